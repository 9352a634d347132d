"""The plane-sum leftover schedule (`plane_sum.py`): which sums it takes, and bit-identical results against
TVM's unscheduled loop."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_fusion.schedules.llvm import plane_sum
from tvm_fusion._tvm import relax, te, tirx, tvm
from tvm_fusion.schedules.llvm.plane_sum import LeftoverPlaneSum, group_size, match_plane_sum
from tvm_fusion.testing import assert_close

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


def _legalized_mean(shape, axes, keepdims=True):
    """R.mean(x, axes, keepdims) legalized by Relax, as the ONNX importer's ReduceMean reaches the leftover
    rules (int64 extents; a sum block, then the division)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.mean(x, axis=list(axes), keepdims=keepdims)))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    (func,) = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    return func


def _run(func, x, target=HOST):
    executable = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target)
    out = tvm.runtime.tensor(np.full([int(d) for d in func.params[-1].shape], np.nan, "float32"))
    executable["main"](tvm.runtime.tensor(x), out)
    return out.numpy()


def _check_bit_identical(func, shape, chains):
    """Scheduled with `chains` outputs per group; the very bits of TVM's unscheduled loop, and the mean."""
    sch = LeftoverPlaneSum().apply(func, HOST, False)
    assert sch is not None
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    got, want = _run(sch.mod["main"], x), _run(func, x)
    np.testing.assert_array_equal(got, want)
    assert match_plane_sum(func).chains == chains
    return got, x


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
    assert_close(got, x.mean(axis=(2, 3), keepdims=True), "against numpy's mean")


@pytest.mark.parametrize("shape, axes, keepdims, chains", [
    ((2, 3, 4, 5), (3,), True, 4),      # ONNX rms_normalization_4d_axis3 / -1 / default axis, expanded
    ((2, 3, 4, 5), (3,), False, 4),
    ((2, 3, 4, 5), (2, 3), True, 6),    # rms_normalization_4d_axis2
    ((2, 3, 4, 5), (1, 2, 3), True, 2),  # rms_normalization_4d_axis1
    ((2, 3, 5), (2,), True, 6),         # rms_normalization_3d_axis2
    ((3, 4), (1,), True, 3),            # rms_normalization_2d_axis1
    ((3, 5, 2, 7), (3,), True, 2),      # 30 outputs: 6 would straddle (0, 3..4, :) and (1, 0, :)
    ((7, 2, 2, 3), (3,), True, 4),      # 28 outputs: 7 straddles
    ((2, 4, 4, 5), (3,), True, 8),      # groups of two 4-rows: boxes
])
def test_mean_over_trailing_axes_is_bit_identical(shape, axes, keepdims, chains):
    """Groups are boxes of the output, never runs across an axis boundary. Before the fix the mean over the
    last axis of 2 x 3 x 4 x 5 (ONNX's expanded RMS normalization) took groups of 8 of its 24 outputs:
    the second group, rows (0, 2, :) and (1, 0, :), had its division computed over the bounding box
    (0..1, :, :) from a per-group sum buffer, and rewrote rows of the third group from sums it never made
    (4 of 24 means off, 20 of 120 elements of the normalization)."""
    got, x = _check_bit_identical(_legalized_mean(shape, axes, keepdims), shape, chains)
    assert_close(got, x.mean(axis=axes, keepdims=keepdims), "against numpy's mean")


def test_mean_then_a_map_in_one_function():
    """The RMS normalization's mean with the map after it in the same function (sqrt(|mean| + eps)): the map
    follows each group of the sum's outputs."""
    shape = (2, 3, 4, 5)
    x = te.placeholder(shape, "float32", name="x")
    k = te.reduce_axis((0, 5), name="k")
    red = te.compute((2, 3, 4, 1), lambda a, b, c, d: te.sum(x[a, b, c, k], axis=k), name="x_red")
    out = te.compute((2, 3, 4, 1), lambda *i: te.sqrt(te.abs(red(*i) / 5.0) + 1e-5), name="rms")
    got, x_np = _check_bit_identical(te.create_prim_func([x, out]).without_attr("global_symbol"), shape, 4)
    assert_close(got, np.sqrt(np.abs(x_np.mean(axis=3, keepdims=True)) + 1e-5), "against numpy")


def test_group_size_keeps_groups_boxes():
    """8 outputs per group where 8 consecutive outputs are a box; otherwise the largest run that is."""
    assert group_size([1, 1000, 1, 1]) == 8   # SqueezeNet's mean
    assert group_size([2, 3, 4, 1]) == 4      # not 8: rows (0, 2, :) and (1, 0, :)
    assert group_size([2, 4, 4, 1]) == 8
    assert group_size([3, 5, 2]) == 2
    assert group_size([5, 3, 2]) == 6
    assert group_size([1, 1009, 1, 1]) == 1


def test_a_group_that_is_not_a_box_is_declined(monkeypatch):
    """The guard after reverse_compute_at: forced to groups of 8 over 2 x 3 x 4 outputs, the map's loops
    under the group would run over a bounding box: the rule declines instead of scheduling it."""
    monkeypatch.setattr(plane_sum, "group_size", lambda extents: 8)
    func = _legalized_mean((2, 3, 4, 5), (3,))
    assert match_plane_sum(func).chains == 8
    assert LeftoverPlaneSum().apply(func, HOST, False) is None


def test_plane_sum_schedule_interleaves_chains():
    """8 outputs per group, unrolled inside the reduction; groups parallel when large."""
    script = LeftoverPlaneSum().apply(_mean_func((1, 1000, 13, 13)), AVX2, False).mod["main"].script()
    assert "T.parallel" in script and "T.unroll(8)" in script
    assert "T.parallel" not in LeftoverPlaneSum().apply(_mean_func((1, 16, 3, 3)), AVX2, False).mod["main"].script()


def test_plane_sum_declines():
    """A max, a prime number of outputs, a map reading the sums at other indices, a non-llvm target:
    declined, with the reason."""
    assert "not a sum" in match_plane_sum(_mean_func((1, 64, 7, 7), "max")).declined
    assert "no run of 2..8" in match_plane_sum(_mean_func((1, 1009, 7, 7))).declined
    x = te.placeholder((4, 6, 5), "float32", name="x")
    k = te.reduce_axis((0, 5), name="k")
    red = te.compute((4, 6), lambda a, b: te.sum(x[a, b, k], axis=k), name="x_red")
    flipped = te.compute((4, 6), lambda a, b: red[3 - a, b] / 5.0, name="divide")
    func = te.create_prim_func([x, flipped]).without_attr("global_symbol")
    assert "not an element-wise map" in match_plane_sum(func).declined
    assert LeftoverPlaneSum().apply(_mean_func((1, 64, 7, 7)), tvm.target.Target("cuda"), False) is None


def test_random_trailing_means_are_bit_identical():
    """Means over the trailing axes of random shapes (seed 2; reproduce with this test alone): every one the
    rule takes gives the bits of TVM's loop (without the box rule the mean over the last axis of 7 x 2 x 2 x 6
    came out wrong here: groups of 7 across rows)."""
    rng = np.random.default_rng(2)
    compared = 0
    for _ in range(30):
        rank = int(rng.integers(2, 5))
        shape = tuple(int(d) for d in rng.integers(1, 8, size=rank))
        axes = tuple(range(rank - int(rng.integers(1, rank)), rank))
        keepdims = bool(rng.integers(0, 2))
        func = _legalized_mean(shape, axes, keepdims)
        sch = LeftoverPlaneSum().apply(func, HOST, False)
        assert (sch is None) == (match_plane_sum(func).chains == 0), (shape, axes, keepdims)
        if sch is None:
            continue
        x = rng.standard_normal(shape).astype("float32")
        np.testing.assert_array_equal(_run(sch.mod["main"], x), _run(func, x), err_msg=f"{shape} {axes} {keepdims}")
        compared += 1
    assert compared >= 20
