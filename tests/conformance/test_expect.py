"""The conformance suite's checks can fail: a fused build that disagrees with the unfused one fails a test
even where the test is an expected failure, an expected failure that passes fails, and the unfused build is
made only where the fuse stage changed the module."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_fusion import rule
from tvm_fusion.errors import FusionMismatch
from tvm_fusion.fusion.loader import load_rules_for
from tvm_fusion.patterns.conv_epilogue import conv_epilogue
from tvm_fusion.rules import RuleSet
from tvm_fusion.testing import GraphBuilder, conv_bn_relu

from .expect import FusedBackend, expect_failure

WHY = "results differ from the ONNX reference (TVM's op implementation)"


def _conv_relu():
    g = GraphBuilder(2)
    return g.model([g.op("Relu", [g.conv(g.input("x", [1, 3, 8, 8]), 3, 8, bias=False)])])


def _rules_with(lower):
    """The built-in rules plus conv2d -> relu at top priority, lowered by `lower`."""
    spec = conv_epilogue(bn=False, bias=False, activation="relu")

    @rule("conv2d_relu_under_test", priority=10_000)
    def conv2d_relu_under_test():
        """conv2d -> relu  ==>  conv2d_relu(x, W)   (lowered by the test's `lower`)"""
        return type(spec)(spec.pattern, spec.annotations, lambda m: lower(spec.lower(m)))

    return RuleSet([*load_rules_for().ordered(), conv2d_relu_under_test])


def _scaled(low):  # wrong on purpose: the weights scaled by 1.01
    low.constants[0] = low.constants[0] * 1.01
    return low


def _broken(low):
    raise RuntimeError("this lowering is broken on purpose")


def _expected_failure_running(model, rules):
    """A suite test that is expected to fail: it runs the model, then fails against its reference."""

    def test():
        FusedBackend.prepare(model, rules=rules).run([np.ones((1, 3, 8, 8), np.float32)])
        raise AssertionError("Not equal to tolerance (the ONNX reference, outside tvm_fusion)")

    return expect_failure(test, WHY)


def test_expected_failure_is_xfailed_with_its_reason():
    with pytest.raises(pytest.xfail.Exception, match=r"results differ .*: AssertionError: Not equal"):
        _expected_failure_running(_conv_relu(), None)()


def test_wrong_fusion_inside_an_expected_failure_fails():
    with pytest.raises(FusionMismatch, match=r"output 0: fused vs unfused: \d+ of \d+ elements off"):
        _expected_failure_running(_conv_relu(), _rules_with(_scaled))()


def test_fused_build_failing_where_unfused_runs_fails():
    with pytest.raises(FusionMismatch, match=r"the fused build failed to build \(FusionError: .*broken on "
                                             r"purpose.*\); the unfused build of the same module ran"):
        _expected_failure_running(_conv_relu(), _rules_with(_broken))()


def test_expected_failure_that_passes_fails():
    with pytest.raises(pytest.fail.Exception, match="Unexpected success: expected to fail"):
        expect_failure(lambda: None, WHY)()


def test_unfused_build_only_where_the_module_changed():
    """A rule fired: checked against the unfused build; nothing fired: the structural check suffices."""
    fired = FusedBackend.prepare(conv_bn_relu())
    fired.run([np.ones((1, 8, 12, 12), np.float32)])
    g = GraphBuilder()
    plain = FusedBackend.prepare(g.model([g.op("Relu", [g.input("x", [2, 3])])]))
    (out,) = plain.run([np.full((2, 3), -1.0, np.float32)])
    assert not out.any()
    assert list(fired.checked_against_unfused.values()) == [True]
    assert list(plain.checked_against_unfused.values()) == [False]


def test_expected_failures_name_each_test_once_and_round_trip():
    """expected_failures.py is what update_expected.py writes from its own tables, each test written once."""
    from pathlib import Path

    from . import expected_failures as ef
    from .update_expected import render

    written = [n for table in (ef.FAIL_WITH_SIMPLIFIER, ef.FIXED_BY_SIMPLIFIER, ef.SIMPLIFIER_BREAKS)
               for names in table.values() for n in names]
    assert len(written) == len(set(written))
    assert set(ef.SIMPLIFIER_FIXES) <= {n for names in ef.EXPECTED_FAILURES.values() for n in names}
    text = Path(ef.__file__).read_text()
    assert render(text, ef.EXPECTED_FAILURES, ef.SIMPLIFIER_FIXES, ef.SIMPLIFIER_BREAKS) == text
