"""compile verifies before it writes: a fused build that differs from the model is never written, and the
manifest says whether and how the library was verified."""

import json
from pathlib import Path

import onnx
import pytest

from tvm_fusion.cli import main
from tvm_fusion.testing import conv_bn_relu, residual_block

WRONG_RULES = Path(__file__).with_name("wrong_rules.py")


def _run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def conv_relu(tmp_path):
    path = tmp_path / "conv_relu.onnx"
    onnx.save(conv_bn_relu(bn=False, bias=False), str(path))
    return path


@pytest.mark.parametrize("target", ["llvm", "cuda"])
def test_wrong_rule_is_refused_and_nothing_written(capsys, tmp_path, conv_relu, target):
    lib = tmp_path / "out" / "m.so"
    rc, out, err = _run(capsys, "compile", str(conv_relu), "--target", target, "--rules", str(WRONG_RULES),
                        "-o", str(lib))
    assert rc == 1, err
    assert "the fused build differs from onnxruntime on output(s)" in err and "no library written" in err
    assert "group 0 (rule conv2d_relu_wrong; ONNX nodes Conv3, Relu5) is the first over tolerance" in err
    assert "--disable conv2d_relu_wrong avoids it" in err
    assert not lib.exists() and not lib.with_name("m.so.json").exists()
    assert list(lib.parent.iterdir()) == []  # no partial library left behind


def test_wrong_rule_written_with_no_verify(capsys, tmp_path, conv_relu):
    lib = tmp_path / "m.so"
    rc, out, _ = _run(capsys, "compile", str(conv_relu), "--target", "llvm", "--rules", str(WRONG_RULES),
                      "--no-verify", "--no-counts", "-o", str(lib))
    assert rc == 0 and lib.exists()
    manifest = json.loads(lib.with_name("m.so.json").read_text())
    assert manifest["verification"] == {"verified": False, "reason": "skipped with --no-verify"}
    assert "not verified (skipped with --no-verify)" in out


@pytest.mark.parametrize("target", ["llvm", "cuda"])
def test_manifest_records_the_verification(capsys, tmp_path, target):
    model = tmp_path / "m.onnx"
    onnx.save(residual_block(), str(model))
    lib = tmp_path / "m.so"
    rc, out, err = _run(capsys, "compile", str(model), "--target", target, "--no-counts", "--seed", "3",
                        "-o", str(lib))
    assert rc == 0, err
    v = json.loads(lib.with_name("m.so.json").read_text())["verification"]
    assert v["verified"] is True and v["reference"] == "onnxruntime" and v["seed"] == 3
    assert json.loads(v["target"])["kind"] == "llvm"  # CUDA builds are verified by the same graph on the CPU
    assert ("built for the host CPU" in v["method"]) == (target == "cuda")
    (name, stats), = v["outputs"].items()
    assert stats["ok"] and stats["elements_off"] == 0 and stats["elements"] == 1 * 8 * 10 * 10
    assert stats["rule"].startswith("float32: |a - r| <= ")
    assert "verified: " in out


def test_cuda_groups_the_cpu_schedule_refuses_still_verify(monkeypatch):
    """The CUDA matches are lowered for the CPU as they are; a group the CPU schedule cannot take keeps its
    plain (unscheduled) compute instead of being dropped or re-matched."""
    import dataclasses

    from tvm_fusion import frontend, registry
    from tvm_fusion._tvm import SCHEDULED_ATTR
    from tvm_fusion.build import build
    from tvm_fusion.verify import verify_fused

    proto = residual_block()
    built = build(frontend.import_onnx(proto), "cuda", "fused")
    for key, sched in list(registry._SCHEDULES.items()):
        if key[1] == "llvm":
            monkeypatch.setitem(registry._SCHEDULES, key,
                                dataclasses.replace(sched, supports=lambda *a: "refused by the test"))
    result = verify_fused(proto, built)
    assert result.verified and all(s.ok for s in result.outputs.values())
    from tvm_fusion.build import resolve_target
    from tvm_fusion.fuse import lower

    graph, groups = lower(built.fused.matched, resolve_target("llvm"), any_target=True)
    assert [g.rule for g in groups] == ["conv2d_bn_relu", "conv2d_bn_add_relu"]
    prims = [f for f in graph.functions.values() if hasattr(f, "buffer_map") or type(f).__name__ == "PrimFunc"]
    assert prims and not any((f.attrs or {}).get(SCHEDULED_ATTR) for f in prims)


def test_verify_runs_on_the_inputs_given(capsys, tmp_path):
    """--inputs: the verify step runs on the user's values (token ids, masks), and the manifest says so;
    arrays that do not fit the model are bad input before any build."""
    import numpy as np

    model = tmp_path / "m.onnx"
    onnx.save(residual_block(), str(model))
    x = np.random.default_rng(5).standard_normal((1, 8, 10, 10)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    lib = tmp_path / "m.so"
    rc, _, err = _run(capsys, "compile", str(model), "--target", "llvm", "--no-counts", "--inputs",
                      str(tmp_path / "in.npz"), "-o", str(lib))
    assert rc == 0, err
    v = json.loads(lib.with_name("m.so.json").read_text())["verification"]
    assert v["verified"] is True and v["inputs_given"] == ["x"]
    np.savez(tmp_path / "bad.npz", y=x)
    rc, _, err = _run(capsys, "compile", str(model), "--target", "llvm", "--inputs", str(tmp_path / "bad.npz"),
                      "-o", str(tmp_path / "n.so"))
    assert rc == 2 and "--inputs has an array 'y', but the model's inputs are ['x']" in err
