"""loop.py: an ONNX Loop with a constant trip count, unrolled before TVM's importer; what it refuses, and how."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_fusion.build.builder import build
from tvm_fusion.errors import FusionError
from tvm_fusion.frontend.importer import import_onnx
from tvm_fusion.check.io import run_onnxruntime
from tvm_fusion.frontend.loop import unroll_loops
from tvm_fusion.testing import assert_close, run_build

F = TensorProto.FLOAT


def _body(nodes, carried=("v",), outs=("v2",), scans=(), inits=()):
    return helper.make_graph(
        nodes, "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                        helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                        *[helper.make_tensor_value_info(v, F, [2, 3]) for v in carried]],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         *[helper.make_tensor_value_info(o, F, [2, 3]) for o in (*outs, *scans)]], list(inits))


def _model(body, trips=3, cond="", outputs=("final",), out_shapes=None, extra=()):
    inits = [numpy_helper.from_array(np.array(trips, np.int64), "M"), *extra]
    loop = helper.make_node("Loop", ["M", cond, "x"], list(outputs), name="loop:0", body=body)
    shapes = out_shapes or [[2, 3]] * len(outputs)
    graph = helper.make_graph([loop], "g", [helper.make_tensor_value_info("x", F, [2, 3])],
                              [helper.make_tensor_value_info(o, F, s) for o, s in zip(outputs, shapes)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _passes(nodes):
    return [*nodes, helper.make_node("Identity", ["c"], ["c_out"], name="keep")]


def _check(model):
    x = np.random.default_rng(0).normal(0, 1, (2, 3)).astype(np.float32)
    sess, _ = run_onnxruntime(model, {"x": x}, optimize=False)
    got = run_build(build(import_onnx(model), "llvm", "fused"), [x])
    for a, r in zip(got, sess.run(None, {"x": x}), strict=True):
        assert_close(a, r)


def test_unrolled_copies_chain_the_carried_value_and_stack_the_scans():
    """v2 = v * 2 + i (the iteration number) three times; the scan output stacks each v2."""
    body = _body(_passes([helper.make_node("Cast", ["i"], ["i_f"], to=F, name="cast"),
                          helper.make_node("Mul", ["v", "two"], ["m"], name="mul"),
                          helper.make_node("Add", ["m", "i_f"], ["v2"], name="add"),
                          helper.make_node("Identity", ["v2"], ["s"], name="scan")]),
                 scans=("s",), inits=[numpy_helper.from_array(np.float32(2), "two")])
    model = _model(body, outputs=("final", "stack"), out_shapes=[[2, 3], [3, 2, 3]])
    unrolled = unroll_loops(model, "m")
    assert [n.op_type for n in unrolled.graph.node].count("Mul") == 3
    assert "Loop" not in {n.op_type for n in unrolled.graph.node}
    assert unrolled.graph.node[-1].op_type == "Concat" and unrolled.graph.node[-1].output[0] == "stack"
    assert any(n.name == "loop:0/it2/mul" for n in unrolled.graph.node)
    _check(model)


def test_an_if_inside_the_body_reads_the_iterations_values():
    """The body's If branches read the carried value: renamed in each copy, inner names too."""
    then = helper.make_graph([helper.make_node("Neg", ["v"], ["t"], name="neg")], "then", [],
                             [helper.make_tensor_value_info("t", F, [2, 3])])
    other = helper.make_graph([helper.make_node("Relu", ["v"], ["e"], name="relu")], "else", [],
                              [helper.make_tensor_value_info("e", F, [2, 3])])
    body = _body(_passes([helper.make_node("Greater", ["i", "one"], ["late"], name="gt"),
                          helper.make_node("If", ["late"], ["v2"], name="if", then_branch=then, else_branch=other)]),
                 inits=[numpy_helper.from_array(np.int64(1), "one")])
    _check(_model(body))


@pytest.mark.parametrize("case, message", [
    ("runtime", "Loop node 'loop:0' runs a number of iterations computed at run time (trip count 'n')"),
    ("cond", "Loop node 'loop:0' starts on a condition computed at run time ('go')"),
    ("stops", "Loop node 'loop:0' stops on a condition its body computes ('c_out')"),
    ("zero", "Loop node 'loop:0' runs 0 iterations; it is unrolled for 1 to 1024"),
])
def test_a_loop_it_cannot_unroll_is_one_error_naming_the_node(case, message):
    keep = [helper.make_node("Identity", ["v"], ["v2"], name="id")]
    body = _body(_passes(keep))
    if case == "stops":
        body = _body([*keep, helper.make_node("ReduceMax", ["v2"], ["big"], keepdims=0, name="max"),
                      helper.make_node("Less", ["big", "ten"], ["c_out"], name="less")],
                     inits=[numpy_helper.from_array(np.float32(10), "ten")])
    model = _model(body, trips=0 if case == "zero" else 3, cond="go" if case == "cond" else "")
    if case == "runtime":
        model.graph.node.insert(0, helper.make_node("Size", ["x"], ["n"], name="size"))
        model.graph.node[1].input[0] = "n"
    if case == "cond":
        model.graph.input.append(helper.make_tensor_value_info("go", TensorProto.BOOL, []))
    with pytest.raises(FusionError) as err:
        unroll_loops(model, "m")
    assert str(err.value).startswith(f"m: {message}"), str(err.value)


def test_a_loop_inside_an_if_branch():
    """The unrolled copies land in the branch (its initializers too) and read the outer tensor `y/0`."""
    body = _body(_passes([helper.make_node("Add", ["v", "y/0"], ["v2"], name="add")]))
    loop = helper.make_node("Loop", ["M", "", "y/0"], ["looped"], name="loop/0", body=body)
    then = helper.make_graph([loop], "then", [], [helper.make_tensor_value_info("looped", F, [2, 3])],
                             [numpy_helper.from_array(np.array(2, np.int64), "M")])
    other = helper.make_graph([helper.make_node("Neg", ["y/0"], ["neg"], name="neg")], "else", [],
                              [helper.make_tensor_value_info("neg", F, [2, 3])])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y/0"], name="relu"),
         helper.make_node("If", ["c"], ["out"], name="if", then_branch=then, else_branch=other)], "g",
        [helper.make_tensor_value_info("x", F, [2, 3]), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("out", F, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    built = build(import_onnx(model), "llvm", "fused")
    x = np.random.default_rng(0).normal(0, 1, (2, 3)).astype(np.float32)
    for taken in (True, False):
        feeds = {"x": x, "c": np.array(taken)}
        sess, _ = run_onnxruntime(model, feeds, optimize=False)
        assert_close(run_build(built, [x, np.array(taken)])[0], sess.run(None, feeds)[0], f"branch {taken}")


def test_an_lstm_inside_the_body():
    """An LSTM over the carried [2, 3] value read as 2 steps of a batch of 1 ([2, 1, 3]): the front door makes
    its recurrence kernel inside the body first, then the Loop is unrolled around it (one kernel per copy)."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.normal(0, 0.5, (1, 12, 3)).astype(np.float32), "W")
    r = numpy_helper.from_array(rng.normal(0, 0.5, (1, 12, 3)).astype(np.float32), "R")
    shape = numpy_helper.from_array(np.array([2, 1, 3], np.int64), "tn")
    back = numpy_helper.from_array(np.array([2, 3], np.int64), "back")
    body = _body(_passes([helper.make_node("Reshape", ["v", "tn"], ["seq"], name="seq"),
                          helper.make_node("LSTM", ["seq", "W", "R"], ["y"], hidden_size=3, name="lstm/0"),
                          helper.make_node("Reshape", ["y", "back"], ["v2"], name="back")]),
                 inits=[w, r, shape, back])
    _check(_model(body))
