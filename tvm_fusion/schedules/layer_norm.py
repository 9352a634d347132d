"""LayerNorm over the last axis of x viewed as [rows, C] (or [N, rows, C] with a symbolic batch N: a product
of N with the other dims is no kernel dim), with an optional residual added first:

    h = x (+ residual);  d = h - h[0]  (the row shifted by its first value)
    mean_d = sum_c d / C;  var = sum_c (d - mean_d)^2 / C
    out = (d - mean_d) / sqrt(var + eps) * gamma + beta

Two passes over a shifted row: the variance sums squared deviations from the mean (no E[h^2] - E[h]^2), and
neither the mean nor the deviations are ever formed at the row's magnitude. A float32 mean of values near 1e4
is itself up to 4.9e-4 off (half an ulp), and every output (h - mean) / std carries that error: with the shift
the row's values are subtracted exactly from a nearby value (Sterbenz), so the mean and the deviations are
sums of small numbers. Half inputs: statistics and normalization in float32, the output rounded once.
Stages: `mean` (the row sum of d), `var` (the row sum of squared deviations) and `out`; the residual add and
the shift are inlined into all three.
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

    def d(r, k):  # the row shifted by its first value
        return h(r, k) - h(r, 0)

    inv_c = tirx.const(1.0 / c, acc)
    k1 = te.reduce_axis((0, c), name="k1")
    total = te.compute(lead, lambda *r: te.sum(d(r, k1), axis=k1), name="mean")
    k2 = te.reduce_axis((0, c), name="k2")
    sq = te.compute(lead, lambda *r: te.sum((d(r, k2) - total[r] * inv_c) * (d(r, k2) - total[r] * inv_c),
                                           axis=k2), name="var")
    eps = tirx.const(epsilon, acc)

    def out(*idx):
        r, k = idx[:-1], idx[-1]
        v = (d(r, k) - total[r] * inv_c) / te.sqrt(sq[r] * inv_c + eps) * wide(gamma[k]) + wide(beta[k])
        return cast_to(v, x.dtype)

    return te.compute((*lead, c), out, name="out")
