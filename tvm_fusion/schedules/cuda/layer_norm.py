"""CUDA schedule for LayerNorm: one block per row; the two row reductions are cross-thread reductions
over threadIdx.x, then every thread writes its share of the normalized row."""

from __future__ import annotations

from tvm_fusion.registry import register_schedule
from tvm_fusion.schedules.layer_norm import LAYER_NORM_FAMILY

MAX_THREADS = 256  # threads per row: enough for C up to a few thousand with a short serial loop each


def _threads(c: int) -> int:
    t = 32
    while t < MAX_THREADS and t < c:
        t *= 2
    return t


@register_schedule(LAYER_NORM_FAMILY, target="cuda")
def schedule_layer_norm_cuda(sch, attrs, target):
    out = sch.get_sblock("out")
    *lead, col = sch.get_loops(out)  # [N, rows, C] with a symbolic batch: one block per (sample, row)
    row = sch.fuse(*lead) if len(lead) > 1 else lead[0]
    threads = _threads(int(sch.get(col).extent))
    sch.bind(row, "blockIdx.x")
    for name in ("var", "mean"):
        block = sch.get_sblock(name)
        sch.compute_at(block, row)
        sch.set_scope(block, 0, "shared")  # one value per row, shared by the row's threads
        _, tx = sch.split(sch.get_loops(block)[-1], [None, threads])
        sch.bind(tx, "threadIdx.x")
    _, tx = sch.split(col, [None, threads])
    sch.bind(tx, "threadIdx.x")
