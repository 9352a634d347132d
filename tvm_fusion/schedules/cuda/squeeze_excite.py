"""CUDA schedule for squeeze-excite: one thread block per sample. The block pools its channels, runs both
1x1 convs and the gate into shared memory (one thread per channel or hidden unit, serial over the
reduction), then gates the feature map, the threads striding over C * H * W.

The gate needs the whole pooled vector, so a sample cannot be split across blocks without a second launch:
a feature map larger than MAX_ELEMENTS per sample is declined (`supports`), and the four unfused kernels,
which spread the gating over the whole GPU, run instead."""

from __future__ import annotations

from tvm_fusion.hardware import cuda_facts
from tvm_fusion.registry import register_schedule
from tvm_fusion.schedules.squeeze_excite import SE_FAMILY, SEOperands

THREADS = 256  # threads per block when every channel stage fits in it; SE blocks have 16-1000 channels
#: C * H * W per sample above which one block per sample leaves the GPU idle; an estimate (no GPU here to
#: measure): 256 threads x 256 elements each, i.e. one SM streaming 256 KB in and out
MAX_ELEMENTS = 256 * 256


def threads_for(channels: int, warp: int) -> int:
    """Threads per block, in whole warps: every channel stage (pool, fc1, fc2, gate: C or hidden units) in one
    pass of the block. A stage with more channels than threads would loop with a predicate around its
    shared-memory write, and TVM cannot put the barrier the next stage needs inside that condition
    ("Cannot insert syncs inside condition": PP-OCRv4's 384-channel SE at 256 threads)."""
    return max(THREADS, -(-channels // warp) * warp)


def _supports(attrs, shapes, target):
    ops = SEOperands(*shapes)
    (_, c, h, w), (hidden, _) = ops.x, ops.w1  # fc1's weight is (hidden, C)
    max_threads = cuda_facts(target).max_threads_per_block
    if min(c, hidden) == 1:
        return (f"the CUDA squeeze-excite kernel splits each channel stage over the threads; a stage of one "
                f"{'channel' if c == 1 else 'hidden unit'} (C = {c}, hidden = {hidden}) has no loop left to split")
    if max(c, hidden) > max_threads:
        return (f"the CUDA squeeze-excite kernel gives each of the {max(c, hidden)} channels a thread of one block; "
                f"a block has at most {max_threads}")
    if c * h * w > MAX_ELEMENTS:
        return (f"the CUDA squeeze-excite kernel runs one thread block per sample; C*H*W = {c * h * w} is over "
                f"{MAX_ELEMENTS}, where the unfused ops spread over the GPU")
    return None


@register_schedule(SE_FAMILY, target="cuda", supports=_supports)
def schedule_squeeze_excite_cuda(sch, attrs, target):
    out = sch.get_sblock("out")
    i, j, y, z = sch.get_loops(out)
    channels = max(int(sch.get(sch.get_loops(sch.get_sblock(name))[1]).extent) for name in ("fc1", "gate"))
    threads = threads_for(channels, cuda_facts(target).warp_size)
    sch.bind(i, "blockIdx.x")
    _, tx = sch.split(sch.fuse(j, y, z), [None, threads])
    sch.bind(tx, "threadIdx.x")
    for name in ("gate", "fc2", "hidden", "fc1", "pool"):  # consumers first: each lands under the sample loop
        block = sch.get_sblock(name)
        sch.compute_at(block, i)
        sch.set_scope(block, 0, "shared")
        _, tx = sch.split(sch.get_loops(block)[1], [None, threads])
        sch.bind(tx, "threadIdx.x")
