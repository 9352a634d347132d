"""pointwise -> depthwise rules: each form is one kernel with exact counts, fused = unfused = onnxruntime
element by element (the dtype tolerance table) on llvm (the host's ISA; .ci/run runs this file again with
TVM_FUSION_CPU set to AVX2); declines with reasons (the measured ones quote the measurement); symbolic batch,
half precision, sanitized names, If branches; --disable, explain, the per-group check; on CUDA the rules
decline (no schedule) and the conv rules take the two convs."""

from __future__ import annotations

import onnx
import pytest

from tvm_fusion.frontend.importer import SymDim
from tvm_fusion.schedules.llvm import pointwise_depthwise as pwdw_llvm
from tvm_fusion.testing import (GraphBuilder, apply_activation_onnx, block_in_if_branches, check_cuda_build,
                                check_fused, check_half, check_symbolic_batch, check_wrong_rule_is_blamed)

MEASURED_LOSSES = list(pwdw_llvm.LOSES)
ACT_FORMS = {"relu": "Relu", "relu6": "Clip", "hardswish": "HardSwish", "silu": "x*Sigmoid"}


@pytest.fixture(autouse=True)
def kernel_whatever_it_measured(monkeypatch):
    """The CPU schedule's measured declines off: these tests are of the kernel, on every shape the target's
    plan takes; `test_shapes_measured_slower_decline...` puts them back."""
    monkeypatch.setattr(pwdw_llvm, "LOSES", [])


def pwdw_block(g: GraphBuilder, x: str, c: int, d: int, *, k=3, stride=2, bn=True, act="relu6", bias=True,
               dw_act=None, pads=None) -> str:
    """conv 1x1 -> [BN] -> act -> conv(groups=D) -> [BN] -> act (`dw_act`: another one; `pads`: the depthwise
    conv's, K // 2 on every side by default)."""
    y = apply_activation_onnx(g, g.bn(g.conv(x, c, d, k=1, pads=[0] * 4, bias=bias), d) if bn else
                              g.conv(x, c, d, k=1, pads=[0] * 4, bias=bias), ACT_FORMS[act])
    y = g.conv(y, d, d, k=k, stride=stride, pads=pads or [k // 2] * 4, groups=d, bias=bias)
    return apply_activation_onnx(g, g.bn(y, d) if bn else y, ACT_FORMS[dw_act or act])


def one_block(n=1, c=16, h=14, w=14, d=32, seed=3, **kw):
    g = GraphBuilder(seed)
    x = g.input("x", [n, c, h, w])
    return g.model([pwdw_block(g, g.op("Relu", [x]), c, d, **kw)])


CASES = [
    (dict(), "pointwise_bn_relu6_depthwise_bn_relu6"),
    (dict(act="relu", bn=False), "pointwise_relu_depthwise_relu"),
    (dict(act="hardswish", k=5), "pointwise_bn_hardswish_depthwise_bn_hardswish"),
    (dict(act="silu", bn=False, k=5, h=15, w=13), "pointwise_silu_depthwise_silu"),
    (dict(stride=1, h=11, w=9), "pointwise_bn_relu6_depthwise_bn_relu6"),
    # TensorFlow's SAME padding of a strided conv (tf2onnx): nothing above and left, one row and column below
    (dict(pads=[0, 0, 1, 1], h=16, w=16), "pointwise_bn_relu6_depthwise_bn_relu6"),
]


@pytest.mark.parametrize("kw,rule", CASES, ids=[f"{r}-{i}" for i, (_, r) in enumerate(CASES)])
def test_block_is_one_kernel_that_matches(kw, rule, rules):
    check_fused(one_block(**kw), rules, expect={rule: 1})


def _declined(model, rules, rule="pointwise_bn_relu6_depthwise_bn_relu6") -> list[str]:
    from tvm_fusion import explain

    return [d.reason for d in explain(model, rules=rules).declined(rule)]


@pytest.mark.parametrize("kw,measured", [
    (dict(stride=1), "a stride-1 depthwise conv measured slower fused"),
    (dict(c=96, d=576), "more input channels of the 1x1 conv than its target's bound"),
], ids=["stride1", "deep"])
def test_shapes_measured_slower_decline_on_the_cpu_with_the_measurement(kw, measured, rules, monkeypatch):
    """The CPU schedule declines the shapes where the fused kernel lost to the two conv kernels
    (benchmarks/pointwise_depthwise.py): two kernels, and the reason quotes the measurement."""
    monkeypatch.setattr(pwdw_llvm, "LOSES", MEASURED_LOSSES)
    model = one_block(**kw)
    check_fused(model, rules, expect={"conv2d_bn_relu6": 2})
    reasons = _declined(model, rules)
    assert reasons and all(measured in r and "Intel Xeon" in r for r in reasons), reasons


def test_mobilenet_v2_strided_expand_fuses_with_its_measured_declines(rules, monkeypatch):
    """MobileNetV2's first strided block (16 -> 96, 3x3/2) keeps fusing with the measured declines on."""
    monkeypatch.setattr(pwdw_llvm, "LOSES", MEASURED_LOSSES)
    check_fused(one_block(c=16, d=96, h=28, w=28), rules, expect={"pointwise_bn_relu6_depthwise_bn_relu6": 1})


def test_expanded_tensor_with_a_second_consumer_declines(rules):
    """The expanded tensor also read by another op (the multi-consumer pitfall): two conv kernels, the
    reason names the intermediate; the numbers still match."""
    g = GraphBuilder(7)
    x = g.input("x", [1, 16, 14, 14])
    e = apply_activation_onnx(g, g.bn(g.conv(x, 16, 32, k=1, pads=[0] * 4), 32), "Clip")
    y = apply_activation_onnx(g, g.bn(g.conv(e, 32, 32, stride=2, pads=[1] * 4, groups=32), 32), "Clip")
    model = g.model([y, g.op("ReduceMean", [e], axes=[2, 3], keepdims=1)], opset=17)
    check_fused(model, rules, expect={"conv2d_bn_relu6": 2})
    reasons = _declined(model, rules)
    assert reasons and all("consumer" in r or "outside" in r for r in reasons), reasons


def test_expanded_tensor_that_is_a_graph_output_declines(rules):
    g = GraphBuilder(7)
    x = g.input("x", [1, 16, 14, 14])
    e = apply_activation_onnx(g, g.bn(g.conv(x, 16, 32, k=1, pads=[0] * 4), 32), "Clip")
    y = apply_activation_onnx(g, g.bn(g.conv(e, 32, 32, stride=2, pads=[1] * 4, groups=32), 32), "Clip")
    check_fused(g.model([y, e]), rules, expect={"conv2d_bn_relu6": 2})


def test_two_activations_are_the_conv_rules(rules):
    """An expand with one activation and a depthwise conv with another: no rule of this family."""
    check_fused(one_block(act="relu6", dw_act="relu"), rules, expect={"conv2d_bn_relu6": 1, "conv2d_bn_relu": 1})


@pytest.mark.parametrize("conv,reason", [
    (dict(groups=8), "a depthwise conv of multiplier 1 has groups == input channels"),
    (dict(cout=64), "a depthwise conv of multiplier 1 has groups == input channels"),
    (dict(k=7, pads=[3] * 4), "the kernel takes 3x3 or 5x5"),
    (dict(dilation=2, pads=[2] * 4), "dilation [2, 2]; expected 1"),
    (dict(stride=3), "strides 1 or 2"),
], ids=["grouped", "multiplier2", "7x7", "dilated", "stride3"])
def test_unsupported_depthwise_convs_decline_with_the_reason(conv, reason, rules):
    g = GraphBuilder(9)
    x = g.input("x", [1, 16, 14, 14])
    e = apply_activation_onnx(g, g.bn(g.conv(x, 16, 32, k=1, pads=[0] * 4), 32), "Clip")
    cout = conv.pop("cout", 32)
    kw = dict(k=3, pads=[1] * 4, groups=32)
    kw.update(conv)
    model = g.model([apply_activation_onnx(g, g.bn(g.conv(e, 32, cout, **kw), cout), "Clip")])
    check_fused(model, rules, expect={"conv2d_bn_relu6": 2})
    reasons = _declined(model, rules)
    assert reasons and all(reason in r for r in reasons), reasons


@pytest.mark.parametrize("shared", [False, True], ids=["one_consumer", "second_consumer"])
def test_a_strided_or_padded_first_conv_declines_and_a_spatial_one_is_another_family(shared, rules):
    """A 1x1 first conv with a stride: a near miss with the reason; a 3x3 one (ResNet's conv -> conv, or
    MobileNetV2's stem -> depthwise) is the conv family's chain: explain lists no decline of this family for
    it, also when its intermediate has a second consumer (which alone would keep the two convs apart)."""
    for k, stride, near in ((1, 2, True), (3, 1, False)):
        g = GraphBuilder(9)
        x = g.input("x", [1, 16, 14, 14])
        e = apply_activation_onnx(g, g.bn(g.conv(x, 16, 32, k=k, stride=stride, pads=[k // 2] * 4), 32), "Clip")
        y = apply_activation_onnx(g, g.bn(g.conv(e, 32, 32, stride=2, pads=[1] * 4, groups=32), 32), "Clip")
        model = g.model([y, g.op("Sigmoid", [e])] if shared else [y])
        check_fused(model, rules, expect={"conv2d_bn_relu6": 2})
        reasons = _declined(model, rules)
        if near:  # the near miss names what keeps the pair apart: the second consumer first
            why = "has 2 consumers" if shared else "a pointwise conv is 1x1, groups 1, stride 1"
            assert reasons and all(why in r for r in reasons), reasons
        else:
            assert reasons == []


def test_expanded_channels_that_are_no_whole_vectors_decline_on_the_cpu(rules):
    model = one_block(d=20)
    check_fused(model, rules, expect={"conv2d_bn_relu6": 2})
    assert any("20 expanded channels, not whole vectors" in r for r in _declined(model, rules))


def test_symbolic_batch_is_one_kernel_at_every_batch(rules):
    g = GraphBuilder(11)
    x = g.input("x", ["N", 16, 14, 14])
    model = g.model([pwdw_block(g, g.op("Relu", [x]), 16, 32)])
    check_symbolic_batch(model, {"x": (SymDim("N"), 16, 14, 14)}, rules,
                         expect={"pointwise_bn_relu6_depthwise_bn_relu6": 1})


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_block_is_one_kernel(dtype, rules):
    check_half(one_block(), dtype, rules, expect={"pointwise_bn_relu6_depthwise_bn_relu6": 1})


def test_names_to_sanitize_and_an_if_branch(rules):
    """An input named `x/0`, the block inside both branches of an If on a condition computed from the input
    (nothing folds it): one group per branch."""
    g = GraphBuilder(12)
    x = g.op("Relu", [g.input("x/0", [1, 16, 14, 14])])
    out = block_in_if_branches(g, x, lambda b, x_: pwdw_block(b, x_, 16, 32))
    check_fused(g.model([out], opset=17), rules, expect={"pointwise_bn_relu6_depthwise_bn_relu6": 2})


def test_cuda_declines_for_want_of_a_schedule_and_the_conv_rules_take_it(rules):
    model = one_block()
    check_cuda_build(model, rules, expect={"conv2d_bn_relu6": 2})
    from tvm_fusion import explain
    from tvm_fusion.build.builder import resolve_target

    reasons = [d.reason for d in explain(model, target=resolve_target("cuda", "sm_90"), rules=rules).declined(
        "pointwise_bn_relu6_depthwise_bn_relu6")]
    assert reasons and all("no cuda schedule is registered" in r for r in reasons), reasons


def test_disable_explain_and_the_priority(tmp_path, capsys, rules):
    from tvm_fusion.cli import main

    mine = [r.priority for r in rules if r.name.startswith("pointwise_")]
    assert min(mine) > max(r.priority for r in rules if r.name.startswith(("conv2d", "depthwise_"))
                           and not r.name.endswith("_pool"))
    assert len(set(mine)) == len(mine) == 8
    path = tmp_path / "block.onnx"
    onnx.save(one_block(), str(path))
    assert main(["explain", str(path)]) == 0
    assert "rules fired: pointwise_bn_relu6_depthwise_bn_relu6 1" in capsys.readouterr().out
    assert main(["explain", str(path), "--disable", "pointwise_bn_relu6_depthwise_bn_relu6"]) == 0
    assert "rules fired: conv2d_bn_relu6 2" in capsys.readouterr().out


def test_per_group_check_and_bisect_cover_the_group(rules):
    from tvm_fusion.check.differential import check_groups
    from tvm_fusion.patterns.pointwise_depthwise import pwdw_pattern

    model = one_block()
    good = check_groups(model, rules=rules)
    assert good.ok and [g.rule for g in good.groups] == ["pointwise_bn_relu6_depthwise_bn_relu6"]
    check_wrong_rule_is_blamed(model, rules, "pointwise_depthwise_wrong", pwdw_pattern(True, "relu6"), constant=2)
