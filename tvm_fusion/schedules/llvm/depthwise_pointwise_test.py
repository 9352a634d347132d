"""The CPU depthwise -> pointwise schedule: its plan per ISA (a pure function of the sizes and the target's
vector facts), and the scheduled kernel against NumPy on AVX-512 and AVX2 code, the depthwise output kept
as a tile (never a whole tensor)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tvm_fusion._tvm import Schedule, te, tvm
from tvm_fusion.check.numerics import error_stats
from tvm_fusion.hardware import CpuFacts
from tvm_fusion.schedules.depthwise_pointwise import depthwise_pointwise
from tvm_fusion.schedules.llvm.depthwise_pointwise import dwpw_plan, schedule_dwpw_llvm

AVX512 = CpuFacts("avx512", 512, 32, 1)
AVX2 = CpuFacts("avx2", 256, 16, 1)


@pytest.mark.parametrize("facts,sizes,want", [
    (AVX512, (144, 24, 56, 56), (2, 4, 7)),  # MobileNetV2's 56x56 block: 112 pixels, 4 channels x 7 vectors
    (AVX512, (32, 16, 112, 112), (1, 4, 7)),
    (AVX2, (144, 24, 56, 56), (1, 2, 7)),  # 16 registers: 2 channels x 7 vectors
    (AVX512, (16, 23, 8, 16), (8, 1, 8)),  # 23 channels: no divisor but 1 fits
])
def test_plan_per_isa(facts, sizes, want):
    plan = dwpw_plan(*sizes, facts)
    assert (plan.rows, plan.channels, plan.pixel_vectors) == want


@pytest.mark.parametrize("facts", [AVX512, AVX2], ids=["avx512", "avx2"])
def test_no_plan_where_no_row_tile_is_whole_vectors(facts):
    assert "no tile of whole output rows of 7 columns" in dwpw_plan(960, 160, 7, 7, facts)
    assert "no tile of whole output rows of 14 columns" in dwpw_plan(384, 64, 14, 14, facts)


def _kernel(target, shape=(1, 16, 8, 16), o=16, k=3, stride=1, mult=1, residual=False):
    n, c, h, w = shape
    pad = k // 2
    hout, wout = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    x = te.placeholder(shape, "float32", name="x")
    wd, bd = te.placeholder((c * mult, 1, k, k), "float32"), te.placeholder((c * mult,), "float32")
    wp, bp = te.placeholder((o, c * mult), "float32"), te.placeholder((o,), "float32")
    r = te.placeholder((n, o, hout, wout), "float32") if residual else None
    attrs = dict(strides=(stride, stride), padding=(pad,) * 4, dw_activation="relu6", dw_activation_params={},
                 activation=None if residual else "relu", activation_params={})
    out = depthwise_pointwise(x, wd, bd, wp, bp, r, **attrs, target=target)
    args = [x, *([r] if residual else []), wd, bd, wp, bp, out]
    sch = Schedule(tvm.IRModule({"main": te.create_prim_func(args)}))
    with target:
        schedule_dwpw_llvm(sch, attrs, target)
    return sch.mod, [[int(d) for d in a.shape] for a in args], (k, stride, pad, mult, residual)


def _reference(vals, geometry):
    k, stride, pad, mult, residual = geometry
    x, *rest = vals
    skip = rest.pop(0) if residual else 0
    wd, bd, wp, bp = (v.astype(np.float64) for v in rest)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, d = x.shape[0], wd.shape[0]
    hout, wout = (xp.shape[2] - k) // stride + 1, (xp.shape[3] - k) // stride + 1
    dw = np.zeros((n, d, hout, wout))
    for a in range(k):
        for b in range(k):
            dw += xp[:, np.arange(d) // mult, a:a + stride * hout:stride, b:b + stride * wout:stride] * \
                wd[None, :, 0, a, b, None, None]
    dw = np.clip(dw + bd[None, :, None, None], 0, 6)
    y = np.einsum("nchw,oc->nohw", dw, wp) + bp[None, :, None, None]
    return y + skip if residual else np.maximum(y, 0)


@pytest.mark.parametrize("mcpu", ["native", "x86-64-v3"])
@pytest.mark.parametrize("case", [dict(), dict(k=5, stride=2, mult=2, shape=(2, 8, 16, 32)), dict(residual=True)],
                         ids=["3x3", "5x5-s2-m2-n2", "residual"])
def test_kernel_matches_numpy_and_keeps_the_depthwise_output_as_a_tile(mcpu, case):
    from tvm_fusion._tvm import cpu_target

    target = cpu_target(1) if mcpu == "native" else cpu_target(1, mcpu=mcpu)
    mod, shapes, geometry = _kernel(target, **case)
    script = mod.script()
    # the depthwise output computed inside the loop over row tiles, which also runs the 1x1 conv and the
    # epilogue: the padded input is the only other parallel loop nest
    tiles = [m.start() for m in re.finditer(r"T\.parallel\(", script)]
    assert len(tiles) == 2
    assert tiles[-1] < script.index('T.sblock("dw_act")') < script.index('T.sblock("pw_update")') < script.index(
        'T.sblock("epilogue")')
    rng = np.random.default_rng(0)
    vals = [rng.standard_normal(s).astype(np.float32) for s in shapes[:-1]]
    out = tvm.runtime.tensor(np.full(shapes[-1], np.nan, np.float32))
    tvm.compile(mod, target)["main"](*[tvm.runtime.tensor(v) for v in vals], out)
    stats = error_stats(out.numpy(), _reference(vals, geometry).astype(np.float32))
    assert stats.ok, stats.describe()
