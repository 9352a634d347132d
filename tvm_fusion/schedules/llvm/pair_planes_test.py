"""The pair planes the bfloat16 dot-product convs share (`pair_planes`): their geometry, the pack's contents
against NumPy, and the tasks' split. (The kernels' numerics: conv2d_amx_test.py, conv2d_dpbf16_test.py.)"""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest

from tvm_fusion import registry
from tvm_fusion._tvm import te, tvm
from tvm_fusion.schedules.conv2d import CONV_FAMILY
from tvm_fusion.schedules.llvm.conv2d_test import conv_reference
from tvm_fusion.schedules.llvm.pair_planes import Tasks, pack_stage, planes, schedule_pack
from tvm_fusion.testing import assert_close

BF16 = ml_dtypes.bfloat16
MIB = 1024 * 1024


def test_tasks_split_rows_for_threads_and_for_l2():
    """Two tasks per thread where the channels give fewer; rows whose sums (32 channels) outgrow a quarter of
    L2 split further: VGG's 224x224 convs into 13 parts of 18 rows with 2 MiB of L2, 25 of 9 with 1 MiB; the
    blocks of pixels cover a task's rows."""
    t = Tasks(1, 2, 56, 58, 2, 2 * MIB, 32)
    assert (t.parts, t.rows, t.count, t.pixels) == (2, 28, 4, 28 * 58 + 8)
    t = Tasks(1, 8, 14, 16, 2, 2 * MIB, 48)
    assert (t.parts, t.rows, t.count, t.blocks, t.pixels) == (1, 14, 8, 5, 240)
    assert (Tasks(1, 2, 224, 226, 2, 2 * MIB, 32).parts, Tasks(1, 2, 224, 226, 2, MIB, 32).parts) == (13, 25)
    for t in (Tasks(1, 2, 224, 226, 2, 2 * MIB, 32), Tasks(2, 1, 7, 9, 16, 2 * MIB, 32)):
        assert t.rows * (t.parts - 1) < (224 if t.rows > 7 else 7) <= t.rows * t.parts
    t = Tasks(2, 3, 10, 12, 2, 2 * MIB, 32)
    seen = {t.of(task) for task in range(t.count)}
    assert len(seen) == t.count and {(i, o) for i, o, _ in seen} == {(i, o) for i in range(2) for o in range(3)}


@pytest.mark.parametrize("case", [
    # (c, h, w, k, stride, pad, dilation, fold)
    (5, 9, 11, 3, 1, 1, 1, False),
    (4, 12, 10, 3, 2, 1, 1, False),
    (6, 11, 11, 3, 2, 0, 2, False),
    (3, 15, 13, 7, 2, 3, 1, True),
])
def test_pack_holds_each_taps_pixels_in_one_run(case):
    """Built and run on any host: for every tap, channel pair and output pixel, the pack's uint32 at the tap's
    run holds the two channels' bfloat16 bits of the input pixel the tap reads (zeros in the padding and past
    the last channel)."""
    c, h, w, k, s, p, d, fold = case
    x = np.random.default_rng(7).standard_normal((1, c, h, w)).astype(BF16)
    geo = planes(x.shape, k, k, (s, s), (p,) * 4, (d, d), fold, 32)
    pairs = -(-(c * k if fold else c) // 2)
    xs = te.placeholder(x.shape, "bfloat16", name="x")
    pack = pack_stage(xs, geo, pairs, k, (s, s), (p,) * 4, (d, d), fold)
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([xs, pack])}))
    schedule_pack(sch)
    lib = tvm.compile(sch.mod, "llvm")
    out = tvm.runtime.tensor(np.zeros([int(d) for d in pack.shape], np.uint32))
    lib["main"](tvm.runtime.tensor(x), out)
    flat = out.numpy().reshape(1, geo.phases, pairs, -1)
    bits = np.pad(x.view(np.uint16), [(0, 0), (0, 2 * pairs), (p, p + 2 * s), (p, p + 2 * s)])
    for t in range(k * geo.taps_w):
        ph, run = geo.tap(t, (s, s), (d, d))
        for oh in range(geo.hout):
            for ow in range(geo.wout):
                got = flat[0, ph, :, oh * geo.plane_w + ow + run]
                r, col = t // geo.taps_w, t % geo.taps_w
                if fold:  # product j of the row: column j // c, channel j % c
                    want = [bits[0, j % c, oh * s + r * d, ow * s + j // c * d] if j < c * k else 0
                            for j in range(2 * pairs)]
                else:
                    want = list(bits[0, :2 * pairs, oh * s + r * d, ow * s + col * d])
                assert list(got & 0xFFFF) == list(want[0::2]) and list(got >> 16) == list(want[1::2]), (t, oh, ow)


# the conv cases the AMX and AVX512-BF16 tests share: (n, c, h, w, oc, k, stride, pad, dilation, residual,
# after): strides, padding, dilation, channels that are not whole tiles, a residual before and after the
# activation, a batch of two
CONV_CASES = [
    (1, 64, 14, 14, 64, 3, 1, 1, 1, False, False),
    (1, 32, 15, 13, 48, 3, 2, 1, 1, False, False),
    (2, 40, 9, 9, 24, 1, 1, 0, 1, True, False),
    (1, 16, 12, 10, 32, 5, 1, 2, 2, True, True),
    (1, 33, 16, 16, 80, 1, 2, 0, 1, False, False),
]


def bf16_conv(case, target, packed=True):
    """(scheduled PrimFunc, its note, its arguments, output shape, (x, W, b, residual, attrs)) of a bfloat16
    conv + bias (+ residual) + ReLU through the llvm conv family for `target`. `case`: (n, c, h, w, oc, k,
    stride, pad, dilation, residual, after); W packed as the build packs it, or left [O, C, KH, KW]."""
    n, c, h, w, oc, k, stride, pad, dil, res, after = case
    kh, kw = k if isinstance(k, tuple) else (k, k)
    rng = np.random.default_rng(zlib.crc32(repr(case[:9]).encode()))
    x = rng.standard_normal((n, c, h, w)).astype(BF16)
    wt = (rng.standard_normal((oc, c, kh, kw)) / np.sqrt(c * kh * kw)).astype(BF16)
    b = rng.standard_normal(oc).astype("float32")
    attrs = {"strides": (stride, stride), "padding": (pad,) * 4, "dilation": (dil, dil), "groups": 1,
             "activation": "relu", "residual_after_activation": after}
    oh = (h + 2 * pad - dil * (kh - 1) - 1) // stride + 1
    ow = (w + 2 * pad - dil * (kw - 1) - 1) // stride + 1
    residual = rng.standard_normal((n, oc, oh, ow)).astype(BF16) if res else None
    wv = registry.get_schedule(CONV_FAMILY, "llvm").packed([wt, b], attrs, [x.shape, wt.shape, b.shape], target)[0] \
        if packed else wt
    xs = te.placeholder(x.shape, "bfloat16", name="x")
    ws = te.placeholder(wv.shape, str(wv.dtype), name="w")  # uint32 pairs too
    bs = te.placeholder(b.shape, "float32", name="b")
    rs = [te.placeholder(residual.shape, "bfloat16", name="r")] if res else []
    out = registry.get_compute(CONV_FAMILY, "llvm")(xs, ws, bs, *rs, target=target, fast_math=False, **attrs)
    func = te.create_prim_func([xs, *rs, ws, bs, out])
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    with target:
        note = registry.get_schedule(CONV_FAMILY, "llvm").apply(sch, attrs, target)
    arrays = [x, *([residual] if res else []), wv, b]
    func = sch.mod["main"].with_attr("global_symbol", "main")
    return func, note, arrays, (n, oc, oh, ow), (x, wt, b, residual, attrs)


def run_bf16_conv(case, target):
    """(note, output as float64) of `bf16_conv` built and run for `target`."""
    func, note, arrays, out_shape, _ = bf16_conv(case, target)
    lib = tvm.compile(tvm.IRModule({"main": func}), target)
    out = tvm.runtime.tensor(np.full(out_shape, np.nan, BF16))
    lib["main"](*[tvm.runtime.tensor(a) for a in arrays], out)
    return note, out.numpy().astype(np.float64)


def matches_float64(case, target, packed, note):
    """`bf16_conv` built and run for `target` (its kernel's note `note`) within bfloat16's tolerance of float64
    NumPy over the bfloat16 inputs."""
    func, got_note, arrays, out_shape, (x, wt, b, residual, attrs) = bf16_conv(case, target, packed)
    assert got_note == note
    lib = tvm.compile(tvm.IRModule({"main": func}), target)
    out = tvm.runtime.tensor(np.full(out_shape, np.nan, BF16))
    lib["main"](*[tvm.runtime.tensor(a) for a in arrays], out)
    f64 = lambda a: None if a is None else a.astype(np.float64)  # noqa: E731
    if attrs["residual_after_activation"]:
        want = conv_reference(f64(x), f64(wt), f64(b), None, attrs) + f64(residual)
    else:
        want = conv_reference(f64(x), f64(wt), f64(b), f64(residual), attrs)
    assert_close(out.numpy().astype(np.float64), want, f"{note} conv {case}", dtype="bfloat16")
