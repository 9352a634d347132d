"""Activation patterns shared by the epilogue families: act(y) in each form TVM's ONNX importer emits.

Each entry builds `(pattern, params)` for a pre-activation pattern `y`; `params(match_exprs)` returns the
constants the compute needs, exactly as matched (LeakyRelu alpha, HardSigmoid alpha/beta, hardswish's
shift and divisor or alpha/beta, the GELU constants), or a Decline when the matched constants do not make
the activation (e.g. a GELU whose erf argument is divided by 1.5). The compute then uses exactly the
matched values, never the canonical ones (`schedules/activations.py CANONICAL`), so a constant that is
near but not equal to the canonical one gives the model's numbers. Constants the compute hard-codes
(clip bounds, GELU's power 3) must equal the canonical value exactly. Names are the keys of
schedules/activations.py ACTIVATIONS.

    relu        relu(y)
    relu6       clip(y, 0, 6)                              (Clip(0, 6); Max/Min pairs are normalised to clip)
    leaky_relu  leakyrelu(y)
    sigmoid     sigmoid(y)
    tanh        tanh(y)
    silu        y * sigmoid(y)                             (either operand order)
    hardsigmoid clip(y * alpha + beta, 0, 1)
    hardswish   y * (clip(y + a, 0, 6) / d)   |   y * hardsigmoid(y)   |   y * clip(y + a, 0, 6) / d
    gelu_erf    gelu(y)   |   y * (erf(y / sqrt2) + 1) * 0.5, the 0.5 also inside or on y
    gelu_tanh   gelu_tanh(y)   |   y * (tanh(sqrt(2/pi) * (y + 0.044715 * y^3)) + 1) * 0.5
    fake_quant  dequantize(quantize(a(y), s, z), s', z')   a: nothing or one of the above (patterns/qdq.py)

`register_activation(name, pattern, compute)` adds one more, from a rules file too: its pattern here and its
TE expression in schedules/activations.py, which every epilogue compute and schedule then takes, so
`conv_epilogue(bn=True, activation=name)` is a rule with a new kernel in one file (patterns/README.md).
"""

from __future__ import annotations

import functools

import numpy as np

from tvm_fusion import _tvm
from tvm_fusion._tvm import dpl
from tvm_fusion.patterns.priority import ACTIVATION_RANK, priority
from tvm_fusion.patterns.qdq import fake_quant_params, fake_quant_pattern
from tvm_fusion.precision import numpy_dtype
from tvm_fusion.registry import refuse_another
from tvm_fusion.rules import Decline, Rule, Spec, clip_bounds, commutative, rule, scalar_constant
from tvm_fusion.schedules import activations as computes
from tvm_fusion.schedules.activations import CANONICAL

__all__ = ["ACTIVATIONS", "BY_RANK", "activation_pattern", "clip_bounds", "epilogue_rule", "epilogue_rules",
           "epilogue_spec", "register_activation", "scalar_constant"]

#: how far a carried constant may be from the canonical one and still name the activation (relative); the
#: compute uses the matched value, so this only decides what the rule is called, never the numbers. A half
#: model's constant is the canonical value rounded to its dtype (sqrt 2 is 1.4140625 in float16): that names
#: it too.
_NAMES_IT = 1e-4


def _op(name, *args):
    return dpl.is_op(name)(*args)


def _carry(name: str, m, constants: dict[str, tuple[str, str]], label: str | None = None):
    """The matched value of each constant {param: (annotation, what)} of activation `name`, to carry
    into the compute, or a Decline when one is not a scalar constant or not near the canonical value."""
    params = {}
    for param, (ann, what) in constants.items():
        got, want = scalar_constant(m[ann]), CANONICAL[name][param]
        rounded = want if got is None else _rounded(want, m[ann])
        if got is None or min(abs(got - want), abs(got - rounded)) > _NAMES_IT * max(1.0, abs(want)):
            return Decline(f"{what} is {got if got is not None else 'not a scalar constant'}; {label or name} needs "
                           f"{want:g}")
        params[param] = got
    return params


def _rounded(value: float, const) -> float:
    """`value` rounded to the dtype of the relax constant `const`."""
    return float(np.asarray(value).astype(numpy_dtype(_tvm.expr_type(const).dtype)))


def _exact(name: str, expr, want: float, what: str):
    """A constant the compute hard-codes: it must be exactly `want`."""
    got = scalar_constant(expr)
    if got != want:
        return Decline(f"{what} is {got if got is not None else 'not a scalar constant'}; {name} needs exactly "
                       f"{want:g}")
    return None


def _no_params(m):
    return {}


def _relu6(y):
    clip = _op("relax.clip", y, dpl.wildcard(), dpl.wildcard())

    def params(m):
        lo, hi = clip_bounds(m.value("act_clip"))
        if (lo, hi) != (0.0, 6.0):
            return Decline(f"clip bounds are ({lo:g}, {hi:g}); relu6 needs (0, 6)")
        return {}

    return clip, {"act_clip": clip}, params


def _leaky(y):
    p = _op("relax.nn.leakyrelu", y)
    return p, {"act_leaky": p}, lambda m: {"alpha": float(m.value("act_leaky").attrs.alpha)}


def _silu(y):
    p = commutative("relax.multiply", y, _op("relax.sigmoid", y))
    return p, {}, _no_params


def _hardsigmoid_of(y, tag: str):
    alpha, beta = dpl.is_const(), dpl.is_const()
    clip = _op("relax.clip", commutative("relax.add", commutative("relax.multiply", y, alpha), beta),
               dpl.wildcard(), dpl.wildcard())
    ann = {f"{tag}_alpha": alpha, f"{tag}_beta": beta, f"{tag}_clip": clip}
    return clip, ann


def _hardsigmoid(y):
    clip, ann = _hardsigmoid_of(y, "hs")

    def params(m):
        lo, hi = clip_bounds(m.value("hs_clip"))
        if (lo, hi) != (0.0, 1.0):
            return Decline(f"clip bounds are ({lo:g}, {hi:g}); hardsigmoid needs (0, 1)")
        a, b = scalar_constant(m["hs_alpha"]), scalar_constant(m["hs_beta"])
        if a is None or b is None:
            return Decline("hardsigmoid alpha/beta are not scalar constants")
        return {"alpha": a, "beta": b}

    return clip, ann, params


def _hardswish(y):
    three, six, six2 = dpl.is_const(), dpl.is_const(), dpl.is_const()
    relu6_y3 = _op("relax.clip", commutative("relax.add", y, three), dpl.wildcard(), dpl.wildcard())
    onnx_form = commutative("relax.multiply", y, _op("relax.divide", relu6_y3, six))
    div_last = _op("relax.divide", commutative("relax.multiply", y, relu6_y3), six2)
    hs, hs_ann = _hardsigmoid_of(y, "hw")
    hs_form = commutative("relax.multiply", y, hs)
    ann = {"hw_three": three, "hw_six": six, "hw_six2": six2, "hw_relu6": relu6_y3, **hs_ann}

    def params(m):
        if "hw_clip" in m:
            lo, hi = clip_bounds(m.value("hw_clip"))
            if (lo, hi) != (0.0, 1.0):
                return Decline(f"clip bounds are ({lo:g}, {hi:g}); hardswish's hardsigmoid needs (0, 1)")
            return _carry("hardswish", m, {"alpha": ("hw_alpha", "hardsigmoid alpha"),
                                           "beta": ("hw_beta", "hardsigmoid beta")})
        lo, hi = clip_bounds(m.value("hw_relu6"))
        if (lo, hi) != (0.0, 6.0):
            return Decline(f"clip bounds are ({lo:g}, {hi:g}); hardswish needs relu6 (0, 6)")
        six = "hw_six" if "hw_six" in m else "hw_six2"
        return _carry("hardswish", m, {"shift": ("hw_three", "the added constant"), "divisor": (six, "the divisor")})

    return onnx_form | div_last | hs_form, ann, params


def _gelu_erf(y):
    op = _op("relax.nn.gelu", y)
    sqrt2, one, half = dpl.is_const(), dpl.is_const(), dpl.is_const()
    erf = _op("relax.erf", _op("relax.divide", y, sqrt2))
    erf_one = commutative("relax.add", erf, one)
    # where the 0.5 goes differs by exporter: (x * (erf + 1)) * 0.5 (TorchScript), x * ((erf + 1) * 0.5)
    # (dynamo), (x * 0.5) * (erf + 1) (Hugging Face's 0.5 * x * (1 + erf(x / sqrt2)))
    decomposed = (commutative("relax.multiply", commutative("relax.multiply", y, erf_one), half)
                  | commutative("relax.multiply", y, commutative("relax.multiply", erf_one, half))
                  | commutative("relax.multiply", commutative("relax.multiply", y, half), erf_one))
    ann = {"ge_sqrt2": sqrt2, "ge_one": one, "ge_half": half, "ge_erf": erf}

    def params(m):
        if "ge_erf" not in m:
            return {}
        return _carry("gelu_erf", m, {"divisor": ("ge_sqrt2", "the erf argument's divisor"),
                                      "one": ("ge_one", "the added constant"),
                                      "half": ("ge_half", "the final factor")}, label="gelu")

    return op | decomposed, ann, params


def _gelu_tanh(y):
    op = _op("relax.nn.gelu_tanh", y)
    c3, k, c, one, half = (dpl.is_const() for _ in range(5))
    cube = _op("relax.power", y, c3)
    poly = commutative("relax.add", y, commutative("relax.multiply", cube, k))
    th = _op("relax.tanh", commutative("relax.multiply", poly, c))
    inner = commutative("relax.multiply", y, commutative("relax.add", th, one))
    decomposed = commutative("relax.multiply", inner, half)
    ann = {"gt_c3": c3, "gt_k": k, "gt_c": c, "gt_one": one, "gt_half": half, "gt_tanh": th}

    def params(m):
        if "gt_tanh" not in m:
            return {}
        return _exact("gelu_tanh", m["gt_c3"], 3.0, "the power") or _carry("gelu_tanh", m, {
            "k": ("gt_k", "the cubic coefficient"), "c": ("gt_c", "the tanh argument's factor"),
            "one": ("gt_one", "the added constant"), "half": ("gt_half", "the final factor")})

    return op | decomposed, ann, params


def _single(op_name):
    def build(y):
        return _op(op_name, y), {}, _no_params

    return build


def _fake_quant(y):
    """A QuantizeLinear -> DequantizeLinear pair on y, or on one other activation of y (conv -> relu -> Q -> DQ,
    as a symmetric quantizer leaves it; onnxruntime's asymmetric one drops the relu): the params are the
    pair's constants (patterns/qdq.py) and, with an activation before it, `inner` and `inner_params`."""
    inner = {"": y}
    ann, inner_params = {}, {}
    for name in BY_RANK:  # every other activation of the table, those that contain another first
        if name != "fake_quant":
            inner[name], act_ann, inner_params[name] = ACTIVATIONS[name](y)
            ann.update(act_ann, **{f"fq_inner_{name}": inner[name]})
    alternatives = list(inner.values())
    before = alternatives[0]
    for alt in alternatives[1:]:
        before = before | alt
    pattern, fq_ann = fake_quant_pattern(before)
    ann.update(fq_ann)

    def params(m):
        got = fake_quant_params(m.value("fq_quantize"), m.value("fq_dequantize"))
        name = next((n for n in inner_params if f"fq_inner_{n}" in m), None)
        if isinstance(got, Decline) or name is None:
            return got
        carried = inner_params[name](m)
        return carried if isinstance(carried, Decline) else {**got, "inner": name, "inner_params": carried}

    return pattern, ann, params


#: name -> builder(y) -> (pattern, annotations, params(exprs) -> dict | Decline)
ACTIVATIONS = {
    "relu": _single("relax.nn.relu"),
    "relu6": _relu6,
    "leaky_relu": _leaky,
    "sigmoid": _single("relax.sigmoid"),
    "tanh": _single("relax.tanh"),
    "silu": _silu,
    "hardsigmoid": _hardsigmoid,
    "hardswish": _hardswish,
    "gelu_erf": _gelu_erf,
    "gelu_tanh": _gelu_tanh,
    "fake_quant": _fake_quant,
}


def register_activation(name: str, pattern, compute) -> None:
    """A new epilogue activation for every epilogue family: `pattern(y) -> (pattern, annotations, params)`
    like the builders of ACTIVATIONS (params(match) -> the constants the compute needs, or a Decline when the
    matched constants do not make the activation), and `compute(v, params, math) -> TE scalar`
    (schedules/activations.py `register_activation`). A name taken by another definition is refused."""
    refuse_another(ACTIVATIONS.get(name), pattern, f"duplicate activation {name!r}: the epilogue patterns "
                                                   "already have one by that name")
    computes.register_activation(name, compute)
    ACTIVATIONS[name] = pattern


def activation_pattern(name: str, y):
    """(pattern, annotations, params) of activation `name` applied to pattern `y`."""
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; known: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name](y)


def epilogue_spec(y, annotations: dict, activation: str | None, lower) -> Spec:
    """`y` followed by `activation` as a Spec: the activation's constants are checked (a Decline when they
    do not make the activation) and handed to `lower(match, activation, params)`."""
    act_params = None
    if activation is not None:
        annotations["pre_activation"] = y
        y, act_ann, act_params = activation_pattern(activation, y)
        annotations.update(act_ann, activation=y)
    annotations["root"] = y

    def check(m):
        if activation is not None and m.shape("root") != m.shape("pre_activation"):
            return Decline(f"{activation}'s constants broadcast its output to shape {m.shape('root')}; expected "
                           f"its input's shape {m.shape('pre_activation')}")
        result = act_params(m) if act_params else {}
        return result if isinstance(result, Decline) else None

    def lower_match(m):
        return lower(m, activation, act_params(m) if act_params else {})

    return Spec(y, annotations, lower_match, check)


#: the activations in the order each activated tier registers them: highest ACTIVATION_RANK first
BY_RANK = sorted(ACTIVATIONS, key=lambda a: -ACTIVATION_RANK[a])


def epilogue_rule(prefix: str, activation: str | None, formula: str, make_spec, check, source: str) -> Rule:
    """One member of an epilogue family (conv, dense): `<prefix>_<activation>`, or `<prefix>` without an
    activation, or `prefix` with {act} filled in where it names the place (conv2d_{act}_add), at its
    priority from patterns/priority.py (tier `<prefix>_<act>`, `<prefix>`, or conv2d_<act>_add). Its first
    docstring line is `formula` with {act} and {name} filled in (" -> {act}" dropped without an
    activation); its pattern is `make_spec(activation=activation)`."""
    if "{act}" in prefix:  # the activation inside the name: conv2d_bn_{act}_add
        name, tier = prefix.format(act=activation), prefix.replace("{act}", "<act>")
    else:
        name, tier = (f"{prefix}_{activation}", f"{prefix}_<act>") if activation else (prefix, prefix)

    def build():
        return make_spec(activation=activation)

    if activation is None:
        formula = formula.replace(" -> {act}", "")
    build.__doc__ = formula.format(act=activation, name=name)
    made = rule(name, priority=priority(tier, activation), check=check)(build)
    made.source = source
    return made


def epilogue_rules(structures: dict, members, make_spec, check, source: str) -> list[Rule]:
    """An epilogue family's table: for each (structure, activation) of `members`, in that order,
    `epilogue_rule` with the structure's (name prefix, pattern options, formula) from `structures` and the
    pattern `make_spec(**options, activation=activation)`."""
    rules = []
    for structure, activation in members:
        prefix, options, formula = structures[structure]
        rules.append(epilogue_rule(prefix, activation, formula, functools.partial(make_spec, **options), check,
                                   source))
    return rules
