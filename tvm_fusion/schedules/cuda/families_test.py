"""Every rule family builds for CUDA (sm_90) without a GPU: scheduled kernels within the launch limits,
and the generated source compiles with nvcc."""

import numpy as np
import pytest

from tvm_fusion._tvm import prim_dtype, tvm
from tvm_fusion.build.builder import build, resolve_target
from tvm_fusion.build.cuda_compiler import compile_cuda_source, cuda_source
from tvm_fusion.frontend.importer import import_onnx
from tvm_fusion.schedules.cuda.gpu_limits import check_gpu_limits
from tvm_fusion.testing import GELU_OPSET, GraphBuilder, apply_activation_onnx, check_cuda_build


def _layer_norm_model():
    g = GraphBuilder(0)
    x, r = g.input("x", [2, 9, 768]), g.input("r", [2, 9, 768])
    ln = g.op("LayerNormalization", [g.op("Add", [x, r]), g.const(np.ones(768, np.float32)),
                                      g.const(np.zeros(768, np.float32))], axis=-1, epsilon=1e-5)
    return g.model([ln], opset=18), {"add_layer_norm": 1}


def _ffn_model():
    g = GraphBuilder(1)
    x = g.input("x", [2, 9, 64])
    w = g.const(g.rng.normal(0, 0.1, (64, 256)).astype(np.float32))
    b = g.const(g.rng.normal(0, 0.1, 256).astype(np.float32))
    y = apply_activation_onnx(g, g.op("Add", [g.op("MatMul", [x, w]), b]), "erf-decomposed")
    return g.model([y], opset=GELU_OPSET), {"dense_bias_gelu_erf": 1}


def _chain_model():
    g = GraphBuilder(2)
    a, b = g.input("a", [4, 32, 17]), g.input("b", [1, 32, 1])
    y = g.op("Exp", [g.op("Tanh", [g.op("Mul", [g.op("Add", [a, b]), b])])])
    return g.model([y, g.op("Relu", [g.op("Add", [a, a])])]), {"elementwise_chain_4": 1, "add_relu": 1}


def _conv_act_model():
    g = GraphBuilder(3)
    x = g.input("x", [1, 16, 20, 20])
    y = apply_activation_onnx(g, g.bn(g.conv(x, 16, 32, stride=2), 32), "HardSwish")
    y = apply_activation_onnx(g, g.conv(y, 32, 32, groups=32), "x*Sigmoid")
    return g.model([y]), {"conv2d_bn_hardswish": 1, "conv2d_bias_silu": 1}


def _conv_act_add_model():
    """YOLO's bottleneck: x + silu(conv(x)), the residual added after the activation in the epilogue."""
    g = GraphBuilder(8)
    x = g.input("x", [1, 32, 20, 20])
    y = apply_activation_onnx(g, g.conv(x, 32, 32), "x*Sigmoid")
    return g.model([g.op("Add", [x, y])]), {"conv2d_silu_add": 1}


def _squeeze_excite_model():
    from tvm_fusion.patterns.se_test import se_block

    g = GraphBuilder(4)
    x = g.input("x", [2, 96, 14, 14])
    return g.model([se_block(g, x, 96, 24, act="x*Sigmoid", gate="Sigmoid")], opset=18), {
        "squeeze_excite_silu_sigmoid": 1}


def _attention_model():
    from tvm_fusion.patterns.attention_test import attention_block

    g = GraphBuilder(6)
    return g.model([attention_block(g, shape=(2, 12, 128, 64))], opset=17), {"attention": 1}


@pytest.mark.parametrize("make", [_layer_norm_model, _ffn_model, _chain_model, _conv_act_model,
                                  _conv_act_add_model, _squeeze_excite_model, _attention_model],
                         ids=["layer_norm", "ffn_gelu", "elementwise", "conv_activations", "conv_act_add",
                              "squeeze_excite", "attention"])
def test_family_builds_for_cuda(make):
    model, expect = make()
    check_cuda_build(model, expect=expect)


ARCHS = ["sm_80", "sm_89", "sm_90", "sm_100"]


@pytest.mark.parametrize("arch", ARCHS)
def test_each_arch_builds_within_its_limits(arch):
    """`--arch` reaches the schedules: a small fused model builds for the arch, every kernel passes
    verify_gpu_code against that arch's limits (hardware.cuda_facts), and nvcc compiles it for the arch."""
    from tvm_fusion.hardware import cuda_facts
    from tvm_fusion.testing import residual_block

    target = resolve_target("cuda", arch)
    facts = cuda_facts(target)
    assert facts.known and facts.arch == arch
    built = build(import_onnx(residual_block(c=64, hw=(14, 14))), target, "fused")
    assert {k: v for k, v in built.counts.items() if v} == {"conv2d_bn_add_relu": 1, "conv2d_bn_relu": 1}
    checked = 0
    for gv, func in built.fused.mod.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc):
            check = check_gpu_limits(func, target, facts.gpu_limits())
            assert check.ok and check.shared_bytes <= facts.shared_static_bytes, f"{arch} {gv.name_hint}: {check}"
            checked += 1
    assert checked == 2
    assert compile_cuda_source(cuda_source(built.executable), arch)[:4] == b"\x50\xed\x55\xba"


def test_squeeze_excite_over_a_large_map_declines_on_cuda_only():
    """One block per sample: a 112x112x32 map (EfficientNet-B0's first SE) is left to the unfused kernels on
    CUDA, with the reason; the CPU schedule takes it."""
    from tvm_fusion.fusion.fuse import fuse
    from tvm_fusion.fusion.loader import load_rules_for
    from tvm_fusion.patterns.se_test import se_block

    g = GraphBuilder(5)
    x = g.input("x", [1, 32, 112, 112])
    mod = import_onnx(g.model([se_block(g, x, 32, 8, act="x*Sigmoid", gate="Sigmoid")], opset=18))
    rules = load_rules_for()
    cuda = fuse(mod, resolve_target("cuda"), rules)
    assert cuda.counts["squeeze_excite_silu_sigmoid"] == 0
    reasons = [d.reason for d in cuda.decisions if d.rule == "squeeze_excite_silu_sigmoid"]
    assert reasons == ["the CUDA squeeze-excite kernel runs one thread block per sample; C*H*W = 401408 is over "
                       "65536, where the unfused ops spread over the GPU"]
    assert fuse(mod, resolve_target("llvm"), rules).counts["squeeze_excite_silu_sigmoid"] == 1


def test_attention_over_too_many_keys_declines_on_cuda_only():
    """A row of 5000 keys (3 x 20 KB of scores in shared memory) does not fit the CUDA kernel; the CPU takes it."""
    from tvm_fusion.fusion.fuse import fuse
    from tvm_fusion.fusion.loader import load_rules_for
    from tvm_fusion.patterns.attention_test import attention_block

    g = GraphBuilder(7)
    mod = import_onnx(g.model([attention_block(g, shape=(1, 1, 2, 8), keys=5000, mask=None)], opset=17))
    rules = load_rules_for()
    cuda = fuse(mod, resolve_target("cuda"), rules)
    assert cuda.counts["attention"] == 0
    assert [d.reason for d in cuda.decisions if d.rule == "attention"] == [
        "the CUDA attention kernel keeps a row of 5000 keys in shared memory; at most 4096 fit in the 48 KB static "
        "limit"]
    assert fuse(mod, resolve_target("llvm"), rules).counts["attention"] == 1


def test_squeeze_excite_declines_more_channels_than_a_block_has_threads():
    """The launch limit comes from the target (hardware.cuda_facts): 1280 channels need 1280 threads."""
    from tvm_fusion.registry import get_schedule
    from tvm_fusion.schedules import load
    from tvm_fusion.schedules.squeeze_excite import SE_FAMILY

    load()
    target = resolve_target("cuda")
    sched = get_schedule(SE_FAMILY, "cuda")
    shapes = [(1, 1280, 7, 7), (320, 1280), (320,), (1280, 320), (1280,)]
    assert sched.why_not({}, shapes, target) == ("the CUDA squeeze-excite kernel gives each of the 1280 channels a "
                                                 "thread of one block; a block has at most 1024")
    assert sched.why_not({}, [(1, 960, 7, 7), (240, 960), (240,), (960, 240), (960,)], target) is None


def test_gpu_limits_bind_a_symbolic_batch_of_an_int64_kernel():
    """TVM's legalized kernels (a Pad the leftover schedules take) index with int64 and carry an int64 buffer
    offset: at_batch binds their N as well (specialize refused an int32 size: "expected an independent Var,
    but got T.int64(0)")."""
    from tvm_fusion.frontend.importer import SymDim
    from tvm_fusion.schedules.cuda.gpu_limits import at_batch

    g = GraphBuilder(3)
    x = g.input("x", ["N", 4, 6, 6])
    model = g.model([g.op("Pad", [g.op("Relu", [x]), g.const(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))])],
                    opset=18)
    target = resolve_target("cuda")
    built = build(import_onnx(model, {"x": (SymDim("N", 64), 4, 6, 6)}), target, "fused")
    kernels = [f for f in built.fused.mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    pads = [f for f in kernels if any(prim_dtype(d) == "int64" for p in f.params for d in p.shape
                                      if isinstance(d, tvm.tirx.Var))]
    assert pads, [f.params for f in kernels]
    for func in pads:
        assert all(isinstance(d, tvm.tirx.IntImm) for p in at_batch(func, 2).params for d in p.shape)
        assert check_gpu_limits(func, target).ok
