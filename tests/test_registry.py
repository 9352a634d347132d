"""Registries refuse duplicates and answer unknown names with candidates."""

import pytest

from tvm_fusion import FusionError, decline, rule
from tvm_fusion.patterns.conv_epilogue import conv_epilogue
from tvm_fusion.registry import get_compute, register_compute, register_schedule
from tvm_fusion.rules import Match, RuleSet


def test_duplicate_rule_refused(rules):
    dup = rule("conv2d_bn_relu")(lambda: conv_epilogue(bn=True, activation="relu"))
    with pytest.raises(FusionError, match="duplicate rule 'conv2d_bn_relu'"):
        RuleSet([rules["conv2d_bn_relu"], dup])


def test_unknown_rule_lists_candidates(rules):
    with pytest.raises(FusionError, match="did you mean conv2d_bn_relu"):
        rules.select(disable=["conv2d_bn_rel"])


def test_unknown_compute_lists_candidates(rules):
    with pytest.raises(FusionError, match="no compute registered as 'conv2d_afine'; did you mean conv2d_affine"):
        get_compute("conv2d_afine", "llvm")


def test_duplicate_compute_and_schedule_refused(rules):
    with pytest.raises(FusionError, match="duplicate compute 'conv2d_affine'"):
        register_compute("conv2d_affine")(lambda *a, **k: None)
    with pytest.raises(FusionError, match="duplicate schedule 'conv2d_affine' for target 'llvm'"):
        register_schedule("conv2d_affine", target="llvm")(lambda *a: None)


def test_check_must_decline_with_a_reason():
    r = rule("bad", check=lambda m: False)(lambda: conv_epilogue(bn=True))
    with pytest.raises(FusionError, match="return None to accept or decline"):
        r.run_check(Match("bad", {}))
    ok = rule("good", check=lambda m: decline("no"))(lambda: conv_epilogue(bn=True))
    assert str(ok.run_check(Match("good", {}))) == "no"


def test_priority_order_is_documented_convention(rules):
    names = rules.names()
    assert names.index("conv2d_bn_add_relu") < names.index("conv2d_bn_relu") < names.index("conv2d_bn")


def test_builtin_priorities_come_from_the_one_table():
    """Every built-in rule's priority is its tier in patterns/priority.py plus its rank; none is shared."""
    from tvm_fusion.patterns import builtin_rules
    from tvm_fusion.patterns.priority import ACTIVATION_RANK, TIERS, priority

    def expected(name: str) -> int:
        if name in TIERS:
            return priority(name)
        for act in ACTIVATION_RANK:  # the same activation in two places (pointwise_relu6_depthwise_relu6)
            both = "_".join("<act>" if part == act else part for part in name.split("_"))
            if both.count("<act>") == 2 and both in TIERS:
                return priority(both, act)
        for act in ACTIVATION_RANK:  # the activation at the end (conv2d_bn_relu) or inside (conv2d_silu_add)
            parts = name.split("_")
            for i in range(len(parts)):
                tier = "_".join([*parts[:i], "<act>", *parts[i + len(act.split("_")):]])
                if "_".join(parts[i:i + len(act.split("_"))]) == act and tier in TIERS:
                    return priority(tier, act)
        prefix, _, n = name.rpartition("_")
        return priority(prefix + "_<n>", int(n))

    rules = builtin_rules().ordered()
    assert {r.name: r.priority for r in rules} == {r.name: expected(r.name) for r in rules}
    assert len({r.priority for r in rules}) == len(rules)


def test_builtin_rules_come_with_their_computes_and_schedules():
    """builtin_rules() alone, in a fresh interpreter, is a registry fuse() can use: no other import needed."""
    import subprocess
    import sys

    code = ("from tvm_fusion.build.builder import resolve_target\n"
            "from tvm_fusion.frontend.importer import import_onnx\n"
            "from tvm_fusion.fusion.fuse import fuse\n"
            "from tvm_fusion.patterns import builtin_rules\n"
            "from tvm_fusion.testing import conv_bn_relu\n"
            "for target in ('llvm', 'cuda'):\n"
            "    counts = fuse(import_onnx(conv_bn_relu()), resolve_target(target), builtin_rules()).counts\n"
            "    print(target, {k: v for k, v in counts.items() if v})\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["llvm {'conv2d_bn_relu': 1}", "cuda {'conv2d_bn_relu': 1}"]


def test_a_definition_loaded_again_is_not_a_duplicate():
    """A rules file loaded twice runs its registrations twice: the same definition is accepted, another
    definition under a taken name is refused (computes, schedules and epilogue activations alike)."""
    from tvm_fusion.patterns.activations import register_activation
    from tvm_fusion.registry import same_definition

    source = "def square(v, params, math):\n    return v * v\n"
    first, again, other = {"__name__": "user_rules_x"}, {"__name__": "user_rules_x"}, {"__name__": "user_rules_y"}
    for namespace in (first, again, other):
        exec(compile(source, "/tmp/user_rules_x.py", "exec"), namespace)  # noqa: S102 - a fixed string
    assert same_definition(first["square"], again["square"])
    assert not same_definition(first["square"], other["square"])
    with pytest.raises(FusionError, match="duplicate activation 'relu'"):
        register_activation("relu", lambda y: None, first["square"])


def test_compute_options_reach_only_the_computes_that_name_them():
    """A compute gets `fast_math` only when it names it: one written without it (a user's, from before the
    option existed) keeps working; an option name that does not exist is refused."""
    from tvm_fusion.registry import compute_options

    def old(x, *, alpha):
        return x

    def loose(x, **_):
        return x

    def named(x, *, fast_math=True):
        return x

    def targeted(x, *, target=None, **_):
        return x

    assert compute_options(old, fast_math=False, target="llvm") == {}
    assert compute_options(loose, fast_math=False, target="llvm") == {}
    assert compute_options(named, fast_math=False, target="llvm") == {"fast_math": False}
    assert compute_options(targeted, fast_math=False, target="llvm") == {"target": "llvm"}
    with pytest.raises(FusionError, match="unknown compute options \\['fast'\\]; known: fast_math, target"):
        compute_options(named, fast=True)


def test_an_activation_written_without_math_still_applies():
    """fn(v, params) (an activation from before the kernel's `math` argument) and fn(v, params, math) both
    apply; the second gets the kernel's exp / sigmoid / erf."""
    from tvm_fusion._tvm import tirx
    from tvm_fusion.schedules.activations import KernelMath, apply_activation, register_activation

    seen = []

    def doubled(v, params):
        return v * 2.0

    def tripled(v, params, math):
        seen.append(math)
        return v * 3.0

    register_activation("test_registry_doubled", doubled)
    register_activation("test_registry_tripled", tripled)
    v = tirx.Var("v", "float32")
    assert str(apply_activation(v, "test_registry_doubled", fast_math=True)) == str(v * 2.0)
    assert str(apply_activation(v, "test_registry_tripled", fast_math=False)) == str(v * 3.0)
    assert seen == [KernelMath(False)]
