"""conv2d with the conv family's affine epilogue in the blocked channel layout NCHW[B]c, for a chain of convs
that pass their activations to each other in it (`fusion/chain_layout.py` decides where):

    out[n, ob, h, w, oi] = act( sum_{c, r, s} pad(x)[n, c, h*sh + r*dh, w*sw + s*dw] * W'[ob*B + oi, c, r, s]
                                + b'[ob*B + oi] (+ residual) )

B is the target's float32 vector lanes, so one output pixel's B channels are one vector register and one
cache line (AVX-512), stored whole and in the order they are computed; the next conv of the chain reads its
input channels B at a time from one line, a residual likewise. x is NCHW (the first conv of a chain: the
`pad` stage, or the reduction itself for an unpadded conv, reads it) or NCHW[B]c (rank 5); the residual too.
The output is NCHW[B]c, or NCHW with `out_blocked=False` (the chain's last conv: the blocked epilogue, then
the `unblock` stage). W is packed at compile time (`pack_blocked`) as Wp[o // (B*OB), r, c // K, s, c % K,
o // B % OB, o % B], K the schedule's reduction chunk (all of C where it does not chunk): one tile of OB
channel blocks reads one step's weights as OB contiguous vectors, and all its weights as one run in the
order it reads them. Groups 1, float32.
Stages, named for the schedule: `pad` (padded convs), `conv`, `epilogue`, `unblock`. A W packed by
`pack_winograd` (the llvm schedule's `pack`, where `conv2d_winograd.why_not` is None) takes the Winograd conv,
reading and writing the same layouts.

A depthwise conv of the chain (`depthwise_conv2d_affine_blocked`: groups = channels, one output channel per
input channel) reads and writes the same blocks: out[n, cb, h, w, ci] sums x[n, cb, h*sh + r*dh, w*sw + s*dw,
ci] * Wp[cb, r, s, ci] over the taps, each tap one multiply-add of whole vectors (W packed by
`pack_depthwise_blocked` as Wp[C / B, KH, KW, B]); the same stages and epilogue.
"""

from __future__ import annotations

import numpy as np

from tvm_fusion._tvm import te, tirx
from tvm_fusion.hardware import cpu_facts
from tvm_fusion.registry import register_compute
from tvm_fusion.schedules.llvm import conv2d_winograd as winograd

from . import dims
from .conv2d import affine_value, conv2d_out_size

BLOCKED_CONV = "conv2d_affine_blocked"
BLOCKED_DEPTHWISE = "depthwise_conv2d_affine_blocked"


def pack_blocked(w: np.ndarray, block: int, tile_blocks: int, chunk: int = 0) -> np.ndarray:
    """W [O, C, KH, KW]  ==>  Wp [O / (block * tile_blocks), KH, C / chunk, KW, chunk, tile_blocks, block]: a
    tile's weights in the order a chunked reduction reads them (per kernel row, per chunk of `chunk` input
    channels, 0: all of them), one contiguous run."""
    cout, cin, kh, kw = w.shape
    chunk = chunk or cin
    tiles = w.reshape(cout // (block * tile_blocks), tile_blocks, block, cin // chunk, chunk, kh, kw)
    return np.ascontiguousarray(tiles.transpose(0, 5, 3, 6, 4, 1, 2))


def pack_depthwise_blocked(w: np.ndarray, block: int) -> np.ndarray:
    """W [C, 1, KH, KW]  ==>  Wp [C / block, KH, KW, block]."""
    c, _, kh, kw = w.shape
    return np.ascontiguousarray(w.reshape(c // block, block, kh, kw).transpose(0, 2, 3, 1))


def to_blocked(a: np.ndarray, block: int) -> np.ndarray:
    """An NCHW array in NCHW[block]c."""
    n, c, h, w = a.shape
    return np.ascontiguousarray(a.reshape(n, c // block, block, h, w).transpose(0, 1, 3, 4, 2))


def from_blocked(a: np.ndarray) -> np.ndarray:
    """An NCHW[B]c array in NCHW."""
    n, cb, h, w, b = a.shape
    return a.transpose(0, 1, 4, 2, 3).reshape(n, cb * b, h, w)


def blocked_shape(shape, block: int) -> tuple:
    """(n, c, h, w) ==> (n, c / block, h, w, block)."""
    n, c, h, w = shape
    return (n, c // block, h, w, block)


def _reader(t, block: int):
    """t[n, c, h, w] of an NCHW or NCHW[B]c tensor (rank 4 or 5)."""
    if len(t.shape) == 5:
        return lambda n, c, h, w: t[n, c // block, h, w, c % block]
    return lambda n, c, h, w: t[n, c, h, w]


def _padded_reader(x, block: int, cin: int, hin: int, win: int, padding):
    """read(n, c, h, w) of x padded: through the `pad` stage (NCHW[B]c, whatever x's layout); an unpadded conv
    reads x itself."""
    read_x = _reader(x, block)
    if not any(padding):
        return read_x
    top, left, bottom, right = padding
    n = dims(x.shape)[0]

    def padded(i, cb, h, ww, ci):
        inside = tirx.all(h >= top, h < hin + top, ww >= left, ww < win + left)
        return tirx.if_then_else(inside, read_x(i, cb * block + ci, h - top, ww - left), tirx.const(0, x.dtype))

    pad = te.compute((n, cin // block, hin + top + bottom, win + left + right, block), padded, name="pad")
    return lambda i, c, h, ww: pad[i, c // block, h, ww, c % block]


def _epilogue(conv, b, residual, block: int, out_blocked: bool, *, activation, activation_params,
              residual_after_activation, fast_math, target):
    """The conv family's affine epilogue on the blocked sums, stored blocked (or NCHW: the `unblock` stage)."""
    n, cout_blocks, hout, wout, _ = conv.shape
    read_residual = None if residual is None else _reader(residual, block)

    def value(i, ob, h, ww, oi):
        o = ob * block + oi
        return affine_value(conv[i, ob, h, ww, oi], b[o], None if read_residual is None else read_residual(i, o, h, ww),
                            conv.dtype, activation=activation, activation_params=activation_params,
                            residual_after_activation=residual_after_activation, fast_math=fast_math, target=target)

    epilogue = te.compute(conv.shape, value, name="epilogue")
    if out_blocked:
        return epilogue
    return te.compute((n, cout_blocks * block, hout, wout),
                      lambda i, o, h, ww: epilogue[i, o // block, h, ww, o % block], name="unblock")


def _out_size(hin, win, kh, kw, strides, padding, dilation):
    top, left, bottom, right = padding
    return (conv2d_out_size(hin, kh, strides[0], top, bottom, dilation[0]),
            conv2d_out_size(win, kw, strides[1], left, right, dilation[1]))


@register_compute(BLOCKED_CONV, target="llvm")
def conv2d_blocked(x, w, b, residual=None, *, strides, padding, dilation, groups=1, out_blocked=True,
                   activation=None, activation_params=None, residual_after_activation=False, fast_math=True,
                   target=None, **_):
    if groups != 1:
        raise ValueError(f"the blocked conv takes groups 1, not {groups}")
    if winograd.is_packed(w, x):  # `pack` chose the Winograd conv: the same layouts in and out
        return winograd.conv2d_winograd(
            x, w, b, residual, out_block=cpu_facts(target).float32_lanes if out_blocked else 0,
            activation=activation, activation_params=activation_params,
            residual_after_activation=residual_after_activation, fast_math=fast_math, target=target)
    tiles, kh, chunks, kw, chunk, tile_blocks, block = (int(d) for d in w.shape)
    cin, blocks_per_chunk = chunks * chunk, chunk // block
    n, _, hin, win = dims(x.shape)[:4]  # NCHW and NCHW[B]c alike
    cout = tiles * tile_blocks * block
    sh, sw = strides
    dh, dw = dilation
    hout, wout = _out_size(hin, win, kh, kw, strides, padding, dilation)
    read = _padded_reader(x, block, cin, hin, win, padding)
    rco, rci = te.reduce_axis((0, cin // block), "rco"), te.reduce_axis((0, block), "rci")
    if (kh, kw) == (1, 1):  # no tap loops (unit loops would stay in the schedule's way)
        rh = rw = tirx.const(0, "int32")
        axes = [rco, rci]
    else:
        rh, rw = te.reduce_axis((0, kh), "rh"), te.reduce_axis((0, kw), "rw")
        axes = [rh, rw, rco, rci]
    conv = te.compute(
        (n, cout // block, hout, wout, block),
        lambda i, ob, h, ww, oi: te.sum(
            read(i, rco * block + rci, h * sh + rh * dh, ww * sw + rw * dw)
            * w[ob // tile_blocks, rh, rco // blocks_per_chunk, rw, rco % blocks_per_chunk * block + rci,
                ob % tile_blocks, oi], axis=axes),
        name="conv")
    return _epilogue(conv, b, residual, block, out_blocked, activation=activation,
                     activation_params=activation_params, residual_after_activation=residual_after_activation,
                     fast_math=fast_math, target=target)


@register_compute(BLOCKED_DEPTHWISE, target="llvm")
def depthwise_blocked(x, w, b, residual=None, *, strides, padding, dilation, groups, out_blocked=True,
                      activation=None, activation_params=None, residual_after_activation=False, fast_math=True,
                      target=None, **_):
    cblocks, kh, kw, block = (int(d) for d in w.shape)
    if groups != cblocks * block:
        raise ValueError(f"the blocked depthwise conv takes groups = channels ({cblocks * block}), not {groups}")
    n, _, hin, win = dims(x.shape)[:4]
    sh, sw = strides
    dh, dw = dilation
    hout, wout = _out_size(hin, win, kh, kw, strides, padding, dilation)
    read = _padded_reader(x, block, groups, hin, win, padding)
    rh, rw = te.reduce_axis((0, kh), "rh"), te.reduce_axis((0, kw), "rw")
    conv = te.compute(
        (n, cblocks, hout, wout, block),
        lambda i, cb, h, ww, ci: te.sum(read(i, cb * block + ci, h * sh + rh * dh, ww * sw + rw * dw)
                                        * w[cb, rh, rw, ci], axis=[rh, rw]),
        name="conv")
    return _epilogue(conv, b, residual, block, out_blocked, activation=activation,
                     activation_params=activation_params, residual_after_activation=residual_after_activation,
                     fast_math=fast_math, target=target)
