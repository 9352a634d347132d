"""Strided llvm convs alone against onnxruntime's Conv node: before / after `channels_last_input`, one thread,
CPU time, interleaved in one process.

    TVM_NUM_THREADS=1 .venv/bin/python benchmarks/strided_convs.py                 # every shape below
    TVM_NUM_THREADS=1 .venv/bin/python benchmarks/strided_convs.py yolo_3_16 --activation silu

Each shape is built the way fuse builds it on llvm (W packed by pack_conv, the llvm compute and schedule,
`conv2d_test._packed_build`), once with the current rule and once with every tiled conv's input copied
channels-last (STRIDED_NCHW_MACS = -1: the kernel before), and onnxruntime runs Conv + the activation as a
one-node model (intra_op_num_threads=1; its session.run overhead included). Prints the medians of `--rounds`
blocks of about 100 ms each, and whether the two builds agree bit for bit.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "schedules" / "llvm"))

import conv2d_test  # noqa: E402  (the packed build the tests use)
from cpu_speed import set_tvm_threads  # noqa: E402

import tvm_fusion.schedules.llvm.conv2d as llvm_conv  # noqa: E402
from tvm_fusion._tvm import tvm  # noqa: E402
from tvm_fusion.build import resolve_target  # noqa: E402

#: name: (n, c, h, w, oc, k, stride, pad)
SHAPES = {
    "yolo_3_16": (1, 3, 320, 320, 16, 3, 2, 1),  # YOLOv8n (320x320 input)
    "yolo_16_32": (1, 16, 160, 160, 32, 3, 2, 1),
    "yolo_32_64": (1, 32, 80, 80, 64, 3, 2, 1),
    "yolo_64_128": (1, 64, 40, 40, 128, 3, 2, 1),
    "shufflenet_stem": (1, 3, 224, 224, 24, 3, 2, 1),
    "resnet50_stem": (1, 3, 224, 224, 64, 7, 2, 3),  # Inception's 7x7/2 stem is the same shape
    "resnet50_3x3s2_128": (1, 128, 56, 56, 128, 3, 2, 1),
    "resnet50_1x1s2_256_512": (1, 256, 56, 56, 512, 1, 2, 0),
    "1x1s2_64_32": (1, 64, 56, 56, 32, 1, 2, 0),
}
ORT_ACTIVATIONS = {"relu": [("Relu", ["c"], "y")], "silu": [("Sigmoid", ["c"], "s"), ("Mul", ["c", "s"], "y")]}


def _cpu(fn, number: int) -> float:
    start = time.process_time()
    for _ in range(number):
        fn()
    return (time.process_time() - start) / number


def _ort(shape, wt, b, activation: str):
    n, c, h, w, _, k, s, p = shape
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[s, s], pads=[p] * 4, kernel_shape=[k, k])]
    nodes += [helper.make_node(op, ins, [out]) for op, ins, out in ORT_ACTIVATIONS[activation]]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, h, w])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [onnx.numpy_helper.from_array(wt, "w"), onnx.numpy_helper.from_array(b, "b")])
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _build(case, target, rule: int):
    keep, llvm_conv.STRIDED_NCHW_MACS = llvm_conv.STRIDED_NCHW_MACS, rule
    try:
        executable, _, arrays, out_shape, _ = conv2d_test._packed_build(case, target)
    finally:
        llvm_conv.STRIDED_NCHW_MACS = keep
    tensors = [tvm.runtime.tensor(a) for a in arrays] + [tvm.runtime.tensor(np.zeros(out_shape, "float32"))]
    return (lambda: executable["main"](*tensors)), tensors[-1], arrays


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shapes", nargs="*", choices=[[], *SHAPES], help="default: all")
    ap.add_argument("--activation", default="relu", choices=list(ORT_ACTIVATIONS))
    ap.add_argument("--target", default="llvm")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    target = resolve_target(args.target)
    set_tvm_threads(1)
    for name in args.shapes or SHAPES:
        shape = SHAPES[name]
        case = dict(zip(("n", "c", "h", "w", "oc", "k", "stride", "pad"), shape), activation=args.activation)
        before, out_before, _ = _build(case, target, -1)
        after, out_after, arrays = _build(case, target, llvm_conv.STRIDED_NCHW_MACS)
        wt = np.random.default_rng(2).standard_normal((shape[4], shape[1], shape[5], shape[5])).astype("float32")
        session, feed = _ort(shape, wt, arrays[2], args.activation), {"x": arrays[0]}
        runs = {"before": before, "after": after, "onnxruntime": lambda: session.run(None, feed)}
        number = {}
        for key, fn in runs.items():
            fn()
            number[key] = max(1, int(0.1 / max(_cpu(fn, 2), 1e-6)))
        times = {key: [] for key in runs}
        for _ in range(args.rounds):
            for key, fn in runs.items():
                times[key].append(_cpu(fn, number[key]))
        same = np.array_equal(out_before.numpy(), out_after.numpy())
        print(f"{name:24s} " + "  ".join(f"{k} {1e3 * statistics.median(v):.3f} ms" for k, v in times.items())
              + f"  bit-identical {same}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
