"""The blocked convs (`conv2d_blocked`, `depthwise_blocked`): their tiles and reduction chunks per target, and
numerics against float64 numpy for every operand layout (x, residual and output NCHW or NCHW[x]c), kernel
size, stride, padding, activation and the chunked reduction, on the host target and on AVX2 (where the host
runs AVX2 code)."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_fusion import registry
from tvm_fusion._tvm import te, tvm
from tvm_fusion.hardware import cpu_facts
from tvm_fusion.schedules.llvm import conv2d_winograd as llvm_winograd
from tvm_fusion.schedules.conv2d_blocked import (BLOCKED_CONV, BLOCKED_DEPTHWISE, blocked_shape, from_blocked,
                                                 pack_blocked, pack_depthwise_blocked, to_blocked)
from tvm_fusion.schedules.llvm.conv2d_blocked import BLOCKED_ACCUMULATORS, MIN_TILE_COLS, reduction_chunk, tile_of
from tvm_fusion.schedules.llvm.conv2d_test import AVX2, NO_AVX2, TARGET, _build
from tvm_fusion.testing import RESNET50_CONVS, assert_close

AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2, "model": "l1d=48K,l2=2048K"})
AVX2_TARGET = tvm.target.Target(AVX2)


@pytest.mark.parametrize("target", [AVX512, AVX2_TARGET], ids=["avx512", "avx2"])
def test_tiles_fit_the_registers_and_divide_the_row(target):
    """Every ResNet-50 conv after its stem gets a tile: a divisor of its output width of MIN_TILE_COLS pixels
    or more, its accumulators within the ISA's budget; two channel blocks on AVX-512, and on AVX2 where the
    row has a divisor of 4-6 (56, 28), one block of 7 pixels on 14x14 and 7x7."""
    facts = cpu_facts(target)
    block = facts.float32_lanes
    for n, c, h, w, oc, k, stride, pad in RESNET50_CONVS[1:]:
        wout = (w + 2 * pad - k) // stride + 1
        blocks, cols = tile_of(oc // block, wout, facts)
        assert blocks == (2 if facts.isa == "avx512" or wout > 14 else 1), (oc, wout, blocks, cols)
        assert wout % cols == 0 and cols >= MIN_TILE_COLS, (oc, wout, blocks, cols)
        assert blocks * cols <= BLOCKED_ACCUMULATORS[facts.vector_registers]
    # a 13-wide row: one block of 13 pixels where 13 accumulators fit (AVX-512), else none
    assert tile_of(1000 // block, 13, facts) == ((1, 13) if facts.isa == "avx512" else None)
    assert tile_of(3, 7, facts) == (1, 7)


def test_reduction_chunks_follow_the_caches():
    """AVX-512 with 48 KiB L1d: the deep 14x14 / 7x7 convs chunk their reduction (accumulators in L1, panels
    over half of it); a 56x56 3x3 conv (accumulators past L1) and shallow 1x1 convs do not; AVX2 never does."""
    avx512, avx2 = cpu_facts(AVX512), cpu_facts(AVX2_TARGET)
    # a kernel row's chunk is 1 / CHUNK_L1_SHARE of L1: 8 KiB of 3 taps x 2 blocks of 16 floats per channel
    assert reduction_chunk(2, 16, 256, 3, 3, 14, 14, 7, avx512) == 16
    assert reduction_chunk(2, 16, 2048, 1, 1, 7, 7, 7, avx512) == 64
    assert reduction_chunk(2, 16, 64, 3, 3, 56, 56, 8, avx512) == 0
    assert reduction_chunk(2, 16, 64, 1, 1, 56, 56, 8, avx512) == 0
    assert reduction_chunk(2, 8, 256, 3, 3, 14, 14, 7, avx2) == 0


def test_pack_blocked_puts_a_tiles_blocks_innermost():
    w = np.arange(64 * 32 * 3 * 3, dtype="float32").reshape(64, 32, 3, 3)
    packed = pack_blocked(w, 16, 2)
    assert packed.shape == (2, 3, 1, 3, 32, 2, 16)
    for o, c, r, s in [(0, 0, 0, 0), (17, 5, 1, 2), (63, 31, 2, 2), (40, 7, 0, 1)]:
        assert packed[o // 32, r, 0, s, c, o // 16 % 2, o % 16] == w[o, c, r, s]


def test_pack_blocked_lays_each_chunk_out_in_one_run():
    """Chunks of 16 input channels: a tile's weights for one kernel row and chunk (all its columns) are one
    contiguous run, the runs in the order the chunked reduction reads them (kernel row, then chunk)."""
    w = np.arange(32 * 64 * 3 * 3, dtype="float32").reshape(32, 64, 3, 3)
    packed = pack_blocked(w, 16, 2, chunk=16)
    assert packed.shape == (1, 3, 4, 3, 16, 2, 16)
    for o, c, r, s in [(0, 0, 0, 0), (17, 5, 1, 2), (31, 63, 2, 2), (20, 40, 0, 1)]:
        assert packed[0, r, c // 16, s, c % 16, o // 16, o % 16] == w[o, c, r, s]


def test_pack_depthwise_blocked_puts_a_blocks_channels_innermost():
    w = np.arange(48 * 3 * 3, dtype="float32").reshape(48, 1, 3, 3)
    packed = pack_depthwise_blocked(w, 16)
    assert packed.shape == (3, 3, 3, 16)
    for c, r, s in [(0, 0, 0), (17, 1, 2), (47, 2, 2), (30, 0, 1)]:
        assert packed[c // 16, r, s, c % 16] == w[c, 0, r, s]


def _reference(x, wt, b, residual, stride, pad, activation, after, dilation=1):
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oc, cpg, k, _ = wt.shape
    span = dilation * (k - 1) + 1
    oh, ow = (xp.shape[2] - span) // stride + 1, (xp.shape[3] - span) // stride + 1
    out = np.zeros((x.shape[0], oc, oh, ow))
    for r in range(k):
        for s in range(k):
            r0, s0 = r * dilation, s * dilation
            patch = xp[:, :, r0:r0 + stride * (oh - 1) + 1:stride, s0:s0 + stride * (ow - 1) + 1:stride]
            if cpg == 1 and oc == x.shape[1] and oc > 1:  # depthwise
                out += patch * wt[None, :, 0, r, s, None, None].astype(np.float64)
            else:
                out += np.einsum("nchw,oc->nohw", patch, wt[:, :, r, s].astype(np.float64))
    out += b[None, :, None, None]
    act = {None: lambda v: v, "relu": lambda v: np.maximum(v, 0), "relu6": lambda v: np.clip(v, 0, 6)}[activation]
    if residual is not None and not after:
        out += residual
    out = act(out)
    if residual is not None and after:
        out += residual
    return out


#: (n, c, h, w, oc, k, stride, pad, x blocked, residual: None / "blocked" / "nchw", out blocked, activation,
#:  residual after the activation)
CASES = [
    (1, 64, 56, 56, 128, 1, 1, 0, True, "blocked", True, "relu", False),  # a chain's 1x1 with its residual
    (1, 32, 28, 28, 64, 3, 1, 1, False, None, True, "relu", False),  # a chain's first conv: NCHW in, padded
    (2, 32, 14, 14, 32, 3, 2, 1, True, "nchw", False, "relu6", False),  # strided, batch 2, a chain's end
    (1, 48, 7, 7, 48, 1, 1, 0, True, "blocked", True, None, True),  # odd blocks: one block per tile
    (1, 256, 14, 14, 64, 3, 1, 1, True, None, True, "relu", False),  # AVX-512: the chunked reduction
    (1, 1024, 7, 7, 64, 1, 1, 0, True, "blocked", False, "relu", False),  # chunked 1x1, unblocked output
    (1, 64, 8, 12, 32, 1, 2, 0, False, "nchw", True, "relu", False),  # a strided 1x1 reading NCHW
    (1, 16, 14, 14, 16, 3, 1, 1, True, None, True, "relu", False),  # AVX-512: one block in and out
]


def _case_id(case) -> str:
    n, c, h, w, oc, k, stride, pad, xb, res, ob, act, after = case
    return (f"{n}x{c}x{h}x{w}-{oc}-k{k}s{stride}p{pad}-x{'b' if xb else 'n'}-r{res or 'none'}-o{'b' if ob else 'n'}"
            f"-{act}{'-after' if after else ''}")


def _run_case(case, target, depthwise=False, dilation=1):
    n, c, h, w, oc, k, stride, pad, x_blocked, res, out_blocked, activation, after = case
    block = cpu_facts(target).float32_lanes
    rng = np.random.default_rng(7)
    x = rng.standard_normal((n, c, h, w)).astype("float32")
    cpg = 1 if depthwise else c
    wt = (rng.standard_normal((oc, cpg, k, k)) / np.sqrt(cpg * k * k)).astype("float32")
    b = rng.standard_normal(oc).astype("float32")
    span = dilation * (k - 1) + 1
    oh, ow = (h + 2 * pad - span) // stride + 1, (w + 2 * pad - span) // stride + 1
    residual = rng.standard_normal((n, oc, oh, ow)).astype("float32") if res else None
    attrs = dict(strides=(stride, stride), padding=(pad,) * 4, dilation=(dilation,) * 2, groups=c if depthwise else 1,
                 out_blocked=out_blocked, activation=activation, residual_after_activation=after)
    xs = to_blocked(x, block) if x_blocked else x
    compute = BLOCKED_DEPTHWISE if depthwise else BLOCKED_CONV
    sched = registry.get_schedule(compute, "llvm")
    wp, bias = sched.packed([wt, b], attrs, [xs.shape], target)
    rs = None if residual is None else (to_blocked(residual, block) if res == "blocked" else residual)
    operands = [xs, *([] if rs is None else [rs]), wp, bias]
    holders = [te.placeholder(a.shape, "float32", name=f"in{i}") for i, a in enumerate(operands)]
    xh, *rh, wh, bh = holders
    out = registry.get_compute(compute, "llvm")(xh, wh, bh, rh[0] if rh else None, **attrs, target=target)
    func = te.create_prim_func([*holders, out])
    out_shape = tuple(int(d) for d in out.shape)
    assert out_shape == (blocked_shape((n, oc, oh, ow), block) if out_blocked else (n, oc, oh, ow))
    got = tvm.runtime.tensor(np.full(out_shape, np.nan, "float32"))
    _build(func, sched.apply, attrs, target)["main"](*[tvm.runtime.tensor(a) for a in operands], got)
    got = from_blocked(got.numpy()) if out_blocked else got.numpy()
    assert_close(got, _reference(x, wt, b, residual, stride, pad, activation, after, dilation), "blocked conv",
                 "float32")


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_blocked_conv_matches_numpy(case):
    _run_case(case, TARGET)


@NO_AVX2
@pytest.mark.parametrize("case", CASES[:4], ids=_case_id)
def test_avx2_blocked_conv_matches_numpy(case):
    _run_case(case, AVX2_TARGET)


#: depthwise convs, as CASES (c == oc): MobileNetV2's inside a chain (stride 1 and 2, ReLU6), a 5x5, an
#: unpadded one, a chain's first (NCHW in) and last (NCHW out), a residual, rows of 7 and of 13
DEPTHWISE_CASES = [
    (1, 64, 14, 14, 64, 3, 1, 1, True, None, True, "relu6", False),
    (1, 96, 14, 14, 96, 3, 2, 1, True, None, True, "relu6", False),
    (2, 32, 28, 28, 32, 5, 1, 2, True, None, True, "relu", False),
    (1, 48, 9, 9, 48, 3, 1, 0, False, None, False, None, False),
    (1, 32, 7, 7, 32, 3, 1, 1, True, "blocked", True, "relu", True),
    (1, 16, 13, 13, 16, 3, 2, 1, False, "nchw", False, "relu6", False),
]


@pytest.mark.parametrize("case", DEPTHWISE_CASES, ids=_case_id)
def test_blocked_depthwise_conv_matches_numpy(case):
    _run_case(case, TARGET, depthwise=True)


@NO_AVX2
@pytest.mark.parametrize("case", DEPTHWISE_CASES[:4], ids=_case_id)
def test_avx2_blocked_depthwise_conv_matches_numpy(case):
    _run_case(case, AVX2_TARGET, depthwise=True)


@pytest.mark.parametrize("depthwise", [False, True], ids=["conv", "depthwise"])
def test_dilated_blocked_convs_match_numpy(depthwise):
    """Dilation 2 (a DeepLab-style conv inside a chain): the taps step over the padded input."""
    _run_case((1, 32, 20, 20, 32, 3, 1, 2, True, None, True, "relu", False), TARGET, depthwise, dilation=2)


@pytest.mark.parametrize("target", [AVX512, AVX2_TARGET], ids=["avx512", "avx2"])
@pytest.mark.parametrize("hw,k,stride", [(14, 3, 1), (7, 3, 1), (14, 3, 2), (28, 5, 1)])
def test_the_depthwise_taps_run_outside_the_tile(target, hw, k, stride):
    """The blocked depthwise conv's update: taps outermost, then the tile's pixels unrolled, then the block's
    channels as one vector; the tile divides the row (one vector accumulator per pixel)."""
    block = cpu_facts(target).float32_lanes
    c = 4 * block
    attrs = dict(strides=(stride, stride), padding=(k // 2,) * 4, dilation=(1, 1), groups=c, out_blocked=True,
                 activation="relu6")
    sched = registry.get_schedule(BLOCKED_DEPTHWISE, "llvm")
    xs = (1, c // block, hw, hw, block)
    wp, bias = sched.packed([np.zeros((c, 1, k, k), "float32"), np.zeros(c, "float32")], attrs, [xs], target)
    assert wp.shape == (c // block, k, k, block)
    holders = [te.placeholder(s, "float32", name=f"in{i}") for i, s in enumerate([xs, wp.shape, bias.shape])]
    out = registry.get_compute(BLOCKED_DEPTHWISE, "llvm")(*holders, None, **attrs, target=target)
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([*holders, out])}))
    with target:
        note = sched.apply(sch, attrs, target)
    assert note == f"depthwise NCHW{block}c chain (NCHW{block}c in, NCHW{block}c out)"
    loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock("conv_update"))]
    kinds = [int(loop.kind) for loop in loops]  # ForKind: 0 serial, 1 parallel, 2 vectorized, 3 unrolled
    assert kinds[0] == 1, kinds  # one task per channel block
    assert int(loops[-1].extent) == block and kinds[-1] == 2, loops[-1]
    wout = (hw + 2 * (k // 2) - k) // stride + 1
    _, cols = tile_of(1, wout, cpu_facts(target))
    assert [int(loop.extent) for loop in loops[-4:-1]] == [k, k, cols] and kinds[-4:-1] == [3, 3, 3], loops


#: (c, oc, k, hw): one input and output block on AVX-512, a 1x1, a chunked 3x3 and 1x1; AVX2 adds one block
SHAPES_BY_TARGET = [(AVX512, "avx512", [(16, 16, 3, 14), (64, 256, 1, 56), (256, 256, 3, 14), (2048, 512, 1, 7)]),
                    (AVX2_TARGET, "avx2", [(16, 16, 3, 14), (64, 256, 1, 56), (256, 256, 3, 14), (8, 16, 3, 8)])]


@pytest.mark.parametrize("target,c,oc,k,hw", [pytest.param(t, *shape, id=f"{name}-{'-'.join(map(str, shape))}")
                                              for t, name, shapes in SHAPES_BY_TARGET for shape in shapes])
def test_the_sums_run_outside_the_tile_and_its_channels_are_one_vector(target, c, oc, k, hw, monkeypatch):
    """Whatever loops a shape drops (one input block: no channel-block loop; one output block; a 1x1 conv:
    no tap loops; a chunked reduction), the tile's accumulators are innermost: the conv update's last loop
    is the block's channels, vectorized, and no sum runs inside the tile's pixels (a schedule that took a
    loop by position once ran a 3x3 16 -> 16 conv 5.7x slower, correct but scalar). The direct blocked
    kernel: the Winograd conv (which takes the 3x3 256 -> 256 on AVX-512) off."""
    monkeypatch.setattr(llvm_winograd, "WINOGRAD_ISAS", ())
    block = cpu_facts(target).float32_lanes
    attrs = dict(strides=(1, 1), padding=(k // 2,) * 4, dilation=(1, 1), groups=1, out_blocked=True,
                 activation="relu")
    sched = registry.get_schedule(BLOCKED_CONV, "llvm")
    xs = (1, c // block, hw, hw, block)
    wp, bias = sched.packed([np.zeros((oc, c, k, k), "float32"), np.zeros(oc, "float32")], attrs, [xs], target)
    holders = [te.placeholder(s, "float32", name=f"in{i}") for i, s in enumerate([xs, wp.shape, bias.shape])]
    out = registry.get_compute(BLOCKED_CONV, "llvm")(*holders, None, **attrs, target=target)
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([*holders, out])}))
    with target:
        sched.apply(sch, attrs, target)
    loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock("conv_update"))]
    kinds = [int(loop.kind) for loop in loops]  # ForKind: 0 serial, 1 parallel, 2 vectorized, 3 unrolled
    assert int(loops[-1].extent) == block and kinds[-1] == 2, loops[-1]
    first = next(i for i, kind in enumerate(kinds) if kind in (2, 3))  # the block's input channels, unrolled
    assert all(kind in (2, 3) for kind in kinds[first:]), kinds  # then the tile: no loop of sums inside it


from hypothesis import assume, given, strategies as st  # noqa: E402


@st.composite
def blocked_cases(draw):
    """A conv a chain may run blocked on the host target: whole channel blocks (1-4 in, 1-6 out; depthwise:
    the same), kernel 1, 3, 5 or 7, stride 1-2, dilation 1-2, padding 0 to 'same', x / residual / output in
    either layout, an activation, the residual before or after it, a batch of 1-2; a row the tile divides."""
    block = cpu_facts(TARGET).float32_lanes
    depthwise = draw(st.booleans())
    c = block * draw(st.integers(1, 4))
    oc = c if depthwise else block * draw(st.integers(1, 6))
    k = draw(st.sampled_from([1, 3, 3, 5, 7]))
    dilation = 1 if k == 1 else draw(st.sampled_from([1, 1, 2]))
    pad = draw(st.integers(0, dilation * (k // 2)))
    stride = draw(st.sampled_from([1, 1, 2]))
    h, w = draw(st.integers(dilation * (k - 1) + 1, 20)), draw(st.integers(dilation * (k - 1) + 1, 30))
    wout = (w + 2 * pad - dilation * (k - 1) - 1) // stride + 1
    assume(tile_of(1 if depthwise else oc // block, wout, cpu_facts(TARGET)) is not None)
    case = (draw(st.integers(1, 2)), c, h, w, oc, k, stride, pad, draw(st.booleans()),
            draw(st.sampled_from([None, "blocked", "nchw"])), draw(st.booleans()),
            draw(st.sampled_from([None, "relu", "relu6"])), draw(st.booleans()))
    return case, depthwise, dilation


@given(blocked_cases())
def test_drawn_blocked_convs_match_numpy(drawn):
    """Drawn shapes and options through both blocked kernels, against float64 numpy."""
    case, depthwise, dilation = drawn
    _run_case(case, TARGET, depthwise=depthwise, dilation=dilation)
