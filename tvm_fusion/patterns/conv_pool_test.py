"""conv -> [BN] -> [activation] -> pool rules: each pool form is one kernel whose numbers match onnxruntime
element by element (host CPU and AVX2), half types, a symbolic batch, sanitized names; the longer chain wins
over the conv rules; --disable, explain, the per-group check and bisect see the group; near misses decline
with their reasons."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx.numpy_helper import to_array

from tvm_fusion.check.differential import bisect, check_groups
from tvm_fusion.cli import main
from tvm_fusion.frontend.importer import SymDim
from tvm_fusion.testing import GraphBuilder, check_fused, check_half, check_symbolic_batch, check_wrong_rule_is_blamed

AVX2 = '{"kind": "llvm", "mcpu": "x86-64-v3"}'

#: id -> (ONNX pool op, its attributes): the forms the rule takes
POOLS = {
    "max3s2p1": ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),  # ResNet's stem
    "max2s2": ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2])),  # VGG
    "max3s1p1": ("MaxPool", dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])),  # Inception
    "max2s1": ("MaxPool", dict(kernel_shape=[2, 2], strides=[1, 1])),
    "max3s2ceil": ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),  # SqueezeNet
    "avg2s2": ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2])),  # DenseNet's transitions
    "avg3s2p1": ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    "avg3s1p1_incl": ("AveragePool", dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1],
                                          count_include_pad=1)),
    "avg3s2ceil": ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    "gap": ("GlobalAveragePool", {}),
}


def conv_pool(pool="max3s2p1", hw=(11, 13), n=1, cin=5, cout=24, bn=True, act="Relu", seed=0, extra=None,
              name="x", **conv):
    """conv -> [BN] -> [act] -> pool; `extra`: "relu_out" also returns the pre-pool map (a second consumer)."""
    g = GraphBuilder(seed)
    x = g.input(name, [n, cin, *hw])
    y = g.conv(x, cin, cout, **conv)
    if bn:
        y = g.bn(y, cout)
    if act:
        y = g.op(act, [y])
    op, attrs = POOLS[pool] if isinstance(pool, str) else pool
    out = g.op(op, [y], **attrs)
    return g.model([out, y] if extra == "relu_out" else [out])


@pytest.mark.parametrize("cpu", ["host", "avx2"])
@pytest.mark.parametrize("pool", list(POOLS))
def test_each_pool_is_one_kernel_matching_onnxruntime(pool, cpu, rules, monkeypatch):
    if cpu == "avx2":
        monkeypatch.setenv("TVM_FUSION_CPU", AVX2)
    fused = check_fused(conv_pool(pool), rules, expect={"conv2d_bn_relu_pool": 1})
    assert fused.kernel_calls == 1, fused.kernel_calls


@pytest.mark.parametrize("cpu", ["host", "avx2"])
@pytest.mark.parametrize("pool", ["max3s1p1", "avg3s1p1_incl", "max2s2"])
def test_rows_of_whole_vectors(pool, cpu, rules, monkeypatch):
    """32 columns: whole vectors of every target (a stride-1 run vectorized, the division vectorized)."""
    if cpu == "avx2":
        monkeypatch.setenv("TVM_FUSION_CPU", AVX2)
    check_fused(conv_pool(pool, hw=(6, 32)), rules, expect={"conv2d_bn_relu_pool": 1})


@pytest.mark.parametrize("bn,act,bias,rule", [
    (False, "Relu", True, "conv2d_relu_pool"), (False, None, False, "conv2d_pool"),
    (True, None, True, "conv2d_bn_pool"), (True, "Sigmoid", False, "conv2d_bn_sigmoid_pool")])
def test_every_conv_epilogue_takes_the_pool(bn, act, bias, rule, rules):
    check_fused(conv_pool("avg3s2p1", bn=bn, act=act, bias=bias), rules, expect={rule: 1})


@pytest.mark.parametrize("conv", [dict(k=7, stride=2, pads=[3, 3, 3, 3]), dict(k=3, groups=24, cin=24),
                                  dict(k=1, cout=40)], ids=["7x7s2", "depthwise", "1x1"])
def test_conv_shapes_stem_depthwise_pointwise(conv, rules):
    conv = dict(conv)
    cin = conv.pop("cin", 5)
    cout = conv.pop("cout", 24)
    fused = check_fused(conv_pool("max3s2p1", hw=(20, 18), cin=cin, cout=cout, **conv), rules)
    fired = {k: v for k, v in fused.counts.items() if v}
    if fired == {"conv2d_bn_relu": 1}:  # AVX2 plans this 1x1 as the pixel-vectorized kernel: declined, saying so
        assert _declined(fused) == ["the conv takes the pointwise kernel, whose parallel tasks split an output "
                                    "plane; the fused pool needs one task per plane (tiled, depthwise, "
                                    "depthwise_channels kernels)"], _declined(fused)
    else:
        assert fired == {"conv2d_bn_relu_pool": 1}, fired


def test_resnet_stem_size(rules, monkeypatch):
    """The ResNet stem at its size: 1x3x224x224, 7x7/2 conv 64, BN, ReLU, MaxPool 3x3/2 pad 1. One kernel for
    AVX2, whose 16-channel tasks hold 0.77 MiB planes; AVX-512's 32-channel tasks (1.5 MiB, past the measured
    bound) run the conv and the pool apart (schedules/llvm/conv_pool_test.py)."""
    monkeypatch.setenv("TVM_FUSION_CPU", AVX2)
    check_fused(conv_pool("max3s2p1", hw=(224, 224), cin=3, cout=64, k=7, stride=2, pads=[3, 3, 3, 3]), rules,
                expect={"conv2d_bn_relu_pool": 1})


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_types_are_one_kernel(dtype, rules):
    check_half(conv_pool("avg3s2p1"), dtype, rules, expect={"conv2d_bn_relu_pool": 1})
    check_half(conv_pool("max2s2", seed=1), dtype, rules, expect={"conv2d_bn_relu_pool": 1})


def test_symbolic_batch_is_one_kernel_at_every_batch(rules):
    model = conv_pool("max3s2p1", n="N")
    check_symbolic_batch(model, {"x": (SymDim("N"), 5, 11, 13)}, rules, expect={"conv2d_bn_relu_pool": 1})


def test_names_that_need_sanitizing(rules):
    check_fused(conv_pool("gap", name="input/0:x"), rules, expect={"conv2d_bn_relu_pool": 1})


def test_disable_leaves_the_conv_rule_and_the_pool(rules):
    fused = check_fused(conv_pool(), rules.select(disable=["conv2d_bn_relu_pool"]), expect={"conv2d_bn_relu": 1})
    assert fused.kernel_calls == 2, fused.kernel_calls


def _declined(fused, rule="conv2d_bn_relu_pool"):
    return [d.reason for d in fused.fused.decisions if d.rule == rule and d.reason]


def test_a_conv_output_with_a_second_consumer_declines(rules):
    """The pooled map is also a graph output: fusing would hide it (the multi-consumer pitfall)."""
    fused = check_fused(conv_pool(extra="relu_out"), rules, expect={"conv2d_bn_relu": 1})
    reasons = _declined(fused)
    assert reasons and "consumers" in reasons[0], reasons


#: (id, pool form, the reason the rule declines with)
NEAR_MISSES = [
    ("window5", ("MaxPool", dict(kernel_shape=[5, 5], strides=[2, 2])),
     "max_pool2d window is 5x5 with strides [2, 2]; the fused kernel takes windows of 2 or 3 with strides 1 or 2"),
    ("stride3", ("AveragePool", dict(kernel_shape=[3, 3], strides=[3, 3])),
     "avg_pool2d window is 3x3 with strides [3, 3]; the fused kernel takes windows of 2 or 3 with strides 1 or 2"),
    ("dilated", ("MaxPool", dict(kernel_shape=[2, 2], strides=[1, 1], dilations=[2, 2])),
     "max_pool2d dilation is [2, 2]; the fused kernel takes [1, 1]"),
]


@pytest.mark.parametrize("pool,reason", [(p, r) for _, p, r in NEAR_MISSES], ids=[i for i, _, _ in NEAR_MISSES])
def test_near_miss_declines_with_reason(pool, reason, rules):
    fused = check_fused(conv_pool(pool), rules, expect={"conv2d_bn_relu": 1})
    assert _declined(fused) == [reason]


def test_mean_over_other_axes_declines(rules):
    g = GraphBuilder(3)
    y = g.op("Relu", [g.bn(g.conv(g.input("x", [1, 4, 6, 6]), 4, 8), 8)])
    fused = check_fused(g.model([g.op("ReduceMean", [y, g.const(np.array([3], np.int64))], keepdims=1)], opset=18),
                        rules)
    assert _declined(fused) == ["the mean is over axes [3]; the fused kernel takes a global pool over [2, 3]"]


def test_float64_declines_with_the_conv_familys_reason(rules):
    model = conv_pool("max2s2")
    for t in model.graph.initializer:
        t.CopyFrom(onnx.numpy_helper.from_array(to_array(t).astype(np.float64), t.name))
    for v in [*model.graph.input, *model.graph.output]:
        v.type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    from tvm_fusion.check.explain import explain

    shown = {(d.rule, d.reason) for d in explain(model, "llvm", rules=rules).declined()}
    assert ("conv2d_bn_relu_pool", "conv2d dtype is float64; the compute supports float32, float16, bfloat16") \
        in shown, shown


def test_explain_shows_the_group_and_the_near_miss(tmp_path, capsys):
    g = GraphBuilder(4)
    y = g.op("Relu", [g.bn(g.conv(g.input("x", [1, 4, 12, 12]), 4, 8), 8)])
    p = g.op("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    z = g.op("Relu", [g.bn(g.conv(p, 8, 8), 8)])
    onnx.save(g.model([g.op("MaxPool", [z], kernel_shape=[5, 5], strides=[1, 1])]), str(tmp_path / "m.onnx"))
    assert main(["explain", str(tmp_path / "m.onnx")]) == 0
    out = capsys.readouterr().out
    assert "rules fired: conv2d_bn_relu_pool 1, conv2d_bn_relu 1" in out, out
    assert "max_pool2d window is 5x5 with strides [1, 1]" in out, out


def test_per_group_check_and_bisect_cover_the_group(rules):
    model = conv_pool("avg3s2p1", hw=(9, 9))
    report = check_groups(model, rules=rules)
    assert report.ok and [g.rule for g in report.groups] == ["conv2d_bn_relu_pool"], str(report)
    assert bisect(model, rules=rules).verdict.startswith("nothing to bisect")


def test_bisect_blames_a_wrong_conv_pool_rule(rules):
    """The same chain lowered with W' scaled by 1.01: the per-group check names it, bisect blames it."""
    from tvm_fusion.patterns.conv_pool import conv_pool_pattern

    check_wrong_rule_is_blamed(conv_pool("max3s2p1", hw=(9, 9)), rules, "conv2d_bn_relu_pool_wrong",
                               conv_pool_pattern(True, "relu"), constant=0)


def test_a_chain_in_a_function_with_an_if(rules):
    """conv -> BN -> ReLU -> MaxPool feeding If(const) {Relu} else {Neg}: the importer builds no dataflow
    block there; the chain is one kernel all the same."""
    from onnx import TensorProto, helper

    g = GraphBuilder(9)
    y = g.op("MaxPool", [g.op("Relu", [g.bn(g.conv(g.input("x", [1, 4, 8, 8]), 4, 8), 8)])],
             kernel_shape=[2, 2], strides=[2, 2])

    def branch(op, out):
        return helper.make_graph([helper.make_node(op, [y], [out], name=f"{out}_node")], out, [],
                                 [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, 8, 4, 4])])

    g.nodes.append(helper.make_node("If", [g.const(np.array(True))], ["z"], name="branch",
                                    then_branch=branch("Relu", "then_out"), else_branch=branch("Neg", "else_out")))
    check_fused(g.model(["z"]), rules, expect={"conv2d_bn_relu_pool": 1})
