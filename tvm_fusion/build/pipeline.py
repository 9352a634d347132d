"""Named, flat pass lists per build mode and target kind.

    unfused : legalize every op to its own PrimFunc; no FuseOps/FuseTIR (each Relax op one kernel)
    tvm     : TVM's default pipeline for the target (its own automatic FuseOps/FuseTIR)
    fused   : our fuse stage (fuse.py) first, then TVM's default pipeline for whatever is left (plus the
              target's schedule for leftover copies and elementwise maps, LEFTOVER_SCHEDULES)

The `legalize` stage is run by builder.py (build.legalize) before counting kernels; `lower` is handed to tvm.compile.
"""

from __future__ import annotations

from tvm_fusion._tvm import BACKEND_PIPELINES, dlight, tvm
from tvm_fusion.frontend import recurrent_kernel
from tvm_fusion.errors import FusionError
from tvm_fusion.precision import half_sums_in_float32
from tvm_fusion.schedules.llvm.leftovers import leftover_schedule

__all__ = ["MODES", "legalize_passes", "lower_passes"]

MODES = ("unfused", "tvm", "fused")
_AUTO_FUSION = ("FuseOps", "FuseTIR")


def _backend(target):
    kind = target.kind.name
    if kind not in BACKEND_PIPELINES:
        raise FusionError(f"target kind {kind!r} is not supported; use one of {sorted(BACKEND_PIPELINES)}")
    return BACKEND_PIPELINES[kind]


class GuardedRule(dlight.ScheduleRule):
    """A dlight rule that declines a PrimFunc it raises on, so the next rule of its list takes it (on CUDA
    the last is dlight's Fallback). TVM 0.27's CUDA GEMV rule raises an AttributeError on a depthwise conv1d
    (an FSMN memory block); without this, one op stops the whole build."""

    def __init__(self, rule):
        self.rule = rule

    def apply(self, func, target, tunable):
        try:
            return self.rule.apply(func, target, tunable)
        except Exception:  # noqa: BLE001  (a rule's crash means "not mine"; the next rule schedules it)
            return None


def _guarded(passes: list) -> list:
    """Every dlight ApplyDefaultSchedule of a backend's list with its rules guarded (GuardedRule)."""
    return [dlight.ApplyDefaultSchedule(*[GuardedRule(r) for r in p.rules])
            if p.info.name == "ApplyDefaultSchedule" and hasattr(p, "rules") else p for p in passes]


def legalize_passes(mode: str, target) -> list:
    """Recurrence kernels in the target's form, half conv / matmul summed in float32, library dispatch
    + legalization (+ TVM's fusion unless unfused)
    + the target's default schedules (each rule guarded: GuardedRule)."""
    if mode not in MODES:
        raise FusionError(f"unknown build mode {mode!r}; use one of {', '.join(MODES)}")
    backend = _backend(target)
    passes = ([recurrent_kernel.for_target(target), half_sums_in_float32()] + backend.library_dispatch_passes(target)
              + _guarded(backend.legalize_passes(target)))
    if mode == "unfused":
        passes = [p for p in passes if p.info.name not in _AUTO_FUSION]
    if mode == "fused":
        passes += [fn() for fn in LEFTOVER_SCHEDULES.get(target.kind.name, ())]
    return passes


#: target kind -> passes (made on use) scheduling what the fused build left to TVM's default lowering
LEFTOVER_SCHEDULES = {"llvm": [leftover_schedule]}


def lower_passes(target) -> list:
    backend = _backend(target)
    return backend.dataflow_lower_passes(target) + backend.finalize_passes(target)


def sequential(passes: list, name: str):
    return tvm.transform.Sequential(passes, name=name)
