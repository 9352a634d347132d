"""CUDA schedule for the conv2d epilogue compute (`pad` -> `conv` -> `epilogue`, NCHW / OIHW).

Direct convolution, the layout of TVM's classic `conv2d_direct` CUDA schedule on an s_tir schedule:

    blockIdx.x    (n, oc block, oh block, ow block)    one output tile per block; blockIdx.y = group
    vthread.x/y   OC_REG x W_REG accumulators          per thread, strided by the thread count, so the
                                                       shared reads are conflict-free and stores coalesce
    threadIdx.x   (oc, oh, ow) threads
    for rc chunk  input patch + weight tile -> shared  cooperative fetch by all threads; the `pad` stage
                                                       is inlined into the patch load (a predicated load)
      rh, rw, rc  accumulate in registers
    epilogue      bias (+ residual) + activation from the registers, one store per output

Tiles come from the shape (`pick_tiles`): a ~64-pixel spatial tile of whole-ish rows, output channels per
block shrunk until the grid has a block per SM of the target's GPU (`cuda_facts(target).sm_count`), then
the largest rc chunk whose staging fits SHARED_BUDGET_BYTES (within the arch's static shared-memory limit). Extents that do not divide their tile are split with predicates, except inside
grouped convs, where oc tiles and rc chunks divide the group (a tile never straddles two groups).
Depthwise convs (one input channel per group) take a simpler branch: one thread per output, the window
read straight from global memory (the op is memory bound; there is no reuse to stage).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm_fusion.hardware import CudaFacts, cuda_facts
from tvm_fusion.registry import register_compute, register_schedule
from tvm_fusion.schedules import dims
from tvm_fusion.schedules.conv2d import CONV_FAMILY, ConvOperands, conv2d_out_size, conv2d_padded

from .tensor_core import VECTOR, TensorCorePlan, plan, try_tensor_cores

# the launch limits (static shared memory, threads per block) and the SM count come from cuda_facts(target)
SHARED_BUDGET_BYTES = 24 * 1024  # what we aim for, so two blocks fit an SM's carve-out comfortably
TARGET_THREADS = 256  # threads per block we aim for
#: output pixels per block tile (4 x 16, 7 x 7, 4 x 14, ...); the smaller ones only when a patch won't fit
SPATIAL_TILES = (64, 16, 4, 1)
MAX_TILE_W = 16  # widest output-row tile
#: (output channels per thread, threads per block) from the largest tile down, tried in order; the first
#: whose grid has a block per SM wins (small layers trade register reuse for parallelism)
PER_THREAD_OC = ((8, 256), (4, 256), (4, 128), (2, 128), (2, 64), (1, 64))
W_REG = 2  # output columns per thread when the row tile is even
RC_CHUNK = 32  # most input channels staged per shared-memory round
REDUCE_STEPS = 144  # multiply-adds per output per round we aim for: 32 channels of a 1x1, 16 of a 3x3, 2 of a 7x7
DEPTHWISE_THREADS = 256  # threads per block of the depthwise branch
UNROLL_MAX_STEP = 16  # pragma_auto_unroll_max_step: more made nvcc spill the 3x3 kernels (255 registers)
BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}  # element sizes for the shared-memory sums


@dataclass(frozen=True)
class ConvShape:
    n: int
    groups: int
    cpg: int  # input channels per group (the rc extent)
    opg: int  # output channels per group
    oh: int
    ow: int
    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    dtype: str = "float32"

    @property
    def depthwise(self) -> bool:
        return self.cpg == 1 and self.groups > 1


@dataclass(frozen=True)
class ConvTiles:
    oc_reg: int  # output channels per thread (registers)
    oc_threads: int
    h_threads: int  # output rows per block, one per thread
    w_reg: int  # output columns per thread (registers)
    w_threads: int
    rc_chunk: int  # input channels per shared-memory round

    @property
    def threads(self) -> int:
        return self.oc_threads * self.h_threads * self.w_threads

    @property
    def oc_tile(self) -> int:
        return self.oc_reg * self.oc_threads

    @property
    def w_tile(self) -> int:
        return self.w_reg * self.w_threads

    def shared_bytes(self, s: ConvShape) -> int:
        """The input patch and the weight tile of one rc chunk (the region TVM's compaction allocates)."""
        patch_h = (self.h_threads - 1) * s.sh + (s.kh - 1) * s.dh + 1
        patch_w = (self.w_tile - 1) * s.sw + (s.kw - 1) * s.dw + 1
        elems = self.rc_chunk * (patch_h * patch_w + self.oc_tile * s.kh * s.kw)
        return elems * BYTES.get(s.dtype, 4)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _tile(extent: int, limit: int) -> int:
    """A tile of at most `limit` that wastes least: an exact divisor when one is at least half the limit,
    else the even split of `extent` into ceil(extent / limit) tiles (the last one predicated)."""
    limit = max(1, min(limit, extent))
    for t in range(limit, (limit + 1) // 2 - 1, -1):
        if t > 0 and extent % t == 0:
            return t
    return _ceil(extent, _ceil(extent, limit))


def _divisor_at_most(extent: int, limit: int) -> int:
    return max(d for d in range(1, max(1, min(extent, limit)) + 1) if extent % d == 0)


def _pow2_floor(v: int) -> int:
    return 1 << (max(1, v).bit_length() - 1)


def _pow2_ceil(v: int) -> int:
    return 1 << (max(1, v) - 1).bit_length()


def _oc_tiles(s: ConvShape, spatial_threads: int, spatial_blocks: int, min_blocks: int) -> tuple[int, int]:
    """(output channels per thread, threads along output channels): the largest per-thread tile whose
    grid still has `min_blocks` blocks (small layers trade register reuse for parallelism)."""
    oc_reg, oc_threads = 1, 1
    for want_reg, want_threads in PER_THREAD_OC:
        want_threads = max(1, min(want_threads, TARGET_THREADS) // spatial_threads)
        if s.groups > 1:  # a block tile inside one group, so the input patch is that group's channels
            oc_reg = _divisor_at_most(s.opg, want_reg)
            oc_threads = _divisor_at_most(s.opg // oc_reg, want_threads)
        else:  # powers of two; the last tile is predicated
            oc_reg = min(want_reg, _pow2_floor(s.opg))
            oc_threads = min(_pow2_floor(want_threads), _pow2_ceil(_ceil(s.opg, oc_reg)))
        if spatial_blocks * _ceil(s.opg, oc_reg * oc_threads) >= min_blocks:
            break
    return oc_reg, oc_threads


def _rc_chunks(s: ConvShape):
    """Candidate input-channel chunks, largest first; exact divisors for grouped convs, so a chunk never
    reaches into the next group's channels."""
    want = max(1, min(RC_CHUNK, REDUCE_STEPS // (s.kh * s.kw)))
    if s.groups > 1:
        return [d for d in range(min(want, s.cpg), 0, -1) if s.cpg % d == 0]
    return list(dict.fromkeys(_tile(s.cpg, limit) for limit in range(want, 0, -1)))


def _candidates(s: ConvShape, min_blocks: int):
    """Tilings from the preferred one down: smaller rc chunks first, then smaller spatial tiles, then a
    single output channel per block, so only a huge window (or stride) can leave nothing that fits."""
    for spatial in SPATIAL_TILES:
        w_tile = _tile(s.ow, min(MAX_TILE_W, spatial))
        w_reg = W_REG if w_tile % W_REG == 0 and w_tile >= 2 * W_REG else 1
        h_threads = _tile(s.oh, max(1, spatial // w_tile))
        spatial_threads = h_threads * (w_tile // w_reg)
        spatial_blocks = s.n * s.groups * _ceil(s.oh, h_threads) * _ceil(s.ow, w_tile)
        for oc_reg, oc_threads in (_oc_tiles(s, spatial_threads, spatial_blocks, min_blocks), (1, 1)):
            for rc in _rc_chunks(s):
                yield ConvTiles(oc_reg, oc_threads, h_threads, w_reg, w_tile // w_reg, rc)


def pick_tiles(s: ConvShape, gpu: CudaFacts) -> ConvTiles:
    """Tile sizes from the shape and the GPU: the first candidate within the shared-memory budget, else the
    first within the arch's static limit, else the smallest (which `supports` then declines)."""
    candidates = list(_candidates(s, gpu.sm_count))
    for limit in (min(SHARED_BUDGET_BYTES, gpu.shared_static_bytes), gpu.shared_static_bytes):
        for t in candidates:
            if t.shared_bytes(s) <= limit and t.threads <= gpu.max_threads_per_block:
                return t
    return candidates[-1]


def conv_shape(attrs: dict, x_shape, w_shape, dtype: str = "float32") -> ConvShape:
    """The conv's sizes; a symbolic batch counts as 1 (the tiles are sized for the smallest grid, which
    grows with the batch: blockIdx.x takes the symbolic extent)."""
    n, _, h, w = x_shape
    n = n if isinstance(n, int) else 1
    cout, cpg, kh, kw = w_shape
    sh, sw = attrs["strides"]
    pt, pl, pb, pr = attrs["padding"]
    dh, dw = attrs["dilation"]
    groups = attrs["groups"]
    return ConvShape(n, groups, cpg, cout // groups, conv2d_out_size(h, kh, sh, pt, pb, dh),
                     conv2d_out_size(w, kw, sw, pl, pr, dw), kh, kw, sh, sw, dh, dw, dtype)


def supports(attrs: dict, shapes, target) -> str | None:
    """Why the schedule cannot take this conv (the rule then declines and TVM's default path runs it), or
    None. `shapes`: the runtime inputs (x[, residual]) then the constants (W, b)."""
    operands = ConvOperands.of(shapes)
    x_shape, w_shape = operands.x, operands.w
    if len(x_shape) != 4 or len(w_shape) != 4:
        return f"conv2d operands have ranks {len(x_shape)} and {len(w_shape)}; the CUDA schedule takes 4-D NCHW/OIHW"
    s = conv_shape(attrs, x_shape, w_shape)
    if s.oh < 1 or s.ow < 1:
        return f"conv2d output is empty ({s.oh}x{s.ow})"
    if not s.depthwise:
        gpu = cuda_facts(target)
        if s.groups > gpu.max_grid_y:
            return (f"conv2d has {s.groups} groups; the CUDA schedule puts them on blockIdx.y "
                    f"(at most {gpu.max_grid_y})")
        t = pick_tiles(s, gpu)
        if t.shared_bytes(s) > gpu.shared_static_bytes:
            return (f"conv2d tile needs {t.shared_bytes(s)} bytes of shared memory even at its smallest; "
                    f"the limit is {gpu.shared_static_bytes} on {gpu.arch}")
        if t.threads > gpu.max_threads_per_block:
            return f"conv2d tile needs {t.threads} threads per block; the limit is {gpu.max_threads_per_block}"
    return None


def _shape_from_func(sch, attrs) -> ConvShape:
    operands = ConvOperands.of(sch.mod["main"].params[:-1])  # the last param is the output
    x, w = operands.x, operands.w
    return conv_shape(attrs, dims(x.shape), dims(w.shape), str(w.dtype))


def _pad_block(sch):
    try:
        return sch.get_sblock("pad")
    except Exception:  # noqa: BLE001 - no padding stage: the conv reads the input directly
        return None


def _loop_index(sch, block, loop) -> int:
    target = sch.get(loop)
    return next(i for i, lp in enumerate(sch.get_loops(block)) if sch.get(lp).same_as(target))


# ---------------------------------------------------------------- tensor cores: the conv as an implicit GEMM
#     out[o, (n, oh, ow)] = sum_{(c, r, s)} W[o, (c, r, s)] * im2col(pad(x))[(c, r, s), (n, oh, ow)]
# A = W (rows of C*kh*kw contiguous elements, copied with cp.async), B = the input patch gathered through
# shared memory (a 1x1 stride-1 conv's pixels are contiguous: TVM vectorizes those copies into cp.async too).
CONV_ATTRS = ("strides", "padding", "dilation", "groups", "activation", "activation_params",
              "residual_after_activation")


def tensor_core_plan(attrs: dict, x_shape, w_shape, dtype: str, target) -> TensorCorePlan:
    """Tensor cores for the conv, or why not (tensor_core.plan on the implicit GEMM's M, N, K; groups = 1)."""
    s = conv_shape(attrs, x_shape, w_shape, dtype)
    n = x_shape[0]
    pixels = n * s.oh * s.ow if isinstance(n, int) else f"{n} * {s.oh * s.ow}"
    pointwise = (s.kh, s.kw, s.sh, s.sw) == (1, 1, 1, 1) and not any(attrs["padding"])  # contiguous pixels
    tc = plan(s.opg, pixels, s.cpg * s.kh * s.kw, dtype, target, b_kn=True, a_rows="W's rows", b_rows=None,
              b_vector=VECTOR if pointwise else 1)
    if tc.reason is None and s.groups != 1:
        return TensorCorePlan(dtype, f"{s.groups} groups; the implicit GEMM takes one")
    return tc


@register_compute(CONV_FAMILY, target="cuda")
def conv2d_affine_cuda(x, w, b, residual=None, *, fast_math=True, target=None, **attrs):
    """The family's compute (schedules/conv2d.py), its products written W * x where the conv takes tensor
    cores on `target` (the implicit GEMM's A is W); otherwise exactly the generic compute."""
    tc = tensor_core_plan(attrs, dims(x.shape), dims(w.shape), str(x.dtype), target) if target else None
    return conv2d_padded(x, w, b, residual, **{k: attrs[k] for k in CONV_ATTRS if k in attrs}, fast_math=fast_math,
                         target=target, weight_first=tc is not None and tc.reason is None)


@register_schedule(CONV_FAMILY, target="cuda", supports=supports)
def schedule_conv2d_cuda(sch, attrs, target) -> str:
    """Schedule the conv PrimFunc "main" of `sch` in place; returns the engine (tensor cores, or CUDA cores
    and why)."""
    ops = ConvOperands.of(sch.mod["main"].params[:-1])
    tc = tensor_core_plan(attrs, dims(ops.x.shape), dims(ops.w.shape), str(ops.x.dtype), target)
    tc = try_tensor_cores(sch, tc, "conv", target)
    if tc.reason is None:
        return tc.engine
    s = _shape_from_func(sch, attrs)
    if s.depthwise:
        _schedule_depthwise(sch, s)
    else:
        _schedule_direct(sch, s, pick_tiles(s, cuda_facts(target)))
    return tc.engine


def _schedule_direct(sch, s: ConvShape, t: ConvTiles) -> None:
    conv, epi, pad = sch.get_sblock("conv"), sch.get_sblock("epilogue"), _pad_block(sch)
    n, o, h, w, rc, rh, rw = sch.get_loops(conv)
    bo, ov, ot = sch.split(o, [None, t.oc_reg, t.oc_threads])
    bh, ht = sch.split(h, [None, t.h_threads])
    bw, wv, wt = sch.split(w, [None, t.w_reg, t.w_threads])
    rco, rci = sch.split(rc, [None, t.rc_chunk])
    if s.groups > 1:  # the group on its own grid axis keeps `o // opg` provably constant per block
        g, bo = sch.split(bo, [s.groups, None])
        sch.reorder(g, n, bo, bh, bw, ov, wv, ot, ht, wt, rco, rh, rw, rci)
        sch.bind(g, "blockIdx.y")
    else:
        sch.reorder(n, bo, bh, bw, ov, wv, ot, ht, wt, rco, rh, rw, rci)
    bx = sch.fuse(n, bo, bh, bw)
    tx = sch.fuse(ot, ht, wt)
    sch.bind(bx, "blockIdx.x")
    sch.bind(ov, "vthread.x")  # registers strided by the thread count: conflict-free, coalesced
    sch.bind(wv, "vthread.y")
    sch.bind(tx, "threadIdx.x")

    # accumulators in registers; the epilogue reads them right there
    sch.set_scope(conv, 0, "local")
    sch.reverse_compute_at(epi, tx)

    fetch_depth = 1 + _loop_index(sch, conv, rco)
    data_shared = sch.cache_read(conv, 0, "shared")
    weight_shared = sch.cache_read(conv, 1, "shared")
    for block in (data_shared, weight_shared):  # unit loops kept: a one-element fetch still has a loop to split
        sch.compute_at(block, rco, preserve_unit_loops=True)
    if pad is not None:
        sch.compute_inline(pad)
    for block in (data_shared, weight_shared):
        fused = sch.fuse(*sch.get_loops(block)[fetch_depth:])
        _, tf = sch.split(fused, [None, t.threads])
        sch.bind(tf, "threadIdx.x")

    sch.decompose_reduction(conv, rco)
    sch.annotate(tx, "pragma_auto_unroll_max_step", UNROLL_MAX_STEP)
    sch.annotate(tx, "pragma_unroll_explicit", 0)


def _schedule_depthwise(sch, s: ConvShape) -> None:
    conv, epi, pad = sch.get_sblock("conv"), sch.get_sblock("epilogue"), _pad_block(sch)
    if pad is not None:
        sch.compute_inline(pad)
    n, o, h, w, rc, rh, rw = sch.get_loops(conv)
    fused = sch.fuse(n, o, h, w)
    bx, tx = sch.split(fused, [None, DEPTHWISE_THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.set_scope(conv, 0, "local")
    sch.reverse_compute_at(epi, tx)
    sch.decompose_reduction(conv, rc)
    sch.annotate(tx, "pragma_auto_unroll_max_step", UNROLL_MAX_STEP)
    sch.annotate(tx, "pragma_unroll_explicit", 0)
