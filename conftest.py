import os

import pytest


os.environ.setdefault("TQDM_DISABLE", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):  # one TVM thread per test worker (-n auto: one worker per core)
    os.environ.setdefault("TVM_NUM_THREADS", "1")

from hypothesis import HealthCheck, settings  # noqa: E402

# CI runs derandomized (the same examples every run); a failure prints the example and the seed/blob to
# reproduce it (`@reproduce_failure(...)`). Locally: HYPOTHESIS_PROFILE=explore for fresh random examples.
settings.register_profile("ci", derandomize=True, max_examples=12, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("explore", max_examples=60, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def resnet50_path():
    from tvm_fusion.examples import example_path

    return example_path("resnet50", seed=0)


@pytest.fixture(scope="session")
def resnet50_mod(resnet50_path):
    from tvm_fusion.frontend import import_onnx

    return import_onnx(resnet50_path)


@pytest.fixture(scope="session")
def cpu():
    from tvm_fusion.build import resolve_target

    return resolve_target("llvm")


@pytest.fixture(scope="session")
def rules():
    from tvm_fusion.loader import load_rules_for

    return load_rules_for()
