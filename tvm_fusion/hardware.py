"""What the target says about the hardware: the numbers schedules size their tiles by.

One section per target kind (CUDA below; the CPU section, `cpu_facts`, lives beside it), so schedules ask
the target instead of carrying constants.
"""

# ---------------------------------------------------------------------------------------------------- CUDA
# cuda_facts(target) -> CudaFacts: launch limits and SM count of the target's arch, from the table below
# (CUDA C Programming Guide, "Features and Technical Specifications"; SM counts of the named GPUs).

import re
from dataclasses import dataclass

# no `from __future__` and an additive __all__: each section stands alone, in either order
__all__ = [*globals().get("__all__", []), "CudaFacts", "CUDA_ARCHS", "cuda_facts"]


@dataclass(frozen=True)
class CudaFacts:
    arch: str  # "sm_90"
    gpus: str  # the GPUs the numbers are those of
    sm_count: int  # streaming multiprocessors: the occupancy heuristics want a grid at least this large
    shared_optin_bytes: int  # dynamic shared memory per block after cudaFuncSetAttribute (opt-in)
    max_threads_per_block: int = 1024
    shared_static_bytes: int = 48 * 1024  # static shared memory per block (__shared__ arrays)
    registers_per_block: int = 64 * 1024  # 32-bit registers
    registers_per_thread: int = 255
    warp_size: int = 32
    known: bool = True  # False: `arch` is not in CUDA_ARCHS and these are conservative defaults
    note: str = ""  # why the numbers are what they are, for unknown archs

    def gpu_limits(self) -> dict:
        """The limits `tvm.s_tir.analysis.verify_gpu_code` checks a kernel without dynamic shared memory against."""
        return {
            "max_shared_memory_per_block": self.shared_static_bytes,
            "max_threads_per_block": self.max_threads_per_block,
            "max_thread_x": self.max_threads_per_block,
            "max_thread_y": self.max_threads_per_block,
            "max_thread_z": 64,
            "max_local_memory_per_block": 2**31 - 1,
            "max_vthread": 8,
            "max_vector_bytes": 16,
        }


def _arch(name, gpus, sms, optin_kib):
    return CudaFacts(name, gpus, sms, int(optin_kib * 1024))


#: per arch: the GPU whose SM count is used (the smallest common data-center part where several share an arch)
CUDA_ARCHS = {f.arch: f for f in (
    _arch("sm_70", "V100", 80, 96),
    _arch("sm_75", "T4", 40, 64),
    _arch("sm_80", "A100", 108, 163),
    _arch("sm_86", "A10 (72 SMs); RTX 3090 82, A40 84", 72, 99),
    _arch("sm_89", "L4 (58 SMs); L40S 142, RTX 4090 128", 58, 99),
    _arch("sm_90", "H100 SXM / H200", 132, 227),
    _arch("sm_100", "B200", 148, 227),
    _arch("sm_120", "RTX PRO 6000 Blackwell (188 SMs); RTX 5090 170", 170, 99),
)}

#: an arch not in the table: the most any sm_70+ GPU allows per block, and a small GPU's SM count
_UNKNOWN = CudaFacts("unknown", "unknown GPU", 40, 48 * 1024, known=False)


def _arch_of(target) -> str:
    if isinstance(target, str):
        return target
    if target.kind.name != "cuda":
        raise ValueError(f"cuda_facts needs a CUDA target, got {target.kind.name}")
    return str(target.attrs.get("arch", "") or "no arch")


def cuda_facts(target) -> CudaFacts:
    """Launch limits and SM count for a CUDA target (or an arch string such as 'sm_90' / 'sm_90a')."""
    arch = _arch_of(target)
    base = re.sub(r"(sm_\d+)[a-z]?$", r"\1", arch)  # sm_90a, sm_100f: the same limits as sm_90, sm_100
    if base in CUDA_ARCHS:
        return CUDA_ARCHS[base]
    return CudaFacts(arch, _UNKNOWN.gpus, _UNKNOWN.sm_count, _UNKNOWN.shared_optin_bytes, known=False,
                     note=f"{arch} is not in tvm_fusion.hardware.CUDA_ARCHS ({', '.join(CUDA_ARCHS)}): "
                          f"conservative limits (48 KB shared, {_UNKNOWN.sm_count} SMs) are used")
