"""The ONNX backend test suite shipped in the onnx wheel, run through tvm_fusion's backend, fused and
unfused: the node tests it generates, and the model tests it carries (simple, pytorch-converted,
pytorch-operator, and the nine light architectures, whose expected outputs the runner computes with
onnx's reference evaluator).

Expected failures are listed in EXPECTED_FAILURES with the reason, grouped; every one of them fails the
same way with our rules disabled (the unfused suite lists the same), so fusion changes nothing.

A third run goes through the front door users get (`SimplifiedBackend`: the ONNX simplifier before TVM's
importer, fused); its expected failures are the same list, less SIMPLIFIER_FIXES (tests the simplifier
makes pass) and plus SIMPLIFIER_BREAKS (tests it makes fail), each with its reason.
"""

import re

import onnx.backend.test
import pytest

from tvm_fusion.backend import SimplifiedBackend, TVMFusionBackend, UnfusedBackend

from .expected_failures import EXPECTED_FAILURES, SIMPLIFIER_BREAKS, SIMPLIFIER_FIXES

pytestmark = pytest.mark.conformance


def expected_failures(simplified: bool) -> set[str]:
    names = {n for tests in EXPECTED_FAILURES.values() for n in tests}
    if simplified:
        names = (names - set(SIMPLIFIER_FIXES)) | {n for tests in SIMPLIFIER_BREAKS.values() for n in tests}
    return names


def _suite(backend, module_name: str, xfails: set[str]) -> dict:
    suite = onnx.backend.test.BackendTest(backend, module_name)
    suite.exclude(r"_cuda$")  # CUDA runs only on a GPU machine
    suite.xfail(rf"^({'|'.join(map(re.escape, sorted(xfails)))})_cpu$")
    return suite.test_cases


def _export(backend, suffix: str, simplified: bool = False) -> None:
    for name, case in _suite(backend, __name__, expected_failures(simplified)).items():
        globals()[f"{name}{suffix}"] = type(f"{name}{suffix}", (case,), {})


_export(TVMFusionBackend, "Fused")
_export(UnfusedBackend, "Unfused")
_export(SimplifiedBackend, "Simplified", simplified=True)
