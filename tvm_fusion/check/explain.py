"""`explain`: for every candidate chain, the rule that took it or each rule's reason for declining, the
near misses before the ops left to TVM (how far each rule's pattern got, trace.py), the ops left to TVM's
own fusion, the kernels of the fused build left without a schedule, per-rule counts and the share of ops
our rules cover."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from tvm_fusion._tvm import relax, tvm
from tvm_fusion.build.builder import legalize_traced, resolve_target
from tvm_fusion.build.mixed_precision import convert
from tvm_fusion.fusion.fuse import Decision, FuseResult, fuse, normalize_batch_norm
from tvm_fusion.rules import RuleSet
from tvm_fusion.patterns.qdq import fake_quant_notes
from tvm_fusion.fusion.trace import PartialMatch, near_misses
from tvm_fusion.build.unscheduled import Unscheduled, find_unscheduled
from tvm_fusion.frontend import importer as frontend
from tvm_fusion.fusion.loader import load_rules_for
from tvm_fusion.frontend.importer import onnx_node_names

__all__ = ["Explanation", "PartialMatch", "explain", "op_counts"]

NEAR_MISSES_SHOWN = 3  # per ONNX node in the text; Explanation.near_misses() has them all


def op_counts(func) -> Counter:
    """Relax operator calls in a function (call_tir counted as 'call_tir')."""
    counts: Counter = Counter()

    def visit(expr):
        if isinstance(expr, relax.Call) and hasattr(expr.op, "name"):
            counts[str(expr.op.name)] += 1

    relax.analysis.post_order_visit(func, visit)
    return counts


@dataclass
class Explanation:
    result: FuseResult
    ops_before: Counter
    ops_left: Counter
    module: tvm.IRModule | None = field(default=None, repr=False)  # as imported: what the tracer reads
    #: the fused build's kernels without a schedule (TVM's bare loops on the CPU; unscheduled.py)
    unscheduled: list[Unscheduled] = field(default_factory=list)
    _near: list[PartialMatch] | None = field(default=None, repr=False)

    @property
    def covered(self) -> int:
        return sum(self.ops_before.values()) - sum(self.ops_left.values())

    @property
    def share(self) -> float:
        total = sum(self.ops_before.values())
        return self.covered / total if total else 0.0

    def declined(self, rule: str | None = None) -> list[Decision]:
        return [d for d in self.result.decisions if d.reason and (rule is None or d.rule == rule)]

    def near_misses(self, rule: str | None = None) -> list[PartialMatch]:
        """The longest partial match of each rule (or of `rule`) before an op no group took: longest first,
        then the closest to a whole match, then by priority."""
        if self._near is None:
            found = [] if self.module is None else near_misses(
                self.module, self.result.groups, self.result.matched.rules, onnx_node_names(self.module))
            self._near = sorted(found, key=lambda m: (-len(m.matched), m.to_go, -m.priority))
        return [m for m in self._near if rule is None or m.rule == rule]

    def __str__(self) -> str:
        lines = ["fused groups (rule <- ONNX nodes):"]
        for g in self.result.groups:
            lines.append(f"  {g.function:28s} {g.rule:22s} <- {', '.join(g.onnx_nodes) or '?'}")
            if g.kernel:
                lines.append(f"  {'':28s}   kernel: {g.kernel}")
            lines += [f"  {'':28s}   {note}" for note in fake_quant_notes(g.attrs)]
        by_root = _by_node(self.declined())
        if by_root:
            lines += ["", "declined candidates (chain ending at ONNX node: rule: reason):"]
            for node, ds in by_root.items():
                for d in ds:
                    lines.append(f"  {node}: {d.rule}: {d.reason}")
        near = _by_node(self.near_misses())
        if near:
            lines += ["", "near misses (the longest partial match of each rule before an op no rule took):"]
            for node, ms in near.items():
                lines += [f"  {node}: {m}" for m in ms[:NEAR_MISSES_SHOWN]]
                if len(ms) > NEAR_MISSES_SHOWN:
                    lines.append(f"  {node}: ... and {len(ms) - NEAR_MISSES_SHOWN} more rules "
                                 "(Explanation.near_misses())")
        if self.ops_left:
            left = ", ".join(f"{op.replace('relax.', '')} x{n}" for op, n in sorted(self.ops_left.items()))
            lines += ["", f"left to TVM's own fusion: {left}"]
        if self.unscheduled:
            lines += ["", "kernels without a schedule (TVM's bare loops: one element at a time, one thread):"]
            lines += [f"  {u}" for u in self.unscheduled]
        else:
            lines += ["", "every kernel has a schedule"]
        fired = ", ".join(f"{k} {v}" for k, v in self.result.counts.items() if v) or "none"
        lines += ["", f"rules fired: {fired}",
                  f"ops covered by our rules: {self.covered} of {sum(self.ops_before.values())} ({self.share:.0%})"]
        return "\n".join(lines)


def _by_node(items: list) -> dict[str, list]:
    """Decisions or near misses grouped by their ONNX node, in order."""
    out: dict[str, list] = {}
    for item in items:
        out.setdefault(item.onnx_node, []).append(item)
    return out


def explain(model, target="llvm", *, shapes=None, rules: RuleSet | None = None, simplify: bool = True,
            precision: str | None = None) -> Explanation:
    """Fuse `model` (path, ModelProto or Relax IRModule) and explain every decision (`simplify=False`: an ONNX
    model imported as given, without the ONNX simplifier; `precision` "fp16" / "bf16": the float32 model
    converted first, as compile does, so each group's kernel is the one its library runs)."""
    mod = model if isinstance(model, tvm.IRModule) else frontend.import_onnx(model, shapes, simplify=simplify)
    mod = convert(mod, precision)
    rules = rules if rules is not None else load_rules_for()
    target = resolve_target(target)
    result = fuse(mod, target, rules)
    # counted after the BatchNorm normalisation that fuse applies first, so that "covered" is never negative
    before = op_counts(normalize_batch_norm(mod, frontend.onnx_node_names(mod))["main"])
    before.pop("relax.call_tir", None)
    left = op_counts(result.mod["main"])
    left.pop("relax.call_tir", None)
    left["relax.reshape"] -= sum(g.views for g in result.groups)  # the groups' own views are not ops left
    left = +left  # drops counts at or below 0
    legal, origins = legalize_traced(result.mod, target, "fused")
    return Explanation(result, before, left, mod, unscheduled=find_unscheduled(legal, origins))
