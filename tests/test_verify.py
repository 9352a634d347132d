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
    assert "and from the unfused TVM build (relu4: " in err and "fusion changed the result" in err
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
    assert stats["rule"].startswith("float32: |a - r| <= ") and stats["scale"] == "rms(r)" and "noise" not in stats
    assert v["agrees_with_reference"] is True and "importer" not in v and "warning" not in v
    assert v["reference_noise"] == "not measured: every output within the tolerance without it"
    assert "verified: " in out and "warning" not in err


def test_cuda_groups_the_cpu_schedule_refuses_still_verify(monkeypatch):
    """The CUDA matches are lowered for the CPU as they are; a group the CPU schedule cannot take keeps its
    plain (unscheduled) compute instead of being dropped or re-matched."""
    import dataclasses

    from tvm_fusion.frontend import importer as frontend
    from tvm_fusion import registry
    from tvm_fusion._tvm import SCHEDULED_ATTR
    from tvm_fusion.build.builder import build
    from tvm_fusion.check.verify import verify_fused

    proto = residual_block()
    built = build(frontend.import_onnx(proto), "cuda", "fused")
    for key, sched in list(registry._SCHEDULES.items()):
        if key[1] == "llvm":
            monkeypatch.setitem(registry._SCHEDULES, key,
                                dataclasses.replace(sched, supports=lambda *a: "refused by the test"))
    result = verify_fused(proto, built)
    assert result.verified and all(s.ok for s in result.outputs.values())
    from tvm_fusion.build.builder import resolve_target
    from tvm_fusion.fusion.fuse import lower

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


@pytest.fixture
def saturated_sigmoid(tmp_path):
    """conv -> add(-16) -> sigmoid: outputs ~1e-7, where onnxruntime's Sigmoid (1.4e-7 off the exact value
    anywhere in [0, 1]) and TVM's exact one differ by more than the output's scale allows, fused or not."""
    import numpy as np

    from tvm_fusion.testing import GraphBuilder

    g = GraphBuilder(0)
    x = g.input("x", [1, 4, 8, 8])
    shifted = g.op("Add", [g.conv(x, 4, 4), g.const(np.full((1, 4, 1, 1), -16.0, np.float32))])
    path = tmp_path / "sigmoid.onnx"
    onnx.save(g.model([g.op("Sigmoid", [shifted])]), str(path))
    return path


def test_a_difference_the_unfused_build_shares_is_written_with_a_warning(capsys, tmp_path, saturated_sigmoid,
                                                                          monkeypatch):
    """Fused matches unfused, both differ from onnxruntime: TVM's, not fusion's. Written, with a warning line
    and the three comparisons in the manifest; the culprit search does not run."""
    from tvm_fusion.check import differential

    def no_search(*a, **kw):
        raise AssertionError("the culprit search ran although fused matches unfused")

    monkeypatch.setattr(differential, "bisect", no_search)
    lib = tmp_path / "m.so"
    rc, out, err = _run(capsys, "compile", str(saturated_sigmoid), "--target", "llvm", "--no-counts", "-o", str(lib))
    assert rc == 0, err
    (warning,) = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert warning.startswith("warning: the fused build differs from onnxruntime on output(s) sigmoid")
    assert ("the unfused TVM build (no fusion rule involved) gives the same values within tolerance and differs from "
            "onnxruntime too (sigmoid") in warning
    assert "TVM's importer and onnxruntime disagree there, not fusion; the library is written (--strict refuses it)" in warning
    assert "verified against the unfused build: onnxruntime differs from both on sigmoid" in out
    v = json.loads(lib.with_name("m.so.json").read_text())["verification"]
    assert v["verified"] is True and v["agrees_with_reference"] is False and "warning: " + v["warning"] == warning
    assert v["reference_noise"].startswith("onnxruntime's graph optimized vs as written, per element")
    (name, record), = v["importer"].items()
    assert record["fused_vs_unfused"]["ok"] is True and record["fused_vs_unfused"]["elements_off"] == 0
    assert record["unfused_vs_onnxruntime"]["ok"] is False and record["fused_vs_onnxruntime"] == v["outputs"][name]
    assert v["outputs"][name]["ok"] is False and set(v["outputs"][name]["noise"]) == {"max", "elements", "needed_by"}


def test_strict_refuses_a_difference_the_unfused_build_shares(capsys, tmp_path, saturated_sigmoid):
    lib = tmp_path / "out" / "m.so"
    rc, out, err = _run(capsys, "compile", str(saturated_sigmoid), "--target", "llvm", "--strict", "-o", str(lib))
    assert rc == 1
    assert "error: verify: the fused build differs from onnxruntime on output(s) sigmoid" in err
    assert "gives the same values within tolerance" in err and "--strict: no library written" in err
    assert list(lib.parent.iterdir()) == []


def test_culprit_search_bound(capsys, tmp_path, conv_relu):
    """--search-timeout 0: no search, the command to run it; a bound it passes: what it found by then."""
    lib = tmp_path / "m.so"
    common = ["compile", str(conv_relu), "--target", "llvm", "--rules", str(WRONG_RULES), "-o", str(lib)]
    rc, _, err = _run(capsys, *common, "--search-timeout", "0")
    assert rc == 1 and "fusion changed the result; no library written. The culprit search is off" in err
    assert "`tvm-fusion compare --bisect`" in err
    rc, _, err = _run(capsys, *common, "--search-timeout", "0.001")
    assert rc == 1 and "the culprit search stopped after 0.001 s (the per-group check did not finish)" in err
    assert not lib.exists()


@pytest.mark.parametrize("flags, message", [
    (["--search-timeout", "-1"], "--search-timeout -1: use 0 (no search) or more seconds"),
    (["--strict", "--no-verify"], "--strict and --no-verify"),
])
def test_verify_flags_refused(capsys, tmp_path, conv_relu, flags, message):
    rc, _, err = _run(capsys, "compile", str(conv_relu), "--target", "llvm", *flags, "-o", str(tmp_path / "m.so"))
    assert rc == 2 and message in err


def test_a_qdq_build_within_onnxruntime_s_own_noise_is_written(capsys, tmp_path):
    """onnxruntime's optimized (int8 QLinearConv) and as-written (float) runs of a QDQ conv are one output step
    (0.05) apart at a few elements; the fused build lands one step off the as-written run at one of them. It
    is verified (it was refused: 1 element off), and the manifest says the noise was needed."""
    from tvm_fusion.testing import qdq_conv

    model, lib = tmp_path / "qdq.onnx", tmp_path / "qdq.so"
    onnx.save(qdq_conv(), str(model))
    rc, out, err = _run(capsys, "compile", str(model), "--target", "llvm", "--no-counts", "-o", str(lib))
    assert rc == 0, err
    v = json.loads(lib.with_name("qdq.so.json").read_text())["verification"]
    assert v["agrees_with_reference"] is True and "warning" not in err and "verified: " in out
    (stats,) = v["outputs"].values()
    assert stats["ok"] and stats["elements_off"] == 0
    assert "noise" in stats, "the fused build matches onnxruntime as written exactly: pick a seed that flips one step"
    assert stats["noise"]["needed_by"] >= 1 and stats["noise"]["max"] == pytest.approx(0.05, rel=1e-3)
    assert stats["max_abs"] == pytest.approx(0.05, rel=1e-3)  # one int8 step: over the table's 7e-4 alone


class _Onnxruntime:
    """A stand-in for reference.Reference: its outputs and its noise (none)."""

    def __init__(self, values):
        self.values, self.names = values, ["y"]

    def noise(self):
        return [None] * len(self.values)


class _Plain:
    def __init__(self, values):
        self.values = values

    def run(self, tensors):
        return self.values


def _against(fused, unfused, ort, strict=False):
    """verify._against_unfused on arrays: fused (over tolerance against ort) judged against unfused."""
    import numpy as np

    from tvm_fusion.check.numerics import error_stats
    from tvm_fusion.check.verify import _against_unfused, _Run

    run = _Run([np.asarray(fused)], _Onnxruntime([np.asarray(ort)]), ["float32"], "", {}, [])
    stats = {"y": error_stats(fused, ort)}
    assert not stats["y"].ok
    return _against_unfused(run, _Plain([np.asarray(unfused)]), ["y"], stats, None, None, None, 0, None, strict, 0, True)


def test_what_the_unfused_build_decides():
    """Over tolerance against onnxruntime: fusion's (fused differs from unfused: refused, here without the
    search), TVM's (unfused differs as much: written), or two differences each within tolerance that add up."""
    import numpy as np

    from tvm_fusion.errors import ToleranceExceeded

    ort = np.linspace(1, 2, 100).astype(np.float32)  # the bound: 3e-4 * rms + 1e-4 * |r|, about 6e-4 to 8e-4
    with pytest.raises(ToleranceExceeded, match=r"and from the unfused TVM build \(y: 100 of 100 elements off\): "
                                                r"fusion changed the result; no library written. The culprit search "
                                                r"is off \(--search-timeout 0\)"):
        _against(ort * np.float32(1.01), ort, ort)
    record, warning = _against(ort * np.float32(1.01), ort * np.float32(1.01), ort)
    assert "gives the same values within tolerance and differs from onnxruntime too (y: 100 of 100 elements off): " \
           "TVM's importer and onnxruntime disagree there, not fusion; the library is written" in warning
    assert record["y"]["fused_vs_unfused"]["ok"] and not record["y"]["unfused_vs_onnxruntime"]["ok"]
    record, warning = _against(ort * np.float32(1 + 6e-4), ort * np.float32(1 + 3e-4), ort)
    assert "which is itself within tolerance of onnxruntime: the two differences, each within tolerance, add up" in warning
    assert record["y"]["fused_vs_unfused"]["ok"] and record["y"]["unfused_vs_onnxruntime"]["ok"]
    with pytest.raises(ToleranceExceeded, match="add up over it; --strict: no library written"):
        _against(ort * np.float32(1 + 6e-4), ort * np.float32(1 + 3e-4), ort, strict=True)
