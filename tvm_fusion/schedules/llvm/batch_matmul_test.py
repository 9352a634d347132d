"""The llvm batched matmul: its register tile per target (`matmul_plan`), the kernel's structure (B's column
panel per tile, rows and columns padded to whole tiles) and its sums: in TVM's order, bit-identical to the
unfused build's matmul."""

import numpy as np
import pytest

from tvm_fusion._tvm import tvm
from tvm_fusion.build.builder import build
from tvm_fusion.frontend.importer import import_onnx
from tvm_fusion.hardware import cpu_facts
from tvm_fusion.schedules.llvm.batch_matmul import matmul_plan
from tvm_fusion.testing import GraphBuilder, run_build

AVX2 = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v3"})
AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})


@pytest.mark.parametrize("target", [AVX2, AVX512], ids=["avx2", "avx512"])
@pytest.mark.parametrize("m, n", [(197, 197), (197, 64), (16, 16), (1, 300), (5, 7)])
def test_plan_fits_the_registers(target, m, n):
    facts = cpu_facts(target)
    plan = matmul_plan(m, n, facts)
    vectors = plan.cols // facts.float32_lanes
    assert plan.cols % facts.float32_lanes == 0 and plan.lanes == facts.float32_lanes
    assert vectors == (2 if n >= 2 * facts.float32_lanes else 1)
    assert 1 <= plan.rows <= m and plan.rows * vectors <= facts.vector_registers // 2
    m_pad, n_pad = plan.padded(m, n)
    assert m_pad % plan.rows == 0 and n_pad % plan.cols == 0 and m_pad - m < plan.rows and n_pad - n < plan.cols


def _scores(a_shape, b_shape):
    g = GraphBuilder(0)
    return g.model([g.op("MatMul", [g.input("a", list(a_shape)), g.input("b", list(b_shape))])])


@pytest.mark.parametrize("target", [AVX2, AVX512], ids=["avx2", "avx512"])
def test_kernel_structure_and_bit_identical_sums(target):
    """ViT's scores (197 x 64 @ 64 x 197, 6 heads): tiles in parallel over (head, column tile), B's panel
    computed under it, the columns in vectors; the same sums in the same order as TVM's unfused matmul."""
    model = _scores((1, 6, 197, 64), (1, 6, 64, 197))
    mod = import_onnx(model)
    fused, unfused = build(mod, target, "fused"), build(mod, "llvm", "unfused")
    assert fused.counts["batch_matmul"] == 1 and not fused.unscheduled
    (func,) = [f for gv, f in fused.fused.mod.functions.items() if gv.name_hint == "batch_matmul"]
    script = func.script()
    lanes = cpu_facts(target).float32_lanes
    assert "T.parallel" in script and f"T.vectorized({lanes})" in script, script
    assert script.index('T.sblock("panel")') < script.index('T.sblock("matmul_update")'), script
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((1, 6, 197, 64)).astype(np.float32), rng.standard_normal((1, 6, 64, 197)).astype(np.float32)
    np.testing.assert_array_equal(run_build(fused, [a, b])[0], run_build(unfused, [a, b])[0])
