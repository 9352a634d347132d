"""conv3d with a folded affine epilogue, NCDHW / OIDHW: the conv2d family's compute with a depth axis.

    out[n, o, d, h, w] = act( sum_{c, q, r, s} pad(x)[n, g*C/G + c, d*sd + q*dd, h*sh + r*dh, w*sw + s*dw]
                                                * W'[o, c, q, r, s] + b'[o] (+ residual[n, o, d, h, w]) )

The stages and rules of `schedules/conv2d.py`: `pad`, `weight` (only when a target pads the output channels),
`conv`, `epilogue` (its `affine_epilogue`: bias, residual, activation, in float32 for half tensors, rounded
once). `out_padding` (a `ConvPadding`) pads each group's output channels, rows and columns to a target's tile
(the depth is never padded: a tile is one output plane deep); the epilogue reads back the real outputs only.
W may come packed by `pack_channel_blocks(..., taps_first=True)`: Wp[o // B, q, r, s, c, o % B] (6-D), the
order of a reduction that runs the input channels innermost.
"""

from __future__ import annotations

from tvm_fusion._tvm import te, tirx
from tvm_fusion.precision import accumulator_dtype, cast_to
from tvm_fusion.registry import register_compute

from . import dims
from .conv2d import ConvPadding, affine_epilogue, conv2d_out_size

CONV3D_FAMILY = "conv3d_affine"  # the compute every conv rule lowers a conv3d to


def conv3d_taps(w_shape) -> tuple[int, int, int, int]:
    """(C/G, KD, KH, KW) of a W in OIDHW or packed taps first (6-D: [O'/B, KD, KH, KW, C/G, B])."""
    d = [int(v) for v in w_shape]
    return (d[4], d[1], d[2], d[3]) if len(d) == 6 else (d[1], d[2], d[3], d[4])


def conv3d_out_sizes(in_sizes, taps, strides, padding, dilation) -> tuple[int, int, int]:
    """(D', H', W') of a conv3d: `padding` is (front, top, left, back, bottom, right), as Relax writes it."""
    return tuple(conv2d_out_size(int(in_sizes[i]), int(taps[i]), int(strides[i]), int(padding[i]),
                                 int(padding[i + 3]), int(dilation[i])) for i in range(3))


@register_compute(CONV3D_FAMILY)
def conv3d_affine(x, w, b, residual=None, *, strides, padding, dilation, groups, activation=None,
                  activation_params=None, residual_after_activation=False, fast_math=True, target=None, **_):
    return conv3d_padded(x, w, b, residual, strides=strides, padding=padding, dilation=dilation, groups=groups,
                         activation=activation, activation_params=activation_params,
                         residual_after_activation=residual_after_activation, fast_math=fast_math, target=target)


def _padded_input(x, padding, sizes):
    """The `pad` stage: x with zeros around it, `sizes` (D, H, W) long (at least the padded input), or x itself."""
    _, _, din, hin, win = dims(x.shape)
    pf, pt, pl = (int(v) for v in padding[:3])
    if tuple(sizes) == (din, hin, win):
        return x
    return te.compute(
        (*x.shape[:2], *sizes),
        lambda i, c, d, h, ww: tirx.if_then_else(
            tirx.all(d >= pf, d < din + pf, h >= pt, h < hin + pt, ww >= pl, ww < win + pl),
            x[i, c, d - pf, h - pt, ww - pl], tirx.const(0, x.dtype)),
        name="pad")


def _weight_reader(w, groups: int, opg: int, gp: int):
    """weight_at(o, c, q, r, s) over the padded output channels: W packed (6-D), W with zero rows for the padded
    channels (the `weight` stage), or W as it is."""
    if len(w.shape) == 6:
        blk = int(w.shape[5])
        return lambda o, c, q, r, s: w[o // blk, q, r, s, c, o % blk]
    if gp != opg:
        weight = te.compute(
            (groups * gp, *w.shape[1:]),
            lambda o, c, q, r, s: tirx.if_then_else(o % gp < opg, w[o // gp * opg + o % gp, c, q, r, s],
                                                    tirx.const(0, w.dtype)),
            name="weight")
        return lambda o, c, q, r, s: weight[o, c, q, r, s]
    return lambda o, c, q, r, s: w[o, c, q, r, s]


def conv3d_padded(x, w, b, residual=None, *, strides, padding, dilation, groups, activation=None,
                  activation_params=None, residual_after_activation=False, fast_math=True, target=None,
                  out_padding: ConvPadding | None = None):
    n, cin, din, hin, win = dims(x.shape)  # n may be a symbolic batch
    cout = int(b.shape[0])
    cpg, kd, kh, kw = conv3d_taps(w.shape)
    sd, sh, sw = (int(v) for v in strides)
    dd, dh, dw = (int(v) for v in dilation)
    dout, hout, wout = conv3d_out_sizes((din, hin, win), (kd, kh, kw), strides, padding, dilation)
    opg = cout // groups
    p = out_padding or ConvPadding(opg, hout, wout)
    if len(w.shape) == 6 and (int(w.shape[5]), int(w.shape[0]) * int(w.shape[5])) != (p.channel_block,
                                                                                       groups * p.group_channels):
        raise ValueError(f"conv3d: W packed in blocks of {int(w.shape[5])} channels ({tuple(w.shape)}) does not "
                         f"match the output tile: {groups} groups x {p.group_channels} channels in blocks of "
                         f"{p.channel_block}")
    pads = [int(v) for v in padding]
    sizes = (din + pads[0] + pads[3],  # the padded output's rows and columns read zeros past the real input
             max(hin + pads[1] + pads[4], (p.rows - 1) * sh + (kh - 1) * dh + 1),
             max(win + pads[2] + pads[5], (p.cols - 1) * sw + (kw - 1) * dw + 1))
    pad = _padded_input(x, padding, sizes)
    gp = p.group_channels
    weight_at = _weight_reader(w, groups, opg, gp)
    acc = accumulator_dtype(x.dtype)
    rc, rd, rh, rw = (te.reduce_axis((0, e), name=nm) for e, nm in ((cpg, "rc"), (kd, "rd"), (kh, "rh"), (kw, "rw")))
    if groups == 1:
        channel = lambda o: rc  # noqa: E731
    else:  # o // gp is constant over a block of channel_block channels (a divisor of gp)
        blk = max(p.channel_block, 1)
        channel = lambda o: (o // blk * blk) // gp * cpg + rc  # noqa: E731

    def product(i, o, d, h, ww):
        xv = pad[i, channel(o), d * sd + rd * dd, h * sh + rh * dh, ww * sw + rw * dw]
        return cast_to(xv, acc) * cast_to(weight_at(o, rc, rd, rh, rw), acc)

    conv = te.compute((n, groups * gp, dout, p.rows, p.cols),
                      lambda i, o, d, h, ww: te.sum(product(i, o, d, h, ww), axis=[rc, rd, rh, rw]), name="conv")

    def conv_value(i, o, d, h, ww):  # the padded channel of real channel o
        return conv[i, o if gp == opg or groups == 1 else o // opg * gp + o % opg, d, h, ww]

    return affine_epilogue((n, cout, dout, hout, wout), conv_value, b, residual, x.dtype, activation=activation,
                           activation_params=activation_params, residual_after_activation=residual_after_activation,
                           fast_math=fast_math, target=target)
