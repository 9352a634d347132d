"""CPU (llvm) grouped 1x1 conv: `conv2d(x, W, groups=G) + epilogue  ==>  G GEMMs over pixel vectors`.

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


from tvm_fusion._tvm import te, tirx
from tvm_fusion.hardware import CpuFacts
from tvm_fusion.precision import accumulator_dtype, cast_to
from tvm_fusion.schedules import dims
from tvm_fusion.schedules.conv2d import ConvPadding, affine_epilogue
from tvm_fusion.schedules.llvm.conv2d_pointwise import PixelTile  # rows: channels (may span groups); cols: pixels

__all__ = ["grouped_pointwise", "choose_group_tile", "conv2d_grouped_pointwise",
           "schedule_grouped_pointwise"]

MAX_CHANNELS = 8  # output channels (broadcast weights) per tile


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
    residual (tiled: 0.134, 0.138 ms)."""
    lanes = facts.float32_lanes
    padded = _ceil_to(pixels, lanes)
    if padded * opg >= _ceil_to(opg, lanes) * pixels:
        return None
    best, best_key = None, None
    for vectors in range(1, padded // lanes + 1):
        if pixels % lanes == 0 and pixels % (vectors * lanes):
            continue  # whole vectors of pixels: tiles that divide them (no x copy, no epilogue apart)
        for channels in range(1, min(opg, MAX_CHANNELS) + 1):
            tile = PixelTile(channels, vectors, lanes)
            if 2 * tile.accumulators > facts.vector_registers:
                break
            real = tile.accumulators * opg / _ceil_to(opg, channels) * pixels / _ceil_to(pixels, tile.cols)
            key = (round(real, 6), -vectors)
            if best_key is None or key > best_key:
                best, best_key = tile, key
    return best


def _ceil_to(n: int, m: int) -> int:
    return -(-n // m) * m


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


def schedule_grouped_pointwise(sch, conv, epi, pad, groups: int, facts: CpuFacts):
    """Tiles of `choose_group_tile`: the conv's accumulators in registers, the epilogue applied to each tile
    (or, for pixels that are not whole vectors, to the stored tiles in a loop nest of its own)."""
    cout, height, width = (int(sch.get(loop).extent) for loop in sch.get_loops(epi)[1:])  # n may be symbolic
    tile = choose_group_tile(cout // groups, height * width, facts)
    real = height * width
    if pad is not None:  # whole vectors of real pixels, then the last one with its zeros
        n, c, p = sch.get_loops(pad)
        sch.parallel(sch.fuse(n, c))
        body, _ = sch.loop_partition(p, [real // tile.lanes * tile.lanes, None])
        sch.vectorize(sch.split(body, [None, tile.lanes])[1])
    sch.transform_block_layout(epi, lambda n_, o_, h_, w_: (n_, o_, h_ * width + w_))
    later = None
    if real % tile.cols:  # the epilogue apart, its last vector partitioned off (a predicate on vector lanes
        later, epi = epi, sch.cache_write(conv, 0, "global")  # would make it scalar), each tile stored
    n, o, p, rc = sch.get_loops(conv)
    oo, oi = sch.split(o, [None, tile.channels])
    po, pv, pl = sch.split(p, [None, tile.vectors, tile.lanes])
    sch.reorder(n, po, oo, rc, oi, pv, pl)
    sch.parallel(sch.fuse(n, po))
    sch.reverse_compute_at(epi, oo)
    sch.set_scope(conv, 0, "local")
    sch.vectorize(pl)
    sch.unroll(pv)
    sch.unroll(oi)
    sch.decompose_reduction(conv, rc)
    *_, eo, ep = sch.get_loops(epi)
    epv, epl = sch.split(ep, [tile.vectors, tile.lanes])
    sch.unroll(eo)
    sch.unroll(epv)
    sch.vectorize(epl)
    if later is not None:
        n, o, p = sch.get_loops(later)
        sch.parallel(sch.fuse(n, o))
        body, _ = sch.loop_partition(p, [real // tile.lanes * tile.lanes, None])
        sch.vectorize(sch.split(body, [None, tile.lanes])[1])
