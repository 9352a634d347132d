"""CUDA conv2d schedule, without a GPU: launch limits over a shape grid (verify_gpu_code on the lowered
kernel), the schedule's numerics run serially on the CPU, nvcc accepting the source, and `supports`."""

from __future__ import annotations

import itertools
import shutil

import numpy as np
import pytest

from tvm_fusion._tvm import nvcc, tvm
from tvm_fusion.hardware import cuda_facts
from tvm_fusion.schedules.conv2d import conv2d_out_size
from tvm_fusion.schedules.cuda.conv2d import conv_shape, pick_tiles, schedule_conv2d_cuda, supports
from tvm_fusion.schedules.cuda.gpu_limits import SM90_LIMITS, check_gpu_limits
from tvm_fusion.testing import RESNET50_CONVS as RESNET50
from tvm_fusion.testing import assert_close, conv_primfunc

TARGET = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})




def schedule(func, attrs, sch_wrapper=lambda s: s):
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    with TARGET:
        schedule_conv2d_cuda(sch_wrapper(sch), attrs, TARGET)
    return sch.mod["main"]


CHANNELS = ((3, 7), (13, 13), (16, 32), (64, 64))
SPATIAL = ((7, 9), (17, 17), (1, 1), (30, 31))


def _grid():
    """Kernels 1/3/5/7 x strides 1/2 x groups 1/2/depthwise x padding and dilation; channels, batch and
    spatial sizes rotate through odd and small values."""
    combos = itertools.product((1, 3, 5, 7), (1, 2), ("1", "2", "dw"), (("sym", 1), ("asym", 1), ("sym", 2)))
    for i, (k, s, g, (pad, dil)) in enumerate(combos):
        c, oc = CHANNELS[i % len(CHANNELS)]
        groups = {"1": 1, "2": 2, "dw": c}[g]
        if c % groups or oc % groups:
            c, oc = 16, 32
        oc = c if g == "dw" else oc
        h, w = SPATIAL[i % len(SPATIAL)]
        p = (k // 2 * dil,) * 4 if pad == "sym" else (0, 1, k - 1, 0)
        if min(conv2d_out_size(h, k, s, p[0], p[2], dil), conv2d_out_size(w, k, s, p[1], p[3], dil)) < 1:
            h, w = 17, 17
        yield dict(n=(1, 4)[i % 2], c=c, h=h, w=w, oc=oc, k=k, stride=s, pad=p, dil=dil, groups=groups)


EXTREMES = [
    dict(n=1, c=256, h=32, w=32, oc=256, k=11, pad=5),  # large window: small rc chunks
    dict(n=1, c=512, h=40, w=40, oc=64, k=(1, 31), pad=(0, 15, 0, 15)),
    dict(n=2, c=8, h=200, w=200, oc=16, k=1, stride=16),  # strided patch
    dict(n=1, c=8, h=200, w=300, oc=16, k=3, stride=(9, 1), pad=1, dil=(4, 1)),
    dict(n=1, c=16, h=64, w=64, oc=16, k=3, pad=24, dil=24),
    dict(n=1, c=4, h=300, w=300, oc=4, k=51),  # the spatial tile shrinks to fit the window
    dict(n=1, c=96, h=27, w=27, oc=256, k=5, pad=2, groups=2),
    dict(n=1, c=128, h=28, w=28, oc=128, k=3, pad=1, groups=32),  # ResNeXt-style
    dict(n=1, c=32, h=112, w=112, oc=64, k=3, pad=1, groups=32),  # depthwise, multiplier 2
    dict(n=1, c=1, h=28, w=28, oc=20, k=5),
    dict(n=8, c=3, h=32, w=32, oc=1, k=3, pad=1),
    dict(n=1, c=2048, h=1, w=1, oc=1000, k=1),
]
CASES = [dict(zip(("n", "c", "h", "w", "oc", "k", "stride", "pad"), r)) for r in RESNET50] + list(_grid()) + EXTREMES


def _id(case):
    return "-".join(f"{k}{v}" for k, v in case.items()).replace(" ", "")


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_within_launch_limits(case):
    func, attrs, shapes = conv_primfunc(**case, residual=case["n"] == 4)
    assert supports(attrs, shapes, TARGET) is None
    check = check_gpu_limits(schedule(func, attrs), TARGET)
    assert check.ok, f"{case}: {check}"
    assert check.shared_bytes <= SM90_LIMITS["max_shared_memory_per_block"]
    s = conv_shape(attrs, shapes[0], shapes[-2])
    if not s.depthwise:  # the tile model the schedule sizes itself by is an upper bound of the real one
        tiles = pick_tiles(s, cuda_facts(TARGET))
        assert check.shared_bytes <= tiles.shared_bytes(s), (case, tiles)


class _Serial:
    """A schedule whose bind() is a no-op: the same loop nest, run as serial loops on the CPU."""

    def __init__(self, sch):
        self._sch = sch

    def bind(self, loop, thread):
        pass

    def __getattr__(self, name):
        return getattr(self._sch, name)


def _run_cpu(func, shapes, out_shape, seed=0):
    rng = np.random.default_rng(seed)
    args = [tvm.runtime.tensor(rng.standard_normal(s).astype("float32")) for s in shapes]
    out = tvm.runtime.tensor(np.full(out_shape, np.nan, "float32"))
    tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), "llvm")["main"](*args, out)
    return out.numpy()


NUMERIC = [
    dict(n=1, c=16, h=9, w=11, oc=24, k=3, stride=1, pad=1),
    dict(n=2, c=13, h=17, w=17, oc=7, k=5, stride=2, pad=(0, 1, 4, 0), dil=1),
    dict(n=1, c=17, h=15, w=15, oc=33, k=3, stride=1, pad=2, dil=2),  # non-divisible rc chunk and oc tile
    dict(n=1, c=3, h=40, w=40, oc=16, k=7, stride=2, pad=3),
    dict(n=1, c=64, h=7, w=7, oc=40, k=1),
    dict(n=4, c=16, h=7, w=9, oc=32, k=3, pad=1, groups=2),
    dict(n=1, c=64, h=14, w=14, oc=64, k=3, pad=1, groups=16),
    dict(n=1, c=13, h=17, w=17, oc=13, k=7, stride=2, pad=6, dil=2, groups=13),  # depthwise
    dict(n=1, c=8, h=12, w=12, oc=16, k=3, pad=1, groups=8),  # depthwise, multiplier 2
    dict(n=1, c=4, h=60, w=60, oc=4, k=21),  # shrunken spatial tile
]


@pytest.mark.parametrize("case", NUMERIC, ids=_id)
def test_schedule_keeps_the_numerics(case):
    """The scheduled loop nest (predicates, shared/local stages, inlined pad, epilogue placement) computes
    what the unscheduled compute does; only the thread bindings are left out."""
    func, attrs, shapes = conv_primfunc(**case, residual=True)
    out_shape = [int(d) for d in func.params[-1].shape]
    got = _run_cpu(schedule(func, attrs, _Serial), shapes, out_shape)
    want = _run_cpu(func, shapes, out_shape)
    assert not np.isnan(got).any(), "an output was never written"
    assert_close(got, want, f"{_id(case)} scheduled vs unscheduled")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_nvcc_compiles_the_kernels():
    funcs = {}
    for i, case in enumerate([RESNET50[0], RESNET50[2], RESNET50[-1]]):
        func, attrs, _ = conv_primfunc(*case, residual=i == 1)
        funcs[f"conv{i}"] = schedule(func, attrs)
    for name, case in (("grouped", EXTREMES[7]), ("depthwise", EXTREMES[8])):
        func, attrs, _ = conv_primfunc(**case)
        funcs[name] = schedule(func, attrs)
    mod = tvm.IRModule({k: f.with_attr("global_symbol", k) for k, f in funcs.items()})
    src = tvm.compile(mod, TARGET).mod.imports[0].inspect_source()  # the cuda module of the host module
    with TARGET:
        assert nvcc.compile_cuda(src, target_format="fatbin", arch="sm_90", compiler="nvcc")


def test_declines_a_window_no_tile_fits():
    func, attrs, shapes = conv_primfunc(n=1, c=4, h=300, w=300, oc=4, k=61, dil=4)
    why = supports(attrs, shapes, TARGET)
    assert why is not None and "shared memory" in why and "49152" in why


def test_operands_by_name_with_and_without_residual():
    """The schedule reads x and W by name from (x, [residual], W, b, out), whichever form the kernel has."""
    from tvm_fusion.schedules.conv2d import ConvOperands

    for residual in (False, True):
        func, _, shapes = conv_primfunc(1, 8, 10, 10, 16, 3, pad=1, residual=residual)
        params = ConvOperands.of(func.params[:-1])
        named = {"x": params.x, "w": params.w, "b": params.b, "residual": params.residual}
        assert {k: v.name if v is not None else None for k, v in named.items()} == \
            {"x": "x", "w": "w", "b": "b", "residual": "r" if residual else None}
        dims = ConvOperands.of(shapes)
        assert (dims.x, dims.w, dims.b) == ((1, 8, 10, 10), (16, 8, 3, 3), (16,))
    with pytest.raises(ValueError, match="a conv kernel takes x, \\[residual\\], W, b; got 2 operands"):
        ConvOperands.of([(1,), (2,)])
