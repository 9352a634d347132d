"""The fused build's leftover copies on llvm: a channel shuffle (reshape -> transpose -> reshape) becomes one
vectorized loop nest, element-wise equal to onnxruntime; reductions and symbolic extents are declined;
the unfused and tvm builds keep TVM's own lowering."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto

from tvm_fusion.frontend import importer as frontend
from tvm_fusion.build import pipeline
from tvm_fusion._tvm import te, tirx, tvm
from tvm_fusion.build.builder import build, resolve_target
from tvm_fusion.check.compare import run_onnxruntime
from tvm_fusion.schedules.llvm.injective import LeftoverInjective
from tvm_fusion.testing import GraphBuilder, assert_close, run_build

AVX2 = resolve_target('{"kind": "llvm", "mcpu": "x86-64-v3"}')


def _shuffle_model(c: int = 24, groups: int = 3, hw: int = 10):
    g = GraphBuilder(0)
    x = g.input("x", [1, c, hw, hw])
    y = g.op("Relu", [x])
    y = g.op("Reshape", [y, g.const(np.array([1, groups, c // groups, hw, hw], np.int64), "s1")])
    y = g.op("Transpose", [y], perm=[0, 2, 1, 3, 4])
    y = g.op("Reshape", [y, g.const(np.array([1, c, hw, hw], np.int64), "s2")])
    return g.model([g.op("Sigmoid", [y])])


def _leftovers(built):
    return {gv.name_hint: f for gv, f in built.module.functions.items()
            if isinstance(f, tirx.PrimFunc) and "transpose" in gv.name_hint}


def test_channel_shuffle_is_one_vectorized_copy_equal_to_onnxruntime():
    model = _shuffle_model()
    built = build(frontend.import_onnx(model), AVX2, "fused")
    (func,) = _leftovers(built).values()
    assert func.attrs["tirx.is_scheduled"]
    script = func.script()
    assert re.search(r"T\.vectorized\((T\.int64\()?8\)", script), script  # AVX2: 8 float32 lanes
    copies = [b for b in re.findall(r'^\s+with T\.sblock\("(\w+)"', script, re.M)
              if not b.endswith(("_partition", "_common"))]
    assert len(copies) == 2 and "sblock_alloc_buffer" not in script, script  # all inlined: one copy, 10 x 10
    assert re.search(r"range\((T\.int64\()?96\)?, (T\.int64\()?100", script), script  # planes as rows of 12 vectors and a scalar tail
    x = np.random.default_rng(1).normal(size=(1, 24, 10, 10)).astype(np.float32)
    sess, _ = run_onnxruntime(model, {"x": x})
    assert_close(run_build(built, [x])[0], sess.run(None, {"x": x})[0], "channel shuffle")
    unfused = build(frontend.import_onnx(model), AVX2, "unfused")
    np.testing.assert_array_equal(run_build(built, [x])[0], run_build(unfused, [x])[0])  # a copy: exact


@pytest.mark.parametrize("mode", ["unfused", "tvm"])
def test_other_modes_keep_tvms_lowering(mode):
    assert not [p for p in pipeline.legalize_passes(mode, AVX2) if p.info.name == "ApplyDefaultSchedule"]
    built = build(frontend.import_onnx(_shuffle_model()), AVX2, mode)
    for func in _leftovers(built).values():
        assert "T.vectorized" not in func.script()


def _prim(shape, reduce: bool):
    x = te.placeholder(shape, "float32", name="x")
    if reduce:
        k = te.reduce_axis((0, shape[-1]), name="k")
        y = te.compute(shape[:-1], lambda *i: te.sum(x[(*i, k)], axis=k), name="y")
    else:
        y = te.compute(shape, lambda *i: x[i] * 2.0, name="y")
    return te.create_prim_func([x, y])


def test_declines_reductions_and_symbolic_extents():
    rule = LeftoverInjective()
    assert rule.apply(_prim((4, 64), reduce=True), AVX2, False) is None
    assert rule.apply(_prim((tirx.Var("n", "int64"), 64), reduce=False), AVX2, False) is None
    assert rule.apply(_prim((4, 64), reduce=False), tvm.target.Target("cuda"), False) is None
    assert rule.apply(_prim((4, 64), reduce=False), AVX2, False) is not None


def test_declines_a_reduction_over_one_element_with_its_epilogue():
    """A 1 x 1 MatMul (K = 1) + a residual Add, as FuseOps makes it: normalized, the reduction has spatial
    iterators only; inlining the Add into it put the Add into its init and its update (the residual counted
    twice: tests/fuzz/regressions/ee6ed9f1e3). The rule declines it, and the fused build is exact."""
    a = te.placeholder((1, 1), "float32", name="a")
    w = te.placeholder((1, 1), "float32", name="w")
    k = te.reduce_axis((0, 1), name="k")
    mm = te.compute((1, 1), lambda i, j: te.sum(a[i, k] * w[k, j], axis=k), name="matmul")
    out = te.compute((1, 1), lambda i, j: mm[i, j] + a[i, j], name="add")
    assert LeftoverInjective().apply(te.create_prim_func([a, w, out]), AVX2, False) is None

    g = GraphBuilder(0)
    x = g.input("x", [1, 2])
    r = g.op("Relu", [g.op("MatMul", [x, g.const(np.array([[0.5], [-0.25]], np.float32), "w1")])])
    y = g.op("Add", [g.op("MatMul", [r, g.const(np.array([[0.75]], np.float32), "w2")]), r])
    model = g.model([y])
    xv = np.array([[0.5, -1.0]], np.float32)
    got = run_build(build(frontend.import_onnx(model), "llvm", "fused"), [xv])[0]
    sess, _ = run_onnxruntime(model, {"x": xv})
    assert_close(got, sess.run(None, {"x": xv})[0])
    assert float(got[0, 0]) == 0.5 * 0.75 + 0.5  # relu(0.25 + 0.25) = 0.5, exact in float32 (twice: 1.375)


def test_long_rows_run_as_vectors_then_a_scalar_tail_equal_to_onnxruntime():
    """Magika's one-hot: rows of 257 (not whole vectors) are not fused with the rows before them, whose
    every lane would then take an int64 division and remainder by 257."""
    g = GraphBuilder(0)
    x = g.input("x", [64, 1], dtype=TensorProto.INT32)
    classes = g.const(np.arange(257, dtype=np.int32).reshape(1, 257), "classes")
    model = g.model([g.op("Cast", [g.op("Equal", [x, classes])], to=1)])
    built = build(frontend.import_onnx(model), AVX2, "fused")
    (func,) = [f for gv, f in built.module.functions.items() if isinstance(f, tirx.PrimFunc) and "equal" in gv.name_hint]
    script = func.script()
    assert re.search(r"T\.vectorized\((T\.int64\()?8\)", script) and "// T.int64(257)" not in script, script
    assert re.search(r"range\((T\.int64\()?256\)?, (T\.int64\()?257\)?\)", script), script  # the scalar tail
    xs = np.random.default_rng(2).integers(0, 300, (64, 1)).astype(np.int32)
    sess, _ = run_onnxruntime(model, {"x": xs})
    out = run_build(built, [xs])[0]
    np.testing.assert_array_equal(out, sess.run(None, {"x": xs})[0])
    np.testing.assert_array_equal(out, run_build(build(frontend.import_onnx(model), AVX2, "unfused"), [xs])[0])


def test_concat_split_halves_are_scheduled_each_equal_to_onnxruntime():
    """YOLOv8's detection head: concat -> reshape -> split leaves one kernel with two outputs (the split's
    halves), each its own vectorized loop nest; a copy, so exactly the unfused build's values."""
    g = GraphBuilder(0)
    a, b = g.input("a", [1, 16, 8, 8]), g.input("b", [1, 8, 8, 8])
    y = g.op("Concat", [g.op("Relu", [a]), g.op("Relu", [b])], axis=1)
    y = g.op("Reshape", [y, g.const(np.array([1, 24, 64], np.int64), "shape")])
    halves = g.op("Split", [y, g.const(np.array([16, 8], np.int64), "sizes")], n_out=2, axis=1)
    model = g.model(list(halves))
    built = build(frontend.import_onnx(model), AVX2, "fused")
    (func,) = [f for gv, f in built.module.functions.items()
               if isinstance(f, tirx.PrimFunc) and "split" in gv.name_hint]
    script = func.script()
    assert func.attrs["tirx.is_scheduled"] and "sblock_alloc_buffer" not in script, script
    assert len(re.findall(r"T\.vectorized\((T\.int64\()?8\)", script)) == 2, script  # one loop nest per half
    rng = np.random.default_rng(3)
    feeds = {"a": rng.normal(size=(1, 16, 8, 8)).astype(np.float32),
             "b": rng.normal(size=(1, 8, 8, 8)).astype(np.float32)}
    sess, _ = run_onnxruntime(model, feeds)
    ours = run_build(built, [feeds["a"], feeds["b"]])
    unfused = run_build(build(frontend.import_onnx(model), AVX2, "unfused"), [feeds["a"], feeds["b"]])
    for got, want, plain in zip(ours, sess.run(None, feeds), unfused):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, plain)


def test_a_split_alone_keeps_tvms_loops():
    """Several outputs and nothing to inline (a split of a graph input): TVM's plain loops, which LLVM
    vectorizes as whole-plane copies (kept as they are by the fallback schedule, which marks them scheduled)."""
    g = GraphBuilder(0)
    x = g.input("x", [1, 32, 16, 16])
    model = g.model(list(g.op("Split", [x, g.const(np.array([16, 16], np.int64), "sizes")], n_out=2, axis=1)))
    built = build(frontend.import_onnx(model), AVX2, "fused")
    (func,) = [f for gv, f in built.module.functions.items()
               if isinstance(f, tirx.PrimFunc) and "split" in gv.name_hint]
    assert LeftoverInjective().apply(func.without_attr("tirx.is_scheduled"), AVX2, False) is None
    assert "T.vectorized" not in func.script() and "T.parallel" not in func.script(), func.script()


AVX512 = resolve_target('{"kind": "llvm", "mcpu": "skylake-avx512"}')


def _rotary_model():
    """A rotary embedding as exported unfused: heads of 8 split in halves, rotated by per-position cos /
    sin, concatenated and reshaped back to rows of 32. The leftover kernel selects per element (the concat)
    through `v % 8` of the row's position (the reshape)."""
    g = GraphBuilder(0)
    x = g.input("x", [2, 3, 32])
    cos, sin = g.input("cos", [2, 3, 4]), g.input("sin", [2, 3, 4])
    heads = g.op("Reshape", [x, g.const(np.array([2, 3, 4, 8], np.int64), "heads")])
    x1, x2 = g.op("Split", [heads, g.const(np.array([4, 4], np.int64), "halves")], n_out=2, axis=-1)
    axis = g.const(np.array([2], np.int64), "axis")
    c, s = g.op("Unsqueeze", [cos, axis]), g.op("Unsqueeze", [sin, axis])
    real = g.op("Sub", [g.op("Mul", [c, x1]), g.op("Mul", [s, x2])])
    imag = g.op("Add", [g.op("Mul", [s, x1]), g.op("Mul", [c, x2])])
    y = g.op("Concat", [real, imag], axis=-1)
    return g.model([g.op("Reshape", [y, g.const(np.array([2, 3, 32], np.int64), "rows")])])


def _rotary_kernel(built):
    (func,) = [f for gv, f in built.module.functions.items()
               if isinstance(f, tirx.PrimFunc) and "concatenate" in gv.name_hint]
    return func.script()


@pytest.mark.parametrize("leftovers", ["all", "fallback alone"])
def test_no_vector_spans_the_wrap_of_a_selecting_index(leftovers, monkeypatch):
    """With 16 lanes (AVX-512) a vector of the rotary kernel's rows of 32 spans two heads of 8: LLVM's
    vectorizer then read every lane's cos / sin at its row position, not its head position (96 of 192
    elements wrong, on an AVX-512 host; the ONNX backend's test_rotary_embedding_3d_input_expanded). The
    vector is 8 lanes (or, in the fallback's loops, the loop split at 8) on every target, and the build
    matches onnxruntime on this host."""
    if leftovers == "fallback alone":
        from tvm_fusion._tvm import dlight
        from tvm_fusion.schedules.llvm.fallback import LeftoverFallback

        monkeypatch.setitem(pipeline.LEFTOVER_SCHEDULES, "llvm",
                            [lambda: dlight.ApplyDefaultSchedule(LeftoverFallback())])
    model = _rotary_model()
    script = _rotary_kernel(build(frontend.import_onnx(model), AVX512, "fused"))
    if leftovers == "all":  # vectors of 8 lanes
        assert re.search(r"T\.vectorized\((T\.int64\()?8\)", script) and "T.vectorized(T.int64(16))" not in script, script
    else:  # the row of 32 split at 8, for LLVM
        assert re.search(r"T\.grid\(.*T\.int64\(4\), T\.int64\(8\)\)", script), script
    rng = np.random.default_rng(4)
    feeds = {"x": rng.normal(size=(2, 3, 32)).astype(np.float32),
             "cos": rng.normal(size=(2, 3, 4)).astype(np.float32), "sin": rng.normal(size=(2, 3, 4)).astype(np.float32)}
    built = build(frontend.import_onnx(model), "llvm", "fused")
    sess, _ = run_onnxruntime(model, feeds)
    assert_close(run_build(built, list(feeds.values()))[0], sess.run(None, feeds)[0], "rotary")
