"""ONNX -> Relax: `import_onnx` loads, sanitises, binds shapes, imports and folds constants.

The result is what the pattern tables match against: weights are constants, dead bindings are gone,
an opset-9 `Sum`/`Max`/`Min` of two tensors is an `add`/`maximum`/`minimum`, a `Clip` with constant
bounds is `clip`, an inference `Dropout` is gone (see NORMALIZATIONS), and every binding knows the ONNX node it came from
(module attribute `tvm_fusion.onnx_nodes`: relax var name -> ONNX node name).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import onnx

from . import _tvm
from . import simplify as _simplify
from ._tvm import dpl, relax, tvm
from .errors import FusionError

__all__ = ["import_onnx", "load_onnx", "parse_shape", "onnx_node_names"]

SHAPE_SYNTAX = "--shape NAME=1x3x224x224"
ONNX_NODES_ATTR = "tvm_fusion.onnx_nodes"


def load_onnx(model) -> onnx.ModelProto:
    """A ModelProto from a path or a ModelProto, with a clear error for anything else."""
    if isinstance(model, onnx.ModelProto):
        return model
    path = Path(os.fspath(model))
    if not path.exists():
        raise FusionError(f"{path}: no such file (expected an ONNX model, e.g. model.onnx)")
    if path.is_dir():
        raise FusionError(f"{path}: is a directory, expected an ONNX model file")
    try:
        proto = onnx.load(str(path))
    except Exception as err:  # protobuf raises DecodeError and friends
        raise FusionError(f"{path}: not an ONNX model ({type(err).__name__}: {err})") from None
    if not proto.graph.node:
        raise FusionError(f"{path}: not an ONNX model (no graph nodes; is it really .onnx?)")
    return proto


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """`NAME=1x3x224x224` -> ("NAME", (1, 3, 224, 224))."""
    name, sep, dims = text.rpartition("=")
    try:
        shape = tuple(int(d) for d in dims.lower().split("x"))
    except ValueError:
        shape = ()
    if not sep or not name or not shape or min(shape) < 1:
        raise FusionError(f"bad shape {text!r}: expected {SHAPE_SYNTAX}")
    return name, shape


def _c_name(name: str, taken: set[str]) -> str:
    safe = re.sub(r"\W", "_", name) or "v"
    if safe[0].isdigit():
        safe = "v_" + safe
    base, i = safe, 1
    while safe in taken:
        safe, i = f"{base}_{i}", i + 1
    taken.add(safe)
    return safe


def _sanitize(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, str], dict[str, str]]:
    """Copy of the model whose value and node names are C identifiers.

    Returns it, value names old -> new, and node names new -> old."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    g = model.graph
    names: dict[str, str] = {}
    taken: set[str] = set()
    values = [v.name for v in g.input] + [t.name for t in g.initializer]
    values += [o for n in g.node for o in n.output] + [v.name for v in g.output]
    for v in values:
        if v and v not in names:
            names[v] = _c_name(v, taken)
    for v in list(g.input) + list(g.output) + list(g.value_info):
        v.name = names.get(v.name, v.name)
    for t in g.initializer:
        t.name = names[t.name]
    nodes: dict[str, str] = {}
    node_taken: set[str] = set()
    for i, n in enumerate(g.node):
        n.input[:] = [names.get(x, x) for x in n.input]
        n.output[:] = [names.get(x, x) for x in n.output]
        original = n.name or f"{n.op_type}_{i}"
        n.name = _c_name(original, node_taken)
        nodes[n.name] = original
    return model, names, nodes


def _check_ops(model: onnx.ModelProto, where: str) -> None:
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    known = set(_get_convert_map()) | {"Constant", "If"}
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            raise FusionError(
                f"{where}: node {node.name!r} uses op {node.domain}::{node.op_type}, which TVM's ONNX "
                "importer does not support; export the model with standard ONNX ops only"
            )
        if node.op_type not in known:
            raise FusionError(
                f"{where}: node {node.name!r} uses op {node.op_type!r}, which TVM's ONNX importer does "
                "not support; replace it in the exporter or decompose it into supported ops"
            )


def _input_shapes(model, shapes: dict, where: str, renamed: dict[str, str]) -> dict[str, list[int]]:
    inits = {t.name for t in model.graph.initializer}
    given = {renamed.get(k, k): tuple(v) for k, v in (shapes or {}).items()}
    known_inputs = [i.name for i in model.graph.input if i.name not in inits]
    original = {v: k for k, v in renamed.items()}
    for name in given:
        if name not in known_inputs:
            raise FusionError(
                f"{where}: --shape names input {original.get(name, name)!r}, but the model's inputs are "
                f"{[original.get(n, n) for n in known_inputs]}"
            )
    out = {}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        dims = inp.type.tensor_type.shape.dim
        static = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in dims]
        if inp.name in given:
            shape = given[inp.name]
            if len(shape) != len(static) or any(s is not None and s != g for s, g in zip(static, shape)):
                raise FusionError(
                    f"{where}: --shape {original.get(inp.name)}={'x'.join(map(str, shape))} does not fit "
                    f"the model's declared shape {[s if s else '?' for s in static]}"
                )
            out[inp.name] = list(shape)
        elif None in static:
            sym = ["?" if s is None else str(s) for s in static]
            raise FusionError(
                f"{where}: input {original.get(inp.name)!r} has symbolic shape {'x'.join(sym)}; "
                f"bind it with {SHAPE_SYNTAX.replace('NAME', original.get(inp.name, inp.name))} "
                "(Python: shapes={name: (1, 3, 224, 224)})"
            )
        else:
            out[inp.name] = static
    return out


def _scalar(expr) -> float | None:
    """The value of a scalar (size-1) float constant, else None."""
    if not _tvm.is_constant(expr):
        return None
    value = _tvm.constant_value(expr)
    return float(value.reshape(())) if value.size == 1 and value.dtype.kind == "f" else None


def _uniform_to_scalar(expr):
    """A constant whose elements are all equal (the importer broadcasts scalars) as a scalar constant."""
    if _tvm.is_constant(expr):
        value = _tvm.constant_value(expr)
        if value.size > 1 and (value == value.flat[0]).all():
            return _tvm.make_constant(value.flat[0].reshape(()))
    return expr


def _stacked_pair(op: str, make):
    """op(stack((broadcast_to(a), b)), axis=0) -> make(a, b)   (opset-9 Sum / Max / Min of two inputs)."""
    a, b = dpl.wildcard(), dpl.wildcard()
    operand = lambda p: dpl.is_op("relax.broadcast_to")(p, dpl.wildcard()) | p  # noqa: E731
    stacked = dpl.is_op("relax.stack")(dpl.is_tuple([operand(a), operand(b)]))
    root = dpl.is_op(op)(stacked)

    def rewriter(expr, matches):
        attrs = matches[root].attrs
        if [int(x) for x in attrs.axis] != [0] or attrs.keepdims or int(matches[stacked].attrs.axis) != 0:
            return expr
        out, sa, sb = (_static_shape(e) for e in (expr, matches[a], matches[b]))
        if None in (out, sa, sb) or list(np.broadcast_shapes(tuple(sa), tuple(sb))) != out:
            return expr
        return make(matches[a], _uniform_to_scalar(matches[b]))

    return root, rewriter


def _call_tir_pair(name: str, make):
    """call_tir(<topi name>, (x, scalar const)) -> make(x, c): TVM's importer legalizes Clip bounds early."""
    x, c = dpl.wildcard(), dpl.is_const()
    root = dpl.is_call_tir(name, args=[x, c])

    def rewriter(expr, matches):
        if _scalar(matches[c]) is None or _static_shape(matches[x]) != _static_shape(expr):
            return expr
        return make(matches[x], matches[c])

    return root, rewriter


def _min_of_max_to_clip():
    """minimum(maximum(x, lo), hi) with scalar lo <= hi  ->  clip(x, lo, hi)."""
    x, lo, hi = dpl.wildcard(), dpl.is_const(), dpl.is_const()
    root = dpl.is_op("relax.minimum")(dpl.is_op("relax.maximum")(x, lo), hi)

    def rewriter(expr, matches):
        low, high = _scalar(matches[lo]), _scalar(matches[hi])
        if low is None or high is None or low > high:
            return expr
        return relax.op.clip(matches[x], low, high)

    return root, rewriter


def _dropout_to_identity():
    """dropout(x)[0] -> x: ONNX Dropout at inference is the identity (TVM's importer ignores training_mode
    as well); otherwise it stays a copy kernel between a matmul and what follows."""
    x = dpl.wildcard()
    root = dpl.is_tuple_get_item(dpl.is_op("relax.nn.dropout")(x), 0)
    return root, lambda expr, matches: matches[x]


#: Relax-level clean-ups of what TVM's ONNX importer emits, in order (name, builder of (pattern, rewriter))
NORMALIZATIONS = [
    ("dropout_to_identity", _dropout_to_identity),
    ("sum_of_two_to_add", lambda: _stacked_pair("relax.sum", relax.op.add)),
    ("max_of_two_to_maximum", lambda: _stacked_pair("relax.max", relax.op.maximum)),
    ("min_of_two_to_minimum", lambda: _stacked_pair("relax.min", relax.op.minimum)),
    ("clip_lower_bound", lambda: _call_tir_pair("maximum", relax.op.maximum)),
    ("clip_upper_bound", lambda: _call_tir_pair("minimum", relax.op.minimum)),
    ("min_of_max_to_clip", _min_of_max_to_clip),
]


def _static_shape(expr):
    shape = getattr(_tvm.expr_type(expr), "shape", None)
    try:
        return [int(d) for d in shape]
    except (TypeError, ValueError):
        return None


def _normalize(mod: tvm.IRModule) -> tvm.IRModule:
    out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    for _, build in NORMALIZATIONS:
        root, rewriter = build()
        for gv, func in out.functions.items():
            if isinstance(func, relax.Function):
                out[gv] = dpl.rewrite_call(root, rewriter, func)
    return out


def onnx_node_names(mod) -> dict[str, str]:
    """relax var name -> ONNX node name, as recorded by import_onnx."""
    attrs = mod.attrs or {}
    table = attrs.get(ONNX_NODES_ATTR) if hasattr(attrs, "get") else None
    return {str(k): str(v) for k, v in table.items()} if table is not None else {}


def import_onnx(model, shapes: dict | None = None, *, fold_constants: bool = True,
                simplify: bool | None = None) -> tvm.IRModule:
    """Import an ONNX model (path or ModelProto) into a Relax IRModule ready for pattern matching.

    `shapes` binds input dims: {"input_name": (1, 3, 224, 224)}; required for symbolic dims.
    `simplify` (default: on, see simplify.enabled) first runs the ONNX simplifier with those shapes
    (simplify.py; module attribute `tvm_fusion.simplify` records what ran).
    """
    where = str(model) if not isinstance(model, onnx.ModelProto) else (model.graph.name or "<ModelProto>")
    proto = load_onnx(model)
    as_named = {i.name: i.name for i in proto.graph.input}
    proto, simplified = _simplify.front_door(proto, _input_shapes(proto, shapes or {}, where, as_named), simplify)
    _check_ops(proto, where)
    proto, renamed, table = _sanitize(proto)
    shape_dict = _input_shapes(proto, shapes or {}, where, renamed)
    opset = max((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), default=None)
    try:
        mod, var_nodes = _tvm.import_onnx_graph(proto, shape_dict, opset)
    except Exception as err:
        raise _simplify.failure(where, "TVM's ONNX importer", err, table, simplified) from None
    table = {**{k: table.get(v, v) for k, v in var_nodes.items()}, **table}
    mod = mod.with_attr(ONNX_NODES_ATTR, table).with_attr(_simplify.RECORD_ATTR, simplified)
    with tvm.transform.PassContext(opt_level=3):
        if fold_constants:
            try:
                mod = relax.transform.FoldConstant()(mod)
            except Exception as err:
                raise _simplify.failure(where, "TVM's FoldConstant", err, table, simplified, mod) from None
        mod = _normalize(mod)  # after folding: Clip bounds are constants by then
        mod = relax.transform.DeadCodeElimination()(mod)  # also drops unused legalized-Clip PrimFuncs
    if ONNX_NODES_ATTR not in (mod.attrs or {}):
        mod = mod.with_attr(ONNX_NODES_ATTR, table).with_attr(_simplify.RECORD_ATTR, simplified)
    return mod
