"""CUDA schedule for the batched matmul (`matmul` -> `epilogue`, A[..., M, K] @ B[..., K, N], batch dims
broadcast): TVM's dlight GPU rules, as for the dense kernel on CUDA cores (`dense.py`).

The rules are tried in dlight's default order (Matmul: shared-memory tiles of A and B per batch, register
accumulators; GEMV, Reduction for a single row or column; GeneralReduction, Fallback for anything else) and
the first that takes the function wins: a kernel is scheduled at least as well as TVM's own pipeline would
schedule the unfused matmul, with the epilogue on the accumulators. dlight's own wmma path is kept off (the
function is marked `dlight.do_not_tensorize`, see dense.py); the kernel reports that it runs on CUDA cores.
"""

from __future__ import annotations

from tvm_fusion.registry import register_schedule
from tvm_fusion.schedules.batch_matmul import BATCH_MATMUL_FAMILY

from .dense import apply_dlight_rules

ENGINE = "CUDA cores (dlight's rules; no tensor-core schedule for a batched matmul of two tensors)"


@register_schedule(BATCH_MATMUL_FAMILY, target="cuda")
def schedule_batch_matmul_cuda(sch, attrs, target) -> str:
    """Schedules in place with the first dlight rule that takes the function; returns the engine."""
    apply_dlight_rules(sch, target, "batch_matmul")
    return ENGINE
