"""llvm conv2d on AVX512-BF16 dot products: bfloat16 x and W (`--precision bf16`), float32 sums, on an x86
target with `avx512bf16` and no AMX tiles (`CpuFacts.avx512_bf16`: Zen 4 and later, Cooper Lake; where the
target has AMX the tiles take the conv, `conv2d_amx`).

One instruction (`vdpbf16ps`) adds to 16 float32 lanes the products of 16 pairs of bfloat16 with 16 others:
32 multiply-adds where a float32 FMA does 16. The conv is an implicit GEMM over the output pixels as vector
lanes, in three stages of one PrimFunc:

    pack: x in phase planes of channel pairs (`pair_planes`): 16 pixels of a channel pair are one vector
    dpbf16: parallel over (image, 32 output channels, rows of the output):
        for a block of `DotTile.pixels` pixels of the rows, for each `oc` output channels of the 32:
            acc[oc x vectors] = 0
            for tap, channel pair k:  acc[o, v] += pack[k, the tap's run + 16 v : +16] . W[tap, k, o] (broadcast)
            store acc to the task's float32 sums
        epilogue from the sums (`pair_planes.epilogue_macro`): act(sum + b (+ residual)), rounded once

W is packed at compile time [O' / 32, KH, KW, C' / 2, 32] as uint32 pairs (`pack_dpbf16`; O' padded to 32,
C' to 2, with zeros), so a step's 32 output channels' weights are one 128-byte run whose elements the
instruction broadcasts from memory. The instruction is LLVM's `llvm.x86.avx512bf16.dpbf16ps.512`, whose
operands are `<32 x bfloat>`: TVM legalizes every bfloat16 value it computes to float32, so the kernel calls a
two-line LLVM function (`DOT_LL`, imported into the module with `pragma_import_llvm` and always inlined) that
takes the pairs as `<16 x i32>` and bitcasts them. The instruction rounds like AMX's: each pair's products are
summed in float32 with round-to-nearest-even and denormals flushed. Declines (the conv keeps its AVX-512
kernel): not bfloat16, grouped, a symbolic batch, no `avx512bf16`, AMX tiles present.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tvm_fusion._tvm import Schedule, te, tirx, tvm
from tvm_fusion._tvm import tvmscript as T
from tvm_fusion.hardware import cpu_facts
from tvm_fusion.schedules.llvm.blocks import ceil_to, optional_block
from tvm_fusion.schedules.llvm.pair_planes import (
    LANES, TASK_CHANNELS, Planes, Tasks, as_pairs, epilogue_macro, half_bits, kernel_stage, pack_stage, pair_bits,
    planes, schedule_pack, vector)

DOT_BLOCK = "dpbf16"
DOT = "tvm_fusion_dpbf16ps"
#: the dot product as LLVM IR: x86's intrinsic takes bfloat vectors, TVM's values are float32 or integers
DOT_LL = f"""
define <16 x float> @{DOT}(<16 x float> %acc, <16 x i32> %a, <16 x i32> %b) {{
  %x = bitcast <16 x i32> %a to <32 x bfloat>
  %y = bitcast <16 x i32> %b to <32 x bfloat>
  %r = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %acc, <32 x bfloat> %x, <32 x bfloat> %y)
  ret <16 x float> %r
}}
declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)
"""


@dataclass(frozen=True)
class DotTile:
    """The register tile of a step: `oc` output channels x `vectors` vectors of 16 pixels; its accumulators
    (oc x vectors) plus the pixel vectors fit the 32 zmm registers, the weights come broadcast from memory."""
    oc: int
    vectors: int

    @property
    def pixels(self) -> int:
        return self.vectors * LANES


def choose_tile(hout: int, plane_w: int) -> DotTile:
    """8 x 3 (24 accumulators, 3 loads and 8 broadcasts per 24 products); planes of fewer than 96 pixels (7x7
    outputs) take 8 x 2, whose blocks of 32 waste less of the last one."""
    return DotTile(8, 2) if hout * plane_w < 96 else DotTile(8, 3)


def runs_dot_products(func) -> bool:
    """Whether a PrimFunc holds an AVX512-BF16 conv stage (the `dpbf16` block)."""
    return optional_block(Schedule(tvm.IRModule({"main": func})), DOT_BLOCK) is not None


def target_reason(dtype, target) -> str | None:
    """Why `target` does not run `dtype` products on AVX512-BF16 (None: it does); the conv and dense kernels'."""
    if not cpu_facts(target).avx512_bf16:
        return "the target has no AVX512-BF16 dot products (avx512bf16)"
    if str(dtype) != "bfloat16":
        return f"AVX512-BF16 takes bfloat16 products; this one is {dtype}"
    return None


def why_not(w_dtype, groups: int, batch, target) -> str | None:
    """Why the conv does not run on AVX512-BF16 dot products for `target` (None: it does)."""
    if cpu_facts(target).amx_bf16:
        return "the target has AMX tiles, which take bfloat16 convs (conv2d_amx)"
    reason = target_reason(w_dtype, target)
    if reason:
        return reason
    if groups != 1:
        return f"the AVX512-BF16 conv takes groups 1, not {groups}"
    if not isinstance(batch, (int, tirx.IntImm)):
        return "the AVX512-BF16 conv plans its tasks for a static batch"
    return None


def is_packed(w) -> bool:
    """Whether a conv's W is `pack_dpbf16`'s (uint32 pairs, 5 dims)."""
    return str(w.dtype) == "uint32" and len(w.shape) == 5


def pack_dpbf16(w: np.ndarray) -> np.ndarray:
    """W [O, C, KH, KW] (bfloat16) ==> [O' / 32, KH, KW, C' / 2, 32] uint32 (O' padded to 32, C' to 2, with
    zeros): element (t, r, s, k, o) holds channels 2k (low half) and 2k + 1 of output channel 32 t + o."""
    cout, cin, kh, kw = w.shape
    op, cp = ceil_to(cout, TASK_CHANNELS), ceil_to(cin, 2)
    padded = np.zeros((op, cp, kh, kw), w.dtype)
    padded[:cout, :cin] = w
    return as_pairs(padded.reshape(op // TASK_CHANNELS, TASK_CHANNELS, cp // 2, 2, kh, kw).transpose(0, 4, 5, 2, 1, 3))


def _weight_stage(w):
    """`pack_dpbf16` as a stage (the compute called with W [O, C, KH, KW])."""
    cout, cin, kh, kw = (int(d) for d in w.shape)

    def packed(t, r, s, k, o):
        oc = t * TASK_CHANNELS + o

        def bits(c):
            return half_bits(w[tirx.min(oc, cout - 1), tirx.min(c, cin - 1), r, s], tirx.all(oc < cout, c < cin))

        return pair_bits(bits, k)

    shape = (ceil_to(cout, TASK_CHANNELS) // TASK_CHANNELS, kh, kw, -(-cin // 2), TASK_CHANNELS)
    return te.compute(shape, packed, name="weight")


def conv2d_dpbf16(x, w, b, residual=None, *, strides, padding, dilation, activation=None, activation_params=None,
                  residual_after_activation=False, target=None):
    """The conv family's compute on AVX512-BF16 (stages `pack`, `dpbf16`; W packed by `pack_dpbf16` or
    [O, C, KH, KW], then the `weight` stage packs it per call)."""
    n = int(x.shape[0])
    cout = int(b.shape[0])
    if not is_packed(w):
        w = _weight_stage(w)
    ot, kh, kw, pairs = (int(d) for d in w.shape[:4])
    probe = planes(x.shape, kh, kw, strides, padding, dilation, False, 0)
    tile = choose_tile(probe.hout, probe.plane_w)
    geo = planes(x.shape, kh, kw, strides, padding, dilation, False, tile.pixels)
    pack = pack_stage(x, geo, pairs, kw, strides, padding, dilation, False)
    facts = cpu_facts(target)
    tasks = Tasks(n, ot, geo.hout, geo.plane_w, facts.threads, facts.l2_bytes, tile.pixels)
    epilogue = dict(activation=activation, activation_params=activation_params,
                    residual_after_activation=residual_after_activation, target=target)
    return kernel_stage(DOT_BLOCK, pack, w, b, residual, (n, cout, geo.hout, geo.wout), x.dtype, epilogue,
                        lambda xb, wb, out, value: _dot_body(xb, wb, out, value, n=n, kh=kh, strides=strides,
                                                             dilation=dilation, cout=cout, geo=geo, tasks=tasks,
                                                             tile=tile))


def schedule_dpbf16(sch) -> str:
    """The `pack` (and `weight`) stages as parallel loops (`pair_planes.schedule_pack`); the `dpbf16` stage is
    its own loop nest. Returns the kernel's note."""
    schedule_pack(sch)
    return "AVX512-BF16 dot products"


def _dot_body(xb, wb, out, value, *, n, kh, strides, dilation, cout, geo: Planes, tasks: Tasks, tile: DotTile):
    """The `dpbf16` stage's statement: TVMScript over the extern's buffers, `value(sum, n, o, h, w)` the
    epilogue."""
    kw, plane_w, plane_h, hout, wout = geo.taps_w, geo.plane_w, geo.plane_h, geo.hout, geo.wout
    ot, pairs = int(wb.ty.shape[0]), int(wb.ty.shape[3])
    rows, cols, block = tasks.rows, tasks.pixels, tile.pixels
    oc, vectors = tile.oc, tile.vectors
    epilogue = epilogue_macro(out, value, cout, geo)
    lanes = vector

    @T.prim_func(private=True, check_well_formed=False, s_tir=True)
    def dots():
        with T.sblock("dpbf16_dots"):
            T.reads(xb[0:n, 0:geo.phases, 0:pairs, 0:plane_h, 0:plane_w], wb[0:ot, 0:kh, 0:kw, 0:pairs, 0:32])
            T.writes(out[0:n, 0:cout, 0:geo.hout, 0:wout])
            with T.attr(0, "pragma_import_llvm", DOT_LL):
                for task in T.parallel(tasks.count):
                    sums = T.alloc_buffer((TASK_CHANNELS, cols), "float32")
                    acc = T.alloc_buffer((oc, block), "float32", scope="local")
                    i, o2, h0 = tasks.of(task)
                    for mb in range(tasks.blocks):
                        if h0 * plane_w + mb * block < T.min(h0 + rows, hout) * plane_w:
                            q0 = h0 * plane_w + mb * block
                            for ob in range(TASK_CHANNELS // oc):
                                for o in T.unroll(oc):
                                    for v in T.unroll(vectors):
                                        acc[o, lanes(v * LANES)] = T.Broadcast(T.float32(0), LANES)
                                for t in range(kh * kw):
                                    ph, run = geo.tap(t, strides, dilation)
                                    for k in range(pairs):
                                        for o in T.unroll(oc):
                                            for v in T.unroll(vectors):
                                                acc[o, lanes(v * LANES)] = T.call_extern(
                                                    "float32x16", DOT, acc[o, lanes(v * LANES)],
                                                    xb[i, ph, k, 0, lanes(q0 + run + v * LANES)],
                                                    T.Broadcast(wb[o2, t // kw, t % kw, k, ob * oc + o], LANES))
                                for o in T.unroll(oc):
                                    for v in T.unroll(vectors):
                                        sums[ob * oc + o, lanes(mb * block + v * LANES)] = acc[o, lanes(v * LANES)]
                    epilogue(sums, i, o2 * TASK_CHANNELS, h0, rows)

    return dots.body
