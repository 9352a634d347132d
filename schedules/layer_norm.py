"""LayerNorm over the last axis of x viewed as [rows, C] (or [N, rows, C] with a symbolic batch N: a product
of N with the other dims is no kernel dim), with an optional residual added first:

    h = x (+ residual);  mean = sum_c h / C;  var = sum_c (h - mean)^2 / C
    out = (h - mean) / sqrt(var + eps) * gamma + beta

Half inputs: both statistics and the normalization run in float32, the output is rounded once.
Stages: `mean` (the row sum), `var` (the row sum of squared deviations) and `out`; the residual add is
inlined into all three.
"""

from __future__ import annotations

from tvm_fusion._tvm import te, tirx
from tvm_fusion.precision import accumulator_dtype, cast_to
from tvm_fusion.registry import register_compute

from . import dims

LAYER_NORM_FAMILY = "layer_norm_affine"  # the compute every LayerNorm rule without a compute of its own lowers to


@register_compute(LAYER_NORM_FAMILY)
def layer_norm_affine(x, gamma, beta, residual=None, *, epsilon, **_):
    *lead, c = dims(x.shape)  # lead: (rows,) or (N, rows); N may be a symbolic batch
    acc = accumulator_dtype(x.dtype)

    def wide(v):
        return cast_to(v, acc)

    def h(r, k):  # r: the row's indices into the lead dims
        return wide(x[(*r, k)]) + wide(residual[(*r, k)]) if residual is not None else wide(x[(*r, k)])

    inv_c = tirx.const(1.0 / c, acc)
    k1 = te.reduce_axis((0, c), name="k1")
    total = te.compute(lead, lambda *r: te.sum(h(r, k1), axis=k1), name="mean")
    k2 = te.reduce_axis((0, c), name="k2")
    sq = te.compute(lead, lambda *r: te.sum((h(r, k2) - total[r] * inv_c) * (h(r, k2) - total[r] * inv_c),
                                           axis=k2), name="var")
    eps = tirx.const(epsilon, acc)

    def out(*idx):
        r, k = idx[:-1], idx[-1]
        v = (h(r, k) - total[r] * inv_c) / te.sqrt(sq[r] * inv_c + eps) * wide(gamma[k]) + wide(beta[k])
        return cast_to(v, x.dtype)

    return te.compute((*lead, c), out, name="out")
