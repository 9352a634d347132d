"""depthwise -> pointwise rules: each form is one kernel with exact counts, fused = unfused = onnxruntime
element by element (the dtype tolerance table) on llvm (the host's ISA; .ci/run runs this file again with
TVM_FUSION_CPU set to AVX2); declines with reasons; symbolic
batch, half precision, sanitized names, If branches; --disable, explain, the per-group check; the CUDA build
compiles for sm_90 (not run)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tvm_fusion.frontend.importer import SymDim
from tvm_fusion.schedules.llvm import depthwise_pointwise as dwpw_llvm
from tvm_fusion.testing import (GraphBuilder, apply_activation_onnx, check_cuda_build, check_fused, check_half,
                                check_symbolic_batch)

MEASURED_LOSSES = list(dwpw_llvm.LOSES)


@pytest.fixture(autouse=True)
def kernel_whatever_it_measured(monkeypatch):
    """The CPU schedule's measured declines off: these tests are of the kernel, on every tile the target's
    plan makes (AVX2's smaller ones included); `test_shapes_measured_slower_decline...` puts them back."""
    monkeypatch.setattr(dwpw_llvm, "LOSES", [])


ACT_FORMS = {"relu": "Relu", "relu6": "Clip", "hardswish": "HardSwish", "silu": "x*Sigmoid"}


def dwpw_block(g: GraphBuilder, x: str, c: int, o: int, *, k=3, stride=1, mult=1, bn=True, dw_act="relu6",
               pw_act=None, residual=None, bias=True) -> str:
    """conv(groups=C) -> [BN] -> act -> conv 1x1 -> [BN] -> [act | + residual]."""
    d = c * mult
    y = g.conv(x, c, d, k=k, stride=stride, pads=[k // 2] * 4, groups=c, bias=bias)
    y = apply_activation_onnx(g, g.bn(y, d) if bn else y, ACT_FORMS[dw_act])
    y = g.conv(y, d, o, k=1, pads=[0] * 4, bias=bias)
    y = g.bn(y, o) if bn else y
    if pw_act:
        y = apply_activation_onnx(g, y, ACT_FORMS[pw_act])
    if residual:
        y = g.op("Add", [y, residual])
    return y


def one_block(n=1, c=16, h=8, w=16, o=24, seed=3, **kw):
    g = GraphBuilder(seed)
    x = g.input("x", [n, c, h, w])
    return g.model([dwpw_block(g, g.op("Relu", [x]), c, o, **kw)])


CASES = [
    (dict(), "depthwise_bn_relu6_pointwise_bn"),
    (dict(dw_act="relu", pw_act="relu"), "depthwise_bn_relu_pointwise_bn_relu"),
    (dict(dw_act="hardswish", pw_act="relu6", bn=False), "depthwise_hardswish_pointwise_relu6"),
    (dict(dw_act="silu", k=5, stride=2, mult=2, bn=False), "depthwise_silu_pointwise"),
    (dict(stride=2, w=32), "depthwise_bn_relu6_pointwise_bn"),
]


@pytest.mark.parametrize("kw,rule", CASES, ids=[f"{r}-{i}" for i, (_, r) in enumerate(CASES)])
def test_block_is_one_kernel_that_matches(kw, rule, rules):
    check_fused(one_block(**kw), rules, expect={rule: 1})


@pytest.mark.parametrize("kw,measured", [
    (dict(stride=2, w=32), "a strided depthwise conv measured slower fused"),
    (dict(o=32), "more than 24 pointwise output channels measured slower fused"),
    (dict(o=16), "fewer than 64 depthwise channels"),
    (dict(c=64, o=23), "a register tile of fewer than 3 pointwise output channels"),
], ids=["strided", "wide", "shallow", "narrow-tile"])
def test_shapes_measured_slower_decline_on_the_cpu_with_the_measurement(kw, measured, rules, monkeypatch):
    """The CPU schedule declines the shapes where the fused kernel lost to the two conv kernels
    (benchmarks/depthwise_pointwise.py): two kernels, and the reason quotes the measurement. (23 channels:
    no divisor but 1 fits a register tile, on AVX-512 or AVX2.)"""
    monkeypatch.setattr(dwpw_llvm, "LOSES", MEASURED_LOSSES)
    model = one_block(**kw)
    check_fused(model, rules, expect={"conv2d_bn_relu6": 1, "conv2d_bn": 1})
    reasons = _declined(model, rules)
    assert reasons and all(measured in r and "Zen 4" in r for r in reasons), reasons


def test_inverted_residual_projection_takes_the_add(rules):
    """MobileNetV2's block: expand (conv2d_bn_relu6) -> dw -> project + x: two kernels, the add in the second."""
    g = GraphBuilder(5)
    x = g.input("x", [1, 16, 8, 16])
    e = apply_activation_onnx(g, g.bn(g.conv(x, 16, 48, k=1, pads=[0] * 4), 48), "Clip")
    y = dwpw_block(g, e, 48, 16, residual=x)
    check_fused(g.model([y]), rules, expect={"conv2d_bn_relu6": 1, "depthwise_bn_relu6_pointwise_bn_add": 1})


@pytest.mark.parametrize("kw,rule", [CASES[0], CASES[3]], ids=["bn_relu6", "silu_5x5_s2_m2"])
def test_cuda_build_compiles_for_sm_90(kw, rule, rules):
    check_cuda_build(one_block(**kw), rules, expect={rule: 1})


def _declined(model, rules, rule="depthwise_bn_relu6_pointwise_bn") -> list[str]:
    from tvm_fusion import explain

    return [d.reason for d in explain(model, rules=rules).declined(rule)]


def test_depthwise_output_with_a_second_consumer_declines(rules):
    """The depthwise output also read by another op (the multi-consumer pitfall): two conv kernels, the
    reason names the intermediate; the numbers still match."""
    g = GraphBuilder(7)
    x = g.input("x", [1, 16, 8, 16])
    d = apply_activation_onnx(g, g.bn(g.conv(x, 16, 16, pads=[1] * 4, groups=16), 16), "Clip")
    y = g.bn(g.conv(d, 16, 24, k=1, pads=[0] * 4), 24)
    model = g.model([y, g.op("ReduceMean", [d], axes=[2, 3], keepdims=1)], opset=17)
    check_fused(model, rules, expect={"conv2d_bn_relu6": 1, "conv2d_bn": 1})
    reasons = _declined(model, rules)
    assert reasons and all("consumer" in r or "outside" in r for r in reasons), reasons


def test_depthwise_output_that_is_a_graph_output_declines(rules):
    g = GraphBuilder(7)
    x = g.input("x", [1, 16, 8, 16])
    d = apply_activation_onnx(g, g.bn(g.conv(x, 16, 16, pads=[1] * 4, groups=16), 16), "Clip")
    y = g.bn(g.conv(d, 16, 24, k=1, pads=[0] * 4), 24)
    check_fused(g.model([y, d]), rules, expect={"conv2d_bn_relu6": 1, "conv2d_bn": 1})


def test_squeeze_excite_between_them_stays_the_squeeze_excite_rules(rules):
    """MobileNetV3 / EfficientNet: dw -> act -> SE -> pw. No depthwise_pointwise group; the SE rule takes the
    squeeze-excite, the conv rules the two convs."""
    from tvm_fusion.patterns.se_test import se_block

    g = GraphBuilder(8)
    x = g.input("x", [1, 16, 8, 16])
    d = apply_activation_onnx(g, g.bn(g.conv(x, 16, 16, pads=[1] * 4, groups=16), 16), "HardSwish")
    y = g.bn(g.conv(se_block(g, d, 16, 4), 16, 24, k=1, pads=[0] * 4), 24)
    check_fused(g.model([y], opset=18), rules, expect={"conv2d_bn_hardswish": 1, "squeeze_excite_relu_hardsigmoid": 1,
                                                       "conv2d_bn": 1})


@pytest.mark.parametrize("conv,reason", [
    (dict(groups=4, cout=16), "depthwise conv has groups == input channels"),
    (dict(k=7, pads=[3] * 4), "the kernel takes 3x3 or 5x5"),
    (dict(dilation=2, pads=[2] * 4), "dilation [2, 2]; expected 1"),
    (dict(stride=3), "strides 1 or 2"),
], ids=["grouped", "7x7", "dilated", "stride3"])
def test_unsupported_depthwise_convs_decline_with_the_reason(conv, reason, rules):
    g = GraphBuilder(9)
    x = g.input("x", [1, 16, 12, 16])
    cout = conv.pop("cout", 16)
    kw = dict(k=3, pads=[1] * 4, groups=16)
    kw.update(conv)
    d = apply_activation_onnx(g, g.bn(g.conv(x, 16, cout, **kw), cout), "Clip")
    model = g.model([g.bn(g.conv(d, cout, 24, k=1, pads=[0] * 4), 24)])
    check_fused(model, rules, expect={"conv2d_bn_relu6": 1, "conv2d_bn": 1})
    reasons = _declined(model, rules)
    assert reasons and all(reason in r for r in reasons), reasons


def test_a_3x3_second_conv_is_another_family_not_a_near_miss(rules):
    """A spatial second conv (or a plain first one: ResNet's conv -> conv) is the conv family's chain, not a
    depthwise -> pointwise one that failed a check: explain lists no decline of this family for it."""
    g = GraphBuilder(9)
    x = g.input("x", [1, 16, 8, 16])
    d = apply_activation_onnx(g, g.bn(g.conv(x, 16, 16, pads=[1] * 4, groups=16), 16), "Clip")
    model = g.model([g.bn(g.conv(d, 16, 24, k=3, pads=[1] * 4), 24)])
    check_fused(model, rules, expect={"conv2d_bn_relu6": 1, "conv2d_bn": 1})
    assert _declined(model, rules) == []


def test_a_plain_conv_chain_is_no_near_miss(rules):
    g = GraphBuilder(9)
    x = g.input("x", [1, 16, 8, 16])
    d = apply_activation_onnx(g, g.bn(g.conv(x, 16, 16, pads=[1] * 4), 16), "Relu")
    model = g.model([g.op("Add", [g.bn(g.conv(d, 16, 16, k=1, pads=[0] * 4), 16), x])])
    check_fused(model, rules, expect={"conv2d_bn_relu": 1, "conv2d_bn_add": 1})
    from tvm_fusion import explain

    assert [d for d in explain(model, rules=rules).declined() if d.rule.startswith("depthwise")] == []


def test_a_row_that_is_no_whole_vectors_declines_on_the_cpu(rules):
    """7 x 7 outputs: no tile of whole rows is whole vectors; the CPU schedule's reason, two conv kernels."""
    model = one_block(h=7, w=7)
    check_fused(model, rules, expect={"conv2d_bn_relu6": 1, "conv2d_bn": 1})
    assert any("no tile of whole output rows of 7 columns" in r for r in _declined(model, rules))


def test_symbolic_batch_is_one_kernel_at_every_batch(rules):
    g = GraphBuilder(11)
    x = g.input("x", ["N", 16, 8, 16])
    model = g.model([dwpw_block(g, g.op("Relu", [x]), 16, 24)])
    shapes = {"x": (SymDim("N"), 16, 8, 16)}
    expect = {"depthwise_bn_relu6_pointwise_bn": 1}
    check_symbolic_batch(model, shapes, rules, expect=expect)
    check_cuda_build(model, rules, expect=expect, shapes=shapes)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_block_is_one_kernel_computed_in_float32(dtype, rules):
    check_half(one_block(), dtype, rules, expect={"depthwise_bn_relu6_pointwise_bn": 1})


def test_names_to_sanitize_and_an_if_branch(rules):
    """An input named `x/0`, the block inside both branches of an If on a condition computed from the input
    (nothing folds it): one group per branch."""
    g = GraphBuilder(12)
    x = g.op("Relu", [g.input("x/0", [1, 16, 8, 16])])

    def branch(name, seed):
        b = GraphBuilder(seed)
        b.nodes, b.inits = [], []
        y = dwpw_block(b, x, 16, 24)
        out = b.op("Identity", [y])
        return helper.make_graph(b.nodes, name, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
                                 b.inits)

    cond = g.op("Greater", [g.op("ReduceSum", [x], keepdims=0), g.const(np.array(0, np.float32))])
    g.nodes.append(helper.make_node("If", [cond], ["z"], name="branch/0",
                                    then_branch=branch("then", 1), else_branch=branch("else", 2)))
    check_fused(g.model(["z"], opset=17), rules, expect={"depthwise_bn_relu6_pointwise_bn": 2})


def test_disable_explain_and_the_higher_priority(tmp_path, capsys, rules):
    from tvm_fusion.cli import main
    from tvm_fusion.patterns.priority import priority

    assert min(r.priority for r in rules if r.name.startswith("depthwise_")) > max(
        r.priority for r in rules if r.name.startswith("conv2d") and not r.name.endswith("_pool"))
    assert max(r.priority for r in rules if r.name.startswith("depthwise_")) < priority("squeeze_excite_<act>_sigmoid")
    path = tmp_path / "block.onnx"
    onnx.save(one_block(), str(path))
    assert main(["explain", str(path)]) == 0
    out = capsys.readouterr().out
    assert "rules fired: depthwise_bn_relu6_pointwise_bn 1" in out
    assert main(["explain", str(path), "--disable", "depthwise_bn_relu6_pointwise_bn"]) == 0
    out = capsys.readouterr().out
    assert "rules fired: conv2d_bn_relu6 1, conv2d_bn 1" in out


WRONG = '''
from tvm_fusion import rule
from tvm_fusion.patterns.depthwise_pointwise import dwpw_pattern
from tvm_fusion.rules import Spec


@rule("depthwise_pointwise_wrong", priority=10_000)
def depthwise_pointwise_wrong():
    """dw -> pw  ==>  one kernel with 1.01 * Wp (wrong on purpose)"""
    spec = dwpw_pattern(True, "relu6", "")

    def lower(m):
        low = spec.lower(m)
        low.constants[2] = low.constants[2] * 1.01
        return low

    return Spec(spec.pattern, spec.annotations, lower, spec.check)
'''


def test_per_group_check_and_bisect_cover_the_group(tmp_path, rules):
    from tvm_fusion.check.differential import bisect, check_groups
    from tvm_fusion.fusion.loader import load_rules_for

    model = one_block()
    good = check_groups(model, rules=rules)
    assert good.ok and [g.rule for g in good.groups] == ["depthwise_bn_relu6_pointwise_bn"]
    wrong = tmp_path / "wrong_dwpw.py"
    wrong.write_text(WRONG)
    bad = check_groups(model, rules=load_rules_for([wrong]))
    assert [(g.rule, g.stats.ok) for g in bad.groups] == [("depthwise_pointwise_wrong", False)]
    assert bisect(model, rules=load_rules_for([wrong])).culprits == ["depthwise_pointwise_wrong"]


def test_what_the_rule_does_with_a_block_follows_the_target(rules, monkeypatch):
    """64 -> 24 channels on 8 x 16 outputs, the measured declines on: AVX-512 (32 registers) tiles 3 channels x
    8 vectors and fuses; AVX2 (16 registers) has room for 1 channel and declines. On 56 x 56 outputs the conv
    family's own 1x1 on AVX-512 is the pixel-vectorized kernel, which measured faster as a kernel of its own."""
    from tvm_fusion.build.builder import resolve_target
    from tvm_fusion.hardware import cpu_facts

    monkeypatch.setattr(dwpw_llvm, "LOSES", MEASURED_LOSSES)
    model = one_block(c=64)
    if cpu_facts(resolve_target("llvm")).vector_registers >= 32:
        check_fused(model, rules, expect={"depthwise_bn_relu6_pointwise_bn": 1})
        large = one_block(c=64, h=56, w=56)
        check_fused(large, rules, expect={"conv2d_bn_relu6": 1, "conv2d_bn": 1})
        assert any("the pixel-vectorized one" in r for r in _declined(large, rules))
    else:
        check_fused(model, rules, expect={"conv2d_bn_relu6": 1, "conv2d_bn": 1})
        assert any("a register tile of fewer than 3" in r for r in _declined(model, rules))
