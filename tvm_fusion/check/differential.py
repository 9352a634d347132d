"""Per-group differential check: every fused group against its own unfused subgraph, on the model's real
intermediate values, so a wrong group is named instead of showing up as a bad final output.

    y = G(a, b, ...)   for each composite call G in the matched module, in execution order:
        reference   G's original ops, unfused, inside the unfused build of the whole model
        fused       G's scheduled PrimFunc, on the reference values of a, b, ...
        |fused - reference| <= atol * scale(reference) + rtol * |reference|   per element
                                                                  (numerics.error_stats, by dtype)

`bisect` then disables the rules of the groups over tolerance, rebuilds the whole model and checks it
again, and repeats (a lower-priority rule may take the same match and make the same mistake), until the
model passes; when no group is to blame it tries each fired rule in turn, and finally all of them. With a
`deadline` (compile's verify step: --search-timeout) it stops at the first stage past it and reports what
it found so far (`BisectReport.timed_out`); a status line on a terminal names the step it is at.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np


from tvm_fusion import _tvm
from tvm_fusion._tvm import relax, tvm
from tvm_fusion.build.builder import build, default_rules
from tvm_fusion.check.prepared import prepare
from tvm_fusion.console import status, table
from tvm_fusion.errors import FusionError
from tvm_fusion.check.io import as_arrays, check_memory, device, gpu_available, input_tensors, run_onnxruntime, run_vm
from tvm_fusion.fusion.fuse import Matched, lower, match
from tvm_fusion.rules import RuleSet
from tvm_fusion.check.numerics import ErrorStats, error_stats
from tvm_fusion.check.half_reference import half_baseline
from tvm_fusion.precision import check_precision, verdict_dtype

__all__ = ["GroupCheck", "GroupReport", "BisectReport", "SearchTimedOut", "check_groups", "bisect", "unfused_module"]


class SearchTimedOut(Exception):
    """check_groups passed its deadline between two stages (bisect turns it into BisectReport.timed_out)."""


def _in_time(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise SearchTimedOut()


@dataclass
class GroupCheck:
    """One fused group: where it is, what it replaced, and how far it is from its unfused subgraph."""

    index: int  # execution order among the groups
    rule: str
    onnx_nodes: list[str]
    stats: ErrorStats

    def describe(self) -> str:
        nodes = ", ".join(self.onnx_nodes) or "?"
        return f"group {self.index} (rule {self.rule}; ONNX nodes {nodes})"


@dataclass
class GroupReport:
    model: str
    target: str
    groups: list[GroupCheck]
    outputs: list[ErrorStats]  # the whole model, fused vs unfused, per output
    output_names: list[str]
    judge_outputs: bool = True  # False: the outputs are reported only (a model ill-conditioned for half)

    @property
    def failing(self) -> list[GroupCheck]:
        return [g for g in self.groups if not g.stats.ok]

    @property
    def ok(self) -> bool:
        return not self.failing and (not self.judge_outputs or all(s.ok for s in self.outputs))

    def first_failure(self) -> str:
        if self.failing:
            g = self.failing[0]
            return f"{g.describe()} is the first over tolerance: {g.stats.describe()}"
        bad = [f"{n}: {s.describe()}" for n, s in zip(self.output_names, self.outputs) if not s.ok and self.judge_outputs]
        if bad:
            return "every group is within tolerance but not the outputs: " + "; ".join(bad)
        return ""

    def __str__(self) -> str:
        rows = [[g.index, g.rule, _nodes(g.onnx_nodes), f"{g.stats.n_bad}/{g.stats.size}", f"{g.stats.max_abs:.3g}",
                 f"{g.stats.max_rel:.3g}", g.stats.worst_element(), "ok" if g.stats.ok else "FAIL"] for g in self.groups]
        lines = [f"model {self.model}  target {self.target}  per-group check: each fused group vs its unfused "
                 "subgraph on the real intermediate values", "",
                 table(["#", "rule", "ONNX nodes", "elements off", "max abs err", "max rel err", "worst element", ""],
                        rows), ""]
        for name, s in zip(self.output_names, self.outputs):
            lines.append(f"output {name}: fused vs unfused {s.describe()} "
                         + (("ok" if s.ok else "FAIL") if self.judge_outputs else "(reported, not judged)"))
        n_bad = len(self.failing)
        lines += ["", f"PASS: all {len(self.groups)} groups within tolerance" if self.ok
                  else f"FAIL: {n_bad} of {len(self.groups)} groups over tolerance; " + self.first_failure()]
        return "\n".join(lines)


def _nodes(nodes: list[str], limit: int = 4) -> str:
    shown = ", ".join(nodes[:limit])
    return shown + (f" (+{len(nodes) - limit})" if len(nodes) > limit else "")


# ---------------------------------------------------------------- the two modules the check runs
def _composite_calls(mod: tvm.IRModule) -> list[relax.VarBinding]:
    """Top-level bindings of main whose value calls a composite function, in execution order."""
    out = []
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            value = b.value
            if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar):
                func = mod[value.op]
                if isinstance(func, relax.Function) and "Composite" in (func.attrs or {}):
                    out.append(b)
    return out


def _strip_composite(func: relax.Function) -> relax.Function:
    for key in ("Composite", "Primitive"):
        if key in (func.attrs or {}):
            func = func.without_attr(key)
    return func


def unfused_module(matched: Matched) -> tvm.IRModule:
    """The matched module with its composite functions made ordinary private functions: built "unfused", it
    runs every group's original ops (the per-group check's reference; compile's verify step's unfused build)."""
    mod = relax.transform.ToNonDataflow()(matched.mod)
    funcs = {gv: _strip_composite(f) if isinstance(f, relax.Function) else f for gv, f in mod.functions.items()}
    return tvm.IRModule(funcs, attrs=mod.attrs)


def _reference_module(matched: Matched, watched: list[relax.Var]) -> tvm.IRModule:
    """main returning (its outputs, the value of every watched var): the composite functions become
    ordinary private functions, so the unfused build runs each group's original ops."""
    mod = unfused_module(matched)
    main = mod["main"]
    # ToNonDataflow makes new Var objects: find the watched vars by position in the binding order
    old = [b.var for block in matched.mod["main"].body.blocks for b in block.bindings]
    new = [b.var for block in main.body.blocks for b in block.bindings]
    remap = {o: n for o, n in zip(old, new)}
    remap.update({p: p for p in main.params})
    result = relax.BlockBuilder().normalize(relax.Tuple([main.body.body, *[remap[v] for v in watched]]))
    body = relax.BlockBuilder().normalize(relax.SeqExpr(main.body.blocks, result))
    mod["main"] = relax.Function(main.params, body, None, main.is_pure, main.attrs)
    return relax.transform.Normalize()(mod)


def _group_module(matched: Matched, calls: list[relax.VarBinding], inputs: list[relax.Var]) -> tvm.IRModule:
    """main(inputs of the groups) returning every group's output: the composite calls alone."""
    params = {v: relax.Var(f"in{i}", _tvm.expr_type(v)) for i, v in enumerate(inputs)}
    bb = relax.BlockBuilder()
    with bb.function("main", list(params.values())):
        with bb.dataflow():
            outs = [bb.emit(relax.Call(b.value.op, [params.get(a, a) for a in b.value.args])) for b in calls]
            result = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(result)
    mod = bb.get()
    for gv, func in matched.mod.functions.items():
        if isinstance(func, relax.Function) and "Composite" in (func.attrs or {}):
            mod[gv] = func
    return mod


def _run(executable, dev, args) -> list:
    vm = relax.VirtualMachine(executable, dev)
    return vm["main"](*args)


# ---------------------------------------------------------------- the check
def check_groups(model, target="llvm", *, shapes: dict | None = None, rules: RuleSet | None = None,
                 seed: int = 0, arch: str = "sm_90", inputs=None, precision: str | None = None,
                 deadline: float | None = None, noise: list | None = None, simplify: bool = True) -> GroupReport:
    """Run every fused group of `model` against its unfused subgraph on the real intermediate values.

    `inputs`: a dict name -> array or an .npz path for some or all graph inputs (the rest: seeded random).
    `precision` "fp16" / "bf16": the float32 model converted first (tvm_fusion.precision); each group's
    half output is judged with its dtype's tolerance against the same ops unfused at the same precision, and
    the whole model's outputs only where the model is well-conditioned for the dtype (half_reference.half_baseline).
    `deadline` (time.monotonic()): SearchTimedOut between two stages past it. `noise`: per output, onnxruntime's
    own on these inputs (reference.Reference.noise), allowed in the whole model's fused-vs-unfused verdict.
    `simplify=False`: import the model as given (no ONNX simplifier). `model`: a path, a ModelProto, or a
    prepared.PreparedModel (then its target, shapes, inputs, precision and simplifier choice are used)."""
    # a symbolic dim is checked bound to one size (an --inputs array's, else the larger one compare runs)
    prepared = prepare(model, target, arch=arch, shapes=shapes, inputs=inputs, precision=precision,
                       simplify=simplify, bound=True)
    name, proto, mod, tgt, shapes, given = (prepared.name, prepared.proto, prepared.mod, prepared.target,
                                            prepared.shapes, prepared.given)
    precision = prepared.precision
    dev = _device(tgt)
    rules = rules if rules is not None else default_rules()
    matched = match(mod, tgt, rules)
    calls = _composite_calls(matched.mod)
    inputs = list(dict.fromkeys(a for b in calls for a in b.value.args if isinstance(a, relax.Var)))
    watched = inputs + [b.var for b in calls]
    check_memory(mod, 3, name, extra=watched * 2)  # each watched value: the reference's and the group's copy

    values, args = input_tensors(proto, shapes, seed, dev, given)
    # a model ill-conditioned for the half dtype (half_reference.half_baseline): its outputs are reported only
    judge_outputs = not check_precision(precision) or all(
        s.ok for s in half_baseline(proto, values, run_onnxruntime(proto, values, name=name)[0].run(None, values), precision))
    _in_time(deadline)
    reference = _run(build(_reference_module(matched, watched), tgt, "unfused").executable, dev, args)
    final, values = reference[0], list(reference)[1:]
    _in_time(deadline)
    value_of = dict(zip(watched, values))

    group_mod = _group_module(matched, calls, inputs)
    lowered, groups = lower(Matched(group_mod, matched.rules, matched.members, []), tgt)
    fused_out = run_vm(build(lowered, tgt, "tvm").executable, dev, [value_of[v] for v in inputs])
    checks = [GroupCheck(i, g.rule, g.onnx_nodes, error_stats(out, value_of[b.var].numpy()))
              for i, (g, b, out) in enumerate(zip(groups, calls, fused_out))]

    _in_time(deadline)
    whole, _ = lower(matched, tgt)  # the fused build of the whole model, from the same matches
    fused_model = run_vm(build(whole, tgt, "tvm").executable, dev, args)
    final = as_arrays(final)
    # onnxruntime's noise of the same inputs (compile's verify step); none where a shape differs
    noise = [n if n is not None and np.shape(n) == r.shape else None
             for n, r in zip(noise if noise is not None else [None] * len(final), final)]
    outputs = [error_stats(f, r, verdict_dtype(r.dtype, precision), n)
               for f, r, n in zip(fused_model, final, noise)]
    return GroupReport(name, str(tgt), checks, outputs, [o.name for o in proto.graph.output], judge_outputs)


def _device(target):
    if target.kind.name == "cuda":
        ok, why = gpu_available()
        if not ok:
            raise FusionError(f"the per-group check runs the builds, and --target cuda needs a GPU: {why}; "
                              "use --target llvm")
    return device(target)


# ---------------------------------------------------------------- bisect
@dataclass
class BisectReport:
    first: GroupReport | None  # None only when the search timed out before the per-group check finished
    culprits: list[str]  # rules whose disabling makes the model pass
    steps: list[tuple[list[str], bool, str]] = field(default_factory=list)  # (disabled, passed, detail)
    verdict: str = ""
    timed_out: bool = False  # stopped at its deadline: `culprits` and `verdict` say what it found by then

    def __str__(self) -> str:
        lines = [str(self.first) if self.first is not None else "per-group check: not finished", "", "bisect:"]
        for disabled, passed, detail in self.steps:
            lines.append(f"  disable {', '.join(disabled) or '(nothing)'}: {'PASS' if passed else 'FAIL'} ({detail})")
        lines += ["", self.verdict]
        return "\n".join(lines)


def bisect(model, target="llvm", *, shapes: dict | None = None, rules: RuleSet | None = None,
           seed: int = 0, arch: str = "sm_90", inputs=None, precision: str | None = None,
           timeout: float | None = None, noise: list | None = None, simplify: bool = True) -> BisectReport:
    """Find the rule(s) that break `model`: per-group check, then disable the rules of the groups over
    tolerance and rebuild, again and again (a lower-priority rule may take the same match and make the same
    mistake), accumulating the culprits until the model passes. When no group is to blame (the error only
    shows in the outputs) try each fired rule in turn, then all of them. `timeout` (seconds): stop at the
    first stage past it, with `timed_out` set and the verdict saying what was found by then."""
    rules = rules if rules is not None else default_rules()
    deadline = time.monotonic() + timeout if timeout is not None else None
    # loaded and imported once, bound as the per-group check needs it, for every round
    prepared = prepare(model, target, arch=arch, shapes=shapes, inputs=inputs, precision=precision,
                       simplify=simplify, bound=True)
    kw = {"seed": seed, "deadline": deadline, "noise": noise}
    report = BisectReport(None, [])
    with status("culprit search", timeout) as line:
        try:
            line.step("per-group check")
            report.first = check_groups(prepared, rules=rules, **kw)
            return _search(report, prepared, rules, kw, line)
        except SearchTimedOut:
            return _timed_out(report, timeout)


def _timed_out(report: BisectReport, timeout: float) -> BisectReport:
    report.timed_out = True
    found = report.first.first_failure() if report.first is not None else ""
    tried = f"; {len(report.steps)} rebuild(s) with rules disabled, none within tolerance" if report.steps else ""
    report.verdict = (f"the culprit search stopped after {timeout:g} s" + (f": {found}" if found else
                      " (the per-group check did not finish)") + tried)
    return report


def _search(report: BisectReport, model, rules: RuleSet, kw: dict, line: status) -> BisectReport:
    """bisect's rounds after the per-group check (`report.first`)."""
    first = report.first
    if first.ok:
        report.verdict = "nothing to bisect: every group and every output is within tolerance"
        return report
    disabled: list[str] = []
    fired: list[str] = []
    failing: list[GroupCheck] = []  # the blamed groups of every round, for the verdict
    current = first
    while True:
        fired = list(dict.fromkeys(fired + [g.rule for g in current.groups]))
        blamed = list(dict.fromkeys(g.rule for g in current.failing if g.rule not in disabled))
        if not blamed:
            break
        disabled += blamed
        failing += current.failing
        line.step("disable " + ", ".join(disabled))
        current = _bisect_step(report, model, rules, disabled, kw)
        if current.ok:
            return _culprits(report, disabled, failing)
    for extra in [[r] for r in fired if r not in disabled] + [[r for r in fired if r not in disabled]]:
        if not extra:
            continue
        line.step("disable " + ", ".join(disabled + extra))
        if _bisect_step(report, model, rules, disabled + extra, kw).ok:
            return _culprits(report, disabled + extra, failing)
    report.verdict = ("no culprit among the rules: the model is over tolerance even with every fired rule "
                      "disabled, so the difference is not made by fusion")
    return report


def _bisect_step(report: BisectReport, model, rules: RuleSet, disabled: list[str], kw) -> GroupReport:
    again = check_groups(model, rules=rules.select(disable=disabled), **kw)
    worst = max((s.max_rel for s in again.outputs), default=0.0)
    off = sum(s.n_bad for s in again.outputs)
    bad = [g.rule for g in again.failing]
    detail = (f"outputs: {off} elements off, max rel error {worst:.3g}"
              + (f"; groups over tolerance: {', '.join(bad)}" if bad else ""))
    report.steps.append((list(disabled), again.ok, detail))
    return again


def _culprits(report: BisectReport, disabled: list[str], failing: list[GroupCheck]) -> BisectReport:
    report.culprits = list(disabled)
    broke = [g.describe() for g in failing if g.rule in disabled]
    report.verdict = (f"culprit: rule(s) {', '.join(disabled)}: "
                      + (f"{len(broke)} group(s) over tolerance, first {broke[0]}; " if broke else "")
                      + "with them disabled the model is within tolerance. "
                      + "Fix the rule, or run with " + " ".join(f"--disable {r}" for r in disabled))
    return report
