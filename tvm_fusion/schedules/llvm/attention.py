"""CPU schedule for attention: the (batch, head, query) rows in parallel; each row's scores, softmax and
probabilities are computed into row-sized buffers under the row loop (they stay in cache), then the row of
the output, its last axis vectorized when it fills whole vectors. A half kernel's `store` (the float32 row
rounded once) is the row loop's block, the float32 `out` row computed under it."""

from __future__ import annotations

from tvm_fusion.hardware import cpu_facts
from tvm_fusion.registry import register_schedule
from tvm_fusion.schedules.attention import ATTENTION_FAMILY, has_store


def _vectorize(sch, loop, lanes: int):
    if int(sch.get(loop).extent) % lanes == 0:
        _, inner = sch.split(loop, [None, lanes])
        sch.vectorize(inner)


@register_schedule(ATTENTION_FAMILY, target="llvm")
def schedule_attention_llvm(sch, attrs, target):
    out = sch.get_sblock("out")
    half = has_store(sch)
    last = sch.get_sblock("store") if half else out
    n, m, i, *_ = sch.get_loops(last)
    row = sch.fuse(n, m, i)
    sch.parallel(row)
    names = ("out",) * half + ("probs", "row_sum", "exp", "row_max", "qk")
    for name in names:  # consumers first: each lands under the row
        sch.compute_at(sch.get_sblock(name), row)
    lanes = cpu_facts(target).float32_lanes
    f, rv = sch.get_loops(out)[-2:]
    if int(sch.get(f).extent) % lanes == 0:
        sch.reorder(rv, f)
        _vectorize(sch, f, lanes)
        sch.decompose_reduction(out, rv)
    if half:
        _vectorize(sch, sch.get_loops(last)[-1], lanes)
