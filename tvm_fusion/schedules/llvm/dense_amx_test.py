"""The AMX dense (`dense_amx`): when it takes a dense and why it declines, its packing, the tile instructions
in every AMX build, and numerics against float64 NumPy (bfloat16's tolerance) where the host has AMX tiles."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_fusion import registry
from tvm_fusion._tvm import te, tirx, tvm
from tvm_fusion.schedules.dense import DENSE_FAMILY
from tvm_fusion.schedules.llvm.conv2d_amx_test import BF16, HOST, NEEDS_AMX, NO_AMX, SAPPHIRE
from tvm_fusion.schedules.llvm.dense_amx import MIN_ROWS, pack_amx_dense, why_not
from tvm_fusion.testing import assert_close


@pytest.mark.parametrize("args,reason", [
    (("float32", 64, SAPPHIRE), "take bfloat16 products; this one is float32"),
    (("bfloat16", 1, SAPPHIRE), "1 rows of x would fill 1 of a tile's 16 rows"),
    (("bfloat16", tirx.Var("N", "int64"), SAPPHIRE), "static number of rows"),
    (("bfloat16", 64, NO_AMX), "no AMX bfloat16 tiles"),
])
def test_declines_with_a_reason(args, reason):
    assert reason in why_not(*args)


def test_takes_bfloat16_denses_of_a_tile_of_rows():
    assert why_not("bfloat16", MIN_ROWS, SAPPHIRE) is None


def test_pack_amx_dense_pairs_k_inside_a_tile():
    w = np.arange(50 * 40, dtype="float32").reshape(50, 40)
    packed = pack_amx_dense(w)
    assert packed.shape == (4, 2, 16, 16, 2)  # 40 -> 64 columns, 50 -> 64 of K
    for k, n in [(0, 0), (1, 0), (17, 5), (49, 39), (33, 20)]:
        assert packed[n // 16, k // 32, k % 32 // 2, n % 16, k % 2] == w[k, n]
    assert not packed[3].any() and not packed[:, 1, 9:].any()  # the padding is zeros


def bf16_dense(m, k, n, target, activation="relu", packed=True):
    """(scheduled PrimFunc, its note, its arguments, (x, W, b)) of a bfloat16 dense + bias + activation through
    the llvm dense family for `target`; W packed as the build packs it, or left [K, N]."""
    rng = np.random.default_rng(m * 7 + k + n)
    x = rng.standard_normal((m, k)).astype(BF16)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(BF16)
    b = rng.standard_normal(n).astype("float32")
    attrs = {"activation": activation}
    sched = registry.get_schedule(DENSE_FAMILY, "llvm")
    wv = sched.packed([w, b], attrs, [x.shape, w.shape, b.shape], target)[0] if packed else w
    xs, ws, bs = (te.placeholder(a.shape, str(a.dtype), name=nm) for a, nm in ((x, "x"), (wv, "w"), (b, "b")))
    out = registry.get_compute(DENSE_FAMILY, "llvm")(xs, ws, bs, target=target, fast_math=False, **attrs)
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([xs, ws, bs, out])}))
    with target:
        note = sched.apply(sch, attrs, target)
    return sch.mod["main"].with_attr("global_symbol", "main"), note, (x, wv, b), (x, w, b)


def test_every_amx_build_runs_tile_instructions():
    func, note, arrays, _ = bf16_dense(64, 96, 80, SAPPHIRE)
    script = func.script()
    assert note == "AMX bfloat16 tiles" and script.count("llvm.x86.tdpbf16ps") == 4
    assert arrays[1].shape == (6, 3, 16, 16, 2)
    tvm.compile(tvm.IRModule({"main": func}), SAPPHIRE)


def test_one_row_leaves_the_tiles():
    """A GEMV is not a tile's work: on an AMX core (which has AVX512-BF16 too) it takes the dot products."""
    func, note, _, _ = bf16_dense(1, 96, 80, SAPPHIRE)
    assert "tdpbf16ps" not in func.script() and note == "AVX512-BF16 dot products"


def run_dense(m, k, n, target, activation, packed=True):
    """(note, output as float64, float64 NumPy's result) of `bf16_dense` built and run for `target`."""
    func, note, arrays, (x, w, b) = bf16_dense(m, k, n, target, activation, packed)
    lib = tvm.compile(tvm.IRModule({"main": func}), target)
    out = tvm.runtime.tensor(np.full((m, n), np.nan, BF16))
    lib["main"](*[tvm.runtime.tensor(a) for a in arrays], out)
    want = x.astype(np.float64) @ w.astype(np.float64) + b
    if activation == "relu":
        want = np.maximum(want, 0)
    elif activation == "gelu_erf":
        from scipy.special import erf
        want = 0.5 * want * (1 + erf(want / np.sqrt(2)))
    return note, out.numpy().astype(np.float64), want


@NEEDS_AMX
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "weight-stage"])
@pytest.mark.parametrize("m,k,n,activation", [(16, 32, 32, None), (40, 50, 40, "relu"), (128, 768, 96, "gelu_erf"),
                                              (33, 64, 1000, None)])
def test_amx_dense_matches_float64(m, k, n, activation, packed):
    note, got, want = run_dense(m, k, n, HOST, activation, packed)
    assert note == "AMX bfloat16 tiles"
    assert_close(got, want, f"AMX dense {m}x{k}x{n}", dtype="bfloat16")


@NEEDS_AMX
@pytest.mark.parametrize("m,k,n", [(40, 50, 40), (128, 768, 96)])
def test_amx_dense_within_one_ulp_of_the_avx512_kernel(m, k, n):
    """Both sum bfloat16 products in float32 and round once: at most one bfloat16 ulp apart per element."""
    from tvm_fusion.schedules.llvm.conv2d_amx_test import HOST_WITHOUT_AMX

    outs = [run_dense(m, k, n, target, "relu")[:2] for target in (HOST, HOST_WITHOUT_AMX)]
    (note, tiles), (plain_note, plain) = outs
    assert note == "AMX bfloat16 tiles" and "AMX" not in (plain_note or "")
    assert (np.abs(tiles - plain) <= np.maximum(np.abs(tiles), np.abs(plain)) * 2.0 ** -7).all()
