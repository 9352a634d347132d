"""Hypothesis strategy for ONE fused kernel at the sizes real networks run, to reach the plans of the hand CPU
schedules (schedules/llvm/) that the small random graphs of strategies.py never reach:

    kernels()  draws  RandomGraph(model, description, plan)      (strategies.py's Plan, Net and emit functions)

Three kinds, each a Plan that `build_kernel(plan)` replays:

- conv: an NCHW image [1-2 or a symbolic N, 1..300, 1..64, 1..64] (square or not; cin 3 stems, primes,
  non-multiples of 4, 8 and 16), ONE Conv (kernel 1, 3, 5, 7, (1, 7), (7, 1); stride 1-3, also on one axis
  only, (2, 1); asymmetric pads; dilation 1-3, also per axis; groups 1, 2, depthwise (channel multiplier 1 or
  2) or another divisor; cout up to 300, or 1000-1008 classes), then a fusible epilogue: conv bias,
  BatchNorm, an activation in any ONNX form (SiLU, hardswish, clip, GELU ...), a residual add of a second
  graph input (before or after the activation), BN + add + relu;
- pool: MaxPool / AveragePool (kernel 1, 2, 3, 5, stride 1-2, also per axis (CRNN's (2, 2) / (2, 1)), pads
  below the kernel, ceil_mode, count_include_pad) or GlobalAveragePool / GlobalMaxPool;
- dense: [1-4 or a symbolic batch, K] x [K, N] (MatMul or Gemm, K and N up to 2048, odd ones too), or
  [B, S, K] x [K, N] (MatMul, S up to 64), a bias, an activation;

each in float32, or one time in six in float16 and one in six in bfloat16 (`Plan.dtype`: the float32 graph
converted by `testing.as_float16`; a bfloat16 kernel is judged against onnxruntime's float32 run, oracle.py).

The work of a kernel is bounded (MAX_MACS multiply-adds: a few seconds to build and check on one core); a
drawn shape over the bound loses spatial size first, then output channels, then input channels. A symbolic
batch ("N", the input's dim_param; half the time with the upper bound KERNEL_BOUND, `Plan.bound`) stays
symbolic in the builds and is SIZES["N"] in the inputs
(`oracle.check_against_onnxruntime(sizes=SIZES)`).
`plan_family(plan)` names the schedule plan a kernel takes on the current CPU target (conv: `conv_plan`'s
kernel and its options; dense: the packed column tile), computed from the shapes without building.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from tvm_fusion.testing import as_float16

from .strategies import (
    LAYER_KINDS,
    LayerKind,
    Net,
    Plan,
    RandomGraph,
    _fmt,
    draw_act,
    emit_conv,
)

__all__ = ["KERNEL_BOUND", "KERNEL_LAYERS", "MAX_MACS", "SIZES", "build_kernel", "hand_schedule_used", "kernels", "plan_family"]

MAX_MACS = 30_000_000
MAX_CHANNELS = 300
MAX_SPATIAL = 64
MAX_FEATURES = 2048
#: channel counts real networks use and their awkward neighbours (primes, off-by-one of a vector multiple)
CHANNELS = (1, 3, 4, 7, 8, 12, 13, 16, 17, 24, 31, 32, 33, 40, 48, 57, 64, 72, 96, 97, 112, 120, 127, 128,
            144, 160, 192, 211, 240, 255, 256, 288, 300)
CLASSES = (1000, 1001, 1008)
#: feature map sizes of real networks (ResNet, MobileNet, SqueezeNet, YOLO, PP-OCR heights) and neighbours
SPATIAL = (7, 8, 13, 14, 15, 16, 19, 20, 27, 28, 32, 35, 40, 48, 55, 56, 57, 64)
#: the size of a symbolic batch ("N": the input's dim_param, kept symbolic by the builds) in the inputs
SIZES = {"N": 3}
#: the upper bound of a symbolic batch, half the time (`--shape x=N<=64x...`: memory planning sizes by it)
KERNEL_BOUND = 64
KERNEL_SIZES = (1, 1, 3, 3, 3, 5, 7, (1, 7), (7, 1))  # int: square
SEQUENCE = (1, 7, 16, 49, 50, 64)  # tokens of a [B, S, K] dense input
FEATURES = (1, 3, 8, 17, 64, 127, 128, 255, 256, 384, 500, 512, 768, 1000, 1023, 1024, 1280, 2047, 2048)


def _k2(k) -> tuple[int, int]:
    return (k, k) if isinstance(k, int) else tuple(k)


# ---------------------------------------------------------------- layer kinds beyond strategies.py's
def conv_out(shape, cout, k, stride, pads, dilation, **_) -> tuple:
    """strategies.conv_shape where the stride and the dilation may be (h, w) pairs."""
    (kh, kw), (sh, sw), (dh, dw) = _k2(k), _k2(stride), _k2(dilation)
    n, _, h, w = shape
    return (n, cout, (h + pads[0] + pads[2] - dh * (kh - 1) - 1) // sh + 1,
            (w + pads[1] + pads[3] - dw * (kw - 1) - 1) // sw + 1)


def emit_conv_hw(net: Net, cout, k, stride, pads, dilation, groups, bias) -> None:
    """strategies.emit_conv where the stride and the dilation may be (h, w) pairs (PP-OCR's (2, 1) convs)."""
    (sh, sw), (dh, dw), before = _k2(stride), _k2(dilation), net.shape
    emit_conv(net, cout, k, sh, pads, dh, groups, bias)
    for attr in net.g.nodes[-1].attribute:  # GraphBuilder.conv writes one stride and dilation for both axes
        if attr.name in ("strides", "dilations"):
            attr.ints[:] = [sh, sw] if attr.name == "strides" else [dh, dw]
    net.shapes[net.cur] = conv_out(before, cout, k, stride, pads, dilation)


def emit_residual(net: Net, other_first: bool) -> None:
    """Add a second graph input of the current shape (a residual the conv kernel reads)."""
    r = net.g.input(f"r{len(net.inputs)}", list(net.shape))
    net.inputs.append(r)
    net.set(net.g.op("Add", [r, net.cur] if other_first else [net.cur, r]))


def pool_shape(shape, op, k=1, stride=1, pads=(0, 0, 0, 0), ceil_mode=0, **_) -> tuple:
    n, c, h, w = shape
    if op.startswith("Global"):
        return (n, c, 1, 1)

    def out(size, k, stride, lo, hi):
        span = size + lo + hi - k
        o = (-(-span // stride) if ceil_mode else span // stride) + 1
        # ONNX (and torch): with ceil_mode the last window must start inside the input or its left padding
        return o - 1 if ceil_mode and (o - 1) * stride >= size + lo else o

    (kh, kw), (sh, sw) = _k2(k), _k2(stride)
    return (n, c, out(h, kh, sh, pads[0], pads[2]), out(w, kw, sw, pads[1], pads[3]))


def emit_pool(net: Net, op, k=1, stride=1, pads=(0, 0, 0, 0), ceil_mode=0, count_include_pad=0) -> None:
    if op.startswith("Global"):
        y = net.g.op(op, [net.cur])
    else:
        attrs = dict(kernel_shape=list(_k2(k)), strides=list(_k2(stride)), pads=list(pads), ceil_mode=ceil_mode)
        if op == "AveragePool":
            attrs["count_include_pad"] = count_include_pad
        y = net.g.op(op, [net.cur], **attrs)
    net.set(y, pool_shape(net.shape, op, k, stride, pads, ceil_mode))


def _no_draw(draw, net, keep_shape=False):
    raise NotImplementedError("kernels.py draws its plans whole (`kernels`)")


#: strategies.py's layer kinds, a conv with a stride and dilation per axis, and the two more a single kernel
#: needs (never drawn by strategies.onnx_graphs)
KERNEL_LAYERS = {**LAYER_KINDS, "conv": LayerKind(_no_draw, emit_conv_hw, domains=("image",)),
                 "residual": LayerKind(_no_draw, emit_residual),
                 "pool": LayerKind(_no_draw, emit_pool, domains=("image",))}


def build_kernel(plan: Plan) -> RandomGraph:
    """The model of a kernel plan (as strategies.build, with KERNEL_LAYERS), in `plan.dtype` (net.finish); a last
    layer ("half", {}), as older saved plans have, turns it into a float16 model (`testing.as_float16`: its
    weights rounded, its inputs and outputs float16)."""
    net = Net.start(plan.domain, plan.input_shape, plan.seed)
    half = plan.layers[-1][0] == "half"
    for name, params in plan.layers[:-1] if half else plan.layers:
        KERNEL_LAYERS[name].emit(net, **params)
        net.log.append(f"  {name}({_fmt(params)}) -> {net.cur} {list(net.shape)}")
    graph = net.finish(plan)
    if not half:
        return graph
    return RandomGraph(as_float16(graph.model), graph.description.replace("\noutputs:", "\n  float16\noutputs:"),
                       plan)


# ---------------------------------------------------------------- drawing
def _channels(draw, most: int = MAX_CHANNELS) -> int:
    return draw(st.sampled_from([c for c in CHANNELS if c <= most]) | st.integers(1, most))


def _spatial(draw) -> int:
    return draw(st.sampled_from(SPATIAL) | st.integers(1, MAX_SPATIAL))


def conv_macs(shape, cout, k, stride, pads, dilation, groups, **_) -> int:
    n, c, _, _ = shape
    n = SIZES.get(n, n)
    _, _, oh, ow = conv_out(shape, cout, k, stride, pads, dilation)
    kh, kw = _k2(k)
    return n * cout * oh * ow * (c // groups) * kh * kw


def _fit_conv(shape: list, conv: dict) -> None:
    """Shrink the image (then cout, then cin) in place until the conv does at most MAX_MACS multiply-adds."""
    (kh, kw), (dh, dw), p = _k2(conv["k"]), _k2(conv["dilation"]), conv["pads"]
    min_h, min_w = max(1, (kh - 1) * dh + 1 - p[0] - p[2]), max(1, (kw - 1) * dw + 1 - p[1] - p[3])
    while conv_macs(tuple(shape), **conv) > MAX_MACS:
        if shape[2] > min_h or shape[3] > min_w:
            axis = 2 if (shape[2] - min_h >= shape[3] - min_w) else 3
            shape[axis] = max(min_h if axis == 2 else min_w, shape[axis] * 3 // 4)
        elif conv["cout"] > conv["groups"]:
            conv["cout"] = max(conv["groups"], conv["cout"] * 3 // 4 // conv["groups"] * conv["groups"])
        else:  # depthwise / grouped: keep the group structure, fewer groups
            g = conv["groups"]
            per = shape[1] // g
            if g == 1:
                shape[1] = max(1, shape[1] * 3 // 4)
            else:
                g2 = max(1, g * 3 // 4)
                conv["cout"], shape[1], conv["groups"] = conv["cout"] // g * g2, per * g2, g2


@st.composite
def conv_kernels(draw) -> Plan:
    n = draw(st.sampled_from([1, 1, 1, 2, "N"]))
    cin = _channels(draw)  # 3: an image stem
    k = draw(st.sampled_from(KERNEL_SIZES))
    kh, kw = _k2(k)
    dilation = 1 if kh == kw == 1 else draw(st.sampled_from([1, 1, 1, 2, 3]))
    stride = draw(st.sampled_from([1, 1, 2, 2, 3]))
    if stride > 1 and draw(st.integers(0, 4)) == 0:  # one axis strided only (PP-OCR, CRNN: (2, 1))
        stride = draw(st.sampled_from([(stride, 1), (1, stride)]))
    if dilation > 1 and draw(st.integers(0, 4)) == 0:
        dilation = draw(st.sampled_from([(dilation, 1), (1, dilation)]))
    dh, dw = _k2(dilation)
    same = [dh * (kh // 2), dw * (kw // 2)] * 2
    pads = draw(st.sampled_from(["same", "none", "any"]))
    pads = same if pads == "same" else [0] * 4 if pads == "none" else [draw(st.integers(0, p)) for p in same]
    divisors = [g for g in range(3, cin) if cin % g == 0]
    kind = draw(st.sampled_from(["dense"] * 4 + ["depthwise"] * 2 + (["two"] if cin % 2 == 0 and cin > 2 else [])
                                + (["other"] if divisors else [])))
    if kind == "depthwise":
        groups = cin
        cout = cin * draw(st.sampled_from([1, 1, 1, 2]))
    else:
        groups = {"dense": 1, "two": 2, "other": None}[kind] or draw(st.sampled_from(divisors))
        cout = draw(st.sampled_from(CLASSES)) if draw(st.integers(0, 9)) == 0 else _channels(draw)
        cout = max(groups, cout // groups * groups)
    h = _spatial(draw)
    w = h if draw(st.booleans()) else _spatial(draw)
    span_h, span_w = (kh - 1) * dh + 1, (kw - 1) * dw + 1  # the output has at least one pixel
    h, w = max(h, span_h - pads[0] - pads[2]), max(w, span_w - pads[1] - pads[3])
    conv = dict(cout=cout, k=k, stride=stride, pads=pads, dilation=dilation, groups=groups,
                bias=draw(st.booleans()))
    shape = [n, cin, h, w]
    _fit_conv(shape, conv)
    layers = [("conv", conv)]
    epilogue = draw(st.sampled_from(["none", "act", "bn", "bn_act", "add", "add_act", "bn_add_relu", "act",
                                     "act_add", "bn_act_add"]))
    if epilogue.startswith("bn"):
        layers.append(("bn", {}))
    residual = ("residual", dict(other_first=draw(st.booleans())))
    if "add_" in epilogue or epilogue == "add":
        layers.append(residual)
    if epilogue.endswith("relu"):
        layers.append(("act", dict(act="relu", form="Relu")))
    elif "act" in epilogue:
        layers.append(("act", draw_act(draw, None)))
    if epilogue.endswith("act_add"):  # the skip joins after the activation (YOLO's bottleneck)
        layers.append(residual)
    return Plan("image", tuple(shape), draw(st.integers(0, 2**16 - 1)), tuple(layers))


@st.composite
def pool_kernels(draw) -> Plan:
    shape = (draw(st.sampled_from([1, 1, 2])), _channels(draw), _spatial(draw))
    shape = (*shape, shape[2] if draw(st.booleans()) else _spatial(draw))
    op = draw(st.sampled_from(["MaxPool", "MaxPool", "AveragePool", "AveragePool", "GlobalAveragePool",
                               "GlobalMaxPool"]))
    if op.startswith("Global"):
        return Plan("image", shape, 0, (("pool", dict(op=op)),))
    k = draw(st.sampled_from([1, 2, 2, 3, 3, 5]))  # 5: YOLO's SPPF (stride 1, pads 2)
    stride = draw(st.sampled_from([1, 2, 2]))
    if draw(st.integers(0, 4)) == 0:  # CRNN / PP-OCR: (2, 2) windows, stride (2, 1); (2, 1) windows
        k, stride = draw(st.sampled_from([((2, 2), (2, 1)), ((2, 1), (2, 1)), ((3, 3), (2, 1)), ((1, 2), (1, 2))]))
    (kh, kw) = _k2(k)
    pads = [draw(st.integers(0, kh - 1)), draw(st.integers(0, kw - 1))] if draw(st.booleans()) else [0, 0]
    pads = tuple(pads + [draw(st.integers(0, kh - 1)), draw(st.integers(0, kw - 1))] if draw(st.booleans())
                 else pads * 2)  # below the window (ONNX): no window wholly in the padding
    shape = (*shape[:2], max(shape[2], kh - pads[0] - pads[2]), max(shape[3], kw - pads[1] - pads[3]))
    params = dict(op=op, k=k, stride=stride, pads=pads, ceil_mode=int(draw(st.booleans())))
    if op == "AveragePool":
        params["count_include_pad"] = int(draw(st.booleans()))
    layers = [("pool", params)]
    if draw(st.integers(0, 3)) == 0:  # an activation fused after the window (AveragePool -> Relu crashed once)
        layers.append(("act", draw_act(draw, None)))
    return Plan("image", shape, 0, tuple(layers))


@st.composite
def dense_kernels(draw) -> Plan:
    batch = draw(st.sampled_from([1, 2, 3, 4, "N"]))
    rows = (batch,) if draw(st.integers(0, 3)) else (batch, draw(st.sampled_from(SEQUENCE)))  # tokens [B, S, K]
    k = draw(st.sampled_from(FEATURES) | st.integers(1, MAX_FEATURES))
    n = draw(st.sampled_from(FEATURES) | st.integers(1, MAX_FEATURES))
    m = SIZES.get(batch, batch) * (rows[1] if len(rows) > 1 else 1)
    n = max(1, min(n, MAX_MACS // (m * k)))
    if len(rows) == 1 and draw(st.booleans()):
        dense = dict(op="Gemm", n=n, bias=draw(st.sampled_from([None, "C", "C"])), trans_b=draw(st.booleans()),
                     alpha=1.0)
    else:
        dense = dict(op="MatMul", n=n, bias=draw(st.sampled_from([None, "after", "after", "before"])),
                     batched_weight=False, bias_rank=1)
    layers = [("dense", dense)]
    if draw(st.booleans()):
        layers.append(("act", draw_act(draw, None)))
    return Plan("tokens", (*rows, k), draw(st.integers(0, 2**16 - 1)), tuple(layers))


KINDS = {"conv": conv_kernels, "pool": pool_kernels, "dense": dense_kernels}


def _maybe_half(plan: Plan):
    """The plan, or one time in six its float16 model and one in six its bfloat16 one (the half kernels sum in
    float32: precision's half_sums_in_float32, which this strategy found lacking for means and average pools)."""
    plans = st.sampled_from([plan, plan, replace(plan, dtype="float16"), plan, plan, replace(plan, dtype="bfloat16")])
    if not plan.symbolic:
        return plans
    return plans.flatmap(lambda p: st.sampled_from([p, replace(p, bound=KERNEL_BOUND)]))


def kernels(kinds=("conv", "conv", "conv", "pool", "dense")):
    """RandomGraph of one kernel plan: a conv (three times in five by default) + epilogue, a pool or a dense,
    one time in six in float16, one in six in bfloat16."""
    return st.sampled_from(kinds).flatmap(lambda kind: KINDS[kind]()).flatmap(_maybe_half).map(build_kernel)


# ---------------------------------------------------------------- which plan a kernel takes
def _conv_plan(plan: Plan, facts):
    from tvm_fusion.schedules.llvm import conv2d as llvm_conv

    conv = dict(plan.layers[0][1])
    kh, kw = _k2(conv["k"])
    s, p, d = _k2(conv["stride"]), conv["pads"], _k2(conv["dilation"])
    cpg = plan.input_shape[1] // conv["groups"]
    return llvm_conv.plan_of(plan.input_shape, conv["cout"], (cpg, kh, kw), s, p, d, conv["groups"], facts)


def plan_family(plan: Plan, target=None) -> str:
    """The schedule plan the kernel of `plan` takes for `target` (default: the CPU target of the build, so
    TVM_FUSION_CPU), from the shapes alone: 'conv tiled flat_taps tap_rows padded_channels', 'conv pointwise',
    'conv depthwise_channels', 'dense cols=32 padded', 'pool MaxPool'..."""
    half = " float16" if plan.layers[-1][0] == "half" else f" {plan.dtype}" if plan.dtype != "float32" else ""
    return _plan_family(plan, target) + half


def _plan_family(plan: Plan, target=None) -> str:
    from tvm_fusion.schedules.llvm import conv2d as llvm_conv
    from tvm_fusion.schedules.llvm.conv2d_pointwise import channel_chunks
    from tvm_fusion.schedules.llvm.dense import column_block, packed_columns

    from tvm_fusion.build.builder import resolve_target
    from tvm_fusion.hardware import cpu_facts

    target = target if target is not None else resolve_target("llvm")
    facts = cpu_facts(target)
    kind, params = plan.layers[0]
    if kind == "pool":
        match = pool_match(plan, target)
        how = ("declined" if match.declined else "planes_only" if match.planes_only else
               f"run={match.run} stride={match.stride}" + (" pad" if match.pad else ""))
        return f"pool {params['op']} {how}"
    if kind == "dense":
        cols, lanes = packed_columns(params["n"], facts.float32_lanes), facts.float32_lanes
        padded = cols > 1 and column_block(params["n"], lanes) != cols
        batch = {1: " batch1", "N": " symbolic_batch"}.get(plan.input_shape[0], "")
        tokens = " tokens" if len(plan.input_shape) == 3 else ""
        return f"dense cols={cols}" + (" padded" if padded else "") + batch + tokens
    conv, c = dict(params), plan.input_shape[1]
    cp = _conv_plan(plan, facts)
    kh, kw = _k2(conv["k"])
    s, pads = _k2(conv["stride"]), conv["pads"]
    cpg, groups = c // conv["groups"], conv["groups"]
    tags = [cp.kernel]
    if cp.flat:
        tags.append("flat_taps" if kh * kw > 1 else
                    "subsampled" if llvm_conv.subsampled_pixels(kh, kw, s, pads, groups, cpg, conv["cout"], facts)
                    else "flat")
    if cp.in_place:
        tags.append("in_place")
    if groups > 1 and cpg > 1:
        tags.append("grouped")
    if cp.kernel == "tiled" and not cp.in_place and llvm_conv.channels_last_input(cp.kernel, cpg, conv["cout"], kh, kw, s, facts):
        tags.append("tap_rows" if cp.flat and kw > 1 and _k2(conv["dilation"])[1] == 1 else "channels_last")
    per_group = conv["cout"] // groups
    if cp.kernel in ("tiled", "pointwise") and cp.padding.group_channels != per_group:
        tags.append("padded_channels")
    _, _, hout, wout = conv_out((1, c, *plan.input_shape[2:]), **conv)
    if isinstance(conv["stride"], tuple) or isinstance(conv["dilation"], tuple):
        tags.append("per_axis")
    if cp.kernel == "pointwise":
        chunks, _ = channel_chunks(cp.padding.group_channels, cp.tile.rows, cpg, hout * wout)
        tags += (["tail"] if cp.padding.cols != hout * wout else []) + (["chunks"] if chunks > 1 else [])
    elif cp.padding.cols != (hout * wout if cp.flat else wout) or cp.padding.rows not in (1, hout):
        tags.append("padded_pixels")
    if plan.input_shape[0] == "N":
        tags.append("symbolic_batch")
    return "conv " + " ".join(tags)


def pool_match(plan: Plan, target):
    """`pooling.pool_plan` of the kernel's pool as TVM legalizes it (the unfused legalize stage: no schedules
    yet, no compile): how the LeftoverPool rule schedules it, or why it declines."""
    from tvm_fusion.schedules.llvm.pooling import pool_plan

    from tvm_fusion._tvm import tirx
    from tvm_fusion.build.builder import legalize
    from tvm_fusion.frontend.importer import import_onnx

    alone = replace(plan, layers=plan.layers[:1])  # without its activation (in its dtype: a bfloat16 plan differs)
    legal = legalize(import_onnx(build_kernel(alone).model), target, "unfused")
    # a half average pool is summed in float32 between casts (precision.WIDENED_INPUTS): the pool's function
    (func,) = [f for gv, f in legal.functions.items() if isinstance(f, tirx.PrimFunc) and "cast" not in gv.name_hint]
    return pool_plan(func, target)


def conv_rule_fired(counts: dict) -> bool:
    return any(n and rule.startswith("conv2d") for rule, n in counts.items())


def hand_schedule_used(plan: Plan, counts: dict) -> bool | None:
    """Whether the fused build ran our rule (so the hand llvm schedule) on the kernel: a conv or dense rule
    fired; None where no rule is meant to take it: pools (TVM's legalized pool, scheduled by the LeftoverPool
    rule when it matches), a dense without bias (the dense rules want a bias, BatchNorm or scale after the
    matmul: a bare matmul, with or without activation, is TVM's) and a dense of [N, S, K] tokens with a
    symbolic N (declined: its kernel takes a 2-D x only when the batch is symbolic)."""
    kind, params = plan.layers[0]
    if kind == "conv":
        return conv_rule_fired(counts)
    if kind == "dense" and params.get("bias") and not (plan.input_shape[0] == "N" and len(plan.input_shape) > 2):
        return any(n and rule.startswith("dense") for rule, n in counts.items())
    return None

