"""conv2d with its folded affine epilogue, then a 2-D pool of its output, as one kernel (NCHW / OIHW):

    epilogue[n, o, y, x] = act(conv(x, W')[n, o, y, x] + b'[o])        (schedules/conv2d.py, unchanged)
    max:     out[n, o, p, q] = max_{r, s} epilogue[n, o, p*sh - pt + r, q*sw - pl + s]   (taps in the plane)
    average: out[n, o, p, q] = sum_{r, s} epilogue[...] / count(p, q)                     (onnxruntime's count)
    global:  out[n, o, (0, 0)] = sum_{y, x} epilogue[n, o, y, x] / (H * W)               (GlobalAveragePool)

The average's count is onnxruntime's: the window clipped to the padded plane, then (count_include_pad=0)
to the real one. The output size comes from the matched op (`pool_out`: ceil mode is in it), so a window
past the padded plane is clipped the same way. Taps outside the plane add nothing to an average; a max
reads the nearest pixel of the plane instead, which is in the same window (every window holds a pixel of
the plane: padding is smaller than the window, and a ceil-mode window starts inside), so the max is the same
with no branch per tap. Half tensors (float16, bfloat16): the epilogue rounds to the tensor dtype as the conv
kernel does, the average sums in float32 and rounds once (a max is exact in any dtype).

The stages keep the conv's names (`pad`, `conv`, `epilogue`) so its schedules apply, then `pool` (the
max, or the window / plane sum) and, for the averages, `out` (the division).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm_fusion._tvm import te, tirx
from tvm_fusion.precision import accumulator_dtype, cast_to
from tvm_fusion.registry import register_compute

from . import dims
from .conv2d import conv2d_affine

POOL_FAMILY = "conv2d_affine_pool"  # the compute every conv_pool rule lowers to
POOL_KINDS = ("max", "avg", "global")
CONV_ATTRS = ("strides", "padding", "dilation", "groups", "activation", "activation_params")


@dataclass(frozen=True)
class PoolWindow:
    """A pool as the kernel computes it: `kind` one of POOL_KINDS; `size`, `strides`, `padding` (top, left,
    bottom, right) and `out` (rows, columns) of the window pools; `keepdims` of a global pool."""
    kind: str
    size: tuple = (1, 1)
    strides: tuple = (1, 1)
    padding: tuple = (0, 0, 0, 0)
    out: tuple = (1, 1)
    count_include_pad: bool = False
    keepdims: bool = True

    @classmethod
    def of(cls, attrs: dict) -> "PoolWindow":
        """From a lowering's attrs (`pool_kind`, `pool_size`, ...)."""
        return cls(attrs["pool_kind"], tuple(attrs.get("pool_size", (1, 1))), tuple(attrs.get("pool_strides", (1, 1))),
                   tuple(attrs.get("pool_padding", (0, 0, 0, 0))), tuple(attrs.get("pool_out", (1, 1))),
                   bool(attrs.get("count_include_pad", False)), bool(attrs.get("keepdims", True)))

    def needs_guard(self, h: int, w: int) -> bool:
        """Whether some window reads past the plane (padding, or a ceil-mode last window)."""
        (kh, kw), (sh, sw), (pt, pl, _, _), (oh, ow) = self.size, self.strides, self.padding, self.out
        return pt > 0 or pl > 0 or (oh - 1) * sh - pt + kh > h or (ow - 1) * sw - pl + kw > w

    def recomputed(self) -> float:
        """The share of the conv outputs a window pool reads more than once (overlapping windows): the
        windows' taps over the distinct pixels they read, less one; 0 for strides as large as the window."""
        (kh, kw), (sh, sw) = self.size, self.strides
        return max(kh / sh, 1.0) * max(kw / sw, 1.0) - 1.0


def pool_stage(epi, window: PoolWindow, out_dtype: str):
    """The pool of `epi` [n, o, H, W] as `window` says: the `pool` stage and, for the averages, `out`."""
    n, c, h, w = dims(epi.shape)
    acc = accumulator_dtype(out_dtype)
    if window.kind == "global":
        rh, rw = te.reduce_axis((0, h), name="ph"), te.reduce_axis((0, w), name="pw")
        pool = te.compute((n, c), lambda i, o: te.sum(cast_to(epi[i, o, rh, rw], acc), axis=[rh, rw]), name="pool")
        count = tirx.const(float(h * w), acc)
        shape = (n, c, 1, 1) if window.keepdims else (n, c)
        return te.compute(shape, lambda i, o, *_: cast_to(pool[i, o] / count, out_dtype), name="out")
    (kh, kw), (sh, sw), (pt, pl, _, _), (oh, ow) = window.size, window.strides, window.padding, window.out
    rh, rw = te.reduce_axis((0, kh), name="ph"), te.reduce_axis((0, kw), name="pw")
    guard = window.needs_guard(h, w)

    def tap(i, o, p, q, empty):
        y, x = p * sh - pt + rh, q * sw - pl + rw
        if not guard:
            return cast_to(epi[i, o, y, x], acc) if window.kind == "avg" else epi[i, o, y, x]
        if window.kind == "max":  # a tap past the plane reads the nearest one in it, also in the window: the same max
            return epi[i, o, tirx.max(tirx.min(y, h - 1), 0), tirx.max(tirx.min(x, w - 1), 0)]
        inside = tirx.all(y >= 0, y < h, x >= 0, x < w)
        return tirx.if_then_else(inside, cast_to(epi[i, o, y, x], acc), empty)

    if window.kind == "max":
        return te.compute((n, c, oh, ow), lambda i, o, p, q: te.max(tap(i, o, p, q, None), axis=[rh, rw]),
                          name="pool")
    zero = tirx.const(0, acc)
    pool = te.compute((n, c, oh, ow), lambda i, o, p, q: te.sum(tap(i, o, p, q, zero), axis=[rh, rw]), name="pool")
    return te.compute((n, c, oh, ow), lambda i, o, p, q: cast_to(pool[i, o, p, q] / _count(window, h, w, p, q, acc),
                                                                 out_dtype), name="out")


def _count(window: PoolWindow, h: int, w: int, p, q, acc):
    """onnxruntime's divisor of the average at output (p, q): the window clipped to the padded plane, then
    (count_include_pad=0) to the real one."""
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = window.size, window.strides, window.padding
    if not window.needs_guard(h, w):
        return tirx.const(float(kh * kw), acc)

    def extent(at, k, size, lo, hi):
        start = at - lo
        end = tirx.min(start + k, size + hi)
        if window.count_include_pad:
            return end - start
        return tirx.min(end, size) - tirx.max(start, 0)

    rows, cols = extent(p * sh, kh, h, pt, pb), extent(q * sw, kw, w, pl, pr)
    return tirx.Cast(acc, rows * cols)


def split_attrs(attrs: dict) -> tuple[dict, PoolWindow]:
    """A lowering's attrs as (the conv's, the pool's window)."""
    return {k: attrs[k] for k in CONV_ATTRS if k in attrs}, PoolWindow.of(attrs)


@register_compute(POOL_FAMILY)
def conv2d_pool(x, w, b, *, fast_math=True, target=None, **attrs):
    """The conv family's compute (`conv2d_affine`), then `pool_stage` of its epilogue."""
    conv_attrs, window = split_attrs(attrs)
    epi = conv2d_affine(x, w, b, **conv_attrs, fast_math=fast_math, target=target)
    return pool_stage(epi, window, x.dtype)
