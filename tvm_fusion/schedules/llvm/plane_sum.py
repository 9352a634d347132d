"""CPU schedule for the plane sums no rule took (ReduceMean / GlobalAveragePool): `sum over the trailing axes
-> element-wise map  ==>  CHAINS output sums interleaved, each in TVM's order`.

TVM legalizes `R.mean(x, axis=[2, 3])` into a sum block over the trailing axes (`x_red`) and a division,
and leaves them unscheduled on the CPU: one output at a time, a single scalar add chain waiting on the add
latency. This rule (a dlight `ScheduleRule`, `pipeline.legalize_passes`) splits the outputs into groups of
CHAINS (fewer where CHAINS consecutive outputs would cross an axis boundary: each group must be a box of
the output, `group_size`) and moves the group's lanes inside the reduction: CHAINS independent add chains
per step, each output still summed in TVM's order (bit-identical to the unfused build); the map follows
each group.

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

from tvm_fusion._tvm import Schedule, tirx
from tvm_fusion.schedules.llvm.loop_nest import CpuRule
from tvm_fusion.schedules.llvm.pooling import PARALLEL_TAPS, _blocks

__all__ = ["CHAINS", "LeftoverPlaneSum", "PlaneSumMatch", "group_size", "match_plane_sum"]

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
    if not _maps_each_sum(reduce, after):
        return PlaneSumMatch(declined=f"`{after.name_hint}` after the sum is not an element-wise map of it "
                                      f"(one read of it at its own indices, over the sum's outputs)")
    spatial = [int(iv.dom.extent) for iv in reduce.iter_vars if iv.iter_type == _SPATIAL]
    chains = group_size(spatial)
    if chains == 1:
        return PlaneSumMatch(declined=f"outputs {spatial}: no run of 2..{CHAINS} consecutive outputs is a box")
    return PlaneSumMatch(reduce.name_hint, after.name_hint, chains)


def _maps_each_sum(reduce, after) -> bool:
    """The sum writes at its spatial indices in order; `after` iterates over the same outputs (same extents)
    and reads the sum, only it, at its own indices: then a group of the sum's outputs is the map's too."""
    spatial = [int(iv.dom.extent) for iv in reduce.iter_vars if iv.iter_type == _SPATIAL]
    written = [r.min for r in reduce.writes[0].region]
    if not (len(written) == len(spatial) and all(w.same_as(iv.var) for w, iv in zip(written, reduce.iter_vars))):
        return False
    if not (len(after.reads) == 1 and after.reads[0].source.same_as(reduce.writes[0].source)
            and all(iv.iter_type == _SPATIAL and isinstance(iv.dom.extent, tirx.IntImm) for iv in after.iter_vars)
            and [int(iv.dom.extent) for iv in after.iter_vars] == spatial):
        return False
    region = after.reads[0].region
    return len(region) == len(after.iter_vars) and all(
        r.min.same_as(iv.var) and isinstance(r.extent, tirx.IntImm) and r.extent.value == 1
        for r, iv in zip(region, after.iter_vars))


def group_size(extents: list[int]) -> int:
    """The most outputs (at most CHAINS) per group such that every group, CHAINS consecutive outputs in
    row-major order, is a box of the output: `inner * t` with `inner` the product of the trailing extents
    below some axis and `t` dividing that axis' extent (1 if none). A group straddling an axis boundary
    (8 of 2 x 3 x 4 outputs: rows (0, 2, :) and (1, 0, :)) is not a box: the map computed at the group
    would cover the bounding box, rewriting other groups' outputs from sums this group never made."""
    def boxed(d: int) -> bool:
        inner = 1
        for extent in reversed(extents):
            if d % inner == 0 and extent % (d // inner) == 0:
                return True
            inner *= extent
        return False
    return max(d for d in range(1, CHAINS + 1) if boxed(d))


class LeftoverPlaneSum(CpuRule):
    """CHAINS outputs' sums interleaved (each in TVM's order), groups in parallel, the map after each group."""

    def schedule(self, func, target):
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
        divide = sch.get_sblock(match.divide)
        sch.reverse_compute_at(divide, group)
        if not _covers_group(sch, divide, group, match.chains):
            return None  # the map would rewrite other groups' outputs (see group_size)
        sch.unroll(lane)  # before decompose_reduction (afterwards: "not compact dataflow")
        sch.decompose_reduction(reduce, reduced[0])
        return sch


def _covers_group(sch, block, group, chains: int) -> bool:
    """The map's loops under `group` run exactly `chains` constant iterations: its group's outputs only.
    Only the group's loop uses the sum buffer, so TVM compacts it to one group's region with indices relative
    to the group: a map over a bounding box larger than the group reads slots this group never wrote."""
    loops = [sch.get(loop) for loop in sch.get_loops(block)]
    outer = [loop.same_as(sch.get(group)) for loop in loops]
    if True not in outer:
        return False
    extents = [loop.extent for loop in loops[outer.index(True) + 1:]]
    if not all(isinstance(e, tirx.IntImm) for e in extents):
        return False
    count = 1
    for extent in extents:
        count *= extent.value
    return count == chains
