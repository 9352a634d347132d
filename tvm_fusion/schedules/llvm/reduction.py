"""CPU schedules for the reductions no rule took (ReduceMax / Min / Sum / Prod / Mean / L2 / LogSumExp, ArgMax /
ArgMin, a variance, a pool's or a conv's window sum): `one reduction nest  ==>  its outputs in parallel, in
vectors where the layout allows`.

TVM legalizes a reduction into one block of spatial loops then reduced loops and leaves it unscheduled on the
CPU: one output at a time, one scalar chain, one thread (a ReduceMax over a middle axis of 8 x 256 x 1024:
32 ms against onnxruntime's 1.8 ms). `reduction_plans` lists what fits a nest, best first; `apply_plan`
applies one (the fallback rule tries them in order on a copy of the schedule, `fallback.py`):

- `outputs:<w>`: the innermost spatial axis is contiguous in every access (a reduction over a middle axis, a
  conv's output row): `w` consecutive outputs as one vector, the reduced loops outside it. Each output is
  reduced in TVM's order: bit-identical to the unscheduled loop.
- `rows:<w>`: the innermost reduced axis is contiguous and whole vectors of `w` (a reduction over the last
  axis): `w` partial results per output in one vector (`rfactor`: element j goes to lane j % w), then
  combined across the lanes. Max, min, ArgMax and ArgMin give exactly TVM's results (the arg reducers break
  ties by the lower index); a sum or product is reassociated into `w` partial sums, as onnxruntime's
  vectorized reductions are (within the float tolerances of `tvm_fusion/check/numerics.py`). A row that is not
  whole vectors of at least MIN_VECTOR lanes is not taken (TVM's split would read past it).
- `chains:<c>`: `c` outputs' reductions interleaved (independent scalar chains, unrolled), each in TVM's
  order: bit-identical.
- `parallel`: the spatial loops above the innermost one in parallel, the rest TVM's loop (for LLVM to
  unroll and vectorize; what a short reduction gets, see SHORT_REDUCTION); `serial`: a reduction to one value
  (nothing to split without reassociating it).

Every plan runs the outputs in parallel when the nest does at least PARALLEL_ELEMENTS iterations. A kernel with
a vector plan is taken before the plane-sum rule (`LeftoverReduction`); the rest by the fallback rule, last.
TVM's dlight CPU `Reduction` rule (every block under the rows, scalar reductions) was slower than these plans on
the normalizations a fused build leaves (mean, subtract, variance over 768 / 4096 / 3136 features, one AVX-512
thread: 2.5 / 1.7 / 2.5 ms against 1.6 / 0.3 / 0.9 ms) and is not used; its `GEMV` matches what the dense and
batch_matmul rules take.
"""

from __future__ import annotations

import math

from tvm_fusion._tvm import called_ops

from .injective import PARALLEL_ELEMENTS, VECTOR_CALLS
from .loop_nest import Nest, contiguous, CpuRule

__all__ = ["CHAINS", "LeftoverReduction", "MIN_VECTOR", "SHORT_REDUCTION", "apply_plan", "parallel_outer", "reduction_plans",
           "vector_width"]

#: independent scalar chains of a reduction whose outputs are not vectors (see plane_sum.CHAINS)
CHAINS = 8
#: the fewest lanes a vector of outputs or of partial results may have
MIN_VECTOR = 4
#: a reduction of at most this many constant taps per output (a pool's window, a depthwise conv1d's kernel)
#: keeps TVM's loop below its parallel outer loops: LLVM unrolls the taps and vectorizes the output loop
#: itself (a 3-tap stride-2 max pool over 128 x 4000: 0.11 ms so, 1.4 ms as chains of 8 outputs)
SHORT_REDUCTION = 16


def vector_width(extent: int | None, lanes: int) -> int | None:
    """The most lanes (a power of two from `lanes` down to MIN_VECTOR) that divide `extent`."""
    width = lanes
    while extent is not None and width >= MIN_VECTOR:
        if extent % width == 0:
            return width
        width //= 2
    return None


def reduction_plans(nest: Nest, lanes: int) -> list[str]:
    """The plans that fit a reduction nest (spatial loops, then reduced loops), best first; [] when its loops
    are not in that order."""
    lead = nest.lead()
    inside = list(zip(nest.kinds[lead:], nest.extents[lead:]))
    if any(k == "O" or (k == "S" and e != 1) for k, e in inside):
        return []  # a spatial loop inside the reduced ones: not TVM's layout of a reduction
    if not lead:
        return _rows(nest, lanes) + ["serial"]
    plans = []
    inner = nest.innermost_spatial()
    vectors = called_ops(nest.stmt.body) <= VECTOR_CALLS
    if vectors and inner is not None and nest.iterator(inner) is not None and contiguous(nest, nest.iterator(inner)):
        width = vector_width(nest.extents[inner], lanes)
        plans += [f"outputs:{width}"] if width else []
    plans += _rows(nest, lanes) if vectors else []
    extent = nest.extents[inner] if inner is not None else None
    chains = max((c for c in range(2, CHAINS + 1) if extent and extent % c == 0), default=None)
    taps = nest.extents[lead:]
    short = None not in taps and math.prod(taps) <= SHORT_REDUCTION
    plans += [f"chains:{chains}"] if chains and not short else []
    return plans + ["parallel"]


def _rows(nest: Nest, lanes: int) -> list[str]:
    """`rows:<w>` when the innermost reduced loop's iterator is contiguous and whole vectors of w."""
    last = len(nest.loops) - 1
    var = nest.iterator(last)
    if nest.kinds[last] != "R" or var is None or not contiguous(nest, var):
        return []
    width = vector_width(nest.extents[last], lanes)
    while width and nest.extents[last] < 2 * width:  # at least two vectors a row
        width = width // 2 if width > MIN_VECTOR else None
    return [f"rows:{width}"] if width else []


def apply_plan(sch, block, plan: str) -> None:
    """Apply one of `reduction_plans` to the nest of `block` (raises where TVM refuses a step)."""
    if plan == "serial":
        return
    nest = Nest(sch, block)
    lead = nest.lead()
    spatial, reduced = nest.loops[:lead], nest.loops[lead:]
    work = nest.work()
    big = work is None or work >= PARALLEL_ELEMENTS
    if plan == "parallel":
        parallel_outer(sch, nest, big)
        return
    if plan.startswith("rows:"):
        outputs = (sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]) if spatial else None
        _rows_plan(sch, block, outputs, reduced, int(plan.split(":")[1]), big)
        return
    # outputs / chains: the innermost spatial loop split (no index arithmetic across the others), its lanes
    # moved inside the reduced loops; the loops above them fused and in parallel
    kind, width = plan.split(":")
    i = nest.innermost_spatial()
    outer, lane = sch.split(spatial[i], [None, int(width)])
    sch.reorder(*reduced, lane)
    if big:
        above = [*spatial[:i], outer]
        sch.parallel(sch.fuse(*above) if len(above) > 1 else outer)
    if kind == "outputs":
        sch.vectorize(lane)
    else:
        sch.unroll(lane)
    sch.decompose_reduction(block, reduced[0])


def parallel_outer(sch, nest: Nest, big: bool) -> None:
    """The leading spatial loops above the innermost one with more than one iteration fused and in parallel
    (when `big`); that loop and the ones inside it stay TVM's, for LLVM to unroll and vectorize."""
    inner = nest.innermost_spatial()
    above = nest.loops[:inner] if inner is not None else []
    if above and big:
        sch.parallel(sch.fuse(*above) if len(above) > 1 else above[0])


def _rows_plan(sch, block, outputs, reduced, width: int, big: bool) -> None:
    """rfactor the innermost reduced loop's lanes: partial[output, lane] in a local vector, then across."""
    rank = len(sch.get(block).writes[0].source.shape)
    ro, ri = sch.split(reduced[-1], [None, width])
    partial = sch.rfactor(ri, rank)  # partial[output..., lane]
    if outputs is not None:
        sch.compute_at(partial, outputs)
        if big:  # before the init is decomposed: then the nest is no longer compact dataflow
            sch.parallel(outputs)
    for i in range(len(sch.get(partial).writes)):
        sch.set_scope(partial, i, "local")
    _lanes_innermost(sch, partial, width)


def _lanes_innermost(sch, partial, width: int) -> None:
    """In the rfactor block, the lane loop (the spatial loop of extent `width` it was made from) moved inside
    the reduced loops and vectorized; the init decomposed out of them."""
    nest = Nest(sch, partial)
    lane = next(i for i in reversed(range(len(nest.loops))) if nest.kinds[i] == "S" and nest.extents[i] == width)
    reduced = [loop for loop, kind in zip(nest.loops, nest.kinds) if kind == "R"]
    sch.reorder(*reduced, nest.loops[lane])
    sch.vectorize(nest.loops[lane])
    sch.decompose_reduction(partial, reduced[0])


class LeftoverReduction(CpuRule):
    """A kernel whose reductions run in vectors (`outputs:` or `rows:` plans), scheduled as the fallback
    schedules it; placed before the plane-sum rule, whose chains of outputs keep TVM's order but leave a mean
    over long rows (768 features: 0.78 ms against onnxruntime's 0.10 ms) in scalars. Other kernels: None."""

    def schedule(self, func, target):
        from .fallback import schedule_function  # local: a cycle (fallback.py plans reductions with this module)

        sch, plans = schedule_function(func, target)
        vector = any(p.startswith(("outputs:", "rows:")) for p in plans.values())
        return sch if vector else None
