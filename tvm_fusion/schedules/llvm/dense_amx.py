"""llvm dense on AMX tiles: bfloat16 x [M, K] and W [K, N] (`--precision bf16`), float32 sums, on an x86
target with `amx-tile` and `amx-bf16` (the conv's kernel, `conv2d_amx.py`, says how the tiles compute).

    pack[m, k] = x[m, k] (bfloat16 bits as uint16; rows padded to 32, columns to 32 with zeros)
    amx: parallel over (32 rows of x, up to `PAIRS_PER_TASK` pairs of 16 output columns):
        for each pair of column tiles:
            C[2 x 2 tiles] = 0
            for 32 of K:  C[i, j] += pack tile i (16 rows x 32) . W tile j (`pack_amx_dense`: 16 pairs of K x 16
                          columns, 1 KiB contiguous)
            the 4 tiles stored to the task's sums; out[m, n] = act(sum + b[n]), rounded once, 16 columns a vector

The rows of x are the tiles' rows, so the sums come out in the output's own layout. Declines (the dense keeps
its AVX-512 kernel): not bfloat16, fewer than `MIN_ROWS` rows (batch-1 classifiers: a GEMV, memory-bound,
its tiles one row full), a symbolic number of rows, no AMX, not x86-64 Linux.
"""

from __future__ import annotations

import numpy as np

from tvm_fusion._tvm import te, tirx
from tvm_fusion._tvm import tvmscript as T
from tvm_fusion.schedules.dense import dense_value
from tvm_fusion.schedules.llvm.blocks import ceil_to, optional_block
from tvm_fusion.schedules.llvm.conv2d_amx import AMX_BLOCK, TILE_K, TILE_ROWS, tile_op, target_reason, tile_macros

MIN_ROWS = TILE_ROWS  # rows of x below which the tiles would be mostly padding
PAIRS_PER_TASK = 8  # column-tile pairs of one task: 256 output columns


def why_not(w_dtype, m, target) -> str | None:
    """Why the dense does not run on AMX tiles for `target` (None: it does)."""
    reason = target_reason(w_dtype, target)
    if reason:
        return reason
    if not isinstance(m, (int, tirx.IntImm)):
        return "the AMX dense plans its tasks for a static number of rows"
    if int(m) < MIN_ROWS:
        return f"{int(m)} rows of x would fill {int(m)} of a tile's {TILE_ROWS} rows (a memory-bound GEMV)"
    return None


def pack_amx_dense(w: np.ndarray) -> np.ndarray:
    """W [K, N] ==> Wb [N' / 16, K' / 32, 16, 16, 2] (N', K': padded to 32 with zeros): Wb[t, c, r, j, e] =
    W[32c + 2r + e, 16t + j], one tile of 16 pairs of K x 16 columns per (column tile, chunk of K)."""
    k, n = w.shape
    kp, np_ = ceil_to(k, TILE_K), ceil_to(n, 2 * TILE_ROWS)
    padded = np.zeros((kp, np_), w.dtype)
    padded[:k, :n] = w
    tiles = padded.reshape(kp // TILE_K, TILE_ROWS, 2, np_ // TILE_ROWS, TILE_ROWS)
    return np.ascontiguousarray(tiles.transpose(3, 0, 1, 4, 2))


def dense_amx(x, w, b, *, activation=None, activation_params=None, target=None):
    """The dense family's compute on AMX tiles (stages `pack`, `amx`; W packed by `pack_amx_dense` or [K, N],
    then the `weight` stage packs it per call)."""
    m, k = (int(d) for d in x.shape)
    n = int(b.shape[0])
    if len(w.shape) != 5:
        w = _weight_stage(w)
    nt, kc = int(w.shape[0]), int(w.shape[1])
    rows = ceil_to(m, 2 * TILE_ROWS)

    def packed(i, j):
        inside = tirx.all(i < m, j < k)
        return tirx.if_then_else(inside, tirx.reinterpret("uint16", x[tirx.min(i, m - 1), tirx.min(j, k - 1)]),
                                 tirx.const(0, "uint16"))

    pack = te.compute((rows, kc * TILE_K), packed, name="pack")
    out_dtype = str(x.dtype)

    def body(ins, outs):
        xb, wb, bb = ins

        def value(v, j):
            return dense_value(v, bb[j], out_dtype, activation, activation_params, fast_math=False, target=target)

        return _amx_body(xb, wb, outs[0], value, m=m, n=n, rows=rows, nt=nt, kc=kc)

    return te.extern([(m, n)], [pack, w, b], body, name=AMX_BLOCK, dtype=out_dtype)


def _weight_stage(w):
    """`pack_amx_dense` as a stage (a W left unpacked), bfloat16 bits as uint16."""
    k, n = (int(d) for d in w.shape)
    nt, kc = ceil_to(n, 2 * TILE_ROWS) // TILE_ROWS, ceil_to(k, TILE_K) // TILE_K

    def packed(t, c, r, j, e):
        kk, nn = c * TILE_K + 2 * r + e, t * TILE_ROWS + j
        return tirx.if_then_else(tirx.all(kk < k, nn < n),
                                 tirx.reinterpret("uint16", w[tirx.min(kk, k - 1), tirx.min(nn, n - 1)]),
                                 tirx.const(0, "uint16"))

    return te.compute((nt, kc, TILE_ROWS, TILE_ROWS, 2), packed, name="weight")


def _amx_body(xb, wb, out, value, *, m, n, rows, nt, kc):
    """The `amx` stage's statement: tiles 0-3 sum (2 pack tiles) x (2 W tiles), 4-5 hold x, 6-7 W."""
    u8 = lambda i: tirx.const(i, "uint8")  # noqa: E731  (a tile's number)
    pairs = nt // 2
    chunks = -(-pairs // PAIRS_PER_TASK)
    per_task = -(-pairs // chunks)
    blocks = rows // 32
    a_stride = kc * TILE_K * 2  # bytes from one row of x to the next
    ask, configure = tile_macros()

    def a_tile(number, row, c):
        return tile_op("tileloadd64", u8(number), T.address_of(xb[row, c * TILE_K]), T.int64(a_stride))

    def b_tile(number, t, c):
        return tile_op("tileloadd64", u8(number), T.address_of(wb[t, c, 0, 0, 0]), T.int64(64))

    def store(number, sums, r, j):
        return tile_op("tilestored64", u8(number), T.address_of(sums[r, j]), T.int64(128))

    @T.prim_func(private=True, check_well_formed=False, s_tir=True)
    def amx():
        with T.sblock("amx_tiles"):
            T.reads(xb[0:rows, 0:kc * TILE_K], wb[0:nt, 0:kc, 0:TILE_ROWS, 0:TILE_ROWS, 0:2])
            T.writes(out[0:m, 0:n])
            ask()
            for task in T.parallel(blocks * chunks):
                cfg = T.alloc_buffer((64,), "uint8", scope="local")
                sums = T.alloc_buffer((32, 32), "float32")
                configure(cfg)
                r0 = task // chunks * 32
                for p in range(per_task):
                    if task % chunks * per_task + p < pairs:
                        t0 = (task % chunks * per_task + p) * 2
                        T.evaluate(tile_op("tilezero", u8(0)))
                        T.evaluate(tile_op("tilezero", u8(1)))
                        T.evaluate(tile_op("tilezero", u8(2)))
                        T.evaluate(tile_op("tilezero", u8(3)))
                        for c in range(kc):
                            T.evaluate(a_tile(4, r0, c))
                            T.evaluate(a_tile(5, r0 + 16, c))
                            T.evaluate(b_tile(6, t0, c))
                            T.evaluate(b_tile(7, t0 + 1, c))
                            T.evaluate(tile_op("tdpbf16ps", u8(0), u8(4), u8(6)))
                            T.evaluate(tile_op("tdpbf16ps", u8(1), u8(4), u8(7)))
                            T.evaluate(tile_op("tdpbf16ps", u8(2), u8(5), u8(6)))
                            T.evaluate(tile_op("tdpbf16ps", u8(3), u8(5), u8(7)))
                        T.evaluate(store(0, sums, 0, 0))
                        T.evaluate(store(1, sums, 0, 16))
                        T.evaluate(store(2, sums, 16, 0))
                        T.evaluate(store(3, sums, 16, 16))
                        for r in range(32):
                            if r0 + r < m:
                                for half in range(2):
                                    if t0 * 16 + half * 16 + 16 <= n:
                                        for j in T.vectorized(16):
                                            out[r0 + r, t0 * 16 + half * 16 + j] = value(
                                                sums[r, half * 16 + j], t0 * 16 + half * 16 + j)
                                    elif t0 * 16 + half * 16 < n:
                                        for j in range(16):
                                            if t0 * 16 + half * 16 + j < n:
                                                out[r0 + r, t0 * 16 + half * 16 + j] = value(
                                                    sums[r, half * 16 + j], t0 * 16 + half * 16 + j)
                T.evaluate(tile_op("tilerelease"))

    return amx.body


def schedule_amx_dense(sch) -> str:
    """The `pack` stage (and a `weight` stage) as parallel loops of vectors; the `amx` stage is its own loop
    nest. Returns the kernel's note."""
    pack = sch.get_sblock("pack")
    i, j = sch.get_loops(pack)
    sch.parallel(i)
    sch.vectorize(j)
    weight = optional_block(sch, "weight")
    if weight is not None:
        t, c, r, j, e = sch.get_loops(weight)
        sch.parallel(sch.fuse(t, c))
        sch.vectorize(sch.fuse(j, e))
    return "AMX bfloat16 tiles"
