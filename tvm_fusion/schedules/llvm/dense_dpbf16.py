"""llvm dense on AVX512-BF16 dot products: bfloat16 x [M, K] and W [K, N] (`--precision bf16`), float32 sums,
on an x86 target with `avx512bf16` (`CpuFacts.avx512_bf16`; a dense AMX takes, 16 rows or more on an AMX
target, stays on its tiles: `dense_amx`). The conv's kernel (`conv2d_dpbf16.py`) says how the instruction
computes and how it is called.

    pack[m, k / 2] = x[m, k:k+2] as one uint32 (rows padded to the task's, K to 2, with zeros)
    dpbf16: parallel over (COLS output columns, ROWS rows of x, or all M where fewer):
        acc[rows x COLS / 16 vectors] = 0
        for each pair of K:  acc[r, v] += W[pair, 16 columns v] (`pack_dpbf16_dense`) . pack[r, pair] (broadcast)
        out[m, n] = act(acc + b[n]), rounded once, 16 columns a vector

W is packed at compile time [N' / COLS, K' / 2, COLS] as uint32 pairs of K (N' padded to COLS, K' to 2), so a
task streams its column tile front to back. Declines (the dense keeps its AVX-512 kernel): not bfloat16, a
symbolic number of rows, no `avx512bf16`.
"""

from __future__ import annotations

import numpy as np

from tvm_fusion._tvm import te, tirx
from tvm_fusion._tvm import tvmscript as T
from tvm_fusion.schedules.dense import dense_value
from tvm_fusion.schedules.llvm.blocks import ceil_to, loop_extent, optional_block
from tvm_fusion.schedules.llvm.conv2d_dpbf16 import DOT, DOT_BLOCK, DOT_LL, target_reason
from tvm_fusion.schedules.llvm.pair_planes import LANES, as_pairs, half_bits, pair_bits, vector

COLS = 4 * LANES  # output columns of a task: 4 vectors
ROWS = 6  # rows of x per task: 6 x 4 = 24 accumulators, 4 W vectors and a broadcast in the 32 zmm registers


def why_not(w_dtype, m, target) -> str | None:
    """Why the dense does not run on AVX512-BF16 dot products for `target` (None: it does)."""
    reason = target_reason(w_dtype, target)
    if reason:
        return reason
    if not isinstance(m, (int, tirx.IntImm)):
        return "the AVX512-BF16 dense plans its tasks for a static number of rows"
    return None


def is_packed(w) -> bool:
    """Whether a dense's W is `pack_dpbf16_dense`'s (uint32 pairs of K)."""
    return str(w.dtype) == "uint32"


def pack_dpbf16_dense(w: np.ndarray) -> np.ndarray:
    """W [K, N] (bfloat16) ==> [N' / COLS, K' / 2, COLS] uint32 (N' padded to COLS, K' to 2, with zeros):
    element (t, p, j) holds W[2p, COLS t + j] (low half) and W[2p + 1, COLS t + j]."""
    k, n = w.shape
    kp, np_ = ceil_to(k, 2), ceil_to(n, COLS)
    padded = np.zeros((kp, np_), w.dtype)
    padded[:k, :n] = w
    return as_pairs(padded.reshape(kp // 2, 2, np_ // COLS, COLS).transpose(2, 0, 3, 1))


def _weight_stage(w):
    """`pack_dpbf16_dense` as a stage (the compute called with W [K, N])."""
    k, n = (int(d) for d in w.shape)

    def packed(t, p, j):
        col = t * COLS + j

        def bits(r):
            return half_bits(w[tirx.min(r, k - 1), tirx.min(col, n - 1)], tirx.all(r < k, col < n))

        return pair_bits(bits, p)

    return te.compute((ceil_to(n, COLS) // COLS, -(-k // 2), COLS), packed, name="weight")


def dense_dpbf16(x, w, b, *, activation=None, activation_params=None, target=None):
    """The dense family's compute on AVX512-BF16 (stages `pack`, `dpbf16`; W packed by `pack_dpbf16_dense` or
    [K, N], then the `weight` stage packs it per call)."""
    m, k = (int(d) for d in x.shape)
    n = int(b.shape[0])
    if not is_packed(w):
        w = _weight_stage(w)
    nt, pairs = int(w.shape[0]), int(w.shape[1])
    tile_rows = min(ROWS, m)  # a GEMV's task is one row
    rows = ceil_to(m, tile_rows)

    def packed(i, p):
        def bits(c):
            return half_bits(x[tirx.min(i, m - 1), tirx.min(c, k - 1)], tirx.all(i < m, c < k))

        return pair_bits(bits, p)

    pack = te.compute((rows, pairs), packed, name="pack")
    out_dtype = str(x.dtype)

    def body(ins, outs):
        xb, wb, bb = ins

        def value(v, j):
            return dense_value(v, bb[j], out_dtype, activation, activation_params, fast_math=False, target=target)

        return _dot_body(xb, wb, outs[0], value, m=m, n=n, rows=rows, tile_rows=tile_rows, nt=nt, pairs=pairs)

    return te.extern([(m, n)], [pack, w, b], body, name=DOT_BLOCK, dtype=out_dtype)


def _dot_body(xb, wb, out, value, *, m, n, rows, tile_rows, nt, pairs):
    """The `dpbf16` stage's statement: a task's `tile_rows` x COLS accumulators in registers over all of K."""
    blocks = rows // tile_rows
    vectors = COLS // LANES
    lanes = vector

    @T.prim_func(private=True, check_well_formed=False, s_tir=True)
    def dots():
        with T.sblock("dpbf16_dots"):
            T.reads(xb[0:rows, 0:pairs], wb[0:nt, 0:pairs, 0:COLS])
            T.writes(out[0:m, 0:n])
            with T.attr(0, "pragma_import_llvm", DOT_LL):
                for task in T.parallel(nt * blocks):
                    acc = T.alloc_buffer((tile_rows, COLS), "float32", scope="local")
                    t = task // blocks
                    r0 = task % blocks * tile_rows
                    for r in T.unroll(tile_rows):
                        for v in T.unroll(vectors):
                            acc[r, lanes(v * LANES)] = T.Broadcast(T.float32(0), LANES)
                    for p in range(pairs):
                        for r in T.unroll(tile_rows):
                            for v in T.unroll(vectors):
                                acc[r, lanes(v * LANES)] = T.call_extern(
                                    "float32x16", DOT, acc[r, lanes(v * LANES)], wb[t, p, lanes(v * LANES)],
                                    T.Broadcast(xb[r0 + r, p], LANES))
                    for r in range(tile_rows):
                        if r0 + r < m:
                            for v in range(vectors):
                                if t * COLS + v * LANES + LANES <= n:
                                    for j in T.vectorized(LANES):
                                        out[r0 + r, t * COLS + v * LANES + j] = value(
                                            acc[r, v * LANES + j], t * COLS + v * LANES + j)
                                elif t * COLS + v * LANES < n:
                                    for j in range(LANES):
                                        if t * COLS + v * LANES + j < n:
                                            out[r0 + r, t * COLS + v * LANES + j] = value(
                                                acc[r, v * LANES + j], t * COLS + v * LANES + j)

    return dots.body


def schedule_dpbf16_dense(sch) -> str:
    """The `pack` stage (and a `weight` stage) as parallel loops; the `dpbf16` stage is its own loop nest.
    Returns the kernel's note."""
    pack = sch.get_sblock("pack")
    i, p = sch.get_loops(pack)
    sch.parallel(i)
    if loop_extent(sch, p) % LANES == 0:  # a vector of 16 pairs (a whole row of K as one vector: LLVM's
        sch.vectorize(sch.split(p, [None, LANES])[1])  # compile time grows with its width)
    weight = optional_block(sch, "weight")
    if weight is not None:
        t, p, j = sch.get_loops(weight)
        sch.parallel(sch.fuse(t, p))
        sch.vectorize(j)
    return "AVX512-BF16 dot products"
