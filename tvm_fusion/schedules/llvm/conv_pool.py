"""CPU (llvm) conv2d -> epilogue -> pool: `conv_pool(x, W', b')  ==>  the conv kernel's tiles, each parallel
task's plane pooled in cache`.

The conv part is the conv family's llvm compute and schedule as they are (`conv2d_llvm`,
`schedule_conv2d_llvm`: the same tile, the same packed W, the same sums). Its parallel loop runs one task
per (image, block of output channels); the task's epilogue writes the block's whole output plane, then the
pool reads it back under the same task, while it is in cache:

    parallel for (n, oc block):
        for tiles: epilogue[block, tile pixels] = act(acc + b')        # the conv kernel, unchanged
        for channel in block, output row, output column:               # the pool, window taps innermost
            out[n, channel, row, column] = pool(epilogue[channel, window])

No pool window crosses a task (a task holds its channels' whole plane), so the halo is neither recomputed
nor exchanged: the plan's `halo` says "none". The epilogue buffer is allocated per task (block channels x
H x W, not the whole tensor). Kernels whose parallel loop splits a plane (the pixel-vectorized "pointwise"
and "pixels" plans) decline; so do the shapes the benchmark measured slower fused (`FUSION_LOSES`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tvm_fusion._tvm import tirx
from tvm_fusion.hardware import cpu_facts
from tvm_fusion.registry import register_compute, register_schedule
from tvm_fusion.schedules import dims
from tvm_fusion.schedules.conv2d import ConvOperands
from tvm_fusion.schedules.conv_pool import POOL_FAMILY, PoolWindow, pool_stage, split_attrs
from tvm_fusion.schedules.llvm.blocks import optional_block
from tvm_fusion.schedules.llvm.conv2d_amx import AMX_BLOCK
from tvm_fusion.schedules.llvm.conv2d_dpbf16 import DOT_BLOCK
from tvm_fusion.schedules.llvm.conv2d_winograd import GEMM_BLOCK
from tvm_fusion.schedules.llvm.conv2d import (ConvPlan, conv2d_llvm, pack_conv, plan_of, schedule_conv2d_llvm,
                                             scheduled_plan)

#: the conv kernels whose parallel loop is one (image, block of output channels) task over the whole plane
WHOLE_PLANE_KERNELS = ("tiled", "depthwise", "depthwise_channels")


#: the largest conv output plane (one task's channels x rows x columns, float32) the fused kernel takes. Past it
#: the plane leaves the core's caches before the pool reads it back, and the fused kernel measured slower than
#: the two kernels. Alone (benchmarks/conv_pool.py), on an AMD EPYC (Zen 4, 1 MiB L2 per core, shared host), one
#: thread, CPU time, interleaved medians, fused / conv + pool kernels in several runs: AVX-512 (32-channel tasks)
#: VGG 3 -> 64 on 224x224, 6.1 MiB: 1.51, 1.35, 1.41, 1.30; ResNet's stem, 1.5 MiB: 1.03, 1.12, 0.79, 0.91, 1.09,
#: 0.80; VGG 64 -> 128 on 112x112, 3.1 MiB: 0.75, 0.99, 1.05, 1.01; AVX2 (16-channel tasks) the stem, 0.77 MiB:
#: 0.94; VGG 3 -> 64, 3.1 MiB: 1.03, 0.95; planes of at most 0.4 MiB 0.95-1.02. In the model the groups past
#: 1 MiB lost: on Zen 4 the ResNet stem's group ran 1-10% slower than the two kernels in every run; on an Intel
#: AVX-512 core (2 MiB L2 per core; one thread, CPU time, the whole model built with this bound at 4 MiB and at
#: 1 MiB, interleaved with onnxruntime, medians of 9 rounds), declining the groups with 1-4 MiB planes (the 7x7/2
#: and 3x3/2 stems' 1.2-1.5 MiB, VGG's 64 -> 128 on 112x112) ran ResNet stem + stage 1 9.79 -> 9.37 ms,
#: ResNet-50 57.6 -> 56.1, SqueezeNet 5.37 -> 5.09, Inception v1 25.6 -> 25.1, Inception v2 27.9 -> 27.4,
#: DenseNet-121 43.9 -> 43.6, VGG19 241 -> 240, ShuffleNet, AlexNet and ZFNet the same.
MAX_PLANE_BYTES = 1 << 20


@dataclass(frozen=True)
class PoolPlan:
    """What the fused kernel does: the conv's plan kernel, the output channels one task holds and the rows and
    columns of its epilogue plane, the halo (always "none" here: a task holds whole planes), or why it
    declines."""
    kernel: str
    channels: int
    rows: int
    cols: int
    halo: str = "none: each task pools whole planes of its channels, no window crosses a task"
    declined: str = ""

    @property
    def plane_bytes(self) -> int:
        return self.channels * self.rows * self.cols * 4


def pool_plan(conv: ConvPlan, attrs: dict) -> PoolPlan:
    """The fused kernel's plan over the conv's plan (`conv_plan`) for an llvm target."""
    channels = 1 if conv.kernel == "depthwise" else getattr(conv.tile, "channels", 1)
    plan = PoolPlan(conv.kernel, channels, conv.padding.rows, conv.padding.cols)
    if conv.kernel not in WHOLE_PLANE_KERNELS:
        return dataclasses.replace(plan, declined=(
            f"the conv takes the {conv.kernel} kernel, whose parallel tasks split an output plane; the fused "
            f"pool needs one task per plane ({', '.join(WHOLE_PLANE_KERNELS)} kernels)"))
    why = FUSION_LOSES(plan, PoolWindow.of(attrs))
    return dataclasses.replace(plan, declined=why) if why else plan


def fusion_loses(plan: PoolPlan, window: PoolWindow) -> str | None:
    """Why the benchmark measured this shape slower fused than as two kernels, or None: a task's plane past
    MAX_PLANE_BYTES."""
    if plan.plane_bytes > MAX_PLANE_BYTES:
        return (f"a task's conv output plane is {plan.plane_bytes / 2**20:.1f} MiB ({plan.channels} channels x "
                f"{plan.rows} x {plan.cols}); past {MAX_PLANE_BYTES >> 20} MiB the fused kernel measured slower than "
                "the conv and pool kernels (benchmarks/conv_pool.py, and in whole models)")
    return None


#: the measured decline (`fusion_loses`); benchmarks/conv_pool.py switches it off to time every shape
FUSION_LOSES = fusion_loses


def supports(attrs: dict, shapes, target) -> str | None:
    ops = ConvOperands.of(shapes)
    x, w = dims(ops.x), dims(ops.w)
    conv = plan_of(x, int(w[0]), w[1:], attrs["strides"], attrs["padding"], attrs["dilation"], attrs.get("groups", 1),
                   cpu_facts(target))
    return pool_plan(conv, attrs).declined or None


@register_compute(POOL_FAMILY, target="llvm")
def conv2d_pool_llvm(x, w, b, *, fast_math=True, target=None, **attrs):
    """The conv family's llvm compute (padded to its tile for `target`), then `pool_stage` of its epilogue."""
    conv_attrs, window = split_attrs(attrs)
    epi = conv2d_llvm(x, w, b, **conv_attrs, fast_math=fast_math, target=target)
    return pool_stage(epi, window, x.dtype)


@register_schedule(POOL_FAMILY, target="llvm", pack=pack_conv, supports=supports)
def schedule_conv2d_pool_llvm(sch, attrs, target):
    """The conv kernel's schedule, then the pool's loops merged into its parallel task loop: (image, block of
    `channels`) is the same task in both, so a task pools the planes its epilogue just wrote."""
    # a bfloat16 conv on AMX tiles or AVX512-BF16, a Winograd conv: its pool after it, planes in parallel (those
    # kernels' tasks are not the epilogue's channel blocks)
    if any(optional_block(sch, name) is not None for name in (AMX_BLOCK, DOT_BLOCK, GEMM_BLOCK)):
        note = schedule_conv2d_llvm(sch, attrs, target)
        pool = sch.get_sblock("pool")
        n, c, *_ = sch.get_loops(pool)
        sch.parallel(sch.fuse(n, c))
        _schedule_pool(sch, pool, attrs, cpu_facts(target).float32_lanes)
        return note
    plan = pool_plan(scheduled_plan(sch, attrs, cpu_facts(target)), attrs)
    schedule_conv2d_llvm(sch, attrs, target)
    task = sch.get_loops(sch.get_sblock("epilogue"))[0]  # the parallel (image, channel block) loop
    pool = sch.get_sblock("pool")
    n, c, *_ = sch.get_loops(pool)
    co, _ = sch.split(c, [None, plan.channels])
    _parallel_again(sch, sch.merge(task, sch.fuse(n, co)))
    _schedule_pool(sch, pool, attrs, cpu_facts(target).float32_lanes)


def _parallel_again(sch, loop):
    """Mark a merged task loop parallel again (`merge` makes it serial). `sch.parallel` refuses it (the pool
    reads what the epilogue wrote under the same loop: no "compact dataflow"), but the tasks write disjoint
    channel blocks, as they did when the conv schedule made the loop parallel; so the loop is rewritten with
    its kind, nothing else changed."""
    old = sch.get(loop)
    sch.state.replace(sch.get_sref(loop), tirx.For(old.loop_var, old.min, old.extent, tirx.ForKind.PARALLEL, old.body,
                                                   old.thread_binding, old.annotations))


def _schedule_pool(sch, pool, attrs: dict, lanes: int):
    """A window pool's taps outside its run of output columns (each output still sums its taps row by row, as
    the unfused pool does), the run vectorized for stride 1 and unrolled (for LLVM's SLP vectorizer) otherwise;
    the averages' division after each plane, vectorized. A global pool keeps its plane sum per channel."""
    window = PoolWindow.of(attrs)
    if window.kind == "global":
        at = sch.get_loops(pool)[1]  # the task's channel loop
    else:
        _, at, col, th, tw = sch.get_loops(pool)[-5:]  # channel, row, column, tap row, tap column
        width = int(sch.get(col).extent)
        run, inner = sch.split(col, [None, min(width, lanes)])
        sch.reorder(run, th, tw, inner)  # a run's outputs stay in registers across its taps
        sch.unroll(th)
        sch.unroll(tw)
        _vector_run(sch, inner, lanes, contiguous=window.strides[1] == 1 and width % lanes == 0)
        sch.decompose_reduction(pool, th)  # after vectorize: the other order is "not compact dataflow"
    out = optional_block(sch, "out")
    if out is not None:
        sch.reverse_compute_at(out, at)
        if window.kind != "global":
            loop = sch.get_loops(out)[-1]
            if int(sch.get(loop).extent) % lanes == 0:
                sch.vectorize(sch.split(loop, [None, lanes])[1])


def _vector_run(sch, loop, lanes: int, contiguous: bool):
    """A run of output columns: a whole vector vectorized where it reads contiguous columns, else unrolled (a
    strided vector load is a per-lane gather in TVM's codegen; LLVM's SLP pass packs the unrolled copies)."""
    if contiguous and int(sch.get(loop).extent) == lanes:
        sch.vectorize(loop)
    else:
        sch.unroll(loop)
