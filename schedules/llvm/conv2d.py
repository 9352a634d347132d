"""CPU schedule for the conv2d epilogue compute (experimental)."""

from __future__ import annotations

from tvm_fusion.registry import register_schedule
from tvm_fusion.schedules.conv2d import CONV_RULES

VECTOR = 16  # fp32 lanes of one AVX-512 register
OC_BLOCK = 8
OC_TILE = 32
W_TILE = 14


def _factor(extent: int, want: int) -> int:
    for f in range(min(want, extent), 0, -1):
        if extent % f == 0:
            return f
    return 1


def _block(sch, name):
    try:
        return sch.get_sblock(name)
    except Exception:  # noqa: BLE001
        return None


def _schedule_simple(sch, conv, epi, pad):
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


def _schedule_oc_vector(sch, conv, epi, pad, oc_tile, w_tile, epi_mode):
    n, o, h, w, rc, rh, rw = sch.get_loops(conv)
    oo, oi = sch.split(o, [None, oc_tile])
    wo, wi = sch.split(w, [None, w_tile])
    sch.reorder(n, oo, h, wo, rh, rw, rc, wi, oi)
    outer = sch.fuse(n, oo)
    sch.parallel(outer)
    # weight panel for this oc block, transposed so oc is innermost
    wcache = sch.cache_read(conv, 1 if pad is None else 1, "global")
    sch.compute_at(wcache, outer)
    sch.transform_layout(wcache, ("write", 0), lambda o_, c, r, s: (r, s, c, o_))
    import os
    pm = os.environ.get("PACK", "scalar")
    if pm == "gather":
        po, pc, pr, ps = sch.get_loops(wcache)[-4:]
        sch.reorder(pr, ps, pc, po)
        sch.vectorize(po)
    elif pm == "vecin":
        po, pc, pr, ps = sch.get_loops(wcache)[-4:]
        sch.vectorize(sch.fuse(pc, pr, ps))
    sch.reverse_compute_at(epi, wo)
    sch.transform_layout(conv, ("write", 0), lambda n_, o_, h_, w_: (n_, h_, w_, o_))
    sch.set_scope(conv, 0, "local")
    sch.vectorize(oi)
    sch.unroll(wi)
    sch.decompose_reduction(conv, rh)
    el = sch.get_loops(epi)
    en, eo, eh, ew = el[-4:]
    if epi_mode == "w":
        sch.vectorize(ew)
    else:
        sch.reorder(ew, eo)
        sch.vectorize(eo)


@register_schedule(*CONV_RULES, target="llvm")
def schedule_conv2d_llvm(sch, attrs, target):
    import os
    conv = sch.get_sblock("conv")
    epi = sch.get_sblock("epilogue")
    pad = _block(sch, "pad")
    if pad is not None:
        pn, pc, ph, pw = sch.get_loops(pad)
        sch.parallel(sch.fuse(pn, pc))
    mode = os.environ.get("MODE", "B")
    cout = int(sch.get(sch.get_loops(conv)[1]).extent)
    if mode == "simple" or attrs["groups"] != 1 or cout % int(os.environ.get("OCT", OC_TILE)) != 0:
        return _schedule_simple(sch, conv, epi, pad)
    _schedule_oc_vector(sch, conv, epi, pad, int(os.environ.get("OCT", OC_TILE)), int(os.environ.get("WT", W_TILE)),
                        os.environ.get("EPI", "w"))
