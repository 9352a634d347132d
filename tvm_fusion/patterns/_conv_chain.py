"""Two conv family members chained into one cross-layer rule (`depthwise_pointwise.py`,
`pointwise_depthwise.py`): the halves' annotations under their prefixes, their own checks run on their views
(`Match.prefixed`), and the checks on the shape of each half that the fused kernel needs."""

from __future__ import annotations

from tvm_fusion.rules import Decline, Match, Spec, batch_shape, decline, not_this_family, static_shape

__all__ = ["annotations", "conv2d_half", "depthwise_reason", "halves_check", "pointwise_reason"]


def annotations(first: tuple[str, Spec], second: tuple[str, Spec]) -> dict:
    """The two halves' annotations, each under its prefix (`("dw", spec)` -> `dw_conv`, ...), rooted at the
    second half's pattern."""
    ann = {f"{prefix}_{k}": v for prefix, spec in (first, second) for k, v in spec.annotations.items()}
    ann["root"] = second[1].pattern
    return ann


def halves_check(*halves: tuple[str, Spec]):
    """A check that runs each half's own check on its view of the match; the first decline wins."""

    def check(m: Match):
        for prefix, spec in halves:
            got = spec.check(m.prefixed(f"{prefix}_")) if spec.check else None
            if isinstance(got, Decline):
                return got
        return None

    return check


def conv2d_half(m: Match, half: str):
    """(the conv2d call, its attrs, W's shape) or a Decline for a conv1d / conv3d (another family's chain)."""
    conv = m.value(f"{half}_conv")
    op = conv.op.name.rsplit(".", 1)[-1]
    if op != "conv2d":
        return not_this_family(f"the {half} conv is a {op}; this kernel takes conv2d")
    return conv, conv.attrs, static_shape(conv.args[1])


def pointwise_reason(m: Match, half: str, which: str) -> Decline | None:
    """Why the `half` conv (the `which` of the two: "first" / "second") is no 1x1, stride-1, unpadded dense
    conv: a near miss for a 1x1 that is not, another family's chain for a spatial conv."""
    got = conv2d_half(m, half)
    if isinstance(got, Decline):
        return got
    _, attrs, w = got
    shape = (w[2:], int(attrs.groups), [int(v) for v in attrs.strides], [int(v) for v in attrs.padding],
             [int(v) for v in attrs.dilation])
    if shape != ((1, 1), 1, [1, 1], [0, 0, 0, 0], [1, 1]):
        return (decline if shape[0] == (1, 1) else not_this_family)(
            f"the {which} conv has kernel {w[2]}x{w[3]}, groups {shape[1]}, strides {shape[2]}, padding "
            f"{shape[3]}, dilation {shape[4]}; a pointwise conv is 1x1, groups 1, stride 1, no padding")
    return None


def depthwise_reason(m: Match, half: str, which: str, kernels, strides, multiplier_one: bool = False
                     ) -> Decline | None:
    """Why the `half` conv is no depthwise conv the kernel takes (groups == input channels, `kernels`,
    `strides`, no dilation; `multiplier_one`: as many output channels as input ones). A plain conv (groups 1)
    is another family's chain, no near miss."""
    got = conv2d_half(m, half)
    if isinstance(got, Decline):
        return got
    conv, attrs, (d, cpg, kh, kw) = got
    channels = batch_shape(conv.args[0])[1]  # conv_checks: known but for a symbolic batch
    groups, conv_strides = int(attrs.groups), tuple(int(v) for v in attrs.strides)
    if groups != channels or cpg != 1 or groups == 1 or (multiplier_one and d != channels):
        want = ("a depthwise conv of multiplier 1 has groups == input channels == output channels > 1"
                if multiplier_one else "a depthwise conv has groups == input channels > 1")
        return (not_this_family if groups == 1 else decline)(
            f"the {which} conv has groups {groups} over {channels} input channels (W {[d, cpg, kh, kw]}); {want}")
    if (kh, kw) not in kernels or any(s not in strides for s in conv_strides):
        return decline(f"the depthwise conv has a {kh}x{kw} kernel, strides {conv_strides}; the kernel takes "
                       f"{' or '.join(f'{a}x{b}' for a, b in kernels)}, strides {' or '.join(map(str, strides))}")
    if any(int(v) != 1 for v in attrs.dilation):
        return decline(f"the depthwise conv has dilation {[int(v) for v in attrs.dilation]}; expected 1")
    return None
