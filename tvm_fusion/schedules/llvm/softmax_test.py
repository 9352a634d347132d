"""The fused build's leftover softmax / log_softmax on llvm: rows in parallel, max / exp / sum / normalize in
vectors of the target's lanes (the sums as `lanes` partial sums), the exp llvm's vectorizable float32 form
only where the fast-math policy allows it; element-wise within tolerance of the unfused build and
onnxruntime (edge rows: tails, -inf, large values; NaN / +-inf rows as TVM's lowering); rows under two vectors, an axis with two dims or more
after it, and functions that are not a softmax are declined with a reason."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tvm_fusion.frontend import importer as frontend
from tvm_fusion._tvm import relax, tirx
from tvm_fusion.build.builder import build, resolve_target
from tvm_fusion.check.compare import run_onnxruntime
from tvm_fusion.schedules.llvm.softmax import LeftoverSoftmax, recognise, rewrite
from tvm_fusion.testing import GraphBuilder, as_float16, assert_close, run_build

AVX2 = resolve_target('{"kind": "llvm", "mcpu": "x86-64-v3"}')
SSE2 = resolve_target('{"kind": "llvm", "mcpu": "x86-64"}')


def _model(shape, op: str = "Softmax", axis: int = -1):
    g = GraphBuilder(0)
    x = g.input("x", list(shape))
    return g.model([g.op(op, [x], axis=axis)])


def _softmax_func(built):
    (func,) = [f for gv, f in built.module.functions.items()
               if isinstance(f, tirx.PrimFunc) and "softmax" in gv.name_hint]
    return func


def _legalized(shape, op=relax.op.nn.softmax, axis: int = -1, dtype: str = "float32"):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(op(x, axis=axis)))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    (func,) = [f for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)]
    return func


def _check(model, x, target=AVX2, dtype=None):
    """The fused build against the unfused one and onnxruntime, element by element; returns the fused build."""
    built = build(frontend.import_onnx(model), target, "fused")
    unfused = build(frontend.import_onnx(model), target, "unfused")
    got = run_build(built, [x])[0]
    assert_close(got, run_build(unfused, [x])[0], "against the unfused build", dtype)
    sess, _ = run_onnxruntime(model, {"x": x})
    assert_close(got, sess.run(None, {"x": x})[0], "against onnxruntime", dtype)
    return built


def _edge_rows(shape, seed: int = 1):
    """Normal rows, then a row with -inf entries, a row of large values (exp overflows unless the max is
    subtracted) and a row of large negative ones."""
    x = np.random.default_rng(seed).normal(size=shape).astype(np.float32) * 4
    rows = x.reshape(-1, shape[-1])
    rows[0, ::3] = -np.inf
    rows[1] = 80 + 20 * np.abs(rows[1])
    rows[2] = -1e4 + rows[2]
    return x


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("n", [1003, 24, 19])  # a tail of 3, whole vectors, two vectors and a tail
def test_last_axis_is_vectorized_and_within_tolerance(op, n):
    shape = (70, n) if n == 1003 else (4, 3, n)  # 70 x 1003: enough elements for parallel rows
    built = _check(_model(shape, op), _edge_rows(shape))
    func = _softmax_func(built)
    assert func.attrs["tirx.is_scheduled"]
    script = func.script()
    assert re.search(r"T\.vectorized\((T\.int64\()?8\)", script), script  # AVX2: 8 float32 lanes
    assert "T.exp(" not in script, script  # llvm's vectorizable exp, float32 may take it
    assert ("T.parallel" in script) == (n == 1003), script
    assert len(re.findall(r'T\.sblock\("(max|sum)_lanes"\)', script)) == 2, script  # the lanes partial sums


def _special_rows(shape):
    """Rows TVM's lowering turns to NaN (a NaN, a +inf, all -inf, +inf and -inf, all NaN) or to exact zeros
    (-inf entries, values far below the row's max), among normal rows."""
    x = np.random.default_rng(5).normal(size=shape).astype(np.float32) * 4
    n = shape[-1]
    x[0, ::3] = -np.inf
    x[1] = -np.inf
    x[2, 5] = np.inf
    x[3, 7] = np.nan
    x[4, n - 1] = np.nan  # in the row's scalar tail
    x[5, n - 1] = np.inf
    x[6, :2] = (np.inf, -np.inf)
    x[7] = np.nan
    x[8, 100] = 3e38  # every other element's exp(x - max) is 0
    x[9] = 80 + 20 * np.abs(x[9])
    return x


@pytest.mark.parametrize("n", [6625, 1003])
def test_softmax_specials_as_tvms_lowering(n):
    """NaN, +-inf and rows whose exps underflow: the same NaNs and zeros as the unfused build (TVM's lowering,
    libm's expf), the finite values within tolerance; the exp's vectors summed as they are computed (one pass
    over the row for both) and the row scaled by 1 / sum."""
    shape = (12, n)
    model = _model(shape)
    x = _special_rows(shape)
    built = build(frontend.import_onnx(model), AVX2, "fused")
    got = run_build(built, [x])[0]
    want = run_build(build(frontend.import_onnx(model), AVX2, "unfused"), [x])[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(want[[1, 2, 3, 4, 5, 6, 7]]).all() and not np.isnan(want[[0, 8, 9, 10, 11]]).any()
    np.testing.assert_array_equal(got[0] == 0, want[0] == 0)  # exp(-inf) = 0
    assert_close(got, want, "special rows against the unfused build")
    script = _softmax_func(built).script()
    exp_loop = script[script.index('T.sblock("row_exp")'):]
    assert exp_loop.index('T.sblock("sum_lanes")') < exp_loop.index('T.sblock("row_sum")'), script
    outputs = re.findall(r"softmax\[v_i0, v_i1\] = (.*)", script)
    assert outputs and all(o.endswith("* row_inverse[v_i0]") for o in outputs), script  # a multiply, no divide
    assert "T.floor" not in script and "T.exp(" not in script, script  # the exp for x - max <= 0


def test_lanes_come_from_the_target():
    func = _legalized((6, 40))
    assert re.search(r"T\.vectorized\(4\)", LeftoverSoftmax().apply(func, SSE2, False).mod.script())  # SSE: 4
    assert re.search(r"T\.vectorized\(8\)", LeftoverSoftmax().apply(func, AVX2, False).mod.script())


@pytest.mark.parametrize("shape, axis, width", [
    ((2, 5, 24), 1, 8),
    ((1, 16, 2, 20), 1, 4),  # YOLOv8's box softmax in small: the last dim takes 4 lanes of 8
    ((6, 4, 8), 0, 8),
])
def test_another_axis_reduces_along_it_in_vectors_of_the_last_dim(shape, axis, width):
    built = _check(_model(shape, "Softmax", axis=axis), _edge_rows(shape))
    script = _softmax_func(built).script()
    assert re.search(rf"T\.vectorized\((T\.int64\()?{width}\)", script), script
    assert "max_lanes" not in script  # the sum runs along the axis, in TVM's order


@pytest.mark.parametrize("shape, axis, why", [
    ((4, 13), -1, "fewer than two vectors"),
    ((2, 5, 6), 1, "no vector of 4 to 8 lanes"),
])
def test_declined_cases_keep_tvms_lowering(shape, axis, why):
    func = _legalized(shape, axis=axis)
    assert why in LeftoverSoftmax.declined(func, AVX2)
    assert LeftoverSoftmax().apply(func, AVX2, False) is None
    x = np.random.default_rng(2).normal(size=shape).astype(np.float32)
    built = _check(_model(shape, "Softmax", axis=axis), x)
    script = _softmax_func(built).script()
    assert "row_max" not in script and "T_softmax_maxelem" in script, script  # TVM's blocks (fallback.py's plans)


def test_other_functions_are_declined_with_a_reason():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 32), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.sum(relax.op.exp(x), axis=[1])))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    for func in (f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)):
        found = recognise(func)
        assert found.kind is None and found.declined, found
        assert LeftoverSoftmax().apply(func, AVX2, False) is None


@pytest.mark.parametrize("dtype, fast", [("float32", True), ("float16", False), ("bfloat16", False)])
def test_exp_follows_the_fast_math_policy(dtype, fast):
    """llvm's float32 exp where fast_math_allowed says yes; TVM's exp for half (no fast form) and bfloat16
    (the policy says no)."""
    func = _legalized((6, 64), dtype=dtype)
    found = recognise(func)
    assert found.kind == "softmax"
    assert ("T.exp(" not in rewrite(func, found, AVX2, 8).script()) == fast


def test_float16_softmax_within_half_tolerance():
    shape = (8, 100)
    model = as_float16(_model(shape))
    x = np.random.default_rng(3).normal(size=shape).astype(np.float16)
    built = _check(model, x, dtype="float16")
    assert re.search(r"T\.vectorized\((T\.int64\()?16\)", _softmax_func(built).script())  # 16 halves
