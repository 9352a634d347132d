"""CPU (llvm) compute and schedule for pointwise -> depthwise in one kernel: each block of L expanded channels
(one vector) is computed channels-last into a buffer that stays in cache, and the depthwise conv reads it
there (`depthwise_channels`' loop nest); the expanded tensor, the block's widest, never goes to memory, and
the depthwise conv needs no channels-last copy of its input.

    parallel for (n, block of L expanded channels):
        for (tile of R x Q padded pixels):                                   # the 1x1 conv: a register tile
            acc[R, Q, L] = 0
            for c: acc[i, j, :] += xpad[c, y + i, z + j] * Wp[c, block]      # broadcast * vector
            e[y + i, z + j, :] = act1(acc + bp) inside x, 0 on the padding   # channels-last, in cache
        for (depthwise tile of rows x cols outputs):
            acc2[rows, cols, L] = sum_{r, s} e[h*sh + r, w*sw + s, :] * Wd[block, r, s]
            out[n, block, tile] = act2(acc2 + bd)

R x Q is EXPAND_TILE; the depthwise tile is `choose_channel_tile`'s over whole vectors. `supports` declines
the shapes where the fused kernel measured slower than the two conv kernels it replaces
(benchmarks/pointwise_depthwise.py), with the measurement as its reason."""

from __future__ import annotations

from dataclasses import dataclass

from tvm_fusion.errors import InternalError
from tvm_fusion.hardware import CpuFacts, cpu_facts
from tvm_fusion.registry import register_compute, register_schedule
from tvm_fusion.schedules import dims
from tvm_fusion.schedules.conv2d import ConvPadding, conv2d_out_size
from tvm_fusion.schedules.depthwise_pointwise import dw_out_size
from tvm_fusion.schedules.llvm.blocks import ceil_to, optional_block
from tvm_fusion.schedules.llvm.conv2d import ConvPlan, ConvTile, choose_channel_tile, schedule_tiled
from tvm_fusion.schedules.pointwise_depthwise import (PWDW_FAMILY, PwDwOperands, pointwise_depthwise,
                                                      pointwise_depthwise_padded)

FLOAT_BYTES = 4
#: the 1x1 conv's register tile, rows x columns of padded pixels (one vector of channels each): 12
#: accumulators beside the weight vector, with AVX2's 16 registers and AVX-512's 32. Measured on an Intel Xeon
#: with AVX-512 (one thread, CPU time, 16 -> 96 on 112x112 then 3x3/2, the 16-lane blocks): 1 x 6 0.526 ms,
#: 2 x 6 0.504-0.522, 3 x 6 0.505-0.541, 1 x 19 0.538; blocks of 8 channels (AVX-512's `channel_depthwise_lanes`)
#: 0.62-0.69 ms
EXPAND_TILE = (2, 6)
#: the most bytes of one block's expanded channels (its padded pixels x one vector of float32): it is written
#: and read back in cache. Measured on a 2 MiB-L2 core up to 112x112 pixels (832 KiB)
MAX_BLOCK_BYTES = 1 << 20
#: the most input channels of the 1x1 conv, by the target's float32 lanes (others: DEFAULT_EXPAND_CHANNELS); see
#: LOSES
MAX_EXPAND_CHANNELS = {16: 64, 8: 24}
DEFAULT_EXPAND_CHANNELS = 24


def max_expand_channels(lanes: int) -> int:
    return MAX_EXPAND_CHANNELS.get(lanes, DEFAULT_EXPAND_CHANNELS)


#: (predicate of the sizes, the measurement): shapes where the fused kernel measured slower than the two
#: conv kernels it replaces; `supports` declines them with the measurement as its reason. Measured with
#: benchmarks/pointwise_depthwise.py on an Intel Xeon with AVX-512 (LLVM `rocketlake`, 2 MiB L2; one thread,
#: CPU time, medians of interleaved rounds): fused / the two conv kernels, 1x1 + BN + ReLU6 -> 3x3 + BN + ReLU6.
LOSES: list = [
    (lambda sizes: sizes["stride"] == 1,
     ("a stride-1 depthwise conv measured slower fused than as the two conv kernels (the conv family's own "
     "stride-1 depthwise kernel vectorizes output columns from the NCHW tensor: there is no channels-last copy "
     "to save; fused / two kernels on an Intel Xeon with AVX-512, one thread: 1.29x on 1x24x56x56 -> 144, 1.26x "
     "on 1x32x28x28 -> 192, 1.28x on 1x64x14x14 -> 384, 1.38x on 1x96x14x14 -> 576, 2.20x on 1x160x7x7 -> 960; "
     "1.12x on 1x24x56x56 -> 144 built for AVX2; the whole of MobileNetV2 1.0 with these fused ran 1.27x)")),
    (lambda sizes: sizes["c"] > max_expand_channels(sizes["lanes"]),
     ("more input channels of the 1x1 conv than its target's bound (64 for 16 float32 lanes, 24 for 8 and "
     "others) measured slower fused than as the two conv kernels (the fused 1x1 tile holds one vector of "
     "channels, where the conv family's 1x1 kernel vectorizes pixels and reuses each input vector for many "
     "channels; fused / two kernels on an Intel Xeon, one thread, stride 2, AVX-512: 1x32x28x28 -> 192 "
     "0.84x-0.88x, 1x40x28x28 -> 240 5x5 0.95x-1.04x, 1x48x28x28 -> 288 0.93x, 1x64x28x28 -> 384 0.94x-0.97x, "
     "1x96x14x14 -> 576 1.28x-1.29x; AVX2: 1x32x28x28 -> 192 1.01x-1.07x, 1x40x28x28 -> 240 5x5 1.19x-1.23x, "
     "1x96x14x14 -> 576 1.55x; where 1x16x112x112 -> 96 ran 0.74x-0.82x (0.72x for AVX2) and 1x24x56x56 -> "
     "144 0.79x-0.83x (0.86x))")),
]


@dataclass(frozen=True)
class PwDwPlan:
    expand_rows: int  # the 1x1 conv's padded pixels, whole register tiles
    expand_cols: int
    dw: ConvPlan  # the depthwise conv's `depthwise_channels` plan, one whole vector of channels a block


def pwdw_plan(d: int, hin: int, win: int, kernel, strides, padding, facts: CpuFacts) -> PwDwPlan | str:
    """The tiles, a pure function of the sizes (d expanded channels, the input's rows and columns, the
    depthwise kernel, strides and padding) and the target's vector facts; or why there is none. The
    depthwise tile is `choose_channel_tile`'s over one whole vector of channels among the tiles whose padded
    outputs read only the padded input (the expanded block is the depthwise conv's input as it is: no `pad`
    stage); one always does (1 x 1)."""
    lanes = facts.float32_lanes
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = kernel, strides, padding
    if d % lanes:
        return f"{d} expanded channels, not whole vectors of {lanes} float32 lanes"
    hp, wp = hin + pt + pb, win + pl + pr
    hout, wout = conv2d_out_size(hin, kh, sh, pt, pb, 1), conv2d_out_size(win, kw, sw, pl, pr, 1)

    def inside(tile: ConvTile) -> bool:  # its padded outputs read no row or column past the padded input
        return ((ceil_to(hout, tile.rows) - 1) * sh + kh <= hp
                and (ceil_to(wout, tile.cols) - 1) * sw + kw <= wp)

    tile = choose_channel_tile(hout, wout, facts, lanes, fits=inside)
    padding_out = ConvPadding(1, ceil_to(hout, tile.rows), ceil_to(wout, tile.cols))
    rows, cols = (ceil_to(size, tile_size) for size, tile_size in zip((hp, wp), EXPAND_TILE))
    if rows * cols * lanes * FLOAT_BYTES > MAX_BLOCK_BYTES:
        return (f"a block of {lanes} expanded channels over {rows} x {cols} padded pixels "
                f"({rows * cols * lanes * FLOAT_BYTES // 1024} KiB), more than the "
                f"{MAX_BLOCK_BYTES // 1024} KiB it keeps in cache")
    return PwDwPlan(rows, cols, ConvPlan("depthwise_channels", tile, padding_out))


def _plan_of(attrs, shapes, target) -> PwDwPlan | str:
    ops = PwDwOperands.of(shapes)
    _, _, hin, win = ops.x
    return pwdw_plan(int(ops.wp[1]), int(hin), int(win), tuple(int(v) for v in ops.wd[2:]), attrs["strides"],
                     attrs["padding"], cpu_facts(target))


def _supports(attrs, shapes, target) -> str | None:
    plan = _plan_of(attrs, shapes, target)
    if isinstance(plan, str):
        return f"the fused pointwise -> depthwise CPU kernel has {plan}"
    ops = PwDwOperands.of(shapes)
    sizes = dict(c=int(ops.wp[0]), d=int(ops.wp[1]), stride=max(int(s) for s in attrs["strides"]),
                 lanes=cpu_facts(target).float32_lanes)
    for loses, measured in LOSES:
        if loses(sizes):
            return (f"{measured}; this one: {sizes['c']} -> {sizes['d']} channels, stride {sizes['stride']}, "
                    f"{sizes['lanes']} float32 lanes (bound {max_expand_channels(sizes['lanes'])})")
    return None


@register_compute(PWDW_FAMILY, target="llvm")
def pointwise_depthwise_llvm(x, wp, bp, wd, bd, *, strides, padding, pw_activation, pw_activation_params=None,
                             activation=None, activation_params=None, fast_math=True, target=None, **_):
    """The compute over `pwdw_plan`'s tiles for `target` (the generic one where it has none: `supports`
    declines such a shape)."""
    _, _, hin, win = dims(x.shape)
    plan = pwdw_plan(int(wp.shape[1]), hin, win, tuple(int(v) for v in wd.shape[2:]), strides, padding,
                     cpu_facts(target))
    options = dict(strides=strides, padding=padding, pw_activation=pw_activation,
                   pw_activation_params=pw_activation_params, activation=activation,
                   activation_params=activation_params, fast_math=fast_math, target=target)
    if isinstance(plan, str):
        return pointwise_depthwise(x, wp, bp, wd, bd, **options)
    return pointwise_depthwise_padded(x, wp, bp, wd, bd, **options, expand_rows=plan.expand_rows,
                                      expand_cols=plan.expand_cols, out_padding=plan.dw.padding)


def _schedule_expand(sch, outer):
    """The 1x1 conv and its activation for one block of channels under `outer`: EXPAND_TILE register tiles
    (channels innermost, vectorized; pixels unrolled), their accumulators pixel-major in registers, each
    stored channels-last through the activation and the padding mask."""
    act, expand = sch.get_sblock("expand_act"), sch.get_sblock("expand")
    sch.compute_at(act, outer)
    channels, y, z = sch.get_loops(act)[-3:]
    er, ec = EXPAND_TILE
    yo, yi = sch.split(y, [None, er])
    zo, zi = sch.split(z, [None, ec])
    sch.reorder(yo, zo, yi, zi, channels)
    sch.compute_at(expand, zo)
    sch.transform_layout(expand, ("write", 0), lambda n, d, y_, z_: (n, y_, z_, d))
    sch.set_scope(expand, 0, "local")
    ed, ey, ez, rc = sch.get_loops(expand)[-4:]
    sch.reorder(rc, ey, ez, ed)
    sch.vectorize(ed)
    sch.unroll(ez)
    sch.unroll(ey)
    sch.decompose_reduction(expand, rc)
    sch.vectorize(channels)
    sch.unroll(zi)
    sch.unroll(yi)


@register_schedule(PWDW_FAMILY, target="llvm", supports=_supports)
def schedule_pwdw_llvm(sch, attrs, target):
    ops = PwDwOperands.of(param.shape for param in sch.mod[sch.func_working_on].params[:-1])
    plan = _plan_of(attrs, ops, target)
    if isinstance(plan, str):
        raise InternalError(f"pointwise_depthwise llvm schedule: {plan}; its `supports` declines such a shape")
    view = optional_block(sch, "expand_view")
    if view is not None:
        sch.compute_inline(view)
    if optional_block(sch, "pad") is not None:
        raise InternalError("pointwise_depthwise llvm schedule: the depthwise conv reads past its padded input")
    conv, epi, act = sch.get_sblock("conv"), sch.get_sblock("epilogue"), sch.get_sblock("expand_act")
    sch.transform_layout(act, ("write", 0), lambda n, d, y, z: (n, y, z, d))
    _, wout = dw_out_size(ops.x, ops.wd, attrs["strides"], attrs["padding"])
    tile = plan.dw.tile
    schedule_tiled(sch, conv, epi, tile, regrouped=False, padded_columns=plan.dw.padding.cols != wout)
    _schedule_expand(sch, sch.get_loops(conv)[0])
    xpad = optional_block(sch, "expand_pad")
    if xpad is not None:
        n, c, *_, z = sch.get_loops(xpad)
        sch.parallel(sch.fuse(n, c))
        sch.vectorize(z)
    return (f"{tile.lanes} expanded channels a block: 1x1 tiles of {EXPAND_TILE[0]} x {EXPAND_TILE[1]} padded "
            f"pixels, depthwise tiles of {tile.rows} x {tile.cols} outputs")
