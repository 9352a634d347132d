"""The fuzz tests' oracle: fused and unfused builds against onnxruntime, element by element.

    check_against_onnxruntime(model, rules)  ->  the fused Built, or raises GraphMismatch / InvalidGraph

Every output of both builds must have onnxruntime's shape and dtype, and every element must hold
numerics' verdict (`error_stats`: `|got - ort| <= atol * rms(ort) + rtol * |ort|` with rtol and atol from
`TOLERANCES` for the output's dtype, integers exactly; NaN and +/-inf only where onnxruntime has the same).
A crash in import, fuse or build is a failure too (the graph is valid: onnxruntime ran it); a graph
onnxruntime refuses is the strategy's bug (InvalidGraph).

The unfused build shares import_onnx (our normalisations) with the fused one: "unfused" failing too points at the
import or at TVM, "fused" alone at a rule, its compute or its schedule.
"""

from __future__ import annotations

import numpy as np

from tvm_fusion.build import build
from tvm_fusion.compare import random_inputs
from tvm_fusion.frontend import import_onnx
from tvm_fusion.testing import error_stats, run_build

__all__ = ["GraphMismatch", "InvalidGraph", "check_against_onnxruntime", "elementwise_mismatch"]


class InvalidGraph(Exception):
    """onnxruntime refused the graph: the strategy drew a model that is not valid ONNX."""


class GraphMismatch(AssertionError):
    """A build's output differs from onnxruntime (shape, dtype, count or elements)."""


def elementwise_mismatch(got, ref) -> str | None:
    """Why `got` is not `ref` element by element (None when it is)."""
    got, ref = np.asarray(got), np.asarray(ref)
    if got.shape != ref.shape or got.dtype != ref.dtype:
        return f"shape {list(got.shape)} {got.dtype}, onnxruntime {list(ref.shape)} {ref.dtype}"
    stats = error_stats(got, ref)
    return None if stats.ok else stats.describe()


def _unique_node_names(model):
    """A copy whose repeated node names get a suffix: onnxruntime refuses duplicates, which ONNX allows (node
    names are for diagnostics only; the computation is the same)."""
    model = type(model).FromString(model.SerializeToString())
    seen: set[str] = set()
    for node in model.graph.node:
        if node.name and node.name in seen:
            i = 1
            while f"{node.name}__{i}" in seen:
                i += 1
            node.name = f"{node.name}__{i}"
        seen.add(node.name)
    return model


def _onnxruntime(model, inputs: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    model = _unique_node_names(model)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the model as written
    try:
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        return sess.run(None, inputs)
    except Exception as err:  # noqa: BLE001 - any refusal means the drawn graph is not valid
        raise InvalidGraph(f"onnxruntime refused the graph: {type(err).__name__}: {err}") from err


def check_against_onnxruntime(model, rules=None, seed: int = 0):
    """Build fused and unfused on llvm; each output must equal onnxruntime's (shape, dtype, every element)."""
    inputs = random_inputs(model, seed=seed)
    ref = _onnxruntime(model, inputs)
    arrays = [inputs[i.name] for i in model.graph.input if i.name in inputs]
    mod = import_onnx(model)
    fused = build(mod, "llvm", "fused", rules=rules)
    unfused = build(mod, "llvm", "unfused", rules=rules)
    problems = []
    for mode, built in (("unfused", unfused), ("fused", fused)):
        got = run_build(built, arrays)
        if len(got) != len(ref):
            problems.append(f"{mode}: {len(got)} outputs, onnxruntime {len(ref)}")
            continue
        for i, (g, r) in enumerate(zip(got, ref)):
            why = elementwise_mismatch(g, r)
            if why:
                problems.append(f"{mode} output {i} ({model.graph.output[i].name}): {why}")
    if problems:
        raise GraphMismatch("; ".join(problems))
    return fused
