"""activations: a decomposed activation whose constants are near but not equal to the canonical ones is
computed with the constants it matched (carried as the group's activation params), element by element
equal to onnxruntime; a constant the compute hard-codes must be exact."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_fusion.testing import GELU_OPSET, GraphBuilder, check_fused

SIXTH = 1 / 6 + 9.9e-5  # a HardSigmoid alpha 1e-4 away from hardswish's 1/6


def _f32(v: float) -> float:
    return float(np.float32(v))


def _conv_then(act) -> tuple:
    """conv (with bias) -> act(y): the model, with act(g, y) appending the activation's ONNX nodes."""
    g = GraphBuilder(11)
    x = g.input("x", [1, 4, 10, 10])
    y = act(g, g.conv(x, 4, 8))
    return g.model([y], opset=GELU_OPSET)


def _c(g, v):
    return g.const(np.array(v, np.float32))


def _hardswish_clip(shift, divisor):
    def act(g, y):
        relu6 = g.op("Clip", [g.op("Add", [y, _c(g, shift)]), _c(g, 0.0), _c(g, 6.0)])
        return g.op("Div", [g.op("Mul", [y, relu6]), _c(g, divisor)])
    return act


def _gelu_erf(divisor, one, half):
    def act(g, y):
        erf = g.op("Erf", [g.op("Div", [y, _c(g, divisor)])])
        return g.op("Mul", [g.op("Mul", [y, g.op("Add", [erf, _c(g, one)])]), _c(g, half)])
    return act


def _gelu_tanh(k, c, one, half, power=3.0):
    def act(g, y):
        cube = g.op("Pow", [y, _c(g, power)])
        inner = g.op("Mul", [g.op("Add", [y, g.op("Mul", [cube, _c(g, k)])]), _c(g, c)])
        return g.op("Mul", [g.op("Mul", [y, g.op("Add", [g.op("Tanh", [inner]), _c(g, one)])]), _c(g, half)])
    return act


SQRT2, TANH_C = 1.4142135381698608, 0.7978845834732056
#: name -> (activation builder, rule, the activation params the group must carry)
NEAR_MISSES = {
    "x*HardSigmoid(alpha=1/6+9.9e-5)": (
        lambda g, y: g.op("Mul", [y, g.op("HardSigmoid", [y], alpha=SIXTH, beta=0.5)]),
        "conv2d_bias_hardswish", {"alpha": _f32(SIXTH), "beta": 0.5}),
    "x*HardSigmoid(beta=0.5+9.9e-5)": (
        lambda g, y: g.op("Mul", [y, g.op("HardSigmoid", [y], alpha=1 / 6, beta=0.5 + 9.9e-5)]),
        "conv2d_bias_hardswish", {"alpha": _f32(1 / 6), "beta": _f32(0.5 + 9.9e-5)}),
    "x*Clip(x+3.00029)/6": (_hardswish_clip(3.00029, 6.0), "conv2d_bias_hardswish",
                            {"shift": _f32(3.00029), "divisor": 6.0}),
    "gelu_erf(half=0.50009)": (_gelu_erf(SQRT2, 1.0, 0.50009), "conv2d_bias_gelu_erf",
                               {"divisor": _f32(SQRT2), "one": 1.0, "half": _f32(0.50009)}),
    "gelu_tanh(k=0.044805, half=0.50009)": (_gelu_tanh(0.044805, TANH_C, 1.0, 0.50009), "conv2d_bias_gelu_tanh",
                                            {"k": _f32(0.044805), "c": _f32(TANH_C), "one": 1.0,
                                             "half": _f32(0.50009)}),
}


@pytest.mark.parametrize("case", NEAR_MISSES)
def test_near_miss_constants_are_carried_into_the_compute(case, rules, matches_onnxruntime):
    act, rule_name, params = NEAR_MISSES[case]
    model = _conv_then(act)
    fused = check_fused(model, rules, expect={rule_name: 1})
    matches_onnxruntime(model, fused)
    assert fused.fused.groups[0].attrs["activation_params"] == params


@pytest.mark.parametrize("case", ["x*HardSigmoid(alpha=1/6+9.9e-5)", "gelu_tanh(k=0.044805, half=0.50009)"])
def test_near_miss_constants_on_a_dense(case, rules, matches_onnxruntime):
    """The same carried constants through the dense epilogue's compute."""
    act, rule_name, params = NEAR_MISSES[case]
    g = GraphBuilder(12)
    x = g.input("x", [3, 16])
    w = g.const(g.rng.normal(0, 0.6, (16, 8)).astype(np.float32))
    y = act(g, g.op("Add", [g.op("MatMul", [x, w]), g.const(g.rng.normal(0, 0.1, 8).astype(np.float32))]))
    model = g.model([y], opset=GELU_OPSET)
    fused = check_fused(model, rules, expect={rule_name.replace("conv2d", "dense"): 1})
    matches_onnxruntime(model, fused)
    assert fused.fused.groups[0].attrs["activation_params"] == params


@pytest.mark.parametrize("act,rule_name,reason", [
    (_gelu_tanh(0.044715, TANH_C, 1.0, 0.5, power=3.0001), "conv2d_bias_gelu_tanh",
     "the power is 3.0000998973846436; gelu_tanh needs exactly 3"),
    (_hardswish_clip(3.0, 6.01), "conv2d_bias_hardswish", "the divisor is 6.010000228881836; hardswish needs 6"),
    (_gelu_erf(1.5, 1.0, 0.5), "conv2d_bias_gelu_erf",
     "the erf argument's divisor is 1.5; gelu needs 1.41421"),
])
def test_constants_that_do_not_make_the_activation_decline(act, rule_name, reason, rules):
    from tvm_fusion import explain

    reasons = [d.reason for d in explain(_conv_then(act), rules=rules).declined(rule_name)]
    assert reasons == [reason]
