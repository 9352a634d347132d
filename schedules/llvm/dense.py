"""CPU schedule for dense + epilogue: parallel over output-column blocks, vectorized columns."""

from __future__ import annotations

from tvm_fusion.registry import register_schedule
from tvm_fusion.schedules.dense import DENSE_RULES

VECTOR = 16


@register_schedule(*DENSE_RULES, target="llvm")
def schedule_dense_llvm(sch, attrs, target):
    dense = sch.get_sblock("dense")
    epi = sch.get_sblock("epilogue")
    i, j, k = sch.get_loops(dense)
    n = int(sch.get(j).extent)
    vec = VECTOR if n % VECTOR == 0 else 1
    jo, ji = sch.split(j, [None, vec])
    sch.reorder(jo, i, k, ji)
    sch.parallel(jo)
    sch.reverse_compute_at(epi, jo)
    if vec > 1:
        sch.vectorize(ji)
    sch.decompose_reduction(dense, k)
