"""The 1x1 convs over pixel vectors (`conv2d_pointwise`). groups = 1 ("pointwise"): which shapes take it,
its tiles per target, its schedule's structure, and numerics against float64 numpy (run on the host: AVX2
here). Grouped ("pixels"): the plan per target, numerics against numpy, bit-identical to the tiled kernel it
replaces, and an AVX-512 build (compiled only)."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from tvm_fusion._tvm import device_lowering_passes, te, tvm
from tvm_fusion.hardware import cpu_facts
from tvm_fusion.schedules.llvm import conv2d as llvm_conv2d
from tvm_fusion.schedules.llvm import conv2d_pointwise
from tvm_fusion.schedules.llvm.conv2d import conv_plan, flat_pixels, pack_conv, pixel_vector_pointwise
from tvm_fusion.schedules.llvm.conv2d_pointwise import (CHUNK_BYTES, PixelTile, channel_chunks, padded_pixels,
                                                        pixel_tiles)
from tvm_fusion.schedules.llvm.conv2d_test import AVX2, NO_AVX2, TARGET, _id, _packed_build, _run, conv_reference
from tvm_fusion.precision import numpy_dtype
from tvm_fusion.testing import RESNET50_CONVS, assert_close, conv_primfunc

AVX2_TARGET = tvm.target.Target(AVX2)
AVX512 = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}


def _plan(facts, c, oc, h, w, k=1, stride=1, pad=0):
    flat = any(rule(k, k, (stride,) * 2, (pad,) * 4, 1, facts) for rule in (flat_pixels, pixel_vector_pointwise))
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    return conv_plan(1, oc, oh, ow, c, k, k, 1, facts, strided=stride > 1, flat=flat)


def test_avx2_resnet50_pointwise_plans():
    """AVX2: every stride-1 1x1 conv whose pixels are whole vectors (56x56, 28x28) takes the pixel tile;
    its accumulators, its x vectors and a broadcast fit the 16 ymm, its pixel vectors divide H * W and its
    padded channels waste under 2%. 14x14 and 7x7 (196 and 49 pixels), strided and 3x3 convs keep the
    channel-vectorized tile. AVX-512 (`pixel_vector_pointwise`, no flat tiled plans) takes the pixel tile
    for the same convs where they do not narrow their channels or have at least 56x56 pixels
    (`pointwise_narrowing_pixels`): 512 -> 128 and 512 -> 256 on 28x28 keep the tiled kernel."""
    avx2, avx512 = cpu_facts(AVX2_TARGET), cpu_facts(tvm.target.Target(AVX512))
    kernels = set()
    for n, c, h, w, oc, k, stride, pad in RESNET50_CONVS:
        plan = _plan(avx2, c, oc, h, w, k, stride, pad)
        pointwise = k == 1 and stride == 1 and h * w % avx2.float32_lanes == 0
        assert (plan.kernel == "pointwise") == pointwise, (c, oc, h, w, k, stride, plan)
        wide = _plan(avx512, c, oc, h, w, k, stride, pad)
        assert (wide.kernel == "pointwise") == (pointwise and (oc >= c or h * w >= 56 * 56)), (c, oc, h, w, wide)
        assert wide.kernel == "pointwise" or not wide.flat, wide
        if wide.kernel == "pointwise":
            assert wide.tile.lanes == 16 and wide.tile.accumulators + wide.tile.vectors + 1 <= 32, wide
        if pointwise:
            tile = plan.tile
            assert tile.accumulators + tile.vectors + 1 <= avx2.vector_registers and tile.accumulators >= 8
            assert h * w % tile.cols == 0 and (plan.padding.rows, plan.padding.cols) == (1, h * w)
            assert plan.padding.group_channels * 49 <= oc * 50, plan
            kernels.add((c, oc, h))
    assert len(kernels) == 7


#: (C_in, C_out, H, W) of flat convs whose pixels no vector divides: the shallow, non-narrowing ones take
#: the pointwise kernel with a last tile past H * W (SqueezeNet-like 55x55, 27x27, 13x13; 14x14)
TAIL_PLANS = [(16, 64, 55, 55), (32, 128, 27, 27), (64, 256, 13, 13), (128, 128, 14, 14)]
#: deep, narrowing or small ones keep the tiled kernel (ResNet-50's 14x14 and 7x7, DenseNet's 14x14 and 7x7,
#: Inception-v2's 14x14, a squeeze, 7x7)
TILED_PLANS = [(1024, 256, 14, 14), (256, 1024, 14, 14), (1024, 512, 14, 14), (512, 2048, 7, 7),
               (2048, 512, 7, 7), (512, 128, 14, 14), (992, 128, 7, 7), (576, 64, 14, 14), (96, 16, 55, 55),
               (64, 128, 7, 7)]


def test_avx2_tail_plans():
    """A tail plan computes whole tiles (padding.cols = the pixels rounded up to the tile's), its tile fits
    the registers and is no wider than the pixels; so on AVX-512 (16 lanes, none of these pixel counts whole
    vectors of them)."""
    avx2, avx512 = cpu_facts(AVX2_TARGET), cpu_facts(tvm.target.Target(AVX512))
    for c, oc, h, w in TAIL_PLANS:
        plan = _plan(avx2, c, oc, h, w)
        tile = plan.tile
        assert plan.kernel == "pointwise" and h * w % avx2.float32_lanes, (c, oc, h, w, plan)
        assert tile.accumulators + tile.vectors + 1 <= avx2.vector_registers and tile.cols <= h * w
        assert plan.padding.cols == padded_pixels(h * w, tile) == -(-h * w // tile.cols) * tile.cols
        wide = _plan(avx512, c, oc, h, w)
        assert wide.kernel == "pointwise" and wide.padding.cols == padded_pixels(h * w, wide.tile) > h * w, wide
    for c, oc, h, w in TILED_PLANS:
        assert _plan(avx2, c, oc, h, w).kernel == "tiled", (c, oc, h, w)
        assert _plan(avx512, c, oc, h, w).kernel == "tiled", (c, oc, h, w)


#: flat convs whose channels the tiled kernel's tile would pad (its epilogue then runs under a channel
#: predicate): the pointwise kernel with a tail whatever their depth (SqueezeNet's classifier, 1000 classes)
PADDED_PLANS = [(512, 1000, 13, 13), (256, 1000, 13, 13), (512, 1000, 14, 14)]


def test_avx2_padded_channel_plans():
    """A flat conv the tiled kernel would pad to its channel tile takes the pointwise kernel (tail tile past
    H * W); 1024 classes, a multiple of the tile, keep the tiled kernel. AVX-512 (`pixel_tail`) takes it where
    whole vectors pad the pixels by at most PIXEL_TAIL_WASTE: 169 pixels in 176 (4%), not 196 in 208 (6%)."""
    avx2, avx512 = cpu_facts(AVX2_TARGET), cpu_facts(tvm.target.Target(AVX512))
    for c, oc, h, w in PADDED_PLANS:
        plan = _plan(avx2, c, oc, h, w)
        assert plan.kernel == "pointwise" and plan.padding.cols == padded_pixels(h * w, plan.tile), plan
        wide = _plan(avx512, c, oc, h, w)
        assert wide.kernel == ("pointwise" if h * w == 169 else "tiled"), (c, oc, h, w, wide)
    assert _plan(avx2, 512, 1024, 13, 13).kernel == "tiled"
    assert _plan(avx512, 512, 1024, 13, 13).kernel == "tiled"


@NO_AVX2
def test_padded_channel_plan_is_bit_identical_to_the_tiled_kernel(monkeypatch):
    """SqueezeNet's classifier (512 -> 1000 on 13x13): the pointwise kernel returns the very bits of the
    tiled kernel it replaces (the same reduction order)."""
    case = dict(n=1, c=512, h=13, w=13, oc=1000, k=1)
    outputs = []
    for pixel_tile in (llvm_conv2d.choose_pixel_tile, lambda *a, **k: None):
        monkeypatch.setattr(llvm_conv2d, "choose_pixel_tile", pixel_tile)
        executable, _, arrays, out_shape, reference = _packed_build(case, AVX2_TARGET)
        outputs.append(_run(executable, arrays, out_shape))
    assert_close(outputs[0], reference, _id(case))
    np.testing.assert_array_equal(outputs[0], outputs[1])


def test_pixel_tiles_follow_the_registers():
    """A tile's accumulators + its x vectors + one broadcast fit the register file, its vectors divide the
    pixels; no tile when a vector does not (196 pixels, 8 lanes)."""
    for lanes, registers in ((8, 16), (16, 32), (4, 32)):
        tiles = pixel_tiles(960, lanes, registers)
        assert tiles and all(t.accumulators + t.vectors + 1 <= registers and 960 % t.cols == 0 for t in tiles)
    assert not pixel_tiles(196, 8, 16)
    tails = pixel_tiles(49, 8, 16, tail=True)
    assert tails and all(t.cols <= 49 and t.accumulators + t.vectors + 1 <= 16 for t in tails)
    assert {t.vectors for t in tails} == set(range(1, 7))


def test_channel_chunks_keep_the_weights_in_cache_and_pad_little():
    """PP-OCR's 480 -> 480: 120 blocks of 4 rows in chunks whose weights fit CHUNK_BYTES; 512 -> 256 in
    blocks of 6 rows: 43 blocks spread over 4 chunks of 11 (264 channels, not 13 + 13 + 13 + 4)."""
    chunks, blocks = channel_chunks(480, 4, 480)
    assert chunks * blocks * 4 == 480 and blocks * 4 * 480 * 4 <= CHUNK_BYTES
    assert channel_chunks(256, 6, 512) == (4, 11)
    assert channel_chunks(256, 6, 64) == (1, 43)


def test_channel_chunks_of_deep_inputs_copy_them_once():
    """A chunk's weights may take CHUNK_INPUT_FRACTION of the input's bytes where that exceeds CHUNK_BYTES
    (each chunk copies the input into its strips), all of them where they are at least the input. ResNet-50's
    512 -> 128 and 512 -> 256 on 28x28 in one chunk, its 1x1/2 256 -> 512 to 28x28 in 2 (4 on CHUNK_BYTES
    alone), 128 -> 512 on 28x28 keeps its 2; the AVX2 plan of 512 -> 256 pads to one chunk of 6-row blocks
    (258 channels, not 4 chunks of 5: 260), and AVX-512 targets keep the tiled kernel."""
    assert channel_chunks(128, 5, 512, 784) == (1, 26) and channel_chunks(128, 5, 512) == (2, 13)
    assert channel_chunks(256, 5, 512, 784) == (1, 52) and channel_chunks(256, 5, 512) == (4, 13)
    assert channel_chunks(512, 6, 256, 784) == (2, 43) and channel_chunks(512, 6, 256) == (4, 22)
    assert channel_chunks(512, 6, 128, 784) == channel_chunks(512, 6, 128) == (2, 43)
    assert channel_chunks(64, 5, 256, 3136) == channel_chunks(64, 5, 256) == (1, 13)
    # the weights at least the input (output channels at least the pixels): SqueezeNet's classifier, PP-OCR
    assert channel_chunks(1000, 6, 512, 169) == (1, 167) and channel_chunks(1000, 6, 512)[0] == 13
    assert channel_chunks(480, 4, 480, 480) == (1, 120)
    avx2, avx512 = cpu_facts(AVX2_TARGET), cpu_facts(tvm.target.Target(AVX512))
    plan = _plan(avx2, 512, 256, 28, 28)
    assert (plan.kernel, plan.tile.rows, plan.padding.group_channels) == ("pointwise", 6, 258), plan
    assert _plan(avx2, 512, 128, 28, 28).padding.group_channels == 130
    assert _plan(avx512, 512, 128, 28, 28).kernel == "tiled"


@NO_AVX2
@pytest.mark.parametrize("case", [dict(n=1, c=512, h=28, w=28, oc=128, k=1),
                                  dict(n=1, c=384, h=8, w=16, oc=40, k=1),
                                  dict(n=1, c=256, h=13, w=13, oc=1000, k=1)], ids=_id)
def test_one_chunk_is_bit_identical_to_chunks_of_weights(case, monkeypatch):
    """Fewer chunks (CHUNK_INPUT_FRACTION, or weights at least the input: 256 -> 1000 on 13x13, a last tile
    past H * W) reorder only the loops over output channels: the conv returns the very bits of the chunks
    CHUNK_BYTES alone gives (the same reduction order), within TOLERANCES of numpy."""
    outputs = []
    for fraction in (conv2d_pointwise.CHUNK_INPUT_FRACTION, 0):
        monkeypatch.setattr(conv2d_pointwise, "CHUNK_INPUT_FRACTION", fraction)
        monkeypatch.setattr(conv2d_pointwise, "CHUNK_BYTES", 32 * 1024 if case["c"] == 384 else 160 * 1024)
        plan = _plan(cpu_facts(AVX2_TARGET), case["c"], case["oc"], case["h"], case["w"])
        assert plan.kernel == "pointwise", plan
        chunks, _ = channel_chunks(case["oc"], plan.tile.rows, case["c"], case["h"] * case["w"])
        assert (chunks == 1) if fraction else (chunks > 1)
        executable, _, arrays, out_shape, reference = _packed_build(case, AVX2_TARGET)
        outputs.append(_run(executable, arrays, out_shape))
    assert_close(outputs[0], reference, _id(case))
    np.testing.assert_array_equal(outputs[0], outputs[1])


#: 56x56 ResNet-50 shapes, 28x28, a residual-less PP-OCR-like wide map, channels padded to the rows and to
#: whole chunks, batch 2, pixels that are exactly one tile
CASES = [
    dict(n=1, c=64, h=56, w=56, oc=256, k=1),
    dict(n=1, c=512, h=28, w=28, oc=256, k=1),
    dict(n=2, c=40, h=6, w=80, oc=60, k=1),
    dict(n=1, c=24, h=3, w=16, oc=13, k=1),
    dict(n=1, c=480, h=2, w=40, oc=120, k=1),
    # pixels no vector divides: a last tile past H * W (odd counts, 14x14, 7x7, batch 2, channels padded)
    dict(n=1, c=16, h=55, w=55, oc=64, k=1),
    dict(n=1, c=32, h=27, w=27, oc=128, k=1),
    dict(n=1, c=128, h=14, w=14, oc=128, k=1),
    dict(n=1, c=64, h=7, w=7, oc=128, k=1),
    dict(n=2, c=24, h=9, w=9, oc=40, k=1),
    dict(n=1, c=48, h=13, w=13, oc=200, k=1),
    dict(n=1, c=512, h=13, w=13, oc=1000, k=1),  # deep, channels the tiled kernel pads (`PADDED_PLANS`)
    # fewer than STRIP_COPY_CHANNELS outputs on whole tiles: x read in place (`strips_in_place`), batch 2 too
    dict(n=1, c=96, h=16, w=16, oc=24, k=1),
    dict(n=2, c=32, h=8, w=16, oc=16, k=1),
    # one output channel: a one-row tile, whose conv has no channel loop (YOLOv8's DFL conv, 16 -> 1 on 4x2100)
    dict(n=1, c=16, h=4, w=2100, oc=1, k=1),
]


@NO_AVX2
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_pointwise_matches_numpy(case, monkeypatch):
    """W packed in blocks of the tile's rows (zero rows beyond cout), a residual, the same element-wise
    verdict (numerics.TOLERANCES) as every conv kernel; run for the AVX2 target. Tail plans on any pixel
    count here (7x7 and 9x9 too, under TAIL_MIN_PIXELS)."""
    monkeypatch.setattr(llvm_conv2d, "TAIL_MIN_PIXELS", 1)
    target = AVX2_TARGET
    plan = _plan(cpu_facts(target), case["c"], case["oc"], case["h"], case["w"])
    assert plan.kernel == "pointwise", plan
    _, attrs, shapes = conv_primfunc(**case, residual=True, target=target)
    rng = np.random.default_rng(3)
    x, r, wt, b = (rng.standard_normal(s).astype("float32") for s in shapes)
    wp, _ = pack_conv([wt, b], attrs, shapes, target)
    assert wp.shape == (plan.padding.group_channels // plan.tile.rows, 1, 1, case["c"], plan.tile.rows)
    scheduled = _schedule(_func_with_packed(case, attrs, wp.shape, target), attrs, target)
    executable = tvm.compile(tvm.IRModule({"main": scheduled}), target)
    got = _run(executable, [x, r, wp, b], [case["n"], case["oc"], case["h"], case["w"]])
    assert_close(got, conv_reference(x, wt, b, r, attrs).astype("float32"), _id(case))


def _func_with_packed(case, attrs, w_shape, target):
    """The llvm compute of `case` with a residual, on W packed to `w_shape` (as fuse builds it)."""
    n, c, h, w, oc = (case[k] for k in ("n", "c", "h", "w", "oc"))
    xs, rs = te.placeholder((n, c, h, w), "float32", name="x"), te.placeholder((n, oc, h, w), "float32", name="r")
    ws, bs = te.placeholder(w_shape, "float32", name="w"), te.placeholder((oc,), "float32", name="b")
    out = llvm_conv2d.conv2d_llvm(xs, ws, bs, rs, **attrs, target=target)
    return te.create_prim_func([xs, rs, ws, bs, out]).without_attr("global_symbol")


def _schedule(func, attrs, target):
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    with target:
        llvm_conv2d.schedule_conv2d_llvm(sch, attrs, target)
    return sch.mod["main"].with_attr("global_symbol", "main")


def test_pointwise_schedule_vectorizes_pixels_and_stores_whole_vectors():
    """The accumulators are local, x is copied into strips [tile, C_in, tile pixels] inside the parallel
    loop, the conv's pixel lanes and the epilogue's store are vectorized at the target's width (whole
    vectors of one output row), and the built kernel has no gathers."""
    case = dict(n=1, c=64, h=56, w=56, oc=256, k=1)
    executable, func, *_ = _packed_build(case, AVX2_TARGET)
    script = func.script()
    assert 'scope="local"' in script and "pad = T.sblock_alloc_buffer((1, 196, 64, 16))" in script
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    for name in ("conv_update", "epilogue"):
        loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock(name))]
        assert loops[0].kind == tvm.tirx.ForKind.PARALLEL
        assert (loops[-1].kind, int(loops[-1].extent)) == (tvm.tirx.ForKind.VECTORIZED, 8), name
    asm = executable.mod.inspect_source("asm")
    assert "vgather" not in asm and "vfmadd231ps" in asm and "zmm" not in asm


def test_avx512_pointwise_compiles(monkeypatch):
    """Compile only (an AVX-512 kernel cannot run on an AVX2 host): with `pixel_vectors` turned on for
    AVX-512, the plan asks the target for 16 lanes and 32 zmm and the kernel builds with zmm FMAs."""
    avx512 = tvm.target.Target(AVX512)
    facts = cpu_facts(avx512)
    cost = dataclasses.replace(llvm_conv2d.step_cost(facts), pixel_vectors=True, flat_pointwise=True)
    monkeypatch.setitem(llvm_conv2d.TILED_STEP_COSTS, facts.isa, cost)
    plan = _plan(facts, 64, 256, 56, 56)
    assert plan.kernel == "pointwise" and plan.tile.lanes == 16
    assert 16 < plan.tile.accumulators + plan.tile.vectors + 1 <= 32, plan.tile
    executable, func, *_ = _packed_build(dict(n=1, c=64, h=56, w=56, oc=256, k=1), avx512)
    asm = executable.mod.inspect_source("asm")
    assert "zmm" in asm and "vfmadd231ps" in asm


def test_tail_schedule_keeps_the_main_loop_whole_vectors():
    """196 pixels (14x14): the conv computes whole tiles, LoopPartition peels the last one (the tile loops
    carry its hint), and the lowered main loop stores each accumulator as one whole 8-lane vector with no
    lane predicate; only the peeled tile's epilogue, after it, is scalar. No gathers, ymm only."""
    case = dict(n=1, c=128, h=14, w=14, oc=128, k=1)
    tile = _plan(cpu_facts(AVX2_TARGET), 128, 128, 14, 14).tile
    executable, func, *_ = _packed_build(case, AVX2_TARGET)
    assert func.script().count("pragma_loop_partition_hint") == 3  # pixel groups, tiles, copy
    with AVX2_TARGET:
        lowered = tvm.transform.Sequential(device_lowering_passes())(tvm.IRModule({"main": func}))["main"]
    stores = [line.strip() for line in lowered.script().splitlines() if line.strip().startswith("epilogue_1[")]
    whole = [i for i, line in enumerate(stores) if ":" in line.split("]")[0]]
    assert len(whole) == tile.accumulators and whole == list(range(len(whole))), stores
    assert len(stores) > len(whole)  # the peeled tile
    asm = executable.mod.inspect_source("asm")
    assert "vgather" not in asm and "vfmadd231ps" in asm and "zmm" not in asm


# ---------------------------------------------------------------- grouped 1x1 convs ("pixels")
LOCAL_ACCUMULATORS = re.compile(r'conv\w* = T.sblock_alloc_buffer\([^\n]*scope="local"')
#: ShuffleNet's grouped 1x1 convs on 28x28 and 56x56 (34 channels per group: tiles of 4 span groups), odd
#: channels and a batch of 2, and pixels that are not whole vectors
SHUFFLENET = [dict(n=1, c=136, h=28, w=28, oc=136, k=1, groups=4), dict(n=1, c=24, h=56, w=56, oc=112, k=1, groups=4),
              dict(n=1, c=112, h=28, w=28, oc=112, k=1, groups=4), dict(n=2, c=30, h=4, w=8, oc=45, k=1, groups=3),
              dict(n=1, c=24, h=7, w=9, oc=36, k=1, groups=3)]  # 63 pixels: padded to 64, x copied


def _group_id(case):
    return "{c}-{oc}g{groups}_{h}x{w}_n{n}".format(**case)


def target_lanes(target) -> int:
    return cpu_facts(target).float32_lanes


def _group_plan(case, spec):
    facts = cpu_facts(tvm.target.Target(spec))
    return conv_plan(case["n"], case["oc"], case["h"], case["w"], case["c"] // case["groups"], 1, 1, case["groups"],
                     facts, pixels=True)


def test_grouped_plans_per_target():
    """AVX2: 4 channels x 2 vectors of 8 pixels (16 registers: accumulators and their input vectors); AVX-512
    fits twice the accumulators in 32 zmm; the tiled kernel where its channels pad no more than the pixels."""
    plan = _group_plan(SHUFFLENET[0], AVX2)
    assert plan.kernel == "pixels" and plan.tile == PixelTile(4, 2, 8)
    assert plan.padding.group_channels == 136, "136 channels are whole tiles of 4"
    wide = _group_plan(SHUFFLENET[0], AVX512)
    assert wide.kernel == "pixels" and wide.tile.lanes == 16 and 2 * wide.tile.accumulators <= 32
    stage2 = _group_plan(dict(n=1, c=272, h=14, w=14, oc=272, k=1, groups=4), AVX2)
    assert stage2.kernel == "pixels" and stage2.padding.cols == 208, "196 pixels pad less than 68 channels"
    assert stage2.tile == PixelTile(4, 2, 8)
    assert _group_plan(dict(n=1, c=544, h=7, w=7, oc=544, k=1, groups=4), AVX2).kernel == "tiled", "136 channels"
    assert _group_plan(dict(n=1, c=256, h=13, w=13, oc=256, k=1, groups=2), AVX2).kernel == "tiled", "AlexNet-like"
    assert not conv2d_pointwise.grouped_pointwise(3, 3, (1, 1), (1, 1, 1, 1), 4, 34)
    assert not conv2d_pointwise.grouped_pointwise(1, 1, (1, 1), (0, 0, 0, 0), 34, 1), "depthwise"


@pytest.mark.parametrize("target_name", ["host", pytest.param("avx2", marks=NO_AVX2)])
@pytest.mark.parametrize("case", SHUFFLENET, ids=_group_id)
def test_grouped_matches_numpy_and_the_tiled_kernel_bit_for_bit(case, target_name, monkeypatch):
    """Against float64 numpy (the numerics table), and equal bit for bit to the tiled kernel (the same
    left-to-right sum over each group's channels)."""
    target = TARGET if target_name == "host" else tvm.target.Target(AVX2)
    executable, func, arrays, out_shape, reference = _packed_build(case, target)
    if _group_plan(case, target).kernel != "pixels":
        pytest.skip("this target's vectors do not divide the pixels")
    assert LOCAL_ACCUMULATORS.search(func.script()) and arrays[1].ndim == 4, "accumulators in registers, W unpacked"
    assert ('T.sblock("pad' in func.script()) == (case["h"] * case["w"] % target_lanes(target) != 0)
    got = _run(executable, arrays, out_shape)
    assert_close(got, reference, _group_id(case))
    monkeypatch.setattr(conv2d_pointwise, "choose_group_tile", lambda *_: None)
    tiled, _, tiled_arrays, *_ = _packed_build(case, target)
    np.testing.assert_array_equal(got, _run(tiled, tiled_arrays, out_shape))


#: 11 channels a group (a prime over 8): the plan's tile is one channel x 8 pixel vectors
ONE_CHANNEL_TILES = dict(n=1, c=12, h=8, w=8, oc=66, k=1, groups=6)


@NO_AVX2
def test_one_channel_tiles_keep_their_channel_loop(monkeypatch):
    """With one channel a tile, reverse_compute_at makes no channel loop in the epilogue, so its last two loops
    were the loop over all the channel tiles and the pixels: unrolling the first (66 tiles here) made a
    grouped 1x1 conv of 20 groups on 30 x 55 take 3 minutes to compile (found by the kernel fuzzer,
    tests/fuzz/kernels.py). Now only the tile's vectors are unrolled; the sums are unchanged (numpy, and bit for
    bit the tiled kernel)."""
    plan = _group_plan(ONE_CHANNEL_TILES, AVX2)
    assert plan.kernel == "pixels" and plan.tile == PixelTile(1, 8, 8)
    executable, func, arrays, out_shape, reference = _packed_build(ONE_CHANNEL_TILES, AVX2_TARGET)
    unrolled = [int(n) for n in re.findall(r"T\.unroll\((\d+)\)", func.script())]
    assert unrolled and max(unrolled) <= plan.tile.vectors, unrolled
    got = _run(executable, arrays, out_shape)
    assert_close(got, reference, _group_id(ONE_CHANNEL_TILES))
    monkeypatch.setattr(conv2d_pointwise, "choose_group_tile", lambda *_: None)
    tiled, _, tiled_arrays, *_ = _packed_build(ONE_CHANNEL_TILES, AVX2_TARGET)
    np.testing.assert_array_equal(got, _run(tiled, tiled_arrays, out_shape))


def test_grouped_avx512_build_compiles():
    """The AVX-512 plan builds (compiled only: this host may not run it) and uses zmm vectors."""
    executable, func, *_ = _packed_build(SHUFFLENET[0], tvm.target.Target(AVX512))
    assert LOCAL_ACCUMULATORS.search(func.script())
    assert "zmm" in executable.mod.inspect_source("asm")


@pytest.mark.parametrize("hw", [8, 7], ids=["whole-vectors", "padded-pixels"])
def test_grouped_symbolic_batch_and_residual_through_the_fused_build(hw):
    """A grouped 1x1 conv + BN + residual add + ReLU with a symbolic batch, through the whole fused build (the
    llvm compute under the host target): batches 1 and 3 of one build against onnxruntime, element-wise."""
    from tvm_fusion._tvm import relax
    from tvm_fusion.build.builder import build
    from tvm_fusion.check.compare import run_onnxruntime
    from tvm_fusion.frontend.importer import SymDim, import_onnx
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


@pytest.mark.parametrize("case", [SHUFFLENET[0], SHUFFLENET[-1]], ids=_group_id)
def test_grouped_float16_widens_to_float32(case):
    """float16 x and W: the products summed in float32, the output rounded once (the float16 tolerance)."""
    func, attrs, shapes = conv_primfunc(**case, target=TARGET, dtype="float16")
    scheduled = _schedule(func, attrs, TARGET)
    assert LOCAL_ACCUMULATORS.search(scheduled.script())
    rng = np.random.default_rng(0)
    x, w = (rng.standard_normal(s).astype("float16") for s in shapes[:2])
    b = rng.standard_normal(shapes[2]).astype("float32")
    out = tvm.runtime.tensor(np.zeros([int(d) for d in func.params[-1].shape], "float16"))
    tvm.compile(tvm.IRModule({"main": scheduled}), TARGET)["main"](*[tvm.runtime.tensor(a) for a in (x, w, b)], out)
    want = conv_reference(x.astype("float32"), w.astype("float32"), b, None, attrs).astype("float16")
    assert_close(out.numpy(), want, "float16 " + _group_id(case))


@pytest.mark.parametrize("case,residual,kernel", [
    (SHUFFLENET[0], False, "pixels"), (SHUFFLENET[-1], True, "pixels"),
    (dict(n=1, c=64, h=56, w=56, oc=256, k=1), True, "pointwise"), (dict(n=1, c=64, h=56, w=56, oc=64, k=3, pad=1),
                                                                    False, "tiled")],
    ids=["grouped-28x28", "grouped-7x9-residual", "pointwise-56x56-residual", "tiled-3x3"])
def test_schedule_dispatches_on_the_plan_of_its_operands(case, residual, kernel):
    """schedule_conv2d_llvm picks the loop nest from the plan of its PrimFunc's operand shapes (x, [residual],
    W, b: the plan the compute padded to), not from the conv stage's loops."""
    func, attrs, _ = conv_primfunc(**case, residual=residual, target=AVX2_TARGET)
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    assert llvm_conv2d.scheduled_plan(sch, attrs, cpu_facts(AVX2_TARGET)).kernel == kernel


def test_pixel_groups_balance_the_threads():
    """Pixel groups of whole tiles whose parallel tasks split evenly over the threads: SqueezeNet's 16 -> 64 on
    55x55 (2 x 5 tiles: 75 whole + a tail tile) in 15 groups of 5 on two threads (3 of 25 left one thread 2 of
    them), one group on one; Inception-v2's 28x28 convs (49 tiles of 5 x 2) one tile a group on two threads, 7 on one;
    groups whose count already splits evenly (the classifier's 2 groups of 5) unchanged."""
    tail_group, pixel_group = conv2d_pointwise._tail_group, conv2d_pointwise._pixel_group
    assert tail_group(76, 40, 16, 2) == 5 and tail_group(76, 40, 16, 1) == 75
    assert tail_group(11, 16, 512, 2) == 5 and tail_group(31, 24, 32, 2) == 15
    assert pixel_group(49, 16, 192, 2) == 1 and pixel_group(49, 16, 192, 1) == 7
    assert pixel_group(49, 16, 320, 2, chunks=2) == 7  # 14 tasks: 7 a thread
    assert pixel_group(196, 16, 64, 2) == 49  # 4 groups


#: MobileNetV2's shapes that take the pixel kernel and the channel-vector depthwise kernel on AVX-512 too
#: (a 1x1 expand, a 3x3/2 depthwise, a 3x3 depthwise on 7 columns), smaller maps
MOBILENET_CASES = [(dict(n=1, c=16, h=28, w=28, oc=96, k=1), "pointwise"),
                   (dict(n=1, c=96, h=28, w=28, oc=24, k=1), "pointwise"),  # a project: x read in place
                   (dict(n=1, c=32, h=28, w=28, oc=32, k=3, stride=2, pad=1, groups=32), "depthwise_channels"),
                   (dict(n=1, c=32, h=7, w=7, oc=32, k=3, stride=1, pad=1, groups=32), "depthwise_channels")]


@pytest.mark.parametrize("target_name", ["host", pytest.param("avx2", marks=NO_AVX2)])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case,kernel", MOBILENET_CASES, ids=lambda v: _id(v) if isinstance(v, dict) else v)
def test_mobilenet_plans_match_numpy_in_each_dtype(case, kernel, dtype, target_name):
    """On AVX-512 (the host here) and AVX2 both: the plan named, W packed as fuse packs it, every dtype
    element-wise against float64 numpy within its tolerance (x, W, output in `dtype`, the bias float32)."""
    target = TARGET if target_name == "host" else AVX2_TARGET
    func, attrs, shapes = conv_primfunc(**case, target=target, dtype=dtype)
    facts = cpu_facts(target)
    stride, pad, groups = case.get("stride", 1), case.get("pad", 0), case.get("groups", 1)
    out_hw = [int(d) for d in func.params[-1].shape][2:]
    plan = conv_plan(1, case["oc"], *out_hw, case["c"] // groups, case["k"], case["k"], groups, facts,
                     strided=stride > 1, flat=llvm_conv2d.one_row_pixels(case["k"], case["k"], (stride,) * 2,
                                                                          (pad,) * 4, groups, case["c"] // groups,
                                                                          case["oc"], facts))
    if facts.isa in ("avx2", "avx512"):
        assert plan.kernel == kernel, plan
    rng = np.random.default_rng(3)
    np_dtype = numpy_dtype(dtype)
    x, w = (rng.standard_normal(s).astype(np_dtype) for s in shapes[:2])
    b = rng.standard_normal(shapes[2]).astype("float32")
    packed = pack_conv([w, b], attrs, shapes, target) or [w, b]
    xs = te.placeholder(x.shape, dtype, name="x")
    ws = te.placeholder(packed[0].shape, str(packed[0].dtype), name="w")  # uint32 pairs on AVX512-BF16
    bs = te.placeholder(b.shape, "float32", name="b")
    out = llvm_conv2d.conv2d_llvm(xs, ws, bs, **attrs, target=target)
    scheduled = _schedule(te.create_prim_func([xs, ws, bs, out]).without_attr("global_symbol"), attrs, target)
    got = tvm.runtime.tensor(np.zeros([int(d) for d in out.shape], np_dtype))
    tvm.compile(tvm.IRModule({"main": scheduled}), target)["main"](
        *[tvm.runtime.tensor(a) for a in (x, packed[0], b)], got)
    want = conv_reference(x.astype("float32"), w.astype("float32"), b, None, attrs)
    assert_close(got.numpy(), want.astype(np_dtype), f"{dtype} {_id(case)}")


@pytest.mark.parametrize("activation,heavy", [("relu", False), ("relu6", False), ("hardswish", False),
                                              ("hardsigmoid", False), ("silu", True), ("sigmoid", True),
                                              ("tanh", True), ("gelu_erf", True), ("gelu_tanh", True)])
@pytest.mark.parametrize("residual", [False, True])
def test_heavy_epilogues_are_the_ones_with_exp_or_a_rational(activation, heavy, residual):
    """`heavy_epilogue` counts the epilogue's floating-point nodes: the activations built on fast_math.py's
    exp, sigmoid, tanh and erf are past HEAVY_EPILOGUE_NODES, the piecewise-linear ones far below it, with or
    without a residual add."""
    func, _, _ = conv_primfunc(n=1, c=8, h=8, w=8, oc=16, k=1, activation=activation, residual=residual,
                               target=TARGET)
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    assert conv2d_pointwise.heavy_epilogue(sch, sch.get_sblock("epilogue")) == heavy


def _epilogue_row_loop(func, rows: int):
    """The epilogue's loop over the tile's `rows` output channels (the one of that extent under the
    parallel loop)."""
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock("epilogue"))]
    return next(loop for loop in loops[1:] if int(loop.extent) == rows)


@pytest.mark.parametrize("target_name", ["avx512", pytest.param("avx2", marks=NO_AVX2)])
def test_silu_epilogue_rows_stay_rolled(target_name, monkeypatch):
    """A pointwise tile's SiLU epilogue keeps its rows (output channels) rolled, a ReLU one unrolls them:
    unrolled, each row's sigmoid temporaries met every live accumulator and spilled. On AVX2 (runs here)
    element-wise against the unfused conv with SiLU in float64 numpy, and bit-identical to the unrolled
    epilogue; the AVX-512 kernel (EfficientNet's 40 -> 240 on 28x28, a 30-row tile) is compiled only."""
    target = AVX2_TARGET if target_name == "avx2" else tvm.target.Target(AVX512)
    case = dict(n=1, c=40, h=28, w=28, oc=240, k=1)
    plan = _plan(cpu_facts(target), 40, 240, 28, 28)
    assert plan.kernel == "pointwise" and plan.tile.rows > 1, plan
    executable, func, arrays, out_shape, _ = _packed_build(case, target, activation="silu")
    assert _epilogue_row_loop(func, plan.tile.rows).kind == tvm.tirx.ForKind.SERIAL
    _, relu_func, *_ = _packed_build(case, target, activation="relu")
    assert _epilogue_row_loop(relu_func, plan.tile.rows).kind == tvm.tirx.ForKind.UNROLLED
    if target_name == "avx512":
        return
    got = _run(executable, arrays, out_shape)
    plain, _, plain_arrays, _, _ = _packed_build(case, target, activation=None)
    conv = _run(plain, plain_arrays, out_shape).astype(np.float64)
    assert_close(got, (conv / (1 + np.exp(-conv))).astype("float32"), "1x1 40 -> 240 + SiLU")
    monkeypatch.setattr(conv2d_pointwise, "HEAVY_EPILOGUE_NODES", 1 << 30)
    unrolled, unrolled_func, unrolled_arrays, _, _ = _packed_build(case, target, activation="silu")
    assert _epilogue_row_loop(unrolled_func, plan.tile.rows).kind == tvm.tirx.ForKind.UNROLLED
    np.testing.assert_array_equal(got, _run(unrolled, unrolled_arrays, out_shape))


#: AVX-512 targets naming their caches (the host target's `model`): an Intel Xeon's 48 KiB L1d, Zen 4's 32 KiB
AVX512_L1_48K = tvm.target.Target({**AVX512, "model": "l1d=48K,l2=2048K"})
AVX512_L1_32K = tvm.target.Target({**AVX512, "model": "l1d=32K,l2=1024K"})


@pytest.mark.parametrize("c,oc,hw,at_48k,at_32k", [
    (192, 32, 28, "pointwise", "tiled"),  # MobileNetV2's projects: 24 KiB and 18 KiB of weights
    (144, 32, 28, "pointwise", "tiled"),
    (512, 128, 28, "tiled", "tiled"),  # ResNet-50's 256 KiB
    (96, 24, 56, "pointwise", "pointwise"),  # 56x56: never kept tiled for narrowing
    (32, 192, 28, "pointwise", "pointwise"),  # widening
    (96, 24, 16, "tiled", "tiled"),  # under NARROWING_L1_MIN_PIXELS
])
def test_narrowing_convs_take_pixel_vectors_where_their_weights_fit_half_of_l1(c, oc, hw, at_48k, at_32k):
    """`narrowing_keeps_tiles`: an AVX-512 1x1 conv that narrows its channels on fewer than 56x56 pixels keeps the
    tiled kernel unless its weights fit half of the target's L1d, on maps of at least 28x28."""
    for target, want in ((AVX512_L1_48K, at_48k), (AVX512_L1_32K, at_32k)):
        facts = cpu_facts(target)
        assert llvm_conv2d.plan_of((1, c, hw, hw), oc, (c, 1, 1), (1, 1), (0,) * 4, (1, 1), 1, facts).kernel == want
        assert llvm_conv2d.narrowing_keeps_tiles(oc, hw * hw, c, facts) == (oc < c and want == "tiled")


def test_narrowing_pixel_kernel_with_a_residual_matches_numpy():
    """MobileNetV2's 192 -> 32 + residual on 28x28 on the 48 KiB-L1d AVX-512 target (its pixel kernel), against
    float64 numpy; run where the host executes AVX-512."""
    from tvm_fusion.check.verify import _runs_here

    if not _runs_here(AVX512_L1_48K):
        pytest.skip("the host does not run AVX-512 code (the plan is checked above)")
    case = dict(n=1, c=192, h=28, w=28, oc=32, k=1)
    executable, func, arrays, out_shape, want = _packed_build(case, AVX512_L1_48K, residual=True)
    assert "pointwise" == llvm_conv2d.plan_of((1, 192, 28, 28), 32, (192, 1, 1), (1, 1), (0,) * 4, (1, 1), 1,
                                              cpu_facts(AVX512_L1_48K)).kernel
    assert_close(_run(executable, arrays, out_shape), want.astype("float32"), _id(case))


@pytest.mark.parametrize("target", [AVX2_TARGET, tvm.target.Target(AVX512)], ids=["avx2", "avx512"])
@pytest.mark.parametrize("c,oc,hw,in_place", [(32, 16, 112, True), (96, 24, 56, True), (144, 24, 56, True),
                                              (192, 32, 56, False), (64, 64, 56, False), (16, 24, 55, False)])
def test_shallow_outputs_read_x_in_place(target, c, oc, hw, in_place):
    """`strips_in_place`: fewer than 32 output channels on whole tiles of pixels read x where it is, so the
    scheduled kernel has no `pad` stage (no strips); 32 or more, or a tail tile (55x55), copy the strips."""
    from tvm_fusion.schedules.llvm.blocks import optional_block

    facts = cpu_facts(target)
    plan = llvm_conv2d.plan_of((1, c, hw, hw), oc, (c, 1, 1), (1, 1), (0,) * 4, (1, 1), 1, facts)
    if plan.kernel != "pointwise":  # 16 -> 24 on 55x55 takes the tiled kernel on AVX-512
        assert not in_place
        return
    assert plan.in_place == in_place, plan
    case = dict(n=1, c=c, h=hw, w=hw, oc=oc, k=1)
    _, attrs, shapes = conv_primfunc(**case, residual=True, target=target)
    wp, _ = pack_conv([np.zeros(shapes[2], "float32"), np.zeros(shapes[3], "float32")], attrs, shapes, target)
    scheduled = _schedule(_func_with_packed(case, attrs, wp.shape, target), attrs, target)
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": scheduled}))
    assert (optional_block(sch, "pad") is None) == in_place
