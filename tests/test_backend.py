"""tvm_fusion.check.backend: the ONNX backend interface (prepare / run_model / run_node / supports_device)."""

import numpy as np
import onnx
import pytest

import tvm_fusion.check.backend as backend
from tvm_fusion.check.compare import random_inputs, run_onnxruntime
from tvm_fusion.testing import assert_close, residual_block


def test_prepare_and_run_matches_onnxruntime():
    model = residual_block(n=2)
    inputs = random_inputs(model, seed=3)
    rep = backend.prepare(model, "CPU")
    got = rep.run([inputs["x"]])
    ref = run_onnxruntime(model, inputs)[0].run(None, inputs)
    assert_close(got[0], ref[0])
    unfused = backend.prepare(model, "CPU", mode="unfused").run({"x": inputs["x"]})
    assert_close(got[0], unfused[0])


def test_run_node():
    node = onnx.helper.make_node("LeakyRelu", ["a"], ["b"], alpha=0.5)
    (out,) = backend.run_node(node, [np.array([-2.0, 3.0], np.float32)])
    np.testing.assert_array_equal(out, [-1.0, 3.0])


def test_symbolic_batch_builds_per_shape():
    from tvm_fusion.testing import GraphBuilder

    g = GraphBuilder()
    x = g.input("x", ["N", 4])
    rep = backend.prepare(g.model([g.op("Relu", [x])]), "CPU")
    for n in (1, 3):
        (out,) = rep.run([np.full((n, 4), -1.0, np.float32)])
        assert out.shape == (n, 4) and not out.any()


def test_devices():
    assert backend.supports_device("CPU")
    with pytest.raises(ValueError, match="device 'TPU' is not supported"):
        backend.prepare(residual_block(), "TPU")


def test_simplified_backend_goes_through_the_front_door():
    """Reshape to a shape computed from Shape/Gather/Concat: TVM's importer refuses it as written; the
    simplifier (SimplifiedBackend, or prepare(simplify=True)) folds it to a constant and the model runs."""
    from onnx import TensorProto, helper

    from tvm_fusion.errors import FusionError

    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i"], ["n"], axis=0),
             helper.make_node("Concat", ["n", "minus1"], ["new_shape"], axis=0),
             helper.make_node("Reshape", ["x", "new_shape"], ["y"])]
    inits = [onnx.numpy_helper.from_array(np.array([0], np.int64), "i"),
             onnx.numpy_helper.from_array(np.array([-1], np.int64), "minus1")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 12])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    with pytest.raises(FusionError, match="TVM's ONNX importer failed at node 'Reshape.*' \\(Reshape\\)"):
        backend.run_model(model, [x])
    assert backend.SimplifiedBackend.prepare(model).simplify
    for rep in (backend.SimplifiedBackend.prepare(model), backend.prepare(model, simplify=True)):
        np.testing.assert_array_equal(rep.run([x])[0], x.reshape(2, 12))
