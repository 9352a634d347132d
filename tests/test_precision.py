"""Half precision (tvm_fusion.precision): float16 ONNX models fuse exactly like their float32 originals and
match onnxruntime; every compute sums in float32 for float16 and bfloat16 (checked against float64 NumPy);
`--precision fp16|bf16` converts a float32 model and is judged against the float32 reference with the half
dtype's tolerance; the half kernels build for CUDA within the launch limits."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tvm_fusion.build import build, resolve_target
from tvm_fusion.frontend import import_onnx
from tvm_fusion.precision import convert, numpy_dtype
from tvm_fusion.schedules.cuda.families_test import _chain_model, _conv_act_model, _ffn_model, _layer_norm_model
from tvm_fusion.compare import random_inputs, run_onnxruntime
from tvm_fusion.testing import as_float16, assert_close, check_fused, conv_bn_relu, residual_block, run_build

FAMILIES = {
    "conv_bn_relu": lambda: (conv_bn_relu(), {"conv2d_bn_relu": 1}),
    "residual_block": lambda: (residual_block(), {"conv2d_bn_add_relu": 1, "conv2d_bn_relu": 1}),
    "conv_activations": _conv_act_model,
    "ffn_gelu": _ffn_model,
    "layer_norm": _layer_norm_model,
    "elementwise": _chain_model,
}


def _onnxruntime(model, inputs):
    return run_onnxruntime(model, inputs)[0].run(None, inputs)


@pytest.mark.parametrize("family", FAMILIES)
def test_float16_model_fuses_like_float32_and_matches_onnxruntime(family):
    """Same groups as the float32 model; the float16 fused build matches onnxruntime's float16 run and the
    float32 model on the same (rounded) inputs, element by element with float16's tolerance. (TVM's unfused
    float16 build sums in float16, so it is not the oracle here: it is further from both.)"""
    model, expect = FAMILIES[family]()
    assert {k: v for k, v in check_fused(model).counts.items() if v} == expect
    half = as_float16(model)
    built = build(import_onnx(half), "llvm", "fused")
    assert {k: v for k, v in built.counts.items() if v} == expect
    inputs = random_inputs(half)
    got = run_build(built, [inputs[i.name] for i in half.graph.input if i.name in inputs])
    wide = {k: v.astype(np.float32) for k, v in inputs.items()}
    for i, (g, r16, r32) in enumerate(zip(got, _onnxruntime(half, inputs), _onnxruntime(model, wide))):
        assert g.dtype == np.float16
        assert_close(g, r16, f"{family} output {i}: fused float16 vs onnxruntime float16")
        assert_close(g, r32, f"{family} output {i}: fused float16 vs float32 reference", dtype="float16")
