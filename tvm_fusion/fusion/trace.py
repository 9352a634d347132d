"""The partial-match tracer behind `explain`: where a rule did not take an op left to TVM, the longest part
of its pattern that matched just before that op, and what was found where the pattern's next op was expected:

    conv2d_bn_relu: matched conv2d -> batch_norm, then found sigmoid where relu was expected

A pattern is a tree whose root is the chain's last op. For each edge parent(child) of the tree (the child
holding at least one op), wherever `child` matches an operand of an op left to TVM and `parent` does not
match that op, the rule matched `child`'s ops and then found that op where `parent`'s was expected. Each
rule keeps its longest partial match, as onnxscript's MatchResult tracer does. Not near misses: a rule
whose whole pattern matches there (it fired, or its check declined, and `explain` shows the reason), and a
partial match on ops that the rule itself or a rule of equal or higher priority took (those win them
whatever comes next).
The trace runs on the module as imported (BatchNorm not yet rewritten as x * s + t): the patterns take
both forms, and the ops read as the model wrote them.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm_fusion import _tvm
from tvm_fusion._tvm import dpl, relax, tvm
from tvm_fusion.rules import RuleSet

__all__ = ["PartialMatch", "near_misses"]


@dataclass(frozen=True)
class PartialMatch:
    """The longest part of one rule's pattern that matched before an op left to TVM."""

    rule: str
    matched: tuple[str, ...]  # the ops matched, in execution order: ("conv2d", "batch_norm")
    expected: tuple[str, ...]  # the op(s) the pattern wanted next
    found: str  # the op found instead
    onnx_node: str  # the ONNX node of the op found
    priority: int
    to_go: int = 1  # ops of the pattern still missing: the expected one and those after it

    def __str__(self) -> str:
        if self.found in self.expected:
            return (f"{self.rule}: matched {' -> '.join(self.matched)}, then found {self.found} with operands "
                    "the pattern does not take")
        return (f"{self.rule}: matched {' -> '.join(self.matched)}, then found {self.found} where "
                f"{' or '.join(self.expected)} was expected")


def _short(op) -> str:
    return str(op.name).rsplit(".", 1)[-1]


def _inner(p) -> list:
    """The sub-patterns a pattern wraps or chooses between (not a call's operands)."""
    if isinstance(p, (dpl.OrPattern, dpl.AndPattern)):
        return [p.left, p.right]
    if isinstance(p, (dpl.AttrPattern, dpl.DataTypePattern, dpl.ShapePattern, dpl.TypePattern)):
        return [p.pattern]
    return []


def _operands(p) -> list:
    if isinstance(p, dpl.CallPattern):
        return list(p.args or [])
    if isinstance(p, dpl.TupleGetItemPattern):
        return [p.tuple]
    return []


def _top_ops(p, memo: dict | None = None) -> tuple[str, ...]:
    """The ops a pattern can start with at its root ("batch_norm" for item 0 of a batch_norm)."""
    memo = {} if memo is None else memo
    if p not in memo:  # patterns share sub-patterns (commutative ops, chains): a DAG, visited once per node
        if isinstance(p, dpl.CallPattern) and isinstance(p.op, dpl.ExprPattern) and isinstance(p.op.expr, tvm.ir.Op):
            memo[p] = (_short(p.op.expr),)
        elif isinstance(p, dpl.TupleGetItemPattern):
            memo[p] = _top_ops(p.tuple, memo)
        else:
            memo[p] = tuple(dict.fromkeys(op for q in _inner(p) for op in _top_ops(q, memo)))
    return memo[p]


def _edges(p, memo: dict, depth: int = 1, out: list | None = None, seen: set | None = None) -> list[tuple]:
    """(parent, child, ops from the parent to the root) from the root down, where the child holds an op;
    each pattern node once."""
    out, seen = ([] if out is None else out), (set() if seen is None else seen)
    if p in seen:
        return out
    seen.add(p)
    for q in _inner(p):
        _edges(q, memo, depth, out, seen)
    for child in _operands(p):
        if _top_ops(child, memo):
            out.append((p, child, depth))
        _edges(child, memo, depth + 1, out, seen)
    return out


def _op_of(value, var2val: dict) -> str | None:
    """The op a value is a call of (through a tuple item and variable bindings), or None."""
    while isinstance(value, relax.TupleGetItem) or (isinstance(value, relax.Var) and value in var2val):
        value = value.tuple_value if isinstance(value, relax.TupleGetItem) else var2val[value]
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        return _short(value.op)
    return None


def _matched_ops(child, expr, var2val) -> list[str]:
    """The ops `child` matched at `expr`, in execution order (operands before their user)."""
    found = [e for p, e in (child.extract_matched_expr(expr, var2val) or {}).items()  # by op patterns only,
             if isinstance(p, dpl.CallPattern) and isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op)]
    order: list[str] = []
    seen: list = []

    def visit(e):
        e = var2val.get(e, e) if isinstance(e, relax.Var) else e
        if isinstance(e, relax.TupleGetItem):
            return visit(e.tuple_value)
        if not isinstance(e, relax.Call) or not any(e.same_as(f) for f in found) or any(e.same_as(s) for s in seen):
            return  # only through the matched ops: never the whole graph above them
        seen.append(e)
        for a in e.args:
            visit(a)
        order.append(_short(e.op))

    visit(expr)
    return order


def near_misses(mod: tvm.IRModule, groups, rules: RuleSet, names: dict[str, str]) -> list[PartialMatch]:
    """The longest partial match of each rule in `rules` before an op of `mod` (as imported) that no fused
    group took, in priority order. `groups`: the fuse stage's groups (their ONNX nodes are taken);
    `names`: relax var name -> ONNX node (frontend.onnx_node_names)."""
    main = mod["main"]
    var2val = relax.analysis.get_var2val(main)
    taken = {n for g in groups for n in g.onnx_nodes} | {""}  # and "": an op of no ONNX node
    users = [b for block in main.body.blocks for b in block.bindings if isinstance(b.value, relax.Call)
             and _op_of(b.value, var2val) is not None and names.get(_tvm.var_name(b.var), "") not in taken]
    taken_at = {}  # ONNX node -> the priority of the rule that took it
    for g in groups:
        taken_at.update((n, rules[g.rule].priority) for n in g.onnx_nodes)
    best: dict[str, tuple[int, PartialMatch]] = {}
    for r in rules.ordered():
        pattern, memo = r.spec.pattern, {}
        edges = [(parent, child, _top_ops(parent, memo), _top_ops(child, memo), depth)
                 for parent, child, depth in _edges(pattern, memo)]
        for u in users:
            found = _op_of(u.value, var2val)
            if found in _top_ops(pattern, memo) and pattern.match(u.value, var2val):
                continue  # the whole pattern: fired or declined with a reason
            for parent, child, want, child_ops, to_go in edges:
                for a in u.value.args:
                    # a rule at or above this one took the operand: the rule itself (its optional parts are
                    # no miss), or one that wins those ops whatever comes next
                    if (not isinstance(a, relax.Var) or _op_of(a, var2val) not in child_ops
                            or taken_at.get(names.get(_tvm.var_name(a)), -1) >= r.priority):
                        continue
                    if not child.match(a, var2val) or (found in want and parent.match(u.value, var2val)):
                        continue
                    ops = _matched_ops(child, a, var2val)
                    if len(ops) > best.get(r.name, (0, None))[0]:
                        node = names[_tvm.var_name(u.var)]
                        miss = PartialMatch(r.name, tuple(ops), want, found, node, r.priority, to_go)
                        best[r.name] = (len(ops), miss)
    return [m for _, m in best.values()]
