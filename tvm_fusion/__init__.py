"""tvm_fusion: pattern-based operator fusion for Apache TVM (Relax graph IR, TE computes).

    import tvm_fusion as tf
    mod = tf.import_onnx("model.onnx")                       # ONNX -> Relax, constants folded
    result = tf.fuse(mod, target="llvm")                     # fused module + per-rule counts
    built = tf.build(mod, target="cuda", mode="fused")       # 'unfused' | 'tvm' | 'fused'
    tf.compile("model.onnx", "model.so", target="cuda")      # library + model.so.json manifest
    tf.compile("model.onnx", "m.so", target="llvm", tune=tf.TuneOptions(64, "tune_db"))  # MetaSchedule-tuned
    print(tf.compare("model.onnx", target="llvm"))           # numerics, kernel counts, latency
    print(tf.check_groups("model.onnx"))                     # each fused group vs its unfused subgraph
    print(tf.bisect("model.onnx", rules=my_rules))           # which rule broke what
    tf.profile("model.onnx").write_html("report.html")       # per-kernel time, traffic, what to fuse next
    model = tf.load("model.so"); outputs = model(x)          # the TVM runtime alone (tvm_fusion.runtime)
"""

from __future__ import annotations

import importlib
import sys
import types

# Names load on first use (PEP 562), so `import tvm_fusion.runtime` on a deployment machine pulls in
# nothing of the compiler side.
_LAZY = {
    "Built": "build", "build": "build", "resolve_target": "build",
    "CompareReport": "compare", "compare": "compare",
    "CompileResult": "compile", "compile_model": "compile",
    "BisectReport": "differential", "GroupReport": "differential", "bisect": "differential",
    "check_groups": "differential",
    "FusionError": "errors", "ToleranceExceeded": "errors",
    "example_model": "examples", "example_path": "examples",
    "Explanation": "explain", "explain": "explain",
    "import_onnx": "frontend", "SymDim": "frontend",
    "FuseResult": "fuse",
    "load_rules": "loader", "load_rules_for": "loader",
    "register_compute": "registry", "register_schedule": "registry",
    "Decline": "rules", "Lowering": "rules", "Match": "rules", "Rule": "rules", "RuleSet": "rules",
    "Spec": "rules", "commutative": "rules", "decline": "rules", "rule": "rules",
    "load": "runtime",
    "ProfileReport": "profile", "profile": "profile",
    "TuneOptions": "tune", "TuneReport": "tune",
}

__all__ = [
    "BisectReport", "Built", "CompareReport", "GroupReport", "bisect", "check_groups", "CompileResult", "Decline", "FuseResult", "FusionError", "Lowering", "Match",
    "Rule", "RuleSet", "Spec", "ToleranceExceeded", "build", "commutative", "compare", "compile", "decline",
    "Explanation", "example_model", "example_path", "explain", "fuse", "import_onnx", "load_rules", "ProfileReport",
    "profile", "register_compute", "register_schedule", "rule", "rules", "load", "SymDim", "TuneOptions", "TuneReport",
]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    else:
        try:
            value = importlib.import_module(f".{name}", __name__)  # a submodule, e.g. tvm_fusion.frontend
        except ModuleNotFoundError:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


class _Package(types.ModuleType):
    """Importing a submodule named like a function of the API (`build`, `compare`, `compile`, `explain`,
    `fuse`, `rules`) must not replace that function: the import system sets a package attribute per
    submodule. The submodule stays in sys.modules."""

    def __setattr__(self, name, value):
        if isinstance(value, types.ModuleType) and (name in _LAZY or name in ("compile", "fuse", "rules")):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__version__ = "0.1.0"


def rules(files=(), only=None, disable=None) -> RuleSet:
    """The active rule set: built-in tables (fixed order), installed plugins, then `files`."""
    from .loader import load_rules_for

    return load_rules_for(files, only=only, disable=disable)


def fuse(mod, target="llvm", rules: RuleSet | None = None, *, only=None, disable=None) -> FuseResult:
    """Run the fuse stage: returns the rewritten module and per-rule counts (`.counts`)."""
    from .build import resolve_target
    from .fuse import fuse as fuse_stage
    from .loader import load_rules_for

    rules = rules if rules is not None else load_rules_for(only=only, disable=disable)
    return fuse_stage(mod, resolve_target(target), rules)


def compile(model, output, target="cuda", **kwargs) -> CompileResult:  # noqa: A001 - mirrors the CLI verb
    """ONNX model -> library at `output` plus `<output>.json` manifest (see compile_model)."""
    from .compile import compile_model

    return compile_model(model, output, target, **kwargs)
