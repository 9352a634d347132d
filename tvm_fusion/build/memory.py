"""Peak activation memory of a build, read from TVM's own memory plan.

    plan        the legalized module through the target's lower passes up to and including Relax's
                `StaticPlanBlockMemory` (what tvm.compile runs next): every intermediate tensor the planner can
                reuse storage for is a `memory.alloc_tensor` on a `memory.alloc_storage(R.shape([bytes]))`
    peak        the sum of those storages (the plan allocates each once per inference and reuses it for every
                tensor placed on it) plus what the plan leaves to the runtime: the outputs `main` returns and a
                tensor the planner does not take (`builtin.alloc_tensor`); of an If, its larger branch
    symbolic    a batch dim with an upper bound (`--shape x=N<=64x...`) is planned at the bound (TVM reads the
                `tir_var_upper_bound` attribute); without one the sizes stay formulas in the dim: linear ones
                are reported per sample
    a group     `plan_groups(legal, target, [vars, ...])`: TVM's plan of some bindings of `main` alone (a
                fused group's ops in the unfused build), so the storage its intermediates take is TVM's figure

Inputs and weights are not activations and are not counted. On CUDA the figures are those of the plan before
`RewriteCUDAGraph`: a CUDA graph moves the same storages into its capture function.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tvm_fusion import _tvm
from tvm_fusion._tvm import Analyzer, detect_linear_equation, relax, tirx, tvm
from tvm_fusion.build import pipeline

__all__ = ["MemoryPlan", "plan_memory", "plan_groups", "PLAN_PASS", "format_bytes", "report_lines"]

PLAN_PASS = "StaticPlanBlockMemory"
_ALLOC_STORAGE = "relax.memory.alloc_storage"
_BUILTIN_ALLOC = "relax.builtin.alloc_tensor"
_UPPER_BOUND = "tir_var_upper_bound"  # frontend.importer.UPPER_BOUND_ATTR: {dim: bound} on main
#: passes run before the plan when a slice of main is planned (the slice is already out of its dataflow block)
_BEFORE_SLICE = ("RewriteDataflowReshape", "ToNonDataflow")


@dataclass(frozen=True)
class MemoryPlan:
    """What TVM's static plan allocates for one inference's activations, in bytes: an int, or a TIR
    expression in the symbolic dims without an upper bound."""

    storages: tuple  # one per memory.alloc_storage: the planned, reused storages
    unplanned: object  # outputs and tensors the planner leaves to the runtime (builtin.alloc_tensor)
    tensors: int  # intermediate tensors placed on the storages
    bounds: dict = field(default_factory=dict)  # {symbolic dim: upper bound} the plan used

    @property
    def planned(self):
        return _sum(self.storages)

    @property
    def peak(self):
        return _sum([self.planned, self.unplanned])

    @property
    def static(self) -> bool:
        return isinstance(self.peak, int)

    def per_sample(self) -> tuple[str, int, int] | None:
        """(dim, bytes per unit of it, constant bytes) when the peak is linear in one symbolic dim."""
        return _linear(self.peak)

    def describe(self) -> str:
        """`1.57 MB (3 storages 1.05 MB for 9 tensors + outputs 0.52 MB)`; with a bound, `at N<=64`; a symbolic
        dim without one: `N x 0.52 MB per sample` (or TVM's formula in bytes)."""
        parts = (f"{len(self.storages)} storage{'s' * (len(self.storages) != 1)} {format_bytes(self.planned)} "
                 f"for {self.tensors} tensor{'s' * (self.tensors != 1)} + outputs {format_bytes(self.unplanned)}")
        bound = ", ".join(f"{k}<={v}" for k, v in sorted(self.bounds.items()))
        return f"{format_bytes(self.peak)} ({parts})" + (f" at the upper bound {bound}" if bound else "")

    def to_json(self) -> dict:
        linear = self.per_sample()
        return {"peak_bytes": self.peak if self.static else None, "planned_bytes": _json(self.planned),
                "storages": [_json(s) for s in self.storages], "tensors": self.tensors,
                "outputs_bytes": _json(self.unplanned), "formula": None if self.static else str(self.peak),
                "per_sample": None if linear is None else {"dim": linear[0], "bytes": linear[1],
                                                           "constant_bytes": linear[2]},
                "upper_bounds": dict(self.bounds), "source": f"TVM {PLAN_PASS}"}


def format_bytes(value) -> str:
    """Bytes as MB (1e6) with three decimals; a symbolic size linear in one dim per sample, else TVM's formula."""
    value, linear = _int(value), _linear(value)
    if isinstance(value, int):
        return f"{value / 1e6:.3f} MB"
    if linear is None:
        return f"{value} bytes"
    dim, per, const = linear
    return f"{dim} x {per / 1e6:.3f} MB per sample" + (f" + {const / 1e6:.3f} MB" if const else "")


def _linear(value) -> tuple[str, int, int] | None:
    """(dim, coefficient, constant) of a size linear in one symbolic dim with constant coefficients."""
    value = _int(value)
    if isinstance(value, int):
        return None
    free = sorted({v.name: v for v in _tir_vars(value)}.items())
    if len(free) != 1:
        return None
    coeffs = [_int(c) for c in detect_linear_equation(value, [free[0][1]])]
    return (free[0][0], *coeffs) if len(coeffs) == 2 and all(isinstance(c, int) for c in coeffs) else None


def report_lines(plans, bound_at: str = "") -> list[str]:
    """A heading and one line per build, for (mode, MemoryPlan) pairs: what compare and profile print.
    `bound_at`: the sizes the symbolic dims were bound to before building ("N=3"), said in the heading."""
    plans = [(m, p) for m, p in plans if p is not None]
    if not plans:
        return []
    width = max(len(m) for m, _ in plans)
    at = f" at {bound_at}, the size built" if bound_at else ""
    return (["", f"peak activation memory (TVM's static memory plan: reused storages + outputs; inputs and weights "
             f"not counted){at}:"] + [f"  {m:<{width}}  {p.describe()}" for m, p in plans])


def planned_module(legal, target, before=()):
    """`legal` through `before` and the target's lower passes up to and including StaticPlanBlockMemory."""
    passes = [p for p in pipeline.lower_passes(target) if p.info.name not in before]
    names = [p.info.name for p in passes]
    cut = names.index(PLAN_PASS) + 1
    with target, tvm.transform.PassContext(opt_level=3):
        return pipeline.sequential(passes[:cut], "plan_memory")(legal)


def plan_memory(legal, target) -> MemoryPlan:
    """TVM's memory plan of a legalized module's `main` (builder.Built.module, what tvm.compile lowers)."""
    return _read(planned_module(legal, target)["main"])


def plan_groups(legal, target, groups) -> list[MemoryPlan | None]:
    """TVM's plan of each list of bindings of `main` (given by their vars, in binding order) made a function of
    its own: its parameters what the bindings read from outside, its outputs what is read after them (or
    returned). For a fused group's ops in the unfused build, `planned` is the storage its intermediates take;
    None for an empty list or a var that is not bound at the top level of `main`."""
    flat = _flat(legal, target)
    main = flat["main"]
    bindings = [b for blk in main.body.blocks for b in blk.bindings]
    original = [b.var for blk in legal["main"].body.blocks for b in blk.bindings]
    if [_tvm.var_name(v) for v in original] != [_tvm.var_name(b.var) for b in bindings]:
        return [None for _ in groups]  # the flattening changed the bindings: no position to go by
    position = {v: i for i, v in enumerate(original)}
    others = {gv: f for gv, f in flat.functions.items() if gv.name_hint != "main"}
    out = []
    for group in groups:
        if not group or any(v not in position for v in group):
            out.append(None)
            continue
        sliced = tvm.IRModule(dict(others))
        sliced["main"] = _slice(main, bindings, {position[v] for v in group})
        out.append(_read(planned_module(sliced, target, before=_BEFORE_SLICE)["main"]))
    return out


def _slice(main, bindings, chosen_at: set):
    """The bindings at positions `chosen_at` as a function: free vars in, vars read after them (or returned) out."""
    chosen = [b for i, b in enumerate(bindings) if i in chosen_at]
    inside = {b.var for b in chosen}
    used_later = {v for b in bindings if b.var not in inside for v in relax.analysis.free_vars(b.value)}
    used_later |= set(relax.analysis.free_vars(main.body.body))
    outputs = [b.var for b in chosen if b.var in used_later] or [chosen[-1].var]
    types = [_tvm.expr_type(v) for v in outputs]
    ret, ret_type = (outputs[0], types[0]) if len(outputs) == 1 else (relax.Tuple(outputs), relax.TupleType(types))
    body = relax.SeqExpr([relax.BindingBlock(chosen)], ret)
    params = [v for v in relax.analysis.free_vars(body) if v not in inside]
    func = relax.Function(params, body, ret_type, is_pure=True).with_attr("global_symbol", "main")
    if _bounds(main):  # TVM plans a symbolic dim of the signature at its upper bound
        func = func.with_attr(_UPPER_BOUND, main.attrs[_UPPER_BOUND])
    return func


def _flat(legal, target):
    passes = [p for p in pipeline.lower_passes(target) if p.info.name in _BEFORE_SLICE]
    with target, tvm.transform.PassContext(opt_level=3):
        return pipeline.sequential(passes, "flatten")(legal)


# ---------------------------------------------------------------- reading the planned module
def _read(main) -> MemoryPlan:
    """The plan of a planned `main`; what the planner left symbolic (the outputs) taken at the upper bounds it
    planned with, like the storages."""
    storages, unplanned, tensors = _walk(main.body)
    bounds = _bounds(main)
    return MemoryPlan(tuple(_at(s, bounds) for s in storages), _at(unplanned, bounds), tensors, bounds)


def _at(value, bounds: dict):
    """`value` with each symbolic dim that has an upper bound set to it."""
    value = _int(value)
    if isinstance(value, int) or not bounds:
        return value
    analyzer = Analyzer()
    for var in _tir_vars(value):
        if var.name in bounds:
            analyzer.bind(var, tirx.IntImm("int64", bounds[var.name]))
    return _int(analyzer.simplify(value))


def _walk(seq) -> tuple[list, object, int]:
    """(storage sizes, unplanned bytes, tensors placed on storages) of a SeqExpr; an If: the larger branch."""
    storages, unplanned, tensors = [], 0, 0
    alloc_storage, builtin_alloc = tvm.ir.Op.get(_ALLOC_STORAGE), tvm.ir.Op.get(_BUILTIN_ALLOC)
    alloc_tensor = tvm.ir.Op.get("relax.memory.alloc_tensor")
    for block in seq.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call) and v.op.same_as(alloc_storage):
                storages.append(_int(v.args[0].values[0]))
            elif isinstance(v, relax.Call) and v.op.same_as(alloc_tensor):
                tensors += 1
            elif isinstance(v, relax.Call) and v.op.same_as(builtin_alloc):
                unplanned = _sum([unplanned, _tensor_bytes(v.args[0].values, v.args[1].value)])
            elif isinstance(v, relax.If):
                branches = [_walk(v.true_branch), _walk(v.false_branch)]
                sizes = [_sum([_sum(s), u]) for s, u, _ in branches]
                s, u, t = branches[0] if _larger(sizes[0], sizes[1]) else branches[1]
                storages += s
                unplanned, tensors = _sum([unplanned, u]), tensors + t
    return storages, unplanned, tensors


def _tensor_bytes(shape, dtype) -> object:
    dt = tvm.DataType(str(dtype))
    size = (dt.bits * dt.lanes + 7) // 8
    for d in shape:
        size = size * d if not isinstance(_int(d), int) else size * _int(d)
    return _int(size)


def _bounds(func) -> dict:
    attr = func.attrs.get(_UPPER_BOUND) if func.attrs is not None else None
    return {str(k): int(v) for k, v in attr.items()} if attr else {}


def _int(value):
    """An int for a constant (Python int or TIR IntImm), else the simplified TIR expression."""
    if isinstance(value, int):
        return value
    if isinstance(value, tirx.IntImm):
        return int(value.value)
    simplified = Analyzer().simplify(value)
    return int(simplified.value) if isinstance(simplified, tirx.IntImm) else simplified


def _sum(values):
    """The sum of sizes: an int while all are constants, else the simplified TIR expression."""
    total = 0
    for v in map(_int, values):
        if isinstance(total, int) and isinstance(v, int):
            total += v
        else:
            total = _int(_prim(total) + _prim(v))
    return total


def _prim(value):
    return tirx.IntImm("int64", value) if isinstance(value, int) else value


def _larger(a, b) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a >= b
    return isinstance(b, int)  # a symbolic branch counts as the larger one


def _tir_vars(expr) -> list:
    return list(tirx.analysis.undefined_vars(expr))


def _json(value):
    value = _int(value)
    return value if isinstance(value, int) else str(value)
