"""CPU schedule for the transposed convolutions no rule took (ONNX ConvTranspose, e.g. the DB text
detector's upsampling head): `topi conv2d_transpose PrimFunc  ==>  per output phase (oy mod s, ox mod s)
only the kernel taps that land on input pixels, output rows in parallel, the channel / tap sums outside
an unrolled run of output pixels`.

TVM legalizes a ConvTranspose into four blocks (`data_dilate`, `data_pad`, `kernel_transform`, `compute`):
the input is dilated by the stride (s - 1 zeros between pixels), padded, and convolved with the flipped
kernel, so for stride 2 three of every four terms of the sum multiply a zero, and TVM's CPU pipeline
leaves the blocks unscheduled (ppocr_det's two 2x2 stride-2 ConvTransposes took 13 of its 18 ms per
inference on one AVX2 core). This rule (a dlight `ScheduleRule`, run on the fused build's leftovers after
`LeftoverInjective`, `pipeline.legalize_passes`) rewrites the `compute` block to sum only the non-zero
terms (the sub-pixel / phase decomposition, `phase_sum`): with `p` the dilated input's leading padding,
output row `y` takes kernel rows `dh = (p - y) mod s + t*s` (t = 0, 1, ...; `dh < k`) from input row
`ceil((y - p) / s) + t`, read from the input itself (the dilate and pad blocks are dropped); the same for
columns. Output columns are split into s phases (`x = q*s + r`) and a run of consecutive outputs (q, r)
of two output channels is unrolled innermost (up to four vectors of sums in registers; each lane's taps
are constants, each input pixel loaded serves both channels). Rows (batch, output channel pair, output
row) run in parallel, the sum (input channel, tap row, tap column) outside the run.
Every output sums the same non-zero terms in the same order as TVM's lowering (the dropped terms are
products with zero), so the results are bit-identical to the unfused build for finite weights (an
infinite or NaN weight times a dropped zero was NaN there, at outputs the weight never reaches; the phase
sum agrees with onnxruntime, the ONNX definition, on those: `test_infinite_weight_gives_onnxruntimes_result_not_nan`).
Where `phase_sum` declines (stride 1 has no
zero taps; a lowering it does not recognise; its `declined` says which), the dilation is inlined into the
padding copy and the sum runs in TVM's order over the padded input. Epilogues TVM fused behind the sum
(bias, sigmoid) are left as they are. The rule declines any other function.
"""

from __future__ import annotations

from typing import NamedTuple

from tvm_fusion._tvm import (
    Analyzer,
    SBlock,
    SBlockRealize,
    Schedule,
    TensorLoad,
    tirx,
    tvm,
)
from tvm_fusion.hardware import cpu_facts
from tvm_fusion.schedules.llvm.loop_nest import CpuRule

__all__ = ["LeftoverConvTranspose", "PhaseSum", "phase_sum"]

#: the most vectors of output pixels one run of the sum keeps in registers (AVX2: 4 x 8 float32 of 16 ymm
#: registers; on ppocr_det's 2x2 stride-2 upsampling 1, 2, 3, 4 vectors took 1.41, 0.91, 0.70, 0.55 ms)
MAX_VECTORS = 4
#: output channels one run of the phase sum computes together, sharing the input pixels' loads (ppocr_det's
#: first upsampling, 24 -> 24 channels: 1, 2, 4 channels took 0.226, 0.172, 0.187 ms)
CHANNELS = 2
_BLOCKS = ("data_dilate", "data_pad", "kernel_transform", "compute")
_SPATIAL, _REDUCE = tirx.IterVar.DataPar, tirx.IterVar.CommReduce


def _block(sch, name: str):
    try:
        return sch.get_sblock(name)
    except Exception:  # noqa: BLE001 (tvm raises its own error types for a missing block)
        return None


def _nest(stmt):
    """(loops, block realize) of a perfect loop nest around one block; realize None otherwise."""
    loops = []
    while isinstance(stmt, tirx.For):
        loops.append(stmt)
        stmt = stmt.body
    return loops, (stmt if isinstance(stmt, SBlockRealize) else None)


def _offset(analyzer, var, index) -> int | None:
    """c where `index == var - c`, else None."""
    diff = analyzer.simplify(var - index)
    return int(diff.value) if isinstance(diff, tirx.IntImm) else None


def _stride(var, index) -> int | None:
    """s where `index == var // s` (1 where `index` is `var`), else None."""
    if index.same_as(var):
        return 1
    if isinstance(index, tirx.FloorDiv) and index.a.same_as(var) and isinstance(index.b, tirx.IntImm):
        return int(index.b.value)
    return None


def _range(extent):
    """[0, extent) in int64, TVM's index type for these functions."""
    return tvm.ir.Range.from_min_extent(tirx.const(0, "int64"), tirx.const(int(extent), "int64"))


def _axis(analyzer, v_out, v_tap, n_out: int, n_in: int, k: int, s: int, p: int):
    """One spatial axis of the phase sum: (tap iter var, tap index, input index, guards)."""
    taps = -(-k // s)
    v_t = tirx.IterVar(_range(taps), tirx.Var(v_tap.var.name + "_phase", "int64"), _REDUCE)
    t = v_t.var
    # (p - y) mod s, written with y's coefficient positive: TVM 0.27's simplifier turned the flattened index
    # `... + floormod(2 - h, 3)` into `... - floormod(h, -3)`, dropping the 2
    tap = (s - 1) - tirx.floormod(v_out + (s - 1 - p) % s, s) + t * s
    pixel = tirx.floordiv(v_out - p + (s - 1), s) + t
    guards = []
    if k % s:  # some phases have fewer taps than `taps`
        guards.append(tap < k)
    if -(-(0 - p) // s) < 0:  # the first outputs reach before the input
        guards.append(pixel >= 0)
    if -(-(n_out - 1 - p) // s) + taps - 1 >= n_in:  # the last ones past it
        guards.append(pixel < n_in)
    return v_t, analyzer.simplify(tap), analyzer.simplify(pixel), guards


class PhaseSum(NamedTuple):
    """What `phase_sum` made of a function: the rewritten function and its strides, or why not."""

    func: object | None
    strides: tuple[int, int] = (1, 1)
    declined: str = ""


def phase_sum(func) -> PhaseSum:
    """The function with its `compute` block summing only the non-zero taps (no dilate / pad blocks), or
    PhaseSum(None, declined=why not)."""
    root = func.body
    if not isinstance(root, SBlockRealize) or not isinstance(root.block.body, tirx.SeqStmt):
        return PhaseSum(None, declined="the function body is not a root block over a sequence of loop nests")
    nests = _loop_nests(root.block.body)
    if any(name not in nests for name in _BLOCKS):
        return PhaseSum(None, declined=f"not TVM's conv2d_transpose lowering: blocks {sorted(nests)}")
    analyzer = Analyzer()
    dilate, pad, compute = (nests[n][2].block for n in ("data_dilate", "data_pad", "compute"))
    x = dilate.reads[0].source
    strides, pads, declined = _strides_and_pads(analyzer, dilate, pad)
    if declined:
        return PhaseSum(None, declined=declined)
    if not all(isinstance(n, tirx.IntImm) for n in x.shape):
        return PhaseSum(None, declined=f"symbolic input shape {list(x.shape)}")
    if strides == [1, 1]:
        return PhaseSum(None, declined="stride 1: no dilation zeros to skip")
    declined = _sum_declined(analyzer, compute, pad)
    if declined:
        return PhaseSum(None, declined=declined)
    block = _phase_block(analyzer, compute, x, strides, pads)
    i, loops, realize = nests["compute"]
    dropped = {nests[n][0] for n in ("data_dilate", "data_pad")}
    seq = [_phase_nest(loops, realize, block) if j == i else s
           for j, s in enumerate(root.block.body.seq) if j not in dropped]
    gone = (dilate.writes[0].source, pad.writes[0].source)
    return PhaseSum(func.with_body(_root_over(root, seq, gone)), tuple(strides))


def _loop_nests(seq) -> dict:
    """{block name: (position in `seq`, loops, block realize)} of the perfect loop nests in `seq`."""
    nests = {}
    for i, stmt in enumerate(seq.seq):
        loops, realize = _nest(stmt)
        if realize is not None:
            nests[realize.block.name_hint] = (i, loops, realize)
    return nests


def _strides_and_pads(analyzer, dilate, pad) -> tuple[list, list, str]:
    """The spatial strides and leading paddings the `data_dilate` and `data_pad` blocks read the input with,
    and "" (or why they are not read as `x[b, c, y // s, ..]` / `dilated[b, c, y - p, ..]`, p >= 0)."""
    strides = [_stride(iv.var, r.min) for iv, r in zip(dilate.iter_vars, dilate.reads[0].region)]
    pads = [_offset(analyzer, iv.var, r.min) for iv, r in zip(pad.iter_vars, pad.reads[0].region)]
    if (len(strides) != 4 or strides[:2] != [1, 1] or pads[:2] != [0, 0] or None in strides[2:] + pads[2:]
            or any(p < 0 for p in pads[2:])):
        return [], [], ("dilation / padding not read as `x[b, c, y // s, ..]` / "
                        f"`dilated[b, c, y - p, ..]` (p >= 0): {dilate.reads[0]}, {pad.reads[0]}")
    return strides[2:], pads[2:], ""


def _sum_declined(analyzer, compute, pad) -> str:
    """Why the `compute` block is not `out += data_pad[.., y + dh, x + dw] * kernel[.., dh, dw]`, or ""."""
    store = compute.body
    ok = (isinstance(store, tirx.BufferStore) and isinstance(store.value, tirx.Add)
          and isinstance(store.value.b, tirx.Mul) and isinstance(store.value.b.a, TensorLoad)
          and isinstance(store.value.b.b, TensorLoad) and store.value.b.a.source.same_as(pad.writes[0].source))
    if not ok:
        return f"the compute block is not `out += data_pad[...] * kernel[...]`: {store}"
    _, _, v_h, v_w, _, v_dh, v_dw = compute.iter_vars
    data, kernel = store.value.b.a, store.value.b.b
    taps_read = all(analyzer.can_prove_equal(data.indices[2 + a] - v.var - t.var, 0)
                    for a, (v, t) in enumerate(((v_h, v_dh), (v_w, v_dw))))
    if not (taps_read and kernel.indices[2].same_as(v_dh.var) and kernel.indices[3].same_as(v_dw.var)):
        return f"the sum does not read data_pad[.., y + dh, x + dw] * kernel[.., dh, dw]: {store.value}"
    return ""


def _phase_block(analyzer, compute, x, strides, pads):
    """The `compute` block over (b, c, y, x, input channel, tap row phase, tap column phase): each output
    sums kernel[.., tap_h, tap_w] * x[.., row, col] over the taps that land on input pixels (guarded where
    some phases have fewer taps or reach past the input)."""
    store = compute.body
    v_b, v_c, v_h, v_w, v_dc, v_dh, v_dw = compute.iter_vars
    data, kernel = store.value.b.a, store.value.b.b
    axes = [_axis(analyzer, v.var, t, int(v.dom.extent), int(x.shape[2 + a]), int(t.dom.extent), s, p)
            for a, (v, t, s, p) in enumerate(zip((v_h, v_w), (v_dh, v_dw), strides, pads))]
    (v_th, tap_h, row, guards_h), (v_tw, tap_w, col, guards_w) = axes
    term = (tirx.BufferLoad(x, [*data.indices[:2], row, col])
            * tirx.BufferLoad(kernel.source, [*kernel.indices[:2], tap_h, tap_w]))
    body = tirx.BufferStore(store.buffer, store.value.a + term, store.indices)
    guards = guards_h + guards_w
    if guards:  # a skipped term is a product with zero (the multiply-add stays one, as LLVM contracts it)
        body = tirx.IfThenElse(tirx.all(*guards), body, None)
    whole = [tirx.BufferRegion(b, [_range(n) for n in b.shape]) for b in (x, kernel.source)]
    return SBlock([v_b, v_c, v_h, v_w, v_dc, v_th, v_tw], whole, compute.writes, "compute", body,
                  compute.init, annotations=compute.annotations)


def _phase_nest(loops, realize, block):
    """The loop nest of the phase block: the compute's five outer loops, then the two tap phase loops."""
    new_loops = [tirx.Var(name, "int64") for name in ("dh_phase", "dw_phase")]
    stmt = SBlockRealize([lp.loop_var for lp in loops[:5]] + new_loops, realize.predicate, block)
    v_th, v_tw = block.iter_vars[5], block.iter_vars[6]
    for var, iv in zip(reversed(new_loops), (v_tw, v_th)):
        stmt = tirx.For(var, iv.dom.min, iv.dom.extent, tirx.ForKind.SERIAL, stmt)
    for lp in reversed(loops[:5]):
        stmt = tirx.For(lp.loop_var, lp.min, lp.extent, lp.kind, stmt)
    return stmt


def _root_over(root, seq, gone):
    """The root block realize over the statements `seq`, without the buffers `gone` (the dropped blocks')."""
    old = root.block
    allocs = [b for b in old.alloc_buffers if not any(b.same_as(g) for g in gone)]
    new_root = SBlock(old.iter_vars, old.reads, old.writes, old.name_hint, tirx.SeqStmt(seq), old.init,
                      allocs, old.match_buffers, old.annotations)
    return SBlockRealize(root.iter_values, root.predicate, new_root)


def _run(target, width: int) -> int | None:
    """The longest run of whole vectors (at most MAX_VECTORS) that tiles `width` pixels, or None."""
    lanes = cpu_facts(target).float32_lanes
    return next((lanes * n for n in range(MAX_VECTORS, 0, -1) if width % (lanes * n) == 0), None)


def _schedule_padded(sch, target, compute):
    """Stride 1 (or what `phase_sum` declines): the dilation inlined into the padding copy, the sum over the
    padded input outside a run of output pixels."""
    sch.compute_inline(sch.get_sblock("data_dilate"))
    b, c, h, w, dc, dh, dw = sch.get_loops(compute)
    sch.parallel(sch.fuse(b, c, h))  # before the reduction is split into init and update (parallel checks the dataflow)
    run = _run(target, int(sch.get(w).extent))
    if run is not None:
        wo, wi = sch.split(w, [None, run])
        sch.reorder(wo, dc, dh, dw, wi)
        sch.decompose_reduction(compute, dc)
        sch.unroll(wi)  # `vectorize` refuses the update block's loop; LLVM's SLP pass packs the copies
    else:
        sch.reorder(dc, dh, dw, w)
        sch.decompose_reduction(compute, dc)


def _schedule_phases(sch, target, compute, stride: int):
    """The phase sum: output columns as (pixel q, phase r), x = q*s + r; a run of whole vectors of
    consecutive outputs (q, r) of CHANNELS output channels innermost, so the sums stay contiguous, each lane's
    taps are constants and each input pixel loaded serves every channel of the run."""
    b, c, h, w, dc, th, tw = sch.get_loops(compute)
    lanes = cpu_facts(target).float32_lanes
    channels = CHANNELS if int(sch.get(c).extent) % CHANNELS == 0 else 1
    co, ci = sch.split(c, [None, channels])
    sch.reorder(co, h, ci)
    sch.parallel(sch.fuse(b, co, h))
    q, r = sch.split(w, [None, stride])
    qs = int(sch.get(q).extent)
    most = lanes * MAX_VECTORS // (stride * channels)
    run = next((n for n in range(most, 0, -1) if qs % n == 0 and (n * stride) % lanes == 0), None)
    if run is not None:
        qo, qi = sch.split(q, [None, run])
        sch.reorder(qo, dc, th, tw, ci, qi, r)
        sch.decompose_reduction(compute, dc)
        for loop in (ci, qi, r):
            sch.unroll(loop)
    else:
        sch.reorder(dc, th, tw, ci, q, r)
        sch.decompose_reduction(compute, dc)


class LeftoverConvTranspose(CpuRule):
    """Sum only the non-zero taps (stride > 1), reorder the sum outside a run of output pixels, parallel
    output rows."""

    def schedule(self, func, target):
        sch = Schedule(func)
        if any(_block(sch, name) is None for name in _BLOCKS):
            return None
        compute = sch.get_sblock("compute")
        kinds = [iv.iter_type for iv in sch.get(compute).iter_vars]
        extents = [sch.get(loop).extent for loop in sch.get_loops(compute)]
        if (len(extents) != 7 or kinds != [_SPATIAL] * 4 + [_REDUCE] * 3
                or not all(isinstance(e, tirx.IntImm) for e in extents)):
            return None
        phased = phase_sum(func)
        if phased.func is None:
            _schedule_padded(sch, target, compute)
            return sch
        sch = Schedule(phased.func)
        _schedule_phases(sch, target, sch.get_sblock("compute"), phased.strides[1])
        return sch
