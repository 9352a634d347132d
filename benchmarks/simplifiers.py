"""Compare ONNX simplifiers on the zoo corpus: `python benchmarks/simplifiers.py`.

For onnxsim, onnxslim and onnxscript's optimizer, on every corpus model with its inputs bound: seconds,
nodes before -> after, what is left of the exporter's clutter (Shape / Constant / Identity nodes),
the share of surviving nodes that keep their ONNX name, the op types it introduced, whether TVM's importer
then takes the model, and whether onnxruntime still gives the same outputs (max abs difference).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "zoo"))
from corpus import ENTRIES, make_inputs, model_path, shapes  # noqa: E402

from tvm_fusion.frontend import simplify  # noqa: E402
from tvm_fusion.errors import FusionError  # noqa: E402
from tvm_fusion.frontend.importer import import_onnx  # noqa: E402

CLUTTER = ("Shape", "Constant", "Identity")


def _run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def main() -> None:
    totals: dict[str, Counter] = {}
    print(f"{'model':22s} {'simplifier':10s} {'s':>5s} {'nodes':>9s} {'clutter':>7s} {'names':>5s} "
          f"{'tvm':4s} {'max|d|':>8s} new ops")
    for name in ENTRIES:
        proto = onnx.load(str(model_path(name)))
        feeds = make_inputs(name)
        ref = _run(proto, feeds)
        for tool in simplify.SIMPLIFIERS:
            start = time.perf_counter()
            try:
                out = simplify.run_simplifier(tool, simplify.bind_input_shapes(proto, shapes(name)))
            except Exception as err:  # noqa: BLE001 - a comparison reports every failure
                print(f"{name:22s} {tool:10s} FAILED {type(err).__name__}: {str(err)[:80]}")
                totals.setdefault(tool, Counter())["failed"] += 1
                continue
            secs = time.perf_counter() - start
            before = {n.name for n in proto.graph.node}
            kept = sum(n.name in before for n in out.graph.node) / max(1, len(out.graph.node))
            clutter = sum(n.op_type in CLUTTER for n in out.graph.node)
            new_ops = sorted({f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in out.graph.node}
                             - {n.op_type for n in proto.graph.node})
            try:
                import_onnx(out, shapes(name), simplify=False)
                tvm_ok = "ok"
            except FusionError:
                tvm_ok = "FAIL"
            try:
                diff = max(float(np.max(np.abs(a - b))) for a, b in zip(_run(out, feeds), ref))
            except Exception:  # noqa: BLE001
                diff = float("nan")
            t = totals.setdefault(tool, Counter())
            t["seconds"] += secs
            t["clutter"] += clutter
            t["tvm_fail"] += tvm_ok != "ok"
            print(f"{name:22s} {tool:10s} {secs:5.2f} {len(proto.graph.node):4d}->{len(out.graph.node):<4d} "
                  f"{clutter:7d} {kept:5.0%} {tvm_ok:4s} {diff:8.1e} {','.join(new_ops)}")
    for tool, t in totals.items():
        print(f"total {tool:10s}: {t['seconds']:.1f} s, clutter left {t['clutter']}, TVM import failures "
              f"{t['tvm_fail']}, simplifier failures {t['failed']}")


if __name__ == "__main__":
    main()
