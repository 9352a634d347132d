"""CPU schedule for an elementwise chain: every stage inlined into the last, loops fused, parallel outer
part, vectorized inner part."""

from __future__ import annotations

from tvm_fusion._tvm import tirx
from tvm_fusion.hardware import cpu_facts
from tvm_fusion.registry import register_schedule
from tvm_fusion.schedules.elementwise import ELEMENTWISE_FAMILY

MIN_PARALLEL = 4096  # elements below which threading costs more than it saves


def inline_into_last(sch):
    """Inline every stage into the output stage; return the output block."""
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    for block in blocks[:-1]:
        sch.compute_inline(block)
    return blocks[-1]


@register_schedule(ELEMENTWISE_FAMILY, target="llvm")
def schedule_elementwise_llvm(sch, attrs, target):
    last = inline_into_last(sch)
    loops = sch.get_loops(last) or [sch.add_unit_loop(last)]  # a 0-d output has no loop
    batch = None
    if not isinstance(sch.get(loops[0]).extent, tirx.IntImm):  # a symbolic batch: its own parallel loop
        batch, loops = loops[0], loops[1:] or [sch.add_unit_loop(last)]
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    extent = int(sch.get(fused).extent)
    lanes = cpu_facts(target).float32_lanes
    outer = fused
    if extent >= lanes:
        outer, inner = sch.split(fused, [None, lanes])
        sch.vectorize(inner)
    if batch is not None:
        sch.parallel(sch.fuse(batch, outer))  # the batch and the static outer part, as one parallel loop
    elif extent >= lanes and extent >= MIN_PARALLEL:
        sch.parallel(outer)
