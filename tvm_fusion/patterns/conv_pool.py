"""conv2d -> [add bias] -> [batch_norm] -> [activation] -> MaxPool | AveragePool | GlobalAveragePool  ==>  one kernel.

    conv2d_bn_relu_pool(x, W', b'; pool)  =  pool(relu(conv2d(x, W') + b'))

The conv part is the conv family's (patterns/conv_epilogue.py: its patterns, checks and BatchNorm fold,
reused as they are); the pool is `relax.nn.max_pool2d`, `relax.nn.avg_pool2d` (windows of 2x2 or 3x3,
strides 1 or 2, any padding smaller than the window, ceil mode, count_include_pad) or GlobalAveragePool
(the importer's `relax.mean` over axes [2, 3], kept or not). The conv's output never goes through memory:
the CPU kernel pools each parallel task's block of output channels over the whole plane while it is in
cache, so no window crosses a task (no halo to recompute); the CUDA kernel computes each block's conv
rows of its pool tile into shared memory, recomputing the halo rows and columns that neighbouring tiles
share (schedules/llvm/conv_pool.py, schedules/cuda/conv_pool.py: their plans say which, and decline the
shapes where the fused kernel measured slower than the two kernels it replaces).

Declines with the values found: a conv output (or its epilogue's) with a second consumer or that is a graph
output (the generic check), a conv1d / conv3d, a pool of another layout, dilation, window, stride or padding,
a global mean over other axes, and whatever the conv family declines (dtype, layout, symbolic shapes).
Rule names: `conv2d[_bn][_<act>]_pool` (the bias is optional in each), priorities above every conv rule
(patterns/priority.py), so the longer chain wins.
"""

from __future__ import annotations

import dataclasses

from tvm_fusion._tvm import dpl
from tvm_fusion.patterns.activations import BY_RANK
from tvm_fusion.patterns.conv_epilogue import conv_checks, conv_epilogue
from tvm_fusion.patterns.priority import priority
from tvm_fusion.rules import Lowering, Match, Spec, decline, rule, shape_text
from tvm_fusion.schedules.conv_pool import POOL_FAMILY

WINDOWS = (2, 3)  # pool window sizes (rows and columns) the kernel takes
STRIDES = (1, 2)
POOL_OPS = {"relax.nn.max_pool2d": "max", "relax.nn.avg_pool2d": "avg", "relax.mean": "global"}


def _epilogue_view(m: Match) -> Match:
    """The match as the conv family's checks and lowering see it: its root the epilogue's output."""
    return Match(m.rule, {**m._exprs, "root": m["epilogue"]}, m._var2val, m.batch_dims)  # noqa: SLF001


def conv_pool_pattern(bn: bool, activation: str | None) -> Spec:
    conv = conv_epilogue(bn=bn, activation=activation)  # bias optional
    y = conv.pattern
    pool = dpl.is_op("relax.nn.max_pool2d")(y) | dpl.is_op("relax.nn.avg_pool2d")(y) | dpl.is_op("relax.mean")(y)
    ann = {**conv.annotations, "epilogue": y, "pool": pool, "root": pool}

    def check(m: Match):
        view = _epilogue_view(m)
        return conv.check(view) or conv_checks(view) or pool_checks(m)

    def lower(m: Match) -> Lowering:
        lowering = conv.lower(_epilogue_view(m))
        return dataclasses.replace(lowering, compute=POOL_FAMILY, attrs={**lowering.attrs, **pool_attrs(m)},
                                   out_shape=None)

    return Spec(pool, ann, lower, check)


def pool_kind(m: Match) -> str:
    return POOL_OPS[m.value("pool").op.name]


def pool_checks(m: Match):
    """Declines a pool the kernel does not compute, with the values found."""
    conv_op = m.value("conv").op.name
    if conv_op != "relax.nn.conv2d":
        return decline(f"the pool follows a {conv_op.rsplit('.', 1)[-1]}; the fused kernel takes a conv2d")
    kind, attrs, shape = pool_kind(m), m.attrs("pool"), m.shape("epilogue")
    if kind == "global":
        axes = sorted(int(a) % 4 for a in attrs.axis) if attrs.axis is not None else [0, 1, 2, 3]
        if axes != [2, 3]:
            return decline(f"the mean is over axes {axes}; the fused kernel takes a global pool over [2, 3]")
        return None
    op = "max_pool2d" if kind == "max" else "avg_pool2d"
    if str(attrs.layout) != "NCHW" or str(attrs.out_layout) not in ("NCHW", ""):
        return decline(f"{op} layout is {attrs.layout}/{attrs.out_layout}; the fused kernel takes NCHW")
    size, strides = [int(v) for v in attrs.pool_size], [int(v) for v in attrs.strides]
    dilation, padding = [int(v) for v in attrs.dilation], [int(v) for v in attrs.padding]
    if any(d != 1 for d in dilation):
        return decline(f"{op} dilation is {dilation}; the fused kernel takes [1, 1]")
    if any(k not in WINDOWS for k in size) or any(s not in STRIDES for s in strides):
        return decline(f"{op} window is {size[0]}x{size[1]} with strides {strides}; the fused kernel takes "
                       f"windows of {' or '.join(map(str, WINDOWS))} with strides {' or '.join(map(str, STRIDES))}")
    if any(p >= k for p, k in zip(padding, size + size)):
        return decline(f"{op} padding {padding} is not smaller than its window {size}")
    out = m.shape("root")
    if out is None or shape is None or len(out) != 4:
        return decline(f"{op} output has shape {shape_text(m['root'])}; expected a static NCHW map")
    return None


def pool_attrs(m: Match) -> dict:
    """The pool's attributes as the compute takes them (schedules/conv_pool.py `PoolWindow.of`)."""
    kind, attrs = pool_kind(m), m.attrs("pool")
    if kind == "global":
        return dict(pool_kind=kind, keepdims=bool(attrs.keepdims))
    out = m.shape("root")
    return dict(pool_kind=kind, pool_size=tuple(int(v) for v in attrs.pool_size),
                pool_strides=tuple(int(v) for v in attrs.strides), pool_padding=tuple(int(v) for v in attrs.padding),
                pool_out=(int(out[2]), int(out[3])), count_include_pad=bool(attrs.count_include_pad))


def _make_rule(bn: bool, activation: str | None):
    prefix = "conv2d_bn" if bn else "conv2d"
    name = "_".join(p for p in (prefix, activation, "pool") if p)
    tier = f"{prefix}_<act>_pool" if activation else f"{prefix}_pool"

    def build():
        return conv_pool_pattern(bn, activation)

    chain = " -> ".join(p for p in ("conv2d -> [add bias]", "batch_norm" if bn else "", activation, "pool") if p)
    build.__doc__ = f"{chain}  ==>  {name}(x, W', b'; max / average / global pool)"
    made = rule(name, priority=priority(tier, activation))(build)
    made.source = __file__
    return made


#: with and without BatchNorm, every activation of the conv family (containing ones first), then none
RULES = [_make_rule(bn, act) for bn in (True, False) for act in [*BY_RANK, None]]
