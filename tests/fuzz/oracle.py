"""The fuzz tests' oracle: fused and unfused builds against onnxruntime, element by element.

    check_against_onnxruntime(model, rules)  ->  the fused Built, or raises GraphMismatch / InvalidGraph

Every output of both builds must have onnxruntime's shape and dtype, and every element must hold
numerics' verdict (`error_stats`: `|got - ort| <= atol * scale(ort) + rtol * |ort|` with rtol and atol from
`TOLERANCES` for the output's dtype, integers exactly; NaN and +/-inf only where onnxruntime has the same).
A crash in import, fuse or build is a failure too (the graph is valid: onnxruntime ran it); a graph
onnxruntime refuses is the strategy's bug (InvalidGraph).

Symbolic dims (a graph input's dim_param, the random graphs' batch "N") stay symbolic in the builds; one build
runs at each of `sizes`. A float16 model is judged against onnxruntime's float16 run with float16's tolerance,
its noise per element how far onnxruntime's float32 run of the same values moves when each node's output is
rounded to float16 (the roundings the builds make between kernels, which onnxruntime's fp16 kernels avoid
inside an op);
a bfloat16 model (onnxruntime has no bfloat16 kernels for most ops on the CPU) against onnxruntime's run of
the same graph in float32 (`as_float32`: its bfloat16 weights widened exactly) on the same bfloat16 inputs
widened, with bfloat16's tolerance, as test_precision.py does; the build's outputs must be bfloat16. That
reference keeps every intermediate in float32 where the builds round each kernel's output to bfloat16: over a
deep graph the roundings add up past the tolerance where values cancel (unfused included: TVM's own ops). So
the reference's noise per element (numerics.error_stats) is how far onnxruntime's run moves when each node's
output is rounded to bfloat16 (`rounded_per_node`), as the reference noise of an optimized run is elsewhere.

The unfused build shares import_onnx (our normalisations) with the fused one: "unfused" failing too points at the
import or at TVM, "fused" alone at a rule, its compute or its schedule.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from tvm_fusion.build.builder import build
from tvm_fusion.check.compare import random_inputs
from tvm_fusion.frontend.importer import SymDim, import_onnx
from tvm_fusion.precision import numpy_dtype
from tvm_fusion.frontend.recurrent import _graphs
from tvm_fusion.testing import error_stats, run_build

__all__ = ["BATCHES", "GraphMismatch", "InvalidGraph", "as_float32", "check_against_onnxruntime", "elementwise_mismatch",
           "model_inputs", "reference_outputs", "rounded_per_node", "symbolic_shapes"]

#: the sizes a symbolic batch ("N", the random graphs' dim_param) runs at by default: one build, two runs
BATCHES = ({"N": 1}, {"N": 3})


class InvalidGraph(Exception):
    """onnxruntime refused the graph: the strategy drew a model that is not valid ONNX."""


class GraphMismatch(AssertionError):
    """A build's output differs from onnxruntime (shape, dtype, count or elements)."""


def elementwise_mismatch(got, ref, dtype: str | None = None, noise=None) -> str | None:
    """Why `got` is not `ref` element by element (None when it is). `dtype`: the dtype `got` must have and is
    judged as, when it is not the reference's (a bfloat16 build against a float32 reference); `noise`: the
    reference's own per element (numerics.error_stats)."""
    got, ref = np.asarray(got), np.asarray(ref)
    want = numpy_dtype(dtype) if dtype else ref.dtype
    if got.shape != ref.shape or got.dtype != want:
        return f"shape {list(got.shape)} {got.dtype}, onnxruntime {list(ref.shape)} {want}"
    stats = error_stats(got, ref, dtype, noise)
    return None if stats.ok else stats.describe()


def as_float32(model: onnx.ModelProto) -> onnx.ModelProto:
    """The float32 graph of a bfloat16 model (testing.as_float16's inverse; exact: bfloat16 values are float32
    values): initializers and Constant nodes widened, inputs, outputs and value infos declared float32."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for g in _graphs(out.graph):
        constants = [a.t for n in g.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"]
        for t in [*g.initializer, *constants]:
            if t.data_type in (TensorProto.BFLOAT16, TensorProto.FLOAT16):
                t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name))
        for v in [*g.input, *g.output, *g.value_info]:
            if v.type.tensor_type.elem_type in (TensorProto.BFLOAT16, TensorProto.FLOAT16):
                v.type.tensor_type.elem_type = TensorProto.FLOAT
    return out


def rounded_per_node(model: onnx.ModelProto, to: int = TensorProto.BFLOAT16) -> onnx.ModelProto:
    """The float32 `model` with every float32 output of a top-level node rounded to `to` (bfloat16 or float16:
    Cast to it and back): the roundings a half computation makes between its ops."""
    out = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in [*out.graph.value_info, *out.graph.output]}
    nodes = []
    for node in out.graph.node:
        nodes.append(node)
        for k, name in enumerate(node.output):
            if types.get(name) != TensorProto.FLOAT:
                continue
            node.output[k] = f"{name}__exact"
            nodes.append(onnx.helper.make_node("Cast", [node.output[k]], [f"{name}__bf16"], to=to))
            nodes.append(onnx.helper.make_node("Cast", [f"{name}__bf16"], [name], to=TensorProto.FLOAT))
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    del out.graph.value_info[:]
    return out


def _is_float16(model) -> bool:
    return any(v.type.tensor_type.elem_type == TensorProto.FLOAT16 for v in [*model.graph.input, *model.graph.output])


def _is_bfloat16(model) -> bool:
    return any(v.type.tensor_type.elem_type == TensorProto.BFLOAT16 for v in [*model.graph.input, *model.graph.output])


def model_inputs(model, shapes: dict, seed: int) -> dict:
    """compare.random_inputs; a bfloat16 input gets the float32 values rounded (random_inputs has no bfloat16)."""
    if not _is_bfloat16(model):
        return random_inputs(model, shapes=shapes, seed=seed)
    halves = {i.name for i in model.graph.input if i.type.tensor_type.elem_type == TensorProto.BFLOAT16}
    inputs = random_inputs(as_float32(model), shapes=shapes, seed=seed)
    return {k: v.astype(numpy_dtype("bfloat16")) if k in halves else v for k, v in inputs.items()}


def reference_outputs(model, inputs: dict) -> tuple[list[np.ndarray], list, list]:
    """onnxruntime's outputs for `inputs`, per output the dtype the builds' output is judged as (None: the
    reference's own) and the reference's noise (None: none); a bfloat16 model runs as float32 (see the
    module docstring)."""
    n = len(model.graph.output)
    if _is_float16(model):  # onnxruntime's float16 run; noise: the roundings of a float16 computation between ops
        wide = {k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in inputs.items()}
        exact = _onnxruntime(as_float32(model), wide)
        rounded = _onnxruntime(rounded_per_node(as_float32(model), TensorProto.FLOAT16), wide)
        own = _onnxruntime(model, inputs)
        return own, [None] * n, [np.abs(r.astype(np.float64) - e) if o.dtype == np.float16 else None
                                 for o, e, r in zip(own, exact, rounded)]
    if not _is_bfloat16(model):
        return _onnxruntime(model, inputs), [None] * n, [None] * n
    bf16 = numpy_dtype("bfloat16")
    wide = {k: v.astype(np.float32) if v.dtype == bf16 else v for k, v in inputs.items()}
    dtypes = ["bfloat16" if o.type.tensor_type.elem_type == TensorProto.BFLOAT16 else None for o in model.graph.output]
    exact = _onnxruntime(as_float32(model), wide)
    rounded = _onnxruntime(rounded_per_node(as_float32(model)), wide)
    noise = [np.abs(r.astype(np.float64) - e) if d else None for d, e, r in zip(dtypes, exact, rounded)]
    return exact, dtypes, noise


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


def symbolic_shapes(model, sizes: dict, bounds: dict | None = None) -> tuple[dict, dict]:
    """(shapes for import_onnx: the graph inputs' dim_params as SymDims, with their upper bound in `bounds`
    where it names one, the concrete input shapes: each dim_param at its size in `sizes`, else 1)."""
    symbolic, concrete, bounds = {}, {}, bounds or {}
    for inp in model.graph.input:
        dims = inp.type.tensor_type.shape.dim
        if any(d.dim_param for d in dims):
            symbolic[inp.name] = tuple(SymDim(d.dim_param, bounds.get(d.dim_param)) if d.dim_param else d.dim_value
                                       for d in dims)
            concrete[inp.name] = [sizes.get(d.dim_param, 1) if d.dim_param else d.dim_value for d in dims]
    return symbolic, concrete


def check_against_onnxruntime(model, rules=None, seed: int = 0, unfused: bool = True, sizes=None, bounds=None):
    """Build fused and unfused on llvm; each output must equal onnxruntime's (shape, dtype, every element).
    `unfused=False`: the fused build only (kernels.py's single kernels at real sizes): the unfused build runs
    TVM's unscheduled kernels, which doubles a kernel's check (288 -> 288 3x3 conv + ReLU on 32 x 32, one
    thread: 1.3 s fused only, 2.5 s both) and tests no code of ours beyond the import the fused build shares;
    onnxruntime is the oracle either way.
    `sizes` ({dim_param: size}, or a list of them: one run each; default BATCHES): the inputs' symbolic dims
    (a dynamic batch) stay symbolic in the builds (import_onnx with SymDims) and take these sizes in the
    inputs (a dim_param not named: 1). A model without symbolic dims runs once. `bounds` ({dim_param: upper
    bound}): those dims are built with that bound (`--shape x=N<=16x...`: memory planning sizes by it)."""
    runs = list(BATCHES if sizes is None else sizes if isinstance(sizes, (list, tuple)) else [sizes])
    symbolic, _ = symbolic_shapes(model, runs[0], bounds)
    runs = runs if symbolic else runs[:1]
    checks = []  # (what, the inputs in graph order, reference, judged dtype): onnxruntime first, before building
    for size in runs:
        inputs = model_inputs(model, symbolic_shapes(model, size)[1], seed)
        ref, dtypes, noise = reference_outputs(model, inputs)
        at = f" at {', '.join(f'{k}={v}' for k, v in size.items())}" if len(runs) > 1 else ""
        checks.append((at, [inputs[i.name] for i in model.graph.input if i.name in inputs], ref, dtypes, noise))
    mod = import_onnx(model, shapes=symbolic or None)
    builds = [("fused", build(mod, "llvm", "fused", rules=rules))]
    if unfused:
        builds.insert(0, ("unfused", build(mod, "llvm", "unfused", rules=rules)))
    problems = [p for mode, built in builds for check in checks for p in _problems(model, mode, built, *check)]
    if problems:
        raise GraphMismatch("; ".join(problems))
    return builds[-1][1]


def _problems(model, mode: str, built, at: str, arrays: list, ref: list, dtypes: list, noise: list) -> list[str]:
    got = run_build(built, arrays)
    if len(got) != len(ref):
        return [f"{mode}{at}: {len(got)} outputs, onnxruntime {len(ref)}"]
    whys = [(i, elementwise_mismatch(*args)) for i, args in enumerate(zip(got, ref, dtypes, noise))]
    return [f"{mode} output {i} ({model.graph.output[i].name}){at}: {why}" for i, why in whys if why]
