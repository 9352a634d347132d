"""The LayerNorm compute's numerics: rows with a large mean (x + 1e3, x + 1e4) against float64 NumPy with
float32's tolerance, on the llvm build of the fused kernel (plain and with the residual add)."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_fusion.build.builder import build
from tvm_fusion.frontend.importer import import_onnx
from tvm_fusion.testing import GraphBuilder, assert_close, run_build

LN_OPSET = 18
ROWS = 16


def _layer_norm64(h: np.ndarray, gamma, beta, eps: float) -> np.ndarray:
    h = h.astype(np.float64)
    mean = h.mean(-1, keepdims=True)
    var = ((h - mean) ** 2).mean(-1, keepdims=True)
    return (h - mean) / np.sqrt(var + eps) * gamma.astype(np.float64) + beta.astype(np.float64)


@pytest.mark.parametrize("residual", [False, True], ids=["layer_norm", "add_layer_norm"])
@pytest.mark.parametrize("c", [33, 100, 768])
@pytest.mark.parametrize("offset", [1e3, 1e4])
def test_rows_with_a_large_mean_match_float64(offset, c, residual):
    """A float32 mean of values near 1e4 is up to 4.9e-4 off by its own rounding, and every (h - mean) / std
    with it: the compute's mean and deviations are taken from the row shifted by its first value. With the
    mean formed at the row's magnitude (TVM's own layer_norm, the compute before) 768 values at x + 1e4 were
    1.1e-2 off; now ~2e-6."""
    g = GraphBuilder(c)
    x = g.input("x", [ROWS, c])
    h = g.op("Add", [x, g.input("r", [ROWS, c])]) if residual else x
    gamma, beta = g.rng.uniform(0.5, 1.5, c).astype(np.float32), g.rng.normal(0, 0.1, c).astype(np.float32)
    y = g.op("LayerNormalization", [h, g.const(gamma), g.const(beta)], axis=-1, epsilon=1e-5)
    fused = build(import_onnx(g.model([y], opset=LN_OPSET)), "llvm", "fused")
    assert {k: v for k, v in fused.counts.items() if v} == {"add_layer_norm" if residual else "layer_norm": 1}
    rng = np.random.default_rng(int(offset) + c)
    xs = (rng.normal(0, 1, (ROWS, c)) + offset).astype(np.float32)
    rs = rng.normal(0, 1, (ROWS, c)).astype(np.float32)
    (got,) = run_build(fused, [xs, rs] if residual else [xs])
    h32 = (xs + rs).astype(np.float32) if residual else xs  # the residual sum as ONNX computes it, in float32
    assert_close(got, _layer_norm64(h32, gamma, beta, 1e-5), f"LayerNorm of x + {offset:g}, C = {c}",
                 dtype="float32")
