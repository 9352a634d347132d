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
def test_resnet50_cpu_only_parts_and_the_gpu_machines_bundle(tmp_path):
    """ResNet-50's CPU parts, and the bundle a GPU machine without TVM runs: the three CUDA libraries, their
    weights as recipes over the example's seed (not 3 x 102 MB of weights files), the TVM runtime and numpy's
    wheel for Python 3.12, within the 64 MiB a lent GPU machine takes per call."""
    bundle = tmp_path / "bundle"
    report, md, _ = _run(tmp_path / "out", "--bundle", str(bundle))
    assert report["model"] == "resnet50-seed0.onnx" and report["ok"]
    assert report["builds"]["fused"]["kernel_launches"] == 57
    assert sum(s["seconds"] for s in report["steps"]) < 400
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    assert report["bundle"]["bytes"] <= size <= 64 << 20 and report["bundle"]["python"] == "3.12"
    assert not list(bundle.glob("*.weights")) and not list(bundle.rglob("libtvm_compiler.so"))
    assert list(bundle.glob("wheels/numpy-*-cp312-*.whl")) and list(bundle.glob("site/tvm_ffi/*cpython-312*"))
    steps = {}
    for mode in ("fused", "unfused", "tvm"):
        weights = json.loads((bundle / f"resnet50-seed0_{mode}.so.json").read_text())["weights"]
        assert weights["recipe_bytes"] < 1 << 20 < 90 << 20 < weights["bytes"]
        steps[mode] = weights["recipe_steps"]
    assert steps["fused"] == {"scale_rows": 53, "stored": 53, "transpose": 1, "draw": 1}  # BN folded into 53 convs
    assert steps["unfused"] == {"draw": 160, "stored": 106, "transpose": 1}  # BN statistics stored as they are
