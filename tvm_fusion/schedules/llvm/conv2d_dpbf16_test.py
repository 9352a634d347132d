"""The AVX512-BF16 conv (`conv2d_dpbf16`): when it takes a conv and why it declines, its packing, the dot
product instruction in every build for a target with `avx512bf16`, and where the host has it numerics against
float64 NumPy (bfloat16's tolerance) and a `--precision bf16` model against onnxruntime's float32 run."""

from __future__ import annotations


import ml_dtypes
import numpy as np
import pytest

from tvm_fusion import _tvm
from tvm_fusion._tvm import tirx, tvm
from tvm_fusion.cpu_features import added_features, host_features
from tvm_fusion.hardware import cpu_facts
from tvm_fusion.schedules.conv2d import CONV_FAMILY
from tvm_fusion.schedules.conv_pool import POOL_FAMILY
from tvm_fusion.schedules.llvm.conv2d_dpbf16 import DOT_BLOCK, choose_tile, pack_dpbf16, runs_dot_products, why_not
from tvm_fusion.schedules.llvm.pair_planes_test import CONV_CASES, bf16_conv, matches_float64, run_bf16_conv
from tvm_fusion.testing import assert_close

BF16 = ml_dtypes.bfloat16
#: a Zen 4 core as LLVM names it (avx512bf16 implied), an older AVX-512 core with it added (a VM's CPU), an
#: AVX-512 core without it, and an AMX core (the tiles take its convs)
ZEN4 = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2, "model": "l1d=32K,l2=1024K"})
ADDED = tvm.target.Target({"kind": "llvm", "mcpu": "icelake-server", "mattr": ["+avx512bf16"], "num-cores": 2})
NO_BF16 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})
AMX = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2})
HOST = _tvm.cpu_target()
HOST_RUNS_IT = cpu_facts(HOST).avx512_bf16 and not cpu_facts(HOST).amx_bf16
NEEDS_DOT = pytest.mark.skipif(not HOST_RUNS_IT, reason="this host's target has no AVX512-BF16 without AMX tiles")


def test_facts_and_the_host_target():
    assert cpu_facts(ZEN4).avx512_bf16 and cpu_facts(ADDED).avx512_bf16 and cpu_facts(AMX).avx512_bf16
    assert not cpu_facts(NO_BF16).avx512_bf16
    every = {"avx2", "avx512f", "avx512bw", "avx512bf16"}
    assert added_features({"avx512f", "avx512bw"}, every, "x86_64") == ["avx512bf16"]
    # LLVM's +avx512bf16 would turn AVX-512 on: a target named for AVX2 (or with AVX-512 hidden) stays AVX2
    assert added_features({"avx2"}, every, "x86_64") == []
    assert added_features({"avx2", "avx512f", "avx512bw"}, {"avx2", "avx512bf16"}, "x86_64") == []
    flags = "flags : fpu sse2 avx avx2 fma f16c avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16\n"
    target = _tvm.cpu_target(2, cpuinfo=flags, mcpu="icelake-server", caches={})
    assert "+avx512bf16" in set(target.attrs["mattr"]) and cpu_facts(target).avx512_bf16
    avx2 = _tvm.cpu_target(2, cpuinfo=flags, mcpu="x86-64-v3", caches={})
    assert not avx2.attrs.get("mattr") and cpu_facts(avx2).isa == "avx2" and not cpu_facts(avx2).avx512_bf16
    assert cpu_facts(HOST).avx512_bf16 == ("avx512bf16" in (host_features() or ()) and cpu_facts(HOST).isa == "avx512")


@pytest.mark.parametrize("args,reason", [
    (("float32", 1, 1, ZEN4), "takes bfloat16 products; this one is float32"),
    (("float16", 1, 1, ZEN4), "this one is float16"),
    (("bfloat16", 4, 1, ZEN4), "groups 1, not 4"),
    (("bfloat16", 1, tirx.Var("N", "int64"), ZEN4), "static batch"),
    (("bfloat16", 1, 1, NO_BF16), "no AVX512-BF16"),
    (("bfloat16", 1, 1, AMX), "AMX tiles"),
])
def test_declines_with_a_reason(args, reason):
    assert reason in why_not(*args)


def test_takes_bfloat16_convs_of_any_channel_count():
    for target in (ZEN4, ADDED):
        assert why_not("bfloat16", 1, 1, target) is None and why_not("bfloat16", 1, 2, target) is None


def test_pack_lays_out_channel_pairs_of_32_output_channels():
    w = (np.arange(40 * 5 * 3 * 2) % 251 - 125).astype(BF16).reshape(40, 5, 3, 2)
    packed = pack_dpbf16(w)
    assert packed.shape == (2, 3, 2, 3, 32) and packed.dtype == np.uint32  # 40 -> 64 outputs, 5 -> 6 inputs
    bits = w.view(np.uint16).astype(np.uint32)
    for o, c, r, s in [(0, 0, 0, 0), (17, 4, 1, 1), (39, 3, 2, 0), (33, 2, 0, 1)]:
        half = packed[o // 32, r, s, c // 2, o % 32] >> (16 * (c % 2)) & 0xFFFF
        assert half == bits[o, c, r, s]
    assert not packed[1, :, :, :, 8:].any() and not (packed[..., 2, :] >> 16).any()  # the padding is zeros


def test_tiles_fit_the_registers():
    for hout, plane_w in [(7, 9), (7, 7), (14, 16), (56, 58), (1, 1)]:
        tile = choose_tile(hout, plane_w)
        assert tile.oc * tile.vectors + tile.vectors <= 32 and 32 % tile.oc == 0


# (n, c, h, w, oc, k, stride, pad, dilation, residual, after): strides, padding, dilation, odd channel counts,
# output channels that are not whole tasks, a residual before and after the activation, a batch of two, a
# 3-channel 7x7/2 stem, a 1x1 strided conv
CASES = [
    *CONV_CASES,
    (1, 3, 30, 28, 64, 7, 2, 3, 1, False, False),
    (2, 5, 15, 17, 40, 3, 2, 0, 1, True, False),
    (1, 256, 7, 7, 40, 3, 1, 1, 1, False, False),
]


@pytest.mark.parametrize("target", [ZEN4, ADDED], ids=["znver4", "icelake+avx512bf16"])
def test_every_build_runs_the_dot_product_instruction(target):
    """Built (not run) for AVX512-BF16 targets wherever the tests run: the instruction in the machine code, W
    packed in pairs, the note saying so."""
    func, note, arrays, _, _ = bf16_conv(CASES[0], target)
    assert note == "AVX512-BF16 dot products" and runs_dot_products(func)
    assert arrays[1].shape == (2, 3, 3, 32, 32) and arrays[1].dtype == np.uint32
    lib = tvm.compile(tvm.IRModule({"main": func}), target)
    assert "vdpbf16ps" in lib.mod.inspect_source("asm")


def test_a_target_without_it_keeps_the_avx512_kernel():
    func, note, arrays, _, _ = bf16_conv(CASES[0], NO_BF16)
    assert DOT_BLOCK not in func.script() and arrays[1].dtype != np.uint32 and "BF16" not in (note or "")


@NEEDS_DOT
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "weight-stage"])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[1]}-{c[4]}-k{c[5]}s{c[6]}d{c[8]}" for c in CASES])
def test_dpbf16_conv_matches_float64(case, packed):
    """On this host's target: the conv + bias (+ residual) + ReLU within bfloat16's tolerance of float64 NumPy
    over the bfloat16 inputs; W packed at compile time, or left unpacked (the `weight` stage)."""
    matches_float64(case, HOST, packed, "AVX512-BF16 dot products")


#: this host's CPU with AVX512-BF16 turned off: the AVX-512 bfloat16 kernel (float32 FMAs), runnable here
HOST_WITHOUT_DOT = tvm.target.Target({**HOST.export(), "mattr": [*HOST.attrs.get("mattr", []), "-avx512bf16"]})


def _within_one_ulp(case):
    note, dots = run_bf16_conv(case, HOST)
    plain_note, plain = run_bf16_conv(case, HOST_WITHOUT_DOT)
    assert note == "AVX512-BF16 dot products" and "BF16" not in (plain_note or "")
    ulp = np.maximum(np.abs(dots), np.abs(plain)) * 2.0 ** -7
    assert (np.abs(dots - plain) <= ulp).all(), (case, np.abs(dots - plain).max())


@NEEDS_DOT
@pytest.mark.parametrize("case", CASES[::2], ids=[f"{c[1]}-{c[4]}-k{c[5]}s{c[6]}" for c in CASES[::2]])
def test_dpbf16_conv_within_one_ulp_of_the_avx512_kernel(case):
    """The dot-product conv and the AVX-512 bfloat16 kernel both sum exact bfloat16 products in float32 and
    round once: they differ by the summation order alone, at most one bfloat16 ulp per element."""
    _within_one_ulp(case)


from hypothesis import given, strategies as st  # noqa: E402


@st.composite
def dot_cases(draw):
    """A bfloat16 conv: 1-70 input and output channels, kernel 1-7, stride 1-3, dilation 1-2, padding 0 to
    'same', a residual (before or after the activation) or not, a batch of 1-2."""
    k = draw(st.integers(1, 7))
    dil = draw(st.sampled_from([1, 1, 2]))
    pad = draw(st.integers(0, dil * (k // 2)))
    h = draw(st.integers(dil * (k - 1) + 1, 20))
    w = draw(st.integers(dil * (k - 1) + 1, 24))
    return (draw(st.integers(1, 2)), draw(st.integers(1, 70)), h, w, draw(st.integers(1, 70)), k,
            draw(st.integers(1, 3)), pad, dil, draw(st.booleans()), draw(st.booleans()))


@NEEDS_DOT
@given(dot_cases())
def test_drawn_dpbf16_convs_within_one_ulp_of_the_avx512_kernel(case):
    _within_one_ulp(case)


@NEEDS_DOT
@pytest.mark.parametrize("pool", [None, "MaxPool"])
def test_bf16_model_runs_its_convs_on_dot_products_and_matches_the_float32_model(pool):
    """`--precision bf16` of a 3-channel stem and a ResNet basic block (32 channels), with a 2x2/2 max pool
    after the stem or not (the conv -> pool group keeps its pool after the dot-product conv): every conv on
    AVX512-BF16; the outputs within bfloat16's tolerance of onnxruntime's float32 model."""
    from tvm_fusion.build.builder import build
    from tvm_fusion.build.mixed_precision import convert
    from tvm_fusion.check.compare import random_inputs, run_onnxruntime
    from tvm_fusion.frontend.importer import import_onnx
    from tvm_fusion.testing import GraphBuilder, run_build

    g = GraphBuilder(5)
    x = g.input("x", [1, 3, 20, 20])
    stem = g.op("Relu", [g.bn(g.conv(x, 3, 32), 32)])
    if pool:
        stem = g.op(pool, [stem], kernel_shape=[2, 2], strides=[2, 2])
    y = g.op("Relu", [g.bn(g.conv(stem, 32, 32), 32)])
    y = g.bn(g.conv(y, 32, 32), 32)
    y = g.op("Relu", [g.op("Add", [y, stem])])
    model = g.model([y, g.op("Relu", [g.conv(x, 3, 16, k=1)])])
    built = build(convert(import_onnx(model), "bf16"), HOST, "fused")
    kernels = [grp.kernel for grp in built.fused.groups if grp.compute in (CONV_FAMILY, POOL_FAMILY)]
    assert kernels.count("AVX512-BF16 dot products") == 4 == len(kernels), kernels
    inputs = random_inputs(model)
    got = run_build(built, [inputs["x"]])
    want = run_onnxruntime(model, inputs)[0].run(None, inputs)
    for i, (a, r) in enumerate(zip(got, want)):
        assert_close(a, r, f"bf16 block output {i} vs the float32 model", dtype="bfloat16")
