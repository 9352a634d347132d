"""The fused llvm build's ConvTranspose kernels alone: CPU time per call, one thread.

    python benchmarks/conv_transpose.py                      # ppocr_det (tests/zoo), this CPU's target
    python benchmarks/conv_transpose.py --rounds 9 --block-ms 200

Builds the model fused, takes every PrimFunc whose name says `conv2d_transpose` (as the fused build
scheduled it), compiles it alone and times it on random inputs of its parameter shapes: `--rounds`
blocks of about `--block-ms`, the median of the per-block mean CPU time (time.process_time), TVM's pool
at one thread.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_speed import _block, _zoo, set_tvm_threads

from tvm_fusion._tvm import tirx, tvm
from tvm_fusion.build import build, resolve_target


def _cpu_ms(fn, rounds: int, block_ms: float) -> float:
    """Median over `rounds` blocks of about `block_ms` of the mean CPU time per call, in ms."""
    fn()
    number = max(1, int(block_ms / 1e3 / max(_block(fn, 1)["cpu"], 1e-6)))
    return 1e3 * statistics.median(_block(fn, number)["cpu"] for _ in range(rounds))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="ppocr_det", help="a tests/zoo corpus entry")
    ap.add_argument("--target", default="llvm")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--block-ms", type=float, default=150.0)
    args = ap.parse_args(argv)
    target = resolve_target(args.target)
    built = build(_zoo(args.model)[0], target, "fused")
    set_tvm_threads(1)
    rng, dev = np.random.default_rng(0), tvm.cpu()
    for gv, func in built.module.functions.items():
        if not (isinstance(func, tirx.PrimFunc) and "conv2d_transpose" in gv.name_hint):
            continue
        kernel = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target)["main"]
        shapes = [[int(d) for d in p.shape] for p in func.params]
        tensors = [tvm.runtime.tensor(rng.normal(size=s).astype("float32"), dev) for s in shapes]
        ms = _cpu_ms(lambda kernel=kernel, tensors=tensors: kernel(*tensors), args.rounds, args.block_ms)
        print(f"{gv.name_hint:40s} {' x '.join(map(str, shapes))}: {ms:.3f} ms CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
