"""conv2d -> [add bias] -> [batch_norm -> [* c + d]] -> [add residual] -> [activation]  ==>  one conv kernel.

BatchNorm (inference) folds into the weights at compile time:
    s = gamma / sqrt(var + eps);  W' = W * s;  b' = (b - mean) * s + beta  =  b * s + t,  t = beta - mean * s
and so does a per-channel scale layer right after it (Caffe's Scale, `* c + d`: DenseNet, Inception v2):
    W'' = W' * c;  b'' = b' * c + d
(s and t are rounded to the tensor dtype once, by the normalize step; the fold itself runs in float64.)
Half precision (float16 / bfloat16): the importer computes a half BatchNorm in float32 between two casts,
`astype(astype(y, float32) * s + t, half)`; that form matches too, so s and t are the float32 values: the
BatchNorm is folded from float32 statistics in float64, then the weights are rounded once to the half
dtype and the bias kept in float32 (the compute accumulates and applies its epilogue in float32).
The fuse stage first rewrites inference `batch_norm(x)[0]` as `x * s + t` (per channel), so a conv -> BN
with nothing after it is still a single-rooted match; a training-mode batch_norm stays and is declined.
A conv1d (audio, FSMN memory blocks) is the same family at height 1: `conv1d(x[N, C, W], W[O, I, K])` lowers
to the conv2d kernel of x viewed as [N, C, 1, W] and W as [O, I, 1, K] (strides, padding and dilation along
the width), its output (and a residual) viewed back as [N, O, W'] (reshapes, no copies), so every member
of the table, and each target's conv plans, take it.
A conv3d (video, volumes: NCDHW / OIDHW) is the same family one dimension up: the same patterns, checks and
folds (per output channel, axis 1), lowered to the conv3d compute (`schedules/conv3d.py`, the conv2d compute
with a depth axis and the same epilogue; its llvm and CUDA schedules beside conv2d's). The rules keep their
conv2d names.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tvm_fusion import _tvm, registry
from tvm_fusion._tvm import dpl
from tvm_fusion.patterns.activations import BY_RANK, epilogue_rules, epilogue_spec
from tvm_fusion.precision import accumulator_dtype, dtype_reason, numpy_dtype
from tvm_fusion.rules import (Lowering, Match, Spec, axis_vector, axis_vector_shapes, batch_shape, commutative,
                              decline, shape_text, static_shape, symbolic_reason)
from tvm_fusion.schedules.conv2d import CONV_FAMILY  # the family compute: rules without their own lower to it
from tvm_fusion.schedules.conv3d import CONV3D_FAMILY  # a conv3d's compute

SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")


def conv_epilogue(*, bn: bool, residual: bool = False, bias: bool | None = None, activation=None,
                  act_first: bool = False, x=None) -> Spec:
    """The pattern for one member of the family. bias=None means "with or without a conv bias". A residual
    member also tries add(skip, y) after add(y, skip) | add(skip, y): in add(conv_a, conv_b) where conv_a
    also feeds the next block (MobileNetV3's inverted residuals), the first pattern binds y to conv_a and
    declines (an intermediate with another consumer); the swapped variant then takes conv_b. `x`: the conv's
    input pattern (a wildcard by default; a rule that chains two convs passes the first one's pattern)."""
    make = _activation_then_add if act_first else _conv_epilogue
    spec = make(bn=bn, residual="either" if residual else None, bias=bias, activation=activation, x=x)
    if residual:
        swapped = make(bn=bn, residual="skip_first", bias=bias, activation=activation, x=x)
        spec = dataclasses.replace(spec, variants=((swapped.pattern, swapped.annotations),))
    return spec


def _residual(y, residual: str, ann: dict):
    other = dpl.wildcard()
    y = commutative("relax.add", y, other) if residual == "either" else dpl.is_op("relax.add")(other, y)
    ann.update(residual_add=y, residual=other)
    return y


def _activation_then_add(*, bn: bool, residual: str, bias: bool | None, activation, x=None) -> Spec:
    """conv2d -> ... -> act -> add(., other) (YOLO's bottleneck: the skip joins after the SiLU): the kernel
    adds the residual after the activation (`residual_after_activation`)."""
    inner = _conv_epilogue(bn=bn, residual=None, bias=bias, activation=activation, x=x)
    ann = dict(inner.annotations)
    root = _residual(inner.pattern, residual, ann)
    ann["root"] = root

    def lower(m: Match) -> Lowering:
        lowering = inner.lower(m)
        lowering.attrs["residual_after_activation"] = True
        return lowering

    return Spec(root, ann, lower, inner.check)


def _conv_epilogue(*, bn: bool, residual: str | None, bias: bool | None, activation, x=None) -> Spec:
    x, w = dpl.wildcard() if x is None else x, dpl.is_const()
    conv = dpl.is_op("relax.nn.conv2d")(x, w) | dpl.is_op("relax.nn.conv1d")(x, w) | dpl.is_op("relax.nn.conv3d")(x, w)
    ann = {"conv": conv}
    bias_add = dpl.is_op("relax.add")(conv, dpl.is_const())
    y = {None: conv | bias_add, True: bias_add, False: conv}[bias]
    ann["bias_add"] = bias_add
    if bn:
        widen = dpl.is_op("relax.astype")(y)  # a half BatchNorm, computed in float32 (see the docstring)
        scale = dpl.is_op("relax.multiply")(y | widen, dpl.is_const())
        shift = dpl.is_op("relax.add")(scale, dpl.is_const())
        narrow = dpl.is_op("relax.astype")(shift)
        stats = [dpl.is_const() for _ in range(4)]
        batch_norm = dpl.is_op("relax.nn.batch_norm")(y, *stats)
        ann.update(bn_scale=scale, bn_shift=shift, batch_norm=batch_norm, bn_widen=widen, bn_narrow=narrow)
        y = narrow | shift | dpl.is_tuple_get_item(batch_norm, 0)
        # an optional per-channel scale layer after the BatchNorm (Caffe's Scale: DenseNet, Inception v2)
        post_scale = dpl.is_op("relax.multiply")(y, dpl.is_const())
        post_shift = dpl.is_op("relax.add")(post_scale, dpl.is_const())
        ann.update(post_scale=post_scale, post_shift=post_shift)
        y = post_shift | y
    if residual:
        y = _residual(y, residual, ann)
    return epilogue_spec(y, ann, activation, lower_conv)


def _per_channel(expr, out_shape) -> np.ndarray | None:
    """A relax constant as a per-output-channel float64 vector (axis 1 of the NCHW conv output, under
    NumPy broadcasting), or None if it is not one."""
    if not _tvm.is_constant(expr):
        return None
    return axis_vector(_tvm.constant_value(expr), out_shape, 1)


def conv_checks(m: Match):
    """Declines with the actual and expected values when the compute cannot take the match."""
    attrs = m.attrs("conv")
    op = _conv_op(m)
    data, kernel = LAYOUTS[op]
    if str(attrs.data_layout) != data or str(attrs.kernel_layout) != kernel:
        return decline(f"{op} layout is {attrs.data_layout}/{attrs.kernel_layout}; the compute takes {data}/{kernel}")
    if str(attrs.out_layout) not in (data, ""):
        return decline(f"{op} out_layout is {attrs.out_layout}; expected {data}")
    dtype = m.dtype("conv")
    why = dtype_reason(m, dtype, op, SUPPORTED_DTYPES)
    if why:
        return decline(why)
    out_shape = m.shape("conv")
    x = m.value("conv").args[0]
    if out_shape is None or batch_shape(x) is None:
        return decline(symbolic_reason(f"{op} input", x))
    for name in ("bias_add", "bn_scale", "bn_shift", "post_scale", "post_shift"):
        if name in m:
            const_arg = m.const_operand(name)
            if _per_channel(const_arg, out_shape) is None:
                return decline(f"{name} constant has shape {static_shape(const_arg)}; expected one value per "
                               f"output channel, {axis_vector_shapes(out_shape, 1)}, broadcast against the conv "
                               f"output {shape_text(out_shape)}")
    if "batch_norm" in m:
        bn_attrs = m.attrs("batch_norm")
        if bool(bn_attrs.training):
            return decline("batch_norm is in training mode (training=True); only inference BatchNorm folds "
                           "into the conv weights")
        if int(bn_attrs.axis) != 1:
            return decline(f"batch_norm axis is {int(bn_attrs.axis)}; expected 1 (channels of NCHW)")
    if "residual" in m:
        add_args = m.value("residual_add").args
        if add_args[0].same_as(add_args[1]):
            return decline("the residual add adds the epilogue's own value to itself (add(y, y)); the kernel's "
                           "residual is another tensor")
        res_shape = m.shape("residual")
        if res_shape is None or shape_text(res_shape) != shape_text(out_shape):  # N compares by name
            return decline(f"residual operand has shape {shape_text(m['residual'])}; expected the conv output shape "
                           f"{shape_text(out_shape)}")
        if m.dtype("residual") != dtype:
            return decline(f"residual dtype is {m.dtype('residual')}; expected {dtype}")
        if _per_channel(m.value("residual"), out_shape) is not None:  # a 1x1 output's bias has its shape
            return decline(f"residual operand is a per-channel constant of shape {res_shape}; it is a bias, which "
                           "the conv2d_bias rules fold")
        residual = m.value("residual")  # e.g. add(bn(conv(x)), conv(x)): the kernel cannot take its own conv
        for name in ("conv", "bias_add", "bn_scale", "bn_shift", "post_scale", "post_shift"):
            if name in m and m.value(name).same_as(residual):
                return decline(f"residual operand is this match's own {name} output; expected a value computed "
                               "outside the match")
    return None


#: op -> (data layout, kernel layout) the computes take
LAYOUTS = {"conv1d": ("NCW", "OIW"), "conv2d": ("NCHW", "OIHW"), "conv3d": ("NCDHW", "OIDHW")}


def _conv_op(m: Match) -> str:
    """"conv1d", "conv2d" or "conv3d"."""
    return m.value("conv").op.name.rsplit(".", 1)[-1]


def _is_conv1d(m: Match) -> bool:
    return _conv_op(m) == "conv1d"


def _height_one(attrs: dict, inputs: list) -> tuple[dict, dict]:
    """A conv1d's attributes and inputs as the conv2d's of height 1: strides, padding and dilation along the
    width; x and a residual [N, C, W] viewed as [N, C, 1, W]."""
    attrs = dict(attrs, strides=(1, *attrs["strides"]), padding=(0, attrs["padding"][0], 0, attrs["padding"][1]),
                 dilation=(1, *attrs["dilation"]))
    return attrs, {i: (*shape[:2], 1, shape[2]) for i, shape in enumerate(batch_shape(x) for x in inputs)}


def lower_conv(m: Match, activation, activation_params=None) -> Lowering:
    conv = m.value("conv")
    attrs = conv.attrs
    w = _tvm.constant_value(conv.args[1]).astype(np.float64)
    if _is_conv1d(m):
        w = w[:, :, None, :]  # O, I, 1, K: the folds below scale along O
    channels = w.shape[0]
    along_o = (slice(None),) + (None,) * (w.ndim - 1)  # a per-channel vector against W's O axis
    out_shape = m.shape("conv")
    b = np.zeros(channels)
    if "bias_add" in m:
        b = _vector(m.const_operand("bias_add"), out_shape)
    if "bn_scale" in m:
        s = _vector(m.const_operand("bn_scale"), out_shape)
        t = _vector(m.const_operand("bn_shift"), out_shape)
        w, b = w * s[along_o], b * s + t
    elif "batch_norm" in m:  # the op's statistics are 1-D over its axis (1, checked) by definition
        bn = m.value("batch_norm")
        gamma, beta, mean, var = (_tvm.constant_value(a).reshape(channels).astype(np.float64) for a in bn.args[1:5])
        s = gamma / np.sqrt(var + float(bn.attrs.epsilon))
        w, b = w * s[along_o], (b - mean) * s + beta
    if "post_scale" in m:
        s2 = _vector(m.const_operand("post_scale"), out_shape)
        t2 = _vector(m.const_operand("post_shift"), out_shape)
        w, b = w * s2[along_o], b * s2 + t2
    dtype = m.dtype("conv")
    inputs = [conv.args[0]]
    if "residual" in m:
        inputs.append(m["residual"])
    conv_attrs = dict(strides=tuple(int(v) for v in attrs.strides), padding=tuple(int(v) for v in attrs.padding),
                      dilation=tuple(int(v) for v in attrs.dilation), groups=int(attrs.groups))
    views, out_shape = {}, None
    if _is_conv1d(m):  # the conv2d of height 1, see the module docstring
        (conv_attrs, views), out_shape = _height_one(conv_attrs, inputs), m.shape("root")
    compute = m.rule if registry.has_compute(m.rule) else CONV_FAMILY
    if _conv_op(m) == "conv3d":
        compute = CONV3D_FAMILY
    return Lowering(
        compute=compute,
        inputs=inputs,
        constants=[w.astype(numpy_dtype(dtype)), b.astype(accumulator_dtype(dtype))],
        attrs=dict(**conv_attrs, activation=activation, activation_params=dict(activation_params or {})),
        input_shapes=views,
        out_shape=out_shape,
    )


def _vector(expr, out_shape) -> np.ndarray:
    vec = _per_channel(expr, out_shape)
    assert vec is not None, "conv_checks guarantees per-channel constants"
    return vec


#: structure -> (name prefix, pattern options, formula of the match); priorities: patterns/priority.py
STRUCTURES = {
    "bn_add": ("conv2d_bn_add", dict(bn=True, residual=True),
               "conv2d -> [add bias] -> batch_norm -> [* c + d] -> add(., other) -> {act}  ==>  {name}(x, other, W', b')"),
    "bn_act_add": ("conv2d_bn_{act}_add", dict(bn=True, residual=True, act_first=True),
                   "conv2d -> [add bias] -> batch_norm -> [* c + d] -> {act} -> add(., other)  ==>  {name}(x, other, W', b')"),
    "act_add": ("conv2d_{act}_add", dict(bn=False, residual=True, act_first=True),
                "conv2d -> [add bias] -> {act} -> add(., other)  ==>  {name}(x, other, W, b)"),
    "bn": ("conv2d_bn", dict(bn=True),
           "conv2d -> [add bias] -> batch_norm -> [* c + d] -> {act}  ==>  {name}(x, W', b')"),
    "add": ("conv2d_add", dict(bn=False, residual=True),
            "conv2d -> [add bias] -> add(., other) -> {act}  ==>  {name}(x, other, W, b)"),
    "bias": ("conv2d_bias", dict(bn=False, bias=True),
             "conv2d -> add bias -> {act}  ==>  {name}(x, W, b)"),
    "plain": ("conv2d", dict(bn=False, bias=False),
              "conv2d -> {act}  ==>  {name}(x, W, 0)"),
}


#: the table: every structure with every activation; then, without an activation, conv2d_bn_add and
#: conv2d_add (residual blocks that end in the add: MobileNetV2/V3 and EfficientNet's inverted residuals),
#: conv2d_bn (projection shortcuts) and, at the lowest priorities, conv2d_bias and the bare conv2d, so that a
#: conv with no epilogue to fuse (DenseNet's convs feeding a Concat) still runs our scheduled kernel
RULES = epilogue_rules(STRUCTURES, [(st, act) for st in STRUCTURES for act in BY_RANK]
                       + [(st, None) for st in ("bn_add", "bn", "add", "bias", "plain")],
                       conv_epilogue, conv_checks, __file__)
