"""llvm schedule of the blocked conv (`schedules/conv2d_blocked.py`): tiles of `tile_blocks` channel blocks x
`cols` output pixels of one row, their accumulators in registers (one vector per block and pixel), the
reduction over the taps, then the input channels (a block's channels rolled), innermost; the epilogue
stores each tile's vectors whole, in the layout the next conv of the chain reads. A deep conv on a small map
takes its reduction in chunks (`reduction_chunk`, the tiled NCHW kernel's rule). The padded input is its own
loop nest, a chain's last conv unblocks its output in its own loop nest too.

The tile: two channel blocks where the output has an even number of them, and the most pixels of a row
(a divisor of its width) that keep the accumulators within `BLOCKED_ACCUMULATORS` of the target's vector
registers. Measured alone on an AVX-512 Xeon (one thread): 1x1 64 -> 256 on 56x56, 2 x 8 pixels 0.78 ms,
3 x 8, 3 x 7, 2 x 7 within 3% of it (W packed per tile and chunk in the order the reduction reads it:
`pack`); with 28 accumulators (2 x 14) LLVM kept them in memory: 1x1 and 3x3
convs on 56x56 / 28x28 / 14x14 2.3-2.6x slower (`benchmarks/blocked_convs.py`).

A block's input channels stay rolled (the loop of 16 or 8 steps). Unrolled, LLVM scheduled the steps'
weight and input loads ahead and spilled vector registers to the stack: ResNet-50's AVX-512 build had 2,055
zmm spill and reload instructions in its blocked convs, 7 rolled. TVM's stack frames are 16-byte aligned,
so a 64-byte spill slot straddles two cache lines unless the thread's stack happens to be 32-byte aligned
at the kernel, which Linux's stack randomization decides once per process: measured on Zen 4 (one thread,
CPU time), the same kernel alone took 2.34 or 4.6-5.0 ms per call depending on the process (3x3 256 on
14x14), the whole of ResNet-50 95-97 or 120-130 ms (never the slow mode with randomization off, `setarch
-R`). Rolled: 2.04-2.12 ms in every process (onnxruntime's node 2.06), ResNet-50 79-85 ms. (On an Intel
AVX-512 core, unrolled had measured 1.30 against 1.43 ms rolled for that conv, in one process.)

The depthwise conv (`schedule_depthwise_blocked`): one task per channel block, its padded plane copied first
(in L1 / L2: 16 KiB for 14x14), tiles of `tile_of(1, ...)`'s pixels of a row, one vector accumulator each,
the taps outermost and unrolled. Against the NCHW depthwise kernels (which vectorize a row of output
columns, or copy a strided conv's input channels-last), alone, one thread, hot | after an 8 MiB write:
3x3 576 on 14x14 0.51 | 0.81 of their time, 960 on 7x7 0.63 | 0.86, 3x3/2 576 on 14x14 0.51 | 0.86,
192 on 28x28 0.83 | 0.96, 144 on 56x56 0.94 | 0.94, 32 on 112x112 0.99 | 1.06.
"""

from __future__ import annotations

from tvm_fusion.hardware import CpuFacts, cpu_facts
from tvm_fusion.registry import register_schedule
from tvm_fusion.schedules.conv2d import conv2d_out_size
from tvm_fusion.schedules.llvm.conv2d import ACC_L2_SHARE, CHUNK_L1_SHARE, FLOAT_BYTES, step_cost
from tvm_fusion.schedules.conv2d_blocked import BLOCKED_CONV, BLOCKED_DEPTHWISE, pack_blocked, pack_depthwise_blocked
from tvm_fusion.schedules.llvm import conv2d_winograd as winograd
from tvm_fusion.schedules.llvm.blocks import loop_extent, optional_block

#: accumulator registers of one tile, per architectural vector register count (32 zmm: 16, measured above;
#: 16 ymm: 12, leaving the weights and a broadcast their registers)
BLOCKED_ACCUMULATORS = {32: 16, 16: 12}
#: the fewest pixels a tile computes: a row whose width has no divisor between this and the register budget
#: would run tiles too short to hide the loads (the conv keeps its NCHW kernel)
MIN_TILE_COLS = 4


def tile_of(cout_blocks: int, wout: int, facts: CpuFacts) -> tuple[int, int] | None:
    """(channel blocks, pixels) of one tile, or None where no tile of MIN_TILE_COLS pixels or more fits: two
    blocks where the output has an even number of them and a row gives them enough pixels, else one."""
    budget = BLOCKED_ACCUMULATORS.get(facts.vector_registers, facts.vector_registers * 3 // 4)
    for blocks in (2, 1):
        if cout_blocks % blocks:
            continue
        cols = max(d for d in range(1, min(wout, budget // blocks) + 1) if wout % d == 0)
        if cols >= MIN_TILE_COLS or cols == wout:
            return blocks, cols
    return None


def reduction_chunk(blocks: int, block: int, cin: int, kh: int, kw: int, hout: int, wout: int, cols: int,
                    facts: CpuFacts) -> int:
    """Input channels per reduction chunk (0: the whole reduction per tile), by the tiled NCHW kernel's rule
    (`conv2d.reduction_chunk`): where the ISA chunks, a tile's weights (its panel) are over half of L1 and the
    task's accumulators (all its pixels) fit L1 (a 1x1 conv's, 1 / ACC_L2_SHARE of L2), each tile takes one
    chunk (a kernel row x `chunk` channels, 1 / CHUNK_L1_SHARE of L1) before the next chunk."""
    step = blocks * block * FLOAT_BYTES  # one reduction step's weights
    accumulators = hout * wout * step
    panel = cin * kh * kw * step  # a tile's weights
    if not step_cost(facts).chunked_reduction or hout * wout // cols < 2 or panel <= facts.l1d_bytes // 2:
        return 0
    if accumulators > facts.l1d_bytes and (kh * kw > 1 or accumulators > facts.l2_bytes // ACC_L2_SHARE):
        return 0
    chunk = max(d for d in range(block, cin + 1, block)
                if cin % d == 0 and d * step * kw <= max(facts.l1d_bytes // CHUNK_L1_SHARE, block * step * kw))
    return chunk if chunk < cin or kh > 1 else 0


def output_size(x_shape, w_shape, attrs) -> tuple[int, int]:
    """The conv's output (height, width), from x (NCHW or NCHW[B]c: H and W at the same places) and W [O, C,
    KH, KW]."""
    return tuple(conv2d_out_size(int(x_shape[2 + a]), int(w_shape[2 + a]), attrs["strides"][a], attrs["padding"][a],
                                 attrs["padding"][2 + a], attrs["dilation"][a]) for a in (0, 1))


def pack(constants, attrs, shapes, target):
    """W [O, C, KH, KW] ==> pack_blocked's Wp for the tile `tile_of` picks and the chunk `reduction_chunk`
    takes, or `pack_winograd`'s U where the conv takes the Winograd kernel; b as it is."""
    w, b = constants
    if winograd.why_not(winograd.nchw_shape(shapes[0]), w.shape, w.dtype, attrs["strides"], attrs["padding"],
                        attrs["dilation"], attrs.get("groups", 1), target) is None:
        return [winograd.pack_winograd(w), b]
    facts = cpu_facts(target)
    block = facts.float32_lanes
    cout, cin, kh, kw = (int(d) for d in w.shape)
    hout, wout = output_size(shapes[0], w.shape, attrs)
    blocks, cols = tile_of(cout // block, wout, facts)
    chunk = reduction_chunk(blocks, block, cin, kh, kw, hout, wout, cols, facts)
    return [pack_blocked(w, block, blocks, chunk), b]


@register_schedule(BLOCKED_CONV, target="llvm", pack=pack)
def schedule_blocked(sch, attrs, target):
    if optional_block(sch, winograd.GEMM_BLOCK) is not None:
        params = sch.mod[sch.func_working_on].params
        note = winograd.schedule_winograd(sch, target)
        blocked = [len(params[i].shape) == 5 for i in (0, -1)]  # x, the output
        return f"{note}; {chain_note(cpu_facts(target).float32_lanes, *blocked)}"
    pad, conv, epi = optional_block(sch, "pad"), sch.get_sblock("conv"), sch.get_sblock("epilogue")
    unblock = optional_block(sch, "unblock")
    w = sch.mod[sch.func_working_on].params[-3]  # the PrimFunc takes x, [residual], Wp, b, out
    _, kh, chunks, kw, chunk_size, blocks, block = (int(d) for d in w.shape)
    cin = chunks * chunk_size
    n, ob, h, ww, oi = sch.get_loops(epi)
    facts = cpu_facts(target)
    _, cols = tile_of(loop_extent(sch, ob), loop_extent(sch, ww), facts)
    wout = loop_extent(sch, ww)
    chunk = reduction_chunk(blocks, block, cin, kh, kw, loop_extent(sch, h), wout, cols, facts)
    obo, obi = sch.split(ob, [None, blocks])
    wo, wi = sch.split(ww, [None, cols])
    sch.reorder(n, obo, h, wo, obi, wi, oi)
    # the conv's loops below the tile (or task) loop, by name: a loop of extent 1 is not there
    taps = (kh, kw) if kh * kw > 1 else (1, 1)  # a 1x1 compute has no tap loops
    sums = [name for name, extent in (("rh", taps[0]), ("rw", taps[1]), ("rco", cin // block), ("rci", block))
            if extent > 1]
    if chunk:  # the task's accumulators for all its pixels; per chunk, every tile in turn
        task = sch.fuse(n, obo)
        sch.parallel(task)
        sch.compute_at(conv, task)
        sch.set_scope(conv, 0, "local")
        named = [name for name, extent in (("obi", blocks), ("h", loop_extent(sch, h)), ("w", wout), ("oi", block))
                 if extent > 1] + sums
        loops = dict(zip(named, sch.get_loops(conv)[1:]))
        cwo, cwi = sch.split(loops["w"], [None, cols])
        rcoo = rcoi = None
        if "rco" in loops and chunk < cin:
            rcoo, rcoi = sch.split(loops["rco"], [None, chunk // block])
        get = lambda *names: [loops[k] for k in names if k in loops]  # noqa: E731
        outer = [*get("rh"), *[x for x in (rcoo,) if x is not None], *get("h"), cwo, *get("rw"),
                 *([rcoi] if rcoi is not None else get("rco")), loops["rci"]]
        sch.reorder(*outer, *get("obi"), cwi, loops["oi"])
        sch.vectorize(loops["oi"])
        sch.unroll(cwi)  # a block's input channels stay rolled: see the module's docstring
        for loop in get("obi"):
            sch.unroll(loop)
        sch.decompose_reduction(conv, outer[0])
    else:
        sch.parallel(sch.fuse(n, obo, h))
        sch.compute_at(conv, wo)
        sch.set_scope(conv, 0, "local")
        own = sch.get_loops(conv)[len(sch.get_loops(epi)) - 3:]  # below wo: the tile's pixels and blocks, the sums
        spatial, reduction = own[:-len(sums)], own[-len(sums):]
        sch.reorder(*reduction, *spatial)
        sch.vectorize(spatial[-1])  # the block's channels
        for loop in spatial[:-1]:
            sch.unroll(loop)
        sch.decompose_reduction(conv, reduction[0])
    sch.vectorize(oi)
    sch.unroll(wi)
    if pad is not None:
        pn, pc, ph, pw, pi = sch.get_loops(pad)
        sch.parallel(sch.fuse(pn, pc, ph))
        sch.vectorize(pi)
    return _unblock_and_note(sch, unblock, block)


def pack_depthwise(constants, attrs, shapes, target):
    """W [C, 1, KH, KW] ==> pack_depthwise_blocked's Wp; b as it is."""
    w, b = constants
    return [pack_depthwise_blocked(w, cpu_facts(target).float32_lanes), b]


@register_schedule(BLOCKED_DEPTHWISE, target="llvm", pack=pack_depthwise)
def schedule_depthwise_blocked(sch, attrs, target):
    """One task per channel block (its padded plane copied first, `pad`), tiles of `tile_of`'s pixels of a row
    (one vector each) summing the taps in registers, the epilogue storing them whole."""
    pad, conv, epi = optional_block(sch, "pad"), sch.get_sblock("conv"), sch.get_sblock("epilogue")
    unblock = optional_block(sch, "unblock")
    w = sch.mod[sch.func_working_on].params[-3]  # the PrimFunc takes x, [residual], Wp, b, out
    _, kh, kw, block = (int(d) for d in w.shape)
    n, cb, h, ww, ci = sch.get_loops(epi)
    _, cols = tile_of(1, loop_extent(sch, ww), cpu_facts(target))
    wo, wi = sch.split(ww, [None, cols])
    task = sch.fuse(n, cb)
    sch.parallel(task)
    sch.compute_at(conv, wo)
    sch.set_scope(conv, 0, "local")
    if pad is not None:
        sch.compute_at(pad, task)
        sch.vectorize(sch.get_loops(pad)[-1])
    # the conv's own loops below the tile, by name: a loop of extent 1 is not there
    named = [name for name, extent in (("wi", cols), ("ci", block), ("rh", kh), ("rw", kw)) if extent > 1]
    loops = dict(zip(named, sch.get_loops(conv)[-len(named):]))
    order = [loops[k] for k in ("rh", "rw", "wi", "ci") if k in loops]
    sch.reorder(*order)
    for k in ("rh", "rw", "wi"):
        if k in loops:
            sch.unroll(loops[k])
    sch.vectorize(loops["ci"])
    if "rh" in loops or "rw" in loops:
        sch.decompose_reduction(conv, order[0])
    sch.vectorize(ci)
    sch.unroll(wi)
    return "depthwise " + _unblock_and_note(sch, unblock, block)


def _unblock_and_note(sch, unblock, block: int) -> str:
    """A chain end's `unblock` stage (NCHW planes in parallel, rows in vectors) scheduled; the kernel's note."""
    if unblock is not None:
        un, uo, uh, uw = sch.get_loops(unblock)
        sch.parallel(sch.fuse(un, uo))
        sch.vectorize(uw)
    return chain_note(block, len(sch.mod[sch.func_working_on].params[0].shape) == 5, unblock is None)


def chain_note(block: int, x_blocked: bool, out_blocked: bool) -> str:
    """What explain and the manifest say the kernel runs on: 'NCHW16c chain (NCHW in, NCHW16c out)'."""
    layout = f"NCHW{block}c"
    return (f"{layout} chain ({layout if x_blocked else 'NCHW'} in, {layout if out_blocked else 'NCHW'} out)")
