"""benchmarks/cpu_speed.py: one zoo model end to end (numerics checked, the table and its geometric mean),
and the flags it refuses."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import cpu_speed  # noqa: E402


def test_one_model_prints_a_row_and_the_geometric_mean(capsys):
    rc = cpu_speed.main(["--models", "mobilenetv3_ts13", "--threads", "1", "--rounds", "1", "--block-ms", "5",
                         "--clock", "both"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "### 1 thread" in out and "| mobilenetv3_ts13 |" in out
    assert "wall clock" in out and "cpu clock" in out  # --clock both: a table per clock
    row = next(line for line in out.splitlines() if line.startswith("| mobilenetv3_ts13 |"))
    fused, ort, ratio = (c.strip() for c in row.strip("|").split("|")[1:])
    assert float(ratio.rstrip("x")) == pytest.approx(float(fused) / float(ort), rel=0.02, abs=0.01)
    assert f"**{ratio}**" in out  # one model: the geometric mean is its ratio


def test_geomean():
    assert cpu_speed.geomean([2.0, 0.5]) == pytest.approx(1.0)
    assert math.isnan(cpu_speed.geomean([]))


def test_unknown_model_is_refused(capsys):
    with pytest.raises(SystemExit) as err:
        cpu_speed.main(["--models", "resnet5"])
    assert err.value.code == 2
    assert "unknown model(s) resnet5" in capsys.readouterr().err
