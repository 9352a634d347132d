"""The fallback schedule (`fallback.py`): every kernel of a fused CPU build gets a schedule, and each op it
takes still matches onnxruntime element by element (and TVM's unscheduled build), at static shapes large
enough for the parallel loops, with a symbolic batch, on an AVX2 target; TVM's own loops (top-k, cumsum,
scatter) are kept as they are."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from tvm_fusion._tvm import relax, tvm
from tvm_fusion.build.builder import build, legalize_traced, resolve_target
from tvm_fusion.check.compare import run_onnxruntime
from tvm_fusion.frontend.importer import SymDim, import_onnx
from tvm_fusion.schedules.llvm.fallback import LeftoverFallback, schedule_function
from tvm_fusion.testing import GraphBuilder, assert_close, check_fused

AVX2 = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v3"})
AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})


def _i64(v):
    return np.array(v, np.int64)


def _gather(g):
    return g.op("Gather", [g.input("x", [4, 300, 64]), g.const(_i64([3, 0, 299, 7]))], axis=1)


def _gather_elements(g):
    idx = g.rng.integers(0, 64, (8, 300, 16)).astype(np.int64)
    return g.op("GatherElements", [g.input("x", [8, 300, 64]), g.const(idx)], axis=2)


def _scatter_elements(g):
    idx = np.stack([g.rng.permutation(64)[:8] for _ in range(32)]).astype(np.int64)  # no duplicates
    return g.op("ScatterElements", [g.input("x", [32, 64]), g.const(idx), g.input("u", [32, 8])], axis=1)


def _scatter_nd(g):
    return g.op("ScatterND", [g.input("x", [16, 64]), g.const(_i64([[1], [9]])), g.input("u", [2, 64])])


def _where(g):
    x, y = g.input("x", [16, 96, 64]), g.input("y", [16, 96, 64])
    return g.op("Where", [g.op("Greater", [x, y]), x, g.op("Neg", [y])])


def _cumsum(g):
    return g.op("CumSum", [g.input("x", [16, 512]), g.const(_i64(1))])


def _resize(g):
    return g.op("Resize", [g.input("x", [1, 8, 40, 40]), "", g.const(np.array([1, 1, 2, 2], np.float32))],
                mode="linear")


def _top_k(g):
    return g.op("TopK", [g.input("x", [16, 300]), g.const(_i64([5]))], n_out=2)[0]


def _einsum(g):
    return g.op("Einsum", [g.input("x", [4, 50, 32]), g.input("y", [4, 32, 48])], equation="bij,bjk->bik")


def _quantize(g):
    q = g.op("QuantizeLinear", [g.input("x", [64, 512]), g.const(np.float32(0.02)), g.const(np.int8(3))])
    return g.op("DequantizeLinear", [q, g.const(np.float32(0.02)), g.const(np.int8(3))])


def _instance_norm(g):
    return g.op("InstanceNormalization", [g.input("x", [2, 16, 40, 40]), g.const(np.full(16, 1.5, np.float32)),
                                          g.const(np.full(16, 0.1, np.float32))])


def _reduce_l2(g):
    return g.op("ReduceL2", [g.input("x", [8, 64, 200])], axes=[2], keepdims=0)


def _log_sum_exp(g):
    return g.op("ReduceLogSumExp", [g.input("x", [8, 64, 200])], axes=[1], keepdims=1)


def _arg_min(g):
    return g.op("Cast", [g.op("ArgMin", [g.input("x", [8, 96, 200])], axis=1)], to=TensorProto.FLOAT)


def _conv3d(g):
    """A dense conv3d: the conv rules take it (`patterns/conv_epilogue.py`); `test_plans` schedules TVM's own."""
    w = g.const(g.rng.normal(0, 0.2, (8, 4, 3, 3, 3)).astype(np.float32))
    return g.op("Conv", [g.input("x", [1, 4, 6, 16, 16]), w], kernel_shape=[3, 3, 3], pads=[1] * 6)


def _conv3d_depthwise(g):
    """A depthwise conv3d, which the conv rules decline on the CPU: TVM's kernel on the fallback schedule."""
    w = g.const(g.rng.normal(0, 0.2, (8, 1, 3, 3, 3)).astype(np.float32))
    return g.op("Conv", [g.input("x", [1, 8, 6, 16, 16]), w], kernel_shape=[3, 3, 3], pads=[1] * 6, group=8)


def _lrn(g):
    return g.op("LRN", [g.input("x", [1, 16, 24, 24])], size=3)


def _pad_tile_trilu(g):
    y = g.op("Pad", [g.input("x", [2, 3, 30, 30]), g.const(_i64([0, 0, 2, 2, 0, 0, 2, 2]))], mode="reflect")
    return g.op("Trilu", [g.op("Tile", [y, g.const(_i64([1, 2, 1, 1]))])])


def _hardmax(g):
    return g.op("Hardmax", [g.input("x", [64, 100])])


OPS = {f.__name__[1:]: f for f in (_gather, _gather_elements, _scatter_elements, _scatter_nd, _where, _cumsum,
                                   _resize, _top_k, _einsum, _quantize, _instance_norm, _reduce_l2, _log_sum_exp,
                                   _arg_min, _conv3d, _conv3d_depthwise, _lrn, _pad_tile_trilu, _hardmax)}


def _model(make, seed=0):
    g = GraphBuilder(seed)
    return g.model([make(g)])


@pytest.mark.parametrize("name", OPS)
def test_every_kernel_scheduled_and_matching_onnxruntime(name, rules):
    fused = check_fused(_model(OPS[name]), rules)
    assert not fused.unscheduled, [str(u) for u in fused.unscheduled]


def test_avx2_and_a_symbolic_batch(rules):
    """Gather, a middle-axis ReduceMax and a Where on [N, ...] built for AVX2: batches 1 and 3 of one build
    match onnxruntime."""
    g = GraphBuilder(1)
    x = g.input("x", ["N", 64, 96])
    y = g.op("ReduceMax", [g.op("Gather", [x, g.const(_i64([5, 1, 60, 2]))], axis=1)], axes=[1], keepdims=0)
    z = g.op("Where", [g.op("Greater", [y, g.const(np.float32(0))]), y, g.op("Exp", [y])])
    model = g.model([z])
    built = build(import_onnx(model, {"x": (SymDim("N", 4), 64, 96)}), AVX2, "fused", rules=rules)
    assert not built.unscheduled
    vm = relax.VirtualMachine(built.executable, tvm.cpu())
    sess, _ = run_onnxruntime(model, {}, optimize=False)
    for n in (1, 3):
        feeds = {"x": np.random.default_rng(n).standard_normal((n, 64, 96)).astype(np.float32)}
        assert_close(vm["main"](tvm.runtime.tensor(feeds["x"])).numpy(), sess.run(None, feeds)[0], f"batch {n}")


def _unscheduled_kernel(make, name):
    """The PrimFunc `name` of the fused build of `make`'s model, before the leftover schedules."""
    from tvm_fusion.build import pipeline

    target = resolve_target("llvm")
    passes = pipeline.legalize_passes("fused", target)[:-1]
    with target, tvm.transform.PassContext(opt_level=3):
        legal = pipeline.sequential(passes, "unscheduled")(import_onnx(_model(make)))
    (func,) = [f for gv, f in legal.functions.items() if gv.name_hint == name]
    return func, target


@pytest.mark.parametrize("make, kernel, plans", [
    (_top_k, "topk", {"topk_cpu": "kept"}),
    (_cumsum, "cumsum", {"cumsum_generic": "kept"}),
    (_scatter_nd, "scatter_nd", {"T_transpose": "spatial", "scatter_nd_generic": "kept"}),
    (_gather, "take", {"T_take": "spatial"}),
    (_conv3d, "conv3d", {"pad_temp": "parallel", "conv3d_ncdhw": "outputs:16"}),
])
def test_plans(make, kernel, plans):
    """TVM's own loops are kept (a library call, parallel loops, a scatter's serial loop); a padding copy keeps
    TVM's innermost loop for LLVM; the conv3d's output rows run as vectors (AVX-512 here: 16 lanes)."""
    func, _ = _unscheduled_kernel(make, kernel)
    with AVX512:
        sch, taken = schedule_function(func, AVX512)
    assert sch is not None and taken == plans


def test_a_nest_no_plan_takes_is_declined():
    """A block with an opaque iterator (no plan knows its loops): the function stays unscheduled, so the build
    names it."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def opaque_iter(a: T.Buffer((16,), "float32"), b: T.Buffer((16,), "float32")):
        for i in range(16):
            with T.sblock("copy"):
                vi = T.axis.opaque(16, i)
                b[vi] = a[vi] * T.float32(2)

    target = resolve_target("llvm")
    with target:
        assert LeftoverFallback().apply(opaque_iter, target, False) is None
        assert schedule_function(opaque_iter, target)[1] == {"copy": ""}


def test_the_build_names_what_no_schedule_took(monkeypatch):
    """Without the leftover schedules every TVM kernel of the fused build is named, with its ONNX nodes."""
    from tvm_fusion.build import pipeline

    monkeypatch.setitem(pipeline.LEFTOVER_SCHEDULES, "llvm", [])
    legal, origins = legalize_traced(import_onnx(_model(_arg_min)), "llvm", "fused")
    from tvm_fusion.build.unscheduled import find_unscheduled

    (found,) = find_unscheduled(legal, origins)
    assert found.function == "fused_argmin_cast" and found.ops == ("argmin", "cast")
    assert found.onnx_nodes == ("ArgMin2", "Cast4")


def test_bfloat16_keeps_tvms_loops():
    """TVM 0.27's llvm bfloat16 lowering refuses vector stores of other widths: a bfloat16 kernel keeps its loops."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def twice(a: T.Buffer((2, 4), "bfloat16"), b: T.Buffer((2, 4), "bfloat16")):
        for i, j in T.grid(2, 4):
            with T.sblock("twice"):
                vi, vj = T.axis.remap("SS", [i, j])
                b[vi, vj] = a[vi, vj] + a[vi, vj]

    target = resolve_target("llvm")
    with target:
        assert schedule_function(twice, target)[1] == {"bfloat16": "kept"}
