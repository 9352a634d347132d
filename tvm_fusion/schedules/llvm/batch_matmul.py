"""CPU (llvm) compute and schedule for the batched matmul (`schedules/batch_matmul.py`):
out[o..., m, n] = act(sum_k A[a..., m, k] * B[b..., k, n] [* c | / c] [+ bias[n]]).

B is a runtime tensor: it cannot be packed at compile time as the dense weights are. The kernel copies a
panel of B (its K rows, COLS columns, zero past N) into a contiguous buffer once per (batch, column tile) and
reuses it for every row tile, so a column tile that is not whole (N = 197 keys) still runs in vectors:

    parallel for (batch, column tile t):                        # COLS = VECTORS x the target's fp32 lanes
        panel[k, :] = B[batch, k, t*COLS : (t+1)*COLS]          # zero past N
        for row tile (ROWS rows; A's rows past M read row M - 1, their results dropped):
            acc[ROWS, COLS] = 0                                 # ROWS x VECTORS vector registers
            for k: acc[r, :] += A[batch, m + r, k] * panel[k, :]   # broadcast x vector
            out[rows, tile] = epilogue(acc)                     # only the rows < M, columns < N

`matmul_plan` (a pure function of the shapes and the target's facts, so compute and schedule agree) picks
ROWS and VECTORS: as many rows as keep ROWS x VECTORS accumulators in half the vector registers, the fewest
padded rows among those; one vector of columns when N fills less than two.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from tvm_fusion._tvm import te, tirx
from tvm_fusion.errors import FusionError
from tvm_fusion.hardware import cpu_facts
from tvm_fusion.precision import accumulator_dtype, cast_to
from tvm_fusion.registry import register_compute, register_schedule
from tvm_fusion.schedules import dims
from tvm_fusion.schedules.batch_matmul import (BATCH_MATMUL_FAMILY, batch_matmul_epilogue, broadcast_index,
                                               out_batch_dims)

__all__ = ["MatmulPlan", "matmul_plan"]

#: vectors of columns per tile where N fills two
VECTORS = 2
#: a kernel with fewer multiply-adds runs on one thread
PARALLEL_MACS = 1 << 18


class MatmulPlan(NamedTuple):
    rows: int  # ROWS: output rows per register tile
    cols: int  # COLS: output columns per tile (whole vectors)
    lanes: int  # fp32 lanes of the target's vectors

    def padded(self, m: int, n: int) -> tuple[int, int]:
        return -(-m // self.rows) * self.rows, -(-n // self.cols) * self.cols


def matmul_plan(m: int, n: int, facts) -> MatmulPlan:
    """ROWS x COLS register tile for an [M, K] x [K, N] product on a CPU with `facts`."""
    lanes = facts.float32_lanes
    vectors = VECTORS if n >= VECTORS * lanes else 1
    most = max(1, facts.vector_registers // 2 // vectors)
    rows = min(range(max(1, most // 2), most + 1), key=lambda r: (-(-m // r) * r - m, -r))  # fewest padded rows
    return MatmulPlan(min(rows, m), vectors * lanes, lanes)


def _facts(target):
    if target is None or target.kind.name != "llvm":
        raise FusionError(f"the llvm batch_matmul compute pads to the target's tile: call it with `target=` an llvm "
                          f"target (got {target})")
    return cpu_facts(target)


@register_compute(BATCH_MATMUL_FAMILY, target="llvm")
def batch_matmul_llvm(a, *rest, has_bias=False, scale=None, scale_op=None, activation=None, activation_params=None,
                      fast_math=True, target=None, **_):
    """The batch_matmul compute over a padded tile grid (`matmul_plan`), B's column tiles as panels."""
    bias, b = (rest[0], rest[1]) if has_bias else (None, rest[0])
    *a_batch, m, k = dims(a.shape)
    *b_batch, _, n = dims(b.shape)
    batch = out_batch_dims(a_batch, b_batch)
    plan = matmul_plan(m, n, _facts(target))
    m_pad, n_pad = plan.padded(m, n)
    cols = plan.cols
    acc = accumulator_dtype(a.dtype)
    zero = tirx.const(0, b.dtype)
    panel = te.compute((*b_batch, n_pad // cols, k, cols),
                       lambda *i: tirx.if_then_else(i[-3] * cols + i[-1] < n, b[(*i[:-3], i[-2], te.min(
                           i[-3] * cols + i[-1], n - 1))], zero), name="panel")
    rk = te.reduce_axis((0, k), name="rk")

    def product(*i):
        *o, row, col = i
        ai, bi = broadcast_index(o, a_batch, batch), broadcast_index(o, b_batch, batch)
        x = a[(*ai, te.min(row, m - 1), rk)]
        return te.sum(cast_to(x, acc) * cast_to(panel[(*bi, col // cols, rk, col % cols)], acc), axis=rk)

    mm = te.compute((*batch, m_pad, n_pad), product, name="matmul")
    return batch_matmul_epilogue(mm, (*batch, m, n), a.dtype, bias, scale=scale, scale_op=scale_op,
                                 activation=activation, activation_params=activation_params, fast_math=fast_math,
                                 target=target)


@register_schedule(BATCH_MATMUL_FAMILY, target="llvm")
def schedule_batch_matmul_llvm(sch, attrs, target):
    mm, epi, panel = (sch.get_sblock(name) for name in ("matmul", "epilogue", "panel"))
    *batch, i, j, k = sch.get_loops(mm)
    m, n = (int(iv.dom.extent) for iv in sch.get(epi).iter_vars[-2:])
    plan = matmul_plan(m, n, cpu_facts(target))
    jo, ji = sch.split(j, [None, plan.cols])
    io, ii = sch.split(i, [None, plan.rows])
    jv, jl = sch.split(ji, [None, plan.lanes])
    sch.reorder(*batch, jo, io, k, ii, jv, jl)
    outer = sch.fuse(*batch, jo) if batch else jo
    macs = _macs(sch, mm)
    if macs is None or macs >= PARALLEL_MACS:
        sch.parallel(outer)
    sch.compute_at(panel, outer)
    sch.vectorize(sch.get_loops(panel)[-1])
    sch.reverse_compute_at(epi, io)
    sch.unroll(ii)
    sch.unroll(jv)
    sch.vectorize(jl)
    sch.vectorize(sch.get_loops(epi)[-1])
    sch.decompose_reduction(mm, k)


def _macs(sch, block) -> int | None:
    extents = [sch.get(loop).extent for loop in sch.get_loops(block)]
    return math.prod(int(e) for e in extents) if all(isinstance(e, tirx.IntImm) for e in extents) else None
