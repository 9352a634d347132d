"""import_onnx: sanitised names, shape binding, Sum -> add, clear errors."""

import pytest
from onnx import TensorProto, helper

from tvm_fusion import FusionError
from tvm_fusion._tvm import relax
from tvm_fusion.frontend import import_onnx, onnx_node_names, parse_shape
from tvm_fusion.testing import GraphBuilder, conv_bn_relu


def _ops(mod):
    ops = []
    relax.analysis.post_order_visit(mod["main"], lambda e: isinstance(e, relax.Call) and hasattr(e.op, "name")
                                    and ops.append(e.op.name))
    return ops


def test_slash_in_input_name_is_sanitised():
    model = conv_bn_relu()
    model.graph.input[0].name = "gpu_0/data_0"
    model.graph.node[0].input[0] = "gpu_0/data_0"
    mod = import_onnx(model)
    assert [p.name for p in mod["main"].params] == ["gpu_0_data_0"]


def test_opset9_sum_of_two_becomes_add():
    g = GraphBuilder()
    a, b = g.input("a", [1, 4, 5, 5]), g.input("b", [1, 4, 5, 5])
    mod = import_onnx(g.model([g.op("Sum", [a, b])], opset=9))
    assert _ops(mod) == ["relax.add"]


@pytest.mark.parametrize("opset", [9, 17])
def test_inference_dropout_is_removed(opset):
    """Dropout at inference is the identity: gone at import, so Gemm + bias + relu fuse across it."""
    from tvm_fusion.testing import check_fused

    g = GraphBuilder()
    x = g.input("x", [2, 8])
    y = g.op("MatMul", [x, g.const(g.rng.normal(0, 0.3, (8, 6)).astype("float32"))])
    y = g.op("Add", [y, g.const(g.rng.normal(0, 0.1, 6).astype("float32"))])
    y = g.op("Dropout", [y], **({"ratio": 0.5} if opset < 12 else {}))
    model = g.model([g.op("Relu", [y])], opset=opset)
    assert _ops(import_onnx(model)) == ["relax.matmul", "relax.add", "relax.nn.relu"]
    check_fused(model, expect={"dense_bias_relu": 1})


def test_constants_folded_and_dead_bn_outputs_removed():
    mod = import_onnx(conv_bn_relu())
    assert _ops(mod) == ["relax.nn.conv2d", "relax.add", "relax.nn.batch_norm", "relax.nn.relu"]
    assert len(mod["main"].params) == 1  # weights became constants


def test_node_names_recorded():
    model = conv_bn_relu()
    model.graph.node[0].name = "backbone/conv 1"
    table = onnx_node_names(import_onnx(model))
    assert table["backbone_conv_1"] == "backbone/conv 1"
    assert set(table.values()) == {n.name for n in model.graph.node}


def _symbolic():
    g = GraphBuilder()
    x = g.input("images", ["N", 3, 8, 8])
    return g.model([g.op("Relu", [x])])


def test_symbolic_dim_refused_with_syntax():
    with pytest.raises(FusionError, match=r"input 'images' has symbolic shape \?x3x8x8; bind it with --shape images="):
        import_onnx(_symbolic())


def test_symbolic_dim_bound_from_shapes():
    mod = import_onnx(_symbolic(), shapes={"images": (2, 3, 8, 8)})
    assert [int(d) for d in mod["main"].params[0].ty.shape] == [2, 3, 8, 8]


def test_shape_for_unknown_input_lists_inputs():
    with pytest.raises(FusionError, match=r"model's inputs are \['images'\]"):
        import_onnx(_symbolic(), shapes={"image": (1, 3, 8, 8)})


@pytest.mark.parametrize("text", ["x", "x=", "x=1xa", "=1x2", "x=0x3"])
def test_parse_shape_rejects(text):
    with pytest.raises(FusionError, match="expected --shape NAME=1x3x224x224"):
        parse_shape(text)


def test_parse_shape():
    assert parse_shape("gpu_0/data_0=1x3x224x224") == ("gpu_0/data_0", (1, 3, 224, 224))


def test_missing_and_non_onnx_files(tmp_path):
    with pytest.raises(FusionError, match="no such file"):
        import_onnx(tmp_path / "nope.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_text("not a model")
    with pytest.raises(FusionError, match="bad.onnx: not an ONNX model"):
        import_onnx(bad)


def test_unsupported_op_named():
    node = helper.make_node("FancyOp", ["x"], ["y"], name="my_fancy_node", domain="com.example")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    with pytest.raises(FusionError, match="node 'my_fancy_node' uses op com.example::FancyOp"):
        import_onnx(model)
