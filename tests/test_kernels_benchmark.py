"""benchmarks/kernels.py: every matched kernel of a fused build timed alone, onnxruntime's nodes beside them
(`--ort`), and the model names it refuses."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import kernels  # noqa: E402


def test_kernels_are_timed_with_onnxruntimes_nodes_beside_them(capsys):
    rc = kernels.main(["--model", "mobilenetv3_ts13", "--match", "conv2d", "--rounds", "1", "--block-ms", "2",
                       "--ort", "--ort-runs", "3"])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = [line for line in out.splitlines() if re.match(r"\S*conv2d\S* .*: [\d.]+ ms CPU", line)]
    assert rows, out
    assert all(float(re.search(r": ([\d.]+) ms CPU", r).group(1)) > 0 for r in rows)
    # a conv kernel of ours finds onnxruntime's conv node of the same input and output shape
    assert any("| ort " in r and "Conv" in r.split("| ort ", 1)[1] for r in rows), out
    summary = re.search(r"onnxruntime nodes, 1 intra-op thread\(s\), median wall ms per node: ([\d.]+) ms in all", out)
    assert summary and float(summary.group(1)) > 0, out
    assert "by op type: " in out


def test_unknown_model_is_refused(capsys):
    with pytest.raises(SystemExit) as err:
        kernels.main(["--model", "resnet5"])
    assert err.value.code == 2
    assert "resnet5" in capsys.readouterr().err
