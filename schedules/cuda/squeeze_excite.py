"""CUDA schedule for squeeze-excite: one thread block per sample. The block pools its channels, runs both
1x1 convs and the gate into shared memory (one thread per channel or hidden unit, serial over the
reduction), then gates the feature map, the threads striding over C * H * W.

The gate needs the whole pooled vector, so a sample cannot be split across blocks without a second launch:
a feature map larger than MAX_ELEMENTS per sample is declined (`supports`), and the four unfused kernels,
which spread the gating over the whole GPU, run instead."""

from __future__ import annotations

from tvm_fusion.registry import register_schedule
from tvm_fusion.schedules.squeeze_excite import SE_FAMILY

THREADS = 256  # threads per block: a multiple of the warp; SE blocks have 16-1000 channels
#: C * H * W per sample above which one block per sample leaves the GPU idle; an estimate (no GPU here to
#: measure): 256 threads x 256 elements each, i.e. one SM streaming 256 KB in and out
MAX_ELEMENTS = 256 * 256


def _supports(attrs, shapes, target):
    n, c, h, w = shapes[0]
    if c * h * w > MAX_ELEMENTS:
        return (f"the CUDA squeeze-excite kernel runs one thread block per sample; C*H*W = {c * h * w} is over "
                f"{MAX_ELEMENTS}, where the unfused ops spread over the GPU")
    return None


@register_schedule(SE_FAMILY, target="cuda", supports=_supports)
def schedule_squeeze_excite_cuda(sch, attrs, target):
    out = sch.get_sblock("out")
    i, j, y, z = sch.get_loops(out)
    sch.bind(i, "blockIdx.x")
    _, tx = sch.split(sch.fuse(j, y, z), [None, THREADS])
    sch.bind(tx, "threadIdx.x")
    for name in ("gate", "fc2", "hidden", "fc1", "pool"):  # consumers first: each lands under the sample loop
        block = sch.get_sblock(name)
        sch.compute_at(block, i)
        sch.set_scope(block, 0, "shared")
        _, tx = sch.split(sch.get_loops(block)[1], [None, THREADS])
        sch.bind(tx, "threadIdx.x")
