"""A library built for another CPU: x86-64-v3 (AVX2, no AVX-512) built here, loaded with the TVM runtime
alone and run against onnxruntime; aarch64 cross-linked when a cross toolchain is on PATH; a host that
lacks a library's features gets a FusionError naming them instead of SIGILL."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest

from tvm_fusion.build.builder import build, resolve_target
from tvm_fusion.check.compare import random_inputs, run_onnxruntime
from tvm_fusion.deploy.compile import compile_model, cpu_linker
from tvm_fusion.errors import FusionError
from tvm_fusion.frontend.importer import import_onnx
from tvm_fusion.hardware import cpu_facts
from tvm_fusion import runtime
from tvm_fusion.runtime.manifest import Manifest
from tvm_fusion.runtime import check_host, load
from tvm_fusion.testing import GraphBuilder, assert_close, residual_block

X86_64_V3 = {"kind": "llvm", "mcpu": "x86-64-v3"}
AARCH64 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}


def _small_net() -> onnx.ModelProto:
    """A residual block (conv kernels), then Flatten -> MatMul + bias -> Relu (a dense kernel)."""
    block = residual_block(c=16, hw=(8, 8))
    g = GraphBuilder(3)
    g.nodes, g.inits, g.inputs = list(block.graph.node), list(block.graph.initializer), list(block.graph.input)
    flat = g.op("Flatten", [block.graph.output[0].name])
    w = g.const(g.rng.normal(0, 0.05, (16 * 8 * 8, 48)).astype(np.float32))
    b = g.const(g.rng.normal(0, 0.1, 48).astype(np.float32))
    return g.model([g.op("Relu", [g.op("Add", [g.op("MatMul", [flat, w]), b])])])


def _assert_matches_onnxruntime(model, outputs, inputs, reference=None):
    if reference is None:
        sess, names = run_onnxruntime(model, inputs)
        reference = sess.run(names, inputs)
    for got, want in zip(outputs, reference, strict=True):
        assert_close(got, want, "deployed library vs onnxruntime")


def _zmm_lines(library) -> list[str]:
    dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(library)], capture_output=True, text=True,
                         check=True).stdout
    return [line for line in dis.splitlines() if "zmm" in line]


def test_x86_64_v3_build_has_no_avx512_code():
    built = build(import_onnx(_small_net()), X86_64_V3, "fused")
    assert sum(built.counts.values()) >= 3 and cpu_facts(built.target).float32_lanes == 8
    (llvm_module,) = [m for m in built.executable.mod.imports if m.kind == "llvm"]
    asm = llvm_module.inspect_source("asm")
    assert "ymm" in asm, "AVX2 code uses the 256-bit registers"
    assert "zmm" not in asm


def test_library_for_x86_64_v3_runs_here(tmp_path):
    model = _small_net()
    path = tmp_path / "net.onnx"
    onnx.save(model, str(path))
    result = compile_model(path, tmp_path / "net.so", json.dumps(X86_64_V3), counts_of_other_builds=False)
    manifest = result.manifest
    assert json.loads(manifest["target"])["mcpu"] == "x86-64-v3"
    assert {"avx2", "fma"} <= set(manifest["cpu_features"]) and "avx512f" not in manifest["cpu_features"]
    if shutil.which("objdump"):
        assert _zmm_lines(result.library) == []
    inputs = random_inputs(model, seed=1)
    loaded = load(result.library)
    _assert_matches_onnxruntime(model, loaded(*inputs.values()), inputs)


def test_the_manifest_records_the_exact_target_with_mattr(tmp_path):
    onnx.save(residual_block(), str(tmp_path / "m.onnx"))
    target = {"kind": "llvm", "mcpu": "znver4", "mattr": ["-avx512f"], "num-cores": 2}
    manifest = compile_model(tmp_path / "m.onnx", tmp_path / "m.so", target, counts_of_other_builds=False).manifest
    recorded = json.loads(manifest["target"])
    assert (recorded["mcpu"], recorded["mattr"]) == ("znver4", ["-avx512f"])
    assert "avx512f" not in manifest["cpu_features"] and "avx2" in manifest["cpu_features"]


def test_load_names_the_features_this_host_lacks(tmp_path, monkeypatch):
    onnx.save(residual_block(), str(tmp_path / "m.onnx"))
    lib = compile_model(tmp_path / "m.onnx", tmp_path / "m.so", X86_64_V3, counts_of_other_builds=False).library
    manifest_path = tmp_path / "m.so.json"
    manifest = json.loads(manifest_path.read_text())
    # a host without AMX, whatever this one has: its real features less the AMX ones, and a library that needs them
    real = runtime.host_features()
    if real is None:
        pytest.skip("this machine's /proc/cpuinfo cannot be read")
    monkeypatch.setattr(runtime, "host_features", lambda *a: frozenset(f for f in real if not f.startswith("amx")))
    manifest["cpu_features"] += ["amx-fp16", "amx-tile"]
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(FusionError, match=r"uses CPU features this machine does not expose: amx-fp16, amx-tile"):
        load(lib)


def _manifest(triple, features) -> Manifest:
    return Manifest(model="m.onnx", library="lib.so", target="llvm", inputs=[], cpu_triple=triple,
                    cpu_features=features)


def test_check_host_against_a_host_with_avx512_hidden(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma f16c\n")
    avx512 = _manifest("x86_64-linux-gnu", ["avx2", "avx512f", "avx512bw", "sse2"])
    with pytest.raises(FusionError, match=r"lib.so uses CPU features .* avx512bw, avx512f \(not in"):
        check_host(avx512, "lib.so", cpuinfo=cpuinfo)
    check_host(_manifest("x86_64-linux-gnu", ["avx", "avx2", "fma"]), cpuinfo=cpuinfo)
    check_host(_manifest(None, None), cpuinfo=cpuinfo)  # a manifest that says nothing about the CPU
    if os.uname().machine == "x86_64":
        with pytest.raises(FusionError, match="was built for aarch64-linux-gnu"):
            check_host(_manifest("aarch64-linux-gnu", ["neon"]), cpuinfo=cpuinfo)


RUNTIME_ONLY = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    from tvm_fusion.runtime import load
    model = load(sys.argv[1])
    out = model(np.load(sys.argv[2]))
    np.save(sys.argv[3], out[0])
    compiler = [m for m in sys.modules if m.startswith(("tvm.relax", "tvm.s_tir", "tvm.topi", "tvm.meta_schedule",
                "tvm_fusion._tvm", "tvm_fusion.build", "tvm_fusion.fusion", "tvm_fusion.deploy", "onnx"))]
    print(json.dumps({"compiler_modules": compiler, "threads": model.threads,
                      "env_threads": os.environ.get("TVM_NUM_THREADS")}))
""")


def _run_runtime_only(tmp_path, lib, x, cores=None, **env):
    """RUNTIME_ONLY in a fresh process (on the CPU set `cores` when given)."""
    np.save(tmp_path / "x.npy", x)
    env = {k: v for k, v in os.environ.items() if k != "TVM_NUM_THREADS"} | {"TVM_USE_RUNTIME_LIB": "1", **env}
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    proc = subprocess.run([sys.executable, "-c", RUNTIME_ONLY, str(lib), str(tmp_path / "x.npy"),
                           str(tmp_path / "y.npy")], capture_output=True, text=True, env=env, timeout=300,
                          preexec_fn=pin)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), np.load(tmp_path / "y.npy")


def test_runtime_alone_loads_and_runs_a_library(tmp_path):
    """TVM_USE_RUNTIME_LIB=1 + tvm_fusion.runtime: no compiler module is imported, the pool uses every
    core this process may run on, and the outputs match onnxruntime."""
    model = residual_block(c=16, hw=(8, 8))
    onnx.save(model, str(tmp_path / "m.onnx"))
    lib = compile_model(tmp_path / "m.onnx", tmp_path / "m.so", "llvm", counts_of_other_builds=False).library
    inputs = random_inputs(model, seed=2)
    report, y = _run_runtime_only(tmp_path, lib, inputs["x"])
    assert report["compiler_modules"] == []
    cores = len(os.sched_getaffinity(0))
    assert (report["env_threads"], report["threads"]) == (str(cores), cores)
    _assert_matches_onnxruntime(model, [y], inputs)
    report, _ = _run_runtime_only(tmp_path, lib, inputs["x"], TVM_NUM_THREADS="1")
    assert (report["env_threads"], report["threads"]) == ("1", 1)
    # the cores this process may use, not the machine's: a process pinned to one core gets one thread
    report, _ = _run_runtime_only(tmp_path, lib, inputs["x"], cores={min(os.sched_getaffinity(0))})
    assert (report["env_threads"], report["threads"]) == ("1", 1)


PLAIN_TVM = textwrap.dedent("""
    import ctypes, json, sys
    import tvm  # TVM's runtime alone: no tvm_fusion in this process
    getenv = ctypes.CDLL(None).getenv  # the C environment TVM's pool reads (os.environ is a copy)
    getenv.restype = ctypes.c_char_p
    before = getenv(b"TVM_NUM_THREADS")
    tvm.runtime.load_module(sys.argv[1])
    after = getenv(b"TVM_NUM_THREADS")
    print(json.dumps({"before": before and before.decode(), "after": after and after.decode(),
                      "threads": int(tvm.get_global_func("runtime.NumThreads")())}))
""")


def _load_with_plain_tvm(lib, cores=None, **env) -> dict:
    """PLAIN_TVM in a fresh process with `env` (and on the CPU set `cores` when given)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")} | {
        "TVM_USE_RUNTIME_LIB": "1", **env}
    proc = subprocess.run([sys.executable, "-c", PLAIN_TVM, str(lib)], capture_output=True, text=True, env=env,
                          timeout=300, preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_library_loaded_by_plain_tvm_sizes_the_pool_to_the_allowed_cores(tmp_path):
    """An exported library loaded with tvm.runtime.load_module alone (no tvm_fusion) sets TVM_NUM_THREADS to
    the cores the process may use when it is loaded (thread_pool.c), so TVM's pool takes them instead of half
    the machine's cores; a TVM_NUM_THREADS or OMP_NUM_THREADS the user set wins."""
    onnx.save(residual_block(c=16, hw=(8, 8)), str(tmp_path / "m.onnx"))
    lib = compile_model(tmp_path / "m.onnx", tmp_path / "m.so", "llvm", counts_of_other_builds=False).library
    cores = len(os.sched_getaffinity(0))
    assert _load_with_plain_tvm(lib) == {"before": None, "after": str(cores), "threads": cores}
    one = {min(os.sched_getaffinity(0))}
    assert _load_with_plain_tvm(lib, cores=one) == {"before": None, "after": "1", "threads": 1}
    # (TVM takes at most the machine's cores: a value the user set is shown by 1 against this process's cores)
    assert _load_with_plain_tvm(lib, TVM_NUM_THREADS="1") == {"before": "1", "after": "1", "threads": 1}
    assert _load_with_plain_tvm(lib, OMP_NUM_THREADS="1") == {"before": None, "after": None, "threads": 1}


def test_runtime_load_passes_a_weights_file(tmp_path):
    """A library compiled with --external-weights runs through tvm_fusion.runtime.load as one with its weights
    inside: load reads the weights file the manifest names and passes the tensors after the inputs."""
    model = residual_block(c=16, hw=(8, 8))
    onnx.save(model, str(tmp_path / "m.onnx"))
    lib = compile_model(tmp_path / "m.onnx", tmp_path / "m.so", "llvm", counts_of_other_builds=False,
                        external_weights=True).library
    inputs = random_inputs(model, seed=2)
    report, y = _run_runtime_only(tmp_path, lib, inputs["x"])
    assert report["compiler_modules"] == []
    _assert_matches_onnxruntime(model, [y], inputs)


def test_runtime_imports_no_compiler_module_of_tvm_fusion():
    """Even where `import tvm` loads TVM's compiler (no TVM_USE_RUNTIME_LIB), tvm_fusion.runtime adds
    nothing of ours but the manifest's class: no _tvm, build, fuse, frontend, onnx or onnxruntime."""
    code = ("import sys, tvm_fusion.runtime; print(sorted(m for m in sys.modules if m.startswith("
            "('tvm_fusion.', 'onnx')) and m not in ('tvm_fusion.runtime', 'tvm_fusion.errors', "
            "'tvm_fusion.cpu_features', 'tvm_fusion.quiet', 'tvm_fusion.runtime.manifest')))")
    env = {k: v for k, v in os.environ.items() if k != "TVM_USE_RUNTIME_LIB"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_cross_linking_without_a_toolchain_says_what_to_install():
    target = resolve_target({"kind": "llvm", "mtriple": "riscv64-linux-gnu"})
    if shutil.which("riscv64-linux-gnu-gcc"):
        pytest.skip("a riscv64 cross toolchain is installed here")
    with pytest.raises(FusionError, match=r"put riscv64-linux-gnu-gcc on PATH .*apt-get install gcc-riscv64-linux-gnu"):
        cpu_linker(target)
    assert cpu_linker(resolve_target("llvm")) is None


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None,
                    reason="no aarch64 cross toolchain (aarch64-linux-gnu-gcc; apt-get install gcc-aarch64-linux-gnu)")
def test_aarch64_library_is_cross_linked_and_refused_here(tmp_path):
    onnx.save(_small_net(), str(tmp_path / "m.onnx"))
    result = compile_model(tmp_path / "m.onnx", tmp_path / "m.so", AARCH64, counts_of_other_builds=False)
    header = result.library.read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183  # EM_AARCH64
    assert result.manifest["cpu_triple"] == "aarch64-linux-gnu" and "neon" in result.manifest["cpu_features"]
    if os.uname().machine != "aarch64":
        with pytest.raises(FusionError, match="was built for aarch64-linux-gnu"):
            load(result.library)


@pytest.mark.slow
def test_resnet50_for_x86_64_v3_runs_here(tmp_path, resnet50_path):
    model = onnx.load(str(resnet50_path))
    result = compile_model(resnet50_path, tmp_path / "r50.so", X86_64_V3, counts_of_other_builds=False)
    if shutil.which("objdump"):
        assert _zmm_lines(result.library) == []
    inputs = random_inputs(model, seed=0)
    outputs = load(result.library)(*inputs.values())
    sess, names = run_onnxruntime(model, inputs)
    reference = dict(zip(names, sess.run(names, inputs)))
    for name, got in zip(names, outputs, strict=True):
        assert_close(got, reference[name], f"{name}: x86-64-v3 library vs onnxruntime")
    # element by element on the probabilities; the logits' worst element is 1.3x that bound here for
    # every CPU target (and 1.8x for TVM's unfused build), so they are held to the tolerance table only
    softmax = names.index("gpu_0/softmax_1")
    _assert_matches_onnxruntime(model, [outputs[softmax]], inputs, [reference[names[softmax]]])
