"""CPU schedule for attention: the (batch, head, query) rows in parallel; each row's scores, softmax and
probabilities are computed into row-sized buffers under the row loop (they stay in cache), then the row of
the output, its last axis vectorized when it fills whole vectors."""

from __future__ import annotations

from tvm_fusion.hardware import cpu_facts
from tvm_fusion.registry import register_schedule
from tvm_fusion.schedules.attention import ATTENTION_FAMILY


@register_schedule(ATTENTION_FAMILY, target="llvm")
def schedule_attention_llvm(sch, attrs, target):
    out = sch.get_sblock("out")
    n, m, i, f, rv = sch.get_loops(out)
    row = sch.fuse(n, m, i)
    sch.parallel(row)
    for name in ("probs", "row_sum", "exp", "row_max", "qk"):  # consumers first: each lands under the row
        sch.compute_at(sch.get_sblock(name), row)
    lanes = cpu_facts(target).float32_lanes
    if int(sch.get(f).extent) % lanes == 0:
        sch.reorder(rv, f)
        _, inner = sch.split(f, [None, lanes])
        sch.vectorize(inner)
        sch.decompose_reduction(out, rv)
