"""TVM's real CUDA loader and VM, run against a stub driver (stub.c): the exported library loads, every
kernel in its function table is in the compiled code, every launch fits the kernel's `.maxntid` and the
launches per inference equal the manifest's kernel launches (its call_tir calls less reshapes, which
TVM turns into views); and a build on a host *with* a driver (TVM
compiles the kernels during the build) gives the same kernels as a driverless one.

Not run here: the kernels themselves (the stub launches nothing; the `gpu` tests and benchmarks/gpu_check.py
run them on a GPU).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import onnx
import pytest

from tvm_fusion.deploy.cuda_binary import fatbin_kernels, library_cuda_module
from tvm_fusion.testing import residual_block

from . import build_stub, check_launches, per_inference, run_with_stub, stub_env


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    return build_stub(tmp_path_factory.mktemp("cuda_stub"))


def _input_shapes(model_path) -> dict:
    model = onnx.load(str(model_path))
    init = {i.name for i in model.graph.initializer}
    return {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input if i.name not in init}


def _compile(model_path, lib, *extra, env=None):
    cmd = [sys.executable, "-m", "tvm_fusion", "compile", str(model_path), "--target", "cuda", "-o", str(lib), *extra]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(lib.with_name(lib.name + ".json").read_text()), proc.stdout


def _check_library_under_stub(stub, model_path, lib, manifest, log):
    """Two inferences under the stub. Without a CUDA graph each launches the manifest's kernel launches; with
    one the first launches them all plus the input copy and captures the graph's kernels, the second launches
    the graph once (replaying those kernels) and the kernels outside it: the manifest's launches with_graph."""
    run = run_with_stub(stub, lib, _input_shapes(model_path), log, runs=2)
    assert run.returncode == 0, run.output[-4000:]
    assert run.result["device"] == "stub GPU"  # TVM ran on the stub, not on a real device
    module = library_cuda_module(lib)
    found = {line.split()[1] for line in run.log if line.startswith("cuModuleGetFunction") and "missing" not in line}
    assert not [line for line in run.log if line.endswith(" missing")]
    assert found == {f.name for f in module.functions.values() if any(la.kernel == f.name for la in run.launches)}
    fused = manifest["builds"]["fused"]
    graph = manifest.get("cuda_graph") or {"enabled": False}
    first, second = per_inference(run.log)
    if graph["enabled"]:
        assert first == {"launch": fused["kernel_launches"] + 1, "capture": graph["captured_kernels"],
                         "graph_launch": 0, "replay": 0}, (first, graph)
        assert second["launch"] + second["graph_launch"] == graph["launches_per_inference"]["with_graph"], second
        assert (second["graph_launch"], second["replay"], second["capture"]) == (1, graph["captured_kernels"], 0)
    else:
        assert first == second == {"launch": fused["kernel_launches"], "capture": 0, "graph_launch": 0, "replay": 0}
    assert check_launches(module, run.launches) == []
    table = {f.name for f in module.functions.values()}
    unlaunched = table - {la.kernel for la in run.launches}  # every kernel runs, but reshapes (views in the VM)
    assert all(re.fullmatch(r"reshape\d*_kernel", k) for k in unlaunched), unlaunched
    return run


def test_small_model_loads_and_every_launch_is_checked(stub, tmp_path):
    model = tmp_path / "block.onnx"
    onnx.save(residual_block(), str(model))
    lib = tmp_path / "block.so"
    manifest, _ = _compile(model, lib, "--no-counts")
    assert manifest["cuda_binary"]["compiled_at"] == "export"  # no driver here: TVM kept source
    run = _check_library_under_stub(stub, model, lib, manifest, tmp_path / "calls.log")
    assert [la.kernel for la in run.launches] == ["conv2d_bn_relu_kernel", "conv2d_bn_add_relu_kernel"] * 2
    assert manifest["builds"]["fused"]["kernel_calls"] == 2
    assert manifest["cuda_graph"]["reason"] == "the graph would not save launches (3 with it, 2 without)"
    assert sum(line.startswith("cuModuleLoadData") for line in run.log) == 1


def test_check_launches_catches_a_block_over_maxntid(stub, tmp_path):
    from . import Launch

    model = tmp_path / "block.onnx"
    onnx.save(residual_block(), str(model))
    lib = tmp_path / "block.so"
    _compile(model, lib, "--no-counts")
    module = library_cuda_module(lib)
    ptx, _ = fatbin_kernels(module.data)
    k = ptx["conv2d_bn_relu_kernel"]
    too_big = Launch(k.name, (1, 1, 1), (k.maxntid[0], 2, 1), 0)
    assert check_launches(module, [too_big]) == [f"{k.name}: block {too_big.block} exceeds .maxntid {k.maxntid}"]


@pytest.mark.slow
def test_build_with_a_driver_present_gives_the_same_kernels(stub, tmp_path):
    """With the stub loaded TVM sees a driver and compiles the kernels during the build (the path that
    failed on GPU servers: NVRTC without cuda-bindings, or a `cubin` module export rejected)."""
    model = tmp_path / "block.onnx"
    onnx.save(residual_block(), str(model))
    plain, with_driver = tmp_path / "plain.so", tmp_path / "driver.so"
    m_plain, _ = _compile(model, plain, "--no-counts")
    m_driver, out = _compile(model, with_driver, "--no-counts", env=stub_env(stub, tmp_path / "build.log"))
    assert m_driver["cuda_binary"]["compiled_at"] == "build", out
    assert m_plain["cuda_binary"]["compiled_at"] == "export"
    a, b = library_cuda_module(plain), library_cuda_module(with_driver)
    assert (a.fmt, a.functions) == (b.fmt, b.functions)
    assert a.data == b.data  # byte-identical fatbin
    _check_library_under_stub(stub, model, with_driver, m_driver, tmp_path / "calls.log")


@pytest.mark.slow
def test_library_with_external_weights_under_the_stub(stub, tmp_path):
    model = tmp_path / "block.onnx"
    onnx.save(residual_block(), str(model))
    lib = tmp_path / "block.so"
    manifest, _ = _compile(model, lib, "--no-counts", "--external-weights")
    assert manifest["weights"]["params"] == ["w0", "w1", "w2", "w3"]
    run = _check_library_under_stub(stub, model, lib, manifest, tmp_path / "calls.log")
    assert run.result["weights"] == 4 and run.result["outputs"] == [[1, 8, 10, 10]]


@pytest.mark.slow
def test_resnet50_library_under_the_stub(stub, resnet50_path, tmp_path):
    lib = tmp_path / "resnet50.so"
    manifest, _ = _compile(resnet50_path, lib)
    run = _check_library_under_stub(stub, resnet50_path, lib, manifest, tmp_path / "calls.log")
    fused = manifest["builds"]["fused"]
    first, second = per_inference(run.log)
    print(f"ResNet-50: {first} then {second}; manifest: {fused}, {manifest['cuda_graph']}")
    assert (fused["kernel_launches"], fused["kernel_calls"]) == (56, 59)  # 3 reshapes (flatten) are views, not kernels
    # the CUDA graph: the input copy and 56 launches while TVM captures 54 of them, then 4 launches per inference
    assert first == {"launch": 57, "capture": 54, "graph_launch": 0, "replay": 0}
    assert second == {"launch": 3, "capture": 0, "graph_launch": 1, "replay": 54}
    assert manifest["cuda_graph"]["launches_per_inference"] == {"with_graph": 4, "without_graph": 56}
    m_driver, _ = _compile(resnet50_path, tmp_path / "driver.so", "--no-counts",
                           env=stub_env(stub, tmp_path / "build.log"))
    a, b = library_cuda_module(lib), library_cuda_module(tmp_path / "driver.so")
    assert m_driver["cuda_binary"]["compiled_at"] == "build"
    assert a.functions == b.functions and a.data == b.data
    small = tmp_path / "external.so"
    m_ext, _ = _compile(resnet50_path, small, "--no-counts", "--external-weights")
    assert small.stat().st_size < 8 << 20 < lib.stat().st_size  # kernels + host code, without ~100 MB of weights
    assert m_ext["weights"]["bytes"] > 90 << 20
    run = _check_library_under_stub(stub, resnet50_path, small, m_ext, tmp_path / "calls_ext.log")
    assert m_ext["cuda_graph"]["enabled"] is False  # weights outside: off unless asked for (--cuda-graph)
    assert len(run.launches) == 2 * 56 and run.result["weights"] == len(m_ext["weights"]["params"])
    _resnet50_bundle_with_a_weights_recipe(stub, small, tmp_path)


def _resnet50_bundle_with_a_weights_recipe(stub, lib, tmp_path):
    """The bundle carries the weights as a recipe over the example's seed and fits in 64 MiB; its run.py,
    with no TVM compiler and no tvm_fusion, regenerates the 108 weights with numpy (each checked by sha256)
    and issues the 56 launches."""
    from . import read_log

    from benchmarks.gpu_bundle import bundle_with_recipes
    from tvm_fusion.errors import FusionError

    deploy = tmp_path / "deploy"
    try:
        bundle_with_recipes(lib, deploy, numpy_wheel=True)
    except FusionError as err:
        if "could not download numpy" in str(err):
            pytest.skip("numpy's wheel could not be fetched (no package index)")
        raise
    size = sum(p.stat().st_size for p in deploy.rglob("*") if p.is_file())
    assert size <= 64 << 20 and not list(deploy.glob("*.weights")), size
    base = getattr(sys, "_base_executable", sys.executable)
    run = subprocess.run([base, "-s", str(deploy / "run.py")], env=stub_env(stub, tmp_path / "bundle.log"),
                         capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["weights"] == 108 and result["compiler_loaded"] is False
    assert len(read_log(tmp_path / "bundle.log")[1]) == 56


def _block_n(tmp_path):
    """A ResNet basic block whose batch is the symbolic dim N (the check builds it at batch 1 and 8)."""
    model = tmp_path / "blockN.onnx"
    onnx.save(residual_block(n="N"), str(model))
    return model


GPU_STEPS = ["load the libraries on the GPU", "GPU numerics (fused vs unfused vs CPU vs onnxruntime)",
             "GPU latency (fused / fused without graph / unfused / tvm, interleaved medians)",
             "GPU per-kernel timing (fused without graph)"]
BUILDS = {"fused", "fused (no CUDA graph)", "unfused", "tvm"}
ZERO = "not measured: a median of 0 ms (no kernel ran: a stub driver?)"
#: the fused block's PrimFuncs: in fp16 the residual (the float32 input) joins add_relu, and the casts in and out
KERNELS = {"fp32": {"conv2d_bn_relu", "conv2d_bn_add_relu"},
           "fp16": {"conv2d_bn_relu", "conv2d_bn", "add_relu", "cast", "cast1"}}


@pytest.mark.slow
def test_gpu_check_runs_its_gpu_steps_under_the_stub(stub, tmp_path):
    """benchmarks/gpu_check.py's GPU path end to end on the stub, for fp16 at batch 1 and 8: every GPU step
    runs (none skipped), the latency rounds stop at the minimum when the time budget is spent, no bar is
    judged on the stub's 0 ms, and the verdict is FAIL, since the stub runs no kernel: the check can fail."""
    from pathlib import Path

    script = Path(__file__).parents[2] / "benchmarks" / "gpu_check.py"
    proc = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "out"), "--model",
                           str(_block_n(tmp_path)), "--precisions", "fp16", "--rounds", "20", "--budget-s", "0"],
                          env=stub_env(stub, tmp_path / "calls.log"), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert report["gpu"]["name"] == "stub GPU" and report["gpu"]["arch"] == "sm_90" and report["skipped"] == []
    keys = ["fp16 batch 1", "fp16 batch 8"]
    assert list(report["configs"]) == keys and "errors" not in report
    assert [s["step"] for s in report["steps"] if ": GPU" in s["step"] or ": load" in s["step"]] == [
        f"{k}: {s}" for k in keys for s in GPU_STEPS]
    for key in keys:
        cfg = report["configs"][key]
        assert set(cfg["latency_ms"]) == BUILDS and {v["rounds"] for v in cfg["latency_ms"].values()} == {3}
        assert {k["kernel"] for k in cfg["kernels"]} == KERNELS[cfg["precision"]], key
    failed = {(n["config"], n["comparison"]) for n in report["numerics"] if not n["ok"]}
    assert ("fp16 batch 8", "fused GPU vs onnxruntime") in failed and report["ok"] is False
    bars = {b["bar"]: b for b in report["bars"]}
    absent = "not measured: fp32 batch 1 is not in this run's matrix"
    assert bars["fp32 batch 1: fused / tvm <= 0.8"]["status"] == absent
    # the stub's cudaEventElapsedTime says 0 ms: no bar is judged on that
    assert {b["status"] for b in report["bars"] if b["config"] == "fp16 batch 1"} == {ZERO}
    assert {v["median"] for v in report["configs"]["fp16 batch 1"]["latency_ms"].values()} == {0.0}
    md = (tmp_path / "out" / "gpu_check.md").read_text()
    assert "**Verdict: FAIL**" in md and "## Latency (interleaved rounds, ms)" in md


@pytest.mark.slow
def test_cuda_bundle_runs_under_the_stub_without_the_compiler(stub, tmp_path):
    """`tvm-fusion bundle` of a CUDA library: run.py (TVM runtime alone, TVM_USE_RUNTIME_LIB=1) loads it
    on the stub GPU and issues every launch; the bundle carries libcudart (the GPU server needs only a driver)."""
    from pathlib import Path

    from . import read_log

    model = tmp_path / "block.onnx"
    onnx.save(residual_block(), str(model))
    lib = tmp_path / "block.so"
    _compile(model, lib, "--no-counts", "--external-weights")
    deploy = tmp_path / "deploy"
    proc = subprocess.run([sys.executable, "-m", "tvm_fusion", "bundle", str(lib), "-o", str(deploy)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert not list(deploy.rglob("libtvm_compiler.so"))
    assert (deploy / "site" / "tvm" / "lib" / "libcudart.so.13").exists(), proc.stdout  # this host has the toolkit
    base = getattr(sys, "_base_executable", sys.executable)  # no venv: neither TVM nor tvm_fusion importable
    run = subprocess.run([base, "-s", str(deploy / "run.py")], env=stub_env(stub, tmp_path / "calls.log"),
                         capture_output=True, text=True, cwd=tmp_path)
    if "No module named 'numpy'" in run.stderr:
        pytest.skip("bundle run not checked: this Python has no numpy outside the venv")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["device"] == "cuda:0" and result["compiler_loaded"] is False
    assert Path(result["tvm"]).is_relative_to(deploy)
    _, launches = read_log(tmp_path / "calls.log")
    assert [la.kernel for la in launches] == ["conv2d_bn_relu_kernel", "conv2d_bn_add_relu_kernel"]


@pytest.mark.slow  # the whole matrix and its bundle (2.3 min on a busy 2-core host): CI runs it under -m slow
def test_gpu_check_bundle_runs_its_gpu_steps_under_the_stub_without_tvm(stub, tmp_path):
    """gpu_check.py --bundle writes what a GPU machine without TVM runs: there gpu_check_device.py (the TVM
    runtime alone; numpy unpacked from the bundled wheel, as this Python has none) runs every GPU step of the
    whole matrix on the stub, with the inputs drawn again from their seed; the verdict is FAIL, since the
    stub runs no kernel."""
    from pathlib import Path

    script = Path(__file__).parents[2] / "benchmarks" / "gpu_check.py"
    bundle = tmp_path / "bundle"
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    proc = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "host"), "--model",
                           str(_block_n(tmp_path)), "--bundle", str(bundle), "--python", here, "--cpu-only"],
                          capture_output=True, text=True, timeout=900)
    if "could not download numpy" in proc.stderr:
        pytest.skip("numpy's wheel could not be fetched (no package index)")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    host = json.loads((bundle / "gpu_check_host.json").read_text())
    assert host["bundle"]["bytes"] <= 64 << 20 and not list(bundle.rglob("libtvm_compiler.so"))
    keys = ["fp32 batch 1", "fp16 batch 1", "fp32 batch 8", "fp16 batch 8"]
    assert list(host["configs"]) == keys and all(set(c["libraries"]) == BUILDS for c in host["configs"].values())
    assert list(bundle.glob("wheels/numpy-*.whl"))
    assert (bundle / "blockN_fp16_b8_fused.so.weights").exists()  # no example: weights files, not recipes
    base = getattr(sys, "_base_executable", sys.executable)  # no venv: neither TVM nor tvm_fusion importable
    run = subprocess.run([base, "-s", str(bundle / "gpu_check_device.py"), "--out", str(tmp_path / "gpu"),
                          "--rounds", "2"], env=stub_env(stub, tmp_path / "calls.log"), capture_output=True,
                         text=True, cwd=tmp_path, timeout=600)
    assert run.returncode == 1, run.stdout + run.stderr
    report = json.loads((tmp_path / "gpu" / "gpu_check.json").read_text())
    assert report["gpu"]["name"] == "stub GPU" and report["skipped"] == [] and "errors" not in report
    assert report["runtime"]["compiler_loaded"] is False and Path(report["runtime"]["tvm"]).is_relative_to(bundle)
    steps = [s["step"] for s in report["steps"]]
    assert steps[:2] == ["fp32 batch 1: build + export fused for CUDA",
                         "fp32 batch 1: build + export fused (no CUDA graph) for CUDA"]
    assert steps[-16:] == [f"{k}: {s}" for k in keys for s in GPU_STEPS]
    for key in keys:
        cfg = report["configs"][key]
        assert set(cfg["latency_ms"]) == BUILDS and {v["rounds"] for v in cfg["latency_ms"].values()} == {2}
        assert {k["kernel"] for k in cfg["kernels"]} == KERNELS[cfg["precision"]], key
    assert report["configs"]["fp32 batch 1"]["cuda_graph"]["enabled"] is False  # two kernels: no launch saved
    assert len(report["weights_seconds"]) == 16  # no example: a weights file per library
    verdicts = {(n["config"], n["comparison"]): n["ok"] for n in report["numerics"]}
    assert all(verdicts[(k, "fused CPU vs onnxruntime")] for k in keys)
    assert not any(verdicts[(k, "fused GPU vs onnxruntime")] for k in keys)
    assert [b["status"] for b in report["bars"]] == [ZERO] * 5  # the stub's events say 0 ms


@pytest.mark.slow
def test_cuda_graph_captured_then_replayed_under_the_stub(stub, tmp_path):
    """A chain of 4 fused kernels: the first inference launches the input copy and the 4 kernels while TVM
    captures the 3 after the copy (cudaStreamBeginCapture ... cudaGraphInstantiate); every later inference
    launches the copy, the graph once (the stub replays its 3 kernels) and the last kernel: 3 launches instead
    of 4, as the manifest says. With --no-cuda-graph every inference launches the 4 kernels."""
    from tests.test_cuda_graph import chain

    model = tmp_path / "chain.onnx"
    onnx.save(chain(4), str(model))
    lib, plain = tmp_path / "chain.so", tmp_path / "plain.so"
    manifest, out = _compile(model, lib, "--no-counts")
    assert manifest["cuda_graph"] == {"enabled": True, "reason": None, "captured_kernels": 3, "graphs": 1,
                                      "launches_per_inference": {"with_graph": 3, "without_graph": 4}}
    assert "CUDA graph: on; launches per inference 3 with it (3 kernels replayed by 1 graph launch), 4 without" in out
    run = _check_library_under_stub(stub, model, lib, manifest, tmp_path / "calls.log")
    graph_calls = ("cudaStreamBegin", "cudaStreamEnd", "cudaGraph", "graph_launch")
    calls = [line.split()[0] for line in run.log if line.startswith(graph_calls)]
    assert calls == ["cudaStreamBeginCapture", "cudaStreamEndCapture", "cudaGraphInstantiate", "graph_launch"]
    replayed = [line.split()[1] for line in run.log if line.startswith("replay ")]
    assert replayed == ["conv2d_bn_relu_kernel"] * 3
    m_plain, out = _compile(model, plain, "--no-counts", "--no-cuda-graph")
    assert m_plain["cuda_graph"]["reason"] == "turned off (--no-cuda-graph)" and "CUDA graph: off" in out
    run = _check_library_under_stub(stub, model, plain, m_plain, tmp_path / "plain.log")
    assert [p["launch"] for p in per_inference(run.log)] == [4, 4]
