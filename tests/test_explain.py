"""explain: the rule that took each chain, reasons for near misses, what is left to TVM."""

from tvm_fusion import explain
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
    assert ex.ops_left == {"relax.nn.max_pool2d": 1, "relax.nn.avg_pool2d": 1, "relax.reshape": 3,
                           "relax.nn.softmax": 1}
