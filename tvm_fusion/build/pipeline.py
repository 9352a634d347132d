"""Named, flat pass lists per build mode and target kind.

    unfused : legalize every op to its own PrimFunc; no FuseOps/FuseTIR (each Relax op one kernel)
    tvm     : TVM's default pipeline for the target (its own automatic FuseOps/FuseTIR)
    fused   : our fuse stage (fuse.py) first, then TVM's default pipeline for whatever is left (plus the
              target's schedule for leftover copies and elementwise maps, LEFTOVER_SCHEDULES)

The `legalize` stage is run by build.py before counting kernels; `lower` is handed to tvm.compile.
"""

from __future__ import annotations

from tvm_fusion._tvm import BACKEND_PIPELINES, dlight, tvm
from tvm_fusion.frontend import recurrent_kernel
from tvm_fusion.errors import FusionError
from tvm_fusion.precision import half_sums_in_float32

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


def _llvm_leftovers():
    """The fused build's CPU kernels that no rule took and TVM leaves unscheduled: copies and elementwise
    maps vectorized (`schedules/llvm/injective.py`), transposed convolutions (`schedules/llvm/conv_transpose.py`),
    softmax / log_softmax rows (`schedules/llvm/softmax.py`), 2-D max / average pools (`schedules/llvm/pooling.py`),
    reductions that run in vectors (`schedules/llvm/reduction.py`), means over trailing axes
(`schedules/llvm/plane_sum.py`); then every other kernel: parallel outer loops, a
vector (or chains) of outputs, reductions in TVM's order (`schedules/llvm/fallback.py`)."""
    from tvm_fusion.schedules.llvm.conv_transpose import LeftoverConvTranspose
    from tvm_fusion.schedules.llvm.fallback import LeftoverFallback
    from tvm_fusion.schedules.llvm.injective import LeftoverInjective
    from tvm_fusion.schedules.llvm.plane_sum import LeftoverPlaneSum
    from tvm_fusion.schedules.llvm.pooling import LeftoverPool
    from tvm_fusion.schedules.llvm.reduction import LeftoverReduction
    from tvm_fusion.schedules.llvm.softmax import LeftoverSoftmax

    return dlight.ApplyDefaultSchedule(LeftoverInjective(), LeftoverConvTranspose(), LeftoverSoftmax(), LeftoverPool(),
                                     LeftoverReduction(), LeftoverPlaneSum(), LeftoverFallback())


#: target kind -> passes (made on use) scheduling what the fused build left to TVM's default lowering
LEFTOVER_SCHEDULES = {"llvm": [_llvm_leftovers]}


def lower_passes(target) -> list:
    backend = _backend(target)
    return backend.dataflow_lower_passes(target) + backend.finalize_passes(target)


def sequential(passes: list, name: str):
    return tvm.transform.Sequential(passes, name=name)
