"""ONNX -> Relax: `import_onnx` loads, sanitises, binds shapes, imports and folds constants.

The result is what the pattern tables match against: weights are constants, dead bindings are gone,
an opset-9 `Sum`/`Max`/`Min` of two tensors is an `add`/`maximum`/`minimum`, a `Clip` with constant
bounds is `clip`, an inference `Dropout` is gone, a float16 BatchNormalization computes in float32 (see
NORMALIZATIONS; each rewrite is checked to keep its expression's shape and dtype), and every binding knows the ONNX node it came from
(module attribute `tvm_fusion.onnx_nodes`: relax var name -> ONNX node name).
"""

from __future__ import annotations

import keyword
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from tvm_fusion import _tvm
from tvm_fusion import precision as _precision
from tvm_fusion.frontend import recurrent as _recurrent
from tvm_fusion.frontend import recurrent_kernel as _recurrent_kernel
from tvm_fusion.frontend import loop as _loop
from tvm_fusion.frontend import simplify as _simplify
from tvm_fusion._tvm import dpl, relax, tirx, tvm
from tvm_fusion.errors import FusionError
from tvm_fusion.quiet import FAST_TAKE_LINES, tvm_output
from tvm_fusion.rules import scalar_constant, shape_dims, static_shape as _static_shape

__all__ = ["SymDim", "import_onnx", "load_onnx", "parse_shape", "onnx_node_names", "concrete_shapes",
           "check_sizes", "sizes_text", "symbolic_dims", "format_shape", "UPPER_BOUND_ATTR"]

SHAPE_SYNTAX = "--shape NAME=1x3x224x224 (or NAME=Nx3x224x224, N<=64, to keep the batch symbolic)"
#: Relax function attribute: {symbolic dim name: upper bound}; memory planning sizes buffers from it
UPPER_BOUND_ATTR = "tir_var_upper_bound"
_SYM = re.compile(r"([A-Za-wyzA-WYZ_][A-Za-wyzA-WYZ0-9_]*)(?:<=([0-9]+))?")
#: TVM indexes buffers with int32: a tensor with more elements than this overflows inside the generated code
MAX_ELEMENTS = 2**31 - 1
ONNX_NODES_ATTR = "tvm_fusion.onnx_nodes"
#: module attribute {input var name: the ONNX graph input's name} (the names `_sanitize` changed, e.g. y_0: y/0)
INPUT_NAMES_ATTR = "tvm_fusion.input_names"


def load_onnx(model) -> onnx.ModelProto:
    """A ModelProto from a path or a ModelProto, with a clear error for anything else."""
    if isinstance(model, onnx.ModelProto):
        return check_graph(model, model.graph.name or "<ModelProto>")
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
    if not proto.graph.output:
        raise FusionError(f"{path}: the graph has no outputs, so there is nothing to compute; "
                          "add the values you need to graph.output")
    return check_graph(proto, str(path))


@dataclass(frozen=True)
class SymDim:
    """A dim left symbolic by `--shape` (`N`, or `N<=64` with an upper bound for memory planning)."""

    name: str
    upper: int | None = None

    def __str__(self) -> str:
        return self.name if self.upper is None else f"{self.name}<={self.upper}"


def format_shape(shape) -> str:
    """(SymDim('N', 64), 3, 224, 224) -> 'N<=64x3x224x224'."""
    return "x".join(map(str, shape))


def _parse_dim(text: str, piece: str):
    if re.fullmatch(r"[0-9]+", piece):
        return int(piece)
    sym = _SYM.fullmatch(piece)
    if sym is None:
        raise FusionError(f"bad shape {text!r}: dim {piece!r} is neither a positive integer nor a symbolic name "
                          f"(a letter, optionally with an upper bound such as N<=64); expected {SHAPE_SYNTAX}")
    return SymDim(sym.group(1), int(sym.group(2)) if sym.group(2) else None)


def parse_shape(text: str) -> tuple[str, tuple]:
    """`NAME=1x3x224x224` -> ("NAME", (1, 3, 224, 224)): ASCII digits, every dim at least 1; a dim that is a
    name (`N`, `batch`; not containing x) stays symbolic, `N<=64` with an upper bound: SymDim."""
    cut = max((i for i, c in enumerate(text) if c == "=" and text[i - 1:i] != "<"), default=-1)  # not N<=64's
    name, sep, dims = text[:max(cut, 0)], "=" if cut >= 0 else "", text[cut + 1:]
    if not sep or not name or not dims or dims.startswith(("x", "X")) or dims.endswith(("x", "X")):
        raise FusionError(f"bad shape {text!r}: expected {SHAPE_SYNTAX} (dims are positive integers joined by x)")
    shape = tuple(_parse_dim(text, piece) for piece in re.split(r"[xX]", dims))
    if any(isinstance(d, int) and d < 1 for d in shape) or any(isinstance(d, SymDim) and d.upper == 0 for d in shape):
        raise FusionError(f"bad shape {text!r}: every dim must be at least 1; expected {SHAPE_SYNTAX}")
    return name, shape


def symbolic_dims(shapes: dict) -> dict[str, int | None]:
    """{symbolic dim name: upper bound or None} over all the shapes; one name bound twice differently is an error."""
    out: dict[str, int | None] = {}
    for input_name, shape in (shapes or {}).items():
        for d in shape:
            if isinstance(d, SymDim):
                if d.name in out and out[d.name] != d.upper:
                    raise FusionError(f"--shape {input_name}: symbolic dim {d.name} has upper bound {d.upper} here "
                                      f"and {out[d.name]} in another --shape; give it one bound")
                out[d.name] = d.upper
    return out


#: the size a symbolic dim without an upper bound is checked at, beside 1; a larger upper bound is checked at
#: this size too (the kernels are the same code at every size; a verify build runs ResNet-50 ~1 s per image)
CHECK_SIZE = 3
MAX_CHECK_SIZE = 8


def check_sizes(shapes: dict, given: dict | None = None) -> list[dict[str, int]]:
    """The sizes at which a build with symbolic dims is run and compared (compare, compile's verify step):
    every symbolic dim at 1, then at its upper bound (at most MAX_CHECK_SIZE) or CHECK_SIZE without one. A
    dim that a `given` array (--inputs) fixes is checked at that size only. [{}] when nothing is symbolic."""
    bounds = symbolic_dims(shapes)
    if not bounds:
        return [{}]
    fixed: dict[str, int] = {}
    for name, shape in shapes.items():
        if name in (given or {}):
            fixed.update({d.name: int(np.shape(given[name])[i]) for i, d in enumerate(shape) if isinstance(d, SymDim)})
    second = {k: fixed.get(k, min(upper, MAX_CHECK_SIZE) if upper else CHECK_SIZE) for k, upper in bounds.items()}
    first = {k: fixed.get(k, 1) for k in bounds}
    return [first] if first == second else [first, second]


def sizes_text(sizes: dict[str, int]) -> str:
    """{"N": 3} -> 'N=3'."""
    return ", ".join(f"{k}={v}" for k, v in sizes.items())


def concrete_shapes(shapes: dict, values: dict[str, int]) -> dict:
    """`shapes` with every symbolic dim replaced by its value in `values` ({dim name: size})."""
    return {k: tuple(values[d.name] if isinstance(d, SymDim) else d for d in v) for k, v in (shapes or {}).items()}


def check_index_range(mod, where: str) -> None:
    """Refuse tensors with more than MAX_ELEMENTS elements: TVM's int32 indexing would overflow."""
    nodes = onnx_node_names(mod)
    main = mod["main"]
    values = [(p, f"input {_tvm.var_name(p)!r}") for p in main.params]
    for block in main.body.blocks:
        for b in block.bindings:
            name = _tvm.var_name(b.var)
            values.append((b.var, f"the output of ONNX node {nodes[name]!r}" if name in nodes
                           else f"the intermediate value {name!r} of main"))
    for var, what in values:
        shape = _static_shape(var)
        if shape and int(np.prod(shape, dtype=object)) > MAX_ELEMENTS:
            raise FusionError(
                f"{where}: {what} has shape {'x'.join(map(str, shape))} = {int(np.prod(shape, dtype=object))} "
                f"elements, more than TVM's int32 indexing allows ({MAX_ELEMENTS}); use smaller --shape values"
            )


#: names a node- or value-derived Relax var must not take. TVM's BlockBuilder names vars and functions
#: from one pool, so a var called `main` pushes the importer's function to `main1` ("Cannot find global var
#: main"), and one called `maximum` renames the Clip PrimFunc our normalisation looks for; `lv`/`gv` are the
#: importer's own var names; keywords would make the printed TVMScript or the generated C/CUDA invalid.
_C_KEYWORDS = """auto break case char const continue default do double else enum extern float for goto if
    inline int long register restrict return short signed sizeof static struct switch typedef union unsigned
    void volatile while bool true false class namespace template typename this new delete operator private
    protected public virtual friend using nullptr constexpr""".split()
_RESERVED = {"main", "maximum", "minimum", *keyword.kwlist, *keyword.softkwlist, *_C_KEYWORDS}
_IMPORTER_NAME = re.compile(r"(lv|gv)\d*")


def _c_name(name: str, taken: set[str]) -> str:
    safe = re.sub(r"\W", "_", name, flags=re.ASCII) or "v"  # ASCII: the names may reach generated C / CUDA
    if safe[0].isdigit():
        safe = "v_" + safe
    if safe in _RESERVED or _IMPORTER_NAME.fullmatch(safe):
        safe += "_"
    base, i = safe, 1
    while safe in taken:
        safe, i = f"{base}_{i}", i + 1
    taken.add(safe)
    return safe


def _walk(graph: onnx.GraphProto, where: str = ""):
    """(graph, node, where) for every node, the main graph's first (`node 12`), then those of the subgraphs
    (an If's branches: `node 12 then_branch node 0`), depth first."""
    subgraphs = []
    for i, n in enumerate(graph.node):
        here = f"{where}node {i}"
        yield graph, n, here
        for attr in n.attribute:
            subgraphs += [(g, f"{here} {attr.name} ") for g in ([attr.g] if attr.HasField("g") else [])]
            subgraphs += [(g, f"{here} {attr.name}[{k}] ") for k, g in enumerate(attr.graphs)]
    for g, prefix in subgraphs:
        yield from _walk(g, prefix)


def node_labels(model: onnx.ModelProto) -> list[str]:
    """How messages name each node (in `_walk` order): its name, or `Relu (node 12)` when the name is
    empty or not unique (ONNX allows both), so every node stays distinguishable."""
    nodes = [(n, where) for _, n, where in _walk(model.graph)]
    count: dict[str, int] = {}
    for n, _ in nodes:
        count[n.name] = count.get(n.name, 0) + 1
    labels: list[str] = []
    used = {n.name for n, _ in nodes if n.name and count[n.name] == 1}
    for n, where in nodes:
        label = n.name
        if not n.name or count[n.name] > 1:
            label = f"{n.name or n.op_type} ({where})"
            while label in used:
                label += "'"
            used.add(label)
        labels.append(label)
    return labels


def _labels_as_names(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every node named by its label (a copy, when some node is unnamed or shares its name):
    the labels then survive the simplifier, which may drop, reorder and rename nodes."""
    labels = node_labels(model)
    if all(n.name == label for (_, n, _), label in zip(_walk(model.graph), labels)):
        return model
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for (_, n, _), label in zip(_walk(model.graph), labels):
        n.name = label
    return model


def _sanitize(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, str], dict[str, str]]:
    """Copy of the model whose value and node names, subgraphs included, are distinct C identifiers, none of
    them reserved.

    Returns it, value names old -> new, and node names new -> label (see node_labels)."""
    labels = node_labels(model)
    model = onnx.ModelProto.FromString(model.SerializeToString())
    walk = list(_walk(model.graph))
    graphs = [model.graph] + [g for g in {id(g): g for g, _, _ in walk}.values() if g is not model.graph]
    names: dict[str, str] = {}
    taken: set[str] = set()  # values and nodes share it: both become Relax var names
    for g in graphs:
        values = [v.name for v in g.input] + [t.name for t in g.initializer]
        values += [o for n in g.node for o in n.output] + [v.name for v in g.output]
        for v in values:
            if v and v not in names:
                names[v] = _c_name(v, taken)
    for g in graphs:
        for v in list(g.input) + list(g.output) + list(g.value_info):
            v.name = names.get(v.name, v.name)
        for t in g.initializer:
            t.name = names[t.name]
    nodes: dict[str, str] = {}
    for (_, n, where), label in zip(walk, labels):
        n.input[:] = [names.get(x, x) for x in n.input]
        n.output[:] = [names.get(x, x) for x in n.output]
        n.name = _c_name(n.name or f"{n.op_type}_{where.replace(' ', '_')}", taken)
        nodes[n.name] = label
    return model, names, nodes


def _check_ops(model: onnx.ModelProto, where: str) -> None:
    known = _tvm.onnx_importer_ops()
    for (_, node, _), label in zip(_walk(model.graph), node_labels(model)):
        if (node.domain, node.op_type) == (_recurrent_kernel.SCAN_DOMAIN, _recurrent_kernel.SCAN_OP):
            continue  # the front door's own (recurrent.py)
        if node.domain not in ("", "ai.onnx"):
            raise FusionError(
                f"{where}: node {label!r} uses op {node.domain}::{node.op_type}, which TVM's ONNX "
                "importer does not support; export the model with standard ONNX ops only"
            )
        if node.op_type not in known:
            raise FusionError(
                f"{where}: node {label!r} uses op {node.op_type!r}, which TVM's ONNX importer does "
                "not support; replace it in the exporter or decompose it into supported ops"
            )


def _given_shape(name: str, shape) -> tuple:
    """A `shapes=` entry from Python as --shape would give it: ints, SymDim, or strings such as "N" / "N<=64"."""
    text = f"shapes={{{name!r}: {shape!r}}}"
    try:
        dims = tuple(shape)
    except TypeError:
        raise FusionError(f"bad shape {text}: expected a tuple of dims, e.g. (1, 3, 224, 224)") from None
    out = []
    for d in dims:
        if isinstance(d, SymDim):
            out.append(d)
        elif isinstance(d, str):
            out.append(_parse_dim(text, d.strip()))
        elif isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0:  # 0: an empty tensor
            out.append(int(d))
        else:
            raise FusionError(f"bad shape {text}: dim {d!r} is neither a non-negative integer nor a symbolic name "
                              f"(a string such as 'N' or 'N<=64', or tvm_fusion.SymDim('N', 64))")
    return tuple(out)


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
            text = f"--shape {original.get(inp.name)}={format_shape(shape)}"
            if len(shape) != len(static) or any(s is not None and isinstance(g, int) and s != g
                                                for s, g in zip(static, shape)):
                raise FusionError(f"{where}: {text} does not fit the model's declared shape "
                                  f"{[s if s else '?' for s in static]}")
            fixed = [i for i, (s, g) in enumerate(zip(static, shape)) if s is not None and isinstance(g, SymDim)]
            if fixed:
                i = fixed[0]
                raise FusionError(
                    f"{where}: {text} makes dim {i} symbolic, but the model declares it as {static[i]} (its "
                    f"Reshapes and constants may assume that size); export the model with that dim dynamic "
                    f"(a dim_param, e.g. torch.onnx.export(..., dynamic_axes=...)) or give the size")
            out[inp.name] = list(shape)
            largest = [g.upper or 1 if isinstance(g, SymDim) else g for g in shape]
            if int(np.prod(largest, dtype=object)) > MAX_ELEMENTS:
                raise FusionError(
                    f"{where}: {text} has {int(np.prod(largest, dtype=object))} elements"
                    f"{' at its upper bound' if largest != list(shape) else ''}, more than TVM's int32 indexing "
                    f"allows ({MAX_ELEMENTS}); use a smaller shape"
                )
        elif None in static:
            _check_no_zero_dims(inp, where, original.get(inp.name, inp.name))
            sym = ["?" if s is None else str(s) for s in static]
            raise FusionError(
                f"{where}: input {original.get(inp.name)!r} has symbolic shape {'x'.join(sym)}; "
                f"bind it with --shape {original.get(inp.name, inp.name)}={'x'.join(s if s != '?' else '1' for s in sym)} "
                f"(Python: shapes={{{original.get(inp.name, inp.name)!r}: {tuple(s or 1 for s in static)}}}), "
                "choosing the size of each ? dim (a letter, e.g. N or N<=64, keeps the batch dim symbolic)"
            )
        else:
            out[inp.name] = static
    return out


def _input_dtypes(model: onnx.ModelProto) -> dict[str, str]:
    """{input name: dtype} as the model declares them (float16 inputs stay float16)."""
    out = {}
    for inp in model.graph.input:
        elem = inp.type.tensor_type.elem_type
        if elem:
            out[inp.name] = str(onnx.helper.tensor_dtype_to_np_dtype(elem))
    return out


def _as_scalar_if_uniform(const, other, out_shape):
    """A constant whose elements are all equal (the importer broadcasts scalars) as a scalar constant,
    when that keeps the result's shape: `other` alone must already have the broadcast shape."""
    if not _tvm.is_constant(const) or _shape_key(other) != out_shape:
        return const
    value = _tvm.constant_value(const)
    if value.size > 1 and (value == value.flat[0]).all():
        return _tvm.make_constant(value.flat[0].reshape(()))
    return const


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
        out, sa, sb = (_shape_key(e) for e in (expr, matches[a], matches[b]))
        if None in (out, sa, sb) or _broadcast_key(sa, sb) != out:
            return expr
        x, y = matches[a], matches[b]
        return make(_as_scalar_if_uniform(x, y, out), _as_scalar_if_uniform(y, x, out))

    return root, rewriter


def _call_tir_pair(name: str, make):
    """call_tir(<topi name>, (x, scalar const)) -> make(x, c): TVM's importer legalizes Clip bounds early."""
    x, c = dpl.wildcard(), dpl.is_const()
    root = dpl.is_call_tir(name, args=[x, c])

    def rewriter(expr, matches):
        if (scalar_constant(matches[c], float_only=True) is None or _shape_key(matches[x]) is None
                or _shape_key(matches[x]) != _shape_key(expr)):
            return expr
        return make(matches[x], matches[c])

    return root, rewriter


def min_of_max_to_clip():
    """minimum(maximum(x, lo), hi) with scalar lo <= hi  ->  clip(x, lo, hi)."""
    x, lo, hi = dpl.wildcard(), dpl.is_const(), dpl.is_const()
    root = dpl.is_op("relax.minimum")(dpl.is_op("relax.maximum")(x, lo), hi)

    def rewriter(expr, matches):
        low, high = (scalar_constant(matches[e], float_only=True) for e in (lo, hi))
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


def _batch_norm_in_float32():
    """batch_norm(x: fp16)[0] -> astype(batch_norm(astype(x, f32), f32 params)[0], fp16).

    TVM's legalization of a float16 batch_norm returns float32: the build's output dtype would differ from
    the model's. Computing in float32 and casting back keeps the model's dtype (and is more exact)."""
    x = dpl.wildcard()
    params = [dpl.is_const() for _ in range(4)]
    bn = dpl.is_op("relax.nn.batch_norm")(x, *params)
    root = dpl.is_tuple_get_item(bn, 0)

    def rewriter(expr, matches):
        dtype = str(_tvm.expr_type(matches[x]).dtype)
        call = matches[bn]
        if dtype == "float32" or not dtype.startswith(("float", "bfloat")) or bool(call.attrs.training):
            return expr
        consts = [_tvm.make_constant(_tvm.constant_value(matches[p]).astype("float32")) for p in params]
        wide = relax.Call(call.op, [relax.op.astype(matches[x], "float32"), *consts], call.attrs)
        return relax.op.astype(relax.TupleGetItem(wide, 0), dtype)

    return root, rewriter


#: ops whose output elements are copies of input elements: a fake-quantized value stays one through them
_MOVES = ("relax.reshape", "relax.permute_dims", "relax.expand_dims", "relax.squeeze", "relax.flatten",
          "relax.strided_slice")
#: scales for which dequantize(quantize(d * s)) == d * s holds for every 16-bit integer d (normal float32 products)
_EXACT_SCALES = (2.0**-100, 2.0**100)


def _requantize_after_move():
    """dequantize(quantize(move(dequantize(q, s, z)), s, z), s, z)  ->  move(dequantize(q, s, z)), for up to
    three data-movement ops (_MOVES; a QDQ model quantizes the output of each Reshape / Transpose again with
    its input's scale and zero point). Exact: every moved element is y = fl(d * s) for an integer
    d = q - z, |d| < 2^16, and fl(y / s) is within 2^-22 * |d| of d, so it rounds back to d, saturates to
    nothing (q is in the same type's range) and dequantizes to y again. Only where the second pair's
    scales, zero points and integer type equal the first's, all scalar constants, the scale a normal number, the
    values float32 (a float16 product keeps 11 bits: a 16-bit d would not come back)."""
    dq1 = dpl.is_op("relax.dequantize")(dpl.wildcard(), dpl.is_const(), dpl.is_const())

    def move(arg):
        out = None
        for op in _MOVES:
            alt = dpl.is_op(op)(arg, varg_default_wildcard=True)
            out = alt if out is None else out | alt
        return out

    one = move(dq1)
    two = move(one)
    moved = one | two | move(two)
    q2 = dpl.is_op("relax.quantize")(moved, dpl.is_const(), dpl.is_const())
    root = dpl.is_op("relax.dequantize")(q2, dpl.is_const(), dpl.is_const())

    def rewriter(expr, matches):
        first, quantize = matches[dq1], matches[q2]
        params = [scalar_constant(e) for e in (*first.args[1:], *quantize.args[1:], *expr.args[1:])]
        scale = params[0]
        if (None in params or params[0::2] != [scale] * 3 or params[1::2] != [params[1]] * 3
                or not _EXACT_SCALES[0] <= abs(scale) <= _EXACT_SCALES[1]
                or str(_tvm.expr_type(first.args[0]).dtype) != str(quantize.attrs.out_dtype)
                or not str(first.attrs.out_dtype) == str(expr.attrs.out_dtype) == "float32"):
            return expr
        return matches[moved]

    return root, rewriter


#: Relax-level clean-ups of what TVM's ONNX importer emits, in order (name, builder of (pattern, rewriter)).
#: Each rewrite must keep the rewritten expression's type (shape and dtype); `_normalize` checks it.
NORMALIZATIONS = [
    ("dropout_to_identity", _dropout_to_identity),
    ("batch_norm_in_float32", _batch_norm_in_float32),
    ("sum_of_two_to_add", lambda: _stacked_pair("relax.sum", relax.op.add)),
    ("max_of_two_to_maximum", lambda: _stacked_pair("relax.max", relax.op.maximum)),
    ("min_of_two_to_minimum", lambda: _stacked_pair("relax.min", relax.op.minimum)),
    ("clip_lower_bound", lambda: _call_tir_pair("maximum", relax.op.maximum)),
    ("clip_upper_bound", lambda: _call_tir_pair("minimum", relax.op.minimum)),
    ("min_of_max_to_clip", min_of_max_to_clip),
    ("requantize_after_move", _requantize_after_move),
]


def _shape_key(expr):
    """The shape as a tuple of ints and, for symbolic dims that are plain variables (N), their names; None
    when unknown or when a dim is an expression: two values with equal keys have the same shape."""
    dims = shape_dims(expr)
    if dims is None:
        return None
    key = []
    for d in dims:
        if isinstance(d, tirx.IntImm):
            key.append(int(d))
        elif isinstance(d, tirx.Var):
            key.append(str(d.name))
        else:
            return None
    return tuple(key)


def _broadcast_key(a: tuple, b: tuple):
    """NumPy broadcasting of two shape keys; a symbolic dim only against itself or 1 (else None)."""
    out = []
    for x, y in zip(((1,) * len(b) + a)[-max(len(a), len(b)):], ((1,) * len(a) + b)[-max(len(a), len(b)):]):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return tuple(out)


def _type_preserving(rewriter):
    """`rewriter`, except that a rewrite whose type (shape + dtype) differs from the original's is dropped:
    no normalisation can change what a graph computes into something of another shape or dtype."""

    def checked(expr, matches):
        new = rewriter(expr, matches)
        if new.same_as(expr):
            return expr
        try:
            new_ty = _tvm.infer_type(new)
        except Exception:  # TVM refused to infer it (e.g. a dtype mismatch): keep the original
            return expr
        return new if _tvm.structural_equal(new_ty, _tvm.expr_type(expr)) else expr

    return checked


def _normalize(mod: tvm.IRModule, normalizations=None) -> tvm.IRModule:
    out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    for _, build in NORMALIZATIONS if normalizations is None else normalizations:
        root, rewriter = build()
        for gv, func in out.functions.items():
            if isinstance(func, relax.Function):
                out[gv] = dpl.rewrite_call(root, _type_preserving(rewriter), func)
    return out


def _alias_labels(mod: tvm.IRModule, table: dict[str, str]) -> dict[str, str]:
    """`gv = Relu12` (the importer's output binding) -> {"gv": label of Relu12}: rewrites and binding
    canonicalisation may drop the alias's source and keep the output var."""
    out = {}

    def visit(binding):
        if isinstance(binding.value, relax.Var) and _tvm.var_name(binding.value) in table:
            out.setdefault(_tvm.var_name(binding.var), table[_tvm.var_name(binding.value)])

    for func in mod.functions.values():
        if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
            for block in func.body.blocks:
                for binding in block.bindings:
                    visit(binding)
    return {k: v for k, v in out.items() if k not in table}


def _has_plain_blocks(mod: tvm.IRModule) -> bool:
    """Whether a Relax function has bindings outside dataflow blocks."""
    return any(isinstance(f, relax.Function) and isinstance(f.body, relax.SeqExpr)
               and any(b.bindings and not isinstance(b, relax.DataflowBlock) for b in f.body.blocks)
               for f in mod.functions.values())


def onnx_node_names(mod) -> dict[str, str]:
    """relax var name -> ONNX node name, as recorded by import_onnx."""
    attrs = mod.attrs or {}
    table = attrs.get(ONNX_NODES_ATTR) if hasattr(attrs, "get") else None
    return {str(k): str(v) for k, v in table.items()} if table is not None else {}


def onnx_input_names(mod) -> dict[str, str]:
    """relax input var name -> the ONNX graph input's name, for the inputs whose names import_onnx sanitized."""
    attrs = mod.attrs or {}
    table = attrs.get(INPUT_NAMES_ATTR) if hasattr(attrs, "get") else None
    return {str(k): str(v) for k, v in table.items()} if table is not None else {}


def import_onnx(model, shapes: dict | None = None, *, fold_constants: bool = True,
                simplify: bool = True) -> tvm.IRModule:
    """Import an ONNX model (path or ModelProto) into a Relax IRModule ready for pattern matching.

    `shapes` binds input dims: {"input_name": (1, 3, 224, 224)}; required for symbolic dims.
    `simplify` (default: on; the CLI's --no-simplify turns it off) first runs the ONNX simplifier with those shapes
    (simplify.py; module attribute `tvm_fusion.frontend.simplify` records what ran).
    """
    where = str(model) if not isinstance(model, onnx.ModelProto) else (model.graph.name or "<ModelProto>")
    proto = load_onnx(model)
    as_named = {i.name: i.name for i in proto.graph.input}
    proto = _labels_as_names(proto)
    proto = in_topological_order(proto)  # after naming: labels count nodes in the given order
    shapes = {k: _given_shape(k, v) for k, v in (shapes or {}).items()}
    bounds = symbolic_dims(shapes)
    bound_shapes = _input_shapes(proto, shapes or {}, where, as_named)
    proto, simplified = _simplify.front_door(proto, bound_shapes, simplify)
    proto, unrolled = _recurrent.decompose_recurrent(proto, bound_shapes, where)
    proto = _loop.unroll_loops(proto, where)
    _check_ops(proto, where)
    proto = ifs_last(proto)
    given_inputs = [i.name for i in proto.graph.input]
    proto, renamed, table = _sanitize(proto)
    table = {k: unrolled.get(v, v) for k, v in table.items()}  # an unrolled LSTM's ops name the LSTM node
    shape_dict = _with_tir_vars(_input_shapes(proto, shapes or {}, where, renamed))
    opset = max((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), default=None)
    try:
        mod, var_nodes = _tvm.import_onnx_graph(proto, shape_dict, opset, _input_dtypes(proto),
                                                {_recurrent_kernel.SCAN_OP: _recurrent_kernel.convert})
    except Exception as err:
        raise _simplify.failure(where, "TVM's ONNX importer", err, table, simplified) from None
    table = {**table, **{k: table.get(v, v) for k, v in var_nodes.items()}}  # actual var names win
    table.update(_alias_labels(mod, table))
    inputs = {renamed[i]: i for i in given_inputs if renamed.get(i, i) != i}
    mod = mod.with_attr(ONNX_NODES_ATTR, table).with_attr(_simplify.RECORD_ATTR, simplified)
    with tvm.transform.PassContext(opt_level=3):
        if _has_plain_blocks(mod):
            # with an If in the graph the importer builds no dataflow block, and constant folding and
            # pattern fusion only look inside dataflow blocks: put the pure runs around it into some
            mod = relax.transform.ConvertToDataflow(min_size=1)(mod)
        if fold_constants:
            try:
                mod = _precision.bfloat16_norms_widened(mod)  # FoldConstant's legalization refuses them
                mod = _precision.bfloat16_ops_widened(mod)  # and bfloat16 isnan (Clip's bounds), power
                with tvm_output(drop=FAST_TAKE_LINES):  # folding legalizes constant Gathers
                    mod = relax.transform.FoldConstant()(mod)
                mod = _precision.bfloat16_norms_narrowed(mod)
                mod = _precision.bfloat16_ops_narrowed(mod)
            except Exception as err:
                raise _simplify.failure(where, "TVM's FoldConstant", err, table, simplified, mod) from None
        mod = _normalize(mod)  # after folding: Clip bounds are constants by then
        mod = relax.transform.DeadCodeElimination()(mod)  # also drops unused legalized-Clip PrimFuncs
    if ONNX_NODES_ATTR not in (mod.attrs or {}):
        mod = mod.with_attr(ONNX_NODES_ATTR, table).with_attr(_simplify.RECORD_ATTR, simplified)
    mod = mod.with_attr(INPUT_NAMES_ATTR, inputs)
    check_index_range(mod, where)
    upper = {k: v for k, v in bounds.items() if v is not None}
    if upper:
        mod["main"] = mod["main"].with_attr(UPPER_BOUND_ATTR, upper)
    return mod


def _with_tir_vars(shape_dict: dict) -> dict:
    """Each SymDim as a TIR variable (int64, one per name, shared by every input that names it)."""
    made: dict[str, object] = {}
    return {k: [made.setdefault(d.name, tirx.Var(d.name, "int64")) if isinstance(d, SymDim) else d for d in v]
            for k, v in shape_dict.items()}


def check_graph(model: onnx.ModelProto, where: str) -> onnx.ModelProto:
    """The model, if its graphs (If / Loop bodies included) are well formed: an opset this onnx package knows,
    every tensor a node reads defined (a graph input, an initializer, a node's output, or, in a body, a tensor
    of an enclosing graph), written once, and no cycle. Else one FusionError naming the node and the tensor."""
    newest = onnx.defs.onnx_opset_version()
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx") and o.version > newest:
            raise FusionError(f"{where}: the model imports ONNX opset {o.version}, but the newest opset released "
                              f"(onnx {onnx.__version__}) is {newest}; export it with opset {newest} or older")
    labels = {at: f"node {label!r} ({n.op_type})"
              for (_, n, at), label in zip(_walk(model.graph), node_labels(model))}
    _check_scope(model.graph, "", set(), labels, where)
    return model


def _bodies(node, at: str):
    """(body, prefix) of each graph attribute of the node at `at` (as _walk names them)."""
    for attr in node.attribute:
        if attr.HasField("g"):
            yield attr.g, f"{at} {attr.name} "
        for k, g in enumerate(attr.graphs):
            yield g, f"{at} {attr.name}[{k}] "


def _outer_reads(node) -> list[str]:
    """The tensors of enclosing graphs that `node`'s bodies (If branches, Loop / Scan bodies) read."""
    out: list[str] = []
    for g, _ in _bodies(node, ""):
        inner = {v.name for v in g.input} | {t.name for t in g.initializer} | {o for n in g.node for o in n.output}
        for n in g.node:
            out += [x for x in list(n.input) + _outer_reads(n) if x and x not in inner]
        out += [v.name for v in g.output if v.name not in inner]
    return out


def _check_scope(graph: onnx.GraphProto, prefix: str, outer: set[str], labels: dict, where: str) -> None:
    """check_graph for one graph (its nodes named `{prefix}node {i}`) whose enclosing graphs define `outer`,
    then for its bodies."""
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    writer: dict[str, int] = {}
    reads = [list(filter(None, list(n.input) + _outer_reads(n))) for n in graph.node]
    for i, node in enumerate(graph.node):
        for name in filter(None, node.output):
            if name in writer or name in defined:
                first = (f"by {labels[f'{prefix}node {writer[name]}']}" if name in writer
                         else "as a graph input or initializer")
                raise FusionError(f"{where}: tensor {name!r} is written twice, {first} and by "
                                  f"{labels[f'{prefix}node {i}']}; give each output its own name")
            writer[name] = i
    known = defined | outer | set(writer)
    for i, node in enumerate(graph.node):  # what a body reads: named by the body's check, below
        for name in filter(None, node.input):
            if name not in known:
                raise FusionError(f"{where}: {labels[f'{prefix}node {i}']} reads tensor {name!r}, which no node, "
                                  "graph input or initializer defines; fix the exporter or add the missing node")
    for v in graph.output:
        if v.name not in known:
            raise FusionError(f"{where}: graph output {v.name!r} is not computed by any node, graph input or "
                              "initializer; fix the exporter or drop it from graph.output")
    cycle = _cycle(reads, writer)
    if cycle:
        steps = ", which".join(f" reads {x!r} from {labels[f'{prefix}node {writer[x]}']}" for x in cycle[1])
        raise FusionError(f"{where}: the graph has a cycle: {labels[f'{prefix}node {cycle[0]}']}{steps}; an ONNX "
                          "graph must be acyclic")
    for i, node in enumerate(graph.node):
        for g, inner in _bodies(node, f"{prefix}node {i}"):
            _check_scope(g, inner, known, labels, where)


def _cycle(reads: list[list[str]], writer: dict[str, int]) -> tuple[int, list[str]] | None:
    """(first node, the tensors read around the cycle) of a cycle among nodes that read `reads` (per node)
    and write `writer` (tensor: node), or None. Depth first, without recursion."""
    state: dict[int, int] = {}  # node: 1 on the current path, 2 done
    for start in range(len(reads)):
        if start in state:
            continue
        stack, path = [(start, iter(reads[start]))], []  # path: the tensor read at each step down the stack
        while stack:
            node, todo = stack[-1]
            state.setdefault(node, 1)
            name = next((x for x in todo if x in writer and state.get(writer[x]) != 2), None)
            if name is None:
                state[node] = 2
                stack.pop()
                path = path[:-1]
                continue
            path.append(name)
            producer = writer[name]
            if state.get(producer) == 1:
                on_stack = [n for n, _ in stack]
                return producer, path[on_stack.index(producer):]
            stack.append((producer, iter(reads[producer])))
    return None


def _check_no_zero_dims(inp, where: str, name: str) -> None:
    """A FusionError for a graph input that declares a dim as 0 (an empty tensor, not a symbolic dim)."""
    dims = inp.type.tensor_type.shape.dim
    zero = [i for i, d in enumerate(dims) if d.HasField("dim_value") and d.dim_value == 0]
    if zero:
        shape = "x".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in dims)
        raise FusionError(f"{where}: input {name!r} declares dim {zero[0]} of its shape {shape} as 0 (an empty "
                          f"tensor, nothing to compute); export the model with that dim > 0 or dynamic, or give "
                          f"its size with --shape {name}=...")


def in_topological_order(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with the nodes of each graph (bodies included) in an order that computes every tensor before
    it is read (a copy, when some are not: onnxruntime accepts such graphs, TVM's importer does not), keeping
    the given order where it already does. The graph must pass check_graph (no cycle)."""
    if all(_order(g) is None for g in [model.graph] + [g for _, n, at in _walk(model.graph) for g, _ in _bodies(n, at)]):
        return model
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graphs = [model.graph]
    while graphs:
        g = graphs.pop()
        order = _order(g)
        if order is not None:
            nodes = [onnx.NodeProto.FromString(g.node[i].SerializeToString()) for i in order]
            del g.node[:]
            g.node.extend(nodes)
        graphs += [body for n in g.node for body, _ in _bodies(n, "")]
    return model


def ifs_last(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with each graph's If nodes (bodies included) as late as their readers allow, the other nodes
    in their given order (a copy, when that moves one). TVM's importer builds no dataflow block around an
    If, so the nodes on either side of one end in two blocks and a chain across it cannot fuse; an If is
    pure, and what it reads is computed before it either way."""
    graphs = [model.graph] + [g for _, n, at in _walk(model.graph) for g, _ in _bodies(n, at)]
    if all(_ifs_deferred(g) is None for g in graphs):
        return model
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for g in [model.graph] + [g for _, n, at in _walk(model.graph) for g, _ in _bodies(n, at)]:
        order = _ifs_deferred(g)
        if order is not None:
            nodes = [onnx.NodeProto.FromString(g.node[i].SerializeToString()) for i in order]
            del g.node[:]
            g.node.extend(nodes)
    return model


def _ifs_deferred(graph: onnx.GraphProto) -> list[int] | None:
    """A topological order of `graph`'s (topologically ordered) nodes taking every other node before an If
    whenever one is ready, or None when that is the given order."""
    writer = {o: i for i, n in enumerate(graph.node) for o in n.output if o}
    reads = [{writer[x] for x in list(n.input) + _outer_reads(n) if x in writer} for n in graph.node]
    order: list[int] = []
    done: set[int] = set()
    while len(order) < len(graph.node):
        ready = [i for i in range(len(graph.node)) if i not in done and reads[i] <= done]
        i = next((i for i in ready if graph.node[i].op_type != "If"), ready[0])
        order.append(i)
        done.add(i)
    return None if order == list(range(len(graph.node))) else order


def _order(graph: onnx.GraphProto) -> list[int] | None:
    """A topological order of `graph`'s nodes (depth first, producers before readers, else the given order),
    or None when the given order is one."""
    writer = {o: i for i, n in enumerate(graph.node) for o in n.output if o}
    reads = [[writer[x] for x in list(n.input) + _outer_reads(n) if x in writer] for n in graph.node]
    if all(p < i for i, r in enumerate(reads) for p in r):
        return None
    order: list[int] = []
    done: set[int] = set()
    for start in range(len(reads)):
        stack = [start]
        while stack:
            i = stack[-1]
            pending = next((p for p in reads[i] if p not in done), None)
            if i in done or pending is None:
                if i not in done:
                    done.add(i)
                    order.append(i)
                stack.pop()
            else:
                stack.append(pending)
    return order
