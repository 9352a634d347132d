"""Kernel identity (fuse._kernel_key): two groups share a PrimFunc exactly when nothing that changes the kernel
differs. One model holds two chains of a family that differ in exactly one of dtype, input shape, attribute or
constant values: a dtype, shape or attribute gives a kernel of its own; constant values are the kernel's
arguments, so the kernel is shared. The same chain twice shares one kernel. Every model is checked against
onnxruntime and the unfused build element by element (check_fused)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tvm_fusion._tvm import tvm
from tvm_fusion.precision import numpy_dtype
from tvm_fusion.testing import OPSET, GraphBuilder, check_fused

LN_OPSET = 18
ELEM = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}

#: family -> (the rule each chain fuses to, the input shape, the "shape" variant's input shape: constants fit both)
FAMILIES = {
    "conv": ("conv2d_bias_leaky_relu", [1, 4, 10, 10], [1, 4, 12, 10]),
    "dense": ("dense_bias_leaky_relu", [4, 32], [6, 32]),
    "layer_norm": ("layer_norm", [4, 48], [7, 48]),
    "elementwise": ("elementwise_chain_4", [3, 20], [5, 20]),
}
#: the attribute each family's second chain changes
ATTRIBUTE = {"conv": "stride", "dense": "alpha", "layer_norm": "epsilon", "elementwise": "clip"}
DEFAULT = {"alpha": 0.1, "stride": 1, "epsilon": 1e-5, "clip": (-0.5, 0.5)}
CHANGED = {"alpha": 0.2, "stride": 2, "epsilon": 1e-3, "clip": (-0.25, 0.75)}


def _chain(g: GraphBuilder, family: str, x: str, dtype: str, seed: int, **attrs) -> str:
    """One chain of `family` on `x` (of `dtype`), its constants drawn from `seed`."""
    a = {**DEFAULT, **attrs}
    rng = np.random.default_rng(seed)

    def const(array):
        return g.const(np.asarray(array, np.float32).astype(numpy_dtype(dtype)))

    if family == "conv":
        w, b = rng.normal(0, 0.3, (8, 4, 3, 3)), rng.normal(0, 0.1, 8)
        s = a["stride"]
        y = g.op("Conv", [x, const(w), const(b)], kernel_shape=[3, 3], strides=[s, s], pads=[1, 1, 1, 1])
        return g.op("LeakyRelu", [y], alpha=a["alpha"])
    if family == "dense":
        y = g.op("Add", [g.op("MatMul", [x, const(rng.normal(0, 0.2, (32, 16)))]), const(rng.normal(0, 0.1, 16))])
        return g.op("LeakyRelu", [y], alpha=a["alpha"])
    if family == "layer_norm":
        gamma, beta = rng.uniform(0.5, 1.5, 48), rng.normal(0, 0.1, 48)
        return g.op("LayerNormalization", [x, const(gamma), const(beta)], axis=-1, epsilon=a["epsilon"])
    lo, hi = a["clip"]
    y = g.op("Mul", [g.op("Add", [x, const(rng.normal(0, 1, 20))]), const(rng.uniform(0.5, 2, 20))])
    return g.op("Tanh", [g.op("Clip", [y, const(lo), const(hi)])])


def _model(g: GraphBuilder, outputs: dict[str, str], opset: int) -> onnx.ModelProto:
    """GraphBuilder.model with each output's own dtype."""
    outs = [helper.make_tensor_value_info(o, ELEM[d], None) for o, d in outputs.items()]
    graph = helper.make_graph(g.nodes, "two_chains", g.inputs, outs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model = onnx.shape_inference.infer_shapes(model)
    onnx.checker.check_model(model)
    return model


def two_chains(family: str, differ: str | None) -> onnx.ModelProto:
    """Two chains of `family` in one model, the second differing from the first in `differ` (None: the same
    chain twice, on a second input of the same shape)."""
    _, shape, other_shape = FAMILIES[family]
    g = GraphBuilder(0)
    x1 = g.input("x1", shape)
    first = _chain(g, family, x1, "float32", seed=1)
    dtype, seed, attrs, x2 = "float32", 1, {}, None
    if differ == "dtype":
        dtype, x2 = "float16", g.op("Cast", [x1], to=TensorProto.FLOAT16)
    elif differ == "shape":
        x2 = g.input("x2", other_shape)
    elif differ == "attribute":
        attrs = {ATTRIBUTE[family]: CHANGED[ATTRIBUTE[family]]}
    elif differ == "constant":
        seed = 2
    x2 = x2 or g.input("x2", shape)
    second = _chain(g, family, x2, dtype, seed=seed, **attrs)
    return _model(g, {first: "float32", second: dtype}, LN_OPSET if family == "layer_norm" else OPSET)


def _kernels(built, rule: str) -> list[tvm.tirx.PrimFunc]:
    """The PrimFunc of each group of `rule`, in the order of the groups."""
    mod = built.fused.mod
    return [mod[grp.function] for grp in built.fused.groups if grp.rule == rule]


@pytest.mark.parametrize("differ", ["dtype", "shape", "attribute"])
@pytest.mark.parametrize("family", FAMILIES)
def test_chains_that_differ_get_kernels_of_their_own(family, differ):
    rule = FAMILIES[family][0]
    built = check_fused(two_chains(family, differ), expect={rule: 2})
    groups = [grp for grp in built.fused.groups if grp.rule == rule]
    assert len({grp.function for grp in groups}) == 2, f"{family} chains differing in {differ} share a kernel"
    first, second = _kernels(built, rule)
    if differ == "dtype":
        assert {str(p.dtype) for p in first.params} == {"float32"}
        assert str(second.params[0].dtype) == str(second.params[-1].dtype) == "float16"


@pytest.mark.parametrize("differ", [None, "constant"], ids=["same chain", "other constants"])
@pytest.mark.parametrize("family", FAMILIES)
def test_chains_alike_but_for_their_constants_share_one_kernel(family, differ):
    """Constant values are the kernel's arguments (folded, packed, then passed): one kernel, right for both."""
    rule = FAMILIES[family][0]
    built = check_fused(two_chains(family, differ), expect={rule: 2})
    assert len({grp.function for grp in built.fused.groups if grp.rule == rule}) == 1
