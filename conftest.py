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
    from tvm_fusion.frontend.importer import import_onnx

    return import_onnx(resnet50_path)


@pytest.fixture(scope="session")
def cpu():
    from tvm_fusion.build.builder import resolve_target

    return resolve_target("llvm")


@pytest.fixture(scope="session")
def rules():
    from tvm_fusion.fusion.loader import load_rules_for

    return load_rules_for()


@pytest.fixture(scope="session")
def matches_onnxruntime():
    """assert(model, fused build): fused equals onnxruntime element by element with numerics' tolerance table
    (testing.assert_close), on check_fused's seeded inputs."""
    from tvm_fusion.check.compare import random_inputs, run_onnxruntime
    from tvm_fusion.testing import assert_close, run_build

    def check(model, fused, seed: int = 0):
        inputs = random_inputs(model, seed=seed)
        sess, _ = run_onnxruntime(model, inputs)
        got = run_build(fused, [inputs[i.name] for i in model.graph.input if i.name in inputs])
        for out, ref in zip(got, sess.run(None, inputs)):
            assert out.shape == ref.shape, f"fused output shape {out.shape}; onnxruntime {ref.shape}"
            assert_close(out, ref, "fused vs onnxruntime")

    return check


@pytest.fixture
def model(tmp_path):
    """conv -> batch_norm -> relu saved as an ONNX file: the model the CLI tests run."""
    import onnx

    from tvm_fusion.testing import conv_bn_relu

    path = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(), str(path))
    return path
