"""Depthwise conv2d -> its epilogue -> pointwise (1x1) conv2d -> its epilogue, as one kernel:

    conv2d(x, Wd, groups=C) -> [+ bd] -> [batch_norm] -> act1 -> conv2d(., Wp 1x1) -> [+ bp] -> [batch_norm]
        -> [act2 | add(., residual)]  ==>  depthwise_<...>_pointwise_<...>(x, [residual], Wd', bd', Wp', bp')

MobileNetV1's depthwise-separable layers and the depthwise -> projection half of MobileNetV2 / EfficientNet
inverted residuals (with the residual add when the block has one). The depthwise output (C * M channels,
the block's widest tensor) is computed per tile of output rows and read by the 1x1 conv while it is in
cache (`schedules/llvm/depthwise_pointwise.py`) or shared memory (`schedules/cuda/depthwise_pointwise.py`);
it is never written to memory. Each half is a member of the conv family (`conv_epilogue`): its pattern,
checks and BatchNorm folds are the conv rules', run on the half's annotations (`dw_*`, `pw_*`).
act1 is relu, relu6, hardswish or silu; act2 none, relu or relu6, or a residual add (no activation).
The depthwise conv must have groups == input channels (any multiplier M), a 3x3 or 5x5 kernel, strides 1
or 2, no dilation; the pointwise conv a 1x1 kernel, stride 1, no padding, groups 1. Squeeze-excite between
the two (MobileNetV3, EfficientNet) is not this chain: the squeeze-excite rules take it. Half models
compute in float32 (the intermediate too) and round the output once.
"""

from __future__ import annotations

import numpy as np

from tvm_fusion.patterns._conv_chain import annotations, depthwise_reason, halves_check, pointwise_reason
from tvm_fusion.patterns.conv_epilogue import conv_checks, conv_epilogue
from tvm_fusion.patterns.priority import priority
from tvm_fusion.rules import Lowering, Match, Spec, rule
from tvm_fusion.schedules.depthwise_pointwise import DWPW_FAMILY

DW_ACTS = ("hardswish", "silu", "relu6", "relu")  # containing forms first
#: the pointwise epilogue -> conv_epilogue options (priorities: patterns/priority.py, a longer match first)
PW_EPILOGUES = {"add": dict(residual=True), "relu6": dict(activation="relu6"), "relu": dict(activation="relu"),
                "": {}}
KERNELS = ((3, 3), (5, 5))
STRIDES = (1, 2)


def rule_name(bn: bool, dw_act: str, pw: str) -> str:
    """depthwise_bn_relu6_pointwise_bn_add; with dw_act "<act>": its tier in patterns/priority.py."""
    parts = ["depthwise", *(["bn"] if bn else []), dw_act, "pointwise", *(["bn"] if bn else []), *([pw] if pw else [])]
    return "_".join(parts)


def dwpw_pattern(bn: bool, dw_act: str, pw: str) -> Spec:
    dw = conv_epilogue(bn=bn, activation=dw_act)
    pw_spec = conv_epilogue(bn=bn, x=dw.pattern, **PW_EPILOGUES[pw])
    ann = annotations(("dw", dw), ("pw", pw_spec))
    variants = tuple((pattern, {**ann, **{f"pw_{k}": v for k, v in variant_ann.items()}, "root": pattern})
                     for pattern, variant_ann in pw_spec.variants)

    def lower(m: Match) -> Lowering:
        return lower_dwpw(dw.lower(m.prefixed("dw_")), pw_spec.lower(m.prefixed("pw_")))

    return Spec(pw_spec.pattern, ann, lower, halves_check(("dw", dw), ("pw", pw_spec)), variants=variants)


def dwpw_checks(m: Match):
    """The conv family's checks on each half first (layout, dtype, BatchNorm, residual, symbolic dims)."""
    for half in ("dw", "pw"):
        why = conv_checks(m.prefixed(f"{half}_"))
        if why:
            return why
    return depthwise_reason(m, "dw", "first", KERNELS, STRIDES) or pointwise_reason(m, "pw", "second")


def lower_dwpw(dw: Lowering, pw: Lowering) -> Lowering:
    """The two halves' lowerings (folds done by the conv family) as the one kernel's."""
    wp, bp = pw.constants
    return Lowering(
        compute=DWPW_FAMILY,
        inputs=[dw.inputs[0], *pw.inputs[1:]],
        constants=[*dw.constants, np.ascontiguousarray(wp.reshape(wp.shape[:2])), bp],
        attrs=dict(strides=dw.attrs["strides"], padding=dw.attrs["padding"], dw_activation=dw.attrs["activation"],
                   dw_activation_params=dw.attrs["activation_params"], activation=pw.attrs["activation"],
                   activation_params=pw.attrs["activation_params"]),
    )


def _make_rule(bn: bool, dw_act: str, pw: str):
    name = rule_name(bn, dw_act, pw)

    def build():
        return dwpw_pattern(bn, dw_act, pw)

    bn_text = " -> [batch_norm]" if bn else ""
    pw_text = {"add": " -> add(., residual)", "": ""}.get(pw, f" -> {pw}")
    operands = "x, residual" if pw == "add" else "x"
    build.__doc__ = (f"conv2d(groups=C) -> [+ b]{bn_text} -> {dw_act} -> conv2d(1x1) -> [+ b]{bn_text}{pw_text}  "
                     f"==>  {name}({operands}, Wd', bd', Wp', bp')")
    made = rule(name, priority=priority(rule_name(bn, "<act>", pw), dw_act), check=dwpw_checks)(build)
    made.source = __file__
    return made


#: above every conv rule (each would take one of the two convs); a pointwise epilogue that takes more of the
#: graph first (the residual add, then an activation), then the activations that contain another
RULES = [_make_rule(bn, act, pw) for pw in PW_EPILOGUES for bn in (True, False) for act in DW_ACTS]
