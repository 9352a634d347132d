"""Depthwise conv2d -> pointwise (1x1) conv2d as one kernel, NCHW; Wd [C*M, 1, K, K], Wp [O, C*M, 1, 1] viewed
as [O, C*M] (both with their epilogues folded by the conv family's lowering):

    pad[n, c, y, x]      = x padded for the depthwise conv (zeros)
    dw[n, d, h, w]       = sum_{r, s} pad[n, d // M, h*sh + r, w*sw + s] * Wd[d, 0, r, s]
    dw_act[n, d, h, w]   = act1(dw[n, d, h, w] + bd[d])                         (kept in float32)
    pw[n, o, h, w]       = sum_d dw_act[n, d, h, w] * Wp[o, d]
    out[n, o, h, w]      = act2(pw[n, o, h, w] + bp[o] (+ residual[n, o, h, w]))  (the conv family's epilogue)

The stages are named for the schedules: `pad` (absent without padding), `dw`, `dw_act`, `pw`, `epilogue`.
Half x (float16, bfloat16) is widened before the products; the intermediate stays in float32 (the conv
family's accumulator, `tvm_fusion.precision`) and the output is rounded once.
"""

from __future__ import annotations

from typing import NamedTuple

from tvm_fusion._tvm import te, tirx
from tvm_fusion.precision import accumulator_dtype, cast_to
from tvm_fusion.registry import register_compute

from . import dims
from .activations import apply_activation
from .conv2d import affine_epilogue, conv2d_out_size

DWPW_FAMILY = "depthwise_pointwise"


class DwPwOperands(NamedTuple):
    """The kernel's operands by name, in its PrimFunc's order: x, [residual], then the folded constants
    (fuse.py's convention). `DwPwOperands.of(shapes)` names the shapes a schedule's `supports` gets."""

    x: object  # [N, C, H, W]
    wd: object  # [C*M, 1, K, K]
    bd: object  # [C*M]
    wp: object  # [O, C*M]
    bp: object  # [O]
    residual: object = None

    @classmethod
    def of(cls, operands) -> "DwPwOperands":
        operands = list(operands)
        if len(operands) not in (5, 6):
            raise ValueError(f"a depthwise_pointwise kernel takes x, [residual], Wd, bd, Wp, bp; got {len(operands)}")
        x, *residual, wd, bd, wp, bp = operands
        return cls(x, wd, bd, wp, bp, residual[0] if residual else None)


def dw_out_size(shape, wd_shape, strides, padding) -> tuple[int, int]:
    """(rows, columns) of the depthwise output (the pointwise output's pixels)."""
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = wd_shape[2:], strides, padding
    return (conv2d_out_size(int(shape[2]), int(kh), sh, pt, pb, 1),
            conv2d_out_size(int(shape[3]), int(kw), sw, pl, pr, 1))


@register_compute(DWPW_FAMILY)
def depthwise_pointwise(x, wd, bd, wp, bp, residual=None, *, strides, padding, dw_activation,
                        dw_activation_params=None, activation=None, activation_params=None, fast_math=True,
                        target=None, **_):
    n, c, h, w = dims(x.shape)
    d, _, kh, kw = (int(v) for v in wd.shape)
    o, mult = int(wp.shape[0]), d // c
    (sh, sw), (pt, pl, pb, pr) = strides, padding
    hout, wout = dw_out_size(x.shape, wd.shape, strides, padding)
    acc = accumulator_dtype(x.dtype)
    pad = x
    if any(padding):
        pad = te.compute((n, c, h + pt + pb, w + pl + pr), lambda i, j, y, z: tirx.if_then_else(
            tirx.all(y >= pt, y < h + pt, z >= pl, z < w + pl), x[i, j, y - pt, z - pl], tirx.const(0, x.dtype)),
            name="pad")
    rh, rw = te.reduce_axis((0, kh), name="rh"), te.reduce_axis((0, kw), name="rw")
    dw = te.compute((n, d, hout, wout), lambda i, j, y, z: te.sum(
        cast_to(pad[i, j // mult, y * sh + rh, z * sw + rw], acc) * cast_to(wd[j, 0, rh, rw], acc), axis=[rh, rw]),
        name="dw")
    dw_act = te.compute((n, d, hout, wout), lambda i, j, y, z: apply_activation(
        dw[i, j, y, z] + cast_to(bd[j], acc), dw_activation, dw_activation_params, fast_math=fast_math,
        target=target), name="dw_act")
    rd = te.reduce_axis((0, d), name="rd")
    pw = te.compute((n, o, hout, wout), lambda i, q, y, z: te.sum(dw_act[i, rd, y, z] * cast_to(wp[q, rd], acc),
                                                                  axis=rd), name="pw")
    return affine_epilogue((n, o, hout, wout), lambda i, q, y, z: pw[i, q, y, z], bp, residual, x.dtype,
                           activation=activation, activation_params=activation_params,
                           residual_after_activation=False, fast_math=fast_math, target=target)
