"""A fused llvm build's kernels alone: CPU time per call, one thread, per kernel (`--match` picks them).

    python benchmarks/kernels.py --model ppocr_det --match conv2d_transpose     # tests/zoo entry
    python benchmarks/kernels.py --model resnet50 --match conv2d --rounds 9      # a light architecture
    python benchmarks/kernels.py --model shufflenet --target '{"kind":"llvm","mcpu":"x86-64-v3"}'

Builds the model fused, takes every PrimFunc whose name contains `--match` (as the fused build scheduled
it: rules' kernels and leftovers alike), compiles it alone and times it on random inputs of its parameter
shapes: `--rounds` blocks of about `--block-ms`, the median of the per-block mean CPU time
(time.process_time), TVM's pool at one thread. Kernels of the same PrimFunc called at several sites are
timed once. To compare two versions of a schedule, run it on both checkouts: the names and shapes line up.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_speed import _block, _light, _zoo, model_names, set_tvm_threads

from tvm_fusion._tvm import tirx, tvm
from tvm_fusion.build import build, resolve_target


def _cpu_ms(fn, rounds: int, block_ms: float) -> float:
    """Median over `rounds` blocks of about `block_ms` of the mean CPU time per call, in ms."""
    fn()
    number = max(1, int(block_ms / 1e3 / max(_block(fn, 1)["cpu"], 1e-6)))
    return 1e3 * statistics.median(_block(fn, number)["cpu"] for _ in range(rounds))


def _random(shape, dtype: str, rng) -> np.ndarray:
    if dtype.startswith(("int", "uint")):
        return rng.integers(0, 2, size=shape).astype(dtype)  # indices and masks: 0 / 1 stay in bounds
    return rng.normal(size=shape).astype(dtype)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="ppocr_det", help=f"one of {', '.join(model_names())}")
    ap.add_argument("--match", default="", help="time only the kernels whose name contains this")
    ap.add_argument("--target", default="llvm")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--block-ms", type=float, default=150.0)
    args = ap.parse_args(argv)
    kinds = model_names()
    if args.model not in kinds:
        ap.error(f"unknown model {args.model!r}; use one of {', '.join(kinds)}")
    target = resolve_target(args.target)
    if target.kind.name != "llvm":
        ap.error(f"--target must be an llvm (CPU) target, got {target.kind.name}")
    mod = (_light if kinds[args.model] == "light" else _zoo)(args.model)[0]
    built = build(mod, target, "fused")
    set_tvm_threads(1)
    rng, dev = np.random.default_rng(0), tvm.cpu()
    for gv, func in sorted(built.module.functions.items(), key=lambda kv: kv[0].name_hint):
        if not (isinstance(func, tirx.PrimFunc) and args.match in gv.name_hint):
            continue
        if not all(isinstance(d, tirx.IntImm) for p in func.params for d in p.shape):
            print(f"{gv.name_hint:40s} skipped: a symbolic dim")
            continue
        kernel = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target)["main"]
        shapes = [[int(d) for d in p.shape] for p in func.params]
        tensors = [tvm.runtime.tensor(_random(s, str(p.dtype), rng), dev) for s, p in zip(shapes, func.params)]
        ms = _cpu_ms(lambda kernel=kernel, tensors=tensors: kernel(*tensors), args.rounds, args.block_ms)
        print(f"{gv.name_hint:40s} {' x '.join(map(str, shapes))}: {ms:.3f} ms CPU", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
