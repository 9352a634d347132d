"""Scaled dot-product attention of one (batch, head) row at a time, inputs viewed as rank 4:

    score[b, h, i, j] = sum_d q[b, h, i, d] * kT[b, h, d, j]
    logit             = score / c   (or score * c, as matched; no scale when none)   (+ mask[b, h, i, j], broadcast)
    row_max[b, h, i]  = max_j logit;   exp = exp(logit - row_max);   row_sum[b, h, i] = sum_j exp
    probs             = exp / row_sum                                                  (softmax over the last axis)
    out[b, h, i, e]   = sum_j probs[b, h, i, j] * v[b, h, j, e]

The mask is indexed with NumPy broadcasting: a size-1 dim reads index 0. Stages, named for the schedules:
`qk`, `row_max`, `exp`, `row_sum`, `probs`, `out`.
"""

from __future__ import annotations

from typing import NamedTuple

from tvm_fusion._tvm import te, tirx
from tvm_fusion.registry import register_compute

from . import dims

ATTENTION_FAMILY = "attention"


class AttentionOperands(NamedTuple):
    """The attention kernel's inputs by name, in its PrimFunc's order (patterns/attention.py's lowering):
    `AttentionOperands(*shapes)` names the shapes a schedule's `supports` gets."""

    q: object  # [b, h, s, d]
    kt: object  # [b, h, d, t]: t keys
    v: object  # [b, h, t, e]
    mask: object = None  # broadcast to [b, h, s, t]


@register_compute(ATTENTION_FAMILY)
def attention(q, kt, v, mask=None, *, scale=None, scale_op=None, **_):
    b, h, s, d = dims(q.shape)  # b (or h, for a rank-3 q viewed as rank 4) may be a symbolic batch
    t, e = int(kt.shape[3]), int(v.shape[3])
    rd = te.reduce_axis((0, d), name="rd")
    qk = te.compute((b, h, s, t), lambda n, m, i, j: te.sum(q[n, m, i, rd] * kt[n, m, rd, j], axis=rd), name="qk")
    c = tirx.const(scale, q.dtype) if scale is not None else None
    mdims = dims(mask.shape) if mask is not None else []

    def logit(n, m, i, j):
        x = qk[n, m, i, j]
        if scale_op == "divide":
            x = x / c
        elif scale_op == "multiply":
            x = x * c
        if mask is not None:
            x = x + mask[tuple(0 if isinstance(size, int) and size == 1 else idx
                               for size, idx in zip(mdims, (n, m, i, j)))]
        return x

    rj = te.reduce_axis((0, t), name="rj")
    row_max = te.compute((b, h, s), lambda n, m, i: te.max(logit(n, m, i, rj), axis=rj), name="row_max")
    ex = te.compute((b, h, s, t), lambda n, m, i, j: te.exp(logit(n, m, i, j) - row_max[n, m, i]), name="exp")
    rk = te.reduce_axis((0, t), name="rk")
    row_sum = te.compute((b, h, s), lambda n, m, i: te.sum(ex[n, m, i, rk], axis=rk), name="row_sum")
    probs = te.compute((b, h, s, t), lambda n, m, i, j: ex[n, m, i, j] / row_sum[n, m, i], name="probs")
    rv = te.reduce_axis((0, t), name="rv")
    return te.compute((b, h, s, e), lambda n, m, i, f: te.sum(probs[n, m, i, rv] * v[n, m, rv, f], axis=rv),
                      name="out")
