"""The AMX conv (`conv2d_amx`): when it takes a conv and why it declines, its packing, the host target's AMX
features, the kernel's tile instructions in every build, and where the host has AMX tiles numerics against
float64 NumPy (bfloat16's tolerance), against the AVX-512 bfloat16 kernel (one ulp; drawn shapes too) and
whole models against onnxruntime's float32 run."""

from __future__ import annotations


import ml_dtypes
import numpy as np
import pytest

from tvm_fusion import _tvm
from tvm_fusion._tvm import tirx, tvm
from tvm_fusion.cpu_features import added_features, host_features
from tvm_fusion.hardware import cpu_facts
from tvm_fusion.schedules.conv2d import CONV_FAMILY
from tvm_fusion.schedules.llvm.conv2d_amx import MIN_CHANNELS, folds, pack_amx, why_not
from tvm_fusion.schedules.llvm.pair_planes_test import CONV_CASES, bf16_conv, matches_float64, run_bf16_conv
from tvm_fusion.testing import assert_close

BF16 = ml_dtypes.bfloat16
#: an AMX server core as LLVM names it, and the same core named as an older one with AMX added (a VM's CPU)
SAPPHIRE = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2, "model": "l1d=48K,l2=2048K"})
ADDED = tvm.target.Target({"kind": "llvm", "mcpu": "rocketlake", "mattr": ["+amx-bf16", "+amx-tile"], "num-cores": 2})
NO_AMX = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})
HOST = _tvm.cpu_target()
HOST_HAS_AMX = {"amx-tile", "amx-bf16"} <= set(host_features() or ())
NEEDS_AMX = pytest.mark.skipif(not HOST_HAS_AMX, reason="this host has no AMX tiles to run the kernel on")


def test_facts_say_amx_only_with_both_features():
    assert cpu_facts(SAPPHIRE).amx_bf16 and cpu_facts(ADDED).amx_bf16
    assert not cpu_facts(NO_AMX).amx_bf16
    only_tile = tvm.target.Target({"kind": "llvm", "mcpu": "rocketlake", "mattr": ["+amx-tile"]})
    assert not cpu_facts(only_tile).amx_bf16


def test_the_host_target_adds_amx_the_cpu_name_lacks():
    """A guest LLVM calls `rocketlake` that has AMX gets +amx-tile, +amx-bf16; a name that implies them gets
    nothing added; a host without them gets nothing."""
    amx = {"amx-tile", "amx-bf16", "avx512f"}
    assert added_features({"avx512f"}, amx, "x86_64") == ["amx-bf16", "amx-tile"]
    assert added_features({"avx512f", "amx-tile", "amx-bf16"}, amx, "x86_64") == []
    assert added_features({"avx512f"}, {"avx512f"}, "x86_64") == []
    assert added_features(set(), {"amx-tile", "amx-bf16"}, "aarch64") == []
    flags = "flags : fpu sse2 avx avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl amx_tile amx_bf16\n"
    target = _tvm.cpu_target(2, cpuinfo=flags, mcpu="rocketlake", caches={})
    assert {"+amx-tile", "+amx-bf16"} <= set(target.attrs["mattr"]) and cpu_facts(target).amx_bf16
    target = _tvm.cpu_target(2, cpuinfo=flags.replace(" amx_tile amx_bf16", ""), mcpu="rocketlake", caches={})
    assert not any(str(f).startswith("+") for f in target.attrs.get("mattr", [])) and not cpu_facts(target).amx_bf16
    assert cpu_facts(HOST).amx_bf16 == HOST_HAS_AMX


@pytest.mark.parametrize("args,reason", [
    (("float32", 1, 64, 3, 1, SAPPHIRE), "take bfloat16 products; this one is float32"),
    (("float16", 1, 64, 3, 1, SAPPHIRE), "this one is float16"),
    (("bfloat16", 2, 64, 3, 1, SAPPHIRE), "groups 1, not 2"),
    (("bfloat16", 1, 3, 1, 1, SAPPHIRE), "3 input channels of a 1-wide kernel would fill 3 of a tile row's 32"),
    (("bfloat16", 1, 64, 3, tirx.Var("N", "int64"), SAPPHIRE), "static batch"),
    (("bfloat16", 1, 64, 3, 1, NO_AMX), "no AMX bfloat16 tiles"),
    (("bfloat16", 1, 64, 3, 1, tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids",
                                                  "mtriple": "x86_64-pc-windows-msvc"})), "the Linux way"),
])
def test_declines_with_a_reason(args, reason):
    assert reason in why_not(*args)


def test_takes_bfloat16_convs_on_amx_targets():
    """Convs of 16 input channels or more, and convs with fewer whose kernel rows fold into the products."""
    assert why_not("bfloat16", 1, MIN_CHANNELS, 1, 1, SAPPHIRE) is None
    assert why_not("bfloat16", 1, 512, 3, 2, ADDED) is None
    assert why_not("bfloat16", 1, 3, 7, 1, SAPPHIRE) is None and folds(3, 7) and folds(8, 3)
    assert not folds(3, 1) and not folds(32, 3)


def test_pack_amx_lays_out_one_tile_per_tap_and_channel_chunk():
    w = np.arange(48 * 40 * 3 * 2, dtype="float32").reshape(48, 40, 3, 2)
    packed = pack_amx(w)
    assert packed.shape == (4, 3, 2, 2, 16, 32)  # 48 -> 64 output channels, 40 -> 64 input channels
    for o, c, r, s in [(0, 0, 0, 0), (17, 5, 1, 1), (47, 39, 2, 0), (33, 32, 0, 1)]:
        assert packed[o // 16, r, s, c // 32, o % 16, c % 32] == w[o, c, r, s]
    assert not packed[3].any() and not packed[:, :, :, 1, :, 8:].any()  # the padding is zeros


# (n, c, h, w, oc, k, stride, pad, dilation, residual, after): strides, padding, dilation, channels that are
# not whole tiles, a residual before and after the activation, a batch of two; the last three fold their
# kernel rows into the products (fewer than 32 channels: a 3-channel 7x7/2 stem, 3x3/2 unpadded, dilated)
CASES = [
    *CONV_CASES,
    (1, 64, 7, 7, 96, 7, 2, 3, 1, False, False),
    (1, 3, 30, 28, 64, 7, 2, 3, 1, False, False),
    (2, 3, 15, 17, 40, 3, 2, 0, 1, True, False),
    (1, 8, 12, 12, 16, 3, 1, 2, 2, False, False),
]


@pytest.mark.parametrize("target", [SAPPHIRE, ADDED], ids=["sapphirerapids", "rocketlake+amx"])
def test_every_amx_build_runs_tile_instructions(target):
    """Built (not run) for AMX targets wherever the tests run: one tile multiply per tile pair, the OS asked
    for the tile registers, W packed in tiles, the note saying so."""
    func, note, arrays, _, _ = bf16_conv(CASES[0], target)
    script = func.script()
    assert note == "AMX bfloat16 tiles"
    assert script.count("llvm.x86.tdpbf16ps") == 4 and "llvm.x86.ldtilecfg" in script
    assert '"syscall"' in script and "llvm.x86.tilerelease" in script
    assert arrays[1].shape == (4, 3, 3, 2, 16, 32)
    tvm.compile(tvm.IRModule({"main": func}), target)


def test_a_target_without_amx_keeps_the_avx512_kernel():
    func, note, arrays, _, _ = bf16_conv(CASES[0], NO_AMX)
    assert "tdpbf16ps" not in func.script() and arrays[1].ndim == 5 and "AMX" not in (note or "")


@NEEDS_AMX
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "weight-stage"])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[1]}-{c[4]}-k{c[5]}s{c[6]}d{c[8]}" for c in CASES])
def test_amx_conv_matches_float64(case, packed):
    """On this host's target (AMX tiles): the conv + bias (+ residual) + ReLU within bfloat16's tolerance of
    float64 NumPy over the bfloat16 inputs; W packed at compile time, or left unpacked (the `weight` stage)."""
    matches_float64(case, HOST, packed, "AMX bfloat16 tiles")


@NEEDS_AMX
def test_bf16_model_runs_its_convs_on_tiles_and_matches_the_float32_model():
    """`--precision bf16` of a ResNet basic block (32 channels) and a 3-channel stem before it: every conv on
    AMX tiles (the stem's kernel rows folded into the products), a 1x1 conv of 3 channels on the AVX-512
    kernel; the output within bfloat16's tolerance of onnxruntime's float32 model."""
    from tvm_fusion.build.builder import build
    from tvm_fusion.build.mixed_precision import convert
    from tvm_fusion.check.compare import random_inputs, run_onnxruntime
    from tvm_fusion.frontend.importer import import_onnx
    from tvm_fusion.testing import GraphBuilder, run_build

    g = GraphBuilder(5)
    x = g.input("x", [1, 3, 20, 20])
    stem = g.op("Relu", [g.bn(g.conv(x, 3, 32), 32)])
    y = g.op("Relu", [g.bn(g.conv(stem, 32, 32), 32)])
    y = g.bn(g.conv(y, 32, 32), 32)
    y = g.op("Relu", [g.op("Add", [y, stem])])
    model = g.model([y, g.op("Relu", [g.conv(x, 3, 16, k=1)])])
    built = build(convert(import_onnx(model), "bf16"), HOST, "fused")  # the host's own target, AMX and all
    kernels = sorted(grp.kernel for grp in built.fused.groups if grp.compute == CONV_FAMILY)
    assert kernels.count("AMX bfloat16 tiles") == 3 and len(kernels) == 4, kernels
    inputs = random_inputs(model)
    got = run_build(built, [inputs["x"]])
    want = run_onnxruntime(model, inputs)[0].run(None, inputs)
    for i, (a, r) in enumerate(zip(got, want)):
        assert_close(a, r, f"bf16 residual block output {i} vs the float32 model", dtype="bfloat16")


@NEEDS_AMX
@pytest.mark.parametrize("pool", ["MaxPool", "AveragePool"])
def test_bf16_conv_pool_group_runs_the_conv_on_tiles(pool):
    """A conv -> ReLU -> 2x2/2 pool (VGG's blocks), `--precision bf16`: the cross-layer group keeps its pool,
    computed after the AMX conv in the same kernel; within bfloat16's tolerance of the float32 model."""
    from tvm_fusion.build.builder import build
    from tvm_fusion.build.mixed_precision import convert
    from tvm_fusion.check.compare import random_inputs, run_onnxruntime
    from tvm_fusion.frontend.importer import import_onnx
    from tvm_fusion.testing import GraphBuilder, run_build

    g = GraphBuilder(7)
    x = g.input("x", [1, 16, 24, 24])
    y = g.op("Relu", [g.conv(x, 16, 32)])
    model = g.model([g.op(pool, [y], kernel_shape=[2, 2], strides=[2, 2])])
    built = build(convert(import_onnx(model), "bf16"), HOST, "fused")
    (group,) = [grp for grp in built.fused.groups if grp.rule.endswith("_pool")]
    assert group.kernel == "AMX bfloat16 tiles", (group.rule, group.kernel)
    inputs = random_inputs(model)
    (got,) = run_build(built, [inputs["x"]])
    (want,) = run_onnxruntime(model, inputs)[0].run(None, inputs)
    assert_close(got, want, f"bf16 conv -> {pool} vs the float32 model", dtype="bfloat16")


def test_explain_at_bf16_names_the_tiles_for_an_amx_target():
    """`explain --precision bf16` for an AMX target (built, not run: any host) says which groups run on tiles;
    the same model at float32 does not."""
    from tvm_fusion.check.explain import explain
    from tvm_fusion.testing import conv_bn_relu

    model = conv_bn_relu(cin=16, cout=32, hw=(14, 14))
    assert "kernel: AMX bfloat16 tiles" in str(explain(model, SAPPHIRE, precision="bf16"))
    assert "AMX" not in str(explain(model, SAPPHIRE))


#: this host's CPU without its AMX features: the AVX-512 bfloat16 kernels, runnable here
HOST_WITHOUT_AMX = tvm.target.Target({k: v for k, v in HOST.export().items() if k != "mattr"})


@NEEDS_AMX
@pytest.mark.parametrize("case", CASES[::2], ids=[f"{c[1]}-{c[4]}-k{c[5]}s{c[6]}" for c in CASES[::2]])
def test_amx_conv_within_one_ulp_of_the_avx512_kernel(case):
    """The AMX conv and the AVX-512 bfloat16 kernel both sum bfloat16 products in float32 and round once: they
    differ by the summation order alone, at most one bfloat16 ulp per element (a far tighter check than the
    dtype's tolerance against float64)."""
    note, tiles = run_bf16_conv(case, HOST)
    plain_note, plain = run_bf16_conv(case, HOST_WITHOUT_AMX)
    assert note == "AMX bfloat16 tiles" and "AMX" not in (plain_note or "")
    ulp = np.maximum(np.abs(tiles), np.abs(plain)) * 2.0 ** -7
    assert (np.abs(tiles - plain) <= ulp).all(), np.abs(tiles - plain).max()


from hypothesis import given, strategies as st  # noqa: E402


@st.composite
def amx_cases(draw):
    """A bfloat16 conv AMX takes: 1-70 input channels (fewer than 16 with a kernel over 1 wide: folded), 1-70
    output channels, kernel 1-7 (rectangular too), stride 1-3, dilation 1-2, padding 0 to 'same', a residual
    or not, a batch of 1-2."""
    kh, kw = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    c = draw(st.integers(16 if kw == 1 else 1, 70))
    dil = draw(st.sampled_from([1, 1, 2]))
    stride = draw(st.integers(1, 3))
    pad = draw(st.integers(0, dil * (max(kh, kw) // 2)))
    h = draw(st.integers(dil * (kh - 1) + 1, 20))
    w = draw(st.integers(dil * (kw - 1) + 1, 24))
    return (draw(st.integers(1, 2)), c, h, w, draw(st.integers(1, 70)), (kh, kw), stride, pad, dil,
            draw(st.booleans()), draw(st.booleans()))


@NEEDS_AMX
@given(amx_cases())
def test_drawn_amx_convs_within_one_ulp_of_the_avx512_kernel(case):
    """Drawn shapes through the AMX conv (packed or folded) and the AVX-512 bfloat16 kernel: one ulp apart."""
    note, tiles = run_bf16_conv(case, HOST)
    _, plain = run_bf16_conv(case, HOST_WITHOUT_AMX)
    assert note == "AMX bfloat16 tiles"
    assert (np.abs(tiles - plain) <= np.maximum(np.abs(tiles), np.abs(plain)) * 2.0 ** -7).all(), \
        (case, np.abs(tiles - plain).max())
