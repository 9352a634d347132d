"""An elementwise / broadcast chain as one TE compute, from a recipe:

    out = step_k( ... step_2(step_1(a, b), c) ... )     each step one unary or binary op (NumPy broadcasting)

`recipe` is a tuple of steps (op, chain_position, operand, params): `chain_position` is the operand slot the
running value takes (0 or 1; None for the first step, whose operands are both given), `operand` indexes the
compute's arguments (>= 0), or an earlier step's result as -(step + 1), or is None for unary ops after the
first step. A step is one relax op (BINARY, UNARY) or a pair of them (COMPOSITE: a QuantizeLinear ->
DequantizeLinear pair, `fake_quant`, float32 only).
Stages are inlined into the last one by the schedules. Half tensors are widened to float32 first and the
result is rounded once (tvm_fusion.precision).
"""

from __future__ import annotations

from tvm_fusion._tvm import te, topi

from tvm_fusion.precision import HALF_DTYPES, accumulator_dtype
from tvm_fusion.registry import register_compute
from tvm_fusion.schedules.activations import KernelMath, fake_quant_value

ELEMENTWISE_FAMILY = "elementwise_chain"
FAKE_QUANT = "fake_quant"  # the step of a QuantizeLinear -> DequantizeLinear pair (patterns/qdq.py)  # the compute every elementwise rule without a compute of its own lowers to

BINARY = {
    "relax.add": topi.add,
    "relax.subtract": topi.subtract,
    "relax.multiply": topi.multiply,
    "relax.divide": topi.divide,
    "relax.maximum": topi.maximum,
    "relax.minimum": topi.minimum,
    "relax.power": topi.power,
}


def inline_into_last(sch):
    """Inline every stage into the output stage; return the output block (the CPU and CUDA schedules of a
    chain both start so)."""
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    for block in blocks[:-1]:
        sch.compute_inline(block)
    return blocks[-1]


def _math(name: str):
    """name(x) element by element as the kernel's `KernelMath` computes it (llvm's vectorizable float32 exp /
    sigmoid / erf / tanh where the kernel may take them, else TVM's intrinsic); named and tagged as topi's."""
    return lambda x, p, math: te.compute(x.shape, lambda *i: getattr(math, name)(x(*i)), name="compute",
                                         tag="elemwise")


#: op -> fn(x, params, math): math is the kernel's KernelMath
UNARY = {
    "relax.nn.relu": lambda x, p, math: topi.nn.relu(x),
    "relax.sigmoid": _math("sigmoid"),
    "relax.tanh": _math("tanh"),
    "relax.exp": _math("exp"),
    "relax.erf": _math("erf"),
    "relax.sqrt": lambda x, p, math: topi.sqrt(x),
    "relax.negative": lambda x, p, math: topi.negative(x),
    "relax.clip": lambda x, p, math: topi.clip(x, p[0], p[1]),
}
#: steps made of more than one relax op: name -> fn(x, params, math)
COMPOSITE = {
    FAKE_QUANT: lambda x, p, math: te.compute(x.shape, lambda *i: fake_quant_value(x(*i), p, math), name="fake_quant",
                                              tag="elemwise"),
}


@register_compute(ELEMENTWISE_FAMILY)
def elementwise_chain(*tensors, recipe, fast_math=True, target=None, **_):
    math = KernelMath.of(fast_math, target)
    half = next((str(t.dtype) for t in tensors if str(t.dtype) in HALF_DTYPES), None)
    if half is not None:
        tensors = [topi.cast(t, accumulator_dtype(half)) if str(t.dtype) == half else t for t in tensors]
    steps = []

    def arg(ref):
        return steps[-ref - 1] if ref < 0 else tensors[ref]

    for op, chain_pos, operand, params in recipe:
        value = steps[-1] if steps else None
        if op in UNARY or op in COMPOSITE:
            fn = UNARY.get(op) or COMPOSITE[op]
            steps.append(fn(arg(operand) if value is None else value, params, math))
            continue
        if value is None:
            a, b = arg(operand[0]), arg(operand[1])
        else:
            a, b = (value, arg(operand)) if chain_pos == 0 else (arg(operand), value)
        steps.append(BINARY[op](a, b))
    return steps[-1] if half is None else topi.cast(steps[-1], half)
