"""Computes and schedules by name and target kind.

    @register_compute("conv2d_bn_relu")                 # TE compute: (*tensors, **attrs) -> te.Tensor
    @register_schedule("conv2d_bn_relu", target="cuda")  # (sch, attrs, target) -> None or str, in place

A schedule may return a one-line note of what its kernel runs on (the CUDA dense: tensor cores, or CUDA
cores and why); it is kept on the group (fuse.Group.kernel) for explain and the manifest.
A schedule may carry `supports(attrs, shapes, target) -> str | None`: a returned string is the reason it
cannot handle a case, and the rule then declines with that reason (the match falls back to TVM).
It may also carry `pack(constants, attrs, target) -> list | None`: the group's constants (numpy arrays)
re-laid out at compile time into the tile layout its kernel reads (None: keep them as they are); the
compute then receives the packed constants.
Duplicates are refused; unknown names are answered with close candidates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .errors import FusionError
from .rules import close_names

__all__ = ["Schedule", "get_compute", "get_schedule", "register_compute", "register_schedule",
           "computes", "has_compute", "schedules"]

GENERIC = "generic"

_COMPUTES: dict[tuple[str, str], Callable] = {}
_SCHEDULES: dict[tuple[str, str], "Schedule"] = {}


@dataclass(frozen=True)
class Schedule:
    name: str
    target: str
    apply: Callable  # (sch: tvm.s_tir.Schedule, attrs: dict, target) -> None or a note of the kernel's engine
    supports: Callable | None = None  # (attrs, shapes, target) -> str | None
    pack: Callable | None = None  # (constants, attrs, target) -> list[np.ndarray] | None

    def packed(self, constants: list, attrs: dict, target) -> list:
        """The constants in the layout this schedule's kernel reads."""
        out = self.pack(constants, attrs, target) if self.pack else None
        return constants if out is None else list(out)

    def why_not(self, attrs: dict, shapes: dict, target) -> str | None:
        return self.supports(attrs, shapes, target) if self.supports else None


def register_compute(*names: str, target: str = GENERIC):
    def wrap(fn):
        for name in names:
            key = (name, target)
            if key in _COMPUTES and _COMPUTES[key] is not fn:
                raise FusionError(f"duplicate compute {name!r} for target {target!r}")
            _COMPUTES[key] = fn
        return fn

    return wrap


def register_schedule(*names: str, target: str, supports: Callable | None = None, pack: Callable | None = None):
    def wrap(fn):
        for name in names:
            key = (name, target)
            if key in _SCHEDULES and _SCHEDULES[key].apply is not fn:
                raise FusionError(f"duplicate schedule {name!r} for target {target!r}")
            _SCHEDULES[key] = Schedule(name, target, fn, supports, pack)
        return fn

    return wrap


def get_compute(name: str, target: str) -> Callable:
    for key in ((name, target), (name, GENERIC)):
        if key in _COMPUTES:
            return _COMPUTES[key]
    raise FusionError(f"no compute registered as {name!r}; {close_names(name, {n for n, _ in _COMPUTES})}")


def has_compute(name: str, target: str = GENERIC) -> bool:
    return (name, target) in _COMPUTES or (name, GENERIC) in _COMPUTES


def get_schedule(name: str, target: str) -> Schedule | None:
    """The schedule for (name, target kind), or None when that target has none."""
    return _SCHEDULES.get((name, target))


def computes() -> list[tuple[str, str]]:
    return sorted(_COMPUTES)


def schedules() -> list[tuple[str, str]]:
    return sorted(_SCHEDULES)
