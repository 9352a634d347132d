"""dense with an epilogue: out[m, n] = act( sum_k x[m, k] * W[k, n] + b[n] ).

Half x and W are summed in float32, the epilogue runs in float32, the output is rounded once.

Stages: `dense` (reduction) and `epilogue`. W is [K, N], or packed by a schedule (`pack_columns`) into
column tiles [N / cols, K, cols], W[k, n] = Wp[n // cols, k, n % cols]: one tile is contiguous in memory.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tvm_fusion._tvm import te

from tvm_fusion.precision import accumulator_dtype, cast_to
from tvm_fusion.registry import register_compute

from . import dims
from .activations import apply_activation

DENSE_FAMILY = "dense_affine"  # the compute every dense rule without a compute of its own lowers to


class DenseOperands(NamedTuple):
    """The dense kernel's operands by name, in its PrimFunc's order: x, then the folded constants W and b
    (fuse.py's convention), then the output. `DenseOperands(*shapes)` names the shapes a schedule's
    `supports` gets, `DenseOperands(*func.params)` the PrimFunc's buffers."""

    x: object
    w: object
    b: object
    out: object = None


def pack_columns(w: np.ndarray, cols: int) -> np.ndarray:
    """W [K, N]  ==>  column tiles [ceil(N / cols), K, cols]: Wp[t, k, c] = W[k, t * cols + c], zero past N
    (the kernel computes those columns and its epilogue drops them)."""
    k, n = w.shape
    padded = -(-n // cols) * cols
    if padded != n:
        w = np.concatenate([w, np.zeros((k, padded - n), w.dtype)], axis=1)
    return np.ascontiguousarray(w.reshape(k, padded // cols, cols).transpose(1, 0, 2))


def dense_value(total, bias, out_dtype, activation=None, activation_params=None, fast_math=True, target=None):
    """One output element from its sum: act(sum + b) in the accumulator dtype, rounded once to `out_dtype`."""
    acc = accumulator_dtype(out_dtype)
    return cast_to(apply_activation(total + cast_to(bias, acc), activation, activation_params, fast_math=fast_math,
                                    target=target), out_dtype)


@register_compute(DENSE_FAMILY)
def dense_affine(x, w, b, *, activation=None, activation_params=None, fast_math=True, target=None, **_):
    m, k = dims(x.shape)  # m may be a symbolic batch
    acc = accumulator_dtype(x.dtype)

    def wide(v):
        return cast_to(v, acc)

    rk = te.reduce_axis((0, k), name="rk")
    n = int(b.shape[0])  # the real columns
    if len(w.shape) == 3:  # column tiles, the last one padded past n with zero columns (pack_columns)
        tiles, cols = int(w.shape[0]), int(w.shape[2])
        computed = tiles * cols
        weight = lambda r, j: w[j // cols, r, j % cols]  # noqa: E731
    else:
        computed = int(w.shape[1])
        weight = lambda r, j: w[r, j]  # noqa: E731
    dense = te.compute((m, computed), lambda i, j: te.sum(wide(x[i, rk]) * wide(weight(rk, j)), axis=rk),
                       name="dense")
    return te.compute((m, n), lambda i, j: dense_value(dense[i, j], b[j], x.dtype, activation, activation_params,
                                                       fast_math, target), name="epilogue")
