"""Build a Relax module in one of three modes and count what runs: PrimFuncs and kernel calls."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field

from tvm_fusion import _tvm
from tvm_fusion.build import pipeline
from tvm_fusion.frontend import recurrent_kernel
from tvm_fusion.build import cuda_graph as graphs
from tvm_fusion._tvm import relax, tvm
from tvm_fusion.errors import FusionError
from tvm_fusion.fusion.fuse import FuseResult, fuse
from tvm_fusion.quiet import FAST_TAKE_LINES, tvm_output
from tvm_fusion.rules import RuleSet
from tvm_fusion.build.unscheduled import Unscheduled, find_unscheduled, kernel_origins, legalized_calls
from tvm_fusion.fusion.loader import load_rules_for
from tvm_fusion.build.cuda_compiler import build_time_compiler
from tvm_fusion.hardware import cuda_sm_version
from tvm_fusion.runtime.weights import lift_weights
from tvm_fusion.build.tune import tune_fused

__all__ = ["Built", "build", "legalize", "legalize_traced", "resolve_target", "parse_target", "default_cpu_target",
           "TARGET_FORMS", "check_arch", "count_kernel_calls", "default_rules"]


#: what resolve_target, the CLI's --target and TVM_FUSION_CPU accept, for error messages
TARGET_FORMS = ("'llvm' (this CPU, or TVM_FUSION_CPU), 'cuda' (with --arch), a JSON dict such as "
                "'{\"kind\":\"llvm\",\"mcpu\":\"x86-64-v3\"}', a TVM target kind such as 'c', "
                "or a tag such as 'nvidia/nvidia-h100'")


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


def parse_target(spec, source: str = "target"):
    """A TVM Target from a Target, a dict, a JSON dict string, a target kind or a tag (taken literally:
    no host detection); FusionError naming the accepted forms otherwise."""
    if isinstance(spec, tvm.target.Target):
        return spec
    try:
        if isinstance(spec, str) and spec.lstrip().startswith("{"):
            spec = json.loads(spec)
        if isinstance(spec, (dict, str)) and spec:
            target = tvm.target.Target(spec)
            unknown = _tvm.unknown_llvm_cpu(target)
            if unknown is None:
                return target
            problem = f"LLVM knows no CPU {unknown!r} for this triple"
        else:
            problem = "not a target"
    except (ValueError, TypeError, RuntimeError, KeyError) as err:  # json.JSONDecodeError is a ValueError
        problem = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    raise FusionError(f"{source} {spec!r} is not a TVM target ({problem}); accepted: {TARGET_FORMS}")


def default_cpu_target():
    """The CPU target used wherever none is given: TVM_FUSION_CPU (a JSON dict, a target kind or a tag)
    when set, else the host as it really is (its mcpu, and mattr without the features it lacks)."""
    spec = os.environ.get("TVM_FUSION_CPU", "").strip()
    if not spec:
        return _tvm.cpu_target()
    target = parse_target(spec, "TVM_FUSION_CPU")
    if target.kind.name != "llvm":
        raise FusionError(f"TVM_FUSION_CPU must be an llvm target, got kind {target.kind.name!r} from {spec!r}")
    return target


def resolve_target(target="llvm", arch: str = "sm_90"):
    """'llvm' / 'cpu' -> default_cpu_target(); 'cuda' -> CUDA for `arch`; anything else TVM accepts as a
    target (a Target, a dict, a JSON dict string, a target kind, a tag) as it is."""
    if isinstance(target, str) and target in ("llvm", "cpu"):
        return default_cpu_target()
    if isinstance(target, str) and target == "cuda":
        return _tvm.cuda_target(check_arch(arch))
    return parse_target(target)


def default_rules() -> RuleSet:
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
    #: CUDA graphs: {"enabled": bool, "reason": why not (or None), "launches": cuda_graph.launches of the
    #: lowered module (one launch per PrimFunc call; compile counts the function table's kernels)}; None off CUDA
    cuda_graph: dict | None = None
    lowered: object = field(default=None, repr=False)  # the Relax module tvm.compile lowered (before codegen)
    tuning: object = None  # tune.TuneReport when built with tune=TuneOptions(...)
    #: the kernels without a schedule (on llvm TVM's bare loop nests; unscheduled.py); every one unfused
    unscheduled: list[Unscheduled] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        return self.fused.counts if self.fused else {}


def codegen_config(target) -> dict:
    """PassContext config for the target's code generation: on CUDA sm_80+, the copies a schedule marks as
    asynchronous pipeline stages (the tensor-core kernels) become cp.async; a kernel without such a stage is
    generated as without the option."""
    return {_tvm.ASYNC_COPY_CONFIG: True} if target.kind.name == "cuda" and cuda_sm_version(target) >= 80 else {}


def legalize(mod, target, mode: str):
    """The `legalize` stage of `mode` (what build() counts kernels on), without compiling."""
    return legalize_traced(mod, target, mode)[0]


def legalize_traced(mod, target, mode: str):
    """(the `legalize` stage of `mode`, {kernel: (the legalized ops, the ONNX nodes) it computes}): the same
    passes, run in three parts around TVM's FuseOps to read which bindings each fused kernel took
    (unscheduled.py)."""
    target = target if isinstance(target, tvm.target.Target) else resolve_target(target)
    recurrent_kernel.check_target(mod, target)
    passes = pipeline.legalize_passes(mode, target)
    names = [p.info.name for p in passes]
    cut = names.index("FuseOps") if "FuseOps" in names else len(passes)
    with target, tvm.transform.PassContext(opt_level=3), tvm_output(drop=FAST_TAKE_LINES):
        mod = pipeline.sequential(passes[:cut], f"{mode}.legalize")(mod)
        calls = legalized_calls(mod)
        mod = pipeline.sequential(passes[cut:cut + 1], f"{mode}.fuse_ops")(mod)
        origins = kernel_origins(mod, calls)
        return pipeline.sequential(passes[cut + 1:], f"{mode}.schedule")(mod), origins


def build(mod, target="llvm", mode: str = "fused", rules: RuleSet | None = None, *,
          external_weights: bool = False, cuda_graph: bool | None = None, tune=None, blocked_layout: bool = True
          ) -> Built:
    """Compile `mod` for `target` in `mode` ('unfused', 'tvm' or 'fused'). With `external_weights`, main's
    constant kernel arguments become parameters (weights.lift_weights) and `Built.weights` holds them.
    `cuda_graph` (default: on for a fused CUDA build with its weights inside) captures the kernels in a CUDA
    graph (cuda_graph.py) where the shapes are static and the graph saves launches; `Built.cuda_graph` says
    what was done. A graph replays the weight tensors of the first call: with `external_weights` and
    cuda_graph=True, pass the same weight tensors to every call.
    `tune` (a tune.TuneOptions, fused mode only) tunes the fused kernels with MetaSchedule and keeps each
    tuned schedule that measured faster than the hand schedule; `Built.tuning` reports it per kernel.
    `blocked_layout` (fused mode, llvm): chains of convs pass their activations in NCHW[x]c
    (fusion/chain_layout.py); False keeps every kernel's tensors NCHW."""
    target = target if isinstance(target, tvm.target.Target) else resolve_target(target)
    if mode not in pipeline.MODES:
        raise FusionError(f"unknown build mode {mode!r}; use one of {', '.join(pipeline.MODES)}")
    if tune is not None and mode != "fused":
        raise FusionError(f"tuning applies to the fused build's kernels, not to the {mode} build")
    start = time.perf_counter()
    fused, tuning = None, None
    if mode == "fused":
        fused = fuse(mod, target, rules if rules is not None else default_rules(), blocked_layout=blocked_layout)
        mod = fused.mod
        if tune is not None:
            mod, tuning = tune_fused(mod, fused.plain, target, tune)
    legal, origins = legalize_traced(mod, target, mode)
    unscheduled = find_unscheduled(legal, origins)
    primfuncs, calls = count_kernel_calls(legal)
    weights = None
    if external_weights:
        legal, weights = lift_weights(legal)
    if cuda_graph is None:  # a graph keeps the first call's weight tensors: only where they are constants
        cuda_graph = mode == "fused" and not external_weights
        why_not = (f"off by default for the {mode} build (pass cuda_graph=True)" if mode != "fused" else
                   "off by default with weights outside the library (pass cuda_graph=True / --cuda-graph)")
    else:
        why_not = "turned off (--no-cuda-graph)"
    graph, lower_mod, lowered = _cuda_graph(legal, target, cuda_graph, why_not)
    config = {**graphs.pass_config(bool(graph and graph["enabled"])), **codegen_config(target)}
    with _compiler_for(target), tvm.transform.PassContext(opt_level=3, config=config):
        ex = tvm.compile(lower_mod, target, relax_pipeline=pipeline.sequential(pipeline.lower_passes(target), "lower"))
    return Built(mode, target, ex, primfuncs, calls, time.perf_counter() - start, fused, legal, weights, graph, lowered,
                 tuning, unscheduled)


def _cuda_graph(legal, target, wanted: bool, why_not: str):
    """(what Built.cuda_graph says, the module to compile, its lowered form) for a CUDA target; graphs are
    used when wanted, the shapes are static, and the graph launches fewer times than the kernels would."""
    if target.kind.name != "cuda":
        return None, legal, None
    lower = pipeline.lower_passes(target)
    plain = graphs.lowered(legal, target, lower, False)
    without = graphs.launches(plain, lambda name: 1)["without_graph"]
    why = None if wanted else why_not
    why = why or graphs.applies(legal, target)
    if why is None:
        static = graphs.static_inputs(legal, target)
        low = graphs.lowered(static, target, lower, True)
        counted = graphs.launches(low, lambda name: 1)
        if counted["graphs"] and counted["with_graph"] < without:
            return {"enabled": True, "reason": None, "launches": counted}, static, low
        why = (f"the graph would not save launches ({counted['with_graph']} with it, {without} without)"
               if counted["graphs"] else "no kernel can be captured")
    return {"enabled": False, "reason": why, "launches": graphs.launches(plain, lambda name: 1)}, legal, plain
