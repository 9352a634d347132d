"""CUDA squeeze-excite and attention schedules, without a GPU: the scheduled loop nest (shared stages under
the block loop, predicated thread splits) run serially on the CPU computes what the unscheduled compute
does, and the kernels stay within sm_90's launch limits."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_fusion._tvm import te, tvm
from tvm_fusion.schedules.attention import attention
from tvm_fusion.schedules.cuda.attention import schedule_attention_cuda
from tvm_fusion.schedules.cuda.conv2d_test import _run_cpu, _Serial
from tvm_fusion.schedules.cuda.gpu_limits import check_gpu_limits
from tvm_fusion.schedules.cuda.squeeze_excite import schedule_squeeze_excite_cuda
from tvm_fusion.schedules.squeeze_excite import squeeze_excite
from tvm_fusion.testing import assert_close

TARGET = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})


def _func(compute, shapes, **attrs):
    tensors = [te.placeholder(s, "float32", name=f"in{i}") for i, s in enumerate(shapes)]
    out = compute(*tensors, **attrs)
    return te.create_prim_func([*tensors, out]).without_attr("global_symbol"), [int(d) for d in out.shape]


def _check(schedule, compute, shapes, attrs):
    func, out_shape = _func(compute, shapes, **attrs)
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    with TARGET:
        schedule(sch, attrs, TARGET)
    check = check_gpu_limits(sch.mod["main"], TARGET)
    assert check.ok, check
    serial = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    with TARGET:
        schedule(_Serial(serial), attrs, TARGET)
    got, want = _run_cpu(serial.mod["main"], shapes, out_shape), _run_cpu(func, shapes, out_shape)
    assert not np.isnan(got).any(), "an output was never written"
    assert_close(got, want, "scheduled vs unscheduled")


SE = [((2, 16, 5, 7), 4, "relu", "hardsigmoid"), ((1, 300, 3, 3), 75, "silu", "sigmoid"),
      ((1, 8, 1, 1), 2, "hardswish", "hardsigmoid"),
      ((1, 384, 3, 6), 96, "relu", "hardsigmoid")]  # PP-OCRv4 det: more channels than 256 threads


@pytest.mark.parametrize("x,r,act,gate", SE, ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v))
def test_squeeze_excite_schedule_keeps_the_numerics(x, r, act, gate):
    c = x[1]
    _check(schedule_squeeze_excite_cuda, squeeze_excite, [x, (r, c), (r,), (c, r), (c,)],
           dict(activation=act, gate=gate))


@pytest.mark.parametrize("x,r", [(s[0], s[1]) for s in SE], ids=lambda v: "x".join(map(str, v))
                         if isinstance(v, tuple) else str(v))
def test_squeeze_excite_kernel_compiles_for_cuda(x, r):
    """Through tvm.compile's lowering (barriers included): a channel stage that loops with a predicate
    around its shared write made TVM fail with "Cannot insert syncs inside condition"."""
    c = x[1]
    func, _ = _func(squeeze_excite, [x, (r, c), (r,), (c, r), (c,)], activation="relu", gate="hardsigmoid")
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    with TARGET:
        schedule_squeeze_excite_cuda(sch, {}, TARGET)
    tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}), target=TARGET)


ATTENTION = [((2, 3, 5, 8), (2, 3, 8, 5), (2, 3, 5, 8), (2, 1, 1, 5)),  # padding mask
             ((1, 2, 300, 16), (1, 2, 16, 300), (1, 2, 300, 24), (1, 1, 300, 300)),  # more keys than threads
             ((1, 1, 3, 8), (1, 1, 8, 9), (1, 1, 9, 8), None)]


@pytest.mark.parametrize("shapes", ATTENTION, ids=["mask", "long", "cross_no_mask"])
def test_attention_schedule_keeps_the_numerics(shapes):
    shapes = [s for s in shapes if s is not None]
    _check(schedule_attention_cuda, attention, shapes, dict(scale=2.0, scale_op="divide"))
