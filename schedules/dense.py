"""dense with an epilogue: out[m, n] = act( sum_k x[m, k] * W[k, n] + b[n] ).

Half x and W are summed in float32, the epilogue runs in float32, the output is rounded once.

Stages: `dense` (reduction) and `epilogue`.
"""

from __future__ import annotations

from tvm_fusion._tvm import te

from tvm_fusion.precision import accumulator_dtype, cast_to
from tvm_fusion.registry import register_compute

from .activations import apply_activation

DENSE_FAMILY = "dense_affine"
DENSE_RULES = (DENSE_FAMILY, "dense_bias_relu", "dense_bias")  # the rest lower to DENSE_FAMILY


@register_compute(*DENSE_RULES)
def dense_affine(x, w, b, *, activation=None, activation_params=None, **_):
    m, k = (int(d) for d in x.shape)
    n = int(w.shape[1])
    acc = accumulator_dtype(x.dtype)

    def wide(v):
        return cast_to(v, acc)

    def narrow(v):
        return cast_to(v, x.dtype)

    rk = te.reduce_axis((0, k), name="rk")
    dense = te.compute((m, n), lambda i, j: te.sum(wide(x[i, rk]) * wide(w[rk, j]), axis=rk), name="dense")
    return te.compute((m, n), lambda i, j: narrow(apply_activation(dense[i, j] + wide(b[j]), activation,
                                                                   activation_params)), name="epilogue")
