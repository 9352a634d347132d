"""Conv -> BN -> ReLU -> pool fused in one kernel vs the two kernels it replaces vs onnxruntime, per shape.

    TVM_NUM_THREADS=1 python benchmarks/conv_pool.py                       # this host's CPU
    TVM_NUM_THREADS=1 python benchmarks/conv_pool.py --target '{"kind":"llvm","mcpu":"x86-64-v3"}'
    python benchmarks/conv_pool.py --only stem --rounds 15

Each shape is a one-group ONNX model (conv -> BatchNorm -> ReLU -> pool) built three ways on the same
inputs: `fused` (the conv_pool rule forced on: its measured decline switched off, so the losing shapes are
timed too), `two kernels` (the conv_pool rules disabled: our conv kernel then our pool kernel) and
onnxruntime (one intra-op thread, all graph optimizations). Times are interleaved medians of CPU time
(`cpu_speed.interleaved`: blocks alternating, the median of each block's mean), TVM's pool at one thread.
Prints a Markdown table with the fused/two ratio and whether the rule fuses the shape as shipped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_speed import interleaved, ort_session, set_tvm_threads
from leftovers import cpu_name

import tvm_fusion as tf
from tvm_fusion.build.builder import build, resolve_target
from tvm_fusion.frontend.importer import import_onnx
from tvm_fusion.schedules.llvm import conv_pool as llvm_conv_pool
from tvm_fusion.testing import GraphBuilder

#: name -> (input [N, C, H, W], conv (cout, k, stride), pool (ONNX op, attrs))
SHAPES = {
    "stem": ((1, 3, 224, 224), (64, 7, 2), ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4))),
    "vgg_224": ((1, 3, 224, 224), (64, 3, 1), ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2]))),
    "vgg_112": ((1, 64, 112, 112), (128, 3, 1), ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2]))),
    "vgg_56": ((1, 128, 56, 56), (256, 3, 1), ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2]))),
    "vgg_28": ((1, 256, 28, 28), (512, 3, 1), ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2]))),
    "vgg_14": ((1, 512, 14, 14), (512, 3, 1), ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2]))),
    "gap_head": ((1, 320, 7, 7), (1280, 1, 1), ("GlobalAveragePool", {})),
}
POOL_RULES = [r.name for r in tf.rules() if r.name.endswith("_pool") and r.name.startswith("conv2d")]


def model(shape, conv, pool):
    (n, cin, h, w), (cout, k, stride), (op, attrs) = shape, conv, pool
    g = GraphBuilder(0)
    x = g.input("x", [n, cin, h, w])
    y = g.op("Relu", [g.bn(g.conv(x, cin, cout, k=k, stride=stride), cout)])
    return g.model([g.op(op, [y], **attrs)])


def _runner(built, x):
    from tvm_fusion._tvm import relax, tvm
    vm = relax.VirtualMachine(built.executable, tvm.cpu())
    arg = tvm.runtime.tensor(x, tvm.cpu())
    return lambda: vm["main"](arg)


def measure(name: str, target, rounds: int, block_ms: float) -> dict:
    proto = model(*SHAPES[name])
    x = np.random.default_rng(0).standard_normal(SHAPES[name][0]).astype(np.float32)
    mod = import_onnx(proto)
    shipped = build(mod, target, "fused")
    fires = shipped.counts.get("conv2d_bn_relu_pool", 0) == 1
    forced = llvm_conv_pool.FUSION_LOSES
    llvm_conv_pool.FUSION_LOSES = lambda *_: None  # time the fused kernel where the rule declines it too
    try:
        fused = build(mod, target, "fused")
    finally:
        llvm_conv_pool.FUSION_LOSES = forced
    assert fused.counts.get("conv2d_bn_relu_pool") == 1, f"{name}: the fused build did not fuse ({fused.counts})"
    two = build(mod, target, "fused", rules=tf.rules().select(disable=POOL_RULES))
    sess = ort_session(proto, 1)
    fns = {"fused": _runner(fused, x), "two kernels": _runner(two, x), "onnxruntime": lambda: sess.run(None, {"x": x})}
    ms = interleaved(fns, rounds, block_ms)["cpu"]
    return {"name": name, **ms, "fires": fires, "why": "" if fires else _declined(shipped)}


def _declined(built) -> str:
    for d in built.fused.decisions:
        if d.rule == "conv2d_bn_relu_pool" and d.reason:
            return d.reason
    return "declined"


def table(rows: list[dict]) -> str:
    lines = ["| shape | fused ms | two kernels ms | onnxruntime ms | fused / two | rule |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['fused']:.3f} | {r['two kernels']:.3f} | {r['onnxruntime']:.3f} | "
                     f"{r['fused'] / r['two kernels']:.2f} | {'fuses' if r['fires'] else 'declines'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="llvm")
    ap.add_argument("--only", default=",".join(SHAPES))
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--block-ms", type=float, default=100.0)
    args = ap.parse_args(argv)
    set_tvm_threads(1)
    target = resolve_target(args.target)
    rows = []
    for name in args.only.split(","):
        rows.append(measure(name, target, args.rounds, args.block_ms))
        print(f"{name}: fused {rows[-1]['fused']:.3f} ms, two {rows[-1]['two kernels']:.3f} ms, "
              f"onnxruntime {rows[-1]['onnxruntime']:.3f} ms", flush=True)
    print(f"\n{cpu_name()}, target {args.target}, one thread, CPU time, interleaved medians of {args.rounds} rounds\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
