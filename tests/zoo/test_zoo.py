"""Real exporters' graphs (tests/zoo/*.onnx, made by make_zoo.py): import through the simplifier, fused llvm
build vs onnxruntime element by element on the entry's own inputs, exact per-rule counts, CUDA compiles."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from functools import lru_cache

import numpy as np
import onnx
import pytest
from corpus import ENTRIES, ZOO_DIR, make_inputs, model_path, shapes

import tvm_fusion as tf
from tvm_fusion import simplify
from tvm_fusion._tvm import relax, tvm
from tvm_fusion.compare import as_arrays, run_onnxruntime
from tvm_fusion.frontend import onnx_node_names

#: per-rule counts of the fused llvm build (rules that fired), recorded 2026-11-30; squeeze_excite and
#: conv2d_add (residual without activation), conv2d_silu_add (after it), attention 2026-12-01
EXPECTED_COUNTS = {
    "mobilenetv3_ts13": {"squeeze_excite_relu_hardsigmoid": 3, "conv2d_bias_hardswish": 6, "conv2d_bias_relu": 5,
                         "conv2d_add": 2, "dense_bias_hardswish": 1, "dense_bias": 1, "conv2d_bias": 3},
    "mobilenetv3_dynamo18": {"squeeze_excite_relu_hardsigmoid": 3, "conv2d_bias_hardswish": 6,
                             "conv2d_bias_relu": 5, "conv2d_add": 2, "dense_bias_hardswish": 1, "dense_bias": 1,
                             "conv2d_bias": 3},
    "efficientnet_ts15": {"squeeze_excite_silu_sigmoid": 4, "conv2d_bias_silu": 9, "conv2d_add": 2, "dense_bias": 1,
                          "conv2d_bias": 2},
    "convnext_ts17": {"dense_bias_gelu_erf": 2, "dense_scale": 2, "dense_bias": 1, "layer_norm": 4,
                      "conv2d_bias": 3},
    "convnext_dynamo18": {"dense_scale": 2, "dense_bias_gelu_erf": 2, "dense_bias": 1, "layer_norm": 4,
                          "conv2d_bias": 3},
    "bert_ts14": {"attention": 2, "dense_bias_gelu_erf": 2, "dense_bias_tanh": 1, "dense_bias": 10, "add_layer_norm": 5},
    "bert_dynamo18": {"attention": 2, "dense_bias_gelu_erf": 2, "dense_bias_tanh": 1, "dense_bias": 10, "add_layer_norm": 5},
    "yolo_ts17": {"conv2d_silu_add": 3, "conv2d_bias_silu": 11, "conv2d_bias": 1},
    "yolo_constants_ts13": {"conv2d_silu_add": 3, "conv2d_bias_silu": 11, "conv2d_bias": 1},
}
#: the CUDA build of these runs by default; the others are marked slow
CUDA_DEFAULT = ("convnext_ts17",)


@lru_cache(maxsize=None)
def imported(name: str):
    return tf.import_onnx(model_path(name), shapes(name))


@lru_cache(maxsize=None)
def reference(name: str) -> list[np.ndarray]:
    feeds = make_inputs(name)
    sess, _ = run_onnxruntime(onnx.load(str(model_path(name))), feeds, optimize=False)
    return sess.run(None, feeds)


def run_fused_llvm(name: str):
    built = tf.build(imported(name), "llvm", "fused")
    feeds, dev = make_inputs(name), tvm.cpu()
    vm = relax.VirtualMachine(built.executable, dev)
    out = as_arrays(vm["main"](*[tvm.runtime.tensor(feeds[k], dev) for k in ENTRIES[name]["inputs"]]))
    return built, out


def assert_elementwise_close(actual: np.ndarray, ref: np.ndarray, what: str) -> None:
    """|a - b| <= 1e-5 * max(1, max|ref|) + 1e-4 * |ref|, for every element (float32)."""
    assert actual.shape == ref.shape, f"{what}: shape {actual.shape} != onnxruntime's {ref.shape}"
    ref64, diff = ref.astype(np.float64), np.abs(actual.astype(np.float64) - ref.astype(np.float64))
    bound = 1e-5 * max(1.0, float(np.abs(ref64).max())) + 1e-4 * np.abs(ref64)
    bad = diff > bound
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} elements over tolerance; worst at "
                           f"{np.unravel_index(np.argmax(diff - bound), diff.shape)}: |d| {diff.max():.3g}")


def test_corpus_is_small_and_complete():
    files = sorted(p.name for p in ZOO_DIR.glob("*.onnx"))
    assert files == sorted(f"{n}.onnx" for n in ENTRIES)
    assert sum(p.stat().st_size for p in ZOO_DIR.glob("*.onnx")) < 2 * 1024 * 1024


def test_inputs_are_meaningful():
    feeds = make_inputs("bert_ts14")
    assert feeds["input_ids"].dtype == np.int64 and 0 <= feeds["input_ids"].min() <= feeds["input_ids"].max() < 100
    mask = feeds["attention_mask"]
    assert set(np.unique(mask)) <= {0, 1} and mask[..., 0].all()
    assert all(np.isfinite(r).all() for r in reference("bert_ts14"))


@pytest.mark.parametrize("name", list(ENTRIES))
def test_fused_llvm_matches_onnxruntime(name):
    built, out = run_fused_llvm(name)
    ref = reference(name)
    assert len(out) == len(ref)
    for i, (a, r) in enumerate(zip(out, ref)):
        assert_elementwise_close(a, r, f"{name} output {ENTRIES[name]['outputs'][i]}")
    assert {k: v for k, v in built.counts.items() if v} == EXPECTED_COUNTS[name]


@pytest.mark.parametrize("name", list(ENTRIES))
def test_simplifier_ran_and_kept_names(name):
    record = simplify.record_of(imported(name))
    assert record["simplifier"] == simplify.DEFAULT and "skipped" not in record, record
    original = {n.name for n in onnx.load(str(model_path(name))).graph.node}
    named = set(onnx_node_names(imported(name)).values())
    assert named and named <= original, sorted(named - original)[:5]  # every group names the user's nodes


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in CUDA_DEFAULT else pytest.mark.slow)
                                  for n in ENTRIES])
def test_cuda_build_compiles(name):
    built = tf.build(imported(name), "cuda", "fused")
    assert built.kernel_calls > 0
    assert {k: v for k, v in built.counts.items() if v} == EXPECTED_COUNTS[name]


def test_without_simplifier_a_failure_is_one_line_naming_the_node():
    with pytest.raises(tf.FusionError) as err:
        tf.import_onnx(model_path("bert_ts14"), shapes("bert_ts14"), simplify=False)
    msg = str(err.value)
    assert "\n" not in msg and "Traceback" not in msg
    assert "TVM's ONNX importer failed at node '/layers.0/Gather' (Gather)" in msg
    assert "(simplifier not run: --no-simplify)" in msg


def test_manifest_says_what_ran(tmp_path):
    from tvm_fusion.cli import main

    argv = ["compile", str(model_path("yolo_constants_ts13")), "--shape", "images=1x3x32x32", "--target", "llvm",
            "--no-counts", "--no-verify"]
    assert main([*argv, "-o", str(tmp_path / "on.so")]) == 0
    assert main([*argv, "-o", str(tmp_path / "off.so"), "--no-simplify"]) == 0
    on = json.loads((tmp_path / "on.so.json").read_text())["simplify"]
    off = json.loads((tmp_path / "off.so.json").read_text())["simplify"]
    assert on["simplifier"] == "onnxslim" and on["nodes_before"] == 90 and on["nodes_after"] == 56, on
    assert off == {"simplifier": "off", "skipped": "--no-simplify"}


def test_no_simplify_on_the_command_line(capsys):
    from tvm_fusion.cli import main

    argv = ["explain", str(model_path("bert_ts14")), "--shape", "input_ids=1x16", "--shape", "attention_mask=1x16"]
    assert main([*argv, "--no-simplify"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "failed at node '/layers.0/Gather'" in err


def test_pass_failure_is_one_line_naming_the_onnx_node():
    err = RuntimeError("emit_te now only supports Tensor that has ShapeExpr shape\n  File \"block_builder.cc\"")
    err.onnx_node = ("Resize_3", "Resize")
    msg = str(simplify.failure("m.onnx", "TVM's FoldConstant", err, {"Resize_3": "/up/Resize"}, {"nodes_after": 9}))
    assert msg == ("m.onnx: TVM's FoldConstant failed at node '/up/Resize' (Resize): RuntimeError: emit_te now "
                   "only supports Tensor that has ShapeExpr shape")
    assert simplify._failing_binding(imported("yolo_ts17")) is None  # a module that legalizes has no culprit


def test_pass_failure_blames_only_calls_on_constants():
    """exp of a tensor of unknown shape cannot be legalized on its own, but FoldConstant never tries it."""
    x = relax.Var("x", relax.TensorType(None, "float32", ndim=2))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.exp(x), name_hint="exp_node")
        bb.emit_func_output(out)
    assert simplify._failing_binding(bb.get()) is None


@pytest.mark.slow
def test_generator_is_reproducible(tmp_path):
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed (pip install torch==2.13.0 regenerates the corpus)")
    subprocess.run([sys.executable, str(ZOO_DIR / "make_zoo.py"), str(tmp_path)], check=True,
                   capture_output=True, timeout=600)
    for name in ENTRIES:
        assert (tmp_path / f"{name}.onnx").read_bytes() == model_path(name).read_bytes(), name
