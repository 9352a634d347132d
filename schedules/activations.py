"""Epilogue activations as TE expressions, shared by every compute: act(v) for one scalar.

Every compute with an epilogue (conv, dense, squeeze-excite, ...) applies `ACTIVATIONS[name](v, params)`, so
an activation registered here (`register_activation`, from a rules file too) is taken by all of them and by
their CPU and CUDA schedules, which schedule the epilogue whatever it computes."""

from __future__ import annotations

import math

from tvm_fusion._tvm import prim_dtype, te, tirx
from tvm_fusion.registry import refuse_another

__all__ = ["ACTIVATIONS", "CANONICAL", "apply_activation", "const", "register_activation"]


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
    return te.sigmoid(v)


def _silu(v, p):
    return v * te.sigmoid(v)


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
    return v * (te.erf(v / const(p["divisor"], v)) + const(p["one"], v)) * const(p["half"], v)


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
