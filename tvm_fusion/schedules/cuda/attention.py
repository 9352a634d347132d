"""CUDA schedule for attention: one thread block per (batch, head, query) row. The threads compute the
row's scores (one key each, serial over the head dim), the row max and sum as cross-thread reductions, the
probabilities, all in shared memory, then one output feature each (serial over the keys; a half kernel's
`store` rounds it, the float32 feature in a register)."""

from __future__ import annotations

from tvm_fusion.hardware import cuda_facts
from tvm_fusion.registry import register_schedule
from tvm_fusion.schedules.attention import ATTENTION_FAMILY, AttentionOperands, has_store

MAX_THREADS = 256
#: the row's scores, exponentials and probabilities live in shared memory: 3 x keys x 4 bytes, within the
#: target's static shared memory per block (48 KB: 4096 keys)
ROW_BYTES_PER_KEY = 3 * 4
TOO_MANY_KEYS = ("the CUDA attention kernel keeps a row of {keys} keys in shared memory; at most {most} fit in "
                 "the {kb} KB static limit")


def _threads(n: int) -> int:
    t = 32
    while t < MAX_THREADS and t < n:
        t *= 2
    return t


def _supports(attrs, shapes, target):
    ops = AttentionOperands(*shapes)
    keys = ops.kt[-1]
    if keys == 1:
        return ("the CUDA attention kernel splits the row's keys over the threads; a row of one key has no loop "
                "left to split")
    shared = cuda_facts(target).shared_static_bytes
    most = shared // ROW_BYTES_PER_KEY
    if keys > most:
        return TOO_MANY_KEYS.format(keys=keys, most=most, kb=shared // 1024)
    return None


@register_schedule(ATTENTION_FAMILY, target="cuda", supports=_supports)
def schedule_attention_cuda(sch, attrs, target):
    out = sch.get_sblock("out")
    half = has_store(sch)
    n, m, i, f = sch.get_loops(sch.get_sblock("store") if half else out)[:4]
    row = sch.fuse(n, m, i)
    keys = int(sch.get(sch.get_loops(sch.get_sblock("probs"))[-1]).extent)
    threads = _threads(max(keys, int(sch.get(f).extent)))
    sch.bind(row, "blockIdx.x")
    _, tx = sch.split(f, [None, threads])
    sch.bind(tx, "threadIdx.x")
    if half:  # the float32 feature of this thread, in a register, then rounded
        sch.compute_at(out, tx)
        sch.set_scope(out, 0, "local")
    for name in ("probs", "row_sum", "exp", "row_max", "qk"):
        block = sch.get_sblock(name)
        sch.compute_at(block, row)
        sch.set_scope(block, 0, "shared")
        loop = sch.get_loops(block)[1]  # the key loop: spatial, or the reduction of row_max / row_sum
        _, tx = sch.split(loop, [None, threads])
        sch.bind(tx, "threadIdx.x")
