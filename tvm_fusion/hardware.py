"""What a target says about the hardware it compiles for, so schedules ask instead of assuming.

One section per target kind; each fact comes from the target (its features, its attributes), never from
the build host, so a library built here for another machine is scheduled for that machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from . import _tvm
from .cpu_features import arch_of

__all__ = ["CpuFacts", "cpu_facts"]


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


@dataclass(frozen=True)
class CpuFacts:
    isa: str  # 'avx512', 'avx2', 'avx', 'sse', 'neon' or the triple's architecture
    vector_bits: int  # one vector register
    vector_registers: int  # architectural vector registers
    threads: int  # the target's num-cores, else the cores this process may use

    def lanes(self, dtype_bits: int = 32) -> int:
        return max(1, self.vector_bits // dtype_bits)

    @property
    def float32_lanes(self) -> int:
        return self.lanes(32)


def cpu_facts(target) -> CpuFacts:
    """Vector ISA, width and register count of an llvm target, from the features it enables: AVX-512
    (16 fp32 lanes, 32 zmm), AVX2 (8 lanes, 16 ymm), SSE (4 lanes, 16 xmm), NEON (4 lanes, 32 q)."""
    key = str(target)
    if key not in _CPU_FACTS:
        _CPU_FACTS[key] = _ask_cpu_target(target)
    return _CPU_FACTS[key]


_CPU_FACTS: dict[str, CpuFacts] = {}


def _ask_cpu_target(target) -> CpuFacts:
    cores, width = target.attrs.get("num-cores"), target.attrs.get("vector-width")
    threads = int(cores) if cores else len(os.sched_getaffinity(0))
    arch = arch_of(_tvm.llvm_triple(target))
    features = _tvm.target_cpu_features(target)
    for feature, isa, bits, registers in CPU_VECTOR_ISAS.get(arch, ()):
        if feature in features:
            return CpuFacts(isa, int(width) if width else bits, registers, threads)
    bits = int(width) if width else _tvm.llvm_vector_width(target)
    return CpuFacts(arch, bits if bits > 0 else 128, OTHER_VECTOR_REGISTERS, threads)
