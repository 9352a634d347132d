"""Half precision: the accumulator of every compute, and `--precision` (an fp32 model converted to fp16 / bf16).

    compute(x: half, W: half)  ==>  sum in float32, epilogue in float32, one cast to half at the store
    --precision fp16 | bf16:   fp32 model  ==>  BatchNorm as x * s + t  ==>  ToMixedPrecision  ==>  fuse

Every family (conv, dense, layer norm, elementwise chains) takes float16 and bfloat16 tensors: products are
widened to float32 before they are summed, the epilogue (bias, BatchNorm shift, residual, activation) runs in
float32 and the result is rounded once. Folded constants are computed in float64 and rounded once: the
weights to the tensor dtype, the bias to float32.

The conversion (`--precision`) is `tvm_fusion.build.mixed_precision`; the baseline a half build is judged
against is `tvm_fusion.check.half_reference`. Here: the dtype helpers every stage uses, and the Relax passes
that keep half tensors computing in float32 where TVM would not (at import: `bfloat16_*`; at build:
`half_sums_in_float32`).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from tvm_fusion._tvm import constant_value, dpl, expr_type, is_constant, make_constant, prim_dtype, relax, tvm
from tvm_fusion.errors import FusionError

__all__ = ["HALF_DTYPES", "PRECISIONS", "FLOAT32_NORMS", "FLOAT32_OPS", "FLOAT32_TESTS", "WEIGHT_OPS",
           "accumulator_dtype", "bfloat16_norms_narrowed", "bfloat16_norms_widened", "bfloat16_ops_narrowed",
           "bfloat16_ops_widened", "cast_to", "check_precision", "dtype_reason", "half_batch_norm_casts",
           "half_sums_in_float32", "mutated", "norm_in_float32", "numpy_dtype", "rewrite", "verdict_dtype"]

#: the ONNX ops whose weight (input 1) a conversion reads in the half dtype
WEIGHT_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")

#: --precision values and the tensor dtype each gives
PRECISIONS = {"fp16": "float16", "bf16": "bfloat16"}
HALF_DTYPES = ("float16", "bfloat16")
ACCUMULATOR = "float32"


def accumulator_dtype(dtype) -> str:
    """The dtype a compute sums and applies its epilogue in: float32 for half tensors, else the dtype."""
    dtype = str(dtype)
    return ACCUMULATOR if dtype in HALF_DTYPES else dtype


def cast_to(value, dtype):
    """The TIR expression `value` cast to `dtype`, or `value` itself when it already has that dtype (so a
    float32 compute stays exactly as it was written)."""
    return value if prim_dtype(value) == str(dtype) else value.astype(str(dtype))


def numpy_dtype(dtype):
    """The NumPy dtype of a TVM dtype name; bfloat16 is ml_dtypes' (NumPy has none)."""
    if str(dtype) == "bfloat16":
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(str(dtype))


def half_batch_norm_casts(m, dtype: str, op: str) -> str | None:
    """Why a match's BatchNorm casts (annotations `bn_widen` / `bn_narrow`) do not make the half form
    `astype(astype(y, float32) * s + t, half)` after an `op` of `dtype`; None when they do or are absent.
    Only that form keeps the kernel's output in the op's dtype."""
    widen, narrow = "bn_widen" in m, "bn_narrow" in m
    if not widen and not narrow:
        return None
    wide = m.dtype("bn_widen") if widen else dtype
    out = m.dtype("bn_narrow") if narrow else m.dtype("bn_shift")
    if dtype in HALF_DTYPES and wide == ACCUMULATOR and out == dtype:
        return None
    return (f"batch_norm computes in {wide} and returns {out} after a {dtype} {op}; the kernel folds a "
            f"BatchNorm in the {op}'s dtype, or a half {op}'s BatchNorm computed in {ACCUMULATOR} and cast back")


def dtype_reason(m, dtype: str, op: str, supported) -> str | None:
    """Why an epilogue family's compute cannot take the match's `op` of `dtype`: not one of `supported`, or
    BatchNorm casts that are not the half form (half_batch_norm_casts); None when it can."""
    if dtype not in supported:
        return f"{op} dtype is {dtype}; the compute supports {', '.join(supported)}"
    return half_batch_norm_casts(m, dtype, op)


def check_precision(precision: str | None) -> str | None:
    """The tensor dtype of `precision` (None for None / "fp32"); FusionError for anything else."""
    if precision in (None, "", "fp32"):
        return None
    if precision not in PRECISIONS:
        raise FusionError(f"--precision {precision!r}: expected one of fp32, {', '.join(PRECISIONS)}")
    return PRECISIONS[precision]


def verdict_dtype(reference_dtype, precision: str | None):
    """The dtype whose tolerance judges an output: the half dtype for a float32 output of a converted model."""
    half = check_precision(precision)
    return half if half is not None and str(reference_dtype) == "float32" else reference_dtype


def mutated(mod, mutator):
    """`mod` with each Relax function visited by a fresh `mutator` (a relax.PyExprMutator class)."""
    out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            out[gv] = mutator(out).visit_expr(func)
    return out


def rewrite(mod, pattern, rewriter):
    """`mod` with each Relax function's matches of `pattern` replaced by `rewriter` (dpl.rewrite_call)."""
    out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            out[gv] = dpl.rewrite_call(pattern, rewriter, func)
    return out


#: reductions that TVM legalizes summing in their input's dtype and that have no out_dtype: a half input is
#: cast to float32 first (a float16 GlobalAveragePool of 43 x 43 summed in float16 was off by 5% on one channel)
WIDENED_INPUTS = ("relax.mean", "relax.sum", "relax.variance", "relax.nn.avg_pool1d", "relax.nn.avg_pool2d",
                  "relax.nn.avg_pool3d", "relax.nn.adaptive_avg_pool1d", "relax.nn.adaptive_avg_pool2d",
                  "relax.nn.adaptive_avg_pool3d")


#: normalizations TVM 0.27 legalizes for float32 and float16 only ("layer_norm: only support float32 and float16
#: for now"; its ONNX importer writes no instance_norm, and refuses a bfloat16 group_norm): a bfloat16 model keeps
#: them as they are, computed in float32 from its bfloat16 values
FLOAT32_NORMS = ("relax.nn.layer_norm",)


def norm_in_float32(call):
    """A bfloat16 normalization call (FLOAT32_NORMS: data, gamma, beta) as astype(norm(astype(data, float32),
    gamma and beta in float32), bfloat16): its statistics in float32, the result rounded once."""
    def wide(e):
        if is_constant(e):
            return make_constant(constant_value(e).astype("float32"))
        return relax.op.astype(e, ACCUMULATOR) if str(expr_type(e).dtype) != ACCUMULATOR else e

    return relax.op.astype(relax.Call(call.op, [wide(a) for a in call.args], call.attrs, call.ty_args),
                           str(expr_type(call.args[0]).dtype))


def bfloat16_norms_widened(mod):
    """`mod` with every bfloat16 FLOAT32_NORMS call as norm_in_float32 (TVM's FoldConstant legalizes each call
    and stops at one); bfloat16_norms_narrowed undoes it."""
    @relax.expr_functor.mutator
    class Widen(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            op = getattr(call.op, "name", "")
            data = call.args[0].ty if call.args else None
            return norm_in_float32(call) if op in FLOAT32_NORMS and str(getattr(data, "dtype", "")) == "bfloat16" \
                else call

    return mutated(mod, Widen)


#: tests TVM 0.27 has no bfloat16 intrinsic for ("Data type T.bfloat16 not supported for isnan op"): ONNX's
#: Clip imports as max(x, where(isnan(lo), -inf, lo)) ..., so constant folding refused every bfloat16 Clip
FLOAT32_TESTS = {"relax.isnan": "isnan", "relax.isinf": "isinf", "relax.isfinite": "isfinite"}
#: ops TVM 0.27 cannot legalize in bfloat16 on llvm ("power only applies to float"; mod's store fails)
FLOAT32_OPS = ("relax.power", "relax.mod")


def bfloat16_ops_widened(mod):
    """`mod` with every FLOAT32_TESTS call on a bfloat16 value as the same test of its float32 value (exact:
    every bfloat16 value, NaN and infinities included, is a float32 value), and every FLOAT32_OPS call on
    bfloat16 values computed in float32 and rounded once to bfloat16. A test of a constant, and a `where` of
    constants, is evaluated here: FoldConstant folds no bfloat16 value, and the Clip rules want constant
    bounds."""
    def dtype(e) -> str:
        return str(getattr(expr_type(e), "dtype", ""))

    @relax.expr_functor.mutator
    class Widen(relax.PyExprMutator):
        def constant(self, e):
            e = self.lookup_binding(e) if isinstance(e, relax.Var) and self.lookup_binding(e) is not None else e
            return constant_value(e) if is_constant(e) else None

        def wide(self, e):
            value = self.constant(e)
            return relax.op.astype(e, ACCUMULATOR) if value is None else make_constant(value.astype(np.float32))

        def visit_call_(self, call):
            call = super().visit_call_(call)
            op = getattr(call.op, "name", "")
            if op == "relax.where" and dtype(call) == "bfloat16":
                values = [self.constant(a) for a in call.args]
                return call if any(v is None for v in values) else make_constant(np.where(*values))
            if op not in (*FLOAT32_TESTS, *FLOAT32_OPS) or dtype(call.args[0]) != "bfloat16":
                return call
            if op in FLOAT32_OPS:
                wide = relax.Call(call.op, [self.wide(a) for a in call.args], call.attrs, call.ty_args)
                return relax.op.astype(wide, "bfloat16")
            value = self.constant(call.args[0])
            if value is not None:
                return make_constant(getattr(np, FLOAT32_TESTS[op])(value.astype(np.float32)))
            return relax.Call(call.op, [self.wide(call.args[0])], call.attrs, call.ty_args)

    return mutated(mod, Widen)


def bfloat16_ops_narrowed(mod):
    """astype(op(astype(x: bfloat16, float32), c), bfloat16), c a float32 constant that bfloat16 holds exactly,
    ==> op(x, c in bfloat16) for FLOAT32_OPS (what bfloat16_ops_widened wrote, after FoldConstant): the form
    the rules take (GELU's x ** 3); half_sums_in_float32 widens those no rule took for the builds."""
    half = numpy_dtype("bfloat16")

    def narrowed(e):
        if is_constant(e):
            v = constant_value(e)
            ok = v.dtype == np.float32 and np.array_equal(v.astype(half).astype(np.float32), v, equal_nan=True)
            return make_constant(v.astype(half)) if ok else None
        inner = e.args[0]
        return inner if str(expr_type(inner).dtype) == "bfloat16" and str(e.attrs.dtype) == ACCUMULATOR else None

    for name in FLOAT32_OPS:
        args = [dpl.is_op("relax.astype")(dpl.wildcard()) | dpl.is_const() for _ in range(2)]
        call = dpl.is_op(name)(*args)

        def rewriter(expr, matches, args=args, call=call):
            narrow = [narrowed(matches[a]) for a in args]
            if str(expr.attrs.dtype) != "bfloat16" or any(n is None for n in narrow):
                return expr
            c = matches[call]
            return relax.Call(c.op, narrow, c.attrs, c.ty_args)

        mod = rewrite(mod, dpl.is_op("relax.astype")(call), rewriter)
    return mod


def bfloat16_norms_narrowed(mod):
    """astype(norm(astype(x: bfloat16, float32), gamma, beta), bfloat16) with float32 constants gamma and beta
    that bfloat16 holds exactly  ==>  norm(x, gamma, beta) in bfloat16 (FLOAT32_NORMS; the form the rules take,
    which the builds compute in float32: norm_in_float32)."""
    x, gamma, beta = dpl.wildcard(), dpl.is_const(), dpl.is_const()
    norm = dpl.is_op("relax.nn.layer_norm")(dpl.is_op("relax.astype")(x), gamma, beta)
    root = dpl.is_op("relax.astype")(norm)
    half = numpy_dtype("bfloat16")

    def rewriter(expr, matches):
        params = [constant_value(matches[c]) for c in (gamma, beta)]
        if str(expr_type(matches[x]).dtype) != "bfloat16" or str(expr.attrs.dtype) != "bfloat16" or \
                any(p.dtype != np.float32 or not np.array_equal(p.astype(half).astype(np.float32), p) for p in params):
            return expr
        call = matches[norm]
        return relax.Call(call.op, [matches[x], *(make_constant(p.astype(half)) for p in params)], call.attrs,
                          call.ty_args)

    return rewrite(mod, root, rewriter)


def half_sums_in_float32():
    """A module pass for the ops no rule took: conv2d / matmul with half inputs and no wider out_dtype
    ==> astype(op(..., out_dtype=float32), half); mean / sum / variance / average pools (WIDENED_INPUTS) of a
    half x ==> astype(op(astype(x, float32)), half); a bfloat16 layer_norm ==> norm_in_float32; a bfloat16
    power / mod (FLOAT32_OPS) computed in float32. TVM legalizes them summing in the half dtype otherwise (or
    refuses bfloat16), and the unfused build is an oracle
    of the fused one (and onnxruntime sums float16 in float32 too)."""
    @relax.expr_functor.mutator
    class Widen(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            op = getattr(call.op, "name", "")
            dtype = str(call.args[0].ty.dtype) if call.args and hasattr(call.args[0].ty, "dtype") else ""
            if op in FLOAT32_NORMS and dtype == "bfloat16":
                return norm_in_float32(call)
            if op in FLOAT32_OPS and dtype == "bfloat16":
                wide = [relax.op.astype(a, ACCUMULATOR) for a in call.args]
                return relax.op.astype(relax.Call(call.op, wide, call.attrs, call.ty_args), dtype)
            if op in WIDENED_INPUTS and dtype in HALF_DTYPES:
                wide = relax.op.astype(call.args[0], ACCUMULATOR)
                return relax.op.astype(relax.Call(call.op, [wide, *call.args[1:]], call.attrs, call.ty_args), dtype)
            if op not in ("relax.nn.conv2d", "relax.matmul"):
                return call
            out = str(call.attrs.out_dtype)
            if dtype not in HALF_DTYPES or out not in ("None", "", "void", dtype):
                return call
            if op == "relax.matmul":
                return relax.op.astype(relax.op.matmul(call.args[0], call.args[1], out_dtype=ACCUMULATOR), dtype)
            a = call.attrs
            wide = relax.op.nn.conv2d(call.args[0], call.args[1], strides=a.strides, padding=a.padding,
                                      dilation=a.dilation, groups=a.groups, data_layout=a.data_layout,
                                      kernel_layout=a.kernel_layout, out_layout=a.out_layout, out_dtype=ACCUMULATOR)
            return relax.op.astype(wide, dtype)

    @tvm.transform.module_pass(opt_level=0, name="HalfSumsInFloat32")
    def widen(mod, ctx):
        return mutated(mod, Widen)

    return widen


