"""CPU (llvm) schedule for `conv2d_affine`: output channels in vectors of L fp32 lanes (16 with AVX-512,
8 with AVX2, 4 with NEON: `hardware.cpu_facts`), a register tile of output pixels x output channels, the
epilogue applied to each tile while it is in registers.

    parallel for (n, oc block of OC = L * v channels):
        panel[rc, rh, rw, OC] = W[oc block, rc, rh, rw]            # oc innermost: one vector load each
        for (row tile, column tile):                             # rows * cols output pixels
            acc[rows, cols, OC] = 0                              # rows * cols * v vector registers
            for rh, rw, rc:
                acc[i, j, :] += x[rc, y + i + rh, x + j + rw] * panel[rc, rh, rw, :]   # broadcast * vector
            out[n, oc block, row tile, column tile] = epilogue(acc)

Padding is materialised by its own parallel loop nest first (inlining it into the reduction is ~10x
slower on 3x3). Shapes the tile does not fit (grouped convs, output channels not a multiple of L) take
`_schedule_generic`, which vectorizes along the output row.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm_fusion._tvm import tirx
from tvm_fusion.hardware import CpuFacts, cpu_facts
from tvm_fusion.registry import register_schedule
from tvm_fusion.schedules.conv2d import CONV_FAMILY

__all__ = ["ConvTile", "choose_tile", "max_accumulators", "schedule_conv2d_llvm"]

FLOAT_BYTES = 4
# vector registers a tile leaves to the panel vectors and the broadcast temporary (28 of 32 zmm accumulate)
RESERVED_REGISTERS = 4
OC_VECTOR_CHOICES = (4, 2, 1)  # output-channel vectors per tile
# The panel (reduction size x tile channels) is re-read by every pixel tile of its oc block. Kept
# inside ~1/6 of the 1 MiB per-core L2 of Zen 4, next to the input rows: measured on ResNet-50,
# 1x1 1024->2048 ran 1.45 ms with a 256 KiB panel and 1.25 ms with 128 KiB.
PANEL_BYTES = 160 * 1024
GENERIC_OC_BLOCK = 8  # generic schedule: output channels unrolled per tile


def max_accumulators(facts: CpuFacts) -> int:
    """Accumulator registers of one tile: the target's vector registers minus RESERVED_REGISTERS."""
    return facts.vector_registers - RESERVED_REGISTERS


@dataclass(frozen=True)
class ConvTile:
    oc_vectors: int  # v: the tile holds lanes * v output channels
    rows: int  # output rows per tile
    cols: int  # output columns per tile
    lanes: int  # fp32 lanes of one vector register of the target

    @property
    def channels(self) -> int:
        return self.lanes * self.oc_vectors

    @property
    def accumulators(self) -> int:
        return self.oc_vectors * self.rows * self.cols

    @property
    def loads_per_step(self) -> int:
        """Vector loads of the panel plus input broadcasts per reduction step."""
        return self.oc_vectors + self.rows * self.cols


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _factor(extent: int, want: int) -> int:
    """The largest divisor of extent that is at most want."""
    return max(d for d in _divisors(extent) if d <= want)


def _oc_vector_options(cout: int, reduction: int, tasks_wanted: int, lanes: int) -> list[int]:
    """Channel widths (in vectors) that divide cout; wider than one vector only while the oc blocks
    still feed every thread and the panel fits PANEL_BYTES."""
    options = []
    for v in OC_VECTOR_CHOICES:
        if cout % (lanes * v):
            continue
        blocks = cout // (lanes * v)
        panel = reduction * lanes * v * FLOAT_BYTES
        if v == 1 or (blocks >= tasks_wanted and panel <= PANEL_BYTES):
            options.append(v)
    return options


def _tile_candidates(cout: int, hout: int, wout: int, reduction: int, tasks_wanted: int, facts: CpuFacts):
    lanes = facts.float32_lanes
    for v in _oc_vector_options(cout, reduction, tasks_wanted, lanes):
        for cols in _divisors(wout):
            # several rows per tile only when a tile covers whole rows (narrow outputs)
            for rows in _divisors(hout) if cols == wout else [1]:
                tile = ConvTile(v, rows, cols, lanes)
                if tile.accumulators <= max_accumulators(facts):
                    yield tile


def choose_tile(cout: int, hout: int, wout: int, reduction: int, batch: int, threads: int,
                facts: CpuFacts) -> ConvTile | None:
    """The register tile with the most accumulators, ties to fewer loads per step; None when the
    output channels are not a multiple of one vector of `facts` (the target's)."""
    tasks_wanted = max(1, -(-threads // batch))
    candidates = list(_tile_candidates(cout, hout, wout, reduction, tasks_wanted, facts))
    if not candidates:
        return None
    return max(candidates, key=lambda t: (t.accumulators, -t.loads_per_step))


def _optional_block(sch, name: str):
    try:
        return sch.get_sblock(name)
    except Exception:  # noqa: BLE001 - tvm raises a ScheduleError subclass when absent
        return None


def _extent(sch, loop) -> int:
    return int(sch.get(loop).extent)


def _static(extent) -> bool:
    return isinstance(extent, (int, tirx.IntImm))


def _schedule_pad(sch, pad):
    n, c, h, w = sch.get_loops(pad)
    sch.parallel(sch.fuse(n, c))


def _pack_weights(sch, conv, at_loop, reduction: int, lanes: int):
    """Copy the oc block's weights W[oc, rc, rh, rw] to a panel [rc, rh, rw, oc] at `at_loop`: the
    copy reads W rows contiguously (vectorized) and writes each element to its oc column."""
    weight_index = len(sch.get(conv).reads) - 1  # reads are (input, weight)
    panel = sch.cache_read(conv, weight_index, "global")
    sch.compute_at(panel, at_loop)
    sch.transform_layout(panel, ("write", 0), lambda o, c, r, s: (c, r, s, o))
    oc, *taps = sch.get_loops(panel)[1:]  # unit loops (1x1 kernel, one input channel) are gone
    if not taps:
        return
    k = sch.fuse(*taps) if len(taps) > 1 else taps[0]
    ko, ki = sch.split(k, [None, _factor(reduction, lanes)])
    sch.reorder(ko, oc, ki)
    sch.vectorize(ki)


def _schedule_tiled(sch, conv, epi, tile: ConvTile):
    n, o, h, w, rc, rh, rw = sch.get_loops(conv)
    reduction = _extent(sch, rc) * _extent(sch, rh) * _extent(sch, rw)
    oo, oi = sch.split(o, [None, tile.channels])
    ho, hi = sch.split(h, [None, tile.rows])
    wo, wi = sch.split(w, [None, tile.cols])
    # rc innermost of the reduction: each step reads a new input plane, so no broadcast stays live
    # across steps (with rw innermost LLVM reused them across taps and spilled the accumulators)
    sch.reorder(n, oo, ho, wo, rh, rw, rc, hi, wi, oi)
    outer = sch.fuse(n, oo)
    sch.parallel(outer)
    _pack_weights(sch, conv, outer, reduction, tile.lanes)
    sch.reverse_compute_at(epi, wo)
    # accumulators pixel-major, so each register holds `lanes` consecutive output channels
    sch.transform_layout(conv, ("write", 0), lambda n_, o_, h_, w_: (n_, h_, w_, o_))
    sch.set_scope(conv, 0, "local")
    sch.vectorize(oi)
    sch.unroll(wi)
    sch.unroll(hi)
    sch.decompose_reduction(conv, rh)  # after vectorize: the other order is "not compact dataflow"
    sch.vectorize(sch.get_loops(epi)[-1])


def _schedule_generic(sch, conv, epi, lanes: int):
    """Any shape: output channels unrolled, the output row vectorized (with a predicated tail)."""
    n, o, h, w, rc, rh, rw = sch.get_loops(conv)
    oo, oi = sch.split(o, [None, _factor(_extent(sch, o), GENERIC_OC_BLOCK)])
    wo, wi = sch.split(w, [None, min(lanes, _extent(sch, w))])
    sch.reorder(n, oo, h, wo, rc, rh, rw, oi, wi)
    sch.parallel(sch.fuse(n, oo))
    sch.reverse_compute_at(epi, wo)
    sch.vectorize(wi)
    sch.unroll(oi)
    sch.decompose_reduction(conv, rc)


@register_schedule(CONV_FAMILY, target="llvm")
def schedule_conv2d_llvm(sch, attrs, target):
    conv = sch.get_sblock("conv")
    epi = sch.get_sblock("epilogue")
    pad = _optional_block(sch, "pad")
    if pad is not None:
        _schedule_pad(sch, pad)
    batch, *loops = sch.get_loops(conv)
    cout, hout, wout, rc, rh, rw = (_extent(sch, loop) for loop in loops)
    n = sch.get(batch).extent
    facts = cpu_facts(target)
    tile = None
    if attrs.get("groups", 1) == 1:  # a symbolic batch is sized for as 1: the tile must feed every thread then
        tile = choose_tile(cout, hout, wout, rc * rh * rw, int(n) if _static(n) else 1, facts.threads, facts)
    if tile is None:
        _schedule_generic(sch, conv, epi, facts.float32_lanes)
    else:
        _schedule_tiled(sch, conv, epi, tile)
