"""ResNet-50, one batch-symbolic fused library against a fused library built for each batch, side by side.

    python benchmarks/dynamic_batch.py [--batches 1,8] [--rounds 5] [--target llvm]

The symbolic build (`--shape gpu_0/data_0=N<=MAXx3x224x224`, MAX the largest batch) and one static build
per batch run interleaved (one run of each per round, after a warm-up), on the same inputs; prints the
median latency of each, the ratio symbolic / static per batch, and the largest element-wise difference
between the two (the same kernels' arithmetic, so it should be ~0).
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8", help="comma-separated batch sizes")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--target", default="llvm")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]

    import tvm

    from tvm_fusion import build
    from tvm_fusion import example_model, import_onnx
    from tvm_fusion._tvm import relax
    from tvm_fusion.frontend.importer import SymDim
    from tvm_fusion.runtime import as_arrays

    dynamic = example_model("resnet50", dynamic_batch=True)
    name = "gpu_0/data_0"
    vm_of = lambda built: relax.VirtualMachine(built.executable, tvm.cpu())  # noqa: E731
    symbolic = vm_of(build(import_onnx(dynamic, {name: (SymDim("N", max(batches)), 3, 224, 224)}), args.target))
    static = {n: vm_of(build(import_onnx(dynamic, {name: (n, 3, 224, 224)}), args.target)) for n in batches}
    rng = np.random.default_rng(0)
    inputs = {n: tvm.runtime.tensor(rng.standard_normal((n, 3, 224, 224)).astype(np.float32)) for n in batches}
    times = {(kind, n): [] for n in batches for kind in ("symbolic", "static")}
    for n in batches:  # warm-up, and the two builds' outputs side by side
        a, b = as_arrays(symbolic["main"](inputs[n])), as_arrays(static[n]["main"](inputs[n]))
        diff = max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))
        print(f"batch {n}: max |symbolic - static| = {diff:.3g}")
    for _ in range(args.rounds):
        for n in batches:
            for kind, vm in (("symbolic", symbolic), ("static", static[n])):
                times[(kind, n)].append(vm.time_evaluator("main", tvm.cpu(), number=1, repeat=1)(inputs[n]).median)
    for n in batches:
        sym, sta = (statistics.median(times[(k, n)]) * 1e3 for k in ("symbolic", "static"))
        print(f"batch {n}: symbolic {sym:.1f} ms, static {sta:.1f} ms, symbolic / static {sym / sta:.2f}x "
              f"(medians of {args.rounds} interleaved rounds)")


if __name__ == "__main__":
    main()
