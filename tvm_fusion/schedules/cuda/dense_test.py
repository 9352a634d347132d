"""CUDA dense schedule, without a GPU: every dense shape gets a dlight rule that binds it to blocks and
threads, and the kernel stays within the launch limits."""

from __future__ import annotations

import pytest

from tvm_fusion._tvm import te, tvm
from tvm_fusion.schedules.cuda.dense import schedule_dense_cuda, supports
from tvm_fusion.schedules.cuda.gpu_limits import check_gpu_limits
from tvm_fusion.schedules.dense import dense_affine

TARGET = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})

SHAPES = [(1, 2048, 1000), (4, 2048, 1000), (128, 768, 3072), (7, 13, 3), (1, 1, 1), (3, 17, 1000),
          (1000, 64, 5), (64, 9216, 4096)]


def dense_case(m, k, n, activation="relu"):
    x = te.placeholder((m, k), "float32", name="x")
    w = te.placeholder((k, n), "float32", name="w")
    b = te.placeholder((n,), "float32", name="b")
    out = dense_affine(x, w, b, activation=activation)
    return te.create_prim_func([x, w, b, out]).without_attr("global_symbol"), [(m, k), (k, n), (n,)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_scheduled_and_within_launch_limits(shape):
    func, shapes = dense_case(*shape)
    assert supports({}, shapes, TARGET) is None
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    with TARGET:
        schedule_dense_cuda(sch, {}, TARGET)
    scheduled = sch.mod["main"]
    check = check_gpu_limits(scheduled, TARGET)
    assert check.ok, f"{shape}: {check}"
    script = scheduled.script()  # scheduled here, not left to TVM's default GPU schedule at build time
    assert 'thread="blockIdx' in script and 'thread="threadIdx' in script
