"""Valid models that crashed or lost information: BatchNorm in a graph with an If, a node named `main`,
duplicate node names. Each runs import, fuse, compare, explain (and compile for the If case)."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from test_frontend import _assert_matches_onnxruntime

import tvm_fusion as tf
from tvm_fusion._tvm import relax
from tvm_fusion.check.compare import random_inputs, run_onnxruntime
from tvm_fusion.check.explain import op_counts
from tvm_fusion.frontend.importer import import_onnx, onnx_node_names
from tvm_fusion.fusion.fuse import normalize_batch_norm
from tvm_fusion.testing import GraphBuilder, assert_close, conv_bn_relu, run_build


def _bn_with_if():
    """conv -> bn -> relu, then If(const) { relu } else { neg }: the importer builds no dataflow block."""
    g = GraphBuilder()
    x = g.input("x", [1, 4, 6, 6])
    y = g.op("Relu", [g.bn(g.conv(x, 4, 8), 8)])
    branch = lambda op, out: helper.make_graph(  # noqa: E731
        [helper.make_node(op, [y], [out], name=f"{out}_node")], out, [],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, 8, 6, 6])])
    g.nodes.append(helper.make_node("If", [g.const(np.array(True))], ["z"], name="branch",
                                    then_branch=branch("Relu", "then_out"), else_branch=branch("Neg", "else_out")))
    return g.model(["z"])


def test_batch_norm_with_if_imports_fuses_and_matches_onnxruntime():
    model = _bn_with_if()
    _assert_matches_onnxruntime(model)
    result = tf.fuse(import_onnx(model), "llvm")
    assert {k: v for k, v in result.counts.items() if v} == {"conv2d_bn_relu": 1}
    assert "relax.nn.batch_norm" not in op_counts(result.mod["main"])


def test_batch_norm_with_if_compare_explain_compile(tmp_path):
    model = _bn_with_if()
    report = tf.compare(model, target="llvm")
    assert report.ok, report.failures()
    assert "conv2d_bn_relu" in str(tf.explain(model))
    compiled = tf.compile(model, tmp_path / "m.so", target="llvm", counts_of_other_builds=False)
    assert (tmp_path / "m.so").exists()
    assert {k: v for k, v in compiled.manifest["rule_counts"].items() if v} == {"conv2d_bn_relu": 1}


def test_batch_norm_folds_outside_dataflow_blocks():
    """normalize_batch_norm on a binding block that is not a dataflow block (any block kind works)."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, 3, 4, 4), "float32"))
    gamma, beta, mean = (relax.const(rng.normal(0, 1, 3).astype("float32")) for _ in range(3))
    var = relax.const(rng.uniform(0.5, 2, 3).astype("float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        bn = bb.emit(relax.op.nn.batch_norm(x, gamma, beta, mean, var, axis=1, training=False))
        out = bb.emit(relax.TupleGetItem(bn, 0))
        bb.emit_func_output(out)
    mod = bb.get()
    folded = normalize_batch_norm(mod)
    assert "relax.nn.batch_norm" not in op_counts(folded["main"])
    arr = rng.normal(size=(1, 3, 4, 4)).astype("float32")
    got, want = (run_build(tf.build(m, "llvm", "unfused"), [arr])[0] for m in (folded, mod))
    assert_close(got, want, "BatchNorm as x * s + t vs batch_norm")


def test_node_named_main():
    model = conv_bn_relu()
    model.graph.node[2].name = "main"
    _assert_matches_onnxruntime(model)
    assert tf.compare(model, target="llvm").ok
    explanation = tf.explain(model)
    assert [g.onnx_nodes for g in explanation.result.groups] == [["BatchNormalization10", "Conv4", "main"]]


def _duplicates():
    """conv -> bn feeding a Relu and a Sigmoid that are added (not two Relus: the simplifier would merge
    them into one): every node is called `dup`."""
    g = GraphBuilder()
    x = g.input("x", [1, 4, 6, 6])
    bn = g.bn(g.conv(x, 4, 8), 8)
    model = g.model([g.op("Add", [g.op("Relu", [bn]), g.op("Sigmoid", [bn])])])
    for n in model.graph.node:
        n.name = "dup"
    return model


def test_duplicate_node_names_distinguishable_in_explain_groups_and_declines():
    explanation = tf.explain(_duplicates())
    assert [g.onnx_nodes for g in explanation.result.groups] == [["dup (node 0)", "dup (node 1)"]]
    declined = {(d.onnx_node, d.rule): d.reason for d in explanation.declined()}
    assert declined == {
        ("dup (node 2)", "conv2d_bn_relu"): "intermediate dup (node 1) has 2 consumers (dup (node 2), "
                                            "dup (node 3)); fusing would hide it from dup (node 3)",
        ("dup (node 3)", "conv2d_bn_sigmoid"): "intermediate dup (node 1) has 2 consumers (dup (node 2), "
                                            "dup (node 3)); fusing would hide it from dup (node 2)",
        # the add after the activation (YOLO's bottleneck rules) sees the same shared intermediate
        ("dup (node 4)", "conv2d_bn_relu_add"): "intermediate dup (node 1) has 2 consumers (dup (node 2), "
                                                "dup (node 3)); fusing would hide it from dup (node 3)",
        ("dup (node 4)", "conv2d_bn_sigmoid_add"): "intermediate dup (node 1) has 2 consumers (dup (node 2), "
                                                   "dup (node 3)); fusing would hide it from dup (node 2)",
    }
    text = str(explanation)
    assert "conv2d_bn              <- dup (node 0), dup (node 1)" in text
    assert "  dup (node 2): conv2d_bn_relu: intermediate dup (node 1)" in text


def test_duplicate_node_names_numerics():
    """onnxruntime refuses duplicate node names: the reference is the same graph with unique names."""
    model, unique = _duplicates(), _duplicates()
    for i, n in enumerate(unique.graph.node):
        n.name = f"n{i}"
    inputs = random_inputs(model)
    ref = run_onnxruntime(unique, inputs)[0].run(None, inputs)
    for mode in ("unfused", "fused"):
        got = run_build(tf.build(import_onnx(model), "llvm", mode), [inputs["x"]])
        assert_close(got[0], ref[0], f"{mode} vs onnxruntime")


def test_if_branches_with_unusual_and_duplicate_names():
    """Subgraph nodes and values are sanitised too: a branch node named `main` crashed the import."""
    g = GraphBuilder()
    y = g.op("Relu", [g.input("x", [2, 3])])
    g.nodes[-1].name = "dup"
    branch = lambda op, out, name: helper.make_graph(  # noqa: E731
        [helper.make_node(op, [y], [out], name=name)], "b", [],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, [2, 3])])
    g.nodes.append(helper.make_node("If", [g.const(np.array(False))], ["z"], name="dup",
                                    then_branch=branch("Relu", "a/b", "main"), else_branch=branch("Neg", "c.d", "if")))
    model = g.model(["z"])
    inputs = random_inputs(model)
    unique = type(model).FromString(model.SerializeToString())
    unique.graph.node[1].name = "the_if"  # onnxruntime refuses duplicate node names
    ref = run_onnxruntime(unique, inputs)[0].run(None, inputs)
    mod = import_onnx(model, simplify=False)  # the simplifier would fold the constant-condition If away
    assert set(onnx_node_names(mod).values()) >= {"dup (node 0)", "dup (node 1)", "main", "if"}
    for mode in ("unfused", "fused"):
        got = run_build(tf.build(mod, "llvm", mode), [inputs["x"]])
        assert_close(got[0], ref[0], f"{mode} vs onnxruntime")


@pytest.mark.parametrize("model", ["bn_with_if", "node_named_main"])
def test_cli_subcommands_on_crash_models(model, tmp_path, capsys):
    """Every subcommand that crashed: explain, compare, compile (llvm) exit 0."""
    from tvm_fusion.cli import main

    proto = _bn_with_if() if model == "bn_with_if" else conv_bn_relu()
    if model == "node_named_main":
        proto.graph.node[2].name = "main"
    path = tmp_path / "m.onnx"
    onnx.save(proto, str(path))
    for argv in (["explain", str(path), "--target", "llvm"], ["compare", str(path), "--target", "llvm"],
                 ["compile", str(path), "--target", "llvm", "-o", str(tmp_path / "m.so")]):
        rc = main(argv)
        out, err = capsys.readouterr()
        assert rc == 0, (argv, out, err)
    manifest = json.loads((tmp_path / "m.so.json").read_text())
    assert (tmp_path / "m.so").exists()
    assert {k: v for k, v in manifest["rule_counts"].items() if v} == {"conv2d_bn_relu": 1}
