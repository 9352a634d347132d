"""Check a scheduled CUDA PrimFunc against the launch limits, without a GPU.

`tvm.compile` does not check the 48 KB static shared-memory limit (a 56 KB kernel builds and then fails at
launch), so the tests lower each schedule through TVM's own s_tir pipeline, up to the point where the
kernel's allocations and thread extents are final (`_tvm.device_lowering_passes`), and run `verify_gpu_code`
on the result.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm_fusion._tvm import device_lowering_passes, tvm, verify_gpu_code
from tvm_fusion.hardware import cuda_facts

#: the launch limits of sm_90 (H100 / H200) that a kernel without dynamic shared memory must meet
SM90_LIMITS = cuda_facts("sm_90").gpu_limits()


@dataclass(frozen=True)
class GpuCheck:
    ok: bool  # verify_gpu_code's verdict: threads per block, shared memory, vthreads, vector width
    shared_bytes: int  # static shared memory per block

    def __str__(self) -> str:
        return f"verify_gpu_code={'ok' if self.ok else 'FAILED'}, shared={self.shared_bytes} B"


def lower_for_device(func, target):
    """`func` lowered to flat buffers with thread extents and allocations as the kernel will have them."""
    func = func.with_attr("global_symbol", "main").with_attr("target", target)
    with target, tvm.transform.PassContext(opt_level=3):
        return tvm.ir.transform.Sequential(device_lowering_passes())(tvm.IRModule({"main": func}))["main"]


def at_batch(func, size: int = 1):
    """`func` with each symbolic dim of its buffers bound to `size` (specialised through the first buffer that
    has it). A symbolic batch only sizes the grid (blockIdx.x): the per-block limits are the same at every
    size, and verify_gpu_code needs constant thread extents."""
    bound: set[str] = set()
    for buf in func.params:
        symbolic = [d for d in buf.shape if isinstance(d, tvm.tirx.Var) and d.name not in bound]
        if symbolic:
            bound.update(d.name for d in symbolic)
            shape = [size if isinstance(d, tvm.tirx.Var) else d for d in buf.shape]
            func = func.specialize({buf: tvm.tirx.decl_buffer(shape, buf.dtype, buf.name)})
    return func


def check_gpu_limits(func, target, limits: dict | None = None) -> GpuCheck:
    """verify_gpu_code against `limits`, by default those of the target's arch (hardware.cuda_facts); a
    symbolic batch is checked at 1 (at_batch)."""
    lowered = lower_for_device(at_batch(func), target)
    ok = bool(verify_gpu_code(lowered, limits or cuda_facts(target).gpu_limits()))
    alloc = tvm.s_tir.analysis.calculate_allocated_bytes(lowered)["main"]
    return GpuCheck(ok, int(alloc.get("shared", 0)))
