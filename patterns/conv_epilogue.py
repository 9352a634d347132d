"""conv2d -> [add bias] -> [batch_norm] -> [add residual] -> [activation]  ==>  one conv kernel.

BatchNorm (inference) folds into the weights at compile time:
    s = gamma / sqrt(var + eps);  W' = W * s;  b' = (b - mean) * s + beta  =  b * s + t,  t = beta - mean * s
(s and t are rounded to the tensor dtype once, by the normalize step; the fold itself runs in float64.)
The fuse stage first rewrites inference `batch_norm(x)[0]` as `x * s + t` (per channel), so a conv -> BN
with nothing after it is still a single-rooted match; a training-mode batch_norm stays and is declined.
"""

from __future__ import annotations

import numpy as np

from tvm_fusion import _tvm, registry
from tvm_fusion._tvm import dpl
from tvm_fusion.rules import Lowering, Match, Spec, commutative, decline, rule, static_shape

SUPPORTED_DTYPES = ("float32",)
CONV_FAMILY = "conv2d_affine"  # schedules/conv2d.py registers it; rules without their own compute use it


#: single-op activations: name in schedules/activations.py -> the Relax op TVM's ONNX importer emits
ACTIVATION_OPS = {
    "relu": "relax.nn.relu",
    "sigmoid": "relax.sigmoid",
    "tanh": "relax.tanh",
    "gelu_erf": "relax.nn.gelu",
    "gelu_tanh": "relax.nn.gelu_tanh",
}


def activation_pattern(activation: str, y):
    """act(y) as a dpl pattern."""
    if activation not in ACTIVATION_OPS:
        raise ValueError(f"unknown activation {activation!r}; known: {', '.join(ACTIVATION_OPS)}")
    return dpl.is_op(ACTIVATION_OPS[activation])(y)


def conv_epilogue(*, bn: bool, residual: bool = False, bias: bool | None = None, activation=None) -> Spec:
    """The pattern for one member of the family. bias=None means "with or without a conv bias"."""
    conv = dpl.is_op("relax.nn.conv2d")(dpl.wildcard(), dpl.is_const())
    ann = {"conv": conv}
    bias_add = dpl.is_op("relax.add")(conv, dpl.is_const())
    y = {None: conv | bias_add, True: bias_add, False: conv}[bias]
    ann["bias_add"] = bias_add
    if bn:
        scale = dpl.is_op("relax.multiply")(y, dpl.is_const())
        shift = dpl.is_op("relax.add")(scale, dpl.is_const())
        stats = [dpl.is_const() for _ in range(4)]
        batch_norm = dpl.is_op("relax.nn.batch_norm")(y, *stats)
        ann.update(bn_scale=scale, bn_shift=shift, batch_norm=batch_norm)
        y = shift | dpl.is_tuple_get_item(batch_norm, 0)
    if residual:
        other = dpl.wildcard()
        y = commutative("relax.add", y, other)
        ann.update(residual_add=y, residual=other)
    if activation is not None:
        y = activation_pattern(activation, y)
        ann["activation"] = y
    ann["root"] = y
    return Spec(y, ann, lambda m: lower_conv(m, activation))


def _per_channel(expr, channels: int) -> np.ndarray | None:
    """A relax constant as a per-output-channel float64 vector, or None if it is not one."""
    if not _tvm.is_constant(expr):
        return None
    value = _tvm.constant_value(expr)
    if value.size == 1:
        return np.full(channels, float(value.reshape(())), dtype=np.float64)
    if value.shape in ((channels,), (channels, 1, 1), (1, channels, 1, 1)):
        return value.reshape(channels).astype(np.float64)
    return None


def conv_checks(m: Match):
    """Declines with the actual and expected values when the compute cannot take the match."""
    attrs = m.attrs("conv")
    if str(attrs.data_layout) != "NCHW" or str(attrs.kernel_layout) != "OIHW":
        return decline(f"conv2d layout is {attrs.data_layout}/{attrs.kernel_layout}; the compute takes NCHW/OIHW")
    if str(attrs.out_layout) not in ("NCHW", ""):
        return decline(f"conv2d out_layout is {attrs.out_layout}; expected NCHW")
    dtype = m.dtype("conv")
    if dtype not in SUPPORTED_DTYPES:
        return decline(f"conv2d dtype is {dtype}; the compute supports {', '.join(SUPPORTED_DTYPES)}")
    out_shape = m.shape("conv")
    in_shape = static_shape(m.value("conv").args[0])
    if out_shape is None or in_shape is None:
        return decline("conv2d has a symbolic shape; bind input shapes (--shape NAME=1x3x224x224)")
    channels = out_shape[1]
    for name in ("bias_add", "bn_scale", "bn_shift"):
        if name in m:
            const_arg = m.value(name).args[1]
            if _per_channel(const_arg, channels) is None:
                return decline(f"{name} constant has shape {static_shape(const_arg)}; expected one value per "
                               f"output channel ({channels},) or (1, {channels}, 1, 1)")
    if "batch_norm" in m:
        bn_attrs = m.attrs("batch_norm")
        if bool(bn_attrs.training):
            return decline("batch_norm is in training mode (training=True); only inference BatchNorm folds "
                           "into the conv weights")
        if int(bn_attrs.axis) != 1:
            return decline(f"batch_norm axis is {int(bn_attrs.axis)}; expected 1 (channels of NCHW)")
    if "residual" in m:
        res_shape = m.shape("residual")
        if res_shape != out_shape:
            return decline(f"residual operand has shape {res_shape}; expected the conv output shape {out_shape}")
        if m.dtype("residual") != dtype:
            return decline(f"residual dtype is {m.dtype('residual')}; expected {dtype}")
    return None


def lower_conv(m: Match, activation) -> Lowering:
    conv = m.value("conv")
    attrs = conv.attrs
    w = _tvm.constant_value(conv.args[1]).astype(np.float64)
    channels = w.shape[0]
    b = np.zeros(channels)
    if "bias_add" in m:
        b = _vector(m, m.value("bias_add").args[1], channels)
    if "bn_scale" in m:
        s = _vector(m, m.value("bn_scale").args[1], channels)
        t = _vector(m, m.value("bn_shift").args[1], channels)
        w, b = w * s[:, None, None, None], b * s + t
    elif "batch_norm" in m:
        bn = m.value("batch_norm")
        gamma, beta, mean, var = (_vector(m, a, channels) for a in bn.args[1:5])
        s = gamma / np.sqrt(var + float(bn.attrs.epsilon))
        w, b = w * s[:, None, None, None], (b - mean) * s + beta
    dtype = m.dtype("conv")
    inputs = [conv.args[0]]
    if "residual" in m:
        inputs.append(m["residual"])
    return Lowering(
        compute=m.rule if registry.has_compute(m.rule) else CONV_FAMILY,
        inputs=inputs,
        constants=[w.astype(dtype), b.astype(dtype)],
        attrs=dict(
            strides=tuple(int(v) for v in attrs.strides),
            padding=tuple(int(v) for v in attrs.padding),
            dilation=tuple(int(v) for v in attrs.dilation),
            groups=int(attrs.groups),
            activation=activation,
        ),
    )


def _vector(m: Match, expr, channels: int) -> np.ndarray:
    vec = _per_channel(expr, channels)
    assert vec is not None, "conv_checks guarantees per-channel constants"
    return vec


@rule("conv2d_bn_add_relu", priority=400, check=conv_checks)
def conv2d_bn_add_relu():
    """conv2d -> [add bias] -> batch_norm -> add(., other) -> relu  ==>  conv2d_bn_add_relu(x, other, W', b')"""
    return conv_epilogue(bn=True, residual=True, activation="relu")


@rule("conv2d_bn_relu", priority=300, check=conv_checks)
def conv2d_bn_relu():
    """conv2d -> [add bias] -> batch_norm -> relu  ==>  conv2d_bn_relu(x, W', b')"""
    return conv_epilogue(bn=True, activation="relu")


@rule("conv2d_bn", priority=200, check=conv_checks)
def conv2d_bn():
    """conv2d -> [add bias] -> batch_norm  ==>  conv2d_bn(x, W', b')"""
    return conv_epilogue(bn=True)


@rule("conv2d_bias_relu", priority=150, check=conv_checks)
def conv2d_bias_relu():
    """conv2d -> add bias -> relu  ==>  conv2d_bias_relu(x, W, b)"""
    return conv_epilogue(bn=False, bias=True, activation="relu")


@rule("conv2d_relu", priority=140, check=conv_checks)
def conv2d_relu():
    """conv2d -> relu  ==>  conv2d_relu(x, W, 0)"""
    return conv_epilogue(bn=False, bias=False, activation="relu")
