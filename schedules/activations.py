"""Epilogue activations as TE expressions, shared by every compute: act(v) for one scalar."""

from __future__ import annotations

import math

from tvm_fusion._tvm import prim_dtype, te, tirx

__all__ = ["ACTIVATIONS", "apply_activation"]


def _const(v, like):
    return tirx.const(v, like if isinstance(like, str) else prim_dtype(like))


def _relu(v, p):
    return te.max(v, _const(0, v))


def _relu6(v, p):
    return te.min(te.max(v, _const(0, v)), _const(6, v))


def _clip(v, p):
    return te.min(te.max(v, _const(p["min"], v)), _const(p["max"], v))


def _leaky_relu(v, p):
    return tirx.Select(v > _const(0, v), v, v * _const(p["alpha"], v))


def _sigmoid(v, p):
    return te.sigmoid(v)


def _silu(v, p):
    return v * te.sigmoid(v)


def _tanh(v, p):
    return te.tanh(v)


def _hardsigmoid(v, p):
    a, b = p.get("alpha", 1.0 / 6.0), p.get("beta", 0.5)
    return te.min(te.max(v * _const(a, v) + _const(b, v), _const(0, v)), _const(1, v))


def _hardswish(v, p):
    return v * _hardsigmoid(v, {"alpha": 1.0 / 6.0, "beta": 0.5})


def _gelu_erf(v, p):
    return v * _const(0.5, v) * (_const(1, v) + te.erf(v * _const(1 / math.sqrt(2), v)))


def _gelu_tanh(v, p):
    c = _const(math.sqrt(2 / math.pi), v)
    return v * _const(0.5, v) * (_const(1, v) + te.tanh(c * (v + _const(0.044715, v) * v * v * v)))


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


def apply_activation(v, name, params=None):
    return ACTIVATIONS[name](v, params or {})
