"""What the leftover schedules and the batch_matmul rules give whole models: fused / unfused / onnxruntime at
one thread, with the fused build's leftovers scheduled and left to TVM.

    python benchmarks/leftovers.py                                # vit_seg_ts17, audio1d_ts17, fsmn_ts13
    python benchmarks/leftovers.py --models fsmn_dynamo18,yolox_ts13 --rounds 9
    python benchmarks/leftovers.py --target '{"kind":"llvm","mcpu":"x86-64-v3"}'     # AVX2
    python benchmarks/leftovers.py --models "" --conv3d 1x32x8x28x28,64,3   # conv3d + BN + ReLU alone

Each corpus model (tests/zoo through the simplifier, on the entry's own inputs) is built four ways:

    fused       our rules, and every kernel they leave scheduled (pipeline.LEFTOVER_SCHEDULES)
    bare        our rules without batch_matmul, the kernels they leave as TVM's bare loops (no leftover
                schedules): what the fused build ran before this work, but for conv1d, which the conv rules
                take either way
    unfused     one TVM kernel per op, every one a bare loop
    onnxruntime all graph optimizations

The three builds are checked element-wise against onnxruntime (tvm_fusion.check.numerics), then all four are timed
at one thread (TVM's pool and onnxruntime's intra-op pool): `--rounds` interleaved rounds, a block of about
`--block-ms` of each, the medians of the per-block means (cpu_speed.interleaved). Prints a table of times and
ratios to onnxruntime, and the kernels each fused build runs without a schedule. To compare two versions of
the code, run it on both checkouts.

`--conv3d NxCxDxHxW,O,K` adds one line for a conv3d (K x K x K, padding K // 2) + BatchNorm + ReLU made on the
fly: the conv family's kernel (fused) against the same graph with the conv rules disabled (TVM's conv3d on the
leftover schedule, `fallback.py`; its BN and ReLU fused by the elementwise rules) and onnxruntime.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_speed import _zoo, interleaved, ort_session, set_tvm_threads  # noqa: E402

from tvm_fusion.build import pipeline  # noqa: E402
from tvm_fusion._tvm import relax, tvm  # noqa: E402
from tvm_fusion.build.builder import build, resolve_target  # noqa: E402
from tvm_fusion.check.compare import as_arrays  # noqa: E402
from tvm_fusion.fusion.loader import load_rules_for  # noqa: E402
from tvm_fusion.check.numerics import error_stats  # noqa: E402

DEFAULT_MODELS = ("vit_seg_ts17", "audio1d_ts17", "fsmn_ts13")
BUILDS = ("fused", "bare", "unfused")


@contextlib.contextmanager
def leftovers_off():
    """The fused build's leftovers as TVM's bare loops, for the duration."""
    saved = dict(pipeline.LEFTOVER_SCHEDULES)
    pipeline.LEFTOVER_SCHEDULES.clear()
    try:
        yield
    finally:
        pipeline.LEFTOVER_SCHEDULES.update(saved)


def _build(mod, target, how: str):
    if how == "unfused":
        return build(mod, target, "unfused")
    if how == "fused":
        return build(mod, target, "fused")
    rules = load_rules_for()
    with leftovers_off():
        return build(mod, target, "fused",
                     rules=rules.select(disable=[n for n in rules.names() if n.startswith("batch_matmul")]))


def measure(name: str, target, rounds: int, block_ms: float) -> dict:
    mod, proto, feeds = _zoo(name)
    dev = tvm.cpu()
    order = [i.name for i in proto.graph.input if i.name in feeds]
    args = [tvm.runtime.tensor(feeds[k], dev) for k in order]
    set_tvm_threads(1)
    sess = ort_session(proto, 1)
    ref = sess.run(None, feeds)
    fns, row = {}, {"model": name, "errors": [], "unscheduled": {}}
    for how in BUILDS:
        built = _build(mod, target, how)
        main = relax.VirtualMachine(built.executable, dev)["main"]
        stats = [error_stats(a, r) for a, r in zip(as_arrays(main(*args)), ref)]
        row["errors"] += [f"{how}: {s.describe()}" for s in stats if not s.ok]
        row["unscheduled"][how] = len(built.unscheduled)
        fns[how] = (lambda m: lambda: m(*args))(main)
    fns["onnxruntime"] = lambda: sess.run(None, feeds)
    row["ms"] = interleaved(fns, rounds, block_ms)["wall"]
    return row


def conv3d_model(spec: str):
    """conv3d + BatchNorm + ReLU of `spec` "NxCxDxHxW,O,K" (seeded weights), and its input."""
    import numpy as np

    from tvm_fusion.testing import GraphBuilder

    shape, cout, k = spec.split(",")
    (n, cin, *sizes), cout, k = [int(v) for v in shape.split("x")], int(cout), int(k)
    g = GraphBuilder(0)
    w = g.const(g.rng.normal(0, np.sqrt(2.0 / (cin * k ** 3)), (cout, cin, k, k, k)).astype(np.float32), "w")
    y = g.op("Conv", [g.input("x", [n, cin, *sizes]), w], kernel_shape=[k] * 3, pads=[k // 2] * 6)
    proto = g.model([g.op("Relu", [g.bn(y, cout)])])
    return proto, {"x": g.rng.standard_normal((n, cin, *sizes)).astype(np.float32)}


def measure_conv3d(spec: str, target, rounds: int, block_ms: float) -> dict:
    """fused (the conv family's conv3d kernel), fallback (the conv rules disabled) and onnxruntime, one thread."""
    from tvm_fusion.frontend import import_onnx

    proto, feeds = conv3d_model(spec)
    mod, dev = import_onnx(proto), tvm.cpu()
    args = [tvm.runtime.tensor(feeds["x"], dev)]
    set_tvm_threads(1)
    sess = ort_session(proto, 1)
    ref = sess.run(None, feeds)
    rules = load_rules_for()
    builds = {"fused": rules, "fallback": rules.select(disable=[n for n in rules.names() if n.startswith("conv2d")])}
    fns, row = {}, {"model": f"conv3d_bn_relu {spec}", "errors": [], "unscheduled": {}, "counts": {}}
    for how, selected in builds.items():
        built = build(mod, target, "fused", rules=selected)
        main = relax.VirtualMachine(built.executable, dev)["main"]
        stats = [error_stats(a, r) for a, r in zip(as_arrays(main(*args)), ref)]
        row["errors"] += [f"{how}: {s.describe()}" for s in stats if not s.ok]
        row["unscheduled"][how] = len(built.unscheduled)
        row["counts"][how] = {k: v for k, v in built.counts.items() if v}
        fns[how] = (lambda m: lambda: m(*args))(main)
    fns["onnxruntime"] = lambda: sess.run(None, feeds)
    row["ms"] = interleaved(fns, rounds, block_ms)["wall"]
    return row


def conv3d_line(r: dict) -> str:
    ms = r["ms"]
    flag = " (OUT OF TOLERANCE)" if r["errors"] else ""
    return (f"{r['model']}{flag}: fused {ms['fused']:.3g} ms {r['counts']['fused']}, fallback {ms['fallback']:.3g} ms "
            f"{r['counts']['fallback']}, onnxruntime {ms['onnxruntime']:.3g} ms; fused / ort "
            f"{ms['fused'] / ms['onnxruntime']:.2f}x, fallback / ort {ms['fallback'] / ms['onnxruntime']:.2f}x, "
            f"fallback / fused {ms['fallback'] / ms['fused']:.2f}x")


def table(rows: list[dict]) -> str:
    lines = ["| model | fused ms | bare ms | unfused ms | onnxruntime ms | fused / ort | bare / ort | unfused / ort "
             "| kernels without a schedule (fused, bare) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ms = r["ms"]
        flag = " (OUT OF TOLERANCE)" if r["errors"] else ""
        lines.append(f"| {r['model']}{flag} | {ms['fused']:.3g} | {ms['bare']:.3g} | {ms['unfused']:.3g} | "
                     f"{ms['onnxruntime']:.3g} | {ms['fused'] / ms['onnxruntime']:.2f}x | "
                     f"{ms['bare'] / ms['onnxruntime']:.2f}x | {ms['unfused'] / ms['onnxruntime']:.2f}x | "
                     f"{r['unscheduled']['fused']}, {r['unscheduled']['bare']} |")
    return "\n".join(lines)


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else the platform's."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma separated tests/zoo entries")
    ap.add_argument("--target", default="llvm", help="'llvm' (this CPU, or TVM_FUSION_CPU) or a JSON llvm target")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (a block of each build per round)")
    ap.add_argument("--block-ms", type=float, default=150.0, help="about how long one block of runs takes")
    ap.add_argument("--conv3d", default="", help="NxCxDxHxW,O,K: also time a conv3d + BN + ReLU made on the fly")
    args = ap.parse_args(argv)
    target = resolve_target(args.target)
    rows = []
    for name in [m for m in args.models.split(",") if m]:
        rows.append(measure(name, target, args.rounds, args.block_ms))
        print(f"{name}: " + ", ".join(f"{k} {v:.3g} ms" for k, v in rows[-1]["ms"].items()), file=sys.stderr, flush=True)
    print(f"\n{cpu_name()}; target {target}; batch 1, one thread; medians of "
          f"{args.rounds} interleaved rounds (blocks of ~{args.block_ms:.0f} ms), wall time\n")
    if rows:
        print(table(rows))
    if args.conv3d:
        rows.append(measure_conv3d(args.conv3d, target, args.rounds, args.block_ms))
        print(conv3d_line(rows[-1]))
    failures = [f"{r['model']}: {e}" for r in rows for e in r["errors"]]
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
