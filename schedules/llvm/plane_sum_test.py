"""The plane-sum leftover schedule (`plane_sum.py`): which sums it takes, and bit-identical results against
TVM's unscheduled loop."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_fusion._tvm import te, tvm
from tvm_fusion.schedules.llvm.plane_sum import LeftoverPlaneSum, match_plane_sum

AVX2 = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v3", "num-cores": 2})
HOST = tvm.target.Target({"kind": "llvm"})


def _mean_func(shape, combine="sum"):
    """R.mean(x, axis=[2, 3], keepdims=True) as TVM legalizes it: a sum (or max) block, then a division."""
    n, c, h, w = shape
    x = te.placeholder(shape, "float32", name="x")
    rh, rw = te.reduce_axis((0, h), name="rh"), te.reduce_axis((0, w), name="rw")
    reducer = te.sum if combine == "sum" else te.max
    red = te.compute((n, c, 1, 1), lambda a, b, i, j: reducer(x[a, b, rh, rw], axis=[rh, rw]), name="x_red")
    out = te.compute((n, c, 1, 1), lambda *i: red(*i) / float(h * w), name="divide")
    return te.create_prim_func([x, out]).without_attr("global_symbol")


def _run(func, x, target=HOST):
    executable = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target)
    out = tvm.runtime.tensor(np.full((x.shape[0], x.shape[1], 1, 1), np.nan, "float32"))
    executable["main"](tvm.runtime.tensor(x), out)
    return out.numpy()


@pytest.mark.parametrize("shape", [(1, 1000, 13, 13), (2, 2048, 7, 7), (1, 6, 5, 3)])
def test_plane_sum_is_bit_identical_to_tvms_loop(shape):
    """Each output summed in TVM's order: the very bits of the unscheduled function (SqueezeNet's classifier
    mean, ResNet-50's global pool with batch 2, a small one with groups of 6)."""
    func = _mean_func(shape)
    sch = LeftoverPlaneSum().apply(func, HOST, False)
    assert sch is not None
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    got, want = _run(sch.mod["main"], x), _run(func, x)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, x.mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)


def test_plane_sum_schedule_interleaves_chains():
    """8 outputs per group, unrolled inside the reduction; groups parallel when large."""
    script = LeftoverPlaneSum().apply(_mean_func((1, 1000, 13, 13)), AVX2, False).mod["main"].script()
    assert "T.parallel" in script and "T.unroll(8)" in script
    assert "T.parallel" not in LeftoverPlaneSum().apply(_mean_func((1, 16, 3, 3)), AVX2, False).mod["main"].script()


def test_plane_sum_declines():
    """A max, a prime number of outputs, a non-llvm target: declined, with the reason."""
    assert "not a sum" in match_plane_sum(_mean_func((1, 64, 7, 7), "max")).declined
    assert "no group" in match_plane_sum(_mean_func((1, 1009, 7, 7))).declined
    assert LeftoverPlaneSum().apply(_mean_func((1, 64, 7, 7)), tvm.target.Target("cuda"), False) is None
