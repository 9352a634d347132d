"""numerics.error_stats: the element-wise verdict every comparison uses."""

import numpy as np
import pytest

from tvm_fusion.errors import ToleranceExceeded
from tvm_fusion.check.numerics import TOLERANCES, error_stats
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


# ---------------------------------------------------------------- the output's scale and the reference's noise
def _probability_map(peak=0.01, pixels=5, shape=(1, 1, 96, 192)):
    """A sigmoid map with one faint candidate: `pixels` at `peak`, the rest exactly 0 as onnxruntime's Sigmoid
    gives it below x ~ -16 (it is 1.4e-7 off the exact value anywhere in [0, 1]), and the exact sigmoid there."""
    ref = np.zeros(shape, np.float32)
    ref.flat[1000:1000 + pixels] = peak
    exact = ref.copy()
    exact[ref == 0] = 1.35e-7
    return exact, ref


def test_sparse_probability_map_is_judged_against_its_peak():
    """With atol * rms the map failed (rms 1.65e-4: 4.9e-8 allowed where the exact sigmoid is 1.35e-7 off);
    against a tenth of its peak it passes. Its candidate pixels are still judged at 0.7%."""
    got, ref = _probability_map()
    rms = float(np.sqrt(np.mean(ref.astype(np.float64) ** 2)))
    assert 3e-4 * rms < 1.35e-7  # what the rms rule allowed
    stats = error_stats(got, ref)
    assert stats.ok and stats.scale_of == "max|r|/10" and stats.atol_eff == pytest.approx(3e-4 * 1e-3)
    got.flat[1002] = 0.01 * 1.007
    stats = error_stats(got, ref)
    assert not stats.ok and stats.n_bad == 1 and stats.worst.index == (0, 0, 5, 42)


def test_dense_outputs_keep_the_rms():
    """A Gaussian-like output (max/rms ~ sqrt(2 ln n)) never reaches max/10 > rms: its bound is unchanged."""
    for n in (10, 1000, 1_000_000):
        ref = np.random.default_rng(n).standard_normal(n).astype(np.float32)
        stats = error_stats(ref, ref)
        rms = float(np.sqrt(np.mean(ref.astype(np.float64) ** 2)))
        assert stats.scale_of == "rms(r)" and stats.atol_eff == pytest.approx(3e-4 * rms), n


def test_a_logit_0_7_percent_off_fails_under_the_peak_and_the_noise():
    """Logits with a confident class (peak 25: the scale is max/10 = 2.5, not the rms) and onnxruntime noisy at
    a tenth of the elements: a typical logit 0.7% off where onnxruntime agrees with itself still fails."""
    rng = np.random.default_rng(3)
    ref = (rng.standard_normal(1000) * 2).astype(np.float32)
    ref[7] = 25.0
    noise = np.where(rng.random(1000) < 0.1, 1e-3, 0.0)
    noise[[100, 200]] = 0.0
    for i, value in ((100, 2.0), (200, 0.5)):  # the rms is 2.1: a typical logit and one at a quarter of it
        r = ref.copy()
        r[i] = value
        got = r.copy()
        got[i] = value * 1.007
        stats = error_stats(got, r, noise=noise)
        assert stats.scale_of == "max|r|/10" and not stats.ok and stats.n_bad == 1 and stats.worst.index == (i,)


def _qdq_output(seed=0, step=7.2e-4, size=4096):
    """An output of a QDQ model, as onnxruntime gives it as written and optimized: int8 steps of `step`
    (dequantized), the optimized run one step off at 3% of the elements (rounding flips)."""
    rng = np.random.default_rng(seed)
    written = (np.round(rng.standard_normal(size) * 0.01 / step) * step).astype(np.float32)
    flips = rng.random(size) < 0.03
    optimized = (written + np.where(flips, step * rng.choice([-1, 1], size), 0)).astype(np.float32)
    return written, optimized, flips


def test_noisy_reference_passes_within_its_own_noise():
    """The build matches onnxruntime-with-optimizations to 1e-7; the reference (as written) is one int8 step
    (7.2e-4, over atol * rms = 3e-6) away from it at the flipped elements: within the noise, per element."""
    written, optimized, flips = _qdq_output()
    got = optimized + np.float32(1e-7)
    assert not error_stats(got, written).ok  # the table alone refuses it
    noise = np.abs(optimized.astype(np.float64) - written)
    stats = error_stats(got, written, noise=noise)
    assert stats.ok and stats.n_noise_only == int(flips.sum()) == stats.n_noisy
    assert stats.noise == pytest.approx(7.2e-4) and "+ noise (max 0.00072 at" in stats.rule()
    assert f"{stats.n_noise_only} within the reference's noise only" in stats.describe()


def test_the_noise_is_per_element():
    """A step off where onnxruntime agrees with itself fails, however noisy the other elements are."""
    written, optimized, flips = _qdq_output()
    noise = np.abs(optimized.astype(np.float64) - written)
    got = written.copy()
    calm = np.flatnonzero(~flips)[:3]
    got[calm] += np.float32(7.2e-4)
    stats = error_stats(got, written, noise=noise)
    assert not stats.ok and stats.n_bad == 3 and stats.worst.index[0] in calm


def test_noise_that_is_not_finite_allows_nothing():
    ref = np.linspace(-1, 1, 10).astype(np.float32)
    got = ref * np.float32(1.01)
    for bad in (np.nan, np.inf):
        stats = error_stats(got, ref, noise=np.full(10, bad))
        assert not stats.ok and stats.n_bad == 10 and stats.noise == 0.0 and stats.n_noise_only == 0
    with pytest.raises(ValueError, match=r"noise of shape \(3,\) does not broadcast to the reference's \(10,\)"):
        error_stats(got, ref, noise=np.zeros(3))


def test_quantized_integer_output_within_the_noise():
    """A uint8 output: one step off where onnxruntime's own runs are one step apart, exact elsewhere."""
    ref = np.arange(64, dtype=np.uint8)
    noise = np.zeros(64)
    noise[5] = 1
    got = ref.copy()
    got[5] += 1
    stats = error_stats(got, ref, noise=noise)
    assert stats.ok and stats.n_noise_only == 1 and "uint8: exact, or within the noise (max 1 at 1 elements)" in stats.rule()
    got[6] += 1
    assert not error_stats(got, ref, noise=noise).ok
