"""Batched matmul with an epilogue, both operands runtime tensors (or any rank of constant the dense rules do
not take):

    out[o..., m, n] = act( sum_k A[a..., m, k] * B[b..., k, n]  [* c | / c]  [+ bias[n]] )

A and B have the same rank (the lowering views a lower-rank operand with leading 1s, a 1-D one as a row or a
column); their batch dims broadcast as NumPy's do: a dim of 1 is read at index 0 (`broadcast_index`). The
outermost batch dim may be symbolic (a declared batch). Half A and B are summed in float32; the scale, the
bias and the activation run in float32, and the output is rounded once.

Stages, named for the schedules: `matmul` (the reduction over k) and `epilogue`.
"""

from __future__ import annotations

from typing import NamedTuple

from tvm_fusion._tvm import te, tirx
from tvm_fusion.precision import accumulator_dtype, cast_to
from tvm_fusion.registry import register_compute

from . import dims
from .activations import apply_activation

BATCH_MATMUL_FAMILY = "batch_matmul"


class BatchMatmulOperands(NamedTuple):
    """The kernel's operands by name, in its PrimFunc's order (the inputs, then the constants, then the output:
    fuse.py): A, B, the folded bias when there is one, the output. `BatchMatmulOperands(*shapes)` names the
    shapes a schedule's `supports` gets, `BatchMatmulOperands(*func.params)` a PrimFunc's buffers (without a
    bias: `BatchMatmulOperands(a, b, out=out)`). The compute is called as (A, [bias], B): the first input,
    the constants, the other inputs."""

    a: object
    b: object
    bias: object = None
    out: object = None


def broadcast_index(index, shape, out_batch):
    """The indices of a batch dim of `shape` for the output's batch indices: 0 where the operand's dim is 1
    and the output's is not (NumPy broadcasting), the output's index otherwise."""
    return [0 if isinstance(d, int) and d == 1 and not (isinstance(o, int) and o == 1) else i
            for i, d, o in zip(index, shape, out_batch)]


def out_batch_dims(a_batch, b_batch) -> list:
    """The output's batch dims: per dim, the one that is not 1 (the lowering checked that they broadcast)."""
    return [b if isinstance(a, int) and a == 1 else a for a, b in zip(a_batch, b_batch)]


@register_compute(BATCH_MATMUL_FAMILY)
def batch_matmul(a, *rest, has_bias=False, scale=None, scale_op=None, activation=None, activation_params=None,
                 fast_math=True, target=None, **_):
    bias, b = (rest[0], rest[1]) if has_bias else (None, rest[0])
    a_shape, b_shape = dims(a.shape), dims(b.shape)
    *a_batch, m, k = a_shape
    *b_batch, _, n = b_shape
    batch = out_batch_dims(a_batch, b_batch)
    acc = accumulator_dtype(a.dtype)
    rk = te.reduce_axis((0, k), name="rk")

    def product(*i):
        *o, row, col = i
        ai, bi = broadcast_index(o, a_batch, batch), broadcast_index(o, b_batch, batch)
        return te.sum(cast_to(a[(*ai, row, rk)], acc) * cast_to(b[(*bi, rk, col)], acc), axis=rk)

    mm = te.compute((*batch, m, n), product, name="matmul")
    return batch_matmul_epilogue(mm, (*batch, m, n), a.dtype, bias, scale=scale, scale_op=scale_op,
                                 activation=activation, activation_params=activation_params, fast_math=fast_math,
                                 target=target)


def batch_matmul_epilogue(mm, shape, dtype, bias=None, *, scale=None, scale_op=None, activation=None,
                          activation_params=None, fast_math=True, target=None):
    """The `epilogue` stage over `shape` (the output's, within `mm`'s): the scale, the bias, the activation in
    the accumulator dtype, rounded to `dtype` once."""
    acc = accumulator_dtype(dtype)
    c = tirx.const(scale, acc) if scale is not None else None

    def epilogue(*i):
        v = mm[i]
        if scale_op == "divide":
            v = v / c
        elif scale_op == "multiply":
            v = v * c
        if bias is not None:
            v = v + cast_to(bias[i[-1]], acc)
        return cast_to(apply_activation(v, activation, activation_params, fast_math=fast_math, target=target), dtype)

    return te.compute(shape, epilogue, name="epilogue")
