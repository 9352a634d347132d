"""explain: the rule that took each chain, reasons for near misses, what is left to TVM."""

from tvm_fusion import explain
from tvm_fusion.build.builder import resolve_target
from tvm_fusion.hardware import cpu_facts
from tvm_fusion.testing import GraphBuilder, residual_block


def test_reason_names_the_onnx_nodes(rules):
    g = GraphBuilder(1)
    x = g.input("x", [1, 4, 8, 8])
    y = g.bn(g.conv(x, 4, 8), 8)
    model = g.model([g.op("Relu", [y]), g.op("Sigmoid", [y])])
    bn, relu, sigmoid = (n.name for n in model.graph.node[1:])
    ex = explain(model, rules=rules)
    (declined,) = ex.declined("conv2d_bn_relu")
    assert declined.onnx_node == relu
    assert declined.reason == (f"intermediate {bn} has 2 consumers ({relu}, {sigmoid}); "
                               f"fusing would hide it from {sigmoid}")
    assert {k: v for k, v in ex.result.counts.items() if v} == {"conv2d_bn": 1}
    assert ex.ops_left == {"relax.nn.relu": 1, "relax.sigmoid": 1}
    text = str(ex)
    assert "conv2d_bn_relu: intermediate" in text and "ops covered by our rules: 4 of 6 (67%)" in text  # BN counted as its multiply + add


def test_everything_covered(rules):
    ex = explain(residual_block(), rules=rules)
    assert not ex.ops_left and ex.share == 1.0 and not ex.declined()


def test_resnet50_explain(resnet50_mod, rules):
    ex = explain(resnet50_mod, rules=rules)
    left = {"relax.nn.avg_pool2d": 1, "relax.reshape": 3, "relax.nn.softmax": 1}  # the stem's pool fused
    if cpu_facts(resolve_target("llvm")).isa == "avx512":  # a 32-channel task's 1.5 MiB plane: past the bound
        left["relax.nn.max_pool2d"] = 1
        reasons = [d.reason for d in ex.declined("conv2d_bn_relu_pool")]
        assert any(r.startswith("a task's conv output plane is 1.5 MiB") for r in reasons), reasons
    assert ex.ops_left == left


def _conv_bn_sigmoid():
    g = GraphBuilder(1)
    x = g.input("x", [1, 4, 8, 8])
    model = g.model([g.op("Sigmoid", [g.bn(g.conv(x, 4, 8, bias=False), 8)])])
    return model, [n.name for n in model.graph.node]


def test_near_miss_says_how_far_the_pattern_got_and_what_it_found(rules):
    model, (conv, bn, sigmoid) = _conv_bn_sigmoid()
    ex = explain(model, rules=rules.select(only=["conv2d_bn_relu", "conv2d_bn"]))
    assert {k: v for k, v in ex.result.counts.items() if v} == {"conv2d_bn": 1}
    (miss,) = ex.near_misses("conv2d_bn_relu")
    assert str(miss) == "conv2d_bn_relu: matched conv2d -> batch_norm, then found sigmoid where relu was expected"
    assert (miss.onnx_node, miss.matched, miss.expected, miss.found) == (sigmoid, ("conv2d", "batch_norm"),
                                                                         ("relu",), "sigmoid")
    assert ex.near_misses("conv2d_bn") == []  # it took conv + BN: its optional `* c + d` after them is no miss
    assert f"  {sigmoid}: {miss}" in str(ex).splitlines()


def test_no_near_miss_where_a_rule_took_the_ops(rules):
    model, _ = _conv_bn_sigmoid()
    ex = explain(model, rules=rules)
    assert {k: v for k, v in ex.result.counts.items() if v} == {"conv2d_bn_sigmoid": 1}
    assert ex.near_misses() == [] and "near misses" not in str(ex)


def test_near_misses_of_every_rule_longest_first(rules):
    """Without conv2d_bn_sigmoid, every rule that reaches the BN reports the op it wanted instead of sigmoid."""
    model, (_, _, sigmoid) = _conv_bn_sigmoid()
    ex = explain(model, rules=rules.select(disable=["conv2d_bn_sigmoid"]))
    misses = ex.near_misses()
    assert misses and all(m.onnx_node == sigmoid and m.found == "sigmoid" for m in misses)
    assert [len(m.matched) for m in misses] == sorted((len(m.matched) for m in misses), reverse=True)
    by_rule = {m.rule: m for m in misses}
    assert by_rule["conv2d_bn_tanh"].expected == ("tanh",) and by_rule["conv2d_bn_tanh"].to_go == 1
    assert by_rule["conv2d_bn_add_relu"].expected == ("add",) and by_rule["conv2d_bn_add_relu"].to_go == 2
    shown = [line for line in str(ex).splitlines() if line.startswith(f"  {sigmoid}: ")]
    assert len(shown) == 4 and shown[-1].endswith(f"and {len(misses) - 3} more rules (Explanation.near_misses())")
