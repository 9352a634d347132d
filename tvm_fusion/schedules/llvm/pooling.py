"""CPU schedule for the 2-D max / average pools no rule took: `legalized pool2d PrimFunc  ==>  per
(batch, channel) plane: the padded plane copied, then output rows as runs of pixels (vectors for stride 1,
unrolled for LLVM's SLP vectorizer otherwise) with the window taps outside the run`.

TVM legalizes MaxPool / AveragePool (NCHW) into a padding copy of the whole input (`pad_temp`, absent
without padding), the window reduction (`pool_max`, or `pool_sum` then the division `pool_avg`) and leaves
them unscheduled on the CPU: the padding is written for the whole tensor before the first window is read,
and each output pixel is a scalar loop over its window. This rule (a dlight `ScheduleRule`, run on the fused
build's leftovers, `pipeline.legalize_passes`) keeps TVM's blocks and each output's reduction order (taps
row by row, as TVM sums them: max and the average's sum are bit-identical to the unfused build) and
reorders them: the padding copy moves inside the (batch, channel) loop (one plane, still in cache when the
windows read it), the planes run in parallel, each output row is split into runs of pixels with the taps
outside the run; stride 1 runs of whole vectors are vectorized (contiguous loads), other runs are
unrolled (a stride-2 vector load is a per-lane gather in TVM's codegen, measured slower than TVM's loop;
unrolled, LLVM's SLP pass packs the copies), and the average's division follows each plane. A stride-1 row
that is not whole vectors (Inception v2's 28 columns) runs its whole vectors, then its last pixels one at a
time (`loop_partition`, sums and division alike); one shorter than a vector (its 14 and 7 columns on
AVX-512) runs as one vector of its width, the padding per plane (a max pool's only up to half a vector: `_run`).
Measured on one AVX2 core (Zen 2), each pool alone (`benchmarks/pooling.py`): the four models' stride-2
pools up to 40% faster than TVM's default (the 112 x 112 max pools tie with warm caches and were 25-45%
faster inside the models, where TVM's whole padded copy goes through memory); Inception v2's stride-1 3 x 3
pools 5-25% (28 columns most, 14 least). Declined, as TVM's loop measured as fast: global pools (one output
pixel per plane) and unpadded pools whose rows run pixel by pixel (AlexNet, ZFNet, VGG-19, SqueezeNet,
DenseNet: 2-20% slower scheduled) keep TVM's loop, only its planes run in parallel when the pool reads at
least PARALLEL_TAPS taps (`PoolMatch.planes_only`): TVM leaves the loop serial, so on two threads SqueezeNet's
three max pools ran on one. `match_pool` / `pool_plan` say why a function is declined.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from tvm_fusion._tvm import (
    SBlockRealize,
    Schedule,
    detect_linear_equation,
    tirx,
)
from tvm_fusion.hardware import cpu_facts
from tvm_fusion.schedules.llvm.loop_nest import CpuRule

__all__ = ["PARALLEL_TAPS", "LeftoverPool", "PoolMatch", "match_pool", "pool_plan"]

#: a pool reading fewer window taps (output pixels x taps) runs on one thread
PARALLEL_TAPS = 1 << 16
_SPATIAL, _REDUCE = tirx.IterVar.DataPar, tirx.IterVar.CommReduce


class PoolMatch(NamedTuple):
    """The blocks of a legalized pool (names; `pad` empty without padding) and its width stride, or why not."""

    reduce: str = ""
    pad: str = ""
    divide: str = ""
    stride: int = 1
    width: int = 0
    run: int = 0  # output pixels computed together (`pool_plan`)
    declined: str = ""
    planes_only: bool = False  # TVM's loop kept, its (batch, channel) planes in parallel (`pool_plan`)


def _blocks(func) -> list:
    """The blocks of the root's loop nests, in order; None if the body is not a root over perfect nests."""
    root = func.body
    if not isinstance(root, SBlockRealize):
        return None
    body = root.block.body
    stmts = body.seq if isinstance(body, tirx.SeqStmt) else [body]
    blocks = []
    for stmt in stmts:
        while isinstance(stmt, tirx.For):
            stmt = stmt.body
        if not isinstance(stmt, SBlockRealize):
            return None
        blocks.append(stmt.block)
    return blocks


def _window_strides(reduce) -> tuple[int, int] | None:
    """(stride, dilation) of the width axis when the reduction reads `src[n, c, h*s + rh*d, w*s + rw*d]`."""
    n, c, h, w, rh, rw = (iv.var for iv in reduce.iter_vars)
    index = reduce.reads[0].region
    if not (index[0].min.same_as(n) and index[1].min.same_as(c)):
        return None
    result = []
    for axis, (out, tap) in zip((2, 3), ((h, rh), (w, rw))):
        coefficients = detect_linear_equation(index[axis].min, [out, tap])
        if len(coefficients) != 3 or not all(isinstance(v, tirx.IntImm) for v in coefficients):
            return None
        s, d, offset = (int(v.value) for v in coefficients)
        if offset != 0 or s < 1 or d < 1:
            return None
        result.append((s, d))
    return result[1]


def match_pool(func) -> PoolMatch:
    """The blocks of TVM's 2-D pool lowering (`[pad] -> max` or `[pad] -> sum -> divide`), or
    PoolMatch(declined=why)."""
    blocks = _blocks(func)
    if blocks is None:
        return PoolMatch(declined="the function body is not a root block over perfect loop nests")
    reduces = [i for i, b in enumerate(blocks) if any(iv.iter_type == _REDUCE for iv in b.iter_vars)]
    if len(reduces) != 1 or not 1 <= len(blocks) <= 3:
        return PoolMatch(declined=f"not one reduction among at most 3 blocks: {[b.name_hint for b in blocks]}")
    i = reduces[0]
    reduce, before, after = blocks[i], blocks[:i], blocks[i + 1:]
    kinds = [iv.iter_type for iv in reduce.iter_vars]
    if kinds != [_SPATIAL] * 4 + [_REDUCE] * 2 or len(reduce.reads) != 1 or reduce.init is None:
        return PoolMatch(declined=f"`{reduce.name_hint}` is not a 4-D output over a 2-D window reading one tensor")
    extents = [iv.dom.extent for iv in reduce.iter_vars]
    if not all(isinstance(e, tirx.IntImm) for e in extents):
        return PoolMatch(declined=f"symbolic extents {extents}")
    store = reduce.body
    combine = isinstance(store, tirx.BufferStore) and type(store.value)
    if combine not in (tirx.Max, tirx.Add) or (combine is tirx.Add) != bool(after):
        return PoolMatch(declined=f"`{reduce.name_hint}` is not `out = max(out, x)` or a sum then a division: {store}")
    strides = _window_strides(reduce)
    if strides is None:
        return PoolMatch(declined=f"the window is not read as x[n, c, h*s + rh*d, w*s + rw*d]: {reduce.reads[0]}")
    if int(extents[2]) * int(extents[3]) == 1:
        return PoolMatch(declined="a global pool (one output pixel per plane): no run of pixels to form")
    if len(before) > 1 or len(after) > 1:  # avg_pool2d -> relu: the sum, its division, then the relu
        return PoolMatch(declined=f"more than one block before or after `{reduce.name_hint}`: "
                                  f"{[b.name_hint for b in blocks]}")
    src = reduce.reads[0].source
    pad = ""
    if before:
        (b,) = before
        if not (b.writes[0].source.same_as(src) and all(iv.iter_type == _SPATIAL for iv in b.iter_vars)):
            return PoolMatch(declined=f"`{b.name_hint}` before the window is not the copy it reads")
        pad = b.name_hint
    divide = ""
    if after:
        (b,) = after
        if not (len(b.reads) == 1 and b.reads[0].source.same_as(reduce.writes[0].source)
                and [iv.iter_type for iv in b.iter_vars] == [_SPATIAL] * 4):
            return PoolMatch(declined=f"`{b.name_hint}` after the sum is not an element-wise map of it")
        divide = b.name_hint
    return PoolMatch(reduce.name_hint, pad, divide, strides[0], int(extents[3]))


def _run(width: int, stride: int, lanes: int, average: bool = True) -> int:
    """Output pixels computed together, the taps outside them: whole vectors (vectorized for stride 1; a
    stride-1 row that is not whole vectors runs its whole vectors, then its last `width % lanes` pixels one at
    a time), a stride-1 row shorter than a vector as one vector of its width (a max pool's only up to half a
    vector), a row of at most two vectors (stride > 1, unrolled), else one (each pixel's taps in turn, as TVM;
    a run of a smaller divisor, 7 of 28, measured slower).

    The short rows, measured on an Intel Xeon (AVX-512, one thread, CPU time, each pool alone,
    `benchmarks/pooling.py`, pixel by pixel -> one vector, bit-identical): Inception v2's 3 x 3 average pools
    576 x 14 x 14 0.094-0.097 -> 0.072-0.080 ms, 1024 x 7 x 7 0.060 -> 0.028, its max pool 1024 x 7 x 7
    0.039 -> 0.027, Inception v1's 832 x 7 x 7 0.030 -> 0.023; built for AVX2 the 7 x 7 average 0.046 ->
    0.029 and max 0.034 -> 0.023. Inception v1's max pool 512 x 14 x 14 (14 of 16 lanes) ran 0.049 -> 0.053
    -0.054, so a max pool's row over half a vector keeps its pixels one at a time."""
    if width >= lanes and (stride == 1 or width % lanes == 0):
        return lanes
    if stride == 1:
        return width if 1 < width <= (lanes if average else lanes // 2) else 1
    return width if width <= 2 * lanes else 1


def pool_plan(func, target) -> PoolMatch:
    """`match_pool` with the run of output pixels this target's vectors give, or why the pool stays as TVM
    lowered it."""
    match = match_pool(func)
    if match.declined:
        return match
    if match.stride == 1 and _dtype(func, match) == "bfloat16":
        return match._replace(declined="a bfloat16 max pool of stride 1 would run as bfloat16 vectors, which TVM's "
                                       "bfloat16 legalization cannot store (BufferStore dtype mismatch): TVM's loop")
    run = _run(match.width, match.stride, cpu_facts(target).float32_lanes, average=bool(match.divide))
    if run == 1 and not match.pad:
        if _taps(func, match) >= PARALLEL_TAPS:
            return match._replace(run=1, planes_only=True)
        return match._replace(declined=f"output rows of {match.width} pixels (stride {match.stride}) run pixel by "
                                       "pixel, there is no padding copy to move and too few taps for threads: "
                                       "TVM's loop measured as fast")
    return match._replace(run=run)


def _dtype(func, match: PoolMatch) -> str:
    """The dtype the pool's window reduction writes."""
    (reduce,) = [b for b in _blocks(func) if b.name_hint == match.reduce]
    return str(reduce.writes[0].source.dtype)


def _taps(func, match: PoolMatch) -> int:
    """Output pixels x window taps of the pool's reduction (its block's iteration domain)."""
    (reduce,) = [b for b in _blocks(func) if b.name_hint == match.reduce]
    return math.prod(int(iv.dom.extent) for iv in reduce.iter_vars)


class LeftoverPool(CpuRule):
    """Padding per plane, planes in parallel, taps outside a run of output pixels (vectorized for stride 1)."""

    def schedule(self, func, target):
        match = pool_plan(func, target)
        if match.declined:
            return None
        sch = Schedule(func)
        lanes = cpu_facts(target).float32_lanes
        reduce = sch.get_sblock(match.reduce)
        n, c, h, w, rh, rw = sch.get_loops(reduce)
        extents = [int(sch.get(loop).extent) for loop in (n, c, h, w, rh, rw)]
        plane = sch.fuse(n, c)
        if math.prod(extents) >= PARALLEL_TAPS:  # before decompose_reduction (parallel checks the dataflow)
            sch.parallel(plane)
        if match.planes_only:
            return sch
        if match.stride == 1 and match.width % lanes and match.run != match.width:
            return _stride_1_rows(sch, match, plane, lanes)
        vector = match.stride == 1
        if match.run > 1:
            wo, wi = sch.split(w, [None, match.run])
            sch.reorder(wo, rh, rw, wi)
            if vector:
                sch.vectorize(wi)  # before decompose_reduction (afterwards: "not compact dataflow")
            else:
                sch.unroll(wi)
        sch.unroll(rw)
        sch.decompose_reduction(reduce, rh)
        if match.divide:
            divide = sch.get_sblock(match.divide)
            sch.reverse_compute_at(divide, plane)
            if vector:
                sch.vectorize(sch.split(sch.get_loops(divide)[-1], [None, match.run])[1])
        if match.pad:
            sch.compute_at(sch.get_sblock(match.pad), plane)
        return sch


def _vectors_then_tail(sch, loop, lanes: int):
    """The loop's whole vectors vectorized, its last `extent % lanes` iterations left scalar; the two loops."""
    extent = int(sch.get(loop).extent)
    body, tail = sch.loop_partition(loop, [extent - extent % lanes, None])
    return sch.split(body, [None, lanes]), tail


def _stride_1_rows(sch, match: PoolMatch, plane, lanes: int):
    """Stride-1 rows that are not whole vectors (Inception v2's 28 / 14 / 7 columns): the padding and the
    division per plane, each row's whole vectors with the taps outside them and its last pixels one at a time
    (`loop_partition`: its blocks hide the row from `compute_at`'s region analysis, so the plane's stages
    move first); rows shorter than one vector run pixel by pixel."""
    if match.divide:
        divide = sch.get_sblock(match.divide)
        sch.reverse_compute_at(divide, plane)
        if match.run > 1:
            (_, wi), _ = _vectors_then_tail(sch, sch.get_loops(divide)[-1], lanes)
            sch.vectorize(wi)
    if match.pad:
        sch.compute_at(sch.get_sblock(match.pad), plane)
    reduce = sch.get_sblock(match.reduce)
    if match.run == 1:
        rh, rw = sch.get_loops(reduce)[-2:]
        sch.unroll(rw)
        sch.decompose_reduction(reduce, rh)
        return sch
    w = sch.get_loops(reduce)[-3]
    var = sch.get(w).loop_var.name  # loop_partition names the parts' blocks `<block>_<var>0`, `..._<var>1`
    (wo, wi), _ = _vectors_then_tail(sch, w, lanes)
    body, tail = (sch.get_sblock(f"{match.reduce}_{var}{i}") for i in (0, 1))
    taps = {body: sch.get_loops(body)[-2:], tail: sch.get_loops(tail)[-2:]}
    sch.reorder(wo, *taps[body], wi)
    sch.vectorize(wi)  # before decompose_reduction (afterwards: "not compact dataflow")
    for block, (rh, rw) in taps.items():
        sch.unroll(rw)
        sch.decompose_reduction(block, rh)
    return sch
