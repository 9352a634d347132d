"""benchmarks/gpu_check.py runs its CPU-only parts here (so it cannot rot) and says plainly what it skipped."""

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from tvm_fusion.testing import residual_block

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "gpu_check.py"
GPU_STEPS = ["load the library on the GPU", "GPU numerics (fused vs unfused vs CPU vs onnxruntime)",
             "GPU latency (fused / unfused / tvm, interleaved medians)", "GPU per-kernel timing (fused)"]


def _run(out: Path, *args):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--cpu-only", *args],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.md").read_text(), proc.stdout


def test_cpu_only_run_reports_what_it_skipped(tmp_path):
    model = tmp_path / "block.onnx"
    onnx.save(residual_block(), str(model))
    report, md, stdout = _run(tmp_path / "out", "--model", str(model))
    assert report["gpu"] == {"present": False, "why": "--cpu-only given"}
    assert [s["step"] for s in report["skipped"]] == GPU_STEPS
    assert all(s["why"] == "--cpu-only given" for s in report["skipped"])
    assert "## Skipped (not run, not passed)" in md and all(f"- {s}: --cpu-only given" in md for s in GPU_STEPS)
    assert "skipped 4 GPU steps" in stdout
    ran = [s["step"] for s in report["steps"]]
    assert ran[0] == "build + export the fused CUDA library" and "build unfused for CUDA" in ran
    assert report["steps"][0]["code"] == "fatbin (nvcc, compiled at export)" and report["steps"][0]["kernels"] == 2
    assert [(n["comparison"], n["ok"]) for n in report["numerics"]] == [("fused CPU vs onnxruntime", True)]
    assert {k["kernel"] for k in report["kernels"]} == {"conv2d_bn_relu", "conv2d_bn_add_relu"}
    assert report["latency_ms"] == {} and report["ok"] is True
    assert (tmp_path / "out" / "block_fused.so").exists()


@pytest.mark.slow
def test_resnet50_cpu_only_parts(tmp_path):
    report, _, _ = _run(tmp_path / "out")
    assert report["model"] == "resnet50-seed0.onnx" and report["ok"]
    assert report["builds"]["fused"]["kernel_launches"] == 57
    assert sum(s["seconds"] for s in report["steps"]) < 300
