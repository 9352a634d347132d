"""Random ONNX graphs (strategies.py): fused and unfused match onnxruntime element by element, with its shapes
and dtypes (oracle.py), on every drawn graph, and the strategy is not vacuous (every rule family fires, escaped
values stop fusions). The graphs are drawn with a static or a symbolic batch (one build, run at batch 1 and 3:
oracle.BATCHES; half of them with an upper bound, 3 or 16), in float32, float16 or bfloat16 (against the float32
graph: see oracle.py), with odd node and value names (inside If branches and Loop bodies too) and with any
layer nested in an If branch or a Loop body. A few are built for CUDA as well (sm_90, nvcc; nothing runs): the
groups are the llvm build's, or a CUDA schedule declined one with a reason.

A failing graph is saved to tests/fuzz/regressions/<hash>.onnx (+ .txt), which test_regressions.py runs
from then on; see regressions/README.md.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis.control import current_build_context

from tvm_fusion.build.builder import resolve_target
from tvm_fusion.frontend.importer import import_onnx
from tvm_fusion.fusion.fuse import fuse
from tvm_fusion.precision import numpy_dtype
from tvm_fusion.testing import check_cuda_build, check_fused

from .oracle import (InvalidGraph, check_against_onnxruntime, elementwise_mismatch, model_inputs, reference_outputs,
                     symbolic_shapes)
from .strategies import BATCH, Plan, build, onnx_graphs

ROOT = Path(__file__).resolve().parents[2]
REGRESSIONS = Path(__file__).resolve().parent / "regressions"
#: each graph runs in onnxruntime and builds twice (~1 s on a 2-core host); ci profile: 60 derandomized graphs in
#: the default run, 240 others under the slow marker (CI runs both); explore: 300 + 1200 fresh ones
EXAMPLES = 3 * settings.default.max_examples
SLOW_EXAMPLES = 20 * settings.default.max_examples
#: CUDA builds (fuse for llvm and CUDA, build, nvcc; ~2 s each): a few in the default run, more under slow
CUDA_EXAMPLES = 4
SLOW_CUDA_EXAMPLES = 5 * settings.default.max_examples
COVERAGE_EXAMPLES = 200  # at most; fuse only, no builds, and none once every family has fired
FAMILIES = {"conv": ("conv2d",), "dense": ("dense_",), "layer_norm": ("layer_norm", "add_layer_norm"),
            "elementwise": ("elementwise_chain_", "add_relu"), "squeeze_excite": ("squeeze_excite_",),
            "attention": ("attention",)}
ESCAPE = "has another consumer"  # the event of a match declined by an intermediate used outside it


def family(rule: str) -> str:
    return next((name for name, prefixes in FAMILIES.items() if rule.startswith(prefixes)), "other")


def blocked_by_consumer(decisions) -> list[str]:
    """The reasons of matches declined because an intermediate has a consumer outside the match."""
    return [d.reason for d in decisions
            if d.reason and d.reason.startswith("intermediate ") and " consumers " in d.reason]


def save_regression(graph, error: BaseException) -> Path:
    """Write the failing model as regressions/<hash>.onnx, with its description, plan and error beside it."""
    data = graph.model.SerializeToString()
    path = REGRESSIONS / f"{hashlib.sha1(data).hexdigest()[:10]}.onnx"
    REGRESSIONS.mkdir(exist_ok=True)
    path.write_bytes(data)
    path.with_suffix(".txt").write_text(f"{graph.description}\n\nrebuild: build({graph.plan!r})\n\n"
                                        f"failed with {type(error).__name__}: {error}\n")
    return path


@settings(max_examples=EXAMPLES)
@given(graph=onnx_graphs())
def test_property_random_graph_fused_matches_onnxruntime(graph, rules):
    check_random_graph(graph, rules)


@pytest.mark.slow
@settings(max_examples=SLOW_EXAMPLES)
@given(graph=onnx_graphs())
def test_property_more_random_graphs_fused_match_onnxruntime(graph, rules):
    """The same property on further graphs (a derandomized test draws its own sequence, seeded by its name)."""
    check_random_graph(graph, rules)


def saving_regression(graph, what: str, check):
    """`check()`, whose failure on the final (shrunk) example is saved as a regression (not an InvalidGraph: the
    strategy's own bug)."""
    try:
        return check()
    except InvalidGraph:
        raise
    except Exception as err:
        if not current_build_context().is_final:  # shrinking: only the final, smallest example is saved
            raise
        path = save_regression(graph, err).relative_to(ROOT)
        raise AssertionError(f"{what} failed on this graph:\n{graph.description}\n{type(err).__name__}: {err}\n"
                             f"saved as {path} (+ .txt); tests/fuzz/test_regressions.py now runs it") from err


def check_random_graph(graph, rules) -> None:
    """Fused and unfused builds of `graph` match onnxruntime; a failure's smallest graph is saved as a regression."""
    fused = saving_regression(graph, "fused build", lambda: check_against_onnxruntime(graph.model, rules,
                                                                                     bounds=_bounds(graph)))
    event(f"domain {graph.plan.domain}")
    batch = f"symbolic <= {graph.plan.bound}" if graph.plan.bound else "symbolic" if graph.plan.symbolic else "static"
    event(f"batch {batch}, {graph.plan.dtype}")
    if any(n.op_type in ("If", "Loop") for n in graph.model.graph.node):
        event("nested: If / Loop")
    for rule, n in fused.counts.items():
        if n:
            event(f"family {family(rule)}")
            event(f"rule {rule}")
    if blocked_by_consumer(fused.fused.decisions):
        event(f"declined: an intermediate {ESCAPE}")


def _bounds(graph) -> dict | None:
    """The symbolic batch's upper bound as oracle.check_against_onnxruntime takes it."""
    return {BATCH: graph.plan.bound} if graph.plan.bound else None


def check_cuda_groups(graph, rules) -> dict:
    """`graph` fused and built for CUDA (sm_90, compiled by nvcc: testing.check_cuda_build; nothing runs), with
    its symbolic batch and bound: the rules that fire are the llvm fusion's, or where one fires less often on
    CUDA, the CUDA fusion declined it with a reason (a schedule's `supports`). Returns the CUDA counts."""
    shapes = symbolic_shapes(graph.model, {}, _bounds(graph))[0] or None
    llvm = fuse(import_onnx(graph.model, shapes), resolve_target("llvm"), rules)
    cuda = check_cuda_build(graph.model, rules, shapes=shapes)
    fewer = {r for r, n in llvm.counts.items() if n > cuda.counts.get(r, 0)}
    declined = {d.rule for d in cuda.fused.decisions if d.reason}
    assert fewer <= declined, (f"rules that fire on llvm and less on CUDA without a reason: {sorted(fewer - declined)}; "
                               f"llvm {_fired(llvm.counts)}, CUDA {_fired(cuda.counts)}")
    if not fewer:
        assert _fired(cuda.counts) == _fired(llvm.counts), (_fired(llvm.counts), _fired(cuda.counts))
    return cuda.counts


def _fired(counts: dict) -> dict:
    return {r: n for r, n in counts.items() if n}


@settings(max_examples=CUDA_EXAMPLES)
@given(graph=onnx_graphs())
def test_property_random_graph_builds_for_cuda(graph, rules):
    """Drawn graphs (every axis: symbolic batch and bound, half dtypes, odd names, If / Loop nesting) build for
    CUDA with the llvm build's groups, or a reason where a CUDA schedule declines one."""
    check_random_graph_for_cuda(graph, rules)


@pytest.mark.slow
@settings(max_examples=SLOW_CUDA_EXAMPLES)
@given(graph=onnx_graphs())
def test_property_more_random_graphs_build_for_cuda(graph, rules):
    check_random_graph_for_cuda(graph, rules)


def check_random_graph_for_cuda(graph, rules) -> None:
    """`check_cuda_groups` in a property: a failure's final (shrunk) example is saved as a regression."""
    counts = saving_regression(graph, "CUDA build", lambda: check_cuda_groups(graph, rules))
    for rule, n in counts.items():
        if n:
            event(f"family {family(rule)}")


#: families that only their own layer kind makes (the others come from several kinds and from blocks)
ONLY_FROM = {"squeeze_excite": "squeeze_excite", "attention": "attention", "layer_norm": "layer_norm"}


def _kinds(plan) -> set[str]:
    """The families of ONLY_FROM whose layer kind the plan has (at the top, as a fork's branch or nested)."""
    names = {name for name, _ in plan.layers}
    names |= {params[k][0] for name, params in plan.layers if name == "fork" for k in ("a", "b")}
    names |= {params["layer"][0] for name, params in plan.layers if name == "nested"}
    return {f for f, kind in ONLY_FROM.items() if kind in names}


def test_strategy_is_not_vacuous(rules):
    """Within a fixed (derandomized) sequence of drawn graphs (every axis: batch, bound, dtype, names, nesting),
    every family fires and some match is declined because an intermediate has another consumer: the property
    above exercises real fusions. The graphs are fused only until all have been seen, and once only SE,
    attention or LayerNorm is missing, only graphs with that layer kind (10 s on one core)."""
    target = resolve_target("llvm")
    fired, domains, blocked = Counter(), Counter(), []

    @settings(max_examples=COVERAGE_EXAMPLES, derandomize=True, database=None)
    @given(graph=onnx_graphs())
    def collect(graph):
        missing = {f for f in FAMILIES if not fired[f]}
        if len(domains) == 2 and blocked and not (missing - set(ONLY_FROM)) and not missing & _kinds(graph.plan):
            return  # nothing left to see, or none of the layers whose family is still missing: not fused
        result = fuse(import_onnx(graph.model, symbolic_shapes(graph.model, {})[0] or None), target, rules)
        domains[graph.plan.domain] += 1
        fired.update(family(r) for r, n in result.counts.items() if n)
        blocked.extend(blocked_by_consumer(result.decisions))

    collect()
    assert set(domains) == {"image", "tokens"}, domains
    assert all(fired[f] for f in FAMILIES), f"families fired over {COVERAGE_EXAMPLES} graphs: {dict(fired)}"
    assert blocked, "no drawn graph had a match declined by an intermediate with another consumer"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_reference_noise_still_fails_a_wrong_result(dtype):
    """A half graph is judged with, per element, how far onnxruntime's float32 run moves when every node's
    output is rounded to the half type (oracle.rounded_per_node); bfloat16 against that float32 run (the
    values rounded once pass), float16 against onnxruntime's own float16 run; 10% off fails."""
    plan = Plan("tokens", (3, 5, 8), 2, (
        ("dense", dict(op="MatMul", n=8, bias="after", batched_weight=False, bias_rank=1)),
        ("layer_norm", dict(LN, residual="x")), ("act", dict(act="gelu_erf", form="Gelu"))), dtype=dtype)
    model = build(plan).model
    ref, dtypes, noise = reference_outputs(model, model_inputs(model, {}, 0))
    (r,), (d,), (n,) = ref, dtypes, noise
    assert d == (dtype if dtype == "bfloat16" else None) and n.shape == r.shape and n.max() < 0.05 * np.abs(r).max()
    half = numpy_dtype(dtype)
    assert elementwise_mismatch(r.astype(half), r, d, n) is None
    assert "elements off" in elementwise_mismatch((r * 1.1).astype(half), r, d, n)


# ---------------------------------------------------------------- plans whose fusions are known exactly
CONV3 = dict(cout=8, k=3, stride=1, pads=[1, 1, 1, 1], dilation=1, groups=1, bias=False)
RELU = dict(act="relu", form="Relu")
LN = dict(form="op", residual=None, epsilon=1e-5, axis=-1)

#: name -> (plan, exact counts, the rules declined because an intermediate has another consumer)
KNOWN = {
    "resnet_basic_block": (Plan("image", (1, 8, 8, 8), 0, (
        ("block", dict(layers=(("conv", CONV3), ("bn", {}), ("act", RELU)))),
        ("block", dict(layers=(("conv", CONV3), ("bn", {}),
                               ("skip_add", dict(other="x", op="Add", other_first=False)), ("act", RELU)))),
    )), {"conv2d_bn_relu": 1, "conv2d_bn_add_relu": 1}, set()),
    # the BatchNorm output is also a graph output: conv + BN fuse, the relu is left to TVM
    "escaped_bn_output": (Plan("image", (1, 4, 8, 8), 1, (
        ("conv", dict(CONV3, cout=6)), ("bn", {}), ("escape", {}), ("act", RELU),
    )), {"conv2d_bn": 1}, {"conv2d_bn_relu"}),
    # the dense output feeds Gelu and LayerNorm: dense + bias fuse without the Gelu
    "forked_dense_output": (Plan("tokens", (2, 5, 8), 2, (
        ("dense", dict(op="MatMul", n=8, bias="after")),
        ("fork", dict(a=("act", dict(act="gelu_erf", form="Gelu")), b=("layer_norm", LN), join="Add")),
    )), {"dense_bias": 1, "layer_norm": 1}, {"dense_bias_gelu_erf"}),
    # pre-LN: the residual sum is kept (an output), so the LayerNorm is fused without the add
    "escaped_residual_sum": (Plan("tokens", (2, 5, 8), 3, (
        ("bias_add", dict(shape=(8,), const_first=False)),
        ("skip_add", dict(other="x", op="Add", other_first=True)), ("escape", {}),
        ("layer_norm", dict(LN, form="decomposed")),
    )), {"layer_norm": 1}, {"add_layer_norm"}),
    "residual_layer_norm_after_gemm": (Plan("tokens", (3, 6), 4, (
        ("dense", dict(op="Gemm", n=6, bias="C", trans_b=True, alpha=1.0)),
        ("layer_norm", dict(LN, residual="x")),
    )), {"dense_bias": 1, "add_layer_norm": 1}, set()),
    "elementwise_chain": (Plan("image", (2, 3, 5, 5), 5, (
        ("elementwise", dict(steps=(("Mul", "scalar", False), ("Add", "channel", True), ("Tanh", None, False)))),
    )), {"elementwise_chain_3": 1}, set()),
    # the residual is the conv's own (biased) output (found by the property, regressions/c659d6fbc6): the
    # conv rules decline, BN + add + relu become one elementwise kernel and the conv is one alone (conv2d_add,
    # the residual add without activation, declines too: the biased conv output is the BN's input as well)
    "residual_is_the_convs_own_output": (Plan("image", (1, 2, 5, 5), 0, (
        ("block", dict(layers=(("conv", dict(CONV3, cout=4, bias=True)), ("bn", {})))),
        ("skip_add", dict(other="conv3", op="Add", other_first=False)), ("act", RELU),
    )), {"conv2d": 1, "elementwise_chain_5": 1}, {"conv2d_add_relu", "conv2d_add", "conv2d_bn"}),
}


@pytest.mark.parametrize("name", list(KNOWN))
def test_known_plan_fuses_exactly(name, rules):
    plan, counts, blocked_rules = KNOWN[name]
    graph = build(plan)
    fused = check_fused(graph.model, rules, expect=counts)
    reasons = blocked_by_consumer(fused.fused.decisions)
    blocked = {d.rule for d in fused.fused.decisions if d.reason in reasons}
    assert blocked == blocked_rules, (blocked, graph.description)

