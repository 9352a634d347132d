"""llvm conv2d on AMX tiles: bfloat16 x and W (`--precision bf16`), float32 sums, on an x86 target with
`amx-tile` and `amx-bf16` (`CpuFacts.amx_bf16`; the host's target carries them where the host has them).

One tile instruction (`tdpbf16ps`) adds a 16 x 32 bfloat16 block of W times a 32 x 16 block of x into a 16 x 16
float32 tile: 8192 multiply-adds, where an AVX-512 FMA does 16. The conv is an implicit GEMM with the output
channels as the tiles' rows and the output pixels as their columns, in three stages of one PrimFunc:

    pack: x in phase planes of channel pairs (`pair_planes`: a pair is the tiles' "VNNI" layout)
    amx: parallel over (image, 32 output channels, rows of the output):
        for 32 pixels q of the rows, as q = row * P + col (P the plane's width: P - wout columns are computed
        and dropped, 2 of 58 for a 3x3 conv on 56x56):
            C[2 x 2 tiles] = 0
            for tap, 32 input channels:  C[i, j] += W tile i (packed: `pack_amx`) . pack tile j at the tap's run
            store the 4 tiles to the task's float32 buffer
        epilogue from that buffer: out[n, o, h, w] = act(sum + b[o] (+ residual)), rounded to bfloat16 once

Input channels are padded to 32 and output channels to 32 with zeros. A conv of fewer than 32 input channels
with a wider kernel (`folds`: stems) takes a kernel row's columns x channels as the products instead: the
pack holds them per output pixel, the taps loop over the kernel's rows only. The task asks the OS for the tile
registers first (Linux: `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, process-wide and idempotent;
refused, the kernel fails with an error instead of the CPU's fault) and loads its tile configuration (8
tiles of 16 rows x 64 bytes). Declines (the conv keeps its AVX-512 kernel): not bfloat16, grouped, 1x1 convs
of fewer than `MIN_CHANNELS` input channels, a symbolic batch, no AMX, not x86-64 Linux.
"""

from __future__ import annotations

import numpy as np

from tvm_fusion._tvm import Schedule, te, tirx, tvm
from tvm_fusion._tvm import tvmscript as T
from tvm_fusion.hardware import cpu_facts
from tvm_fusion.schedules.llvm.blocks import ceil_to, optional_block
from tvm_fusion.schedules.llvm.pair_planes import (
    Planes, Tasks, epilogue_macro, kernel_stage, pack_stage, planes, schedule_pack)

AMX_BLOCK = "amx"
TILE_ROWS = 16  # rows of a tile; a row is 64 bytes: 32 bfloat16 or 16 float32
TILE_K = 32  # bfloat16 products per tile row
MIN_CHANNELS = 16  # input channels below which the tile rows are mostly padding
ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 158, 0x1023, 18  # Linux x86-64


def runs_on_tiles(func) -> bool:
    """Whether a PrimFunc holds an AMX stage (conv or dense: the `amx` block)."""
    return optional_block(Schedule(tvm.IRModule({"main": func})), AMX_BLOCK) is not None


def target_reason(dtype, target) -> str | None:
    """Why `target` does not run `dtype` products on AMX tiles (None: it does); the conv and dense kernels'."""
    facts = cpu_facts(target)
    triple = str(target.attrs.get("mtriple") or "")
    if not facts.amx_bf16:
        return "the target has no AMX bfloat16 tiles (amx-tile, amx-bf16)"
    if triple and "linux" not in triple:
        return f"AMX tile permission is requested the Linux way; the target is {triple}"
    if str(dtype) != "bfloat16":
        return f"AMX tiles take bfloat16 products; this one is {dtype}"
    return None


def why_not(w_dtype, groups: int, cin: int, kw: int, batch, target) -> str | None:
    """Why the conv (`cin` input channels, kernel `kw` wide) does not run on AMX tiles for `target` (None: it
    does)."""
    reason = target_reason(w_dtype, target)
    if reason:
        return reason
    if groups != 1:
        return f"the AMX conv takes groups 1, not {groups}"
    if cin < MIN_CHANNELS and not folds(cin, kw):
        return f"{cin} input channels of a 1-wide kernel would fill {cin} of a tile row's {TILE_K} products"
    if not isinstance(batch, (int, tirx.IntImm)):
        return "the AMX conv plans its tasks for a static batch"
    return None


def folds(cin: int, kw: int) -> bool:
    """Whether a kernel row's columns share the tile rows' products (`cin` < 32, `kw` > 1: a 3-channel 7x7
    stem runs 7 steps of 21 products, not 49 of 3): the pack then holds, per output pixel, the row's columns x
    channels, and W stays [O, C, KH, KW] (its `weight` stage folds it per call: a stem's W is a few KiB)."""
    return cin < TILE_K and kw > 1


def pack_amx(w: np.ndarray) -> np.ndarray:
    """W [O, C, KH, KW] ==> Wa [O' / 16, KH, KW, C' / 32, 16, 32] (O', C': padded to 32 with zeros): one tile
    of 16 output channels x 32 input channels per (tap, channel chunk), 1 KiB contiguous."""
    cout, cin, kh, kw = w.shape
    op, cp = ceil_to(cout, 2 * TILE_ROWS), ceil_to(cin, TILE_K)
    padded = np.zeros((op, cp, kh, kw), w.dtype)
    padded[:cout, :cin] = w
    tiles = padded.reshape(op // TILE_ROWS, TILE_ROWS, cp // TILE_K, TILE_K, kh, kw)
    return np.ascontiguousarray(tiles.transpose(0, 4, 5, 2, 1, 3))


def conv2d_amx(x, w, b, residual=None, *, strides, padding, dilation, activation=None, activation_params=None,
               residual_after_activation=False, target=None):
    """The conv family's compute on AMX tiles (stages `pack`, `amx`; W packed by `pack_amx` or [O, C, KH, KW],
    then the `weight` stage packs it per call)."""
    n, cin = int(x.shape[0]), int(x.shape[1])
    cout = int(b.shape[0])
    if len(w.shape) == 6:  # packed by pack_amx
        ot, kh, kw, kc = (int(d) for d in w.shape[:4])
        fold = False
    else:
        kh, kw = int(w.shape[2]), int(w.shape[3])
        fold = folds(cin, kw)
        ot = ceil_to(cout, 2 * TILE_ROWS) // TILE_ROWS
        kc = ceil_to(cin * kw if fold else cin, TILE_K) // TILE_K
        w = _weight_stage(w, ot, kc, fold)
    geo = planes(x.shape, kh, kw, strides, padding, dilation, fold, 2 * TILE_ROWS)
    pack = pack_stage(x, geo, kc * TILE_K // 2, kw, strides, padding, dilation, fold)
    facts = cpu_facts(target)
    tasks = Tasks(n, ot // 2, geo.hout, geo.plane_w, facts.threads, facts.l2_bytes, 2 * TILE_ROWS)
    epilogue = dict(activation=activation, activation_params=activation_params,
                    residual_after_activation=residual_after_activation, target=target)
    return kernel_stage(AMX_BLOCK, pack, w, b, residual, (n, cout, geo.hout, geo.wout), x.dtype, epilogue,
                        lambda xb, wb, out, value: _amx_body(xb, wb, out, value, n=n, ot=ot, kh=kh, kc=kc,
                                                             strides=strides, dilation=dilation, cout=cout, geo=geo,
                                                             tasks=tasks))


def schedule_amx(sch) -> str:
    """The `pack` (and `weight`) stages as parallel loops (`pair_planes.schedule_pack`); the `amx` stage is its
    own loop nest. Returns the kernel's note."""
    schedule_pack(sch)
    return "AMX bfloat16 tiles"


def _weight_stage(w, ot: int, kc: int, fold: bool = False):
    """`pack_amx` as a stage (a W left unpacked: the compute called alone, or a folded conv), bfloat16 bits as
    uint16; `fold`: [O' / 16, KH, 1, kc, 16, 32], product k of a kernel row the column k // C, channel k % C."""
    cout, cin, kh, kw = (int(d) for d in w.shape)

    def packed(t, r, s, k, i, j):
        o, kk = t * TILE_ROWS + i, k * TILE_K + j
        c, col = (kk % cin, kk // cin) if fold else (kk, s)
        inside = tirx.all(o < cout, kk < cin * kw) if fold else tirx.all(o < cout, kk < cin)
        read = w[tirx.min(o, cout - 1), tirx.min(c, cin - 1), r, tirx.min(col, kw - 1)]
        return tirx.if_then_else(inside, tirx.reinterpret("uint16", read), tirx.const(0, "uint16"))

    return te.compute((ot, kh, 1 if fold else kw, kc, TILE_ROWS, TILE_K), packed, name="weight")


def tile_op(name: str, *args):
    """One AMX instruction (LLVM's intrinsics naming tiles by number: `llvm.x86.tileloadd64` ...)."""
    return tirx.call_llvm_intrin("void", f"llvm.x86.{name}", *args)


def tile_macros():
    """(ask, configure): TVMScript macros the AMX kernels share. `ask()`: the tile registers requested from
    the OS, an error if refused; `configure(cfg)`: a task's tile configuration (palette 1, 8 tiles of 16 rows x
    64 bytes) written to `cfg` (64 bytes, local) and loaded."""
    @T.macro
    def ask():
        granted = T.call_extern("int64", "syscall", T.int64(ARCH_PRCTL), T.int64(ARCH_REQ_XCOMP_PERM),
                                T.int64(XFEATURE_XTILEDATA))
        assert granted == T.int64(0), ("the OS refused this process the AMX tile registers (arch_prctl "
                                       "ARCH_REQ_XCOMP_PERM); build for a target without amx-tile")

    @T.macro
    def configure(cfg):
        for j in range(64):
            cfg[j] = T.uint8(0)
        cfg[0] = T.uint8(1)
        for t8 in range(8):
            cfg[16 + 2 * t8] = T.uint8(64)
            cfg[48 + t8] = T.uint8(TILE_ROWS)
        T.evaluate(tile_op("ldtilecfg", T.address_of(cfg[0])))

    return ask, configure


def _amx_body(xb, wb, out, value, *, n, ot, kh, kc, strides, dilation, cout, geo: Planes, tasks: Tasks):
    """The `amx` stage's statement: TVMScript over the extern's buffers, `value(sum, n, o, h, w)` the epilogue.
    Tiles 0-3 sum (2 W tiles) x (2 pack tiles), 4-5 hold W, 6-7 the pack."""
    kw, plane_w, plane_h, hout, wout = geo.taps_w, geo.plane_w, geo.plane_h, geo.hout, geo.wout
    u8 = lambda i: tirx.const(i, "uint8")  # noqa: E731  (a tile's number)
    rows, cols = tasks.rows, tasks.pixels
    b_stride = plane_h * plane_w * 4  # bytes from one channel pair's plane to the next
    c_stride = cols * 4  # bytes from one output channel's sums to the next
    phases, half = geo.phases, TILE_ROWS
    ask, configure = tile_macros()
    epilogue = epilogue_macro(out, value, cout, geo)

    def b_tile(number, i, ph, k, q):  # 16 channel pairs x 16 pixels from pixel q of a phase plane
        return tile_op("tileloadd64", u8(number), T.address_of(xb[i, ph, k * half, q // plane_w, q % plane_w]),
                     T.int64(b_stride))

    def a_tile(number, o, r, s, k):  # 16 output channels x 32 input channels of tap (r, s)
        return tile_op("tileloadd64", u8(number), T.address_of(wb[o, r, s, k, 0, 0]), T.int64(64))

    def store(number, sums, o, q):
        return tile_op("tilestored64", u8(number), T.address_of(sums[o, q]), T.int64(c_stride))

    @T.prim_func(private=True, check_well_formed=False, s_tir=True)
    def amx():
        with T.sblock("amx_tiles"):
            T.reads(xb[0:n, 0:phases, 0:kc * half, 0:plane_h, 0:plane_w],
                    wb[0:ot, 0:kh, 0:kw, 0:kc, 0:TILE_ROWS, 0:TILE_K])
            T.writes(out[0:n, 0:cout, 0:hout, 0:wout])
            ask()
            for task in T.parallel(tasks.count):
                cfg = T.alloc_buffer((64,), "uint8", scope="local")
                sums = T.alloc_buffer((2 * TILE_ROWS, cols), "float32")
                # the tile stores write `sums` through addresses TVM's buffer compaction does not follow: this
                # store spans it to the last column, so its rows keep the stride the stores use
                sums[2 * TILE_ROWS - 1, cols - 1] = T.float32(0)
                configure(cfg)
                i, o2, h0 = tasks.of(task)
                for mb in range(tasks.blocks):
                    if h0 * plane_w + mb * 32 < T.min(h0 + rows, hout) * plane_w:
                        q0 = h0 * plane_w + mb * 32
                        T.evaluate(tile_op("tilezero", u8(0)))
                        T.evaluate(tile_op("tilezero", u8(1)))
                        T.evaluate(tile_op("tilezero", u8(2)))
                        T.evaluate(tile_op("tilezero", u8(3)))
                        for t in range(kh * kw):
                            ph, run = geo.tap(t, strides, dilation)
                            q = q0 + run
                            for k in range(kc):
                                T.evaluate(a_tile(4, o2 * 2, t // kw, t % kw, k))
                                T.evaluate(a_tile(5, o2 * 2 + 1, t // kw, t % kw, k))
                                T.evaluate(b_tile(6, i, ph, k, q))
                                T.evaluate(b_tile(7, i, ph, k, q + half))
                                T.evaluate(tile_op("tdpbf16ps", u8(0), u8(4), u8(6)))
                                T.evaluate(tile_op("tdpbf16ps", u8(1), u8(4), u8(7)))
                                T.evaluate(tile_op("tdpbf16ps", u8(2), u8(5), u8(6)))
                                T.evaluate(tile_op("tdpbf16ps", u8(3), u8(5), u8(7)))
                        T.evaluate(store(0, sums, 0, mb * 32))
                        T.evaluate(store(1, sums, 0, mb * 32 + half))
                        T.evaluate(store(2, sums, half, mb * 32))
                        T.evaluate(store(3, sums, half, mb * 32 + half))
                T.evaluate(tile_op("tilerelease"))
                epilogue(sums, i, o2 * 32, h0, rows)

    return amx.body


