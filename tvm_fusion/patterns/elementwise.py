"""Elementwise / broadcast chains into one kernel:

    relu(add(a, b))                          ==>  add_relu(a, b)          (a skip connection: both are tensors)
    op_k(... op_2(op_1(a, b), c) ...), k>=3  ==>  elementwise_chain_k(...)
    fake_quant(op(a, b)) | op(fake_quant(a), b) ==>  elementwise_chain_2(...)  (a QDQ model's Add bias -> Q -> DQ)

Each op is one of schedules/elementwise.py BINARY (either operand order) or UNARY, or a QuantizeLinear ->
DequantizeLinear pair (one step, `fake_quant`: patterns/qdq.py; the first step too). The other operands of
the chain may be tensors from anywhere (the dependency check of FuseOpsByPattern keeps the graph acyclic)
or constants. An intermediate with a consumer outside the chain declines the match (generic check).
"""

from __future__ import annotations

from tvm_fusion import _tvm, registry
from tvm_fusion._tvm import dpl, relax
from tvm_fusion.patterns.activations import clip_bounds
from tvm_fusion.patterns.priority import priority
from tvm_fusion.patterns.qdq import fake_quant_params, fake_quant_pattern
from tvm_fusion.rules import Decline, Lowering, Match, Spec, batch_shape, decline, rule, symbolic_reason
from tvm_fusion.schedules.elementwise import BINARY, ELEMENTWISE_FAMILY, FAKE_QUANT, UNARY

SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")  # half: computed in float32, rounded once
LONGEST_CHAIN = 6


def _step(prev):
    """One op of the chain applied to `prev` (any operand slot)."""
    alternatives = []
    for op in BINARY:
        alternatives += [dpl.is_op(op)(prev, dpl.wildcard()), dpl.is_op(op)(dpl.wildcard(), prev)]
    for op in UNARY:
        extra = [dpl.wildcard(), dpl.wildcard()] if op == "relax.clip" else []
        alternatives.append(dpl.is_op(op)(prev, *extra))
    alternatives.append(fake_quant_pattern(prev)[0])
    out = alternatives[0]
    for alt in alternatives[1:]:
        out = out | alt
    return out


def _first():
    binary = [dpl.is_op(op)(dpl.wildcard(), dpl.wildcard()) for op in BINARY] + [fake_quant_pattern(dpl.wildcard())[0]]
    out = binary[0]
    for alt in binary[1:]:
        out = out | alt
    return out


def chain(length: int) -> Spec:
    y = _first()
    ann = {"s1": y}
    for i in range(2, length + 1):
        y = _step(y)
        ann[f"s{i}"] = y
    ann["root"] = y
    return Spec(y, ann, lambda m: lower_chain(m, length))


def _resolve(m: Match, expr):
    while isinstance(expr, relax.Var) and expr in m._var2val:  # noqa: SLF001 - Match internals
        expr = m._var2val[expr]  # noqa: SLF001
    return expr


def lower_chain(m: Match, length: int) -> Lowering:
    tensors, consts, steps, calls = [], [], [], []

    def operand(expr) -> tuple[str, int]:
        value = _resolve(m, expr)
        for j, call in enumerate(calls):  # an earlier step's result, used again (e.g. y * f(y))
            if value.same_as(call):
                return ("s", j)
        if _tvm.is_constant(expr):
            consts.append(_tvm.constant_value(expr))
            return ("c", len(consts) - 1)
        for i, t in enumerate(tensors):
            if t.same_as(expr):
                return ("t", i)
        tensors.append(expr)
        return ("t", len(tensors) - 1)

    prev = None
    for i in range(1, length + 1):
        call = m.value(f"s{i}")
        op = str(call.op.name)
        params = clip_bounds(call) if op == "relax.clip" else None
        if op == "relax.dequantize":  # a QuantizeLinear -> DequantizeLinear pair: one step
            quantize = _resolve(m, call.args[0])
            op, params = FAKE_QUANT, fake_quant_params(quantize, call)
            steps.append((op, None, operand(quantize.args[0]), params) if prev is None else (op, 0, None, params))
        elif prev is None:
            steps.append((op, None, (operand(call.args[0]), operand(call.args[1])), params))
        elif op in UNARY:
            steps.append((op, 0, None, params))
        else:
            pos = 0 if _resolve(m, call.args[0]).same_as(prev) else 1
            steps.append((op, pos, operand(call.args[1 - pos]), params))
        prev = call
        calls.append(call)
    # calling convention of the fuse core: compute(first tensor, *constants, *other tensors)
    # step results are referenced as -(step + 1)
    def index(ref):
        kind, i = ref
        if kind == "s":
            return -(i + 1)
        return 1 + i if kind == "c" else (0 if i == 0 else 1 + len(consts) + i - 1)

    def refs(pos, ref):
        if pos is None:  # the first step: both operands of a binary op, the one of a pair
            return index(ref) if isinstance(ref[0], str) else tuple(index(r) for r in ref)
        return None if ref is None else index(ref)

    recipe = tuple((op, pos, refs(pos, ref), params) for op, pos, ref, params in steps)
    compute = m.rule if registry.has_compute(m.rule) else ELEMENTWISE_FAMILY
    return Lowering(compute=compute, inputs=tensors, constants=consts, attrs={"recipe": recipe})


def elementwise_checks(m: Match):
    out = m["root"]
    dtype = m.dtype("root")
    if dtype not in SUPPORTED_DTYPES:
        return decline(f"elementwise chain dtype is {dtype}; the compute supports {', '.join(SUPPORTED_DTYPES)}")
    if batch_shape(out) is None:
        return decline(symbolic_reason("elementwise chain output", out))
    first = m.value("s1")
    if all(_tvm.is_constant(a) for a in first.args):
        return decline("the chain starts from constants only; FoldConstant should have folded it")
    for i in range(1, LONGEST_CHAIN + 1):
        step = m.value(f"s{i}") if f"s{i}" in m else None
        if step is not None and str(step.op.name) == "relax.dequantize":
            got = fake_quant_params(_resolve(m, step.args[0]), step)
            if isinstance(got, Decline):
                return got
    return None


@rule("add_relu", priority=priority("add_relu"), check=elementwise_checks)
def add_relu():
    """relu(add(a, b))  ==>  add_relu(a, b)"""
    add = dpl.is_op("relax.add")(dpl.wildcard(), dpl.wildcard())
    y = dpl.is_op("relax.nn.relu")(add)
    return Spec(y, {"s1": add, "s2": y, "root": y}, lambda m: lower_chain(m, 2))


def _make_chain_rule(length: int):
    def build():
        return chain(length)

    build.__doc__ = f"op_{length}(...op_2(op_1(a, b), c)...)  ==>  elementwise_chain_{length}(...)"
    made = rule(f"elementwise_chain_{length}", priority=priority("elementwise_chain_<n>", length),
                check=elementwise_checks)(build)
    made.source = __file__
    return made


def _two_steps(m: Match) -> Match:
    """elementwise_chain_2's match with its first step named s1, whichever form matched."""
    first = m["s1_op"] if "s1_op" in m else m["s1_fq"]
    return Match(m.rule, {"s1": first, "s2": m["root"], "root": m["root"]}, m._var2val, m.batch_dims)  # noqa: SLF001


@rule("elementwise_chain_2", priority=priority("elementwise_chain_<n>", 2),
      check=lambda m: elementwise_checks(_two_steps(m)))
def elementwise_chain_2():
    """fake_quant(op(a, b)) | op(fake_quant(a), ...)  ==>  elementwise_chain_2(...): two steps, one of them a
    QuantizeLinear -> DequantizeLinear pair (two plain ops stay with TVM's own fusion)"""
    first = _first()
    fq_first, _ = fake_quant_pattern(dpl.wildcard())
    root = fake_quant_pattern(first)[0] | _step(fq_first)
    return Spec(root, {"s1_op": first, "s1_fq": fq_first, "root": root}, lambda m: lower_chain(_two_steps(m), 2))


RULES = [add_relu] + [_make_chain_rule(n) for n in range(LONGEST_CHAIN, 2, -1)] + [elementwise_chain_2]
