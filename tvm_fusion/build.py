"""Build a Relax module in one of three modes and count what runs: PrimFuncs and kernel calls."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field

from . import _tvm, pipeline
from ._tvm import relax, tvm
from .errors import FusionError
from .fuse import FuseResult, fuse
from .rules import RuleSet

__all__ = ["Built", "build", "legalize", "resolve_target", "check_arch", "count_kernel_calls", "default_rules"]


@functools.lru_cache(maxsize=1)
def nvcc_archs() -> tuple[str, ...] | None:
    """The sm_XX architectures the nvcc on PATH compiles for (None without nvcc)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    try:
        out = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = tuple(dict.fromkeys("sm_" + m for m in re.findall(r"compute_(\d+[a-z]?)", out)))
    return found or None


def check_arch(arch: str, nvcc: bool = True) -> str:
    """`arch` must look like sm_90 (sm_<digits>, optional a/f suffix) and, with `nvcc`, be one that the nvcc
    on PATH knows."""
    if not isinstance(arch, str) or not re.fullmatch(r"sm_\d+[af]?", arch):
        raise FusionError(f"--arch {arch!r}: expected a CUDA architecture such as sm_80 or sm_90")
    known = nvcc_archs() if nvcc else None
    if known is not None and arch.rstrip("af") not in known:
        raise FusionError(f"--arch {arch}: not an architecture that the nvcc on PATH knows; it knows "
                          f"{', '.join(known)} (`nvcc --list-gpu-arch`)")
    return arch


def resolve_target(target="llvm", arch: str = "sm_90"):
    """'llvm' / 'cpu' -> the host CPU with its real mcpu; 'cuda' -> CUDA for `arch`; dicts and Targets pass."""
    if isinstance(target, tvm.target.Target):
        return target
    if isinstance(target, dict):
        return tvm.target.Target(target)
    if target in ("llvm", "cpu"):
        return _tvm.cpu_target()
    if target == "cuda":
        return _tvm.cuda_target(check_arch(arch))
    raise FusionError(f"unknown target {target!r}; use 'llvm' (CPU) or 'cuda' (with --arch, default sm_90)")


def default_rules() -> RuleSet:
    from .loader import load_rules_for

    return load_rules_for()


def count_kernel_calls(mod) -> tuple[int, int]:
    """(PrimFuncs in the module, call_tir calls per inference in `main`) after legalization."""
    primfuncs = sum(1 for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc))
    calls = 0

    def visit(expr):
        nonlocal calls
        if isinstance(expr, relax.Call) and expr.op.same_as(tvm.ir.Op.get("relax.call_tir")):
            calls += 1

    relax.analysis.post_order_visit(mod["main"], visit)
    return primfuncs, calls


@dataclass
class Built:
    mode: str
    target: object
    executable: object
    primfuncs: int
    kernel_calls: int
    build_seconds: float
    fused: FuseResult | None = None
    module: object = field(default=None, repr=False)  # the legalized Relax module

    @property
    def counts(self) -> dict[str, int]:
        return self.fused.counts if self.fused else {}


def legalize(mod, target, mode: str):
    """The `legalize` stage of `mode` (what build() counts kernels on), without compiling."""
    target = resolve_target(target)
    with target, tvm.transform.PassContext(opt_level=3):
        return pipeline.sequential(pipeline.legalize_passes(mode, target), f"{mode}.legalize")(mod)


def build(mod, target="llvm", mode: str = "fused", rules: RuleSet | None = None) -> Built:
    """Compile `mod` for `target` in `mode` ('unfused', 'tvm' or 'fused')."""
    target = resolve_target(target)
    if mode not in pipeline.MODES:
        raise FusionError(f"unknown build mode {mode!r}; use one of {', '.join(pipeline.MODES)}")
    start = time.perf_counter()
    fused = None
    if mode == "fused":
        fused = fuse(mod, target, rules if rules is not None else default_rules())
        mod = fused.mod
    legal = legalize(mod, target, mode)
    primfuncs, calls = count_kernel_calls(legal)
    ex = tvm.compile(legal, target, relax_pipeline=pipeline.sequential(pipeline.lower_passes(target), "lower"))
    return Built(mode, target, ex, primfuncs, calls, time.perf_counter() - start, fused, legal)
