"""CPU (llvm) 1x1 convs over pixel vectors: `conv2d_1x1(x, W, groups=G) + epilogue  ==>  tiles of output
channel rows x pixel vectors` (NCHW in, NCHW out). The two kernels of `conv2d.conv_plan` that broadcast
weights and keep pixel vectors as accumulators (the tiled kernel of `conv2d.py` does the reverse): per group,
out[o, P] = W[o, C] @ x[C, P] over the H * W pixels, read and written contiguously, in tiles of `PixelTile`.

- groups = 1, plan kind "pointwise" (`schedule_pointwise`): where the step cost says `pixel_vectors`
  (AVX2's flat 1x1 convs; AVX-512's `conv2d.pixel_vector_pointwise` ones);
  the compute is `conv2d.conv2d_padded(flat=True)`, W packed, x copied into strips, the output channels in
  L2-sized chunks, a last tile past H * W peeled by LoopPartition.
- groups > 1, plan kind "pixels" (`conv2d_grouped_pointwise`, `schedule_grouped_pointwise`): any ISA; W read
  as it is (OIHW), a tile's channels may span two groups, pixels padded to whole vectors by a copy of x.

They share the tile, its register schedule (`_accumulate_in_registers`, `_store_whole_vectors`), the
epilogue's pixels fused into one loop (`_flatten_epilogue`) and the whole-vector loop over planes
(`_planes_in_vectors`). Their computes and loop nests differ (packed against unpacked W, strips against a
padded copy, chunks of channels, a tail tile peeled against pixels partitioned off), and so do their tile
choices (`conv2d.choose_pixel_tile`: real outputs per FMA slot at the ISA's step cost, channels padded to
whole chunks, against the channel-vectorized flat tile; `choose_group_tile`: real outputs with the channels
of a group and the pixels padded to the tile, half the registers as accumulators, against the tiled
kernel's channel padding), each measured where it is taken: one kernel for both would change the code of
every model that takes either.

## groups = 1 ("pointwise"): `conv2d_1x1(x, W) + epilogue  ==>  out[co, p] tiles of rows x pixel vectors`

Stride 1, unpadded (`conv2d.flat_pixels`). In NCHW both x and the output are contiguous in the pixels
p = h * W + w, so the conv is the GEMM out[C_out, P] = W[C_out, C_in] @ x[C_in, P] in its natural layout:
each reduction step loads `vectors` pixel vectors of one input plane and broadcasts `rows` weights, and the
epilogue (bias / folded BN, residual, activation) stores whole vectors of each output row (the
channel-vectorized tile of `conv2d.py` stores NCHW one element at a time).

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
PP-OCR's 240 -> 240 on 12x80 1.67 -> 1.35 ms and 480 -> 480 on 6x80 3.09 -> 2.68 ms (docs/cpu_conv_kernels.md,
for every shape).

## groups > 1 ("pixels"): `conv2d(x, W, groups=G) + epilogue  ==>  G GEMMs over pixel vectors`

A grouped pointwise conv (ShuffleNet: 4 groups of 28-136 channels) is per group a small GEMM
out[o, p] = sum_c W[o, c] * x[c, p] on NCHW planes of H*W pixels. The tiled kernel (`conv2d.py`) puts output
channels in vectors: 34 channels per group pad to 40, and the channel-vector accumulators store the NCHW
output element by element (through a regrouped copy). Here the pixels are the vectors instead: x and the
output are read and written contiguously, and each step broadcasts `channels` weights.

    parallel for (n, group):
        for pixel tile (vectors * L pixels), channel block (`channels` output channels of the group):
            acc[channels, vectors * L] = 0
            for c in the group's input channels:
                acc[o, :] += W[o, c] * x[c, tile]        # broadcast * vector
            out[n, real channels of the block, tile] = epilogue(acc)

Taken where the pixels padded to whole vectors waste less than the channels of a group padded to them (the
tiled kernel's padding). Pixels that are not whole vectors are padded to whole tiles: x is copied first (the
`pad` stage: each plane's pixels, then zeros), and each tile's accumulators are stored, the epilogue run
apart with the last partial vector partitioned off (a predicate on the vector lanes would make it scalar).
A tile's channels may span two groups: each reads its own group's input channels. The output channels are
padded to whole tiles, the padded ones repeating the last channel (their outputs are dropped). Each output is
the same left-to-right sum over its group's channels as the tiled kernel's: the results are bit-identical.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm_fusion._tvm import float_nodes, te, tirx
from tvm_fusion.hardware import CpuFacts
from tvm_fusion.precision import accumulator_dtype, cast_to
from tvm_fusion.schedules import dims
from tvm_fusion.schedules.conv2d import ConvPadding, affine_epilogue
from tvm_fusion.schedules.llvm.blocks import ceil_to, loop_extent, optional_block

__all__ = ["PixelTile", "VectorRows", "channel_chunks", "choose_group_tile", "conv2d_grouped_pointwise",
           "grouped_pointwise", "padded_channels", "pixel_tiles", "schedule_grouped_pointwise", "schedule_pointwise",
           "strips_in_place"]

# a chunk of output channels' weights (rows x C_in floats) re-read by every pixel tile: kept to about the
# tiled kernel's panel budget (conv2d.PANEL_BYTES), so it stays in the per-core L2 while x streams
CHUNK_BYTES = 160 * 1024
FLOAT_BYTES = 4
#: ... or up to this fraction of the input's bytes, where larger: each chunk copies the whole input into its
#: strips again (`_copy_strips`), which costs more than streaming a larger chunk's weights (`channel_chunks`)
CHUNK_INPUT_FRACTION = 0.5
# the x strips of a group of pixel tiles, re-read by every row block of a chunk (its weights then stay in L1)
PIXEL_GROUP_BYTES = 256 * 1024
#: a conv with fewer output channels than this (and whole tiles of pixels) reads x in place (`strips_in_place`)
STRIP_COPY_CHANNELS = 32
BROADCAST_REGISTERS = 1  # the weight broadcast of a step (its x vectors are counted by the tile)
MAX_CHANNELS = 8  # grouped: output channels (broadcast weights) per tile
#: An epilogue with more floating-point nodes than this (`float_nodes`: SiLU, sigmoid, tanh and the GELUs
#: 79-113 with fast_math.py's functions; ReLU, ReLU6, hardswish, with a residual add, at most 19) keeps its
#: rows rolled (`_store_whole_vectors`): unrolled, the activation's temporaries of every row meet the tile's
#: live accumulators and spill, each spilled vector stored and reloaded through one stack slot in a chain.
#: Measured on Zen 4 (AVX-512, one conv + SiLU, one thread, CPU time, interleaved, bit-identical; unrolled ->
#: rolled): 1x1 40 -> 240 on 28x28 (30-row tile) 0.851 -> 0.232 ms (ReLU 0.17), 16 -> 96 on 112x112 (6 x 4)
#: 0.899 -> 0.802, 64 -> 256 on 56x56 1.746 -> 1.364; rolled ReLU epilogues lost (16 -> 96 0.42 -> 0.52 ms).
HEAVY_EPILOGUE_NODES = 32
#: pixel groups: the busiest thread may run this fraction more tiles than the best grouping gives it
GROUP_IMBALANCE = 0.1


@dataclass(frozen=True)
class VectorRows:
    """`rows` x `vectors` vectors of `lanes` fp32 values held in registers: rows * vectors accumulators, each
    row `cols` values long (the depthwise kernel's `RowTile`, the pointwise kernel's `PixelTile`)."""
    rows: int
    vectors: int
    lanes: int

    @property
    def cols(self) -> int:
        return self.vectors * self.lanes

    @property
    def accumulators(self) -> int:
        return self.rows * self.vectors


@dataclass(frozen=True)
class PixelTile(VectorRows):
    """`rows` output channels x `vectors` vectors of `lanes` pixels (grouped: the rows may span two groups)."""

    @property
    def channels(self) -> int:  # the block W is packed in (conv2d.pack_conv)
        return self.rows

    @property
    def loads_per_step(self) -> int:
        """x vectors plus weight broadcasts per reduction step."""
        return self.rows + self.vectors


def _flatten_epilogue(sch, epi) -> int:
    """The epilogue's (n, o, h, w) as (n, o, h * W + w), one pixel loop; returns H * W."""
    height, width = (loop_extent(sch, loop) for loop in sch.get_loops(epi)[2:])
    sch.transform_block_layout(epi, lambda n_, o_, h_, w_: (n_, o_, h_ * width + w_))
    return height * width


def _accumulate_in_registers(sch, conv, rc, rows, vectors, lanes):
    """The tile's accumulators local (registers): its pixel lanes vectorized, its vectors and `rows` (None:
    a one-row tile) unrolled, the initialisation split off the reduction `rc`."""
    sch.set_scope(conv, 0, "local")
    sch.vectorize(lanes)
    sch.unroll(vectors)
    if rows is not None:
        sch.unroll(rows)
    sch.decompose_reduction(conv, rc)  # after vectorize: the other order is "not compact dataflow"


def heavy_epilogue(sch, epi) -> bool:
    """Whether the epilogue's value has more than HEAVY_EPILOGUE_NODES floating-point nodes (`float_nodes`)."""
    return float_nodes(sch.get(epi).body) > HEAVY_EPILOGUE_NODES


def _store_whole_vectors(sch, rows, vectors, lanes, rolled: bool = False):
    """The epilogue of a tile: its rows (unless `rolled`, `heavy_epilogue`) and vectors unrolled, each
    vector's lanes stored as one."""
    if not rolled:
        sch.unroll(rows)
    sch.unroll(vectors)
    sch.vectorize(lanes)


def _planes_in_vectors(sch, block, real: int, lanes: int):
    """A [n, c, P] loop nest parallel over its planes, the first `real` pixels rounded down to whole vectors
    vectorized and the rest partitioned off (a predicate on the vector lanes would make it scalar); fewer
    than `lanes` real pixels stay one scalar loop (a partition at 0 is a ScheduleError: regressions/b9a478f23f)."""
    n, c, p = sch.get_loops(block)
    sch.parallel(sch.fuse(n, c))
    if real < lanes:
        return
    body, _ = sch.loop_partition(p, [real // lanes * lanes, None])
    sch.vectorize(sch.split(body, [None, lanes])[1])


# ---------------------------------------------------------------- groups = 1 ("pointwise")
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


def channel_chunks(cout: int, rows: int, reduction: int, pixels: int = 0) -> tuple[int, int]:
    """(chunks, row blocks per chunk) of `cout` output channels in blocks of `rows`: as few chunks as keep
    each chunk's weights (its rows x `reduction` floats) within CHUNK_BYTES, or within CHUNK_INPUT_FRACTION
    of the input's bytes (`reduction` planes of `pixels`) where that is more: every chunk copies the input
    into its strips once more. Where the weights are at least the input (`cout` >= `pixels`: few pixel
    groups stream them) one chunk. The blocks are spread evenly over the chunks; the channels are padded to
    chunks * blocks * rows (`padded_channels`). Measured on Zen 2 (AVX2, one thread, CPU time, conv + ReLU,
    CHUNK_BYTES alone -> with the input's fraction): ResNet-50's 512 -> 128 on 28x28 1.158 -> 1.103 ms (2 -> 1
    chunks), 512 -> 256 on 28x28 2.278 -> 2.116 ms (4 -> 1), its 1x1/2 256 -> 512 to 28x28 2.315 -> 2.229 ms
    (4 -> 2); 128 -> 512 on 28x28 ran 1.086 ms in 2 chunks, 1.113 ms in one (kept: 2); SqueezeNet's 512 ->
    1000 on 13x13 1.964 -> 1.827 ms (12 -> 1), 256 -> 1000 on 13x13 0.954 -> 0.919 ms (7 -> 1), PP-OCR's 480
    -> 480 on 6x80 2.314 -> 2.217 ms (2 -> 1)."""
    blocks = -(-cout // rows)
    if CHUNK_INPUT_FRACTION and 0 < pixels <= cout:  # the weights at least the input: one chunk
        return 1, blocks
    budget = max(CHUNK_BYTES, int(CHUNK_INPUT_FRACTION * reduction * pixels * FLOAT_BYTES))
    want = max(1, budget // (rows * reduction * FLOAT_BYTES))
    chunks = -(-blocks // want)
    return chunks, -(-blocks // chunks)


def padded_channels(cout: int, rows: int, reduction: int, pixels: int = 0) -> int:
    """The output channels the pointwise compute computes (zero weights beyond `cout`): whole chunks of the
    conv's `pixels` (`channel_chunks`)."""
    chunks, blocks = channel_chunks(cout, rows, reduction, pixels)
    return chunks * blocks * rows


def padded_pixels(pixels: int, tile: PixelTile) -> int:
    """The pixels the conv computes: whole tiles (the last one's pixels beyond `pixels` read zeros)."""
    return ceil_to(pixels, tile.cols)


def _balanced_group(tiles: int, want: int, threads: int, chunks: int = 1) -> int:
    """Pixel tiles per group: a divisor of `tiles` of at most `want`, the largest whose busiest thread (the
    `chunks` x tiles / group parallel tasks split over `threads` in contiguous ranges, as TVM's pool does)
    runs at most GROUP_IMBALANCE more tiles than with the best such divisor. On two threads SqueezeNet's
    16 -> 64 on 55x55 ran 3 groups of 25 tiles (2 on one thread); Inception-v2's convs on 28x28 7 groups of 7."""
    divisors = [d for d in range(1, min(tiles, max(want, 1)) + 1) if tiles % d == 0]

    def load(d: int) -> int:
        return -(-chunks * (tiles // d) // max(threads, 1)) * d

    best = min(load(d) for d in divisors)
    return max(d for d in divisors if load(d) <= best * (1 + GROUP_IMBALANCE))


def _pixel_group(tiles: int, cols: int, reduction: int, threads: int = 1, chunks: int = 1) -> int:
    """Pixel tiles per group: a divisor of `tiles` whose x strips (`reduction` planes x `cols` pixels each)
    fit PIXEL_GROUP_BYTES, balanced over `threads` (`_balanced_group`)."""
    return _balanced_group(tiles, PIXEL_GROUP_BYTES // (cols * reduction * FLOAT_BYTES), threads, chunks)


def _tail_group(tiles: int, cols: int, reduction: int, threads: int) -> int:
    """Pixel tiles per group when the last tile passes H * W (`tiles` counts it): the whole tiles grouped as
    `_pixel_group` in at least `threads` groups where they can be, so the last group holds only that tile
    (the one LoopPartition peels and runs serially after the parallel groups)."""
    if tiles == 1:
        return 1
    want = min(PIXEL_GROUP_BYTES // (cols * reduction * FLOAT_BYTES), (tiles - 1) // max(threads, 1))
    return _balanced_group(tiles - 1, want, threads)


def strips_in_place(cout: int, pixels: int, tile: PixelTile) -> bool:
    """Whether the pointwise kernel reads x where it is (NCHW: each step's pixel vectors are one input plane's,
    contiguous) instead of copying it into strips (`_copy_strips`): fewer than STRIP_COPY_CHANNELS output
    channels, whose few multiply-adds per input element do not pay for moving it, and pixels in whole tiles
    (a tail tile reads the copy's zero pixels). Measured on an Intel Xeon (one conv + ReLU alone, one thread,
    CPU time, strips -> in place, bit-identical; in brackets single calls after an 8 MiB write): AVX-512,
    MobileNetV2's 32 -> 16 on 112x112 0.201 -> 0.173 ms (0.262 -> 0.239), 96 -> 24 on 56x56 0.138 -> 0.134
    (0.244 -> 0.227), 144 -> 24 on 56x56 0.241 -> 0.223 (0.330 -> 0.291); the same for AVX2 (x86-64-v3) 0.240
    -> 0.218 (0.285 -> 0.281), 0.208 -> 0.185 (0.341 -> 0.283), 0.369 -> 0.342 (0.478 -> 0.392). With 32 or
    more channels the copy holds its own: 192 -> 32 on 28x28 AVX-512 0.096 -> 0.088 (0.187 -> 0.205), AVX2
    0.113 -> 0.118 (0.199 -> 0.218); 64 -> 64 on 56x56 1.00x (1.03x) and 0.96x (0.87x); 256 -> 64, 64 -> 256,
    256 -> 128 on 56x56, 128 -> 512 and 512 -> 256 on 28x28 0.98x-1.06x on AVX-512 (the copy's loads move
    into the kernel)."""
    return cout < STRIP_COPY_CHANNELS and pixels % tile.cols == 0


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
    pixels = _flatten_epilogue(sch, epi)
    n, o, p = sch.get_loops(epi)
    reduction = loop_extent(sch, sch.get_loops(conv)[4])
    chunks, blocks = channel_chunks(loop_extent(sch, o), tile.rows, reduction, pixels)
    oc, ob, oi = sch.split(o, [chunks, blocks, tile.rows])
    tiles = -(-pixels // tile.cols)
    tail = pixels % tile.cols != 0
    if tail:
        group = _tail_group(tiles, tile.cols, reduction, threads)
    else:
        group = _pixel_group(tiles, tile.cols, reduction, threads, chunks)
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
    pad = optional_block(sch, "pad")  # absent where the plan reads x in place (`strips_in_place`)
    if pad is not None:
        copy = _copy_strips(sch, pad, sch.get_loops(epi)[1 if tail else 0], tile.cols)
        if tail:  # the last tile's pixels beyond H * W: its own loop, the others unpredicated whole vectors
            sch.annotate(copy, "pragma_loop_partition_hint", 1)
    cv, cl = sch.split(cw, [tile.vectors, tile.lanes])
    sch.reorder(rc, *([co] if co is not None else []), cv, cl)
    _accumulate_in_registers(sch, conv, rc, co, cv, cl)
    _store_whole_vectors(sch, oi, pv, pl, rolled=heavy_epilogue(sch, epi))


# ---------------------------------------------------------------- groups > 1 ("pixels")
def grouped_pointwise(kh: int, kw: int, strides, padding, groups: int, cpg: int) -> bool:
    """Whether a conv is a grouped (not depthwise) 1x1, stride-1, unpadded conv."""
    return (groups > 1 and cpg > 1 and (kh, kw) == (1, 1) and all(int(s) == 1 for s in strides)
            and not any(int(p) for p in padding))


def choose_group_tile(opg: int, pixels: int, facts: CpuFacts) -> PixelTile | None:
    """The tile with the most real outputs (channels and pixels padded to the tile), ties to fewer pixel
    vectors; None when the pixels padded to whole vectors waste as much as the channels padded to them (the
    tiled kernel's padding). Pixels that are whole vectors take tiles that divide them. The accumulators take
    at most half the vector registers: each channel's input vectors are loaded for it (a tile may span two
    groups, so LLVM cannot share them). Measured on Zen 2 (AVX2, one thread, CPU time, conv + ReLU):
    136 -> 136 in 4 groups on 28x28 ran 0.101 ms with 4 channels x 2 vectors, 0.137 ms with 6 x 2, 0.133 ms
    with 5 x 2, 0.126 ms with 3 x 2; 24 -> 112 on 56x56 0.075 ms with 4 x 2, 0.102 ms with 6 x 2 (the tiled
    kernel: 0.203 and 0.230 ms); 272 -> 272 on 14x14 (196 pixels padded to 208) 0.112 ms, 0.117 ms with a
    residual (tiled: 0.134, 0.138 ms).
    Not `conv2d.choose_pixel_tile` (groups = 1): that one weighs FMA slots at the ISA's step cost with a
    register per x vector and one broadcast, over channels padded to whole L2 chunks, and declines to the
    flat tiled kernel; here a tile's input vectors are not shared across its rows and the alternative is
    the tiled kernel's channel padding per group."""
    lanes = facts.float32_lanes
    padded = ceil_to(pixels, lanes)
    if padded * opg >= ceil_to(opg, lanes) * pixels:
        return None
    best, best_key = None, None
    for vectors in range(1, padded // lanes + 1):
        if pixels % lanes == 0 and pixels % (vectors * lanes):
            continue  # whole vectors of pixels: tiles that divide them (no x copy, no epilogue apart)
        for channels in range(1, min(opg, MAX_CHANNELS) + 1):
            tile = PixelTile(channels, vectors, lanes)
            if 2 * tile.accumulators > facts.vector_registers:
                break
            real = tile.accumulators * opg / ceil_to(opg, channels) * pixels / ceil_to(pixels, tile.cols)
            key = (round(real, 6), -vectors)
            if best_key is None or key > best_key:
                best, best_key = tile, key
    return best


def conv2d_grouped_pointwise(x, w, b, residual=None, *, groups: int, out_padding: ConvPadding, activation=None,
                             activation_params=None, residual_after_activation=False, fast_math=True,
                             target=None):
    """conv[n, o, p] = sum_c x[n, group(o)*C/G + c, p] * W[o, c] over the output channels padded to
    `out_padding.group_channels` (the padded ones repeat the last channel: their outputs are dropped), then the
    conv2d epilogue over the real channels."""
    n, _, h, wd = dims(x.shape)
    cout, cpg = int(w.shape[0]), int(w.shape[1])
    opg, acc = cout // groups, accumulator_dtype(x.dtype)
    rc = te.reduce_axis((0, cpg), name="rc")
    pixels = out_padding.cols
    if pixels == h * wd:
        def at(i, c, p):
            return x[i, c, p // wd, p % wd]
    else:  # the pixels padded to whole vectors: x copied with zeros after each plane's real pixels
        pad = te.compute((n, int(x.shape[1]), pixels), lambda i, c, p: tirx.if_then_else(
            p < h * wd, x[i, c, tirx.min(p, h * wd - 1) // wd, tirx.min(p, h * wd - 1) % wd],
            tirx.const(0, x.dtype)), name="pad")

        def at(i, c, p):
            return pad[i, c, p]

    def product(i, o, p):
        real = tirx.min(o, cout - 1)
        return cast_to(at(i, real // opg * cpg + rc, p), acc) * cast_to(w[real, rc, 0, 0], acc)

    conv = te.compute((n, out_padding.group_channels, pixels),
                      lambda i, o, p: te.sum(product(i, o, p), axis=[rc]), name="conv")
    return affine_epilogue((n, cout, h, wd), lambda i, o, y, z: conv[i, o, y * wd + z], b,
                           residual, x.dtype, activation=activation, activation_params=activation_params,
                           residual_after_activation=residual_after_activation, fast_math=fast_math,
                           target=target)


def schedule_grouped_pointwise(sch, conv, epi, pad, tile: PixelTile):
    """`tile` (the plan's, `choose_group_tile`): the conv's accumulators in registers, the epilogue applied to
    each tile (or, for pixels that are not whole vectors, to the stored tiles in a loop nest of its own)."""
    real = _flatten_epilogue(sch, epi)
    if pad is not None:  # whole vectors of real pixels, then the last one with its zeros
        _planes_in_vectors(sch, pad, real, tile.lanes)
    later = None
    if real % tile.cols:  # the epilogue apart, its last vector partitioned off (a predicate on vector lanes
        later, epi = epi, sch.cache_write(conv, 0, "global")  # would make it scalar), each tile stored
    n, o, p, rc = sch.get_loops(conv)
    oo, oi = sch.split(o, [None, tile.channels])
    po, pv, pl = sch.split(p, [None, tile.vectors, tile.lanes])
    sch.reorder(n, po, oo, rc, oi, pv, pl)
    sch.parallel(sch.fuse(n, po))
    sch.reverse_compute_at(epi, oo)
    _accumulate_in_registers(sch, conv, rc, oi, pv, pl)
    *_, eo, ep = sch.get_loops(epi)
    epv, epl = sch.split(ep, [tile.vectors, tile.lanes])
    if sch.get(eo).same_as(sch.get(oo)):  # one channel a tile: reverse_compute_at made no channel loop, and
        sch.unroll(epv)                   # unrolling `oo` (all the channel tiles) took minutes to compile
        sch.vectorize(epl)
    else:
        _store_whole_vectors(sch, eo, epv, epl, rolled=heavy_epilogue(sch, epi))
    if later is not None:
        _planes_in_vectors(sch, later, real, tile.lanes)
