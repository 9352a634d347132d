"""Epilogue activations as TE expressions, shared by every compute: act(v) for one scalar.

Every compute with an epilogue (conv, dense, squeeze-excite, ...) applies `ACTIVATIONS[name](v, params, math)`
(`apply_activation`), so an activation registered here (`register_activation`, from a rules file too) is taken
by all of them and by their CPU and CUDA schedules, which schedule the epilogue whatever it computes.
`math` is the kernel's exp / sigmoid / erf / tanh (`KernelMath`): the target's own forms (`register_math`) where the
kernel may take them (`fast_math_allowed`, decided by fuse from the kernel's dtypes and passed to the compute
as its `fast_math` argument, with the build's target as its `target` argument), TVM's intrinsics otherwise."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from math import pi, sqrt

from tvm_fusion._tvm import prim_dtype, te, tirx
from tvm_fusion.registry import refuse_another

__all__ = ["ACTIVATIONS", "CANONICAL", "MATH", "KernelMath", "apply_activation", "const", "fake_quant_value",
           "fast_math_allowed", "register_activation", "register_math"]

#: TVM's math intrinsics, as the computes call them unless the target has its own (MATH)
_INTRINSICS = {"exp": te.exp, "sigmoid": te.sigmoid, "erf": te.erf, "tanh": te.tanh}
#: (target kind, dtype) -> {name: fn(v)}: a target's own forms of _INTRINSICS' functions (register_math)
MATH: dict[tuple[str, str], dict] = {}


def register_math(target: str, dtype: str, **fns) -> None:
    """Kernels built for `target` compute `name(v)` of a `dtype` value as fns[name](v) (names of
    _INTRINSICS), e.g. llvm's vectorizable float32 exp (`schedules/llvm/fast_math.py`)."""
    unknown = set(fns) - set(_INTRINSICS)
    if unknown:
        raise ValueError(f"no math function {sorted(unknown)}; expected some of {sorted(_INTRINSICS)}")
    table = MATH.setdefault((target, dtype), {})
    for name, fn in fns.items():
        refuse_another(table.get(name), fn, f"duplicate {name!r} for {target} {dtype}")
        table[name] = fn


def fast_math_allowed(dtypes) -> bool:
    """Whether a kernel with tensors of these dtypes may take its target's exp / sigmoid / erf (`MATH`). Not
    with bfloat16 tensors: TVM's bfloat16 legalization copies the epilogue, and its vectorizer refuses the
    copies of the fast forms' Let bindings (schedules/llvm/fast_math.py)."""
    return all(str(d) != "bfloat16" for d in dtypes)


@dataclass(frozen=True)
class KernelMath:
    """exp, sigmoid, erf and tanh as one kernel computes them: the own form of the value's dtype that target
    kind `target` registered (`register_math`) when `fast`, else TVM's intrinsic (also with no target)."""

    fast: bool
    target: str | None = None  # the kind of the target the kernel is built for ("llvm", "cuda")

    @classmethod
    def of(cls, fast_math: bool, target=None) -> "KernelMath":
        """The math of a kernel built for `target` (a tvm Target, a kind name or None)."""
        kind = getattr(getattr(target, "kind", None), "name", target)
        return cls(bool(fast_math), None if kind is None else str(kind))

    def exp(self, v):
        return self._op("exp", v)

    def sigmoid(self, v):
        return self._op("sigmoid", v)

    def erf(self, v):
        return self._op("erf", v)

    def tanh(self, v):
        return self._op("tanh", v)

    def separate_product(self, a, b):
        """a * b rounded on its own, as a separate multiply does: never contracted with the add that follows
        into one fused multiply-add, which TVM's LLVM (AllowFPOpFusion fast) and nvcc (-fmad) otherwise do.
        After a dequantize that matters: (q - z) * s + c is often exactly halfway between two steps of the
        next quantize (s = 2/255, c = 1), and an FMA rounds it the other way. llvm: an arithmetic fence on
        the product (still vectorized); CUDA: __fmul_rn."""
        if self.target == "llvm":
            return tirx.call_llvm_pure_intrin(prim_dtype(a), "llvm.arithmetic.fence", a * b)
        if self.target == "cuda" and prim_dtype(a) == "float32":
            return tirx.call_pure_extern("float32", "__fmul_rn", a, b)
        return a * b

    def round_half_even(self, v):
        """v rounded to the nearest integer, ties to even (IEEE's default, as x86's cvtps2dq). On llvm TVM's `round`
        is exactly that (llvm.nearbyint) and vectorizes; `nearbyint` is not marked vectorizable (a loop with it
        is scalarized) and elsewhere `round` means roundf (ties away from zero, CUDA), so `nearbyint` there."""
        return te.round(v) if self.target == "llvm" else te.nearbyint(v)

    def _op(self, name: str, v):
        if self.target is None or not self.fast:
            return _INTRINSICS[name](v)
        return MATH.get((self.target, prim_dtype(v)), {}).get(name, _INTRINSICS[name])(v)


def const(v, like):
    """The number `v` as a TIR constant of `like`'s dtype (`like`: a PrimExpr or a dtype name)."""
    return tirx.const(v, like if isinstance(like, str) else prim_dtype(like))


def _relu(v, p, math):
    return te.max(v, const(0, v))


def _relu6(v, p, math):
    return te.min(te.max(v, const(0, v)), const(6, v))


def _clip(v, p, math):
    return te.min(te.max(v, const(p["min"], v)), const(p["max"], v))


def _leaky_relu(v, p, math):
    return tirx.Select(v > const(0, v), v, v * const(p["alpha"], v))


def _sigmoid(v, p, math):
    return math.sigmoid(v)


def _silu(v, p, math):
    return v * math.sigmoid(v)


def _tanh(v, p, math):
    return math.tanh(v)


#: the constants of each activation with constants. A decomposed form carries the values it matched as
#: activation params (recorded in the group's attrs and the manifest), and the compute uses exactly those;
#: these are the canonical values, for the op forms and as the reference the pattern checks compare with.
CANONICAL = {
    "hardsigmoid": {"alpha": 0.2, "beta": 0.5},  # ONNX HardSigmoid's defaults
    # x * clip(x + 3, 0, 6) / 6, or x * hardsigmoid(x; 1/6, 1/2) when the match carries alpha/beta
    "hardswish": {"shift": 3.0, "divisor": 6.0, "alpha": 1 / 6, "beta": 0.5},
    "gelu_erf": {"divisor": sqrt(2), "one": 1.0, "half": 0.5},  # x * (erf(x / sqrt 2) + 1) * 0.5
    "gelu_tanh": {"k": 0.044715, "c": sqrt(2 / pi), "one": 1.0, "half": 0.5},
}


def _params(name, p):
    return {**CANONICAL[name], **p}


def _hardsigmoid(v, p, math):
    p = _params("hardsigmoid", p)
    return te.min(te.max(v * const(p["alpha"], v) + const(p["beta"], v), const(0, v)), const(1, v))


def _hardswish(v, p, math):
    """x * hardsigmoid(x; alpha, beta) when the match was that form (alpha/beta carried), else
    x * clip(x + shift, 0, 6) / divisor."""
    if "alpha" in p:
        return v * _hardsigmoid(v, {"alpha": p["alpha"], "beta": p["beta"]}, math)
    p = _params("hardswish", p)
    return v * te.min(te.max(v + const(p["shift"], v), const(0, v)), const(6, v)) / const(p["divisor"], v)


def _gelu_erf(v, p, math):
    p = _params("gelu_erf", p)
    return v * (math.erf(v / const(p["divisor"], v)) + const(p["one"], v)) * const(p["half"], v)


def _gelu_tanh(v, p, math):
    p = _params("gelu_tanh", p)
    inner = (v + v * v * v * const(p["k"], v)) * const(p["c"], v)
    return v * (math.tanh(inner) + const(p["one"], v)) * const(p["half"], v)


def fake_quant_value(v, p, math: KernelMath):
    """QuantizeLinear -> DequantizeLinear of the float32 value v as onnxruntime computes them (MLAS): the
    quotient v / scale (a division, as MLAS's _mm_div_ps, never v * (1 / scale)), clamped to
    [qmin - zero_point, qmax - zero_point], rounded half to even (as cvtps2dq: `math.round_half_even`),
    shifted to the dequantize's zero point, times its scale.
    Clamping before rounding equals saturating after it (the bounds are integers); every value before the
    last product is an integer below 2^24, exact in float32, so the one rounding is the product's, as in
    onnxruntime's float(q - z') * s', a product of its own (`math.separate_product`: no FMA with what follows)."""
    lo, hi = p["qmin"] - p["zero_point"], p["qmax"] - p["zero_point"]
    r = math.round_half_even(te.min(te.max(v / const(p["scale"], v), const(lo, v)), const(hi, v)))
    shift = p["zero_point"] - p["dq_zero_point"]
    return math.separate_product(r + const(shift, v) if shift else r, const(p["dq_scale"], v))


def _fake_quant(v, p, math):
    """fake_quant_value of `inner`(v) (None: v itself), the activation before the quantize (conv -> relu -> Q)."""
    inner = p.get("inner")
    if inner is not None:
        fn, inner_params = ACTIVATIONS[inner], p.get("inner_params") or {}
        v = fn(v, inner_params) if inner in _WITHOUT_MATH else fn(v, inner_params, math)
    return fake_quant_value(v, p, math)


ACTIVATIONS = {
    None: lambda v, p, math: v,
    "relu": _relu,
    "relu6": _relu6,
    "clip": _clip,
    "leaky_relu": _leaky_relu,
    "sigmoid": _sigmoid,
    "silu": _silu,
    "tanh": _tanh,
    "hardsigmoid": _hardsigmoid,
    "hardswish": _hardswish,
    "gelu_erf": _gelu_erf,
    "gelu_tanh": _gelu_tanh,
    "fake_quant": _fake_quant,
}


def register_activation(name: str, fn) -> None:
    """Adds epilogue activation `name`: fn(v, params, math) -> the activated TE scalar (v is in the accumulator
    dtype; params: the constants the rule's match carries; math: the kernel's exp / sigmoid / erf, a
    `KernelMath`), or fn(v, params) for one that takes none of them (an activation written before `math`
    existed keeps working). A name taken by another definition is refused."""
    refuse_another(ACTIVATIONS.get(name), fn, f"duplicate activation {name!r}: the epilogue computes already "
                                               "have one by that name")
    ACTIVATIONS[name] = fn
    if _takes_math(fn):
        _WITHOUT_MATH.discard(name)
    else:
        _WITHOUT_MATH.add(name)


#: registered activations written fn(v, params)
_WITHOUT_MATH: set[str] = set()


def _takes_math(fn) -> bool:
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params) >= 3


def apply_activation(v, name, params=None, *, fast_math: bool, target=None):
    """Activation `name` of the accumulator value v; `fast_math` and `target`: the compute's arguments of those
    names (may the kernel take its target's exp / sigmoid / erf, `fast_math_allowed`; the build's target:
    without one, TVM's intrinsics)."""
    if name in _WITHOUT_MATH:
        return ACTIVATIONS[name](v, params or {})
    return ACTIVATIONS[name](v, params or {}, KernelMath.of(fast_math, target))
