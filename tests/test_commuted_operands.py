"""Commuted operands: a rule written as Mul(x, c) / Add(y, b) also takes Mul(c, x) / Add(b, y).

TVM's dpl already matches `relax.add` and `relax.multiply` calls in either operand order (measured below: it
tries the written order, then the swapped one); subtract and divide are not commuted. The rules rely on that
and say so with `rules.commutative`. Where a check can decline the first order that fits (a residual add
of two convs), the conv rules carry a swapped variant (`Spec.variants`; conv_epilogue_test). These tests
write every constant first and check the rule still fires, with the numbers of onnxruntime.
"""

from __future__ import annotations

import numpy as np
import pytest

from tvm_fusion import _tvm
from tvm_fusion._tvm import dpl, relax
from tvm_fusion.testing import GraphBuilder, check_fused


def _call(op, a, b):
    return getattr(relax.op, op)(a, b)


@pytest.mark.parametrize("op,commutes", [("add", True), ("multiply", True), ("subtract", False), ("divide", False)])
def test_dpl_matches_add_and_multiply_in_either_order(op, commutes):
    """A tripwire for TVM upgrades: the rules assume this of dpl."""
    x = relax.Var("x", _tvm.tensor_type((4,), "float32"))
    c = relax.const(np.arange(1, 5, dtype="float32"))
    pattern = dpl.is_op(f"relax.{op}")(dpl.wildcard(), dpl.is_const())
    assert pattern.match(_call(op, x, c))
    assert bool(pattern.match(_call(op, c, x))) == commutes


def f32(g, v):
    return g.const(np.asarray(v, np.float32))


def test_conv_bias_and_affine_with_constants_first(rules):
    """b + conv(x), then s * y and t + y (per channel), then HardSigmoid: one conv2d_bn_hardsigmoid kernel with
    b, s and t folded into the weights."""
    g = GraphBuilder(1)
    x = g.input("x", [1, 4, 6, 6])
    y = g.op("Add", [f32(g, g.rng.normal(0, 0.1, (8, 1, 1))), g.conv(x, 4, 8, bias=False)])
    y = g.op("Mul", [f32(g, g.rng.uniform(0.5, 1.5, (8, 1, 1))), y])
    y = g.op("Add", [f32(g, g.rng.normal(0, 0.1, (1, 8, 1, 1))), y])
    check_fused(g.model([g.op("HardSigmoid", [y])]), rules, expect={"conv2d_bn_hardsigmoid": 1})


@pytest.mark.parametrize("form", ["HardSigmoid(y)*y", "y*Clip(3+y)/6 (3 first)", "Clip(y+3)/6*y"])
def test_hardswish_with_operands_commuted(form, rules):
    g = GraphBuilder(2)
    x = g.input("x", [1, 4, 6, 6])
    y = g.conv(x, 4, 8)
    if form == "HardSigmoid(y)*y":
        out = g.op("Mul", [g.op("HardSigmoid", [y], alpha=1 / 6, beta=0.5), y])
    elif form == "y*Clip(3+y)/6 (3 first)":
        relu6 = g.op("Clip", [g.op("Add", [f32(g, 3.0), y]), f32(g, 0.0), f32(g, 6.0)])
        out = g.op("Div", [g.op("Mul", [y, relu6]), f32(g, 6.0)])
    else:
        relu6 = g.op("Clip", [g.op("Add", [y, f32(g, 3.0)]), f32(g, 0.0), f32(g, 6.0)])
        out = g.op("Mul", [g.op("Div", [relu6, f32(g, 6.0)]), y])
    check_fused(g.model([out]), rules, expect={"conv2d_bias_hardswish": 1})


def test_decomposed_layer_norm_with_constants_first(rules):
    """gamma * normed + ..., beta + ..., eps + var: the decomposed LayerNorm with every constant first."""
    g = GraphBuilder(3)
    x = g.input("x", [2, 5, 16])
    axes = g.const(np.array([-1], np.int64))
    centered = g.op("Sub", [x, g.op("ReduceMean", [x, axes])])
    var = g.op("ReduceMean", [g.op("Pow", [centered, f32(g, 2.0)]), axes])
    normed = g.op("Div", [centered, g.op("Sqrt", [g.op("Add", [f32(g, 1e-5), var])])])
    y = g.op("Add", [f32(g, g.rng.normal(0, 0.1, 16)), g.op("Mul", [f32(g, g.rng.uniform(0.5, 1.5, 16)), normed])])
    check_fused(g.model([y], opset=18), rules, expect={"layer_norm": 1})


def test_dense_layer_scale_constant_first(rules):
    """ConvNeXt's gamma * fc2(x): Mul(c, y) folds into the dense weights (dense_scale)."""
    g = GraphBuilder(4)
    x = g.input("x", [1, 3, 3, 16])
    y = g.op("Add", [g.op("MatMul", [x, f32(g, g.rng.normal(0, 0.2, (16, 8)))]), f32(g, g.rng.normal(0, 0.1, 8))])
    y = g.op("Mul", [f32(g, g.rng.uniform(0.5, 1.5, 8)), y])
    check_fused(g.model([y]), rules, expect={"dense_scale": 1})
