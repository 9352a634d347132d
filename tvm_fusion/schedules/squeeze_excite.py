"""Squeeze-and-excitation as one kernel, x NCHW, W1 [R, C], W2 [C, R] (the 1x1 convs' weights):

    pool[n, c]   = sum_{h, w} x[n, c, h, w]                  (GlobalAveragePool = pool / (H * W))
    fc1[n, r]    = sum_c W1[r, c] * (pool[n, c] / (H * W))
    hidden[n, r] = act(fc1[n, r] + b1[r])
    fc2[n, c]    = sum_r W2[c, r] * hidden[n, r]
    gate[n, c]   = gate_act(fc2[n, c] + b2[c])                (HardSigmoid or Sigmoid)
    out[n, c, h, w] = x[n, c, h, w] * gate[n, c]

The stages are named for the schedules: `pool`, `fc1`, `hidden`, `fc2`, `gate`, `out`. Half x (float16,
bfloat16): every stage before `out` runs in float32 (the pool sums x widened; W1, b1, W2, b2 are float32
constants), and `out` multiplies in float32 and rounds once.
"""

from __future__ import annotations

from typing import NamedTuple

from tvm_fusion._tvm import te, tirx
from tvm_fusion.precision import accumulator_dtype, cast_to
from tvm_fusion.registry import register_compute

from . import dims
from .activations import apply_activation

SE_FAMILY = "squeeze_excite"


class SEOperands(NamedTuple):
    """The squeeze-excite kernel's operands by name, in its PrimFunc's order: x, then the folded constants
    (fuse.py's convention), then the output. `SEOperands(*shapes)` names the shapes a schedule's `supports`
    gets."""

    x: object  # [N, C, H, W]
    w1: object  # [R, C]
    b1: object
    w2: object  # [C, R]
    b2: object
    out: object = None


@register_compute(SE_FAMILY)
def squeeze_excite(x, w1, b1, w2, b2, *, activation, activation_params=None, gate, gate_params=None,
                   fast_math=True, target=None, **_):
    n, c, h, w = dims(x.shape)  # n may be a symbolic batch
    r, acc = int(w1.shape[0]), accumulator_dtype(x.dtype)
    kh, kw = te.reduce_axis((0, h), name="kh"), te.reduce_axis((0, w), name="kw")
    pool = te.compute((n, c), lambda i, j: te.sum(cast_to(x[i, j, kh, kw], acc), axis=[kh, kw]), name="pool")
    count = tirx.const(float(h * w), acc)
    rc = te.reduce_axis((0, c), name="rc")
    fc1 = te.compute((n, r), lambda i, q: te.sum(w1[q, rc] * (pool[i, rc] / count), axis=rc), name="fc1")
    hidden = te.compute((n, r), lambda i, q: apply_activation(fc1[i, q] + b1[q], activation, activation_params,
                                                              fast_math=fast_math, target=target), name="hidden")
    rr = te.reduce_axis((0, r), name="rr")
    fc2 = te.compute((n, c), lambda i, j: te.sum(w2[j, rr] * hidden[i, rr], axis=rr), name="fc2")
    g = te.compute((n, c), lambda i, j: apply_activation(fc2[i, j] + b2[j], gate, gate_params, fast_math=fast_math,
                                                         target=target), name="gate")
    return te.compute((n, c, h, w), lambda i, j, y, z: cast_to(cast_to(x[i, j, y, z], acc) * g[i, j], x.dtype),
                      name="out")
