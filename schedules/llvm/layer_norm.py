"""CPU schedule for LayerNorm: rows in parallel, both reductions and the output of a row computed
together (the row stays in cache), the output vectorized."""

from __future__ import annotations

from tvm_fusion.hardware import cpu_facts
from tvm_fusion.registry import register_schedule
from tvm_fusion.schedules.layer_norm import LAYER_NORM_FAMILY


@register_schedule(LAYER_NORM_FAMILY, target="llvm")
def schedule_layer_norm_llvm(sch, attrs, target):
    out = sch.get_sblock("out")
    *lead, col = sch.get_loops(out)  # [N, rows, C] with a symbolic batch: one parallel loop over N * rows
    row = sch.fuse(*lead) if len(lead) > 1 else lead[0]
    sch.parallel(row)
    sch.compute_at(sch.get_sblock("var"), row)
    sch.compute_at(sch.get_sblock("mean"), row)
    lanes = cpu_facts(target).float32_lanes
    if int(sch.get(col).extent) % lanes == 0:
        _, inner = sch.split(col, [None, lanes])
        sch.vectorize(inner)
