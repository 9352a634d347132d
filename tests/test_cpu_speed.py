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


def test_modes_time_every_build_in_one_table(capsys):
    """`--modes unfused,fused,no-cross`: the builds checked and timed with onnxruntime; their kernel calls, each
    one's ms and the ratios to the fused build and fused / onnxruntime in one row. no-cross is the fused build
    without the cross-layer rules: the stem's conv and max pool as two kernels. Built for AVX2, whose 16-channel
    tasks take the stem's pool on any x86-64 host (AVX-512's 32-channel plane is past the CPU conv -> pool
    kernel's bound: there the fused build has it apart too)."""
    rc = cpu_speed.main(["--models", "resnet_stem_ts17", "--threads", "1", "--rounds", "1", "--block-ms", "5",
                         "--modes", "unfused,fused,no-cross", "--target", '{"kind": "llvm", "mcpu": "x86-64-v3"}'])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert ("| model | kernel calls unfused / fused / no-cross | unfused ms | fused ms | no-cross ms | onnxruntime ms "
            "| unfused / fused | no-cross / fused | fused / ort |") in out
    row = next(line for line in out.splitlines() if line.startswith("| resnet_stem_ts17 |"))
    calls, unfused, fused, _, ort, slower, _, ratio = (c.strip() for c in row.strip("|").split("|")[1:])
    unfused_calls, fused_calls, no_cross_calls = (int(c) for c in calls.split(" / "))
    # one kernel per op (11 convs and their bias adds, 10 ReLUs, 3 residual adds, the max pool); the fused count
    # is tests/zoo's to pin
    assert unfused_calls == 36 and fused_calls < 20 and no_cross_calls == fused_calls + 1
    assert float(slower.rstrip("x")) == pytest.approx(float(unfused) / float(fused), rel=0.05, abs=0.05)
    assert float(ratio.rstrip("x")) == pytest.approx(float(fused) / float(ort), rel=0.02, abs=0.01)


def test_no_chunks_times_the_plans_without_reduction_chunks(capsys):
    """`--modes fused,no-chunks`: the fused build and the same build with the tiled convs' reduction in one
    pass per tile (the AVX-512 plans chunk it where the weights outgrow L1), both checked against onnxruntime
    and timed in one table; the same groups, so the same kernel calls. The step costs are as before after."""
    from tvm_fusion.schedules.llvm import conv2d

    costs = conv2d.TILED_STEP_COSTS
    rc = cpu_speed.main(["--models", "resnet_stem_ts17", "--threads", "1", "--rounds", "1", "--block-ms", "5",
                         "--modes", "fused,no-chunks"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert conv2d.TILED_STEP_COSTS is costs
    assert "| model | kernel calls fused / no-chunks | fused ms | no-chunks ms | onnxruntime ms" in out
    row = next(line for line in out.splitlines() if line.startswith("| resnet_stem_ts17 |"))
    fused_calls, no_chunks_calls = (int(c) for c in row.strip("|").split("|")[1].split(" / "))
    assert fused_calls == no_chunks_calls


def test_modes_without_fused_are_refused(capsys):
    with pytest.raises(SystemExit) as err:
        cpu_speed.main(["--models", "resnet_stem_ts17", "--modes", "unfused,tvm"])
    assert err.value.code == 2
    assert "--modes unfused,tvm: include fused" in capsys.readouterr().err


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
