"""Bug hunting with the random-graph strategy, beyond the pytest property (which stops at its first failure and
whose Hypothesis shrinking gives up after five minutes on graphs that take a second each to check):

    python -m tests.fuzz.explore run N SEED [image,tokens]   draw N graphs, check each, print every failure
                                                              with its class and its plan; never stops early
    python -m tests.fuzz.explore shrink FILE.txt | 'Plan(...)'
                                                              shrink a failing plan greedily while it fails
                                                              the same way, save it to regressions/

A failure's class (`classify`) is what the shrinker keeps: a known crash message, or the kind of mismatch
(shape / numeric) and whether unfused fails too.
"""

from __future__ import annotations

import re
import sys
import time
from collections import Counter

from hypothesis import HealthCheck, Phase, given, seed, settings

from tvm_fusion.loader import load_rules_for

from .oracle import GraphMismatch, InvalidGraph, check_against_onnxruntime
from .strategies import Plan, build, onnx_graphs
from .test_random_graphs import save_regression

#: crash messages -> class (the bugs of issue 8 that crash)
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
    rules, found = load_rules_for(), Counter()

    @seed(seed_)
    @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(graph=onnx_graphs(domains=domains))
    def check(graph):
        cls, _, err = outcome(graph.plan, rules)
        found[cls] += 1
        if cls != "pass":
            print(f"FAIL {cls}\nPLAN {graph.plan!r}\n{type(err).__name__}: {str(err)[:300]}", flush=True)

    start = time.perf_counter()
    check()
    print(f"{sum(found.values())} graphs in {time.perf_counter() - start:.0f} s: {dict(found)}")
    return found


def smaller(p: Plan):
    """Candidate plans one step simpler than `p`, most promising first."""
    def with_layers(layers):
        return Plan(p.domain, p.input_shape, p.seed, tuple(layers), p.names)

    layers = list(p.layers)
    for i in range(len(p.names)):
        yield Plan(p.domain, p.input_shape, p.seed, p.layers, p.names[:i] + p.names[i + 1:])
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
    for j, d in enumerate(p.input_shape):
        for nd in sorted({1, 2, 3, d // 2}):
            if nd < d:
                yield Plan(p.domain, p.input_shape[:j] + (nd,) + p.input_shape[j + 1:], p.seed, p.layers, p.names)
    if p.seed:
        yield Plan(p.domain, p.input_shape, 0, p.layers, p.names)


def shrink(plan: Plan):
    """The smallest plan (greedy, first improvement) that fails with the same class; saved to regressions/."""
    rules = load_rules_for()
    target, graph, err = outcome(plan, rules)
    if target in ("pass", "unbuildable", "invalid_graph"):
        raise SystemExit(f"the plan does not fail ({target})")
    improved = True
    while improved:
        improved = False
        for candidate in smaller(plan):
            cls, g, e = outcome(candidate, rules)
            if cls == target:
                plan, graph, err, improved = candidate, g, e, True
                break
    path = save_regression(graph, err)
    print(f"{target}: saved {path.name}\n{graph.description}\n{type(err).__name__}: {err}")
    return plan


def main(argv: list[str]) -> None:
    if argv[:1] == ["run"] and len(argv) in (3, 4):
        run(int(argv[1]), int(argv[2]), tuple(argv[3].split(",")) if len(argv) == 4 else ("image", "tokens"))
    elif argv[:1] == ["shrink"] and len(argv) == 2:
        text = open(argv[1]).read() if argv[1].endswith(".txt") else argv[1]
        match = re.search(r"build\((Plan\(.*\))\)\s*$", text, re.M)
        shrink(eval(match.group(1) if match else text, {"Plan": Plan}))  # noqa: S307 - our own plan repr
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
