"""CPU schedule for every leftover kernel the other leftover rules did not take (the last rule of
`pipeline.LEFTOVER_SCHEDULES`): `any PrimFunc  ==>  each loop nest with its outer spatial loops in parallel and
a spatial loop in vectors, reductions as `reduction.py` plans them`.

TVM's CPU pipeline compiles a PrimFunc no schedule touched as its bare loop nest: one scalar element at a
time, on one thread (a conv3d, an ArgMax, a gather, quantize / dequantize chains: 10-100x slower than
scheduled). This rule takes any function, one loop nest (a block under the root) at a time:

- producers that only map elements are inlined into their consumers (`compute_inline`; into a reduction only
  an element-wise producer, read once per reduced element: a padding copy stays its own loop nest). A
  consumer is never inlined into a reduction (an init inlined into gave a residual added twice).
- a nest of spatial loops only: the injective schedule's loop nest (`injective.schedule_loop_nest`: trailing
  loops fused to whole vectors, outer loops in parallel when large); a padding copy (a masked load:
  `if_then_else`) or symbolic extents: the loops above the innermost in parallel, the innermost TVM's loop,
  which LLVM vectorizes itself (a max pool's padding, 128 x 4002: 1.6 ms in vectors of the injective
  schedule, under 0.1 ms so);
- a reduction: the first of `reduction.reduction_plans` that TVM takes (a vector of outputs, vector rows,
  chains of outputs, parallel outputs);
- several outputs of spatial nests with nothing to inline (a split alone) are kept as TVM's plain loops (as the
  injective schedule measured);
- a nest TVM writes as its own loops (TOPI's sort, top-k, cumsum, scatter: a block without iterators, with
  its own loops, parallel ones or a library call) is kept as TVM wrote it.

Each nest is scheduled on a copy of the schedule, plan after plan, and the copy is kept only when every step
of the plan succeeds. A function with a nest that no plan takes is declined (None): it stays unscheduled,
and the build names it (`build.Built.unscheduled`).
"""

from __future__ import annotations

import math

from tvm_fusion._tvm import SBlockRealize, Schedule, called_ops
from tvm_fusion.hardware import cpu_facts

from .injective import PARALLEL_ELEMENTS, schedule_loop_nest, wraps
from .loop_nest import Nest, CpuRule, elementwise
from .reduction import apply_plan, parallel_outer, reduction_plans

__all__ = ["LeftoverFallback", "nest_plans", "schedule_function"]


def nest_plans(sch, block, lanes: int) -> list[str]:
    """The plans to try for one nest, best first: 'kept' (TVM's own loops), 'spatial' / 'parallel' (no
    reduction), or `reduction.reduction_plans`; [] when none fits."""
    nest = Nest(sch, block)
    if nest.opaque or not nest.loops:  # TVM's own loops, or one element (a scalar index computation)
        return ["kept"]
    if nest.realize is None or "O" in nest.kinds:
        return []
    if not nest.reduces:
        masked = "if_then_else" in called_ops(nest.stmt.body)  # a padding copy: its loads run lane by lane
        return ["parallel"] if masked else ["spatial", "parallel"]
    return reduction_plans(nest, lanes)


def _apply(sch, block, plan: str, lanes: int) -> None:
    if plan == "kept":
        return
    if plan == "spatial":
        if not schedule_loop_nest(sch, block, lanes):
            raise ValueError("symbolic extents: not the injective loop nest")
        return
    nest = Nest(sch, block)
    if not nest.reduces:  # "parallel": the loops above the innermost, which stays TVM's loop for LLVM
        work = nest.work()
        parallel_outer(sch, nest, work is None or work >= PARALLEL_ELEMENTS)
        _split_at_wrap(sch, nest)
        return
    apply_plan(sch, block, plan)


def _split_at_wrap(sch, nest: Nest) -> None:
    """A nest that picks a value per element (`injective.wraps`) through a floordiv / floormod of its
    innermost loop: that loop split at the period, so the loop LLVM vectorizes indexes
    affinely (injective.in_vectors: LLVM's vectorizer miscompiled a wrapping one)."""
    inner = nest.innermost_spatial()
    if inner is None:
        return
    extent = nest.extents[inner]
    divisors = {c for c in wraps(sch, nest.block, nest.loops[inner]) if extent is None or c < extent}
    if divisors:
        period = math.gcd(*divisors)
        sch.split(nest.loops[inner], [None, period if period > 1 else min(divisors)])


def _inline_producers(sch) -> None:
    """compute_inline every spatial producer whose consumers are all spatial, or that is element-wise."""
    changed = True
    while changed:
        changed = False
        for block in sch.get_child_blocks(sch.get_sblock("root")):
            nest = Nest(sch, block)
            if nest.opaque or nest.reduces or nest.realize is None:
                continue
            consumers = [Nest(sch, c) for c in sch.get_consumers(block)]
            if not consumers or any(c.opaque for c in consumers):
                continue
            if any(c.reduces for c in consumers) and not elementwise(nest):
                continue
            try:
                sch.compute_inline(block)
            except Exception:  # noqa: BLE001 (TVM's schedule errors: the producer stays its own nest)
                continue
            changed = True
            break


class LeftoverFallback(CpuRule):
    """Every nest: parallel outer spatial loops, vectors of elements or outputs, reductions as planned."""

    def schedule(self, func, target):
        return schedule_function(func, target)[0]


def schedule_function(func, target) -> tuple[Schedule | None, dict[str, str]]:
    """(the schedule, {nest: the plan it took}); (None, {..., the nest no plan takes: ''}) when declined."""
    if _written_by_tvm(func):
        return Schedule(func), {func.body.block.name_hint: "kept"}
    if any(str(getattr(b, "dtype", "")) == "bfloat16" for b in func.params):
        # TVM 0.27's llvm bfloat16 lowering refuses vector stores of another width than its own (`dtype
        # mismatch on BufferStore: ... uint16 ... bfloat16x4`, an einsum 'bij,bjk->bik'): its plain loops
        return Schedule(func), {"bfloat16": "kept"}
    try:
        sch = Schedule(func)
        root = sch.get_sblock("root")
    except Exception:  # noqa: BLE001 (not a block function)
        return None, {}
    lanes = cpu_facts(target).float32_lanes
    before = len(sch.get_child_blocks(root))
    try:
        _inline_producers(sch)
        nests = [Nest(sch, b) for b in sch.get_child_blocks(root)]
    except Exception:  # noqa: BLE001 (a structure the analysis does not know: the kernel stays unscheduled, named)
        return None, {}
    if len(nests) == before > 1 and not any(n.reduces or n.opaque for n in nests):
        # several outputs, nothing inlined (a split alone): TVM's plain loops, which LLVM vectorizes as
        # whole-plane copies (injective.py measured them faster than scheduled rows)
        return Schedule(func), {n.stmt.name_hint: "kept" for n in nests}
    taken = {}
    for name in [sch.get(b).name_hint for b in sch.get_child_blocks(root)]:
        sch, taken[name] = _schedule_nest(sch, name, lanes)
        if sch is None:
            return None, taken
    return sch, taken


def _written_by_tvm(func) -> bool:
    """The function body is one block without iterators (no root block): TOPI's own loops (ir_builder)."""
    body = func.body
    return isinstance(body, SBlockRealize) and not body.block.iter_vars and body.block.name_hint != "root"


def _schedule_nest(sch, name: str, lanes: int) -> tuple[Schedule | None, str]:
    """(the schedule with the first plan for the nest `name` that TVM accepts, made on a copy, and the plan);
    (None, '') if none does."""
    try:
        plans = nest_plans(sch, sch.get_sblock(name), lanes)
    except Exception:  # noqa: BLE001 (blocks of the same name: not a function TVM's lowering writes)
        return None, ""
    for plan in plans:
        trial = sch.copy()
        try:
            _apply(trial, trial.get_sblock(name), plan, lanes)
        except Exception:  # noqa: BLE001 (a schedule error: try the next plan)
            continue
        return trial, plan
    return None, ""
