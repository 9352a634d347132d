"""Fusion rules: a dpl pattern, a check that declines with a reason, and a lowering to a named compute.

    @rule("conv2d_bn_relu", priority=300, check=conv_checks)
    def conv2d_bn_relu():
        '''conv2d -> [add bias] -> batch_norm -> relu  ==>  conv2d_bn_relu(x, W', b')'''
        return conv_epilogue(bn=True, activation="relu")      # a Spec: pattern, annotations, lower

Priority convention (one, everywhere): a HIGHER `priority` wins an overlap; equal priorities keep
registration order. `RuleSet.ordered()` is the order handed to FuseOpsByPattern (earlier wins there).
A check returns None to accept or `decline("message with actual and expected values")`; a bare
True/False is refused, so every "no" has a reason that `explain` can show.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _tvm
from ._tvm import dpl, relax, tirx
from .errors import FusionError

__all__ = [
    "Decline", "Lowering", "Match", "Rule", "RuleSet", "Spec", "axis_vector", "axis_vector_shapes", "batch_shape",
    "clip_bounds", "commutative", "decline", "declared_batch_dims", "is_symbolic", "may_hold_rules", "not_this_family",
    "rule", "scalar_constant", "shape_text", "static_shape", "symbolic_reason", "undeclared_dims",
]

DEFAULT_TARGETS = ("cuda", "llvm")


@dataclass(frozen=True)
class Decline:
    """Why a rule did not take a match: the message carries actual and expected values. `other_family`: the
    match is another family's subgraph that the pattern cannot tell apart (a plain conv where a depthwise one
    belongs): not a near miss, so `explain` does not list it."""

    message: str
    other_family: bool = False

    def __str__(self) -> str:
        return self.message


def decline(message: str) -> Decline:
    return Decline(message)


def not_this_family(message: str) -> Decline:
    """A decline that is no near miss (`Decline.other_family`): the fuse stage does not record it."""
    return Decline(message, other_family=True)


@dataclass
class Lowering:
    """What replaces a match: `compute(*inputs, *constants, **attrs)` as one scheduled PrimFunc."""

    compute: str
    inputs: list  # relax exprs: runtime tensors of the matched subgraph
    constants: list[np.ndarray]  # weights folded at compile time
    attrs: dict[str, Any] = field(default_factory=dict)
    input_shapes: dict[int, tuple] = field(default_factory=dict)  # view input i with this shape (reshape)
    out_shape: tuple | None = None  # view the kernel's output with this shape (reshape)

    def shape_of_input(self, i: int) -> tuple:
        return tuple(self.input_shapes.get(i) or batch_shape(self.inputs[i]))


@dataclass(frozen=True)
class Spec:
    """What a rule builder returns: the pattern, its annotated sub-patterns, the lowering, and
    optionally a check intrinsic to the pattern (run before the rule's own check)."""

    pattern: Any
    annotations: dict[str, Any]
    lower: Callable[["Match"], Lowering]
    check: Callable[["Match"], "Decline | None"] | None = None
    #: more (pattern, annotations) pairs, matched after `pattern` on what it left: a commuted operand order.
    #: The matcher binds the first operand order (and the first alternative of an `a | b`) that fits the
    #: graph and never tries another when the check declines it, so add(y, skip) on add(conv_a, conv_b)
    #: binds y to conv_a only; a variant written add(skip, y) is tried in that order first and gives conv_b
    #: its turn. `pattern` must match every variant's subgraph (lowering re-matches with it).
    variants: tuple = ()

    def patterns(self) -> list[tuple[Any, dict[str, Any]]]:
        return [(self.pattern, self.annotations), *self.variants]


class Match:
    """A matched subgraph seen through the rule's annotation names."""

    def __init__(self, rule_name: str, exprs: dict[str, Any], var2val: dict | None = None,
                 batch_dims: Collection[str] | None = None):
        self.rule = rule_name
        self._exprs = exprs
        self._var2val = var2val or {}
        #: the symbolic dims the model's inputs declare (declared_batch_dims); None: any outer variable
        self.batch_dims = None if batch_dims is None else frozenset(batch_dims)

    def __contains__(self, name: str) -> bool:
        return name in self._exprs

    def __getitem__(self, name: str):
        try:
            return self._exprs[name]
        except KeyError:
            raise KeyError(f"rule {self.rule}: no annotated expression {name!r}; have {sorted(self._exprs)}") from None

    def value(self, name: str):
        """The expression, looking through variable bindings."""
        expr = self[name]
        while isinstance(expr, relax.Var) and expr in self._var2val:
            expr = self._var2val[expr]
        return expr

    def attrs(self, name: str):
        return self.value(name).attrs

    def const(self, name: str) -> np.ndarray:
        expr = self.value(name)
        if not _tvm.is_constant(expr):
            raise ValueError(f"{name} is not a constant")
        return _tvm.constant_value(expr)

    def shape(self, name: str) -> tuple | None:
        """batch_shape: ints, except that the outermost dim may be a TIR variable (a declared symbolic batch)."""
        return batch_shape(self[name], self.batch_dims)

    def const_operand(self, name: str):
        """The constant operand of the binary op annotated `name`, in either operand order (dpl matches
        add and multiply commuted, so `b + y` fills a pattern written `y + b`)."""
        call = self.value(name)
        found = [a for a in call.args if _tvm.is_constant(a)]
        if len(found) != 1:
            raise ValueError(f"{name} has {len(found)} constant operands; expected one")
        return found[0]

    def dtype(self, name: str) -> str:
        return str(_tvm.expr_type(self[name]).dtype)

    def prefixed(self, prefix: str) -> "Match":
        """The annotations named `prefix` + name, under their names without it: a rule that chains two
        members' patterns (annotations `dw_conv`, `pw_conv`, ...) runs each member's checks on its view."""
        exprs = {k[len(prefix):]: v for k, v in self._exprs.items() if k.startswith(prefix)}
        return Match(self.rule, exprs, self._var2val, self.batch_dims)


def static_shape(expr) -> tuple[int, ...] | None:
    shape = getattr(_tvm.expr_type(expr), "shape", None)
    try:
        return tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        return None


def shape_dims(expr) -> list | None:
    """The dims of a value's shape as TIR expressions (IntImm, Var, ...); None when its shape or rank is unknown."""
    shape = getattr(_tvm.expr_type(expr), "shape", None)
    try:
        return list(shape)
    except TypeError:  # no shape, or an unknown rank
        return None


def batch_shape(expr, batch_dims: Collection[str] | None = None) -> tuple | None:
    """The shape as ints, except that the outermost dim may be a TIR variable (`--shape x=Nx3x224x224`): what
    the computes take, with the batch left symbolic. None when the shape is unknown or any other dim is
    symbolic (see symbolic_reason). With `batch_dims` (Match.batch_dims: the names of the symbolic dims the
    model's inputs declare), an outer variable not among them is refused too: a length computed inside the
    graph (Range's, a Shape-to-tensor cast) is bound where it is computed, not where the kernel runs."""
    dims = shape_dims(expr)
    if dims is None:
        return None
    out = []
    for i, d in enumerate(dims):
        if isinstance(d, tirx.IntImm):
            out.append(int(d))
        elif i == 0 and isinstance(d, tirx.Var) and (batch_dims is None or str(d.name) in batch_dims):
            out.append(d)
        else:
            return None
    return tuple(out)


def dim_name(d) -> str:
    """A symbolic dim's text: a variable's own name (str() prints TVMScript, which calls a dim named `T` `T_1`
    since T is its prefix for TIR), or the expression's text."""
    return str(d.name) if isinstance(d, tirx.Var) else str(d)


def undeclared_dims(expr, batch_dims: Collection[str]) -> list[str]:
    """The names of the variables in a value's shape that are not among `batch_dims` (in dim order)."""
    names = dict.fromkeys(str(v.name) for v in _dim_vars(expr))
    return [n for n in names if n not in batch_dims]


def _dim_vars(expr) -> list:
    """The TIR variables in a value's shape (a dim N, or N inside a dim N * 3), in dim order."""
    return [v for d in shape_dims(expr) or [] if not isinstance(d, tirx.IntImm) for v in tirx.analysis.undefined_vars(d)]


def declared_batch_dims(func) -> frozenset[str]:
    """The names of the symbolic dims a Relax function's parameters declare (the model's inputs bound with
    `--shape x=Nx...`): the only ones a kernel may keep symbolic."""
    return frozenset(str(v.name) for p in func.params for v in _dim_vars(p))


def is_symbolic(shape) -> bool:
    """Whether a batch_shape has a symbolic (outermost) dim."""
    return bool(shape) and not isinstance(shape[0], int)


def shape_text(value) -> str:
    """A value's (or a tuple of dims') shape for messages: (N, 3, 224, 224), (5,), or 'unknown'."""
    shape = value if isinstance(value, tuple) else getattr(_tvm.expr_type(value), "shape", None)
    try:
        dims = [int(d) if isinstance(d, (int, tirx.IntImm)) else dim_name(d) for d in shape]
    except TypeError:
        return "unknown"
    return str(tuple(dims)).replace("'", "")


def symbolic_reason(what: str, expr, batch_dims: Collection[str] | None = None) -> str:
    """Why a rule declines a value batch_shape refuses: its shape and what may stay symbolic, naming a dim
    computed inside the graph (not among `batch_dims`) when there is one."""
    inner = undeclared_dims(expr, batch_dims) if batch_dims is not None else []
    if inner:
        return (f"{what} has shape {shape_text(expr)}; its dim {inner[0]} is computed inside the graph (by a "
                f"data-dependent op such as Range), not a batch dim declared with --shape "
                f"({', '.join(sorted(batch_dims)) or 'none declared'}); only a declared batch may stay symbolic")
    return (f"{what} has shape {shape_text(expr)}; only the outermost (batch) dim may stay symbolic: bind the "
            "others with --shape (e.g. NAME=Nx3x224x224)")


def clip_bounds(call) -> tuple[float, float]:
    """(min, max) of a relax clip call."""
    def number(arg):
        while hasattr(arg, "value"):
            arg = arg.value
        return float(arg)

    return number(call.args[1]), number(call.args[2])


def scalar_constant(expr, float_only: bool = False) -> float | None:
    """The value of a size-1 relax constant (with `float_only`, only of a float dtype), else None."""
    if _tvm.is_constant(expr):
        value = _tvm.constant_value(expr)
        floating = value.dtype.kind == "f" or value.dtype.name == "bfloat16"  # ml_dtypes' bfloat16 has kind "V"
        if value.size == 1 and (floating or not float_only):
            return float(value.reshape(()))
    return None


def axis_vector(value: np.ndarray, out_shape, axis: int) -> np.ndarray | None:
    """`value` as one float64 number per position along `axis` of `out_shape`, when NumPy (ONNX)
    broadcasting makes it exactly that: its shape, right-aligned against the output rank, is 1 on every
    other axis (a size-1 value is the same number everywhere). None when it varies along another axis or
    has a higher rank than the output (it would change the output shape). Decided from the broadcast
    shape alone, never from the element count: a (C,) vector after an NCHW conv varies along W, not C."""
    rank = len(out_shape)
    axis %= rank
    if value.ndim > rank:
        return None
    aligned = (1,) * (rank - value.ndim) + tuple(value.shape)
    if any(d != 1 for i, d in enumerate(aligned) if i != axis) or aligned[axis] not in (1, out_shape[axis]):
        return None
    return np.broadcast_to(value.reshape(-1).astype(np.float64), (int(out_shape[axis]),)).copy()


def axis_vector_shapes(out_shape, axis: int) -> str:
    """The shapes `axis_vector` takes for (out_shape, axis), for decline messages: '(8, 1, 1) or (1, 8, 1, 1)'."""
    rank = len(out_shape)
    axis %= rank
    shortest = (int(out_shape[axis]),) + (1,) * (rank - 1 - axis)
    full = (1,) * axis + shortest
    return str(shortest) if shortest == full else f"{shortest} or {full}"


def commutative(op: str, a, b):
    """`op(a, b) | op(b, a)`: operand order of a commutative op, handled once. (dpl's `is_op` already
    matches relax.add and relax.multiply in either order, written order first: tests/test_commuted_operands.py
    checks it; this spells the intent out and keeps working if a TVM release stops doing so.)"""
    return dpl.is_op(op)(a, b) | dpl.is_op(op)(b, a)


@dataclass
class Rule:
    name: str
    build: Callable[[], Spec]
    priority: int = 0
    check: Callable[[Match], Decline | None] | None = None
    targets: tuple[str, ...] = DEFAULT_TARGETS
    doc: str = ""
    source: str = "<unknown>"
    _spec: Spec | None = field(default=None, repr=False)

    @property
    def spec(self) -> Spec:
        if self._spec is None:
            try:
                spec = self.build()
            except Exception as err:
                raise FusionError(f"{self.source}: rule {self.name!r} failed to build its pattern: "
                                  f"{type(err).__name__}: {err}") from None
            if not isinstance(spec, Spec):
                raise FusionError(f"{self.source}: rule {self.name!r} must return a Spec(pattern, "
                                  f"annotations, lower), got {type(spec).__name__}")
            self._spec = spec
        return self._spec

    def run_check(self, match: Match) -> Decline | None:
        for check in (self.spec.check, self.check):
            result = self._one_check(check, match) if check is not None else None
            if result is not None:
                return result
        return None

    def _one_check(self, check, match: Match) -> Decline | None:
        result = check(match)
        if result is not None and not isinstance(result, Decline):
            raise FusionError(f"{self.source}: check of rule {self.name!r} returned {result!r}; "
                              "return None to accept or decline('reason') to refuse")
        return result


def rule(name: str, *, priority: int = 0, check=None, targets: Iterable[str] = DEFAULT_TARGETS):
    """Declare a rule from a builder function that returns a Spec (see module docstring)."""

    def wrap(build: Callable[[], Spec]) -> Rule:
        doc = inspect.getdoc(build) or ""
        try:
            source = inspect.getsourcefile(build) or "<unknown>"
        except TypeError:
            source = "<unknown>"
        return Rule(name=name, build=build, priority=priority, check=check,
                    targets=tuple(targets), doc=doc.splitlines()[0] if doc else "", source=source)

    return wrap


def may_hold_rules(stem: str) -> bool:
    """Whether a module (by its file stem) is one the rule and kernel scans load: not a test (test_*, *_test,
    conftest) and not private (_*). The built-in package scans and a --rules folder use the same test."""
    return not stem.startswith(("_", "test_")) and not stem.endswith("_test") and stem != "conftest"


def close_names(name: str, names: Iterable[str]) -> str:
    names = sorted(names)
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    return f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(names) or '(none)'}"


class RuleSet:
    """An ordered registry of rules. Refuses duplicate names; unknown names get close candidates."""

    def __init__(self, rules: Iterable[Rule] = ()):
        self._rules: dict[str, Rule] = {}
        for r in rules:
            self.add(r)

    def add(self, r: Rule) -> None:
        if not isinstance(r, Rule):
            raise TypeError(f"expected a Rule, got {type(r).__name__}")
        if r.name in self._rules:
            raise FusionError(f"duplicate rule {r.name!r}: defined in {self._rules[r.name].source} "
                              f"and again in {r.source}; rename one of them")
        self._rules[r.name] = r

    def __getitem__(self, name: str) -> Rule:
        if name not in self._rules:
            raise FusionError(f"unknown rule {name!r}; {close_names(name, self._rules)}")
        return self._rules[name]

    def __contains__(self, name: str) -> bool:
        return name in self._rules

    def __iter__(self):
        return iter(self.ordered())

    def __len__(self) -> int:
        return len(self._rules)

    def names(self) -> list[str]:
        return [r.name for r in self.ordered()]

    def ordered(self) -> list[Rule]:
        """Highest priority first; ties keep registration order."""
        order = {n: i for i, n in enumerate(self._rules)}
        return sorted(self._rules.values(), key=lambda r: (-r.priority, order[r.name]))

    def select(self, only: Iterable[str] | None = None, disable: Iterable[str] | None = None) -> "RuleSet":
        """The subset named by `only` (all if None) minus `disable`; unknown names are errors."""
        only = [n for n in (only or []) if n]
        disable = [n for n in (disable or []) if n]
        for n in list(only) + list(disable):
            self[n]  # raises with candidates
        both = [n for n in only if n in disable]
        if both:
            raise FusionError(f"rule {both[0]} is both in --only and --disable; drop it from one of them")
        keep = [r for r in self._rules.values() if (not only or r.name in only) and r.name not in disable]
        return RuleSet(keep)

    def for_target(self, kind: str) -> "RuleSet":
        return RuleSet(r for r in self._rules.values() if kind in r.targets)

    def __add__(self, other: "RuleSet") -> "RuleSet":
        return RuleSet(list(self._rules.values()) + list(other._rules.values()))


def rules_in_module(module) -> list[Rule]:
    """The Rule objects a module defines, in definition order (or its `RULES` list, if it has one)."""
    if isinstance(getattr(module, "RULES", None), (list, tuple)):
        return list(module.RULES)
    return [v for v in vars(module).values() if isinstance(v, Rule)]
