"""The light models' 2-D pools alone: TVM's default lowering, `LeftoverPool`'s schedule and onnxruntime's node.

    python benchmarks/pooling.py                            # this CPU's target, every shape below
    python benchmarks/pooling.py --target '{"kind":"llvm","mcpu":"x86-64-v3"}' --only max

Each pool shape of Inception v2, ShuffleNet, ResNet-50 and SqueezeNet (and Inception v1's and YOLOv8n's
stride-1 pools; kernel, stride, padding, ceil_mode) is legalized by TVM, compiled as TVM leaves it and as
`LeftoverPool` schedules it (or `declined`), and run on the same random input as a one-node onnxruntime
session; CPU time per call (time.process_time, median of `--rounds` blocks of about `--block-ms`), one thread
each. `exact` says whether the schedule's output equals TVM's bit for bit.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_speed import _block, ort_session, set_tvm_threads
from tvm_fusion.schedules.llvm.pooling import LeftoverPool, pool_plan

from tvm_fusion._tvm import relax, tirx, tvm
from tvm_fusion.build.builder import resolve_target

# model pool, op, NCHW input, kernel, stride, pads (top, left, bottom, right), ceil_mode
SHAPES = [
    ("inception_v2 max 1", "max", (1, 64, 112, 112), 3, 2, (0, 0, 1, 1), 0),
    ("inception_v2 max 2", "max", (1, 192, 56, 56), 3, 2, (0, 0, 1, 1), 0),
    ("inception_v2 max 3", "max", (1, 320, 28, 28), 3, 2, (0, 0, 1, 1), 0),
    ("inception_v2 max 4", "max", (1, 576, 14, 14), 3, 2, (0, 0, 1, 1), 0),
    ("inception_v2 max s1", "max", (1, 1024, 7, 7), 3, 1, (1, 1, 1, 1), 0),
    ("inception_v2 avg 28", "avg", (1, 256, 28, 28), 3, 1, (1, 1, 1, 1), 0),
    ("inception_v2 avg 14", "avg", (1, 576, 14, 14), 3, 1, (1, 1, 1, 1), 0),
    ("inception_v2 avg 7", "avg", (1, 1024, 7, 7), 3, 1, (1, 1, 1, 1), 0),
    ("inception_v2 global", "avg", (1, 1024, 7, 7), 7, 1, (0, 0, 0, 0), 0),
    ("shufflenet max", "max", (1, 24, 112, 112), 3, 2, (1, 1, 1, 1), 0),
    ("shufflenet avg 1", "avg", (1, 24, 56, 56), 3, 2, (1, 1, 1, 1), 0),
    ("shufflenet avg 2", "avg", (1, 136, 28, 28), 3, 2, (1, 1, 1, 1), 0),
    ("shufflenet avg 3", "avg", (1, 272, 14, 14), 3, 2, (1, 1, 1, 1), 0),
    ("resnet50 max", "max", (1, 64, 112, 112), 3, 2, (1, 1, 1, 1), 0),
    ("resnet50 global", "avg", (1, 2048, 7, 7), 7, 1, (0, 0, 0, 0), 0),
    ("squeezenet max 1", "max", (1, 64, 111, 111), 3, 2, (0, 0, 0, 0), 0),
    ("squeezenet max 2", "max", (1, 128, 55, 55), 3, 2, (0, 0, 0, 0), 0),
    ("squeezenet max 3", "max", (1, 256, 27, 27), 3, 2, (0, 0, 0, 0), 0),
    ("inception_v1 max s1 28", "max", (1, 256, 28, 28), 3, 1, (1, 1, 1, 1), 0),
    ("inception_v1 max s1 14", "max", (1, 512, 14, 14), 3, 1, (1, 1, 1, 1), 0),
    ("inception_v1 max s1 7", "max", (1, 832, 7, 7), 3, 1, (1, 1, 1, 1), 0),
    ("inception_v1 avg 7x7 end pad", "avg", (1, 1024, 7, 7), 7, 1, (0, 0, 1, 1), 0),
    ("nudenet_yolov8n sppf max", "max", (1, 128, 10, 10), 5, 1, (2, 2, 2, 2), 0),
]


def _pool_func(op, shape, k, s, pads, ceil):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    make = relax.op.nn.max_pool2d if op == "max" else relax.op.nn.avg_pool2d
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(make(x, (k, k), (s, s), pads, ceil_mode=bool(ceil))))
    mod = relax.transform.LegalizeOps()(bb.get())
    (func,) = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    return func.with_attr("global_symbol", "main")


def _onnx_pool(op, shape, k, s, pads, ceil):
    node = helper.make_node("MaxPool" if op == "max" else "AveragePool", ["x"], ["y"], kernel_shape=[k, k],
                            strides=[s, s], pads=list(pads), ceil_mode=ceil)
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _cpu_ms(fn, rounds: int, block_ms: float) -> float:
    fn()
    number = max(1, int(block_ms / 1e3 / max(_block(fn, 1)["cpu"], 1e-6)))
    return 1e3 * statistics.median(_block(fn, number)["cpu"] for _ in range(rounds))


def _tvm_kernel(func, target, x, out_shape):
    kernel = tvm.compile(tvm.IRModule({"main": func}), target)["main"]
    a, b = tvm.runtime.tensor(x, tvm.cpu()), tvm.runtime.tensor(np.zeros(out_shape, np.float32), tvm.cpu())
    return (lambda: kernel(a, b)), b


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="llvm")
    ap.add_argument("--only", default="", help="only the shapes whose name contains this")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--block-ms", type=float, default=50.0)
    args = ap.parse_args(argv)
    target = resolve_target(args.target)
    set_tvm_threads(1)
    print("| pool | input | k / s / pads / ceil | onnxruntime ms | TVM default ms | scheduled ms | exact |")
    print("|---|---|---|---|---|---|---|")
    for name, *spec in SHAPES:
        if args.only not in name:
            continue
        x = np.random.default_rng(0).normal(size=spec[1]).astype(np.float32)
        sess = ort_session(_onnx_pool(*spec), 1)
        ref = sess.run(None, {"x": x})[0]
        ort_ms = _cpu_ms(lambda sess=sess, x=x: sess.run(None, {"x": x}), args.rounds, args.block_ms)
        func = _pool_func(*spec)
        run, out = _tvm_kernel(func, target, x, ref.shape)
        default_ms, default_out = _cpu_ms(run, args.rounds, args.block_ms), out.numpy()
        plan = pool_plan(func, target)
        sched_ms, exact = "-", f"declined: {plan.declined}"
        if not plan.declined:
            run, out = _tvm_kernel(LeftoverPool().apply(func, target, False).mod["main"], target, x, ref.shape)
            sched_ms = f"{_cpu_ms(run, args.rounds, args.block_ms):.3f}"
            exact = "yes" if np.array_equal(out.numpy(), default_out) else "NO"
        _, shape, k, s, pads, ceil = spec
        print(f"| {name} | {'x'.join(map(str, shape[1:]))} | {k} / {s} / {list(pads)} / {ceil} | {ort_ms:.3f} | "
              f"{default_ms:.3f} | {sched_ms} | {exact} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
