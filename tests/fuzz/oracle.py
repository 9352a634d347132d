"""The fuzz tests' oracle: fused and unfused builds against onnxruntime, element by element.

    check_against_onnxruntime(model, rules)  ->  the fused Built, or raises GraphMismatch / InvalidGraph

Every output of both builds must have onnxruntime's shape and dtype, and every element must hold
numerics' verdict (`error_stats`: `|got - ort| <= atol * scale(ort) + rtol * |ort|` with rtol and atol from
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
from tvm_fusion.frontend import SymDim, import_onnx
from tvm_fusion.testing import error_stats, run_build

__all__ = ["GraphMismatch", "InvalidGraph", "check_against_onnxruntime", "elementwise_mismatch", "symbolic_shapes"]


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


def symbolic_shapes(model, sizes: dict) -> tuple[dict, dict]:
    """(shapes for import_onnx: the graph inputs' dim_params as SymDims, the concrete input shapes: each
    dim_param at its size in `sizes`, else 1)."""
    symbolic, concrete = {}, {}
    for inp in model.graph.input:
        dims = inp.type.tensor_type.shape.dim
        if any(d.dim_param for d in dims):
            symbolic[inp.name] = tuple(SymDim(d.dim_param) if d.dim_param else d.dim_value for d in dims)
            concrete[inp.name] = [sizes.get(d.dim_param, 1) if d.dim_param else d.dim_value for d in dims]
    return symbolic, concrete


def check_against_onnxruntime(model, rules=None, seed: int = 0, unfused: bool = True, sizes: dict | None = None):
    """Build fused and unfused on llvm; each output must equal onnxruntime's (shape, dtype, every element).
    `unfused=False`: the fused build only (kernels.py's single kernels at real sizes): the unfused build runs
    TVM's unscheduled kernels, which doubles a kernel's check (288 -> 288 3x3 conv + ReLU on 32 x 32, one
    thread: 1.3 s fused only, 2.5 s both) and tests no code of ours beyond the import the fused build shares;
    onnxruntime is the oracle either way.
    `sizes` ({dim_param: size}): the inputs' symbolic dims (a dynamic batch) stay symbolic in the builds
    (import_onnx with SymDims) and take these sizes in the inputs."""
    symbolic, concrete = symbolic_shapes(model, sizes or {})
    inputs = random_inputs(model, shapes=concrete, seed=seed)
    ref = _onnxruntime(model, inputs)
    arrays = [inputs[i.name] for i in model.graph.input if i.name in inputs]
    mod = import_onnx(model, shapes=symbolic or None)
    builds = [("fused", build(mod, "llvm", "fused", rules=rules))]
    if unfused:
        builds.insert(0, ("unfused", build(mod, "llvm", "unfused", rules=rules)))
    fused = builds[-1][1]
    problems = []
    for mode, built in builds:
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
