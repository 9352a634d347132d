"""Depthwise -> pointwise in one kernel, worth it or not: per shape, the fused group against the two conv
kernels it replaces and onnxruntime, one thread.

    python benchmarks/depthwise_pointwise.py                       # MobileNetV2 blocks + a MobileNetV1 stack
    python benchmarks/depthwise_pointwise.py --target '{"kind":"llvm","mcpu":"x86-64-v3"}'     # AVX2
    python benchmarks/depthwise_pointwise.py --shapes 1x144x56x56/1:24+ --rounds 9

A shape `NxCxHxW/S:O` is x -> depthwise 3x3 (stride S, padding 1) -> BatchNorm -> ReLU6 -> 1x1 conv to O
channels -> BatchNorm (a trailing `+`: and the residual add of a second input, as MobileNetV2's projection).
Each is built three ways and checked element by element against onnxruntime (tvm_fusion.check.numerics):

    fused        the depthwise_pointwise rules, the CPU schedule's measured declines switched off (so every
                 shape it can tile is timed)
    two kernels  the same build with the depthwise_pointwise rules disabled: the conv family's depthwise
                 kernel and its 1x1 kernel
    onnxruntime  all graph optimizations, one intra-op thread

then timed at one thread (TVM's pool and onnxruntime's): `--rounds` interleaved rounds of a block of about
`--block-ms` of each, the medians of the per-block means (cpu_speed.interleaved, wall clock). The last
column says what the rule does with the shape on this target: fuses, or declines and why.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_speed import CLOCKS, interleaved, ort_session, set_tvm_threads  # noqa: E402

from tvm_fusion._tvm import relax, tvm  # noqa: E402
from tvm_fusion.build.builder import build, resolve_target  # noqa: E402
from tvm_fusion.check.compare import as_arrays  # noqa: E402
from tvm_fusion.check.numerics import error_stats  # noqa: E402
from tvm_fusion.frontend import import_onnx  # noqa: E402
from tvm_fusion.fusion.loader import load_rules_for  # noqa: E402
from tvm_fusion.schedules.llvm import depthwise_pointwise as dwpw_llvm  # noqa: E402
from tvm_fusion.testing import GraphBuilder  # noqa: E402

#: MobileNetV2's depthwise -> projection pairs (input of the depthwise conv, stride, projection channels; +:
#: the block's residual add), then MobileNetV1's depthwise-separable layers
MOBILENET_V2 = ("1x32x112x112/1:16", "1x96x112x112/2:24", "1x144x56x56/1:24+", "1x144x56x56/2:32",
                "1x192x28x28/1:32+", "1x192x28x28/2:64", "1x384x14x14/1:64+", "1x384x14x14/1:96",
                "1x576x14x14/1:96+", "1x576x14x14/2:160", "1x960x7x7/1:160+", "1x960x7x7/1:320")
MOBILENET_V1 = ("1x32x112x112/1:64", "1x64x112x112/2:128", "1x128x56x56/1:128", "1x128x56x56/2:256",
                "1x256x28x28/1:256", "1x256x28x28/2:512", "1x512x14x14/1:512", "1x512x14x14/2:1024",
                "1x1024x7x7/1:1024")


def parse(shape: str):
    dims, rest = shape.split("/")
    stride, out = rest.rstrip("+").split(":")
    return [int(v) for v in dims.split("x")], int(stride), int(out), shape.endswith("+")


def block_model(shape: str):
    """The ONNX model of `shape` (seeded weights) and its inputs."""
    (n, c, h, w), stride, o, residual = parse(shape)
    g = GraphBuilder(0)
    x = g.input("x", [n, c, h, w])
    y = g.op("Clip", [g.bn(g.conv(x, c, c, k=3, stride=stride, pads=[1] * 4, groups=c), c),
                      g.const(np.float32(0)), g.const(np.float32(6))])
    y = g.bn(g.conv(y, c, o, k=1, pads=[0] * 4), o)
    hout, wout = (h - 1) // stride + 1, (w - 1) // stride + 1
    feeds = {"x": g.rng.standard_normal((n, c, h, w)).astype(np.float32)}
    if residual:
        y = g.op("Add", [y, g.input("skip", [n, o, hout, wout])])
        feeds["skip"] = g.rng.standard_normal((n, o, hout, wout)).astype(np.float32)
    return g.model([y]), feeds


@contextlib.contextmanager
def measured_declines_off(loses: list):
    """A CPU schedule's measured declines (its `LOSES`) emptied, for the duration: every tileable shape fuses."""
    saved = list(loses)
    loses.clear()
    try:
        yield
    finally:
        loses.extend(saved)


def _decision(built, prefix: str) -> str:
    fired = [k for k, v in built.counts.items() if v and k.startswith(prefix)]
    if fired:
        return "fuses"
    why = [d.reason for d in built.fused.decisions if d.rule.startswith(prefix) and d.reason]
    return f"declines: {why[0]}" if why else "declines"


def measure(shape: str, target, rounds: int, block_ms: float, clock: str = "wall", *, model=None,
            prefix: str = "depthwise_", loses: list | None = None) -> dict:
    """`shape`'s block (`model(shape)`: the ONNX model and its feeds; this family's `block_model` by default)
    built with the rules whose names start with `prefix` (their measured declines `loses` off) and without
    them, checked and timed against onnxruntime."""
    proto, feeds = (model or block_model)(shape)
    mod, dev = import_onnx(proto), tvm.cpu()
    args = [tvm.runtime.tensor(feeds[i.name], dev) for i in proto.graph.input]
    set_tvm_threads(1)
    sess = ort_session(proto, 1)
    ref = sess.run(None, feeds)
    rules = load_rules_for()
    off = rules.select(disable=[n for n in rules.names() if n.startswith(prefix)])
    row = {"shape": shape, "errors": [], "decision": _decision(build(mod, target, "fused", rules=rules), prefix)}
    fns = {}
    with measured_declines_off(dwpw_llvm.LOSES if loses is None else loses):
        for how, selected in (("fused", rules), ("two kernels", off)):
            built = build(mod, target, "fused", rules=selected)
            fired = sum(v for k, v in built.counts.items() if k.startswith(prefix))
            if how == "fused" and not fired:
                continue  # no tile for this shape on this target
            main = relax.VirtualMachine(built.executable, dev)["main"]
            stats = [error_stats(a, r) for a, r in zip(as_arrays(main(*args)), ref)]
            row["errors"] += [f"{how}: {s.describe()}" for s in stats if not s.ok]
            fns[how] = (lambda m: lambda: m(*args))(main)
    fns["onnxruntime"] = lambda: sess.run(None, feeds)
    row["ms"] = interleaved(fns, rounds, block_ms)[clock]
    return row


def line(r: dict) -> str:
    ms = r["ms"]
    fused = f"{ms['fused']:.3f}" if "fused" in ms else "-"
    ratio = f"{ms['fused'] / ms['two kernels']:.2f}" if "fused" in ms else "-"
    flag = " (OUT OF TOLERANCE: " + "; ".join(r["errors"]) + ")" if r["errors"] else ""
    return (f"| {r['shape']} | {fused} | {ms['two kernels']:.3f} | {ms['onnxruntime']:.3f} | {ratio} | "
            f"{r['decision']}{flag} |")


def run(argv, *, description: str, shapes, header: str, **measure_options) -> int:
    """The command line of a cross-layer benchmark: `--shapes` (default `shapes`), `--target`, `--rounds`,
    `--block-ms`, `--clock`; one table row per shape (`measure(..., **measure_options)`) under `header`."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--shapes", default=",".join(shapes))
    ap.add_argument("--target", default="llvm")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--block-ms", type=float, default=60.0)
    ap.add_argument("--clock", choices=CLOCKS, default="wall",
                    help="wall, or cpu: this process's CPU time (steadier where other processes share the cores)")
    args = ap.parse_args(argv)
    target = resolve_target(args.target)
    print(f"{platform.processor() or platform.machine()}, target {target}, one thread, {args.clock}-clock medians of "
          f"{args.rounds} interleaved rounds")
    print(f"| {header} | fused ms | two kernels ms | onnxruntime ms | fused / two | the rule |")
    print("|---|---|---|---|---|---|")
    for shape in filter(None, args.shapes.split(",")):
        print(line(measure(shape, target, args.rounds, args.block_ms, args.clock, **measure_options)), flush=True)
    return 0


def main(argv=None) -> int:
    return run(argv, description=__doc__.splitlines()[0], shapes=MOBILENET_V2 + MOBILENET_V1,
               header="shape (x, dw 3x3 / stride : pw out, + residual)")


if __name__ == "__main__":
    sys.exit(main())
