"""CPU (llvm) Winograd F(2x2, 3x3) conv: `conv3x3(x, W) + epilogue  ==>  16 GEMMs over transformed tiles`.

A 3x3 stride-1 conv computes each 2x2 block of outputs from a 4x4 tile of its padded input d:

    Y = A^T [ (G g G^T) (.) (B^T d B) ] A        (.) element-wise over the 16 points, summed over the input channels

so per tile and output channel it takes 16 multiply-adds per input channel where the direct conv takes 36:
2.25x fewer. G g G^T (U) is computed once, at compile time (`pack_winograd`, float64 rounded once to float32),
B^T d B (V) per tile and input channel, and the sum over the input channels is, for each of the 16 points, a
GEMM of (tiles x input channels) by (input channels x output channels):

    pad[n, h, w, c]            = x padded by one pixel (and to whole tiles), channels-last
    parallel for (n, block of tile rows, block of output channels):
        V[e, tile, c]          = (B^T d B)[e] for the block's tiles          # `transform`, vectors of channels
        M[e, tile, k]          = sum_c V[e, tile, c] * U[e, c, k]            # `winograd_gemm`: register tiles of
                                                                            #  GEMM_ROWS tiles x 32 channels
        out[n, k, h, w]        = epilogue((A^T M A)[h % 2, w % 2] + b[k])   # vectors of output channels

B^T, G and A^T are the F(2, 3) matrices of Lavin & Gray ("Fast Algorithms for Convolutional Neural Networks",
2016): their entries are 0, +-1 and +-1/2, so the transforms are additions (the +-1/2 is in U). The sums
are not the direct conv's: against float64, 1.4e-6 to 4.7e-6 of the output's rms on the measured convs
(docs/cpu_conv_kernels.md), within float32's tolerance (the numerics tests judge it with the table).

Where (`why_not`): float32, groups 1, a 3x3 kernel, stride 1, dilation 1, padding 1 on every side (any batch, a
symbolic one planned as 1), input channels whole vectors and output channels whole GEMM tiles (32), on an ISA this
was measured on (`WINOGRAD_ISAS`: AVX-512). A conv of an NCHW[x]c chain (`fusion/chain_layout.py`) takes it in the
chain's layouts (x and the residual read NCHW or blocked, the output written blocked, whole vectors of a pixel's
channels, or NCHW: `schedules/conv2d_blocked.py`); a conv -> pool group runs its pool after it.

Measured on Zen 4 (AVX-512, one conv + ReLU, one thread, CPU time; `benchmarks/strided_convs.py SHAPES
--before winograd`): docs/cpu_conv_kernels.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tvm_fusion._tvm import te, tirx
from tvm_fusion.hardware import cpu_facts
from tvm_fusion.schedules import dims
from tvm_fusion.schedules.conv2d import affine_value

__all__ = ["GEMM_BLOCK", "WINOGRAD_ISAS", "WinogradPlan", "conv2d_winograd", "is_packed", "nchw_shape",
           "pack_winograd", "schedule_winograd", "why_not", "winograd_plan"]

GEMM_BLOCK = "winograd_gemm"
#: the vector ISAs whose targets take the Winograd conv (measured on AVX-512 only)
WINOGRAD_ISAS = ("avx512",)
#: output channels of a GEMM register tile: two vectors of 16 float32 lanes
TILE_CHANNELS = 32
#: tiles of a GEMM register tile: 2 x 14 = 28 accumulators of AVX-512's 32 vector registers (the direct
#: conv's 2 x 14 tile)
GEMM_ROWS = 14
POINTS = 16  # (2 + 3 - 1)^2 points of a transformed tile
#: F(2, 3)'s filter transform (Lavin & Gray): U = G g G^T
G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])


def why_not(x_shape, w_shape, w_dtype, strides, padding, dilation, groups: int, target) -> str | None:
    """Why a conv (x NCHW, W [O, C, KH, KW]) does not take the Winograd kernel on `target` (None: it does)."""
    facts = cpu_facts(target)
    if facts.isa not in WINOGRAD_ISAS:
        return f"the Winograd conv is measured and scheduled for {', '.join(WINOGRAD_ISAS)}, not {facts.isa}"
    if str(w_dtype) != "float32":
        return f"the Winograd conv takes float32, not {w_dtype}"
    if groups != 1:
        return f"the Winograd conv takes groups 1, not {groups}"
    if tuple(int(d) for d in w_shape[2:]) != (3, 3):
        return f"the Winograd conv takes a 3x3 kernel, not {'x'.join(str(int(d)) for d in w_shape[2:])}"
    if tuple(int(s) for s in strides) != (1, 1) or tuple(int(d) for d in dilation) != (1, 1):
        return "the Winograd conv takes stride 1 and dilation 1"
    if tuple(int(p) for p in padding) != (1, 1, 1, 1):
        return f"the Winograd conv takes padding 1 on every side, not {tuple(int(p) for p in padding)}"
    cin, cout = int(x_shape[1]), int(w_shape[0])
    if cin % facts.float32_lanes:
        return f"{cin} input channels are not whole vectors of {facts.float32_lanes}"
    if cout % TILE_CHANNELS:
        return f"{cout} output channels are not whole GEMM tiles of {TILE_CHANNELS}"
    return None


def nchw_shape(shape) -> tuple:
    """(n, c, h, w) of an NCHW or NCHW[B]c shape."""
    if len(shape) == 5:
        n, cb, h, w, block = shape
        return (n, int(cb) * int(block), h, w)
    return tuple(shape)


def is_packed(w, x) -> bool:
    """Whether a conv's W is `pack_winograd`'s U [O / 32, 16, C, 32] for input x, NCHW or NCHW[B]c (an OIHW 3x3
    W ends in 3)."""
    return (len(w.shape) == 4 and int(w.shape[1]) == POINTS and int(w.shape[3]) == TILE_CHANNELS
            and int(w.shape[2]) == int(nchw_shape(x.shape)[1]))


def _reader(t):
    """t[n, c, h, w] of an NCHW or NCHW[B]c tensor (rank 4 or 5)."""
    if len(t.shape) == 5:
        block = int(t.shape[4])
        return lambda n, c, h, w: t[n, c // block, h, w, c % block]
    return lambda n, c, h, w: t[n, c, h, w]


def pack_winograd(w: np.ndarray) -> np.ndarray:
    """W [O, C, 3, 3] ==> U [O / 32, 16, C, 32], U[t, 4a + b, c, o] = (G g G^T)[a, b] of g = W[32 t + o, c]: in
    float64, rounded once to W's dtype; one GEMM tile's 32 channels innermost, one point's C x 32 panel
    contiguous."""
    cout, cin = w.shape[:2]
    u = np.einsum("ai,kcij,bj->abck", G, w.astype(np.float64), G).reshape(POINTS, cin, cout)
    return np.ascontiguousarray(u.reshape(POINTS, cin, cout // TILE_CHANNELS, TILE_CHANNELS).transpose(2, 0, 1, 3)
                                ).astype(w.dtype)


@dataclass(frozen=True)
class WinogradPlan:
    """A task: `tile_rows` rows of 2x2 output tiles x `channels` output channels; the GEMM's register tiles
    are `gemm_rows` tiles x TILE_CHANNELS channels."""

    tile_rows: int
    gemm_rows: int
    channels: int
    tasks: int


def winograd_plan(n: int, hout: int, wout: int, cout: int, threads: int) -> WinogradPlan:
    """The fewest tile rows whose tiles fill a GEMM register tile (GEMM_ROWS), the register tile's rows the
    largest divisor of a task's tiles up to it; the output channels split in halves while the tasks number
    fewer than two per thread."""
    th, tw = -(-hout // 2), -(-wout // 2)
    rows = min(th, -(-GEMM_ROWS // tw))
    tiles = rows * tw
    gemm_rows = max(d for d in range(1, GEMM_ROWS + 1) if tiles % d == 0)
    row_tasks = n * -(-th // rows)
    channels = cout
    while row_tasks * (cout // channels) < 2 * threads and channels % (2 * TILE_CHANNELS) == 0:
        channels //= 2
    return WinogradPlan(rows, gemm_rows, channels, row_tasks * (cout // channels))


def _bt(a, d):
    """Row a of B^T d for F(2, 3): d(i) the tile's element i along the transformed axis."""
    s = tirx.Select
    return s(a == 0, d(0) - d(2), s(a == 1, d(1) + d(2), s(a == 2, d(2) - d(1), d(1) - d(3))))


def _at(i, m):
    """Row i of A^T m for F(2, 3): m(a) the point a along the transformed axis."""
    return tirx.Select(i == 0, m(0) + m(1) + m(2), m(1) - m(2) - m(3))


def conv2d_winograd(x, u, b, residual=None, *, out_block: int = 0, activation=None, activation_params=None,
                    residual_after_activation=False, fast_math=True, target=None):
    """The conv family's compute as Winograd F(2x2, 3x3) (stages `pad`, `transform`, GEMM_BLOCK, `epilogue`);
    U packed by `pack_winograd`, the conv 3x3 / stride 1 / padding 1 (`why_not`). x and the residual NCHW or
    NCHW[B]c (a conv chain's, `schedules/conv2d_blocked.py`); the output NCHW, or NCHW[out_block]c."""
    n, cin, hin, win = (int(d) if isinstance(d, (int, tirx.IntImm)) else d for d in nchw_shape(dims(x.shape)))
    cout = int(u.shape[0]) * TILE_CHANNELS
    th, tw = -(-hin // 2), -(-win // 2)
    zero = tirx.const(0, x.dtype)
    read_x = _reader(x)
    pad = te.compute((n, 2 * th + 2, 2 * tw + 2, cin), lambda i, h, w, c: tirx.if_then_else(
        tirx.all(h >= 1, h <= hin, w >= 1, w <= win), read_x(i, c, h - 1, w - 1), zero), name="pad")
    v = te.compute((n, 4, 4, th * tw, cin), lambda i, a, e, p, c: _bt(a, lambda r: _bt(
        e, lambda s: pad[i, 2 * (p // tw) + r, 2 * (p % tw) + s, c])), name="transform")
    rc = te.reduce_axis((0, cin), "rc")
    m = te.compute((n, 4, 4, th * tw, cout), lambda i, a, e, p, k: te.sum(
        v[i, a, e, p, rc] * u[k // TILE_CHANNELS, 4 * a + e, rc, k % TILE_CHANNELS], axis=rc), name=GEMM_BLOCK)
    read_residual = None if residual is None else _reader(residual)

    def value(i, k, h, w):
        p = h // 2 * tw + w // 2
        y = _at(h % 2, lambda a: _at(w % 2, lambda e: m[i, a, e, p, k]))
        return affine_value(y, b[k], None if read_residual is None else read_residual(i, k, h, w), x.dtype,
                            activation=activation, activation_params=activation_params,
                            residual_after_activation=residual_after_activation, fast_math=fast_math, target=target)

    if out_block:
        return te.compute((n, cout // out_block, hin, win, out_block),
                          lambda i, ob, h, w, oi: value(i, ob * out_block + oi, h, w), name="epilogue")
    return te.compute((n, cout, hin, win), value, name="epilogue")


def schedule_winograd(sch, target) -> str:
    """Tasks of (image, tile rows, output channels) in parallel (`winograd_plan`); per task its tiles'
    transform (vectors of input channels, the 16 points unrolled), the GEMM in register tiles, the epilogue
    (vectors of output channels, each 2x2 block unrolled); the padded input copied channels-last first, one
    image row per parallel iteration. Returns the kernel's note."""
    facts = cpu_facts(target)
    lanes = facts.float32_lanes
    epi, gemm = sch.get_sblock("epilogue"), sch.get_sblock(GEMM_BLOCK)
    transform, pad = sch.get_sblock("transform"), sch.get_sblock("pad")
    n, o, h, w, *blocked = sch.get_loops(epi)  # NCHW, or NCHW[B]c: o the channel blocks, `blocked` [B]
    block = int(sch.get(blocked[0]).extent) if blocked else 1
    batch, *extent = (sch.get(loop).extent for loop in (n, o, h, w))
    # a symbolic batch is planned as 1 (as the direct kernel plans it: the same packed W for any batch)
    batch = int(batch) if isinstance(batch, (int, tirx.IntImm)) else 1
    extent = [int(e) for e in extent]
    plan = winograd_plan(batch, *extent[1:], extent[0] * block, facts.threads)
    ho, hi = sch.split(h, [None, 2 * plan.tile_rows])
    oo, oi = sch.split(o, [None, plan.channels // block])
    hio, hii = sch.split(hi, [None, 2])
    wo, wi = sch.split(w, [None, 2])
    if blocked:  # whole vectors of a pixel's channels, stored whole
        oio, oii = oi, blocked[0]
    else:
        oio, oii = sch.split(oi, [None, lanes])
    sch.reorder(n, ho, oo, hio, wo, oio, hii, wi, oii)
    task = sch.fuse(n, ho, oo)
    sch.parallel(task)
    sch.unroll(hii)
    sch.unroll(wi)
    sch.vectorize(oii)
    # the GEMM's register tile: its sums in a local buffer, copied to M per tile
    store = sch.cache_write(gemm, 0, "local")
    sch.compute_at(store, task)
    point_a, point_e, p, k = sch.get_loops(store)[-4:]
    po, pi = sch.split(p, [None, plan.gemm_rows])
    ko, ki = sch.split(k, [None, TILE_CHANNELS])
    sch.reorder(point_a, point_e, ko, po, pi, ki)
    sch.compute_at(gemm, po)
    rows, channels, rc = sch.get_loops(gemm)[-3:]
    vectors, lane = sch.split(channels, [None, lanes])
    sch.reorder(rc, rows, vectors, lane)
    sch.unroll(rows)
    sch.unroll(vectors)
    sch.vectorize(lane)
    sch.decompose_reduction(gemm, rc)
    sch.vectorize(sch.split(ki, [None, lanes])[1])
    # the transform of the task's tiles, after the GEMM's consumer is in place
    sch.compute_at(transform, task)
    point_a, point_e, p, c = sch.get_loops(transform)[-4:]
    co, ci = sch.split(c, [None, lanes])
    sch.reorder(p, co, point_a, point_e, ci)
    sch.unroll(point_a)
    sch.unroll(point_e)
    sch.vectorize(ci)
    pn, ph, pw, pc = sch.get_loops(pad)
    co, ci = sch.split(pc, [None, lanes])
    sch.reorder(pn, ph, co, pw, ci)
    sch.parallel(sch.fuse(pn, ph))
    sch.vectorize(ci)
    return (f"Winograd F(2x2, 3x3): {plan.tasks} tasks of {plan.tile_rows} tile rows x {plan.channels} channels, "
            f"GEMM tiles of {plan.gemm_rows} x {TILE_CHANNELS}")
