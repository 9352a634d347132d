"""The example ResNet-50 (seeded random weights): exact rule counts, numerics on llvm, CUDA build + export."""

import json
import re

import pytest

from tvm_fusion._tvm import relax
from tvm_fusion.build.builder import build
from tvm_fusion.check.compare import gpu_available, random_inputs, run_onnxruntime
from tvm_fusion.testing import assert_close, run_build

RESNET50_COUNTS = {"conv2d_bn_relu_pool": 1, "conv2d_bn_add_relu": 16, "conv2d_bn_relu": 32, "conv2d_bn": 4,
                   "dense_bias": 1}
#: on an AVX-512 CPU the stem's conv and pool stay two kernels: a 32-channel task's 112x112 plane (1.5 MiB) is
#: past the CPU conv -> pool kernel's measured bound (schedules/llvm/conv_pool.py, MAX_PLANE_BYTES)
AVX512_CPU_COUNTS = {"conv2d_bn_add_relu": 16, "conv2d_bn_relu": 33, "conv2d_bn": 4, "dense_bias": 1}
CONV_LAYERS = 53


def _fired(counts):
    return {k: v for k, v in counts.items() if v}


def _cpu_counts():
    """The rule counts of the host CPU's build: AVX-512's, or the CUDA build's (AVX2: the stem fused too)."""
    from tvm_fusion.build.builder import resolve_target
    from tvm_fusion.hardware import cpu_facts

    return AVX512_CPU_COUNTS if cpu_facts(resolve_target("llvm")).isa == "avx512" else RESNET50_COUNTS


def _ops(mod):
    ops = []
    relax.analysis.post_order_visit(mod["main"], lambda e: isinstance(e, relax.Call) and hasattr(e.op, "name")
                                    and ops.append(e.op.name))
    return ops


@pytest.fixture(scope="module")
def fused_cpu(resnet50_mod, rules):
    return build(resnet50_mod, "llvm", "fused", rules=rules)


def test_every_conv_lands_in_a_rule(fused_cpu):
    assert _fired(fused_cpu.counts) == _cpu_counts()
    assert sum(v for k, v in fused_cpu.counts.items() if k.startswith("conv2d")) == CONV_LAYERS
    assert "relax.nn.conv2d" not in _ops(fused_cpu.fused.mod)
    assert all(g.onnx_nodes for g in fused_cpu.fused.groups)


def test_fused_matches_unfused_and_onnxruntime(resnet50_path, resnet50_mod, fused_cpu):
    import onnx

    model = onnx.load(str(resnet50_path))
    inputs = random_inputs(model, seed=1)
    x = [inputs[model.graph.input[0].name]]
    unfused = build(resnet50_mod, "llvm", "unfused")
    got_fused, got_unfused = run_build(fused_cpu, x), run_build(unfused, x)
    sess, names = run_onnxruntime(model, inputs)
    ref = sess.run(None, inputs)
    assert names == ["gpu_0/softmax_1", "r174"]
    logits = ref[1]
    assert 0.3 < float(logits.std()) < 10, "example weights should give O(1) logits"
    for f, u, r, name in zip(got_fused, got_unfused, ref, names):
        assert_close(f, u, f"{name}: fused vs unfused")
        assert_close(f, r, f"{name}: fused vs onnxruntime")
    assert fused_cpu.kernel_calls < unfused.kernel_calls


@pytest.mark.slow
def test_cuda_library(resnet50_path, tmp_path):
    from tvm_fusion.deploy.compile import compile_model
    from tvm_fusion.deploy.export import library_cuda_modules

    lib = tmp_path / "resnet50_fused.so"
    result = compile_model(resnet50_path, lib, "cuda", arch="sm_90")
    manifest = json.loads(result.manifest_path.read_text())
    assert _fired(manifest["rule_counts"]) == RESNET50_COUNTS
    assert len(manifest["groups"]) == sum(RESNET50_COUNTS.values())
    assert all(g["onnx_nodes"] and g["kernels"] for g in manifest["groups"])
    assert {g["rule"] for g in manifest["groups"]} == set(RESNET50_COUNTS)
    builds = manifest["builds"]
    assert builds["fused"]["kernel_calls"] < builds["tvm"]["kernel_calls"] < builds["unfused"]["kernel_calls"]
    assert manifest["cuda_binary"]["format"] == "fatbin"
    assert library_cuda_modules(lib) == ["fatbin"]  # compiled GPU code, not CUDA source
    assert b"__global__" not in lib.read_bytes()


@pytest.mark.slow
def test_cuda_source_has_each_rules_kernel(resnet50_mod, rules):
    from tvm_fusion.build.cuda_compiler import cuda_source

    built = build(resnet50_mod, "cuda", "fused", rules=rules)
    kernels = re.findall(r"__global__\s+void\s+(?:__launch_bounds__\(\d+\)\s+)?(\w+)\s*\(",
                         cuda_source(built.executable))
    for rule in RESNET50_COUNTS:
        assert any(k.startswith(rule) for k in kernels), rule


@pytest.mark.gpu
def test_library_runs_on_gpu(resnet50_path, tmp_path):
    ok, why = gpu_available()
    if not ok:
        pytest.skip(f"GPU execution not run: {why}")
    import onnx
    import tvm

    from tvm_fusion.deploy.compile import compile_model

    lib = tmp_path / "r50.so"
    compile_model(resnet50_path, lib, "cuda", counts_of_other_builds=False)
    model = onnx.load(str(resnet50_path))
    inputs = random_inputs(model, seed=1)
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(lib)), dev)
    out = [o.numpy() for o in vm["main"](tvm.runtime.tensor(inputs[model.graph.input[0].name], dev))]
    sess, _ = run_onnxruntime(model, inputs)
    for f, r in zip(out, sess.run(None, inputs)):
        assert_close(f, r, "GPU fused vs onnxruntime")


@pytest.mark.slow
def test_every_group_matches_its_unfused_subgraph(resnet50_path):
    from tvm_fusion.check.differential import check_groups

    report = check_groups(str(resnet50_path))
    assert report.ok, report.first_failure()
    assert len(report.groups) == sum(_cpu_counts().values())
    assert {g.rule for g in report.groups} == set(_cpu_counts())
    assert all(g.stats.max_rel < 1e-5 for g in report.groups)  # each group alone is near float32 rounding
