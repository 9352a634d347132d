"""CPU (llvm) schedule for dense + epilogue: out[m, n] = act(sum_k x[m, k] * W[k, n] + b[n]).

W is [K, N] (N contiguous), so the output columns are vectorized: parallel over blocks of columns,
each block's accumulators held in registers across the whole K loop, then the epilogue.

    parallel for column block (COLS columns, COLS a divisor of N and a multiple of a half vector):
        for m:
            acc[COLS] = 0
            for k: acc[:] += x[m, k] * W[k, block]        # broadcast * vector
            out[m, block] = act(acc + b[block])
"""

from __future__ import annotations

from tvm_fusion.registry import register_schedule
from tvm_fusion.schedules.dense import DENSE_RULES

VECTOR = 16  # fp32 lanes of one AVX-512 register
MIN_VECTOR = 8  # a column block must fill at least one AVX2 (8-lane) register
MAX_COLS = 4 * VECTOR  # accumulators per block: 4 zmm, enough to hide the FMA latency


def _column_block(n: int) -> int:
    """The largest divisor of n that is a multiple of MIN_VECTOR and at most MAX_COLS; 1 if none."""
    for cols in range(min(n, MAX_COLS), 0, -1):
        if n % cols == 0 and cols % MIN_VECTOR == 0:
            return cols
    return 1


@register_schedule(*DENSE_RULES, target="llvm")
def schedule_dense_llvm(sch, attrs, target):
    dense = sch.get_sblock("dense")
    epi = sch.get_sblock("epilogue")
    i, j, k = sch.get_loops(dense)
    cols = _column_block(int(sch.get(j).extent))
    jo, ji = sch.split(j, [None, cols])
    sch.reorder(jo, i, k, ji)
    sch.parallel(jo)
    sch.reverse_compute_at(epi, i)
    if cols > 1:
        sch.vectorize(ji)
        sch.vectorize(sch.get_loops(epi)[-1])
    sch.decompose_reduction(dense, k)
