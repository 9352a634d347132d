"""CPU (llvm) dense schedule: W packed at compile time into the column tiles the kernel reads, batch 1
(GEMV) and row blocks, element-wise against onnxruntime on the host's target and a forced AVX2 target."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_fusion.frontend import importer as frontend
from tvm_fusion.build.builder import build, resolve_target
from tvm_fusion.check.compare import run_onnxruntime
from tvm_fusion.hardware import cpu_facts
from tvm_fusion.schedules.dense import pack_columns
from tvm_fusion.schedules.llvm.dense import column_block, packed_columns, row_block
from tvm_fusion.testing import GraphBuilder, assert_close, run_build

AVX2 = '{"kind": "llvm", "mcpu": "x86-64-v3"}'
TARGETS = {"host": "llvm", "avx2": AVX2}


def _gemm_relu(m: int, k: int, n: int, seed: int = 0):
    g = GraphBuilder(seed)
    x = g.input("x", [m, k])
    w = g.const(g.rng.normal(0, 0.3, (n, k)).astype(np.float32), "w")
    b = g.const(g.rng.normal(0, 0.1, n).astype(np.float32), "b")
    return g.model([g.op("Relu", [g.op("Gemm", [x, w, b], transB=1)])])


def _dense_func(built):
    funcs = [f for gv, f in built.module.functions.items() if gv.name_hint.startswith("dense_bias_relu")]
    assert len(funcs) == 1, [gv.name_hint for gv in built.module.functions]
    return funcs[0]


def test_pack_columns_is_a_pure_relayout():
    w = np.arange(6 * 8, dtype=np.float32).reshape(6, 8)
    packed = pack_columns(w, 4)
    assert packed.shape == (2, 6, 4) and packed.flags.c_contiguous
    for t, k, c in np.ndindex(packed.shape):
        assert packed[t, k, c] == w[k, t * 4 + c]


@pytest.mark.parametrize("n,lanes,cols", [(4096, 16, 64), (4096, 8, 32), (1000, 16, 40), (1000, 8, 20),
                                          (96, 16, 48), (13, 16, 1), (12, 8, 12)])
def test_column_tiles_are_vectors_of_the_target(n, lanes, cols):
    assert column_block(n, lanes) == cols


@pytest.mark.parametrize("n,lanes,cols", [(4096, 8, 32), (6625, 8, 32), (6625, 16, 64), (13, 8, 16),
                                          (13, 16, 1), (3, 8, 1), (1000, 8, 32), (1000, 16, 64)])
def test_columns_without_a_vector_divisor_pad_to_whole_tiles(n, lanes, cols):
    assert packed_columns(n, lanes) == cols
    if cols > 1:
        assert column_block(-(-n // cols) * cols, lanes) == cols  # the schedule splits the padded N the same


@pytest.mark.parametrize("n,lanes,cols", [(1000, 8, 32), (1000, 16, 64), (1100, 8, 32), (100, 8, 20), (96, 16, 48),
                                          (12, 8, 12)])
def test_part_vector_blocks_pad_to_whole_vectors_when_little_is_added(n, lanes, cols):
    """1000 classes: 20 columns (2.5 ymm) -> 32, N padded to 1024 (2.4% more); 1100 -> 1120 (1.8%); 100 would
    add 28% (-> 128): it keeps 20; 96 / 16 is whole zmm already; 12 is under a tile of 4 vectors."""
    assert packed_columns(n, lanes) == cols
    assert column_block(-(-n // cols) * cols, lanes) == cols  # the schedule splits the padded N the same


def test_pack_columns_pads_the_last_tile_with_zero_columns():
    w = np.arange(3 * 5, dtype=np.float32).reshape(3, 5) + 1
    packed = pack_columns(w, 4)
    assert packed.shape == (2, 3, 4)
    assert np.array_equal(packed[1, :, 1:], np.zeros((3, 3), np.float32)) and np.array_equal(packed[1, :, 0], w[:, 4])


def test_row_blocks_fit_half_the_vector_registers():
    avx512, avx2 = cpu_facts(resolve_target('{"kind": "llvm", "mcpu": "znver4"}')), cpu_facts(resolve_target(AVX2))
    assert (avx512.vector_registers, avx2.vector_registers) == (32, 16)
    assert row_block(1, 64, avx512) == 1
    assert row_block(128, 64, avx512) == 4  # 4 rows x 4 zmm = 16 accumulators
    assert row_block(128, 32, avx2) == 2  # 2 rows x 4 ymm = 8
    assert row_block(6, 64, avx512) == 3
    assert row_block(7, 64, avx512) == 1


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("m,k,n", [(1, 2304, 1024), (1, 300, 1000), (8, 96, 96), (6, 40, 13), (3, 20, 12),
                                   (40, 120, 6625), (2, 7, 3)])
def test_packed_dense_matches_onnxruntime(target, m, k, n):
    """Batch 1 and row blocks; N with and without a vector-sized divisor (13 and 6625: padded to whole
    tiles, except 13 for AVX-512's 16 lanes; 3: W stays [K, N])."""
    tgt = resolve_target(TARGETS[target])
    model = _gemm_relu(m, k, n)
    built = build(frontend.import_onnx(model), tgt, "fused")
    assert {r: c for r, c in built.counts.items() if c} == {"dense_bias_relu": 1}
    cols = packed_columns(n, cpu_facts(tgt).float32_lanes)
    weight = _dense_func(built).params[1]
    want = (k, n) if cols == 1 else (-(-n // cols), k, cols)
    assert tuple(int(d) for d in weight.shape) == want
    x = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
    sess, _ = run_onnxruntime(model, {"x": x})
    assert_close(run_build(built, [x])[0], sess.run(None, {"x": x})[0], f"{target} dense {m}x{k}x{n}")


def test_avx2_gemv_reads_tiles_of_four_ymm_in_parallel():
    """AlexNet's fc7 shape at batch 1 for AVX2: W as [4096 / 32, 4096, 32], tiles in parallel, 32 columns
    vectorized, the reduction innermost but one."""
    built = build(frontend.import_onnx(_gemm_relu(1, 4096, 4096)), resolve_target(AVX2), "fused")
    func = _dense_func(built)
    assert tuple(int(d) for d in func.params[1].shape) == (128, 4096, 32)
    text = func.script()
    assert "T.parallel(128)" in text and "T.vectorized(32)" in text


@pytest.mark.parametrize("target,shape,cols", [('{"kind": "llvm", "mcpu": "znver4"}', (16, 2048, 64), 64),
                                               (AVX2, (32, 2048, 32), 32)])
def test_thousand_classes_are_packed_in_whole_vector_tiles(target, shape, cols):
    """ResNet-50's classifier (2048 -> 1000): 20 / 40 columns (2.5 vectors) before; now N padded to 1024 in
    tiles of 4 vectors of the target (compiled for AVX-512 here, not run; run for AVX2 in the test above)."""
    built = build(frontend.import_onnx(_gemm_relu(1, 2048, 1000)), resolve_target(target), "fused")
    func = _dense_func(built)
    assert tuple(int(d) for d in func.params[1].shape) == shape
    assert f"T.vectorized({cols})" in func.script()
