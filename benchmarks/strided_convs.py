"""Strided (and stride-1 3x3) llvm convs alone against onnxruntime's Conv node: before / after a plan rule, one
thread, CPU time, interleaved in one process; or (`--copies`) what each conv kernel's input copy costs.

    TVM_NUM_THREADS=1 .venv/bin/python benchmarks/strided_convs.py                 # every shape below
    TVM_NUM_THREADS=1 .venv/bin/python benchmarks/strided_convs.py yolo_3_16 --activation silu
    TVM_NUM_THREADS=1 .venv/bin/python benchmarks/strided_convs.py --before nchw   # channels_last_input's rule
    TVM_NUM_THREADS=1 .venv/bin/python benchmarks/strided_convs.py resnet50_3x3_128 --before flat_taps
    TVM_NUM_THREADS=1 .venv/bin/python benchmarks/strided_convs.py resnet50_1x1_512_128 --before chunks
    TVM_NUM_THREADS=1 .venv/bin/python benchmarks/strided_convs.py mbv2_dw_144_56 effnet_dw5_240_28 --before shared_taps
    TVM_NUM_THREADS=1 .venv/bin/python benchmarks/strided_convs.py effnet_1x1_40_240 --activation silu --before rolled_epilogue
    TVM_NUM_THREADS=1 .venv/bin/python benchmarks/strided_convs.py resnet50_3x3_256 --before avx512_nchw
    TVM_NUM_THREADS=1 .venv/bin/python benchmarks/strided_convs.py resnet50_3x3_512 --before four_vectors
    TVM_NUM_THREADS=1 .venv/bin/python benchmarks/strided_convs.py resnet50_3x3_512 --before reduction_chunks --evict 1024
    TVM_NUM_THREADS=1 .venv/bin/python benchmarks/strided_convs.py vgg19_stem yolo_3_16 --before channel_epilogue
    TVM_NUM_THREADS=1 .venv/bin/python benchmarks/strided_convs.py vgg19_3x3_64_224 --before copy_rows
    TVM_NUM_THREADS=1 .venv/bin/python benchmarks/strided_convs.py vgg19_3x3_256 resnet50_3x3_512 --before winograd
    TVM_NUM_THREADS=1 .venv/bin/python benchmarks/strided_convs.py --copies        # ResNet-50's input copies

Each shape is built the way fuse builds it on llvm (W packed by pack_conv, the llvm compute and schedule,
`conv2d_test._packed_build`), once with the current rules and once with the rule `--before` names undone
(BEFORE: "subsample", the default: strided 1x1 convs keep their strided tile, `subsampled_pixels` off; "nchw":
every tiled conv's input copied channels-last, STRIDED_NCHW_MACS = -1; "flat_taps": stride-1 convs with a larger
kernel keep their rows of tiles, `flat_taps` off; "copy_rows": a conv's channels-last input copied a whole
channel row per pixel, not in blocks of COPY_CHANNELS (flat 1x1 convs) or of the vector's lanes; "tap_rows": a
flat conv's kernel columns and input channels reduced in two loops, not one; "chunks": the pointwise kernel's
output channels in chunks of CHUNK_BYTES of weights only, CHUNK_INPUT_FRACTION 0; "avx512": AVX-512 with the
default step cost (none of TILED_STEP_COSTS["avx512"]: no `pixel_vectors` / `channel_depthwise`, NCHW, four
channel vectors); "avx512_nchw": AVX-512's W packed [oc block, C, KH, KW, B] and its input NCHW, not
`taps_first`; "four_vectors": AVX-512 tiles of up to four channel vectors with panels of PANEL_BYTES, not two of
AVX512_PANEL_BYTES; "shared_taps": stride-1 depthwise tiles of up to `max_accumulators` with their taps rolled,
not `RowTile.shared_taps`; "rolled_epilogue": the pointwise kernel's epilogue rows unrolled whatever the
activation, not rolled past HEAVY_EPILOGUE_NODES; "reduction_chunks": AVX-512 tiled convs run their whole
reduction per tile, `reduction_chunk` off; "channel_epilogue": AVX-512 tiles whose columns are not whole vectors
run their epilogue over channel vectors, `StepCost.column_epilogue_share` 0; "winograd": 3x3 stride-1 convs
take the direct kernel, not `conv2d_winograd`), and onnxruntime runs Conv + the
activation as a one-node model (intra_op_num_threads=1; its session.run overhead included). Prints the medians of
`--rounds` blocks of about 100 ms each, and whether the two builds agree bit for bit. `--evict MB` times
single calls instead, each after writing MB MiB, so that the weights come from L3 (8) or memory (1024), as
in a model whose weights do not stay in cache (the wall time of the call; 10 x `--rounds` calls each).

`--copies`: for each of ResNet-50's 23 conv shapes (tvm_fusion.testing.RESNET50_CONVS, weighted by its calls
in the model, RESNET50_CALLS), the whole kernel and its input copy alone (the compute's `pad` stage, its
`subsample` inlined, scheduled as the kernel schedules it: `_schedule_pad`, or the pointwise kernel's strips
`[n, P / cols, C, cols]`), interleaved; the total is what a layout every conv writes for the next one to read
(NCHW[x]c) could save at most.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tvm_fusion" / "schedules" / "llvm"))

import conv2d_test  # noqa: E402  (the packed build the tests use)
from cpu_speed import set_tvm_threads  # noqa: E402

import tvm_fusion.schedules.llvm.conv2d as llvm_conv  # noqa: E402
from tvm_fusion._tvm import te, tvm  # noqa: E402
from tvm_fusion.testing import RESNET50_CONVS  # noqa: E402
from tvm_fusion.build.builder import resolve_target  # noqa: E402

#: name: (n, c, h, w, oc, k, stride, pad[, groups])
SHAPES = {
    "yolo_3_16": (1, 3, 320, 320, 16, 3, 2, 1),  # YOLOv8n (320x320 input)
    "yolo_16_32": (1, 16, 160, 160, 32, 3, 2, 1),
    "yolo_32_64": (1, 32, 80, 80, 64, 3, 2, 1),
    "yolo_64_128": (1, 64, 40, 40, 128, 3, 2, 1),
    "shufflenet_stem": (1, 3, 224, 224, 24, 3, 2, 1),
    "resnet50_stem": (1, 3, 224, 224, 64, 7, 2, 3),  # Inception's 7x7/2 stem is the same shape
    "resnet50_3x3s2_128": (1, 128, 56, 56, 128, 3, 2, 1),
    "resnet50_1x1s2_256_512": (1, 256, 56, 56, 512, 1, 2, 0),
    "resnet50_3x3s2_256": (1, 256, 28, 28, 256, 3, 2, 1),
    "resnet50_3x3s2_512": (1, 512, 14, 14, 512, 3, 2, 1),
    "resnet50_1x1s2_512_1024": (1, 512, 28, 28, 1024, 1, 2, 0),
    "resnet50_1x1s2_1024_2048": (1, 1024, 14, 14, 2048, 1, 2, 0),
    "1x1s2_64_32": (1, 64, 56, 56, 32, 1, 2, 0),
    "1x1s2_128_64": (1, 128, 56, 56, 64, 1, 2, 0),
    "1x1s2_256_96": (1, 256, 28, 28, 96, 1, 2, 0),  # subsampled, then read in place (FLAT_COPY_CHANNELS)
    # stride-1 3x3 convs (ResNet-50, VGG19, Inception-v2): the tiled kernel, columns padded to the tile
    "resnet50_3x3_64": (1, 64, 56, 56, 64, 3, 1, 1),
    "resnet50_3x3_128": (1, 128, 28, 28, 128, 3, 1, 1),
    "resnet50_3x3_256": (1, 256, 14, 14, 256, 3, 1, 1),
    "resnet50_3x3_512": (1, 512, 7, 7, 512, 3, 1, 1),
    "vgg19_stem": (1, 3, 224, 224, 64, 3, 1, 1),
    "stem_111": (1, 3, 222, 222, 64, 3, 2, 1),  # 111 output columns
    "vgg19_3x3_64_224": (1, 64, 224, 224, 64, 3, 1, 1),
    "vgg19_3x3_128_112": (1, 128, 112, 112, 128, 3, 1, 1),
    "vgg19_3x3_256": (1, 256, 56, 56, 256, 3, 1, 1),
    "vgg19_3x3_512_28": (1, 512, 28, 28, 512, 3, 1, 1),
    "vgg19_3x3_512_14": (1, 512, 14, 14, 512, 3, 1, 1),
    "inception_3x3_64_192": (1, 64, 56, 56, 192, 3, 1, 1),
    "inception_3x3_96": (1, 96, 28, 28, 96, 3, 1, 1),
    "inception_3x3_192_256": (1, 192, 14, 14, 256, 3, 1, 1),
    # ResNet-50's 1x1 convs on 7x7 (flat tiled: 2 x 5 pixels, 49 padded to 50)
    "resnet50_1x1_2048_512": (1, 2048, 7, 7, 512, 1, 1, 0),
    "resnet50_1x1_512_2048": (1, 512, 7, 7, 2048, 1, 1, 0),
    # ... and on 14x14 (flat tiled: 196 pixels are no whole pixel vectors; the 1024-channel input copied
    # channels-last in blocks of COPY_CHANNELS)
    "resnet50_1x1_1024_256": (1, 1024, 14, 14, 256, 1, 1, 0),
    "resnet50_1x1_256_1024": (1, 256, 14, 14, 1024, 1, 1, 0),
    "resnet50_1x1_1024_512": (1, 1024, 14, 14, 512, 1, 1, 0),
    # ... and on 56x56 / 28x28 (the pointwise kernel, `conv2d_pointwise.py`)
    "resnet50_1x1_64_64": (1, 64, 56, 56, 64, 1, 1, 0),
    "resnet50_1x1_64_256": (1, 64, 56, 56, 256, 1, 1, 0),
    "resnet50_1x1_256_64": (1, 256, 56, 56, 64, 1, 1, 0),
    "resnet50_1x1_256_128": (1, 256, 56, 56, 128, 1, 1, 0),
    "resnet50_1x1_128_512": (1, 128, 28, 28, 512, 1, 1, 0),
    "resnet50_1x1_512_128": (1, 512, 28, 28, 128, 1, 1, 0),
    "resnet50_1x1_512_256": (1, 512, 28, 28, 256, 1, 1, 0),
    # ... PP-OCR's (wide maps, deep weights) and DenseNet-121's last 28x28 bottleneck
    "ppocr_1x1_240": (1, 240, 12, 80, 240, 1, 1, 0),
    "ppocr_1x1_480": (1, 480, 6, 80, 480, 1, 1, 0),
    "densenet_1x1_480_128": (1, 480, 28, 28, 128, 1, 1, 0),
    "squeezenet_1x1_512_1000": (1, 512, 13, 13, 1000, 1, 1, 0),  # a last tile past H * W, 1000 padded
    "1x1_256_1000": (1, 256, 13, 13, 1000, 1, 1, 0),
    # MobileNetV2 1.0 (`--before avx512`: the AVX-512 plans without `pixel_vector_pointwise` and
    # `channel_depthwise`); a 9th number is the groups
    "mbv2_stem": (1, 3, 224, 224, 32, 3, 2, 1),
    "mbv2_1x1_320_1280": (1, 320, 7, 7, 1280, 1, 1, 0),
    "mbv2_1x1_16_96": (1, 16, 112, 112, 96, 1, 1, 0),
    "mbv2_1x1_24_144": (1, 24, 56, 56, 144, 1, 1, 0),
    "mbv2_1x1_96_24": (1, 96, 56, 56, 24, 1, 1, 0),
    "mbv2_dw_s2_96": (1, 96, 112, 112, 96, 3, 2, 1, 96),
    "mbv2_dw_s2_144": (1, 144, 56, 56, 144, 3, 2, 1, 144),
    "mbv2_dw_960_7": (1, 960, 7, 7, 960, 3, 1, 1, 960),
    "mbv2_dw_32_112": (1, 32, 112, 112, 32, 3, 1, 1, 32),
    "mbv2_dw_144_56": (1, 144, 56, 56, 144, 3, 1, 1, 144),
    "mbv2_dw_192_28": (1, 192, 28, 28, 192, 3, 1, 1, 192),
    "mbv2_dw_576_14": (1, 576, 14, 14, 576, 3, 1, 1, 576),
    # EfficientNet-B0's (`--activation silu --before rolled_epilogue`: pointwise.HEAVY_EPILOGUE_NODES)
    "effnet_1x1_40_240": (1, 40, 28, 28, 240, 1, 1, 0),
    "effnet_1x1_80_480": (1, 80, 14, 14, 480, 1, 1, 0),
    "effnet_dw5_240_28": (1, 240, 28, 28, 240, 5, 1, 2, 240),
    "effnet_dw5_672_14": (1, 672, 14, 14, 672, 5, 1, 2, 672),
}
ORT_ACTIVATIONS = {"relu": [("Relu", ["c"], "y")], "silu": [("Sigmoid", ["c"], "s"), ("Mul", ["c", "s"], "y")]}


def _cpu(fn, number: int) -> float:
    start = time.process_time()
    for _ in range(number):
        fn()
    return (time.process_time() - start) / number


def _ort(shape, wt, b, activation: str):
    n, c, h, w, _, k, s, p, *groups = shape
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[s, s], pads=[p] * 4, kernel_shape=[k, k],
                              group=groups[0] if groups else 1)]
    nodes += [helper.make_node(op, ins, [out]) for op, ins, out in ORT_ACTIVATIONS[activation]]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, h, w])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [onnx.numpy_helper.from_array(wt, "w"), onnx.numpy_helper.from_array(b, "b")])
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


#: calls of each RESNET50_CONVS shape in ResNet-50 v1.5 (tvm_fusion.examples' resnet50): 53 convs
RESNET50_CALLS = [1, 1, 3, 4, 2, 1, 1, 4, 1, 3, 3, 1, 1, 6, 1, 5, 5, 1, 1, 3, 1, 2, 2]
_SCHEDULE_PAD = llvm_conv._schedule_pad
_SCHEDULE_FLAT = llvm_conv._schedule_flat


def _copy_whole_rows(sch, pad, lanes: int, channels_last: bool = False, flat: bool = False):
    """`_schedule_pad` as it was before its blocks of channels: each pixel's whole channel row copied in one scalar
    loop."""
    if not channels_last:
        return _SCHEDULE_PAD(sch, pad, lanes, channels_last, flat)
    n, c, h, w = sch.get_loops(pad)
    sch.transform_layout(pad, ("write", 0), lambda n_, c_, h_, w_: (n_, h_, w_, c_))
    sch.reorder(n, h, w, c)
    sch.parallel(sch.fuse(n, h, w) if flat else sch.fuse(n, h))


def _rolled_taps_row_tile(hout, wout, facts, strided=False):
    """`choose_row_tile` as it was before `RowTile.shared_taps`: taps rolled, up to `max_accumulators`."""
    full, budget = facts.float32_lanes, llvm_conv.max_accumulators(facts)
    tiles = (llvm_conv.RowTile(rows, vectors, lanes)
             for lanes in llvm_conv._vector_lanes(full)
             for vectors in range(1, min(budget, -(-wout // lanes)) + 1)
             for rows in range(1, (1 if strided else min(hout, budget // vectors)) + 1))
    return max(tiles, key=lambda t: (
        llvm_conv._efficiency(t.accumulators, t.accumulators + 1, (hout, wout, t.lanes),
                              (-(-hout // t.rows) * t.rows, -(-wout // t.cols) * t.cols, full)),
        t.accumulators, -(-(-wout // t.cols) * t.cols), t.vectors))


#: the rules `--before` undoes: module attributes of schedules/llvm/conv2d.py set for the "before" build
BEFORE = {"subsample": {"subsampled_pixels": lambda *args, **kwargs: False},
          "nchw": {"STRIDED_NCHW_MACS": -1},
          "pixel_tail": {"pixel_tail": lambda *args, **kwargs: False},
          "flat_taps": {"flat_taps": lambda *args, **kwargs: False},
          "copy_rows": {"_schedule_pad": _copy_whole_rows},
          "tap_rows": {"_schedule_flat": lambda *args, tap_rows=False: _SCHEDULE_FLAT(*args)},
          "chunks": {"pointwise.CHUNK_INPUT_FRACTION": 0},
          "shared_taps": {"choose_row_tile": _rolled_taps_row_tile},
          "rolled_epilogue": {"pointwise.HEAVY_EPILOGUE_NODES": 1 << 30},
          "avx512": {"TILED_STEP_COSTS": {k: v for k, v in llvm_conv.TILED_STEP_COSTS.items() if k != "avx512"}},
          "avx512_nchw": {"TILED_STEP_COSTS": {**llvm_conv.TILED_STEP_COSTS, "avx512": replace(
              llvm_conv.TILED_STEP_COSTS["avx512"], taps_first=False)}},
          "four_vectors": {"TILED_STEP_COSTS": {**llvm_conv.TILED_STEP_COSTS, "avx512": replace(
              llvm_conv.TILED_STEP_COSTS["avx512"], panel_bytes=llvm_conv.PANEL_BYTES, max_oc_vectors=4)}},
          "reduction_chunks": {"TILED_STEP_COSTS": {**llvm_conv.TILED_STEP_COSTS, "avx512": replace(
              llvm_conv.TILED_STEP_COSTS["avx512"], chunked_reduction=False)}},
          "winograd": {"winograd.WINOGRAD_ISAS": ()},
          "channel_epilogue": {"TILED_STEP_COSTS": {**llvm_conv.TILED_STEP_COSTS, "avx512": replace(
              llvm_conv.TILED_STEP_COSTS["avx512"], column_epilogue_share=0.0)}}}


def _owner(name: str):
    """The module and attribute an override names: conv2d.py's, or "pointwise.X" for conv2d_pointwise.py's."""
    module, _, attr = name.rpartition(".")
    return (getattr(llvm_conv, module) if module else llvm_conv), attr


def _build(case, target, overrides: dict):
    keep = {name: getattr(*_owner(name)) for name in overrides}
    try:
        for name, value in overrides.items():
            setattr(*_owner(name), value)
        executable, _, arrays, out_shape, _ = conv2d_test._packed_build(case, target)
    finally:
        for name, value in keep.items():
            setattr(*_owner(name), value)
    tensors = [tvm.runtime.tensor(a) for a in arrays] + [tvm.runtime.tensor(np.zeros(out_shape, "float32"))]
    return (lambda: executable["main"](*tensors)), tensors[-1], arrays


def _interleaved(runs: dict, rounds: int) -> dict:
    """{name: median ms} of `rounds` interleaved blocks of about 100 ms of each run's CPU time per call."""
    number = {}
    for key, fn in runs.items():
        fn()
        number[key] = max(1, int(0.1 / max(_cpu(fn, 2), 1e-6)))
    times = {key: [] for key in runs}
    for _ in range(rounds):
        for key, fn in runs.items():
            times[key].append(_cpu(fn, number[key]))
    return {key: 1e3 * statistics.median(v) for key, v in times.items()}


def _find_stage(tensor, name: str):
    """The te stage called `name` among the stages `tensor` reads (depth first), or None."""
    for t in tensor.op.input_tensors:
        if t.op.name == name:
            return t
        found = _find_stage(t, name)
        if found is not None:
            return found
    return None


def _copy_kernel(case, target):
    """The input copy of `case`'s llvm kernel alone, scheduled as the kernel schedules it, or None (no copy)."""
    _, attrs, shapes = conv2d_test.conv_primfunc(**case, residual=False, target=target)
    packed = conv2d_test.pack_conv([np.zeros(shapes[1], "float32"), np.zeros(shapes[2], "float32")], attrs, shapes,
                                   target)
    xs = te.placeholder(shapes[0], "float32", name="x")
    ws = te.placeholder((packed or [np.zeros(shapes[1])])[0].shape, "float32", name="w")
    out = llvm_conv.conv2d_llvm(xs, ws, te.placeholder(shapes[2], "float32", name="b"), **attrs, target=target)
    pad = _find_stage(out, "pad")
    if pad is None:
        return None
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([xs, pad])}))
    if (subsample := llvm_conv.optional_block(sch, "subsample")) is not None:
        sch.compute_inline(subsample)
    block = sch.get_sblock("pad")
    facts = llvm_conv.cpu_facts(target)
    k, stride = case["k"], (case["stride"],) * 2
    plan = llvm_conv.plan_of(shapes[0], case["oc"], (case["c"], k, k), stride, attrs["padding"], attrs["dilation"], 1,
                             facts)
    if plan.kernel == "pointwise":  # conv2d_pointwise._copy_strips, for the whole image at once
        cols = plan.tile.cols
        sch.transform_layout(block, ("write", 0), lambda n_, c_, h_, p_: (n_, p_ // cols, c_, p_ % cols))
        n, c, _, p = sch.get_loops(block)
        po, pi = sch.split(p, [None, cols])
        sch.reorder(n, po, c, pi)
        sch.parallel(sch.fuse(n, po))
        sch.vectorize(pi)
    else:
        llvm_conv._schedule_pad(sch, block, facts.float32_lanes, channels_last=llvm_conv.channels_last_input(
            plan.kernel, case["c"], case["oc"], k, k, stride, facts), flat=plan.flat and k == 1)
    func = sch.mod["main"].with_attr("global_symbol", "main")
    kernel = tvm.compile(tvm.IRModule({"main": func}), target)["main"]
    tensors = [tvm.runtime.tensor(np.ones([int(d) for d in p.shape], "float32")) for p in func.params]
    return lambda: kernel(*tensors)


def _copies(target, rounds: int) -> int:
    total_kernels = total_copies = 0.0
    for shape, calls in zip(RESNET50_CONVS, RESNET50_CALLS):
        case = dict(zip(("n", "c", "h", "w", "oc", "k", "stride", "pad"), shape), activation="relu")
        kernel, _, _ = _build(case, target, {})
        copy = _copy_kernel(case, target)
        times = _interleaved({"kernel": kernel, **({"copy": copy} if copy else {})}, rounds)
        times.setdefault("copy", 0.0)
        total_kernels += calls * times["kernel"]
        total_copies += calls * times["copy"]
        print(f"{str(shape):36s} x{calls}: kernel {times['kernel']:.3f} ms, input copy {times['copy']:.3f} ms "
              f"({100 * times['copy'] / times['kernel']:.0f}%)", flush=True)
    print(f"ResNet-50, 53 convs: kernels {total_kernels:.2f} ms, input copies {total_copies:.2f} ms "
          f"({100 * total_copies / total_kernels:.1f}%)")
    return 0


def _after_eviction(runs: dict, rounds: int, evict_mb: int) -> dict:
    """{name: median ms} of `rounds` x 10 single calls of each run (wall time of the call alone), each after
    writing `evict_mb` MiB (8: past L2, the weights then come from L3; 1024: past L3, from memory), interleaved."""
    buffer = np.zeros(evict_mb * 1024 * 1024 // 4, "float32")
    times = {key: [] for key in runs}
    for i in range(rounds * 10):
        for key, fn in runs.items():
            buffer.fill(i)
            start = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - start)
    return {key: 1e3 * statistics.median(v) for key, v in times.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shapes", nargs="*", choices=[[], *SHAPES], help="default: all")
    ap.add_argument("--activation", default="relu", choices=list(ORT_ACTIVATIONS))
    ap.add_argument("--target", default="llvm")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--before", default="subsample", choices=list(BEFORE))
    ap.add_argument("--copies", action="store_true", help="ResNet-50's input copies against their kernels")
    ap.add_argument("--evict", type=int, default=0, metavar="MB",
                    help="time single calls, each after writing this many MiB (caches emptied of the weights)")
    args = ap.parse_args(argv)
    target = resolve_target(args.target)
    set_tvm_threads(1)
    if args.copies:
        return _copies(target, args.rounds)
    for name in args.shapes or SHAPES:
        shape = SHAPES[name]
        case = dict(zip(("n", "c", "h", "w", "oc", "k", "stride", "pad", "groups"), shape), activation=args.activation)
        before, out_before, _ = _build(case, target, BEFORE[args.before])
        after, out_after, arrays = _build(case, target, {})
        groups = case.get("groups", 1)
        wt = np.random.default_rng(2).standard_normal((shape[4], shape[1] // groups, shape[5], shape[5])).astype("float32")
        session, feed = _ort(shape, wt, arrays[2], args.activation), {"x": arrays[0]}
        runs = {"before": before, "after": after, "onnxruntime": lambda: session.run(None, feed)}
        times = _after_eviction(runs, args.rounds, args.evict) if args.evict else _interleaved(runs, args.rounds)
        same = np.array_equal(out_before.numpy(), out_after.numpy())
        print(f"{name:24s} " + "  ".join(f"{k} {v:.3f} ms" for k, v in times.items())
              + f"  bit-identical {same}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
