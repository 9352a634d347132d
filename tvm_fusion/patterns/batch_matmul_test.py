"""batch_matmul rules: MatMul of two tensors at any rank, broadcast batches, 1-D operands, epilogues; numerics
against onnxruntime (and the unfused build), half precision, a symbolic batch, an AVX2 target, priorities
against dense and attention, and the declines."""

import numpy as np
import pytest

from tvm_fusion._tvm import relax, tvm
from tvm_fusion.build.builder import build, resolve_target
from tvm_fusion.check.compare import run_onnxruntime
from tvm_fusion.frontend.importer import SymDim, import_onnx
from tvm_fusion.fusion.fuse import fuse
from tvm_fusion.patterns.batch_matmul import kernel_views
from tvm_fusion.precision import numpy_dtype
from tvm_fusion.testing import (GELU_OPSET, GraphBuilder, apply_activation_onnx, as_float16, assert_close,
                                check_fused, run_build)

AVX2 = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v3"})


def _matmul(a_shape, b_shape, *, scale=None, bias=None, act=None, b_const=False, seed=0):
    """MatMul(a, b) [/ or * scale] [+ bias over the last axis] [activation form]."""
    g = GraphBuilder(seed)
    a = g.input("a", list(a_shape))
    b = (g.const(g.rng.normal(0, 0.3, b_shape).astype(np.float32), "w") if b_const
         else g.input("b", list(b_shape)))
    y = g.op("MatMul", [a, b])
    if scale is not None:
        y = g.op(scale[0], [y, g.const(np.float32(scale[1]))])
    if bias is not None:
        y = g.op("Add", [y, g.const(g.rng.normal(0, 0.1, bias).astype(np.float32), "bias")])
    if act is not None:
        y = apply_activation_onnx(g, y, act)
    return g.model([y], opset=GELU_OPSET)


@pytest.mark.parametrize("a_shape, b_shape", [
    ((1, 6, 197, 64), (1, 6, 64, 197)),   # ViT's scores: rows and columns not whole tiles
    ((2, 1, 9, 16), (1, 3, 16, 5)),       # batch dims broadcast both ways
    ((4, 33, 20), (4, 20, 40)),
    ((3, 2, 5, 7, 8), (8, 6)),            # rank 5 against a 2-D tensor
    ((20,), (3, 20, 7)),                  # a 1-D A: a row
    ((3, 5, 20), (20,)),                  # a 1-D B: a column
    ((30, 20), (20, 50)),                 # two 2-D activations
])
def test_matmul_of_two_tensors(a_shape, b_shape, rules):
    fused = check_fused(_matmul(a_shape, b_shape), rules, expect={"batch_matmul": 1})
    assert not fused.unscheduled


@pytest.mark.parametrize("scale, bias, act, rule", [
    (("Div", 8.0), None, None, "batch_matmul"),
    (("Mul", 0.125), 24, None, "batch_matmul"),
    (None, 24, "Gelu", "batch_matmul_gelu_erf"),
    (("Div", 2.0), None, "Relu", "batch_matmul_relu"),
    (None, (1, 24), "x*Sigmoid", "batch_matmul_silu"),
])
def test_epilogues(scale, bias, act, rule, rules):
    """A scale (divide or multiply, as matched), a bias over the columns and an activation on the accumulators."""
    check_fused(_matmul((2, 3, 17, 16), (2, 3, 16, 24), scale=scale, bias=bias, act=act), rules, expect={rule: 1})


def test_dense_keeps_a_constant_2d_weight_and_attention_its_block(rules):
    """Priorities: a constant 2-D B is dense's; the whole attention block is attention's."""
    from tvm_fusion.patterns.attention_test import attention_block

    check_fused(_matmul((2, 5, 16), (16, 24), bias=24, b_const=True), rules, expect={"dense_bias": 1})
    g = GraphBuilder(6)
    check_fused(g.model([attention_block(g, shape=(2, 2, 8, 16))], opset=17), rules, expect={"attention": 1})


def test_symbolic_batch_one_library_every_batch(rules):
    """[N, S, K] @ a constant [K, T] (dense declines a 3-D input with a symbolic batch) and [N, H, S, D] @
    [N, H, D, S]: the batch stays symbolic; batches 1, 2 and 5 of one build match onnxruntime."""
    g = GraphBuilder(3)
    x, q = g.input("x", ["N", 7, 16]), g.input("q", ["N", 2, 7, 8])
    w = g.const(g.rng.normal(0, 0.3, (16, 12)).astype(np.float32), "w")
    y = g.op("Relu", [g.op("Add", [g.op("MatMul", [x, w]), g.const(np.full(12, 0.1, np.float32))])])
    kt = g.op("Transpose", [q], perm=[0, 1, 3, 2])
    s = g.op("Div", [g.op("MatMul", [q, kt]), g.const(np.float32(4.0))])
    model = g.model([y, s])
    mod = import_onnx(model, {"x": (SymDim("N", 8), 7, 16), "q": (SymDim("N", 8), 2, 7, 8)})
    built = build(mod, "llvm", "fused", rules=rules)
    assert {k: v for k, v in built.counts.items() if v} == {"batch_matmul_relu": 1, "batch_matmul": 1}
    assert not built.unscheduled
    vm = relax.VirtualMachine(built.executable, tvm.cpu())
    sess, _ = run_onnxruntime(model, {}, optimize=False)
    for n in (1, 2, 5):
        rng = np.random.default_rng(n)
        feeds = {"x": rng.standard_normal((n, 7, 16)).astype(np.float32),
                 "q": rng.standard_normal((n, 2, 7, 8)).astype(np.float32)}
        got = vm["main"](*[tvm.runtime.tensor(feeds[k]) for k in ("x", "q")])
        for out, ref in zip(got, sess.run(None, feeds)):
            assert out.numpy().shape == ref.shape
            assert_close(out.numpy(), ref, f"batch {n}")


def test_float16_sums_in_float32_and_matches_onnxruntime(rules):
    model = as_float16(_matmul((2, 4, 33, 40), (2, 4, 40, 19), scale=("Div", 4.0), bias=19))
    fused = check_fused(model, rules, expect={"batch_matmul": 1})
    (func,) = [f for gv, f in fused.fused.mod.functions.items() if gv.name_hint == "batch_matmul"]
    assert [str(p.dtype) for p in func.params] == ["float16", "float16", "float32", "float16"]  # A, B, bias, out
    assert 'acc' not in func.script() and 'T.Cast("float32", in0[' in func.script(), func.script()


def test_bfloat16_matches_the_float32_model(rules):
    """onnxruntime has no bfloat16 MatMul on the CPU: the fused build against the unfused one and the float32
    model on the same (rounded) inputs, with bfloat16's tolerance."""
    model = _matmul((2, 9, 24), (2, 24, 20), bias=20, act="Relu")
    mod = import_onnx(as_float16(model, "bfloat16"))
    rng = np.random.default_rng(0)
    half = [rng.standard_normal(s).astype(numpy_dtype("bfloat16")) for s in ((2, 9, 24), (2, 24, 20))]
    fused, unfused = build(mod, "llvm", "fused", rules=rules), build(mod, "llvm", "unfused", rules=rules)
    assert {k: v for k, v in fused.counts.items() if v} == {"batch_matmul_relu": 1}
    wide = {"a": half[0].astype(np.float32), "b": half[1].astype(np.float32)}
    (r32,) = run_onnxruntime(model, wide)[0].run(None, wide)
    got, ref = run_build(fused, half)[0], run_build(unfused, half)[0]
    assert got.dtype == numpy_dtype("bfloat16")
    assert_close(got, ref, "fused vs unfused bfloat16", dtype="bfloat16")
    assert_close(got, r32, "fused bfloat16 vs float32", dtype="bfloat16")


def test_avx2_target(rules):
    """The AVX2 tile (8 lanes) on the same shapes (this host runs AVX2 code)."""
    model = _matmul((1, 6, 50, 64), (1, 6, 64, 50), scale=("Div", 8.0))
    fused = build(import_onnx(model), AVX2, "fused", rules=rules)
    assert fused.counts["batch_matmul"] == 1
    rng = np.random.default_rng(1)
    feeds = {"a": rng.standard_normal((1, 6, 50, 64)).astype(np.float32),
             "b": rng.standard_normal((1, 6, 64, 50)).astype(np.float32)}
    (ref,) = run_onnxruntime(model, feeds)[0].run(None, feeds)
    assert_close(run_build(fused, [feeds["a"], feeds["b"]])[0], ref, "AVX2 batch_matmul vs onnxruntime")


def test_kernel_views():
    assert kernel_views((20,), (3, 20, 7)) == ((1, 1, 20), (3, 20, 7), (3, 1, 7))
    assert kernel_views((3, 5, 20), (20,)) == ((3, 5, 20), (1, 20, 1), (3, 5, 1))
    assert kernel_views((2, 1, 9, 16), (3, 16, 5)) == ((2, 1, 9, 16), (1, 3, 16, 5), (2, 3, 9, 5))
    assert kernel_views((2, 9, 16), (3, 16, 5)) == "batch dims (2,) and (3,) do not broadcast (dim 2 against 3)"
    assert kernel_views((2, 9, 16), (2, 15, 5)) == "A's last dim 16 is not B's second to last 15"


def test_declines_with_reasons(rules):
    cpu = resolve_target("llvm")

    def reasons(model, shapes=None, fired=0):
        result = fuse(import_onnx(model, shapes), cpu, rules)
        assert result.total == fired
        return {d.reason for d in result.decisions if d.rule == "batch_matmul" and d.reason}

    g = GraphBuilder(0)
    model = g.model([g.op("MatMul", [g.input("c", ["N", 16]), g.input("d", [16, 5])])])
    assert reasons(model, {"c": (SymDim("N"), 16)}) == {
        "A has shape (N, 16); the kernel would view it as (1, N, 16), moving its symbolic dim from the outermost place"}
    # the scale stays outside: the bare matmul is taken
    assert reasons(_scaled_by_vector(), fired=1) == {"the matmul's scale has shape (5,); expected a scalar constant"}
    g = GraphBuilder(0)
    dot = g.model([g.op("MatMul", [g.input("a", [7]), g.input("b", [7])])])
    assert reasons(dot) == {"A (7,) and B (7,) are both 1-D: a dot product to a scalar, which the kernel (a "
                            "matrix of outputs) does not write"}
    g = GraphBuilder(0)
    ints = g.model([g.op("MatMul", [g.input("a", [2, 3], 6), g.input("b", [3, 4], 6)])], dtype=6)
    assert reasons(ints) == {"matmul dtypes are A int32, B int32, output int32; the compute takes one of float32, "
                             "float16, bfloat16 for all three"}


def _scaled_by_vector():
    g = GraphBuilder(0)
    y = g.op("MatMul", [g.input("a", [2, 3, 4]), g.input("b", [2, 4, 5])])
    return g.model([g.op("Div", [y, g.const(np.arange(1, 6, dtype=np.float32))])])


def test_names_to_sanitize_and_an_if_branch(rules):
    """Inputs named `a/0` and `b:1`, the MatMul's result read inside an If's branches (the importer builds no
    dataflow block around an If), a leftover reduction in each branch: one batch_matmul, every kernel
    scheduled, onnxruntime's values."""
    from onnx import TensorProto, helper

    g = GraphBuilder(9)
    y = g.op("MatMul", [g.input("a/0", [2, 8, 16]), g.input("b:1", [2, 16, 8])])

    def branch(op, out):
        return helper.make_graph([helper.make_node(op, [y], [out], name=f"{out}/node", axes=[1], keepdims=0)], out,
                                 [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, [2, 8])])

    g.nodes.append(helper.make_node("If", [g.const(np.array(True))], ["z"], name="branch/0",
                                    then_branch=branch("ReduceMax", "then_out"),
                                    else_branch=branch("ReduceMin", "else_out")))
    fused = check_fused(g.model(["z"], opset=17), rules, expect={"batch_matmul": 1})
    assert not fused.unscheduled
