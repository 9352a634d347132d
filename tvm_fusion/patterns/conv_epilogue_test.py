"""conv_epilogue rules: numerics over a parameter grid, golden IR, near misses, priority."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tvm_fusion import _tvm
from tvm_fusion._tvm import relax, tvm
from tvm_fusion.build.builder import resolve_target
from tvm_fusion.frontend.importer import import_onnx
from tvm_fusion.fusion.fuse import fuse
from tvm_fusion.rules import RuleSet
from tvm_fusion.patterns.conv_epilogue import STRUCTURES
from tvm_fusion.schedules.conv2d import pack_channel_blocks
from tvm_fusion.schedules.llvm.conv2d import pack_conv, packs_taps_first
from onnx.numpy_helper import to_array as onnx_array

from tvm_fusion.testing import (ACTIVATION_FORMS, GELU_OPSET, GraphBuilder, apply_activation_onnx, check_fused,
                                conv_bn_relu, residual_block)

# (batch, cin, cout, hw, kernel, stride, pads, dilation, groups, bias)
GRID = [
    (1, 8, 16, (12, 12), 1, 1, [0, 0, 0, 0], 1, 1, True),
    (1, 8, 16, (12, 12), 3, 1, [1, 1, 1, 1], 1, 1, False),
    (4, 8, 16, (12, 12), 3, 2, [1, 1, 1, 1], 1, 1, True),
    (1, 3, 13, (15, 15), 5, 1, [2, 2, 2, 2], 1, 1, True),
    (1, 3, 16, (23, 23), 7, 2, [3, 3, 3, 3], 1, 1, False),
    (1, 7, 7, (9, 11), 3, 1, [0, 1, 1, 0], 1, 1, True),  # asymmetric padding, odd channels
    (1, 8, 8, (14, 14), 3, 1, [2, 2, 2, 2], 2, 1, True),  # dilation 2
    (4, 8, 12, (10, 10), 3, 1, [1, 1, 1, 1], 1, 2, True),  # groups 2
    (1, 16, 16, (14, 14), 3, 1, [1, 1, 1, 1], 1, 16, True),  # depthwise
    (1, 16, 16, (15, 15), 3, 2, [1, 1, 1, 1], 1, 16, False),  # depthwise, stride 2
    (4, 5, 9, (7, 9), 1, 2, [0, 0, 0, 0], 1, 1, True),  # 1x1 stride 2, odd sizes, batch 4
    (1, 32, 24, (7, 7), 3, 1, [1, 1, 1, 1], 1, 4, False),  # grouped, 7x7 spatial
]


@pytest.mark.parametrize("case", GRID, ids=lambda c: "n{}c{}o{}k{}s{}p{}d{}g{}{}".format(
    c[0], c[1], c[2], c[4], c[5], "".join(map(str, c[6])), c[7], c[8], "b" if c[9] else ""))
def test_conv2d_bn_relu_numerics(case, rules):
    n, cin, cout, hw, k, s, pads, d, g, bias = case
    model = conv_bn_relu(n, cin, cout, hw, k=k, stride=s, pads=pads, dilation=d, groups=g, bias=bias)
    check_fused(model, rules, expect={"conv2d_bn_relu": 1})


@pytest.mark.parametrize("bn,relu,bias,rule", [
    (True, False, True, "conv2d_bn"),
    (False, True, True, "conv2d_bias_relu"),
    (False, True, False, "conv2d_relu"),
])
def test_family_members(bn, relu, bias, rule, rules):
    check_fused(conv_bn_relu(2, 6, 10, (9, 9), bn=bn, relu=relu, bias=bias), rules, expect={rule: 1})


def test_residual_block_is_exact(rules):
    """The add's other operand (the skip connection) comes from outside the chain."""
    check_fused(residual_block(n=2, c=8), rules, expect={"conv2d_bn_add_relu": 1, "conv2d_bn_relu": 1})


def test_bn_output_with_second_consumer_declines(rules):
    g = GraphBuilder(1)
    x = g.input("x", [1, 4, 8, 8])
    y = g.bn(g.conv(x, 4, 8), 8)
    model = g.model([g.op("Relu", [y]), g.op("Sigmoid", [y])])
    fused = check_fused(model, rules, expect={"conv2d_bn": 1})
    reasons = [d.reason for d in fused.fused.decisions if d.rule == "conv2d_bn_relu" and d.reason]
    assert reasons and "2 consumers" in reasons[0], reasons


def test_conv_output_with_second_consumer_declines(rules):
    g = GraphBuilder(2)
    x = g.input("x", [1, 4, 8, 8])
    c = g.conv(x, 4, 8, bias=False)
    model = g.model([g.op("Relu", [g.bn(c, 8)]), g.op("Tanh", [c])])
    # the conv is a kernel of its own (the bare conv2d rule); BN (as x * s + t) and relu make one
    # elementwise kernel
    fused = check_fused(model, rules, expect={"conv2d": 1, "elementwise_chain_3": 1})
    reasons = {d.rule: d.reason for d in fused.fused.decisions}
    assert reasons["conv2d_bn_relu"].startswith("intermediate Conv3 has 2 consumers "), reasons




@pytest.mark.parametrize("shape", [(8, 1, 1), (1, 8, 1, 1)])
def test_scale_layer_after_batch_norm_folds_into_the_conv(rules, shape):
    """conv -> BN -> Mul(c) -> Add(d) -> Relu (Caffe's Scale layer, as in DenseNet-121 and Inception v2):
    one conv2d_bn_relu kernel, with c and d folded into W' and b' as well."""
    g = GraphBuilder(5)
    x = g.input("x", [1, 4, 9, 9])
    y = g.bn(g.conv(x, 4, 8), 8)
    y = g.op("Mul", [y, g.const(g.rng.uniform(0.5, 1.5, shape).astype(np.float32))])
    y = g.op("Add", [y, g.const(g.rng.normal(0, 0.1, shape).astype(np.float32))])
    check_fused(g.model([g.op("Relu", [y])]), rules, expect={"conv2d_bn_relu": 1})


def test_scale_layer_that_is_not_per_channel_declines(rules):
    g = GraphBuilder(5)
    x = g.input("x", [1, 4, 6, 6])
    y = g.bn(g.conv(x, 4, 8), 8)
    y = g.op("Mul", [y, g.const(g.rng.uniform(0.5, 1.5, (8, 6, 6)).astype(np.float32))])
    y = g.op("Add", [y, g.const(np.float32(0.1))])
    # the conv still takes its BatchNorm; the scale layer and relu are left to the elementwise rules
    fused = check_fused(g.model([g.op("Relu", [y])]), rules, expect={"conv2d_bn": 1, "elementwise_chain_3": 1})
    reasons = {d.rule: d.reason for d in fused.fused.decisions}
    assert reasons["conv2d_bn_relu"] == ("post_scale constant has shape (8, 6, 6); expected one value per output "
                                         "channel, (8, 1, 1) or (1, 8, 1, 1), broadcast against the conv output "
                                         "(1, 8, 6, 6)")

@pytest.mark.parametrize("bias, own", [(True, "bias_add"), (False, "conv")])
def test_residual_that_is_the_convs_own_output_declines(rules, bias, own):
    """relu(bn(conv(x)) + conv(x)): the skip operand is computed inside the match, so the kernel could not
    take it as an input (found by tests/fuzz; the fused build used to fail in TVM's VM codegen)."""
    g = GraphBuilder(0)
    x = g.input("x", [1, 2, 5, 5])
    c = g.conv(x, 2, 4, bias=bias)
    model = g.model([g.op("Relu", [g.op("Add", [g.bn(c, 4), c])])])
    fused = check_fused(model, rules)
    assert not any(n for r, n in fused.counts.items() if r.startswith("conv2d_bn_add")), fused.counts
    reasons = [d.reason for d in fused.fused.decisions if d.rule == "conv2d_bn_add_relu"]
    assert reasons == [f"residual operand is this match's own {own} output; expected a value computed "
                       "outside the match"]


def test_convs_with_nothing_to_fuse_still_get_our_kernel(rules):
    """DenseNet's shape: convs feeding a Concat. The lowest-priority rules (conv2d_bias, bare conv2d) give
    each its scheduled kernel instead of TVM's default conv."""
    g = GraphBuilder(1)
    x = g.input("x", [1, 4, 8, 8])
    a, b = g.conv(x, 4, 6, bias=False), g.conv(x, 4, 5, k=1)
    y = g.conv(g.op("Concat", [a, b], axis=1), 11, 7, stride=2, bias=False)
    fused = check_fused(g.model([y]), rules, expect={"conv2d": 2, "conv2d_bias": 1})
    # a one-op group still names its ONNX node (found through its weight constant)
    assert sorted(n for grp in fused.fused.groups for n in grp.onnx_nodes) == sorted(
        n.name for n in g.nodes if n.op_type == "Conv")

def _training_bn_module():
    bb = relax.BlockBuilder()
    x = relax.Var("x", _tvm.tensor_type((1, 4, 8, 8), "float32"))
    rng = np.random.default_rng(0)
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(rng.normal(size=(4, 4, 3, 3)).astype("float32"))
            c = bb.emit(relax.op.nn.conv2d(x, w, padding=1))
            stats = [relax.const(rng.uniform(0.5, 1.5, 4).astype("float32")) for _ in range(4)]
            b = bb.emit(relax.op.nn.batch_norm(c, *stats, axis=1, training=True))
            y = bb.emit(relax.TupleGetItem(b, 0))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    return bb.get()


def test_training_mode_batch_norm_declines_with_reason(rules):
    result = fuse(_training_bn_module(), resolve_target("llvm"), rules)
    assert {k: v for k, v in result.counts.items() if v} == {"conv2d": 1}  # the conv alone; the BN stays
    reasons = [d.reason for d in result.decisions if d.rule == "conv2d_bn_relu"]
    assert reasons and "training mode" in reasons[0]


def test_higher_priority_wins_overlap(rules):
    """conv -> bn -> relu matches conv2d_bn_relu and conv2d_bn; the higher priority takes it."""
    mod = import_onnx(conv_bn_relu())
    target = resolve_target("llvm")
    both = RuleSet([rules["conv2d_bn_relu"], rules["conv2d_bn"]])
    assert {k: v for k, v in fuse(mod, target, both).counts.items() if v} == {"conv2d_bn_relu": 1}
    flipped = RuleSet([rules["conv2d_bn_relu"], dataclasses.replace(rules["conv2d_bn"], priority=1000)])
    assert {k: v for k, v in fuse(mod, target, flipped).counts.items() if v} == {"conv2d_bn": 1}


def test_golden_ir_of_conv_bn_relu(rules):
    """main becomes one call_tir of the conv2d_bn_relu PrimFunc with W' and b' folded as constants (W' packed
    at compile time into the llvm kernel's channel blocks: pack_conv)."""
    g = GraphBuilder(3)
    x = g.input("x", [1, 3, 8, 8])
    model = g.model([g.op("Relu", [g.bn(g.conv(x, 3, 4), 4)])])
    result = fuse(import_onnx(model), resolve_target("llvm"), rules)
    init = {t.name: t for t in model.graph.initializer}
    from onnx import numpy_helper

    w, b, gamma, beta, mean, var = (numpy_helper.to_array(init[n]).astype(np.float64)
                                    for n in model.graph.node[0].input[1:] + model.graph.node[1].input[1:])
    # the fuse stage first rewrites BN as x * s + t with s, t rounded to float32 (see fuse.py), then folds
    exact = gamma / np.sqrt(var + np.float64(np.float32(1e-5)))
    scale = exact.astype("float32").astype(np.float64)
    shift = (beta - mean * exact).astype("float32").astype(np.float64)
    w_folded = (w * scale[:, None, None, None]).astype("float32")
    b_folded = (b * scale + shift).astype("float32")
    w_packed, b_packed = pack_conv([w_folded, b_folded], result.groups[0].attrs,
                                   [(1, 3, 8, 8), w_folded.shape, b_folded.shape], resolve_target("llvm"))
    assert w_packed.ndim == 5, "a tiled conv's W is packed in channel blocks"
    gv = result.mod.get_global_var("conv2d_bn_relu")
    bb = relax.BlockBuilder()
    xv = relax.Var("x", _tvm.tensor_type((1, 3, 8, 8), "float32"))
    with bb.function("main", [xv], {"num_input": 1}):
        with bb.dataflow():
            out = bb.emit_output(relax.call_tir(gv, [xv, relax.const(w_packed), relax.const(b_packed)],
                                                _tvm.tensor_type((1, 4, 8, 8), "float32")))
        bb.emit_func_output(out)
    expected = bb.get()["main"]
    tvm.ir.assert_structural_equal(result.mod["main"], expected, map_free_vars=True)
    prim = result.mod["conv2d_bn_relu"]
    assert int(prim.attrs["op_pattern"]) == _tvm.OPAQUE and bool(prim.attrs[_tvm.SCHEDULED_ATTR])
    assert result.groups[0].onnx_nodes  # traceable to the ONNX nodes


ACT_CASES = [(act, form) for act, forms in ACTIVATION_FORMS.items() for form in forms]


@pytest.mark.parametrize("act,form", ACT_CASES, ids=[f"{a}-{f}" for a, f in ACT_CASES])
def test_every_activation_form_after_conv_bn(act, form, rules):
    g = GraphBuilder(5)
    x = g.input("x", [2, 3, 7, 9])
    y = apply_activation_onnx(g, g.bn(g.conv(x, 3, 8), 8), form)
    check_fused(g.model([y], opset=GELU_OPSET), rules, expect={f"conv2d_bn_{act}": 1})


@pytest.mark.parametrize("structure,act", [("bn_add", "silu"), ("add", "relu6"), ("bias", "hardswish"),
                                           ("plain", "gelu_erf"), ("bn_add", "leaky_relu"), ("add", "tanh")])
def test_structures(structure, act, rules):
    g = GraphBuilder(6)
    x = g.input("x", [1, 6, 8, 8])
    y = g.conv(x, 6, 6, bias=structure != "plain")
    if structure.startswith("bn"):
        y = g.bn(y, 6)
    if structure.endswith("add"):
        y = g.op("Add", [x, y])  # the skip connection first: operand order must not matter
    y = apply_activation_onnx(g, y, ACTIVATION_FORMS[act][-1])
    prefix = {"bn_add": "conv2d_bn_add", "add": "conv2d_add", "bias": "conv2d_bias", "plain": "conv2d"}[structure]
    check_fused(g.model([y], opset=GELU_OPSET), rules, expect={f"{prefix}_{act}": 1})


@pytest.mark.parametrize("bn", [True, False], ids=["bn_add", "add"])
@pytest.mark.parametrize("skip_first", [True, False], ids=["skip+y", "y+skip"])
def test_residual_add_without_activation(bn, skip_first, rules):
    """MobileNetV2/V3 and EfficientNet's inverted residual: the projection conv (+BN) ends in the Add, no
    activation after it. One conv2d_bn_add / conv2d_add kernel takes the skip as an input, either order."""
    g = GraphBuilder(8)
    x = g.input("x", [2, 6, 7, 7])
    y = g.conv(x, 6, 6, k=1)
    if bn:
        y = g.bn(y, 6)
    y = g.op("Add", [x, y] if skip_first else [y, x])
    # the sum feeds another conv, as the next block's expansion does
    out = g.conv(y, 6, 4, bias=False)
    check_fused(g.model([out]), rules, expect={"conv2d_bn_add" if bn else "conv2d_add": 1, "conv2d": 1})


@pytest.mark.parametrize("kept_first", [True, False], ids=["add(kept, last)", "add(last, kept)"])
def test_residual_sum_of_two_convs_takes_the_one_not_used_elsewhere(kept_first, rules):
    """MobileNetV2's stacked inverted residuals: add(conv_a, conv_b) where conv_a's output also feeds the
    next block. Whichever operand comes first, conv_b (used only by the add) is the fused conv; the matcher
    binds y to the first operand, declines it, and the swapped variant of the rule takes the other."""
    g = GraphBuilder(11)
    x = g.input("x", [1, 6, 6, 6])
    kept = g.conv(x, 6, 6, k=1)
    last = g.conv(g.op("Relu", [g.conv(kept, 6, 12, k=1)]), 12, 6, k=1)
    y = g.op("Add", [kept, last] if kept_first else [last, kept])
    fused = check_fused(g.model([g.conv(y, 6, 4, k=1)]), rules,
                        expect={"conv2d_add": 1, "conv2d_bias_relu": 1, "conv2d_bias": 2})
    group = next(grp for grp in fused.fused.groups if grp.rule == "conv2d_add")
    last_node = next(n.name for n in g.nodes if n.output[0] == last)
    assert last_node in group.onnx_nodes, group.onnx_nodes


@pytest.mark.parametrize("bn,act", [(False, "silu"), (True, "relu"), (False, "hardswish")])
@pytest.mark.parametrize("skip_first", [True, False], ids=["skip+act", "act+skip"])
def test_residual_add_after_the_activation(bn, act, skip_first, rules):
    """YOLO's bottleneck: x + silu(conv(x)), the skip joining after the activation. One conv2d_<act>_add /
    conv2d_bn_<act>_add kernel adds the residual after the activation."""
    g = GraphBuilder(12)
    x = g.input("x", [2, 6, 7, 7])
    y = g.conv(x, 6, 6)
    if bn:
        y = g.bn(y, 6)
    y = apply_activation_onnx(g, y, ACTIVATION_FORMS[act][-1])
    y = g.op("Add", [x, y] if skip_first else [y, x])
    rule_name = f"conv2d_bn_{act}_add" if bn else f"conv2d_{act}_add"
    fused = check_fused(g.model([y]), rules, expect={rule_name: 1})
    assert fused.fused.groups[0].attrs["residual_after_activation"] is True


def test_golden_ir_of_conv_add_without_activation(rules):
    """conv2d -> bias -> add(skip): main becomes one call_tir of conv2d_add(x, skip, W, b), W packed in the llvm
    kernel's channel blocks (pack_channel_blocks: 4 channels padded to one block of the tile)."""
    g = GraphBuilder(9)
    x = g.input("x", [1, 4, 5, 5])
    model = g.model([g.op("Add", [g.conv(x, 4, 4, k=1), x])])
    result = fuse(import_onnx(model), resolve_target("llvm"), rules)
    assert {k: v for k, v in result.counts.items() if v} == {"conv2d_add": 1}
    main = result.mod["main"]
    calls = [b.value for blk in main.body.blocks for b in blk.bindings]
    assert len(calls) == 1 and calls[0].op.name == "relax.call_tir", main
    gv, args = calls[0].args[0], calls[0].args[1]
    assert gv.name_hint == "conv2d_add"
    assert [str(getattr(a, "name", type(a).__name__)) for a in args][:2] == ["x", "x"]  # input, then the skip
    w, b = (_tvm.constant_value(a) for a in list(args)[2:])
    init = {i.name: i for i in model.graph.initializer}
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    w_onnx = onnx_array(init[conv.input[1]])
    taps_first = packs_taps_first(resolve_target("llvm"))  # AVX2: [blocks, KH, KW, C, B]
    np.testing.assert_array_equal(w, pack_channel_blocks(w_onnx, 1, w.shape[-1], w.shape[-1], taps_first))
    np.testing.assert_array_equal(w[..., :4].transpose(0, 4, 1, 2, 3).reshape(4, 4, 1, 1), w_onnx)
    np.testing.assert_array_equal(b, onnx_array(init[conv.input[2]]))


def test_bias_of_a_1x1_output_is_not_a_residual(rules):
    """After a global pool the conv output is (N, C, 1, 1) and its bias constant has that shape too; the
    residual rules decline it (a bias), so the conv2d_bias rules fold it as a bias."""
    g = GraphBuilder(10)
    x = g.input("x", [1, 8, 1, 1])
    model = g.model([g.op("Relu", [g.conv(x, 8, 4, k=1)])])
    fused = check_fused(model, rules, expect={"conv2d_bias_relu": 1})
    reasons = {d.rule: d.reason for d in fused.fused.decisions}
    assert reasons["conv2d_add_relu"] == ("residual operand is a per-channel constant of shape (1, 4, 1, 1); it "
                                          "is a bias, which the conv2d_bias rules fold")


def test_gelu_with_wrong_constant_declines_with_reason(rules):
    g = GraphBuilder(7)
    x = g.input("x", [1, 3, 6, 6])
    y = g.conv(x, 3, 4)
    erf = g.op("Erf", [g.op("Div", [y, g.const(np.array(1.5, np.float32))])])
    out = g.op("Mul", [g.op("Mul", [y, g.op("Add", [erf, g.const(np.array(1.0, np.float32))])]),
                       g.const(np.array(0.5, np.float32))])
    # not a GELU: the conv is a kernel alone, the bias add and the five ops after it one elementwise kernel
    fused = check_fused(g.model([out]), rules, expect={"conv2d": 1, "elementwise_chain_6": 1})
    reasons = [d.reason for d in fused.fused.decisions if d.rule == "conv2d_bias_gelu_erf"]
    assert reasons == ["the erf argument's divisor is 1.5; gelu needs 1.41421"]


# ---------------------------------------------------------------- property: over the family's domain
from hypothesis import strategies as st  # noqa: E402

from tvm_fusion.testing import check_family_property  # noqa: E402


@st.composite
def conv_chains(draw):
    groups_kind = draw(st.sampled_from(["1", "2", "depthwise"]))
    cin = draw(st.integers(1, 6)) * (2 if groups_kind == "2" else 1)
    cout = {"1": draw(st.integers(1, 9)), "2": 2 * draw(st.integers(1, 4)), "depthwise": cin}[groups_kind]
    groups = {"1": 1, "2": 2, "depthwise": cin}[groups_kind]
    k, stride, dilation = draw(st.sampled_from([1, 3, 5])), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pads = [draw(st.integers(0, k // 2 * dilation)) for _ in range(4)]
    span = dilation * (k - 1) + 1
    h, w = draw(st.integers(span, span + 6)), draw(st.integers(span, span + 6))
    structure = draw(st.sampled_from(list(STRUCTURES)))
    act = draw(st.sampled_from(list(ACTIVATION_FORMS)))
    form = draw(st.sampled_from(ACTIVATION_FORMS[act]))
    g = GraphBuilder(draw(st.integers(0, 2**16)))
    n = draw(st.integers(1, 2))
    x = g.input("x", [n, cin, h, w])
    oh = (h + pads[0] + pads[2] - span) // stride + 1
    ow = (w + pads[1] + pads[3] - span) // stride + 1
    y = g.conv(x, cin, cout, k=k, stride=stride, pads=pads, dilation=dilation, groups=groups,
               bias=structure != "plain")
    if structure.startswith("bn"):
        y = g.bn(y, cout)
    act_first = STRUCTURES[structure][1].get("act_first", False)  # the skip joins after the activation
    skip_first = draw(st.booleans())

    def add_skip(v):
        skip = g.input("skip", [n, cout, oh, ow])
        return g.op("Add", [skip, v] if skip_first else [v, skip])

    if structure.endswith("add") and not act_first:
        y = add_skip(y)
    pre = y
    y = apply_activation_onnx(g, y, form)
    if act_first:
        y = add_skip(y)
    prefix = STRUCTURES[structure][0]
    leak = draw(st.integers(0, 3)) == 0  # a near miss: the pre-activation value escapes, so it declines
    name = prefix.format(act=act) if "{act}" in prefix else f"{prefix}_{act}"
    return g.model([y, pre] if leak else [y], opset=GELU_OPSET), name


def test_property_conv_family(rules):
    """Each generated chain fuses to the fused == unfused == onnxruntime numbers or declines leaving the module
    unchanged; at least half fire (8 of the 12 derandomized examples), the near misses (the pre-activation
    value escaping) decline."""
    fired, examples = check_family_property(conv_chains(), rules, min_share=0.5)
    assert fired < examples, "no generated near miss declined"


def test_per_channel_checks_decline_with_reasons(rules):
    """A conv 'bias' that is not per output channel, and a residual of another shape."""
    from tvm_fusion import explain

    g = GraphBuilder(12)
    x = g.input("x", [1, 4, 6, 6])
    c = g.conv(x, 4, 4, bias=False)
    y = g.op("Relu", [g.op("Add", [c, g.const(np.ones((1, 1, 6, 6), np.float32))])])
    reasons = [d.reason for d in explain(g.model([y]), rules=rules).declined("conv2d_add_relu")]
    assert reasons == ["residual operand has shape (1, 1, 6, 6); expected the conv output shape (1, 4, 6, 6)"]


def test_float64_conv_declines_with_reason(rules):
    """float16 and bfloat16 fuse (tests/test_precision.py); float64 has no compute."""
    from onnx import TensorProto

    from tvm_fusion import explain

    g = GraphBuilder(13)
    x = g.input("x", [1, 2, 5, 5], TensorProto.DOUBLE)
    w = g.const(g.rng.normal(size=(3, 2, 3, 3)).astype(np.float64))
    y = g.op("Relu", [g.op("Conv", [x, w], kernel_shape=[3, 3], pads=[1, 1, 1, 1])])
    reasons = [d.reason for d in explain(g.model([y], dtype=TensorProto.DOUBLE), rules=rules)
               .declined("conv2d_relu")]
    assert reasons == ["conv2d dtype is float64; the compute supports float32, float16, bfloat16"]


def _relax_conv_bn_relu(x_shape, data_layout="NCHW", bn_axis=1):
    """conv2d -> batch_norm -> relu written directly in Relax (layouts and shapes ONNX cannot express)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", _tvm.tensor_type(x_shape, "float32"))
    rng = np.random.default_rng(0)
    kernel_layout = "OIHW" if data_layout == "NCHW" else "OHWI"
    w_shape = (4, 3, 3, 3)
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(rng.normal(size=w_shape).astype("float32"))
            c = bb.emit(relax.op.nn.conv2d(x, w, padding=1, data_layout=data_layout, kernel_layout=kernel_layout))
            stats = [relax.const(rng.uniform(0.5, 1.5, 4).astype("float32")) for _ in range(4)]
            b = bb.emit(relax.op.nn.batch_norm(c, *stats, axis=bn_axis))
            y = bb.emit(relax.TupleGetItem(b, 0))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    return bb.get()


def _reasons(mod, rules, rule_name):
    return [d.reason for d in fuse(mod, resolve_target("llvm"), rules).decisions if d.rule == rule_name]


def test_nhwc_declines_with_reason(rules):
    mod = _relax_conv_bn_relu((1, 6, 6, 3), data_layout="NHWC", bn_axis=3)
    assert _reasons(mod, rules, "conv2d_bn_relu") == [
        "conv2d layout is NHWC/OHWI; the compute takes NCHW/OIHW"]


def test_symbolic_batch_fuses_and_other_symbolic_dims_decline_with_reason(rules):
    from tvm_fusion._tvm import tirx

    n, h = tirx.Var("n", "int64"), tirx.Var("h", "int64")
    # a symbolic batch passes the shape check: the rule says what it says of a static batch
    assert _reasons(_relax_conv_bn_relu((n, 3, 6, 6)), rules, "conv2d_bn_relu") == \
        _reasons(_relax_conv_bn_relu((2, 3, 6, 6)), rules, "conv2d_bn_relu")
    assert _reasons(_relax_conv_bn_relu((1, 3, h, 6)), rules, "conv2d_bn_relu") == [
        "conv2d input has shape (1, 3, h, 6); only the outermost (batch) dim may stay symbolic: bind the others "
        "with --shape (e.g. NAME=Nx3x224x224)"]


# ---------------------------------------------------------------- per channel only from the broadcast shape
def _w_equals_c(tail):
    """conv with C = W = 8 output channels and columns, then tail(g, y) with (C,)-shaped constants: ONNX
    broadcasting puts a (C,) constant over the last axis (W), not over the channels."""
    g = GraphBuilder(21)
    x = g.input("x", [1, 4, 8, 8])
    y = tail(g, g.conv(x, 4, 8, bias=False))
    return g.model([g.op("Relu", [y])])


def _vec(g, low, high):
    return g.const(g.rng.uniform(low, high, 8).astype(np.float32))


W_EQUALS_C = {
    # name -> (tail, rule that folded it on main, counts now, the annotated constant it declines on)
    "bias_add": (lambda g, y: g.op("Add", [y, _vec(g, -3, 3)]), "conv2d_bias_relu",
                 {"conv2d": 1, "add_relu": 1}, "bias_add"),
    "mul_add_as_bn": (lambda g, y: g.op("Add", [g.op("Mul", [y, _vec(g, 0.5, 3)]), _vec(g, -3, 3)]),
                      "conv2d_bn_relu", {"conv2d": 1, "elementwise_chain_3": 1}, "bn_scale"),
    "scale_layer_after_bn": (lambda g, y: g.op("Add", [g.op("Mul", [g.bn(y, 8), _vec(g, 0.5, 3)]), _vec(g, -3, 3)]),
                             "conv2d_bn_relu", {"conv2d_bn": 1, "elementwise_chain_3": 1}, "post_scale"),
}


@pytest.mark.parametrize("case", W_EQUALS_C)
def test_c_shaped_constant_broadcasts_over_w_not_channels(case, rules, matches_onnxruntime):
    """A regression: with W == C a (C,) constant after a conv was folded as per channel (max abs error 4.5)."""
    tail, rule_name, counts, part = W_EQUALS_C[case]
    model = _w_equals_c(tail)
    fused = check_fused(model, rules, expect=counts)
    matches_onnxruntime(model, fused)
    reasons = {d.rule: d.reason for d in fused.fused.decisions}
    assert reasons[rule_name] == (f"{part} constant has shape (8,); expected one value per output channel, "
                                  "(8, 1, 1) or (1, 8, 1, 1), broadcast against the conv output (1, 8, 8, 8)")


@pytest.mark.parametrize("shape", [(1, 1, 8, 1, 1), (1, 8, 1, 1, 1)])
def test_constant_of_higher_rank_than_the_conv_output_declines(shape, rules):
    """A (1, 1, C, 1, 1) 'bias' makes the output rank 5: it is not a per-channel bias of the conv."""
    g = GraphBuilder(22)
    x = g.input("x", [1, 4, 6, 6])
    y = g.op("Add", [g.conv(x, 4, 8, bias=False), g.const(g.rng.normal(0, 1, shape).astype(np.float32))])
    fused = check_fused(g.model([g.op("Relu", [y])]), rules, expect={"conv2d": 1, "add_relu": 1})
    reasons = {d.rule: d.reason for d in fused.fused.decisions}
    assert reasons["conv2d_bias_relu"].startswith(f"bias_add constant has shape {shape}; expected one value per")


# ---------------------------------------------------------------- conv1d: the conv2d rules at height 1
def _conv1d(g, x, cin, cout, k, stride=1, pads=None, dilation=1, groups=1, bias=True):
    w = g.const(g.rng.normal(0, np.sqrt(2.0 / (cin // groups * k)), (cout, cin // groups, k)).astype(np.float32), "w")
    ins = [x, w] + ([g.const(g.rng.normal(0, 0.1, cout).astype(np.float32), "b")] if bias else [])
    pads = pads if pads is not None else [k // 2 * dilation] * 2
    return g.op("Conv", ins, kernel_shape=[k], strides=[stride], pads=list(pads), dilations=[dilation], group=groups)


def _audio_block(batch=1, width=100):
    """conv1d + BN + ReLU (stride 2), a depthwise conv1d with the block's input added back, then ReLU (an FSMN
    memory block), a 1x1 conv1d."""
    g = GraphBuilder(30)
    x = g.input("x", [batch, 16, width])
    y = g.op("Relu", [g.bn(_conv1d(g, x, 16, 32, 5, stride=2), 32)])
    y = g.op("Relu", [g.op("Add", [_conv1d(g, y, 32, 32, 11, groups=32, bias=False), y])])
    return g.model([_conv1d(g, y, 32, 8, 1)])


AUDIO_COUNTS = {"conv2d_bn_relu": 1, "conv2d_add_relu": 1, "conv2d_bias": 1}


def test_conv1d_takes_the_conv_rules(rules):
    fused = check_fused(_audio_block(), rules, expect=AUDIO_COUNTS)
    assert not fused.unscheduled


@pytest.mark.parametrize("k, stride, pads, dilation, groups", [
    (3, 1, [1, 1], 1, 1), (10, 5, [0, 0], 1, 1), (3, 1, [0, 2], 1, 1), (3, 1, [2, 2], 2, 1), (5, 1, [2, 2], 1, 4),
    (7, 2, [3, 3], 1, 12)])
def test_conv1d_attributes(k, stride, pads, dilation, groups, rules):
    """Strides, asymmetric padding, dilation and groups along the width."""
    g = GraphBuilder(31)
    y = _conv1d(g, g.input("x", [2, 12, 37]), 12, 24, k, stride, pads, dilation, groups)
    check_fused(g.model([g.op("Relu", [y])]), rules, expect={"conv2d_bias_relu": 1})


def test_conv1d_float16_and_avx2(rules):
    from tvm_fusion.build.builder import build
    from tvm_fusion.check.compare import random_inputs, run_onnxruntime
    from tvm_fusion.testing import as_float16, assert_close, run_build

    check_fused(as_float16(_audio_block()), rules, expect=AUDIO_COUNTS)
    model = _audio_block()
    avx2 = build(import_onnx(model), tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v3"}), "fused", rules=rules)
    assert {k: v for k, v in avx2.counts.items() if v} == AUDIO_COUNTS
    feeds = random_inputs(model, seed=0)
    (ref,) = run_onnxruntime(model, feeds)[0].run(None, feeds)
    assert_close(run_build(avx2, [feeds["x"]])[0], ref, "conv1d block, AVX2")


def test_conv1d_with_a_symbolic_batch(rules):
    """The views [N, C, 1, W] keep N symbolic (in the caller's dims): one build, batches 1 and 3."""
    from tvm_fusion.build.builder import build
    from tvm_fusion.check.compare import run_onnxruntime
    from tvm_fusion.frontend.importer import SymDim
    from tvm_fusion.testing import assert_close

    model = _audio_block(batch="N")
    built = build(import_onnx(model, {"x": (SymDim("N", 4), 16, 100)}), "llvm", "fused", rules=rules)
    assert {k: v for k, v in built.counts.items() if v} == AUDIO_COUNTS
    vm = relax.VirtualMachine(built.executable, tvm.cpu())
    sess, _ = run_onnxruntime(model, {}, optimize=False)
    for n in (1, 3):
        x = np.random.default_rng(n).standard_normal((n, 16, 100)).astype(np.float32)
        assert_close(vm["main"](tvm.runtime.tensor(x)).numpy(), sess.run(None, {"x": x})[0], f"batch {n}")


# ---------------------------------------------------------------- conv3d: the same rules, the conv3d compute
def _conv3d(g, x, cin, cout, k=3, stride=1, pads=None, dilation=1, groups=1, bias=True):
    k = (k,) * 3 if isinstance(k, int) else tuple(k)
    w = g.rng.normal(0, np.sqrt(2.0 / (cin // groups * int(np.prod(k)))), (cout, cin // groups, *k))
    ins = [x, g.const(w.astype(np.float32), "w")]
    ins += [g.const(g.rng.normal(0, 0.1, cout).astype(np.float32), "b")] if bias else []
    pads = pads if pads is not None else [kk // 2 * dilation for kk in k] * 2
    return g.op("Conv", ins, kernel_shape=list(k), strides=[stride] * 3, pads=list(pads), dilations=[dilation] * 3,
                group=groups)


def _video_block(batch=1, depth=5, hw=9):
    """conv3d + BN + ReLU, a conv3d + BN whose input is added back then ReLU (a residual block), a 1x1x1
    conv3d with a bias."""
    g = GraphBuilder(40)
    x = g.input("x", [batch, 8, depth, hw, hw])
    y = g.op("Relu", [g.bn(_conv3d(g, x, 8, 16, bias=False), 16)])
    y = g.op("Relu", [g.op("Add", [g.bn(_conv3d(g, y, 16, 16), 16), y])])
    return g.model([_conv3d(g, y, 16, 4, k=1)])


VIDEO_COUNTS = {"conv2d_bn_relu": 1, "conv2d_bn_add_relu": 1, "conv2d_bias": 1}


def test_conv3d_takes_the_conv_rules(rules):
    """BN folded, a residual add, a bias: three kernels of the conv3d compute, every kernel scheduled."""
    fused = check_fused(_video_block(), rules, expect=VIDEO_COUNTS)
    assert not fused.unscheduled
    assert {g.compute for g in fused.fused.groups} == {"conv3d_affine"}


@pytest.mark.parametrize("k, stride, pads, dilation, groups", [
    ((3, 3, 3), 2, [1, 1, 1, 1, 1, 1], 1, 1),  # strided
    ((1, 3, 3), 1, [0, 0, 1, 2, 1, 0], 1, 1),  # asymmetric padding, a 2-D kernel in 3-D
    ((3, 1, 1), 1, [2, 0, 0, 2, 0, 0], 2, 1),  # dilation 2 along a temporal kernel
    ((3, 3, 3), 1, [1, 1, 1, 1, 1, 1], 1, 2),  # 2 groups of 12 output channels (padded per group)
])
def test_conv3d_attributes(k, stride, pads, dilation, groups, rules):
    g = GraphBuilder(41)
    y = _conv3d(g, g.input("x", [2, 12, 6, 11, 9]), 12, 24, k, stride, pads, dilation, groups)
    check_fused(g.model([g.op("Relu", [y])]), rules, expect={"conv2d_bias_relu": 1})


def test_depthwise_conv3d_declines_with_reason_and_runs_on_the_fallback(rules):
    """One input channel per group: the llvm kernel would pad every group to a vector of channels, so the
    rules decline, naming the groups and the padding; TVM's conv3d then runs on the leftover schedule (its bias
    and ReLU fused by the elementwise rules)."""
    g = GraphBuilder(42)
    model = g.model([g.op("Relu", [_conv3d(g, g.input("x", [1, 8, 4, 8, 8]), 8, 8, groups=8)])])
    fused = check_fused(model, rules, expect={"add_relu": 1})
    assert not fused.unscheduled
    reasons = {d.rule: d.reason for d in fused.fused.decisions}
    assert reasons["conv2d_bias_relu"].startswith("conv3d has 8 groups of 1 output channels; the llvm conv3d "
                                                  "kernel computes whole vectors of"), reasons


def test_conv3d_float16_and_avx2(rules):
    from tvm_fusion.build import build
    from tvm_fusion.check.compare import random_inputs, run_onnxruntime
    from tvm_fusion.testing import as_float16, assert_close, run_build

    check_fused(as_float16(_video_block()), rules, expect=VIDEO_COUNTS)
    model = _video_block()
    avx2 = build(import_onnx(model), tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v3"}), "fused", rules=rules)
    assert {k: v for k, v in avx2.counts.items() if v} == VIDEO_COUNTS and not avx2.unscheduled
    feeds = random_inputs(model, seed=0)
    (ref,) = run_onnxruntime(model, feeds)[0].run(None, feeds)
    assert_close(run_build(avx2, [feeds["x"]])[0], ref, "conv3d block, AVX2")


def test_conv3d_with_a_symbolic_batch(rules):
    from tvm_fusion.frontend import SymDim
    from tvm_fusion.testing import check_symbolic_batch

    check_symbolic_batch(_video_block(batch="N"), {"x": (SymDim("N", 4), 8, 5, 9, 9)}, rules, expect=VIDEO_COUNTS)


def test_conv3d_builds_for_cuda(rules):
    """sm_90, no GPU: every kernel within the launch limits, nvcc compiles the source."""
    from tvm_fusion.testing import check_cuda_build

    check_cuda_build(_video_block(), rules, expect=VIDEO_COUNTS)


@pytest.mark.slow
def test_conv3d_builds_for_cuda_in_float16_and_with_a_symbolic_batch(rules):
    from tvm_fusion.frontend import SymDim
    from tvm_fusion.testing import as_float16, check_cuda_build

    check_cuda_build(as_float16(_video_block()), rules, expect=VIDEO_COUNTS)
    check_cuda_build(_video_block(batch="N"), rules, expect=VIDEO_COUNTS, shapes={"x": (SymDim("N", 4), 8, 5, 9, 9)})


def test_conv3d_bfloat16_matches_the_float32_model(rules):
    """onnxruntime has no bfloat16 Conv on the CPU: conv3d + BN + ReLU fused against the float32 model on the
    same (rounded) input, with bfloat16's tolerance. (Not against the unfused build here: it rounds the conv's
    sums to bfloat16 before the BatchNorm's shift cancels most of them, 0.12 off the float32 model where the
    fused kernel, folded, is 0.023 off.)"""
    from tvm_fusion.build import build
    from tvm_fusion.check.compare import random_inputs, run_onnxruntime
    from tvm_fusion.precision import numpy_dtype
    from tvm_fusion.testing import as_float16, assert_close, run_build

    g = GraphBuilder(43)
    model = g.model([g.op("Relu", [g.bn(_conv3d(g, g.input("x", [1, 8, 5, 9, 9]), 8, 16), 16)])])
    mod = import_onnx(as_float16(model, "bfloat16"))
    half = random_inputs(model)["x"].astype(numpy_dtype("bfloat16"))
    fused = build(mod, "llvm", "fused", rules=rules)
    assert {k: v for k, v in fused.counts.items() if v} == {"conv2d_bn_relu": 1} and not fused.unscheduled
    wide = {"x": half.astype(np.float32)}
    (r32,) = run_onnxruntime(model, wide)[0].run(None, wide)
    got = run_build(fused, [half])[0]
    assert got.dtype == numpy_dtype("bfloat16")
    assert_close(got, r32, "fused bfloat16 vs float32", dtype="bfloat16")
