"""Check a scheduled CUDA PrimFunc against the launch limits, without a GPU.

`tvm.compile` does not check the 48 KB static shared-memory limit (a 56 KB kernel builds and then fails at
launch), so the tests lower each schedule through TVM's own s_tir pipeline, up to the point where the
kernel's allocations and thread extents are final (`_tvm.device_lowering_passes`), and run `verify_gpu_code`
on the result.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm_fusion._tvm import buffer_load, device_lowering_passes, prim_dtype, tvm, verify_gpu_code
from tvm_fusion.hardware import cuda_facts

#: the launch limits of sm_90 (H100 / H200) that a kernel without dynamic shared memory must meet
SM90_LIMITS = cuda_facts("sm_90").gpu_limits()


@dataclass(frozen=True)
class GpuCheck:
    ok: bool  # verify_gpu_code's verdict: threads per block, shared memory, vthreads, vector width
    shared_bytes: int  # static shared memory per block
    dynamic_shared_bytes: int = 0  # dynamic shared memory (shared.dyn) per block

    def __str__(self) -> str:
        dyn = f", shared.dyn={self.dynamic_shared_bytes} B" if self.dynamic_shared_bytes else ""
        return f"verify_gpu_code={'ok' if self.ok else 'FAILED'}, shared={self.shared_bytes} B{dyn}"


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
            # in the dims' own index dtype, with the buffer's offset: TVM's legalized kernels index with int64
            shape = [tvm.tirx.IntImm(prim_dtype(d), size) if isinstance(d, tvm.tirx.Var) else d for d in buf.shape]
            func = func.specialize({buf: tvm.tirx.decl_buffer(shape, buf.dtype, buf.name,
                                                              elem_offset=buf.elem_offset)})
    return func


def check_gpu_limits(func, target, limits: dict | None = None) -> GpuCheck:
    """verify_gpu_code against `limits`, by default those of the target's arch (hardware.cuda_facts: the
    opt-in dynamic shared memory for a kernel with shared.dyn, whose static shared memory must still fit
    48 KB); a symbolic batch is checked at 1 (at_batch)."""
    lowered = lower_for_device(at_batch(func), target)
    alloc = tvm.s_tir.analysis.calculate_allocated_bytes(lowered)["main"]
    static, dynamic = int(alloc.get("shared", 0)), int(alloc.get("shared.dyn", 0))
    facts = cuda_facts(target)
    ok = bool(verify_gpu_code(lowered, limits or facts.gpu_limits(dynamic_shared=dynamic > 0)))
    if dynamic and static > facts.shared_static_bytes:
        ok = False
    return GpuCheck(ok, static, dynamic)


def vector_copy_strides(func, target) -> list[int]:
    """The element stride of every vector load from global memory that feeds a shared-memory store, in the
    lowered kernel. TVM's InjectPTXAsyncCopy turns such a copy into one cp.async of the vector's bytes from
    the ramp's base, whatever its stride: a stride other than 1 would copy the wrong elements."""
    strides: list[int] = []
    for node in _statements(lower_for_device(at_batch(func), target).body):
        value = getattr(node, "value", None)
        if str(getattr(getattr(value, "op", None), "name", "")).endswith("if_then_else"):  # a padded tile's copy
            value = value.args[1]
        load = buffer_load(value) if isinstance(node, tvm.tirx.BufferStore) else None
        if load and node.buffer.scope().startswith("shared") and load[0].scope() == "global":
            index = load[1][-1]
            if isinstance(index, tvm.tirx.Ramp):
                strides.append(int(index.stride))
    return strides


def _statements(stmt):
    """Every statement of a lowered body (TVM 0.27 has no TIR post_order_visit in Python)."""
    yield stmt
    if isinstance(stmt, tvm.tirx.SeqStmt):
        for s in stmt.seq:
            yield from _statements(s)
    for field in ("body", "then_case", "else_case"):
        child = getattr(stmt, field, None)
        if isinstance(child, tvm.tirx.Stmt):
            yield from _statements(child)
