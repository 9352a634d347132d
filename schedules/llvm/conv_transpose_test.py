"""The fused build's leftover ConvTranspose on llvm: scheduled (output rows in parallel, the sum outside an
unrolled run of up to four vectors of output pixels), bit-identical to TVM's unscheduled lowering (the unfused build) and within
tolerance of onnxruntime; other functions and targets are declined."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_fusion import frontend
from tvm_fusion._tvm import te, tirx, tvm
from tvm_fusion.build import build, legalize, resolve_target
from tvm_fusion.compare import run_onnxruntime
from tvm_fusion.schedules.llvm.conv_transpose import LeftoverConvTranspose
from tvm_fusion.testing import GraphBuilder, assert_close, run_build

AVX2 = resolve_target('{"kind": "llvm", "mcpu": "x86-64-v3"}')


def _model(cin: int, cout: int, k: int, stride: int, pad: int, hw: tuple[int, int], head: bool):
    """ConvTranspose (ppocr_det's upsampling head when `head`: + bias, then Sigmoid)."""
    rng = np.random.default_rng(0)
    g = GraphBuilder(0)
    x = g.input("x", [1, cin, *hw])
    w = g.const(rng.normal(size=(cin, cout, k, k)).astype(np.float32), "w")
    inputs = [x, w] + ([g.const(rng.normal(size=(cout,)).astype(np.float32), "b")] if head else [])
    y = g.op("ConvTranspose", inputs, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)
    return g.model([g.op("Sigmoid", [y]) if head else y])


@pytest.mark.parametrize("cin,cout,k,stride,pad,hw,head", [
    (24, 24, 2, 2, 0, (6, 48), False),   # ppocr_det's first upsampling: output width 96, runs of 4 vectors
    (24, 24, 2, 2, 0, (12, 20), False),  # output width 40: runs of one vector
    (24, 1, 2, 2, 0, (12, 20), True),    # its last: one channel, bias and sigmoid fused behind the sum
    (8, 6, 3, 1, 1, (7, 9), False),      # width 9: no whole vectors, the sum still outside the pixels
])
def test_conv_transpose_is_scheduled_and_bit_identical_to_tvms_lowering(cin, cout, k, stride, pad, hw, head):
    model = _model(cin, cout, k, stride, pad, hw, head)
    built = build(frontend.import_onnx(model), AVX2, "fused")
    (func,) = [f for gv, f in built.module.functions.items()
               if isinstance(f, tirx.PrimFunc) and "conv2d_transpose" in gv.name_hint]
    script = func.script()
    assert func.attrs["tirx.is_scheduled"] and "T.parallel" in script, script
    width = hw[1] * stride
    run = next((8 * n for n in (4, 3, 2, 1) if width % (8 * n) == 0), None)  # AVX2: 8 float32 lanes
    assert (f"T.unroll(T.int64({run}))" in script) if run else ("T.unroll" not in script), script
    x = np.random.default_rng(1).normal(size=(1, cin, *hw)).astype(np.float32)
    unfused = build(frontend.import_onnx(model), AVX2, "unfused")
    np.testing.assert_array_equal(run_build(built, [x])[0], run_build(unfused, [x])[0])
    sess, _ = run_onnxruntime(model, {"x": x})
    assert_close(run_build(built, [x])[0], sess.run(None, {"x": x})[0], "conv transpose")


def test_declines_other_functions_and_targets():
    x = te.placeholder((4, 64), "float32", name="x")
    k = te.reduce_axis((0, 64), name="k")
    reduction = te.create_prim_func([x, te.compute((4,), lambda i: te.sum(x[i, k], axis=k), name="compute")])
    rule = LeftoverConvTranspose()
    assert rule.apply(reduction, AVX2, False) is None
    model = _model(4, 4, 2, 2, 0, (4, 8), False)
    legal = legalize(frontend.import_onnx(model), tvm.target.Target("llvm"), "unfused")
    (func,) = [f for gv, f in legal.functions.items() if "conv2d_transpose" in gv.name_hint]
    assert rule.apply(func, tvm.target.Target("cuda"), False) is None
    assert rule.apply(func, AVX2, False) is not None
