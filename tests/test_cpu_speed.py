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
    """`--clock both`: a wall-time and a CPU-time table from the same blocks, each with its geometric mean;
    `--busy 1` is named in the header."""
    rc = cpu_speed.main(["--models", "mobilenetv3_ts13", "--threads", "1", "--rounds", "1", "--block-ms", "5",
                         "--clock", "both", "--busy", "1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "; 1 other processes spinning" in out
    tables = out.split("### 1 thread")[1:]
    assert [t.split("\n", 1)[0].rsplit(", ", 1)[1] for t in tables] == ["wall time", "cpu time"]
    for table in tables:
        row = next(line for line in table.splitlines() if line.startswith("| mobilenetv3_ts13 |"))
        fused, ort, ratio = (c.strip() for c in row.strip("|").split("|")[1:])
        assert float(ratio.rstrip("x")) == pytest.approx(float(fused) / float(ort), rel=0.02, abs=0.01)
        assert f"**{ratio}**" in table  # one model: the geometric mean is its ratio


def test_busy_processes_spin_while_the_block_runs_and_are_gone_after():
    with cpu_speed.busy_processes(2) as procs:
        assert len(procs) == 2 and all(p.poll() is None for p in procs)
    assert all(p.poll() is not None for p in procs)


def test_geomean():
    assert cpu_speed.geomean([2.0, 0.5]) == pytest.approx(1.0)
    assert math.isnan(cpu_speed.geomean([]))


def test_unknown_model_is_refused(capsys):
    with pytest.raises(SystemExit) as err:
        cpu_speed.main(["--models", "resnet5"])
    assert err.value.code == 2
    assert "unknown model(s) resnet5" in capsys.readouterr().err
