"""conv2d with a folded affine epilogue, NCHW / OIHW:

    out[n, o, h, w] = act( sum_{c, r, s} pad(x)[n, g*C/G + c, h*sh + r*dh, w*sw + s*dw] * W'[o, c, r, s]
                           + b'[o] (+ residual[n, o, h, w]) )
    (or act(...) + residual[n, o, h, w] with residual_after_activation, YOLO's bottleneck)

Half tensors (float16, bfloat16) are widened to float32 before the products are summed; the epilogue runs in
float32 on a float32 bias and the output is rounded once (tvm_fusion.precision). Registered under the family
name; every conv rule without a compute of its own lowers to it. The stages are named for the schedules:
`pad`, `weight` (only when a target pads the output channels), `conv`, `epilogue`. `conv2d_padded` is the same compute over an output
padded to a target's tile (more output channels per group, rows and columns); the epilogue reads back
only the real outputs, so the result is unchanged. It also reads W packed at compile time into blocks of
output channels (`pack_channel_blocks`: Wp[o // B, c, r, s, o % B] = W[o, c, r, s], B the tile's channels,
each group's channels padded with zero weights; with `taps_first` Wp[o // B, r, s, c, o % B]), then it has no
`weight` stage.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tvm_fusion._tvm import te, tirx
from tvm_fusion.precision import accumulator_dtype, cast_to
from tvm_fusion.registry import register_compute

from . import dims
from .activations import apply_activation

CONV_FAMILY = "conv2d_affine"  # the compute every conv rule without a compute of its own lowers to


def pack_channel_blocks(w: np.ndarray, groups: int, group_channels: int, block: int,
                        taps_first: bool = False) -> np.ndarray:
    """W [O, C/G, KH, KW]  ==>  Wp [G * group_channels / block, C/G, KH, KW, block]: each group's output
    channels padded with zeros to `group_channels` (a multiple of `block`), then blocks of `block` channels
    innermost, so one tile's weights for a reduction step are one contiguous vector load. `taps_first`:
    Wp [..., KH, KW, C/G, block], the order of a reduction that runs the input channels innermost. Any number
    of taps (a conv3d's W [O, C/G, KD, KH, KW] likewise: [..., C/G, KD, KH, KW, block] or [..., KD, KH, KW, C/G,
    block])."""
    cout, cpg, *taps = w.shape
    opg = cout // groups
    padded = np.zeros((groups, group_channels, cpg, *taps), w.dtype)
    padded[:, :opg] = w.reshape(groups, opg, cpg, *taps)
    blocks = padded.reshape(groups * group_channels // block, block, cpg, *taps)
    tap_axes = tuple(range(3, 3 + len(taps)))
    order = (0, *tap_axes, 2, 1) if taps_first else (0, 2, *tap_axes, 1)
    return np.ascontiguousarray(blocks.transpose(order))


def packed_taps(w_shape, taps_first: bool = False) -> tuple[int, int, int]:
    """(C/G, KH, KW) of a W in OIHW or packed by `pack_channel_blocks` (5-D)."""
    dims_ = [int(d) for d in w_shape[1:4]]
    return (dims_[2], dims_[0], dims_[1]) if len(w_shape) == 5 and taps_first else tuple(dims_)


def conv2d_out_size(size, k, stride, pad_lo, pad_hi, dilation):
    return (size + pad_lo + pad_hi - dilation * (k - 1) - 1) // stride + 1


@dataclass(frozen=True)
class ConvPadding:
    """The padded output a schedule computes: per-group output channels, rows and columns (each at least
    the real size), and `channel_block`, the output channels one tile computes (a divisor of
    `group_channels`): the input-group index is written per block so a vectorized block reads one group."""
    group_channels: int
    rows: int
    cols: int
    channel_block: int = 1


@register_compute(CONV_FAMILY)
def conv2d_affine(x, w, b, residual=None, *, strides, padding, dilation, groups,
                  activation=None, activation_params=None, residual_after_activation=False, fast_math=True,
                  target=None, **_):
    return conv2d_padded(x, w, b, residual, strides=strides, padding=padding, dilation=dilation, groups=groups,
                         activation=activation, activation_params=activation_params,
                         residual_after_activation=residual_after_activation, fast_math=fast_math, target=target)


def conv2d_padded(x, w, b, residual=None, *, strides, padding, dilation, groups, activation=None,
                  activation_params=None, residual_after_activation=False, fast_math=True, target=None,
                  out_padding: ConvPadding | None = None, weight_first: bool = False, taps_first: bool = False,
                  flat: bool = False, in_place: bool = False):
    """`weight_first`: the products written W * x (an implicit GEMM whose A operand is W[O, C*kh*kw]: the
    CUDA tensor-core schedule's form); the same sums. `taps_first`: a packed W is in
    `pack_channel_blocks(..., taps_first=True)`'s layout. `flat` (a 1x1, stride-1, unpadded conv only): the
    pixels are one row, x read as [n, C, 1, H*W] and `out_padding` given for that one row, so a tile may
    span image rows; the input is copied (the `pad` stage, its padded pixels zero), or with `in_place` read
    where it is (the padded pixels read the last real one: their outputs are dropped), and the epilogue
    reads conv[n, o, 0, h*W + w]. A `flat` conv with a larger kernel or padding (`flat_taps`) keeps x and its
    padded copy as they are and computes conv[n, o, 0, p] over the output pixels p = h * wout + w as one row:
    pixel p reads pad[.., p // wout * sh + r, p % wout * sw + s] (the pixels `out_padding` adds past
    hout * wout read the last one's: their outputs are dropped)."""
    g = _geometry(x, w, b, strides=strides, padding=padding, dilation=dilation, groups=groups,
                  out_padding=out_padding, taps_first=taps_first, flat=flat)
    if flat and in_place and g.flat_taps:
        raise ValueError("conv2d: `in_place` reads the pixels of a flat 1x1 unpadded conv where they are; this "
                         f"one has a {g.kh}x{g.kw} kernel and padding {padding}")
    pad = None if flat and in_place else _pad_stage(x, g, flat)
    conv = _conv_stage(x, pad, _weight_reader(w, groups, g, taps_first), groups, g, weight_first)
    gp, opg = g.p.group_channels, g.opg

    def conv_value(i, o, h, ww):
        at = o if gp == opg or groups == 1 else o // opg * gp + o % opg  # the padded channel of real channel o
        return conv[i, at, 0, h * g.out_w + ww] if flat else conv[i, at, h, ww]

    return affine_epilogue((g.n, g.cout, g.out_h, g.out_w), conv_value, b, residual, x.dtype, activation=activation,
                           activation_params=activation_params,
                           residual_after_activation=residual_after_activation, fast_math=fast_math,
                           target=target)


@dataclass(frozen=True)
class _Geometry:
    """The sizes `conv2d_padded` computes with. `hin`, `win`: the input as read (1 x H*W for a flat 1x1 conv,
    `one_row`); `hout`, `wout`: the conv's output over it; `out_h`, `out_w`: the epilogue's (the image's for a
    flat 1x1 conv, else `hout`, `wout`); `hpad`, `wpad`: the padded input the padded output `p` reads."""
    n: object  # may be a symbolic batch
    cin: int
    hin: int
    win: int
    cout: int
    opg: int  # real output channels per group
    cpg: int
    kh: int
    kw: int
    strides: tuple
    padding: tuple
    dilation: tuple
    hout: int
    wout: int
    out_h: int
    out_w: int
    hpad: int
    wpad: int
    p: ConvPadding
    one_row: bool  # a flat 1x1 unpadded conv: x read as [n, C, 1, H*W]
    flat_taps: bool  # a flat conv with a larger kernel or padding: the output pixels as one row


def _geometry(x, w, b, *, strides, padding, dilation, groups, out_padding, taps_first, flat) -> _Geometry:
    n, cin, hin, win = dims(x.shape)
    cout = int(b.shape[0]) if len(w.shape) == 5 else int(w.shape[0])  # 5-D: channel blocks (pack_channel_blocks)
    cpg, kh, kw = packed_taps(w.shape, taps_first)
    flat_taps = flat and ((kh, kw) != (1, 1) or any(int(v) for v in padding))
    one_row = flat and not flat_taps
    out_h, out_w = None, None
    if one_row:  # a 1x1 unpadded conv: its pixels read as one row need stride 1
        if any(int(v) != 1 for v in strides):
            raise ValueError(f"conv2d: flat pixels of a 1x1 unpadded conv need stride 1 (got strides {strides}; "
                             "a strided one is subsampled first)")
        out_h, out_w, hin, win = hin, win, 1, hin * win
    sh, sw = strides
    pt, pl, pb, pr = padding
    dh, dw = dilation
    hout = conv2d_out_size(hin, kh, sh, pt, pb, dh)
    wout = conv2d_out_size(win, kw, sw, pl, pr, dw)
    p = out_padding or ConvPadding(cout // groups, hout, wout)
    # input rows / columns the padded output reads (the real ones, the padding, then zeros)
    hpad = max(hin + pt + pb, (p.rows - 1) * sh + (kh - 1) * dh + 1)
    wpad = max(win + pl + pr, (p.cols - 1) * sw + (kw - 1) * dw + 1)
    if flat_taps:  # the pixels past hout * wout read the last output pixel's inputs (their outputs dropped)
        hpad, wpad = hin + pt + pb, win + pl + pr
    if not one_row:
        out_h, out_w = hout, wout
    return _Geometry(n, cin, hin, win, cout, cout // groups, cpg, kh, kw, strides, padding, dilation, hout, wout,
                     out_h, out_w, hpad, wpad, p, one_row, flat_taps)


def _read_input(x, g: _Geometry):
    """x[i, c, h, w] as the conv reads it: [n, C, 1, H*W] for a flat 1x1 conv."""
    if g.one_row:
        return lambda i, c, h, ww: x[i, c, ww // g.out_w, ww % g.out_w]
    return lambda i, c, h, ww: x[i, c, h, ww]


def _pad_stage(x, g: _Geometry, flat: bool):
    """The `pad` stage: x with its padding (and the rows / columns the padded output reads past it) zero, or x
    itself where the padded output reads none (a `flat` conv's input is always copied)."""
    if (g.hpad, g.wpad) == (g.hin, g.win) and not flat:
        return x
    read = _read_input(x, g)
    pt, pl = g.padding[0], g.padding[1]
    return te.compute(
        (g.n, g.cin, g.hpad, g.wpad),
        lambda i, c, h, ww: tirx.if_then_else(
            tirx.all(h >= pt, h < g.hin + pt, ww >= pl, ww < g.win + pl),
            read(i, c, h - pt, ww - pl), tirx.const(0, x.dtype)),
        name="pad",
    )


def _weight_reader(w, groups: int, g: _Geometry, taps_first: bool):
    """W[o, c, r, s] over the padded output channels: read from a packed W, or from the `weight` stage (each
    group's channels padded with zero weights), or W itself."""
    gp = g.p.group_channels  # padded output channels per group
    if len(w.shape) == 5:  # channel blocks (pack_channel_blocks)
        wblk = int(w.shape[4])
        if (wblk, int(w.shape[0]) * wblk) != (g.p.channel_block, groups * gp):
            raise ValueError(f"conv2d: W packed in blocks of {wblk} channels ({tuple(w.shape)}) does not match "
                             f"the output tile: {groups} groups x {gp} channels in blocks of {g.p.channel_block}")
        if taps_first:
            return lambda o, c, r, s: w[o // wblk, r, s, c, o % wblk]
        return lambda o, c, r, s: w[o // wblk, c, r, s, o % wblk]
    if gp != g.opg:
        weight = te.compute(
            (groups * gp, g.cpg, g.kh, g.kw),
            lambda o, c, r, s: tirx.if_then_else(o % gp < g.opg, w[o // gp * g.opg + o % gp, c, r, s],
                                                 tirx.const(0, w.dtype)),
            name="weight",
        )
        return lambda o, c, r, s: weight[o, c, r, s]
    return lambda o, c, r, s: w[o, c, r, s]


def _input_channel(groups: int, g: _Geometry, rc):
    """The input channel output channel o reads at reduction step rc (its group's first channel + rc)."""
    gp, blk = g.p.group_channels, g.p.channel_block
    if groups == 1:
        return lambda o: rc
    if blk == 1:
        return lambda o: (o // gp) * g.cpg + rc
    return lambda o: (o // blk * blk) // gp * g.cpg + rc  # o // gp == (o // blk * blk) // gp: one per block


def _conv_stage(x, pad, weight_at, groups: int, g: _Geometry, weight_first: bool):
    """The `conv` stage over the padded output: sum_{c, r, s} x * W, each factor widened to the accumulator
    dtype (`weight_first`: written W * x); `pad` None: x read where it is (a flat in-place conv)."""
    rc = te.reduce_axis((0, g.cpg), name="rc")
    rh = te.reduce_axis((0, g.kh), name="rh")
    rw = te.reduce_axis((0, g.kw), name="rw")
    channel = _input_channel(groups, g, rc)
    read = _read_input(x, g)
    acc = accumulator_dtype(x.dtype)
    (sh, sw), (dh, dw), p = g.strides, g.dilation, g.p

    def product(i, o, h, ww):
        if g.flat_taps:  # ww: the output pixel h * wout + w
            pixel = tirx.min(ww, g.hout * g.wout - 1) if p.cols > g.hout * g.wout else ww
            h, ww = pixel // g.wout, pixel % g.wout
        at = (i, channel(o), h * sh + rh * dh, ww * sw + rw * dw)
        if pad is None:
            xv = cast_to(read(*at[:3], tirx.min(at[3], g.win - 1) if p.cols > g.win else at[3]), acc)
        else:
            xv = cast_to(pad[at], acc)
        wv = cast_to(weight_at(o, rc, rh, rw), acc)
        return wv * xv if weight_first else xv * wv

    return te.compute((g.n, groups * p.group_channels, p.rows, p.cols),
                      lambda i, o, h, ww: te.sum(product(i, o, h, ww), axis=[rc, rh, rw]), name="conv")


def affine_epilogue(shape, conv_value, b, residual, out_dtype, *, activation, activation_params,
                    residual_after_activation, fast_math, target=None):
    """The `epilogue` stage: out[i, o, h, w] = act(conv_value(i, o, h, w) + b[o] (+ residual)) (a conv3d's
    out[i, o, d, h, w] likewise), in the
    accumulator dtype, rounded once to `out_dtype`; `fast_math` and `target` as `apply_activation` takes them."""
    def value(i, o, *pixel):  # (h, w); a conv3d's (d, h, w)
        return affine_value(conv_value(i, o, *pixel), b[o], None if residual is None else residual[(i, o, *pixel)],
                            out_dtype, activation=activation, activation_params=activation_params,
                            residual_after_activation=residual_after_activation, fast_math=fast_math, target=target)

    if len(shape) == 5:
        return te.compute(shape, lambda i, o, d, h, ww: value(i, o, d, h, ww), name="epilogue")
    return te.compute(shape, lambda i, o, h, ww: value(i, o, h, ww), name="epilogue")


def affine_value(v, bias, residual, out_dtype, *, activation, activation_params, residual_after_activation,
                 fast_math, target=None):
    """One element of the conv family's epilogue: act(v + bias (+ residual)) (+ residual, after the activation
    where `residual_after_activation`: YOLO's bottleneck act(conv) + skip), in the accumulator dtype of
    `out_dtype`, rounded once to it; `residual` the element's residual value, or None."""
    acc = accumulator_dtype(out_dtype)
    v = v + cast_to(bias, acc)
    if residual is not None and not residual_after_activation:
        v = v + cast_to(residual, acc)
    v = apply_activation(v, activation, activation_params, fast_math=fast_math, target=target)
    if residual is not None and residual_after_activation:
        v = v + cast_to(residual, acc)
    return cast_to(v, out_dtype)


@dataclass(frozen=True)
class ConvOperands:
    """The conv kernel's operands by name. Its PrimFunc takes (x, [residual], W, b, out): the runtime inputs,
    then the folded constants (fuse.py's convention); a schedule's `supports` gets their shapes in that order."""

    x: object
    w: object
    b: object
    residual: object | None = None

    @classmethod
    def of(cls, operands) -> "ConvOperands":
        """From (x, [residual], W, b): a PrimFunc's params without its output, or the shapes `supports` gets."""
        operands = list(operands)
        if len(operands) not in (3, 4):
            raise ValueError(f"a conv kernel takes x, [residual], W, b; got {len(operands)} operands")
        x, *residual, w, b = operands
        return cls(x, w, b, residual[0] if residual else None)
