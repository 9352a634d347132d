"""CPU (llvm) schedule for dense + epilogue: out[m, n] = act(sum_k x[m, k] * W[k, n] + b[n]).

W is [K, N] (N contiguous), so the output columns are vectorized: parallel over blocks of columns,
each block's accumulators held in registers across the whole K loop, then the epilogue.

    parallel for column block (COLS columns, COLS a divisor of N and a multiple of half a vector of the
                               target, at most 4 vectors: `hardware.cpu_facts`):
        for m:
            acc[COLS] = 0
            for k: acc[:] += x[m, k] * W[k, block]        # broadcast * vector
            out[m, block] = act(acc + b[block])
"""

from __future__ import annotations

from tvm_fusion.hardware import cpu_facts
from tvm_fusion.registry import register_schedule
from tvm_fusion.schedules.dense import DENSE_FAMILY

ACCUMULATOR_VECTORS = 4  # vector accumulators per column block: enough to hide the FMA latency


def column_block(n: int, lanes: int) -> int:
    """The largest divisor of n that is a multiple of half a vector (`lanes` fp32 lanes) and at most
    ACCUMULATOR_VECTORS vectors; 1 if none."""
    min_cols = max(1, lanes // 2)
    for cols in range(min(n, ACCUMULATOR_VECTORS * lanes), 0, -1):
        if n % cols == 0 and cols % min_cols == 0:
            return cols
    return 1


@register_schedule(DENSE_FAMILY, target="llvm")
def schedule_dense_llvm(sch, attrs, target):
    dense = sch.get_sblock("dense")
    epi = sch.get_sblock("epilogue")
    i, j, k = sch.get_loops(dense)
    cols = column_block(int(sch.get(j).extent), cpu_facts(target).float32_lanes)
    jo, ji = sch.split(j, [None, cols])
    sch.reorder(jo, i, k, ji)
    sch.parallel(jo)
    sch.reverse_compute_at(epi, i)
    if cols > 1:
        sch.vectorize(ji)
        sch.vectorize(sch.get_loops(epi)[-1])
    sch.decompose_reduction(dense, k)
