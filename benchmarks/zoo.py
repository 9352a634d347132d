"""The corpus table of docs/models.md ("The corpus, fused"): `python benchmarks/zoo.py [--threads N] [NAME ...]`
(default: every corpus model, all cores; `--threads 1` times TVM and onnxruntime on one thread each, the
steadier comparison on a host that other jobs load).

For each corpus model (tests/zoo: the checked-in exports and the wheels' pretrained models, imported
through the simplifier, on the host CPU): ops covered by our rules (all ops, and convolutions / matmuls /
layer norms / softmax / erf (GELU) on their own), groups per rule, kernel calls per
inference unfused / tvm / fused, and the fused build's max relative error against onnxruntime on the
entry's own inputs, and fused latency against onnxruntime (each timed alone, all cores);
then what each model leaves to TVM's own fusion.
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

import numpy as np

THREADS = int(sys.argv[sys.argv.index("--threads") + 1]) if "--threads" in sys.argv else None
if THREADS:  # before TVM's thread pool starts
    os.environ["TVM_NUM_THREADS"] = str(THREADS)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "zoo"))
from corpus import ENTRIES, model_path  # noqa: E402
from cpu_speed import _block  # noqa: E402
from corpus import make_inputs  # noqa: E402
from test_zoo import imported, reference, run_llvm  # noqa: E402

import pytest  # noqa: E402

from tvm_fusion._tvm import relax, tvm  # noqa: E402
from tvm_fusion.check.compare import run_onnxruntime  # noqa: E402

from tvm_fusion.build.builder import resolve_target  # noqa: E402
from tvm_fusion.deploy.compile import kernel_counts  # noqa: E402
from tvm_fusion.check.explain import explain  # noqa: E402

KEY_OPS = {"conv": "relax.nn.conv2d", "matmul": "relax.matmul", "layer_norm": "relax.nn.layer_norm",
           "softmax": "relax.nn.softmax", "erf (GELU)": "relax.erf"}


def _share(ex, op: str) -> str:
    total = ex.ops_before.get(op, 0)
    return f"{total - ex.ops_left.get(op, 0)}/{total}" if total else "-"


def latency_ms(name: str, built, repeat: int = 5, number: int = 20) -> tuple[float, float]:
    """(fused ms, onnxruntime ms): medians of `repeat` means over `number` runs. On all cores the two are
    timed one after the other (interleaving them, onnxruntime's spinning worker threads slowed TVM's runs
    about 100x); with --threads the rounds alternate (TVM, onnxruntime, TVM, ...), so load from other jobs
    falls on both."""
    import onnx

    feeds, dev = make_inputs(name), tvm.cpu()
    vm = relax.VirtualMachine(built.executable, dev)
    args = [tvm.runtime.tensor(feeds[k], dev) for k in ENTRIES[name]["inputs"]]
    sess, _ = run_onnxruntime(onnx.load(str(model_path(name))), feeds, threads=THREADS)
    runs = {"fused": lambda: vm["main"](*args), "onnxruntime": lambda: sess.run(None, feeds)}
    for run in runs.values():
        run()  # warm up
    if not THREADS:
        fused = vm.time_evaluator("main", dev, number=number, repeat=repeat)(*args).median
        return 1e3 * fused, 1e3 * statistics.median(_block(runs["onnxruntime"], number)["wall"] for _ in range(repeat))
    times = {k: [] for k in runs}
    for _ in range(repeat):
        for key, run in runs.items():
            times[key].append(_block(run, number)["wall"])
    return 1e3 * statistics.median(times["fused"]), 1e3 * statistics.median(times["onnxruntime"])


def main(names: list[str]) -> None:
    cpu = resolve_target("llvm")
    print("| model | exporter / opset | ops covered | " + " | ".join(KEY_OPS) + " | groups per rule "
          "| kernel calls unfused / tvm / fused | fused vs onnxruntime max rel error | fused ms | fused / onnxruntime |")
    print("|---" * (8 + len(KEY_OPS)) + "|")
    left = {}
    for name in names:
        entry = ENTRIES[name]
        try:
            mod = imported(name)
        except pytest.skip.Exception as err:  # a wheel's model where the package index is unreachable
            print(f"| {name} | not fetched: {err} |")
            continue
        ex = explain(mod, cpu)
        built, out = run_llvm(name)
        err = max(float(np.abs(a - r).max() / max(np.abs(r).max(), 1e-30)) for a, r in zip(out, reference(name)))
        calls = [kernel_counts(mod, cpu, m)["kernel_calls"] for m in ("unfused", "tvm")] + [built.kernel_calls]
        groups = ", ".join(f"{k} {v}" for k, v in built.counts.items() if v)
        fused_ms, ort_ms = latency_ms(name, built, repeat=9 if THREADS else 5)
        print(f"| {name} | {entry['exporter']} {entry['opset']} | {ex.covered}/{sum(ex.ops_before.values())} "
              f"({ex.share:.0%}) | " + " | ".join(_share(ex, op) for op in KEY_OPS.values())
              + f" | {groups} | {' / '.join(map(str, calls))} | {err:.1e} | {fused_ms:.2f} | {fused_ms / ort_ms:.2f}x |",
              flush=True)
        left[name] = ", ".join(f"{op.replace('relax.', '')} x{n}" for op, n in sorted(ex.ops_left.items()))
    print()
    for name, ops in left.items():
        print(f"- {name}: {ops}")


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--threads" in args:
        del args[args.index("--threads"):args.index("--threads") + 2]
    unknown = [n for n in args if n not in ENTRIES]
    if unknown:
        raise SystemExit(f"unknown corpus model(s) {unknown}; known: {', '.join(ENTRIES)}")
    main(args or list(ENTRIES))
