"""CPU schedule for an elementwise chain: every stage inlined into the last; the trailing loops along which
every operand is read the same way (all dense, or broadcast) fused and vectorized; the loops outside them
fused into one parallel loop.

A per-channel operand (BatchNorm's scale [1, C, 1, 1] on an NCHW tensor) is broadcast along H and W but not
along C: fusing C into the vector loop would gather it lane by lane (and, where H*W is not a whole number of
vectors, recompute its index per lane). So the vector loop stops at the first axis where some operand
changes from dense to broadcast; that loop's run is vectorized when it holds whole vectors and otherwise left
to LLVM's loop vectorizer (which peels the remainder). Same-shape chains fuse every loop, as before.
"""

from __future__ import annotations

import math

from tvm_fusion._tvm import tirx
from tvm_fusion.hardware import cpu_facts
from tvm_fusion.registry import register_schedule
from tvm_fusion.schedules.elementwise import ELEMENTWISE_FAMILY, inline_into_last

MIN_PARALLEL = 4096  # elements below which threading costs more than it saves


def read_axes(sch, block) -> list[frozenset[int]]:
    """Per buffer the block reads: the block axes its indices use (the axes it is not broadcast along)."""
    stmt = sch.get(block)
    axes = [iv.var for iv in stmt.iter_vars]
    used = []
    for read in stmt.reads:
        free = [v for r in read.region for v in tirx.analysis.undefined_vars(r.min)]
        used.append(frozenset(i for i, axis in enumerate(axes) if any(v.same_as(axis) for v in free)))
    return used


def vector_run_start(extents: list[int], reads: list[frozenset[int]]) -> int:
    """First axis of the trailing run along which every read is uniformly dense or broadcast.

    Axes of extent 1 join any run. Loop i joins the run that starts at j > i when every read uses i iff it
    uses j's axes (the fused index stays contiguous or constant for each operand)."""
    start = len(extents) - 1
    while start > 0 and extents[start] == 1:
        start -= 1
    kind = [start in used for used in reads]
    while start > 0:
        below = start - 1
        if extents[below] != 1 and [below in used for used in reads] != kind:
            break
        start = below
    return start


@register_schedule(ELEMENTWISE_FAMILY, target="llvm")
def schedule_elementwise_llvm(sch, attrs, target):
    last = inline_into_last(sch)
    loops = sch.get_loops(last) or [sch.add_unit_loop(last)]  # a 0-d output has no loop
    batch = None
    if not isinstance(sch.get(loops[0]).extent, tirx.IntImm):  # a symbolic batch: its own parallel loop
        batch, loops = loops[0], loops[1:] or [sch.add_unit_loop(last)]
    extents = [int(sch.get(loop).extent) for loop in loops]
    axes = read_axes(sch, last)
    if batch is not None:  # axes of the static loops only
        axes = [frozenset(a - 1 for a in used if a) for used in axes]
    start = vector_run_start(extents, axes)
    lanes = cpu_facts(target).float32_lanes
    if start == 0:  # one run: every loop fused, split by whole vectors (a predicated tail)
        fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        extent = int(sch.get(fused).extent)
        outer = fused
        if extent >= lanes:
            outer, inner = sch.split(fused, [None, lanes])
            sch.vectorize(inner)
        if batch is not None:
            sch.parallel(sch.fuse(batch, outer))  # the batch and the static outer part, as one parallel loop
        elif extent >= lanes and extent >= MIN_PARALLEL:
            sch.parallel(outer)
        return
    run = sch.fuse(*loops[start:]) if start < len(loops) - 1 else loops[start]
    if int(sch.get(run).extent) % lanes == 0:
        sch.vectorize(sch.split(run, [None, lanes])[1])
    outer = ([batch] if batch is not None else []) + loops[:start]
    if batch is not None or math.prod(extents) >= MIN_PARALLEL:
        sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])

