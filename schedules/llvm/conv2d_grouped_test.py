"""Grouped 1x1 convs as GEMMs over pixel vectors (conv2d_grouped): the plan per target, numerics against
numpy, bit-identical to the tiled kernel it replaces, and an AVX-512 build (compiled only)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tvm_fusion._tvm import tvm
from tvm_fusion.hardware import cpu_facts
from tvm_fusion.schedules.llvm import conv2d_grouped
from tvm_fusion.schedules.llvm.conv2d_pointwise import PixelTile
from tvm_fusion.schedules.llvm.conv2d import conv_plan
from tvm_fusion.schedules.llvm.conv2d_test import AVX2, NO_AVX2, TARGET, _packed_build, _run

LOCAL_ACCUMULATORS = re.compile(r'conv\w* = T.sblock_alloc_buffer\([^\n]*scope="local"')
AVX512 = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}
#: ShuffleNet's grouped 1x1 convs on 28x28 and 56x56 (34 channels per group: tiles of 4 span groups), odd
#: channels and a batch of 2, and pixels that are not whole vectors
SHUFFLENET = [dict(n=1, c=136, h=28, w=28, oc=136, k=1, groups=4), dict(n=1, c=24, h=56, w=56, oc=112, k=1, groups=4),
              dict(n=1, c=112, h=28, w=28, oc=112, k=1, groups=4), dict(n=2, c=30, h=4, w=8, oc=45, k=1, groups=3),
              dict(n=1, c=24, h=7, w=9, oc=36, k=1, groups=3)]  # 63 pixels: padded to 64, x copied


def _id(case):
    return "{c}-{oc}g{groups}_{h}x{w}_n{n}".format(**case)


def target_lanes(target) -> int:
    return cpu_facts(target).float32_lanes


def _plan(case, spec):
    facts = cpu_facts(tvm.target.Target(spec))
    return conv_plan(case["n"], case["oc"], case["h"], case["w"], case["c"] // case["groups"], 1, 1, case["groups"],
                     facts, pixels=True)


def test_plans_per_target():
    """AVX2: 4 channels x 2 vectors of 8 pixels (16 registers: accumulators and their input vectors); AVX-512
    fits twice the accumulators in 32 zmm; the tiled kernel where its channels pad no more than the pixels."""
    plan = _plan(SHUFFLENET[0], AVX2)
    assert plan.kernel == "pixels" and plan.tile == PixelTile(4, 2, 8)
    assert plan.padding.group_channels == 136, "136 channels are whole tiles of 4"
    wide = _plan(SHUFFLENET[0], AVX512)
    assert wide.kernel == "pixels" and wide.tile.lanes == 16 and 2 * wide.tile.accumulators <= 32
    stage2 = _plan(dict(n=1, c=272, h=14, w=14, oc=272, k=1, groups=4), AVX2)
    assert stage2.kernel == "pixels" and stage2.padding.cols == 208, "196 pixels pad less than 68 channels"
    assert stage2.tile == PixelTile(4, 2, 8)
    assert _plan(dict(n=1, c=544, h=7, w=7, oc=544, k=1, groups=4), AVX2).kernel == "tiled", "136 channels"
    assert _plan(dict(n=1, c=256, h=13, w=13, oc=256, k=1, groups=2), AVX2).kernel == "tiled", "AlexNet-like"
    assert not conv2d_grouped.grouped_pointwise(3, 3, (1, 1), (1, 1, 1, 1), 4, 34)
    assert not conv2d_grouped.grouped_pointwise(1, 1, (1, 1), (0, 0, 0, 0), 34, 1), "depthwise"


@pytest.mark.parametrize("target_name", ["host", pytest.param("avx2", marks=NO_AVX2)])
@pytest.mark.parametrize("case", SHUFFLENET, ids=_id)
def test_matches_numpy_and_the_tiled_kernel_bit_for_bit(case, target_name, monkeypatch):
    """Against float64 numpy (the numerics table), and equal bit for bit to the tiled kernel (the same
    left-to-right sum over each group's channels)."""
    target = TARGET if target_name == "host" else tvm.target.Target(AVX2)
    executable, func, arrays, out_shape, reference = _packed_build(case, target)
    if _plan(case, target).kernel != "pixels":
        pytest.skip("this target's vectors do not divide the pixels")
    assert LOCAL_ACCUMULATORS.search(func.script()) and arrays[1].ndim == 4, "accumulators in registers, W unpacked"
    assert ('T.sblock("pad' in func.script()) == (case["h"] * case["w"] % target_lanes(target) != 0)
    got = _run(executable, arrays, out_shape)
    from tvm_fusion.testing import assert_close

    assert_close(got, reference, _id(case))
    monkeypatch.setattr(conv2d_grouped, "choose_group_tile", lambda *_: None)
    tiled, _, tiled_arrays, *_ = _packed_build(case, target)
    np.testing.assert_array_equal(got, _run(tiled, tiled_arrays, out_shape))


def test_avx512_build_compiles():
    """The AVX-512 plan builds (compiled only: this host may not run it) and uses zmm vectors."""
    executable, func, *_ = _packed_build(SHUFFLENET[0], tvm.target.Target(AVX512))
    assert LOCAL_ACCUMULATORS.search(func.script())
    assert "zmm" in executable.mod.inspect_source("asm")


@pytest.mark.parametrize("hw", [8, 7], ids=["whole-vectors", "padded-pixels"])
def test_symbolic_batch_and_residual_through_the_fused_build(hw):
    """A grouped 1x1 conv + BN + residual add + ReLU with a symbolic batch, through the whole fused build (the
    llvm compute under the host target): batches 1 and 3 of one build against onnxruntime, element-wise."""
    from tvm_fusion._tvm import relax
    from tvm_fusion.build import build
    from tvm_fusion.compare import run_onnxruntime
    from tvm_fusion.frontend import SymDim, import_onnx
    from tvm_fusion.testing import GraphBuilder, assert_close

    g = GraphBuilder(seed=5)
    x = g.input("x", ["N", 36, hw, hw])
    y = g.bn(g.conv(x, 36, 36, k=1, pads=[0, 0, 0, 0], groups=3), 36)  # 12 channels per group
    model = g.model([g.op("Relu", [g.op("Add", [y, x])])])
    built = build(import_onnx(model, {"x": (SymDim("N", 4), 36, hw, hw)}), "llvm", "fused")
    assert sum(built.counts.values()) == 1, built.counts
    vm = relax.VirtualMachine(built.executable, tvm.cpu())
    sess, _ = run_onnxruntime(model, {}, optimize=False)
    for n in (1, 3):
        xs = np.random.default_rng(n).standard_normal((n, 36, hw, hw)).astype("float32")
        assert_close(vm["main"](tvm.runtime.tensor(xs)).numpy(), sess.run(None, {"x": xs})[0], f"batch {n}")


@pytest.mark.parametrize("case", [SHUFFLENET[0], SHUFFLENET[-1]], ids=_id)
def test_float16_widens_to_float32(case):
    """float16 x and W: the products summed in float32, the output rounded once (the float16 tolerance)."""
    from tvm_fusion.schedules.llvm.conv2d import schedule_conv2d_llvm
    from tvm_fusion.schedules.llvm.conv2d_test import _schedule, conv_reference
    from tvm_fusion.testing import assert_close, conv_primfunc

    func, attrs, shapes = conv_primfunc(**case, target=TARGET, dtype="float16")
    scheduled = _schedule(func, schedule_conv2d_llvm, attrs)
    assert LOCAL_ACCUMULATORS.search(scheduled.script())
    rng = np.random.default_rng(0)
    x, w = (rng.standard_normal(s).astype("float16") for s in shapes[:2])
    b = rng.standard_normal(shapes[2]).astype("float32")
    out = tvm.runtime.tensor(np.zeros([int(d) for d in func.params[-1].shape], "float16"))
    tvm.compile(tvm.IRModule({"main": scheduled}), TARGET)["main"](*[tvm.runtime.tensor(a) for a in (x, w, b)], out)
    want = conv_reference(x.astype("float32"), w.astype("float32"), b, None, attrs).astype("float16")
    assert_close(out.numpy(), want, "float16 " + _id(case))
