"""The README's "Models from real exporters" table: `python benchmarks/zoo.py`.

For each tests/zoo model (imported through the simplifier, on the host CPU): ops covered by our rules (all
ops, and convolutions / matmuls / layer norms / softmax on their own), groups per rule, kernel calls per
inference unfused / tvm / fused, and the fused build's max relative error against onnxruntime on the
entry's own inputs; then what each model leaves to TVM's own fusion.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "zoo"))
from corpus import ENTRIES, model_path  # noqa: E402
from test_zoo import imported, reference, run_fused_llvm  # noqa: E402

from tvm_fusion.build import resolve_target  # noqa: E402
from tvm_fusion.compile import kernel_counts  # noqa: E402
from tvm_fusion.explain import explain  # noqa: E402

KEY_OPS = {"conv": "relax.nn.conv2d", "matmul": "relax.matmul", "layer_norm": "relax.nn.layer_norm",
           "softmax": "relax.nn.softmax"}


def _share(ex, op: str) -> str:
    total = ex.ops_before.get(op, 0)
    return f"{total - ex.ops_left.get(op, 0)}/{total}" if total else "-"


def main() -> None:
    cpu = resolve_target("llvm")
    print("| model | exporter / opset | ops covered | conv | matmul | layer_norm | softmax | groups per rule "
          "| kernel calls unfused / tvm / fused | fused vs onnxruntime max rel error |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    left = {}
    for name, entry in ENTRIES.items():
        mod = imported(name)
        ex = explain(mod, cpu)
        built, out = run_fused_llvm(name)
        err = max(float(np.abs(a - r).max() / max(np.abs(r).max(), 1e-30)) for a, r in zip(out, reference(name)))
        calls = [kernel_counts(mod, cpu, m)["kernel_calls"] for m in ("unfused", "tvm")] + [built.kernel_calls]
        groups = ", ".join(f"{k} {v}" for k, v in built.counts.items() if v)
        print(f"| {name} | {entry['exporter']} {entry['opset']} | {ex.covered}/{sum(ex.ops_before.values())} "
              f"({ex.share:.0%}) | " + " | ".join(_share(ex, op) for op in KEY_OPS.values())
              + f" | {groups} | {' / '.join(map(str, calls))} | {err:.1e} |", flush=True)
        left[name] = ", ".join(f"{op.replace('relax.', '')} x{n}" for op, n in sorted(ex.ops_left.items()))
    print()
    for name, ops in left.items():
        print(f"- {name}: {ops}")


if __name__ == "__main__":
    main()
