"""The reduction plans (`reduction.py`) on TVM's legalized reductions: which plan each takes per target, the
results of the order-keeping plans bit-identical to TVM's unscheduled loop, ArgMax / ArgMin ties broken by
the lower index as TVM's loop breaks them, the reassociated sums within the float tolerance, and a symbolic
batch."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_fusion._tvm import relax, tirx, tvm
from tvm_fusion.schedules.llvm.fallback import schedule_function
from tvm_fusion.testing import assert_close

AVX2 = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v3"})
AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})
HOST = tvm.target.Target({"kind": "llvm"})  # compiled for this host: runs the AVX2 and AVX-512 schedules alike


def _legalized(op, shape, dtype="float32", **attrs):
    """`op(x, **attrs)` as Relax legalizes it: one PrimFunc (blocks named x_red / x_red_temp ...)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(op(x, **attrs)))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    (func,) = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    return func


def _run(func, x, out_shape, out_dtype):
    executable = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), HOST)
    out = tvm.runtime.tensor(np.zeros(out_shape, out_dtype))
    executable["main"](tvm.runtime.tensor(x), out)
    return out.numpy()


def _scheduled(func, target):
    with target:
        sch, plans = schedule_function(func, target)
    assert sch is not None, plans
    return sch.mod["main"], plans


CASES = {
    # name: (op, attrs, shape, {target: plan of the reduction block})
    "max_middle": (relax.op.max, dict(axis=[1]), (4, 64, 48), {"avx2": "outputs:8", "avx512": "outputs:16"}),
    "max_last": (relax.op.max, dict(axis=[2]), (4, 8, 256), {"avx2": "rows:8", "avx512": "rows:16"}),
    "min_two_middle": (relax.op.min, dict(axis=[1, 2]), (2, 5, 7, 32), {"avx2": "outputs:8", "avx512": "outputs:16"}),
    "prod_odd": (relax.op.prod, dict(axis=[2]), (3, 16, 197), {"avx2": "chains:8", "avx512": "chains:8"}),
    "sum_odd_rows": (relax.op.sum, dict(axis=[2]), (3, 36, 197), {"avx2": "chains:6", "avx512": "chains:6"}),
    "pool_like_short": (relax.op.max, dict(axis=[2]), (64, 100, 3), {"avx2": "parallel", "avx512": "parallel"}),
}


@pytest.mark.parametrize("target", [AVX2, AVX512], ids=["avx2", "avx512"])
@pytest.mark.parametrize("case", CASES)
def test_order_keeping_plans_are_bit_identical(case, target):
    """Max and min (also as vector rows) and every plan that keeps each output's order: the very bits of
    TVM's unscheduled loop."""
    op, attrs, shape, plans = CASES[case]
    func = _legalized(op, shape, **attrs)
    scheduled, taken = _scheduled(func, target)
    assert taken["x_red"] == plans["avx2" if target is AVX2 else "avx512"], taken
    x = np.random.default_rng(0).uniform(0.9, 1.1, shape).astype(np.float32)  # a product of 197 stays finite
    out_shape, out_dtype = [int(d) for d in func.params[-1].shape], str(func.params[-1].dtype)
    np.testing.assert_array_equal(_run(scheduled, x, out_shape, out_dtype), _run(func, x, out_shape, out_dtype))


@pytest.mark.parametrize("op, axis", [(relax.op.argmax, 2), (relax.op.argmin, 2), (relax.op.argmax, 1)])
def test_arg_reductions_break_ties_by_the_lower_index(op, axis):
    """Each row holds its extreme several times (integers 0..3): the lower index wins, in every plan, as in
    TVM's loop and NumPy."""
    shape = (3, 40, 256)
    func = _legalized(op, shape, axis=axis)
    scheduled, taken = _scheduled(func, AVX512)
    assert taken["x_red_temp"] == ("rows:16" if axis == 2 else "outputs:16"), taken
    x = np.random.default_rng(1).integers(0, 4, shape).astype(np.float32)
    out_shape = [int(d) for d in func.params[-1].shape]
    got = _run(scheduled, x, out_shape, "int64")
    np.testing.assert_array_equal(got, _run(func, x, out_shape, "int64"))
    np.testing.assert_array_equal(got, (np.argmax if op is relax.op.argmax else np.argmin)(x, axis=axis))


def test_vector_rows_of_a_sum_are_reassociated_within_tolerance():
    """A sum over the last axis as 16 partial sums (one per lane), then across: within float32's tolerance of
    float64 NumPy (not bit-identical to TVM's single chain)."""
    shape = (4, 8, 1000)
    func = _legalized(relax.op.sum, shape, axis=[2])
    scheduled, taken = _scheduled(func, AVX512)
    assert taken["x_red"] == "rows:8"  # 1000: whole vectors of 8, not of 16
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    assert_close(_run(scheduled, x, (4, 8), "float32"), x.astype(np.float64).sum(axis=2), "sum rows", dtype="float32")


def test_symbolic_batch():
    """A max over the middle axis with a symbolic batch: outputs in vectors, the batch in parallel; right at
    batches 1 and 5."""
    n = tirx.Var("n", "int64")
    func = _legalized(relax.op.max, (n, 64, 48), axis=[1])
    scheduled, taken = _scheduled(func, AVX512)
    assert taken["x_red"] == "outputs:16"
    executable = tvm.compile(tvm.IRModule({"main": scheduled.with_attr("global_symbol", "main")}), HOST)
    for batch in (1, 5):
        x = np.random.default_rng(batch).standard_normal((batch, 64, 48)).astype(np.float32)
        out = tvm.runtime.tensor(np.zeros((batch, 48), np.float32))
        executable["main"](tvm.runtime.tensor(x), out)
        np.testing.assert_array_equal(out.numpy(), x.max(axis=1))


def test_vector_reductions_go_before_the_plane_sums():
    """A mean over 768 features takes vector rows (LeftoverReduction, before the plane-sum rule); a mean over
    13 x 13 planes, whose rows are not whole vectors, is left to the plane sums."""
    from tvm_fusion.schedules.llvm.plane_sum import LeftoverPlaneSum
    from tvm_fusion.schedules.llvm.reduction import LeftoverReduction

    rows = _legalized(relax.op.mean, (8, 128, 768), axis=[2], keepdims=True)
    planes = _legalized(relax.op.mean, (1, 64, 13, 13), axis=[2, 3], keepdims=True)
    with AVX512:
        assert LeftoverReduction().apply(rows, AVX512, False) is not None
        assert LeftoverReduction().apply(planes, AVX512, False) is None
        assert LeftoverPlaneSum().apply(planes, AVX512, False) is not None
    x = np.random.default_rng(3).standard_normal((8, 128, 768)).astype(np.float32)
    scheduled, _ = _scheduled(rows, AVX512)
    assert_close(_run(scheduled, x, (8, 128, 1), "float32"), x.astype(np.float64).mean(axis=2, keepdims=True),
                 "mean rows", dtype="float32")
