"""Tensor-core matmul schedule: C[i, j] = sum_k A[i, k] * B[k, j] in float16 / bfloat16 with float32
accumulators on wmma m16n16k16 fragments, then the epilogue (bias, residual, activation, the cast) applied
on the accumulator tile in shared memory, before the one store to global memory.

The schedule is dlight's MatmulTensorization (tvm/s_tir/dlight/gpu/matmul.py) made for our kernels:
bfloat16 as well as float16 (TVM's own wmma generators, `_tvm.wmma_intrinsics`), tiles sized against the
target's opt-in dynamic shared memory (`hardware.cuda_facts`), and on sm_80+ the global -> shared copies
issued as cp.async in a two-stage software pipeline (the next K tile loads while this one multiplies).

    tile (wm, fm, wn, fn, fk)   a block computes (wm * fm * 16) x (wn * fn * 16) outputs in K steps of fk * 16
    warps                       wm x wn per block (threadIdx.y), each fm x fn fragments of 16 x 16
    shared.dyn                  A and B tiles (x2 when pipelined), then the warps' float32 accumulator tiles
                                for the epilogue (in the same space: TILES, tile_shared_bytes)

`plan(...)` says whether a matmul of given sizes and dtype takes tensor cores on a target, and why not;
`schedule_tensor_core(sch, plan)` schedules the function's one reduction block (any einsum dlight's index
analysis normalises to C[S, I, J] += A[S, I, K] * B[S, J, K]: a dense, a 1x1 conv, an implicit-GEMM conv).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

from tvm_fusion import _tvm
from tvm_fusion.hardware import cuda_facts, cuda_sm_version
from tvm_fusion.schedules.cuda.gpu_limits import vector_copy_strides

__all__ = ["TensorCorePlan", "plan", "schedule_tensor_core", "try_tensor_cores", "utilization", "HALF_DTYPES",
           "MIN_SM", "MIN_UTILIZATION", "VECTOR"]

HALF_DTYPES = ("float16", "bfloat16")
MIN_SM = 80  # bfloat16 wmma and cp.async need sm_80; below, float16 wmma exists but we keep CUDA cores
#: the share of a tile's padded M x N x K volume that must be real work: below it the padding's loads and
#: multiplies (and the tile's occupancy) cost more than tensor cores save (a heuristic, not measured on a GPU)
MIN_UTILIZATION = 0.5
FRAGMENT = 16  # wmma m16n16k16
WARP_SIZE = 32
VECTOR = 4  # elements per thread per copy (8 bytes of half)
#: (warps along M, fragments per warp along M, warps along N, fragments per warp along N, K fragments per
#: step), largest first; the first that fits the target's shared memory and fills MIN_UTILIZATION is used
TILES = ((4, 2, 4, 2, 4), (4, 2, 4, 2, 2), (2, 2, 2, 2, 2))
A_PAD, C_PAD = 8, 4  # storage_align offsets (elements) against shared-memory bank conflicts


@dataclass(frozen=True)
class TensorCorePlan:
    """Tensor cores or not for one matmul; `reason` says why not (None: tensor cores)."""

    dtype: str
    reason: str | None
    tile: tuple = ()
    pipelined: bool = False  # cp.async two-stage pipeline (sm_80+)
    b_kn: bool = True  # B tiles kept [K, N] (W[k, n] rows are contiguous over n), else [N, K]
    b_vector: int = VECTOR  # elements per thread per copy of B (1: B is gathered element by element)
    shared_bytes: int = 0  # dynamic shared memory the tile model needs

    @property
    def engine(self) -> str:
        """One line for explain and the manifest."""
        if self.reason:
            return f"CUDA cores ({self.reason})"
        wm, _, wn, _, _ = self.tile
        return (f"tensor cores: wmma m16n16k16 {self.dtype} -> float32, block tile "
                f"{'x'.join(map(str, block_tile(self.tile)))}, {wm * wn} warps, "
                f"{self.shared_bytes // 1024} KB dynamic shared memory"
                + (", cp.async pipeline" if self.pipelined else ""))


def tile_shared_bytes(tile: tuple, dtype_bytes: int, pipelined: bool) -> int:
    """Shared memory of a tile: A and B (padded rows, x2 stages when pipelined), or the float32 accumulator
    tiles of the warps (padded rows) where larger: they live after the K loop, and TVM's
    MergeSharedMemoryAllocations gives them the space of A and B."""
    wm, fm, wn, fn, fk = tile
    k = fk * FRAGMENT
    ab = (wm * fm + wn * fn) * FRAGMENT * (k + A_PAD) * dtype_bytes * (2 if pipelined else 1)
    acc = wm * wn * (fm * FRAGMENT) * (fn * FRAGMENT + C_PAD) * 4
    return max(ab, acc)


def block_tile(tile: tuple) -> tuple[int, int, int]:
    """(M, N, K) extents of one block's tile."""
    wm, fm, wn, fn, fk = tile
    return wm * fm * FRAGMENT, wn * fn * FRAGMENT, fk * FRAGMENT


def utilization(tile: tuple, m: int, n: int, k: int) -> float:
    """The share of the padded M x N x K volume (each extent rounded up to the tile) that is real work."""
    used = 1.0
    for extent, size in zip((m, n, k), block_tile(tile)):
        used *= extent / (-(-extent // size) * size)
    return used


def plan(m, n, k, dtype: str, target, *, b_kn: bool = True, a_rows: str = "x's rows",
         b_rows: str | None = "W's rows", b_vector: int = VECTOR) -> TensorCorePlan:
    """Tensor cores for an M x N x K matmul of `dtype` inputs on `target`, or the reason not. `b_kn`: B is
    contiguous along N in memory (a dense's W[K, N], a conv's pixels); else along K. The shared tiles keep
    the global memory's contiguous axis innermost, so each thread's vector copy (cp.async) reads contiguous
    bytes, which must then be aligned: A's rows of K elements (`a_rows`, the name in the reason) and B's
    rows of N (`b_rows`; None: B is gathered, as a conv's im2col). `b_vector`: elements per copy of B; 1
    where its elements are not contiguous (TVM's cp.async would copy a strided vector as a contiguous one)."""
    if dtype not in HALF_DTYPES:
        return TensorCorePlan(dtype, f"{dtype} inputs; tensor cores take {' or '.join(HALF_DTYPES)}")
    if target.kind.name != "cuda":
        return TensorCorePlan(dtype, f"target {target.kind.name} has no tensor cores")
    sm = cuda_sm_version(target)
    if sm < MIN_SM:
        return TensorCorePlan(dtype, f"arch {target.attrs.get('arch', '?')} is below sm_{MIN_SM} "
                                     "(bfloat16 wmma and cp.async need sm_80)")
    for name, extent in (("M", m), ("N", n), ("K", k)):
        if not isinstance(extent, int):
            return TensorCorePlan(dtype, f"{name} = {extent} is symbolic; the tensor-core tile needs it known")
    facts = cuda_facts(target)
    budget = facts.shared_optin_bytes if facts.known else facts.shared_static_bytes
    fitting = [t for t in TILES if tile_shared_bytes(t, 2, True) <= budget]
    if not fitting:
        return TensorCorePlan(dtype, f"no tensor-core tile fits {budget} B of shared memory")
    tile = next((t for t in fitting if utilization(t, m, n, k) >= MIN_UTILIZATION), None)
    if tile is None:
        best = max(fitting, key=lambda t: utilization(t, m, n, k))
        return TensorCorePlan(dtype, f"M, N, K = {m}, {n}, {k} fill {utilization(best, m, n, k):.0%} of the "
                                     f"fullest tensor-core tile ({'x'.join(map(str, block_tile(best)))}); "
                                     f"the schedule wants {MIN_UTILIZATION:.0%}")
    for name, extent, rows in (("K", k, a_rows), ("N", n, b_rows)):
        if rows is not None and extent % VECTOR:
            return TensorCorePlan(dtype, f"{name} = {extent} is not a multiple of {VECTOR}: the {VECTOR * 2}-byte "
                                         f"copies of {rows} would be misaligned")
    return TensorCorePlan(dtype, None, tile, pipelined=True, shared_bytes=tile_shared_bytes(tile, 2, True),
                          b_kn=b_kn, b_vector=b_vector)


class _Loops(NamedTuple):
    """The tiled matmul's blocks and loops `schedule_tensor_core` stages the copies at."""

    inner: object  # the 16 x 16 x 16 fragment block (the wmma mma)
    outer: object  # the block over fragments (blockize of the fragment loops)
    k0: object  # K steps of fk fragments (the copies to shared memory, the software pipeline)
    k1: object  # the fragments of one K step (the loads to wmma fragments)
    warp: object  # the block's warps (threadIdx.y)


def schedule_tensor_core(sch, tc: TensorCorePlan) -> bool:
    """Schedule the one reduction block of `sch`'s function on tensor cores as `tc` says; False (and `sch`
    left half-scheduled: use a fresh copy) when a tensor intrinsic does not match the block."""
    get_root_block, get_reduction_blocks, get_index_map, inline_producers, inline_consumers = \
        _tvm.dlight_matmul_helpers()
    intrin = _tvm.wmma_intrinsics(tc.dtype, trans_b=not tc.b_kn)
    m, n, k = block_tile(tc.tile)
    reductions = get_reduction_blocks(sch, sch.get_child_blocks(get_root_block(sch)))
    if not reductions or len(reductions) != 1:
        return False
    block = reductions[0]
    if not _normalise_matmul(sch, block, tc.b_kn, get_index_map):
        return False
    sch.pad_einsum(block, [1, m, n, k])
    loops = _tile_blocks_and_warps(sch, block, tc.tile)
    a_frag, b_frag, init, store, acc_shared = _stage_through_memory(sch, loops, tc, inline_producers)
    try:
        _tensorize(sch, intrin, a_frag, b_frag, init, store, loops.inner)
    except Exception:  # noqa: BLE001  (TVM raises TVMError / ScheduleError: the block is not a matmul it takes)
        return False
    inline_consumers(sch, acc_shared)  # the epilogue reads the accumulator tile: applied before the store
    fused = sch.fuse(*sch.get_loops(acc_shared)[-2:])
    _, tx, vec = sch.split(fused, [None, WARP_SIZE, VECTOR])
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(vec)
    if tc.pipelined:  # k0 runs [A copy, B copy, k1 loop]: copies of step k0 + 1 overlap the MMAs of step k0
        sch.annotate(loops.k0, "software_pipeline_stage", [0, 0, 1])
        sch.annotate(loops.k0, "software_pipeline_order", [0, 1, 2])
        sch.annotate(loops.k0, "software_pipeline_async_stages", [0])
    return True


def _normalise_matmul(sch, block, b_kn: bool, get_index_map) -> bool:
    """Rewrite `block` as C[S, I, J] += A[S, I, K] * B[S, J, K] (B[S, K, J] with `b_kn`) over reindexed
    operands; False where dlight's index analysis does not read it as a matmul."""
    a_re, b_re = sch.reindex(block, ("read", 0)), sch.reindex(block, ("read", 1))
    c_re = sch.reindex(block, ("write", 0))
    maps = get_index_map(sch.get(block))
    if maps is None:
        return False
    mm_map, a_map, b_map, c_map = maps
    sch.transform_layout(a_re, ("write", 0), a_map)
    sch.transform_layout(b_re, ("write", 0), b_map)
    if b_kn:  # B[S, J, K] -> B[S, K, J]
        sch.transform_layout(b_re, ("write", 0), lambda s, j, k: (s, k, j))
    sch.transform_layout(c_re, ("read", 0), c_map)
    sch.transform_block_layout(block, mm_map)
    return True


def _tile_blocks_and_warps(sch, block, tile: tuple) -> _Loops:
    """Split the padded matmul into 16 x 16 x 16 fragments, blocks of wm x wn warps (blockIdx.z over S,
    blockIdx.x over the block tiles, threadIdx.y over the warps), each warp fm x fn fragments, K steps of fk."""
    wm, fm, wn, fn, fk = tile
    batch, i, j, k = sch.get_loops(block)
    i, i_in = sch.split(i, [None, FRAGMENT])
    j, j_in = sch.split(j, [None, FRAGMENT])
    k, k_in = sch.split(k, [None, FRAGMENT])
    sch.reorder(i, j, k, i_in, j_in, k_in)
    outer = sch.blockize(i_in)
    i0, i1, i2 = sch.split(i, [None, wm, fm])
    j0, j1, j2 = sch.split(j, [None, wn, fn])
    k0, k1 = sch.split(k, [None, fk])
    sch.reorder(i0, j0, i1, j1, k0, k1, i2, j2)
    sch.bind(batch, "blockIdx.z")
    sch.bind(sch.fuse(i0, j0), "blockIdx.x")
    warp = sch.fuse(i1, j1)
    sch.bind(warp, "threadIdx.y")
    return _Loops(block, outer, k0, k1, warp)


def _copy_to_shared(sch, loops: _Loops, index: int, vector: int, warps: int):
    """Operand `index`'s tile copied to shared memory at each K step, `vector` elements per thread per copy
    over the block's `warps`, rows padded against bank conflicts."""
    copy = sch.cache_read(loops.outer, index, "shared.dyn")
    sch.compute_at(copy, loops.k0)
    fused = sch.fuse(*sch.get_loops(copy)[-2:])
    _, ty, tx, vec = sch.split(fused, [None, warps, WARP_SIZE, vector])
    sch.bind(tx, "threadIdx.x")
    sch.bind(ty, "threadIdx.y")
    sch.vectorize(vec)
    sch.storage_align(copy, 0, axis=-2, factor=16, offset=A_PAD)
    return copy


def _stage_through_memory(sch, loops: _Loops, tc: TensorCorePlan, inline_producers):
    """A and B through shared memory into wmma fragments; the accumulators through a wmma store into a shared
    float32 tile per warp; the reduction's init split off. Returns (A fragment, B fragment, init, store,
    the shared accumulator tile)."""
    wm, _, wn, _, _ = tc.tile
    a_s = _copy_to_shared(sch, loops, 0, VECTOR, wm * wn)
    b_s = _copy_to_shared(sch, loops, 1, tc.b_vector, wm * wn)
    inline_producers(sch, a_s)
    inline_producers(sch, b_s)
    a_frag = sch.cache_read(loops.outer, 0, "wmma.matrix_a")
    b_frag = sch.cache_read(loops.outer, 1, "wmma.matrix_b")
    sch.compute_at(a_frag, loops.k1)
    sch.compute_at(b_frag, loops.k1)
    acc_shared = sch.cache_write(loops.outer, 0, "shared.dyn")
    sch.storage_align(acc_shared, 0, -2, 16, C_PAD)
    store = sch.cache_write(loops.outer, 0, "wmma.accumulator")
    sch.reverse_compute_at(store, loops.warp)
    sch.reverse_compute_at(acc_shared, loops.warp)
    si, sj = sch.get_loops(store)[-2:]
    si0, si1 = sch.split(si, [None, FRAGMENT])
    sj0, sj1 = sch.split(sj, [None, FRAGMENT])
    sch.reorder(si0, sj0, si1, sj1)
    init = sch.get_child_blocks(sch.decompose_reduction(loops.outer, loops.k0))[0]
    return a_frag, b_frag, init, store, acc_shared


def _tensorize(sch, intrin: dict, a_frag, b_frag, init, store, inner) -> None:
    """The fragment loads, the accumulators' init and store and the multiply as wmma intrinsics (TVM raises
    where one does not match)."""
    for frag, name in ((a_frag, "load_a"), (b_frag, "load_b")):
        fi, fj = sch.get_loops(frag)[-2:]
        fi0, fi1 = sch.split(fi, [None, FRAGMENT])
        fj0, fj1 = sch.split(fj, [None, FRAGMENT])
        sch.reorder(fi0, fj0, fi1, fj1)
        sch.unroll(fi0)
        sch.unroll(fj0)
        sch.tensorize(fi1, intrin[name])
    sch.tensorize(sch.get_loops(init)[-2], intrin["init"])
    sch.tensorize(sch.get_loops(store)[-2], intrin["store"])
    sch.tensorize(sch.get_loops(inner)[-3], intrin["compute"])


def try_tensor_cores(sch, tc: TensorCorePlan, what: str, target) -> TensorCorePlan:
    """Schedule `sch` on tensor cores where `tc` says so (a copy is scheduled, and its trace replayed on `sch`
    once every intrinsic matched and every vector copy reads contiguous elements, the condition of a correct
    cp.async); returns `tc`, or `tc` with the reason it was not done (`sch` untouched)."""
    if tc.reason is not None:
        return tc
    trial = _tvm.Schedule(sch.mod)
    if not schedule_tensor_core(trial, tc):
        return replace(tc, reason=f"the wmma intrinsics do not match this {what} block")
    strided = sorted({s for s in vector_copy_strides(trial.mod["main"], target) if s != 1})
    if tc.pipelined and strided:
        return replace(tc, reason=f"a vector copy of this {what} reads elements {strided[0]} apart (cp.async "
                                  "copies contiguous bytes)")
    trial.trace.apply_to_schedule(sch, remove_postproc=False)
    return tc
