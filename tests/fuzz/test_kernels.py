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

from .kernels import SIZES, hand_schedule_used, kernels, plan_family
from .oracle import InvalidGraph, check_against_onnxruntime
from .test_random_graphs import REGRESSIONS, ROOT, save_regression

#: a kernel builds once and runs in onnxruntime (0.2-1.5 s on one core): 24 derandomized kernels in the
#: default run, 240 others under the slow marker
EXAMPLES = 2 * settings.default.max_examples
SLOW_EXAMPLES = 20 * settings.default.max_examples
COVERAGE_EXAMPLES = 60  # plans only: no builds
#: plan families the derandomized set must reach on an AVX2 host (`plan_family`'s first words)
AVX2_FAMILIES = ("conv tiled", "conv pointwise", "conv depthwise", "conv tiled flat_taps", "dense", "pool")
TARGET_LINE = re.compile(r"^target: (.+)$", re.MULTILINE)


def check_kernel(graph, rules) -> None:
    """The fused build of one kernel matches onnxruntime and, for a conv / dense with a bias, our rule took it;
    a failure's final (shrunk) example is saved as a regression."""
    family = plan_family(graph.plan)
    try:
        fused = check_against_onnxruntime(graph.model, rules, unfused=False, sizes=SIZES)
        assert hand_schedule_used(graph.plan, fused.counts) is not False, \
            f"no conv / dense rule fired on {family}: {fused.counts}"
    except InvalidGraph:
        raise
    except Exception as err:
        if not current_build_context().is_final:
            raise
        path = save_regression(graph, err).relative_to(ROOT)
        raise AssertionError(f"fused kernel failed ({family}):\n{graph.description}\n{type(err).__name__}: {err}\n"
                             f"saved as {path} (+ .txt)") from err
    event(f"plan {family}")


@settings(max_examples=EXAMPLES)
@given(graph=kernels())
def test_property_kernel_matches_onnxruntime(graph, rules):
    check_kernel(graph, rules)


@pytest.mark.slow
@settings(max_examples=SLOW_EXAMPLES)
@given(graph=kernels())
def test_property_more_kernels_match_onnxruntime(graph, rules):
    check_kernel(graph, rules)


def test_kernel_plans_are_not_vacuous(cpu):
    """The derandomized kernels reach the main plans of the hand schedules (from the shapes alone)."""
    from tvm_fusion.hardware import cpu_facts

    families = Counter()

    @settings(max_examples=COVERAGE_EXAMPLES, derandomize=True, database=None)
    @given(graph=kernels())
    def collect(graph):
        families[plan_family(graph.plan, cpu)] += 1

    collect()
    reached = " | ".join(sorted(families))
    if cpu_facts(cpu).isa == "avx2":
        assert all(any(f.startswith(want) for f in families) for want in AVX2_FAMILIES), reached
    assert any("padded_channels" in f for f in families), reached
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
