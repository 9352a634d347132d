"""The CUDA depthwise -> pointwise schedule, without a GPU: the row tile per block, its loop nest run serially
on the CPU against NumPy, each MobileNetV2 shape
within sm_90's launch limits with the depthwise tile in shared memory (verify_gpu_code on the lowered
kernel), and `supports` declining a row that does not fit a block's shared memory. nvcc compiling the whole
build: patterns/depthwise_pointwise_test.py."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_fusion._tvm import Schedule, te, tvm
from tvm_fusion.check.numerics import error_stats
from tvm_fusion.schedules.cuda.conv2d_test import _Serial
from tvm_fusion.schedules.llvm.depthwise_pointwise_test import _reference
from tvm_fusion.schedules.cuda.depthwise_pointwise import _supports, cuda_rows, schedule_dwpw_cuda
from tvm_fusion.schedules.cuda.gpu_limits import check_gpu_limits
from tvm_fusion.schedules.depthwise_pointwise import depthwise_pointwise

TARGET = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
SHARED = 48 * 1024


def test_rows_per_block_fill_the_shared_memory():
    assert cuda_rows(144, 56, 56, SHARED) == 1  # 144 x 56 floats = 32 KB; two rows do not fit
    assert cuda_rows(384, 14, 14, SHARED) == 2
    assert cuda_rows(960, 7, 7, SHARED) == 1
    assert cuda_rows(4096, 7, 7, SHARED) is None


def _scheduled(shape, o, stride=1, residual=False, mult=1, wrap=lambda sch: sch):
    """The scheduled PrimFunc (x, [residual], Wd, bd, Wp, bp, out): dw 3x3 + ReLU6 -> 1x1 (+ residual; else ReLU)."""
    n, c, h, w = shape
    x = te.placeholder(shape, "float32", name="x")
    wd, bd = te.placeholder((c * mult, 1, 3, 3), "float32"), te.placeholder((c * mult,), "float32")
    wp, bp = te.placeholder((o, c * mult), "float32"), te.placeholder((o,), "float32")
    hout, wout = (h - 1) // stride + 1, (w - 1) // stride + 1
    r = te.placeholder((n, o, hout, wout), "float32") if residual else None
    attrs = dict(strides=(stride, stride), padding=(1, 1, 1, 1), dw_activation="relu6", dw_activation_params={},
                 activation=None if residual else "relu", activation_params={})
    out = depthwise_pointwise(x, wd, bd, wp, bp, r, **attrs, target=TARGET)
    sch = Schedule(tvm.IRModule({"main": te.create_prim_func([x, *([r] if residual else []), wd, bd, wp, bp, out])}))
    with TARGET:
        schedule_dwpw_cuda(wrap(sch), attrs, TARGET)
    return sch.mod["main"]


@pytest.mark.parametrize("shape,o,stride,residual,mult", [
    ((1, 16, 9, 11), 24, 1, True, 1), ((2, 8, 13, 12), 12, 2, False, 2), ((1, 600, 7, 7), 20, 1, False, 1),
], ids=["residual", "s2-m2-n2", "600ch"])
def test_schedule_keeps_the_numerics(shape, o, stride, residual, mult):
    """The scheduled loop nest (the shared depthwise tile, the local sums, the inlined padding) run serially on
    the CPU, only the thread bindings left out, against NumPy."""
    func = _scheduled(shape, o, stride, residual, mult, wrap=_Serial)
    shapes = [[int(d) for d in b.shape] for b in func.params]
    rng = np.random.default_rng(0)
    vals = [rng.standard_normal(s).astype(np.float32) for s in shapes[:-1]]
    out = tvm.runtime.tensor(np.full(shapes[-1], np.nan, np.float32))
    tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), "llvm")["main"](
        *[tvm.runtime.tensor(v) for v in vals], out)
    stats = error_stats(out.numpy(), _reference(vals, (3, stride, 1, mult, residual)).astype(np.float32))
    assert stats.ok, stats.describe()


@pytest.mark.parametrize("shape,o,stride,residual", [
    ((1, 96, 112, 112), 24, 2, False), ((1, 144, 56, 56), 24, 1, True), ((1, 384, 14, 14), 64, 1, True),
    ((1, 960, 7, 7), 160, 1, True), ((2, 32, 112, 112), 16, 1, False),
], ids=["96x112-s2", "144x56+", "384x14+", "960x7+", "n2-32x112"])
def test_mobilenet_v2_shapes_fit_sm_90_with_the_tile_in_shared_memory(shape, o, stride, residual):
    func = _scheduled(shape, o, stride, residual)
    check = check_gpu_limits(func, TARGET)
    assert check.ok, check
    assert 0 < check.shared_bytes <= SHARED
    assert 'scope="shared"' in func.script()


def test_a_row_over_the_shared_memory_declines():
    shapes = [(1, 4096, 7, 7), (4096, 1, 3, 3), (4096,), (16, 4096), (16,)]
    why = _supports(dict(strides=(1, 1), padding=(1, 1, 1, 1)), shapes, TARGET)
    assert "one row of 4096 channels x 7 columns is 114688 B, over the 49152 B a block has" in why
