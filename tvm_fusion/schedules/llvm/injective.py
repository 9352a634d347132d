"""CPU schedule for the kernels no rule took that only move or map elements (reshape, transpose, channel
shuffle, concat, split, resize, elementwise): `leftover injective PrimFunc  ==>  one loop nest, inner
pixels in vectors`.

TVM's CPU pipeline leaves these unscheduled: FuseTIR's reshape -> transpose -> reshape (ShuffleNet's
channel shuffle) writes every intermediate to its own buffer and each copy runs one scalar element at a
time. This rule (a dlight `ScheduleRule`, run on the fused build's leftovers, `pipeline.legalize_passes`)
inlines the intermediate blocks, fuses the output's trailing loops until they hold whole vectors,
vectorizes them by the target's lanes and, when the kernel is large, runs its outer loop in parallel. A long
output row that is not whole vectors (LONG_ROW_VECTORS; the trailing loops fused up to that length, so an
image plane of 14 x 14 is one row of 196) is split instead: its vectors, then a scalar tail. ShuffleNet's
channel shuffles on 14x14 and 7x7 (Zen 2, one thread): 60 -> 9 us and 29 -> 5 us, the planes fused with
the channels before (every lane's channel, row and column an int64 division).
Several blocks left after inlining, each writing an output no other reads (a concat -> split's halves,
YOLOv8n's detection head: 0.33 -> 0.06 ms, Zen 2, one thread), get a loop nest each. It declines (returns
None) a function with a reduction (a block with an init, also over one element), a symbolic extent, blocks
left that read another's output, or several blocks of which none was inlined (a split alone: TVM's plain
loops, which LLVM vectorizes as whole-plane copies; YOLOv8n's 80 x 80 split ran 0.022 ms so, 0.029 ms
scheduled as rows of 10 vectors).
"""

from __future__ import annotations

import math

from tvm_fusion._tvm import Schedule, called_ops, dlight, tirx
from tvm_fusion.hardware import cpu_facts

from .loop_nest import branches, CpuRule, periods

__all__ = ["LeftoverInjective", "PARALLEL_ELEMENTS", "VECTOR_CALLS", "in_vectors", "schedule_loop_nest", "wraps"]

#: a kernel with fewer output elements runs on one thread (a parallel launch costs more than its copy)
PARALLEL_ELEMENTS = 1 << 16
#: an output row of at least this many vectors that is not whole vectors runs as vectors then a scalar tail
#: (`loop_partition`) rather than fused with the rows before it: fused, every lane's row and column are an
#: int64 division and remainder by the row length (Magika's one-hot, 2048 rows of 257: 0.72 -> 0.14 ms)
LONG_ROW_VECTORS = 4


def _extents(sch, loops) -> list[int] | None:
    values = [sch.get(loop).extent for loop in loops]
    return [int(v) for v in values] if all(isinstance(v, tirx.IntImm) for v in values) else None


#: the calls a row fused up to a long row may make: the math TVM's llvm codegen lowers for vectors (loads,
#: arithmetic, selects, casts and min / max are not calls); any other call (sinh, cosh: "unknown intrinsic" at
#: codegen) keeps the rule from before
VECTOR_CALLS = frozenset({"if_then_else", "likely", "exp", "sigmoid", "tanh", "sqrt", "log", "fabs"})


def _reduces(sch, block) -> bool:
    """Whether the block is a reduction (it has an init). A reduction over one element normalizes to a block
    of spatial iterators only, so `is_injective()` passes it; inlining its consumer into it then puts the
    epilogue into both its init and its update (a 1 x 1 MatMul + Add added the residual twice:
    tests/fuzz/regressions/ee6ed9f1e3)."""
    return sch.get(block).init is not None


def _independent_outputs(sch, blocks) -> bool:
    """Whether every block left writes a buffer no other block reads (each an output of its own, as a
    concat -> split's halves): each then gets its own loop nest."""
    stmts = [sch.get(b.block_rv) for b in blocks]
    return not any(w.source.same_as(r.source) for i, a in enumerate(stmts) for j, b in enumerate(stmts) if i != j
                   for w in a.writes for r in b.reads)


def _long_row_ok(sch, block) -> bool:
    """Whether the block calls only what a vector row may (`VECTOR_CALLS`)."""
    return called_ops(sch.get(block).body) <= VECTOR_CALLS


class LeftoverInjective(CpuRule):
    """Inline, fuse the trailing loops to a multiple of `lanes` elements, vectorize by `lanes`, parallel
    outer loop."""

    def schedule(self, func, target):
        sch = Schedule(func)
        blocks = dlight.normalize_prim_func(sch)
        if blocks is None or any(not b.is_injective() or _reduces(sch, b.block_rv) for b in blocks):
            return None
        before = len(blocks)
        blocks = dlight.try_inline(sch, blocks)
        if not blocks or (len(blocks) > 1 and (len(blocks) == before or not _independent_outputs(sch, blocks))):
            return None  # several outputs and nothing inlined (a split alone): TVM's loops, LLVM's vectors
        lanes = cpu_facts(target).float32_lanes
        for block in blocks:
            if not schedule_loop_nest(sch, block.block_rv, lanes):
                return None
        return sch


def schedule_loop_nest(sch, block, lanes: int) -> bool:
    """One output block's loop nest of spatial loops: trailing loops fused to whole vectors (or a long row:
    its vectors, then a scalar tail), outer loops in parallel when large; False where its extents are not all
    constant (nothing scheduled)."""
    loops = sch.get_loops(block)
    extents = _extents(sch, loops)
    if not loops or extents is None:
        return False
    # fused up to a long row (an image plane) unless the row calls what TVM cannot vectorize (a sinh /
    # cosh row reached its llvm codegen as a vector call it cannot lower: the ONNX backend's test_sinh)
    long_limit = LONG_ROW_VECTORS * lanes if _long_row_ok(sch, block) else None
    if long_limit is None and extents[-1] % lanes and extents[-1] >= LONG_ROW_VECTORS * lanes:
        return _long_rows(sch, block, loops, extents, lanes)
    inner, run = len(loops) - 1, extents[-1]
    while inner > 0 and run % lanes and (long_limit is None or run < long_limit):  # fused: whole vectors
        inner -= 1
        run *= extents[inner]
    if long_limit is not None and run % lanes and run >= long_limit:  # or a long row (a 14 x 14 plane)
        if inner < len(loops) - 1:
            loops = [*loops[:inner], sch.fuse(*loops[inner:])]
            extents = [*extents[:inner], run]
        return _long_rows(sch, block, loops, extents, lanes)
    fused = sch.fuse(*loops[inner:]) if inner < len(loops) - 1 else loops[-1]
    if run % lanes == 0:  # a run that is not whole vectors stays scalar (no predicated tail)
        in_vectors(sch, fused, lanes, wraps(sch, block, fused))
    outer = loops[:inner]
    if outer and math.prod(extents) >= PARALLEL_ELEMENTS:
        sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
    return True


def wraps(sch, block, loop) -> set[int]:
    """Where the block picks a value per element (a concat, a pad: `loop_nest.branches`), the divisors of the
    floordivs / floormods through which it reaches `loop` (`loop_nest.periods`); else none."""
    return {c for c in periods(sch, block, loop) if c > 1} if branches(sch.get(block)) else set()


def in_vectors(sch, loop, lanes: int, divisors: set[int]) -> None:
    """`loop` (whole vectors of `lanes`) split and its inner loop vectorized, no vector spanning a wrap of an
    index the block selects through (`wraps`, a concat read back through a reshape): the width is the
    greatest common divisor of the lanes and those divisors, and where that is one lane the loop is split at
    the smallest and left to LLVM. LLVM's loop vectorizer (AVX-512, 16 lanes) miscompiled a wrapping one:
    a RoPE's halves concatenated per head of 8 and reshaped back to rows of 32 read every lane's cos / sin
    at its row position, not its head position (the ONNX backend's test_rotary_embedding_3d_input_expanded)."""
    width = math.gcd(lanes, *divisors)
    if width == 1:
        sch.split(loop, [None, min(divisors)])
        return
    sch.vectorize(sch.split(loop, [None, width])[1])


def _long_rows(sch, block, loops, extents, lanes):
    """Each output row as whole vectors, then its last `row % lanes` elements one at a time."""
    row = extents[-1]
    divisors = wraps(sch, block, loops[-1])  # before the partition, which makes new blocks
    body, _ = sch.loop_partition(loops[-1], [row - row % lanes, None])
    in_vectors(sch, body, lanes, divisors)
    outer = loops[:-1]
    if outer and math.prod(extents) >= PARALLEL_ELEMENTS:
        sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
    return True
