"""CUDA schedule for depthwise -> pointwise in one kernel: one thread block per (sample, tile of R output
rows). The block computes the depthwise output of its rows, all channels, into shared memory (one thread per
(channel, pixel), the taps summed in a register, the padding read as zeros in place), then each thread
computes output elements of the 1x1 conv from shared memory, summing over the channels in a register, and
applies the epilogue. The depthwise output never goes to global memory.

    grid (n * Hout / R), block THREADS:
        dw_act[D, R, Wout] (shared) = act1(sum_taps x * Wd + bd)
        __syncthreads()
        out[n, o, R rows] = act2(sum_d Wp[o, d] * dw_act[d, pixel] + bp (+ residual))

R is the most rows (a divisor of Hout) whose D * R * Wout float32 values fit the static shared memory of a
block (`hardware.cuda_facts`); a shape where one row does not fit is declined (`supports`). Not measured on
a GPU: no tile sizes were tuned."""

from __future__ import annotations

from tvm_fusion.hardware import cuda_facts
from tvm_fusion.registry import register_schedule
from tvm_fusion.schedules.llvm.blocks import optional_block
from tvm_fusion.schedules.depthwise_pointwise import DWPW_FAMILY, DwPwOperands, dw_out_size

THREADS = 256
FLOAT_BYTES = 4


def cuda_rows(d: int, hout: int, wout: int, shared_bytes: int) -> int | None:
    """The most output rows per block (a divisor of hout) whose depthwise tile fits `shared_bytes`."""
    fits = [r for r in range(1, hout + 1) if hout % r == 0 and d * r * wout * FLOAT_BYTES <= shared_bytes]
    return max(fits) if fits else None


def _supports(attrs, shapes, target):
    ops = DwPwOperands.of(shapes)
    hout, wout = dw_out_size(ops.x, ops.wd, attrs["strides"], attrs["padding"])
    d, shared = int(ops.wd[0]), cuda_facts(target).shared_static_bytes
    if cuda_rows(d, hout, wout, shared) is None:
        return (f"the CUDA depthwise -> pointwise kernel keeps a row tile of the depthwise output in shared memory; "
                f"one row of {d} channels x {wout} columns is {d * wout * FLOAT_BYTES} B, over the {shared} B a block "
                "has")
    return None


@register_schedule(DWPW_FAMILY, target="cuda", supports=_supports)
def schedule_dwpw_cuda(sch, attrs, target):
    d, hout, wout = (int(sch.get(loop).extent) for loop in sch.get_loops(sch.get_sblock("dw"))[1:4])
    rows = cuda_rows(d, hout, wout, cuda_facts(target).shared_static_bytes)
    pad = optional_block(sch, "pad")
    if pad is not None:  # the padding read as zeros where the taps read it
        sch.compute_inline(pad)
    epilogue = sch.get_sblock("epilogue")
    n, o, h, w = sch.get_loops(epilogue)
    ht, hi = sch.split(h, [None, rows])
    sch.reorder(n, ht, o, hi, w)
    tile = sch.fuse(n, ht)
    sch.bind(tile, "blockIdx.x")
    _, tx = sch.split(sch.fuse(o, hi, w), [None, THREADS])
    sch.bind(tx, "threadIdx.x")
    pw = sch.get_sblock("pw")
    sch.compute_at(pw, tx, preserve_unit_loops=True)
    sch.set_scope(pw, 0, "local")
    dw_act = sch.get_sblock("dw_act")
    sch.compute_at(dw_act, tile, preserve_unit_loops=True)
    sch.set_scope(dw_act, 0, "shared")
    _, tx = sch.split(sch.fuse(*sch.get_loops(dw_act)[1:]), [None, THREADS])
    sch.bind(tx, "threadIdx.x")
    dw = sch.get_sblock("dw")
    sch.compute_at(dw, tx, preserve_unit_loops=True)
    sch.set_scope(dw, 0, "local")
    return f"one block per {rows} output rows, the depthwise tile in shared memory"
