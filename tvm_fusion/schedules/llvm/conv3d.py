"""CPU (llvm) conv3d: `conv3d(x, W) + epilogue  ==>  the conv2d tiled kernel, one output plane deep`.

The tile is conv2d's (`choose_tile`: L lanes from the target, v vectors of output channels x rows x columns
of output pixels, the register budget of the target's ISA), chosen for the H' x W' plane with the reduction
C/G * KD * KH * KW; the output planes count as tasks beside the batch. W is packed at compile time
(`pack_conv3d`) into Wp[oc block, KD, KH, KW, C/G, OC], the order the reduction reads it in.

    parallel for (n, oc block of OC = L * v channels, output plane d):
        for (row tile, column tile):
            acc[rows, cols, OC] = 0
            for rd, rh, rw, rc:
                acc[i, j, :] += pad(x)[rc, d*sd + rd, y + i + rh, x + j + rw] * Wp[block, rd, rh, rw, rc, :]
            out[n, real channels of the block, d, real pixels of the tile] = epilogue(acc)

The padded input is written by its own parallel loop nest first (as conv2d's, measured ~10x faster than
inlined on 3x3). The epilogue of a tile whose columns are all real runs its columns as vectors; with padded
columns, by vectors of channels (conv2d's `epilogue_by_channel_vectors`: a predicated column vector would be
scalarized). Measured on Zen 4 (AVX-512, one thread, conv3d + BN + ReLU, interleaved, wall time, a host shared
with other jobs), channel vectors -> columns: 3 -> 32 channels 3x3x3 on 16x56x56 (tiles of 14 columns x 32
channels) 7.42 -> 5.55 ms (the channel-vector stores extracted lane by lane: 240 vextracts in the kernel, 2
after); 32 -> 64 on 8x28x28 6.65 -> 6.47 ms.

A grouped conv pads each group's channels to whole vectors; where that would more than double the work
(depthwise 3-D convs, a few channels per group) `supports` declines and the conv is left to TVM's kernel and
the leftover schedule (`fallback.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm_fusion.errors import FusionError
from tvm_fusion.hardware import CpuFacts, cpu_facts
from tvm_fusion.registry import register_compute, register_schedule
from tvm_fusion.schedules import dims
from tvm_fusion.schedules.conv2d import ConvPadding, pack_channel_blocks
from tvm_fusion.schedules.conv3d import CONV3D_FAMILY, conv3d_out_sizes, conv3d_padded, conv3d_taps
from tvm_fusion.schedules.llvm.blocks import ceil_to, loop_extent, optional_block, vectorize_own_inner_loop
from tvm_fusion.schedules.llvm.conv2d import ConvTile, choose_tile, epilogue_by_channel_vectors, planned_batch

#: a grouped conv3d whose channels padded to whole vectors per group would be more than this many times its
#: real multiply-adds is declined (`supports`): TVM's kernel then runs it
MAX_CHANNEL_PADDING = 2.0


@dataclass(frozen=True)
class Conv3dPlan:
    tile: ConvTile
    padding: ConvPadding  # per-group output channels, rows and columns the conv stage computes
    depth: int  # output planes


def conv3d_plan(x_shape, cout: int, taps, strides, padding, dilation, groups: int, facts: CpuFacts) -> Conv3dPlan:
    """The tile and padded output of a conv3d for a target; a pure function of the shape (the batch planned for
    as 1 when symbolic), so the compute, `pack_conv3d` and the schedule agree."""
    n, _, *sizes = x_shape
    cpg, *kernel = taps
    dout, hout, wout = conv3d_out_sizes(sizes, kernel, strides, padding, dilation)
    reduction = cpg * kernel[0] * kernel[1] * kernel[2]
    tile = choose_tile(cout, hout, wout, reduction, planned_batch(n) * dout, facts.threads, facts, groups)
    padding_ = ConvPadding(ceil_to(cout // groups, tile.channels), ceil_to(hout, tile.rows),
                           ceil_to(wout, tile.cols), tile.channels)
    return Conv3dPlan(tile, padding_, dout)


def _operands(shapes):
    """(x, W, b) shapes of (x, [residual], W, b)."""
    shapes = list(shapes)
    return shapes[0], shapes[-2], shapes[-1]


def _plan_of(attrs, x_shape, w_shape, cout: int, target) -> Conv3dPlan:
    return conv3d_plan(dims(x_shape), cout, conv3d_taps(w_shape), attrs["strides"], attrs["padding"],
                       attrs["dilation"], attrs.get("groups", 1), cpu_facts(target))


def supports(attrs, shapes, target) -> str | None:
    """Why the llvm conv3d kernel does not take this conv (its output empty, or its groups' channels padded to
    whole vectors more than MAX_CHANNEL_PADDING times its real work), else None."""
    x, w, b = _operands(shapes)
    if len(x) != 5 or len(w) not in (5, 6):
        return f"conv3d operands have ranks {len(x)} and {len(w)}; the llvm conv3d kernel takes NCDHW / OIDHW"
    cpg, *kernel = conv3d_taps(w)
    out = conv3d_out_sizes(dims(x)[2:], kernel, attrs["strides"], attrs["padding"], attrs["dilation"])
    if min(out) < 1:
        return f"conv3d output is empty ({'x'.join(map(str, out))})"
    groups, cout = attrs.get("groups", 1), int(b[0])
    plan = _plan_of(attrs, x, w, cout, target)
    opg = cout // groups
    if groups > 1 and plan.padding.group_channels > MAX_CHANNEL_PADDING * opg:
        return (f"conv3d has {groups} groups of {opg} output channels; the llvm conv3d kernel computes whole "
                f"vectors of {plan.tile.lanes} channels per group ({plan.padding.group_channels}), more than "
                f"{MAX_CHANNEL_PADDING:g}x the real work: left to TVM's kernel")
    return None


def pack_conv3d(constants, attrs, shapes, target):
    """W [O, C/G, KD, KH, KW]  ==>  Wp [O'/B, KD, KH, KW, C/G, B] (`pack_channel_blocks`, taps first; B: the
    tile's output channels, O': the channels padded per group to the tile), packed once at compile time."""
    w, b = constants
    plan = _plan_of(attrs, shapes[0], w.shape, int(w.shape[0]), target)
    return [pack_channel_blocks(w, attrs.get("groups", 1), plan.padding.group_channels, plan.tile.channels,
                                taps_first=True), b]


@register_compute(CONV3D_FAMILY, target="llvm")
def conv3d_llvm(x, w, b, residual=None, *, fast_math=True, target=None, **attrs):
    """The conv3d_affine compute over the output padded to `conv3d_plan`'s tile for `target`."""
    if target is None or target.kind.name != "llvm":
        raise FusionError("the llvm conv3d compute pads to the target's tile: call it with `target=` an llvm "
                          f"target (got {target})")
    plan = _plan_of(attrs, x.shape, w.shape, int(b.shape[0]), target)
    keys = ("strides", "padding", "dilation", "groups", "activation", "activation_params", "residual_after_activation")
    return conv3d_padded(x, w, b, residual, **{k: attrs[k] for k in keys if k in attrs}, fast_math=fast_math,
                         target=target, out_padding=plan.padding)


def _schedule_side_stages(sch):
    """The padded input and the padded weights (W not packed), each its own parallel loop nest."""
    pad = optional_block(sch, "pad")
    if pad is not None:
        n, c, d, _, w = sch.get_loops(pad)
        sch.parallel(sch.fuse(n, c, d))
        sch.vectorize(w)
    weight = optional_block(sch, "weight")
    if weight is not None:
        sch.parallel(sch.get_loops(weight)[0])


@register_schedule(CONV3D_FAMILY, target="llvm", supports=supports, pack=pack_conv3d)
def schedule_conv3d_llvm(sch, attrs, target):
    conv, epi = sch.get_sblock("conv"), sch.get_sblock("epilogue")
    params = sch.mod[sch.func_working_on].params[:-1]
    x, w, b = _operands(p.shape for p in params)
    plan = _plan_of(attrs, x, w, int(b[0]), target)
    tile, p, groups = plan.tile, plan.padding, attrs.get("groups", 1)
    n, o, d, h, ww, rc, rd, rh, rw = sch.get_loops(conv)
    cp, hp, wp = (loop_extent(sch, loop) for loop in (o, h, ww))
    cout, _, hout, wout = (loop_extent(sch, loop) for loop in sch.get_loops(epi)[1:])
    if (cp, hp, wp) != (groups * p.group_channels, p.rows, p.cols):
        raise FusionError(f"conv3d llvm schedule: the conv stage computes {cp}x{hp}x{wp} outputs per plane, the "
                          f"plan for {target} pads {cout}x{hout}x{wout} to {groups * p.group_channels}x{p.rows}x"
                          f"{p.cols}: build the PrimFunc with the llvm compute under the same target")
    _schedule_side_stages(sch)
    regrouped = groups > 1 and cp != cout  # the epilogue reads the padded channels of several groups
    tile_epi = epi
    if regrouped:
        tile_epi = sch.cache_write(conv, 0, "global")
        sch.set_scope(conv, 0, "local")
        n, o, d, h, ww, rc, rd, rh, rw = sch.get_loops(conv)
    oo, oi = sch.split(o, [None, tile.channels])
    ho, hi = sch.split(h, [None, tile.rows])
    wo, wi = sch.split(ww, [None, tile.cols])
    sch.reorder(n, oo, d, ho, wo, rd, rh, rw, rc, hi, wi, oi)  # W's packed order; rc innermost of the reduction
    sch.parallel(sch.fuse(n, oo, d))
    sch.reverse_compute_at(tile_epi, wo)
    # accumulators pixel-major, so each register holds `lanes` consecutive output channels
    sch.transform_layout(conv, ("write", 0), lambda n_, o_, d_, h_, w_: (n_, d_, h_, w_, o_))
    sch.set_scope(conv, 0, "local")
    sch.vectorize(oi)
    sch.unroll(wi)
    sch.unroll(hi)
    sch.decompose_reduction(conv, rd)  # after vectorize: the other order is "not compact dataflow"
    if regrouped:
        vectorize_own_inner_loop(sch, tile_epi, conv)
        n, o, d, h, ww = sch.get_loops(epi)
        sch.parallel(sch.fuse(n, o, d))
        sch.vectorize(ww)
    elif wp != wout:
        epilogue_by_channel_vectors(sch, tile_epi, conv)
    else:  # every column real: the columns as vectors (a partial one where they are not whole vectors)
        vectorize_own_inner_loop(sch, tile_epi, conv)
