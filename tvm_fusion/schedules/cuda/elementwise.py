"""CUDA schedule for an elementwise chain: every stage inlined into the last, one thread per element."""

from __future__ import annotations

from tvm_fusion.registry import register_schedule
from tvm_fusion.schedules.elementwise import ELEMENTWISE_FAMILY, inline_into_last

THREADS = 256  # threads per block: a multiple of the warp, enough to hide memory latency


@register_schedule(ELEMENTWISE_FAMILY, target="cuda")
def schedule_elementwise_cuda(sch, attrs, target):
    last = inline_into_last(sch)
    loops = sch.get_loops(last) or [sch.add_unit_loop(last)]  # a 0-d output has no loop
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    bx, tx = sch.split(fused, [None, THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
