"""conv2d with a folded affine epilogue, NCHW / OIHW:

    out[n, o, h, w] = act( sum_{c, r, s} pad(x)[n, g*C/G + c, h*sh + r*dh, w*sw + s*dw] * W'[o, c, r, s]
                           + b'[o] (+ residual[n, o, h, w]) )

Half tensors (float16, bfloat16) are widened to float32 before the products are summed; the epilogue runs in
float32 on a float32 bias and the output is rounded once (tvm_fusion.precision). Registered under every
conv rule name. The stages are named for the schedules: `pad`, `conv`, `epilogue`.
"""

from __future__ import annotations

from tvm_fusion._tvm import te, tirx
from tvm_fusion.precision import accumulator_dtype, cast_to
from tvm_fusion.registry import register_compute

from .activations import apply_activation

CONV_FAMILY = "conv2d_affine"  # the compute every conv rule without a compute of its own lowers to
CONV_RULES = (
    CONV_FAMILY,
    "conv2d_bn_add_relu",
    "conv2d_bn_relu",
    "conv2d_bn",
    "conv2d_bias_relu",
    "conv2d_relu",
    "conv2d_bias",
)


def conv2d_out_size(size, k, stride, pad_lo, pad_hi, dilation):
    return (size + pad_lo + pad_hi - dilation * (k - 1) - 1) // stride + 1


@register_compute(*CONV_RULES)
def conv2d_affine(x, w, b, residual=None, *, strides, padding, dilation, groups,
                  activation=None, activation_params=None, **_):
    n, cin, hin, win = (int(d) for d in x.shape)
    cout, cpg, kh, kw = (int(d) for d in w.shape)
    sh, sw = strides
    pt, pl, pb, pr = padding
    dh, dw = dilation
    hout = conv2d_out_size(hin, kh, sh, pt, pb, dh)
    wout = conv2d_out_size(win, kw, sw, pl, pr, dw)
    opg = cout // groups
    acc = accumulator_dtype(x.dtype)

    def wide(v):
        return cast_to(v, acc)
    if any((pt, pl, pb, pr)):
        pad = te.compute(
            (n, cin, hin + pt + pb, win + pl + pr),
            lambda i, c, h, ww: tirx.if_then_else(
                tirx.all(h >= pt, h < hin + pt, ww >= pl, ww < win + pl),
                x[i, c, h - pt, ww - pl], tirx.const(0, x.dtype)),
            name="pad",
        )
    else:
        pad = x
    rc = te.reduce_axis((0, cpg), name="rc")
    rh = te.reduce_axis((0, kh), name="rh")
    rw = te.reduce_axis((0, kw), name="rw")
    if groups == 1:
        conv = te.compute(
            (n, cout, hout, wout),
            lambda i, o, h, ww: te.sum(wide(pad[i, rc, h * sh + rh * dh, ww * sw + rw * dw]) * wide(w[o, rc, rh, rw]),
                                       axis=[rc, rh, rw]),
            name="conv",
        )
    else:
        conv = te.compute(
            (n, cout, hout, wout),
            lambda i, o, h, ww: te.sum(
                wide(pad[i, (o // opg) * cpg + rc, h * sh + rh * dh, ww * sw + rw * dw]) * wide(w[o, rc, rh, rw]),
                axis=[rc, rh, rw]),
            name="conv",
        )

    def epilogue(i, o, h, ww):
        v = conv[i, o, h, ww] + wide(b[o])
        if residual is not None:
            v = v + wide(residual[i, o, h, ww])
        v = apply_activation(v, activation, activation_params)
        return cast_to(v, x.dtype)

    return te.compute((n, cout, hout, wout), epilogue, name="epilogue")
