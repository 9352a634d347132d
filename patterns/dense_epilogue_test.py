"""dense_epilogue rules: Gemm / MatMul + bias (+ relu), numerics and near misses."""

import numpy as np
import pytest

from tvm_fusion.testing import GraphBuilder, check_fused


def _gemm(relu: bool, batch=3, k=20, n=12, seed=0):
    g = GraphBuilder(seed)
    x = g.input("x", [batch, k])
    w = g.const(g.rng.normal(0, 0.3, (n, k)).astype(np.float32), "w")
    b = g.const(g.rng.normal(0, 0.1, n).astype(np.float32), "b")
    y = g.op("Gemm", [x, w, b], transB=1)
    return g.model([g.op("Relu", [y]) if relu else y])


@pytest.mark.parametrize("relu,rule", [(True, "dense_bias_relu"), (False, "dense_bias")])
def test_gemm_bias(relu, rule, rules):
    check_fused(_gemm(relu), rules, expect={rule: 1})


def test_matmul_add_with_bias_first(rules):
    """add(b, matmul(x, W)): operand order of the add does not matter."""
    g = GraphBuilder(1)
    x = g.input("x", [2, 16])
    w = g.const(g.rng.normal(0, 0.3, (16, 8)).astype(np.float32), "w")
    b = g.const(g.rng.normal(0, 0.1, 8).astype(np.float32), "b")
    y = g.op("Add", [b, g.op("MatMul", [x, w])])
    check_fused(g.model([y]), rules, expect={"dense_bias": 1})


def test_batched_matmul_declines_with_reason(rules):
    g = GraphBuilder(2)
    x = g.input("x", [2, 3, 16])
    w = g.const(g.rng.normal(0, 0.3, (16, 8)).astype(np.float32), "w")
    b = g.const(g.rng.normal(0, 0.1, 8).astype(np.float32), "b")
    fused = check_fused(g.model([g.op("Add", [g.op("MatMul", [x, w]), b])]), rules, expect={})
    reasons = [d.reason for d in fused.fused.decisions if d.rule == "dense_bias"]
    assert reasons and "ranks 3 and 2" in reasons[0]
