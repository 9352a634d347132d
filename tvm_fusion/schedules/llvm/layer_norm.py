"""CPU schedule for LayerNorm: rows in parallel, both reductions and the output of a row computed
together (the row stays in cache), everything in vectors. A row sum is `w` partial sums in one vector register
(`rfactor`: element j goes to lane j % w, as reduction.py's `rows:` plan), then added across the lanes: one scalar
chain of C dependent adds per sum (the row's latency, not its bandwidth) ran a 128 x 768 block 3x slower. A
row that is not at least two whole vectors (of MIN_VECTOR lanes or more) keeps the scalar sums."""

from __future__ import annotations

from tvm_fusion.hardware import cpu_facts
from tvm_fusion.registry import register_schedule
from tvm_fusion.schedules.layer_norm import LAYER_NORM_FAMILY
from tvm_fusion.schedules.llvm.reduction import MIN_VECTOR, vector_width


@register_schedule(LAYER_NORM_FAMILY, target="llvm")
def schedule_layer_norm_llvm(sch, attrs, target):
    out = sch.get_sblock("out")
    *lead, col = sch.get_loops(out)  # [N, rows, C] with a symbolic batch: one parallel loop over N * rows
    c = int(sch.get(col).extent)
    lanes = cpu_facts(target).float32_lanes
    width = _sum_width(c, lanes)
    partials = {name: _vector_sum(sch, sch.get_sblock(name), width, len(lead)) if width else None
                for name in ("var", "mean")}
    row = sch.fuse(*lead) if len(lead) > 1 else lead[0]
    sch.parallel(row)
    for name in ("var", "mean"):  # consumers first: each lands under the row loop above what reads it
        sch.compute_at(sch.get_sblock(name), row)
        if partials[name] is not None:
            sch.compute_at(partials[name], row)
    for partial in partials.values():
        if partial is not None:
            _lanes_inside(sch, partial, width)
    if c % lanes == 0:
        _, inner = sch.split(col, [None, lanes])
        sch.vectorize(inner)


def _sum_width(c: int, lanes: int) -> int | None:
    """The lanes of a row's partial sums: the most (a power of two up to the target's) that divide C at least
    twice over; None where fewer than MIN_VECTOR would."""
    width = vector_width(c, lanes)
    while width and c < 2 * width:
        width = width // 2 if width > MIN_VECTOR else None
    return width


def _vector_sum(sch, block, width: int, rank: int):
    """rfactor of the row sum `block`'s lanes (`rank` lead dims: the row, or the batch and the row):
    partial[row..., lane] in a local buffer; returns its block."""
    k = sch.get_loops(block)[-1]
    _, lane = sch.split(k, [None, width])
    partial = sch.rfactor(lane, rank)
    sch.set_scope(partial, 0, "local")
    return partial


def _lanes_inside(sch, partial, width: int) -> None:
    """In the rfactor block, the lane loop inside the reduced one and vectorized; its init decomposed out."""
    loops = sch.get_loops(partial)
    lane = next(lp for lp in reversed(loops) if int(sch.get(lp).extent) == width)
    reduced = [lp for lp in loops[1:] if not lp.same_as(lane)]
    sch.reorder(*reduced, lane)
    sch.vectorize(lane)
    sch.decompose_reduction(partial, reduced[0])
