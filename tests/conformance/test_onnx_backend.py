"""The ONNX backend test suite shipped in the onnx wheel, run through tvm_fusion's backend, fused and
unfused: the node tests it generates, and the model tests it carries (simple, pytorch-converted,
pytorch-operator, and the nine light architectures, whose expected outputs the runner computes with
onnx's reference evaluator).

Expected failures are listed in EXPECTED_FAILURES with the reason, grouped; every one of them fails the
same way with our rules disabled (the unfused suite lists the same), so fusion changes nothing.
"""

import re

import onnx.backend.test
import pytest

from tvm_fusion.backend import TVMFusionBackend, UnfusedBackend

from .expected_failures import EXPECTED_FAILURES

pytestmark = pytest.mark.conformance


def _suite(backend, module_name: str) -> dict:
    suite = onnx.backend.test.BackendTest(backend, module_name)
    suite.exclude(r"_cuda$")  # CUDA runs only on a GPU machine
    names = sorted(n for tests in EXPECTED_FAILURES.values() for n in tests)
    suite.xfail(rf"^({'|'.join(map(re.escape, names))})_cpu$")
    return suite.test_cases


def _export(backend, suffix: str) -> None:
    for name, case in _suite(backend, __name__).items():
        globals()[f"{name}{suffix}"] = type(f"{name}{suffix}", (case,), {})


_export(TVMFusionBackend, "Fused")
_export(UnfusedBackend, "Unfused")
