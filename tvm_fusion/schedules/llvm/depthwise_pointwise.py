"""CPU (llvm) schedule for depthwise -> pointwise in one kernel: the depthwise output is computed per tile of
output rows, for all its channels, into a buffer the 1x1 conv reads while it is in cache; it never goes
to memory as a tensor.

    parallel for (n, row tile of R rows):
        for d: dw_act[d, R rows, Wout] = act1(sum_{r, s} pad[d // M, ...] * Wd[d, r, s] + bd[d])  # Wout vectorized
        for o block of B channels:
            acc[B, R * Wout] = 0                                  # B * ceil(R * Wout / L) vector registers
            for d: acc[b, :] += Wp[o + b, d] * dw_act[d, :]       # broadcast * vector
            out[n, o block, R rows] = act2(acc + bp (+ residual))

R is the most rows (a divisor of Hout) whose pixels fill at most MAX_PIXEL_VECTORS vectors and whose
depthwise tile fits TILE_BYTES; B the most output channels (a divisor of O) whose accumulators, plus the
depthwise vector, fit the target's vector registers. `supports` declines the shapes where the fused kernel
measured slower than the two conv kernels it replaces (benchmarks/depthwise_pointwise.py)."""

from __future__ import annotations

from dataclasses import dataclass

from tvm_fusion.errors import InternalError
from tvm_fusion.hardware import CpuFacts, cpu_facts
from tvm_fusion.registry import register_schedule
from tvm_fusion.schedules.llvm.blocks import optional_block
from tvm_fusion.schedules.llvm.conv2d import plan_of as conv_plan_of
from tvm_fusion.schedules.depthwise_pointwise import DWPW_FAMILY, DwPwOperands, dw_out_size

FLOAT_BYTES = 4
MAX_PIXEL_VECTORS = 8  # the accumulator row of one output channel: at most this many vectors
# the depthwise tile (all channels x R rows) kept for the 1x1 conv: inside a core's L2 beside Wp
TILE_BYTES = 128 * 1024
RESERVED_REGISTERS = 2  # the depthwise vector and a broadcast weight
MAX_POINTWISE_CHANNELS = 24  # see LOSES
MIN_TILE_CHANNELS = 3  # see LOSES
MIN_DEPTHWISE_CHANNELS = 64  # see LOSES
#: (predicate of (plan, sizes), the measurement): shapes where the fused kernel measured slower than the two
#: conv kernels it replaces; `supports` declines them with the measurement as its reason. Measured with
#: benchmarks/depthwise_pointwise.py on Zen 4 (AVX-512, one thread, wall-clock medians of 7 interleaved
#: rounds): fused / the two conv kernels, dw 3x3 + BN + ReLU6 -> 1x1 + BN.
LOSES: list = [
    (lambda plan, sizes: sizes["stride"] > 1,
     "a strided depthwise conv measured slower fused than as the two conv kernels (its columns are read "
     "every second one: a gather per vector; fused / two kernels on Zen 4, one thread: 1.57x-1.78x on "
     "1x96x112x112 3x3/2 -> 24, 1.70x-1.81x on 1x144x56x56 3x3/2 -> 32, 1.48x-1.52x on 1x64x112x112 3x3/2 -> "
     "128; 16x on AVX2)"),
    (lambda plan, sizes: sizes["o"] > MAX_POINTWISE_CHANNELS,
     f"more than {MAX_POINTWISE_CHANNELS} pointwise output channels measured slower fused than as the two "
     "conv kernels (the 1x1 conv re-reads the depthwise tile once per register tile of output channels, "
     "where the conv family's 1x1 kernel reuses its weight panel; fused / two kernels on Zen 4, one thread: "
     "1.21x-1.30x on 1x192x28x28 -> 32, 1.24x-1.29x on 1x32x112x112 -> 64, 1.29x-1.40x on 1x128x56x56 -> "
     "128, 1.34x-1.51x on 1x256x28x28 -> 256; 0.89x-1.07x on 1x144x56x56 -> 24 + residual)"),
    (lambda plan, sizes: sizes["d"] < MIN_DEPTHWISE_CHANNELS,
     f"fewer than {MIN_DEPTHWISE_CHANNELS} depthwise channels (the 1x1 conv's reduction) measured slower fused than "
     "as the two conv kernels (each register tile's zeroing and epilogue over too few multiply-adds; fused / two "
     "kernels on Zen 4, one thread: 1.11x-1.29x on 1x32x112x112 -> 16 in 4 of 5 runs (0.84x in one), where 144 "
     "channels, 1x144x56x56 -> 24 + residual, ran 0.89x-1.00x in 4 of 5 (1.07x in one))"),
    (lambda plan, sizes: plan.channels < MIN_TILE_CHANNELS,
     f"a register tile of fewer than {MIN_TILE_CHANNELS} pointwise output channels (16 vector registers, or a "
     "channel count with no larger divisor that fits) measured slower fused than as the two conv kernels (one "
     "depthwise vector load per one or two FMAs; fused / two kernels on Zen 4 compiled for AVX2, x86-64-v3, one "
     "thread: 1.20x on 1x144x56x56 -> 24 + residual with 2 channels x 7 vectors; on AVX-512 the same shape, "
     "4 x 7, ran 0.89x-1.07x)"),
    (lambda plan, sizes: sizes["pw_kernel"] == "pointwise",
     "the conv family's own 1x1 kernel for this shape is the pixel-vectorized one (`conv2d_pointwise`, whole "
     "vectors of output pixels), which measured faster as the second of two kernels than the fused kernel's "
     "1x1 (fused / two kernels on Zen 4, AVX-512, one thread, CPU time, 15 interleaved rounds: 1.49x on "
     "1x144x56x56 -> 24 + residual, the one shape that had fused)"),
]


@dataclass(frozen=True)
class DwPwPlan:
    rows: int  # R: output rows per tile
    channels: int  # B: pointwise output channels per register tile
    pixel_vectors: int  # whole vectors per accumulator row (R * Wout / L)
    lanes: int


def dwpw_plan(d: int, o: int, hout: int, wout: int, facts: CpuFacts) -> DwPwPlan | str:
    """The tile, a pure function of the sizes (depthwise channels d, pointwise channels o, output rows and
    columns) and the target's vector facts; or why there is none: a tile's pixels must be whole vectors."""
    lanes = facts.float32_lanes
    fits = [r for r in range(1, hout + 1) if hout % r == 0 and r * wout % lanes == 0
            and r * wout // lanes <= MAX_PIXEL_VECTORS and d * r * wout * FLOAT_BYTES <= TILE_BYTES]
    if not fits:
        return (f"no tile of whole output rows of {wout} columns (a divisor of {hout} rows) is whole vectors of "
                f"{lanes} float32 lanes within {MAX_PIXEL_VECTORS} vectors and {TILE_BYTES // 1024} KiB of "
                f"depthwise output ({d} channels)")
    rows = max(fits)
    vectors = rows * wout // lanes
    budget = max(1, (facts.vector_registers - RESERVED_REGISTERS) // vectors)
    channels = max(b for b in range(1, min(o, budget) + 1) if o % b == 0)
    return DwPwPlan(rows, channels, vectors, lanes)


def _schedule_depthwise(sch, tile_loop):
    """dw_act for all channels of the tile's rows under `tile_loop`, its columns vectorized; dw per channel,
    its taps outside its columns."""
    dw_act, dw = sch.get_sblock("dw_act"), sch.get_sblock("dw")
    sch.compute_at(dw_act, tile_loop, preserve_unit_loops=True)
    ch, _, _, cols = sch.get_loops(dw_act)[-4:]
    sch.vectorize(cols)
    sch.compute_at(dw, ch, preserve_unit_loops=True)
    *_, hh, ww, rh, rw = sch.get_loops(dw)
    sch.reorder(hh, rh, rw, ww)
    sch.vectorize(ww)
    init = sch.decompose_reduction(dw, rh)  # after vectorize: the other order is "not compact dataflow"
    sch.vectorize(sch.get_loops(init)[-1])


def _schedule_pointwise(sch, lanes: int):
    """pw for B channels of the tile: the reduction over d outermost, then the B channels and the tile's
    pixel vectors (unrolled: B * R * Wout / L accumulators in registers), then the lanes (vectorized)."""
    pw = sch.get_sblock("pw")
    *_, q, hh, ww, rd = sch.get_loops(pw)
    vec, lane = sch.split(sch.fuse(hh, ww), [None, lanes])
    sch.reorder(rd, q, vec, lane)
    sch.unroll(q)
    sch.unroll(vec)
    sch.vectorize(lane)
    init = sch.decompose_reduction(pw, rd)
    sch.vectorize(sch.get_loops(init)[-1])


def _plan_of(attrs, shapes, target) -> DwPwPlan | str:
    ops = DwPwOperands.of(shapes)
    hout, wout = dw_out_size(ops.x, ops.wd, attrs["strides"], attrs["padding"])
    return dwpw_plan(int(ops.wd[0]), int(ops.wp[0]), hout, wout, cpu_facts(target))


def _supports(attrs, shapes, target) -> str | None:
    plan = _plan_of(attrs, shapes, target)
    if isinstance(plan, str):
        return f"the fused depthwise -> pointwise CPU kernel has {plan}"
    ops = DwPwOperands.of(shapes)
    rows, cols = dw_out_size(ops.x, ops.wd, attrs["strides"], attrs["padding"])
    pw = conv_plan_of((ops.x[0], ops.wd[0], rows, cols), int(ops.wp[0]), (int(ops.wd[0]), 1, 1), (1, 1), (0, 0, 0, 0),
                    (1, 1), 1, cpu_facts(target))
    sizes = dict(d=int(ops.wd[0]), o=int(ops.wp[0]), stride=max(attrs["strides"]), pw_kernel=pw.kernel)
    for loses, measured in LOSES:
        if loses(plan, sizes):
            return f"{measured}; this one: {sizes['d']} -> {sizes['o']} channels, stride {sizes['stride']}"
    return None


@register_schedule(DWPW_FAMILY, target="llvm", supports=_supports)
def schedule_dwpw_llvm(sch, attrs, target):
    d, hout, wout = (int(sch.get(loop).extent) for loop in sch.get_loops(sch.get_sblock("dw"))[1:4])
    o = int(sch.get(sch.get_loops(sch.get_sblock("pw"))[1]).extent)
    plan = dwpw_plan(d, o, hout, wout, cpu_facts(target))
    if isinstance(plan, str):
        raise InternalError(f"depthwise_pointwise llvm schedule: {plan}; its `supports` declines such a shape")
    epilogue = sch.get_sblock("epilogue")
    n, o, h, w = sch.get_loops(epilogue)
    ht, hi = sch.split(h, [None, plan.rows])
    ob, oi = sch.split(o, [None, plan.channels])
    sch.reorder(n, ht, ob, oi, hi, w)
    tile = sch.fuse(n, ht)
    sch.parallel(tile)
    _, lane = sch.split(sch.fuse(hi, w), [None, plan.lanes])
    sch.vectorize(lane)
    sch.compute_at(sch.get_sblock("pw"), ob, preserve_unit_loops=True)
    _schedule_depthwise(sch, tile)
    _schedule_pointwise(sch, plan.lanes)
    _schedule_pad(sch)
    return (f"depthwise tile of {plan.rows} rows x {plan.channels} pointwise channels x {plan.pixel_vectors} "
            f"vectors")


def _schedule_pad(sch):
    """The padded input, parallel over (n, channel) before the tiles (absent without padding)."""
    pad = optional_block(sch, "pad")
    if pad is None:
        return
    n, c, *_ = sch.get_loops(pad)
    sch.parallel(sch.fuse(n, c))
