"""The conformance suite's two rules: every fused run is checked against the unfused build (FusedBackend,
SimplifiedFusedBackend), and an expected failure must fail for its reason, never with a FusionMismatch."""

import atexit
import functools
import os

import pytest

from tvm_fusion.check.backend import SimplifiedBackend, TVMFusionBackend
from tvm_fusion.errors import FusionMismatch

from .expected_failures import EXPECTED_FAILURES, SIMPLIFIER_BREAKS, SIMPLIFIER_FIXES


#: TVM_FUSION_CONFORMANCE_LOG=path: each process appends, per prepared model, "backend<TAB>graph<TAB>runs
#: checked against an unfused build<TAB>runs" (how often the unfused build was needed)
_LOG = os.environ.get("TVM_FUSION_CONFORMANCE_LOG")
_CHECKED: list[tuple[str, str, dict]] = []


class _Logged:
    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs):
        rep = super().prepare(model, device, **kwargs)
        if _LOG:
            _CHECKED.append((cls.__name__, model.graph.name, rep.checked_against_unfused))
        return rep


@atexit.register
def _write_log() -> None:
    if _LOG and _CHECKED:
        with open(_LOG, "a") as f:
            f.writelines(f"{b}\t{g}\t{sum(c.values())}\t{len(c)}\n" for b, g, c in _CHECKED)


class FusedBackend(_Logged, TVMFusionBackend):
    AGAINST_UNFUSED = True


class SimplifiedFusedBackend(_Logged, SimplifiedBackend):
    AGAINST_UNFUSED = True


def expected_failures(simplified: bool) -> dict[str, str]:
    """{test name: why it is expected to fail}."""
    reasons = {n: reason for reason, tests in EXPECTED_FAILURES.items() for n in tests}
    if simplified:
        fixed = set(SIMPLIFIER_FIXES)
        reasons = {n: r for n, r in reasons.items() if n not in fixed}
        reasons.update({n: reason for reason, tests in SIMPLIFIER_BREAKS.items() for n in tests})
    return reasons


def expect_failure(test, reason: str):
    """`test` must fail, for `reason`: xfail when it raises anything but FusionMismatch (which fails the
    test, as does a pass: 'Unexpected success', what update_expected.py looks for)."""

    @functools.wraps(test)
    def run(*args, **kwargs):
        try:
            test(*args, **kwargs)
        except FusionMismatch:
            raise
        except Exception as err:  # noqa: BLE001 - the expected failure, whatever TVM raised
            pytest.xfail(f"{reason}: {type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:300]}")
        pytest.fail(f"Unexpected success: expected to fail ({reason}); remove it from expected_failures.py",
                    pytrace=False)

    return run
