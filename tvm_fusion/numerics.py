"""Numeric verdicts: the dtype tolerance table and the element-wise error measure.

A leaf module (numpy only): `compare`, the per-group check, compile's verify step and the tests all judge
with it, so a verdict means the same everywhere. In the style of `numpy.allclose`, every element must hold

    |actual - reference| <= atol * scale + rtol * |reference|,   scale = rms(finite reference)  (1 if 0)

with (rtol, atol) from TOLERANCES, keyed by the *reference's* dtype (an fp16 model is judged as fp16).
atol is scaled by the output's typical magnitude (its root mean square) because an element that is near zero
after cancellation carries the rounding noise of the whole computation at the output's scale, not at its
own: between TVM (unfused, no rule of ours involved) and onnxruntime the logits of ResNet-50 differ by up
to 8e-5 * rms (Inception v2 3.5e-5, the light models <= 1e-5), so float32's atol is 3e-4, about 4x that.
The rms, not the max, keeps one large outlier from loosening the bound of every other element, and the
scale is the output's own, never clamped to 1: a softmax whose values are ~1e-3 gets an atol of ~3e-7, not
3e-4 (which would let its typical element be 30% off). With
float32's table an element 0.7% off fails unless it is below 1/23 of the output's rms (where 0.7% of it is
within that noise), however large the output's maximum is.

Where the reference is NaN or +/-inf the actual value must be the same (NaN == NaN); a NaN or inf where the
reference is finite, or a finite value where it is not, is an element off. Integer and bool outputs must
match exactly. A shape mismatch fails and names both shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["TOLERANCES", "Tolerance", "ErrorStats", "Worst", "tolerance", "error_stats"]


@dataclass(frozen=True)
class Tolerance:
    rtol: float  # relative to each element's |reference|
    atol: float  # absolute, times the rms of the output's finite reference values


#: rtol: per element, from BN folding and different summation orders (~1e-6 per layer over 50+ layers).
#: atol (times the output's rms): the rounding noise at the output's scale, see the module docstring. float16 /
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


def tolerance(dtype) -> Tolerance:
    """The tolerance for outputs of `dtype` (exact for integer and bool dtypes)."""
    return TOLERANCES.get(str(np.dtype(dtype)) if not isinstance(dtype, str) else dtype, EXACT)


@dataclass(frozen=True)
class Worst:
    """The element furthest over (or closest to) its allowed error."""

    index: tuple[int, ...]
    actual: float
    reference: float
    allowed: float  # atol_eff + rtol * |reference| at this element

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
    atol_eff: float  # tol.atol * rms(reference) (* 1 when the rms is 0)
    worst: Worst | None = None
    reason: str = ""  # set when nothing could be compared element by element (shape mismatch)

    @property
    def bound(self) -> float:
        """The allowed error at the worst element (atol_eff when there is none)."""
        return self.worst.allowed if self.worst else self.atol_eff

    def rule(self) -> str:
        if self.tol == EXACT:
            return f"{self.dtype}: exact"
        return f"{self.dtype}: |a - r| <= {self.atol_eff:.3g} + {self.tol.rtol:g} * |r|"

    def worst_element(self) -> str:
        """`[i, j]: actual vs reference actual` for a table cell (or the shape mismatch)."""
        if self.reason:
            return self.reason
        return f"{list(self.worst.index)}: {self.worst.actual:.7g} vs {self.worst.reference:.7g}" if self.worst else "-"

    def describe(self) -> str:
        """One line: how many elements are off and the worst one, or why nothing was compared."""
        if self.reason:
            return self.reason
        head = f"{self.n_bad} of {self.size} elements off ({self.rule()})"
        return head + (f"; worst {self.worst}" if self.worst is not None else "")


def _shape_failure(actual, reference) -> ErrorStats:
    dtype = str(reference.dtype)
    tol = tolerance(reference.dtype)
    why = f"shape {tuple(actual.shape)} vs reference shape {tuple(reference.shape)}"
    return ErrorStats(False, int(reference.size), int(reference.size), float("inf"), float("inf"), dtype, tol,
                      tol.atol, None, why)


def error_stats(actual, reference, dtype=None) -> ErrorStats:
    """Judge `actual` against `reference` element by element (see the module docstring).

    `dtype`: whose tolerance applies (default: the reference's), e.g. the model's output dtype when the
    reference is another build that computed in a wider type. Mixed dtypes are compared in float64."""
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
    exact = tol == EXACT
    # complex and object arrays are outside the table: compare them exactly as well
    a = actual.astype(np.float64) if actual.dtype.kind in "biuf" else actual
    r = reference.astype(np.float64) if reference.dtype.kind in "biuf" else reference
    if exact or a.dtype.kind not in "f" or r.dtype.kind not in "f":
        bad = ~((a == r) | (_isnan(a) & _isnan(r)))
        diff = np.abs(a - r) if a.dtype.kind == "f" and r.dtype.kind == "f" else bad.astype(np.float64)
        allowed = np.zeros(r.shape)
        atol_eff = 0.0
        finite = np.isfinite(diff)
    else:
        fin_r, fin_a = np.isfinite(r), np.isfinite(a)
        rf = r[fin_r]
        rms = float(np.sqrt(np.mean(rf * rf))) if rf.size else 0.0
        scale = rms if rms > 0 else 1.0
        atol_eff = tol.atol * scale
        finite = fin_r & fin_a
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.where(finite, np.abs(a - r), 0.0)
            allowed = atol_eff + tol.rtol * np.where(fin_r, np.abs(r), 0.0)
        same_nonfinite = ~fin_r & ~fin_a & ((a == r) | (np.isnan(a) & np.isnan(r)))
        bad = (finite & (diff > allowed)) | (fin_r != fin_a) | (~fin_r & ~fin_a & ~same_nonfinite)
    n_bad = int(bad.sum())
    max_abs = float(diff[finite].max()) if finite.any() else 0.0
    peak = float(np.abs(r[np.isfinite(r)]).max()) if np.isfinite(r).any() else 0.0
    worst = _worst(a, r, diff, allowed, bad, finite)
    return ErrorStats(n_bad == 0, int(r.size), n_bad, max_abs, max_abs / peak if peak else max_abs, dtype, tol,
                      atol_eff, worst)


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
