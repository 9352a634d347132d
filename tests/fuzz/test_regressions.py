"""Every graph saved by the random-graph property (regressions/<hash>.onnx): fused and unfused match onnxruntime
element by element (oracle.py). The .txt beside each model says what the graph is, how it failed when it was
saved and, once classified, the bug it shows."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from .oracle import check_against_onnxruntime

REGRESSIONS = Path(__file__).resolve().parent / "regressions"
SAVED = sorted(REGRESSIONS.glob("*.onnx"))


@pytest.mark.parametrize("path", SAVED or [pytest.param(None, marks=pytest.mark.skip(
    reason="no saved failing graphs in tests/fuzz/regressions"))], ids=lambda p: p.stem if p else "none")
def test_saved_graph(path, rules):
    about = path.with_suffix(".txt")
    print(about.read_text() if about.exists() else f"{path.name}: no description saved")  # shown on failure
    check_against_onnxruntime(onnx.load(path), rules)
