"""CPU schedule for the transposed convolutions no rule took (ONNX ConvTranspose, e.g. the DB text
detector's upsampling head): `topi conv2d_transpose PrimFunc  ==>  output rows in parallel, output
pixels in vectors, the channel / kernel sums outside the vector`.

TVM legalizes a ConvTranspose into four blocks (`data_dilate`, `data_pad`, `kernel_transform`, `compute`)
and its CPU pipeline leaves them unscheduled: the sum runs one scalar output element at a time, striding
through the input channels (ppocr_det's two 2x2 stride-2 ConvTransposes took 13 of its 18 ms per
inference on one AVX2 core). This rule (a dlight `ScheduleRule`, run on the fused build's leftovers after
`LeftoverInjective`, `pipeline.legalize_passes`) inlines the dilation into the padding copy, moves the
sum's loops (input channel, kernel row, kernel column) outside a run of up to four vectors of output pixels and runs
(batch, output channel, output row) in parallel; each output element still sums the same terms in the same
order, so the results are bit-identical to TVM's unscheduled lowering. Epilogues TVM fused behind the
sum (bias, sigmoid) are left as they are. It declines any other function.
"""

from __future__ import annotations

from tvm_fusion._tvm import Schedule, dlight, tirx
from tvm_fusion.hardware import cpu_facts

__all__ = ["LeftoverConvTranspose"]

#: the most vectors of output pixels one run of the sum keeps in registers (AVX2: 4 x 8 float32 of 16 ymm
#: registers; on ppocr_det's 2x2 stride-2 upsampling 1, 2, 3, 4 vectors took 1.41, 0.91, 0.70, 0.55 ms)
MAX_VECTORS = 4
_BLOCKS = ("data_dilate", "data_pad", "kernel_transform", "compute")


def _block(sch, name: str):
    try:
        return sch.get_sblock(name)
    except Exception:  # noqa: BLE001 (tvm raises its own error types for a missing block)
        return None


class LeftoverConvTranspose(dlight.ScheduleRule):
    """Inline the dilation, reorder the sum outside a run of output pixels, parallel output rows."""

    def apply(self, func, target, tunable):
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        sch = Schedule(func)
        blocks = {name: _block(sch, name) for name in _BLOCKS}
        if any(b is None for b in blocks.values()):
            return None
        compute = blocks["compute"]
        loops = sch.get_loops(compute)
        kinds = [iv.iter_type for iv in sch.get(compute).iter_vars]
        extents = [sch.get(loop).extent for loop in loops]
        if (len(loops) != 7 or kinds != [tirx.IterVar.DataPar] * 4 + [tirx.IterVar.CommReduce] * 3
                or not all(isinstance(e, tirx.IntImm) for e in extents)):
            return None
        sch.compute_inline(blocks["data_dilate"])
        b, c, h, w, dc, dh, dw = loops
        rows = sch.fuse(b, c, h)
        sch.parallel(rows)  # before the reduction is split into init and update (parallel checks the dataflow)
        lanes, width = cpu_facts(target).float32_lanes, int(extents[3])
        run = next((lanes * n for n in range(MAX_VECTORS, 0, -1) if width % (lanes * n) == 0), None)
        if run is not None:  # the longest run of whole vectors that tiles the output row
            wo, wi = sch.split(w, [None, run])
            sch.reorder(wo, dc, dh, dw, wi)
            sch.decompose_reduction(compute, dc)
            sch.unroll(wi)  # `vectorize` refuses the update block's loop; LLVM's SLP pass packs the copies
        else:
            sch.reorder(dc, dh, dw, w)
            sch.decompose_reduction(compute, dc)
        return sch
