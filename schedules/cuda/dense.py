"""CUDA schedule for dense + epilogue (`dense` -> `epilogue`, x[M, K] @ W[K, N] + b[N]): TVM's dlight GPU rules.

The rules are tried in dlight's default order and the first that takes the function wins, as in TVM's own
CUDA pipeline (so the fused kernel is scheduled at least as well as the unfused matmul would be):

    Matmul           M large enough to tile: shared-memory tiles of x and W, register accumulators
    GEMV, Reduction  M == 1 (ResNet's classifier): one output column per thread, K split across threads
                     and combined by a cross-thread reduction
    GeneralReduction, Fallback   anything else

The epilogue (bias + activation) is computed from the accumulators by every rule. The winning rule
schedules its own copy of the function; its trace is replayed on the schedule we are given.

Half inputs take the same CUDA-core schedules (float32 accumulators). dlight's Matmul would tensorize a
float16 matmul with M, N, K > 64 onto wmma, but `Schedule.tensorize` segfaults in apache-tvm 0.27.0.post1
(inside tvm::s_tir::Tensorize -> ffi::ToJSONGraph, for any tensor intrinsic, even a 4-lane add), which
would kill the process: the function is marked `dlight.do_not_tensorize` so that path is never taken.
"""

from __future__ import annotations

from tvm_fusion._tvm import dlight
from tvm_fusion.errors import FusionError
from tvm_fusion.registry import register_schedule
from tvm_fusion.schedules.dense import DENSE_FAMILY

SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")  # half: float32 accumulators
NO_TENSORIZE = "dlight.do_not_tensorize"  # see the module docstring

#: dlight's default GPU rule order (tvm.relax.backend.cuda pipeline)
RULES = (
    dlight.gpu.Matmul,
    dlight.gpu.GEMV,
    dlight.gpu.Reduction,
    dlight.gpu.GeneralReduction,
    dlight.gpu.Fallback,
)


def supports(attrs: dict, shapes, target) -> str | None:
    x_shape, w_shape = shapes[0], shapes[-2]
    if len(x_shape) != 2 or len(w_shape) != 2:
        return f"dense operands have ranks {len(x_shape)} and {len(w_shape)}; the CUDA schedule takes 2-D x and W"
    return None


@register_schedule(DENSE_FAMILY, target="cuda", supports=supports)
def schedule_dense_cuda(sch, attrs, target):
    func = sch.mod["main"].with_attr(NO_TENSORIZE, True)
    for rule in RULES:
        scheduled = rule().apply(func, target, False)
        if isinstance(scheduled, list):
            scheduled = scheduled[0] if scheduled else None
        if scheduled is not None:
            scheduled.trace.apply_to_schedule(sch, remove_postproc=False)
            return
    raise FusionError(f"no dlight GPU rule schedules the dense function {func.params}")
