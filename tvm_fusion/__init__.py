"""tvm_fusion: pattern-based operator fusion for Apache TVM (Relax graph IR, TE computes).

    import tvm_fusion as tf
    mod = tf.import_onnx("model.onnx")                       # ONNX -> Relax, constants folded
    result = tf.fuse(mod, target="llvm")                     # fused module + per-rule counts
    built = tf.build(mod, target="cuda", mode="fused")       # 'unfused' | 'tvm' | 'fused'
    tf.compile("model.onnx", "model.so", target="cuda")      # library + model.so.json manifest
    print(tf.compare("model.onnx", target="llvm"))           # numerics, kernel counts, latency
    print(tf.check_groups("model.onnx"))                     # each fused group vs its unfused subgraph
    print(tf.bisect("model.onnx", rules=my_rules))           # which rule broke what
    tf.profile("model.onnx").write_html("report.html")       # per-kernel time, traffic, what to fuse next
"""

from __future__ import annotations

from .build import Built, build, resolve_target
from .compare import CompareReport, compare
from .compile import CompileResult, compile_model
from .differential import BisectReport, GroupReport, bisect, check_groups
from .errors import FusionError, ToleranceExceeded
from .examples import example_model, example_path
from .explain import Explanation, explain
from .frontend import import_onnx
from .fuse import FuseResult
from .fuse import fuse as _fuse
from .loader import load_rules, load_rules_for
from .profile import ProfileReport, profile
from .registry import register_compute, register_schedule
from .rules import Decline, Lowering, Match, Rule, RuleSet, Spec, commutative, decline, rule

__all__ = [
    "BisectReport", "Built", "CompareReport", "GroupReport", "bisect", "check_groups", "CompileResult", "Decline", "FuseResult", "FusionError", "Lowering", "Match",
    "Rule", "RuleSet", "Spec", "ToleranceExceeded", "build", "commutative", "compare", "compile", "decline",
    "Explanation", "example_model", "example_path", "explain", "fuse", "import_onnx", "load_rules", "ProfileReport", "profile", "register_compute",
    "register_schedule", "rule", "rules",
]

__version__ = "0.1.0"


def rules(files=(), only=None, disable=None) -> RuleSet:
    """The active rule set: built-in tables (fixed order), installed plugins, then `files`."""
    return load_rules_for(files, only=only, disable=disable)


def fuse(mod, target="llvm", rules: RuleSet | None = None, *, only=None, disable=None) -> FuseResult:
    """Run the fuse stage: returns the rewritten module and per-rule counts (`.counts`)."""
    rules = rules if rules is not None else load_rules_for(only=only, disable=disable)
    return _fuse(mod, resolve_target(target), rules)


def compile(model, output, target="cuda", **kwargs) -> CompileResult:  # noqa: A001 - mirrors the CLI verb
    """ONNX model -> library at `output` plus `<output>.json` manifest (see compile_model)."""
    return compile_model(model, output, target, **kwargs)
