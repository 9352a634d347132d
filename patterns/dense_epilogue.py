"""matmul(x, W) -> [add b] -> [batch_norm] -> [activation]  ==>  dense_<...>(x, W', b')   (Gemm / MatMul).
matmul(x, W) -> [add b] -> c * .                           ==>  dense_scale(x, W * c, b * c)   (layer scale)

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
from tvm_fusion.patterns.activations import ACTIVATIONS, epilogue_spec
from tvm_fusion.precision import accumulator_dtype, half_batch_norm_casts, numpy_dtype
from tvm_fusion.rules import Lowering, Match, Spec, axis_vector, commutative, decline, rule, static_shape

SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")  # half: summed in float32, bias kept in float32
DENSE_FAMILY = "dense_affine"  # schedules/dense.py registers it; rules without their own compute use it


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


def _const_operand(m: Match, name: str):
    """The constant operand of the binary op annotated `name` (either operand order)."""
    call = m.value(name)
    return next(a for a in call.args if _tvm.is_constant(a))


def _feature_vector(expr, out_shape) -> np.ndarray | None:
    """A constant that is one value per output feature (the last axis) of the match's output shape
    `out_shape` under NumPy broadcasting: (n,), (1, n), ... or size 1. A constant of a higher rank than the
    matmul output makes the output rank higher ([2, K] @ W + b[1, 1, N] is [1, 2, N]): the kernel's
    [rows, N] is then viewed as that shape."""
    return axis_vector(_tvm.constant_value(expr), out_shape, -1)


def dense_checks(m: Match):
    x_shape, w_shape = (static_shape(a) for a in m.value("matmul").args)
    if x_shape is None:
        return decline("matmul input has a symbolic shape; bind input shapes (--shape NAME=1x3x224x224)")
    if len(x_shape) < 2 or len(w_shape) != 2:
        return decline(f"matmul operands have ranks {len(x_shape)} and {len(w_shape)}; dense takes x of rank "
                       ">= 2 and a 2-D constant W")
    dtype = m.dtype("matmul")
    if dtype not in SUPPORTED_DTYPES:
        return decline(f"matmul dtype is {dtype}; the compute supports {', '.join(SUPPORTED_DTYPES)}")
    why = half_batch_norm_casts(m, dtype, "matmul")
    if why:
        return decline(why)
    n = w_shape[1]
    out_shape = m.shape("root")
    for name in ("bias_add", "bn_scale", "bn_shift", "layer_scale"):
        if name in m:
            const = _const_operand(m, name)
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
    b = _feature_vector(_const_operand(m, "bias_add"), out_shape) if "bias_add" in m else np.zeros(n)
    if "bn_scale" in m:
        s = _feature_vector(_const_operand(m, "bn_scale"), out_shape)
        t = _feature_vector(_const_operand(m, "bn_shift"), out_shape)
        w, b = w * s[None, :], b * s + t
    if "layer_scale" in m:
        s = _feature_vector(_const_operand(m, "layer_scale"), out_shape)
        w, b = w * s[None, :], b * s
    dtype = m.dtype("matmul")
    x_shape = static_shape(x)
    rows = int(np.prod(x_shape[:-1]))
    return Lowering(
        compute=m.rule if registry.has_compute(m.rule) else DENSE_FAMILY,
        inputs=[x],
        constants=[w.astype(numpy_dtype(dtype)), b.astype(accumulator_dtype(dtype))],
        attrs=dict(activation=activation, activation_params=dict(activation_params or {})),
        input_shapes={0: (rows, x_shape[-1])} if len(x_shape) != 2 else {},
        out_shape=out_shape if out_shape != (rows, n) else None,
    )


#: structure -> (name prefix, priority tier, pattern options, formula)
STRUCTURES = {
    "bn": ("dense_bn", 130, dict(bias=None, bn=True), "matmul(x, W) -> [add b] -> batch_norm -> {act}"),
    "bias": ("dense_bias", 110, dict(bias=True), "matmul(x, W) -> add b -> {act}"),
    "scale": ("dense_scale", 125, dict(bias=None, scale=True), "matmul(x, W) -> [add b] -> * c -> {act}"),
}
ACTIVATION_RANK = {"hardswish": 9, "silu": 8, "gelu_tanh": 7, "gelu_erf": 6, "hardsigmoid": 5,
                   "relu6": 4, "leaky_relu": 3, "sigmoid": 2, "tanh": 1, "relu": 0}


def _make_rule(structure: str, activation: str | None):
    prefix, tier, options, formula = STRUCTURES[structure]
    name = f"{prefix}_{activation}" if activation else prefix
    priority = tier + (ACTIVATION_RANK[activation] + 1 if activation else 0)

    def build():
        return dense_epilogue(activation=activation, **options)

    text = formula.replace(" -> {act}", f" -> {activation}" if activation else "")
    build.__doc__ = f"{text}  ==>  {name}(x, W', b')"
    made = rule(name, priority=priority, check=dense_checks)(build)
    made.source = __file__
    return made


#: the layer scale comes without an activation (ConvNeXt, CaiT); below dense_bn, which also has the `* c`
RULES = [_make_rule(st, act) for st in ("bn", "bias")
         for act in [*sorted(ACTIVATIONS, key=lambda a: -ACTIVATION_RANK[a]), None]] + [_make_rule("scale", None)]
