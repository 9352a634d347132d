"""numerics.error_stats: the element-wise verdict every comparison uses."""

import numpy as np
import pytest

from tvm_fusion.errors import ToleranceExceeded
from tvm_fusion.numerics import TOLERANCES, error_stats
from tvm_fusion.testing import assert_close


def _ref(shape=(4, 5, 6), scale=100.0, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def test_one_element_off_by_0_7_percent_fails():
    """The old per-output rule (max|diff| <= atol + rtol * max|ref|) passed this: one large value (an
    outlier feature, a peak logit) made the bound of every other element 100x looser."""
    ref = _ref(scale=1.0)
    ref[0, 0, 0] = 100.0
    ref[1, 2, 3] = 1.0
    got = ref.copy()
    got[1, 2, 3] = 1.007
    old_bound = 1e-5 + 1e-4 * np.abs(ref).max()
    assert np.abs(got - ref).max() <= old_bound  # what used to pass
    stats = error_stats(got, ref)
    assert not stats.ok and stats.n_bad == 1 and stats.size == ref.size
    assert stats.worst.index == (1, 2, 3)
    assert stats.worst.actual == pytest.approx(1.007) and stats.worst.reference == 1.0
    assert "1 of 120 elements off" in stats.describe() and "at [1, 2, 3]: 1.007 vs reference 1" in stats.describe()


def test_typical_elements_are_judged_at_0_7_percent():
    """Every element above 1/20 of the output's rms fails when it is 0.7% off, whatever its neighbours."""
    ref = _ref(scale=100.0)
    rms = float(np.sqrt(np.mean(ref.astype(np.float64) ** 2)))
    for value in (rms / 20, rms / 2, rms, 3 * rms):
        r = ref.copy()
        r[2, 2, 2] = value
        got = r.copy()
        got[2, 2, 2] = value * 1.007
        assert not error_stats(got, r).ok, value


def test_large_element_off_by_0_7_percent_fails():
    ref = _ref(scale=1.0)
    ref.flat[7] = 2.0
    got = ref.copy()
    got.flat[7] *= 1.007
    assert not error_stats(got, ref).ok


def test_one_ulp_passes():
    ref = _ref(scale=3.0)
    ref.flat[0] = 0.0  # a zero reference: 1 ulp of 0 is a subnormal, within atol
    got = np.nextafter(ref, np.float32(np.inf))
    stats = error_stats(got, ref)
    assert stats.ok and stats.n_bad == 0 and stats.max_abs > 0


def test_near_zero_after_cancellation_is_judged_absolutely():
    """An element near 0 with an error of the output's rounding size passes (atol scaled by rms)."""
    ref = _ref(scale=50.0)
    ref.flat[3] = 1e-7
    got = ref.copy()
    got.flat[3] = 1e-7 + 50 * 1e-6  # ~1e-6 relative to the output's magnitude
    assert error_stats(got, ref).ok


def test_nan_and_inf_positions():
    ref = np.array([1.0, np.nan, np.inf, -np.inf], np.float32)
    assert error_stats(ref.copy(), ref).ok
    for i, bad in [(0, np.nan), (1, 1.0), (2, -np.inf), (3, 0.0), (0, np.inf)]:
        got = ref.copy()
        got[i] = bad
        stats = error_stats(got, ref)
        assert not stats.ok and stats.n_bad == 1 and stats.worst.index == (i,), (i, bad)


def test_integers_and_bools_compare_exactly():
    ref = np.arange(12, dtype=np.int64).reshape(3, 4)
    got = ref.copy()
    assert error_stats(got, ref).ok
    got[2, 1] += 1
    stats = error_stats(got, ref)
    assert not stats.ok and stats.worst.index == (2, 1) and "int64: exact" in stats.describe()
    assert not error_stats(np.array([True, True]), np.array([True, False])).ok


def test_shape_mismatch_names_both_shapes():
    stats = error_stats(np.zeros((2, 3), np.float32), np.zeros((1, 2, 3), np.float32))
    assert not stats.ok and stats.describe() == "shape (2, 3) vs reference shape (1, 2, 3)"
    with pytest.raises(ToleranceExceeded, match=r"out: shape \(2, 3\) vs reference shape \(1, 2, 3\)"):
        assert_close(np.zeros((2, 3)), np.zeros((1, 2, 3)), "out")


def test_reference_dtype_decides_the_tolerance():
    """An fp16 model is judged with the fp16 tolerance, even when the build returned float32."""
    ref = np.linspace(-4, 4, 64).astype(np.float16)
    got = (ref.astype(np.float32) * (1 + 5e-3)).astype(np.float32)  # 0.5%: fine for fp16, not for fp32
    stats = error_stats(got, ref)
    assert stats.ok and stats.dtype == "float16" and stats.tol == TOLERANCES["float16"]
    assert not error_stats(got, ref.astype(np.float32)).ok


def test_empty_and_scalar():
    assert error_stats(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32)).ok
    assert not error_stats(np.float32(1.01), np.float32(1.0)).ok


def test_dtype_override_for_a_wider_reference():
    """fused vs an unfused build that computed in float32: the model's dtype (float16) still decides."""
    ref = np.linspace(-4, 4, 64).astype(np.float32)
    got = ref * (1 + 5e-3)
    assert not error_stats(got, ref).ok
    assert error_stats(got, ref, dtype=np.float16).ok
    assert error_stats(got, ref, dtype="float16").dtype == "float16"
