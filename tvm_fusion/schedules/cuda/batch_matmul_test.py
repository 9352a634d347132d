"""The batched matmul builds for CUDA without a GPU: dlight's rules schedule it within the launch limits and
nvcc compiles it (scores of two tensors, broadcast batches, a symbolic batch, float16)."""

import numpy as np
import pytest

from tvm_fusion.build.builder import build, resolve_target
from tvm_fusion.frontend.importer import SymDim, import_onnx
from tvm_fusion.schedules.cuda.batch_matmul import ENGINE
from tvm_fusion.schedules.cuda.gpu_limits import check_gpu_limits
from tvm_fusion.testing import GraphBuilder, as_float16, check_cuda_build


def _model(a_shape, b_shape, relu=False):
    g = GraphBuilder(0)
    y = g.op("Div", [g.op("MatMul", [g.input("a", list(a_shape)), g.input("b", list(b_shape))]),
                     g.const(np.float32(8.0))])
    return g.model([g.op("Relu", [y]) if relu else y])


@pytest.mark.parametrize("a_shape, b_shape, relu, half", [
    ((1, 6, 197, 64), (1, 6, 64, 197), False, False),
    ((2, 1, 9, 16), (1, 3, 16, 5), True, False),
    ((4, 128, 64), (4, 64, 128), False, True),
])
def test_batch_matmul_builds_for_cuda(a_shape, b_shape, relu, half):
    model = _model(a_shape, b_shape, relu)
    built = check_cuda_build(as_float16(model) if half else model,
                             expect={"batch_matmul_relu" if relu else "batch_matmul": 1})
    assert [g.kernel for g in built.fused.groups] == [ENGINE]
    assert not built.unscheduled


def test_symbolic_batch_builds_for_cuda():
    model = _model(["N", 4, 33, 16], ["N", 4, 16, 33])
    target = resolve_target("cuda", "sm_90")
    built = build(import_onnx(model, {"a": (SymDim("N", 8), 4, 33, 16), "b": (SymDim("N", 8), 4, 16, 33)}),
                  target, "fused")
    assert built.counts["batch_matmul"] == 1 and not built.unscheduled
    (func,) = [f for gv, f in built.fused.mod.functions.items() if gv.name_hint == "batch_matmul"]
    check = check_gpu_limits(func, target)
    assert check.ok, str(check)
