"""Pointwise (1x1) conv2d -> its epilogue -> depthwise conv2d -> its epilogue as one kernel, NCHW: the expand
half of an inverted residual block. Wp [C, D] (the 1x1 weights transposed: a reduction step reads D
contiguous weights), Wd [D, 1, K, K], both with their epilogues folded by the conv family's lowering:

    xpad[n, c, y, z]   = x[n, c, y - pt, z - pl], zero outside x          (absent without padding)
    expand[n, d, y, z] = sum_c xpad[n, c, y, z] * Wp[c, d]                (over the padded pixels)
    expand_act[n, d, y, z] = act1(expand + bp[d]) inside x's pixels, 0 on the padding   (x's dtype)
    conv[n, d, h, w]   = sum_{r, s} expand_act[n, d, h*sh + r, w*sw + s] * Wd[d, 0, r, s]
    out[n, d, h, w]    = act2(conv + bd[d])                               (the conv family's epilogue)

The expand output is computed over the depthwise conv's padded input and zeroed on its padding (the 1x1 of
a zero pixel is act1(bp), not the zero the depthwise conv pads with), so the depthwise conv reads it with
no `pad` stage of its own. `expand_rows` / `expand_cols`: the expand stages cover at least that many padded
rows / columns (a schedule's whole tiles; the extra ones are zero and never read: `expand_view`, the padded
input the depthwise conv reads, is the real ones). The stages are named for the schedules: `expand_pad`
(absent without padding or extra rows), `expand`, `expand_act`, `expand_view` (only with extra rows or
columns), then the conv family's `conv` and `epilogue` (`conv2d_padded`; its own `pad` stage only where its
`out_padding` reads past the padded input). Half x (float16, bfloat16) is widened before the
products; the expand output is rounded to x's dtype as the unfused graph rounds it, the output once.
"""

from __future__ import annotations

from typing import NamedTuple

from tvm_fusion._tvm import te, tirx
from tvm_fusion.precision import accumulator_dtype, cast_to
from tvm_fusion.registry import register_compute

from . import dims
from .activations import apply_activation
from .conv2d import ConvPadding, conv2d_padded

PWDW_FAMILY = "pointwise_depthwise"


class PwDwOperands(NamedTuple):
    """The kernel's operands by name, in its PrimFunc's order: x, then the folded constants (fuse.py's
    convention). `PwDwOperands.of(shapes)` names the shapes a schedule's `supports` gets."""

    x: object  # [N, C, H, W]
    wp: object  # [C, D]
    bp: object  # [D]
    wd: object  # [D, 1, K, K]
    bd: object  # [D]

    @classmethod
    def of(cls, operands) -> PwDwOperands:
        operands = list(operands)
        if len(operands) != 5:
            raise ValueError(f"a pointwise_depthwise kernel takes x, Wp, bp, Wd, bd; got {len(operands)} operands")
        return cls(*operands)


@register_compute(PWDW_FAMILY)
def pointwise_depthwise(x, wp, bp, wd, bd, *, strides, padding, pw_activation, pw_activation_params=None,
                        activation=None, activation_params=None, fast_math=True, target=None, **_):
    return pointwise_depthwise_padded(x, wp, bp, wd, bd, strides=strides, padding=padding,
                                      pw_activation=pw_activation, pw_activation_params=pw_activation_params,
                                      activation=activation, activation_params=activation_params,
                                      fast_math=fast_math, target=target)


def pointwise_depthwise_padded(x, wp, bp, wd, bd, *, strides, padding, pw_activation, pw_activation_params=None,
                               activation=None, activation_params=None, fast_math=True, target=None,
                               expand_rows: int = 0, expand_cols: int = 0, out_padding: ConvPadding | None = None):
    """The compute with the expand stages over at least `expand_rows` x `expand_cols` padded pixels and the
    depthwise conv over `out_padding` (`conv2d_padded`'s: a tile's whole rows and columns)."""
    n, c, h, w = dims(x.shape)
    d = int(wp.shape[1])
    pt, pl, pb, pr = (int(v) for v in padding)
    rows, cols = max(h + pt + pb, expand_rows), max(w + pl + pr, expand_cols)
    acc = accumulator_dtype(x.dtype)

    def inside(y, z):
        return tirx.all(y >= pt, y < h + pt, z >= pl, z < w + pl)

    xpad = x
    if (rows, cols) != (h, w):
        xpad = te.compute((n, c, rows, cols), lambda i, j, y, z: tirx.if_then_else(
            inside(y, z), x[i, j, y - pt, z - pl], tirx.const(0, x.dtype)), name="expand_pad")
    rc = te.reduce_axis((0, c), name="rc")
    expand = te.compute((n, d, rows, cols), lambda i, j, y, z: te.sum(
        cast_to(xpad[i, rc, y, z], acc) * cast_to(wp[rc, j], acc), axis=rc), name="expand")
    expand_act = te.compute((n, d, rows, cols), lambda i, j, y, z: tirx.if_then_else(
        inside(y, z), cast_to(apply_activation(expand[i, j, y, z] + cast_to(bp[j], acc), pw_activation,
                                               pw_activation_params, fast_math=fast_math, target=target), x.dtype),
        tirx.const(0, x.dtype)), name="expand_act")
    view = expand_act
    if (rows, cols) != (h + pt + pb, w + pl + pr):  # the depthwise conv's padded input, inlined by a schedule
        view = te.compute((n, d, h + pt + pb, w + pl + pr), lambda i, j, y, z: expand_act[i, j, y, z],
                          name="expand_view")
    return conv2d_padded(view, wd, bd, strides=strides, padding=(0, 0, 0, 0), dilation=(1, 1), groups=d,
                         activation=activation, activation_params=activation_params, fast_math=fast_math,
                         target=target, out_padding=out_padding)
