"""Numeric verdicts: the dtype tolerance table and the element-wise error measure.

A leaf module (numpy only): `compare`, the per-group check, compile's verify step and the tests all judge
with it, so a verdict means the same everywhere. In the style of `numpy.allclose`, every element must hold

    |actual - reference| <= atol * scale + rtol * |reference| + noise,
    scale = max(rms(r), max|r| / 10)   over the finite reference values (1 when they are all 0)

with (rtol, atol) from TOLERANCES, keyed by the *reference's* dtype (an fp16 model is judged as fp16), and
`noise` the reference's own uncertainty at that element (0 unless given; see below).

**The scale.** atol is scaled by the output's typical magnitude because an element that is near zero after
cancellation carries the rounding noise of the whole computation at the output's scale, not at its own:
between TVM (unfused, no rule of ours involved) and onnxruntime the logits of ResNet-50 differ by up to
8e-5 * rms (Inception v2 3.5e-5, the light models <= 1e-5), so float32's atol is 3e-4, about 4x that. The
scale is the output's own, never clamped to 1: a softmax whose values are ~1e-3 gets an atol of ~3e-7, not
3e-4 (which would let its typical element be 30% off). It is the rms for a dense output: a Gaussian-like
output of n values has max/rms ~ sqrt(2 ln n), under 6.1 up to 1e8 values, so max|r|/10 never replaces its
rms and one large outlier does not loosen the bound of every other element until it is 10x the rms. It is
a tenth of the largest value for a *sparse* one, mostly near 0 with a few large values (a sigmoid
probability map with a small detection, a confident softmax): there the rms measures how much of the
output is large, not the magnitude the computation runs at. onnxruntime's float32 Sigmoid, for one, is
1.4e-7 off the exact value anywhere in [0, 1] (measured over x in [-40, 40]), so an exact sigmoid differs
from it by that much where it gives 0: with max/10 a map passes once its peak reaches 0.5%; with the rms
it needed rms >= 4.7e-4 (a 96x192 map whose only candidate is 5 pixels at 1% failed). A map whose peak is
below onnxruntime's own error (no detection at all: random inputs) fails either way; compile's verify step
then finds that the unfused build gives the same values (verify.py). With float32's table an
element 0.7% off fails unless it is below 1/23 of the scale (where 0.7% of it is within that noise):
below rms/23 and below max|r|/230, however large the output's maximum is.

**The reference's noise** (`noise`, per element, broadcast to the output's shape; non-finite entries count
as 0). A reference is only as exact as its own rounding: onnxruntime with its graph optimizations on and
off computes the same model in two ways, and where the two runs differ (a QDQ int8 model whose rounding
flips to the neighbouring int8 step, a fused Gelu or LayerNorm summing in another order) another correct
implementation may land anywhere in that spread, so an element may differ from the reference by that much
more. Per element, not per output: an element where onnxruntime agrees with itself keeps the table's
bound, so a wrong value there still fails however noisy other elements are (a per-output maximum would
let one unstable element loosen every other). `ErrorStats` counts the elements that passed only within
the noise (`n_noise_only`) and where it is non-zero (`n_noisy`), and the rule names its maximum.

Where the reference is NaN or +/-inf the actual value must be the same (NaN == NaN); a NaN or inf where the
reference is finite, or a finite value where it is not, is an element off. Integer and bool outputs must
match exactly, or within the noise (a quantized output one step off where onnxruntime's own runs are one
step apart). A shape mismatch fails and names both shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["TOLERANCES", "Tolerance", "ErrorStats", "Worst", "tolerance", "error_stats", "output_scale",
           "PEAK_FRACTION"]


@dataclass(frozen=True)
class Tolerance:
    rtol: float  # relative to each element's |reference|
    atol: float  # absolute, times the output's scale (output_scale: max(rms, max|r| / 10))


#: rtol: per element, from BN folding and different summation orders (~1e-6 per layer over 50+ layers).
#: atol (times the output's scale): the rounding noise at the output's scale, see the module docstring. float16 /
#: bfloat16: atol = rtol (~10 and ~6 ulps): a K-term sum accumulated in fp16 (TVM) against one accumulated
#: in float32 (onnxruntime) differs by ~sqrt(K) half-ulps of the partial sums; at atol 1e-3 a 72-term fp16
#: conv failed on elements 40x below the output's rms. bfloat16 keeps 8 significant bits (float16 11): one ulp
#: is 2^-7 = 0.8% relative against float16's 0.1%, so its row is 5x float16's (~6 of its ulps).
TOLERANCES = {
    "float32": Tolerance(rtol=1e-4, atol=3e-4),
    "float16": Tolerance(rtol=1e-2, atol=1e-2),
    "bfloat16": Tolerance(rtol=5e-2, atol=5e-2),
    "float64": Tolerance(rtol=1e-9, atol=1e-9),
}
EXACT = Tolerance(rtol=0.0, atol=0.0)
#: the output's scale is max(rms, PEAK_FRACTION * max|r|): a sparse output is judged against its largest values
PEAK_FRACTION = 0.1


def tolerance(dtype) -> Tolerance:
    """The tolerance for outputs of `dtype` (exact for integer and bool dtypes)."""
    return TOLERANCES.get(str(np.dtype(dtype)) if not isinstance(dtype, str) else dtype, EXACT)


def output_scale(finite_reference: np.ndarray) -> tuple[float, str]:
    """(scale, what it is) for an output's finite reference values: max(rms, max|r| / 10), 1 when all are 0."""
    r = np.asarray(finite_reference, dtype=np.float64)
    if not r.size:
        return 1.0, "1 (no finite reference value)"
    rms, peak = float(np.sqrt(np.mean(r * r))), float(np.abs(r).max())
    if rms == 0:
        return 1.0, "1 (the reference is all 0)"
    if PEAK_FRACTION * peak > rms:
        return PEAK_FRACTION * peak, f"max|r|/{1 / PEAK_FRACTION:g}"
    return rms, "rms(r)"


@dataclass(frozen=True)
class Worst:
    """The element furthest over (or closest to) its allowed error."""

    index: tuple[int, ...]
    actual: float
    reference: float
    allowed: float  # atol_eff + rtol * |reference| (+ the reference's noise) at this element

    def __str__(self) -> str:
        return f"at {list(self.index)}: {self.actual:.7g} vs reference {self.reference:.7g}"


@dataclass(frozen=True)
class ErrorStats:
    ok: bool
    size: int  # elements compared
    n_bad: int  # elements over their allowed error (or with mismatching NaN/inf)
    max_abs: float  # max |actual - reference| over positions where both are finite
    max_rel: float  # max_abs / max|reference| (display only; the verdict is per element)
    dtype: str  # the reference's dtype: the one that chose the tolerance
    tol: Tolerance
    atol_eff: float  # tol.atol * scale
    worst: Worst | None = None
    reason: str = ""  # set when nothing could be compared element by element (shape mismatch)
    scale_of: str = "rms(r)"  # what the scale is: "rms(r)", "max|r|/10" or "1 (...)"
    noise: float | None = None  # the largest reference noise of the output (None: no noise was given)
    n_noisy: int = 0  # elements where the reference's noise is not 0
    n_noise_only: int = 0  # elements over the table's bound that pass within the reference's noise

    @property
    def bound(self) -> float:
        """The allowed error at the worst element (atol_eff when there is none)."""
        return self.worst.allowed if self.worst else self.atol_eff

    def rule(self) -> str:
        noise = f" + noise (max {self.noise:.3g} at {self.n_noisy} elements)" if self.noise else ""
        if self.tol == EXACT:
            return f"{self.dtype}: exact" + (f", or within the{noise[2:]}" if noise else "")
        return f"{self.dtype}: |a - r| <= {self.atol_eff:.3g} + {self.tol.rtol:g} * |r|{noise}"

    def noise_note(self) -> str:
        """How much the reference's own noise was needed: '' when it was not."""
        if not self.n_noise_only:
            return ""
        return f"{self.n_noise_only} within the reference's noise only"

    def worst_element(self) -> str:
        """`[i, j]: actual vs reference actual` for a table cell (or the shape mismatch)."""
        if self.reason:
            return self.reason
        return f"{list(self.worst.index)}: {self.worst.actual:.7g} vs {self.worst.reference:.7g}" if self.worst else "-"

    def describe(self) -> str:
        """One line: how many elements are off and the worst one, or why nothing was compared."""
        if self.reason:
            return self.reason
        note = f", {self.noise_note()}" if self.noise_note() else ""
        head = f"{self.n_bad} of {self.size} elements off{note} ({self.rule()})"
        return head + (f"; worst {self.worst}" if self.worst is not None else "")


def _shape_failure(actual, reference) -> ErrorStats:
    dtype = str(reference.dtype)
    tol = tolerance(reference.dtype)
    why = f"shape {tuple(actual.shape)} vs reference shape {tuple(reference.shape)}"
    return ErrorStats(False, int(reference.size), int(reference.size), float("inf"), float("inf"), dtype, tol,
                      tol.atol, None, why)


def error_stats(actual, reference, dtype=None, noise=None) -> ErrorStats:
    """Judge `actual` against `reference` element by element (see the module docstring).

    `dtype`: whose tolerance applies (default: the reference's), e.g. the model's output dtype when the
    reference is another build that computed in a wider type. Mixed dtypes are compared in float64.
    `noise`: the reference's own uncertainty per element (an array broadcastable to its shape, or a number),
    e.g. |onnxruntime optimized - onnxruntime as written| (reference.reference_noise); added to the bound."""
    actual, reference = np.asarray(actual), np.asarray(reference)
    if dtype is None and reference.dtype.name == "bfloat16":
        dtype = "bfloat16"
    actual, reference = _widen_bfloat16(actual), _widen_bfloat16(reference)
    if actual.shape != reference.shape:
        return _shape_failure(actual, reference)
    dtype = dtype if isinstance(dtype, str) else str(np.dtype(dtype if dtype is not None else reference.dtype))
    tol = tolerance(dtype)
    if reference.size == 0:
        return ErrorStats(True, 0, 0, 0.0, 0.0, dtype, tol, tol.atol)
    spread = _noise(noise, reference.shape)
    exact = tol == EXACT
    # complex and object arrays are outside the table: compare them exactly as well
    a = actual.astype(np.float64) if actual.dtype.kind in "biuf" else actual
    r = reference.astype(np.float64) if reference.dtype.kind in "biuf" else reference
    scale_of = "rms(r)"
    if exact or a.dtype.kind not in "f" or r.dtype.kind not in "f":
        equal = (a == r) | (_isnan(a) & _isnan(r))
        diff = np.abs(a - r) if a.dtype.kind == "f" and r.dtype.kind == "f" else (~equal).astype(np.float64)
        base = np.zeros(r.shape)
        atol_eff = 0.0
        finite = np.isfinite(diff)
        over = ~equal
    else:
        fin_r, fin_a = np.isfinite(r), np.isfinite(a)
        scale, scale_of = output_scale(r[fin_r])
        atol_eff = tol.atol * scale
        finite = fin_r & fin_a
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.where(finite, np.abs(a - r), 0.0)
            base = atol_eff + tol.rtol * np.where(fin_r, np.abs(r), 0.0)
        same_nonfinite = ~fin_r & ~fin_a & ((a == r) | (np.isnan(a) & np.isnan(r)))
        over = (finite & (diff > base)) | (fin_r != fin_a) | (~fin_r & ~fin_a & ~same_nonfinite)
    allowed = base if spread is None else base + spread
    bad = over if spread is None else over & ~(finite & (diff <= allowed))
    n_bad = int(bad.sum())
    max_abs = float(diff[finite].max()) if finite.any() else 0.0
    peak = float(np.abs(r[np.isfinite(r)]).max()) if np.isfinite(r).any() else 0.0
    worst = _worst(a, r, diff, allowed, bad, finite)
    noisy = {} if spread is None else {"noise": float(spread.max()), "n_noisy": int((spread > 0).sum()),
                                       "n_noise_only": int((over & ~bad).sum())}
    return ErrorStats(n_bad == 0, int(r.size), n_bad, max_abs, max_abs / peak if peak else max_abs, dtype, tol,
                      atol_eff, worst, scale_of=scale_of, **noisy)


def _noise(noise, shape) -> np.ndarray | None:
    """The reference's noise as non-negative float64 of `shape` (NaN / inf count as 0); None stays None."""
    if noise is None:
        return None
    spread = np.abs(_widen_bfloat16(np.asarray(noise)).astype(np.float64))
    try:
        spread = np.broadcast_to(spread, shape)
    except ValueError:
        raise ValueError(f"noise of shape {spread.shape} does not broadcast to the reference's {tuple(shape)}") from None
    return np.where(np.isfinite(spread), spread, 0.0)


def _widen_bfloat16(x: np.ndarray) -> np.ndarray:
    """ml_dtypes' bfloat16 (NumPy kind "V", which the float arithmetic below does not take) as float32: exact."""
    return x.astype(np.float32) if x.dtype.name == "bfloat16" else x


def _isnan(x: np.ndarray) -> np.ndarray:
    return np.isnan(x) if x.dtype.kind == "f" else np.zeros(x.shape, bool)


def _worst(a, r, diff, allowed, bad, finite) -> Worst:
    """The first bad element that is not finite where it should be, else the largest diff / allowed."""
    mismatch = bad & ~finite
    if mismatch.any():
        flat = int(np.flatnonzero(mismatch.ravel())[0])
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(finite, diff / np.where(allowed > 0, allowed, 1.0), 0.0)
            ratio = np.where(finite & (allowed == 0) & (diff > 0), np.inf, ratio)
        flat = int(np.argmax(ratio.ravel()))
    index = tuple(int(i) for i in np.unravel_index(flat, r.shape))
    return Worst(index, float(a.ravel()[flat]), float(r.ravel()[flat]), float(allowed.ravel()[flat]))
