"""Half precision: the accumulator of every compute, and `--precision` (an fp32 model converted to fp16 / bf16).

    compute(x: half, W: half)  ==>  sum in float32, epilogue in float32, one cast to half at the store
    --precision fp16 | bf16:   fp32 model  ==>  BatchNorm as x * s + t  ==>  ToMixedPrecision  ==>  fuse

Every family (conv, dense, layer norm, elementwise chains) takes float16 and bfloat16 tensors: products are
widened to float32 before they are summed, the epilogue (bias, BatchNorm shift, residual, activation) runs in
float32 and the result is rounded once. Folded constants are computed in float64 and rounded once: the
weights to the tensor dtype, the bias to float32.

`convert` turns a float32 Relax module into a mixed-precision one with Relax's `ToMixedPrecision`: conv2d
and matmul read half inputs, elementwise ops follow their inputs, and softmax, layer-norm statistics and
reductions stay in float32 (the pass's "never" list). BatchNorm is rewritten as `x * s + t` first (s and t
per channel, from the float32 statistics) so that it follows the conv into half precision and fuses exactly
as in the float32 model. ToMixedPrecision only knows float16: for bfloat16 every float16 it produced is
retyped to bfloat16 (the casts it inserted and the conv / matmul output dtypes), then types are inferred again.
The function signature stays float32 (inputs are cast inside, outputs cast back), so the reference is the
float32 model and the verdict uses the half dtype's tolerance (numerics.TOLERANCES).
"""

from __future__ import annotations

__all__ = ["HALF_DTYPES", "PRECISIONS", "accumulator_dtype", "check_precision", "convert", "numpy_dtype",
           "cast_to", "verdict_dtype"]

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
    from ._tvm import prim_dtype

    return value if prim_dtype(value) == str(dtype) else value.astype(str(dtype))


def numpy_dtype(dtype):
    """The NumPy dtype of a TVM dtype name; bfloat16 is ml_dtypes' (NumPy has none)."""
    import numpy as np

    if str(dtype) == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(str(dtype))


def check_precision(precision: str | None) -> str | None:
    """The tensor dtype of `precision` (None for None / "fp32"); FusionError for anything else."""
    from .errors import FusionError

    if precision in (None, "", "fp32"):
        return None
    if precision not in PRECISIONS:
        raise FusionError(f"--precision {precision!r}: expected one of fp32, {', '.join(PRECISIONS)}")
    return PRECISIONS[precision]


def verdict_dtype(reference_dtype, precision: str | None):
    """The dtype whose tolerance judges an output: the half dtype for a float32 output of a converted model."""
    half = check_precision(precision)
    return half if half is not None and str(reference_dtype) == "float32" else reference_dtype


def convert(mod, precision: str | None):
    """`mod` (float32) with conv / matmul and what follows them in `precision` (see the module docstring);
    `mod` itself for None / "fp32"."""
    dtype = check_precision(precision)
    if dtype is None:
        return mod
    from ._tvm import relax
    from .frontend import onnx_node_names
    from .fuse import normalize_batch_norm

    names = onnx_node_names(mod)
    mod = normalize_batch_norm(mod, names)
    mod = relax.transform.ToMixedPrecision(out_dtype="float16")(mod)
    if dtype != "float16":
        mod = _retype_half(mod, dtype)
    mod = relax.transform.FoldConstant()(mod)
    return relax.transform.DeadCodeElimination()(mod)


def _retype_half(mod, dtype: str):
    """Every float16 that ToMixedPrecision introduced, as `dtype`: the astype targets and the out_dtype of
    conv2d / matmul; the types downstream are inferred again by the block builder."""
    from ._tvm import relax, tvm

    @relax.expr_functor.mutator
    class Retype(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            op = getattr(call.op, "name", "")
            if op == "relax.astype" and str(call.attrs.dtype) == "float16":
                return relax.op.astype(call.args[0], dtype)
            if op == "relax.nn.conv2d" and str(call.attrs.out_dtype) == "float16":
                a = call.attrs
                return relax.op.nn.conv2d(call.args[0], call.args[1], strides=a.strides, padding=a.padding,
                                          dilation=a.dilation, groups=a.groups, data_layout=a.data_layout,
                                          kernel_layout=a.kernel_layout, out_layout=a.out_layout, out_dtype=dtype)
            if op == "relax.matmul" and str(call.attrs.out_dtype) == "float16":
                return relax.op.matmul(call.args[0], call.args[1], out_dtype=dtype)
            return call

    out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            out[gv] = Retype(out).visit_expr(func)
    return out
