"""CUDA schedule for dense + epilogue (`dense` -> `epilogue`, x[M, K] @ W[K, N] + b[N]): TVM's dlight GPU rules.

The rules are tried in dlight's default order and the first that takes the function wins, as in TVM's own
CUDA pipeline (so the fused kernel is scheduled at least as well as the unfused matmul would be):

    Matmul           M large enough to tile: shared-memory tiles of x and W, register accumulators
    GEMV, Reduction  M == 1 (ResNet's classifier): one output column per thread, K split across threads
                     and combined by a cross-thread reduction
    GeneralReduction, Fallback   anything else

The epilogue (bias + activation) is computed from the accumulators by every rule. The winning rule
schedules its own copy of the function; its trace is replayed on the schedule we are given.

Half inputs (float16, bfloat16) on sm_80+ that fill at least half of a tensor-core tile take them instead
(tensor_core.py: wmma m16n16k16 with float32 accumulators, cp.async copies, the epilogue applied to the
accumulator tile before the store); every other case, and a half dense whose block the wmma intrinsics do
not match, takes the rules above, and the schedule says why (`plan(...).engine`, shown by explain and in
the manifest). dlight's own Matmul rule would tensorize float16 alone, with 48 KB-unaware tiles and without
cp.async: the function is marked `dlight.do_not_tensorize` so that path is never taken.
"""

from __future__ import annotations

from tvm_fusion._tvm import dlight, tirx
from tvm_fusion.errors import FusionError
from tvm_fusion.registry import register_schedule
from tvm_fusion.schedules.dense import DENSE_FAMILY, DenseOperands

from .tensor_core import TensorCorePlan, plan, try_tensor_cores

SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")  # half: float32 accumulators
NO_TENSORIZE = "dlight.do_not_tensorize"  # dlight's own wmma path: see the module docstring

#: dlight's default GPU rule order (tvm.relax.backend.cuda pipeline)
RULES = (
    dlight.gpu.Matmul,
    dlight.gpu.GEMV,
    dlight.gpu.Reduction,
    dlight.gpu.GeneralReduction,
    dlight.gpu.Fallback,
)


def supports(attrs: dict, shapes, target) -> str | None:
    ops = DenseOperands(*shapes)
    x_shape, w_shape = ops.x, ops.w
    if len(x_shape) != 2 or len(w_shape) != 2:
        return f"dense operands have ranks {len(x_shape)} and {len(w_shape)}; the CUDA schedule takes 2-D x and W"
    return None


def tensor_core_plan(func, target) -> TensorCorePlan:
    """Tensor cores or not for the dense function (x[M, K], W[K, N], b[N], out): W's rows are contiguous."""
    ops = DenseOperands(*func.params)
    x, w = ops.x, ops.w
    m, k, n = (int(d) if isinstance(d, tirx.IntImm) else d for d in (x.shape[0], x.shape[1], w.shape[-1]))
    return plan(m, n, k, str(x.dtype), target, b_kn=True)


@register_schedule(DENSE_FAMILY, target="cuda", supports=supports)
def schedule_dense_cuda(sch, attrs, target) -> str:
    """Schedules in place; returns the engine (tensor cores, or CUDA cores and why)."""
    tc = try_tensor_cores(sch, tensor_core_plan(sch.mod["main"], target), "dense", target)
    if tc.reason is None:
        return tc.engine
    apply_dlight_rules(sch, target, "dense")
    return tc.engine


def apply_dlight_rules(sch, target, what: str) -> None:
    """Schedule `sch` in place with the first of dlight's GPU RULES that takes its function (dlight's own wmma
    path kept off, NO_TENSORIZE): the winning rule's trace replayed on `sch`. A rule that raises declines
    (pipeline.GuardedRule: TVM 0.27's GEMV raised on a depthwise conv1d)."""
    func = sch.mod["main"].with_attr(NO_TENSORIZE, True)
    for rule in RULES:
        try:
            scheduled = rule().apply(func, target, False)
        except Exception:  # noqa: BLE001 (a rule's crash means "not mine": the next one, Fallback last)
            continue
        if isinstance(scheduled, list):
            scheduled = scheduled[0] if scheduled else None
        if scheduled is not None:
            scheduled.trace.apply_to_schedule(sch, remove_postproc=False)
            return
    raise FusionError(f"no dlight GPU rule schedules the {what} function {func.params}")
