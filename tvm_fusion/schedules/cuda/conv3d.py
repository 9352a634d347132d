"""CUDA schedule for the conv3d epilogue compute (`pad` -> `conv` -> `epilogue`, NCDHW / OIDHW).

Direct convolution, OC_REG output channels per thread:

    blockIdx.x    (n, oc block, d, h, w) / THREADS        one output pixel of OC_REG channels per thread;
    threadIdx.x                                           consecutive threads: consecutive output columns,
                                                          so the input reads and the stores coalesce
    rc, rd, rh, rw    OC_REG accumulators in registers    each input value read once for OC_REG channels
    epilogue          bias (+ residual) + activation from the registers, one store per output

The `pad` stage is inlined (a predicated load). OC_REG is the largest of OC_REG_CHOICES that divides the output
channels per group, so a thread's channels never straddle two groups. Not staged through shared memory: the
window's reuse is left to the L1 cache.
"""

from __future__ import annotations

from tvm_fusion.hardware import cuda_facts
from tvm_fusion.registry import register_schedule
from tvm_fusion.schedules.conv3d import CONV3D_FAMILY, conv3d_out_sizes, conv3d_taps

THREADS = 128  # threads per block
OC_REG_CHOICES = (4, 2, 1)  # output channels per thread
UNROLL_MAX_STEP = 16  # pragma_auto_unroll_max_step, as the conv2d CUDA schedule


def oc_per_thread(opg: int) -> int:
    return next(k for k in OC_REG_CHOICES if opg % k == 0)


def supports(attrs: dict, shapes, target) -> str | None:
    """Why the schedule cannot take this conv3d, or None. `shapes`: (x, [residual], W, b)."""
    shapes = list(shapes)
    x, w = shapes[0], shapes[-2]
    if len(x) != 5 or len(w) != 5:
        return f"conv3d operands have ranks {len(x)} and {len(w)}; the CUDA conv3d schedule takes NCDHW / OIDHW"
    out = conv3d_out_sizes(x[2:], conv3d_taps(w)[1:], attrs["strides"], attrs["padding"], attrs["dilation"])
    if min(out) < 1:
        return f"conv3d output is empty ({'x'.join(map(str, out))})"
    if THREADS > cuda_facts(target).max_threads_per_block:
        return f"the CUDA conv3d schedule runs {THREADS} threads per block; the limit is " \
               f"{cuda_facts(target).max_threads_per_block}"
    return None


@register_schedule(CONV3D_FAMILY, target="cuda", supports=supports)
def schedule_conv3d_cuda(sch, attrs, target) -> str:
    conv, epi = sch.get_sblock("conv"), sch.get_sblock("epilogue")
    try:
        sch.compute_inline(sch.get_sblock("pad"))
    except Exception:  # noqa: BLE001 - no padding stage: the conv reads the input directly
        pass
    n, o, d, h, w, rc, rd, rh, rw = sch.get_loops(conv)
    groups = attrs.get("groups", 1)
    oc_reg = oc_per_thread(int(sch.get(o).extent) // groups)
    oo, oi = sch.split(o, [None, oc_reg])
    sch.reorder(n, oo, d, h, w, rc, rd, rh, rw, oi)
    bx, tx = sch.split(sch.fuse(n, oo, d, h, w), [None, THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.set_scope(conv, 0, "local")
    sch.reverse_compute_at(epi, tx)
    sch.unroll(oi)
    sch.decompose_reduction(conv, rc)
    sch.annotate(tx, "pragma_auto_unroll_max_step", UNROLL_MAX_STEP)
    sch.annotate(tx, "pragma_unroll_explicit", 0)
    return f"CUDA cores, {oc_reg} output channels per thread"
