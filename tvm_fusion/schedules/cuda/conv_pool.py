"""CUDA conv2d -> epilogue -> pool: `conv_pool(x, W', b')  ==>  one kernel, a thread block per pool tile`.

    blockIdx.x   (n, channel block, pool row block, pool column block)
    shared       epilogue[channels, rows, columns] the tile's windows read: the conv + bias + activation of
                 those outputs, one thread per output (the `pad` stage inlined into its predicated loads,
                 the accumulator in a register), its halo recomputed: the rows and columns a neighbouring
                 tile's windows also read are computed by both tiles (`halo_recompute` in the plan)
    threadIdx.x  one pool output per thread: the window read from shared memory (the average divided by its
                 count); a global pool: one channel's plane sum per thread

The conv part computes each output once per tile that reads it, straight from global memory (no staging of
the input or weights): the stem's and VGG's convs are compute bound on the GPU, and this kernel's worth is
not measured (no GPU here); `supports` declines a tile whose shared epilogue passes the arch's limit.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm_fusion.hardware import cuda_facts
from tvm_fusion.registry import register_schedule
from tvm_fusion.schedules import dims
from tvm_fusion.schedules.conv2d import ConvOperands, conv2d_out_size
from tvm_fusion.schedules.conv_pool import POOL_FAMILY, PoolWindow

THREADS = 128  # threads per block: one pool output (or one channel of a global pool) each
MAX_TILE_COLS = 8  # pool columns per tile
MAX_TILE_ROWS = 4  # pool rows per tile
BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


@dataclass(frozen=True)
class PoolTile:
    """`channels` x `rows` x `cols` pool outputs per thread block (a global pool: `channels` only) and the
    conv outputs its windows read: `conv_rows` x `conv_cols` per channel, kept in shared memory."""
    channels: int
    rows: int
    cols: int
    conv_rows: int
    conv_cols: int

    def shared_bytes(self, dtype: str) -> int:
        return self.channels * self.conv_rows * self.conv_cols * BYTES.get(dtype, 4)

    def halo_recompute(self, window: PoolWindow) -> float:
        """Conv outputs computed per tile over the distinct ones the tile advances by, less one: the share of the
        conv recomputed for the overlapping halo (0 for a global pool or windows that do not overlap)."""
        if window.kind == "global":
            return 0.0
        (sh, sw) = window.strides
        return round(self.conv_rows * self.conv_cols / (min(self.conv_rows, self.rows * sh)
                                                         * min(self.conv_cols, self.cols * sw)) - 1, 4)


def pool_tile(window: PoolWindow, conv_hw: tuple[int, int], channels: int) -> PoolTile:
    h, w = conv_hw
    if window.kind == "global":
        return PoolTile(min(channels, THREADS), 1, 1, h, w)
    (kh, kw), (sh, sw), (oh, ow) = window.size, window.strides, window.out
    cols, rows = min(ow, MAX_TILE_COLS), min(oh, MAX_TILE_ROWS)
    return PoolTile(max(1, min(channels, THREADS // (rows * cols))), rows, cols,
                    min(h, (rows - 1) * sh + kh), min(w, (cols - 1) * sw + kw))


def _conv_hw(attrs: dict, x, w) -> tuple[int, int]:
    _, _, hin, win = dims(x)
    _, _, kh, kw = dims(w)
    (sh, sw), (pt, pl, pb, pr), (dh, dw) = attrs["strides"], attrs["padding"], attrs["dilation"]
    return conv2d_out_size(int(hin), kh, sh, pt, pb, dh), conv2d_out_size(int(win), kw, sw, pl, pr, dw)


def supports(attrs: dict, shapes, target) -> str | None:
    ops = ConvOperands.of(shapes)
    window, dtype = PoolWindow.of(attrs), "float32"
    tile = pool_tile(window, _conv_hw(attrs, ops.x, ops.w), int(dims(ops.w)[0]))
    limit = cuda_facts(target).shared_static_bytes
    if tile.shared_bytes(dtype) > limit:
        return (f"the pool tile's conv outputs ({tile.channels} channels x {tile.conv_rows} x {tile.conv_cols}) need "
                f"{tile.shared_bytes(dtype)} bytes of shared memory; the limit is {limit}")
    return None


@register_schedule(POOL_FAMILY, target="cuda", supports=supports)
def schedule_conv2d_pool_cuda(sch, attrs, target) -> str:
    func = sch.mod["main"]
    ops = ConvOperands.of(func.params[:-1])
    window = PoolWindow.of(attrs)
    tile = pool_tile(window, _conv_hw(attrs, ops.x.shape, ops.w.shape), int(ops.w.shape[0]))
    try:
        last = sch.get_sblock("out")
        pool = sch.get_sblock("pool")
    except Exception:  # noqa: BLE001 - a max pool's output is its `pool` stage
        last, pool = sch.get_sblock("pool"), None
    block_loop, thread_loop = _tile_outputs(sch, last, window, tile)
    if pool is not None:
        sch.compute_at(pool, thread_loop)
        sch.set_scope(pool, 0, "local")
    epi = sch.get_sblock("epilogue")
    sch.compute_at(epi, block_loop)
    sch.set_scope(epi, 0, "shared")
    _, tx = sch.split(sch.fuse(*sch.get_loops(epi)[1:]), [None, THREADS])
    sch.bind(tx, "threadIdx.x")
    conv = sch.get_sblock("conv")
    sch.compute_at(conv, tx)
    sch.set_scope(conv, 0, "local")
    try:
        sch.compute_inline(sch.get_sblock("pad"))
    except Exception:  # noqa: BLE001 - an unpadded conv has no pad stage
        pass
    return f"CUDA cores, halo recomputed: {tile.halo_recompute(window):.0%} more conv outputs per tile"


def _tile_outputs(sch, last, window: PoolWindow, tile: PoolTile):
    """The output's loops as (blockIdx.x, threadIdx.x): tiles of pool outputs, one output per thread."""
    loops = sch.get_loops(last)
    if window.kind == "global":
        n, c, *rest = loops
        cb, ci = sch.split(c, [None, tile.channels])
        bx = sch.fuse(n, cb)
        inner = sch.fuse(ci, *rest) if rest else ci
    else:
        n, c, p, q = loops[:4]
        cb, ci = sch.split(c, [None, tile.channels])
        pb, pi = sch.split(p, [None, tile.rows])
        qb, qi = sch.split(q, [None, tile.cols])
        sch.reorder(n, cb, pb, qb, ci, pi, qi)
        bx = sch.fuse(n, cb, pb, qb)
        inner = sch.fuse(ci, pi, qi)
    _, tx = sch.split(inner, [None, THREADS])  # every threadIdx.x loop of the kernel has the same extent
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    return bx, tx
