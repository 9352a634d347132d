"""CPU schedule for the plane sums no rule took (ReduceMean / GlobalAveragePool): `sum over the trailing axes
-> element-wise map  ==>  CHAINS output sums interleaved, each in TVM's order`.

TVM legalizes `R.mean(x, axis=[2, 3])` into a sum block over the trailing axes (`x_red`) and a division,
and leaves them unscheduled on the CPU: one output at a time, a single scalar add chain waiting on the add
latency. This rule (a dlight `ScheduleRule`, `pipeline.legalize_passes`) splits the outputs into groups of
CHAINS and moves the group's lanes inside the reduction: CHAINS independent add chains per step, each
output still summed in TVM's order (bit-identical to the unfused build); the map follows each group.

    parallel for group of CHAINS outputs (one thread when small, pooling.PARALLEL_TAPS):
        acc[CHAINS] = 0
        for the reduced axes (TVM's order):
            acc[i] += x[group's output i, reduced index]     # CHAINS scalar chains, unrolled
        out[group] = map(acc)                                 # the division by the count

Measured on Zen 2 (AVX2, one thread, CPU time, the kernel alone): SqueezeNet's mean over 1000 x 13 x 13
0.080 -> 0.039 ms (onnxruntime's GlobalAveragePool 0.033 ms); the same groups vectorized across the outputs
(stride-169 gathers) 0.061 ms.
"""

from __future__ import annotations

from typing import NamedTuple

from tvm_fusion._tvm import Schedule, dlight, tirx
from tvm_fusion.schedules.llvm.pooling import PARALLEL_TAPS, _blocks

__all__ = ["CHAINS", "LeftoverPlaneSum", "PlaneSumMatch", "match_plane_sum"]

#: independent scalar add chains per step: 2 FP add pipes x ~3-4 cycles of latency (Zen 2, Haswell and later)
CHAINS = 8
_SPATIAL, _REDUCE = tirx.IterVar.DataPar, tirx.IterVar.CommReduce


class PlaneSumMatch(NamedTuple):
    """The sum block and its element-wise map (names), the outputs per group, or why not."""

    reduce: str = ""
    divide: str = ""
    chains: int = 0
    declined: str = ""


def _reads_trailing_axes(reduce) -> bool:
    """The sum reads `x[spatial vars..., reduce vars...]`: the reduced axes are x's last ones, in order."""
    index = [r.min for r in reduce.reads[0].region]
    reduced = [iv.var for iv in reduce.iter_vars if iv.iter_type == _REDUCE]
    spatial = [iv.var for iv in reduce.iter_vars if iv.iter_type == _SPATIAL]
    if not all(isinstance(i, tirx.Var) for i in index) or len(index) < len(reduced):
        return False
    lead, tail = index[:len(index) - len(reduced)], index[len(index) - len(reduced):]
    return all(a.same_as(b) for a, b in zip(tail, reduced)) and all(any(i.same_as(s) for s in spatial) for i in lead)


def match_plane_sum(func) -> PlaneSumMatch:
    """`sum (init 0) over x's trailing axes -> element-wise map of it`, or PlaneSumMatch(declined=why)."""
    blocks = _blocks(func)
    if blocks is None or len(blocks) != 2:
        return PlaneSumMatch(declined="not two blocks (a sum, then a map) over perfect loop nests")
    reduce, after = blocks
    kinds = [iv.iter_type for iv in reduce.iter_vars]
    if _REDUCE not in kinds or kinds != sorted(kinds, key=lambda k: k == _REDUCE) or len(reduce.reads) != 1:
        return PlaneSumMatch(declined=f"`{reduce.name_hint}` is not spatial axes then reduced axes of one tensor")
    extents = [iv.dom.extent for iv in reduce.iter_vars]
    if not all(isinstance(e, tirx.IntImm) for e in extents):
        return PlaneSumMatch(declined=f"symbolic extents {extents}")
    store = reduce.body
    if not (isinstance(store, tirx.BufferStore) and isinstance(store.value, tirx.Add) and reduce.init is not None
            and isinstance(reduce.init.value, tirx.FloatImm) and reduce.init.value.value == 0):
        return PlaneSumMatch(declined=f"`{reduce.name_hint}` is not a sum from 0: {store}")
    if not _reads_trailing_axes(reduce):
        return PlaneSumMatch(declined=f"`{reduce.name_hint}` does not reduce x's trailing axes: {reduce.reads[0]}")
    if not (len(after.reads) == 1 and after.reads[0].source.same_as(reduce.writes[0].source)
            and all(iv.iter_type == _SPATIAL for iv in after.iter_vars)):
        return PlaneSumMatch(declined=f"`{after.name_hint}` after the sum is not an element-wise map of it")
    outputs = 1
    for iv in reduce.iter_vars:
        outputs *= int(iv.dom.extent) if iv.iter_type == _SPATIAL else 1
    chains = max(d for d in range(1, CHAINS + 1) if outputs % d == 0)
    if chains == 1:
        return PlaneSumMatch(declined=f"{outputs} outputs: no group of 2..{CHAINS} divides them")
    return PlaneSumMatch(reduce.name_hint, after.name_hint, chains)


class LeftoverPlaneSum(dlight.ScheduleRule):
    """CHAINS outputs' sums interleaved (each in TVM's order), groups in parallel, the map after each group."""

    def apply(self, func, target, tunable):
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        match = match_plane_sum(func)
        if match.declined:
            return None
        sch = Schedule(func)
        reduce = sch.get_sblock(match.reduce)
        loops = sch.get_loops(reduce)
        kinds = [iv.iter_type for iv in sch.get(reduce).iter_vars]
        spatial = [loop for loop, kind in zip(loops, kinds) if kind == _SPATIAL]
        reduced = [loop for loop, kind in zip(loops, kinds) if kind == _REDUCE]
        taps = 1
        for loop in loops:
            taps *= int(sch.get(loop).extent)
        group, lane = sch.split(sch.fuse(*spatial), [None, match.chains])
        sch.reorder(group, *reduced, lane)
        if taps >= PARALLEL_TAPS:
            sch.parallel(group)
        sch.set_scope(reduce, 0, "local")
        sch.reverse_compute_at(sch.get_sblock(match.divide), group)
        sch.unroll(lane)  # before decompose_reduction (afterwards: "not compact dataflow")
        sch.decompose_reduction(reduce, reduced[0])
        return sch
