"""attention rule: every scale / mask form, operand orders, ranks, golden IR, near misses with reasons."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_fusion import _tvm
from tvm_fusion.build.builder import resolve_target
from tvm_fusion.frontend.importer import import_onnx
from tvm_fusion.fusion.fuse import fuse
from tvm_fusion.testing import (GraphBuilder, as_float16, check_cuda_build, check_fused, check_half,
                                check_symbolic_batch, symbolic_shapes)

OPSET = 17


def attention_block(g: GraphBuilder, shape=(2, 3, 5, 8), keys=None, scale="Div", mask=(2, 1, 1, None),
                    mask_first=False, softmax_axis=-1, k_batch=None, mask_const=False) -> str:
    """softmax(q @ kT [/ sqrt(d) | * c] [+ mask]) @ v, q/k/v graph inputs, K transposed in the graph."""
    *batch, s, d = shape
    t = keys or s
    q = g.input("q", [*batch, s, d])
    k = g.input("k", [*(k_batch or batch), t, d])
    v = g.input("v", [*batch, t, d])
    perm = list(range(len(batch))) + [len(batch) + 1, len(batch)]
    scores = g.op("MatMul", [q, g.op("Transpose", [k], perm=perm)])
    if scale == "Div":
        scores = g.op("Div", [scores, g.const(np.float32(np.sqrt(d)))])
    elif scale == "Mul":  # the constant first, as some exporters write it
        scores = g.op("Mul", [g.const(np.float32(1 / np.sqrt(d))), scores])
    elif scale == "per-head":
        scores = g.op("Div", [scores, g.const(g.rng.uniform(1, 3, (1, batch[-1], 1, 1)).astype(np.float32))])
    if mask is not None:
        mshape = [t if m is None else m for m in mask]
        if mask_const:  # a causal mask, as a constant
            m = g.const(np.where(np.tril(np.ones(mshape, bool)), 0, -1e4).astype(np.float32))
        else:
            m = g.input("mask", mshape)
        scores = g.op("Add", [m, scores] if mask_first else [scores, m])
    probs = g.op("Softmax", [scores], axis=softmax_axis)
    return g.op("MatMul", [probs, v])


CASES = {
    "bert": dict(),
    "mask_first": dict(mask_first=True),
    "mul_scale_no_mask": dict(scale="Mul", mask=None),
    "no_scale": dict(scale=None),
    "causal_const_mask": dict(shape=(1, 2, 6, 4), mask=(6, 6), mask_const=True),
    "mask_1d": dict(mask=(None,)),
    "rank3": dict(shape=(4, 7, 16), mask=(4, 1, None)),
    "cross_attention": dict(shape=(1, 2, 3, 8), keys=9, mask=(1, 1, 1, None)),
}


@pytest.mark.parametrize("case", CASES)
def test_attention_is_one_exact_kernel(case, rules):
    g = GraphBuilder(1)
    y = attention_block(g, **CASES[case])
    check_fused(g.model([y], opset=OPSET), rules, expect={"attention": 1})


SYMBOLIC = {
    "bert": dict(shape=("N", 3, 5, 8), mask=("N", 1, 1, None)),
    "rank3": dict(shape=("N", 7, 16), mask=("N", 1, None)),
    "causal_const_mask": dict(shape=("N", 2, 6, 4), mask=(6, 6), mask_const=True),
}


@pytest.mark.parametrize("bound", [None, 8], ids=["N", "N<=8"])
@pytest.mark.parametrize("case", SYMBOLIC)
def test_symbolic_batch_is_one_kernel_that_matches_at_every_batch(case, bound, rules):
    """q, k, v (and the mask) with a symbolic batch: the lowering read static shapes (`TypeError: object of
    type 'NoneType' has no len()`, reported as bad input); one build now runs at batch 1 and 3, and the CUDA
    build compiles."""
    g = GraphBuilder(8)
    model = g.model([attention_block(g, **SYMBOLIC[case])], opset=OPSET)
    shapes = symbolic_shapes(model, bound)
    check_symbolic_batch(model, shapes, rules, expect={"attention": 1})
    check_cuda_build(model, rules, expect={"attention": 1}, shapes=shapes)


HALF = {"bert": dict(shape=(2, 3, 5, 16), mask=(2, 1, 1, None)),
        "causal_const_mask": dict(shape=(1, 2, 6, 8), mask=(6, 6), mask_const=True)}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c != "bert" else c for c in HALF])
def test_half_attention_is_one_kernel_computed_in_float32(case, dtype, rules):
    """float16 / bfloat16 q, k, v and mask (the rule declined them: "the compute supports float32"): one kernel
    whose scores, softmax and context run in float32 (a `store` stage rounds the context once); within the
    dtype's tolerance of the unfused build and of the float32 model on the same rounded inputs (slow: also of
    onnxruntime's float16 run). 16 features: whole vectors on AVX2 and AVX-512 (the vectorized row)."""
    g = GraphBuilder(10)
    model = g.model([attention_block(g, **HALF[case])], opset=OPSET)
    check_half(model, dtype, rules, expect={"attention": 1})


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_attention_with_a_bounded_batch_builds_for_llvm_and_cuda(dtype, rules):
    g = GraphBuilder(11)
    model = g.model([attention_block(g, **SYMBOLIC["bert"])], opset=OPSET)
    shapes = symbolic_shapes(model, 8)
    check_half(model, dtype, rules, expect={"attention": 1}, shapes=shapes, batches=(1, 3))
    check_cuda_build(as_float16(model, dtype), rules, expect={"attention": 1}, shapes=shapes)
    if dtype == "float16":
        check_symbolic_batch(as_float16(model), shapes, rules, expect={"attention": 1})


def test_symbolic_sequence_declines_with_reason_and_builds(rules):
    g = GraphBuilder(9)
    model = g.model([attention_block(g, shape=(2, 3, "S", 8), mask=None)], opset=OPSET)
    fused = check_symbolic_batch(model, symbolic_shapes(model), rules)
    assert fused.counts["attention"] == 0
    assert set(_reasons(fused)) == {"attention q has shape (2, 3, S, 8); only the outermost (batch) dim may stay "
                                    "symbolic: bind the others with --shape (e.g. NAME=Nx3x224x224)"}


def test_golden_ir_is_one_call_of_q_kt_v_mask(rules):
    g = GraphBuilder(2)
    model = g.model([attention_block(g)], opset=OPSET)
    result = fuse(import_onnx(model), resolve_target("llvm"), rules)
    assert {k: v for k, v in result.counts.items() if v} == {"attention": 1}
    bindings = [b.value for blk in result.mod["main"].body.blocks for b in blk.bindings]
    ops = [getattr(b.op, "name", None) for b in bindings]
    assert ops == ["relax.permute_dims", "relax.call_tir"], result.mod["main"]  # K's transpose stays outside
    gv, args = bindings[1].args[0], list(bindings[1].args[1])
    assert gv.name_hint == "attention"
    assert [_tvm.var_name(a) for a in args] == ["q", _tvm.var_name(result.mod["main"].body.blocks[0].bindings[0].var),
                                                "v", "mask"]
    assert result.groups[0].attrs == {"scale": pytest.approx(np.sqrt(8)), "scale_op": "divide"}


def _reasons(fused):
    return [d.reason for d in fused.fused.decisions if d.rule == "attention" and d.reason]


def test_softmax_over_another_axis_declines_with_reason(rules):
    g = GraphBuilder(3)
    fused = check_fused(g.model([attention_block(g, softmax_axis=2)], opset=OPSET), rules)
    assert _reasons(fused) == ["softmax is over axis 2; attention needs the last axis (3), the keys"]


def test_mask_that_broadcasts_the_scores_declines_with_reason(rules):
    """A (2, 3, 2, 5, 5) mask would make the scores rank 5: not a mask of these scores."""
    g = GraphBuilder(4)
    fused = check_fused(g.model([attention_block(g, shape=(3, 5, 8), mask=(2, 3, 1, 1, None))], opset=OPSET), rules)
    assert _reasons(fused) == ["mask has shape (2, 3, 1, 1, 5); expected a static shape that broadcasts to the "
                               "scores (3, 5, 5) without changing them (each dim 1 or equal)"]


def test_broadcast_batch_between_q_and_k_declines_with_reason(rules):
    g = GraphBuilder(5)
    fused = check_fused(g.model([attention_block(g, k_batch=[1, 3])], opset=OPSET), rules)
    assert _reasons(fused) == ["q, kT, v have batch dims (2, 3), (1, 3), (2, 3); the compute takes equal batch dims "
                               "(no broadcast between them)"]


def test_per_head_scale_declines_with_reason(rules):
    g = GraphBuilder(6)
    fused = check_fused(g.model([attention_block(g, scale="per-head")], opset=OPSET), rules)
    assert _reasons(fused) == ["the scores' scale has shape (1, 3, 1, 1); expected a scalar constant"]


def test_probabilities_returned_too_decline(rules):
    """The attention weights are also an output (output_attentions=True): they cannot stay in the kernel."""
    g = GraphBuilder(7)
    y = attention_block(g)
    probs = next(n.output[0] for n in g.nodes if n.op_type == "Softmax")
    fused = check_fused(g.model([y, probs], opset=OPSET), rules)
    reasons = _reasons(fused)
    assert fused.counts["attention"] == 0 and reasons and "has 2 consumers" in reasons[0], reasons


# ---------------------------------------------------------------- property: over the family's domain
from hypothesis import strategies as st  # noqa: E402

from tvm_fusion.testing import check_family_property  # noqa: E402


@st.composite
def attentions(draw):
    """Attention of rank 3 or 4, self or cross, every scale form, masks of every broadcast shape (some that
    would change the scores' shape), a softmax over another axis now and then."""
    rank = draw(st.sampled_from([3, 4]))
    batch = [draw(st.integers(1, 3)) for _ in range(rank - 2)]
    s, t, d = draw(st.integers(1, 9)), draw(st.integers(1, 9)), draw(st.integers(1, 12))
    full = [*batch, s, t]
    mask = draw(st.sampled_from([None, "sub", "big"]))
    if mask == "sub":  # each dim 1 or the scores', possibly fewer dims
        mask = [draw(st.sampled_from([1, m])) for m in full][draw(st.integers(0, rank - 1)):]
    elif mask == "big":  # a leading dim the scores do not have: the add would raise their rank
        mask = [2, *full]
    g = GraphBuilder(draw(st.integers(0, 2**16)))
    y = attention_block(g, shape=(*batch, s, d), keys=t, scale=draw(st.sampled_from(["Div", "Mul", None])),
                        mask=mask, mask_first=draw(st.booleans()),
                        softmax_axis=draw(st.sampled_from([-1, -1, -1, rank - 2])))
    return g.model([y], opset=OPSET)


def test_property_attention(rules):
    """Each generated attention fuses with matching numbers or declines leaving the module unchanged; at least a
    quarter fire (4 of the 12 derandomized examples), the out-of-domain masks and softmax axes decline."""
    fired, examples = check_family_property(attentions().map(lambda m: (m, "attention")), rules, min_share=0.25)
    assert fired < examples, "no generated near miss declined"
