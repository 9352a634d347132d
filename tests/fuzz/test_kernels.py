"""Single fused kernels at real sizes (kernels.py: convs up to 300 channels on up to 64 x 64 pixels with their
epilogues, pools, dense layers up to 2048 x 2048): the fused build matches onnxruntime element by element
(oracle.py, the unfused build skipped), a conv or dense with a bias is taken by our rule (so by the hand
llvm schedule), and the derandomized set reaches the llvm schedules' main plan families (`plan_family`).

The CPU target is the build's default (TVM_FUSION_CPU, else the host): run it again with
TVM_FUSION_CPU='{"kind":"llvm","mcpu":"x86-64-v2"}' (4 lanes) for the SSE plans. A failing kernel is saved to
regressions/ as the random graphs' are (`save_regression`); a regression whose .txt has a line
`target: <TVM_FUSION_CPU value>` failed on that target only and is run there too (`test_saved_kernel_on_its_target`).
"""

from __future__ import annotations

import re
from collections import Counter

import onnx
import pytest
from hypothesis import event, given, settings
from hypothesis.control import current_build_context

from tvm_fusion.build.builder import resolve_target

from .kernels import SIZES, build_kernel, hand_schedule_used, kernels, plan_family
from .oracle import InvalidGraph, check_against_onnxruntime
from .strategies import Plan
from .test_random_graphs import REGRESSIONS, ROOT, save_regression

#: a kernel builds once and runs in onnxruntime (0.2-1.5 s on one core): 48 derandomized kernels in the
#: default run (20 s on one core), 240 others under the slow marker (1 min; 480 ran past 6 min: grouped 1x1
#: convs of many groups whose build alone takes 1-2 min, 178 -> 979 in 89 groups on 30 x 55 pixels)
EXAMPLES = 4 * settings.default.max_examples
SLOW_EXAMPLES = 20 * settings.default.max_examples
COVERAGE_EXAMPLES = 60  # plans only: no builds
TARGET_LINE = re.compile(r"^target: (.+)$", re.MULTILINE)


RELU, SILU = ("act", dict(act="relu", form="Relu")), ("act", dict(act="silu", form="x*Sigmoid"))
RESIDUAL = ("residual", dict(other_first=False))


def _conv(shape, cout, k=1, stride=1, pads=(0, 0, 0, 0), groups=1, epilogue=()) -> Plan:
    return Plan("image", shape, 0, (("conv", dict(cout=cout, k=k, stride=stride, pads=list(pads), dilation=1,
                                                  groups=groups, bias=True)), *epilogue))


def _dense(shape, n, epilogue=(), **dense) -> Plan:
    dense = dense or dict(op="MatMul", bias="after", batched_weight=False, bias_rank=1)
    return Plan("tokens", shape, 0, (("dense", dict(n=n, **dense)), *epilogue))


def _pool(shape, **pool) -> Plan:
    return Plan("image", shape, 0, (("pool", pool),))


#: one kernel of each plan of the hand llvm schedules: the plan `plan_family` names on an AVX2 host -> its plan
#: (on other targets they are kernels of other plans, checked all the same)
FAMILY_KERNELS = {
    "conv pointwise flat chunks": _conv((1, 160, 20, 20), 300, epilogue=(RELU,)),
    "conv pointwise flat padded_channels tail": _conv((1, 200, 17, 17), 1001, epilogue=(RESIDUAL, RELU)),
    "conv pointwise subsampled chunks": _conv((1, 256, 32, 32), 200, stride=2, epilogue=(("bn", {}), RELU)),
    "conv tiled flat in_place padded_pixels": _conv((1, 256, 14, 14), 64),
    "conv tiled flat_taps tap_rows padded_pixels": _conv((2, 64, 28, 28), 64, k=3, pads=(1, 1, 1, 1),
                                                        epilogue=(("bn", {}), RESIDUAL, RELU)),
    "conv tiled flat_taps tap_rows padded_channels padded_pixels": _conv((1, 97, 17, 17), 127, k=(1, 7),
                                                                         pads=(0, 3, 0, 3), epilogue=(SILU,)),
    "conv tiled channels_last": _conv((1, 256, 15, 15), 256, epilogue=(SILU, RESIDUAL)),
    "conv tiled padded_pixels": _conv((1, 3, 64, 64), 16, k=3, stride=2, pads=(1, 1, 1, 1), epilogue=(SILU,)),
    "conv tiled grouped channels_last padded_pixels": _conv((1, 96, 28, 28), 96, k=3, pads=(1, 1, 1, 1),
                                                           groups=2),
    "conv pixels grouped padded_pixels": _conv((1, 136, 28, 28), 136, groups=4, epilogue=(RELU,)),
    "conv depthwise padded_pixels": _conv((1, 144, 28, 28), 144, k=3, pads=(1, 1, 1, 1), groups=144,
                                          epilogue=(("act", dict(act="relu6", form="Clip")),)),
    "conv depthwise_channels": _conv((1, 96, 56, 56), 96, k=3, stride=2, pads=(0, 0, 1, 1), groups=96,
                                     epilogue=(("act", dict(act="hardswish", form="HardSwish")),)),
    "conv depthwise per_axis": _conv((1, 64, 8, 40), 128, k=3, stride=(2, 1), pads=(1, 1, 1, 1), groups=64),
    "conv tiled flat_taps tap_rows padded_pixels symbolic_batch": _conv(("N", 32, 28, 28), 48, k=3,
                                                                        pads=(1, 1, 1, 1), epilogue=(RELU,)),
    "dense cols=32 padded batch1": _dense((1, 2048), 1000, op="Gemm", bias="C", trans_b=True, alpha=1.0),
    "dense cols=20": _dense((4, 300), 100, epilogue=(("act", dict(act="hardswish", form="x*HardSigmoid")),)),
    "dense cols=32 tokens": _dense((2, 49, 384), 1536, epilogue=(("act", dict(act="gelu", form="Gelu")),)),
    "dense cols=32 padded symbolic_batch": _dense(("N", 512), 127, epilogue=(RELU,)),
    "pool MaxPool run=1 stride=2 pad": _pool((1, 64, 56, 56), op="MaxPool", k=3, stride=2, pads=(1, 1, 1, 1),
                                             ceil_mode=0),
    "pool AveragePool run=8 stride=1 pad": _pool((1, 96, 28, 28), op="AveragePool", k=3, stride=1,
                                                 pads=(1, 1, 1, 1), ceil_mode=0, count_include_pad=0),
    "pool MaxPool run=8 stride=1 pad": _pool((1, 256, 8, 40), op="MaxPool", k=(2, 2), stride=(2, 1),
                                             pads=(0, 1, 0, 1), ceil_mode=0),
    "pool GlobalAveragePool declined": _pool((1, 1280, 7, 7), op="GlobalAveragePool"),
}


def check_kernel(graph, rules) -> str:
    """The fused build of one kernel matches onnxruntime and, for a conv / dense with a bias, our rule took it
    (so its hand llvm schedule); returns its plan (`plan_family`)."""
    family = plan_family(graph.plan)
    bounds = {"N": graph.plan.bound} if graph.plan.bound else None
    fused = check_against_onnxruntime(graph.model, rules, unfused=False, sizes=SIZES, bounds=bounds)
    assert hand_schedule_used(graph.plan, fused.counts) is not False, \
        f"no conv / dense rule fired on {family}: {fused.counts}"
    return family


def check_drawn_kernel(graph, rules) -> None:
    """`check_kernel` in a property: a failure's final (shrunk) example is saved as a regression; the plan is
    recorded (Hypothesis `event`: shown by --hypothesis-show-statistics)."""
    try:
        family = check_kernel(graph, rules)
    except InvalidGraph:
        raise
    except Exception as err:
        if not current_build_context().is_final:
            raise
        path = save_regression(graph, err).relative_to(ROOT)
        raise AssertionError(f"fused kernel failed ({plan_family(graph.plan)}):\n{graph.description}\n"
                             f"{type(err).__name__}: {err}\nsaved as {path} (+ .txt)") from err
    event(f"plan {family}")


@settings(max_examples=EXAMPLES)
@given(graph=kernels())
def test_property_kernel_matches_onnxruntime(graph, rules):
    check_drawn_kernel(graph, rules)


@pytest.mark.slow
@settings(max_examples=SLOW_EXAMPLES)
@given(graph=kernels())
def test_property_more_kernels_match_onnxruntime(graph, rules):
    check_drawn_kernel(graph, rules)


@pytest.mark.parametrize("family", list(FAMILY_KERNELS))
def test_family_kernel_matches_onnxruntime(family, rules):
    """One kernel of each plan (FAMILY_KERNELS), fused against onnxruntime; on an AVX2 host it takes that plan."""
    from tvm_fusion.hardware import cpu_facts

    plan = FAMILY_KERNELS[family]
    if cpu_facts(resolve_target("llvm")).isa == "avx2":
        assert plan_family(plan) == family
    check_kernel(build_kernel(plan), rules)


def test_kernel_plans_are_not_vacuous(cpu):
    """The derandomized kernels reach the main plans of the hand schedules (from the shapes alone): convs of the
    tiled, pointwise and depthwise kernels with padded channels and pixels, a dense and pools the LeftoverPool rule
    schedules."""
    families = Counter()

    @settings(max_examples=COVERAGE_EXAMPLES, derandomize=True, database=None)
    @given(graph=kernels())
    def collect(graph):
        families[plan_family(graph.plan, cpu)] += 1

    collect()
    print("\n".join(f"{n:4d} {f}" for f, n in sorted(families.items())))
    reached = " | ".join(sorted(families))
    for want in ("conv tiled", "conv depthwise", "dense", "pool"):
        assert any(f.startswith(want) for f in families), f"no {want!r} plan: {reached}"
    assert any("padded_channels" in f for f in families), reached
    assert any("padded_pixels" in f for f in families), reached
    assert any(f.startswith("pool") and "declined" not in f for f in families), reached


def _saved_with_target():
    for path in sorted(REGRESSIONS.glob("*.onnx")):
        about = path.with_suffix(".txt")
        match = TARGET_LINE.search(about.read_text()) if about.exists() else None
        if match:
            yield pytest.param(path, match.group(1).strip(), id=path.stem)


SAVED_WITH_TARGET = list(_saved_with_target())


@pytest.mark.parametrize("path,target", SAVED_WITH_TARGET or [pytest.param(None, None, marks=pytest.mark.skip(
    reason="no saved kernel names a target"))])
def test_saved_kernel_on_its_target(path, target, rules, monkeypatch):
    """A saved kernel that failed on another CPU target than the host's (its .txt's `target:` line), built for
    that target (one this host runs: AVX-512 ones are not saved with a target line)."""
    print(path.with_suffix(".txt").read_text())
    monkeypatch.setenv("TVM_FUSION_CPU", target)
    check_against_onnxruntime(onnx.load(path), rules)
