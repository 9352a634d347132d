"""Every rule family with a symbolic batch (`--shape x=Nx...`) and a bounded one (`N<=8`): one small graph per
family, built once for llvm and run at batch 1 and 3 against onnxruntime element by element, with the exact
rule counts of the family (or, where a family cannot keep the batch symbolic, its decline with the reason
`explain` shows). None crashes, none is refused as bad input. The bounded batch and the CUDA builds of the
same graphs (compiled with nvcc, not run) are `slow`."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_fusion import cli
from tvm_fusion.build.builder import resolve_target
from tvm_fusion.check.explain import explain
from tvm_fusion.frontend.importer import format_shape, import_onnx
from tvm_fusion.fusion.fuse import fuse
from tvm_fusion.check.io import random_inputs
from tvm_fusion.patterns.attention_test import attention_block
from tvm_fusion.patterns.se_test import se_block
from tvm_fusion.testing import (GraphBuilder, apply_activation_onnx, check_cuda_build, check_symbolic_batch,
                                symbolic_shapes)


def _w(g, *shape, scale=0.3):
    return g.const(g.rng.normal(0, scale, shape).astype(np.float32), "w")


def conv_bn_relu(g, b):
    x = g.input("x", [b, 4, 8, 8])
    return [g.op("Relu", [g.bn(g.conv(x, 4, 16), 16)])]


def conv_residual(g, b):
    x = g.input("x", [b, 8, 6, 6])
    y = g.op("Relu", [g.bn(g.conv(x, 8, 8), 8)])
    return [g.op("Relu", [g.op("Add", [g.bn(g.conv(y, 8, 8), 8), x])])]


def conv_add_silu(g, b):
    """A residual add without BN, then SiLU written as x * Sigmoid(x)."""
    x = g.input("x", [b, 8, 6, 6])
    return [apply_activation_onnx(g, g.op("Add", [g.conv(x, 8, 8), x]), "x*Sigmoid")]


def depthwise(g, b):
    x = g.input("x", [b, 16, 7, 7])
    return [g.op("Relu", [g.conv(x, 16, 16, groups=16)])]


def grouped_strided(g, b):
    x = g.input("x", [b, 8, 9, 9])
    y = g.bn(g.conv(x, 8, 16, groups=2, stride=2), 16)
    return [g.op("Clip", [y, g.const(np.float32(0)), g.const(np.float32(6))])]


def pointwise_hardswish(g, b):
    x = g.input("x", [b, 16, 5, 5])
    return [g.op("HardSwish", [g.conv(x, 16, 32, k=1)])]


def dense(g, b):
    x = g.input("x", [b, 16])
    y = g.op("Gemm", [x, _w(g, 24, 16), _w(g, 24, scale=0.1)], transB=1)
    return [g.op("Relu", [y])]


def dense_rank3(g, b):
    x = g.input("x", [b, 5, 16])
    return [g.op("Relu", [g.op("Add", [g.op("MatMul", [x, _w(g, 16, 8)]), _w(g, 8, scale=0.1)])])]


def batch_matmul(g, b):
    lhs, rhs = g.input("a", [b, 4, 8]), g.input("b", [b, 8, 6])
    return [g.op("Relu", [g.op("MatMul", [lhs, rhs])])]


def attention(g, b):
    return [attention_block(g, shape=(b, 2, 5, 8), mask=(b, 1, 1, None))]


def squeeze_excite(g, b):
    x = g.input("x", [b, 16, 5, 7])
    return [se_block(g, x, 16, 4, act="Relu", gate="HardSigmoid")]


def squeeze_excite_sigmoid(g, b):
    x = g.input("x", [b, 24, 4, 4])
    return [se_block(g, x, 24, 8, act="x*Sigmoid", gate="Sigmoid")]


def _ln(g, y, d=16):
    return g.op("LayerNormalization", [y, _w(g, d), _w(g, d, scale=0.1)], axis=-1, epsilon=1e-5)


def layer_norm(g, b):
    return [_ln(g, g.input("x", [b, 16]))]


def add_layer_norm(g, b):
    x, y = g.input("x", [b, 16]), g.input("y", [b, 16])
    return [_ln(g, g.op("Add", [x, y]))]


def rms_norm(g, b):
    """x / sqrt(mean(x^2) + eps) * gamma, as exporters write RMSNorm (no rule of its own: chains and leftovers)."""
    x = g.input("x", [b, 16])
    ms = g.op("ReduceMean", [g.op("Mul", [x, x]), g.const(np.array([-1], np.int64))], keepdims=1)
    y = g.op("Div", [x, g.op("Sqrt", [g.op("Add", [ms, g.const(np.float32(1e-6))])])])
    return [g.op("Mul", [y, _w(g, 16)])]


def elementwise_chain(g, b):
    x = g.input("x", [b, 16, 4, 4])
    y = g.op("Add", [x, g.const(np.full((16, 1, 1), 0.5, np.float32))])
    return [g.op("Tanh", [g.op("Mul", [y, g.const(np.float32(0.25))])])]


def add_relu(g, b):
    x, y = g.input("x", [b, 8, 4, 4]), g.input("y", [b, 8, 4, 4])
    return [g.op("Relu", [g.op("Add", [x, y])])]


def pools(g, b):
    """MaxPool, AveragePool, GlobalAveragePool and softmax: the leftover schedules, no rule."""
    x = g.input("x", [b, 8, 9, 9])
    y = g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    y = g.op("AveragePool", [y], kernel_shape=[2, 2], strides=[1, 1])
    y = g.op("Flatten", [g.op("GlobalAveragePool", [y])])
    return [g.op("Softmax", [y], axis=-1)]


def conv_dilated_gelu(g, b):
    x = g.input("x", [b, 6, 10, 10])
    return [g.op("Gelu", [g.conv(x, 6, 8, dilation=2)])]


def conv_asymmetric_pad_leaky(g, b):
    x = g.input("x", [b, 4, 7, 9])
    return [g.op("LeakyRelu", [g.conv(x, 4, 8, k=(3, 2), pads=[1, 0, 1, 1])], alpha=0.1)]


def conv1d(g, b):
    """A Conv over [N, C, W]: the conv rules view it as [N, C, 1, W]."""
    x = g.input("x", [b, 8, 12])
    w, b = _w(g, 16, 8, 3), _w(g, 16, scale=0.1)
    return [g.op("Relu", [g.op("Conv", [x, w, b], kernel_shape=[3], pads=[1, 1])])]


def conv_transpose(g, b):
    x = g.input("x", [b, 8, 5, 5])
    return [g.op("Relu", [g.op("ConvTranspose", [x, _w(g, 8, 4, 3, 3)], strides=[2, 2], pads=[1, 1, 1, 1])])]


def conv_qdq(g, b):
    """A QDQ conv: the pairs on the input and output around conv + bias."""
    x = g.input("x", [b, 4, 6, 6])

    def qdq(v, scale):
        sc, z = g.const(np.array(scale, np.float32), "scale"), g.const(np.array(0, np.int8), "zero")
        return g.op("DequantizeLinear", [g.op("QuantizeLinear", [v, sc, z]), sc, z])

    return [qdq(g.op("Relu", [g.conv(qdq(x, 0.03), 4, 8)]), 0.05)]


def dense_bn_sigmoid(g, b):
    x = g.input("x", [b, 16])
    return [g.op("Sigmoid", [g.bn(g.op("MatMul", [x, _w(g, 16, 12)]), 12)])]


def dense_scale(g, b):
    x = g.input("x", [b, 16])
    return [g.op("Mul", [g.op("MatMul", [x, _w(g, 16, 8)]), g.const(np.float32(0.5))])]


def batch_matmul_rank4_scale_bias(g, b):
    lhs, rhs = g.input("a", [b, 2, 4, 8]), g.input("b", [b, 2, 8, 6])
    y = g.op("Div", [g.op("MatMul", [lhs, rhs]), g.const(np.float32(2.0))])
    return [g.op("Tanh", [g.op("Add", [y, _w(g, 6, scale=0.1)])])]


def batch_matmul_broadcast_b(g, b):
    """B has batch 1: broadcast over A's symbolic batch."""
    lhs, rhs = g.input("a", [b, 3, 4, 8]), g.input("b", [1, 3, 8, 6])
    return [g.op("MatMul", [lhs, rhs])]


def attention_rank3(g, b):
    return [attention_block(g, shape=(b, 7, 16), mask=(b, 1, None))]


def attention_causal(g, b):
    return [attention_block(g, shape=(b, 2, 6, 4), mask=(6, 6), mask_const=True)]


def layer_norm_rank3(g, b):
    return [_ln(g, g.input("x", [b, 5, 16]))]


def layer_norm_decomposed(g, b):
    x = g.input("x", [b, 4, 16])
    axes = g.const(np.array([-1], np.int64))
    d = g.op("Sub", [x, g.op("ReduceMean", [x, axes], keepdims=1)])
    var = g.op("ReduceMean", [g.op("Pow", [d, g.const(np.float32(2))]), axes], keepdims=1)
    y = g.op("Div", [d, g.op("Sqrt", [g.op("Add", [var, g.const(np.float32(1e-5))])])])
    return [g.op("Add", [g.op("Mul", [y, _w(g, 16)]), _w(g, 16, scale=0.1)])]


def elementwise_broadcast(g, b):
    """Two inputs, one with batch 1, and a per-channel constant: the chain reads each where it is."""
    x, y = g.input("x", [b, 8, 3, 3]), g.input("y", [1, 8, 3, 3])
    z = g.op("Mul", [g.op("Sub", [x, y]), g.const(np.full((8, 1, 1), 0.5, np.float32))])
    return [g.op("Sigmoid", [g.op("Add", [z, x])])]


def fake_quant_alone(g, b):
    """A QDQ pair after a softmax: the standalone fake_quant."""
    x = g.input("x", [b, 10])
    sc, z = g.const(np.array(0.01, np.float32), "scale"), g.const(np.array(0, np.uint8), "zero")
    q = g.op("QuantizeLinear", [g.op("Softmax", [x], axis=-1), sc, z])
    return [g.op("DequantizeLinear", [q, sc, z])]


def leftovers(g, b):
    """Reshape with -1, Transpose, Concat, Slice, Pad, ReduceSum, Resize, ArgMax-free: the injective and reduction
    leftovers with the batch outermost."""
    x = g.input("x", [b, 4, 6, 6])
    y = g.op("Concat", [x, g.op("Transpose", [x], perm=[0, 1, 3, 2])], axis=1)
    y = g.op("Pad", [y, g.const(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))])
    y = g.op("Slice", [y, g.const(np.array([1], np.int64)), g.const(np.array([7], np.int64)),
                       g.const(np.array([2], np.int64))])
    y = g.op("Resize", [y, "", g.const(np.array([1, 1, 2, 2], np.float32))], mode="nearest")
    y = g.op("ReduceSum", [y, g.const(np.array([1], np.int64))], keepdims=0)
    return [g.op("Reshape", [y, g.const(np.array([-1, 12 * 16], np.int64))])]


def conv_add_broadcast_other(g, b):
    """The residual operand has batch 1: it broadcasts over the conv's symbolic batch."""
    x, other = g.input("x", [b, 8, 6, 6]), g.input("other", [1, 8, 6, 6])
    return [g.op("Relu", [g.op("Add", [g.conv(x, 8, 8), other])])]


def per_sample_scale(g, b):
    """A per-sample scalar [N, 1, 1, 1] (drop-path, a gate) times a map and a per-channel bias."""
    x, s = g.input("x", [b, 8, 4, 4]), g.input("s", [b, 1, 1, 1])
    y = g.op("Add", [g.op("Mul", [x, s]), g.const(np.full((8, 1, 1), 0.1, np.float32))])
    return [g.op("Sigmoid", [y])]


def encoder(g, b, seq=8, d=16, heads=2):
    """A post-LN transformer encoder layer whose Reshapes copy the batch (0): attention, LayerNorms over
    [N, S, C], the projections and the FFN (a [N, S, K] MatMul: the batch-matmul rule's, see dense_rank3)."""
    x = g.input("x", [b, seq, d])

    def linear(v, n_in, n_out):
        return g.op("Add", [g.op("MatMul", [v, _w(g, n_in, n_out, scale=n_in ** -0.5)]), _w(g, n_out, scale=0.1)])

    def split(v):
        v = g.op("Reshape", [v, g.const(np.array([0, seq, heads, d // heads], np.int64))])
        return g.op("Transpose", [v], perm=[0, 2, 1, 3])

    q, k, v = (split(linear(x, d, d)) for _ in range(3))
    scores = g.op("Div", [g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])]),
                          g.const(np.float32(np.sqrt(d // heads)))])
    ctx = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
    ctx = g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]), g.const(np.array([0, seq, d], np.int64))])
    h = _ln(g, g.op("Add", [x, linear(ctx, d, d)]))
    return [_ln(g, g.op("Add", [h, linear(g.op("Gelu", [linear(h, d, 4 * d)]), 4 * d, d)]))]


def if_branch_sanitized_names(g, b):
    """An SE block on an input named `x/0`, its output read inside both branches of an If on a runtime
    condition (names `out/0`, `neg/0` to sanitize)."""
    x, cond = g.input("x/0", [b, 16, 5, 7]), g.input("cond", [], TensorProto.BOOL)
    y = se_block(g, g.op("Relu", [x]), 16, 4)
    half = numpy_helper.from_array(np.full((16, 1, 1), 0.5, np.float32), "half/0")
    then = helper.make_graph([helper.make_node("Add", [y, "half/0"], ["sum/0"], name="add/0"),
                              helper.make_node("Relu", ["sum/0"], ["relu/0"], name="relu/0")], "then", [],
                             [helper.make_tensor_value_info("relu/0", TensorProto.FLOAT, None)], [half])
    other = helper.make_graph([helper.make_node("Neg", [y], ["neg/0"], name="neg/0")], "else", [],
                              [helper.make_tensor_value_info("neg/0", TensorProto.FLOAT, None)])
    g.nodes.append(helper.make_node("If", [cond], ["out/0"], name="if/0", then_branch=then, else_branch=other))
    return ["out/0"]


_DENSE_3D = ("matmul input has shape (N, 8, {k}); with a symbolic batch the kernel takes a 2-D x only (it would "
             "view x as [rows, K] with rows a product of dims)")

#: family -> (graph, opset, the rule counts of the symbolic build, {rule: the reason it declines})
FAMILIES = {
    "conv_bn_relu": (conv_bn_relu, 17, {"conv2d_bn_relu": 1}, {}),
    "conv_residual": (conv_residual, 17, {"conv2d_bn_relu": 1, "conv2d_bn_add_relu": 1}, {}),
    "conv_add_silu": (conv_add_silu, 17, {"conv2d_add_silu": 1}, {}),
    "depthwise": (depthwise, 17, {"conv2d_bias_relu": 1}, {}),
    "grouped_strided": (grouped_strided, 17, {"conv2d_bn_relu6": 1}, {}),
    "pointwise_hardswish": (pointwise_hardswish, 17, {"conv2d_bias_hardswish": 1}, {}),
    "dense": (dense, 17, {"dense_bias_relu": 1}, {}),
    "dense_rank3": (dense_rank3, 17, {"batch_matmul_relu": 1}, {"dense_bias_relu": _DENSE_3D.format(k=16)
                                                                .replace("(N, 8, 16)", "(N, 5, 16)")}),
    "batch_matmul": (batch_matmul, 17, {"batch_matmul_relu": 1}, {}),
    "attention": (attention, 17, {"attention": 1}, {}),
    "squeeze_excite": (squeeze_excite, 18, {"squeeze_excite_relu_hardsigmoid": 1}, {}),
    "squeeze_excite_sigmoid": (squeeze_excite_sigmoid, 18, {"squeeze_excite_silu_sigmoid": 1}, {}),
    "layer_norm": (layer_norm, 17, {"layer_norm": 1}, {}),
    "add_layer_norm": (add_layer_norm, 17, {"add_layer_norm": 1}, {}),
    "rms_norm": (rms_norm, 18, {"elementwise_chain_4": 1}, {}),
    "elementwise_chain": (elementwise_chain, 17, {"elementwise_chain_3": 1}, {}),
    "add_relu": (add_relu, 17, {"add_relu": 1}, {}),
    "pools": (pools, 17, {}, {}),
    "conv_dilated_gelu": (conv_dilated_gelu, 20, {"conv2d_bias_gelu_erf": 1}, {}),
    "conv_asymmetric_pad_leaky": (conv_asymmetric_pad_leaky, 17, {"conv2d_bias_leaky_relu": 1}, {}),
    "conv1d": (conv1d, 17, {"conv2d_bias_relu": 1}, {}),
    "conv_transpose": (conv_transpose, 17, {}, {}),
    "conv_qdq": (conv_qdq, 17, {"conv2d_bias_fake_quant": 1, "fake_quant": 1}, {}),
    "dense_bn_sigmoid": (dense_bn_sigmoid, 17, {"dense_bn_sigmoid": 1}, {}),
    "dense_scale": (dense_scale, 17, {"dense_scale": 1}, {}),
    "batch_matmul_rank4_scale_bias": (batch_matmul_rank4_scale_bias, 17, {"batch_matmul_tanh": 1}, {}),
    "batch_matmul_broadcast_b": (batch_matmul_broadcast_b, 17, {"batch_matmul": 1}, {}),
    "attention_rank3": (attention_rank3, 17, {"attention": 1}, {}),
    "attention_causal": (attention_causal, 17, {"attention": 1}, {}),
    "layer_norm_rank3": (layer_norm_rank3, 17, {"layer_norm": 1}, {}),
    "layer_norm_decomposed": (layer_norm_decomposed, 18, {"layer_norm": 1}, {}),
    "elementwise_broadcast": (elementwise_broadcast, 17, {"elementwise_chain_4": 1}, {}),
    "fake_quant_alone": (fake_quant_alone, 17, {"fake_quant": 1}, {}),
    "leftovers": (leftovers, 18, {}, {}),
    "encoder": (encoder, 20, {"attention": 1, "batch_matmul_gelu_erf": 1, "batch_matmul": 5, "add_layer_norm": 2},
                {"dense_bias": _DENSE_3D.format(k=16), "dense_bias_gelu_erf": _DENSE_3D.format(k=16)}),
    "conv_add_broadcast_other": (conv_add_broadcast_other, 17, {"conv2d": 1, "elementwise_chain_3": 1}, {}),
    "per_sample_scale": (per_sample_scale, 17, {"elementwise_chain_3": 1}, {}),
    "if_branch_sanitized_names": (if_branch_sanitized_names, 18,
                                  {"squeeze_excite_relu_hardsigmoid": 1, "add_relu": 1}, {}),
}
BOUNDS = {"N": None, "N<=8": 8}
#: the bounded batch differs only in memory planning (tir_var_upper_bound): `slow`, to keep the default run short
BOUND_PARAMS = [pytest.param("N"), pytest.param("N<=8", marks=pytest.mark.slow)]


def _model(family: str, batch="N"):
    """The family's graph with its batch dim `batch` ("N": symbolic, or a size)."""
    graph, opset = FAMILIES[family][:2]
    g = GraphBuilder(sum(map(ord, family)))
    return g.model(graph(g, batch), opset=opset)


@pytest.mark.parametrize("bound", BOUND_PARAMS)
@pytest.mark.parametrize("family", FAMILIES)
def test_family_with_a_symbolic_batch_builds_and_matches_or_declines(family, bound, rules):
    model, (_, _, counts, declines) = _model(family), FAMILIES[family]
    shapes = symbolic_shapes(model, BOUNDS[bound])
    seed = 0
    if "cond" in shapes:  # seed 5 draws the If's condition False at batch 1 and True at batch 3: both branches run
        seed = 5
        at = lambda n: {k: [d if isinstance(d, int) else n for d in v] for k, v in shapes.items()}  # noqa: E731
        assert [bool(random_inputs(model, at(n), seed=seed + n)["cond"]) for n in (1, 3)] == [False, True]
    check_symbolic_batch(model, shapes, rules, expect=counts, batches=(1, 3), seed=seed)
    if declines:
        shown = {(d.rule, d.reason) for d in explain(model, "llvm", shapes=shapes, rules=rules).declined()}
        assert set(declines.items()) <= shown, shown


@pytest.mark.parametrize("family", FAMILIES)
def test_a_static_batch_fires_what_the_symbolic_one_fires(family, rules):
    """The same graph at batch 3 fuses into the groups the symbolic build has (FAMILIES), and takes with the
    declining rule what a symbolic batch declines: no rule gives up on a symbolic batch silently."""
    counts, declines = FAMILIES[family][2:]
    static = fuse(import_onnx(_model(family, 3)), resolve_target("llvm"), rules).counts
    fired = {k: v for k, v in static.items() if v}
    if declines:
        assert set(declines) <= set(fired), fired
    else:
        assert fired == counts


@pytest.mark.parametrize("family", ["squeeze_excite", "attention", "layer_norm_rank3"])
def test_compile_with_a_symbolic_batch_exits_0(family, tmp_path, capsys):
    """The command line, as the reports met it: an SE block crashed (exit 3), attention was called bad input
    (exit 2), a LayerNorm over [N, S, C] was declined."""
    model = _model(family)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    flags = [f"--shape={name}={format_shape(shape)}" for name, shape in symbolic_shapes(model).items()]
    assert cli.main(["compile", str(path), *flags, "--target", "llvm", "-o", str(tmp_path / "m.so")]) == 0
    out = capsys.readouterr().out
    assert "on seeded inputs at N=1 and N=3" in out
    assert f"fused groups: 1 ({next(iter(FAMILIES[family][2]))} 1)" in out


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_family_with_a_symbolic_batch_builds_for_cuda(family, rules):
    model, counts = _model(family), FAMILIES[family][2]
    check_cuda_build(model, rules, expect=counts, shapes=symbolic_shapes(model, 64))
