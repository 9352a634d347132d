"""Exit status of `tvm-fusion`: 0 ok, 1 tolerance exceeded, 2 bad input, 3 internal error (one line; the
traceback only with --debug). Through `cli.main` and once through the installed console script."""

import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_fusion.cli import main
from tvm_fusion.testing import conv_bn_relu

WRONG_RULES = Path(__file__).parent / "wrong_rules.py"  # conv -> relu with weights scaled by 1.01
CONSOLE = Path(sys.executable).parent / "tvm-fusion"


@pytest.fixture()
def crashing_rules(tmp_path):
    """A valid rules file that also makes `explain` crash: an internal error, as a user would meet one."""
    path = tmp_path / "crash.py"
    path.write_text(WRONG_RULES.read_text() + textwrap.dedent("""
        import importlib


        def _boom(*args, **kwargs):
            raise KeyError("no entry for 'conv'\\nsecond line of the message")


        importlib.import_module("tvm_fusion.check.explain").explain = _boom
    """))
    return path


def test_exit_0(capsys):
    assert main(["rules"]) == 0


def test_exit_1_tolerance_exceeded(capsys, tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(bn=False, bias=False), str(path))
    assert main(["compare", str(path), "--rules", str(WRONG_RULES), "--repeat", "0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: fused build exceeds the tolerance: fused vs unfused, output ")
    assert "elements off (float32: |a - r| <= " in err and "; worst at [" in err


def test_exit_2_bad_input(capsys, model):
    assert main(["compare", str(model), "--seed", "-1"]) == 2
    assert main(["compare", "--no-such-flag"]) == 2  # argparse's own usage errors are bad input too


def test_exit_3_internal_error_is_one_line(capsys, model, monkeypatch):
    def boom(*args, **kwargs):
        raise ZeroDivisionError("division by zero\nmore detail")

    monkeypatch.setattr(importlib.import_module("tvm_fusion.check.explain"), "explain", boom)
    assert main(["explain", str(model)]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("error: internal error in explain (tvm_fusion/cli.py:")
    assert err.rstrip().endswith("ZeroDivisionError: division by zero (run with --debug for the traceback)")


RAISING_RULE = textwrap.dedent("""
    from tvm_fusion import rule
    from tvm_fusion.patterns.conv_epilogue import conv_epilogue


    def _boom(match):
        raise KeyError("conv")


    @rule("conv2d_bn_relu_raising", priority=10_000, check=_boom)
    def conv2d_bn_relu_raising():
        \"\"\"conv2d -> batch_norm -> relu  ==>  nothing: its check raises\"\"\"
        return conv_epilogue(bn=True, activation="relu")
""")


def test_a_rule_that_raises_is_bad_input_from_a_users_file_and_internal_when_built_in(capsys, model, tmp_path,
                                                                                      monkeypatch):
    """A user's rule file that raises is the user's to fix (exit 2, naming the file); a built-in rule that raises
    is our bug (exit 3), never reported as bad input of a valid model."""
    user = tmp_path / "raising.py"
    user.write_text(RAISING_RULE)
    assert main(["compile", str(model), "--rules", str(user), "-o", str(tmp_path / "m.so")]) == 2
    assert capsys.readouterr().err == (f"error: {user}: rule 'conv2d_bn_relu_raising' raised KeyError: 'conv'\n")
    from tvm_fusion.patterns import builtin_rules

    def boom(match):
        raise TypeError("object of type 'NoneType' has no len()")

    monkeypatch.setattr(builtin_rules()["conv2d_bn_relu"], "check", boom)
    assert main(["compile", str(model), "-o", str(tmp_path / "m.so")]) == 3
    err = capsys.readouterr().err
    assert err.startswith("error: internal error in compile (") and err.count("\n") == 1, err
    assert ("patterns/conv_epilogue.py: rule 'conv2d_bn_relu' raised TypeError: object of type 'NoneType' has no "
            "len() (run with --debug for the traceback)") in err
    assert not (tmp_path / "m.so").exists()


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_prints_the_traceback(capsys, model, monkeypatch, where):
    monkeypatch.setattr(importlib.import_module("tvm_fusion.check.explain"), "explain", lambda *a, **k: 1 / 0)
    argv = ["--debug", "explain", str(model)] if where == "before" else ["explain", str(model), "--debug"]
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "internal error in explain" in err


@pytest.mark.skipif(not CONSOLE.exists(), reason="the console script is installed in the virtualenv")
def test_console_script_exit_codes(model, crashing_rules):
    def run(*argv):
        return subprocess.run([str(CONSOLE), *argv], capture_output=True, text=True, timeout=300)

    bad = run("compare", str(model), "--shape", "x=1_0x8x12x12")
    assert bad.returncode == 2 and bad.stderr.startswith("error: bad shape") and bad.stderr.count("\n") == 1
    crash = run("explain", str(model), "--rules", str(crashing_rules))
    assert crash.returncode == 3 and crash.stderr.count("\n") == 1, crash.stderr
    assert "internal error in explain" in crash.stderr and "KeyError" in crash.stderr
    debug = run("--debug", "explain", str(model), "--rules", str(crashing_rules))
    assert debug.returncode == 3 and "Traceback (most recent call last)" in debug.stderr


@pytest.mark.skipif(not CONSOLE.exists(), reason="the console script is installed in the virtualenv")
def test_console_script_bad_graphs_are_one_line(tmp_path):
    """What reaches the terminal, file descriptors included: a cycle and a Conv TVM's importer refuses (it
    prints the converter's inputs and logs a BlockBuilder warning) are one line each, exit 2; a compile
    (export) and a load print nothing."""
    def model(name, nodes, x_shape, inits=()):
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / name))
        return str(tmp_path / name)

    cycle = model("cycle.onnx", [helper.make_node("Add", ["x", "b"], ["a"], name="add"),
                                 helper.make_node("Relu", ["a"], ["b"], name="relu"),
                                 helper.make_node("Relu", ["a"], ["y"], name="out")], [1, 4])
    conv = model("conv.onnx", [helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], [1, 4, 8, 8],
                 [numpy_helper.from_array(np.zeros((4, 4), np.float32), "w")])
    for path, says in ((cycle, "the graph has a cycle: node 'add' (Add) reads 'b' from node 'relu' (Relu)"),
                       (conv, "TVM's ONNX importer failed at node 'conv' (Conv): ValueError: in relax.nn.conv2d")):
        run = subprocess.run([str(CONSOLE), "explain", path, "--no-simplify"], capture_output=True, text=True,
                             timeout=300)
        assert run.returncode == 2 and run.stdout == "" and run.stderr.count("\n") == 1, run.stderr
        assert run.stderr.startswith(f"error: {path}: {says}"), run.stderr
    good = tmp_path / "good.onnx"
    onnx.save(conv_bn_relu(), str(good))
    built = subprocess.run([str(CONSOLE), "compile", str(good), "--target", "llvm", "-o", str(tmp_path / "m.so")],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0 and built.stderr == "", built.stderr
    loaded = subprocess.run([sys.executable, "-c", f"from tvm_fusion.runtime import load; load({str(tmp_path / 'm.so')!r})"],
                            capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0 and loaded.stderr == "" and loaded.stdout == "", loaded.stderr
