"""matmul(A, B) [* c | / c] [+ b] -> [activation]  ==>  batch_matmul_<act>(A, B, b')   (MatMul of any two tensors)

A MatMul the dense rules do not take: of two runtime tensors (attention's scores and context where the
attention rule declines, a gate of two activations), batched at any rank with NumPy-broadcast batch dims
([2, 1, M, K] @ [1, 3, K, N]: each operand read where it is, no broadcast copy), a 1-D operand (a row for
A, a column for B, as ONNX says), or a constant B the dense rules decline (a 3-D input with a symbolic batch).
The epilogue runs on the accumulators: a scalar constant scale (multiply or divide, as matched), a constant
bias along the last axis (folded to one value per column), an activation. Half inputs are summed in float32.

The kernel sees A and B at one rank (at least 3) with the same batch dims or 1s: the lower-rank operand is
viewed with leading 1s (a reshape, no copy) and the output viewed back. Declines with the actual values:
batch dims that do not broadcast, a symbolic dim anywhere but a declared batch (the outermost dim of the
higher-rank operand), a scale that is not a scalar constant, a bias that varies along another axis, a MatMul
whose output dtype differs from its inputs', other dtypes.
"""

from __future__ import annotations

import numpy as np

from tvm_fusion import _tvm
from tvm_fusion._tvm import dpl
from tvm_fusion.patterns.activations import BY_RANK, epilogue_rules, epilogue_spec, scalar_constant
from tvm_fusion.precision import accumulator_dtype
from tvm_fusion.rules import (Lowering, Match, Spec, axis_vector, commutative, decline, shape_text, static_shape,
                              symbolic_reason)
from tvm_fusion.schedules.batch_matmul import BATCH_MATMUL_FAMILY

SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")  # half: summed in float32, the bias kept in float32


def batch_matmul_spec(*, activation=None) -> Spec:
    a, b = dpl.wildcard(), dpl.wildcard()
    matmul = dpl.is_op("relax.matmul")(a, b)
    c = dpl.is_const()
    divide = dpl.is_op("relax.divide")(matmul, c)
    multiply = commutative("relax.multiply", matmul, c)
    scaled = divide | multiply | matmul
    bias = dpl.is_const()
    bias_add = commutative("relax.add", scaled, bias)
    ann = {"a": a, "b": b, "matmul": matmul, "scale": c, "divide": divide, "multiply": multiply, "bias": bias,
           "bias_add": bias_add}
    return epilogue_spec(bias_add | scaled, ann, activation, lower_batch_matmul)


def _is_var(d) -> bool:
    return not isinstance(d, int)


def kernel_views(a_shape: tuple, b_shape: tuple):
    """(A's view, B's view, the kernel's output shape) at one rank >= 3, or a reason (str) they cannot be:
    a 1-D A is a row [1, K], a 1-D B a column [K, 1]; the lower-rank operand gets leading 1s; batch dims must
    be equal or 1. A symbolic dim stays the outermost of its operand (no view may move it) and only meets
    itself or 1."""
    a = (1, *a_shape) if len(a_shape) == 1 else tuple(a_shape)
    b = (*b_shape, 1) if len(b_shape) == 1 else tuple(b_shape)
    rank = max(len(a), len(b), 3)
    a, b = (1,) * (rank - len(a)) + a, (1,) * (rank - len(b)) + b
    if a[-1] != b[-2]:
        return f"A's last dim {a[-1]} is not B's second to last {b[-2]}"
    for view, given, name in ((a, a_shape, "A"), (b, b_shape, "B")):
        if any(_is_var(d) for d in view[1:]) or (view != tuple(given) and any(map(_is_var, given))):
            return (f"{name} has shape {shape_text(tuple(given))}; the kernel would view it as {shape_text(view)}, "
                    "moving its symbolic dim from the outermost place")
    batch = []
    for x, y in zip(a[:-2], b[:-2]):
        if x == 1 or y == 1 or (x == y if not (_is_var(x) or _is_var(y)) else str(x) == str(y)):
            batch.append(y if x == 1 else x)
        else:
            return f"batch dims {shape_text(a[:-2])} and {shape_text(b[:-2])} do not broadcast (dim {x} against {y})"
    return a, b, (*batch, a[-2], b[-1])


def batch_matmul_checks(m: Match):
    a_shape, b_shape = m.shape("a"), m.shape("b")
    for name, shape in (("A", a_shape), ("B", b_shape)):
        if shape is None:
            return decline(symbolic_reason(f"matmul {name}", m["a" if name == "A" else "b"], m.batch_dims))
    if len(a_shape) == 1 and len(b_shape) == 1:
        return decline(f"A {shape_text(a_shape)} and B {shape_text(b_shape)} are both 1-D: a dot product to a "
                       "scalar, which the kernel (a matrix of outputs) does not write")
    dtypes = {m.dtype("a"), m.dtype("b"), m.dtype("matmul")}
    if len(dtypes) != 1 or m.dtype("a") not in SUPPORTED_DTYPES:
        return decline(f"matmul dtypes are A {m.dtype('a')}, B {m.dtype('b')}, output {m.dtype('matmul')}; the compute "
                       f"takes one of {', '.join(SUPPORTED_DTYPES)} for all three")
    views = kernel_views(a_shape, b_shape)
    if isinstance(views, str):
        return decline(views)
    if ("divide" in m or "multiply" in m) and scalar_constant(m["scale"], float_only=True) is None:
        return decline(f"the matmul's scale has shape {shape_text(m['scale'])}; expected a scalar constant")
    if "bias_add" in m:
        out = m.shape("bias_add")
        if out is None or out != m.shape("matmul") or _bias(m) is None:
            return decline(f"bias constant has shape {static_shape(m.const_operand('bias_add'))}; expected one value "
                           f"per output column ({views[2][-1]},) broadcast over the matmul's output "
                           f"{shape_text(m.shape('matmul'))} without changing its shape")
    return None


def _bias(m: Match) -> np.ndarray | None:
    out = m.shape("matmul")
    return axis_vector(_tvm.constant_value(m.const_operand("bias_add")), [1] * (len(out) - 1) + [out[-1]], -1)


def lower_batch_matmul(m: Match, activation, activation_params=None) -> Lowering:
    a_shape, b_shape = m.shape("a"), m.shape("b")
    a_view, b_view, out = kernel_views(a_shape, b_shape)
    dtype = m.dtype("a")
    has_bias = "bias_add" in m
    scale_op = "divide" if "divide" in m else "multiply" if "multiply" in m else None
    root = m.shape("root")
    return Lowering(
        compute=BATCH_MATMUL_FAMILY,
        inputs=[m["a"], m["b"]],
        constants=[_bias(m).astype(accumulator_dtype(dtype))] if has_bias else [],
        attrs=dict(has_bias=has_bias, scale=scalar_constant(m["scale"]) if scale_op else None, scale_op=scale_op,
                   activation=activation, activation_params=dict(activation_params or {})),
        input_shapes={i: view for i, (view, given) in enumerate(((a_view, a_shape), (b_view, b_shape)))
                      if view != tuple(given)},
        out_shape=None if shape_text(root) == shape_text(out) else root,
    )


#: structure -> (name prefix, pattern options, formula); priorities: patterns/priority.py
STRUCTURES = {
    "matmul": ("batch_matmul", {}, "matmul(A, B) [* c | / c] [+ b] -> {act}  ==>  {name}(A, B, b')"),
}

RULES = epilogue_rules(STRUCTURES, [("matmul", act) for act in [*BY_RANK, None]], batch_matmul_spec,
                       batch_matmul_checks, __file__)
