"""Nothing from TVM reaches the terminal: the VM's per-function warnings on export and load, and what TVM's
ONNX importer logs and prints around a failing converter, are dropped; any other line still comes through."""

import gc
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tvm_fusion.cli import main
from tvm_fusion.quiet import SCOPE_LINES, tvm_output
from tvm_fusion.runtime import load
from tvm_fusion.testing import conv_bn_relu


def test_noise_dropped_other_lines_kept_fd_restored(capfd):
    before = os.fstat(2).st_ino
    with tvm_output(drop=SCOPE_LINES):
        os.write(2, b"[13:27:23] /project/src/runtime/vm/executable.cc:276: Warning: Scope Saving:\n")
        os.write(2, b"a real error\n")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "a real error\nafter\n"
    assert os.fstat(2).st_ino == before


def test_compile_and_load_print_nothing(capfd, tmp_path):
    model, library = tmp_path / "m.onnx", tmp_path / "m.so"
    onnx.save(conv_bn_relu(), str(model))
    assert main(["compile", str(model), "--target", "llvm", "-o", str(library)]) == 0
    assert capfd.readouterr().err == ""
    loaded = load(library)
    [y] = loaded(np.zeros((1, 8, 12, 12), np.float32))
    assert y.shape == (1, 16, 12, 12)
    assert capfd.readouterr() == ("", "")


def test_importer_failure_is_one_line(capfd, tmp_path):
    """A Conv with a 2-d weight: TVM's importer prints the converter's inputs, raises, and its BlockBuilder
    logs a warning when destroyed; only our line reaches the terminal, with TVM's reason in it."""
    weight = numpy_helper.from_array(np.zeros((4, 4), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[weight])
    path = tmp_path / "conv.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert main(["explain", str(path), "--no-simplify"]) == 2
    gc.collect()  # the importer's BlockBuilder, were it still alive, would log now
    out, err = capfd.readouterr()
    assert out == ""
    assert err == (f"error: {path}: TVM's ONNX importer failed at node 'conv' (Conv): ValueError: in "
                   "relax.nn.conv2d: layout OIHW requires the input to be 4-dim tensor. However, the given input "
                   "has ndim 2 (simplifier not run: --no-simplify)\n")


def test_gathers_print_nothing(capfd, tmp_path):
    """TOPI's take logs `Fast mode segfaults ...` for every Gather it legalizes in the mode TVM's importer
    asks for (indices normalized into range first): on import (a constant Gather folded) and on every build;
    compile, explain and compare print only their own lines, and the gathered rows are right."""
    table = numpy_helper.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "table")
    rows = numpy_helper.from_array(np.array([1, -1], np.int64), "rows")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["picked"], axis=0),  # built: a graph input's ids
             helper.make_node("Gather", ["table", "rows"], ["fixed"], axis=0),  # folded on import: constants
             helper.make_node("Concat", ["picked", "fixed"], ["y"], axis=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 4])], initializer=[table, rows])
    model, library = tmp_path / "gather.onnx", tmp_path / "gather.so"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    assert main(["compile", str(model), "--target", "llvm", "-o", str(library)]) == 0
    assert capfd.readouterr().err == ""
    for command in (["explain", str(model)], ["compare", str(model), "--modes", "fused"]):
        assert main(command) == 0
        assert "Warning" not in capfd.readouterr().err
    [y] = load(library)(np.array([0, 9, -2], np.int64))
    np.testing.assert_array_equal(y, np.arange(40, dtype=np.float32).reshape(10, 4)[[0, 9, 8, 1, 9]])
