"""Computes and schedules by name and target kind.

    @register_compute("conv2d_bn_relu")                 # TE compute: (*tensors, **attrs) -> te.Tensor
    @register_schedule("conv2d_bn_relu", target="cuda")  # (sch, attrs, target) -> None or str, in place

A schedule may return a one-line note of what its kernel runs on (the CUDA dense: tensor cores, or CUDA
cores and why); it is kept on the group (fuse.Group.kernel) for explain and the manifest.
A compute gets the rule's attributes, and the build's options (`COMPUTE_OPTIONS`) that it names as parameters:
`fast_math` (whether its epilogue may take the target's exp / sigmoid / erf:
`schedules.activations.apply_activation`) and `target` (the tvm Target the kernel is built for: a compute
that pads to the target's tile or takes its math reads it there, never from a `with target:` scope). A
compute that does not name an option never gets it, so a compute written without one keeps working
(`compute_options`).
A schedule may carry `supports(attrs, shapes, target) -> str | None`: a returned string is the reason it
cannot handle a case, and the rule then declines with that reason (the match falls back to TVM).
It may also carry `pack(constants, attrs, shapes, target) -> list | None`: the group's constants (numpy
arrays) re-laid out at compile time into the tile layout its kernel reads (None: keep them as they are;
`shapes` as `supports` gets them: the inputs', then the constants'); the compute then receives the packed
constants.
Duplicates are refused; unknown names are answered with close candidates. The same definition registered
again is not a duplicate: a rules file that registers its kernel runs again each time it is loaded
(`--rules FILE` in two commands of one process) and replaces its own entries (`same_definition`).
"""

from __future__ import annotations

import inspect

from collections.abc import Callable
from dataclasses import dataclass

from .errors import FusionError
from .rules import close_names

__all__ = ["Schedule", "get_compute", "get_schedule", "register_compute", "register_schedule",
           "computes", "has_compute", "refuse_another", "same_definition", "schedules"]

GENERIC = "generic"

_COMPUTES: dict[tuple[str, str], Callable] = {}
_SCHEDULES: dict[tuple[str, str], "Schedule"] = {}


@dataclass(frozen=True)
class Schedule:
    name: str
    target: str
    apply: Callable  # (sch: tvm.s_tir.Schedule, attrs: dict, target) -> None or a note of the kernel's engine
    supports: Callable | None = None  # (attrs, shapes, target) -> str | None
    pack: Callable | None = None  # (constants, attrs, shapes, target) -> list[np.ndarray] | None

    def packed(self, constants: list, attrs: dict, shapes: list, target) -> list:
        """The constants in the layout this schedule's kernel reads."""
        out = self.pack(constants, attrs, shapes, target) if self.pack else None
        return constants if out is None else list(out)

    def why_not(self, attrs: dict, shapes: dict, target) -> str | None:
        return self.supports(attrs, shapes, target) if self.supports else None


def same_definition(old: Callable, new: Callable) -> bool:
    """Whether `new` is `old`, or the same function defined again: same module, qualified name, file and line
    (a rules file loaded twice runs its registrations twice; its module name comes from its path)."""
    def where(fn):
        code = getattr(fn, "__code__", None)
        return (getattr(fn, "__module__", None), getattr(fn, "__qualname__", None),
                code and code.co_filename, code and code.co_firstlineno)

    return old is new or where(old) == where(new)


def refuse_another(registered: Callable | None, new: Callable, message: str) -> None:
    """Raise FusionError(message) when a name already has a definition (`registered`) other than `new`."""
    if registered is not None and not same_definition(registered, new):
        raise FusionError(message)


#: options the build passes to a compute that names them as parameters
COMPUTE_OPTIONS = ("fast_math", "target")


def compute_options(fn: Callable, **options) -> dict:
    """The `options` (names from COMPUTE_OPTIONS) that compute `fn` names as parameters."""
    unknown = set(options) - set(COMPUTE_OPTIONS)
    if unknown:
        raise FusionError(f"unknown compute options {sorted(unknown)}; known: {', '.join(COMPUTE_OPTIONS)}")
    declared = inspect.signature(fn).parameters
    return {name: value for name, value in options.items() if name in declared}


def register_compute(*names: str, target: str = GENERIC):
    def wrap(fn):
        for name in names:
            key = (name, target)
            refuse_another(_COMPUTES.get(key), fn, f"duplicate compute {name!r} for target {target!r}")
            _COMPUTES[key] = fn
        return fn

    return wrap


def register_schedule(*names: str, target: str, supports: Callable | None = None, pack: Callable | None = None):
    def wrap(fn):
        for name in names:
            key = (name, target)
            old = _SCHEDULES.get(key)
            refuse_another(old and old.apply, fn, f"duplicate schedule {name!r} for target {target!r}")
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
