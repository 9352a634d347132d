"""The CLI as a user runs it: one clear line and a non-zero exit for bad input; compare fails loudly."""

import json
import subprocess
import sys
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from tvm_fusion.cli import main
from tvm_fusion.testing import conv_bn_relu, residual_block


def _run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_missing_file(capsys):
    rc, out, err = _run(capsys, "compile", "missing.onnx", "-o", "x.so")
    assert rc == 2 and err.strip() == "error: missing.onnx: no such file (expected an ONNX model, e.g. model.onnx)"


def test_not_onnx(capsys, tmp_path):
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"\x00\x01garbage")
    rc, _, err = _run(capsys, "compare", str(bad))
    assert rc == 2 and err.startswith(f"error: {bad}: not an ONNX model") and err.count("\n") == 1


def test_unsupported_op(capsys, tmp_path):
    node = helper.make_node("NotARealOp", ["x"], ["y"], name="weird_1")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    rc, _, err = _run(capsys, "compare", str(path))
    assert rc == 2
    assert "node 'weird_1' uses op 'NotARealOp', which TVM's ONNX importer does not support" in err


def test_unknown_rule_name(capsys, tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(), str(path))
    rc, _, err = _run(capsys, "compare", str(path), "--disable", "conv2d_bn_rlu")
    assert rc == 2 and "did you mean conv2d_bn_relu" in err


def test_compare_passes_and_prints_table(capsys, tmp_path):
    path = tmp_path / "block.onnx"
    onnx.save(residual_block(), str(path))
    rc, out, _ = _run(capsys, "compare", str(path), "--repeat", "2")
    assert rc == 0, out
    assert "rules fired: conv2d_bn_add_relu 1, conv2d_bn_relu 1 (total 2)" in out
    for word in ("unfused", "tvm", "fused", "onnxruntime", "fused vs unfused", "fused vs onnxruntime", "PASS"):
        assert word in out


WRONG_RULES = Path(__file__).parent / "wrong_rules.py"  # conv -> relu with weights scaled by 1.01


def test_compare_fails_loudly_when_fused_is_wrong(capsys, tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(bn=False, bias=False), str(model))
    rc, out, err = _run(capsys, "compare", str(model), "--rules", str(WRONG_RULES), "--repeat", "1")
    assert rc == 1
    assert "conv2d_relu_wrong 1" in out and "FAIL" in out
    assert err.startswith("error: fused build exceeds the tolerance")


def test_broken_rules_file_names_file(capsys, tmp_path):
    rules = tmp_path / "broken.py"
    rules.write_text("from tvm_fusion import rule\n@rule('x')\ndef x():\n    return 42\n")
    rc, _, err = _run(capsys, "rules", "--rules", str(rules))
    assert rc == 2 and str(rules) in err and "rule 'x' must return a Spec" in err


def test_compile_llvm_writes_library_and_manifest(capsys, tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(residual_block(), str(model))
    lib = tmp_path / "m.so"
    rc, out, _ = _run(capsys, "compile", str(model), "--target", "llvm", "-o", str(lib))
    assert rc == 0 and lib.exists()
    assert out.splitlines()[-1] == ("per-kernel time, memory traffic and what to fuse next: tvm-fusion profile "
                                    f"{model} --target llvm --html report.html")
    manifest = json.loads((tmp_path / "m.so.json").read_text())
    assert [g["rule"] for g in manifest["groups"]] == ["conv2d_bn_relu", "conv2d_bn_add_relu"]
    assert all(g["onnx_nodes"] for g in manifest["groups"])
    assert set(manifest["builds"]) == {"unfused", "tvm", "fused"}


def test_console_script_installed():
    out = subprocess.run([sys.executable, "-m", "tvm_fusion", "rules"], capture_output=True, text=True, check=True)
    table, convention = out.stdout.split("\n\n")  # the rules, then the priority convention under them
    rows = [line.split()[:2] for line in table.splitlines()]
    assert ["400", "conv2d_bn_add_relu"] in rows and ["300", "conv2d_bn_relu"] in rows
    priorities = [int(p) for p, _ in rows]
    assert priorities == sorted(priorities, reverse=True)
    assert len(set(priorities)) == len(priorities)  # no two built-in rules share a priority
    assert convention.startswith("priority = tier + rank within the tier") and "conv2d_bn_<act> 300" in convention


def test_compare_cuda_without_gpu_builds_and_says_why(capsys, tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(residual_block(), str(model))
    rc, out, _ = _run(capsys, "compare", str(model), "--target", "cuda")
    assert rc == 0
    assert "execution skipped: no CUDA device on this machine" in out
    assert "nvcc compiled the generated CUDA of: unfused" in out and "fused" in out
    assert "conv2d_bn_add_relu 1" in out


def test_explain_builds_for_the_given_arch(capsys, tmp_path, monkeypatch):
    """explain fuses for the target the flags give, --arch included (the CUDA schedules size by the arch)."""
    from tvm_fusion.check import explain as explain_module

    seen = []
    monkeypatch.setattr(explain_module, "explain", lambda model, target, **kw: seen.append(target) or "")
    path = str(tmp_path / "m.onnx")
    onnx.save(conv_bn_relu(), path)
    assert main(["explain", path, "--target", "cuda", "--arch", "sm_80"]) == 0, capsys.readouterr().err
    assert [str(t.attrs["arch"]) for t in seen] == ["sm_80"]


def test_no_simplify_reaches_every_command(capsys, tmp_path, monkeypatch):
    """--no-simplify is an argument of each command's import (no process-wide switch): recorded here on the
    import, which then stops the command (exit 2)."""
    from tvm_fusion.frontend import importer as frontend
    from tvm_fusion.errors import FusionError

    seen = []

    def recording(model, shapes=None, *, fold_constants=True, simplify=True):
        seen.append(simplify)
        raise FusionError("stop after the import")

    monkeypatch.setattr(frontend, "import_onnx", recording)
    path = str(tmp_path / "m.onnx")
    onnx.save(conv_bn_relu(), path)
    commands = [["explain"], ["compare", "--repeat", "0"], ["compare", "--per-group"], ["profile"],
                ["compile", "-o", str(tmp_path / "m.so"), "--target", "llvm"]]
    for command in commands:
        for flag, expected in (([], True), (["--no-simplify"], False)):
            seen.clear()
            assert main([command[0], path, *command[1:], *flag]) == 2, capsys.readouterr().err
            assert seen == [expected], (command, flag)
    assert main(["rules", "--no-simplify"]) == 2  # only the commands that import a model take it
    assert "unrecognized arguments: --no-simplify" in capsys.readouterr().err
