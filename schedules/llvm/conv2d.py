"""CPU schedule for the conv2d epilogue compute: parallel over (batch, output-channel blocks), vectorized
along the output row, epilogue computed per tile while the accumulators are hot."""

from __future__ import annotations

from tvm_fusion.registry import register_schedule
from tvm_fusion.schedules.conv2d import CONV_RULES

VECTOR = 16  # fp32 lanes of one AVX-512 register
OC_BLOCK = 8


def _factor(extent: int, want: int) -> int:
    for f in range(min(want, extent), 0, -1):
        if extent % f == 0:
            return f
    return 1


@register_schedule(*CONV_RULES, target="llvm")
def schedule_conv2d_llvm(sch, attrs, target):
    conv = sch.get_sblock("conv")
    epi = sch.get_sblock("epilogue")
    try:
        pad = sch.get_sblock("pad")
    except Exception:  # noqa: BLE001 - no padding stage
        pad = None
    n, o, h, w, rc, rh, rw = sch.get_loops(conv)
    o_ext = int(sch.get(o).extent)
    w_ext = int(sch.get(w).extent)
    oo, oi = sch.split(o, [None, _factor(o_ext, OC_BLOCK)])
    wo, wi = sch.split(w, [None, min(VECTOR, w_ext)])
    sch.reorder(n, oo, h, wo, rc, rh, rw, oi, wi)
    outer = sch.fuse(n, oo)
    sch.parallel(outer)
    sch.reverse_compute_at(epi, wo)
    sch.vectorize(wi)
    sch.unroll(oi)
    sch.decompose_reduction(conv, rc)
    if pad is not None:
        pn, pc, ph, pw = sch.get_loops(pad)
        sch.parallel(sch.fuse(pn, pc))
