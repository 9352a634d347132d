"""CPU schedule for the softmax / log_softmax no rule took: `legalized softmax(x, axis) PrimFunc  ==>  per
row: max, exp, sum and normalize in vectors, rows in parallel`.

TVM legalizes `R.nn.softmax` into four blocks (max reduce, `exp(x - max)`, sum reduce, `exp / sum`) and
`R.nn.log_softmax` into three (max reduce, sum of `exp(x - max)`, `x - max - log(sum)`), and its CPU pipeline
leaves them unscheduled: one scalar libm `expf` per element, one thread (PP-OCR-rec's softmax over 6625
classes, 40 rows: 1.3 ms against onnxruntime's 0.22 ms on one AVX2 core). This rule (a dlight `ScheduleRule`,
run on the fused build's leftovers, `pipeline.legalize_passes`) recognises that structure (`recognise`: the
blocks, their reductions and expressions, the `axis` TVM records on the last block; a function it does not
recognise is declined, `Softmax.declined` says why) and writes the same math again as a TE compute that
schedules well (`rewrite`):

- the axis is the last one (a row of `n` contiguous elements): the max and the sum as `lanes` partial
  results in one vector (`j*lanes + v` for the whole vectors, the last `n % lanes` elements folded into
  lanes `v < n % lanes`), then reduced across the lanes. A softmax's exps are kept as (whole vectors,
  lanes), each vector added to the partial sums as it is computed (one pass over the row for both), and the
  row is scaled by 1 / sum (a multiply per element: one rounding more than the division, within float32's
  tolerance); the row's last `n % lanes` exps are computed again where they are read (scalar tail). Rows
  run in parallel, each row's steps together (its exp row stays in cache). PP-OCR-rec's 40 x 6625, one AVX2
  core: 0.37 -> 0.21 ms (the exp below 0.37 -> 0.28, the fused pass and the multiply the rest).
- another axis: the reductions run along it for a vector of consecutive elements of the last dim at a time
  (the most lanes, a power of two, that divide it: YOLOv8's box softmax, (1, 16, 4, 2100) over axis 1, runs
  4 of 8 AVX2 lanes), in TVM's order (the same sums, lane by lane); the other dims and the vectors of the
  last one in parallel. A last dim that no vector of MIN_WIDTH lanes divides is declined. (Not a vector of
  the inner dims fused: `compute_at` then covered whole rows of the last one.)

The exp is the kernel's exp (`activations.KernelMath`): where `fast_math_allowed` says the kernel may take
llvm's vectorizable float32 form (its dtypes, as for the fused kernels), that form for arguments <= 0
(`fast_math.fast_exp_nonpositive`: x - max is <= 0, or NaN where a row holds NaN or +inf; -inf gives 0;
results below 2^-126 flush to 0), TVM's `exp` intrinsic otherwise. Rows with NaN, +inf or only -inf give
the NaNs TVM's lowering gives, -inf entries its zeros. The max is exact; the sums of a last-axis softmax are
reassociated (lanes partial sums), so the results differ from TVM's lowering in the last bits (within the
dtype tolerances of `tvm_fusion/check/numerics.py`). Rows shorter than two vectors are declined (nothing to gain).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from tvm_fusion._tvm import Schedule, TensorLoad, te, tirx, tvm
from tvm_fusion.hardware import cpu_facts

from ..activations import MATH, KernelMath, fast_math_allowed
from . import fast_math  # registers llvm's float32 exp too, which KernelMath looks up
from .injective import PARALLEL_ELEMENTS
from .loop_nest import CpuRule

__all__ = ["LeftoverSoftmax", "Softmax", "recognise", "rewrite"]

_SPATIAL, _REDUCE = tirx.IterVar.DataPar, tirx.IterVar.CommReduce
#: a softmax over another axis than the last runs vectors of at least this many of the last dim's elements
MIN_WIDTH = 4


class Softmax(NamedTuple):
    """What `recognise` made of a function: 'softmax' or 'log_softmax' over `axis` of its input, or why not."""

    kind: str | None
    axis: int = -1
    declined: str = ""


def _blocks(func) -> list:
    """The blocks under the root block, in order (nested blocks: none expected)."""
    sch = Schedule(func)
    return [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]


def _store(block, kinds) -> tirx.BufferStore | None:
    ivs = [iv.iter_type for iv in block.iter_vars]
    if ivs != kinds or not isinstance(block.body, tirx.BufferStore):
        return None
    return block.body


def _load(expr, buf) -> bool:
    return isinstance(expr, TensorLoad) and expr.source.same_as(buf)


def _call(expr, name: str) -> bool:
    """expr is a call of TVM's intrinsic `name` (a TIR call: its op's name, `tirx.exp`)."""
    return getattr(getattr(expr, "op", None), "name", "") == f"tirx.{name}" and len(expr.args) == 1


def recognise(func) -> Softmax:
    """softmax / log_softmax as TVM 0.27 legalizes it (see the module docstring), or Softmax(None, declined=why)."""
    if len(func.params) != 2:
        return Softmax(None, declined=f"{len(func.params)} parameters, expected 2 (input, output)")
    x, out = func.params
    static = all(isinstance(n, tirx.IntImm) for n in (*x.shape, *out.shape))
    if not static or [int(n) for n in x.shape] != [int(n) for n in out.shape]:
        return Softmax(None, declined=f"symbolic or different shapes: {list(x.shape)} -> {list(out.shape)}")
    try:
        blocks = _blocks(func)
    except Exception as e:  # noqa: BLE001 (tvm's error types: no root block, not a schedulable function)
        return Softmax(None, declined=f"not a block function: {type(e).__name__}")
    if len(blocks) not in (3, 4):
        return Softmax(None, declined=f"{len(blocks)} blocks, expected 4 (softmax) or 3 (log_softmax)")
    rank = len(x.shape)
    reduce_kinds = [_SPATIAL] * (rank - 1) + [_REDUCE]
    mx = _store(blocks[0], reduce_kinds)
    if mx is None or not isinstance(mx.value, tirx.Max) or not _load(mx.value.b, x):
        return Softmax(None, declined=f"first block is not `m = max(m, x[..])`: {blocks[0].body}")
    axis = blocks[-1].annotations.get("axis")
    axis = int(axis) if axis is not None else -1
    k = blocks[0].iter_vars[-1].var
    if not 0 <= axis < rank or not mx.value.b.indices[axis].same_as(k):
        return Softmax(None, declined=f"the max does not run along the last block's axis {axis}")
    m = mx.buffer
    last = _store(blocks[-1], [_SPATIAL] * rank)
    if last is None or not last.buffer.same_as(out):
        return Softmax(None, declined=f"the last block does not write the output: {blocks[-1].body}")
    if len(blocks) == 4:
        e, s = _store(blocks[1], [_SPATIAL] * rank), _store(blocks[2], reduce_kinds)
        ok = (e is not None and _call(e.value, "exp") and isinstance(e.value.args[0], tirx.Sub)
              and _load(e.value.args[0].a, x) and _load(e.value.args[0].b, m)
              and s is not None and isinstance(s.value, tirx.Add) and _load(s.value.b, e.buffer)
              and isinstance(last.value, tirx.Div) and _load(last.value.a, e.buffer) and _load(last.value.b, s.buffer))
        return Softmax("softmax", axis) if ok else Softmax(None, declined="not exp(x - max) / sum: " + str(last.value))
    s = _store(blocks[1], reduce_kinds)
    v = last.value
    ok = (s is not None and isinstance(s.value, tirx.Add) and _call(s.value.b, "exp")
          and isinstance(s.value.b.args[0], tirx.Sub) and _load(s.value.b.args[0].a, x)
          and _load(s.value.b.args[0].b, m)
          and isinstance(v, tirx.Sub) and isinstance(v.a, tirx.Sub) and _load(v.a.a, x) and _load(v.a.b, m)
          and _call(v.b, "log") and _load(v.b.args[0], s.buffer))
    return Softmax("log_softmax", axis) if ok else Softmax(None, declined="not x - max - log(sum(exp)): " + str(v))


def _last_axis(x, kind: str, lanes: int, exp):
    """Stages of a softmax over the last axis with the reductions as `lanes` partial results; a softmax's
    exp(x - max) as (whole vectors, lanes) so that its sum can run inside its loop."""
    *lead, n = [int(d) for d in x.shape]
    whole, tail = n // lanes, n % lanes
    dtype = x.dtype
    low, zero = tirx.min_value(dtype), tirx.const(0, dtype)

    def partial(name, term, combine):  # term(row, j, v): element j*lanes + v of the row
        j = te.reduce_axis((0, whole), "j")
        return te.compute((*lead, lanes), lambda *i: combine(term(i[:-1], j, i[-1]), axis=j), name=name)

    def across(name, part, term, combine, fill):
        v = te.reduce_axis((0, lanes), "v")

        def lane(*i):
            value = part[(*i, v)]
            if tail:  # element whole*lanes + v of the row, for the lanes v < tail
                folded = tirx.Select(v < tail, term(i, whole, te.min(v, tail - 1)), fill)
                value = te.max(value, folded) if combine is te.max else value + folded
            return combine(value, axis=v)

        return te.compute(tuple(lead), lane, name=name)

    def xs(row, j, v):
        return x[(*row, j * lanes + v)]

    pmax = partial("max_lanes", xs, te.max)
    mx = across("row_max", pmax, xs, te.max, low)

    def shifted_exp(row, j, v):
        return exp(x[(*row, j * lanes + v)] - mx[row])

    if kind == "log_softmax":
        psum = partial("sum_lanes", shifted_exp, te.sum)
        s = across("row_sum", psum, shifted_exp, te.sum, zero)
        return te.compute(x.shape, lambda *i: x[i] - mx[i[:-1]] - te.log(s[i[:-1]]), name="log_softmax")
    e = te.compute((*lead, whole, lanes), lambda *i: shifted_exp(i[:-2], i[-2], i[-1]), name="row_exp")

    psum = partial("sum_lanes", lambda row, j, v: e[(*row, j, v)], te.sum)
    s = across("row_sum", psum, shifted_exp, te.sum, zero)  # the tail's few exps: computed where read
    inv = te.compute(tuple(lead), lambda *i: tirx.const(1, dtype) / s[i], name="row_inverse")

    def normalized(*i):
        row, col = i[:-1], i[-1]
        value = e[(*row, col // lanes, col % lanes)]
        if tail:  # if_then_else, not Select: each side read only where it holds (the row's vectors read e only)
            value = tirx.if_then_else(col < whole * lanes, value, shifted_exp(row, whole, col - whole * lanes))
        return value * inv[row]

    return te.compute(x.shape, normalized, name="softmax")


def _other_axis(x, kind: str, axis: int, exp):
    """Stages of a softmax over a leading axis, in TVM's order (the reductions along `axis`)."""
    shape = [int(d) for d in x.shape]

    def along(i, a):
        return (*i[:axis], a, *i[axis:])

    def dropped(i):
        return (*i[:axis], *i[axis + 1:])

    rest = shape[:axis] + shape[axis + 1:]
    k = te.reduce_axis((0, shape[axis]), "k")
    mx = te.compute(rest, lambda *i: te.max(x[along(i, k)], axis=k), name="row_max")
    if kind == "softmax":
        e = te.compute(x.shape, lambda *i: exp(x[i] - mx[dropped(i)]), name="row_exp")
        k2 = te.reduce_axis((0, shape[axis]), "k")
        s = te.compute(rest, lambda *i: te.sum(e[along(i, k2)], axis=k2), name="row_sum")
        return te.compute(x.shape, lambda *i: e[i] / s[dropped(i)], name="softmax")
    k2 = te.reduce_axis((0, shape[axis]), "k")
    s = te.compute(rest, lambda *i: te.sum(exp(x[along(i, k2)] - mx[i]), axis=k2), name="row_sum")
    return te.compute(x.shape, lambda *i: x[i] - mx[dropped(i)] - te.log(s[dropped(i)]), name="log_softmax")


def _shifted_exp(math_: KernelMath, dtype: str):
    """The exp of x - max (<= 0, or NaN): llvm's float32 form for such arguments where the kernel takes llvm's
    float32 exp (`fast_math.fast_exp_nonpositive`), else the kernel's exp."""
    if math_.fast and MATH.get((math_.target, dtype), {}).get("exp") is fast_math.fast_exp:
        return fast_math.fast_exp_nonpositive
    return math_.exp


def rewrite(func, found: Softmax, target, lanes: int):
    """The function's softmax as a TE compute of the stages the schedule wants (module docstring), its exp the
    target's own where the fast-math policy allows it; the same parameters and attributes."""
    x_buf, out_buf = func.params
    x = te.placeholder(x_buf.shape, x_buf.dtype, name=x_buf.name)
    exp = _shifted_exp(KernelMath.of(fast_math_allowed([x_buf.dtype, out_buf.dtype]), target), str(x_buf.dtype))
    if found.axis == len(x_buf.shape) - 1:
        out = _last_axis(x, found.kind, lanes, exp)
    else:
        out = _other_axis(x, found.kind, found.axis, exp)
    new = te.create_prim_func([x, out]).without_attr("global_symbol")
    for key, value in (func.attrs or {}).items():
        new = new.with_attr(key, value)
    return new


def _vector_row(sch, loop, lanes: int):
    """A loop of whole vectors and a scalar tail."""
    n = int(sch.get(loop).extent)
    if n % lanes:
        loop, _ = sch.loop_partition(loop, [n - n % lanes, None])
    sch.vectorize(sch.split(loop, [None, lanes])[1])


def _schedule_last_axis(sch, kind: str, lanes: int, elements: int):
    out = sch.get_sblock(kind)
    *lead, col = sch.get_loops(out)
    row = sch.fuse(*lead) if len(lead) > 1 else lead[0]
    stages = ["row_inverse", "row_sum", "sum_lanes", "row_exp", "row_max", "max_lanes"]
    for name in stages if kind == "softmax" else ["row_sum", "sum_lanes", "row_max", "max_lanes"]:
        sch.compute_at(sch.get_sblock(name), row)
    block = sch.get_sblock("max_lanes")  # (v, j) -> (j, v): the lanes innermost, one vector of partials
    v, j = sch.get_loops(block)[-2:]
    sch.reorder(j, v)
    sch.vectorize(v)
    block = sch.get_sblock("sum_lanes")
    if kind == "softmax":  # each vector of exps added to the partial sums as it is computed
        j, v = sch.get_loops(sch.get_sblock("row_exp"))[-2:]
        sch.vectorize(v)
        sch.reverse_compute_at(block, j)
        sch.vectorize(sch.get_loops(block)[-1])
    else:
        v, j = sch.get_loops(block)[-2:]
        sch.reorder(j, v)
        sch.vectorize(v)
    _vector_row(sch, col, lanes)
    if int(sch.get(row).extent) > 1 and elements >= PARALLEL_ELEMENTS:
        sch.parallel(row)


def _schedule_other_axis(sch, kind: str, axis: int, width: int, elements: int):
    """Tasks of (the dims but the axis and the last, a vector of `width` of the last): the axis inside."""
    out = sch.get_sblock(kind)
    loops = sch.get_loops(out)
    outer, a, last = loops[:axis] + loops[axis + 1:-1], loops[axis], loops[-1]
    chunk, vector = sch.split(last, [None, width])
    sch.reorder(*outer, chunk, a, vector)
    task = sch.fuse(*outer, chunk) if outer else chunk
    stages = ["row_sum", "row_exp", "row_max"] if kind == "softmax" else ["row_sum", "row_max"]
    for name in stages:
        sch.compute_at(sch.get_sblock(name), task)
    for name in ("row_max", "row_sum"):  # (lane, k) -> (k, lane): the lanes innermost
        block = sch.get_sblock(name)
        lane, k = sch.get_loops(block)[-2:]
        sch.reorder(k, lane)
        sch.vectorize(lane)
    if kind == "softmax":
        sch.vectorize(sch.get_loops(sch.get_sblock("row_exp"))[-1])
    sch.vectorize(vector)
    if int(sch.get(task).extent) > 1 and elements >= PARALLEL_ELEMENTS:
        sch.parallel(task)


class LeftoverSoftmax(CpuRule):
    """softmax / log_softmax: rows in parallel, each row's max, exp, sum and normalize in vectors."""

    def schedule(self, func, target):
        found = recognise(func)
        if found.kind is None:
            return None
        return self.schedule_rows(func, found, target)

    @staticmethod
    def declined(func, target) -> str:
        """Why `apply` returns None for this function ('' when it schedules it)."""
        found = recognise(func)
        return found.declined or _unfit(func, found, target)

    @staticmethod
    def schedule_rows(func, found: Softmax, target):
        if _unfit(func, found, target):
            return None
        shape = [int(d) for d in func.params[0].shape]
        lanes = _lanes(func, target)
        sch = Schedule(rewrite(func, found, target, lanes))
        if found.axis == len(shape) - 1:
            _schedule_last_axis(sch, found.kind, lanes, math.prod(shape))
        else:
            _schedule_other_axis(sch, found.kind, found.axis, _other_axis_width(shape[-1], lanes), math.prod(shape))
        return sch


def _unfit(func, found: Softmax, target) -> str:
    """Why a recognised softmax is left to TVM ('' when it is scheduled here)."""
    shape = [int(d) for d in func.params[0].shape]
    lanes = _lanes(func, target)
    if found.axis == len(shape) - 1:
        if shape[-1] < 2 * lanes:
            return f"rows of {shape[-1]} elements, fewer than two vectors of {lanes}: nothing to gain"
        return ""
    if _other_axis_width(shape[-1], lanes) < MIN_WIDTH:
        return f"a last dim of {shape[-1]}: no vector of {MIN_WIDTH} to {lanes} lanes divides it"
    return ""


def _other_axis_width(last: int, lanes: int) -> int:
    """The vector for a softmax over another axis: the most lanes (a power of two) dividing the last dim."""
    return math.gcd(last, lanes)


def _lanes(func, target) -> int:
    """Elements of the input's dtype in one of the target's vector registers."""
    return cpu_facts(target).lanes(tvm.runtime.DataType(str(func.params[0].dtype)).bits)
