"""`compare --per-group` and `--bisect`: a deliberately wrong rule is named by its group, its ONNX nodes
and its rule, groups after it are judged on the true intermediate values, and bisect blames it."""

from pathlib import Path

import onnx
import pytest

from tvm_fusion.cli import main
from tvm_fusion.check.differential import bisect, check_groups
from tvm_fusion.fusion.loader import load_rules_for
from tvm_fusion.testing import GraphBuilder, conv_bn_relu

WRONG_RULES = Path(__file__).parent / "wrong_rules.py"  # conv -> relu lowered with its weights scaled by 1.01


def _three_groups():
    """conv-bn-relu -> conv-relu -> conv-bn-relu: only the middle one is a conv2d_relu."""
    g = GraphBuilder(seed=3)
    x = g.input("x", [1, 4, 9, 9])
    y = g.op("Relu", [g.bn(g.conv(x, 4, 8), 8)])
    y = g.op("Relu", [g.conv(y, 8, 8, bias=False)])
    y = g.op("Relu", [g.bn(g.conv(y, 8, 8), 8)])
    return g.model([y])


@pytest.fixture()
def wrong_rules():
    return WRONG_RULES


@pytest.fixture()
def model_path(tmp_path):
    path = tmp_path / "three_groups.onnx"
    onnx.save(_three_groups(), str(path))
    return str(path)


def _middle_nodes(model) -> list[str]:
    """The ONNX names of the middle conv and its relu."""
    conv = [n for n in model.graph.node if n.op_type == "Conv"][1]
    relu = next(n for n in model.graph.node if n.op_type == "Relu" and n.input[0] == conv.output[0])
    return [conv.name, relu.name]


def test_per_group_names_the_wrong_group_only(wrong_rules):
    model = _three_groups()
    report = check_groups(model, rules=load_rules_for([wrong_rules]))
    assert [(g.rule, g.stats.ok) for g in report.groups] == [
        ("conv2d_bn_relu", True), ("conv2d_relu_wrong", False), ("conv2d_bn_relu", True)]
    conv, relu = _middle_nodes(model)
    assert report.groups[1].onnx_nodes == [conv, relu]
    assert 0.005 < report.groups[1].stats.max_rel < 0.02  # the 1.01 weight scale, seen through relu
    assert not report.outputs[0].ok and not report.ok
    assert report.first_failure().startswith(f"group 1 (rule conv2d_relu_wrong; ONNX nodes {conv}, {relu}) is "
                                             "the first over tolerance")


def test_per_group_passes_with_the_builtin_rules():
    report = check_groups(_three_groups())
    assert report.ok and [g.rule for g in report.groups] == ["conv2d_bn_relu", "conv2d_relu", "conv2d_bn_relu"]
    assert all(g.stats.n_bad == 0 for g in report.groups)
    assert "PASS: all 3 groups within tolerance" in str(report)


def test_bisect_blames_the_wrong_rule(wrong_rules):
    report = bisect(_three_groups(), rules=load_rules_for([wrong_rules]))
    assert report.culprits == ["conv2d_relu_wrong"]
    assert report.steps == [(["conv2d_relu_wrong"], True, report.steps[0][2])]
    assert "culprit: rule(s) conv2d_relu_wrong: 1 group(s) over tolerance" in report.verdict
    assert "--disable conv2d_relu_wrong" in report.verdict


def test_bisect_of_a_good_model_has_nothing_to_do():
    report = bisect(conv_bn_relu())
    assert report.culprits == [] and report.steps == []
    assert report.verdict.startswith("nothing to bisect")


def test_cli_per_group_exits_1_and_names_the_group(capsys, model_path, wrong_rules):
    rc = main(["compare", model_path, "--rules", str(wrong_rules), "--per-group"])
    out, err = capsys.readouterr()
    assert rc == 1
    assert "FAIL: 1 of 3 groups over tolerance" in out
    conv, relu = _middle_nodes(_three_groups())
    assert err.startswith(f"error: group 1 (rule conv2d_relu_wrong; ONNX nodes {conv}, {relu})")
    assert "--bisect" in err


def test_cli_bisect_reports_the_culprit(capsys, model_path, wrong_rules):
    rc = main(["compare", model_path, "--rules", str(wrong_rules), "--bisect"])
    out, err = capsys.readouterr()
    assert rc == 1
    assert "disable conv2d_relu_wrong: PASS" in out
    assert "culprit: rule(s) conv2d_relu_wrong" in err


def test_cli_per_group_passes(capsys, model_path):
    assert main(["compare", model_path, "--per-group"]) == 0
    assert "PASS: all 3 groups within tolerance" in capsys.readouterr().out


def test_cli_per_group_on_cuda(capsys, model_path):
    """Without a GPU: exit 2 and say why; with one: the CUDA groups pass."""
    from tvm_fusion.check.compare import gpu_available

    rc = main(["compare", model_path, "--per-group", "--target", "cuda"])
    out, err = capsys.readouterr()
    if gpu_available()[0]:
        assert rc == 0 and "PASS: all 3 groups within tolerance" in out
    else:
        assert rc == 2
        assert "per-group check runs the builds, and --target cuda needs a GPU" in err and "--target llvm" in err


WRONG_TWICE = Path(__file__).parent / "wrong_rules_twice.py"  # the same 1.01 mistake at priorities 10000 and 9000


def test_bisect_keeps_going_when_a_lower_priority_rule_makes_the_same_mistake():
    """Disabling the blamed rule lets the next one take the same match and fail the same way: bisect
    disables it too, and blames both, instead of ending with 'no culprit'."""
    report = bisect(_three_groups(), rules=load_rules_for([WRONG_TWICE]))
    assert report.culprits == ["conv2d_relu_wrong_high", "conv2d_relu_wrong_low"]
    assert [(disabled, passed) for disabled, passed, _ in report.steps] == [
        (["conv2d_relu_wrong_high"], False), (["conv2d_relu_wrong_high", "conv2d_relu_wrong_low"], True)]
    assert "groups over tolerance: conv2d_relu_wrong_low" in report.steps[0][2]
    assert report.verdict.startswith("culprit: rule(s) conv2d_relu_wrong_high, conv2d_relu_wrong_low: 2 group(s) "
                                     "over tolerance, first group 1 (rule conv2d_relu_wrong_high;")
    assert report.verdict.endswith("--disable conv2d_relu_wrong_high --disable conv2d_relu_wrong_low")


def test_cli_bisect_reports_every_culprit(capsys, model_path):
    rc = main(["compare", model_path, "--rules", str(WRONG_TWICE), "--bisect"])
    out, err = capsys.readouterr()
    assert rc == 1
    assert "disable conv2d_relu_wrong_high: FAIL" in out
    assert "disable conv2d_relu_wrong_high, conv2d_relu_wrong_low: PASS" in out
    assert "--disable conv2d_relu_wrong_high --disable conv2d_relu_wrong_low" in err
