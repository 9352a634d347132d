"""The fused build's leftover ConvTranspose on llvm: stride > 1 sums only the non-zero taps (the phase
decomposition: no dilate / pad blocks, ceil(k / s) taps per axis), stride 1 runs the padded sum; both
bit-identical to TVM's unscheduled lowering (the unfused build) and within tolerance of onnxruntime;
other functions and targets are declined."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tvm_fusion.frontend import importer as frontend
from tvm_fusion._tvm import te, tirx, tvm
from tvm_fusion.build.builder import build, legalize, resolve_target
from tvm_fusion.check.compare import run_onnxruntime
from tvm_fusion.schedules.llvm.conv_transpose import LeftoverConvTranspose, phase_sum
from tvm_fusion.testing import GraphBuilder, assert_close, run_build

AVX2 = resolve_target('{"kind": "llvm", "mcpu": "x86-64-v3"}')


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


def _model(cin: int, cout: int, k, stride, pad, hw: tuple[int, int], head: bool = False, group: int = 1,
           output_padding=0, dilation=1):
    """ConvTranspose (ppocr_det's upsampling head when `head`: + bias, then Sigmoid)."""
    rng = np.random.default_rng(0)
    g = GraphBuilder(0)
    x = g.input("x", [1, cin, *hw])
    w = g.const(rng.normal(size=(cin, cout // group, *_pair(k))).astype(np.float32), "w")
    inputs = [x, w] + ([g.const(rng.normal(size=(cout,)).astype(np.float32), "b")] if head else [])
    attrs = {"kernel_shape": list(_pair(k)), "strides": list(_pair(stride)), "pads": list(_pair(pad)) * 2,
             "group": group, "dilations": list(_pair(dilation))}
    if output_padding:
        attrs["output_padding"] = list(_pair(output_padding))
    y = g.op("ConvTranspose", inputs, **attrs)
    return g.model([g.op("Sigmoid", [y]) if head else y])


def _conv_transpose_func(built):
    (func,) = [f for gv, f in built.module.functions.items()
               if isinstance(f, tirx.PrimFunc) and "conv2d_transpose" in gv.name_hint]
    return func


def _check_numerics(model, cin: int, hw: tuple[int, int], built):
    x = np.random.default_rng(1).normal(size=(1, cin, *hw)).astype(np.float32)
    unfused = build(frontend.import_onnx(model), AVX2, "unfused")
    np.testing.assert_array_equal(run_build(built, [x])[0], run_build(unfused, [x])[0])
    sess, _ = run_onnxruntime(model, {"x": x})
    assert_close(run_build(built, [x])[0], sess.run(None, {"x": x})[0], "conv transpose")


def _sum_terms(func) -> int:
    """Multiply-adds the scheduled sum runs: the product of the loop extents around its update block."""
    sch = tvm.s_tir.Schedule(func)
    return math.prod(int(sch.get(loop).extent) for loop in sch.get_loops(sch.get_sblock("compute_update")))


@pytest.mark.parametrize("cin,cout,k,stride,pad,hw,head,run", [
    (24, 24, 2, 2, 0, (6, 48), False, 8),    # ppocr_det's first upsampling: 48 pixels x 2 phases, runs of
                                             # 8 x 2 for 2 channels (4 vectors)
    (24, 24, 2, 2, 0, (12, 20), False, 4),   # 20 pixels per phase: runs of 4 x 2 for 2 channels
    (24, 1, 2, 2, 0, (12, 20), True, 4),     # its last: one channel, bias and sigmoid fused behind the sum,
                                             # runs of 4 x 2
    (8, 6, 3, 2, 1, (5, 6), False, None),    # 11 outputs per row: 6 pixels x 2 phases, no whole vectors
])
def test_stride_2_sums_only_the_non_zero_taps_bit_identical_to_tvms_lowering(cin, cout, k, stride, pad, hw, head, run):
    model = _model(cin, cout, k, stride, pad, hw, head)
    built = build(frontend.import_onnx(model), AVX2, "fused")
    func = _conv_transpose_func(built)
    script = func.script()
    assert func.attrs["tirx.is_scheduled"] and "T.parallel" in script, script
    assert "data_dilate" not in script and "data_pad" not in script, script  # read from the input itself
    assert (f"T.unroll(T.int64({run}))" in script) if run else ("T.unroll" not in script), script
    rows, width = ((n - 1) * stride - 2 * pad + k for n in hw)
    taps = (-(-k // stride)) ** 2  # per output: ceil(k / s) kernel rows x columns, not k x k
    assert _sum_terms(func) == cout * rows * (-(-width // stride) * stride) * cin * taps
    _check_numerics(model, cin, hw, built)


@pytest.mark.parametrize("case", [
    {"cin": 4, "cout": 6, "k": 3, "stride": 2, "pad": 1, "hw": (5, 7), "output_padding": 1},  # 3 taps: 2 + 1 per phase
    {"cin": 4, "cout": 4, "k": 4, "stride": 2, "pad": 1, "hw": (6, 8), "group": 2},  # DCGAN's upsampling, grouped
    {"cin": 6, "cout": 6, "k": 3, "stride": 2, "pad": 0, "hw": (5, 9), "group": 6},  # depthwise
    {"cin": 3, "cout": 5, "k": 5, "stride": 3, "pad": 2, "hw": (4, 6), "output_padding": 2},  # stride 3, padding > s
    {"cin": 3, "cout": 4, "k": 1, "stride": 2, "pad": 0, "hw": (4, 8)},  # 1x1: the odd phases take no tap
    {"cin": 3, "cout": 4, "k": (3, 2), "stride": (2, 1), "pad": (1, 0), "hw": (5, 8)},  # stride 1 on one axis only
    {"cin": 4, "cout": 3, "k": 3, "stride": 2, "pad": 1, "hw": (5, 6), "dilation": 2},  # TVM dilates the kernel first
    {"cin": 5, "cout": 3, "k": 2, "stride": 2, "pad": 0, "hw": (3, 16), "head": True},  # 32 wide: runs of 16 x 2
    # tap (p - y) mod s with p = 2: TVM's simplifier dropped the 2 from `floormod(2 - h, 3)` in a flat index
    {"cin": 2, "cout": 3, "k": (3, 1), "stride": (3, 1), "pad": 0, "hw": (5, 7)},
    # the same form made TVM's lowering fail ("Binding of variable rmod ... conflicts")
    {"cin": 6, "cout": 8, "k": (1, 2), "stride": (1, 2), "pad": (0, 1), "hw": (8, 12), "group": 2,
     "output_padding": (0, 1)},
])
def test_phase_sum_matches_tvms_lowering_and_onnxruntime(case):
    model = _model(**case)
    built = build(frontend.import_onnx(model), AVX2, "fused")
    script = _conv_transpose_func(built).script()
    assert "data_pad" not in script and "T.parallel" in script, script
    _check_numerics(model, case["cin"], case["hw"], built)


def test_stride_1_keeps_the_padded_sum():
    """No dilation zeros to skip: the dilation inlined into the padding copy, the sum over the padded input."""
    model = _model(8, 6, 3, 1, 1, (7, 9))
    built = build(frontend.import_onnx(model), AVX2, "fused")
    script = _conv_transpose_func(built).script()
    assert "data_pad" in script and "T.parallel" in script and "T.unroll" not in script, script  # width 9
    legal = legalize(frontend.import_onnx(model), tvm.target.Target("llvm"), "unfused")
    (func,) = [f for gv, f in legal.functions.items() if "conv2d_transpose" in gv.name_hint]
    assert phase_sum(func).declined == "stride 1: no dilation zeros to skip"
    _check_numerics(model, 8, (7, 9), built)


def test_declines_other_functions_and_targets():
    x = te.placeholder((4, 64), "float32", name="x")
    k = te.reduce_axis((0, 64), name="k")
    reduction = te.create_prim_func([x, te.compute((4,), lambda i: te.sum(x[i, k], axis=k), name="compute")])
    rule = LeftoverConvTranspose()
    assert rule.apply(reduction, AVX2, False) is None
    assert phase_sum(reduction).func is None and phase_sum(reduction).declined
    model = _model(4, 4, 2, 2, 0, (4, 8))
    legal = legalize(frontend.import_onnx(model), tvm.target.Target("llvm"), "unfused")
    (func,) = [f for gv, f in legal.functions.items() if "conv2d_transpose" in gv.name_hint]
    assert rule.apply(func, tvm.target.Target("cuda"), False) is None
    assert rule.apply(func, AVX2, False) is not None


def test_infinite_weight_gives_onnxruntimes_result_not_nan():
    """out = sum over the taps that exist: an infinite weight makes its outputs inf, and only those.

    TVM's lowering (the unfused build) dilates the input with zeros and multiplies them by every weight, so
    there inf * 0 made NaN at the outputs the weight never reaches; the phase sum skips those products and
    agrees with onnxruntime (the ONNX definition), NaN for NaN and inf for inf."""
    g = GraphBuilder(0)
    x = g.input("x", [1, 4, 5, 5])
    weights = np.random.default_rng(0).normal(size=(4, 3, 3, 3)).astype(np.float32)
    weights[1, 2, 0, 0] = np.inf
    y = g.op("ConvTranspose", [x, g.const(weights, "w")], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
             output_padding=[1, 1])
    model = g.model([y])
    built = build(frontend.import_onnx(model), AVX2, "fused")
    assert "data_dilate" not in _conv_transpose_func(built).script()  # the phase sum, not TVM's lowering
    data = np.random.default_rng(1).normal(size=(1, 4, 5, 5)).astype(np.float32)
    ours = run_build(built, [data])[0]
    sess, _ = run_onnxruntime(model, {"x": data})
    reference = sess.run(None, {"x": data})[0]
    assert np.isinf(reference).sum() == 16 and not np.isnan(reference).any()
    np.testing.assert_array_equal(np.isinf(ours), np.isinf(reference))
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(reference))
    finite = np.isfinite(reference)
    assert_close(ours[finite], reference[finite], "conv transpose, finite outputs")
