"""Bad input a hostile user tries: each is one line `error: ...` naming the flag or file, and exit status 2."""

import os
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from tvm_fusion.cli import main
from tvm_fusion.errors import FusionError
from tvm_fusion.frontend.importer import parse_shape
from tvm_fusion.testing import GraphBuilder, conv_bn_relu


def _bad(capsys, *argv) -> str:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert rc == 2, (rc, out, err)
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.fixture()
def symbolic(tmp_path):
    """x: [n, 8, h, w] -> conv(8 -> 256) -> relu."""
    g = GraphBuilder(0)
    x = g.input("x", ["n", 8, "h", "w"])
    path = tmp_path / "sym.onnx"
    onnx.save(g.model([g.op("Relu", [g.conv(x, 8, 256)])]), str(path))
    return path


@pytest.mark.parametrize("text", ["x=1_0x3x8x8", "x=1x", "x=x3", "x=1x-3", "x=1 x 3", "x=", "=1x3", "x=0x3",
                                  "x=1x\u0663", "1x3", "x=1.5x3"])
def test_malformed_shapes(text):
    with pytest.raises(FusionError, match="bad shape"):
        parse_shape(text)


def test_shape_with_digit_groups_is_refused(capsys, symbolic):
    assert "bad shape 'x=1_0x8x8x8'" in _bad(capsys, "explain", str(symbolic), "--shape", "x=1_0x8x8x8")


def test_shape_beyond_int32_indexing(capsys, symbolic):
    err = _bad(capsys, "compare", str(symbolic), "--shape", "x=1x8x100000x100000")
    assert "80000000000 elements, more than TVM's int32 indexing allows (2147483647)" in err


def test_intermediate_beyond_int32_indexing(capsys, symbolic):
    """The input fits (134M elements), the conv output does not (4.3G)."""
    err = _bad(capsys, "explain", str(symbolic), "--shape", "x=1x8x4096x4096")
    assert "1x256x4096x4096 = 4294967296 elements" in err


def test_compare_refuses_what_does_not_fit_in_memory(capsys, model, monkeypatch):
    import importlib

    monkeypatch.setattr(importlib.import_module("tvm_fusion.check.io"), "available_memory", lambda: 1000)
    err = _bad(capsys, "compare", str(model))
    assert "running the model needs at least" in err and "GiB is available" in err


@pytest.mark.parametrize("kind", ["directory", "text"])
def test_rules_not_a_python_file(capsys, tmp_path, kind):
    path = tmp_path / ("rules_dir" if kind == "directory" else "rules.txt")
    path.mkdir() if kind == "directory" else path.write_text("x = 1\n")
    err = _bad(capsys, "rules", "--rules", str(path))
    assert ("a directory whose modules define no rules" if kind == "directory" else "not a Python file") in err


def test_output_onto_a_directory(capsys, model, tmp_path):
    err = _bad(capsys, "compile", str(model), "--target", "llvm", "-o", str(tmp_path))
    assert f"-o {str(tmp_path)!r}: is a directory" in err


def test_output_empty(capsys, model):
    assert "is a directory" in _bad(capsys, "compile", str(model), "--target", "llvm", "-o", "")


def test_shape_given_twice_differently(capsys, model):
    err = _bad(capsys, "explain", str(model), "--shape", "x=1x8x12x12", "--shape", "x=2x8x12x12")
    assert "--shape x is given twice, as 1x8x12x12 and 2x8x12x12" in err


def test_output_onto_the_model_itself(capsys, model):
    before = model.read_bytes()
    err = _bad(capsys, "compile", str(model), "--target", "llvm", "-o", str(model))
    assert "would overwrite the input model" in err and model.read_bytes() == before


def test_manifest_path_is_a_directory(capsys, model, tmp_path):
    (tmp_path / "m.so.json").mkdir()
    err = _bad(capsys, "compile", str(model), "--target", "llvm", "-o", str(tmp_path / "m.so"))
    assert "the manifest path" in err and "is a directory" in err


def test_output_into_a_read_only_directory(capsys, model, tmp_path):
    """As root chmod does not stop writes: /sys refuses even root; otherwise a chmod 0o500 directory."""
    if os.geteuid() == 0:
        target = "/sys/model.so"
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        target = str(ro / "model.so")
    err = _bad(capsys, "compile", str(model), "--target", "llvm", "-o", target)
    assert "cannot write into" in err and "choose a writable directory" in err


@pytest.mark.parametrize("arch", ["garbage", "", "sm_", "90"])
def test_arch_malformed(capsys, model, tmp_path, arch):
    err = _bad(capsys, "compile", str(model), "--arch", arch, "-o", str(tmp_path / "m.so"))
    assert f"--arch {arch!r}: expected a CUDA architecture such as sm_80" in err


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc to know the architectures")
def test_arch_unknown_to_nvcc(capsys, model, tmp_path):
    err = _bad(capsys, "compile", str(model), "--arch", "sm_999", "-o", str(tmp_path / "m.so"))
    assert "--arch sm_999: not an architecture that the nvcc on PATH knows" in err and "sm_90" in err


def test_nvcc_failure_is_one_line():
    from tvm_fusion.build.cuda_compiler import _first_error

    source = "extern \"C\" __global__ void k() {\n  int error_count = 0;\n}\n" * 200
    err = RuntimeError(source + "\n\nCompilation error:\nnvcc fatal   : Unsupported gpu architecture 'sm_999'\n")
    assert _first_error(err) == "nvcc fatal   : Unsupported gpu architecture 'sm_999'"


def test_negative_seed(capsys, model):
    assert "--seed -1: the seed must be >= 0" in _bad(capsys, "compare", str(model), "--seed", "-1")


@pytest.mark.parametrize("repeat", ["-1", "-5"])
def test_negative_repeat(capsys, model, repeat):
    assert f"--repeat {repeat}" in _bad(capsys, "compare", str(model), "--repeat", repeat)


def test_only_and_disable_the_same_rule(capsys, model):
    err = _bad(capsys, "explain", str(model), "--only", "conv2d_bn_relu", "--disable", "conv2d_bn_relu")
    assert "rule conv2d_bn_relu is both in --only and --disable" in err


def test_explain_coverage_is_never_negative(capsys, model):
    """BatchNorm is normalised to multiply + add before matching: count the ops after that."""
    assert main(["explain", str(model), "--only", "conv2d_relu"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("ops covered"))
    assert not line.split(":")[1].strip().startswith("-"), line


@pytest.mark.parametrize("modes,why", [("", "--modes is empty"), (",", "--modes is empty"),
                                       ("fused,foo", "unknown build mode 'foo'"), ("fused,fused", "names a mode twice")])
def test_bad_modes(capsys, model, modes, why):
    assert why in _bad(capsys, "compare", str(model), "--modes", modes)


def test_unknown_example(capsys):
    rc = main(["compare", "--example", "nope"])
    assert rc == 2 and "invalid choice: 'nope'" in capsys.readouterr().err


def test_empty_model_file(capsys, tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    assert "not an ONNX model" in _bad(capsys, "compare", str(path))


def test_model_without_outputs(capsys, tmp_path):
    proto = conv_bn_relu()
    del proto.graph.output[:]
    path = tmp_path / "noout.onnx"
    onnx.save(proto, str(path))
    for command in (["compare"], ["explain"], ["compile", "--target", "llvm", "-o", str(tmp_path / "x.so")]):
        assert "the graph has no outputs" in _bad(capsys, command[0], str(path), *command[1:])


# ---------------------------------------------------------------- --inputs
def _npz(tmp_path, **arrays):
    path = tmp_path / "inputs.npz"
    np.savez(path, **arrays)
    return str(path)


def test_inputs_unknown_name(capsys, model, tmp_path):
    err = _bad(capsys, "compare", str(model), "--inputs", _npz(tmp_path, y=np.zeros(3, np.float32)))
    assert "--inputs has an array 'y', but the model's inputs are ['x']" in err


def test_inputs_wrong_dtype(capsys, model, tmp_path):
    err = _bad(capsys, "compare", str(model), "--inputs", _npz(tmp_path, x=np.zeros((1, 8, 12, 12), np.float64)))
    assert "--inputs 'x': dtype float64, the model expects float32" in err


def test_inputs_wrong_shape(capsys, model, tmp_path):
    err = _bad(capsys, "compare", str(model), "--inputs", _npz(tmp_path, x=np.zeros((1, 8, 12, 13), np.float32)))
    assert "--inputs 'x': shape 1x8x12x13, the model expects 1x8x12x12" in err


def test_inputs_conflicting_with_shape(capsys, symbolic, tmp_path):
    err = _bad(capsys, "compare", str(symbolic), "--shape", "x=1x8x6x6",
               "--inputs", _npz(tmp_path, x=np.zeros((1, 8, 5, 5), np.float32)))
    assert "--inputs 'x': shape 1x8x5x5, the model expects 1x8x6x6" in err


def test_inputs_not_an_npz(capsys, model, tmp_path):
    path = tmp_path / "x.npz"
    path.write_text("hello")
    assert "not a readable .npz file" in _bad(capsys, "compare", str(model), "--inputs", str(path))
    assert "no such file" in _bad(capsys, "compare", str(model), "--inputs", str(tmp_path / "missing.npz"))


def test_inputs_int_dtype_named(capsys, tmp_path):
    g = GraphBuilder(0)
    ids = g.input("ids", [1, 4], TensorProto.INT64)
    path = tmp_path / "ids.onnx"
    onnx.save(g.model([g.op("Add", [ids, g.const(np.array([1], np.int64))])], dtype=TensorProto.INT64), str(path))
    err = _bad(capsys, "compare", str(path), "--inputs", _npz(tmp_path, ids=np.zeros((1, 4), np.int32)))
    assert "dtype int32, the model expects int64; save it with .astype(numpy.int64)" in err


def test_per_group_refuses_what_does_not_fit_in_memory(capsys, model, monkeypatch):
    import importlib

    monkeypatch.setattr(importlib.import_module("tvm_fusion.check.io"), "available_memory", lambda: 1000)
    assert "running the model needs at least" in _bad(capsys, "compare", str(model), "--per-group")


# ---------------------------------------------------------------- malformed graphs
def _vi(name, shape=(1, 4)):
    return onnx.helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _graph(tmp_path, nodes, opset=17, inputs=None, inits=()) -> str:
    """A model of `nodes` from x: 1x4 (or `inputs`) to y: 1x4."""
    h = onnx.helper
    g = h.make_graph(nodes, "g", inputs or [_vi("x")], [_vi("y")], initializer=list(inits))
    path = tmp_path / "bad.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", opset)]), str(path))
    return str(path)


def _branch(reads: str, out: str):
    h = onnx.helper
    return h.make_graph([h.make_node("Relu", [reads], [out], name=f"in_{out}")], f"b_{out}", [], [_vi(out)])


def _if(reads: str, out: str = "y", name: str = "if"):
    """An If (condition: the initializer c) whose then branch reads `reads`, its else branch x."""
    return onnx.helper.make_node("If", ["c"], [out], name=name, then_branch=_branch(reads, "t"),
                                 else_branch=_branch("x", "e"))


_COND = onnx.helper.make_tensor("c", TensorProto.BOOL, [], [True])
_COMMANDS = (["explain"], ["compare", "--repeat", "0"], ["profile"], ["compare", "--per-group"],
             ["compile", "--target", "llvm", "-o", "{tmp}/m.so"])


def _bad_everywhere(capsys, tmp_path, path) -> set[str]:
    """The one error line of every command that loads the model (identical for all of them)."""
    errs = set()
    for command in _COMMANDS:
        errs.add(_bad(capsys, command[0], path, *[a.format(tmp=tmp_path) for a in command[1:]]))
    return errs


def test_opset_from_the_future(capsys, tmp_path):
    path = _graph(tmp_path, [onnx.helper.make_node("Relu", ["x"], ["y"], name="r")], opset=999)
    [err] = _bad_everywhere(capsys, tmp_path, path)
    newest = onnx.defs.onnx_opset_version()
    assert err == (f"error: {path}: the model imports ONNX opset 999, but the newest opset released (onnx "
                   f"{onnx.__version__}) is {newest}; export it with opset {newest} or older\n")


def test_tensor_written_twice(capsys, tmp_path):
    h = onnx.helper
    path = _graph(tmp_path, [h.make_node("Relu", ["x"], ["a"], name="r1"), h.make_node("Sigmoid", ["x"], ["a"], name="r2"),
                             h.make_node("Relu", ["a"], ["y"], name="r3")])
    [err] = _bad_everywhere(capsys, tmp_path, path)
    assert err == (f"error: {path}: tensor 'a' is written twice, by node 'r1' (Relu) and by node 'r2' (Sigmoid); "
                   "give each output its own name\n")


def test_tensor_written_over_a_graph_input(capsys, tmp_path):
    h = onnx.helper
    path = _graph(tmp_path, [h.make_node("Relu", ["x"], ["x"], name="r1"), h.make_node("Relu", ["x"], ["y"])])
    assert "tensor 'x' is written twice, as a graph input or initializer and by node 'r1' (Relu)" in _bad(
        capsys, "explain", path)


def test_cycle(capsys, tmp_path):
    h = onnx.helper
    path = _graph(tmp_path, [h.make_node("Add", ["x", "b2"], ["b1"], name="add1"),
                             h.make_node("Relu", ["b1"], ["b2"], name="relu2"),
                             h.make_node("Relu", ["b1"], ["y"], name="r3")])
    [err] = _bad_everywhere(capsys, tmp_path, path)
    assert err == (f"error: {path}: the graph has a cycle: node 'add1' (Add) reads 'b2' from node 'relu2' (Relu), "
                   "which reads 'b1' from node 'add1' (Add); an ONNX graph must be acyclic\n")


def test_cycle_through_a_branch(capsys, tmp_path):
    """The If's then branch reads the outer `b`, which is computed from the If's own output."""
    h = onnx.helper
    path = _graph(tmp_path, [_if("b", "yi"), h.make_node("Relu", ["yi"], ["b"], name="rb"),
                             h.make_node("Relu", ["b"], ["y"], name="ry")], inits=[_COND])
    assert ("the graph has a cycle: node 'if' (If) reads 'b' from node 'rb' (Relu), which reads 'yi' from "
            "node 'if' (If)") in _bad(capsys, "explain", path)


def test_undefined_tensor(capsys, tmp_path):
    path = _graph(tmp_path, [onnx.helper.make_node("Add", ["x", "b2"], ["y"], name="add1")])
    [err] = _bad_everywhere(capsys, tmp_path, path)
    assert err == (f"error: {path}: node 'add1' (Add) reads tensor 'b2', which no node, graph input or "
                   "initializer defines; fix the exporter or add the missing node\n")


def test_undefined_tensor_in_a_branch(capsys, tmp_path):
    path = _graph(tmp_path, [onnx.helper.make_node("Relu", ["x"], ["a"], name="r0"), _if("zz")], inits=[_COND])
    assert "node 'in_t' (Relu) reads tensor 'zz', which no node" in _bad(capsys, "explain", path)


def test_branch_reading_an_outer_tensor_is_well_formed(capsys, tmp_path):
    h = onnx.helper
    path = _graph(tmp_path, [h.make_node("Relu", ["x"], ["a"], name="r0"), _if("a")], inits=[_COND])
    assert main(["explain", path]) == 0, capsys.readouterr().err


def test_nodes_out_of_order_are_not_a_cycle(capsys, tmp_path):
    """onnxruntime runs them; the frontend puts them in order for TVM's importer, with or without the
    simplifier (which sorts them too)."""
    h = onnx.helper
    path = _graph(tmp_path, [h.make_node("Relu", ["a"], ["y"], name="r2"), h.make_node("Relu", ["x"], ["a"], name="r1")])
    assert main(["explain", path]) == 0, capsys.readouterr().err
    assert main(["compare", path, "--no-simplify", "--repeat", "0"]) == 0, capsys.readouterr().err


def test_in_topological_order_keeps_sorted_graphs_and_sorts_bodies():
    from tvm_fusion.frontend.importer import in_topological_order

    h = onnx.helper
    sorted_model = h.make_model(h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g", [_vi("x")], [_vi("y")]))
    assert in_topological_order(sorted_model) is sorted_model
    body = h.make_graph([h.make_node("Relu", ["u"], ["t"], name="second"), h.make_node("Relu", ["x"], ["u"], name="first")],
                        "body", [], [_vi("t")])
    branch = h.make_node("If", ["c"], ["y"], name="if", then_branch=body, else_branch=_branch("x", "e"))
    model = h.make_model(h.make_graph([h.make_node("Relu", ["x"], ["x2"], name="r"), branch], "g", [_vi("x")],
                                      [_vi("y")], initializer=[_COND]))
    ordered = in_topological_order(model)
    assert [n.name for n in ordered.graph.node] == ["r", "if"]
    then = {a.name: a.g for a in ordered.graph.node[1].attribute}["then_branch"]
    assert [n.name for n in then.node] == ["first", "second"]
    given = {a.name: a.g for a in model.graph.node[1].attribute}["then_branch"]
    assert [n.name for n in given.node] == ["second", "first"]  # the model given is not changed


def test_input_dim_fixed_to_zero(capsys, tmp_path):
    path = _graph(tmp_path, [onnx.helper.make_node("Relu", ["x"], ["y"], name="r")], inputs=[_vi("x", (0, 4))])
    err = _bad(capsys, "explain", path)
    assert f"{path}: input 'x' declares dim 0 of its shape 0x4 as 0 (an empty tensor" in err and "symbolic" not in err


def test_model_onnxruntime_refuses(capsys, tmp_path):
    """TVM's importer ignores the unknown attribute; onnxruntime, the reference, refuses the model: every
    command that runs it says so in one line naming the model and onnxruntime's reason."""
    path = _graph(tmp_path, [onnx.helper.make_node("Relu", ["x"], ["y"], name="r", alpha=1.0)])
    inputs = _npz(tmp_path, x=np.zeros((1, 4), np.float32))
    reason = ("This is an invalid model. In Node, (\"r\", Relu, \"\", -1) : (\"x\": tensor(float),) -> (\"y\": "
              "tensor(float),) , Error Unrecognized attribute: alpha for operator Relu; check it with "
              "onnx.checker.check_model(model, full_check=True)\n")
    for command in (["compare", "--repeat", "0"], ["compare", "--repeat", "0", "--inputs", inputs],
                    ["compile", "--target", "llvm", "-o", str(tmp_path / "m.so")],
                    ["compile", "--target", "llvm", "--precision", "bf16", "-o", str(tmp_path / "m.so")]):
        assert _bad(capsys, command[0], path, *command[1:]) == (
            f"error: {path}: onnxruntime cannot load the model (its graph as written): {reason}")
    assert _bad(capsys, "compare", path, "--per-group", "--precision", "fp16") == (
        f"error: {path}: onnxruntime cannot load the model: {reason}")


def test_onnxruntime_reason_drops_code_path_and_function():
    from tvm_fusion.check.io import onnxruntime_reason

    err = RuntimeError("[ONNXRuntimeError] : 1 : FAIL : Load model from /tmp/m.onnx failed:/onnxruntime_src/onnxruntime/"
                       "core/graph/model_load_utils.h:46 void onnxruntime::model_load_utils::ValidateOpsetForDomain("
                       "const std::unordered_map<std::string, int>&, const onnxruntime::logging::Logger&, bool, "
                       "const std::string&, int) ONNX Runtime only *guarantees* support for models stamped with "
                       "official released onnx opset versions. Opset 99 is under development.\n")
    assert onnxruntime_reason(err) == ("ONNX Runtime only *guarantees* support for models stamped with official "
                                       "released onnx opset versions. Opset 99 is under development.")
