"""Epilogue activations as TE expressions, shared by every compute: act(v) for one scalar.

Every compute with an epilogue (conv, dense, squeeze-excite, ...) applies `ACTIVATIONS[name](v, params)`, so
an activation registered here (`register_activation`, from a rules file too) is taken by all of them and by
their CPU and CUDA schedules, which schedule the epilogue whatever it computes."""

from __future__ import annotations

import contextlib
import contextvars
import math

from tvm_fusion._tvm import prim_dtype, te, tirx, tvm
from tvm_fusion.registry import refuse_another

__all__ = ["ACTIVATIONS", "CANONICAL", "MATH", "apply_activation", "const", "kernel_dtypes", "math_op",
           "register_activation", "register_math"]

#: TVM's math intrinsics, as the computes call them unless the target has its own (MATH)
_INTRINSICS = {"exp": te.exp, "sigmoid": te.sigmoid, "erf": te.erf}
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


#: the dtypes of the tensors of the kernel being built (`kernel_dtypes`)
_KERNEL_DTYPES: contextvars.ContextVar[tuple] = contextvars.ContextVar("kernel_dtypes", default=())


@contextlib.contextmanager
def kernel_dtypes(dtypes):
    """Builds the computes inside for a kernel whose tensors have these dtypes (see `math_op`)."""
    token = _KERNEL_DTYPES.set(tuple(str(d) for d in dtypes))
    try:
        yield
    finally:
        _KERNEL_DTYPES.reset(token)


def math_op(name: str, v):
    """name(v) (exp, sigmoid, erf) for the target the kernel is being built for (`with target:`). A kernel
    with bfloat16 tensors keeps TVM's intrinsic: TVM's bfloat16 legalization copies the epilogue and the
    copies' Let bindings then differ, which its vectorizer refuses."""
    target = tvm.target.Target.current(allow_none=True)
    if target is None or "bfloat16" in _KERNEL_DTYPES.get():
        return _INTRINSICS[name](v)
    return MATH.get((target.kind.name, prim_dtype(v)), {}).get(name, _INTRINSICS[name])(v)


def const(v, like):
    """The number `v` as a TIR constant of `like`'s dtype (`like`: a PrimExpr or a dtype name)."""
    return tirx.const(v, like if isinstance(like, str) else prim_dtype(like))


def _relu(v, p):
    return te.max(v, const(0, v))


def _relu6(v, p):
    return te.min(te.max(v, const(0, v)), const(6, v))


def _clip(v, p):
    return te.min(te.max(v, const(p["min"], v)), const(p["max"], v))


def _leaky_relu(v, p):
    return tirx.Select(v > const(0, v), v, v * const(p["alpha"], v))


def _sigmoid(v, p):
    return math_op("sigmoid", v)


def _silu(v, p):
    return v * math_op("sigmoid", v)


def _tanh(v, p):
    return te.tanh(v)


#: the constants of each activation with constants. A decomposed form carries the values it matched as
#: activation params (recorded in the group's attrs and the manifest), and the compute uses exactly those;
#: these are the canonical values, for the op forms and as the reference the pattern checks compare with.
CANONICAL = {
    "hardsigmoid": {"alpha": 0.2, "beta": 0.5},  # ONNX HardSigmoid's defaults
    # x * clip(x + 3, 0, 6) / 6, or x * hardsigmoid(x; 1/6, 1/2) when the match carries alpha/beta
    "hardswish": {"shift": 3.0, "divisor": 6.0, "alpha": 1 / 6, "beta": 0.5},
    "gelu_erf": {"divisor": math.sqrt(2), "one": 1.0, "half": 0.5},  # x * (erf(x / sqrt 2) + 1) * 0.5
    "gelu_tanh": {"k": 0.044715, "c": math.sqrt(2 / math.pi), "one": 1.0, "half": 0.5},
}


def _params(name, p):
    return {**CANONICAL[name], **p}


def _hardsigmoid(v, p):
    p = _params("hardsigmoid", p)
    return te.min(te.max(v * const(p["alpha"], v) + const(p["beta"], v), const(0, v)), const(1, v))


def _hardswish(v, p):
    """x * hardsigmoid(x; alpha, beta) when the match was that form (alpha/beta carried), else
    x * clip(x + shift, 0, 6) / divisor."""
    if "alpha" in p:
        return v * _hardsigmoid(v, {"alpha": p["alpha"], "beta": p["beta"]})
    p = _params("hardswish", p)
    return v * te.min(te.max(v + const(p["shift"], v), const(0, v)), const(6, v)) / const(p["divisor"], v)


def _gelu_erf(v, p):
    p = _params("gelu_erf", p)
    return v * (math_op("erf", v / const(p["divisor"], v)) + const(p["one"], v)) * const(p["half"], v)


def _gelu_tanh(v, p):
    p = _params("gelu_tanh", p)
    inner = (v + v * v * v * const(p["k"], v)) * const(p["c"], v)
    return v * (te.tanh(inner) + const(p["one"], v)) * const(p["half"], v)


ACTIVATIONS = {
    None: lambda v, p: v,
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
}


def register_activation(name: str, fn) -> None:
    """Adds epilogue activation `name`: fn(v, params) -> the activated TE scalar (v is in the accumulator
    dtype; params: the constants the rule's match carries). A name taken by another definition is refused."""
    refuse_another(ACTIVATIONS.get(name), fn, f"duplicate activation {name!r}: the epilogue computes already "
                                               "have one by that name")
    ACTIVATIONS[name] = fn


def apply_activation(v, name, params=None):
    return ACTIVATIONS[name](v, params or {})
