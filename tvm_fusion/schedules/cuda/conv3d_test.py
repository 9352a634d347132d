"""CUDA conv3d schedule, without a GPU: launch limits (verify_gpu_code on the lowered kernel), the scheduled loop
nest's numerics run serially on the CPU against the unscheduled compute, a grouped conv's channels per thread,
`supports`. (The fused build compiled by nvcc: patterns/conv_epilogue_test.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from tvm_fusion._tvm import te, tvm
from tvm_fusion.schedules.conv3d import conv3d_affine
from tvm_fusion.schedules.cuda.conv2d_test import _Serial  # bind() a no-op: the loop nest run serially
from tvm_fusion.schedules.cuda.conv3d import oc_per_thread, schedule_conv3d_cuda, supports
from tvm_fusion.schedules.cuda.gpu_limits import check_gpu_limits
from tvm_fusion.testing import assert_close

TARGET = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})

# (x shape, W shape, strides, padding, dilation, groups)
CASES = {
    "3x3x3": ((2, 8, 5, 9, 9), (16, 8, 3, 3, 3), (1, 1, 1), (1,) * 6, (1, 1, 1), 1),
    "strided-asym": ((1, 3, 8, 17, 15), (6, 3, 3, 5, 5), (2, 2, 1), (1, 2, 0, 0, 2, 3), (1, 1, 1), 1),
    "dilated-groups": ((1, 12, 7, 10, 10), (18, 4, 3, 3, 3), (1, 1, 1), (2,) * 6, (2, 2, 2), 3),
    "depthwise": ((1, 8, 4, 8, 8), (8, 1, 3, 3, 3), (1, 1, 1), (1,) * 6, (1, 1, 1), 8),
}


def _func(case):
    x_shape, w_shape, strides, padding, dilation, groups = case
    attrs = dict(strides=strides, padding=padding, dilation=dilation, groups=groups, activation="relu",
                 activation_params={})
    x, w, b = (te.placeholder(s, "float32", name=n) for s, n in ((x_shape, "x"), (w_shape, "w"), ((w_shape[0],), "b")))
    out = conv3d_affine(x, w, b, **attrs)
    return te.create_prim_func([x, w, b, out]).without_attr("global_symbol"), attrs, [x_shape, w_shape, (w_shape[0],)]


def _schedule(func, attrs, wrap=lambda s: s):
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    with TARGET:
        engine = schedule_conv3d_cuda(wrap(sch), attrs, TARGET)
    return sch.mod["main"], engine


def _run_cpu(func, shapes):
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.standard_normal(s).astype("float32")) for s in shapes]
    out = tvm.runtime.tensor(np.full([int(d) for d in func.params[-1].shape], np.nan, "float32"))
    tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), "llvm")["main"](*args, out)
    return out.numpy()


@pytest.mark.parametrize("name", CASES)
def test_within_launch_limits_and_keeps_the_numerics(name):
    func, attrs, shapes = _func(CASES[name])
    assert supports(attrs, shapes, TARGET) is None
    scheduled, engine = _schedule(func, attrs)
    check = check_gpu_limits(scheduled, TARGET)
    assert check.ok, f"{name}: {check}"
    opg = shapes[1][0] // attrs["groups"]
    assert engine == f"CUDA cores, {oc_per_thread(opg)} output channels per thread"
    got = _run_cpu(_schedule(func, attrs, _Serial)[0], shapes)
    assert not np.isnan(got).any(), "an output was never written"
    assert_close(got, _run_cpu(func, shapes), f"{name} scheduled vs unscheduled")


def test_channels_per_thread_divide_the_group():
    assert [oc_per_thread(opg) for opg in (16, 6, 3, 1)] == [4, 2, 1, 1]


def test_supports_names_actual_and_expected_values():
    attrs = dict(strides=(1, 1, 1), padding=(0,) * 6, dilation=(1, 1, 1), groups=1)
    assert supports(attrs, [(1, 8, 2, 8, 8), (8, 8, 3, 3, 3), (8,)], TARGET) == "conv3d output is empty (0x6x6)"
    assert supports(attrs, [(1, 8, 8, 8), (8, 8, 3, 3), (8,)], TARGET).startswith(
        "conv3d operands have ranks 4 and 4; the CUDA conv3d schedule takes NCDHW / OIDHW")
