"""Scaled dot-product attention of one (batch, head) row at a time, inputs viewed as rank 4:

    score[b, h, i, j] = sum_d q[b, h, i, d] * kT[b, h, d, j]
    logit             = score / c   (or score * c, as matched; no scale when none)   (+ mask[b, h, i, j], broadcast)
    row_max[b, h, i]  = max_j logit;   exp = exp(logit - row_max);   row_sum[b, h, i] = sum_j exp
    probs             = exp / row_sum                                                  (softmax over the last axis)
    out[b, h, i, e]   = sum_j probs[b, h, i, j] * v[b, h, j, e]

The mask is indexed with NumPy broadcasting: a size-1 dim reads index 0. Stages, named for the schedules:
`qk`, `row_max`, `exp`, `row_sum`, `probs`, `out`. Half q, kT, v (float16, bfloat16): every stage runs in
float32 (the products widened, the scale and the mask too), and one more stage, `store`, rounds `out` once
(a float32 kernel has none: `out` is its output).
"""

from __future__ import annotations

from typing import NamedTuple

from tvm_fusion._tvm import te, tirx
from tvm_fusion.precision import accumulator_dtype, cast_to
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


def has_store(sch) -> bool:
    """Whether the scheduled kernel is a half one: its last block is `store`, which rounds `out`."""
    return any(sch.get(b).name_hint == "store" for b in sch.get_child_blocks(sch.get_sblock("root")))


@register_compute(ATTENTION_FAMILY)
def attention(q, kt, v, mask=None, *, scale=None, scale_op=None, **_):
    b, h, s, d = dims(q.shape)  # b (or h, for a rank-3 q viewed as rank 4) may be a symbolic batch
    t, e = int(kt.shape[3]), int(v.shape[3])
    acc = accumulator_dtype(q.dtype)
    rd = te.reduce_axis((0, d), name="rd")
    qk = te.compute((b, h, s, t), lambda n, m, i, j: te.sum(
        cast_to(q[n, m, i, rd], acc) * cast_to(kt[n, m, rd, j], acc), axis=rd), name="qk")
    c = tirx.const(scale, acc) if scale is not None else None
    mdims = dims(mask.shape) if mask is not None else []

    def logit(n, m, i, j):
        x = qk[n, m, i, j]
        if scale_op == "divide":
            x = x / c
        elif scale_op == "multiply":
            x = x * c
        if mask is not None:
            x = x + cast_to(mask[tuple(0 if isinstance(size, int) and size == 1 else idx
                                       for size, idx in zip(mdims, (n, m, i, j)))], acc)
        return x

    rj = te.reduce_axis((0, t), name="rj")
    row_max = te.compute((b, h, s), lambda n, m, i: te.max(logit(n, m, i, rj), axis=rj), name="row_max")
    ex = te.compute((b, h, s, t), lambda n, m, i, j: te.exp(logit(n, m, i, j) - row_max[n, m, i]), name="exp")
    rk = te.reduce_axis((0, t), name="rk")
    row_sum = te.compute((b, h, s), lambda n, m, i: te.sum(ex[n, m, i, rk], axis=rk), name="row_sum")
    probs = te.compute((b, h, s, t), lambda n, m, i, j: ex[n, m, i, j] / row_sum[n, m, i], name="probs")
    rv = te.reduce_axis((0, t), name="rv")
    out = te.compute((b, h, s, e), lambda n, m, i, f: te.sum(probs[n, m, i, rv] * cast_to(v[n, m, rv, f], acc),
                                                             axis=rv), name="out")
    if out.dtype == q.dtype:
        return out
    return te.compute((b, h, s, e), lambda *i: out[i].astype(q.dtype), name="store")
