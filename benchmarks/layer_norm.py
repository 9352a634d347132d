"""The fused LayerNorm kernel alone on a BERT-base block of rows: CPU time per call, one thread.

    python benchmarks/layer_norm.py                          # 128 x 768, this CPU's target
    python benchmarks/layer_norm.py --rows 512 --target '{"kind":"llvm","mcpu":"x86-64-v3"}'

Builds LayerNormalization (and Add -> LayerNormalization) of [rows, C] fused, compiles the PrimFunc the fused
build scheduled alone and times it on inputs of mean 1e3: `--rounds` blocks of `--number` calls, the median and
the minimum of the per-block mean CPU time (time.process_time), TVM's pool at one thread. To compare two
versions of the compute, run it on both checkouts.
"""

from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("TVM_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from tvm_fusion._tvm import tvm  # noqa: E402
from tvm_fusion.build.builder import build, resolve_target  # noqa: E402
from tvm_fusion.frontend.importer import import_onnx  # noqa: E402
from tvm_fusion.testing import GraphBuilder  # noqa: E402
from cpu_speed import _block  # noqa: E402


def _model(rows: int, c: int, residual: bool):
    g = GraphBuilder(0)
    x = g.input("x", [rows, c])
    h = g.op("Add", [x, g.input("r", [rows, c])]) if residual else x
    y = g.op("LayerNormalization", [h, g.const(np.ones(c, np.float32)), g.const(np.zeros(c, np.float32))],
             axis=-1, epsilon=1e-5)
    return g.model([y], opset=18)


def _times_us(fn, rounds: int, number: int) -> tuple[float, float]:
    """Median and best CPU microseconds per call over `rounds` blocks of `number` calls."""
    fn()
    means = [_block(fn, number)["cpu"] for _ in range(rounds)]
    return 1e6 * statistics.median(means), 1e6 * min(means)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--c", type=int, default=768)
    ap.add_argument("--target", default="llvm")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--number", type=int, default=300)
    args = ap.parse_args()
    target = resolve_target(args.target)
    print(f"target {target}")
    for residual in (False, True):
        rule = "add_layer_norm" if residual else "layer_norm"
        fused = build(import_onnx(_model(args.rows, args.c, residual)), target, "fused")
        (group,) = [g for g in fused.fused.groups if g.rule == rule]
        func = fused.fused.mod[group.function].with_attr("global_symbol", "kernel")
        kernel = tvm.compile(tvm.IRModule({"kernel": func}), target=target)["kernel"]
        rng = np.random.default_rng(0)
        tensors = [tvm.runtime.tensor((rng.normal(0, 1, [int(d) for d in p.shape]) + (1e3 if i == 0 else 0))
                                      .astype(str(p.dtype)), tvm.cpu()) for i, p in enumerate(func.params)]
        median, best = _times_us(lambda: kernel(*tensors), args.rounds, args.number)
        print(f"{rule} {args.rows}x{args.c}: median {median:.1f} us, min {best:.1f} us per call")


if __name__ == "__main__":
    main()
