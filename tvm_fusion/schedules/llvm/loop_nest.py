"""What the leftover CPU schedules read off one loop nest (a block under the root): its loops, which block
iterators each binds (spatial, reduced), their extents, and how the block indexes its buffers."""

from __future__ import annotations

import math

from tvm_fusion._tvm import Analyzer, TensorLoad, called_ops, detect_linear_equation, dlight, tirx, tvm, tvm_ffi

__all__ = ["Nest", "branches", "contiguous", "CpuRule", "elementwise", "loads", "periods"]

_SPATIAL, _REDUCE = tirx.IterVar.DataPar, tirx.IterVar.CommReduce


class CpuRule(dlight.ScheduleRule):
    """A leftover rule for CPU targets. dlight offers every function to every rule (Relax functions, other
    targets' kernels): `apply` passes over all but an llvm target's PrimFunc, which `schedule` gets (and
    returns its Schedule, or None where the rule does not apply)."""

    def apply(self, func, target, tunable):
        if isinstance(func, tirx.PrimFunc) and target.kind.name == "llvm":
            return self.schedule(func, target)
        return None

    def schedule(self, func, target):
        raise NotImplementedError


class Nest:
    """One block under the root: `loops`, their `kinds` ('S' binds spatial iterators only, 'R' a reduced
    one, 'O' anything else), `extents` (None where symbolic), and the block's iterator bound to each loop
    when the binding is the loop variable itself (`iterator(i)`)."""

    def __init__(self, sch, block):
        self.block = block
        self.stmt = sch.get(block)
        self.loops = sch.get_loops(block)
        realize = sch.get(self.loops[-1]).body if self.loops else None
        self.realize = realize if hasattr(realize, "iter_values") else None
        self.loop_vars = [sch.get(loop).loop_var for loop in self.loops]
        self.kinds = [self._kind(var) for var in self.loop_vars]
        extents = [sch.get(loop).extent for loop in self.loops]
        self.extents = [int(e) if isinstance(e, tirx.IntImm) else None for e in extents]

    def _kind(self, var) -> str:
        if self.realize is None:
            return "O"
        bound = {iv.iter_type for iv, value in zip(self.stmt.iter_vars, self.realize.iter_values)
                 if any(v.same_as(var) for v in tirx.analysis.undefined_vars(value))}
        return "R" if _REDUCE in bound else "S" if bound <= {_SPATIAL} else "O"

    @property
    def opaque(self) -> bool:
        """A block TVM wrote as its own loops (no iterators: TOPI's ir_builder kernels)."""
        return not self.stmt.iter_vars

    @property
    def reduces(self) -> bool:
        return self.stmt.init is not None or "R" in self.kinds

    def lead(self) -> int:
        """The number of spatial loops before the first reduced one (all loops if none)."""
        return self.kinds.index("R") if "R" in self.kinds else len(self.kinds)

    def work(self) -> int | None:
        return math.prod(self.extents) if None not in self.extents else None

    def iterator(self, i: int):
        """The block iterator bound to loop i as the loop variable itself, else None."""
        if self.realize is None:
            return None
        for iv, value in zip(self.stmt.iter_vars, self.realize.iter_values):
            if isinstance(value, tirx.Var) and value.same_as(self.loop_vars[i]):
                return iv.var
        return None

    def innermost_spatial(self) -> int | None:
        """The innermost leading spatial loop with more than one iteration."""
        return next((i for i in reversed(range(self.lead())) if self.extents[i] != 1), None)


def loads(stmt) -> list:
    found: list = []
    tvm_ffi.structural_walk(stmt, (TensorLoad, found.append))
    return found


def contiguous(nest: Nest, var) -> bool:
    """Every access of the block (its loads and its store) indexes `var` in its last dim only, with stride 1,
    or not at all: consecutive values of `var` are consecutive elements."""
    body = nest.stmt.body
    stores: list = []
    tvm_ffi.structural_walk(body, (tirx.BufferStore, stores.append))
    for indices in [list(a.indices) for a in loads(body) + stores]:
        for k, index in enumerate(indices):
            if not any(v.same_as(var) for v in tirx.analysis.undefined_vars(index)):
                continue
            if k != len(indices) - 1:
                return False
            coef = detect_linear_equation(index, [var])
            if len(coef) != 2 or not isinstance(coef[0], tirx.IntImm) or int(coef[0]) != 1:
                return False
    return True


def elementwise(nest: Nest) -> bool:
    """The block reads each input at its own trailing iterators, in order (or a broadcast of them: a constant
    index): a pure map of elements."""
    ivars = [iv.var for iv in nest.stmt.iter_vars]
    for load in loads(nest.stmt.body):
        indices = list(load.indices)
        if len(indices) > len(ivars):
            return False
        tail = ivars[len(ivars) - len(indices):]
        if not all(isinstance(i, tirx.IntImm) or i.same_as(v) for i, v in zip(indices, tail)):
            return False
    return True


def branches(stmt) -> bool:
    """Whether the block picks between values per element (an `if_then_else` or a select: a concat, a pad)."""
    found: list = []
    tvm_ffi.structural_walk(stmt.body, (tirx.Select, found.append))
    return bool(found) or "if_then_else" in called_ops(stmt.body)


def periods(sch, block, loop) -> set[int]:
    """The constant divisors c of every floordiv / floormod through which the block reaches `loop`'s variable:
    in its iterator bindings (a fused loop), and in its indices and conditions, simplified over the
    iterators' ranges, on an iterator bound through that variable (a reshape's row and column). Within c
    consecutive values aligned to c such an index is affine; across them it wraps."""
    var = sch.get(loop).loop_var
    stmt = sch.get(block)
    values = list(getattr(sch.get(sch.get_loops(block)[-1]).body, "iter_values", ()))
    reached = [iv.var for iv, value in zip(stmt.iter_vars, values) if _mentions(value, [var])]
    found: set[int] = set()

    def divisors(expr, wanted) -> None:
        def visit(node):  # the innermost divisions only: an outer one wraps with its inner one's quotient
            if isinstance(node.b, tirx.IntImm) and _mentions(node.a, wanted) and not _divides(node.a, wanted):
                found.add(int(node.b))
        for cls in _DIVISIONS:
            tvm_ffi.structural_walk(expr, (cls, visit))

    for value in values:
        divisors(value, [var])
    if reached:
        analyzer = Analyzer()
        for iv in stmt.iter_vars:
            analyzer.bind(iv.var, iv.dom)
        for expr in _indices_and_conditions(stmt.body):
            divisors(analyzer.simplify(expr), reached)
    return found


def _indices_and_conditions(body) -> list:
    stores: list = []
    calls: list = []
    selects: list = []
    tvm_ffi.structural_walk(body, (tirx.BufferStore, stores.append))
    tvm_ffi.structural_walk(body, (tvm.ir.expr.Call, calls.append))
    tvm_ffi.structural_walk(body, (tirx.Select, selects.append))
    found = [i for access in loads(body) + stores for i in access.indices]
    found += [c.args[0] for c in calls if str(c.op.name).endswith("if_then_else")]
    return found + [s.condition for s in selects]


_DIVISIONS = (tirx.FloorMod, tirx.FloorDiv, tirx.Mod, tirx.Div)


def _divides(expr, variables) -> bool:
    inner: list = []
    for cls in _DIVISIONS:
        tvm_ffi.structural_walk(expr, (cls, inner.append))
    return any(_mentions(node.a, variables) for node in inner)


def _mentions(expr, variables) -> bool:
    return any(v.same_as(w) for v in tirx.analysis.undefined_vars(expr) for w in variables)
