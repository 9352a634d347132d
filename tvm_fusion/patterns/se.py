"""Squeeze-and-excitation (MobileNetV3, EfficientNet, SENet) as one kernel:

    x * gate(conv1x1(act(conv1x1(mean(x, [2, 3]), W1) + b1), W2) + b2)  ==>  squeeze_excite_<act>_<gate>(x, W1, b1, W2, b2)

GlobalAveragePool, both 1x1 convs with their biases and activations, and the gating multiply (either
operand order) are one launch instead of five (the conv rules would take the two convs, leaving the pool
and the multiply alone). The gated map then feeds the block's projection conv as before. `act` is relu,
relu6, silu or hardswish; `gate` is hardsigmoid (MobileNetV3) or sigmoid (SENet, EfficientNet), with their
constants carried as matched. The convs must be 1x1 with no padding and no groups (a Linear on the pooled
vector), and the gate one value per (sample, channel): anything else declines with the actual shape.
Half maps (float16, bfloat16) are computed in float32 (the weights and biases as float32 constants) and
rounded once at the gated output.
"""

from __future__ import annotations

import numpy as np

from tvm_fusion import _tvm
from tvm_fusion._tvm import dpl
from tvm_fusion.patterns.activations import activation_pattern
from tvm_fusion.patterns.priority import priority
from tvm_fusion.precision import accumulator_dtype
from tvm_fusion.rules import (Decline, Lowering, Match, Spec, axis_vector, axis_vector_shapes, commutative, decline,
                              rule, static_shape, symbolic_reason)
from tvm_fusion.schedules.squeeze_excite import SE_FAMILY

SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")  # half: computed in float32, rounded once
ACTS = ("hardswish", "silu", "relu6", "relu")  # containing forms first (hardswish contains hardsigmoid)
GATES = ("hardsigmoid", "sigmoid")


def _fc(v):
    """A 1x1 conv with an optional bias add: returns (pattern, conv, bias_add)."""
    conv = dpl.is_op("relax.nn.conv2d")(v, dpl.is_const())
    bias = dpl.is_op("relax.add")(conv, dpl.is_const())
    return conv | bias, conv, bias


def squeeze_excite_pattern(act: str, gate: str) -> Spec:
    x = dpl.wildcard()
    pool = dpl.is_op("relax.mean")(x)
    y1, fc1, fc1_bias = _fc(pool)
    hidden, act_ann, act_params = activation_pattern(act, y1)
    y2, fc2, fc2_bias = _fc(hidden)
    g, gate_ann, gate_params = activation_pattern(gate, y2)
    root = commutative("relax.multiply", x, g)
    ann = {"x": x, "pool": pool, "fc1": fc1, "fc1_bias": fc1_bias, "hidden": hidden, "fc2": fc2,
           "fc2_bias": fc2_bias, "gate": g, "root": root, **act_ann, **gate_ann}

    def check(m: Match):
        for params in (act_params, gate_params):
            got = params(m)
            if isinstance(got, Decline):
                return got
        return None

    def lower(m: Match) -> Lowering:
        return lower_squeeze_excite(m, act, act_params(m), gate, gate_params(m))

    return Spec(root, ann, lower, check)


def _fc_check(m: Match, name: str, in_channels: int, out_channels: int | None):
    conv = m.value(name)
    attrs = conv.attrs
    if str(attrs.data_layout) != "NCHW" or str(attrs.kernel_layout) != "OIHW":
        return decline(f"{name} conv2d layout is {attrs.data_layout}/{attrs.kernel_layout}; expected NCHW/OIHW")
    w = static_shape(conv.args[1])
    if w[2:] != (1, 1) or int(attrs.groups) != 1 or any(int(p) for p in attrs.padding):
        return decline(f"{name} conv2d has kernel {w[2]}x{w[3]}, groups {int(attrs.groups)}, padding "
                       f"{[int(p) for p in attrs.padding]}; squeeze-excite needs a 1x1 conv, groups 1, no padding")
    if w[1] != in_channels or (out_channels is not None and w[0] != out_channels):
        want = f"[{out_channels if out_channels is not None else 'R'}, {in_channels}, 1, 1]"
        return decline(f"{name} weight has shape {list(w)}; expected {want}, one gate value per channel of x")
    bias = f"{name}_bias"
    if bias in m:
        b, out = m.const_operand(bias), m.shape(bias)
        if axis_vector(_tvm.constant_value(b), out, 1) is None:
            return decline(f"{bias} constant has shape {static_shape(b)}; expected one value per output channel, "
                           f"{axis_vector_shapes(out, 1)}")
    return None


def squeeze_excite_checks(m: Match):
    shape = m.shape("x")
    if shape is None or m.shape("root") is None:
        return decline(symbolic_reason("squeeze-excite input", m["x"], m.batch_dims))
    if len(shape) != 4:
        return decline(f"squeeze-excite input has rank {len(shape)}; expected an NCHW feature map (rank 4)")
    dtype = m.dtype("root")
    if dtype not in SUPPORTED_DTYPES:
        return decline(f"squeeze-excite dtype is {dtype}; the compute supports {', '.join(SUPPORTED_DTYPES)}")
    attrs = m.attrs("pool")
    axes = sorted(int(a) % 4 for a in attrs.axis) if attrs.axis is not None else [0, 1, 2, 3]
    if axes != [2, 3] or not attrs.keepdims:
        return decline(f"the pool is a mean over axes {axes} (keepdims={bool(attrs.keepdims)}); squeeze-excite "
                       "needs the spatial axes [2, 3] with keepdims (GlobalAveragePool)")
    n, c = shape[:2]
    hidden = m.shape("fc1")[1]
    reason = _fc_check(m, "fc1", c, None) or _fc_check(m, "fc2", hidden, c)
    if reason:
        return reason
    if m.shape("gate") != (n, c, 1, 1) or m.shape("root") != shape:
        return decline(f"the gate has shape {m.shape('gate')} and the gated output {m.shape('root')}; expected "
                       f"one gate value per (sample, channel), {(n, c, 1, 1)}, broadcast over x {shape}")
    return None


def _bias(m: Match, name: str, channels: int) -> np.ndarray:
    if name not in m:
        return np.zeros(channels)
    return axis_vector(_tvm.constant_value(m.const_operand(name)), m.shape(name), 1)


def lower_squeeze_excite(m: Match, act: str, act_params: dict, gate: str, gate_params: dict) -> Lowering:
    acc = accumulator_dtype(m.dtype("root"))
    w1 = _tvm.constant_value(m.value("fc1").args[1])
    w2 = _tvm.constant_value(m.value("fc2").args[1])
    b1, b2 = _bias(m, "fc1_bias", w1.shape[0]), _bias(m, "fc2_bias", w2.shape[0])
    return Lowering(
        compute=SE_FAMILY,
        inputs=[m["x"]],
        constants=[w1.reshape(w1.shape[:2]).astype(acc), b1.astype(acc), w2.reshape(w2.shape[:2]).astype(acc),
                   b2.astype(acc)],
        attrs=dict(activation=act, activation_params=dict(act_params), gate=gate, gate_params=dict(gate_params)),
    )


def _make_rule(act: str, gate: str):
    name = f"squeeze_excite_{act}_{gate}"

    def build():
        return squeeze_excite_pattern(act, gate)

    build.__doc__ = (f"x * {gate}(conv1x1({act}(conv1x1(mean(x, [2, 3])) + b1)) + b2)  ==>  {name}(x, W1, b1, W2, "
                     "b2)")
    made = rule(name, priority=priority(f"squeeze_excite_<act>_{gate}", act), check=squeeze_excite_checks)(build)
    made.source = __file__
    return made


#: above every conv rule (those would otherwise take the two 1x1 convs first); gates and activations that
#: contain another are tried first
RULES = [_make_rule(act, gate) for gate in GATES for act in ACTS]
