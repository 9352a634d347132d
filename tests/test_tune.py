"""compile --tune: MetaSchedule tuning of the fused kernels, the database reused by every model with the same
fused group shapes, the hand schedule kept where it is faster, measuring here or over TVM's RPC tracker."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tvm_fusion import _tvm
from tvm_fusion.build.builder import build, default_rules
from tvm_fusion.cli import main
from tvm_fusion.deploy.compile import compile_model
from tvm_fusion.examples import with_dynamic_batch
from tvm_fusion.frontend.importer import import_onnx
from tvm_fusion.check.io import random_inputs, run_onnxruntime
from tvm_fusion.testing import assert_close, conv_bn_relu, run_build
from tvm_fusion.build.tune import CHOICES_FILE, TuneOptions, parse_rpc

fuse = __import__("tvm_fusion.fusion.fuse", fromlist=["fuse"]).fuse


def _records(db: Path) -> int:
    path = db / "database_tuning_record.json"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _cli(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# ---------------------------------------------------------------- bad input: one line, exit 2, before any work
@pytest.mark.parametrize("flags, message", [
    (["--tune", "0"], "error: --tune 0: give the MetaSchedule trials per fused kernel, 1 or more (e.g. --tune 64)"),
    (["--tune", "2", "--tune-rpc", "localhost:9190"],
     "error: --tune-rpc 'localhost:9190': expected HOST:PORT:KEY of a TVM RPC tracker, e.g. 127.0.0.1:9190:h200 "
     "(the key the servers registered with --key)"),
    (["--tune", "2", "--tune-rpc", "host:99999:k"], "error: --tune-rpc 'host:99999:k': expected HOST:PORT:KEY"),
    (["--tune-db", "somewhere"], "error: --tune-db without --tune: add --tune TRIALS (e.g. --tune 64)"),
    (["--tune", "2", "--tune-rpc-workers", "0", "--tune-rpc", "h:1:k"], "error: --tune-rpc-workers 0: use 1 or more"),
    (["--tune-kernels", "conv2d_bn_relu"], "error: --tune-kernels without --tune: add --tune TRIALS (e.g. --tune 64)"),
    (["--tune", "2", "--tune-kernels", "conv2d_bn_rlu"],
     "error: --tune-kernels conv2d_bn_rlu: not a fused kernel of this model; did you mean conv2d_bn_relu?"),
])
def test_bad_tune_flags(capsys, tmp_path, flags, message):
    model = tmp_path / "m.onnx"
    model.write_bytes(conv_bn_relu().SerializeToString())
    if "--tune-db" not in flags and "--tune" in flags:
        flags = [*flags, "--tune-db", str(tmp_path / "db")]
    rc, _, err = _cli(capsys, "compile", str(model), "--target", "llvm", "-o", str(tmp_path / "m.so"), *flags)
    assert rc == 2 and err.startswith(message) and err.count("\n") == 1, err
    assert not (tmp_path / "m.so").exists()


def test_tune_db_is_a_file(capsys, tmp_path):
    model, db = tmp_path / "m.onnx", tmp_path / "db"
    model.write_bytes(conv_bn_relu().SerializeToString())
    db.write_text("not a folder")
    rc, _, err = _cli(capsys, "compile", str(model), "--target", "llvm", "-o", str(tmp_path / "m.so"),
                      "--tune", "2", "--tune-db", str(db))
    assert rc == 2 and err == f"error: --tune-db {db}: is a file; give a folder (made when missing)\n"


def test_kernels_with_a_symbolic_batch_are_not_tuned(capsys, tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(with_dynamic_batch(conv_bn_relu()).SerializeToString())
    rc, out, err = _cli(capsys, "compile", str(model), "--target", "llvm", "-o", str(tmp_path / "m.so"),
                        "--shape", "x=Nx8x12x12", "--tune", "2", "--tune-db", str(tmp_path / "db"), "--no-counts")
    assert rc == 0, err
    assert "0 of 0 fused kernels use the tuned schedule, 0 new trials" in out
    assert "not tuned: conv2d_bn_relu (a symbolic dim: MetaSchedule measures fixed shapes)" in out
    assert _records(tmp_path / "db") == 0


@pytest.mark.parametrize("mcpu,why", [("sapphirerapids", "AMX tiles: a hand-written loop nest of tile instructions"),
                                      ("znver4", "AVX512-BF16: a hand-written loop nest of dot-product instructions")])
def test_hand_written_bf16_kernels_are_not_tuned(capsys, tmp_path, mcpu, why):
    """A bfloat16 conv on AMX tiles or AVX512-BF16 is a hand-written loop nest of instructions: tuning passes it
    by and says so (MetaSchedule schedules TE computes). Built for each CPU, on any host: nothing is timed."""
    model = tmp_path / "m.onnx"
    model.write_bytes(conv_bn_relu(cin=16, cout=32).SerializeToString())
    target = json.dumps({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    rc, out, err = _cli(capsys, "compile", str(model), "--target", target, "-o", str(tmp_path / "m.so"),
                        "--precision", "bf16", "--tune", "2", "--tune-db", str(tmp_path / "db"), "--no-counts")
    assert rc == 0, err
    assert f"not tuned: conv2d_bn_relu ({why}" in out
    assert _records(tmp_path / "db") == 0


def test_parse_rpc():
    assert parse_rpc("127.0.0.1:9190:h200") == ("127.0.0.1", 9190, "h200")
    assert parse_rpc("farm.example.org:9000:sm90-box") == ("farm.example.org", 9000, "sm90-box")
    assert parse_rpc("[::1]:9190:k") == ("::1", 9190, "k")


@pytest.mark.skipif(_tvm.has_cuda_device(), reason="this machine has a GPU: --tune for cuda measures on it")
def test_cuda_tune_without_gpu_names_the_rpc_runner(capsys, tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(conv_bn_relu().SerializeToString())
    rc, _, err = _cli(capsys, "compile", str(model), "--target", "cuda", "-o", str(tmp_path / "m.so"),
                      "--tune", "2", "--tune-db", str(tmp_path / "db"), "--no-counts")
    assert rc == 2, err
    assert err == ("error: --tune for --target cuda measures every candidate on a GPU, and this machine has none "
                   "(tvm.cuda(0).exist is False); pass --tune-rpc HOST:PORT:KEY of a TVM RPC tracker whose servers "
                   "have the GPU (README: 'Tuning on a build farm'), or run the compile on the GPU host\n")
    assert _records(tmp_path / "db") == 0 and not (tmp_path / "m.so").exists()


def test_fuse_keeps_the_plain_compute_of_each_hand_scheduled_kernel():
    """What tuning starts from: the rule's compute before its hand schedule, with the same parameters."""
    result = fuse(import_onnx(conv_bn_relu()), _tvm.cpu_target(), default_rules())
    assert sorted(result.plain) == ["conv2d_bn_relu"]
    plain, hand = result.plain["conv2d_bn_relu"], result.mod["conv2d_bn_relu"]
    assert _tvm.SCHEDULED_ATTR not in plain.attrs and bool(hand.attrs[_tvm.SCHEDULED_ATTR])
    assert [tuple(map(int, b.shape)) for b in plain.params] == [tuple(map(int, b.shape)) for b in hand.params]
    assert not _tvm.structural_equal(plain, hand.without_attr(_tvm.SCHEDULED_ATTR))


# ---------------------------------------------------------------- tuning on this machine
@pytest.mark.slow
def test_tuned_build_matches_and_the_database_is_reused(capsys, tmp_path):
    """4 trials of the one fused kernel; the tuned schedule forced in (keep="tuned") must match onnxruntime and
    the unfused build element-wise; then a model with other weights but the same group shapes, and the CLI,
    reuse the database: zero new trials, no new records."""
    db = tmp_path / "db"
    model = conv_bn_relu(seed=0)
    mod = import_onnx(model)
    built = build(mod, "llvm", "fused", tune=TuneOptions(4, db, keep="tuned"))
    report = built.tuning
    [k] = report.kernels
    assert (k.kernel, k.trials, k.new_trials, k.chosen) == ("conv2d_bn_relu", 4, 4, "tuned")
    assert k.hand_ms > 0 and k.tuned_ms > 0 and k.gain == pytest.approx(k.hand_ms / k.tuned_ms)
    assert 1 <= k.measured <= 4 and _records(db) == k.measured  # MetaSchedule may stop early on a small space
    hand = fuse(mod, built.target, default_rules()).mod["conv2d_bn_relu"]
    assert not _tvm.structural_equal(built.module["conv2d_bn_relu"], hand)  # the tuned kernel is what runs
    inputs = random_inputs(model, seed=3)
    sess, _ = run_onnxruntime(model, inputs)
    [ref] = sess.run(None, inputs)
    [got] = run_build(built, list(inputs.values()))
    [unfused] = run_build(build(mod, "llvm", "unfused"), list(inputs.values()))
    assert_close(got, ref, "tuned fused vs onnxruntime")
    assert_close(got, unfused, "tuned fused vs unfused")

    records = _records(db)
    other = tmp_path / "other.onnx"
    other.write_bytes(conv_bn_relu(seed=7).SerializeToString())  # other weights, the same group shapes
    result = compile_model(other, tmp_path / "other.so", "llvm", counts_of_other_builds=False,
                           tune=TuneOptions(4, db, keep="tuned"))
    assert result.manifest["verification"]["verified"]
    [again] = result.manifest["tuning"]["kernels"]
    assert (again["workload"], again["new_trials"], again["chosen"]) == (k.workload, 0, "tuned")
    assert result.manifest["tuning"]["new_trials"] == 0 and _records(db) == records

    rc, out, err = _cli(capsys, "compile", str(other), "--target", "llvm", "-o", str(tmp_path / "cli.so"),
                        "--tune", "4", "--tune-db", str(db), "--no-counts")
    assert rc == 0, err
    assert "0 new trials" in out and "kernel          hand ms  tuned ms  gain" in out
    row = next(ln for ln in out.splitlines() if ln.startswith("conv2d_bn_relu "))
    assert row.split()[-4:] == ["4", str(k.measured), "from", "db"]
    assert row.split()[4] == ("tuned" if k.tuned_ms < k.hand_ms else "hand")
    choices = json.loads((db / CHOICES_FILE).read_text())
    assert list(choices) == [str(built.target)] and list(choices[str(built.target)]) == [k.workload]
    assert _records(db) == records


# ---------------------------------------------------------------- measuring over TVM's RPC tracker
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 15)  # the process group this test started (the server forks per session)
        proc.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass


@pytest.fixture
def rpc_tracker():
    """A tracker and one server under key `tvm-fusion-test` on free localhost ports: "HOST:PORT:KEY"."""
    port, key = _free_port(), "tvm-fusion-test"
    tracker = _start(["tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port),
                      "--port-end", str(port + 1), "--silent"])
    server_port = _free_port()
    server = _start(["tvm.exec.rpc_server", "--tracker", f"127.0.0.1:{port}", "--key", key, "--host", "127.0.0.1",
                     "--port", str(server_port), "--port-end", str(server_port + 1), "--silent"])
    try:
        deadline = time.time() + 240
        while True:
            try:
                summary = _tvm.tvm.rpc.connect_tracker("127.0.0.1", port).summary()
                if key in str(summary.get("queue_info", {})) or key in str(summary.get("server_info", [])):
                    break
            except (ConnectionError, OSError, RuntimeError):
                pass
            assert time.time() < deadline, "the RPC server did not register with the tracker in 240 s"
            time.sleep(1)
        yield f"127.0.0.1:{port}:{key}"
    finally:
        _stop(server)
        _stop(tracker)


@pytest.mark.slow
def test_tuning_measured_over_rpc(tmp_path, rpc_tracker):
    """2 trials measured by an RPC server through the tracker; the tuned library matches onnxruntime."""
    db = tmp_path / "db"
    model = tmp_path / "m.onnx"
    model.write_bytes(conv_bn_relu(cin=4, cout=8, hw=(8, 8)).SerializeToString())
    result = compile_model(model, tmp_path / "m.so", "llvm", counts_of_other_builds=False,
                           tune=TuneOptions(2, db, rpc=rpc_tracker, keep="tuned"))
    tuning = result.manifest["tuning"]
    host, port, key = parse_rpc(rpc_tracker)
    assert tuning["runner"] == f"measured over RPC: tracker {host}:{port}, key {key}"
    [k] = tuning["kernels"]
    assert k["new_trials"] == 2 and k["chosen"] == "tuned" and k["hand_ms"] > 0 and k["tuned_ms"] > 0
    assert 1 <= k["measured"] <= 2 and _records(db) == k["measured"]
    assert result.manifest["verification"]["verified"]  # element-wise against onnxruntime, the tuned kernel in
    assert np.isfinite(k["gain"])
