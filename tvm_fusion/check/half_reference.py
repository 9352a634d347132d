"""The baseline a half-precision build is judged against (`--precision`, or a float16 / bfloat16 model).

Whether the half verdict means anything depends on the model, so it is measured first (`half_baseline`):

    baseline = onnxruntime(fp32 model, input and conv / matmul weights rounded to the half dtype)
    baseline within the half tolerance of onnxruntime(fp32 model)  ==>  judge every half build against it
    otherwise (ill-conditioned)  ==>  report that error, judge each fused group against its unfused ops

The baseline is the rounding every half build must do before any arithmetic, computed in float32 by
onnxruntime (no TVM, no conversion of ours). When that alone puts elements over the half tolerance, the model
amplifies rounding (the synthetic ResNet-50: a 2^-11 relative change of its input moves the logits ~0.9%), and
two correct half builds that round at different points (fused and unfused) differ as much: then the whole-
model errors are reported, and fusion is judged per group at the same precision (differential.check_groups:
each group against the same ops unfused, on the same half inputs, where nothing amplifies).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from tvm_fusion.check.io import run_onnxruntime
from tvm_fusion.check.numerics import error_stats
from tvm_fusion.precision import WEIGHT_OPS, check_precision, numpy_dtype, verdict_dtype

__all__ = ["half_baseline", "half_baseline_outputs", "rounded_weights"]


def rounded_weights(proto, precision: str):
    """A copy of the float32 ONNX model whose conv / matmul weights (float32 initializers and Constant nodes
    read as input 1 of WEIGHT_OPS) are rounded to the half dtype of `precision` and stored as float32 again."""
    half = numpy_dtype(check_precision(precision))
    weights = {n.input[1] for n in proto.graph.node if n.op_type in WEIGHT_OPS and len(n.input) > 1}

    def rounded(t):
        a = numpy_helper.to_array(t)
        return numpy_helper.from_array(a.astype(half).astype(a.dtype), t.name) if a.dtype == "float32" else t

    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for t in out.graph.initializer:
        if t.name in weights:
            t.CopyFrom(rounded(t))
    for n in out.graph.node:
        if n.op_type == "Constant" and n.output[0] in weights:
            for a in n.attribute:
                if a.name == "value":
                    a.t.CopyFrom(rounded(a.t))
    return out


def half_baseline_outputs(proto, inputs: dict, precision: str) -> list:
    """onnxruntime's outputs for `proto` with its float32 `inputs` and weights rounded to the half dtype
    (rounded_weights; the arithmetic in float32)."""
    half = numpy_dtype(check_precision(precision))
    fed = {k: v.astype(half).astype(v.dtype) if np.asarray(v).dtype == np.float32 else v for k, v in inputs.items()}
    sess, _ = run_onnxruntime(rounded_weights(proto, precision), fed)
    return sess.run(None, fed)


def half_baseline(proto, inputs: dict, reference: list, precision: str) -> list:
    """numerics.ErrorStats per output of half_baseline_outputs against `reference` (onnxruntime on the float32
    model) with the half dtype's tolerance: the error any half build carries at least. All ok: the model is
    well-conditioned for the dtype, and half builds are judged against the float32 model."""
    return [error_stats(a, r, verdict_dtype(np.asarray(r).dtype, precision))
            for a, r in zip(half_baseline_outputs(proto, inputs, precision), reference)]
