"""The README's "Models from real exporters" table: `python benchmarks/zoo.py`.

For each tests/zoo model (imported through the simplifier, on the host CPU): ops covered by our rules (all
ops, and convolutions / matmuls / layer norms / softmax on their own), groups per rule, kernel calls per
inference unfused / tvm / fused, and the fused build's max relative error against onnxruntime on the
entry's own inputs, and fused latency against onnxruntime (each timed alone, all cores);
then what each model leaves to TVM's own fusion.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "zoo"))
from corpus import ENTRIES, model_path  # noqa: E402
from corpus import make_inputs  # noqa: E402
from test_zoo import imported, reference, run_fused_llvm  # noqa: E402

from tvm_fusion._tvm import relax, tvm  # noqa: E402
from tvm_fusion.compare import run_onnxruntime  # noqa: E402

from tvm_fusion.build import resolve_target  # noqa: E402
from tvm_fusion.compile import kernel_counts  # noqa: E402
from tvm_fusion.explain import explain  # noqa: E402

KEY_OPS = {"conv": "relax.nn.conv2d", "matmul": "relax.matmul", "layer_norm": "relax.nn.layer_norm",
           "softmax": "relax.nn.softmax"}


def _share(ex, op: str) -> str:
    total = ex.ops_before.get(op, 0)
    return f"{total - ex.ops_left.get(op, 0)}/{total}" if total else "-"


def latency_ms(name: str, built, repeat: int = 5, number: int = 20) -> tuple[float, float]:
    """(fused ms, onnxruntime ms): medians of `repeat` means over `number` runs, one runtime after the other
    (interleaving them, onnxruntime's spinning worker threads slowed TVM's runs about 100x)."""
    import onnx

    feeds, dev = make_inputs(name), tvm.cpu()
    vm = relax.VirtualMachine(built.executable, dev)
    args = [tvm.runtime.tensor(feeds[k], dev) for k in ENTRIES[name]["inputs"]]
    fused = vm.time_evaluator("main", dev, number=number, repeat=repeat)(*args).median
    sess, _ = run_onnxruntime(onnx.load(str(model_path(name))), feeds)
    sess.run(None, feeds)
    ort = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            sess.run(None, feeds)
        ort.append((time.perf_counter() - start) / number)
    del sess
    return 1e3 * fused, 1e3 * statistics.median(ort)


def main() -> None:
    cpu = resolve_target("llvm")
    print("| model | exporter / opset | ops covered | conv | matmul | layer_norm | softmax | groups per rule "
          "| kernel calls unfused / tvm / fused | fused vs onnxruntime max rel error | fused ms | fused / onnxruntime |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    left = {}
    for name, entry in ENTRIES.items():
        mod = imported(name)
        ex = explain(mod, cpu)
        built, out = run_fused_llvm(name)
        err = max(float(np.abs(a - r).max() / max(np.abs(r).max(), 1e-30)) for a, r in zip(out, reference(name)))
        calls = [kernel_counts(mod, cpu, m)["kernel_calls"] for m in ("unfused", "tvm")] + [built.kernel_calls]
        groups = ", ".join(f"{k} {v}" for k, v in built.counts.items() if v)
        fused_ms, ort_ms = latency_ms(name, built)
        print(f"| {name} | {entry['exporter']} {entry['opset']} | {ex.covered}/{sum(ex.ops_before.values())} "
              f"({ex.share:.0%}) | " + " | ".join(_share(ex, op) for op in KEY_OPS.values())
              + f" | {groups} | {' / '.join(map(str, calls))} | {err:.1e} | {fused_ms:.2f} | {fused_ms / ort_ms:.2f}x |",
              flush=True)
        left[name] = ", ".join(f"{op.replace('relax.', '')} x{n}" for op, n in sorted(ex.ops_left.items()))
    print()
    for name, ops in left.items():
        print(f"- {name}: {ops}")


if __name__ == "__main__":
    main()
