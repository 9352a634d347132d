"""elementwise rules: add + relu with a skip connection, chains of 3 to 6 ops, near misses."""

import numpy as np
import pytest

from tvm_fusion.testing import GraphBuilder, check_fused

OPS = ["Add", "Sub", "Mul", "Div", "Max", "Min"]
UNARY = ["Relu", "Sigmoid", "Tanh", "Exp", "Erf", "Neg"]


def test_add_relu_with_skip_connection_is_exact(rules):
    """relu(branch + skip): the add's other operand comes from outside the chain."""
    g = GraphBuilder(0)
    x = g.input("x", [2, 8, 6, 6])
    branch = g.op("Softmax", [x], axis=1)
    y = g.op("Relu", [g.op("Add", [branch, x])])
    fused = check_fused(g.model([y]), rules)
    assert fused.counts["add_relu"] == 1


@pytest.mark.parametrize("length", [3, 4, 5, 6])
def test_chain_of_length(length, rules):
    g = GraphBuilder(length)
    a = g.input("a", [3, 4, 7])
    b = g.input("b", [1, 4, 1])  # broadcast operand
    y = g.op("Add", [a, b])
    for i in range(1, length):
        if i % 2:
            y = g.op(UNARY[i % len(UNARY)], [y])
        else:
            other = g.const(g.rng.uniform(0.5, 1.5, (7,)).astype(np.float32)) if i % 4 else b
            y = g.op(OPS[i % len(OPS)], [other, y] if i % 3 else [y, other])
    check_fused(g.model([y]), rules, expect={f"elementwise_chain_{length}": 1})


def test_chain_declines_when_an_intermediate_escapes(rules):
    g = GraphBuilder(9)
    a, b = g.input("a", [4, 5]), g.input("b", [4, 5])
    mid = g.op("Mul", [g.op("Add", [a, b]), b])
    y = g.op("Exp", [g.op("Sigmoid", [mid])])
    fused = check_fused(g.model([y, mid]), rules)
    assert fused.counts["elementwise_chain_4"] == 0
    reasons = [d.reason for d in fused.fused.decisions if d.rule == "elementwise_chain_4"]
    assert reasons and "consumers" in reasons[0]
