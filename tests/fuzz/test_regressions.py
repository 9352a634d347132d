"""Every graph saved by the random-graph property (regressions/<hash>.onnx): fused matches onnxruntime and
unfused. The .txt beside each model says what the graph is and how it failed when it was saved."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from tvm_fusion.testing import check_fused

REGRESSIONS = Path(__file__).resolve().parent / "regressions"
SAVED = sorted(REGRESSIONS.glob("*.onnx"))


@pytest.mark.parametrize("path", SAVED or [pytest.param(None, marks=pytest.mark.skip(
    reason="no saved failing graphs in tests/fuzz/regressions"))], ids=lambda p: p.stem if p else "none")
def test_saved_graph(path, rules):
    about = path.with_suffix(".txt")
    print(about.read_text() if about.exists() else f"{path.name}: no description saved")  # shown on failure
    check_fused(onnx.load(path), rules)
