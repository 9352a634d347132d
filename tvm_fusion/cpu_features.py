"""The vector-ISA features a CPU really exposes, in LLVM's names, read from `/proc/cpuinfo` text; and its
per-core cache sizes, read from sysfs, in the form an llvm target's `model` carries them.

A leaf module (no TVM import): the compiler uses it to derive a target's `mattr` from the host, and
`tvm_fusion.runtime` uses it to check that a library's required features are present before running it.

Only the features that change which instructions LLVM may emit for our kernels are tracked (the AVX /
AVX-512 / AMX families on x86-64, NEON / SVE and their extensions on AArch64). A CPU *name* such as
`znver4` implies all of them; a hypervisor may hide some (AVX-512 on many cloud VMs), and code built
for the name then dies with SIGILL.
"""

from __future__ import annotations

import platform
from pathlib import Path

__all__ = ["TRACKED", "arch_of", "features_from_cpuinfo", "host_features", "hidden_features", "missing_features",
           "CACHE_LEVELS", "host_cache_sizes", "cache_model", "parse_cache_model"]

#: LLVM feature name -> the flags `/proc/cpuinfo` shows for it (all must be present), per architecture
TRACKED = {
    "x86_64": {
        "avx": ("avx",), "avx2": ("avx2",), "fma": ("fma",), "f16c": ("f16c",),
        "avx512f": ("avx512f",), "avx512cd": ("avx512cd",), "avx512dq": ("avx512dq",),
        "avx512bw": ("avx512bw",), "avx512vl": ("avx512vl",), "avx512ifma": ("avx512ifma",),
        "avx512vbmi": ("avx512vbmi",), "avx512vbmi2": ("avx512_vbmi2",), "avx512vnni": ("avx512_vnni",),
        "avx512bitalg": ("avx512_bitalg",), "avx512vpopcntdq": ("avx512_vpopcntdq",),
        "avx512bf16": ("avx512_bf16",), "avx512fp16": ("avx512_fp16",),
        "avx512vp2intersect": ("avx512_vp2intersect",), "avxvnni": ("avx_vnni",),
        "amx-tile": ("amx_tile",), "amx-int8": ("amx_int8",), "amx-bf16": ("amx_bf16",), "amx-fp16": ("amx_fp16",),
    },
    "aarch64": {
        "neon": ("asimd",), "fullfp16": ("fphp", "asimdhp"), "dotprod": ("asimddp",), "i8mm": ("i8mm",),
        "bf16": ("bf16",), "sve": ("sve",), "sve2": ("sve2",), "sme": ("sme",),
    },
}


def arch_of(machine_or_triple: str | None = None) -> str:
    """'x86_64' or 'aarch64' (or the machine name as given) for a `platform.machine()` value or an
    LLVM triple; the running machine when None."""
    name = (machine_or_triple or platform.machine()).split("-")[0].lower()
    if name in ("x86_64", "amd64", "x86-64"):
        return "x86_64"
    if name in ("aarch64", "arm64"):
        return "aarch64"
    return name


def _cpuinfo_flags(text: str) -> set[str]:
    """The flags of the first processor listed (`flags` on x86, `Features` on AArch64)."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            return set(value.split())
    return set()


def features_from_cpuinfo(text: str, arch: str | None = None) -> frozenset[str]:
    """The tracked features (LLVM names) that a `/proc/cpuinfo` text lists, for `arch` (default: this
    machine's)."""
    flags = _cpuinfo_flags(text)
    table = TRACKED.get(arch_of(arch), {})
    return frozenset(feat for feat, needs in table.items() if all(f in flags for f in needs))


def host_features(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str] | None:
    """The tracked features this machine exposes (from `/proc/cpuinfo`); None where that cannot be read
    (not Linux) or the architecture is not tracked."""
    if arch_of() not in TRACKED:
        return None
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return None
    return features_from_cpuinfo(text) if _cpuinfo_flags(text) else None


def hidden_features(implied, available, arch: str | None = None) -> list[str]:
    """Tracked features that a CPU name implies but the host does not expose, sorted: the ones to turn
    off with `mattr=-feature`."""
    table = TRACKED.get(arch_of(arch), {})
    return sorted(f for f in set(implied) if f in table and f not in available)


#: features a target turns on where the host has them and its CPU name does not imply them (a VM may name an
#: older CPU than it runs on: LLVM calls a Sapphire Rapids guest `rocketlake`, which has no AMX); only ones a
#: schedule asks for (`hardware.CpuFacts.amx_bf16`, `avx512_bf16`), each with the features the CPU name must
#: imply for it to be added (LLVM's `+avx512bf16` turns AVX-512 on: a target named for AVX2 stays AVX2)
ADDED_WHEN_PRESENT = {"x86_64": {"amx-tile": (), "amx-bf16": (), "avx512bf16": ("avx512f", "avx512bw")}}


def added_features(implied, available, arch: str | None = None) -> list[str]:
    """ADDED_WHEN_PRESENT features the host exposes but the CPU name does not imply (where it implies what
    they need), sorted: the ones to turn on with `mattr=+feature`."""
    implied, available = set(implied), set(available)
    return sorted(f for f, needs in ADDED_WHEN_PRESENT.get(arch_of(arch), {}).items()
                  if f in available and f not in implied and implied & available >= set(needs))


def missing_features(required, available, arch: str | None = None) -> list[str]:
    """Tracked features in `required` (e.g. a library's manifest) that `available` lacks, sorted."""
    return hidden_features(required, available, arch)


# ---------------------------------------------------------------------------------------------- caches
#: the caches a target's `model` may describe (`cache_model`): sysfs (level, type) -> our name
CACHE_LEVELS = {(1, "Data"): "l1d", (2, "Unified"): "l2"}
_SIZE_UNITS = {"": 1, "K": 1024, "M": 1024 * 1024}


def _size(text: str) -> int | None:
    text = text.strip().upper()
    unit = text[-1] if text[-1:] in ("K", "M") else ""
    number = text[:-1] if unit else text
    return int(number) * _SIZE_UNITS[unit] if number.isdigit() and int(number) else None


def host_cache_sizes(root: str | Path = "/sys/devices/system/cpu/cpu0/cache") -> dict[str, int] | None:
    """This machine's per-core L1 data and L2 cache sizes in bytes ({'l1d': ..., 'l2': ...}, the first CPU's,
    from Linux's sysfs); None where they cannot be read."""
    sizes = {}
    for index in sorted(Path(root).glob("index*")):
        try:
            level, kind, size = ((index / f).read_text().strip() for f in ("level", "type", "size"))
        except OSError:
            continue
        name = CACHE_LEVELS.get((int(level), kind)) if level.isdigit() else None
        if name and (value := _size(size)):
            sizes[name] = value
    return sizes or None


def cache_model(sizes: dict[str, int]) -> str:
    """The `model` string of an llvm target that carries cache sizes: 'l1d=48K,l2=2048K'."""
    return ",".join(f"{name}={sizes[name] // 1024}K" for name in CACHE_LEVELS.values() if name in sizes)


def parse_cache_model(model: str) -> dict[str, int]:
    """The cache sizes (bytes) a target's `model` string names (`cache_model`'s form; sizes in bytes, K or
    M); entries it does not know are ignored, so any other model string names none."""
    sizes = {}
    for item in (model or "").split(","):
        name, sep, value = item.partition("=")
        name = name.strip().lower()
        if sep and name in CACHE_LEVELS.values() and (size := _size(value)):
            sizes[name] = size
    return sizes
