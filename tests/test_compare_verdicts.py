"""`compare` says what it compared and judges element by element in the model's dtype; user inputs reach
every runtime (CLI --inputs, Python inputs=)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from tvm_fusion import bisect, check_groups
from tvm_fusion import compare
from tvm_fusion.cli import main
from tvm_fusion.check.compare import random_inputs
from tvm_fusion.testing import GraphBuilder, conv_bn_relu


def _save(tmp_path, proto, name="m.onnx") -> str:
    path = tmp_path / name
    onnx.save(proto, str(path))
    return str(path)


def _gather(tmp_path) -> str:
    """y = table[ids]: random ids in [0, 8) are out of range for a 2-row table."""
    g = GraphBuilder(0)
    ids = g.input("ids", [1, 4], TensorProto.INT64)
    table = g.const(np.arange(6, dtype=np.float32).reshape(2, 3))
    return _save(tmp_path, g.model([g.op("Gather", [table, ids], axis=0)]), "gather.onnx")


def test_modes_without_fused_do_not_claim_fused(capsys, tmp_path):
    path = _save(tmp_path, conv_bn_relu())
    assert main(["compare", path, "--modes", "unfused,tvm", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "PASS: fused" not in out and not any(line.startswith("fused vs") for line in out.splitlines())
    assert "PASS: no fused build; compared only unfused vs onnxruntime, tvm vs onnxruntime: all within" in out


def test_nan_positions_count_as_equal(capsys, tmp_path):
    """sqrt of standard-normal inputs: NaN at the same places in every runtime is a PASS, not a FAIL."""
    g = GraphBuilder(0)
    x = g.input("x", [4, 8])
    path = _save(tmp_path, g.model([g.op("Sqrt", [x])]))
    report = compare(path, repeat=0)
    assert report.ok, str(report)
    assert all(s.n_bad == 0 for stats in report.errors.values() for s in stats)


def test_fp16_model_is_judged_as_fp16(tmp_path):
    g = GraphBuilder(0)
    x = g.input("x", [1, 8, 10, 10], TensorProto.FLOAT16)
    w = g.const(g.rng.normal(0, 0.3, (8, 8, 3, 3)).astype(np.float16), "w")
    y = g.op("Relu", [g.op("Conv", [x, w], kernel_shape=[3, 3], pads=[1, 1, 1, 1])])
    report = compare(g.model([y], dtype=TensorProto.FLOAT16), repeat=0)
    assert {s.dtype for stats in report.errors.values() for s in stats} == {"float16"}
    assert report.ok, str(report)


def test_random_integer_inputs_refused_by_onnxruntime_ask_for_inputs(capsys, tmp_path):
    rc = main(["compare", _gather(tmp_path), "--repeat", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and "onnxruntime cannot run the model on these inputs" in err and "--inputs" in err


def test_cli_inputs_npz(capsys, tmp_path):
    npz = tmp_path / "ids.npz"
    np.savez(npz, ids=np.array([[0, 1, 1, 0]], np.int64))
    assert main(["compare", _gather(tmp_path), "--repeat", "0", "--inputs", str(npz)]) == 0
    assert "PASS: fused is within tolerance" in capsys.readouterr().out


def test_inputs_bind_symbolic_dims(capsys, tmp_path):
    g = GraphBuilder(0)
    x = g.input("x", ["n", 4, "h", "w"])
    path = _save(tmp_path, g.model([g.op("Relu", [g.conv(x, 4, 4)])]))
    npz = tmp_path / "x.npz"
    np.savez(npz, x=np.ones((2, 4, 5, 5), np.float32))
    assert main(["compare", path, "--repeat", "0", "--inputs", str(npz), "--per-group"]) == 0


def test_python_inputs_reach_every_entry_point(tmp_path):
    path = _gather(tmp_path)
    ids = {"ids": np.array([[1, 1, 0, 1]], np.int64)}
    assert compare(path, repeat=0, inputs=ids).ok
    model = conv_bn_relu()
    x = {"x": np.full((1, 8, 12, 12), 0.5, np.float32)}
    assert check_groups(model, inputs=x).ok
    npz = tmp_path / "x.npz"
    np.savez(npz, **x)
    assert check_groups(model, inputs=str(npz)).ok
    assert bisect(model, inputs=x).verdict.startswith("nothing to bisect")


def test_given_inputs_are_used_and_the_rest_random():
    g = GraphBuilder(0)
    a, b = g.input("a", [2, 3]), g.input("b", [2, 3])
    model = g.model([g.op("Add", [a, b])])
    given = np.ones((2, 3), np.float32)
    inputs = random_inputs(model, seed=1, given={"a": given})
    assert inputs["a"] is given and inputs["b"].shape == (2, 3) and not np.all(inputs["b"] == 1)
    with pytest.raises(Exception, match="seed -1 is negative"):
        random_inputs(model, seed=-1)


def _timed_report(latencies, threads):
    from tvm_fusion.check.compare import BuildStats, CompareReport

    stats = {"fused": BuildStats("fused", 1, 1, 0.1, latencies)}
    return CompareReport("m.onnx", "llvm", ["y"], stats, {}, {}, True, cpu_threads=threads)


def test_runs_spread_on_a_shared_host_say_so():
    """A CPU build whose runs spread over STALL_SPREAD x on a pool of several threads gets a note naming the
    pool, the remedy and the README section; one thread, or runs within the spread, get none."""
    from tvm_fusion.check.compare import STALL_SPREAD

    stalled = str(_timed_report([0.020, 0.210, 0.724], threads=2))
    assert "note: fused's timed runs spread 36x (fastest to slowest) on TVM's pool of 2 threads" in stalled
    assert "TVM_NUM_THREADS" in stalled and "A host shared with other busy processes" in stalled
    assert "note:" not in str(_timed_report([0.020, 0.210, 0.724], threads=1))
    assert "note:" not in str(_timed_report([0.020, 0.020 * STALL_SPREAD * 0.99], threads=2))


def test_a_timed_cpu_compare_records_its_pool(tmp_path):
    report = compare(_save(tmp_path, conv_bn_relu()), repeat=2, modes=("fused",))
    assert report.cpu_threads >= 1 and len(report.builds["fused"].latencies) == 2
    assert compare(_save(tmp_path, conv_bn_relu()), repeat=0, modes=("fused",)).cpu_threads == 0


def test_onnxruntime_s_own_noise_is_shown_and_allowed():
    """A QDQ conv: onnxruntime optimized and as written are one int8 step apart at a few elements; the
    report says where and how much, every comparison allows it per element, and the verdict passes."""
    from tvm_fusion.testing import qdq_conv

    report = compare(qdq_conv(), repeat=0)
    assert report.ok, str(report)
    (out,) = report.outputs
    noisy, biggest = report.noise[out]
    assert 0 < noisy < 4096 // 100 and biggest == pytest.approx(0.05, rel=1e-3)
    text = str(report)
    assert f"onnxruntime's own runs (graph optimized vs as written) differ on {out} at {noisy} elements (max 0.05)" in text
    assert "|a - r| <= atol * max(rms(r), max|r|/10) + rtol * |r| + noise(r) per element" in text
    assert all(s.noise == pytest.approx(biggest) for stats in report.errors.values() for s in stats)
