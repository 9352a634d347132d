"""What a target says about the hardware it compiles for, so schedules ask instead of assuming.

One section per target kind; each fact comes from the target (its features, its attributes), never from
the build host, so a library built here for another machine is scheduled for that machine. (The host's
target carries the host's facts: `_tvm.cpu_target` writes its mattr and cache sizes into it.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import _tvm
from .cpu_features import arch_of, parse_cache_model

__all__ = ["CpuFacts", "cpu_facts", "CudaFacts", "CUDA_ARCHS", "cuda_facts", "cuda_sm_version"]


# ================================================================ CPU (llvm targets)
#: per architecture, (feature the target must enable, ISA, vector bits, vector registers); first match wins
CPU_VECTOR_ISAS = {
    "x86_64": (
        ("avx512f", "avx512", 512, 32),  # zmm0-31
        ("avx2", "avx2", 256, 16),  # ymm0-15
        ("avx", "avx", 256, 16),
        ("sse2", "sse", 128, 16),  # xmm0-15
    ),
    "aarch64": (
        ("neon", "neon", 128, 32),  # v0-31 (SVE code is vector-length agnostic: we schedule for NEON)
    ),
}
#: any other architecture: LLVM's vector width and this many registers
OTHER_VECTOR_REGISTERS = 16
#: per-core (L1 data, L2) bytes of a target whose `model` names none (`cpu_features.cache_model`), per ISA:
#: the smallest L1d of the ISA's current server cores (Zen 4, Skylake-SP: 32 KiB) and the L2 the AVX-512
#: plans were measured with (2 MiB: Sapphire Rapids and later)
DEFAULT_CACHES = {"avx512": (32 * 1024, 2048 * 1024), "avx2": (32 * 1024, 1024 * 1024)}
OTHER_CACHES = (32 * 1024, 512 * 1024)


@dataclass(frozen=True)
class CpuFacts:
    isa: str  # 'avx512', 'avx2', 'avx', 'sse', 'neon' or the triple's architecture
    vector_bits: int  # one vector register
    vector_registers: int  # architectural vector registers
    threads: int  # the target's num-cores, else the cores this process may use
    l1d_bytes: int = OTHER_CACHES[0]  # one core's L1 data cache: the target's `model`, else DEFAULT_CACHES
    l2_bytes: int = OTHER_CACHES[1]  # one core's L2
    amx_bf16: bool = False  # AMX tiles with bfloat16 products (x86 `amx-tile` and `amx-bf16`)
    avx512_bf16: bool = False  # AVX-512 bfloat16 dot products (x86 `avx512bf16`)

    def lanes(self, dtype_bits: int = 32) -> int:
        return max(1, self.vector_bits // dtype_bits)

    @property
    def float32_lanes(self) -> int:
        return self.lanes(32)


def cpu_facts(target) -> CpuFacts:
    """Vector ISA, width and register count of an llvm target, from the features it enables: AVX-512
    (16 fp32 lanes, 32 zmm), AVX2 (8 lanes, 16 ymm), SSE (4 lanes, 16 xmm), NEON (4 lanes, 32 q); its
    per-core L1d and L2 sizes from its `model` ('l1d=48K,l2=2048K', as `_tvm.cpu_target` writes the host's),
    else the ISA's DEFAULT_CACHES."""
    key = str(target)
    if key not in _CPU_FACTS:
        _CPU_FACTS[key] = _ask_cpu_target(target)
    return _CPU_FACTS[key]


_CPU_FACTS: dict[str, CpuFacts] = {}


def _ask_cpu_target(target) -> CpuFacts:
    cores, width = target.attrs.get("num-cores"), target.attrs.get("vector-width")
    threads = int(cores) if cores else _tvm.HOST_CORES
    arch = arch_of(_tvm.llvm_triple(target))
    features = _tvm.target_cpu_features(target)
    named = parse_cache_model(str(target.attrs.get("model") or ""))
    amx = arch == "x86_64" and {"amx-tile", "amx-bf16"} <= features
    dot = arch == "x86_64" and {"avx512f", "avx512bf16"} <= features
    for feature, isa, bits, registers in CPU_VECTOR_ISAS.get(arch, ()):
        if feature in features:
            return CpuFacts(isa, int(width) if width else bits, registers, threads, *_caches(named, isa), amx, dot)
    bits = int(width) if width else _tvm.llvm_vector_width(target)
    return CpuFacts(arch, bits if bits > 0 else 128, OTHER_VECTOR_REGISTERS, threads, *_caches(named, arch))


def _caches(named: dict[str, int], isa: str) -> tuple[int, int]:
    l1d, l2 = DEFAULT_CACHES.get(isa, OTHER_CACHES)
    return named.get("l1d", l1d), named.get("l2", l2)


# ---------------------------------------------------------------------------------------------------- CUDA
# cuda_facts(target) -> CudaFacts: launch limits and SM count of the target's arch, from the table below
# (CUDA C Programming Guide, "Features and Technical Specifications"; SM counts of the named GPUs).



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
    max_grid_y: int = 65535  # blocks along blockIdx.y (and z); x takes 2**31 - 1
    known: bool = True  # False: `arch` is not in CUDA_ARCHS and these are conservative defaults
    note: str = ""  # why the numbers are what they are, for unknown archs

    def gpu_limits(self, dynamic_shared: bool = False) -> dict:
        """The limits `tvm.s_tir.analysis.verify_gpu_code` checks a kernel against: 48 KB of shared memory, or
        with `dynamic_shared` (a kernel whose shared memory is `shared.dyn`) the arch's opt-in maximum, which
        TVM's CUDA runtime requests with cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES) at the first
        launch of a kernel that asks for 48 KB or more (src/backend/cuda/runtime/cuda_module.cc)."""
        return {
            "max_shared_memory_per_block": self.shared_optin_bytes if dynamic_shared else self.shared_static_bytes,
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


def cuda_sm_version(target) -> int:
    """The compute capability a CUDA target (or arch string) names, as 80 for sm_80 / sm_80a; -1 for none."""
    found = re.match(r"sm_(\d+)", _arch_of(target))
    return int(found.group(1)) if found else -1
