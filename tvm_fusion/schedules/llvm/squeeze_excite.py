"""CPU schedule for squeeze-excite: each stage parallel over its (sample, channel) rows, the last two
loops of the output (the gated feature map) fused and vectorized when they fill whole vectors. The sums
(the pool over the pixels, the two small FCs) run as `lanes` partial sums in one vector (rfactor) when
their length is a multiple of it: one scalar add chain per channel otherwise (EfficientNet's SE of 96
channels x 8 x 8 on AVX2: 8.5 us that way)."""

from __future__ import annotations

from tvm_fusion.hardware import cpu_facts
from tvm_fusion.registry import register_schedule
from tvm_fusion.schedules.squeeze_excite import SE_FAMILY


def _sum_in_vector(sch, block, lanes: int):
    """The block's reduction loops (after its two spatial ones) fused and summed as `lanes` partial sums
    in one vector, then those added up; left as it is when the length is not a multiple of `lanes`."""
    reduction = sch.get_loops(block)[1:]
    k = sch.fuse(*reduction) if len(reduction) > 1 else reduction[0]
    if int(sch.get(k).extent) % lanes or int(sch.get(k).extent) == lanes:
        return
    _, inner = sch.split(k, [None, lanes])
    partial = sch.rfactor(inner, 0)
    row, *_, vector = sch.get_loops(partial)
    sch.vectorize(vector)
    sch.reverse_compute_at(block, row)  # the partial sums added up in the same task


@register_schedule(SE_FAMILY, target="llvm")
def schedule_squeeze_excite_llvm(sch, attrs, target):
    lanes = cpu_facts(target).float32_lanes
    for name in ("pool", "fc1", "hidden", "fc2", "gate"):
        block = sch.get_sblock(name)
        i, j = sch.get_loops(block)[:2]
        sch.parallel(sch.fuse(i, j))
        if name in ("pool", "fc1", "fc2"):
            _sum_in_vector(sch, block, lanes)
    out = sch.get_sblock("out")
    i, j, y, z = sch.get_loops(out)
    sch.parallel(sch.fuse(i, j))
    pixels = sch.fuse(y, z)
    if int(sch.get(pixels).extent) % lanes == 0:
        _, inner = sch.split(pixels, [None, lanes])
        sch.vectorize(inner)
