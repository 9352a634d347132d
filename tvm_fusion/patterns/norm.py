"""LayerNorm over the last axis, with the residual add before it fused in:

    layer_norm(add(a, b), gamma, beta)                              ==>  add_layer_norm(a, b, gamma, beta)
    (h - mean(h)) / sqrt(mean((h - mean(h))^2) + eps) * gamma + beta   (the decomposed ONNX form) likewise
    layer_norm(x, gamma, beta)                                      ==>  layer_norm(x, gamma, beta)

When the residual sum h also feeds something else (pre-LN transformers keep it for the next residual),
the match declines with the generic reason "intermediate ... has N consumers"; the LayerNorm output
itself may have any number of consumers (the BERT story: post-LN output feeds Q, K, V and the next add).
"""

from __future__ import annotations

import numpy as np

from tvm_fusion import _tvm, registry
from tvm_fusion._tvm import dpl
from tvm_fusion.patterns.activations import scalar_constant
from tvm_fusion.patterns.priority import priority
from tvm_fusion.precision import numpy_dtype
from tvm_fusion.rules import (Lowering, Match, Spec, axis_vector, batch_shape, commutative, decline, is_symbolic, rule,
                              shape_text, symbolic_reason)
from tvm_fusion.schedules.layer_norm import LAYER_NORM_FAMILY

SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")  # half: statistics in float32


def _decomposed(h):
    """The decomposed LayerNorm of `h`; returns (root, annotations)."""
    mean = dpl.is_op("relax.mean")(h)
    centered = dpl.is_op("relax.subtract")(h, mean)
    two, eps, gamma, beta = dpl.is_const(), dpl.is_const(), dpl.is_const(), dpl.is_const()
    var = dpl.is_op("relax.mean")(dpl.is_op("relax.power")(centered, two))
    std = dpl.is_op("relax.sqrt")(commutative("relax.add", var, eps))
    normed = dpl.is_op("relax.divide")(centered, std)
    out = commutative("relax.add", commutative("relax.multiply", normed, gamma), beta)
    ann = {"ln_mean": mean, "ln_var": var, "ln_two": two, "ln_eps": eps, "ln_gamma": gamma, "ln_beta": beta}
    return out, ann


def layer_norm_pattern(residual: bool) -> Spec:
    h = commutative("relax.add", dpl.wildcard(), dpl.wildcard()) if residual else dpl.wildcard()
    op = dpl.is_op("relax.nn.layer_norm")(h, dpl.is_const(), dpl.is_const())
    decomposed, ann = _decomposed(h)
    root = op | decomposed
    ann.update(h=h, ln_op=op, root=root)
    return Spec(root, ann, lambda m: lower_layer_norm(m, residual), _residual_check if residual else None)


def _params(m: Match) -> tuple[np.ndarray, np.ndarray, float]:
    if "ln_op" in m:
        call = m.value("ln_op")
        gamma, beta = (_tvm.constant_value(a) for a in call.args[1:3])
        return gamma, beta, float(call.attrs.epsilon)
    return (_tvm.constant_value(m["ln_gamma"]), _tvm.constant_value(m["ln_beta"]), scalar_constant(m["ln_eps"]))


def layer_norm_checks(m: Match):
    shape = batch_shape(m["root"])
    if shape is None:
        return decline(symbolic_reason("layer norm input", m["root"]))
    dtype = m.dtype("root")
    if dtype not in SUPPORTED_DTYPES:
        return decline(f"layer norm dtype is {dtype}; the compute supports {', '.join(SUPPORTED_DTYPES)}")
    c = shape[-1]
    if "ln_op" in m:
        axes = [int(a) % len(shape) for a in m.value("ln_op").attrs.axes]
        if axes != [len(shape) - 1]:
            return decline(f"layer_norm normalizes axes {axes}; the compute takes the last axis only")
    else:
        for name in ("ln_mean", "ln_var"):
            attrs = m.value(name).attrs
            axes = [int(a) % len(shape) for a in attrs.axis] if attrs.axis is not None else []
            if axes != [len(shape) - 1] or not attrs.keepdims:
                return decline(f"{name} reduces axes {axes} (keepdims={bool(attrs.keepdims)}); LayerNorm needs "
                               "the last axis with keepdims")
        if scalar_constant(m["ln_two"]) != 2.0:
            return decline(f"the variance uses power {scalar_constant(m['ln_two'])}; LayerNorm needs 2")
        if scalar_constant(m["ln_eps"]) is None:
            return decline("epsilon is not a scalar constant")
    gamma, beta, _ = _params(m)
    for name, value in (("gamma", gamma), ("beta", beta)):
        if axis_vector(value, shape, -1) is None:
            return decline(f"{name} has shape {value.shape}; expected one value per feature ({c},) broadcast over "
                           f"the last axis of {shape}")
    return None


def _residual_check(m: Match):
    shape = shape_text(m["root"])
    a, b = (shape_text(x) for x in m.value("h").args)
    if a != shape or b != shape:
        return decline(f"residual add operands have shapes {a} and {b}; expected both {shape}")
    return None


def _kernel_view(shape: tuple) -> tuple:
    """The kernel's view of the input: [rows, C], or [N, rows, C] when the batch N is symbolic (N times the
    other dims is no kernel dim)."""
    if is_symbolic(shape):
        return (shape[0], int(np.prod(shape[1:-1], dtype=np.int64)), shape[-1]) if len(shape) > 2 else tuple(shape)
    return int(np.prod(shape[:-1], dtype=np.int64)), shape[-1]


def lower_layer_norm(m: Match, residual: bool) -> Lowering:
    shape = batch_shape(m["root"])
    view = _kernel_view(shape)
    gamma, beta, eps = _params(m)
    inputs = list(m.value("h").args) if residual else [m["h"]]
    dtype = m.dtype("root")
    return Lowering(
        compute=m.rule if registry.has_compute(m.rule) else LAYER_NORM_FAMILY,
        inputs=inputs,
        constants=[axis_vector(v, shape, -1).astype(numpy_dtype(dtype)) for v in (gamma, beta)],
        attrs={"epsilon": eps},
        input_shapes={i: view for i, x in enumerate(inputs) if shape_text(x) != shape_text(view)},
        out_shape=tuple(shape) if shape_text(shape) != shape_text(view) else None,
    )


@rule("add_layer_norm", priority=priority("add_layer_norm"), check=layer_norm_checks)
def add_layer_norm():
    """layer_norm(add(a, b))  ==>  add_layer_norm(a, b, gamma, beta)   (op or decomposed form)"""
    return layer_norm_pattern(residual=True)


@rule("layer_norm", priority=priority("layer_norm"), check=layer_norm_checks)
def layer_norm():
    """decomposed or op LayerNorm over the last axis  ==>  layer_norm(x, gamma, beta)"""
    return layer_norm_pattern(residual=False)
