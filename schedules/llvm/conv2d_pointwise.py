"""CPU (llvm) 1x1 conv vectorized over pixels: `conv2d_1x1(x, W) + epilogue  ==>  out[co, p] tiles of
channel rows x pixel vectors` (groups=1, stride 1, unpadded: `conv2d.flat_pixels`). In NCHW both x and the
output are contiguous in the pixels p = h * W + w, so the conv is the GEMM out[C_out, P] = W[C_out, C_in] @
x[C_in, P] in its natural layout: each reduction step loads `vectors` pixel vectors of one input plane and
broadcasts `rows` weights, and the epilogue (bias / folded BN, residual, activation) stores whole vectors of
each output row (the channel-vectorized tile of `conv2d.py` stores NCHW one element at a time).

    parallel for (n, chunk of output channels, group of pixel tiles of vectors * L pixels):
        strips[tile, ci, :] = x[n, ci, tile's pixels]  for the group's tiles    # copied (`_copy_strips`)
        for row block of `rows` channels in the chunk:                  # the chunk's weights stay in L2
            for pixel tile in the group:                                # the block's weights stay in L1
                acc[rows, vectors * L] = 0
                for ci:                                                 # the same order as every other plan
                    acc[i, :] += Wp[block, ci, i] * strips[tile, ci, :]   # broadcast * vector
                out[n, block's channels, tile's pixels] = epilogue(acc)  # whole vectors of output rows

W is packed at compile time in blocks of `rows` channels (`conv2d.pack_conv`: Wp[block, ci, row]), so each
step's broadcasts are consecutive; the output channels are padded to whole chunks of blocks with zero
weights (the epilogue drops them). Where no tile divides H * W (`conv2d._pixels_tail`: shallow convs),
the conv computes whole tiles (`padded_pixels`, the copy's pixels past H * W zero), the whole tiles are
grouped and the last tile is a group of its own; the pixel-group, tile and copy loops carry
`pragma_loop_partition_hint`, so LoopPartition peels that tile (run serially after the parallel groups)
and only its epilogue stores under a lane predicate (scalar): the main loop keeps whole-vector stores.
Measured on Zen 2 (AVX2, one thread, CPU time, one conv + ReLU, channel-vectorized tile -> this kernel):
64 -> 256 on 56x56 1.34 -> 1.12 ms, 256 -> 64 on 56x56 1.45 -> 1.28 ms, 320 -> 64 on 28x28 0.45 -> 0.39 ms,
PP-OCR's 240 -> 240 on 12x80 1.67 -> 1.35 ms and 480 -> 480 on 6x80 3.09 -> 2.68 ms (README, "CPU
convolution kernels", for every shape).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PixelTile", "channel_chunks", "padded_channels", "pixel_tiles", "schedule_pointwise"]

# a chunk of output channels' weights (rows x C_in floats) re-read by every pixel tile: kept to about the
# tiled kernel's panel budget (conv2d.PANEL_BYTES), so it stays in the per-core L2 while x streams
CHUNK_BYTES = 160 * 1024
FLOAT_BYTES = 4
# the x strips of a group of pixel tiles, re-read by every row block of a chunk (its weights then stay in L1)
PIXEL_GROUP_BYTES = 256 * 1024
BROADCAST_REGISTERS = 1  # the weight broadcast of a step (its x vectors are counted by the tile)


@dataclass(frozen=True)
class PixelTile:
    """`rows` output channels x `vectors` vectors of `lanes` pixels: rows * vectors accumulators."""
    rows: int
    vectors: int
    lanes: int

    @property
    def channels(self) -> int:  # the block W is packed in (conv2d.pack_conv)
        return self.rows

    @property
    def cols(self) -> int:
        return self.vectors * self.lanes

    @property
    def accumulators(self) -> int:
        return self.rows * self.vectors

    @property
    def loads_per_step(self) -> int:
        """x vectors plus weight broadcasts per reduction step."""
        return self.rows + self.vectors


def pixel_tiles(pixels: int, lanes: int, vector_registers: int, tail: bool = False) -> list[PixelTile]:
    """Every tile that fits the vector registers (its accumulators, its x vectors of a step and one
    broadcast) and whose pixel vectors divide `pixels`; none when a vector does not divide them. With
    `tail`, every such tile no wider than `pixels` (the conv computes whole tiles, `padded_pixels`)."""
    tiles = []
    for vectors in range(1, vector_registers):
        if (vectors * lanes > pixels) if tail else pixels % (vectors * lanes):
            continue
        rows = (vector_registers - vectors - BROADCAST_REGISTERS) // vectors
        tiles += [PixelTile(r, vectors, lanes) for r in range(1, rows + 1)]
    return tiles


def _extent(sch, loop) -> int:
    return int(sch.get(loop).extent)


def channel_chunks(cout: int, rows: int, reduction: int) -> tuple[int, int]:
    """(chunks, row blocks per chunk) of `cout` output channels in blocks of `rows`: as few chunks as keep
    each chunk's weights (its rows x `reduction` floats) within CHUNK_BYTES, the blocks spread evenly over
    them; the channels are padded to chunks * blocks * rows (`padded_channels`)."""
    blocks = -(-cout // rows)
    want = max(1, CHUNK_BYTES // (rows * reduction * FLOAT_BYTES))
    chunks = -(-blocks // want)
    return chunks, -(-blocks // chunks)


def padded_channels(cout: int, rows: int, reduction: int) -> int:
    """The output channels the pointwise compute computes (zero weights beyond `cout`): whole chunks."""
    chunks, blocks = channel_chunks(cout, rows, reduction)
    return chunks * blocks * rows


def padded_pixels(pixels: int, tile: PixelTile) -> int:
    """The pixels the conv computes: whole tiles (the last one's pixels beyond `pixels` read zeros)."""
    return -(-pixels // tile.cols) * tile.cols


def _pixel_group(tiles: int, cols: int, reduction: int) -> int:
    """Pixel tiles per group: the largest divisor of `tiles` whose x strips (`reduction` planes x `cols`
    pixels each) fit PIXEL_GROUP_BYTES."""
    want = max(1, PIXEL_GROUP_BYTES // (cols * reduction * FLOAT_BYTES))
    return max(d for d in range(1, min(tiles, want) + 1) if tiles % d == 0)


def _tail_group(tiles: int, cols: int, reduction: int, threads: int) -> int:
    """Pixel tiles per group when the last tile passes H * W (`tiles` counts it): the whole tiles grouped as
    `_pixel_group` in at least `threads` groups where they can be, so the last group holds only that tile
    (the one LoopPartition peels and runs serially after the parallel groups)."""
    if tiles == 1:
        return 1
    want = max(1, min(PIXEL_GROUP_BYTES // (cols * reduction * FLOAT_BYTES), (tiles - 1) // max(threads, 1)))
    return max(d for d in range(1, min(tiles - 1, want) + 1) if (tiles - 1) % d == 0)


def _copy_strips(sch, pad, at_loop, cols: int):
    """The input copy (`pad`: x as [n, C_in, 1, P]) laid out [n, P / cols, C_in, cols] and computed per
    group of pixel tiles at `at_loop`: each tile's reduction then reads its x vectors in storage order
    instead of one line of a different input plane per step. Measured on Zen 2 (AVX2, one thread, CPU time,
    read in place -> copied strips): 512 -> 256 on 28x28 2.62 -> 2.36 ms, 128 -> 512 on 28x28 1.16 -> 1.06 ms,
    224 -> 128 on 56x56 2.30 -> 2.13 ms; 192 -> 32 on 28x28 and 240 -> 240 on 3x80 unchanged."""
    sch.transform_layout(pad, ("write", 0), lambda n_, c_, h_, p_: (n_, p_ // cols, c_, p_ % cols))
    sch.compute_at(pad, at_loop)
    *_, c, p = sch.get_loops(pad)
    po, pi = sch.split(p, [None, cols])
    sch.reorder(po, c, pi)
    sch.vectorize(pi)
    return po


def schedule_pointwise(sch, conv, epi, tile: PixelTile, threads: int = 1):
    """Schedule the flat compute (`conv2d_padded(flat=True)`: conv[n, C', 1, P'] with C' the channels padded
    to `tile.rows`, P' = H * W or its whole tiles, `padded_pixels`) with `tile`: the epilogue's pixels fused
    into one loop, the conv computed at each block of rows x pixel vectors, both vectorized over the pixels.
    A tail plan's pixel groups (sized for `threads`, the target's) are its outer, parallel loop."""
    width = _extent(sch, sch.get_loops(epi)[3])
    sch.transform_block_layout(epi, lambda n_, o_, h_, w_: (n_, o_, h_ * width + w_))
    n, o, p = sch.get_loops(epi)
    chunks, blocks = channel_chunks(_extent(sch, o), tile.rows, _extent(sch, sch.get_loops(conv)[4]))
    oc, ob, oi = sch.split(o, [chunks, blocks, tile.rows])
    pixels, reduction = _extent(sch, p), _extent(sch, sch.get_loops(conv)[4])
    tiles = -(-pixels // tile.cols)
    tail = pixels % tile.cols != 0
    if tail:
        group = _tail_group(tiles, tile.cols, reduction, threads)
    else:
        group = _pixel_group(tiles, tile.cols, reduction)
    pg, po, pv, pl = sch.split(p, [-(-tiles // group), group, tile.vectors, tile.lanes])
    if tail:  # the tiles past H * W: LoopPartition peels them, the others stay unpredicated
        sch.reorder(pg, n, oc, ob, po, oi, pv, pl)
        sch.fuse(n, oc)
        sch.parallel(pg)
        sch.annotate(pg, "pragma_loop_partition_hint", 1)
        sch.annotate(po, "pragma_loop_partition_hint", 1)
    else:
        sch.reorder(n, oc, pg, ob, po, oi, pv, pl)
        sch.parallel(sch.fuse(n, oc, pg))
    sch.compute_at(conv, po)
    # the unit loops (one image row, a 1x1 kernel; the channel loop of a one-row tile) are gone
    *_, co, cw, rc = sch.get_loops(conv) if tile.rows > 1 else (None, *sch.get_loops(conv)[-2:])
    copy = _copy_strips(sch, sch.get_sblock("pad"), sch.get_loops(epi)[1 if tail else 0], tile.cols)
    if tail:  # the last tile's pixels beyond H * W: its own loop, the others unpredicated whole vectors
        sch.annotate(copy, "pragma_loop_partition_hint", 1)
    cv, cl = sch.split(cw, [tile.vectors, tile.lanes])
    sch.reorder(rc, *([co] if co is not None else []), cv, cl)
    sch.set_scope(conv, 0, "local")
    sch.vectorize(cl)
    sch.unroll(cv)
    if co is not None:
        sch.unroll(co)
    sch.decompose_reduction(conv, rc)
    sch.unroll(oi)
    sch.unroll(pv)
    sch.vectorize(pl)
