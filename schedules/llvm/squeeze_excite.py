"""CPU schedule for squeeze-excite: each stage parallel over its (sample, channel) rows, the last two
loops of the output (the gated feature map) fused and vectorized when they fill whole vectors."""

from __future__ import annotations

from tvm_fusion.hardware import cpu_facts
from tvm_fusion.registry import register_schedule
from tvm_fusion.schedules.squeeze_excite import SE_FAMILY


@register_schedule(SE_FAMILY, target="llvm")
def schedule_squeeze_excite_llvm(sch, attrs, target):
    for name in ("pool", "fc1", "hidden", "fc2", "gate"):
        block = sch.get_sblock(name)
        i, j = sch.get_loops(block)[:2]
        sch.parallel(sch.fuse(i, j))
    out = sch.get_sblock("out")
    i, j, y, z = sch.get_loops(out)
    sch.parallel(sch.fuse(i, j))
    pixels = sch.fuse(y, z)
    lanes = cpu_facts(target).float32_lanes
    if int(sch.get(pixels).extent) % lanes == 0:
        _, inner = sch.split(pixels, [None, lanes])
        sch.vectorize(inner)
