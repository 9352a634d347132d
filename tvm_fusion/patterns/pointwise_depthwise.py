"""Pointwise (1x1) conv2d -> its epilogue -> depthwise conv2d -> its epilogue, as one kernel:

    conv2d(x, Wp 1x1) -> [+ bp] -> [batch_norm] -> act -> conv2d(., Wd, groups=D) -> [+ bd] -> [batch_norm] -> act
        ==>  pointwise_<...>_depthwise_<...>(x, Wp', bp', Wd', bd')

The expand half of MobileNetV2 / MobileNetV3 / EfficientNet inverted residuals: the 1x1 conv widens the
block to D channels (its widest tensor) and the depthwise conv reads them back. The CPU kernel computes the
expanded channels a vector at a time into a buffer that stays in cache, where the depthwise conv reads them
(`schedules/llvm/pointwise_depthwise.py`); the expanded tensor is never written to memory. Each half is a
member of the conv family (`conv_epilogue`): its pattern, checks and BatchNorm folds are the conv rules', run
on the half's annotations (`pw_*`, `dw_*`). Both activations are the same one, relu, relu6, hardswish or
silu (the blocks of those networks). The pointwise conv must be 1x1, stride 1, unpadded, groups 1; the
depthwise conv groups == its input channels (multiplier 1), 3x3 or 5x5, strides 1 or 2, no dilation. The
expanded tensor must have no other consumer and not be a graph output (fuse's own checks). Only the CPU has
a schedule: on CUDA the rules decline and the conv rules take the two convs.
"""

from __future__ import annotations

import numpy as np

from tvm_fusion.patterns._conv_chain import annotations, depthwise_reason, halves_check, pointwise_reason
from tvm_fusion.patterns.conv_epilogue import conv_checks, conv_epilogue
from tvm_fusion.patterns.priority import priority
from tvm_fusion.rules import Lowering, Match, Spec, rule
from tvm_fusion.schedules.pointwise_depthwise import PWDW_FAMILY

#: the activation of both halves (its rank within the tier: patterns/priority.py)
ACTS = ("hardswish", "silu", "relu6", "relu")
KERNELS = ((3, 3), (5, 5))
STRIDES = (1, 2)


def rule_name(bn: bool, act: str) -> str:
    """pointwise_bn_relu6_depthwise_bn_relu6; with act "<act>": its tier in patterns/priority.py."""
    half = "_".join(["bn", act] if bn else [act])
    return f"pointwise_{half}_depthwise_{half}"


def pwdw_pattern(bn: bool, act: str) -> Spec:
    pw = conv_epilogue(bn=bn, activation=act)
    dw = conv_epilogue(bn=bn, x=pw.pattern, activation=act)

    def lower(m: Match) -> Lowering:
        return lower_pwdw(pw.lower(m.prefixed("pw_")), dw.lower(m.prefixed("dw_")))

    return Spec(dw.pattern, annotations(("pw", pw), ("dw", dw)), lower, halves_check(("pw", pw), ("dw", dw)))


def pwdw_checks(m: Match):
    """The conv family's checks on each half first (layout, dtype, BatchNorm, symbolic dims)."""
    for half in ("pw", "dw"):
        why = conv_checks(m.prefixed(f"{half}_"))
        if why:
            return why
    return (pointwise_reason(m, "pw", "first")
            or depthwise_reason(m, "dw", "second", KERNELS, STRIDES, multiplier_one=True))


def lower_pwdw(pw: Lowering, dw: Lowering) -> Lowering:
    """The two halves' lowerings (folds done by the conv family) as the one kernel's: Wp [D, C, 1, 1] as
    [C, D] (a reduction step reads D contiguous weights)."""
    wp, bp = pw.constants
    return Lowering(
        compute=PWDW_FAMILY,
        inputs=[pw.inputs[0]],
        constants=[np.ascontiguousarray(wp.reshape(wp.shape[:2]).T), bp, *dw.constants],
        attrs=dict(strides=dw.attrs["strides"], padding=dw.attrs["padding"], pw_activation=pw.attrs["activation"],
                   pw_activation_params=pw.attrs["activation_params"], activation=dw.attrs["activation"],
                   activation_params=dw.attrs["activation_params"]),
    )


def _make_rule(bn: bool, act: str):
    name = rule_name(bn, act)

    def build():
        return pwdw_pattern(bn, act)

    bn_text = " -> [batch_norm]" if bn else ""
    build.__doc__ = (f"conv2d(1x1) -> [+ b]{bn_text} -> {act} -> conv2d(groups=D) -> [+ b]{bn_text} -> {act}  "
                     f"==>  {name}(x, Wp', bp', Wd', bd')")
    made = rule(name, priority=priority(rule_name(bn, "<act>"), act), check=pwdw_checks)(build)
    made.source = __file__
    return made


#: above every conv rule (each would take one of the two convs) and the depthwise -> pointwise rules
RULES = [_make_rule(bn, act) for bn in (True, False) for act in ACTS]
