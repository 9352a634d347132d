"""Kernels without a schedule (tvm_fusion/build/unscheduled.py): compile warns and writes them to the manifest,
explain and profile name them, each with its ops and ONNX nodes; a default build has none. The leftover
schedules are switched off (pipeline.LEFTOVER_SCHEDULES) to make some."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto

from tvm_fusion import explain
from tvm_fusion.build import pipeline
from tvm_fusion.deploy.compile import compile_model
from tvm_fusion.profile.measure import profile
from tvm_fusion.testing import GraphBuilder


def _model():
    """ArgMin -> Cast (one TVM kernel, fused by TVM) and a ReduceMax over the middle axis."""
    g = GraphBuilder(0)
    x = g.input("x", [4, 32, 48])
    arg = g.op("Cast", [g.op("ArgMin", [x], axis=1)], to=TensorProto.FLOAT)
    return g.model([arg, g.op("ReduceMax", [x], axes=[1], keepdims=0)])


EXPECTED = [{"function": "fused_argmin_cast", "ops": ["argmin", "cast"], "onnx_nodes": ["ArgMin2", "Cast4"]},
            {"function": "max", "ops": ["max"], "onnx_nodes": ["ReduceMax6"]}]


@pytest.fixture
def without_leftover_schedules(monkeypatch):
    monkeypatch.setitem(pipeline.LEFTOVER_SCHEDULES, "llvm", [])


def test_compile_warns_and_records(tmp_path, without_leftover_schedules, rules):
    result = compile_model(_model(), tmp_path / "m.so", "llvm", rules=rules, counts_of_other_builds=False)
    assert sorted(result.manifest["unscheduled"], key=lambda k: k["function"]) == EXPECTED
    assert json.loads((tmp_path / "m.so.json").read_text())["unscheduled"] == result.manifest["unscheduled"]
    text = str(result)
    assert "warning: 2 kernel(s) run without a schedule (TVM's bare loops; `explain` names them):" in text
    assert "  fused_argmin_cast (argmin, cast) <- ArgMin2, Cast4" in text.splitlines()


def test_explain_and_profile_name_them(without_leftover_schedules, rules):
    ex = explain(_model(), rules=rules)
    assert sorted(u.record()["function"] for u in ex.unscheduled) == ["fused_argmin_cast", "max"]
    assert "kernels without a schedule (TVM's bare loops: one element at a time, one thread):" in str(ex)
    assert "  max (max) <- ReduceMax6" in str(ex).splitlines()
    report = profile(_model(), rules=rules, repeat=1)
    assert sorted(report.unscheduled, key=lambda k: k["function"]) == EXPECTED
    assert report.to_json()["unscheduled"] == report.unscheduled
    assert "fused: kernels without a schedule" in str(report)


def test_a_default_build_has_none(tmp_path, rules):
    result = compile_model(_model(), tmp_path / "m.so", "llvm", rules=rules, counts_of_other_builds=False)
    assert result.manifest["unscheduled"] == [] and "without a schedule" not in str(result)
    ex = explain(_model(), rules=rules)
    assert ex.unscheduled == [] and "every kernel has a schedule" in str(ex)
    assert np.isfinite(result.manifest["verification"]["outputs"][next(iter(result.manifest["verification"]["outputs"]))]["max_rel"])
