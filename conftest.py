import os
import sys
from pathlib import Path

import pytest


os.environ.setdefault("TQDM_DISABLE", "1")


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
