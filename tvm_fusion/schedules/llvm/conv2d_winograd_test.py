"""The Winograd F(2x2, 3x3) conv (`conv2d_winograd`): when it takes a conv and why it declines, the filter
transform against the algorithm's identity, its plan, and numerics against float64 NumPy through the llvm conv
family as fuse builds it (pack_conv, conv2d_llvm, schedule_conv2d_llvm): AVX-512 code where the host runs it,
and everywhere AVX2 code planned as AVX-512 is (WINOGRAD_ISAS widened); a model with a conv -> pool group and a
residual against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_fusion import _tvm
from tvm_fusion._tvm import tirx, tvm
from tvm_fusion.check.verify import _runs_here
from tvm_fusion.hardware import cpu_facts
from tvm_fusion.schedules.conv2d import CONV_FAMILY
from tvm_fusion.schedules.conv_pool import POOL_FAMILY
from tvm_fusion.schedules.llvm import conv2d_winograd as winograd
from tvm_fusion.schedules.llvm.conv2d_test import _id, _packed_build, _run
from tvm_fusion.schedules.llvm.conv2d_winograd import (GEMM_BLOCK, GEMM_ROWS, TILE_CHANNELS, pack_winograd, why_not,
                                                       winograd_plan)
from tvm_fusion.testing import assert_close

AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2, "model": "l1d=32K,l2=1024K"})
AVX2 = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v3", "num-cores": 2})
#: F(2, 3)'s data and output transforms (Lavin & Gray), written out here to check the kernel's against
BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64)
AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)
CONV = dict(strides=(1, 1), padding=(1, 1, 1, 1), dilation=(1, 1))


@pytest.mark.parametrize("change,reason", [
    (dict(target=AVX2), "not avx2"),
    (dict(dtype="float16"), "takes float32, not float16"),
    (dict(groups=2), "groups 1, not 2"),
    (dict(w=(64, 32, 5, 5)), "a 3x3 kernel, not 5x5"),
    (dict(strides=(2, 2)), "stride 1 and dilation 1"),
    (dict(dilation=(2, 2)), "stride 1 and dilation 1"),
    (dict(padding=(0, 0, 0, 0)), "padding 1 on every side"),
    (dict(x=(1, 24, 14, 14), w=(64, 24, 3, 3)), "24 input channels are not whole vectors of 16"),
    (dict(w=(48, 32, 3, 3)), "48 output channels are not whole GEMM tiles of 32"),
])
def test_declines_with_a_reason(change, reason):
    args = dict(x=(1, 32, 14, 14), w=(64, 32, 3, 3), dtype="float32", **CONV, groups=1, target=AVX512)
    args.update(change)
    why = why_not(args["x"], args["w"], args["dtype"], args["strides"], args["padding"], args["dilation"],
                  args["groups"], args["target"])
    assert why is not None and reason in why, why


def test_takes_3x3_stride_1_float32_convs_on_avx512():
    for x, w in [((1, 64, 224, 224), (64, 64, 3, 3)), ((2, 16, 7, 7), (32, 16, 3, 3)),
                 ((1, 512, 14, 14), (512, 512, 3, 3)), ((tirx.Var("N", "int64"), 32, 14, 14), (64, 32, 3, 3))]:
        assert why_not(x, w, "float32", **CONV, groups=1, target=AVX512) is None, (x, w)


def test_pack_holds_the_filter_transform_of_every_channel_pair():
    """U [O / 32, 16, C, 32] holds G g G^T of W[32 t + o, c] at point 4a + b: A^T (U (.) B^T d B) A is the 2x2
    correlation of any 4x4 tile d with g (float64, to rounding)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 8, 3, 3))
    u = pack_winograd(w)
    assert u.shape == (2, 16, 8, TILE_CHANNELS) and u.dtype == w.dtype
    for k, c in [(0, 0), (37, 3), (63, 7)]:
        point = u[k // TILE_CHANNELS, :, c, k % TILE_CHANNELS].reshape(4, 4)
        d = rng.standard_normal((4, 4))
        got = AT @ (point * (BT @ d @ BT.T)) @ AT.T
        want = [[np.sum(d[i:i + 3, j:j + 3] * w[k, c]) for j in range(2)] for i in range(2)]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert pack_winograd(w.astype("float32")).dtype == np.float32


@pytest.mark.parametrize("n,hout,wout,cout,want", [
    (1, 56, 56, 256, (1, 14, 256, 28)),  # a row of 28 tiles: two register tiles of 14
    (1, 14, 14, 256, (2, 14, 256, 4)),  # two rows of 7 tiles
    (1, 7, 7, 512, (4, 8, 128, 4)),  # the whole 4 x 4 tiles, output channels split for two threads
    (2, 7, 7, 512, (4, 8, 256, 4)),
    (1, 224, 224, 64, (1, 14, 64, 112)),
])
def test_plan_fills_the_register_tiles_and_the_threads(n, hout, wout, cout, want):
    plan = winograd_plan(n, hout, wout, cout, threads=2)
    assert (plan.tile_rows, plan.gemm_rows, plan.channels, plan.tasks) == want
    assert plan.gemm_rows <= GEMM_ROWS and (plan.tile_rows * -(-wout // 2)) % plan.gemm_rows == 0
    assert cout % plan.channels == 0 and plan.channels % TILE_CHANNELS == 0


#: 3x3 / stride 1 / padding 1 convs: even and odd outputs, rectangular, a batch of 2, one task's tiles not a
#: whole number of tile rows (14x14: rows of 7 tiles, two per task), output channels split across tasks
CASES = [
    dict(n=1, c=16, h=8, w=8, oc=32),
    dict(n=2, c=32, h=14, w=14, oc=64),
    dict(n=1, c=48, h=7, w=7, oc=96),
    dict(n=1, c=16, h=9, w=12, oc=32),
    dict(n=1, c=64, h=28, w=28, oc=64),
    dict(n=1, c=16, h=5, w=30, oc=32),
]


def _target(name, monkeypatch):
    """The AVX-512 target, or AVX2 planned as AVX-512 (8 lanes: the same loop nests, code every host here runs)."""
    if name == "avx512":
        return AVX512
    monkeypatch.setattr(winograd, "WINOGRAD_ISAS", ("avx512", "avx2"))
    return AVX2


@pytest.mark.parametrize("residual", [False, True], ids=["relu", "residual"])
@pytest.mark.parametrize("target_name", ["avx512", "avx2"])
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_winograd_conv_matches_float64(case, target_name, residual, monkeypatch):
    """The conv family's llvm build takes the Winograd kernel (W packed as U, the GEMM stage in its PrimFunc)
    and matches float64 NumPy's conv + bias (+ residual) + ReLU within float32's tolerance."""
    target = _target(target_name, monkeypatch)
    case = dict(case, k=3, stride=1, pad=1)
    executable, func, arrays, out_shape, reference = _packed_build(case, target, residual=residual)
    assert arrays[-2].shape == (case["oc"] // TILE_CHANNELS, 16, case["c"], TILE_CHANNELS)
    script = func.script()
    assert f'T.sblock("{GEMM_BLOCK}_update")' in script and 'T.sblock("transform")' in script
    assert f"T.vectorized({cpu_facts(target).float32_lanes})" in script
    if _runs_here(target):
        assert_close(_run(executable, arrays, out_shape), reference, f"{target_name} {_id(case)}")


def test_other_convs_keep_the_direct_kernel():
    """A strided 3x3 conv (and any the kernel declines) keeps W packed in channel blocks and no GEMM stage."""
    case = dict(n=1, c=32, h=14, w=14, oc=64, k=3, stride=2, pad=1)
    _, func, arrays, _, _ = _packed_build(case, AVX512)
    assert arrays[-2].ndim == 5 and GEMM_BLOCK not in func.script()


@pytest.mark.parametrize("target_name", ["avx512", "avx2"])
def test_model_runs_its_3x3_convs_as_winograd_and_matches_onnxruntime(target_name, monkeypatch):
    """A conv -> max pool group (its pool after the Winograd conv), a conv + BN + ReLU, a conv + BN + residual
    + ReLU and a strided 3x3 conv (direct): the three 3x3 stride-1 groups on the Winograd kernel, the outputs
    within float32's tolerance of onnxruntime's."""
    from tvm_fusion.build.builder import build
    from tvm_fusion.check.compare import random_inputs, run_onnxruntime
    from tvm_fusion.frontend.importer import import_onnx
    from tvm_fusion.testing import GraphBuilder, run_build

    target = _target(target_name, monkeypatch)
    g = GraphBuilder(3)
    x = g.input("x", [1, 16, 20, 20])
    stem = g.op("MaxPool", [g.op("Relu", [g.bn(g.conv(x, 16, 32), 32)])], kernel_shape=[2, 2], strides=[2, 2])
    y = g.op("Relu", [g.bn(g.conv(stem, 32, 32), 32)])
    y = g.op("Relu", [g.op("Add", [g.bn(g.conv(y, 32, 32), 32), stem])])
    model = g.model([y, g.op("Relu", [g.conv(x, 16, 32, stride=2)])])
    built = build(import_onnx(model), target, "fused", blocked_layout=False)
    kernels = [grp.kernel for grp in built.fused.groups if grp.compute in (CONV_FAMILY, POOL_FAMILY)]
    assert sum(k.startswith("Winograd F(2x2, 3x3)") for k in kernels) == 3 and len(kernels) == 4, kernels
    if not _runs_here(target):
        return
    inputs = random_inputs(model)
    want = run_onnxruntime(model, inputs)[0].run(None, inputs)
    for i, (a, r) in enumerate(zip(run_build(built, [inputs["x"]]), want)):
        assert_close(a, r, f"{target_name} output {i} vs onnxruntime")


def test_host_target_takes_it_where_the_host_has_avx512():
    host = _tvm.cpu_target()
    reason = why_not((1, 32, 14, 14), (64, 32, 3, 3), "float32", **CONV, groups=1, target=host)
    assert (reason is None) == (cpu_facts(host).isa in winograd.WINOGRAD_ISAS), reason


@pytest.mark.parametrize("target_name", ["avx512", "avx2"])
def test_chained_3x3_convs_run_as_winograd_in_the_blocked_layout(target_name, monkeypatch):
    """A chain of convs passing NCHW[x]c (a 1x1 conv, two 3x3 ones, a 1x1 one with the block's residual, the
    last writing NCHW): the 3x3 convs on the Winograd kernel reading and writing the chain's layout, the
    outputs within float32's tolerance of onnxruntime's (AVX2 chained and planned as AVX-512 elsewhere)."""
    from tvm_fusion.build.builder import build
    from tvm_fusion.check.compare import random_inputs, run_onnxruntime
    from tvm_fusion.fusion import chain_layout
    from tvm_fusion.frontend.importer import import_onnx
    from tvm_fusion.testing import GraphBuilder, run_build

    target = _target(target_name, monkeypatch)
    monkeypatch.setattr(chain_layout, "BLOCKED_ISAS", ("avx512", "avx2"))
    lanes = cpu_facts(target).float32_lanes
    g = GraphBuilder(4)
    x = g.input("x", [1, 32, 14, 14])
    a = g.op("Relu", [g.bn(g.conv(x, 32, 64, k=1), 64)])
    y = g.op("Relu", [g.bn(g.conv(a, 64, 64), 64)])
    y = g.op("Relu", [g.bn(g.conv(y, 64, 64), 64)])
    y = g.op("Relu", [g.op("Add", [g.bn(g.conv(y, 64, 64, k=1), 64), a])])
    model = g.model([y])
    built = build(import_onnx(model), target, "fused")
    kernels = [grp.kernel for grp in built.fused.groups if grp.compute != POOL_FAMILY]
    winograd_kernels = [k for k in kernels if k.startswith("Winograd F(2x2, 3x3)")]
    assert len(winograd_kernels) == 2 and all(f"NCHW{lanes}c chain (NCHW{lanes}c in, NCHW{lanes}c out)" in k
                                              for k in winograd_kernels), kernels
    if not _runs_here(target):
        return
    inputs = random_inputs(model)
    want = run_onnxruntime(model, inputs)[0].run(None, inputs)
    assert_close(run_build(built, [inputs["x"]])[0], want[0], f"{target_name} chained block vs onnxruntime")


def test_symbolic_batch_runs_every_batch_with_the_weights_of_batch_1(monkeypatch):
    """A model whose batch is symbolic takes the Winograd conv planned as batch 1 (the same packed weights as a
    batch-1 build: one recipe for both in a bundle) and matches onnxruntime at batch 1 and 3."""
    from tvm_fusion.build.builder import build
    from tvm_fusion.check.compare import run_onnxruntime
    from tvm_fusion.frontend.importer import import_onnx, parse_shape
    from tvm_fusion.testing import GraphBuilder, run_build

    target = _target("avx2", monkeypatch)
    g = GraphBuilder(6)
    x = g.input("x", ["N", 16, 9, 10])
    model = g.model([g.op("Relu", [g.bn(g.conv(x, 16, 32), 32)])])
    built = build(import_onnx(model, shapes=dict([parse_shape("x=Nx16x9x10")])), target, "fused")
    kernels = [grp.kernel for grp in built.fused.groups if grp.compute == CONV_FAMILY]
    assert len(kernels) == 1 and kernels[0].startswith("Winograd F(2x2, 3x3)"), kernels
    if not _runs_here(target):
        return
    rng = np.random.default_rng(6)
    for batch in (1, 3):
        inputs = {"x": rng.standard_normal((batch, 16, 9, 10)).astype("float32")}
        want = run_onnxruntime(model, inputs)[0].run(None, inputs)[0]
        assert_close(run_build(built, [inputs["x"]])[0], want, f"batch {batch} vs onnxruntime")
