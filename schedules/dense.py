"""dense with an epilogue: out[m, n] = act( sum_k x[m, k] * W[k, n] + b[n] ).

Stages: `dense` (reduction) and `epilogue`.
"""

from __future__ import annotations

from tvm_fusion._tvm import te

from tvm_fusion.registry import register_compute

from . import dims
from .activations import apply_activation

DENSE_FAMILY = "dense_affine"  # the compute every dense rule without a compute of its own lowers to


@register_compute(DENSE_FAMILY)
def dense_affine(x, w, b, *, activation=None, activation_params=None, **_):
    m, k = dims(x.shape)  # m may be a symbolic batch
    n = int(w.shape[1])
    rk = te.reduce_axis((0, k), name="rk")
    dense = te.compute((m, n), lambda i, j: te.sum(x[i, rk] * w[rk, j], axis=rk), name="dense")
    return te.compute((m, n), lambda i, j: apply_activation(dense[i, j] + b[j], activation, activation_params),
                      name="epilogue")
