"""Small helpers the llvm schedules share: a stage that may be absent, a loop's extent, whole tiles, the
innermost loop a block does not share with another."""

from __future__ import annotations

__all__ = ["ceil_to", "loop_extent", "optional_block", "vectorize_own_inner_loop"]


def ceil_to(n: int, m: int) -> int:
    """n rounded up to a whole number of m."""
    return -(-n // m) * m


def loop_extent(sch, loop) -> int:
    return int(sch.get(loop).extent)


def optional_block(sch, name: str):
    """The block called `name`, or None where the compute has no such stage."""
    try:
        return sch.get_sblock(name)
    except Exception:  # noqa: BLE001 - tvm raises a ScheduleError subclass when absent
        return None


def vectorize_own_inner_loop(sch, block, outer_block):
    """Vectorize the innermost loop of `block` that `outer_block` does not share (none: a unit region)."""
    shared = [sch.get(loop) for loop in sch.get_loops(outer_block)]
    own = [loop for loop in sch.get_loops(block) if not any(sch.get(loop).same_as(s) for s in shared)]
    if own:
        sch.vectorize(own[-1])
