"""elementwise rules: add + relu with a skip connection, chains of 3 to 6 ops, near misses."""

import numpy as np
import pytest

from tvm_fusion.testing import GraphBuilder, check_fused

OPS = ["Add", "Sub", "Mul", "Div", "Max", "Min"]
UNARY = ["Relu", "Sigmoid", "Tanh", "Exp", "Erf", "Neg"]


def test_add_relu_with_skip_connection_is_exact(rules):
    """relu(branch + skip): the add's other operand comes from outside the chain."""
    g = GraphBuilder(0)
    x = g.input("x", [2, 8, 6, 6])
    branch = g.op("Softmax", [x], axis=1)
    y = g.op("Relu", [g.op("Add", [branch, x])])
    fused = check_fused(g.model([y]), rules)
    assert fused.counts["add_relu"] == 1


@pytest.mark.parametrize("length", [3, 4, 5, 6])
def test_chain_of_length(length, rules):
    g = GraphBuilder(length)
    a = g.input("a", [3, 4, 7])
    b = g.input("b", [1, 4, 1])  # broadcast operand
    y = g.op("Add", [a, b])
    for i in range(1, length):
        if i % 2:
            y = g.op(UNARY[i % len(UNARY)], [y])
        else:
            other = g.const(g.rng.uniform(0.5, 1.5, (7,)).astype(np.float32)) if i % 4 else b
            y = g.op(OPS[i % len(OPS)], [other, y] if i % 3 else [y, other])
    check_fused(g.model([y]), rules, expect={f"elementwise_chain_{length}": 1})


def test_chain_declines_when_an_intermediate_escapes(rules):
    g = GraphBuilder(9)
    a, b = g.input("a", [4, 5]), g.input("b", [4, 5])
    mid = g.op("Mul", [g.op("Add", [a, b]), b])
    y = g.op("Exp", [g.op("Sigmoid", [mid])])
    fused = check_fused(g.model([y, mid]), rules)
    assert fused.counts["elementwise_chain_4"] == 0
    reasons = [d.reason for d in fused.fused.decisions if d.rule == "elementwise_chain_4"]
    assert reasons and "consumers" in reasons[0]


def test_chains_alike_but_for_constants_get_their_own_kernels(rules):
    """sigmoid(a + c1) * c2 - e and sigmoid(a + b) * d - e: equal shapes and recipes, but the first takes two
    constants where the second takes tensors; one kernel for both fed the second's tensors in the wrong order."""
    g = GraphBuilder(3)
    a, b, d, e = (g.input(n, [2, 5]) for n in "abde")
    c1, c2 = (g.const(g.rng.normal(0, 1, (2, 5)).astype(np.float32)) for _ in range(2))
    with_consts = g.op("Sub", [g.op("Mul", [g.op("Sigmoid", [g.op("Add", [a, c1])]), c2]), e])
    with_tensors = g.op("Sub", [g.op("Mul", [g.op("Sigmoid", [g.op("Add", [a, b])]), d]), e])
    fused = check_fused(g.model([with_consts, with_tensors]), rules, expect={"elementwise_chain_4": 2})
    assert len({grp.function for grp in fused.fused.groups}) == 2


# ---------------------------------------------------------------- property: over the family's domain
from hypothesis import strategies as st  # noqa: E402

from tvm_fusion.testing import check_family_property  # noqa: E402


@st.composite
def chains(draw):
    length = draw(st.integers(3, 6))
    shape = draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))
    g = GraphBuilder(draw(st.integers(0, 2**16)))
    a = g.input("a", shape)
    b = g.input("b", [1] * (len(shape) - 1) + [shape[-1]])
    y = g.op(draw(st.sampled_from(["Add", "Sub", "Mul"])), [a, b])
    for _ in range(length - 1):
        if draw(st.booleans()):
            y = g.op(draw(st.sampled_from(["Relu", "Sigmoid", "Tanh", "Neg"])), [y])
        else:
            other = draw(st.sampled_from(["a", "b", "const"]))
            other = g.const(g.rng.uniform(0.5, 1.5, shape[-1]).astype(np.float32)) if other == "const" else \
                {"a": a, "b": b}[other]
            op = draw(st.sampled_from(["Add", "Sub", "Mul", "Max", "Min"]))
            y = g.op(op, [other, y] if draw(st.booleans()) else [y, other])
    return g.model([y]), f"elementwise_chain_{length}"


def test_property_elementwise_family(rules):
    """Every generated chain is inside the family's domain: each one fires, with matching numbers."""
    check_family_property(chains(), rules, min_share=1.0)


def test_golden_ir_of_add_relu(rules):
    from tvm_fusion._tvm import tvm

    from tvm_fusion import _tvm
    from tvm_fusion._tvm import relax
    from tvm_fusion.build.builder import resolve_target
    from tvm_fusion.frontend.importer import import_onnx
    from tvm_fusion.fusion.fuse import fuse

    g = GraphBuilder(3)
    a, b = g.input("a", [2, 5]), g.input("b", [2, 5])
    result = fuse(import_onnx(g.model([g.op("Relu", [g.op("Add", [a, b])])])), resolve_target("llvm"), rules)
    gv = result.mod.get_global_var("add_relu")
    assert result.groups[0].attrs["recipe"] == (("relax.add", None, (0, 1), None), ("relax.nn.relu", 0, None, None))
    bb = relax.BlockBuilder()
    av, bv = (relax.Var(n, _tvm.tensor_type((2, 5), "float32")) for n in ("a", "b"))
    with bb.function("main", [av, bv], {"num_input": 2}):
        with bb.dataflow():
            out = bb.emit_output(relax.call_tir(gv, [av, bv], _tvm.tensor_type((2, 5), "float32")))
        bb.emit_func_output(out)
    tvm.ir.assert_structural_equal(result.mod["main"], bb.get()["main"], map_free_vars=True)


def test_integer_chain_declines_with_reason(rules):
    from onnx import TensorProto

    from tvm_fusion import explain

    g = GraphBuilder(4)
    a, b = g.input("a", [3, 4], TensorProto.INT32), g.input("b", [3, 4], TensorProto.INT32)
    y = g.op("Mul", [g.op("Sub", [g.op("Add", [a, b]), b]), a])
    reasons = [d.reason for d in explain(g.model([y], dtype=TensorProto.INT32), rules=rules)
               .declined("elementwise_chain_3")]
    assert reasons == ["elementwise chain dtype is int32; the compute supports float32, float16, bfloat16"]


def test_scalar_chain(rules):
    """A 0-d chain (found by the ONNX backend suite: DynamicQuantizeLinear's scale computation)."""
    g = GraphBuilder(5)
    a, b = g.input("a", []), g.input("b", [])
    y = g.op("Mul", [g.op("Sub", [g.op("Add", [a, b]), b]), a])
    check_fused(g.model([y]), rules, expect={"elementwise_chain_3": 1})
