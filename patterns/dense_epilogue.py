"""matmul(x, W) -> add bias -> [relu]  ==>  dense_bias[_relu](x, W, b)   (ONNX Gemm / MatMul + Add).

TVM imports Gemm as permute_dims(W) + matmul + add; FoldConstant turns permute_dims(W) into a constant.
"""

from __future__ import annotations

import numpy as np

from tvm_fusion import _tvm, registry
from tvm_fusion._tvm import dpl
from tvm_fusion.rules import Lowering, Match, Spec, commutative, decline, rule, static_shape

SUPPORTED_DTYPES = ("float32",)
DENSE_FAMILY = "dense_affine"  # schedules/dense.py registers it; rules without their own compute use it


def dense_epilogue(*, activation=None) -> Spec:
    matmul = dpl.is_op("relax.matmul")(dpl.wildcard(), dpl.is_const())
    bias = dpl.is_const()
    y = commutative("relax.add", matmul, bias)
    ann = {"matmul": matmul, "bias_add": y, "bias": bias}
    if activation is not None:
        y = dpl.is_op(f"relax.nn.{activation}")(y)
        ann["activation"] = y
    ann["root"] = y
    return Spec(y, ann, lambda m: lower_dense(m, activation))


def dense_checks(m: Match):
    x_shape, w_shape = (static_shape(a) for a in m.value("matmul").args)
    if x_shape is None:
        return decline("matmul input has a symbolic shape; bind input shapes (--shape NAME=1x3x224x224)")
    if len(x_shape) != 2 or len(w_shape) != 2:
        return decline(f"matmul operands have ranks {len(x_shape)} and {len(w_shape)}; dense takes 2-D x and 2-D W")
    dtype = m.dtype("matmul")
    if dtype not in SUPPORTED_DTYPES:
        return decline(f"matmul dtype is {dtype}; the compute supports {', '.join(SUPPORTED_DTYPES)}")
    n = w_shape[1]
    b_shape = static_shape(m["bias"])
    if b_shape not in ((n,), (1, n)):
        return decline(f"bias has shape {b_shape}; expected ({n},) or (1, {n})")
    return None


def lower_dense(m: Match, activation) -> Lowering:
    matmul = m.value("matmul")
    w = _tvm.constant_value(matmul.args[1])
    b = np.asarray(m.const("bias")).reshape(-1)
    dtype = m.dtype("matmul")
    compute = m.rule if registry.has_compute(m.rule) else DENSE_FAMILY
    return Lowering(compute=compute, inputs=[matmul.args[0]],
                    constants=[w.astype(dtype), b.astype(dtype)], attrs=dict(activation=activation))


@rule("dense_bias_relu", priority=120, check=dense_checks)
def dense_bias_relu():
    """matmul(x, W) -> add b -> relu  ==>  dense_bias_relu(x, W, b)"""
    return dense_epilogue(activation="relu")


@rule("dense_bias", priority=110, check=dense_checks)
def dense_bias():
    """matmul(x, W) -> add b  ==>  dense_bias(x, W, b)"""
    return dense_epilogue()
