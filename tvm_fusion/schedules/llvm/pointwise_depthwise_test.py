"""The CPU pointwise -> depthwise schedule: its plan per ISA (a pure function of the sizes and the target's
vector facts), and the scheduled kernel against NumPy on AVX-512 and AVX2 code, the expanded tensor kept as
a block of one vector of channels inside the parallel loop (never a whole tensor)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tvm_fusion._tvm import Schedule, te, tvm
from tvm_fusion.check.numerics import error_stats
from tvm_fusion.check.verify import _runs_here
from tvm_fusion.hardware import CpuFacts
from tvm_fusion.schedules.llvm.pointwise_depthwise import (MAX_BLOCK_BYTES, pointwise_depthwise_llvm, pwdw_plan,
                                                           schedule_pwdw_llvm)

AVX512 = CpuFacts("avx512", 512, 32, 1)
AVX2 = CpuFacts("avx2", 256, 16, 1)


@pytest.mark.parametrize("facts,sizes,want", [
    # MobileNetV2's 16 -> 96 on 112x112, 3x3/2: 114 x 114 padded pixels in 2 x 6 tiles (114 columns), 16 lanes
    (AVX512, (96, 112, 112, (3, 3), (2, 2), (1, 1, 1, 1)), (114, 114, 16)),
    (AVX2, (96, 112, 112, (3, 3), (2, 2), (1, 1, 1, 1)), (114, 114, 8)),
    # 24 -> 144 on 56x56, 5x5/2 (EfficientNet): 60 x 60 padded pixels, whole tiles 60 x 60
    (AVX512, (144, 56, 56, (5, 5), (2, 2), (2, 2, 2, 2)), (60, 60, 16)),
    # 13 x 13: 15 x 15 padded pixels rounded up to whole tiles
    (AVX512, (32, 13, 13, (3, 3), (1, 1), (1, 1, 1, 1)), (16, 18, 16)),
])
def test_plan_per_isa(facts, sizes, want):
    plan = pwdw_plan(*sizes, facts)
    assert (plan.expand_rows, plan.expand_cols, plan.dw.tile.lanes) == want
    assert plan.dw.kernel == "depthwise_channels" and plan.dw.tile.oc_vectors == 1
    _, hin, win, (kh, kw), (sh, sw), (pt, pl, pb, pr) = sizes
    # the depthwise tile reads only the padded input: the expanded block is its input as it is
    assert (plan.dw.padding.rows - 1) * sh + kh <= hin + pt + pb
    assert (plan.dw.padding.cols - 1) * sw + kw <= win + pl + pr


@pytest.mark.parametrize("facts", [AVX512, AVX2], ids=["avx512", "avx2"])
def test_no_plan_for_partial_vectors_or_a_block_past_the_cache_bound(facts):
    assert "20 expanded channels, not whole vectors" in pwdw_plan(20, 16, 16, (3, 3), (2, 2), (1,) * 4, facts)
    lanes = facts.float32_lanes
    side = int((MAX_BLOCK_BYTES // (4 * lanes)) ** 0.5) + 8  # a block over the bound
    why = pwdw_plan(lanes, side, side, (3, 3), (2, 2), (1,) * 4, facts)
    assert isinstance(why, str) and f"more than the {MAX_BLOCK_BYTES // 1024} KiB it keeps in cache" in why


def _kernel(target, shape=(1, 8, 14, 14), d=32, k=3, stride=2):
    c = shape[1]
    pad = k // 2
    x = te.placeholder(shape, "float32", name="x")
    wp, bp = te.placeholder((c, d), "float32"), te.placeholder((d,), "float32")
    wd, bd = te.placeholder((d, 1, k, k), "float32"), te.placeholder((d,), "float32")
    attrs = dict(strides=(stride, stride), padding=(pad,) * 4, pw_activation="relu6", pw_activation_params={},
                 activation="relu", activation_params={})
    out = pointwise_depthwise_llvm(x, wp, bp, wd, bd, **attrs, target=target)
    args = [x, wp, bp, wd, bd, out]
    sch = Schedule(tvm.IRModule({"main": te.create_prim_func(args)}))
    with target:
        schedule_pwdw_llvm(sch, attrs, target)
    return sch.mod, [[int(v) for v in a.shape] for a in args], (k, stride, pad)


def _reference(vals, geometry):
    k, stride, pad = geometry
    x, wp, bp, wd, bd = (v.astype(np.float64) for v in vals)
    e = np.clip(np.einsum("nchw,cd->ndhw", x, wp) + bp[None, :, None, None], 0, 6)
    ep = np.pad(e, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    hout, wout = (ep.shape[2] - k) // stride + 1, (ep.shape[3] - k) // stride + 1
    y = np.zeros((x.shape[0], wd.shape[0], hout, wout))
    for a in range(k):
        for b in range(k):
            y += ep[:, :, a:a + stride * hout:stride, b:b + stride * wout:stride] * wd[None, :, 0, a, b, None, None]
    return np.maximum(y + bd[None, :, None, None], 0)


@pytest.mark.parametrize("mcpu", ["native", "x86-64-v3"])
@pytest.mark.parametrize("case", [dict(), dict(k=5, shape=(2, 8, 16, 16)), dict(stride=1, shape=(1, 8, 13, 11)),
                                  dict(shape=(1, 16, 7, 9), d=64)],
                         ids=["3x3-s2", "5x5-s2-n2", "3x3-s1-ragged", "odd-7x9"])
def test_kernel_matches_numpy_and_keeps_the_expanded_tensor_as_a_block(mcpu, case):
    from tvm_fusion._tvm import cpu_target

    target = cpu_target(1) if mcpu == "native" else cpu_target(1, mcpu=mcpu)
    if not _runs_here(target):
        pytest.skip(f"this host cannot run {mcpu} code")
    mod, shapes, geometry = _kernel(target, **case)
    script = mod.script()
    # the expanded block and the depthwise tiles inside the one loop over channel blocks: the padded input
    # is the only other parallel loop nest, and no expand stage is as large as the whole tensor
    tiles = [m.start() for m in re.finditer(r"T\.parallel\(", script)]
    assert len(tiles) == 2
    assert tiles[-1] < script.index('T.sblock("expand_update")') < script.index('T.sblock("expand_act")') < \
        script.index('T.sblock("conv_update")') < script.index('T.sblock("epilogue")')
    rng = np.random.default_rng(0)
    vals = [rng.standard_normal(s).astype(np.float32) for s in shapes[:-1]]
    out = tvm.runtime.tensor(np.full(shapes[-1], np.nan, np.float32))
    tvm.compile(mod, target)["main"](*[tvm.runtime.tensor(v) for v in vals], out)
    stats = error_stats(out.numpy(), _reference(vals, geometry).astype(np.float32))
    assert stats.ok, stats.describe()


@pytest.mark.parametrize("mcpu,c,declines", [
    # AVX-512 (16 lanes) fuses up to 64 input channels (MobileNetV2's 32 -> 192, EfficientNet's 40 -> 240)
    ("skylake-avx512", 32, False), ("skylake-avx512", 64, False), ("skylake-avx512", 96, True),
    # AVX2 (8 lanes) up to 24: 32 measured slower fused there
    ("x86-64-v3", 24, False), ("x86-64-v3", 32, True),
])
def test_expand_channel_bound_follows_the_target_lanes(mcpu, c, declines):
    """`supports` declines a 1x1 of more input channels than the target's measured bound, naming it."""
    from tvm_fusion._tvm import cpu_target
    from tvm_fusion.schedules.llvm.pointwise_depthwise import _supports, max_expand_channels

    target = cpu_target(1, mcpu=mcpu)
    attrs = dict(strides=(2, 2), padding=(1, 1, 1, 1))
    why = _supports(attrs, [(1, c, 28, 28), (c, 192), (192,), (192, 1, 3, 3), (192,)], target)
    lanes = 16 if mcpu == "skylake-avx512" else 8
    if declines:
        assert why and "input channels of the 1x1 conv than its target's bound" in why, why
        assert f"{lanes} float32 lanes (bound {max_expand_channels(lanes)})" in why
    else:
        assert why is None, why
