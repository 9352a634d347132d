"""The llvm elementwise-chain schedule: the vector loop stays inside the axes along which every operand is
read the same way (a per-channel BatchNorm + ReLU vectorizes H*W, never across channels), same-shape chains
fuse every loop as before; numerics equal to onnxruntime and to the unfused build."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tvm_fusion.frontend import importer as frontend
from tvm_fusion._tvm import tirx
from tvm_fusion.build.builder import build, resolve_target
from tvm_fusion.check.compare import run_onnxruntime
from tvm_fusion.schedules.llvm.elementwise import MIN_PARALLEL, vector_run_start
from tvm_fusion.testing import GraphBuilder, assert_close, run_build

AVX2 = resolve_target('{"kind": "llvm", "mcpu": "x86-64-v3"}')
AVX512 = resolve_target('{"kind": "llvm", "mcpu": "skylake-avx512"}')


@pytest.mark.parametrize(("extents", "reads", "start"), [
    ([1, 64, 28, 28], [{0, 1, 2, 3}, {0, 1}, {1}], 2),  # per-channel params: the run is H*W
    ([1, 64, 28, 28], [{0, 1, 2, 3}, {0, 1, 2, 3}], 0),  # same shapes: every loop
    ([8, 96], [{0, 1}, {1}], 1),  # a bias on the last axis: the run is that axis
    ([4, 1, 7], [{0, 2}, {2}], 1),  # a unit axis joins the run
    ([1, 64, 1, 1], [{0, 1}, {1}], 0),  # trailing unit axes: the channels are the run
    ([5, 6], [{0}, {0, 1}], 1),  # broadcast along the last axis only
])
def test_vector_run_start(extents, reads, start):
    assert vector_run_start(extents, [frozenset(r) for r in reads]) == start


def _bn_relu_model(c: int, hw: int):
    """DenseNet's pre-activation: BatchNormalization -> Relu on a feature map (no conv to fold into)."""
    g = GraphBuilder(c + hw)
    x = g.input("x", [1, c, hw, hw])
    return g.model([g.op("Relu", [g.bn(x, c)])])


def _chain(built):
    (func,) = [f for gv, f in built.fused.mod.functions.items()
               if isinstance(f, tirx.PrimFunc) and gv.name_hint.startswith("elementwise_chain")]
    return func.script()


@pytest.mark.parametrize("target", [AVX2, AVX512], ids=["avx2", "avx512"])
@pytest.mark.parametrize(("c", "hw"), [(32, 28), (48, 14), (40, 7)])
def test_per_channel_chain_vectorizes_within_a_channel(c, hw, target):
    built = build(frontend.import_onnx(_bn_relu_model(c, hw)), target, "fused")
    script = _chain(built)
    lanes = 16 if target is AVX512 else 8
    parallel = c * hw * hw >= MIN_PARALLEL
    assert bool(re.search(rf"T\.parallel\({c}\)", script)) == parallel, script  # one task per channel
    vectors = re.findall(r"T\.vectorized\((\d+)\)", script)
    # H*W as whole vectors when it holds them, else LLVM's vectorizer peels it
    assert vectors == ([str(lanes)] if hw * hw % lanes == 0 else []), script
    assert not re.search(r"//\s*" + str(hw * hw), script), script  # no channel index recomputed per lane


@pytest.mark.parametrize(("c", "hw"), [(32, 28), (48, 14), (40, 7)])
def test_per_channel_chain_numerics(c, hw):
    model = _bn_relu_model(c, hw)
    x = np.random.default_rng(c).normal(size=(1, c, hw, hw)).astype(np.float32)
    fused = build(frontend.import_onnx(model), AVX2, "fused")
    assert fused.counts  # the chain fused
    sess, _ = run_onnxruntime(model, {"x": x})
    got = run_build(fused, [x])[0]
    assert_close(got, sess.run(None, {"x": x})[0], f"bn+relu {c}x{hw}x{hw}")
    unfused = build(frontend.import_onnx(model), AVX2, "unfused")
    assert_close(got, run_build(unfused, [x])[0], "fused vs unfused")


def test_same_shape_chain_fuses_every_loop():
    g = GraphBuilder(3)
    a, b = g.input("a", [2, 6, 10, 10]), g.input("b", [2, 6, 10, 10])
    model = g.model([g.op("Sigmoid", [g.op("Relu", [g.op("Mul", [g.op("Add", [a, b]), b])])])])
    built = build(frontend.import_onnx(model), AVX2, "fused")
    script = _chain(built)
    assert re.search(r"T\.vectorized\(8\)", script) and "T.parallel" not in script, script  # 1200 elements
    assert len(re.findall(r"^\s+for ", script, re.MULTILINE)) == 2, script  # one fused loop split by the lanes
