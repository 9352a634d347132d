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
    m = tf.prepare("model.onnx", "llvm"); tf.compare(m); tf.profile(m)   # loaded and imported once, for several
"""

from __future__ import annotations

import importlib
import sys
import types
import typing

if typing.TYPE_CHECKING:  # the facade's annotations; at run time the names load lazily (_LAZY)
    from tvm_fusion.deploy.compile import CompileResult
    from tvm_fusion.fusion.fuse import FuseResult
    from tvm_fusion.rules import RuleSet

# Names load on first use (PEP 562), so `import tvm_fusion.runtime` on a deployment machine pulls in
# nothing of the compiler side.
_LAZY = {
    "BisectReport": "check.differential", "GroupReport": "check.differential", "bisect": "check.differential",
    "check_groups": "check.differential", "compare": "check.compare", "explain": "check.explain",
    "Built": "build.builder", "CompareReport": "check.compare", "CompileResult": "deploy.compile",
    "Explanation": "check.explain",
    "FuseResult": "fusion.fuse", "ProfileReport": "profile.measure",
    "FusionError": "errors", "ToleranceExceeded": "errors",
    "example_model": "examples", "example_path": "examples",
    "import_onnx": "frontend.importer", "SymDim": "frontend.importer",
    "load_rules": "fusion.loader",
    "register_compute": "registry", "register_schedule": "registry",
    "Decline": "rules", "Lowering": "rules", "Match": "rules", "Rule": "rules", "RuleSet": "rules",
    "Spec": "rules", "commutative": "rules", "decline": "rules", "rule": "rules",
    "load": "runtime", "Manifest": "runtime.manifest", "PreparedModel": "check.prepared", "prepare": "check.prepared",
    "TuneOptions": "build.tune", "TuneReport": "build.tune",
}

#: functions of the API named like a submodule: `tvm_fusion.<name>` is that submodule (`import tvm_fusion.rules
#: as r` gives the module), and calling it calls the function: the facade's below, or (None) the module's own
#: function of that name (`tf.build(...)` is `tvm_fusion.build.build(...)`)
_CALLABLE = {"build": None, "profile": None, "rules": "_rules"}

#: functions of the API defined here, whose modules live in the stage packages (tvm_fusion.fusion.fuse,
#: tvm_fusion.deploy.compile)
_FUNCTIONS = ("compile", "fuse")

__all__ = sorted([*_LAZY, *_CALLABLE, *_FUNCTIONS])


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    else:
        try:
            value = importlib.import_module(f".{name}", __name__)  # a submodule, e.g. tvm_fusion.frontend
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_CALLABLE))


class _CallableModule(types.ModuleType):
    """A submodule named like a function of the API, callable as that function (see _CALLABLE)."""

    def _function(self):
        name = self.__name__.rpartition(".")[2]
        facade = _CALLABLE[name]
        return globals()[facade] if facade else getattr(self, name)

    def __call__(self, *args, **kwargs):
        return self._function()(*args, **kwargs)

    @property
    def __signature__(self):
        import inspect

        return inspect.signature(self._function())


class _Package(types.ModuleType):
    """The import system sets a package attribute per submodule it loads: a submodule of _CALLABLE becomes
    callable as it is set, so `tvm_fusion.rules` is one object whichever way it was reached."""

    def __setattr__(self, name, value):
        if isinstance(value, types.ModuleType) and name in _CALLABLE and value.__name__ == f"{__name__}.{name}":
            value.__class__ = _CallableModule
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__version__ = "0.1.0"


def _rules(files=(), only=None, disable=None) -> RuleSet:
    """The active rule set: built-in tables (fixed order), installed plugins, then `files`."""
    from tvm_fusion.fusion.loader import load_rules_for  # local: the facade loads a stage when it is used

    return load_rules_for(files, only=only, disable=disable)


def fuse(mod, target="llvm", rules: RuleSet | None = None, *, only=None, disable=None) -> FuseResult:
    """Run the fuse stage: returns the rewritten module and per-rule counts (`.counts`)."""
    from tvm_fusion.build.builder import resolve_target  # local: the facade loads a stage when it is used
    from tvm_fusion.fusion.fuse import fuse as fuse_stage  # local: as above
    from tvm_fusion.fusion.loader import load_rules_for  # local: as above

    rules = rules if rules is not None else load_rules_for(only=only, disable=disable)
    return fuse_stage(mod, resolve_target(target), rules)


def compile(model, output, target="cuda", **kwargs) -> CompileResult:
    """ONNX model -> library at `output` plus `<output>.json` manifest (see compile_model)."""
    from tvm_fusion.deploy.compile import compile_model  # local: the facade loads a stage when it is used

    return compile_model(model, output, target, **kwargs)
