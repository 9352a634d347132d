"""CPU (llvm) conv2d and dense schedules: the tile choice on ResNet-50, and numerics against numpy over a
grid of kernels, strides, paddings, dilations, groups, odd channel counts, batches and small images."""

from __future__ import annotations

import itertools
from dataclasses import replace
import re

import numpy as np
import pytest

from tvm_fusion._tvm import te, tvm
from tvm_fusion.build.builder import resolve_target
from tvm_fusion.check.verify import _runs_here  # whether this host runs a target's code
from tvm_fusion.cpu_features import host_features
from tvm_fusion.schedules.conv2d import conv2d_out_size, pack_channel_blocks
from tvm_fusion.schedules.dense import dense_affine
from tvm_fusion.hardware import cpu_facts
from tvm_fusion.schedules.llvm.conv2d import (COPY_CHANNELS, FLAT_COPY_CHANNELS, FLOAT_BYTES, STRIDED_NCHW_CHANNELS,
                                              STRIDED_NCHW_MACS, TILED_STEP_COSTS, ConvTile, channel_depthwise,
                                              channels_last_input, choose_tile, column_epilogue, conv2d_llvm,
                                              conv_plan, flat_pixels, flat_taps, max_accumulators, one_row_pixels,
                                              pack_conv, packs_taps_first, plan_of, schedule_conv2d_llvm,
                                              shared_tap_accumulators, step_cost, subsampled_pixels,
                                              tiled_accumulators)
from tvm_fusion.schedules.llvm import conv2d_winograd as llvm_winograd
from tvm_fusion.schedules.llvm.blocks import ceil_to
from tvm_fusion.schedules.conv2d import ConvPadding
from tvm_fusion.schedules.llvm.conv2d_pointwise import grouped_pointwise
from tvm_fusion.schedules.llvm.dense import schedule_dense_llvm
from tvm_fusion.testing import RESNET50_CONVS as RESNET50
from tvm_fusion.testing import assert_close, conv_primfunc

TARGET = resolve_target("llvm")  # the host, or TVM_FUSION_CPU
FACTS = cpu_facts(TARGET)
LANES = FACTS.float32_lanes
AVX2 = {"kind": "llvm", "mcpu": "x86-64-v3", "num-cores": 2}



#: the host, and AVX-512 / AVX2 targets forced whatever the host is (only their facts are read: nothing runs)
TILE_TARGETS = {"host": TARGET, "avx512": tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2}),
                "avx2": tvm.target.Target(AVX2)}


@pytest.mark.parametrize("target", TILE_TARGETS.values(), ids=TILE_TARGETS.keys())
@pytest.mark.parametrize("n,c,h,w,oc,k,stride,pad", RESNET50)
def test_resnet50_tiles_fill_registers_cache_and_cores(n, c, h, w, oc, k, stride, pad, target):
    """On every target: the tile fits the register file, its channels divide the layer's, its rows and
    columns waste at most one seventh of the output in padding (AVX2's 2-column tile on 7 columns pads to
    8; 5 columns on 14 pad to 15), its panel fits the cache and both cores get work."""
    facts = cpu_facts(target)
    oh = ow = conv2d_out_size(h, k, stride, pad, pad, 1)
    reduction = c * k * k
    tile = choose_tile(oc, oh, ow, reduction, n, threads=2, facts=facts)
    assert tile is not None
    assert tile.lanes == facts.float32_lanes
    assert tile.accumulators <= tiled_accumulators(facts, tile.oc_vectors) < facts.vector_registers
    assert oc % tile.channels == 0
    padded = -(-oh // tile.rows) * tile.rows * -(-ow // tile.cols) * tile.cols
    assert padded * 7 <= oh * ow * 8, (tile, padded, oh * ow)
    assert tile.oc_vectors == 1 or reduction * tile.channels * FLOAT_BYTES <= step_cost(facts).panel_bytes
    assert oc // tile.channels >= 2, "both cores get an oc block"
    assert tile.accumulators >= 7, "enough independent FMA chains to hide the FMA latency"


#: (oc vectors, rows, cols) of each RESNET50 conv on 2 threads for an AVX-512 target (16 lanes, 32 zmm; at
#: most two channel vectors, panels up to AVX512_PANEL_BYTES): the tiles measured on an Intel AVX-512 core,
#: fixed so that asking the target cannot change them
AVX512_RESNET50_TILES = [(2, 1, 14)] * 18 + [(2, 1, 7)] * 5


#: the same on AVX2 (8 lanes, 16 ymm, TILED_STEP_COSTS["avx2"]: a load takes a whole FMA slot, 10 chains,
#: accumulators up to 16 - the weight vectors - 2 broadcasts): 2 channel vectors x 6 columns on 56x56 and
#: 28x28 (columns padded to 60 and 30), 2 x 5 on 14x14 (padded to 15), 8 accumulators on 7x7 (padded to 8);
#: measured on an AVX2-only Zen 2 with W packed taps first, 3x3 on 56x56 and 14x14 ran at 92-93 GFLOPS (65-70
#: with 4 x 2)
AVX2_RESNET50_TILES = [(2, 1, 6)] * 12 + [(2, 1, 5)] * 6 + [(2, 1, 4), (4, 1, 2), (4, 1, 2), (4, 1, 2), (2, 1, 4)]


@pytest.mark.parametrize("spec,lanes,accumulators", [
    ({"kind": "llvm", "mcpu": "znver4"}, 16, 28),
    ({"kind": "llvm", "mcpu": "znver4", "mattr": ["-avx512f"]}, 8, 13),
    ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}, 4, 28),
])
def test_tiles_follow_the_target(spec, lanes, accumulators):
    facts = cpu_facts(tvm.target.Target(spec))
    assert (facts.float32_lanes, tiled_accumulators(facts, 1)) == (lanes, accumulators)
    tiles = []
    for n, c, h, w, oc, k, stride, pad in RESNET50:
        oh = conv2d_out_size(h, k, stride, pad, pad, 1)
        tile = choose_tile(oc, oh, oh, c * k * k, n, threads=2, facts=facts)
        assert tile.lanes == lanes and tile.accumulators <= accumulators
        tiles.append((tile.oc_vectors, tile.rows, tile.cols))
    if lanes == 16:
        assert tiles == AVX512_RESNET50_TILES
    if lanes == 8:
        assert tiles == AVX2_RESNET50_TILES


@pytest.mark.parametrize("cout", [LANES - 1, LANES + LANES // 2, 1000])
def test_channels_not_a_multiple_of_a_vector_are_padded_to_the_tile(cout):
    plan = conv_plan(1, cout, 13, 13, 512, 1, 1, 1, FACTS)
    assert plan.kernel == "tiled" and plan.tile.lanes == LANES
    assert plan.padding.group_channels == -(-cout // plan.tile.channels) * plan.tile.channels
    assert plan.padding.group_channels - cout < plan.tile.channels


def test_avx2_squeezenet_classifier_gets_a_full_tile():
    """1000 classes x 13 x 13: an AVX2 tile may hold 16 - 1 weight vector - 2 broadcasts = 13 accumulators,
    so one vector of channels x 13 columns covers a whole row (no padded columns; the issue's 17 of 35 ms,
    then 4 x 2 columns padded to 14). Depthwise tiles and AVX-512 keep their budgets."""
    facts = cpu_facts(tvm.target.Target(AVX2))
    plan = conv_plan(1, 1000, 13, 13, 512, 1, 1, 1, facts)
    assert (plan.tile.lanes, plan.tile.oc_vectors, plan.tile.cols) == (8, 1, 13)
    assert (plan.padding.rows, plan.padding.cols, plan.padding.group_channels) == (13, 13, 1000)
    assert (tiled_accumulators(facts, 1), tiled_accumulators(facts, 2), tiled_accumulators(facts, 4)) == (13, 12, 10)
    assert max_accumulators(facts) == 12
    avx512 = cpu_facts(tvm.target.Target({"kind": "llvm", "mcpu": "znver4"}))
    assert tiled_accumulators(avx512, 1) == max_accumulators(avx512) == 28, "AVX-512 budget unchanged"


def test_avx2_pointwise_convs_tile_their_pixels_as_one_row():
    """AVX2: a 1x1, stride-1, unpadded conv plans its pixels as one row when that row's tile has more real
    outputs per FMA slot (a tile may end on the next image row): 7x7 outputs take 2 x 5 pixels (49 padded
    to 50) instead of 4 x 2 with 7 columns padded to 8. Not when a row tile divides the image, nor for other
    convs, nor on AVX-512 (its plans unchanged). Under FLAT_COPY_CHANNELS output channels x is read in place."""
    avx2, avx512 = (cpu_facts(tvm.target.Target(s)) for s in (AVX2, {"kind": "llvm", "mcpu": "znver4"}))
    pointwise = dict(kh=1, kw=1, strides=(1, 1), padding=(0, 0, 0, 0), groups=1)
    assert flat_pixels(**pointwise, facts=avx2) and not flat_pixels(**pointwise, facts=avx512)
    assert not flat_pixels(**{**pointwise, "strides": (2, 2)}, facts=avx2)
    assert not flat_pixels(**{**pointwise, "padding": (1, 1, 1, 1)}, facts=avx2)
    assert not flat_pixels(**{**pointwise, "kh": 3, "kw": 3}, facts=avx2)
    late = conv_plan(1, 512, 7, 7, 2048, 1, 1, 1, avx2, flat=True)
    assert late.flat and (late.tile.oc_vectors, late.tile.cols) == (2, 5)
    assert (late.padding.rows, late.padding.cols) == (1, 50)
    assert not late.in_place, "512 output channels: x copied channels-last"
    # under FLAT_COPY_CHANNELS and a multiple of the tile's channels (channels it would pad: `pointwise`)
    assert conv_plan(1, FLAT_COPY_CHANNELS - 16, 14, 14, 576, 1, 1, 1, avx2, flat=True).in_place
    assert not conv_plan(1, 512, 7, 7, 2048, 1, 1, 1, avx2).flat
    assert not conv_plan(1, 32, 55, 55, 256, 1, 1, 1, avx2, flat=True).flat, "2 x 5 columns divide 55"
    assert not conv_plan(1, 16, 1, 49, 32, 1, 1, 1, avx2, flat=True).flat, "one row already"


def test_depthwise_and_grouped_plans():
    dw = conv_plan(1, 60, 28, 28, 1, 3, 3, 60, FACTS)
    assert dw.kernel == "depthwise" and dw.tile.lanes == LANES and dw.padding.cols % LANES == 0
    assert dw.tile.shared_taps and 1 < dw.tile.accumulators <= shared_tap_accumulators(FACTS)
    # 7 columns: 8 lanes, not 16 with 9 padded (60 channels: no whole vectors for `channel_depthwise_columns`)
    narrow = conv_plan(1, 60, 7, 7, 1, 3, 3, 60, FACTS)
    assert narrow.kernel == "depthwise" and narrow.tile.lanes == min(LANES, 8)
    assert narrow.padding.cols == narrow.tile.lanes
    strided = conv_plan(1, 116, 14, 14, 1, 3, 3, 116, FACTS, strided=True)  # no whole vectors: channel_depthwise
    assert strided.kernel == "depthwise" and strided.tile.rows == 1, "gathers leave no registers for more rows"
    assert not strided.tile.shared_taps and 1 < strided.tile.accumulators <= max_accumulators(FACTS)
    grouped = conv_plan(1, 256, 27, 27, 48, 5, 5, 2, FACTS)  # AlexNet conv2: the oc block inside a group
    assert grouped.kernel == "tiled" and 128 % grouped.tile.channels == 0 and grouped.padding.group_channels == 128
    shuffle = conv_plan(1, 60, 28, 28, 80, 1, 1, 3, FACTS)  # 20 channels per group, padded per group
    assert shuffle.padding.group_channels == -(-20 // shuffle.tile.channels) * shuffle.tile.channels




def conv_reference(x, wt, b, residual, attrs):
    """float64 numpy conv2d + bias (+ residual), then relu."""
    (sh, sw), (pt, pl, pb, pr), (dh, dw), groups = (attrs[k] for k in ("strides", "padding", "dilation", "groups"))
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    n, c = x.shape[:2]
    oc, cpg, kh, kw = wt.shape
    oh = (xp.shape[2] - dh * (kh - 1) - 1) // sh + 1
    ow = (xp.shape[3] - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, oc, oh, ow))
    opg = oc // groups
    for g, r, s in itertools.product(range(groups), range(kh), range(kw)):
        rows = slice(r * dh, r * dh + sh * (oh - 1) + 1, sh)
        cols = slice(s * dw, s * dw + sw * (ow - 1) + 1, sw)
        patch = xp[:, g * cpg:(g + 1) * cpg, rows, cols]
        out[:, g * opg:(g + 1) * opg] += np.einsum("nchw,oc->nohw", patch, wt[g * opg:(g + 1) * opg, :, r, s])
    out += b[None, :, None, None]
    if residual is not None:
        out += residual
    return np.maximum(out, 0)


def _schedule(func, schedule, attrs, target=TARGET):
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    with target:
        schedule(sch, attrs, target)
    return sch.mod["main"].with_attr("global_symbol", "main")


def _build(func, schedule, attrs, target=TARGET):
    return tvm.compile(tvm.IRModule({"main": _schedule(func, schedule, attrs, target)}), target)


def _run(executable, arrays, out_shape):
    out = tvm.runtime.tensor(np.full(out_shape, np.nan, "float32"))
    executable["main"](*[tvm.runtime.tensor(a) for a in arrays], out)
    return out.numpy()


CHANNELS = ((3, 16), (13, 13), (16, 32), (7, 48), (32, 64))
SPATIAL = ((7, 9), (15, 15), (1, 1), (9, 7), (12, 10))


def _grid():
    """Kernels 1/3/5/7 x strides 1/2 x groups 1/2/depthwise x symmetric, asymmetric and dilated padding;
    channels, batch and image sizes rotate through odd and small values."""
    combos = itertools.product((1, 3, 5, 7), (1, 2), ("1", "2", "dw"), (("sym", 1), ("asym", 1), ("sym", 2)))
    for i, (k, s, g, (pad, dil)) in enumerate(combos):
        c, oc = CHANNELS[i % len(CHANNELS)]
        oc = c if g == "dw" else oc
        if g == "2" and (c % 2 or oc % 2):
            c, oc = 16, 32
        groups = {"1": 1, "2": 2, "dw": c}[g]
        h, w = SPATIAL[i % len(SPATIAL)]
        p = (k // 2 * dil,) * 4 if pad == "sym" else (0, 1, k - 1, 0)
        if min(conv2d_out_size(h, k, s, p[0], p[2], dil), conv2d_out_size(w, k, s, p[1], p[3], dil)) < 1:
            h, w = 17, 17
        yield dict(n=(1, 4)[i % 2], c=c, h=h, w=w, oc=oc, k=k, stride=s, pad=p, dil=dil, groups=groups)


RESNET_SAMPLE = [dict(zip(("n", "c", "h", "w", "oc", "k", "stride", "pad"), RESNET50[i])) for i in (0, 6, 18, 20, 22)]
CASES = RESNET_SAMPLE + list(_grid()) + [
    dict(n=1, c=1, h=9, w=9, oc=16, k=1),  # one input channel, 1x1: the weight panel has no taps loop
    dict(n=2, c=48, h=1, w=1, oc=32, k=1),
    dict(n=1, c=8, h=9, w=7, oc=96, k=(1, 3), stride=(1, 2), pad=(0, 1, 0, 1)),
    dict(n=1, c=24, h=13, w=11, oc=48, k=3, dil=(2, 1)),
    dict(n=2, c=24, h=13, w=13, oc=1000, k=1),  # AVX2: flat pixels, batch 2, channels padded, a residual
    dict(n=1, c=32, h=7, w=7, oc=64, k=1),  # AVX2: flat pixels read in place, 49 padded to a whole tile
    dict(n=2, c=20, h=9, w=11, oc=24, k=1),  # AVX2: flat pixels read in place, batch 2, channels padded
]


def _id(case):
    return "-".join(f"{k}{v}" for k, v in case.items()).replace(" ", "")


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_conv_matches_numpy(case):
    residual = case["n"] == 4 or case["k"] == 1
    func, attrs, _ = conv_primfunc(**case, residual=residual, target=TARGET)
    shapes = [[int(d) for d in p.shape] for p in func.params]
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype("float32") for s in shapes[:-1]]
    x, r, wt, b = arrays if residual else (arrays[0], None, *arrays[1:])
    got = _run(_build(func, schedule_conv2d_llvm, attrs), arrays, shapes[-1])
    assert_close(got, conv_reference(x, wt, b, r, attrs).astype("float32"), _id(case))


@pytest.mark.parametrize("m,k,n", [(1, 2048, 1000), (4, 64, 48), (3, 100, 37), (2, 16, 8)])
def test_dense_matches_numpy(m, k, n):
    x = te.placeholder((m, k), "float32", name="x")
    w = te.placeholder((k, n), "float32", name="w")
    b = te.placeholder((n,), "float32", name="b")
    attrs = dict(activation="relu")
    func = te.create_prim_func([x, w, b, dense_affine(x, w, b, **attrs)]).without_attr("global_symbol")
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype("float32") for s in ((m, k), (k, n), (n,))]
    got = _run(_build(func, schedule_dense_llvm, attrs), arrays, (m, n))
    want = np.maximum(arrays[0].astype(np.float64) @ arrays[1] + arrays[2], 0)
    assert_close(got, want.astype("float32"), f"dense {m}x{k}x{n}")


#: the shapes of the issue: odd classes (SqueezeNet), depthwise s1/s2 (ShuffleNet, MobileNet), grouped with
#: per-group channels a vector multiple (AlexNet) and not (ShuffleNet g=3), 1x1, 7x7 stride-2 stem, 7x7 late
KERNEL_CASES = [
    dict(n=1, c=64, h=13, w=13, oc=1000, k=1),
    dict(n=1, c=24, h=14, w=14, oc=24, k=3, pad=1, groups=24),
    dict(n=1, c=24, h=15, w=15, oc=24, k=3, stride=2, pad=1, groups=24),
    dict(n=1, c=16, h=11, w=11, oc=32, k=3, pad=1, groups=16),  # channel multiplier 2
    dict(n=1, c=32, h=13, w=13, oc=64, k=5, pad=2, groups=2),
    dict(n=1, c=48, h=14, w=14, oc=60, k=1, groups=3),
    dict(n=1, c=3, h=45, w=45, oc=24, k=7, stride=2, pad=3),
    dict(n=1, c=64, h=7, w=7, oc=40, k=3, pad=1),
]


@pytest.mark.parametrize("case", KERNEL_CASES, ids=_id)
def test_every_shape_gets_the_register_tiled_kernel(case):
    """Structure of the scheduled PrimFunc: the padded output in registers (`local` accumulators), the
    channels (tiled) or columns (depthwise) vectorized at full vector width of the target, the outer loop
    parallel; numerics against numpy on the target (the host, or TVM_FUSION_CPU)."""
    func, attrs, _ = conv_primfunc(**case, residual=False, target=TARGET)
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    with TARGET:
        schedule_conv2d_llvm(sch, attrs, TARGET)
    conv = sch.get_sblock("conv_update")  # the reduction, after decompose_reduction
    kinds = [(sch.get(loop).kind, int(sch.get(loop).extent)) for loop in sch.get_loops(conv)]
    vector = [extent for kind, extent in kinds if kind == tvm.tirx.ForKind.VECTORIZED]
    assert kinds[0][0] == tvm.tirx.ForKind.PARALLEL, kinds
    assert re.search(r'conv\w* = T.sblock_alloc_buffer\([^\n]*scope="local"', sch.mod["main"].script())
    depthwise = case.get("groups", 1) == case["c"]
    if depthwise:  # the target's vector, or a half of it for a narrow row
        assert len(vector) == 1 and LANES % vector[0] == 0 and vector[0] >= min(LANES, 4), kinds
    else:
        assert len(vector) == 1 and vector[0] % LANES == 0, kinds
    test_conv_matches_numpy(case)


@pytest.mark.skipif("avx2" not in (host_features() or ()), reason="this host cannot run AVX2 code")
@pytest.mark.parametrize("case", KERNEL_CASES, ids=_id)
def test_avx2_kernels_match_numpy(case):
    """The same shapes built for an AVX2 target (8 lanes, 16 ymm): run here, against numpy."""
    target = tvm.target.Target(AVX2)
    func, attrs, _ = conv_primfunc(**case, residual=False, target=target)
    shapes = [[int(d) for d in p.shape] for p in func.params]
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(s).astype("float32") for s in shapes[:-1]]
    got = _run(_build(func, schedule_conv2d_llvm, attrs, target), arrays, shapes[-1])
    assert_close(got, conv_reference(arrays[0], arrays[1], arrays[2], None, attrs).astype("float32"), _id(case))


def test_odd_depthwise_and_grouped_convs_fused_match_onnxruntime():
    """A net of the shapes above through the whole fusion build (the llvm compute under the target): odd
    output channels, depthwise stride 2, grouped with 5 channels per group, a 37-class 1x1 head; fused vs
    unfused and onnxruntime element-wise, every conv in a kernel of ours."""
    from tvm_fusion.testing import GraphBuilder, check_fused

    g = GraphBuilder(seed=3)
    x = g.input("x", [1, 3, 23, 23])
    y = g.op("Relu", [g.conv(x, 3, 13, k=3)])
    y = g.op("Relu", [g.conv(y, 13, 13, k=3, stride=2, groups=13)])
    y = g.op("Relu", [g.conv(y, 13, 26, k=1, pads=[0, 0, 0, 0])])
    y = g.op("Relu", [g.conv(y, 26, 10, k=3, groups=2)])
    y = g.conv(y, 10, 37, k=1, pads=[0, 0, 0, 0])
    check_fused(g.model([y]), expect={"conv2d_bias_relu": 4, "conv2d_bias": 1})


# ---------------------------------------------------------------- weights packed at compile time (pack_conv)


def test_pack_channel_blocks_pads_each_group_and_puts_the_block_innermost():
    """Wp[o // B, c, r, s, o % B] = W[o, c, r, s] for the real channels of each group, 0 for the padding."""
    w = np.arange(2 * 5 * 3 * 3 * 3, dtype="float32").reshape(10, 3, 3, 3) + 1  # 2 groups x 5 channels
    wp = pack_channel_blocks(w, groups=2, group_channels=8, block=4)
    assert wp.shape == (4, 3, 3, 3, 4) and wp.flags.c_contiguous
    flat = wp.transpose(0, 4, 1, 2, 3).reshape(16, 3, 3, 3)  # padded channel o' = o // B * B + o % B
    for g in range(2):
        np.testing.assert_array_equal(flat[g * 8:g * 8 + 5], w[g * 5:(g + 1) * 5])
        assert not flat[g * 8 + 5:(g + 1) * 8].any()


def _packed_build(case, target, seed=2, activation="relu", residual=False):
    """Build `case` the way fuse does on llvm: W packed by pack_conv for `target`, the llvm compute and
    schedule under it (epilogue `activation`, or the case's own "activation"; `residual`: added before it).
    Returns (executable, scheduled PrimFunc, arrays in call order, out shape, reference: float64 numpy's conv
    + bias (+ residual) + ReLU)."""
    _, attrs, shapes = conv_primfunc(**{"activation": activation, **case}, residual=residual, target=target)
    rng = np.random.default_rng(seed)
    x, *r, wt, b = (rng.standard_normal(s).astype("float32") for s in shapes)
    packed = pack_conv([wt, b], attrs, shapes, target) or [wt, b]
    xs = te.placeholder(x.shape, "float32", name="x")
    rs = [te.placeholder(r[0].shape, "float32", name="r")] if residual else []
    ws = te.placeholder(packed[0].shape, "float32", name="w")
    bs = te.placeholder(b.shape, "float32", name="b")
    out = conv2d_llvm(xs, ws, bs, *rs, **attrs, target=target)
    func = te.create_prim_func([xs, *rs, ws, bs, out]).without_attr("global_symbol")
    scheduled = _schedule(func, schedule_conv2d_llvm, attrs, target)
    executable = tvm.compile(tvm.IRModule({"main": scheduled}), target)
    reference = conv_reference(x, wt, b, r[0] if residual else None, attrs).astype("float32")
    return executable, scheduled, [x, *r, packed[0], b], [int(d) for d in out.shape], reference


#: ResNet-50's convs (all 23 shapes: 7x7 stride-2 stem, 1x1, 3x3, strided 1x1 and 3x3) and the shapes of
#: KERNEL_CASES (odd classes, depthwise s1/s2 and multiplier 2, grouped, 7x7 stem, 7x7 late)
PACKED_CASES = [dict(zip(("n", "c", "h", "w", "oc", "k", "stride", "pad"), r)) for r in RESNET50] + KERNEL_CASES
PACK_TARGETS = {"host": TARGET, "avx2": tvm.target.Target(AVX2)}


NO_AVX2 = pytest.mark.skipif("avx2" not in (host_features() or ()), reason="this host cannot run AVX2 code")


@pytest.mark.parametrize("target_name", ["host", pytest.param("avx2", marks=NO_AVX2)])
@pytest.mark.parametrize("case", PACKED_CASES, ids=_id)
def test_packed_weights_match_numpy(case, target_name, monkeypatch):
    """Every tiled and pointwise conv reads W packed at compile time in its tile's channel blocks (no panel
    copy inside the kernel); depthwise and grouped 1x1 GEMMs over pixels (conv2d_pointwise) keep W as it is.
    Numerics against float64 numpy, for the host's vector width and AVX2's (the 3x3 stride-1 convs on the
    direct kernel: the Winograd conv, conv2d_winograd_test.py, off)."""
    monkeypatch.setattr(llvm_winograd, "WINOGRAD_ISAS", ())
    target = PACK_TARGETS[target_name]
    executable, func, arrays, out_shape, reference = _packed_build(case, target)
    stride, pad = case.get("stride", 1), case.get("pad", 0)
    plan = conv_plan(1, case["oc"], *out_shape[2:], case["c"] // case.get("groups", 1), *(case["k"],) * 2,
                     case.get("groups", 1), cpu_facts(target), strided=stride > 1,
                     flat=one_row_pixels(case["k"], case["k"], (stride,) * 2, (pad,) * 4 if isinstance(pad, int) else pad,
                                         case.get("groups", 1), case["c"] // case.get("groups", 1), case["oc"],
                                         cpu_facts(target)),
                     pixels=grouped_pointwise(case["k"], case["k"], (stride,) * 2, (pad,) * 4 if isinstance(pad, int)
                                              else pad, case.get("groups", 1), case["c"] // case.get("groups", 1)))
    wp = arrays[1]
    if plan.kernel in ("tiled", "pointwise"):  # tiled: blocks of channel vectors; pointwise: of its rows
        assert wp.ndim == 5 and wp.shape[-1] == plan.tile.channels
        assert plan.kernel == "pointwise" or plan.tile.channels % plan.tile.lanes == 0
        script = func.script()
        assert "w_global" not in script and 'T.sblock("weight"' not in script, "no weight copy in the kernel"
    else:
        assert wp.ndim == 4
    assert_close(_run(executable, arrays, out_shape), reference, f"{target_name} {_id(case)}")


@NO_AVX2
def test_avx2_build_uses_no_avx512():
    """Code built for the AVX2 target uses ymm registers only (it must run on a host without AVX-512)."""
    executable, *_ = _packed_build(dict(n=1, c=64, h=14, w=14, oc=64, k=3, pad=1), tvm.target.Target(AVX2))
    asm = executable.mod.inspect_source("asm")
    assert "ymm" in asm and "zmm" not in asm


@pytest.mark.parametrize("spec", [AVX2, {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}], ids=["avx2", "avx512"])
def test_weight_and_input_layout_follow_the_target(spec):
    """AVX2 and AVX-512 pack W taps first ([oc block, KH, KW, C, B]) and write the padded input channels-last,
    so the reduction (channels innermost) reads both in storage order; each target's code uses its own
    registers. Numerics where the host runs the target's code."""
    target = tvm.target.Target(spec)
    executable, func, arrays, out_shape, reference = _packed_build(dict(n=1, c=24, h=14, w=14, oc=64, k=3, pad=1),
                                                                   target)
    assert packs_taps_first(target) and arrays[1].shape[1:4] == (3, 3, 24)
    pad = next(b for b in func.script().splitlines() if "pad = T.sblock_alloc_buffer" in b)
    shape = [int(d) for d in re.search(r"\(\((\d+, \d+, \d+, \d+)\)", pad).group(1).split(", ")]
    assert shape[3] == 24, pad
    assert ("zmm" in executable.mod.inspect_source("asm")) == (spec is not AVX2)
    if _runs_here(target):
        assert_close(_run(executable, arrays, out_shape), reference, str(spec))



#: strided convs with few multiply-adds per input element (YOLOv8n's 3x3/2 3 -> 16 and 16 -> 32 on small
#: images, ShuffleNet's 3 -> 24 stem, a 1x1/2 narrowing conv) and deeper ones that keep the channels-last copy
#: on AVX2 (3x3/2 128 -> 128, the 7x7/2 3 -> 64 stem); image sizes odd so rows and columns are padded
STRIDED_CASES = [
    (dict(n=1, c=3, h=33, w=31, oc=16, k=3, stride=2, pad=1), False),
    (dict(n=1, c=16, h=21, w=22, oc=32, k=3, stride=2, pad=1), False),
    (dict(n=1, c=3, h=29, w=29, oc=24, k=3, stride=2, pad=1), False),
    (dict(n=1, c=64, h=56, w=56, oc=32, k=1, stride=2), False),  # 28 columns padded to the tile: a copy
    (dict(n=1, c=128, h=15, w=15, oc=128, k=3, stride=2, pad=1), True),
    (dict(n=1, c=3, h=37, w=37, oc=64, k=7, stride=2, pad=3), True),
    (dict(n=1, c=128, h=15, w=15, oc=256, k=1, stride=2), True),  # ResNet-50's 1x1/2 downsampling: many planes
]


@pytest.mark.parametrize("spec", [AVX2, {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}], ids=["avx2", "avx512"])
@pytest.mark.parametrize("case,channels_last", STRIDED_CASES, ids=[_id(c) for c, _ in STRIDED_CASES])
def test_shallow_strided_convs_read_their_input_nchw(case, channels_last, spec):
    """A strided tiled conv with at most STRIDED_NCHW_CHANNELS input channels and STRIDED_NCHW_MACS
    multiply-adds per input element writes its padded input NCHW (W still packed taps first, on AVX2 and
    AVX-512); deeper ones keep it channels-last. Numerics against float64 numpy where the host runs the code."""
    target = tvm.target.Target(spec)
    executable, func, arrays, out_shape, reference = _packed_build(case, target)
    assert packs_taps_first(target)
    macs = case["oc"] * case["k"] ** 2 / case["stride"] ** 2
    shallow = macs <= STRIDED_NCHW_MACS and case["c"] <= STRIDED_NCHW_CHANNELS
    assert channels_last_input("tiled", case["c"], case["oc"], case["k"], case["k"], (case["stride"],) * 2,
                               cpu_facts(target)) == channels_last == (not shallow)
    pad = next((b for b in func.script().splitlines() if "pad = T.sblock_alloc_buffer" in b), None)
    subsampled = subsampled_pixels(case["k"], case["k"], (case["stride"],) * 2, (case.get("pad", 0),) * 4, 1,
                                   case["c"], case["oc"], cpu_facts(target))
    if pad is not None and not subsampled:  # none where the tile divides an unpadded conv's output: x as it is
        shape = [int(d) for d in re.search(r"\(\((\d+, \d+, \d+, \d+)\)", pad).group(1).split(", ")]
        assert shape[3 if channels_last else 1] == case["c"], pad
    assert arrays[1].shape[1:4] == (case["k"], case["k"], case["c"])
    if _runs_here(target):
        assert_close(_run(executable, arrays, out_shape), reference, _id(case))


# ---------------------------------------------------------------- strided 1x1 convs over their pixels (AVX2)


#: strided 1x1 unpadded convs that `subsampled_pixels` plans as a flat 1x1 conv over the pixels they read
#: (AVX2): ResNet-50's downsampling shortcuts (784 pixels: the pointwise kernel; 196: the flat tiled kernel
#: with its channels-last copy), odd images (rows and columns odd, pixels not whole vectors, batch 2),
#: output channels under FLAT_COPY_CHANNELS (the strided pixels written first, then read in place), and
#: unequal strides
SUBSAMPLED_CASES = [
    dict(n=1, c=256, h=56, w=56, oc=512, k=1, stride=2),
    dict(n=1, c=512, h=28, w=28, oc=1024, k=1, stride=2),
    dict(n=2, c=96, h=13, w=11, oc=200, k=1, stride=2),
    dict(n=1, c=256, h=28, w=27, oc=96, k=1, stride=2),
    dict(n=1, c=80, h=9, w=17, oc=136, k=1, stride=(2, 3)),
]
AVX512_TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})


def _subsampled(case, target) -> bool:
    stride = case["stride"] if isinstance(case["stride"], tuple) else (case["stride"],) * 2
    return subsampled_pixels(case["k"], case["k"], stride, (case.get("pad", 0),) * 4, case.get("groups", 1),
                             case["c"], case["oc"], cpu_facts(target))


def test_strided_1x1_convs_are_planned_over_their_pixels():
    """AVX2 and AVX-512: a strided 1x1 unpadded conv whose input would be copied channels-last plans its hout
    * wout pixels as one row (`flat`: its input copy takes the strided pixels only); not a padded, 3x3,
    grouped or shallow one (`channels_last_input` reads those NCHW), nor a stride-1 one (`flat_pixels`)."""
    avx2, avx512 = cpu_facts(tvm.target.Target(AVX2)), cpu_facts(AVX512_TARGET)
    for case in SUBSAMPLED_CASES:
        assert _subsampled(case, tvm.target.Target(AVX2)) and _subsampled(case, AVX512_TARGET), case
    shortcut = dict(kh=1, kw=1, strides=(2, 2), padding=(0, 0, 0, 0), groups=1, cpg=256, cout=512)
    for facts in (avx2, avx512):
        assert subsampled_pixels(**shortcut, facts=facts) and one_row_pixels(**shortcut, facts=facts)
        assert not subsampled_pixels(**{**shortcut, "padding": (1, 1, 1, 1)}, facts=facts)
        assert not subsampled_pixels(**{**shortcut, "kh": 3, "kw": 3}, facts=facts)
        assert not subsampled_pixels(**{**shortcut, "groups": 2, "cpg": 128}, facts=facts)
        assert not subsampled_pixels(**{**shortcut, "cpg": 64, "cout": 32}, facts=facts), "shallow: x read NCHW"
        assert not subsampled_pixels(**{**shortcut, "strides": (1, 1)}, facts=facts), "flat_pixels' conv"
        plan = conv_plan(1, 512, 28, 28, 256, 1, 1, 1, facts, strided=True, flat=True)
        assert plan.flat and plan.kernel == "pointwise" and (plan.padding.rows, plan.padding.cols) == (1, 784)
    late = conv_plan(1, 1024, 14, 14, 512, 1, 1, 1, avx2, strided=True, flat=True)
    assert late.flat and late.kernel == "tiled" and not late.in_place


def _build_without(rule: str, case, target):
    """`case` built (`_packed_build`) with the plan predicate `rule` of schedules/llvm/conv2d.py answering
    False: the kernel before that rule."""
    import tvm_fusion.schedules.llvm.conv2d as llvm_conv

    keep = getattr(llvm_conv, rule)
    setattr(llvm_conv, rule, lambda *args, **kwargs: False)
    try:
        return _packed_build(case, target)
    finally:
        setattr(llvm_conv, rule, keep)


def _strided_plan_build(case, target):
    """`case` built with `subsampled_pixels` off: the strided tile (the kernel before)."""
    return _build_without("subsampled_pixels", case, target)


@pytest.mark.parametrize("target", [
    pytest.param(tvm.target.Target(AVX2), id="avx2", marks=NO_AVX2),
    pytest.param(AVX512_TARGET, id="avx512", marks=pytest.mark.skipif(
        not _runs_here(AVX512_TARGET), reason="this host cannot run AVX-512 code (the AVX2 build runs)"))])
@pytest.mark.parametrize("case", SUBSAMPLED_CASES, ids=_id)
def test_subsampled_convs_match_numpy_and_the_strided_kernel_bit_for_bit(case, target):
    """Built for AVX2 and AVX-512 (W packed for the flat plan): element-wise against float64 numpy, and
    bit-identical to the strided tile's kernel (the same sums in the same order, input channels one by one).
    AVX-512 plans the pixels as one row where `conv_plan` finds it a pixel tile (the pointwise kernel's
    whole vectors of pixels: 784 of them), else the strided tile as before."""
    executable, func, arrays, out_shape, reference = _packed_build(case, target)
    stride = case["stride"] if isinstance(case["stride"], tuple) else (case["stride"],) * 2
    one_row = plan_of(arrays[0].shape, case["oc"], (case["c"], 1, 1), stride, (0,) * 4, (1, 1), 1,
                      cpu_facts(target)).flat
    if one_row:  # the accumulators [n, 1, P, C] (flat tiled) or [n, C, 1, P] (pointwise)
        acc = re.search(r"conv_local = T.sblock_alloc_buffer\(\((\d+), (\d+), (\d+), (\d+)\)", func.script())
        assert 1 in [int(d) for d in acc.groups()[1:3]], f"the pixels as one row: {acc.group(0)}"
    assert one_row or target is AVX512_TARGET, "AVX2 plans every one as one row of pixels"
    if case["c"] == 256 and case["h"] == 56:
        assert one_row, "ResNet-50's 256 -> 512 shortcut: the pointwise kernel over 784 pixels"
    got = _run(executable, arrays, out_shape)
    assert_close(got, reference, _id(case))
    strided, _, strided_arrays, strided_shape, _ = _strided_plan_build(case, target)
    np.testing.assert_array_equal(got, _run(strided, strided_arrays, strided_shape))


@NO_AVX2
def test_subsampled_conv_reads_only_the_strided_pixels():
    """x changed at every pixel off the stride grid (odd rows or columns: no output reads them) leaves the
    output bit for bit; one pixel on it (row 2, column 4: output 1, 2) changes that output pixel only. A copy
    that took the wrong pixels (x[h, w] instead of x[2h, 2w], or rows and columns swapped) fails both."""
    case = dict(n=1, c=128, h=11, w=9, oc=136, k=1, stride=2)
    target = tvm.target.Target(AVX2)
    executable, _, arrays, out_shape, reference = _packed_build(case, target)
    assert _subsampled(case, target)
    base = _run(executable, arrays, out_shape)
    assert_close(base, reference, _id(case))
    x = arrays[0].copy()
    off_grid = np.ones(x.shape[2:], bool)
    off_grid[::2, ::2] = False
    x[:, :, off_grid] = 1e6
    np.testing.assert_array_equal(_run(executable, [x, *arrays[1:]], out_shape), base)
    x = arrays[0].copy()
    x[0, :, 2, 4] += 1.0
    changed = np.argwhere((_run(executable, [x, *arrays[1:]], out_shape) != base).any(axis=1)[0])
    assert changed.tolist() == [[1, 2]], changed


@NO_AVX2
@pytest.mark.parametrize("case", SUBSAMPLED_CASES[2:], ids=_id)
def test_subsampled_convs_with_residual_and_relu_match_numpy(case):
    """The conv + bias + residual + ReLU epilogue (conv_primfunc's), W as the llvm compute takes it unpacked."""
    target = tvm.target.Target(AVX2)
    func, attrs, _ = conv_primfunc(**case, residual=True, target=target)
    shapes = [[int(d) for d in p.shape] for p in func.params]
    rng = np.random.default_rng(4)
    x, r, wt, b = (rng.standard_normal(s).astype("float32") for s in shapes[:-1])
    got = _run(_build(func, schedule_conv2d_llvm, attrs, target), [x, r, wt, b], shapes[-1])
    assert_close(got, conv_reference(x, wt, b, r, attrs).astype("float32"), _id(case))


# ---------------------------------------------------------------- epilogues over channel vectors


#: tiles whose columns are not whole vectors on AVX2 (10 columns, 8 lanes) and not padded: YOLOv8n's 3x3/2
#: 3 -> 16 stem and its 3x3 16 -> 16 bottleneck conv, on small images
CHANNEL_EPILOGUE_CASES = [
    dict(n=1, c=3, h=40, w=40, oc=16, k=3, stride=2, pad=1),
    dict(n=1, c=16, h=30, w=30, oc=16, k=3, stride=1, pad=1),
]


def _epilogue_bindings(script: str, after: int) -> dict[str, str]:
    """The iterator bindings (`v_o`: its expression of loop variables) of the block whose axes follow `after`
    in a scheduled PrimFunc's script: `v = T.axis.spatial(extent, expr)` and `T.axis.remap` lines."""
    header = script[after:script.index("T.reads", after)]
    bindings = {}
    for names, loops in re.findall(r"([\w, ]+) = T\.axis\.remap\(\"\w+\", \[([^\]]*)\]\)", header):
        bindings.update(zip((n.strip() for n in names.split(",")), (v.strip() for v in loops.split(","))))
    bindings.update(re.findall(r"(\w+) = T\.axis\.spatial\(\d+, (.*)\)\n", header))
    return bindings


def _column_epilogue_build(case, target, activation):
    """`case` built with its epilogue vectorized along the tile's columns (the kernel before)."""
    import tvm_fusion.schedules.llvm.conv2d as llvm_conv

    keep = llvm_conv.epilogue_by_channel_vectors
    llvm_conv.epilogue_by_channel_vectors = llvm_conv.vectorize_own_inner_loop
    try:
        return _packed_build(case, target, activation=activation)
    finally:
        llvm_conv.epilogue_by_channel_vectors = keep


@NO_AVX2
@pytest.mark.parametrize("case", CHANNEL_EPILOGUE_CASES, ids=_id)
def test_silu_epilogue_runs_in_channel_vectors_when_columns_are_not_whole_vectors(case, monkeypatch):
    """A tile of 10 exact columns on AVX2 applies its SiLU epilogue over the tile's channels, whole vectors of
    the pixel-major accumulators (not 8 + 2 column lanes gathered across them), the fast sigmoid vectorized
    (no libm `expf`): element-wise against the unfused build (the conv without activation, SiLU in float64
    numpy) and bit-identical to the column-vectorized epilogue (the same arithmetic per element). The
    stride-1 conv with `flat_taps` off: on AVX2 it is planned as one row of pixels (1 x 12), whose epilogue
    runs over channel vectors anyway (`_schedule_flat`)."""
    import tvm_fusion.schedules.llvm.conv2d as llvm_conv

    monkeypatch.setattr(llvm_conv, "flat_taps", lambda *args, **kwargs: False)
    target = tvm.target.Target(AVX2)
    plan_tile = choose_tile(case["oc"], *(conv2d_out_size(case["h"], 3, case["stride"], 1, 1, 1),) * 2,
                            case["c"] * 9, case["n"], threads=2, facts=cpu_facts(target))
    assert plan_tile.cols % plan_tile.lanes and case["h"] // case["stride"] % plan_tile.cols == 0, plan_tile
    executable, func, arrays, out_shape, _ = _packed_build(case, target, activation="silu")
    script = func.script()
    loop = re.search(r"for (\w+) in T\.vectorized\((\d+)\):\n\s+with T\.sblock\(\"epilogue\"\)", script)
    assert loop is not None and int(loop.group(2)) == plan_tile.channels, script
    bindings = _epilogue_bindings(script, loop.end())
    assert re.search(rf"\b{loop.group(1)}\b", bindings["v_o"]), f"a vector loop over the channels: {bindings}"
    assert not re.search(rf"\b{loop.group(1)}\b", bindings["v_ww"]), bindings
    assert "expf" not in executable.mod.inspect_source("ll"), "the sigmoid is the fast vector form"
    got = _run(executable, arrays, out_shape)
    plain, _, plain_arrays, _, _ = _packed_build(case, target, activation=None)
    conv = _run(plain, plain_arrays, out_shape).astype(np.float64)
    assert_close(got, (conv / (1 + np.exp(-conv))).astype("float32"), _id(case))
    columns, _, column_arrays, _, _ = _column_epilogue_build(case, target, "silu")
    np.testing.assert_array_equal(got, _run(columns, column_arrays, out_shape))


# ---------------------------------------------------------------- epilogues along exact columns


def test_column_epilogue_takes_at_least_half_a_vector_of_exact_columns():
    """AVX-512 tiles whose columns are all real run their epilogue along the columns from half a vector of
    them (`StepCost.column_epilogue_share`); AVX2 ones only where the columns are whole vectors (10 columns
    with SiLU lost there)."""
    avx512, avx2 = (step_cost(cpu_facts(TILE_TARGETS[name])) for name in ("avx512", "avx2"))
    for cols in (8, 11, 14, 20, 28, 32):
        assert column_epilogue(ConvTile(2, 1, cols, 16), avx512), cols
    for cols in (3, 7):
        assert not column_epilogue(ConvTile(2, 1, cols, 16), avx512), cols
    assert not column_epilogue(ConvTile(1, 1, 10, 8), avx2) and column_epilogue(ConvTile(2, 1, 16, 8), avx2)


#: tiles of exact columns that are not whole vectors (AVX-512: 14, 20, 11, 28 columns; AVX2 planned as
#: AVX-512: 4, 5, 11, 4): VGG19's 3 -> 64 stem on a small image, YOLOv8n's 3x3/2 stem, a strided stem with
#: 11 output columns, a 24 -> 48 conv
COLUMN_EPILOGUE_CASES = [
    dict(n=2, c=3, h=12, w=28, oc=64, k=3, stride=1, pad=1),
    dict(n=1, c=3, h=40, w=40, oc=16, k=3, stride=2, pad=1),
    dict(n=1, c=3, h=12, w=22, oc=64, k=3, stride=2, pad=1),
    dict(n=1, c=24, h=8, w=28, oc=48, k=3, stride=1, pad=1),
]


def _avx512_or_planned_as_it(name, monkeypatch):
    """The AVX-512 target, or AVX2 planned as AVX-512 is (`_chunked_target`'s)."""
    return TILE_TARGETS["avx512"] if name == "avx512" else _chunked_target(name, monkeypatch)


@pytest.mark.parametrize("epilogue", ["relu", "silu", "residual"])
@pytest.mark.parametrize("target_name", ["avx512", pytest.param("avx2", marks=NO_AVX2)])
@pytest.mark.parametrize("case", COLUMN_EPILOGUE_CASES, ids=_id)
def test_exact_column_tiles_store_rows_of_columns(case, target_name, epilogue, monkeypatch):
    """A tile whose columns are all real but not whole vectors (`column_epilogue`) runs its epilogue with its
    channels unrolled and its columns as one (partial) vector: one store per channel row. Bit-identical to
    the epilogue over channel vectors (the same arithmetic per element; SiLU's fast vector form in both),
    and with ReLU / a residual element-wise against float64 numpy, where the host runs the target's code."""
    import tvm_fusion.schedules.llvm.conv2d as llvm_conv

    target = _avx512_or_planned_as_it(target_name, monkeypatch)
    activation, residual = ("relu", True) if epilogue == "residual" else (epilogue, False)
    executable, func, arrays, out_shape, reference = _packed_build(case, target, activation=activation,
                                                                    residual=residual)
    plan = plan_of((case["n"], case["c"], case["h"], case["w"]), case["oc"], (case["c"], 3, 3), (case["stride"],) * 2,
                   (case["pad"],) * 4, (1, 1), 1, cpu_facts(target))
    tile = plan.tile
    assert plan.kernel == "tiled" and not plan.flat and not plan.chunk and plan.padding.cols == out_shape[3], plan
    assert tile.cols % tile.lanes and column_epilogue(tile, step_cost(cpu_facts(target))), tile
    script = func.script()
    loop = re.search(r"for (\w+) in T\.vectorized\((\d+)\):\n\s+with T\.sblock\(\"epilogue\"\)", script)
    assert loop is not None and int(loop.group(2)) == tile.cols, script
    bindings = _epilogue_bindings(script, loop.end())
    assert re.search(rf"\b{loop.group(1)}\b", bindings["v_ww"]), f"a vector loop over the columns: {bindings}"
    assert not re.search(rf"\b{loop.group(1)}\b", bindings["v_o"]), bindings
    if not _runs_here(target):
        return
    got = _run(executable, arrays, out_shape)
    if activation == "relu":
        assert_close(got, reference, f"{target_name} {_id(case)}")
    costs = {isa: replace(cost, column_epilogue_share=0.0) for isa, cost in llvm_conv.TILED_STEP_COSTS.items()}
    monkeypatch.setattr(llvm_conv, "TILED_STEP_COSTS", costs)
    vectors, vector_func, vector_arrays, _, _ = _packed_build(case, target, activation=activation, residual=residual)
    before = re.search(r"T\.vectorized\((\d+)\):\n\s+with T\.sblock\(\"epilogue\"\)", vector_func.script())
    assert before.group(1) != str(tile.cols), "the kernel before: channel vectors"
    np.testing.assert_array_equal(got, _run(vectors, vector_arrays, out_shape))


#: convs whose padded input is copied channels-last: 64, 24 and 3 input channels (blocks of 16 / 8, 12 / 8,
#: 3 / 3), stride 1 and 2
PAD_COPY_CASES = [
    dict(n=1, c=64, h=16, w=28, oc=64, k=3, stride=1, pad=1),
    dict(n=2, c=24, h=9, w=13, oc=32, k=3, stride=1, pad=1),
    dict(n=1, c=3, h=12, w=28, oc=64, k=3, stride=1, pad=1),
    dict(n=1, c=128, h=14, w=14, oc=128, k=3, stride=2, pad=1),
]


@pytest.mark.parametrize("target_name", ["avx512", pytest.param("avx2", marks=NO_AVX2)])
@pytest.mark.parametrize("case", PAD_COPY_CASES, ids=_id)
def test_channels_last_input_copies_write_vectors_of_channels(case, target_name):
    """A conv's padded channels-last input copy (`_schedule_pad`) writes each image row in blocks of the
    largest divisor of the channels up to the target's float32 lanes, one vector per pixel (a pixel's whole
    channel row at once reads a line of every plane, and planes a multiple of 4 KiB apart share one L1 set);
    element-wise against float64 numpy where the host runs the target's code."""
    target = TILE_TARGETS[target_name]
    lanes = cpu_facts(target).float32_lanes
    executable, func, arrays, out_shape, reference = _packed_build(case, target)
    assert channels_last_input("tiled", case["c"], case["oc"], 3, 3, (case["stride"],) * 2, cpu_facts(target))
    block = max(d for d in range(1, lanes + 1) if case["c"] % d == 0)
    pad = func.script().split('T.sblock("pad")')[0].rsplit("for ", 1)[-1]  # the copy's innermost loop
    assert f"T.vectorized({block})" in pad, pad
    if _runs_here(target):
        assert_close(_run(executable, arrays, out_shape), reference, f"{target_name} {_id(case)}")


#: strided depthwise convs: 3x3 and 5x5 stride 2, odd sizes, padded, unpadded and asymmetric, batch 2, 64 or 24
#: channels (whole AVX2 vectors: `depthwise_channels`) and 20 (not: the column-vectorized kernel)
STRIDED_DEPTHWISE = [
    dict(n=1, c=64, h=16, w=16, oc=64, k=3, stride=2, pad=1, groups=64),
    dict(n=1, c=24, h=15, w=13, oc=24, k=3, stride=2, pad=1, groups=24),
    dict(n=2, c=16, h=9, w=11, oc=16, k=5, stride=2, pad=2, groups=16),
    dict(n=1, c=24, h=11, w=9, oc=24, k=3, stride=2, pad=0, groups=24),
    dict(n=1, c=8, h=12, w=12, oc=8, k=5, stride=2, pad=(1, 2, 2, 1), groups=8),
    dict(n=1, c=20, h=13, w=13, oc=20, k=3, stride=2, pad=1, groups=20),
    # stride 1 with at most `channel_depthwise_columns` output columns (MobileNetV2's last 3x3 on 7x7)
    dict(n=1, c=32, h=7, w=7, oc=32, k=3, stride=1, pad=1, groups=32),
    dict(n=2, c=16, h=6, w=5, oc=16, k=5, stride=1, pad=2, groups=16),
]


def test_strided_depthwise_convs_vectorize_their_channels():
    """`channel_depthwise`: AVX2's and AVX-512's step costs, strided, one output channel per input channel,
    whole vectors (8 or 16 lanes; AVX-512 blocks 8 channels: `channel_depthwise_lanes`)."""
    avx2, avx512 = cpu_facts(tvm.target.Target(AVX2)), cpu_facts(TILE_TARGETS["avx512"])
    plan = conv_plan(1, 112, 28, 28, 1, 3, 3, 112, avx2, strided=True)
    assert plan.kernel == "depthwise_channels" and plan.tile.oc_vectors == 1 and plan.tile.lanes == 8, plan
    assert plan.padding == ConvPadding(1, ceil_to(28, plan.tile.rows), ceil_to(28, plan.tile.cols))
    assert plan.tile.accumulators <= tiled_accumulators(avx2, 1)
    wide = conv_plan(1, 112, 28, 28, 1, 3, 3, 112, avx512, strided=True)
    assert wide.kernel == "depthwise_channels" and wide.tile.lanes == 8, "blocks of `channel_depthwise_lanes`"
    assert wide.tile.accumulators <= tiled_accumulators(avx512, 1)
    assert conv_plan(1, 120, 28, 28, 1, 3, 3, 120, avx512, strided=True).kernel == "depthwise", "7.5 zmm"
    sse = cpu_facts(tvm.target.Target({"kind": "llvm", "mcpu": "x86-64"}))
    assert conv_plan(1, 112, 28, 28, 1, 3, 3, 112, sse, strided=True).kernel == "depthwise", "no step cost says so"
    assert conv_plan(1, 112, 28, 28, 1, 3, 3, 112, avx2).kernel == "depthwise", "stride 1: no gathers"
    for facts in (avx2, avx512):  # stride 1, 7 columns (`channel_depthwise_columns`): a row pads its last vector
        assert conv_plan(1, 960, 7, 7, 1, 3, 3, 960, facts).kernel == "depthwise_channels", facts
        assert conv_plan(1, 384, 14, 14, 1, 3, 3, 384, facts).kernel == "depthwise", facts
    assert conv_plan(1, 60, 14, 14, 1, 3, 3, 60, avx2, strided=True).kernel == "depthwise", "60 channels"
    assert conv_plan(1, 64, 14, 14, 1, 3, 3, 32, avx2, strided=True).kernel == "depthwise", "multiplier 2"
    assert pack_conv([np.zeros((64, 1, 3, 3), "float32"), np.zeros(64, "float32")],
                     dict(strides=(2, 2), padding=(1, 1, 1, 1), dilation=(1, 1), groups=64),
                     [(1, 64, 16, 16), (64, 1, 3, 3), (64,)], tvm.target.Target(AVX2)) is None, "W read as it is"


def _depthwise_build(case, activation, channels: bool, target):
    """`case` built for `target` with `channel_depthwise` as it is (`channels`) or off (the column kernel)."""
    import tvm_fusion.schedules.llvm.conv2d as llvm_conv

    keep = llvm_conv.channel_depthwise
    if not channels:
        llvm_conv.channel_depthwise = lambda *args, **kwargs: False
    try:
        func, attrs, _ = conv_primfunc(**case, residual=False, activation=activation, target=target)
        scheduled = _schedule(func, schedule_conv2d_llvm, attrs, target)
        return tvm.compile(tvm.IRModule({"main": scheduled}), target), scheduled, attrs
    finally:
        llvm_conv.channel_depthwise = keep


@pytest.mark.parametrize("target_name", [pytest.param("avx2", marks=NO_AVX2), "host"])
@pytest.mark.parametrize("activation", ["relu", "silu"])
@pytest.mark.parametrize("case", STRIDED_DEPTHWISE, ids=_id)
def test_strided_depthwise_channel_vectors_match_numpy_and_the_column_kernel(case, activation, target_name):
    """Built for AVX2 and the host (AVX-512 here): element-wise against float64 numpy (ReLU) and the
    column-vectorized kernel (the same taps summed in the same order: bit-identical with ReLU, within the
    tolerances with SiLU's exp)."""
    target = tvm.target.Target(AVX2) if target_name == "avx2" else TARGET
    facts = cpu_facts(target)
    executable, scheduled, attrs = _depthwise_build(case, activation, True, target)
    wout = (case["w"] + 2 * (case["pad"] if isinstance(case["pad"], int) else 0) - case["k"]) // case["stride"] + 1
    channels = channel_depthwise(case["oc"], case["groups"], facts, case["stride"] > 1, wout=wout)
    nhwc = re.search(rf"T.sblock_alloc_buffer\(\(\d+, \d+, \d+, {case['c']}\)\)", scheduled.script())
    assert channels == (nhwc is not None), "the input copied channels-last for whole vectors of channels"
    shapes = [[int(d) for d in p.shape] for p in scheduled.params]
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal(s).astype("float32") for s in shapes[:-1]]
    got = _run(executable, arrays, shapes[-1])
    before = _run(_depthwise_build(case, activation, False, target)[0], arrays, shapes[-1])
    if activation == "relu":
        assert_close(got, conv_reference(*arrays, None, attrs).astype("float32"), _id(case))
        np.testing.assert_array_equal(got, before)
    else:
        assert_close(got, before, _id(case))


def test_avx2_stride1_convs_tile_their_pixels_as_one_row():
    """AVX2 (`flat_taps`): a dense stride-1 conv with a kernel larger than 1x1 plans its output pixels as one
    row where that row's tile has more real outputs per FMA slot, ranked wanting 12 FMA chains
    (`StepCost.flat_taps_chains`): ResNet-50's 3x3 on 28x28 pads 784 pixels to 786 instead of 28 columns to 30
    (2 x 6 tiles), on 7x7 49 to 54 with 2 x 6 (12 chains) instead of 7 columns to 8 with 2 x 4 (8 chains). Not
    for strided, grouped or 1x1 convs (`flat_pixels`' own), nor on AVX-512 (its plans unchanged)."""
    avx2, avx512 = (cpu_facts(tvm.target.Target(s)) for s in (AVX2, {"kind": "llvm", "mcpu": "znver4"}))
    assert flat_taps(3, 3, (1, 1), 1, 64, 64, avx2) and not flat_taps(3, 3, (1, 1), 1, 64, 64, avx512)
    assert flat_taps(1, 3, (1, 1), 1, 8, 32, avx2) and flat_taps(5, 5, (1, 1), 1, 3, 16, avx2)
    assert flat_taps(3, 3, (2, 2), 1, 128, 128, avx2), "a strided conv whose input is copied channels-last"
    assert not flat_taps(3, 3, (2, 2), 1, 16, 32, avx2), "shallow strided: its input copied NCHW"
    assert not flat_taps(3, 3, (1, 1), 2, 64, 64, avx2) and not flat_taps(1, 1, (1, 1), 1, 64, 64, avx2)
    for hw, pixels in ((28, 786), (7, 54), (56, 3138)):
        plan = conv_plan(1, 128, hw, hw, 128, 3, 3, 1, avx2, flat=True)
        assert plan.flat and plan.kernel == "tiled" and not plan.in_place, plan
        assert (plan.tile.oc_vectors, plan.tile.cols, plan.padding.rows, plan.padding.cols) == (2, 6, 1, pixels), plan
        assert not conv_plan(1, 128, hw, hw, 128, 3, 3, 1, avx2).flat
    assert not conv_plan(1, 64, 224, 228, 64, 3, 3, 1, avx2, flat=True).flat, "2 x 6 columns divide 228"


#: convs planned as one row of pixels on AVX2 (`flat_taps`): odd images (the last tile ends past hout * wout,
#: its pixels there reading the last real pixel's inputs), a 5x5 and a 1x3 kernel, asymmetric padding,
#: dilation, batch 2, output channels padded to the tile, ResNet-50's 3x3 on 7x7, strided convs
FLAT_TAPS_CASES = [
    dict(n=1, c=32, h=13, w=11, oc=64, k=3, pad=1),
    dict(n=2, c=24, h=9, w=11, oc=32, k=5, pad=2),
    dict(n=1, c=16, h=12, w=10, oc=32, k=3, pad=(0, 1, 2, 0), dil=2),
    dict(n=1, c=8, h=9, w=13, oc=32, k=(1, 3), pad=(0, 1, 0, 1)),
    dict(n=1, c=512, h=7, w=7, oc=512, k=3, pad=1),
    dict(n=2, c=80, h=15, w=15, oc=80, k=3, stride=2, pad=1),  # strided: 8 x 8 outputs, 64 padded to 66
    dict(n=1, c=128, h=14, w=15, oc=64, k=3, stride=2, pad=(1, 0, 1, 1)),
]


@NO_AVX2
@pytest.mark.parametrize("case", FLAT_TAPS_CASES, ids=_id)
def test_flat_taps_convs_match_numpy_and_the_row_tiles_bit_for_bit(case):
    """Built for AVX2 (W packed for the flat plan): the conv's accumulators one row of pixels, element-wise
    against float64 numpy, and bit-identical to the kernel with tiles of rows (the same sums in the same
    order: taps, then input channels one by one)."""
    target = tvm.target.Target(AVX2)
    executable, func, arrays, out_shape, reference = _packed_build(case, target)
    acc = re.search(r"conv_local = T.sblock_alloc_buffer\(\((\d+), (\d+), (\d+), (\d+)\)", func.script())
    assert int(acc.group(2)) == 1, f"the pixels as one row: {acc.group(0)}"
    got = _run(executable, arrays, out_shape)
    assert_close(got, reference, _id(case))
    rows, rows_func, rows_arrays, rows_shape, _ = _build_without("flat_taps", case, target)
    assert "conv_local = T.sblock_alloc_buffer((1, 1," not in rows_func.script()
    np.testing.assert_array_equal(got, _run(rows, rows_arrays, rows_shape))


#: flat 1x1 convs whose input is copied channels-last on AVX2: channels a multiple of COPY_CHANNELS (ResNet-50's
#: 1024 -> 256 on 14x14 in small: 7x7), not one (200 = 8 blocks of 25), fewer (24: one block), a strided one
#: (the subsampled pixels read by the copy) and batch 2
COPY_CASES = [
    dict(n=1, c=256, h=7, w=7, oc=128, k=1),
    dict(n=2, c=200, h=5, w=9, oc=128, k=1),
    dict(n=1, c=24, h=6, w=7, oc=136, k=1),
    dict(n=1, c=160, h=11, w=13, oc=128, k=1, stride=2),
]


@NO_AVX2
@pytest.mark.parametrize("case", COPY_CASES, ids=_id)
def test_flat_input_copies_write_blocks_of_channels(case, monkeypatch):
    """A flat 1x1 conv's channels-last input copy writes each pixel's channels in vectors of the largest
    divisor of the channels up to COPY_CHANNELS (a whole channel row per pixel touches a cache line of every
    input plane): element-wise against float64 numpy, and bit-identical to the copy in blocks of one channel
    (a copy: the kernel's sums are the same)."""
    import tvm_fusion.schedules.llvm.conv2d as llvm_conv

    target = tvm.target.Target(AVX2)
    executable, func, arrays, out_shape, reference = _packed_build(case, target)
    block = max(d for d in range(1, COPY_CHANNELS + 1) if case["c"] % d == 0)
    pad = func.script().split('T.sblock("pad")')[0].rsplit("for ", 1)[-1]  # the copy's innermost loop
    assert f"T.vectorized({block})" in pad, pad
    got = _run(executable, arrays, out_shape)
    assert_close(got, reference, _id(case))
    monkeypatch.setattr(llvm_conv, "COPY_CHANNELS", 1)
    single, _, single_arrays, single_shape, _ = _packed_build(case, target)
    np.testing.assert_array_equal(got, _run(single, single_arrays, single_shape))


@NO_AVX2
@pytest.mark.parametrize("case", FLAT_TAPS_CASES, ids=_id)
def test_flat_taps_reduce_each_kernel_row_in_one_loop(case):
    """AVX2 (`_schedule_flat`'s `tap_rows`): a flat conv reads a kernel row's columns and input channels as one
    run of its channels-last input and taps-first W, so it reduces them in one loop of KW * C steps (rw = k // C,
    rc = k % C); not with a dilated width (the run has gaps) nor a kernel one column wide. The sums are in the
    same order: bit-identical to the rows-of-tiles kernel (`test_flat_taps_convs_match_numpy_and_the_row_tiles_bit_for_bit`)."""
    target = tvm.target.Target(AVX2)
    _, func, *_ = _packed_build(case, target)
    kw = case["k"][1] if isinstance(case["k"], tuple) else case["k"]
    dil = case.get("dil", 1)
    update = func.script().split('T.sblock("conv_update")')[1]
    fused = re.search(rf"v_rw = T.axis.reduce\({kw}, (\w+) // {case['c']}\)", update)
    assert (fused is not None) == (kw > 1 and dil == 1), update[:800]
    if fused:
        assert re.search(rf"v_rc = T.axis.reduce\({case['c']}, {fused.group(1)} % {case['c']}\)", update), update[:800]


@pytest.mark.parametrize("target", TILE_TARGETS.values(), ids=TILE_TARGETS.keys())
@pytest.mark.parametrize("size", [112, 56, 28, 20, 14, 10])
def test_stride_one_depthwise_tiles_share_their_taps(size, target):
    """Stride 1: a tile of at most `shared_tap_accumulators` (4) output rows x column vectors whose taps
    unroll (`shared_taps`), one full vector wide where the rows allow, rows before columns (a row shares
    its input rows' loads with the next), padding at most one vector of columns and fewer rows than a tile."""
    facts = cpu_facts(target)
    plan = conv_plan(1, 72, size, size, 1, 3, 3, 72, facts)
    tile = plan.tile
    assert plan.kernel == "depthwise" and tile.shared_taps, plan
    assert tile.accumulators <= shared_tap_accumulators(facts) == 4, tile
    assert plan.padding.cols - size < tile.lanes and plan.padding.rows - size < tile.rows, plan
    if size % 4 == 0:
        assert (tile.rows, tile.vectors) == (4, 1), tile


def _depthwise_loops(func, block: str):
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    return [sch.get(loop) for loop in sch.get_loops(sch.get_sblock(block))]


#: a stride-1 depthwise conv whose column tiles end in padding on every ISA (20 columns: 2 x 16 or 3 x 8 lanes)
RAGGED_DEPTHWISE = dict(n=1, c=24, h=20, w=20, oc=24, k=5, pad=2, groups=24)


@pytest.mark.parametrize("target_name", ["host", pytest.param("avx2", marks=NO_AVX2)])
def test_ragged_depthwise_epilogue_runs_per_row_of_tiles(target_name):
    """The column tiles of a 20-column output end in padding: the SiLU epilogue runs once per row of tiles
    over the 20 real columns (one vector loop, no per-tile predicate), its 25 taps unrolled, each channel's
    padded plane written inside its parallel task; element-wise against the unfused conv with SiLU in
    float64 numpy."""
    target = TARGET if target_name == "host" else tvm.target.Target(AVX2)
    executable, func, arrays, out_shape, _ = _packed_build(RAGGED_DEPTHWISE, target, activation="silu")
    plan = conv_plan(1, 24, 20, 20, 1, 5, 5, 24, cpu_facts(target))
    assert plan.padding.cols // plan.tile.cols > 1 and 20 % plan.tile.cols, plan
    epilogue = _depthwise_loops(func, "epilogue")
    assert (epilogue[-1].kind, int(epilogue[-1].extent)) == (tvm.tirx.ForKind.VECTORIZED, 20), epilogue
    conv = _depthwise_loops(func, "conv_update")
    assert sum(loop.kind == tvm.tirx.ForKind.UNROLLED and int(loop.extent) == 5 for loop in conv) == 2, conv
    pad = _depthwise_loops(func, "pad")
    assert pad[0].kind == tvm.tirx.ForKind.PARALLEL and pad[0].same_as(conv[0]), "the plane inside the task"
    got = _run(executable, arrays, out_shape)
    plain, _, plain_arrays, _, _ = _packed_build(RAGGED_DEPTHWISE, target, activation=None)
    y = _run(plain, plain_arrays, out_shape).astype(np.float64)
    assert_close(got, (y / (1 + np.exp(-y))).astype("float32"), "5x5 depthwise 24 on 20x20 + SiLU")


#: AVX-512 targets whose `model` names their per-core caches: 32 KiB L1d and 1 MiB L2 (Zen 4), 48 KiB and 2 MiB
#: (Sapphire Rapids and later); their code runs only where the host has AVX-512
CACHE_TARGETS = {
    "l1d32": tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2, "model": "l1d=32K,l2=1024K"}),
    "l1d48": tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2, "model": "l1d=48K,l2=2048K"}),
}
#: ResNet-50 convs (n, c, h, w, oc, k, stride, pad) -> their reduction chunk on CACHE_TARGETS: 0 where the panel
#: stays in L1 or the accumulators outgrow it (the stem, 3x3 on 56x56 and 28x28), else a kernel row x the most
#: channels whose weights fit a sixth of L1 (32 KiB: 5.3 KiB, 32 channels of a 32-channel tile; 48 KiB: 64); a
#: 1x1 conv's 28x28 accumulators (100 KiB) within a sixteenth of a 2 MiB L2 but not of a 1 MiB one
RESNET50_CHUNKS = {
    (1, 3, 224, 224, 64, 7, 2, 3): (0, 0),
    (1, 64, 56, 56, 64, 3, 1, 1): (0, 0),
    (1, 128, 28, 28, 128, 3, 1, 1): (0, 0),
    (1, 512, 28, 28, 128, 1, 1, 0): (0, 64),
    (1, 256, 14, 14, 256, 3, 1, 1): (32, 64),
    (1, 1024, 14, 14, 256, 1, 1, 0): (32, 64),
    (1, 512, 7, 7, 512, 3, 1, 1): (32, 64),
    (1, 2048, 7, 7, 512, 1, 1, 0): (32, 64),
}


def _tiled_plan(case, target):
    n, c, h, w, oc, k, stride, pad = case
    return plan_of((n, c, h, w), oc, (c, k, k), (stride,) * 2, (pad,) * 4, (1, 1), 1, cpu_facts(target))


@pytest.mark.parametrize("case", RESNET50_CHUNKS, ids=str)
def test_reduction_chunks_follow_the_target_caches(case):
    """AVX-512 plans chunk the reduction by the target's L1d and L2 (its `model`); AVX2 plans do not (not
    measured there). A chunk divides the input channels and its weights fit a sixth of L1."""
    for target, chunk in zip(CACHE_TARGETS.values(), RESNET50_CHUNKS[case]):
        plan = _tiled_plan(case, target)
        assert plan.kernel == "tiled" and plan.chunk == chunk, (str(target), plan)
        if chunk:
            assert case[1] % chunk == 0
            assert chunk * plan.tile.channels * FLOAT_BYTES <= cpu_facts(target).l1d_bytes // 6
    assert _tiled_plan(case, tvm.target.Target(AVX2)).chunk == 0


#: convs whose reduction the "l1d32" target chunks: 1x1 in channel chunks (with a residual; output channels
#: padded to the tile, input channels no power of two), 3x3 in kernel rows x channels, strided, a batch of 2
CHUNKED_CASES = [
    dict(n=1, c=1024, h=7, w=7, oc=64, k=1),
    dict(n=2, c=800, h=7, w=7, oc=40, k=1),
    dict(n=1, c=256, h=9, w=9, oc=64, k=3, pad=1),
    dict(n=1, c=128, h=14, w=14, oc=32, k=3, stride=2, pad=1),
    dict(n=1, c=512, h=5, w=6, oc=96, k=1),
]


def _chunked_target(name, monkeypatch):
    """The l1d32 AVX-512 target, or AVX2 planned as AVX-512 is (its step cost: row tiles, chunked reductions),
    the same loop nest on the vector width every x86-64 host here runs."""
    if name == "avx512":
        return CACHE_TARGETS["l1d32"]
    monkeypatch.setitem(TILED_STEP_COSTS, "avx2", TILED_STEP_COSTS["avx512"])
    return tvm.target.Target({**AVX2, "model": "l1d=32K,l2=1024K"})


@pytest.mark.parametrize("residual", [False, True], ids=["relu", "residual"])
@pytest.mark.parametrize("target_name", ["avx512", pytest.param("avx2", marks=NO_AVX2)])
@pytest.mark.parametrize("case", CHUNKED_CASES, ids=_id)
def test_chunked_convs_match_numpy(case, target_name, residual, monkeypatch):
    """A chunked conv zeroes its block's accumulators, then runs every tile of pixels per chunk (the chunk loops
    outside the tile loops) and matches float64 numpy, with and without a residual, where the host runs the
    target's code (AVX-512 code elsewhere only compiles and is checked for its loop nest); the 3x3 stride-1 conv
    on the direct kernel (the Winograd conv off)."""
    monkeypatch.setattr(llvm_winograd, "WINOGRAD_ISAS", ())
    target = _chunked_target(target_name, monkeypatch)
    executable, func, arrays, out_shape, reference = _packed_build(case, target, residual=residual)
    plan = plan_of((case["n"], case["c"], case["h"], case["w"]), case["oc"], (case["c"], case["k"], case["k"]),
                   (case.get("stride", 1),) * 2, (case.get("pad", 0),) * 4, (1, 1), 1, cpu_facts(target))
    assert plan.kernel == "tiled" and plan.chunk, plan
    loops = re.search(r"for (rh, rc_0, [^)]*) in T\.grid\(([^)]*)\):", func.script())
    assert loops, "the chunk loops (kernel row, channel chunk) surround the tile loops"
    names, extents = loops.group(1).split(", "), [int(e) for e in loops.group(2).split(", ")]
    assert names[2:4] == ["h_0", "ww_0"] and extents[1] == case["c"] // plan.chunk, loops.group(0)
    if _runs_here(target):
        assert_close(_run(executable, arrays, out_shape), reference, f"{target_name} {_id(case)}")
