"""What MetaSchedule tuning (`compile --tune`) gains on a light architecture, per kernel and end to end.

    python benchmarks/tune_gain.py squeezenet --trials 64 --db tune_db
    python benchmarks/tune_gain.py squeezenet --trials 128 --kernels conv2d_bias_relu17,conv2d_bias_relu --db tune_db

Builds the model's fused build twice on this CPU, with the hand schedules and with `--trials` MetaSchedule
trials per fused kernel (tuning kept only where it measured faster; the database is reused, so a second run
measures nothing new), checks both element-wise against onnxruntime (tvm_fusion.check.numerics), prints the
per-kernel tuning table, then times the two builds interleaved (`--rounds` blocks of about `--block-ms`
each, medians of the block means). Exits 1 if either build is out of tolerance.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_speed import _light, interleaved_ms  # noqa: E402

from tvm_fusion._tvm import relax, tvm  # noqa: E402
from tvm_fusion.build.builder import build, resolve_target  # noqa: E402
from tvm_fusion.check.compare import as_arrays  # noqa: E402
from tvm_fusion.check.numerics import error_stats  # noqa: E402
from tvm_fusion.build.tune import TuneOptions  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="a tvm_fusion.examples name, e.g. squeezenet")
    p.add_argument("--trials", type=int, default=64, help="MetaSchedule trials per fused kernel")
    p.add_argument("--db", required=True, help="tuning database folder (reused)")
    p.add_argument("--kernels", default="", help="tune only these fused kernels (comma separated)")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--block-ms", type=float, default=300.0)
    args = p.parse_args(argv)
    mod, proto, feeds = _light(args.model)
    target = resolve_target("llvm")
    kernels = tuple(k for k in args.kernels.split(",") if k) or None
    builds = {"hand": build(mod, target, "fused"),
              "tuned": build(mod, target, "fused", tune=TuneOptions(args.trials, args.db, kernels=kernels))}
    print(builds["tuned"].tuning)
    dev = tvm.cpu()
    order = [i.name for i in proto.graph.input if i.name in feeds]
    inputs = [tvm.runtime.tensor(feeds[k], dev) for k in order]
    from tvm_fusion.check.io import run_onnxruntime

    sess, _ = run_onnxruntime(proto, feeds)
    ref = sess.run(None, feeds)
    mains, ok = {}, True
    for name, b in builds.items():
        mains[name] = relax.VirtualMachine(b.executable, dev)["main"]
        stats = [error_stats(a, r) for a, r in zip(as_arrays(mains[name](*inputs)), ref)]
        ok &= all(s.ok for s in stats)
        print(f"{name}: " + "; ".join(s.describe() for s in stats))
    hand_ms, tuned_ms = interleaved_ms(lambda: mains["hand"](*inputs), lambda: mains["tuned"](*inputs),
                                       args.rounds, args.block_ms)["wall"]
    print(f"{args.model}: hand {hand_ms:.2f} ms, tuned {tuned_ms:.2f} ms, hand / tuned {hand_ms / tuned_ms:.2f}x "
          f"({args.rounds} interleaved rounds)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
