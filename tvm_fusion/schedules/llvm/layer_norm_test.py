"""The llvm LayerNorm schedule: each row sum is a vector of partial sums of the target's width (not one scalar
chain), rows in parallel, and the result matches onnxruntime and the unfused build; a row too short for two
vectors keeps scalar sums. Built for forced targets, so the widths do not depend on this host."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import numpy_helper

from tvm_fusion._tvm import tvm
from tvm_fusion.build.builder import build, resolve_target
from tvm_fusion.frontend.importer import import_onnx
from tvm_fusion.testing import GraphBuilder, assert_close, check_fused, run_build

AVX2 = '{"kind": "llvm", "mcpu": "x86-64-v3"}'
AVX512 = '{"kind": "llvm", "mcpu": "skylake-avx512"}'


def _layer_norm(rows: int, c: int):
    g = GraphBuilder(c)
    x, r = g.input("x", [rows, c]), g.input("r", [rows, c])
    gamma, beta = g.rng.uniform(0.5, 1.5, c).astype(np.float32), g.rng.normal(0, 0.1, c).astype(np.float32)
    y = g.op("LayerNormalization", [g.op("Add", [x, r]), g.const(gamma), g.const(beta)], axis=-1, epsilon=1e-5)
    return g.model([y], opset=18)


def _kernel(model, target) -> str:
    built = build(import_onnx(model), resolve_target(target), "fused")
    (group,) = built.fused.groups
    return built.fused.mod[group.function].script()


@pytest.mark.parametrize("target,c,width", [(AVX512, 768, 16), (AVX2, 768, 8), (AVX512, 24, 8), (AVX2, 100, 4)])
def test_row_sums_are_vectors_of_partial_sums(target, c, width):
    script = _kernel(_layer_norm(4, c), target)
    for name in ("mean", "var"):
        assert f"{name}_rf_local = T.sblock_alloc_buffer((4, {width}), scope=\"local\")" in script
    assert script.count(f"in T.vectorized({width})") >= 4  # both sums' inits and updates
    assert re.search(r"for \w+ in T\.parallel\(4\)", script), script


@pytest.mark.parametrize("c", [33, 6])
def test_a_row_without_two_whole_vectors_keeps_scalar_sums(c):
    script = _kernel(_layer_norm(3, c), AVX2)
    assert "_rf" not in script and re.search(r"for \w+ in T\.parallel\(3\)", script), script


@pytest.mark.parametrize("shape", [(5, 768), (7, 24), (3, 33), (2, 100)])
def test_layer_norm_matches_onnxruntime(shape):
    check_fused(_layer_norm(*shape), expect={"add_layer_norm": 1})


def test_cuda_schedule_is_its_own():
    """The llvm schedule's rfactor does not reach the CUDA kernel (one block per row, cross-thread sums)."""
    from tvm_fusion.testing import check_cuda_build

    built = check_cuda_build(_layer_norm(4, 768), expect={"add_layer_norm": 1})
    kernels = [f for f in built.fused.mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert kernels and all("_rf_local" not in f.script() for f in kernels)


def test_symbolic_rows_keep_one_row_of_partial_sums():
    """A symbolic batch of rows: the partial sums are one row's vector (not N rows of them), and the kernel
    matches float64 NumPy at batch 1 and 3."""
    from tvm_fusion.frontend.importer import SymDim

    model = _layer_norm("N", 768)
    shapes = {"x": (SymDim("N", None), 768), "r": (SymDim("N", None), 768)}
    built = build(import_onnx(model, shapes), resolve_target(AVX2), "fused")
    (group,) = built.fused.groups
    func = built.fused.mod[group.function]
    passes = ("LowerInitBlock", "PlanAndUpdateBufferAllocationLocation", "ConvertBlocksToOpaque",
              "CompactBufferAllocation")
    compact = [getattr(tvm.s_tir.transform, p)() for p in passes]  # TVM's lowering up to the buffers' final sizes
    script = tvm.transform.Sequential(compact)(tvm.IRModule({"main": func}))["main"].script()
    for name in ("mean", "var"):  # allocated inside the parallel row loop: one row's lanes per thread
        assert f'{name}_rf_local = T.sblock_alloc_buffer((1, 8), scope="local")' in script, script
    gamma, beta = (numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer)
    for n in (1, 3):
        rng = np.random.default_rng(n)
        x, r = (rng.normal(0, 1, (n, 768)).astype(np.float32) for _ in range(2))
        h = (x + r).astype(np.float64)
        mean, var = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
        (got,) = run_build(built, [x, r])
        assert_close(got, (h - mean) / np.sqrt(var + 1e-5) * gamma + beta, f"batch {n}", dtype="float32")
