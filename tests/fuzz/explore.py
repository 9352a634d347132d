"""Bug hunting with the random-graph strategy, beyond the pytest property (which stops at its first failure and
whose Hypothesis shrinking gives up after five minutes on graphs that take a second each to check):

    python -m tests.fuzz.explore run N SEED [image,tokens]   draw N graphs, check each, print every failure
                                                              with its class and its plan; never stops early;
                                                              then how many were drawn per batch and dtype
    python -m tests.fuzz.explore shrink FILE.txt | 'Plan(...)'
                                                              shrink a failing plan greedily while it fails
                                                              the same way, save it to regressions/
    python -m tests.fuzz.explore kernels N SEED [conv,pool,dense] [compile]
                                                              draw N single kernels at real sizes (kernels.py),
                                                              check the fused build of each, print every
                                                              failure with its class, schedule plan and plan;
                                                              a conv / dense no rule took is "not_scheduled";
                                                              `compile`: build only (TVM_FUSION_CPU = AVX-512)
    python -m tests.fuzz.explore shrink_kernel FILE.txt | 'Plan(...)'
                                                              `shrink` for a kernel plan (under the same
                                                              TVM_FUSION_CPU: the .txt records it)

A failure's class (`classify`) is what the shrinker keeps: a known crash message, or the kind of mismatch
(shape / numeric) and whether unfused fails too.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings

from tvm_fusion.build.builder import build as fused_build
from tvm_fusion.frontend.importer import import_onnx
from tvm_fusion.fusion.loader import load_rules_for

from .kernels import SIZES, build_kernel, hand_schedule_used, kernels, plan_family
from .oracle import (
    GraphMismatch,
    InvalidGraph,
    check_against_onnxruntime,
    symbolic_shapes,
)
from .strategies import BATCH, Plan, build, onnx_graphs
from .test_random_graphs import save_regression

#: crash messages -> class (the known bugs that crash)
CRASHES = {"EmitOutput has to be called inside dataflow": "bn_if_emit_output",
           'Cannot find global var "main"': "node_named_main", "Found null pointer node": "null_pointer_import"}


def classify(err: BaseException) -> str:
    text = str(err)
    if isinstance(err, InvalidGraph):
        return "invalid_graph"
    if isinstance(err, GraphMismatch):
        kind = "shape" if "shape [" in text else "numeric"
        return f"{kind}_{'unfused_too' if 'unfused' in text else 'fused'}"
    crash = next((name for message, name in CRASHES.items() if message in text), None)
    return crash or re.sub(r"\W+", "_", f"{type(err).__name__}_{text[:40]}")


def outcome(plan: Plan, rules):
    """(class or "pass" / "unbuildable", graph, error)."""
    try:
        graph = build(plan)
    except Exception:  # noqa: BLE001 - a shrunk plan may no longer fit its shapes
        return "unbuildable", None, None
    try:
        check_against_onnxruntime(graph.model, rules)
        return "pass", graph, None
    except Exception as err:  # noqa: BLE001
        return classify(err), graph, err


def run(n: int, seed_: int, domains: tuple[str, ...]) -> Counter:
    rules, found, axes = load_rules_for(), Counter(), Counter()

    @seed(seed_)
    @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(graph=onnx_graphs(domains=domains))
    def check(graph):
        cls, _, err = outcome(graph.plan, rules)
        found[cls] += 1
        axes[(graph.plan.symbolic, graph.plan.dtype)] += 1
        if cls != "pass":
            print(f"FAIL {cls}\nPLAN {graph.plan!r}\n{type(err).__name__}: {str(err)[:300]}", flush=True)

    start = time.perf_counter()
    check()
    print("axes: " + ", ".join(f"{'symbolic' if symbolic else 'static'} {dtype}: {n}"
                               for (symbolic, dtype), n in sorted(axes.items())))
    print(f"{sum(found.values())} graphs in {time.perf_counter() - start:.0f} s: {dict(found)}")
    return found


def kernel_outcome(plan: Plan, graph, rules, compile_only: bool = False) -> tuple[str, BaseException | None]:
    """(class or "pass" / "not_scheduled", error) of one kernel: the fused build against onnxruntime (the
    unfused build skipped: see oracle.check_against_onnxruntime), and our rule must have taken the conv / dense.
    `compile_only`: the fused build alone (a target this CPU cannot run: AVX-512)."""
    try:
        if compile_only:
            mod = import_onnx(graph.model, shapes=symbolic_shapes(graph.model, SIZES)[0] or None)
            fused = fused_build(mod, "llvm", "fused", rules=rules)
        else:
            fused = check_against_onnxruntime(graph.model, rules, unfused=False, sizes=SIZES)
    except Exception as err:  # noqa: BLE001
        return classify(err), err
    if hand_schedule_used(plan, fused.counts) is False:
        return "not_scheduled", AssertionError(f"no conv / dense rule fired: {fused.counts}")
    return "pass", None


def run_kernels(n: int, seed_: int, kinds: tuple[str, ...], compile_only: bool = False) -> Counter:
    rules, found, families = load_rules_for(), Counter(), Counter()

    @seed(seed_)
    @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(graph=kernels(kinds))
    def check(graph):
        family = plan_family(graph.plan)
        families[family] += 1
        start = time.perf_counter()
        cls, err = kernel_outcome(graph.plan, graph, rules, compile_only)
        found[cls] += 1
        if cls != "pass":
            print(f"FAIL {cls} [{family}] ({time.perf_counter() - start:.1f} s)\n{graph.description}\n"
                  f"PLAN {graph.plan!r}\n{type(err).__name__}: {str(err)[:300]}", flush=True)

    start = time.perf_counter()
    check()
    print(f"plans: {dict(sorted(families.items()))}")
    print(f"{sum(found.values())} kernels in {time.perf_counter() - start:.0f} s: {dict(found)}")
    return found


def smaller(p: Plan):
    """Candidate plans one step simpler than `p`, most promising first (float32 and a static batch are simpler
    than float16 / bfloat16 and a symbolic one)."""
    def with_layers(layers):
        return replace(p, layers=tuple(layers))

    layers = list(p.layers)
    for i in range(len(p.names)):
        yield replace(p, names=p.names[:i] + p.names[i + 1:])
    for i in range(len(layers)):
        yield with_layers(layers[:i] + layers[i + 1:])
    for i, (name, params) in enumerate(layers):
        before, after = layers[:i], layers[i + 1:]
        if name == "block":
            inner = params["layers"]
            for j in range(len(inner)):
                if len(inner) > 1:
                    yield with_layers(before + [("block", dict(layers=inner[:j] + inner[j + 1:]))] + after)
            yield with_layers(before + list(inner) + after)
        elif name == "fork":
            for branch in (params["a"], params["b"]):
                yield with_layers(before + [branch] + after)
        elif name == "if":
            for key in ("then", "orelse"):
                if len(params[key]) > 1:
                    yield with_layers(before + [(name, {**params, key: params[key][:1]})] + after)
        elif name == "elementwise" and len(params["steps"]) > 1:
            steps = params["steps"]
            for j in range(len(steps)):
                yield with_layers(before + [(name, dict(steps=steps[:j] + steps[j + 1:]))] + after)
    if p.dtype != "float32":
        yield replace(p, dtype="float32")
    for j, d in enumerate(p.input_shape):
        for nd in [1] if d == BATCH else sorted({1, 2, 3, d // 2}):  # a symbolic batch: a static one
            if d == BATCH or nd < d:
                yield replace(p, input_shape=p.input_shape[:j] + (nd,) + p.input_shape[j + 1:])
    if p.seed:
        yield replace(p, seed=0)


def _greedy(plan: Plan, outcome_of, candidates):
    """The smallest plan (greedy, first improvement among `candidates(plan)`) that `outcome_of` (plan ->
    (class, graph, error)) classes as `plan`: (class, plan, graph, error)."""
    target, graph, err = outcome_of(plan)
    if target in ("pass", "unbuildable", "invalid_graph"):
        raise SystemExit(f"the plan does not fail ({target})")
    improved = True
    while improved:
        improved = False
        for candidate in candidates(plan):
            cls, g, e = outcome_of(candidate)
            if cls == target:
                plan, graph, err, improved = candidate, g, e, True
                break
    return target, plan, graph, err


def shrink(plan: Plan):
    """The smallest plan (greedy, first improvement) that fails with the same class; saved to regressions/."""
    rules = load_rules_for()
    target, plan, graph, err = _greedy(plan, lambda p: outcome(p, rules), smaller)
    path = save_regression(graph, err)
    print(f"{target}: saved {path.name}\n{graph.description}\n{type(err).__name__}: {err}")
    return plan


def smaller_kernel(p: Plan):
    """Kernel plans one step simpler than `p` (kernels.py): an epilogue layer dropped, fewer images, channels,
    pixels, output channels or features, no bias / padding / dilation / stride, the weights of seed 0."""
    def fewer(v: int, step: int = 1):
        return sorted({d for d in (step, v // 2 // step * step, v - step) if 0 < d < v})

    def with_(shape=None, layers=None):
        return Plan(p.domain, tuple(shape or p.input_shape), p.seed, tuple(layers or p.layers), p.names)

    (kind, params), rest = p.layers[0], list(p.layers[1:])
    for i in range(len(rest)):
        yield with_(layers=[p.layers[0], *rest[:i], *rest[i + 1:]])
    shape = list(p.input_shape)
    depthwise = kind == "conv" and params["groups"] == shape[1] > 1
    for j, d in enumerate(shape):
        for nd in fewer(d):
            if j == 1 and depthwise:  # the groups follow the channels
                per = params["cout"] // params["groups"]
                yield with_(shape[:1] + [nd] + shape[2:], [(kind, dict(params, groups=nd, cout=per * nd)), *rest])
            else:
                yield with_(shape[:j] + [nd] + shape[j + 1:])
    for key, value in params.items():
        if key in ("cout", "n"):
            for nv in fewer(value, params.get("groups", 1)):
                yield with_(layers=[(kind, dict(params, **{key: nv})), *rest])
        elif key in ("bias", "stride", "dilation", "pads") and value not in (False, None, 1, [0] * 4, (0,) * 4):
            simple = {"bias": False if kind == "conv" else None, "stride": 1, "dilation": 1, "pads": [0] * 4}[key]
            yield with_(layers=[(kind, dict(params, **{key: simple})), *rest])
    if p.seed:
        yield Plan(p.domain, p.input_shape, 0, p.layers, p.names)


def shrink_kernel(plan: Plan):
    """`shrink` for a kernel plan (`smaller_kernel`, `kernel_outcome`); saved to regressions/ with its
    `build_kernel(...)` line and the CPU target (TVM_FUSION_CPU) it failed on."""
    rules = load_rules_for()

    def outcome_of(p):
        try:
            graph = build_kernel(p)
        except Exception:  # noqa: BLE001 - a shrunk plan may no longer fit its shapes
            return "unbuildable", None, None
        cls, err = kernel_outcome(p, graph, rules)
        return cls, graph, err

    target, plan, graph, err = _greedy(plan, outcome_of, smaller_kernel)
    path = save_regression(graph, err)
    about = path.with_suffix(".txt")
    text = about.read_text().replace("rebuild: build(Plan(", "rebuild: build_kernel(Plan(")  # kernels.py
    cpu = os.environ.get("TVM_FUSION_CPU", "").strip()
    about.write_text(text + (f"target: {cpu}\n" if cpu else ""))
    print(f"{target} [{plan_family(plan)}]: saved {path.name}\n{graph.description}\n{type(err).__name__}: {err}")
    return plan


def _plan_of(arg: str, call: str) -> Plan:
    """The plan of a saved .txt (its `rebuild: <call>(Plan(...))` line), or a plan's repr."""
    text = Path(arg).read_text() if arg.endswith(".txt") else arg
    match = re.search(rf"{call}\((Plan\(.*\))\)\s*$", text, re.M)
    return eval(match.group(1) if match else text, {"Plan": Plan})  # noqa: S307 - our own plan repr


def main(argv: list[str]) -> None:
    if argv[:1] == ["run"] and len(argv) in (3, 4):
        run(int(argv[1]), int(argv[2]), tuple(argv[3].split(",")) if len(argv) == 4 else ("image", "tokens"))
    elif argv[:1] == ["kernels"] and len(argv) in (3, 4, 5):
        kinds = argv[3] if len(argv) > 3 and argv[3] != "compile" else "conv,conv,conv,pool,dense"
        run_kernels(int(argv[1]), int(argv[2]), tuple(kinds.split(",")), compile_only=argv[-1] == "compile")
    elif argv[:1] == ["shrink_kernel"] and len(argv) == 2:
        shrink_kernel(_plan_of(argv[1], "build_kernel"))
    elif argv[:1] == ["shrink"] and len(argv) == 2:
        shrink(_plan_of(argv[1], "build"))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
