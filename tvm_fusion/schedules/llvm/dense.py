"""CPU (llvm) schedule for dense + epilogue: out[m, n] = act(sum_k x[m, k] * W[k, n] + b[n]).

W is packed at compile time into column tiles Wp[N / COLS, K, COLS] (`pack_columns`), so the kernel
streams each tile from memory front to back; the output columns of a tile are vectorized, and tiles run
in parallel. At batch 1 this is a GEMV: memory-bound, one pass over W in the order it is stored. A bfloat16
dense of 16 rows or more on a target with AMX tiles runs on them instead (`dense_amx.py`), another bfloat16
dense on a target with AVX512-BF16 on its dot products (`dense_dpbf16.py`).

    parallel for tile t (COLS columns, COLS a divisor of N and a multiple of half a vector of the
                         target, at most 4 vectors: `hardware.cpu_facts`; an N without one, or whose
                         COLS are not whole vectors (1000), is padded to whole tiles of vectors, zero
                         columns the epilogue drops):
        for row block (ROWS rows, registers: ROWS x COLS accumulators):
            acc[ROWS, COLS] = 0
            for k: acc[r, :] += x[m + r, k] * Wp[t, k, :]      # broadcast * vector, Wp loaded once for ROWS rows
            out[rows, tile] = act(acc + b[tile])
"""

from __future__ import annotations

from tvm_fusion._tvm import tirx
from tvm_fusion.hardware import cpu_facts
from tvm_fusion.registry import register_compute, register_schedule
from tvm_fusion.schedules import dims
from tvm_fusion.schedules.dense import DENSE_FAMILY, dense_affine, pack_columns
from tvm_fusion.schedules.llvm import dense_amx as amx
from tvm_fusion.schedules.llvm import dense_dpbf16 as dpbf16
from tvm_fusion.schedules.llvm.blocks import optional_block

ACCUMULATOR_VECTORS = 4  # vector accumulators per column block: enough to hide the FMA latency
#: an N whose column block is not whole vectors (1000 classes: 20 columns for 8 lanes, 40 for 16) is padded to
#: tiles of ACCUMULATOR_VECTORS vectors where that adds at most this fraction of zero columns (1000 -> 1024:
#: 2.4%). Measured on Zen 2 (AVX2, one thread, CPU time), ResNet-50's 2048 -> 1000 Gemm: 0.80 -> 0.23 ms
#: alone with W in cache, 1.07 -> 0.78 ms with the caches flushed before each call, 0.95-0.98 -> 0.47-0.50
#: ms inside the model (onnxruntime's node there: 0.57-0.60 ms); 8 columns (one vector): 0.42 / 0.73 /
#: 0.59-0.61 ms. The same sums in the same order: bit-identical.
MAX_PADDED_FRACTION = 0.05


def column_block(n: int, lanes: int) -> int:
    """The largest divisor of n that is a multiple of half a vector (`lanes` fp32 lanes) and at most
    ACCUMULATOR_VECTORS vectors; 1 if none."""
    min_cols = max(1, lanes // 2)
    for cols in range(min(n, ACCUMULATOR_VECTORS * lanes), 0, -1):
        if n % cols == 0 and cols % min_cols == 0:
            return cols
    return 1


def row_block(m: int, cols: int, facts) -> int:
    """The largest divisor of m whose ROWS x COLS accumulators fit in half the vector registers."""
    vectors = max(1, -(-cols // facts.float32_lanes))
    most = max(1, facts.vector_registers // 2 // vectors)
    return max(r for r in range(1, min(m, most) + 1) if m % r == 0)


def packed_columns(n: int, lanes: int) -> int:
    """The column tile W is packed into: `column_block`; ACCUMULATOR_VECTORS vectors where that block is not
    whole vectors and padding N to such tiles adds at most MAX_PADDED_FRACTION (1000 classes); for an N of at
    least a vector with no vector-sized divisor (PP-OCR's 6625 classes), ACCUMULATOR_VECTORS vectors or the
    vectors N fills when fewer. The last tile is padded with zero columns (`column_block` of the padded N
    gives the tile back); 1: W stays [K, N]."""
    cols = column_block(n, lanes)
    full = ACCUMULATOR_VECTORS * lanes
    if cols % lanes and n >= full and -n % full <= MAX_PADDED_FRACTION * n:
        return full
    if cols > 1 or n < lanes:
        return cols
    return min(full, -(-n // lanes) * lanes)


@register_compute(DENSE_FAMILY, target="llvm")
def dense_llvm(x, w, b, *, activation=None, activation_params=None, fast_math=True, target=None, **attrs):
    """The dense family's compute; a bfloat16 dense of 16 rows or more on a target with AMX tiles: `dense_amx`;
    else one on a target with AVX512-BF16: `dense_dpbf16`."""
    if target is not None and amx.why_not(w.dtype, dims(x.shape)[0], target) is None:
        return amx.dense_amx(x, w, b, activation=activation, activation_params=activation_params, target=target)
    if target is not None and (dpbf16.is_packed(w) or dpbf16.why_not(w.dtype, dims(x.shape)[0], target) is None):
        return dpbf16.dense_dpbf16(x, w, b, activation=activation, activation_params=activation_params,
                                   target=target)
    return dense_affine(x, w, b, activation=activation, activation_params=activation_params, fast_math=fast_math,
                        target=target, **attrs)


def pack_dense(constants, attrs, shapes, target):
    """W [K, N]  ==>  Wp [ceil(N / COLS), K, COLS] (`packed_columns`; None when 1: W stays as it is); for the
    AMX dense (`dense_amx.why_not`), its tiles (`pack_amx_dense`); for AVX512-BF16, pairs of K
    (`pack_dpbf16_dense`)."""
    w, b = constants
    if amx.why_not(w.dtype, shapes[0][0], target) is None:
        return [amx.pack_amx_dense(w), b]
    if dpbf16.why_not(w.dtype, shapes[0][0], target) is None:
        return [dpbf16.pack_dpbf16_dense(w), b]
    cols = packed_columns(w.shape[1], cpu_facts(target).float32_lanes)
    return None if cols <= 1 else [pack_columns(w, cols), b]


@register_schedule(DENSE_FAMILY, target="llvm", pack=pack_dense)
def schedule_dense_llvm(sch, attrs, target):
    if optional_block(sch, amx.AMX_BLOCK) is not None:
        return amx.schedule_amx_dense(sch)
    if optional_block(sch, dpbf16.DOT_BLOCK) is not None:
        return dpbf16.schedule_dpbf16_dense(sch)
    facts = cpu_facts(target)
    dense = sch.get_sblock("dense")
    epi = sch.get_sblock("epilogue")
    i, j, k = sch.get_loops(dense)
    cols = column_block(int(sch.get(j).extent), facts.float32_lanes)
    m = sch.get(i).extent
    rows = row_block(int(m), cols, facts) if isinstance(m, tirx.IntImm) else 1  # a symbolic batch: one row a step
    jo, ji = sch.split(j, [None, cols])
    io, ii = sch.split(i, [None, rows])
    sch.reorder(jo, io, k, ii, ji)
    sch.parallel(jo)
    sch.reverse_compute_at(epi, io)
    if rows > 1:
        sch.unroll(ii)
    if cols > 1:
        lanes = facts.float32_lanes
        if cols > lanes and cols % lanes == 0:  # whole vectors, one after another (48 lanes as one vector of
            jv, ji = sch.split(ji, [None, lanes])  # LLVM's ran 13x slower: FSMN's 100x64 @ 64x96)
            sch.unroll(jv)
        sch.vectorize(ji)
        sch.vectorize(sch.get_loops(epi)[-1])
    sch.decompose_reduction(dense, k)
