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


def test_in_model_rows_pair_each_call_with_its_time_alone_and_onnxruntimes_node(capsys):
    rc = kernels.main(["--model", "mobilenetv3_ts13", "--match", "conv2d", "--rounds", "1", "--block-ms", "2",
                       "--ort", "--ort-runs", "3", "--in-model", "--in-model-runs", "3"])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = re.findall(r"^ +\d+ (\S+) +(\S+) -> (\S+) +([\d.]+) +([\d.]*) +(\S+) +([\d.]+) +([-+][\d.]+)$",
                      out.split("In the model, per call", 1)[1], re.MULTILINE)
    assert rows, out
    # every call timed in the model; the conv calls also alone; a conv call paired with an onnxruntime Conv
    assert all(float(r[3]) > 0 for r in rows)
    assert any("conv2d" in r[0] and r[4] and r[5] != "-" for r in rows), out
    gaps = [float(r[7]) for r in rows]
    assert gaps == sorted(gaps, reverse=True)  # sorted by the gap
    calls = re.search(r"ours: (\d+) calls sum to ([\d.]+) ms of a ([\d.]+) ms inference", out)
    assert calls and int(calls.group(1)) == len(rows) and float(calls.group(3)) > 0, out
    assert re.search(r"onnxruntime: \d+ nodes sum to [\d.]+ ms \(wall, profiled\) of a [\d.]+ ms inference", out)


def test_unknown_model_is_refused(capsys):
    with pytest.raises(SystemExit) as err:
        kernels.main(["--model", "resnet5"])
    assert err.value.code == 2
    assert "resnet5" in capsys.readouterr().err
