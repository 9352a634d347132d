"""The nine architectures the onnx wheel ships: fused / unfused / TVM default / onnxruntime, one table.

    python benchmarks/light_models.py [--models alexnet,vgg19] [--rounds 3] [--fast-rounds 15]

For each model (tvm_fusion.examples: seeded random weights) `tvm_fusion.check.compare` builds the three
variants on llvm, checks fused against unfused and onnxruntime, and times the three builds and
onnxruntime interleaved over `--rounds` rounds (the unfused and tvm builds run TVM's unscheduled CPU
kernels: seconds per inference). The fused build and onnxruntime are then timed alone, interleaved, over
`--fast-rounds` rounds. Ratios are of medians: unfused/fused and tvm/fused from the first run, fused ms
and fused/onnxruntime from the second. Prints one markdown table; exits 1 if a fused build is out of
tolerance.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import onnx


def _median_ms(values) -> float:
    return statistics.median(values) * 1e3


def _row(name: str, rounds: int, fast_rounds: int) -> tuple[list[str], list[str]]:
    from tvm_fusion.check.compare import compare
    from tvm_fusion.examples import example_path, logits_name

    path = example_path(name)
    model = onnx.load(str(path))
    full = compare(path, "llvm", repeat=rounds)
    fast = compare(path, "llvm", repeat=fast_rounds, modes=("fused",))
    logits = [o.name for o in model.graph.output].index(logits_name(model))
    rel = full.errors["fused vs onnxruntime"][logits].max_rel
    med = {m: statistics.median(b.latencies) for m, b in full.builds.items()}
    fused_ms = _median_ms(fast.builds["fused"].latencies)
    b = full.builds
    row = [name, str(len(model.graph.node)), ", ".join(f"{k}:{v}" for k, v in full.counts.items() if v),
           f"{b['unfused'].kernel_calls} / {b['tvm'].kernel_calls} / {b['fused'].kernel_calls}", f"{rel:.1e}",
           f"{fused_ms:.1f}", f"{med['unfused'] / med['fused']:.1f}x", f"{med['tvm'] / med['fused']:.1f}x",
           f"{fused_ms / _median_ms(fast.ort_latencies):.2f}x"]
    failures = [f"{name}: {f}" for f in full.failures() + fast.failures()]
    return row, failures


HEADER = ["model", "ONNX ops", "rules fired", "kernel calls unfused / tvm / fused",
          "max rel err vs onnxruntime (logits)", "fused ms", "unfused/fused", "tvm/fused", "fused/onnxruntime"]


def _markdown(rows) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def main() -> int:
    from tvm_fusion.examples import EXAMPLES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(EXAMPLES), help=f"comma separated, of: {', '.join(EXAMPLES)}")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of all three builds + onnxruntime")
    ap.add_argument("--fast-rounds", type=int, default=15, help="interleaved rounds of fused + onnxruntime")
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in EXAMPLES]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(EXAMPLES)}")
    rows, failures = [], []
    for name in models:
        t0 = time.perf_counter()
        row, fail = _row(name, args.rounds, args.fast_rounds)
        rows.append(row)
        failures += fail
        print(f"{name}: done in {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
    print(f"\nllvm, batch 1; medians of {args.rounds} interleaved rounds (unfused/fused, tvm/fused) and "
          f"{args.fast_rounds} (fused ms, fused/onnxruntime)\n")
    print(_markdown(rows))
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
