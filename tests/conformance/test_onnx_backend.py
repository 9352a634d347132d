"""The ONNX backend test suite shipped in the onnx wheel, run through tvm_fusion's backend: the node tests it
generates, and the model tests it carries (simple, pytorch-converted, pytorch-operator, and the nine light
architectures, whose expected outputs the runner computes with onnx's reference evaluator).

Every fused run is also checked against the unfused build of the same module (backend `against_unfused`):
element by element with numerics' tolerance table where a rule fired or the fuse stage changed the module,
by structural equality (fuse.unchanged) where it did not, so the unfused build is made only where it can
differ. A disagreement (FusionMismatch) fails the test, also when the test is an expected failure.

Expected failures are listed in EXPECTED_FAILURES with the reason, grouped. An expected failure still runs:
it must fail against the ONNX reference for a reason outside tvm_fusion (then it is reported as xfailed with
its reason), not with a FusionMismatch (reported as failed), and a pass is reported as failed too (remove it
from the list).

A second run goes through the front door users get (`SimplifiedBackend`: the ONNX simplifier before TVM's
importer, fused); its expected failures are the same list, less SIMPLIFIER_FIXES (tests the simplifier
makes pass) and plus SIMPLIFIER_BREAKS (tests it makes fail), each with its reason.
"""

import re

import onnx.backend.test
import pytest

from .expect import FusedBackend, SimplifiedFusedBackend, expect_failure, expected_failures

pytestmark = pytest.mark.conformance


def _export(backend, suffix: str, simplified: bool = False) -> None:
    xfails = expected_failures(simplified)
    suite = onnx.backend.test.BackendTest(backend, __name__)
    suite.exclude(r"_cuda$")  # CUDA runs only on a GPU machine
    for name, case in suite.test_cases.items():
        methods = {}
        for attr in dir(case):
            short = re.sub(r"_cpu$", "", attr)
            if attr.endswith("_cpu") and short in xfails:
                methods[attr] = expect_failure(getattr(case, attr), xfails[short])
        globals()[f"{name}{suffix}"] = type(f"{name}{suffix}", (case,), methods)


_export(FusedBackend, "Fused")
_export(SimplifiedFusedBackend, "Simplified", simplified=True)
