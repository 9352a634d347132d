"""The AVX512-BF16 dense (`dense_dpbf16`): when it takes a dense and why it declines, its packing, the dot
product instruction in every build, and where the host's target has AVX512-BF16 without AMX numerics against
float64 NumPy (bfloat16's tolerance) and against the AVX-512 bfloat16 kernel (one ulp)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tvm_fusion._tvm import tirx, tvm
from tvm_fusion.schedules.llvm.conv2d_dpbf16_test import ADDED, HOST, HOST_WITHOUT_DOT, NEEDS_DOT, NO_BF16, ZEN4
from tvm_fusion.schedules.llvm.dense_amx_test import bf16_dense, run_dense
from tvm_fusion.schedules.llvm.dense_dpbf16 import COLS, pack_dpbf16_dense, why_not
from tvm_fusion.testing import assert_close

BF16 = ml_dtypes.bfloat16


@pytest.mark.parametrize("args,reason", [
    (("float32", 64, ZEN4), "takes bfloat16 products; this one is float32"),
    (("bfloat16", tirx.Var("N", "int64"), ZEN4), "static number of rows"),
    (("bfloat16", 64, NO_BF16), "no AVX512-BF16"),
])
def test_declines_with_a_reason(args, reason):
    assert reason in why_not(*args)


def test_takes_bfloat16_denses_of_any_row_count():
    for m in (1, 5, 128):
        assert why_not("bfloat16", m, ZEN4) is None and why_not("bfloat16", m, ADDED) is None


def test_pack_pairs_k_per_column():
    w = (np.arange(7 * 70) % 251 - 125).astype(BF16).reshape(7, 70)
    packed = pack_dpbf16_dense(w)
    assert packed.shape == (2, 4, COLS) and packed.dtype == np.uint32  # 70 -> 128 columns, 7 -> 8 of K
    bits = w.view(np.uint16).astype(np.uint32)
    for k, n in [(0, 0), (1, 0), (5, 33), (6, 69), (3, 64)]:
        assert packed[n // COLS, k // 2, n % COLS] >> (16 * (k % 2)) & 0xFFFF == bits[k, n]
    assert not packed[1, :, 6:].any() and not (packed[:, 3] >> 16).any()  # the padding is zeros


@pytest.mark.parametrize("target", [ZEN4, ADDED], ids=["znver4", "icelake+avx512bf16"])
def test_every_build_runs_the_dot_product_instruction(target):
    func, note, arrays, _ = bf16_dense(13, 96, 80, target)
    assert note == "AVX512-BF16 dot products" and arrays[1].dtype == np.uint32 and arrays[1].shape == (2, 48, COLS)
    assert "vdpbf16ps" in tvm.compile(tvm.IRModule({"main": func}), target).mod.inspect_source("asm")


def test_a_target_without_it_keeps_the_avx512_kernel():
    func, note, arrays, _ = bf16_dense(13, 96, 80, NO_BF16)
    assert arrays[1].dtype != np.uint32 and "BF16" not in (note or "")


# (m, k, n, activation): a GEMV, row counts that are not whole tasks, odd K, columns that are not whole
# vectors or tiles (1000 classes), GELU
SHAPES = [(1, 2048, 1000, None), (5, 50, 40, "relu"), (13, 33, 17, "relu"), (128, 768, 96, "gelu_erf"),
          (6, 64, 130, None)]


@NEEDS_DOT
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "weight-stage"])
@pytest.mark.parametrize("m,k,n,activation", SHAPES)
def test_dpbf16_dense_matches_float64(m, k, n, activation, packed):
    note, got, want = run_dense(m, k, n, HOST, activation, packed)
    assert note == "AVX512-BF16 dot products"
    assert_close(got, want, f"AVX512-BF16 dense {m}x{k}x{n}", dtype="bfloat16")


@NEEDS_DOT
@pytest.mark.parametrize("m,k,n,activation", SHAPES[:4])
def test_dpbf16_dense_within_one_ulp_of_the_avx512_kernel(m, k, n, activation):
    """Both sum exact bfloat16 products in float32 and round once: at most one bfloat16 ulp apart."""
    (note, dots), (plain_note, plain) = [run_dense(m, k, n, t, activation)[:2] for t in (HOST, HOST_WITHOUT_DOT)]
    assert note == "AVX512-BF16 dot products" and "BF16" not in (plain_note or "")
    assert (np.abs(dots - plain) <= np.maximum(np.abs(dots), np.abs(plain)) * 2.0 ** -7).all()
