"""What the leftover CPU schedules read off one loop nest (a block under the root): its loops, which block
iterators each binds (spatial, reduced), their extents, and how the block indexes its buffers."""

from __future__ import annotations

import math

from tvm_fusion._tvm import TensorLoad, detect_linear_equation, tirx, tvm_ffi

__all__ = ["Nest", "contiguous", "elementwise", "loads"]

_SPATIAL, _REDUCE = tirx.IterVar.DataPar, tirx.IterVar.CommReduce


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
