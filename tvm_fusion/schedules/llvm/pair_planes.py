"""What the bfloat16 dot-product convs share (AMX tiles: `conv2d_amx`; AVX512-BF16: `conv2d_dpbf16`): x copied
into phase planes of channel pairs (`pack`), the parallel tasks, the epilogue from a task's float32 sums, and
the schedule of the copy.

    pack[n, phase, c / 2, row, col] = x[n, c:c+2, row * sh + a - top, col * sw + b - left]   (0 outside)
        phase (a, b) of the stride: a tap (r, s) reads phase (r*dh % sh, s*dw % sw) at the output pixel's
        (row, col) + (r*dh // sh, s*dw // sw), so a tap's pixels are one run of the phase plane (`Planes.tap`);
        each pixel holds a pair of channels as one uint32 of their bfloat16 bits, the pair both instructions
        multiply (a vector of pixels is two loads of x's rows; TVM legalizes a bfloat16 buffer it allocates into
        another, which the kernels' addresses would not follow)

A task computes (image, 32 output channels, rows of the output): blocks of pixels q = row * P + col over the
plane's width P (P - wout columns are computed and dropped: 2 of 58 for a 3x3 conv on 56x56) into its float32
`sums` [32, pixels], then the epilogue writes out[n, o, h, w] = act(sum + b[o] (+ residual)), rounded once.
A conv of fewer than 32 input channels with a wider kernel may fold (`fold`): the pack holds a kernel row's
columns x channels per output pixel and the taps loop over the kernel's rows only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tvm_fusion._tvm import te, tirx
from tvm_fusion._tvm import tvmscript as T
from tvm_fusion.schedules.conv2d import affine_value, conv2d_out_size
from tvm_fusion.schedules.llvm.blocks import optional_block

TASK_CHANNELS = 32  # output channels of one task
LANES = 16  # float32 lanes of the epilogue's vectors (and of an AVX-512 register)


@dataclass(frozen=True)
class Planes:
    """The geometry of `pack`: `phases` (`na` row x `nb` column phases of the stride) planes of `plane_h` x
    `plane_w` pixels per channel pair; `taps_w` kernel columns are taps (1 where folded)."""
    hout: int
    wout: int
    na: int
    nb: int
    plane_w: int
    plane_h: int
    taps_w: int

    @property
    def phases(self) -> int:
        return self.na * self.nb

    def tap(self, t, strides, dilation):
        """(phase, offset of its run from the output pixel's q) of tap t = r * taps_w + s."""
        (sh, sw), (dh, dw), kw = strides, dilation, self.taps_w
        return (t // kw * dh % sh * self.nb + t % kw * dw % sw,
                t // kw * dh // sh * self.plane_w + t % kw * dw // sw)


def planes(x_shape, kh: int, kw: int, strides, padding, dilation, fold: bool, over: int) -> Planes:
    """`Planes` of a conv's pack, rows enough that a block of pixels may read `over` pixels past the last
    output pixel's run."""
    _, _, hin, win = (int(d) for d in x_shape)
    (sh, sw), (dh, dw), (top, left, bottom, right) = strides, dilation, padding
    hout = conv2d_out_size(hin, kh, sh, top, bottom, dh)
    wout = conv2d_out_size(win, kw, sw, left, right, dw)
    na = max(r * dh % sh for r in range(kh)) + 1  # row phases 0.. the last one a tap reads
    nb = 1 if fold else max(s * dw % sw for s in range(kw)) + 1  # column phases
    # a folded pack's planes are the output's columns (each pixel holds its kernel row's columns)
    plane_w = wout if fold else -(-(win + left + right) // sw)
    taps_w = 1 if fold else kw
    reach = max((r * dh // sh) * plane_w + s * dw // sw for r in range(kh) for s in range(taps_w))
    plane_h = -(-(hout * plane_w + over + reach) // plane_w)
    return Planes(hout, wout, na, nb, plane_w, plane_h, taps_w)


def half_bits(read, inside):
    """A bfloat16 value's bits as uint32 (the low half), 0 where not `inside`."""
    return tirx.if_then_else(inside, tirx.reinterpret("uint16", read).astype("uint32"), tirx.const(0, "uint32"))


def pair_bits(bits, k2):
    """Pair k2 as one uint32: `bits(2 k2)` in the low half, `bits(2 k2 + 1)` in the high half (`half_bits` of
    each), the order both instructions read a pair in."""
    return bits(k2 * 2) | (bits(k2 * 2 + 1) << tirx.const(16, "uint32"))


def as_pairs(a: np.ndarray) -> np.ndarray:
    """A bfloat16 array whose last axis holds pairs (size 2) as uint32, the first of each pair the low half."""
    return np.ascontiguousarray(a).view(np.uint16).view(np.uint32)[..., 0]


def vector(start):
    """The LANES consecutive indices from `start` (a ramp: one vector load or store)."""
    return T.ramp(start, 1, LANES)


def pack_stage(x, geo: Planes, pairs: int, kw: int, strides, padding, dilation, fold: bool):
    """The `pack` stage: x [N, C, H, W] (bfloat16) as `pairs` channel pairs (zeros past C), uint32."""
    n, cin, hin, win = (int(d) for d in x.shape)
    (sh, sw), (_, dw), (top, left, _, _) = strides, dilation, padding
    nb = geo.nb

    def packed(i, ph, k2, row, col):
        hh = row * sh + ph // nb - top

        def bits(k):  # product k's bfloat16 bits (channel k, or column k // C and channel k % C), 0 outside
            c, s = (k % cin, k // cin) if fold else (k, 0)
            ww = col * sw + (s * dw if fold else ph % nb) - left
            inside = tirx.all(hh >= 0, hh < hin, ww >= 0, ww < win)
            if fold or cin % 2:
                inside = tirx.all(inside, k < (cin * kw if fold else cin))
            # the row clamped into x (the vector of columns reads one row; `inside` drops what is outside)
            return half_bits(x[i, tirx.min(c, cin - 1), tirx.max(tirx.min(hh, hin - 1), 0),
                               tirx.max(tirx.min(ww, win - 1), 0) if fold else ww], inside)

        return pair_bits(bits, k2)

    return te.compute((n, geo.phases, pairs, geo.plane_h, geo.plane_w), packed, name="pack")


class Tasks:
    """The parallel tasks: (image, block of TASK_CHANNELS output channels, `rows` output rows), at least two
    per thread where the rows can be split, and rows few enough that a task's float32 sums (32 channels x its
    pixels) fit in a quarter of L2, where its epilogue reads them back; `blocks` of `block` pixels cover a
    task's rows (`pixels` of sums)."""

    def __init__(self, n: int, channel_blocks: int, hout: int, plane_w: int, threads: int, l2_bytes: int,
                 block: int):
        most_rows = max(1, l2_bytes // 4 // (TASK_CHANNELS * plane_w * 4))
        parts = min(hout, max(1, -(-2 * threads // (n * channel_blocks)), -(-hout // most_rows)))
        self.n, self.channel_blocks, self.block = n, channel_blocks, block
        self.rows = -(-hout // parts)
        self.parts = -(-hout // self.rows)
        self.count = n * channel_blocks * self.parts
        self.blocks = -(-(self.rows * plane_w) // block)
        self.pixels = self.blocks * block

    def of(self, task):
        """(image, channel block, first row) of a task number."""
        return (task // (self.channel_blocks * self.parts), task // self.parts % self.channel_blocks,
                task % self.parts * self.rows)


def kernel_stage(name: str, pack, w, b, residual, out_shape, out_dtype, epilogue: dict, loop_nest):
    """The kernel's own stage: `te.extern` over (pack, W, b[, residual]) into `out_shape` of `out_dtype`, its
    statement `loop_nest(pack buffer, W buffer, out buffer, value)`, with `value(sum, n, o, h, w)` the conv
    family's epilogue of one element (`affine_value`; `epilogue`: activation, activation_params,
    residual_after_activation, target)."""
    inputs = [pack, w, b] + ([residual] if residual is not None else [])

    def body(ins, outs):
        bb, rb = ins[2], ins[3] if residual is not None else None

        def value(v, i, o, h, ww):
            return affine_value(v, bb[o], None if rb is None else rb[i, o, h, ww], out_dtype, fast_math=False,
                                **epilogue)

        return loop_nest(ins[0], ins[1], outs[0], value)

    return te.extern([out_shape], inputs, body, name=name, dtype=str(out_dtype))


def epilogue_macro(out, value, cout: int, geo: Planes):
    """TVMScript macro `epilogue(sums, i, o0, h0, rows)`: the task's output rows from its sums [32, pixels],
    a row of the output per vector; `value(sum, n, o, h, w)` the conv family's epilogue of one element."""
    hout, wout, plane_w = geo.hout, geo.wout, geo.plane_w
    whole, rest = wout // LANES * LANES, wout % LANES

    @T.macro
    def epilogue(sums, i, o0, h0, rows):
        for oo in range(TASK_CHANNELS):
            if o0 + oo < cout:
                for hh in range(rows):
                    if h0 + hh < hout:
                        for wo in range(whole // LANES):
                            for wi in T.vectorized(LANES):
                                out[i, o0 + oo, h0 + hh, wo * LANES + wi] = value(
                                    sums[oo, hh * plane_w + wo * LANES + wi], i, o0 + oo, h0 + hh, wo * LANES + wi)
                        if rest > 0:
                            for wi in T.vectorized(rest):
                                out[i, o0 + oo, h0 + hh, whole + wi] = value(
                                    sums[oo, hh * plane_w + whole + wi], i, o0 + oo, h0 + hh, whole + wi)

    return epilogue


def schedule_pack(sch) -> None:
    """The `pack` stage (and a `weight` stage, W packed per call) as parallel loops, a plane row per vector;
    the kernel's own stage is its own loop nest."""
    pack = sch.get_sblock("pack")
    n, ph, k2, row, col = sch.get_loops(pack)
    sch.parallel(sch.fuse(n, ph, k2))
    sch.vectorize(col)
    weight = optional_block(sch, "weight")
    if weight is not None:
        loops = sch.get_loops(weight)
        sch.parallel(sch.fuse(*loops[:-2]))
        sch.vectorize(loops[-1])
