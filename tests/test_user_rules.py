"""Rules from a user's file and from an installed plugin (entry-point group tvm_fusion.rules)."""

import textwrap

import numpy as np
import pytest

from tvm_fusion import FusionError, load_rules
from tvm_fusion.fusion.loader import load_rules_for
from tvm_fusion.testing import GraphBuilder, check_fused

USER_RULE = textwrap.dedent('''
    from tvm_fusion import rule
    from tvm_fusion._tvm import dpl
    from tvm_fusion.patterns.activations import clip_bounds
    from tvm_fusion.patterns.conv_epilogue import conv_checks, conv_epilogue, lower_conv
    from tvm_fusion.rules import Spec

    @rule("conv2d_bn_clip", priority=350, check=conv_checks)
    def conv2d_bn_clip():
        """conv2d -> [add bias] -> batch_norm -> clip(lo, hi)  ==>  conv2d_bn_clip(x, W', b'; lo, hi)"""
        conv_bn = conv_epilogue(bn=True)
        clip = dpl.is_op("relax.clip")(conv_bn.pattern, dpl.wildcard(), dpl.wildcard())

        def lower(match):
            lo, hi = clip_bounds(match.value("clip"))
            return lower_conv(match, "clip", {"min": lo, "max": hi})

        return Spec(clip, {**conv_bn.annotations, "clip": clip, "root": clip}, lower)
''')


def _conv_bn_clip():
    """A ReLU-N: Clip(-1, 4) after conv -> BN, bounds the built-in relu6 declines."""
    g = GraphBuilder(4)
    x = g.input("x", [2, 6, 9, 9])
    lo, hi = g.const(np.float32(-1)), g.const(np.float32(4))
    return g.model([g.op("Clip", [g.bn(g.conv(x, 6, 6), 6), lo, hi])])


def test_readme_rule_from_a_file(tmp_path):
    path = tmp_path / "my_rules.py"
    path.write_text(USER_RULE)
    rules = load_rules_for([path])
    assert rules["conv2d_bn_clip"].source == str(path)
    check_fused(_conv_bn_clip(), rules, expect={"conv2d_bn_clip": 1})
    without = load_rules_for()
    check_fused(_conv_bn_clip(), without, expect={"conv2d_bn": 1})


def test_rule_file_errors_name_the_file(tmp_path):
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(FusionError, match=f"{empty}: defines no rules"):
        load_rules(empty)
    broken = tmp_path / "broken.py"
    broken.write_text("import tvm_fusion\nraise RuntimeError('boom')\n")
    with pytest.raises(FusionError, match=f"{broken}: failed to load rules: RuntimeError: boom"):
        load_rules(broken)


def test_a_rules_folder_loads_its_rule_modules_and_passes_over_helpers_and_tests(tmp_path):
    """A folder: its rule modules load; a helper module that defines no rule and a test beside them do not
    count; a module that fails to load still names itself; a folder with no rule at all is refused."""
    (tmp_path / "my_rules.py").write_text(USER_RULE)
    (tmp_path / "shapes_helper.py").write_text("x = 1\n")
    (tmp_path / "test_my_rules.py").write_text("raise RuntimeError('a test is not loaded as rules')\n")
    assert [r.name for r in load_rules(tmp_path)] == ["conv2d_bn_clip"]
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(FusionError, match=f"{tmp_path / 'broken.py'}: failed to load rules: RuntimeError: boom"):
        load_rules(tmp_path)
    helpers = tmp_path / "helpers"
    helpers.mkdir()
    (helpers / "shapes_helper.py").write_text("x = 1\n")
    with pytest.raises(FusionError, match="a directory whose modules define no rules"):
        load_rules(helpers)


def test_duplicate_of_builtin_refused(tmp_path):
    path = tmp_path / "dup.py"
    path.write_text(USER_RULE.replace('"conv2d_bn_clip"', '"conv2d_bn_relu"'))
    with pytest.raises(FusionError, match="duplicate rule 'conv2d_bn_relu'"):
        load_rules_for([path])


def test_plugin_entry_point(monkeypatch, tmp_path):
    """An installed package exposes a module of rules under the entry-point group tvm_fusion.rules."""
    import importlib.metadata
    import sys

    (tmp_path / "fancy_rules.py").write_text(USER_RULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = importlib.metadata.EntryPoint(name="fancy", value="fancy_rules", group="tvm_fusion.rules")
    real = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group=None, **kw: [ep] if group == "tvm_fusion.rules" else real(group=group, **kw))
    rules = load_rules_for()
    assert "conv2d_bn_clip" in rules
    sys.modules.pop("fancy_rules", None)
