"""benchmarks/gpu_check.py runs its CPU-only parts here (so it cannot rot) and says plainly what it skipped:
the matrix {fp32, fp16} x batch {1, 8} x {fused, fused without graph, unfused, tvm} on a small model with a
symbolic batch, the bars it could not measure, and the bundle a GPU machine without TVM runs. The GPU steps
run under the driver stub (tests/cuda_stub/test_driver_stub.py)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from tvm_fusion.testing import residual_block

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "gpu_check.py"
GPU_STEPS = ["load the libraries on the GPU", "GPU numerics (fused vs unfused vs CPU vs onnxruntime)",
             "GPU latency (fused / fused without graph / unfused / tvm, interleaved medians)",
             "GPU per-kernel timing (fused without graph)"]
CONFIGS = ["fp32 batch 1", "fp16 batch 1", "fp32 batch 8", "fp16 batch 8"]
BUILDS = ["fused", "fused (no CUDA graph)", "unfused", "tvm", "fused (CPU)"]
BARS = ["fp32 batch 1: fused / unfused <= 0.4", "fp32 batch 1: fused / tvm <= 0.8",
        "fp16 batch 1: fused / unfused <= 0.4", "fp16 batch 1: fused / tvm <= 0.8",
        "fp16 batch 1: fused ms <= 0.5 on an H200"]


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(out: Path, *args, code: int = 0):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--cpu-only", *args],
                          capture_output=True, text=True, timeout=3600)
    assert proc.returncode == code, proc.stdout + proc.stderr
    return json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.md").read_text(), proc.stdout


@pytest.fixture
def block_n(tmp_path) -> Path:
    """A ResNet basic block whose batch is the symbolic dim N."""
    model = tmp_path / "blockN.onnx"
    onnx.save(residual_block(n="N"), str(model))
    return model


@pytest.mark.slow  # the 16-library matrix and its bundle (2.6 min on a busy 2-core host): CI runs it under -m slow
def test_the_matrix_without_a_gpu_and_its_bundle(tmp_path, block_n):
    """Every configuration is built for sm_90 (the fused library with and without its CUDA graph, unfused, tvm)
    and for the CPU, the CPU build is judged against onnxruntime with the precision's tolerance, the GPU steps
    and the bars are listed as not run with the reason, and the bundle carries the 16 libraries in 64 MiB."""
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    bundle = tmp_path / "bundle"
    report, md, stdout = _run(tmp_path / "out", "--model", str(block_n), "--bundle", str(bundle), "--python", here)
    assert report["gpu"] == {"present": False, "why": "--cpu-only given"} and report["ok"] is True
    assert [s["step"] for s in report["skipped"]] == GPU_STEPS
    assert all(s["why"] == f"--cpu-only given (configurations: {', '.join(CONFIGS)})" for s in report["skipped"])
    assert "skipped 4 steps" in stdout and "## Skipped (not run, not passed)" in md
    assert list(report["configs"]) == CONFIGS
    for key, cfg in report["configs"].items():
        assert cfg["shapes"] == {"x": [cfg["batch"], 8, 10, 10]} and list(cfg["builds"]) == BUILDS, key
        assert {b["target"] for m, b in cfg["builds"].items() if m != "fused (CPU)"} == {"sm_90"}
        assert sorted(cfg["libraries"]) == sorted(BUILDS[:4]) and "latency_ms" not in cfg
        fused = cfg["builds"]["fused"]
        if cfg["precision"] == "fp32":  # the two fused kernels; a graph would not save a launch
            assert (fused["primfuncs"], fused["kernel_launches"]) == (2, 2)
            assert cfg["cuda_graph"]["enabled"] is False and "would not save launches" in cfg["cuda_graph"]["reason"]
        else:  # the casts in and out are kernels of their own: the graph replays the 4 after the input copy
            assert (fused["primfuncs"], fused["kernel_launches"]) == (5, 5)
            assert cfg["cuda_graph"]["enabled"] is True and cfg["cuda_graph"]["captured_kernels"] == 4
            assert cfg["cuda_graph"]["launches_per_inference"] == {"with_graph": 3, "without_graph": 5}
    rows = [(n["config"], n["comparison"], n["dtype"], n["ok"], n["judged"]) for n in report["numerics"]]
    gc = _script()
    # fp16: the baseline (input and weights rounded, onnxruntime) is within float16's tolerance, so the fp16
    # build is judged against the float32 model
    assert rows == [row for k in CONFIGS for row in ([(k, gc.BASELINE, "float16", True, False)] if "fp16" in k else [])
                    + [(k, "fused CPU vs onnxruntime", "float16" if "fp16" in k else "float32", True, True)]]
    assert [cfg.get("ill_conditioned") for cfg in report["configs"].values()] == [None, False, None, False]
    assert [b["bar"] for b in report["bars"]] == BARS
    assert {b["status"] for b in report["bars"]} == {"not measured: no GPU (--cpu-only given)"}
    assert "## Bars" in md
    assert all(f"| {b} | - | not measured: no GPU (--cpu-only given) |" in md for b in BARS)
    kernels = {k["kernel"] for k in report["configs"]["fp32 batch 1"]["kernels"]}
    assert kernels == {"conv2d_bn_relu", "conv2d_bn_add_relu"}

    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    assert report["bundle"]["bytes"] <= size <= 64 << 20
    host = json.loads((bundle / "gpu_check_host.json").read_text())
    libs = [lib for cfg in host["configs"].values() for lib in cfg["libraries"].values()]
    assert len(set(libs)) == 16
    assert all((bundle / lib).exists() and (bundle / f"{lib}.weights").exists() for lib in libs)
    refs = np.load(bundle / "references.npz")
    assert sorted(refs.files) == sorted(f"{k}|{w}0" for k in CONFIGS for w in ("cpu", "ort"))  # inputs: a seed
    from tvm_fusion.check.io import random_inputs

    for key, cfg in host["configs"].items():  # the inputs drawn again from the seed are those the host used
        again = _script().regenerate_inputs(cfg["inputs"])
        np.testing.assert_array_equal(again[0], random_inputs(onnx.load(str(block_n)), {"x": cfg["shapes"]["x"]})["x"])
        assert refs[f"{key}|ort0"].shape == (cfg["batch"], 8, 10, 10)


def test_a_batch_the_model_cannot_take_is_skipped_with_the_reason(tmp_path):
    """A model whose batch is fixed at 1 runs batch 1 and lists batch 8 as not built, naming the input."""
    model = tmp_path / "block.onnx"
    onnx.save(residual_block(), str(model))
    configs = _script().plan(model, None, ["fp32", "fp16"], [1, 8])
    assert [(c["key"], c["shapes"]) for c in configs[:2]] == [("fp32 batch 1", None), ("fp16 batch 1", None)]
    assert [c["key"] for c in configs[2:]] == ["fp32 batch 8", "fp16 batch 8"]
    assert configs[2]["skipped"] == ("the model's batch dim is fixed (x: 1); batch 8 needs a symbolic batch dim "
                                     "(a dim_param) in the model")


def test_an_example_batch_8_is_its_dynamic_batch_variant_bound_to_8(resnet50_path):
    """Static builds per batch: CUDA graphs need static shapes (and each batch gets kernels scheduled for it)."""
    configs = _script().plan(resnet50_path, "resnet50", ["fp16"], [1, 8])
    assert Path(configs[0]["model"]).name == "resnet50-seed0.onnx" and configs[0]["shapes"] is None
    assert Path(configs[1]["model"]).name == "resnet50-seed0-batchN.onnx"
    assert configs[1]["shapes"] == {"gpu_0/data_0": [8, 3, 224, 224]}


@pytest.mark.parametrize("flag, value, expected", [
    ("--precisions", "fp32,bf8", "expected a comma-separated list of fp32, fp16"),
    ("--batches", "1,0", "expected a comma-separated list of positive batch sizes, e.g. 1,8")])
def test_a_matrix_flag_out_of_range_is_one_line_and_exit_2(tmp_path, capsys, flag, value, expected):
    with pytest.raises(SystemExit) as exit_:
        _script().main(["--out", str(tmp_path), flag, value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err == f"error: {flag} {value!r}: {expected}\n"


def test_an_ill_conditioned_configuration_judges_only_the_same_kernels_and_the_groups(tmp_path):
    """Where the baseline says fp16 is ill-conditioned, rows against the float32 model or between different
    kernels are reported (shown, not in the verdict); the GPU library against itself without its graph and
    each fused group against its unfused ops (on the CPU) are judged, and can fail."""
    from tests.test_precision import _cancelling_branches

    gc = _script()
    rep = gc.Report("m", "sm_90")
    graph = {"enabled": True, "captured_kernels": 1, "launches_per_inference": {"with_graph": 1, "without_graph": 2}}
    rep.data["configs"]["fp16 batch 1"] = {"precision": "fp16", "ill_conditioned": True, "builds": {},
                                           "cuda_graph": graph}
    off, ref = [np.full(4, 1.1, np.float32)], [np.ones(4, np.float32)]
    rep.compare("fp16 batch 1", "fused GPU vs onnxruntime", ["y"], off, ref)
    assert rep.data["ok"] and rep.data["numerics"][-1]["judged"] is False
    model = tmp_path / "m.onnx"
    onnx.save(_cancelling_branches(), str(model))
    gc._per_group(rep, "fp16 batch 1", str(model), None, "fp16")
    row = rep.data["numerics"][-1]
    assert (row["comparison"], row["judged"], row["ok"]) == (gc.PER_GROUP, True, True)
    assert row["output"].startswith("2 groups; worst: group ") and rep.data["ok"]
    assert "| reported |" in gc.markdown({**rep.data, "gpu": None, "skipped": [], "bars": []})
    rep.compare("fp16 batch 1", gc.SAME_KERNELS[0], ["y"], off, ref)
    assert rep.data["numerics"][-1]["judged"] is True and not rep.data["ok"]


def test_bars_pass_fail_and_not_measured():
    """Each bar states the ratio of medians (or the fused median in ms), pass or fail, and where a bar's
    configuration was not timed, why."""
    gc = _script()

    def lat(fused, unfused, tvm):
        return {m: {"median": v} for m, v in (("fused", fused), ("unfused", unfused), ("tvm", tvm))}

    data = {"gpu": {"present": True, "name": "NVIDIA H200"},
            "configs": {"fp32 batch 1": {"precision": "fp32", "latency_ms": lat(1.0, 2.0, 1.2)},
                        "fp16 batch 1": {"precision": "fp16", "latency_ms": lat(0.4, 1.6, 0.6)}}}
    rows = {b["bar"]: (b["measured"], b["status"]) for b in gc.bars(data)}
    assert rows == {BARS[0]: (0.5, "fail"), BARS[1]: (0.8333, "fail"), BARS[2]: (0.25, "pass"),
                    BARS[3]: (0.6667, "pass"), BARS[4]: (0.4, "pass")}
    data["gpu"]["name"] = "NVIDIA A100"
    assert gc.bars(data)[4]["status"] == "pass (measured on NVIDIA A100, not an H200)"
    data["configs"]["fp32 batch 1"]["latency_ms"]["unfused"]["median"] = 0.0  # nothing ran (the stub driver)
    assert gc.bars(data)[0]["status"] == "not measured: a median of 0 ms (no kernel ran: a stub driver?)"
    data["configs"] = {"fp16 batch 1": {"skipped": "the model's batch dim is fixed (x: 8)"}}
    assert [b["status"] for b in gc.bars(data)] == ["not measured: fp32 batch 1 is not in this run's matrix"] * 2 + [
        "not measured: the model's batch dim is fixed (x: 8)"] * 3


#: exit 0: fp16 is ill-conditioned for this synthetic example (rounding its input and weights alone is over
#: float16's tolerance), so its fp16 builds' errors against the float32 model are reported and fusion is judged
#: per group (docs/precision.md, Half precision)
RESNET50_CODE = 0
#: fp16: the casts of the input and of the two outputs, and the global average pool's input cast to float32
#: (precision.WIDENED_INPUTS: its mean sums in float32; TVM's FuseOps keeps that cast a kernel of its own)
RESNET50_LAUNCHES = {"fp32": 56, "fp16": 60}  # the stem's conv and max pool are one kernel
RESNET50_GRAPH = {"fp32": {"with_graph": 4, "without_graph": 56}, "fp16": {"with_graph": 4, "without_graph": 60}}
RESNET50_CPU_VERDICTS = {(f"{p} batch {b}", "fused CPU vs onnxruntime", out): p == "fp32" for p in ("fp32", "fp16")
                         for b in (1, 8) for out in ("gpu_0/softmax_1", "r174")}
RESNET50_FUSED_STEPS = {"fp32": {"scale_rows": 53, "stored": 53, "transpose": 1, "draw": 1},
                        "fp16": {"scale_rows": 53, "stored": 53, "transpose": 1, "cast": 1}}


@pytest.mark.slow
def test_resnet50_matrix_cpu_parts_and_the_gpu_machines_bundle(tmp_path):
    """ResNet-50's matrix without a GPU, and the bundle a GPU machine without TVM runs: the 16 CUDA libraries,
    their weights as recipes over the example's seed (fp16 ones as casts of it; libraries with the same weights
    share one recipe), the TVM runtime and numpy's wheel for Python 3.12, within the 64 MiB a lent GPU machine
    takes per call."""
    bundle = tmp_path / "bundle"
    report, _, _ = _run(tmp_path / "out", "--bundle", str(bundle), code=RESNET50_CODE)
    check_resnet50_matrix(report, bundle)


def check_resnet50_matrix(report: dict, bundle: Path) -> None:
    assert report["model"] == "resnet50-seed0.onnx" and list(report["configs"]) == CONFIGS
    for key, cfg in report["configs"].items():
        assert cfg["builds"]["fused"]["kernel_launches"] == RESNET50_LAUNCHES[cfg["precision"]], key
        assert cfg["cuda_graph"]["launches_per_inference"] == RESNET50_GRAPH[cfg["precision"]], key
    verdicts = {(n["config"], n["comparison"], n["output"]): n["ok"] for n in report["numerics"]
                if n["comparison"] == "fused CPU vs onnxruntime"}
    assert verdicts == RESNET50_CPU_VERDICTS
    judged = {(n["config"], n["comparison"]): n["ok"] for n in report["numerics"] if n["judged"]}
    per_group = _script().PER_GROUP
    assert judged == {**{(f"fp32 batch {b}", "fused CPU vs onnxruntime"): True for b in (1, 8)},
                      **{(f"fp16 batch {b}", per_group): True for b in (1, 8)}}
    assert [cfg["ill_conditioned"] for k, cfg in report["configs"].items() if "fp16" in k] == [True, True]
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    assert report["bundle"]["bytes"] <= size <= 64 << 20 and report["bundle"]["python"] == "3.12"
    assert not list(bundle.glob("*.weights")) and not list(bundle.rglob("libtvm_compiler.so"))
    assert list(bundle.glob("wheels/numpy-*-cp312-*.whl")) and list(bundle.glob("site/tvm_ffi/*cpython-312*"))
    recipes = {}
    for key, cfg in report["configs"].items():
        for mode, lib in cfg["libraries"].items():
            weights = json.loads((bundle / f"{lib}.json").read_text())["weights"]
            assert weights["recipe_bytes"] < 1 << 20 and weights["bytes"] > (45 << 20 if "fp16" in key else 90 << 20)
            recipes.setdefault(weights["recipe"], set()).add((key, mode))
            if mode == "fused":
                assert weights["recipe_steps"] == RESNET50_FUSED_STEPS[cfg["precision"]], key
    # one recipe per precision and build kind: batch 1 and 8, with and without the graph, share theirs
    assert len(recipes) == 6 == report["bundle"]["recipes"]
    shared = {frozenset(v) for v in recipes.values()}
    assert frozenset({("fp16 batch 1", "fused"), ("fp16 batch 1", "fused (no CUDA graph)"), ("fp16 batch 8", "fused"),
                      ("fp16 batch 8", "fused (no CUDA graph)")}) in shared
