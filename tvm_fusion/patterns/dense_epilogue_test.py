"""dense_epilogue rules: Gemm / MatMul + bias (+ relu), numerics and near misses."""

import numpy as np
import pytest

from tvm_fusion.testing import GELU_OPSET, GraphBuilder, apply_activation_onnx, check_fused, run_build


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


@pytest.mark.parametrize("form", ["Gelu", "erf-decomposed", "erf-dynamo", "erf-hf", "Gelu(tanh)", "tanh-decomposed",
                                  "Relu"])
def test_batched_matmul_bias_activation(form, rules):
    """A transformer FFN: [batch, seq, K] @ W + b over the last axis, then GELU (the op, and erf written out
    with the 0.5 where each exporter puts it; tanh) or ReLU."""
    g = GraphBuilder(2)
    x = g.input("x", [2, 5, 16])
    w = g.const(g.rng.normal(0, 0.3, (16, 24)).astype(np.float32), "w")
    b = g.const(g.rng.normal(0, 0.1, 24).astype(np.float32), "b")
    y = apply_activation_onnx(g, g.op("Add", [g.op("MatMul", [x, w]), b]), form)
    act = "relu" if form == "Relu" else "gelu_erf" if form == "Gelu" or form.startswith("erf") else "gelu_tanh"
    check_fused(g.model([y], opset=GELU_OPSET), rules, expect={f"dense_bias_{act}": 1})


def test_gemm_batch_norm_folds_into_weights(rules):
    g = GraphBuilder(3)
    x = g.input("x", [4, 10])
    w = g.const(g.rng.normal(0, 0.3, (6, 10)).astype(np.float32), "w")
    b = g.const(g.rng.normal(0, 0.1, 6).astype(np.float32), "b")
    y = g.bn(g.op("Gemm", [x, w, b], transB=1), 6)
    check_fused(g.model([g.op("Relu", [y])]), rules, expect={"dense_bn_relu": 1})


@pytest.mark.parametrize("constant_first", [True, False])
def test_layer_scale_folds_into_weights(constant_first, rules):
    """ConvNeXt's layer scale: gamma * (x @ W + b), gamma per output feature, either operand order."""
    g = GraphBuilder(5)
    x = g.input("x", [1, 4, 4, 16])
    w = g.const(g.rng.normal(0, 0.3, (16, 8)).astype(np.float32), "w")
    b = g.const(g.rng.normal(0, 0.1, 8).astype(np.float32), "b")
    gamma = g.const(g.rng.uniform(0.1, 1.0, 8).astype(np.float32), "gamma")
    y = g.op("Add", [g.op("MatMul", [x, w]), b])
    out = g.op("Mul", [gamma, y] if constant_first else [y, gamma])
    check_fused(g.model([out]), rules, expect={"dense_scale": 1})


def test_layer_scale_over_wrong_axis_declines_with_reason(rules):
    g = GraphBuilder(6)
    x = g.input("x", [3, 8])
    w = g.const(g.rng.normal(0, 0.3, (8, 5)).astype(np.float32), "w")
    b = g.const(g.rng.normal(0, 0.1, 5).astype(np.float32), "b")
    c = g.const(g.rng.uniform(0.5, 1.5, (3, 1)).astype(np.float32), "c")
    fused = check_fused(g.model([g.op("Mul", [c, g.op("Add", [g.op("MatMul", [x, w]), b])])]), rules,
                        expect={"dense_bias": 1})
    reasons = [d.reason for d in fused.fused.decisions if d.rule == "dense_scale"]
    assert reasons and "layer_scale constant has shape (3, 1)" in reasons[0]


def test_bias_over_wrong_axis_declines_with_reason(rules):
    g = GraphBuilder(4)
    x = g.input("x", [3, 8])
    w = g.const(g.rng.normal(0, 0.3, (8, 5)).astype(np.float32), "w")
    b = g.const(g.rng.normal(0, 0.1, (3, 1)).astype(np.float32), "b")
    # the bare matmul goes to batch_matmul (the rule for a matmul the dense rules leave), the add stays TVM's
    fused = check_fused(g.model([g.op("Add", [g.op("MatMul", [x, w]), b])]), rules, expect={"batch_matmul": 1})
    reasons = [d.reason for d in fused.fused.decisions if d.rule == "dense_bias"]
    assert reasons == ["bias_add constant has shape (3, 1); expected one value per output feature (5,) "
                       "broadcast over the last axis"]


# ---------------------------------------------------------------- property: over the family's domain
from hypothesis import strategies as st  # noqa: E402

from tvm_fusion.testing import ACTIVATION_FORMS, check_family_property  # noqa: E402


@st.composite
def dense_chains(draw):
    lead = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    k, n = draw(st.integers(1, 24)), draw(st.integers(1, 24))
    act = draw(st.sampled_from([None, *ACTIVATION_FORMS]))
    bn = len(lead) == 1 and draw(st.booleans())  # BatchNormalization of a Gemm output: [N, C]
    g = GraphBuilder(draw(st.integers(0, 2**16)))
    x = g.input("x", [*lead, k])
    w = g.const(g.rng.normal(0, 0.5, (k, n)).astype(np.float32))
    b = g.const(g.rng.normal(0, 0.1, n).astype(np.float32))
    y = g.op("Add", [b, g.op("MatMul", [x, w])] if draw(st.booleans()) else [g.op("MatMul", [x, w]), b])
    if bn:
        y = g.bn(y, n)
    if act:
        y = apply_activation_onnx(g, y, draw(st.sampled_from(ACTIVATION_FORMS[act])))
    name = ("dense_bn" if bn else "dense_bias") + (f"_{act}" if act else "")
    return g.model([y], opset=GELU_OPSET), name


def test_property_dense_family(rules):
    """Every generated dense chain is inside the family's domain: each one fires, with matching numbers."""
    check_family_property(dense_chains(), rules, min_share=1.0)


def test_golden_ir_of_batched_dense_bias_relu(rules):
    """main: x viewed as [rows, K], one call_tir of dense_bias_relu with W and b as constants, viewed back."""
    from tvm_fusion._tvm import tvm

    from tvm_fusion import _tvm
    from tvm_fusion._tvm import relax
    from tvm_fusion.build.builder import resolve_target
    from tvm_fusion.frontend.importer import import_onnx
    from tvm_fusion.fusion.fuse import fuse

    g = GraphBuilder(8)
    x = g.input("x", [2, 3, 4])
    w = g.rng.normal(0, 0.3, (4, 5)).astype(np.float32)
    b = g.rng.normal(0, 0.1, 5).astype(np.float32)
    y = g.op("Relu", [g.op("Add", [g.op("MatMul", [x, g.const(w)]), g.const(b)])])
    result = fuse(import_onnx(g.model([y])), resolve_target("llvm"), rules)
    gv = result.mod.get_global_var("dense_bias_relu")
    bb = relax.BlockBuilder()
    xv = relax.Var("x", _tvm.tensor_type((2, 3, 4), "float32"))
    with bb.function("main", [xv], {"num_input": 1}):
        with bb.dataflow():
            flat = bb.emit(relax.op.reshape(xv, (6, 4)))
            call = bb.emit(relax.call_tir(gv, [flat, relax.const(w), relax.const(b)],
                                          _tvm.tensor_type((6, 5), "float32")))
            out = bb.emit_output(relax.op.reshape(call, (2, 3, 5)))
        bb.emit_func_output(out)
    tvm.ir.assert_structural_equal(result.mod["main"], bb.get()["main"], map_free_vars=True)


def test_float64_declines_with_reason(rules):
    """float16 and bfloat16 fuse (tests/test_precision.py); float64 has no compute."""
    from onnx import TensorProto

    g = GraphBuilder(9)
    x = g.input("x", [2, 4], TensorProto.DOUBLE)
    w = g.const(g.rng.normal(0, 0.3, (4, 3)).astype(np.float64))
    b = g.const(g.rng.normal(0, 0.1, 3).astype(np.float64))
    model = g.model([g.op("Add", [g.op("MatMul", [x, w]), b])], dtype=TensorProto.DOUBLE)
    from tvm_fusion import explain

    reasons = [d.reason for d in explain(model, rules=rules).declined("dense_bias")]
    assert reasons == ["matmul dtype is float64; the compute supports float32, float16, bfloat16"]


@pytest.mark.parametrize("x_shape,bias_shape,out_shape", [
    ([2, 8], (1, 1, 5), (1, 2, 5)),
    ([1, 2, 8], (1, 1, 1, 5), (1, 1, 2, 5)),
    ([1, 2, 8], (5,), (1, 2, 5)),
    ([1, 2, 8], (1, 5), (1, 2, 5)),
])
def test_bias_of_higher_rank_keeps_the_output_shape(x_shape, bias_shape, out_shape, rules, matches_onnxruntime):
    """A regression: [2, K] @ W + b[1, 1, N] is [1, 2, N] in ONNX; the fused build returned [2, N]."""
    g = GraphBuilder(10)
    x = g.input("x", x_shape)
    w = g.const(g.rng.normal(0, 0.3, (8, 5)).astype(np.float32))
    b = g.const(g.rng.normal(0, 0.1, bias_shape).astype(np.float32))
    model = g.model([g.op("Add", [g.op("MatMul", [x, w]), b])])
    fused = check_fused(model, rules, expect={"dense_bias": 1})  # which compares the shapes first
    matches_onnxruntime(model, fused)
    assert run_build(fused, [np.zeros(x_shape, np.float32)])[0].shape == out_shape
