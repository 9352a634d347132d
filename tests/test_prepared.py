"""A model is prepared once per command (prepared.py): one `compare` resolves the target once and imports the
model once, the ill-conditioned path's per-group check and every round of `bisect` reuse that import, and
a prepared model passed to the API functions is not loaded again."""

import sys

import onnx
import pytest

from tvm_fusion import _tvm, frontend
from tvm_fusion.build import resolve_target
from tvm_fusion.cli import main
from tvm_fusion.check.compare import compare
from tvm_fusion.check.differential import bisect
from tvm_fusion.fusion.loader import load_rules_for
from tvm_fusion.check.prepared import PreparedModel, prepare
from tvm_fusion.testing import GraphBuilder, conv_bn_relu

from test_differential import WRONG_RULES, _three_groups  # conv -> relu lowered with its weights scaled by 1.01


@pytest.fixture()
def calls(monkeypatch):
    """{"resolve_target": n, "import_onnx": n}: calls of each through every tvm_fusion module that holds it."""
    import tvm_fusion.deploy.compile  # noqa: F401  (every module that may call them, imported before patching)
    import tvm_fusion.profile  # noqa: F401

    counts = {"resolve_target": 0, "import_onnx": 0}
    originals = {"resolve_target": resolve_target, "import_onnx": frontend.import_onnx}

    def counted(name):
        def call(*args, **kwargs):
            counts[name] += 1
            return originals[name](*args, **kwargs)
        return call

    for module in [m for k, m in sys.modules.items() if k.startswith("tvm_fusion")]:
        for name, original in originals.items():
            if getattr(module, name, None) is original:
                monkeypatch.setattr(module, name, counted(name))
    return counts


def test_compare_resolves_the_target_once_and_imports_once(tmp_path, calls):
    path = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(), str(path))
    report = compare(str(path), "llvm", repeat=0)
    assert report.ok and list(report.builds) == ["unfused", "tvm", "fused"]
    assert calls == {"resolve_target": 1, "import_onnx": 1}


def test_the_cli_compare_resolves_the_target_once_and_imports_once(tmp_path, calls, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(), str(path))
    assert main(["compare", str(path), "--target", "llvm", "--repeat", "0"]) == 0
    assert "PASS: fused is within tolerance" in capsys.readouterr().out
    assert calls == {"resolve_target": 1, "import_onnx": 1}


def test_an_ill_conditioned_compare_checks_its_groups_on_the_same_import(calls):
    from test_precision import _cancelling_branches  # rounding its weights to float16 alone is over tolerance

    report = compare(_cancelling_branches(), "llvm", precision="fp16", repeat=0, modes="unfused,fused")
    assert report.groups is not None and len(report.groups.groups) == 2 and report.ok
    assert calls == {"resolve_target": 1, "import_onnx": 1}


def test_bisect_imports_once_for_all_its_rounds(calls):
    report = bisect(_three_groups(), rules=load_rules_for([WRONG_RULES]))
    assert report.culprits == ["conv2d_relu_wrong"] and len(report.steps) >= 1
    assert calls == {"resolve_target": 1, "import_onnx": 1}


def test_a_prepared_model_is_used_as_it_is(calls):
    prepared = prepare(conv_bn_relu(), "llvm")
    assert isinstance(prepared, PreparedModel) and prepare(prepared) is prepared
    assert prepared.bound() is prepared  # nothing symbolic: no second import
    report = compare(prepared, repeat=0)
    assert report.ok and report.target == str(prepared.target)
    assert calls == {"resolve_target": 1, "import_onnx": 1}


def test_binding_a_symbolic_dim_imports_again_at_the_checked_size():
    g = GraphBuilder(seed=1)
    model = g.model([g.op("Relu", [g.conv(g.input("x", ["N", 4, 6, 6]), 4, 8)])])
    prepared = prepare(model, "llvm", shapes={"x": (frontend.SymDim("N", 4), 4, 6, 6)})
    bound = prepared.bound()
    assert bound.shapes == {"x": (4, 4, 6, 6)} and bound.mod is not prepared.mod
    assert [int(d) for d in _tvm.expr_type(bound.mod["main"].params[0]).shape] == [4, 4, 6, 6]
    assert (bound.proto, bound.target) == (prepared.proto, prepared.target)
