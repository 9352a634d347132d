"""The public surface: `tvm_fusion.__all__` is what the facade exports, each name resolves, and a submodule
named like a function of the API (`rules`, `build`, `profile`) is that module however it is reached, callable
as the function (`fuse`, `compile`, `compare`, `explain` are plain functions: their modules live in the stage
packages); `tvm_fusion.testing.__all__` lists what rule authors use."""

import importlib
import inspect
import subprocess
import sys
import types

import tvm_fusion as tf

FUNCTION_MODULES = ("build", "profile", "rules")


def test_every_name_in_all_resolves_and_nothing_else_is_exported():
    for name in tf.__all__:
        assert getattr(tf, name) is not None, name
    public = {n for n in dir(tf) if not n.startswith("_") and n != "annotations"
              and not isinstance(getattr(tf, n), types.ModuleType)}
    assert public <= set(tf.__all__), f"exported but not in __all__: {sorted(public - set(tf.__all__))}"
    assert len(tf.__all__) == len(set(tf.__all__))


def test_import_as_gives_the_module_and_calling_it_the_function():
    """In a fresh interpreter, whichever comes first: `import tvm_fusion.rules as r` is the module (it used
    to hand back the facade's function), and `tf.rules(...)` still returns the rule set."""
    script = """
import inspect, tvm_fusion as tf
import tvm_fusion.rules as r
import tvm_fusion.fusion.fuse as f
import tvm_fusion.deploy.compile as c
import tvm_fusion.build as b
assert r.__name__ == "tvm_fusion.rules" and r.RuleSet and r is tf.rules, r
assert f.__name__ == "tvm_fusion.fusion.fuse" and f.Matched and tf.fuse is not f and callable(tf.fuse), f
assert c.__name__ == "tvm_fusion.deploy.compile" and c.compile_model and callable(tf.compile), c
assert b.__name__ == "tvm_fusion.build" and b.build and b is tf.build, b
rules = tf.rules()
assert isinstance(rules, r.RuleSet) and "conv2d_bn_relu" in rules
assert list(inspect.signature(tf.fuse).parameters)[:3] == ["mod", "target", "rules"]
print("ok")
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


def test_function_modules_are_callable_as_their_function():
    for name in FUNCTION_MODULES:
        module = importlib.import_module(f"tvm_fusion.{name}")
        assert getattr(tf, name) is module and callable(module), name
    assert inspect.signature(tf.build) == inspect.signature(importlib.import_module("tvm_fusion.build.builder").build)
    assert "files" in inspect.signature(tf.rules).parameters
    assert "output" in inspect.signature(tf.compile).parameters


def test_functions_of_stage_modules_are_the_functions():
    """`fuse`, `compile`, `compare`, `explain` live in stage packages: the facade's name is the function."""
    assert tf.compare is importlib.import_module("tvm_fusion.check.compare").compare
    assert tf.explain is importlib.import_module("tvm_fusion.check.explain").explain
    assert list(inspect.signature(tf.fuse).parameters)[:3] == ["mod", "target", "rules"]


def test_testing_all_is_complete():
    """Every public function and class that tvm_fusion.testing defines is in its __all__, and each resolves."""
    from tvm_fusion import testing

    defined = {n for n, v in vars(testing).items() if not n.startswith("_")
               and (inspect.isfunction(v) or inspect.isclass(v)) and v.__module__ == testing.__name__}
    assert defined <= set(testing.__all__), sorted(defined - set(testing.__all__))
    assert {"check_rule_property", "check_family_property", "check_fused", "check_cuda_build"} <= set(testing.__all__)
    for name in testing.__all__:
        getattr(testing, name)
