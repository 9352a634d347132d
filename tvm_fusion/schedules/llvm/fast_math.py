"""Vectorizable float32 exp, sigmoid, erf and tanh for the CPU kernels: exp(x) ==> 2^n * P(r),
erf(x) and tanh(x) ==> P(x) / Q(x).

LLVM lowers a vector `llvm.exp` or an `erf` to one libm call per lane, so a vectorized epilogue with SiLU
(x * sigmoid(x)) or exact GELU spent most of its time in scalar `expf` / `erff` calls: EfficientNet's 1x1
conv + SiLU kernels and ConvNeXt's Gemm + GELU (142 of its 194 us per inference) on an AVX2 host. These
are the same expressions written with arithmetic, floor, shifts and selects, which vectorize:

- exp: Cody-Waite range reduction `x = n ln2 + r` (ln2 split in two, |r| <= ln2 / 2), Cephes' degree-6
  polynomial for e^r, 2^n built in the exponent bits (two factors, so subnormal results and float32's
  largest come out right); past float32's range +inf or 0, NaN stays NaN.
- exp of x <= 0 (`fast_exp_nonpositive`, a softmax's x - max): the same reduction and polynomial, n rounded by
  adding 1.5 * 2^23 (the sum's low mantissa bits are n: no round / convert instructions), 2^n one factor, 0
  below ln(2^-126) (subnormal results flush to 0: an absolute error under 2^-126), r taken from x itself so
  NaN stays NaN without a bit test; -inf gives 0; 1.01 ulps at most where the result is normal (as
  `fast_exp`). PP-OCR-rec's 40 x 6625 softmax on one AVX2 core: 0.38 -> 0.28 ms with it (floor-rounded),
  0.268 -> 0.237 ms more with the rounding by addition.
- sigmoid: (x >= 0 ? 1 : e) / (1 + e) with e = e^-|x| by the exp of x <= 0 below (`fast_sigmoid`).
- erf: Eigen's rational approximation on [-4, 4] (TVM's `fast_erf` too); |error| < 2e-7 everywhere.
- tanh: Eigen's rational approximation on [-7.9, 7.9] (TVM's `fast_tanh` too), +-1 past +-9; <= 5 ulps
  and 3e-7 absolute (TVM's own llvm tanh is two `expf` calls per lane: Magika's GELU chains, 3.4 ms of 15).

A NaN test is written on the bits (`_isnan`): TVM's loop vectorizer has no vector `isnan` and kept the
whole lanes loop scalar around one, so until then only LLVM's own loop vectorizer saved the simplest
loops; a conv epilogue (strided reads of its accumulators) ran its exp one lane at a time.

`activations.KernelMath` (the epilogue activations, the elementwise chains) takes these where the kernel is
built for llvm, may take them (`fast_math_allowed`) and v is float32 (`register_math` below); every other
target and dtype keeps TVM's intrinsic.
"""

from __future__ import annotations

from tvm_fusion._tvm import prim_dtype, te, tirx

from ..activations import register_math

__all__ = ["fast_erf", "fast_exp", "fast_exp_nonpositive", "fast_sigmoid", "fast_tanh"]

_F32 = "float32"
_LOG2E = 1.44269504088896341
_LN2_HI = 0.693359375  # exactly representable: n * _LN2_HI is exact for |n| <= 2^15
_LN2_LO = -2.12194440e-4
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
#: past _X_HI e^x overflows float32 (+inf); below _X_LO it is below half the smallest subnormal (0)
_X_HI, _X_LO = 88.72283935546875, -103.97208404541016
#: ln(2^-126) rounded up to float32: from it on e^x is a normal float32 (2^n one factor, n >= -126)
_X_NORMAL = -87.33654022216797
#: 1.5 * 2^23: v + _ROUNDER rounds v (|v| < 2^22) to an integer held in the sum's low mantissa bits
_ROUNDER = 12582912.0

#: Eigen's rational tanh (TVM's topi.fast_tanh too): odd numerator x^13 ... x^1, even denominator x^6 ... x^0
_TANH_NUM = (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11, 5.12229709037114e-08,
             1.48572235717979e-05, 6.37261928875436e-04, 4.89352455891786e-03)
_TANH_DEN = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03)
_TANH_CLAMP = 7.90531110763549805  # the quotient's input range (it grows past +-1 beyond): 0.99999976 there
_TANH_ONE = 9.0  # past it tanh(x) rounds to +-1 in float32
_TANH_TINY = 0.0004  # below it tanh(x) rounds to x
_ERF_NUM = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
            -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)  # odd: x^13 ... x^1
_ERF_DEN = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
            -1.42647390514189e-02)  # even: x^8 ... x^0


def _c(v):
    return tirx.const(v, _F32)


def _horner(coeffs, x):
    acc = _c(coeffs[0])
    for c in coeffs[1:]:
        acc = acc * x + _c(c)
    return acc


def _pow2(k):
    """2^k for an int32 k in [-126, 127], built in the exponent bits."""
    return tirx.reinterpret(_F32, tirx.shift_left(k + tirx.const(127, "int32"), tirx.const(23, "int32")))


def _isnan(x):
    """x is NaN, from its bits (exponent all ones, mantissa not zero). TVM's vectorizer has no vector form of
    `tirx.isnan` and scalarized the whole loop around one (every lane of a conv + SiLU epilogue then ran the
    exp one at a time), and its simplifier folds `x != x` to false."""
    bits = tirx.bitwise_and(tirx.reinterpret("int32", x), tirx.const(0x7FFFFFFF, "int32"))
    return bits > tirx.const(0x7F800000, "int32")


def _let(value, body, name: str):
    """body(v) with v bound once to `value` (a Let: the expression is not copied into every use)."""
    var = tirx.Var(name, prim_dtype(value))
    return tirx.Let(var, value, body(var))


def fast_exp(x):
    """e^x for a float32 TIR expression, written so that it vectorizes (see the module docstring)."""
    return _let(x, _exp, "x")


def _exp(x):
    def scaled(p, n):  # 2^n as two factors: each a normal float for n in [-150, 128]
        half = tirx.shift_right(n, tirx.const(1, "int32"))
        return p * _pow2(half) * _pow2(n - half)

    y = _exp_parts(te.max(te.min(x, _c(_X_HI)), _c(_X_LO)), scaled)
    y = tirx.Select(x > _c(_X_HI), _c(float("inf")), y)
    y = tirx.Select(x < _c(_X_LO), _c(0.0), y)
    return tirx.Select(_isnan(x), x, y)  # NaN in, NaN out (the clamps above would make it finite)


def _exp_parts(xc, scaled):
    """scaled(e^r, n) for x = n ln2 + r, |r| <= ln2 / 2 (Cody-Waite), e^r by Cephes' polynomial."""
    def with_n(n):
        nf = n.astype(_F32)
        return _let(xc - nf * _c(_LN2_HI) - nf * _c(_LN2_LO), lambda r: scaled(_exp_poly(r), n), "r")

    return _let(tirx.floor(xc * _c(_LOG2E) + _c(0.5)).astype("int32"), with_n, "n")


def _exp_poly(r):
    """e^r for |r| <= ln2 / 2: Cephes' polynomial."""
    return _horner(_EXP_POLY, r) * r * r + r + _c(1.0)


def fast_exp_nonpositive(x):
    """e^x for a float32 TIR expression x <= 0 (a softmax's x - max; NaN and -inf too): `fast_exp` less what
    x > 0 and subnormal results need (module docstring); right to 1.5 ulps down to ln(2^-126), 0 below it."""
    return _let(x, _exp_nonpositive, "x")


def _exp_nonpositive(x):
    # n = round(x / ln2) by the float adder: x log2e + 1.5 * 2^23 holds n in its low mantissa bits (no round /
    # convert instructions), and 2^n is those bits + 127 shifted into the exponent. x below _X_NORMAL (-inf,
    # and where n or the integer bits leave their range) selects 0; NaN runs through r and stays NaN.
    def with_t(t):
        nf = t - _c(_ROUNDER)
        scale = tirx.reinterpret(_F32, tirx.shift_left(tirx.reinterpret("int32", t) + tirx.const(127, "int32"),
                                                       tirx.const(23, "int32")))
        return _let(x - nf * _c(_LN2_HI) - nf * _c(_LN2_LO), lambda r: _exp_poly(r) * scale, "r")

    y = _let(x * _c(_LOG2E) + _c(_ROUNDER), with_t, "t")
    return tirx.Select(x < _c(_X_NORMAL), _c(0.0), y)


def fast_sigmoid(x):
    """sigmoid(x) = 1 / (1 + e^-x) ==> (x >= 0 ? 1 : e) / (1 + e), e = e^-|x| by `fast_exp_nonpositive`: one
    exp of a nonpositive argument (no clamps, one 2^n factor, no NaN bit test), a few ulps everywhere, also
    where sigmoid(x) is tiny (0 below x = ln(2^-126), where it is under 2^-126); NaN stays NaN, +-inf give 1, 0."""
    return _let(x, _sigmoid, "x")


def _sigmoid(x):
    return _let(fast_exp_nonpositive(-te.abs(x)),
                lambda e: tirx.Select(x >= _c(0.0), _c(1.0), e) / (_c(1.0) + e), "e")


def fast_erf(x):
    """erf(x) for a float32 TIR expression: Eigen's rational approximation, x clamped to [-4, 4]."""
    return _let(x, _erf, "x")


def _erf(x):
    xc = te.max(te.min(x, _c(4.0)), _c(-4.0))
    z = _let(xc * xc, lambda z: xc * _horner(_ERF_NUM, z) / _horner(_ERF_DEN, z), "z")
    return tirx.Select(_isnan(x), x, z)


def fast_tanh(x):
    """tanh(x) for a float32 TIR expression: Eigen's rational approximation on x clamped to +-7.9053, x itself
    below 0.0004 in magnitude, +-1 past +-9 (TVM's llvm tanh is two libm `expf` calls per lane)."""
    return _let(x, _tanh, "x")


def _tanh(x):
    xc = te.max(te.min(x, _c(_TANH_CLAMP)), _c(-_TANH_CLAMP))
    q = _let(xc * xc, lambda z: xc * _horner(_TANH_NUM, z) / _horner(_TANH_DEN, z), "z")
    q = tirx.Select(te.abs(x) < _c(_TANH_TINY), x, q)
    q = tirx.Select(x > _c(_TANH_ONE), _c(1.0), tirx.Select(x < _c(-_TANH_ONE), _c(-1.0), q))
    return tirx.Select(_isnan(x), x, q)


register_math("llvm", _F32, exp=fast_exp, sigmoid=fast_sigmoid, erf=fast_erf, tanh=fast_tanh)
