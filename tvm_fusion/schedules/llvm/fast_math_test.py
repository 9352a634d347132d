"""llvm's vectorizable float32 exp (and its form for x <= 0) / sigmoid / erf / tanh: accuracy against float64 over float32's range
(specials included), no per-lane libm call left in a vectorized kernel, other targets and dtypes keep TVM's
intrinsics, and a conv + SiLU, a Gemm + GELU and a tanh / exp chain element-wise against onnxruntime."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tvm_fusion.frontend import importer as frontend
from tvm_fusion._tvm import te, tirx, tvm
from tvm_fusion.build.builder import build, resolve_target
from tvm_fusion.check.compare import run_onnxruntime
from tvm_fusion.schedules.activations import KernelMath, apply_activation, fast_math_allowed
from tvm_fusion.schedules.llvm.fast_math import fast_erf, fast_exp, fast_exp_nonpositive, fast_sigmoid, fast_tanh
from tvm_fusion.testing import GraphBuilder, apply_activation_onnx, assert_close, run_build

AVX2 = '{"kind": "llvm", "mcpu": "x86-64-v3"}'
SPECIALS = [np.nan, np.inf, -np.inf, 88.7, 88.72, 88.73, 89.0, -87.3, -87.4, -103.9, -104.0, -110.0, 0.0, -0.0,
            1e-8, -1e-8, 1.0, -1.0, 4.0, -4.0, 4.5, 1e30, -1e30]


def _kernel(fn, n: int):
    """fn over a float32 vector of n, vectorized by 8 lanes, built for the AVX2 target."""
    x = te.placeholder((n,), "float32", name="x")
    y = te.compute((n,), lambda i: fn(x[i]), name="y")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, y]))
    (i,) = sch.get_loops(sch.get_sblock("y"))
    sch.vectorize(sch.split(i, [None, 8])[1])
    return tvm.compile(sch.mod, resolve_target(AVX2))


def _run(fn, xs: np.ndarray) -> np.ndarray:
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.empty_like(xs), dev)
    _kernel(fn, xs.size)(tvm.runtime.tensor(xs, dev), out)
    return out.numpy()


def _inputs(lo: float, hi: float) -> np.ndarray:
    sweep = np.linspace(lo, hi, (1 << 18) - len(SPECIALS), dtype=np.float32)
    return np.concatenate([sweep, np.array(SPECIALS, np.float32)])


def _ulps(actual: np.ndarray, ref64: np.ndarray) -> np.ndarray:
    return np.abs(actual - ref64) / np.spacing(np.abs(ref64).astype(np.float32))


def _same_specials(actual, ref64, where):
    with np.errstate(over="ignore"):
        a, r = actual[where], ref64[where].astype(np.float32)
    assert np.array_equal(a, r, equal_nan=True), f"{a} != {r}"


TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32


@pytest.mark.parametrize("fn,ref,max_ulp,subnormal_error", [
    (fast_exp, np.exp, 1.5, float(np.finfo(np.float32).smallest_subnormal)),
    (fast_sigmoid, lambda x: 1 / (1 + np.exp(-x)), 3.0, TINY),  # 1 / (1 + inf) = 0 below x = -88.7
])
def test_exp_and_sigmoid_within_a_few_ulps(fn, ref, max_ulp, subnormal_error):
    xs = _inputs(-110.0, 89.0)
    out = _run(fn, xs)
    with np.errstate(over="ignore"):
        r = ref(xs.astype(np.float64))
    normal = np.isfinite(r) & (np.abs(r) >= TINY) & (np.abs(r) <= np.finfo(np.float32).max)
    assert _ulps(out[normal], r[normal]).max() <= max_ulp
    sub = np.isfinite(r) & (np.abs(r) < TINY)  # subnormal results, and 0 below them
    assert np.abs(out[sub] - r[sub]).max() <= subnormal_error
    _same_specials(out, r, ~np.isfinite(r) | (np.abs(r) > np.finfo(np.float32).max))  # NaN, +inf, 0 at -inf


NORMAL_LN = -87.33654022216797  # ln(2^-126) as fast_exp_nonpositive rounds it: 0 below


def test_exp_of_nonpositive_within_1_5_ulps_and_0_below_normal_results():
    """A softmax's exp(x - max): right to 1.5 ulps where e^x is a normal float32, 0 below (subnormal results
    flushed: an absolute error under 2^-126), exp(-inf) = 0, NaN stays NaN, exp(0) = exp(-0) = 1."""
    specials = np.array([np.nan, -np.inf, 0.0, -0.0, -1e-8, -1e-30, NORMAL_LN, np.nextafter(np.float32(NORMAL_LN), 0),
                         np.nextafter(np.float32(NORMAL_LN), -np.inf), -87.0, -88.0, -103.9, -104.0, -1e30,
                         -float(np.finfo(np.float32).max)], np.float32)
    xs = np.concatenate([np.linspace(-110.0, 0.0, 1 << 18, dtype=np.float32), -np.logspace(-9, 1, 4096, dtype=np.float32),
                         specials])
    out = _run(fast_exp_nonpositive, xs)
    r = np.exp(xs.astype(np.float64))
    normal = xs >= np.float32(NORMAL_LN)
    assert _ulps(out[normal], r[normal]).max() <= 1.5
    assert np.all(out[xs < np.float32(NORMAL_LN)] == 0) and np.all(r[xs < np.float32(NORMAL_LN)] < TINY)
    nan, minus_inf, zero, minus_zero = out[-len(specials):][:4]
    assert np.isnan(nan) and minus_inf == 0 and zero == 1 and minus_zero == 1


def test_erf_within_4e_7_absolute():
    xs = _inputs(-6.0, 6.0)
    out = _run(fast_erf, xs)
    r = np.array([math.erf(v) if np.isfinite(v) else (np.nan if np.isnan(v) else np.sign(v)) for v in xs.astype(float)])
    assert np.nanmax(np.abs(out - r)) <= 4e-7
    _same_specials(out, r, np.isnan(r) | np.isinf(xs))


def test_tanh_within_5_ulps_and_3e_7_absolute():
    xs = np.concatenate([_inputs(-10.0, 10.0), np.logspace(-9, 1, 4096, dtype=np.float32)])
    xs = np.concatenate([xs, -xs])
    out = _run(fast_tanh, xs)
    r = np.tanh(xs.astype(np.float64))
    nonzero = np.isfinite(r) & (r != 0)
    assert _ulps(out[nonzero], r[nonzero]).max() <= 5
    assert np.nanmax(np.abs(out - r)) <= 3e-7
    _same_specials(out, r, ~np.isfinite(xs) | (r == 0) | (np.abs(xs) > 9.1))  # NaN, +-0, +-1 (float32) past 9.1


@pytest.mark.parametrize("fn", [fast_exp, fast_exp_nonpositive, fast_sigmoid, fast_erf, fast_tanh])
def test_no_libm_call_left(fn):
    ir = _kernel(fn, 64).mod.inspect_source("ll")
    for libm in ("@expf", "@erff", "@tanhf", "llvm.exp."):
        assert libm not in ir
    assert "<8 x float>" in ir


@pytest.mark.parametrize("fn", [fast_exp, fast_exp_nonpositive, fast_sigmoid, fast_erf, fast_tanh])
def test_tvm_vectorizer_keeps_the_vector_form(fn):
    """TVM's VectorizeLoop turns the lanes loop into vector expressions: one op it has no vector form for
    (`tirx.isnan`) made it keep a scalar loop, which LLVM vectorized only where the loop was plain (not the
    conv epilogues, whose loads are strided: their exp ran one lane at a time)."""
    x = te.placeholder((64,), "float32", name="x")
    y = te.compute((64,), lambda i: fn(x[i]), name="y")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, y]))
    (i,) = sch.get_loops(sch.get_sblock("y"))
    sch.vectorize(sch.split(i, [None, 8])[1])
    mod = sch.mod
    for lower in (tvm.s_tir.transform.LowerInitBlock(), tvm.s_tir.transform.ConvertBlocksToOpaque(),
                  tvm.s_tir.transform.LowerOpaqueBlock(), tvm.tirx.transform.FlattenBuffer(),
                  tvm.tirx.transform.VectorizeLoop()):
        mod = lower(mod)
    loops = [line.strip() for line in mod.script().splitlines() if line.strip().startswith("for ")]
    assert loops == ["for i_0 in range(8):"], mod.script()  # the outer loop only: the lanes are vectors


def test_other_targets_and_dtypes_keep_tvms_intrinsics():
    def op_of(name, dtype, target, fast=True):
        return getattr(KernelMath.of(fast, tvm.target.Target(target)), name)(tirx.Var("v", dtype))

    assert isinstance(op_of("exp", "float32", "llvm"), tirx.Let)  # the fast form
    assert op_of("exp", "float32", "llvm", fast=False).op.name == "tirx.exp"
    # the target is the kernel's argument, never a `with target:` scope: without one, TVM's intrinsic
    with tvm.target.Target("llvm"):
        assert KernelMath(True).exp(tirx.Var("v", "float32")).op.name == "tirx.exp"
    for name in ("exp", "sigmoid", "erf", "tanh"):
        for dtype, target in (("float32", "cuda"), ("float16", "llvm"), ("float64", "llvm")):
            call = op_of(name, dtype, target)
            assert getattr(getattr(call, "op", None), "name", None) == f"tirx.{name}", (name, dtype, target, call)


def test_kernels_with_bfloat16_tensors_keep_tvms_intrinsics():
    """TVM's bfloat16 legalization copies the epilogue and its vectorizer refuses the copies' Let bindings:
    fuse passes such a kernel's compute fast_math=False, and the epilogue keeps TVM's sigmoid."""
    assert fast_math_allowed(["float32", "float16"]) and not fast_math_allowed(["bfloat16", "float32"])
    llvm, v = tvm.target.Target("llvm"), tirx.Var("v", "float32")
    assert isinstance(apply_activation(v, "silu", fast_math=True, target=llvm).b, tirx.Let)  # fast_sigmoid's x = v
    assert apply_activation(v, "silu", fast_math=False, target=llvm).b.op.name == "tirx.sigmoid"


@pytest.mark.parametrize("target", ["llvm", AVX2])
def test_conv_silu_and_gemm_gelu_match_onnxruntime(target):
    g = GraphBuilder(3)
    x = g.input("x", [1, 8, 12, 12])
    y = apply_activation_onnx(g, g.conv(x, 8, 24), "x*Sigmoid")
    y = apply_activation_onnx(g, g.conv(y, 24, 24, groups=24), "x*Sigmoid")
    y = g.op("Reshape", [y, g.const(np.array([1, 24 * 144], np.int64), "shape")])
    w = g.const(g.rng.normal(0, 0.05, (24 * 144, 40)).astype(np.float32), "w")
    b = g.const(g.rng.normal(0, 0.1, 40).astype(np.float32), "b")
    model = g.model([apply_activation_onnx(g, g.op("Add", [g.op("MatMul", [y, w]), b]), "erf-decomposed")])
    x = g.rng.normal(0, 2, (1, 8, 12, 12)).astype(np.float32)
    built = build(frontend.import_onnx(model), resolve_target(target), "fused")
    rules = {grp.rule for grp in built.fused.groups}
    assert {"conv2d_bias_silu", "dense_bias_gelu_erf"} <= rules, rules
    sess, _ = run_onnxruntime(model, {"x": x})
    assert_close(run_build(built, [x])[0], sess.run(None, {"x": x})[0], f"{target} conv + SiLU, Gemm + GELU")


@pytest.mark.parametrize("target", ["llvm", AVX2])
def test_gemm_gelu_tanh_and_a_tanh_exp_chain_match_onnxruntime(target):
    """The tanh of a GELU epilogue and the tanh / exp / sigmoid of an elementwise chain take the fast forms."""
    g = GraphBuilder(4)
    x = g.input("x", [1, 48])
    w = g.const(g.rng.normal(0, 0.5, (48, 256)).astype(np.float32), "w")
    b = g.const(g.rng.normal(0, 0.1, 256).astype(np.float32), "b")
    y = apply_activation_onnx(g, g.op("Add", [g.op("MatMul", [x, w]), b]), "tanh-decomposed")
    f32 = lambda v: g.const(np.array(v, np.float32))  # noqa: E731
    z = g.op("Mul", [g.op("Tanh", [g.op("Add", [y, f32(-0.5)])]), f32(0.5)])
    model = g.model([g.op("Sigmoid", [g.op("Exp", [z])])])
    x = g.rng.normal(0, 2, (1, 48)).astype(np.float32)
    built = build(frontend.import_onnx(model), resolve_target(target), "fused")
    rules = {grp.rule for grp in built.fused.groups}
    assert "dense_bias_gelu_tanh" in rules and any(r.startswith("elementwise_chain") for r in rules), rules
    sess, _ = run_onnxruntime(model, {"x": x})
    assert_close(run_build(built, [x])[0], sess.run(None, {"x": x})[0], f"{target} Gemm + GELU(tanh), tanh chain")
