"""QDQ models: a DequantizeLinear of a constant folds into a float weight; a QuantizeLinear -> DequantizeLinear
pair is one fake quantization, alone, in an elementwise chain or in a conv / dense epilogue, equal to
onnxruntime's unoptimized session (the graph as ONNX defines it) element for element where the arithmetic
is the same (ties, saturation, x / s rather than x * (1 / s)); pairs it cannot take decline with a reason."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import tvm_fusion as tf
from tvm_fusion import _tvm
from tvm_fusion._tvm import relax
from tvm_fusion.check.explain import op_counts
from tvm_fusion.check.io import random_inputs, run_onnxruntime
from tvm_fusion.testing import GraphBuilder, as_float16, check_cuda_build, encoder, run_build

INT8 = (np.int8, -128, 127)
UINT8 = (np.uint8, 0, 255)


def qdq(g: GraphBuilder, y: str, scale: float, zero_point: int, dtype=np.int8, dq=None) -> str:
    """y -> QuantizeLinear(scale, zero_point) -> DequantizeLinear (with `dq` = (scale, zero point) if given)."""
    s, z = g.const(np.float32(scale), "s"), g.const(dtype(zero_point), "z")
    ds, dz = (s, z) if dq is None else (g.const(np.float32(dq[0]), "s"), g.const(dtype(dq[1]), "z"))
    return g.op("DequantizeLinear", [g.op("QuantizeLinear", [y, s, z]), ds, dz])


def mlas_fake_quant(x, scale, zero_point, qmin, qmax, dq=None):
    """onnxruntime's arithmetic (MLAS QuantizeLinear, then DequantizeLinear) in float32, in numpy."""
    s, z = np.float32(scale), zero_point
    ds, dz = (s, z) if dq is None else (np.float32(dq[0]), dq[1])
    r = np.rint(np.clip(x.astype(np.float32) / s, np.float32(qmin - z), np.float32(qmax - z)))
    return ((r.astype(np.int32) + z - dz).astype(np.float32) * ds).astype(np.float32)


def reference(model, feeds) -> list[np.ndarray]:
    """onnxruntime with its graph optimizations off: the QDQ graph as written (optimized, it runs int8
    kernels whose rounding differs: that noise is the verify step's)."""
    sess, _ = run_onnxruntime(model, feeds, optimize=False)
    return sess.run(None, feeds)


def fused_outputs(model, feeds, expect: dict, shapes=None):
    built = tf.build(tf.import_onnx(model, shapes), "llvm", "fused")
    assert {k: v for k, v in built.counts.items() if v} == expect
    return built, run_build(built, [feeds[i.name] for i in model.graph.input])


def assert_identical(got, want, what: str):
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape)
    differ = got != want
    assert not differ.any(), (f"{what}: {int(differ.sum())} of {got.size} elements differ; first at "
                              f"{np.argwhere(differ)[0]}: {got[differ][0]} vs {want[differ][0]}")


def division_cases(scale: float, qmin: int, qmax: int, zero_point: int) -> np.ndarray:
    """Values at and one ulp around each half step (x / s = k + 0.5), those where x / s and x * (1 / s) round
    apart, and values far past both saturation bounds."""
    s = np.float32(scale)
    halves = (np.arange(qmin - zero_point - 2, qmax - zero_point + 2) + 0.5).astype(np.float32) * s
    near = np.concatenate([halves, np.nextafter(halves, np.float32(np.inf)), np.nextafter(halves, -np.float32(np.inf))])
    apart = near[np.rint(near / s) != np.rint(near * (np.float32(1) / s))]
    return np.concatenate([near, apart, np.float32([1e6, -1e6, 0.0, -0.0])]).astype(np.float32), apart


def _pair_model(n: int, scale, zero_point, dtype, dq=None, name="x"):
    g = GraphBuilder()
    return g.model([qdq(g, g.input(name, [1, n]), scale, zero_point, dtype, dq)], opset=13)


@pytest.mark.parametrize("scale, zero_point, kind, dq", [
    (0.1, -3, INT8, None),           # an inexact scale: x / s and x * (1 / s) round differently
    (0.0625, 0, INT8, None),         # a power of two: exact half steps, ties to even
    (0.0173, 128, UINT8, None),
    (0.05, 10, UINT8, (0.025, 12)),  # dequantized with other constants
])
def test_pair_alone_is_onnxruntimes_exactly(scale, zero_point, kind, dq):
    dtype, qmin, qmax = kind
    x, apart = division_cases(scale, qmin, qmax, zero_point)
    if scale == 0.1:
        assert len(apart) >= 10  # the case that tells division from the reciprocal product is in the input
    model = _pair_model(x.size, scale, zero_point, dtype, dq)
    feeds = {"x": x[None]}
    _, (got,) = fused_outputs(model, feeds, {"fake_quant": 1})
    (want,) = reference(model, feeds)
    assert_identical(want, mlas_fake_quant(x[None], scale, zero_point, qmin, qmax, dq), "numpy's MLAS vs onnxruntime")
    assert_identical(got, want, "fused fake_quant vs onnxruntime")


def test_dequantized_product_is_not_fused_into_the_next_add():
    """erf-like values -> QDQ (2/255, 0) -> + 1 -> QDQ (2/255, -128), as onnxruntime calibrates a GELU's pairs:
    (q * 2/255 + 1) / (2/255) is halfway between two steps for every q, and which way it rounds depends on the
    product being rounded before the add. A fused multiply-add (TVM's LLVM contracts a * b + c) moved 1.6% of
    a GELU's values by a step; the fake quantization's product is kept separate, so none moves."""
    g = GraphBuilder(11)
    y = qdq(g, g.op("Add", [qdq(g, g.input("x", [1, 4096]), 2 / 255, 0), g.const(np.float32(1.0))]), 2 / 255, -128)
    model = g.model([y], opset=13)
    feeds = {"x": np.linspace(-1, 1, 4096, dtype=np.float32)[None]}
    _, (got,) = fused_outputs(model, feeds, {"elementwise_chain_3": 1})
    assert_identical(got, reference(model, feeds)[0], "QDQ -> Add -> QDQ at halfway points")


def _quantized_weight(g: GraphBuilder, w: np.ndarray, axis: int | None, dtype=np.int8):
    """DequantizeLinear(int weight, scale, zero point): per-tensor (axis None) or per-channel along `axis`;
    returns (the DequantizeLinear's output, the float weight onnxruntime computes)."""
    info = np.iinfo(dtype)
    red = tuple(i for i in range(w.ndim) if i != axis) if axis is not None else None
    scale = (np.abs(w).max(axis=red) / 100).astype(np.float32)
    zp = np.zeros_like(scale, dtype=dtype) + (0 if dtype == np.int8 else 128)
    shape = [1] * w.ndim
    if axis is not None:
        shape[axis] = -1
    q = np.clip(np.rint(w / scale.reshape(shape)) + zp.reshape(shape).astype(np.int32), info.min, info.max).astype(dtype)
    attrs = {} if axis is None else {"axis": axis}
    out = g.op("DequantizeLinear", [g.const(q, "wq"), g.const(scale, "ws"), g.const(zp, "wz")], **attrs)
    return out, ((q.astype(np.int32) - zp.reshape(shape)).astype(np.float32) * scale.reshape(shape)).astype(np.float32)


def _qdq_conv(relu: bool, zero_point: int, axis=0, bias=True):
    """QDQ'd input -> Conv(DequantizeLinear(int8 W, per channel), DequantizeLinear(int32 b)) -> [Relu] -> QDQ."""
    g = GraphBuilder(3)
    x = qdq(g, g.input("x", [1, 6, 9, 9]), 0.03, 2)
    w, w_float = _quantized_weight(g, g.rng.normal(0, 0.3, (8, 6, 3, 3)).astype(np.float32), axis)
    ins = [x, w]
    if bias:
        b_scale = (np.float32(0.03) * np.abs(w_float).reshape(8, -1).max(1) / 100).astype(np.float32)
        b_q = g.rng.integers(-2000, 2000, 8).astype(np.int32)
        ins.append(g.op("DequantizeLinear", [g.const(b_q, "bq"), g.const(b_scale, "bs"),
                                             g.const(np.zeros(8, np.int32), "bz")], axis=0))
    y = g.op("Conv", ins, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    if relu:
        y = g.op("Relu", [y])
    return g.model([qdq(g, y, 0.04, zero_point)], opset=13), w_float


def test_weight_dequantize_folds_at_import():
    """No dequantize of a constant is left after import: the per-channel int8 weight and the int32 bias are
    float32 constants, the weight equal to float(w - z) * s; the two activation pairs stay."""
    model, w_float = _qdq_conv(relu=False, zero_point=0)
    mod = tf.import_onnx(model)
    dequantized = _calls(mod, "relax.dequantize")
    assert len(dequantized) == 2 and not any(_tvm.is_constant(c.args[0]) for c in dequantized)
    (conv,) = _calls(mod, "relax.nn.conv2d")
    assert np.array_equal(_tvm.constant_value(conv.args[1]), w_float)


def _calls(mod, op: str) -> list:
    out = []
    relax.analysis.post_order_visit(mod["main"], lambda e: out.append(e) if isinstance(e, relax.Call) and getattr(
        e.op, "name", "") == op else None)
    return out


@pytest.mark.parametrize("relu, zero_point", [(True, 0), (False, -128)])
def test_conv_epilogue_fake_quant(relu, zero_point):
    """conv (+ relu, kept by a symmetric quantizer) -> Q -> DQ is one kernel, element for element
    onnxruntime's; the relu is carried as the fake quantization's inner activation."""
    model, _ = _qdq_conv(relu, zero_point)
    feeds = random_inputs(model, seed=1)
    built, (got,) = fused_outputs(model, feeds, {"conv2d_bias_fake_quant": 1, "fake_quant": 1})
    assert_identical(got, reference(model, feeds)[0], "conv epilogue fake quantization")
    (group,) = [grp for grp in built.fused.groups if grp.rule == "conv2d_bias_fake_quant"]
    params = group.attrs["activation_params"]
    assert params.get("inner") == ("relu" if relu else None) and params["zero_point"] == zero_point
    text = str(tf.explain(model))  # explain names each group's fake quantization
    assert f"fake quantization{' after relu' if relu else ''}: int8 scale 0.04 zero point {zero_point}" in text, text


def _qdq_dense(split_bias: bool, per_channel: bool):
    """QDQ'd x [2, 5, 16] -> MatMul(DequantizeLinear(uint8 W)) -> Add b -> Q -> DQ, or with the MatMul's own
    Q -> DQ before the Add (a MatMul and an Add quantized one by one)."""
    g = GraphBuilder(4)
    x = qdq(g, g.input("x", [2, 5, 16]), 0.02, 0)
    w, _ = _quantized_weight(g, g.rng.normal(0, 0.3, (16, 12)).astype(np.float32), 1 if per_channel else None, np.uint8)
    y = g.op("MatMul", [x, w])
    if split_bias:
        y = qdq(g, y, 0.05, 3)
    y = g.op("Add", [y, g.const(g.rng.normal(0, 0.2, 12).astype(np.float32), "b")])
    return g.model([qdq(g, y, 0.05, -7)], opset=13)


@pytest.mark.parametrize("split_bias, per_channel, expect", [
    (False, False, {"dense_bias_fake_quant": 1, "fake_quant": 1}),
    (True, True, {"dense_fake_quant": 1, "elementwise_chain_2": 1, "fake_quant": 1}),
])
def test_dense_epilogue_fake_quant(split_bias, per_channel, expect):
    model = _qdq_dense(split_bias, per_channel)
    feeds = random_inputs(model, seed=2)
    _, (got,) = fused_outputs(model, feeds, expect)
    assert_identical(got, reference(model, feeds)[0], "dense epilogue fake quantization")


def test_chain_with_pairs_and_symbolic_batch():
    """add -> QDQ -> mul -> QDQ as one elementwise chain, on a symbolic batch (N=3 at run time), on an input
    whose name needs sanitizing."""
    g = GraphBuilder(5)
    x, r = g.input("y/0", ["N", 4, 8]), g.input("r", ["N", 4, 8])
    y = qdq(g, g.op("Mul", [qdq(g, g.op("Add", [x, r]), 0.04, 1), g.const(np.float32(1.5))]), 0.06, -2)
    model = g.model([y], opset=13)
    feeds = {"y/0": g.rng.normal(0, 1, (3, 4, 8)).astype(np.float32), "r": g.rng.normal(0, 1, (3, 4, 8)).astype(np.float32)}
    _, (got,) = fused_outputs(model, feeds, {"elementwise_chain_4": 1}, shapes={"y/0": ("N", 4, 8), "r": ("N", 4, 8)})
    assert_identical(got, reference(model, feeds)[0], "chain with two pairs")


def test_requantization_after_reshape_and_transpose_is_dropped():
    """x -> QDQ -> Reshape -> QDQ -> Transpose -> QDQ with one scale: the two pairs after the moves are the
    identity and go at import; with another scale after the Transpose that pair stays."""
    for second, kept in ((0.05, 1), (0.07, 2)):
        g = GraphBuilder(6)
        y = qdq(g, g.input("x", [2, 12]), 0.05, 3)
        y = qdq(g, g.op("Reshape", [y, g.const(np.array([2, 3, 4], np.int64))]), 0.05, 3)
        y = qdq(g, g.op("Transpose", [y], perm=[0, 2, 1]), second, 3)
        model = g.model([y], opset=13)
        assert op_counts(tf.import_onnx(model)["main"])["relax.quantize"] == kept
        feeds = random_inputs(model, seed=3)
        _, (got,) = fused_outputs(model, feeds, {"fake_quant": kept})
        assert_identical(got, reference(model, feeds)[0], f"moves between pairs (second scale {second})")


def _declined(model, shapes=None) -> list[str]:
    return [d.reason for d in tf.explain(model, shapes=shapes).declined("fake_quant")]


def test_pairs_the_rules_cannot_take_decline_with_a_reason():
    g = GraphBuilder(7)  # the scale is a graph input
    x, s = g.input("x", [1, 8]), g.input("s", [])
    z = g.const(np.int8(0))
    model = g.model([g.op("DequantizeLinear", [g.op("QuantizeLinear", [x, s, z]), s, z])], opset=13)
    assert any("the quantize scale is not a constant" in r for r in _declined(model)), _declined(model)

    g = GraphBuilder(8)  # per-channel activations
    y = g.input("x", [1, 3, 4, 4])
    s, z = g.const(np.float32([0.1, 0.2, 0.3]), "s"), g.const(np.int8([0, 1, 2]), "z")
    model = g.model([g.op("DequantizeLinear", [g.op("QuantizeLinear", [y, s, z], axis=1), s, z], axis=1)], opset=13)
    assert any("has shape (3,) (per-channel)" in r for r in _declined(model)), _declined(model)
    assert tf.compare(model, target="llvm").ok  # TVM's own quantize / dequantize take it

    g = GraphBuilder(9)  # float16: onnxruntime quantizes the half value; the float32 epilogue would not round it
    y = qdq(g, g.op("Relu", [g.input("x", [1, 8])]), 0.1, 0)
    half = as_float16(g.model([y], opset=19))
    for node in half.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            scale = next(t for t in half.graph.initializer if t.name == node.input[1])
            scale.data_type = TensorProto.FLOAT16
    assert any("fake quantization of float16" in r for r in _declined(half)), _declined(half)


def test_pair_inside_an_if_branch_runs_as_onnxruntime():
    """A QDQ pair in an If branch (on a condition the graph is given): the main graph's pair fuses into the
    conv, the branch's into a fake_quant kernel, and the numbers are onnxruntime's on either branch."""
    g = GraphBuilder(10)
    y = qdq(g, g.op("Relu", [g.conv(g.input("x", [1, 4, 6, 6]), 4, 8)]), 0.05, 0)
    cond = g.input("c", [], TensorProto.BOOL)
    s, z = g.const(np.float32(0.1), "s"), g.const(np.int8(0), "z")
    then = helper.make_graph(
        [helper.make_node("QuantizeLinear", [y, s, z], ["tq"], name="then_q"),
         helper.make_node("DequantizeLinear", ["tq", s, z], ["then_out"], name="then_dq")], "then", [],
        [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, [1, 8, 6, 6])])
    other = helper.make_graph([helper.make_node("Neg", [y], ["else_out"], name="else_neg")], "else", [],
                              [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, [1, 8, 6, 6])])
    g.nodes.append(helper.make_node("If", [cond], ["out"], name="branch", then_branch=then, else_branch=other))
    model = g.model(["out"], opset=13)
    for taken in (True, False):
        feeds = {**random_inputs(model, seed=4), "c": np.array(taken)}
        _, (got,) = fused_outputs(model, feeds, {"conv2d_bias_fake_quant": 1, "fake_quant": 1})
        assert_identical(got, reference(model, feeds)[0], f"QDQ in an If branch (condition {taken})")


def test_cuda_build_rounds_half_to_even():
    """The CUDA kernels compile, round with nearbyintf (TVM's `round` is roundf there: ties away from 0) and
    keep the dequantize's product out of a fused multiply-add (__fmul_rn)."""
    from tvm_fusion.build.cuda_compiler import cuda_source

    model, _ = _qdq_conv(relu=True, zero_point=0)
    built = check_cuda_build(model, expect={"conv2d_bias_fake_quant": 1, "fake_quant": 1})
    source = cuda_source(built.executable)
    assert "nearbyintf(" in source and "roundf(" not in source and "__fmul_rn(" in source


@pytest.mark.parametrize("per_channel", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_encoder_quantized_by_onnxruntime(per_channel, tmp_path):
    """A transformer encoder layer (MatMul, Add, LayerNormalization, Softmax, Gelu written out) quantized by
    onnxruntime.quantization.quantize_static (QDQ, int8, calibrated on seeded inputs): every pair fused,
    the output onnxruntime's element for element."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    float_model = encoder()
    onnx.save(float_model, str(tmp_path / "f.onnx"))
    rng = np.random.default_rng(0)
    calibration = iter([{"x": rng.normal(0, 1, (1, 8, 16)).astype(np.float32)} for _ in range(4)])

    class Reader:
        def get_next(self):
            return next(calibration, None)

    quantize_static(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=per_channel, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    model = onnx.load(str(tmp_path / "q.onnx"))
    feeds = random_inputs(model, seed=5)
    built, (got,) = fused_outputs(model, feeds, ENCODER_COUNTS)
    assert_identical(got, reference(model, feeds)[0], f"QDQ encoder layer (per_channel={per_channel})")
    assert op_counts(built.fused.mod["main"]).get("relax.quantize", 0) == 0  # every pair is in a kernel of ours


#: the encoder layer's groups: q, k, v, o and the FFN's two matmuls with their pairs (dense_fake_quant), each
#: bias add with its pair (elementwise_chain_2, or with the residual add: _4), the scores' scaling and the
#: GELU as chains, the LayerNorms; the attention's two matmuls of activations with their pairs
#: (batch_matmul_fake_quant); alone: the pairs on the input, after the LayerNorms and the softmax
ENCODER_COUNTS = {"dense_fake_quant": 6, "layer_norm": 2, "elementwise_chain_6": 1, "elementwise_chain_4": 2,
                  "elementwise_chain_3": 1, "elementwise_chain_2": 5, "fake_quant": 4, "batch_matmul_fake_quant": 2}
