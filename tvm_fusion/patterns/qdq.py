"""QuantizeLinear -> DequantizeLinear pairs on activations (QDQ models), as one fake quantization:

    dequantize(quantize(x, s, z), s', z')  ==>  fake_quant(x)
        q = saturate(round_half_to_even(x / s) + z)          (onnxruntime's MLAS order: a division, not x * (1 / s))
        y = (q - z') * s'

computed in float32 (every intermediate is an integer below 2^24, so exact) by
`schedules/activations.py fake_quant_value`. Three places take a pair: the epilogue activation
`fake_quant` of the conv and dense families (patterns/activations.py, which may hold one other activation
before the quantize: conv -> relu -> Q -> DQ), a step of the elementwise chains (patterns/elementwise.py),
and `fake_quant` below, a pair that stands alone (after a LayerNorm, a softmax, a reshape). The scales and
zero points must be per-tensor constants (a size-1 scale; per-channel activations are declined), the
quantized type an 8- or 16-bit integer, the dequantized one float32.

A DequantizeLinear of a constant weight or bias (per-tensor or per-channel, int8 / uint8 / int32) needs no
rule: TVM's importer emits `dequantize(const, const, const)` and the frontend's FoldConstant folds it to a
float32 constant, float(w - z) * s as onnxruntime computes it, so the conv and dense rules see float weights
(`qdq_test.py` checks that none is left).
"""

from __future__ import annotations

import numpy as np

from tvm_fusion import _tvm
from tvm_fusion._tvm import dpl
from tvm_fusion.patterns.priority import priority
from tvm_fusion.rules import Decline, Lowering, Match, Spec, batch_shape, decline, rule, symbolic_reason
from tvm_fusion.schedules.elementwise import ELEMENTWISE_FAMILY, FAKE_QUANT

__all__ = ["FAKE_QUANT", "QUANTIZED_DTYPES", "fake_quant_notes", "fake_quant_pattern", "fake_quant_params",
           "fake_quant_text"]

#: integer types a fake quantization may go through; float32 holds every value of them (and their sums with a
#: zero point) exactly
QUANTIZED_DTYPES = ("int8", "uint8", "int16", "uint16")


def fake_quant_pattern(x, tag: str = "fq"):
    """(pattern, annotations) of dequantize(quantize(x, s, z), s', z'); the scales and zero points are
    wildcards, so that a pair whose are not constants declines with a reason (`fake_quant_params`)."""
    quantize = dpl.is_op("relax.quantize")(x, dpl.wildcard(), dpl.wildcard())
    dequantize = dpl.is_op("relax.dequantize")(quantize, dpl.wildcard(), dpl.wildcard())
    return dequantize, {f"{tag}_quantize": quantize, f"{tag}_dequantize": dequantize}


def _scalar(expr, what: str):
    """The number of a per-tensor constant (size 1), or a Decline naming what it is instead."""
    if not _tvm.is_constant(expr):
        return Decline(f"{what} is not a constant ({type(expr).__name__}); a fused fake quantization needs constant "
                       "scales and zero points")
    value = _tvm.constant_value(expr)
    if value.size != 1:
        return Decline(f"{what} has shape {tuple(value.shape)} (per-channel); a fused fake quantization takes a "
                       "per-tensor scale and zero point (size 1)")
    return value.reshape(()).item()


def fake_quant_params(quantize, dequantize) -> dict | Decline:
    """The constants of one pair (relax calls quantize, dequantize), as the compute takes them, or a Decline:
    scale, zero_point, qmin, qmax (of the quantized type), dq_scale, dq_zero_point."""
    x_dtype, q_dtype = _tvm.expr_type(quantize.args[0]).dtype, str(quantize.attrs.out_dtype)
    y_dtype = str(dequantize.attrs.out_dtype)
    if str(x_dtype) != "float32" or y_dtype != "float32":
        return Decline(f"fake quantization of {x_dtype} to {y_dtype}; the fused form is float32 -> float32 (a half "
                       "value would be quantized after rounding to its dtype, which the float32 epilogue skips)")
    if q_dtype not in QUANTIZED_DTYPES:
        return Decline(f"quantized type is {q_dtype}; a fused fake quantization takes {', '.join(QUANTIZED_DTYPES)}")
    got = {}
    for key, expr, what in (("scale", quantize.args[1], "the quantize scale"),
                            ("zero_point", quantize.args[2], "the quantize zero point"),
                            ("dq_scale", dequantize.args[1], "the dequantize scale"),
                            ("dq_zero_point", dequantize.args[2], "the dequantize zero point")):
        value = _scalar(expr, what)
        if isinstance(value, Decline):
            return value
        got[key] = value
    info = np.iinfo(q_dtype)
    if not (info.min <= got["zero_point"] <= info.max and info.min <= got["dq_zero_point"] <= info.max):
        return Decline(f"zero points {got['zero_point']}, {got['dq_zero_point']} outside {q_dtype}'s range")
    if not all(np.isfinite([got["scale"], got["dq_scale"]])):
        return Decline(f"scales {got['scale']}, {got['dq_scale']} are not finite")
    return {"scale": float(got["scale"]), "zero_point": int(got["zero_point"]), "qmin": int(info.min),
            "qmax": int(info.max), "dq_scale": float(got["dq_scale"]), "dq_zero_point": int(got["dq_zero_point"])}


def fake_quant_text(params: dict) -> str:
    """`int8 scale 0.0321 zero point -1`: a pair's constants in a line (explain, the tests' messages)."""
    kind = f"{'u' if params['qmin'] == 0 else ''}int{int(np.log2(params['qmax'] - params['qmin'] + 1))}"
    same = (params["scale"], params["zero_point"]) == (params["dq_scale"], params["dq_zero_point"])
    tail = "" if same else f" (dequantized with scale {params['dq_scale']:.4g} zero point {params['dq_zero_point']})"
    return f"{kind} scale {params['scale']:.4g} zero point {params['zero_point']}{tail}"


def fake_quant_notes(attrs: dict) -> list[str]:
    """What a fused group's fake quantizations are (explain prints them under the group): its epilogue's
    (`activation` fake_quant) and each pair step of its elementwise recipe, in order."""
    notes = []
    if attrs.get("activation") == FAKE_QUANT:
        params = attrs.get("activation_params") or {}
        inner = f" after {params['inner']}" if params.get("inner") else ""
        notes.append(f"fake quantization{inner}: {fake_quant_text(params)}")
    for step in attrs.get("recipe") or ():
        if step[0] == FAKE_QUANT:
            notes.append(f"fake quantization: {fake_quant_text(step[3])}")
    return notes


def _match_params(m: Match, tag: str = "fq"):
    return fake_quant_params(m.value(f"{tag}_quantize"), m.value(f"{tag}_dequantize"))


def fake_quant_checks(m: Match):
    params = _match_params(m)
    if isinstance(params, Decline):
        return params
    if batch_shape(m["root"]) is None:
        return decline(symbolic_reason("fake quantization output", m["root"]))
    return None


def lower_fake_quant(m: Match) -> Lowering:
    """One step of the elementwise chain compute: recipe (("fake_quant", None, 0, params),) on the input."""
    params = _match_params(m)
    return Lowering(compute=ELEMENTWISE_FAMILY, inputs=[m.value("fq_quantize").args[0]], constants=[],
                    attrs={"recipe": ((FAKE_QUANT, None, 0, params),)})


@rule("fake_quant", priority=priority("fake_quant"), check=fake_quant_checks)
def fake_quant():
    """dequantize(quantize(x, s, z), s', z')  ==>  fake_quant(x)"""
    pattern, ann = fake_quant_pattern(dpl.wildcard())
    return Spec(pattern, {**ann, "root": pattern}, lower_fake_quant)


RULES = [fake_quant]
