"""An elementwise / broadcast chain as one TE compute, from a recipe:

    out = step_k( ... step_2(step_1(a, b), c) ... )     each step one unary or binary op (NumPy broadcasting)

`recipe` is a tuple of steps (op, chain_position, operand): `chain_position` is the operand slot the running
value takes (0 or 1; None for the first step, whose operands are both given), `operand` indexes the
inputs (runtime tensors then constants, in call order) or is None for unary ops.
Stages are inlined into the last one by the schedules.
"""

from __future__ import annotations

from tvm_fusion._tvm import topi

from tvm_fusion.registry import register_compute

ELEMENTWISE_FAMILY = "elementwise_chain"
ELEMENTWISE_RULES = (ELEMENTWISE_FAMILY, "add_relu")

BINARY = {
    "relax.add": topi.add,
    "relax.subtract": topi.subtract,
    "relax.multiply": topi.multiply,
    "relax.divide": topi.divide,
    "relax.maximum": topi.maximum,
    "relax.minimum": topi.minimum,
    "relax.power": topi.power,
}
UNARY = {
    "relax.nn.relu": lambda x, p: topi.nn.relu(x),
    "relax.sigmoid": lambda x, p: topi.sigmoid(x),
    "relax.tanh": lambda x, p: topi.tanh(x),
    "relax.exp": lambda x, p: topi.exp(x),
    "relax.erf": lambda x, p: topi.erf(x),
    "relax.sqrt": lambda x, p: topi.sqrt(x),
    "relax.negative": lambda x, p: topi.negative(x),
    "relax.clip": lambda x, p: topi.clip(x, p[0], p[1]),
}


@register_compute(*ELEMENTWISE_RULES)
def elementwise_chain(*tensors, recipe, **_):
    value = None
    for op, chain_pos, operand, params in recipe:
        if op in UNARY:
            arg = tensors[operand] if value is None else value
            value = UNARY[op](arg, params)
            continue
        if value is None:
            a, b = tensors[operand[0]], tensors[operand[1]]
        else:
            other = tensors[operand]
            a, b = (value, other) if chain_pos == 0 else (other, value)
        value = BINARY[op](a, b)
    return value
