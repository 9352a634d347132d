"""norm rules: LayerNorm (op and decomposed), with the residual add, and the multi-consumer stories."""

import numpy as np
import pytest

from tvm_fusion.build.builder import resolve_target
from tvm_fusion.frontend.importer import import_onnx
from tvm_fusion.fusion.fuse import fuse
from tvm_fusion.testing import GraphBuilder, check_cuda_build, check_fused, check_symbolic_batch, symbolic_shapes

LN_OPSET = 18


def layer_norm_onnx(g: GraphBuilder, h: str, c: int, decomposed: bool) -> str:
    gamma = g.const(g.rng.uniform(0.5, 1.5, c).astype(np.float32))
    beta = g.const(g.rng.normal(0, 0.1, c).astype(np.float32))
    if not decomposed:
        return g.op("LayerNormalization", [h, gamma, beta], axis=-1, epsilon=1e-5)
    axes = g.const(np.array([-1], np.int64))
    centered = g.op("Sub", [h, g.op("ReduceMean", [h, axes])])
    var = g.op("ReduceMean", [g.op("Pow", [centered, g.const(np.float32(2))]), axes])
    std = g.op("Sqrt", [g.op("Add", [var, g.const(np.float32(1e-5))])])
    return g.op("Add", [g.op("Mul", [g.op("Div", [centered, std]), gamma]), beta])


@pytest.mark.parametrize("decomposed", [False, True], ids=["op", "decomposed"])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("shape", [(2, 5, 16), (3, 768), (1, 7, 13)])
def test_layer_norm(decomposed, residual, shape, rules):
    g = GraphBuilder(1)
    x, r = g.input("x", list(shape)), g.input("r", list(shape))
    h = g.op("Add", [x, r]) if residual else x
    y = layer_norm_onnx(g, h, shape[-1], decomposed)
    check_fused(g.model([y], opset=LN_OPSET), rules, expect={"add_layer_norm" if residual else "layer_norm": 1})


@pytest.mark.parametrize("decomposed", [False, True], ids=["op", "decomposed"])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("shape", [("N", 5, 16), ("N", 2, 3, 8)], ids=["Nx5x16", "Nx2x3x8"])
def test_layer_norm_with_a_symbolic_batch_over_sequences(decomposed, residual, shape, rules):
    """[N, S, C] with N symbolic (a transformer with a dynamic batch) was declined ("the kernel takes 2-D rows
    only"): the kernel now takes [N, rows, C], one build runs at batch 1 and 3, the CUDA build compiles."""
    g = GraphBuilder(9)
    x, r = g.input("x", list(shape)), g.input("r", list(shape))
    y = layer_norm_onnx(g, g.op("Add", [x, r]) if residual else x, shape[-1], decomposed)
    model = g.model([y], opset=LN_OPSET)
    expect = {"add_layer_norm" if residual else "layer_norm": 1}
    check_symbolic_batch(model, symbolic_shapes(model), rules, expect=expect)
    if not decomposed:
        check_cuda_build(model, rules, expect=expect, shapes=symbolic_shapes(model, 64))


def test_layer_norm_kernel_views_a_symbolic_batch_as_n_rows_c(rules):
    g = GraphBuilder(10)
    x = g.input("x", ["N", 2, 3, 8])
    model = g.model([layer_norm_onnx(g, x, 8, decomposed=False)], opset=LN_OPSET)
    result = fuse(import_onnx(model, symbolic_shapes(model)), resolve_target("llvm"), rules)
    (call,) = [b.value for blk in result.mod["main"].body.blocks for b in blk.bindings
               if getattr(b.value.op, "name", None) == "relax.call_tir"]
    kernel = result.mod[call.args[0]]
    assert [str(p.shape) for p in kernel.params[:1]] == ["(N, 6, 8)"]


def test_post_ln_output_with_several_consumers_fuses(rules):
    """BERT (post-LN): the LayerNorm output feeds Q, K, V and the next residual add; it is the root."""
    g = GraphBuilder(2)
    x, r = g.input("x", [2, 4, 16]), g.input("r", [2, 4, 16])
    ln = layer_norm_onnx(g, g.op("Add", [x, r]), 16, decomposed=False)
    outs = [g.op("Tanh", [ln]), g.op("Sigmoid", [ln]), g.op("Add", [ln, x])]
    fused = check_fused(g.model(outs, opset=LN_OPSET), rules)
    assert fused.counts["add_layer_norm"] == 1


def test_pre_ln_residual_sum_with_second_consumer_declines(rules):
    """Pre-LN: the residual sum h = x + r is kept for the next residual, so it cannot be hidden."""
    g = GraphBuilder(3)
    x, r = g.input("x", [2, 4, 16]), g.input("r", [2, 4, 16])
    h = g.op("Add", [x, r])
    ln = layer_norm_onnx(g, h, 16, decomposed=True)
    fused = check_fused(g.model([ln, g.op("Mul", [h, h])], opset=LN_OPSET), rules)
    assert fused.counts["add_layer_norm"] == 0 and fused.counts["layer_norm"] == 1
    reasons = [d.reason for d in fused.fused.decisions if d.rule == "add_layer_norm"]
    assert reasons and "has 3 consumers" in reasons[0] and "Mul" in reasons[0]


def test_layer_norm_over_two_axes_declines(rules):
    g = GraphBuilder(4)
    x = g.input("x", [2, 4, 8])
    gamma = g.const(np.ones((4, 8), np.float32))
    beta = g.const(np.zeros((4, 8), np.float32))
    y = g.op("LayerNormalization", [x, gamma, beta], axis=-2, epsilon=1e-5)
    fused = check_fused(g.model([y], opset=LN_OPSET), rules, expect={})
    reasons = [d.reason for d in fused.fused.decisions if d.rule == "layer_norm"]
    assert reasons == ["layer_norm normalizes axes [1, 2]; the compute takes the last axis only"]


# ---------------------------------------------------------------- property: over the family's domain
from hypothesis import strategies as st  # noqa: E402

from tvm_fusion.testing import check_family_property  # noqa: E402


@st.composite
def layer_norms(draw):
    shape = draw(st.lists(st.integers(1, 5), min_size=1, max_size=2)) + [draw(st.integers(2, 40))]
    residual, decomposed = draw(st.booleans()), draw(st.booleans())
    g = GraphBuilder(draw(st.integers(0, 2**16)))
    x = g.input("x", shape)
    h = g.op("Add", [x, g.input("r", shape)]) if residual else x
    outs = [layer_norm_onnx(g, h, shape[-1], decomposed)]
    if residual and draw(st.integers(0, 3)) == 0:  # a near miss: the residual sum escapes
        outs.append(h)
    return g.model(outs, opset=LN_OPSET), "add_layer_norm" if residual else "layer_norm"


def test_property_norm_family(rules):
    """Each generated LayerNorm fuses with matching numbers or declines leaving the module unchanged; at least
    60% fire (11 of the 12 derandomized examples), the near misses (the residual sum escaping) decline."""
    fired, examples = check_family_property(layer_norms(), rules, min_share=0.6)
    assert fired < examples, "no generated near miss declined"


def test_golden_ir_of_add_layer_norm(rules):
    """main: one call_tir of add_layer_norm over both residual operands, gamma and beta as constants."""
    from tvm_fusion._tvm import tvm

    from tvm_fusion import _tvm
    from tvm_fusion._tvm import relax
    from tvm_fusion.build.builder import resolve_target
    from tvm_fusion.frontend.importer import import_onnx
    from tvm_fusion.fusion.fuse import fuse

    g = GraphBuilder(5)
    x, r = g.input("x", [3, 8]), g.input("r", [3, 8])
    gamma = g.rng.uniform(0.5, 1.5, 8).astype(np.float32)
    beta = g.rng.normal(0, 0.1, 8).astype(np.float32)
    y = g.op("LayerNormalization", [g.op("Add", [x, r]), g.const(gamma), g.const(beta)], axis=-1, epsilon=1e-5)
    result = fuse(import_onnx(g.model([y], opset=LN_OPSET)), resolve_target("llvm"), rules)
    gv = result.mod.get_global_var("add_layer_norm")
    assert float(result.groups[0].attrs["epsilon"]) == float(np.float32(1e-5))
    bb = relax.BlockBuilder()
    xv, rv = (relax.Var(n, _tvm.tensor_type((3, 8), "float32")) for n in ("x", "r"))
    with bb.function("main", [xv, rv], {"num_input": 2}):
        with bb.dataflow():
            out = bb.emit_output(relax.call_tir(gv, [xv, rv, relax.const(gamma), relax.const(beta)],
                                                _tvm.tensor_type((3, 8), "float32")))
        bb.emit_func_output(out)
    tvm.ir.assert_structural_equal(result.mod["main"], bb.get()["main"], map_free_vars=True)


def test_variance_with_wrong_power_declines(rules):
    g = GraphBuilder(6)
    x = g.input("x", [2, 8])
    axes = g.const(np.array([-1], np.int64))
    centered = g.op("Sub", [x, g.op("ReduceMean", [x, axes])])
    var = g.op("ReduceMean", [g.op("Pow", [centered, g.const(np.float32(3))]), axes])
    std = g.op("Sqrt", [g.op("Add", [var, g.const(np.float32(1e-5))])])
    gamma, beta = g.rng.uniform(0.5, 1.5, 8), g.rng.normal(0, 0.1, 8)  # not 1 / 0: the simplifier drops those
    y = g.op("Add", [g.op("Mul", [g.op("Div", [centered, std]), g.const(gamma.astype(np.float32))]),
                     g.const(beta.astype(np.float32))])
    from tvm_fusion import explain

    reasons = [d.reason for d in explain(g.model([y], opset=LN_OPSET), rules=rules).declined("layer_norm")]
    assert reasons == ["the variance uses power 3.0; LayerNorm needs 2"]


@pytest.mark.parametrize("shape", [(4, 1), (1, 4, 1)])
def test_gamma_over_another_axis_declines(shape, rules, matches_onnxruntime):
    """A regression: a decomposed LayerNorm over [2, 4, 4] whose gamma/beta have shape (C, 1) scale the rows
    (axis -2), not the features: with C == the last dim they were taken as one value per feature."""
    g = GraphBuilder(7)
    x = g.input("x", [2, 4, 4])
    axes = g.const(np.array([-1], np.int64))
    centered = g.op("Sub", [x, g.op("ReduceMean", [x, axes])])
    var = g.op("ReduceMean", [g.op("Pow", [centered, g.const(np.float32(2))]), axes])
    std = g.op("Sqrt", [g.op("Add", [var, g.const(np.float32(1e-5))])])
    gamma = g.const(g.rng.uniform(0.5, 1.5, shape).astype(np.float32))
    beta = g.const(g.rng.normal(0, 1, shape).astype(np.float32))
    model = g.model([g.op("Add", [g.op("Mul", [g.op("Div", [centered, std]), gamma]), beta])], opset=LN_OPSET)
    fused = check_fused(model, rules, expect={"elementwise_chain_5": 1})
    matches_onnxruntime(model, fused)
    reasons = [d.reason for d in fused.fused.decisions if d.rule == "layer_norm"]
    assert reasons == [f"gamma has shape {shape}; expected one value per feature (4,) broadcast over the last axis "
                       "of (2, 4, 4)"]
