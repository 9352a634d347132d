"""Build a Relax module in one of three modes and count what runs: PrimFuncs and kernel calls."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

from . import _tvm, pipeline
from ._tvm import relax, tvm
from .errors import FusionError
from .fuse import FuseResult, fuse
from .rules import RuleSet

__all__ = ["Built", "build", "legalize", "resolve_target", "count_kernel_calls", "default_rules"]


def resolve_target(target="llvm", arch: str = "sm_90"):
    """'llvm' / 'cpu' -> the host CPU with its real mcpu; 'cuda' -> CUDA for `arch`; dicts and Targets pass."""
    if isinstance(target, tvm.target.Target):
        return target
    if isinstance(target, dict):
        return tvm.target.Target(target)
    if target in ("llvm", "cpu"):
        return _tvm.cpu_target()
    if target == "cuda":
        return _tvm.cuda_target(arch)
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


def _compiler_for(target):
    """For CUDA, the compiler TVM calls if a driver is present (the same as a driverless export's)."""
    if target.kind.name != "cuda":
        return contextlib.nullcontext()
    from .export import build_time_compiler

    return build_time_compiler(str(target.attrs.get("arch", "sm_90")))


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
    weights: dict | None = field(default=None, repr=False)  # {param name: tensor} when built with external_weights

    @property
    def counts(self) -> dict[str, int]:
        return self.fused.counts if self.fused else {}


def legalize(mod, target, mode: str):
    """The `legalize` stage of `mode` (what build() counts kernels on), without compiling."""
    target = resolve_target(target)
    with target, tvm.transform.PassContext(opt_level=3):
        return pipeline.sequential(pipeline.legalize_passes(mode, target), f"{mode}.legalize")(mod)


def build(mod, target="llvm", mode: str = "fused", rules: RuleSet | None = None, *,
          external_weights: bool = False) -> Built:
    """Compile `mod` for `target` in `mode` ('unfused', 'tvm' or 'fused'). With `external_weights`, main's
    constant kernel arguments become parameters (weights.lift_weights) and `Built.weights` holds them."""
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
    weights = None
    if external_weights:
        from .weights import lift_weights

        legal, weights = lift_weights(legal)
    with _compiler_for(target):
        ex = tvm.compile(legal, target, relax_pipeline=pipeline.sequential(pipeline.lower_passes(target), "lower"))
    return Built(mode, target, ex, primfuncs, calls, time.perf_counter() - start, fused, legal, weights)
