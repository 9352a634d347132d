"""matmul(x, W) -> [add b] -> [batch_norm] -> [activation]  ==>  dense_<...>(x, W', b')   (Gemm / MatMul).
matmul(x, W) -> [add b] -> c * .                           ==>  dense_scale(x, W * c, b * c)   (layer scale)
matmul(x, W) -> quantize -> dequantize                      ==>  dense_fake_quant(x, W, 0)      (QDQ models)

TVM imports Gemm as permute_dims(W) + matmul + add; FoldConstant turns permute_dims(W) into a constant.
x may be batched ([..., M, K] with a bias over the last axis): the kernel sees x as [rows, K] and its
output is viewed back as [..., N] (reshapes, no copies). BatchNorm over the features (inference, as
x * s + t after the fuse stage's normalization; in a half model between casts to float32 and back, s and
t then float32) folds into the weights: W' = W * s, b' = b * s + t; a
per-feature scale alone (ConvNeXt's and CaiT's layer scale `gamma * fc2(x)`, constant first or second)
likewise: W' = W * c, b' = b * c.
"""

from __future__ import annotations

import numpy as np

from tvm_fusion import _tvm, registry
from tvm_fusion._tvm import dpl
from tvm_fusion.patterns.activations import BY_RANK, epilogue_rules, epilogue_spec
from tvm_fusion.precision import accumulator_dtype, dtype_reason, numpy_dtype
from tvm_fusion.rules import (Lowering, Match, Spec, axis_vector, batch_shape, commutative, decline, is_symbolic,
                              shape_text, static_shape, symbolic_reason)
from tvm_fusion.schedules.dense import DENSE_FAMILY  # the family compute: rules without their own lower to it

SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")  # half: summed in float32, bias kept in float32


def dense_epilogue(*, bias: bool | None = True, bn: bool = False, scale: bool = False, activation=None) -> Spec:
    """The pattern of one family member. bias=None means "with or without a bias"."""
    matmul = dpl.is_op("relax.matmul")(dpl.wildcard(), dpl.is_const())
    bias_const = dpl.is_const()
    bias_add = commutative("relax.add", matmul, bias_const)
    y = {None: matmul | bias_add, True: bias_add, False: matmul}[bias]
    ann = {"matmul": matmul, "bias_add": bias_add, "bias": bias_const}
    if bn:
        widen = dpl.is_op("relax.astype")(y)  # a half model's BatchNorm, computed in float32 by the importer
        scale = commutative("relax.multiply", y | widen, dpl.is_const())
        shift = commutative("relax.add", scale, dpl.is_const())
        narrow = dpl.is_op("relax.astype")(shift)
        y = narrow | shift
        ann.update(bn_scale=scale, bn_shift=shift, bn_widen=widen, bn_narrow=narrow)
    elif scale:
        y = commutative("relax.multiply", y, dpl.is_const())
        ann.update(layer_scale=y)
    return epilogue_spec(y, ann, activation, lower_dense)


def _feature_vector(expr, out_shape) -> np.ndarray | None:
    """A constant that is one value per output feature (the last axis) of the match's output shape
    `out_shape` under NumPy broadcasting: (n,), (1, n), ... or size 1. A constant of a higher rank than the
    matmul output makes the output rank higher ([2, K] @ W + b[1, 1, N] is [1, 2, N]): the kernel's
    [rows, N] is then viewed as that shape."""
    return axis_vector(_tvm.constant_value(expr), out_shape, -1)


def dense_checks(m: Match):
    x, w = m.value("matmul").args
    x_shape, w_shape = batch_shape(x), static_shape(w)
    if x_shape is None:
        return decline(symbolic_reason("matmul input", x))
    if is_symbolic(x_shape) and len(x_shape) != 2:
        return decline(f"matmul input has shape {shape_text(x)}; with a symbolic batch the kernel takes a 2-D x "
                       "only (it would view x as [rows, K] with rows a product of dims)")
    if len(x_shape) < 2 or len(w_shape) != 2:
        return decline(f"matmul operands have ranks {len(x_shape)} and {len(w_shape)}; dense takes x of rank "
                       ">= 2 and a 2-D constant W")
    dtype = m.dtype("matmul")
    why = dtype_reason(m, dtype, "matmul", SUPPORTED_DTYPES)
    if why:
        return decline(why)
    n = w_shape[1]
    out_shape = m.shape("root")
    if out_shape is None:
        return decline(symbolic_reason("matmul output", m["root"]))
    for name in ("bias_add", "bn_scale", "bn_shift", "layer_scale"):
        if name in m:
            const = m.const_operand(name)
            if _feature_vector(const, out_shape) is None:
                return decline(f"{name} constant has shape {static_shape(const)}; expected one value per output "
                               f"feature ({n},) broadcast over the last axis")
    return None


def lower_dense(m: Match, activation, activation_params=None) -> Lowering:
    matmul = m.value("matmul")
    x = matmul.args[0]
    w = _tvm.constant_value(matmul.args[1]).astype(np.float64)
    n = w.shape[1]
    out_shape = m.shape("root")
    b = _feature_vector(m.const_operand("bias_add"), out_shape) if "bias_add" in m else np.zeros(n)
    if "bn_scale" in m:
        s = _feature_vector(m.const_operand("bn_scale"), out_shape)
        t = _feature_vector(m.const_operand("bn_shift"), out_shape)
        w, b = w * s[None, :], b * s + t
    if "layer_scale" in m:
        s = _feature_vector(m.const_operand("layer_scale"), out_shape)
        w, b = w * s[None, :], b * s
    dtype = m.dtype("matmul")
    x_shape = batch_shape(x)
    rows = x_shape[0] if len(x_shape) == 2 else int(np.prod(x_shape[:-1]))  # 2-D when the batch is symbolic
    return Lowering(
        compute=m.rule if registry.has_compute(m.rule) else DENSE_FAMILY,
        inputs=[x],
        constants=[w.astype(numpy_dtype(dtype)), b.astype(accumulator_dtype(dtype))],
        attrs=dict(activation=activation, activation_params=dict(activation_params or {})),
        input_shapes={0: (rows, x_shape[-1])} if len(x_shape) != 2 else {},
        out_shape=out_shape if shape_text(out_shape) != shape_text((rows, n)) else None,
    )


#: structure -> (name prefix, pattern options, formula); priorities: patterns/priority.py
STRUCTURES = {
    "bn": ("dense_bn", dict(bias=None, bn=True),
           "matmul(x, W) -> [add b] -> batch_norm -> {act}  ==>  {name}(x, W', b')"),
    "bias": ("dense_bias", dict(bias=True), "matmul(x, W) -> add b -> {act}  ==>  {name}(x, W', b')"),
    "scale": ("dense_scale", dict(bias=None, scale=True),
              "matmul(x, W) -> [add b] -> * c -> {act}  ==>  {name}(x, W', b')"),
    "plain": ("dense", dict(bias=False), "matmul(x, W) -> {act}  ==>  {name}(x, W, 0)"),
}


#: the layer scale comes without an activation (ConvNeXt, CaiT); below dense_bn, which also has the `* c`. A
#: bare matmul only with a fake quantization after it (a QDQ model's MatMul -> Q -> DQ -> Add bias)
RULES = epilogue_rules(STRUCTURES, [(st, act) for st in ("bn", "bias") for act in [*BY_RANK, None]]
                       + [("scale", None), ("plain", "fake_quant")], dense_epilogue, dense_checks, __file__)
