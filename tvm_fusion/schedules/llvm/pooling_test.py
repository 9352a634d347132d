"""The fused build's leftover 2-D pools on llvm: TVM's lowering is recognised structurally, scheduled (the
padding per plane, planes in parallel, vectorized / unrolled runs of pixels) and bit-identical to the
unfused build (TVM's own lowering) for max and average pools with padding, ceil_mode, count_include_pad and
strides 1-3 (stride-1 rows of whole vectors, of whole vectors and a scalar tail, or shorter than a vector);
unpadded rows run pixel by pixel keep TVM's loop with only the planes in parallel, when large; global pools,
small such pools, other functions and targets are declined."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest
from tvm_fusion.schedules.llvm.pooling import LeftoverPool, match_pool, pool_plan

from tvm_fusion.frontend import importer as frontend
from tvm_fusion.build import pipeline
from tvm_fusion._tvm import relax, te, tirx, tvm
from tvm_fusion.build.builder import build, resolve_target
from tvm_fusion.check.compare import run_onnxruntime
from tvm_fusion.testing import GraphBuilder, assert_close, run_build

AVX2 = resolve_target('{"kind": "llvm", "mcpu": "x86-64-v3"}')
SSE = resolve_target('{"kind": "llvm", "mcpu": "x86-64"}')  # 4 lanes
AVX512 = resolve_target('{"kind": "llvm", "mcpu": "skylake-avx512"}')  # 16 lanes: compiled, not run here
AARCH64 = tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]})


def _pool_func(op: str, shape, k: int, s: int, pads, ceil: bool = False, cip: bool = False):
    """TVM's legalized PrimFunc of one max / average pool."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        if op == "max":
            y = relax.op.nn.max_pool2d(x, (k, k), (s, s), pads, ceil_mode=ceil)
        else:
            y = relax.op.nn.avg_pool2d(x, (k, k), (s, s), pads, ceil_mode=ceil, count_include_pad=cip)
        bb.emit_func_output(bb.emit(y))
    mod = relax.transform.LegalizeOps()(bb.get())
    (func,) = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    return func


def _model(op: str, c: int, hw, k: int, s: int, pads, ceil: int = 0, cip: int = 0):
    """Relu -> MaxPool / AveragePool (the Relu keeps the pool a kernel of its own)."""
    g = GraphBuilder(0)
    x = g.input("x", [1, c, *hw])
    attrs = {"kernel_shape": [k, k], "strides": [s, s], "pads": list(pads), "ceil_mode": ceil}
    if op == "avg":
        attrs["count_include_pad"] = cip
    y = g.op("MaxPool" if op == "max" else "AveragePool", [g.op("Relu", [x])], **attrs)
    return g.model([y])


def _pools(built):
    return [f for gv, f in built.module.functions.items()
            if isinstance(f, tirx.PrimFunc) and "pool" in gv.name_hint]


# op, channels, (h, w), kernel, stride, pads (top, left, bottom, right), ceil_mode, count_include_pad
CASES = [
    ("max", 8, (30, 30), 3, 2, (1, 1, 1, 1), 0, 0),  # ResNet-50 / ShuffleNet: 15 pixels a row, one run
    ("max", 8, (33, 33), 3, 2, (0, 0, 1, 1), 0, 0),  # Inception v2's end padding, 16 a row: two vectors
    ("max", 4, (56, 56), 3, 2, (0, 0, 0, 0), 1, 0),  # ceil_mode adds a column: 28 a row, per pixel, padded
    ("max", 4, (65, 65), 3, 2, (0, 0, 0, 0), 1, 0),  # ceil_mode, 32 a row: vectors
    ("max", 4, (55, 55), 3, 2, (1, 1, 1, 1), 1, 0),  # ceil_mode, 28 a row: per pixel, padded
    ("max", 4, (16, 16), 3, 1, (1, 1, 1, 1), 0, 0),  # stride 1, vectors
    ("max", 3, (29, 31), 3, 3, (1, 2, 1, 0), 1, 0),  # stride 3, odd, uneven padding
    ("avg", 8, (28, 28), 3, 2, (1, 1, 1, 1), 0, 0),  # ShuffleNet's, padding not counted
    ("avg", 8, (28, 28), 3, 2, (1, 1, 1, 1), 0, 1),  # padding counted
    ("avg", 4, (27, 27), 3, 2, (1, 1, 1, 1), 1, 0),  # ceil_mode
    ("avg", 4, (16, 16), 3, 1, (1, 1, 1, 1), 0, 0),  # stride 1, vectors
    ("avg", 3, (17, 23), 2, 3, (0, 1, 1, 0), 1, 1),  # stride 3, odd
    # stride 1, rows that are not whole vectors: whole vectors then a scalar tail, or pixel by pixel
    ("avg", 8, (28, 28), 3, 1, (1, 1, 1, 1), 0, 0),  # Inception v2's: 3 vectors + 4 pixels a row
    ("avg", 8, (14, 14), 3, 1, (1, 1, 1, 1), 0, 0),  # Inception v2's: 1 vector + 6 pixels
    ("avg", 8, (14, 14), 3, 1, (1, 1, 1, 1), 0, 1),  # padding counted
    ("avg", 8, (7, 7), 3, 1, (1, 1, 1, 1), 0, 0),  # Inception v2's: shorter than a vector, per pixel
    ("avg", 4, (7, 7), 3, 1, (1, 1, 1, 1), 0, 1),
    ("max", 8, (7, 7), 3, 1, (1, 1, 1, 1), 0, 0),  # Inception v2's
    ("max", 4, (13, 19), 3, 1, (1, 1, 1, 1), 0, 0),  # odd widths: 19 = 2 vectors + 3
    ("max", 4, (12, 11), 3, 1, (2, 1, 0, 2), 0, 0),  # uneven padding: 12 a row
    ("avg", 4, (11, 20), 5, 1, (2, 2, 2, 2), 0, 0),  # a 5 x 5 window
    ("avg", 3, (10, 18), 3, 1, (0, 0, 0, 0), 0, 0),  # no padding: 16 a row, whole vectors
    ("avg", 8, (7, 7), 7, 1, (0, 0, 1, 1), 0, 0),  # Inception v1's last pool: a 7 x 7 window, 2 x 2 out
    ("max", 64, (55, 55), 3, 2, (0, 0, 0, 0), 0, 0),  # SqueezeNet's: 27 a row, unpadded: planes only
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)).replace(" ", ""))
def test_scheduled_pool_is_bit_identical_to_the_unfused_build(case):
    _check_bit_identical(case, AVX2, seed=3)


def _check_bit_identical(case, target, seed: int) -> None:
    """The pool of `case` scheduled for `target`, equal to the unfused build bit for bit (the same taps in the
    same order) and close to onnxruntime."""
    op, c, hw = case[:3]
    model = _model(*case)
    fused = build(frontend.import_onnx(model), target, "fused")
    (func,) = _pools(fused)
    assert func.attrs["tirx.is_scheduled"], func.script()
    x = np.random.default_rng(seed).normal(size=(1, c, *hw)).astype(np.float32)
    out = run_build(fused, [x])[0]
    unfused = build(frontend.import_onnx(model), target, "unfused")
    np.testing.assert_array_equal(out, run_build(unfused, [x])[0])
    sess, _ = run_onnxruntime(model, {"x": x})
    assert_close(out, sess.run(None, {"x": x})[0], f"{op} pool {case}")


def test_stride_1_rows_of_whole_vectors_are_vectorized_and_planes_parallel():
    sch = LeftoverPool().apply(_pool_func("avg", (1, 64, 32, 32), 3, 1, (1, 1, 1, 1)), AVX2, False)
    script = sch.mod["main"].script()
    assert len(re.findall(r"T\.vectorized\((T\.int64\()?8\)", script)) == 3, script  # init, taps, division
    assert re.search(r"T\.parallel\((T\.int64\()?64\)", script), script  # batch x channels
    sse = LeftoverPool().apply(_pool_func("avg", (1, 64, 32, 32), 3, 1, (1, 1, 1, 1)), SSE, False)
    assert re.search(r"T\.vectorized\((T\.int64\()?4\)", sse.mod["main"].script())


def test_stride_1_rows_run_whole_vectors_then_a_scalar_tail():
    """Inception v2's 14-pixel rows on AVX2: one vector of 8 (the taps outside it) and 6 pixels one at a time,
    for the window sums and the division."""
    func = _pool_func("avg", (1, 576, 14, 14), 3, 1, (1, 1, 1, 1))
    assert pool_plan(func, AVX2).run == 8 and pool_plan(func, SSE).run == 4
    script = LeftoverPool().apply(func, AVX2, False).mod["main"].script()
    assert len(re.findall(r"T\.vectorized\((T\.int64\()?8\)", script)) == 3, script  # init, taps, division
    assert len(re.findall(r"in range\((T\.int64\()?8\), (T\.int64\()?14\)", script)) == 2, script  # sums, division
    assert script.index('T.sblock("pad_temp")') > script.index("T.parallel"), script


@pytest.mark.parametrize("op,width,target,run", [
    ("avg", 7, AVX2, 7), ("max", 7, AVX2, 1),  # a max pool's row over half a vector: pixel by pixel
    ("avg", 14, AVX512, 14), ("max", 14, AVX512, 1), ("max", 7, AVX512, 7), ("avg", 3, SSE, 3)])
def test_stride_1_rows_shorter_than_a_vector_run_as_one_vector(op, width, target, run):
    """A stride-1 row shorter than a vector runs as one vector of its width, the taps outside it and the
    padding per plane (a max pool's only up to half a vector); else pixel by pixel."""
    func = _pool_func(op, (1, 1024, width, width), 3, 1, (1, 1, 1, 1))
    assert pool_plan(func, target).run == run
    script = LeftoverPool().apply(func, target, False).mod["main"].script()
    vectors = len(re.findall(rf"T\.vectorized\((T\.int64\()?{width}\)", script))
    assert vectors == ((3 if op == "avg" else 2) if run > 1 else 0), script  # init, taps (, division)
    assert script.index('T.sblock("pad_temp")') > script.index("T.parallel"), script


def test_stride_2_rows_are_unrolled_runs_with_the_padding_per_plane():
    func = _pool_func("max", (1, 64, 112, 112), 3, 2, (1, 1, 1, 1))
    assert pool_plan(func, AVX2).run == 8 and pool_plan(func, SSE).run == 4
    script = LeftoverPool().apply(func, AVX2, False).mod["main"].script()
    assert "T.vectorized" not in script and re.search(r"T\.unroll\((T\.int64\()?8\)", script), script
    plane = script.index("T.parallel")
    assert script.index('T.sblock("pad_temp")') > plane, script  # the padding is copied inside the plane loop
    small = _pool_func("max", (1, 2, 8, 8), 3, 2, (1, 1, 1, 1))
    assert "T.parallel" not in LeftoverPool().apply(small, AVX2, False).mod["main"].script()


def test_declines_with_reasons():
    gap = _pool_func("avg", (1, 64, 7, 7), 7, 1, (0, 0, 0, 0))
    assert "global pool" in match_pool(gap).declined
    assert LeftoverPool().apply(gap, AVX2, False) is None
    short = _pool_func("max", (1, 64, 7, 7), 3, 1, (0, 0, 0, 0))  # 5 pixels a row, stride 1, no padding
    assert match_pool(short).declined == "" and "no padding copy to move" in pool_plan(short, AVX2).declined
    assert LeftoverPool().apply(short, AVX2, False) is None
    unpadded = _pool_func("max", (1, 8, 55, 55), 3, 2, (0, 0, 0, 0))  # 27 a row, pixel by pixel, 52488 taps
    assert "no padding copy to move" in pool_plan(unpadded, AVX2).declined
    x = te.placeholder((4, 64), "float32", name="x")
    r = te.reduce_axis((0, 64), name="r")
    rowsum = te.create_prim_func([x, te.compute((4,), lambda i: te.sum(x[i, r], axis=r), name="y")])
    assert "not a 4-D output over a 2-D window" in match_pool(rowsum).declined
    pool = _pool_func("max", (1, 64, 32, 32), 3, 2, (1, 1, 1, 1))
    assert LeftoverPool().apply(pool, tvm.target.Target("cuda"), False) is None


def test_average_pool_then_relu_declines_and_matches_onnxruntime():
    """AveragePool -> Relu is one fused function of three blocks after the window: the sum, its division and the
    relu. It crashed the fused build (`(b,) = after`) until match_pool declined more than one block after the
    sum (found through a float16 average pool, whose float32 sum is cast back the same way)."""
    g = GraphBuilder(0)
    x = g.input("x", [1, 16, 28, 28])
    model = g.model([g.op("Relu", [g.op("AveragePool", [x], kernel_shape=[3, 3], strides=[2, 2])])])
    mod = frontend.import_onnx(model)
    with AVX2, tvm.transform.PassContext(opt_level=3):  # without the leftover schedules (the last pass)
        legal = pipeline.sequential(pipeline.legalize_passes("fused", AVX2)[:-1], "unscheduled")(mod)
    (func,) = [f for gv, f in legal.functions.items()
               if isinstance(f, tirx.PrimFunc) and "pool" in gv.name_hint]  # the pool, its division and the relu
    assert "more than one block before or after" in match_pool(func).declined
    assert LeftoverPool().apply(func, AVX2, False) is None
    fused = build(mod, "llvm", "fused")
    inputs = {"x": np.random.default_rng(0).normal(size=(1, 16, 28, 28)).astype(np.float32)}
    (ref,) = run_onnxruntime(model, inputs)[0].run(None, inputs)
    assert_close(run_build(fused, [inputs["x"]])[0], ref, "avg pool -> relu, fused")


def test_large_unpadded_pixel_by_pixel_pools_keep_tvm_loop_with_planes_in_parallel():
    """SqueezeNet's max pools (rows of 55 / 27 pixels, stride 2, no padding): TVM's loop, planes parallel."""
    func = _pool_func("max", (1, 64, 111, 111), 3, 2, (0, 0, 0, 0))
    plan = pool_plan(func, AVX2)
    assert plan.declined == "" and plan.planes_only and plan.run == 1
    script = LeftoverPool().apply(func, AVX2, False).mod["main"].script()
    assert re.search(r"T\.parallel\((T\.int64\()?64\)", script), script
    assert "T.unroll" not in script and "T.vectorized" not in script and "_init" not in script, script


@pytest.mark.parametrize("target", [AVX2, SSE, AVX512, AARCH64], ids=["avx2", "sse", "avx512", "aarch64"])
def test_compiles_for_other_vector_widths(target):
    for op, s, hw in (("max", 2, 32), ("avg", 1, 32), ("avg", 1, 28), ("avg", 1, 14), ("max", 1, 7), ("avg", 1, 19)):
        func = _pool_func(op, (1, 16, hw, hw), 3, s, (1, 1, 1, 1))
        sch = LeftoverPool().apply(func, target, False)
        assert sch is not None, (op, s, hw)
        tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}), target)


def _tvm_and_scheduled(func, x: np.ndarray, out_shape) -> list[np.ndarray]:
    """The pool's output as TVM lowered it and as LeftoverPool schedules it, on input x."""
    func = func.with_attr("global_symbol", "main")
    outs = []
    for f in (func, LeftoverPool().apply(func, AVX2, False).mod["main"]):
        kernel = tvm.compile(tvm.IRModule({"main": f}), AVX2)["main"]
        y = tvm.runtime.tensor(np.zeros(out_shape, np.float32), tvm.cpu())
        kernel(tvm.runtime.tensor(x, tvm.cpu()), y)
        outs.append(y.numpy())
    return outs


def _two_thread_check():
    """Run in a process whose TVM pool has two threads (the pool's size is fixed when it starts)."""
    assert int(tvm.get_global_func("runtime.NumThreads")()) == 2
    for op, s, hw in (("max", 2, 56), ("avg", 2, 56), ("avg", 1, 28), ("max", 1, 14)):  # stride 1: vectors + tail
        x = np.random.default_rng(4).normal(size=(1, 64, hw, hw)).astype(np.float32)
        outs = _tvm_and_scheduled(_pool_func(op, x.shape, 3, s, (1, 1, 1, 1)), x, (1, 64, hw // s, hw // s))
        np.testing.assert_array_equal(outs[1], outs[0])
    x = np.random.default_rng(5).normal(size=(1, 64, 55, 55)).astype(np.float32)  # SqueezeNet's: planes only
    outs = _tvm_and_scheduled(_pool_func("max", x.shape, 3, 2, (0, 0, 0, 0)), x, (1, 64, 27, 27))
    np.testing.assert_array_equal(outs[1], outs[0])


def test_parallel_planes_are_bit_identical_on_two_threads():
    """The padding copied per plane inside the parallel plane loop: no plane reads another's copy."""
    code = "from tvm_fusion.schedules.llvm.pooling_test import _two_thread_check; _two_thread_check()"
    env = {**os.environ, "TVM_NUM_THREADS": "2"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("stride", [(2, 1), (2, 2)], ids=["rows_stride_1", "stride_2"])
def test_bfloat16_max_pool_builds_and_matches_the_float32_model(stride):
    """A bfloat16 MaxPool (found by the kernel fuzzer): its stride-1 rows ran as bfloat16 vectors, which TVM's
    bfloat16 legalization cannot store (`TypeError: dtype mismatch on BufferStore`, an internal error); that
    plan now declines naming why and TVM's loop runs; stride-2 rows (unrolled, no vector) keep the schedule.
    Exact against the float32 pool of the same bfloat16 values (a max rounds nothing)."""
    import ml_dtypes

    from tvm_fusion.testing import as_float16

    g = GraphBuilder(0)
    x = g.input("x", [1, 3, 7, 19])
    model = g.model([g.op("MaxPool", [x], kernel_shape=[2, 2], strides=list(stride), pads=[0, 1, 0, 1])])
    half = as_float16(model, "bfloat16")
    mod = frontend.import_onnx(half)
    with AVX2, tvm.transform.PassContext(opt_level=3):
        legal = pipeline.sequential(pipeline.legalize_passes("fused", AVX2)[:-1], "unscheduled")(mod)
    (func,) = [f for gv, f in legal.functions.items() if isinstance(f, tirx.PrimFunc) and "pool" in gv.name_hint]
    declined = pool_plan(func, AVX2).declined
    assert ("bfloat16 vectors" in declined) == (stride[1] == 1), declined
    values = np.random.default_rng(0).normal(size=(1, 3, 7, 19)).astype(ml_dtypes.bfloat16)
    (ref,) = run_onnxruntime(model, {"x": values.astype(np.float32)})[0].run(None, {"x": values.astype(np.float32)})
    got = run_build(build(mod, "llvm", "fused"), [values])[0]
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got.astype(np.float32), ref)


@pytest.mark.parametrize("case", [("avg", 8, (14, 14), 3, 1, (1, 1, 1, 1), 0, 0),
                                  ("avg", 8, (7, 7), 3, 1, (1, 1, 1, 1), 0, 1),
                                  ("max", 8, (7, 7), 3, 1, (1, 1, 1, 1), 0, 0),
                                  ("max", 8, (10, 10), 5, 1, (2, 2, 2, 2), 0, 0)],
                         ids=lambda c: "-".join(map(str, c)).replace(" ", ""))
def test_host_target_pools_are_bit_identical_to_the_unfused_build(case):
    """The host's own vector width (16 lanes on AVX-512: its 14-, 10- and 7-pixel rows run as one vector or
    pixel by pixel), against the unfused build bit for bit and onnxruntime."""
    _check_bit_identical(case, resolve_target("llvm"), seed=4)
