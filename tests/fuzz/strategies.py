"""Hypothesis strategies for random ONNX graphs, to check fused against onnxruntime on whole small networks.

    onnx_graphs()  draws  RandomGraph(model, description, plan)

A graph starts from an NCHW image (spatial <= 12, channels <= 16) or a token input ([batch, seq,
features] or [batch, features]) and stacks a few layers. It is a *plan*: the domain, the input shape,
the seed of the weights and a list of (layer kind, parameters). Each kind in LAYER_KINDS is a pair of
small functions: `draw(draw, net, keep_shape)` picks parameters that fit the current value's shape and
`emit(net, **params)` appends the ONNX nodes. The strategy draws and emits layer by layer (so shapes are
known as it goes); `build(plan)` replays a plan, so a plan written by hand builds the same graph.

What found earlier bugs is drawn on purpose: constants whose broadcast axis is not the channel axis
(`bias_add`, `pair`: (W,) after a conv whose C == W, (H, 1), (1, W), scalars, full shapes, shapes that raise
the rank or stretch a size-1 axis, constants whose elements are all equal, either operand order), activation
constants near but not equal to the canonical ones (`near_act`), ranks 2 to 5 (token inputs of rank 4 and 5,
batched MatMul weights), LayerNorm scales of another broadcast shape ((S, 1) with S == F), `If` nodes with a
constant condition, any shape-keeping layer (a conv block, attention, SE, LayerNorm ...) inside an If branch or
a Loop body (`nested`), and node / value names that collide with C, Python or TVM names (`Plan.names`).

Every graph is drawn along two more axes (`Plan`): its batch is static or symbolic (the input's first dim is
the dim_param BATCH, "N", with an upper bound half the time, `Plan.bound`; constants never take that axis: a
symbolic batch broadcasts as 1 in them, `fixed`),
and its dtype is float32, float16 or bfloat16 (`testing.as_float16` of the float32 graph, If branches
included). oracle.py builds a symbolic batch once and runs it at batch 1 and 3.

Values with several consumers come from skip connections (an add back to an earlier value of the same
shape), forks (one value feeding two branches that are joined again), attention (q, k and v of one value),
elementwise ops reusing their input, and escapes (an intermediate that is also a graph output); each must
stop a fusion across that value, or be an input of the same fused kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
from hypothesis import strategies as st

from tvm_fusion.testing import ACTIVATION_FORMS, GELU_OPSET, OPSET, GraphBuilder, apply_activation_onnx, as_float16

__all__ = ["BATCH", "BOUNDS", "DTYPES", "LAYER_KINDS", "Plan", "RandomGraph", "build", "onnx_graphs"]

MAX_CHANNELS = 16  # image channels and token features
MAX_SPATIAL = 12
MAX_LAYERS = 6
DECOMPOSED_LN_OPSET = 18  # ReduceMean takes its axes as an input from opset 18
DOMAINS = ("image", "tokens")
#: a symbolic batch: the input's first dim is this dim_param (kernels.py's too), kept symbolic in the builds
BATCH = "N"
#: the model's float dtype: float32, or the float32 graph converted (testing.as_float16: weights rounded)
DTYPES = ("float32", "float16", "bfloat16")
#: a symbolic batch's upper bound (Plan.bound): none, the largest batch the oracle runs (3: oracle.BATCHES), more
BOUNDS = (None, None, 3, 16)


@dataclass(frozen=True)
class Plan:
    """Everything a graph is made of; `build(plan)` turns it into the same model every time."""

    domain: str  # "image" or "tokens"
    input_shape: tuple
    seed: int  # of the weights (GraphBuilder)
    layers: tuple  # ((layer kind, params), ...)
    names: tuple = ()  # (("node" | "value" | "input", index, new name), ...): see ODD_NAMES and rename()
    dtype: str = "float32"  # one of DTYPES
    bound: int | None = None  # a symbolic batch's upper bound (`--shape x=N<=16x...`), None: unbounded

    @property
    def symbolic(self) -> bool:
        """The batch (input_shape[0]) is the dim_param BATCH."""
        return self.input_shape[0] == BATCH


@dataclass(frozen=True)
class RandomGraph:
    """A drawn graph: the ONNX model, a one-line-per-layer description and the plan that rebuilds it."""

    model: onnx.ModelProto
    description: str
    plan: Plan

    def __repr__(self) -> str:  # what Hypothesis prints for a falsifying example
        return f"RandomGraph(\n{self.description}\n)"

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(repr(self))


@dataclass
class Net:
    """The graph being built: the builder, the current value and every value so far with its shape."""

    g: GraphBuilder
    domain: str
    cur: str
    shapes: dict  # value -> shape, in creation order (the candidates of a skip connection)
    inputs: list
    outputs: list = field(default_factory=list)  # escaped intermediates; the last value is added at the end
    opset: int = OPSET
    log: list = field(default_factory=list)

    @classmethod
    def start(cls, domain: str, shape: tuple, seed: int) -> Net:
        g = GraphBuilder(seed)
        x = g.input("x", list(shape))
        return cls(g, domain, x, {x: tuple(shape)}, [x])

    @property
    def shape(self) -> tuple:
        return self.shapes[self.cur]

    def set(self, value: str, shape=None) -> None:
        """`value` is the new current value (with the current shape unless given)."""
        self.shapes[value] = tuple(self.shape if shape is None else shape)
        self.cur = value

    def same_shape(self) -> list[str]:
        """Earlier values with the current value's shape."""
        return [v for v, s in self.shapes.items() if s == self.shape and v != self.cur]

    def needs_opset(self, opset: int) -> None:
        self.opset = max(self.opset, opset)

    def uniform(self, shape, low=0.5, high=1.5) -> str:
        return self.g.const(self.g.rng.uniform(low, high, shape).astype(np.float32))

    def normal(self, shape, std=0.5) -> str:
        return self.g.const(self.g.rng.normal(0.0, std, shape).astype(np.float32))

    def per_channel(self) -> tuple:
        """The shape of a constant with one value per channel (image) or per feature (tokens)."""
        if self.domain == "image":
            return (self.shape[1], 1, 1)
        return (self.shape[-1],)

    def finish(self, plan: Plan) -> RandomGraph:
        outputs = self.outputs + ([self.cur] if self.cur not in self.outputs else [])
        shapes = [self.shapes[o] for o in outputs]
        outputs, renamed = rename(self.g, outputs, plan.names)
        model = self.g.model(outputs, opset=self.opset) if not any(n.op_type == "Loop" for n in self.g.nodes) else \
            self._typed_model(outputs, shapes)
        head = f"{plan.domain} x{list(plan.input_shape)}, weights seed {plan.seed}, opset {self.opset}"
        head += f", {BATCH}<={plan.bound}" if plan.bound else ""
        if plan.dtype != "float32":
            model, head = as_float16(model, plan.dtype), f"{head}, {plan.dtype}"
        tail = f"outputs: {', '.join(outputs)}" + (f"\nrenamed: {'; '.join(renamed)}" if renamed else "")
        return RandomGraph(model, "\n".join([head, *self.log, tail]), plan)


    def _typed_model(self, outputs: list, shapes: list) -> onnx.ModelProto:
        """GraphBuilder.model with the outputs' shapes declared: onnx's checker refuses an output without one in
        a graph with a Loop."""
        from onnx import TensorProto, helper

        outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, list(s)) for o, s in zip(outputs, shapes)]
        graph = helper.make_graph(self.g.nodes, "test", self.g.inputs, outs, self.g.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        onnx.checker.check_model(model)
        return model


#: node and value names that exporters write or that collide with names of TVM's IR, C or Python: the module's
#: entry function, keywords, the importer's own var prefix, an input's name, duplicates, empty, path-like
ODD_NAMES = ("main", "if", "int", "return", "", "dup", "dup", "a/b.c:0", "x", "lv", "0", "R", "T", "relu")


def _rename_values(nodes, old: str, new: str) -> None:
    for node in nodes:
        node.input[:] = [new if v == old else v for v in node.input]
        node.output[:] = [new if v == old else v for v in node.output]
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:  # If branches see the outer values by name
                _rename_values(attr.g.node, old, new)
                for out in attr.g.output:
                    out.name = new if out.name == old else out.name


def _all_nodes(nodes):
    """The nodes and, after each, those of its subgraphs (If branches, Loop bodies), depth first."""
    for node in nodes:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(attr.g.node)


def _unique(name: str, taken: set) -> str:
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def rename(g: GraphBuilder, outputs: list, names: tuple) -> tuple[list, list]:
    """Apply a plan's `names` to the built graph: ("node", i, name) names node i (of every node, those inside If
    branches and Loop bodies included, depth first); ("value", i, name) renames the first output of node i
    everywhere, ("input", i, name) graph input i (both kept unique: "_" appended while
    taken). Returns the outputs, a log."""
    log = []
    nodes = list(_all_nodes(g.nodes))  # the If branches' and Loop bodies' nodes too
    taken = {v for n in nodes for v in [*n.output, *n.input]} | {i.name for i in g.inputs} | {t.name for t in g.inits}
    for kind, index, name in names:
        node = nodes[index % len(nodes)]
        if kind == "input":  # a graph input: it becomes a parameter of the entry function and of kernels
            value = g.inputs[index % len(g.inputs)]
            old, value.name = value.name, _unique(name or "_", taken)
            _rename_values(g.nodes, old, value.name)
            log.append(f"input {old} -> {value.name!r}")
            continue
        if kind == "node":
            log.append(f"node {node.name} -> {name!r}")
            node.name = name
            continue
        old, new = node.output[0], _unique(name or "_", taken)
        _rename_values(g.nodes, old, new)
        outputs = [new if v == old else v for v in outputs]
        log.append(f"value {old} -> {new!r}")
    return outputs, log


def draw_names(draw, n_nodes: int) -> tuple:
    return tuple(draw(st.lists(st.tuples(st.sampled_from(["node", "value", "input"]), st.integers(0, n_nodes - 1),
                                         st.sampled_from(ODD_NAMES)), max_size=4)))


def broadcast_shapes(shape: tuple):
    """Shapes of a constant that broadcasts to `shape` without changing it: a scalar, or the last k axes each
    either kept or 1: (W,), (H, 1), (C, 1, 1), (1, W), the full shape ... (scalars first: they shrink there)."""
    rank = len(shape)
    return st.integers(0, rank).flatmap(
        lambda k: st.tuples(*[st.sampled_from([1, d]) if d not in (1, BATCH) else st.just(1)
                              for d in shape[rank - k:]]))


def fixed(shape) -> tuple:
    """`shape` for a constant: a symbolic batch axis becomes 1 (it broadcasts)."""
    return tuple(1 if d == BATCH else d for d in shape)


def broadcast(*shapes) -> tuple:
    """np.broadcast_shapes where a dim may be the symbolic batch BATCH (which broadcasts only with 1 and itself)."""
    rank = max(len(s) for s in shapes)
    out = []
    for dims in zip(*[(1,) * (rank - len(s)) + tuple(s) for s in shapes]):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            raise ValueError(f"shapes {shapes} do not broadcast")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


# ---------------------------------------------------------------- layer kinds: draw(draw, net, keep_shape), emit
KERNELS = (1, 3, 5, (1, 3), (3, 1))  # int: square


def _kh(k) -> int:
    return k if isinstance(k, int) else k[0]


def _kw(k) -> int:
    return k if isinstance(k, int) else k[1]


def draw_conv(draw, net: Net, keep_shape: bool = False) -> dict:
    _, c, h, w = net.shape
    fits = [(k, d) for k in KERNELS for d in ((1,) if k == 1 else (1, 2))
            if (_kh(k) - 1) * d + 1 <= h and (_kw(k) - 1) * d + 1 <= w]
    k, dilation = draw(st.sampled_from(fits))
    groups = draw(st.sampled_from(sorted({1, c} | ({2} if c % 2 == 0 else set()))))  # c: depthwise
    bias = draw(st.booleans())
    same = [dilation * (_kh(k) // 2), dilation * (_kw(k) // 2)] * 2
    if keep_shape:
        return dict(cout=c, k=k, stride=1, pads=same, dilation=dilation, groups=groups, bias=bias)
    cout = groups * draw(st.integers(1, MAX_CHANNELS // groups))
    pads = [draw(st.integers(0, p)) for p in same]
    stride = draw(st.integers(1, 2))
    _, _, oh, ow = conv_shape(net.shape, c, k, stride, pads, dilation)
    like = [d for d in (ow, oh) if d % groups == 0 and d <= MAX_CHANNELS and d != cout]
    if like and draw(st.booleans()):  # C == W (or H): a (W,) constant then has C elements but is not per channel
        cout = draw(st.sampled_from(like))
    return dict(cout=cout, k=k, stride=stride, pads=pads, dilation=dilation, groups=groups, bias=bias)


def conv_shape(shape, cout, k, stride, pads, dilation, **_) -> tuple:
    n, _, h, w = shape
    oh = (h + pads[0] + pads[2] - dilation * (_kh(k) - 1) - 1) // stride + 1
    ow = (w + pads[1] + pads[3] - dilation * (_kw(k) - 1) - 1) // stride + 1
    return (n, cout, oh, ow)


def emit_conv(net: Net, cout, k, stride, pads, dilation, groups, bias) -> None:
    c = net.shape[1]
    y = net.g.conv(net.cur, c, cout, k=k, stride=stride, pads=pads, dilation=dilation, groups=groups, bias=bias)
    net.set(y, conv_shape(net.shape, cout, k, stride, pads, dilation))


def draw_nothing(draw, net: Net, keep_shape: bool = False) -> dict:
    return {}


def emit_bn(net: Net) -> None:
    """Inference BatchNormalization over axis 1 (channels; the sequence axis of [batch, seq, features])."""
    net.set(net.g.bn(net.cur, net.shape[1]))


def draw_act(draw, net: Net, keep_shape: bool = False) -> dict:
    act = draw(st.sampled_from(list(ACTIVATION_FORMS)))
    return dict(act=act, form=draw(st.sampled_from(ACTIVATION_FORMS[act])))


def emit_act(net: Net, act, form) -> None:  # `act` only names the activation in the description
    if form.startswith("Gelu"):
        net.needs_opset(GELU_OPSET)
    net.set(apply_activation_onnx(net.g, net.cur, form))


#: activation forms with the constants that make them: name -> canonical value (what the rules look for)
NEAR_MISS = {
    "HardSigmoid": {"alpha": 1 / 6, "beta": 0.5},  # hardswish's half
    "x*HardSigmoid": {"alpha": 1 / 6, "beta": 0.5},
    "x*(Clip(x+3)/6)": {"three": 3.0, "low": 0.0, "high": 6.0, "six": 6.0},
    "x*Clip(x+3)/6": {"three": 3.0, "low": 0.0, "high": 6.0, "six": 6.0},
    "Clip": {"low": 0.0, "high": 6.0},
    "MaxMin": {"low": 0.0, "high": 6.0},
    "LeakyRelu": {"alpha": 0.01},
    "erf-decomposed": {"sqrt2": float(np.float32(np.sqrt(2.0))), "one": 1.0, "half": 0.5},
    "tanh-decomposed": {"cubic": 0.044715, "sqrt_2_over_pi": 0.7978845834732056, "one": 1.0, "half": 0.5},
}
#: 0 (canonical), within the rules' 1e-4 (near miss, still visible element by element), clearly off
NUDGES = (0.0, 9e-5, -9e-5, 5e-5, -5e-5, 1e-3, 0.1)


def draw_near_act(draw, net: Net, keep_shape: bool = False) -> dict:
    """An activation whose constants are near, but not always equal to, the canonical ones (HardSigmoid alpha
    1/6 + 9e-5, Clip(0, 6.001), GELU's sqrt(2) nudged ...), after a gain that takes values past the bounds."""
    form = draw(st.sampled_from(list(NEAR_MISS)))
    return dict(form=form, nudge=draw(st.sampled_from(list(NEAR_MISS[form]))), delta=draw(st.sampled_from(NUDGES)),
                gain=draw(st.sampled_from([1.0, 1.0, 4.0])))  # a gain stops the fusion with a conv before


def emit_near_act(net: Net, form, nudge, delta, gain) -> None:
    g, y = net.g, net.cur
    c = {**NEAR_MISS[form]}
    c[nudge] += delta
    f32 = lambda v: g.const(np.array(v, np.float32))  # noqa: E731
    if gain != 1.0:
        y = g.op("Mul", [y, f32(gain)])
    if form in ("HardSigmoid", "x*HardSigmoid"):
        hs = g.op("HardSigmoid", [y], alpha=c["alpha"], beta=c["beta"])
        y = hs if form == "HardSigmoid" else g.op("Mul", [y, hs])
    elif form.startswith("x*"):
        relu6 = g.op("Clip", [g.op("Add", [y, f32(c["three"])]), f32(c["low"]), f32(c["high"])])
        y = g.op("Mul", [y, g.op("Div", [relu6, f32(c["six"])])]) if form == "x*(Clip(x+3)/6)" else \
            g.op("Div", [g.op("Mul", [y, relu6]), f32(c["six"])])
    elif form == "Clip":
        y = g.op("Clip", [y, f32(c["low"]), f32(c["high"])])
    elif form == "MaxMin":
        y = g.op("Min", [g.op("Max", [y, f32(c["low"])]), f32(c["high"])])
    elif form == "LeakyRelu":
        y = g.op("LeakyRelu", [y], alpha=c["alpha"])
    elif form == "erf-decomposed":
        erf = g.op("Erf", [g.op("Div", [y, f32(c["sqrt2"])])])
        y = g.op("Mul", [g.op("Mul", [y, g.op("Add", [erf, f32(c["one"])])]), f32(c["half"])])
    else:  # tanh-decomposed
        inner = g.op("Add", [y, g.op("Mul", [g.op("Pow", [y, f32(3.0)]), f32(c["cubic"])])])
        t = g.op("Tanh", [g.op("Mul", [inner, f32(c["sqrt_2_over_pi"])])])
        y = g.op("Mul", [g.op("Mul", [y, g.op("Add", [t, f32(c["one"])])]), f32(c["half"])])
    net.set(y)


def draw_bias_add(draw, net: Net, keep_shape: bool = False) -> dict:
    """A constant added to (or multiplying, ...) the current value, in either operand order: per channel, a
    scalar, or any shape that broadcasts over other axes ((W,) after a conv, also when W == C; (H, 1); ...)."""
    rank = len(net.shape)
    channel = net.per_channel()
    broadcast = (1, *channel) if net.domain == "image" else (1,) * (rank - 1) + channel
    other_axes = [(net.shape[-1],)] + ([(net.shape[-2], 1)] if rank >= 2 and net.shape[-2] != BATCH else [])
    shape = draw(st.sampled_from([channel, broadcast, (), *other_axes, *other_axes]) | broadcast_shapes(net.shape))
    if not keep_shape and net.domain == "tokens" and len(shape) == rank < 5 and draw(st.booleans()):
        shape = (1, *shape)  # raises the value's rank: [2, N] + (1, 1, N) is [1, 2, N]
    op = draw(st.sampled_from(CONST_OPS))
    return dict(shape=tuple(shape), const_first=op != "Div" and draw(st.booleans()), op=op)  # c / x: x ~ 0


CONST_OPS = ("Add", "Mul", "Sub", "Div")


def emit_bias_add(net: Net, shape, const_first, op="Add") -> None:
    b = net.uniform(shape) if op in ("Mul", "Div") else net.normal(shape)  # no division by values near 0
    out = broadcast(net.shape, shape)
    net.set(net.g.op(op, [b, net.cur] if const_first else [net.cur, b]), out)


def draw_skip_add(draw, net: Net, keep_shape: bool = False) -> dict:
    return dict(other=draw(st.sampled_from(net.same_shape())), op=draw(st.sampled_from(["Add", "Sum"])),
                other_first=draw(st.booleans()))


def emit_skip_add(net: Net, other, op, other_first) -> None:
    net.set(net.g.op(op, [other, net.cur] if other_first else [net.cur, other]))


def draw_pair(draw, net: Net, keep_shape: bool = False) -> dict:
    """Max / Min / Sum / Mean of two inputs: the current value and a constant that broadcasts to it (or, unless
    the shape is kept, one that also stretches its size-1 axes or adds a leading axis), in either order."""
    shape = draw(broadcast_shapes(net.shape))
    if not keep_shape and draw(st.booleans()):
        shape = fixed(draw(st.integers(2, 3)) if d == 1 else d for d in net.shape)
    if not keep_shape and net.domain == "tokens" and len(shape) == len(net.shape) < 5 and draw(st.booleans()):
        shape = (draw(st.integers(1, 2)), *shape)  # one more (leading) axis than the value
    return dict(op=draw(st.sampled_from(["Max", "Min", "Sum", "Mean"])), shape=tuple(shape),
                const_first=draw(st.booleans()), filled=draw(st.booleans()))


def emit_pair(net: Net, op, shape, const_first, filled=False) -> None:
    """`filled`: every element of the constant is the same (as ConstantOfShape / Expand of a scalar give)."""
    c = net.g.const(np.full(shape, 0.25, np.float32)) if filled else net.normal(shape)
    out = broadcast(net.shape, shape)
    net.set(net.g.op(op, [c, net.cur] if const_first else [net.cur, c]), out)


IF_OPS = ("Relu", "Sigmoid", "Neg", "Add", "Mul")


def draw_if(draw, net: Net, keep_shape: bool = False) -> dict:
    """If with a constant condition; each branch applies 1-2 ops to the current value (seen from outer scope)."""
    ops = st.lists(st.sampled_from(IF_OPS), min_size=1, max_size=2).map(tuple)
    return dict(cond=draw(st.booleans()), then=draw(ops), orelse=draw(ops))


def emit_if(net: Net, cond, then, orelse) -> None:
    from onnx import TensorProto, helper

    g = net.g

    def branch(ops, tag):
        nodes, y = [], net.cur
        for op in ops:
            ins = [y]
            if op in ("Add", "Mul"):
                c = g.name(f"{tag}_c")
                value = g.rng.uniform(0.5, 1.5, net.per_channel()).astype(np.float32)
                nodes.append(helper.make_node("Constant", [], [c], name=g.name("Constant"),
                                              value=onnx.numpy_helper.from_array(value, c)))
                ins.append(c)
            out = g.name(f"{tag}_{op.lower()}")
            nodes.append(helper.make_node(op, ins, [out], name=g.name(op)))
            y = out
        return helper.make_graph(nodes, tag, [], [helper.make_tensor_value_info(y, TensorProto.FLOAT, None)])

    c = g.const(np.array(cond))
    net.set(g.op("If", [c], then_branch=branch(then, g.name("then")), else_branch=branch(orelse, g.name("else"))))


def draw_nested(draw, net: Net, keep_shape: bool = False) -> dict:
    """A shape-keeping layer of any kind (a conv block, attention, SE, LayerNorm, ...) inside an If branch (the
    other branch the same kind with its own weights; a constant condition) or a Loop body (a constant trip
    count of 1 or 2, the layer applied to the carried value)."""
    names = [n for n, kind in LAYER_KINDS.items() if kind.branch and kind.applies(net) and n != "nested"]
    name = draw(st.sampled_from(names))
    how = draw(st.sampled_from(["if", "loop"]))
    extra = dict(cond=draw(st.booleans())) if how == "if" else dict(trips=draw(st.integers(1, 2)))
    return dict(how=how, layer=(name, LAYER_KINDS[name].draw(draw, net, keep_shape=True)), **extra)


def _subgraph(net: Net, name: str, params: dict, start: str, tag: str) -> tuple:
    """Emit layer `name` from value `start` and take its nodes out of the graph (for a subgraph). The values it made are forgotten
    (net.shapes): no later layer may read them outside the subgraph. Returns (nodes, output, its shape)."""
    known, k = set(net.shapes), len(net.g.nodes)
    net.cur = start
    LAYER_KINDS[name].emit(net, **params)
    nodes, out, shape = net.g.nodes[k:], net.cur, net.shape
    del net.g.nodes[k:]
    for v in set(net.shapes) - known:
        del net.shapes[v]
    return nodes, out, shape


def emit_nested(net: Net, how, layer, cond=True, trips=1) -> None:
    from onnx import TensorProto, helper

    g, x, shape = net.g, net.cur, net.shape
    f, (name, params) = TensorProto.FLOAT, layer
    if how == "if":
        branches = []
        for tag in ("then", "else"):
            nodes, out, shape = _subgraph(net, name, params, x, tag)
            branches.append(helper.make_graph(nodes, g.name(tag), [], [helper.make_tensor_value_info(out, f, None)]))
        net.cur = x
        net.set(g.op("If", [g.const(np.array(cond))], then_branch=branches[0], else_branch=branches[1]), shape)
        return
    v, c = g.name("carried"), g.name("cond")
    net.shapes[v] = shape
    nodes, out, after = _subgraph(net, name, params, v, "body")
    del net.shapes[v]  # the body's input: no value outside the body
    assert after == shape, f"a Loop body's {name} changed the carried shape {shape} to {after}"
    c_out = g.name("cond_out")
    nodes.append(helper.make_node("Identity", [c], [c_out], name=g.name("Identity")))
    body = helper.make_graph(nodes, g.name("body"), [
        helper.make_tensor_value_info(g.name("i"), TensorProto.INT64, []),
        helper.make_tensor_value_info(c, TensorProto.BOOL, []), helper.make_tensor_value_info(v, f, list(shape))],
        [helper.make_tensor_value_info(c_out, TensorProto.BOOL, []), helper.make_tensor_value_info(out, f, list(shape))])
    net.cur = x
    net.set(g.op("Loop", [g.const(np.array(trips, np.int64)), "", x], body=body), shape)


UNARY_OPS = ("Relu", "Sigmoid", "Tanh", "Neg", "Erf", "Abs")  # Abs is not in our chains: it splits them
BINARY_OPS = ("Add", "Sub", "Mul", "Div", "Max", "Min", "Pow")


def draw_elementwise(draw, net: Net, keep_shape: bool = False) -> dict:
    """1-4 elementwise ops; the other operand of a binary op is a constant, an earlier value or the layer's input
    (which then has two consumers inside one chain, as in x * sigmoid(x))."""
    steps = []
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(UNARY_OPS + BINARY_OPS))
        if op in UNARY_OPS:
            steps.append((op, None, False))
        elif op == "Pow":  # x ** 2 only: a fractional power of a negative value is NaN
            steps.append((op, "two", False))
        elif op == "Div":  # by a constant in [0.5, 1.5] only: dividing by a value near 0 amplifies rounding
            steps.append((op, draw(st.sampled_from(["scalar", "channel"])), False))
        else:
            operand = draw(st.sampled_from(["scalar", "channel", net.cur, *net.same_shape()]))
            steps.append((op, operand, draw(st.booleans())))
    return dict(steps=tuple(steps))


def emit_elementwise(net: Net, steps) -> None:
    y = net.cur
    for op, operand, operand_first in steps:
        if operand is None:
            y = net.g.op(op, [y])
            continue
        if operand == "two":
            other = net.g.const(np.array(2.0, np.float32))
        elif operand in ("scalar", "channel"):
            other = net.uniform(() if operand == "scalar" else net.per_channel())
        else:
            other = operand
        y = net.g.op(op, [other, y] if operand_first else [y, other])
    net.set(y)


def draw_fork(draw, net: Net, keep_shape: bool = False) -> dict:
    """The current value feeds two shape-keeping branches, joined again: it has two consumers."""
    names = [n for n, kind in LAYER_KINDS.items() if kind.branch and kind.applies(net)]
    a, b = draw(st.sampled_from(names)), draw(st.sampled_from(names))
    return dict(a=(a, LAYER_KINDS[a].draw(draw, net, keep_shape=True)),
                b=(b, LAYER_KINDS[b].draw(draw, net, keep_shape=True)),
                join=draw(st.sampled_from(["Add", "Mul"])))


def emit_fork(net: Net, a, b, join) -> None:
    v, ends = net.cur, []
    for name, params in (a, b):
        net.cur = v
        LAYER_KINDS[name].emit(net, **params)
        ends.append(net.cur)
    net.set(net.g.op(join, ends), broadcast(*(net.shapes[e] for e in ends)))


def draw_squeeze_excite(draw, net: Net, keep_shape: bool = False) -> dict:
    """x * gate(conv1x1(relu(conv1x1(GlobalAveragePool(x))))) (MobileNetV3, EfficientNet): a [N, C, 1, 1]
    value broadcast against [N, C, H, W]."""
    return dict(hidden=draw(st.integers(1, max(1, net.shape[1] // 2))),
                gate=draw(st.sampled_from(["Sigmoid", "HardSigmoid"])), gate_first=draw(st.booleans()))


def emit_squeeze_excite(net: Net, hidden, gate, gate_first) -> None:
    x, c = net.cur, net.shape[1]
    s = net.g.op("Relu", [net.g.conv(net.g.op("GlobalAveragePool", [x]), c, hidden, k=1)])
    s = net.g.conv(s, hidden, c, k=1)
    s = net.g.op("Sigmoid", [s]) if gate == "Sigmoid" else net.g.op("HardSigmoid", [s], alpha=1 / 6, beta=0.5)
    net.set(net.g.op("Mul", [s, x] if gate_first else [x, s]))


def draw_attention(draw, net: Net, keep_shape: bool = False) -> dict:
    """Single-head self-attention softmax(q k^T / sqrt(d)) v; q, k, v are dense layers of the current value,
    which so has three consumers."""
    n = net.shape[-1] if keep_shape else draw(st.integers(1, MAX_CHANNELS))
    return dict(d=draw(st.integers(1, MAX_CHANNELS)), n=n, bias=draw(st.booleans()))


def emit_attention(net: Net, d, n, bias) -> None:
    x, (batch, seq, _) = net.cur, net.shape
    heads = []
    for width in (d, d, n):
        net.cur = x
        emit_dense(net, "MatMul", width, "after" if bias else None)
        heads.append(net.cur)
    q, k, v = heads
    scores = net.g.op("MatMul", [q, net.g.op("Transpose", [k], perm=[0, 2, 1])])
    scores = net.g.op("Div", [scores, net.g.const(np.array(np.sqrt(d), np.float32))])
    net.set(net.g.op("MatMul", [net.g.op("Softmax", [scores], axis=-1), v]), (batch, seq, n))


def draw_block(draw, net: Net, keep_shape: bool = False) -> dict:
    """A network's usual unit: conv (image) or dense (tokens), then BatchNorm, a residual add back to a value
    of the block's input shape (the conv or dense keeps the shape then) and/or an activation (canonical or
    nudged); a constant of any broadcast shape right after the conv / dense or just before the activation."""
    first = "conv" if net.domain == "image" else "dense"
    residual = draw(st.booleans())
    params = LAYER_KINDS[first].draw(draw, net, keep_shape or residual)
    layers = [(first, params)]
    out = conv_shape(net.shape, **params) if first == "conv" else \
        (1,) * (params.get("bias_rank", 1) - len(net.shape)) + (*net.shape[:-1], params["n"])
    after = Net(net.g, net.domain, net.cur, {net.cur: out}, [])  # only its shape: draws the constant
    const = draw(st.sampled_from([None, "after_" + first, "before_act"]))
    if const == "after_" + first:  # conv -> Add((W,)) -> relu with C == W: not a per-channel bias
        layers.append(("bias_add", draw_bias_add(draw, after, keep_shape=True)))
    if out[1] != BATCH and draw(st.booleans()):  # not over a symbolic batch moved to axis 1 by a leading axis
        layers.append(("bn", {}))
    if residual:
        layers.append(("skip_add", dict(other=draw(st.sampled_from([net.cur, *net.same_shape()])), op="Add",
                                        other_first=draw(st.booleans()))))
    if const == "before_act":
        layers.append(("bias_add", draw_bias_add(draw, after, keep_shape or residual)))
    act = draw(st.sampled_from([None, "act", "near_act"]))
    if act:
        layers.append((act, LAYER_KINDS[act].draw(draw, net)))
    return dict(layers=tuple(layers))


def draw_off_axis(draw, net: Net, keep_shape: bool = False) -> dict:
    """conv / dense -> a constant broadcast over another axis than the channels / features -> an activation
    (canonical or nudged): conv(C == W) + (W,) and dense(N == S) + (S, 1) have one value per channel by count
    only, which a rule must not take for a bias or scale (what found the W == C bug)."""
    first = "conv" if net.domain == "image" else "dense"
    params = LAYER_KINDS[first].draw(draw, net, keep_shape)
    if first == "conv" and not keep_shape:
        _, _, _, ow = conv_shape(net.shape, **params)
        if ow % params["groups"] == 0 and ow <= MAX_CHANNELS:
            params = dict(params, cout=ow, bias=draw(st.sampled_from([False, False, True])))
    elif first == "dense" and not keep_shape and len(net.shape) >= 2:
        params = dict(params, n=net.shape[-2]) if net.shape[-2] != BATCH else params
    out = conv_shape(net.shape, **params) if first == "conv" else \
        (1,) * (params.get("bias_rank", 1) - len(net.shape)) + (*net.shape[:-1], params["n"])
    other = st.sampled_from([(out[-1],), (out[-1],), fixed((out[-2], 1)), (1, out[-1])]) if len(out) >= 2 else st.just(())
    shape = draw(other | broadcast_shapes(out))
    op = draw(st.sampled_from(["Add", "Mul", "Add", "Sub", "Div"]))
    const_first = op != "Div" and draw(st.sampled_from([False, False, True]))
    layers = [(first, params), ("bias_add", dict(shape=tuple(shape), const_first=const_first, op=op))]
    act = draw(st.sampled_from([None, "act", "near_act"]))
    if act:
        layers.append((act, LAYER_KINDS[act].draw(draw, net)))
    return dict(layers=tuple(layers))


def emit_block(net: Net, layers) -> None:
    for name, params in layers:
        LAYER_KINDS[name].emit(net, **params)


def emit_escape(net: Net) -> None:
    """The current value is also a graph output, so no fusion may hide it."""
    net.outputs.append(net.cur)


def draw_to_tokens(draw, net: Net, keep_shape: bool = False) -> dict:
    return dict(how=draw(st.sampled_from(["sequence", "pool"])))


def emit_to_tokens(net: Net, how) -> None:
    """[N, C, H, W] -> [N, H*W, C] (a ViT-style sequence) or -> [N, C] (global average pool + flatten)."""
    n, c, h, w = net.shape
    net.domain = "tokens"
    if how == "pool":
        net.set(net.g.op("Flatten", [net.g.op("GlobalAveragePool", [net.cur])], axis=1), (n, c))
        return
    flat = net.g.op("Reshape", [net.cur, net.g.const(np.array([0 if n == BATCH else n, c, h * w], np.int64))])
    net.set(net.g.op("Transpose", [flat], perm=[0, 2, 1]), (n, h * w, c))


def draw_dense(draw, net: Net, keep_shape: bool = False) -> dict:
    n = net.shape[-1] if keep_shape else draw(st.integers(1, MAX_CHANNELS))
    if len(net.shape) == 2 and draw(st.booleans()):
        return dict(op="Gemm", n=n, bias=draw(st.sampled_from([None, "C"])), trans_b=draw(st.booleans()),
                    alpha=draw(st.sampled_from([1.0, 1.0, 0.5])))
    batched = len(net.shape) >= 3 and draw(st.booleans())  # [B, M, K] x [B, K, N] as well as x [K, N]
    bias = draw(st.sampled_from([None, "after", "before"]))
    ranks = [1, len(net.shape)] + ([len(net.shape) + 1] if not keep_shape and len(net.shape) < 5 else [])
    bias_rank = draw(st.sampled_from(ranks)) if bias else 1
    return dict(op="MatMul", n=n, bias=bias, batched_weight=batched, bias_rank=bias_rank)


def emit_dense(net: Net, op, n, bias, trans_b=False, alpha=1.0, batched_weight=False, bias_rank=1) -> None:
    """`bias_rank`: the bias is (1, ..., 1, n) of that rank; one more than the value's rank adds a leading axis."""
    f = net.shape[-1]
    w = (n, f) if trans_b else (f, n)
    w = net.normal((*fixed(net.shape[:-2]), *w) if batched_weight else w, std=1.0 / np.sqrt(f))
    b = net.normal((1,) * (bias_rank - 1) + (n,), std=0.1) if bias else None
    if op == "Gemm":
        y = net.g.op("Gemm", [net.cur, w] + ([b] if b else []), transB=int(trans_b), alpha=alpha)
    else:
        y = net.g.op("MatMul", [net.cur, w])
        if b:
            y = net.g.op("Add", [b, y] if bias == "before" else [y, b])
    net.set(y, (1,) * (bias_rank - len(net.shape)) + (*net.shape[:-1], n))


def draw_layer_norm(draw, net: Net, keep_shape: bool = False) -> dict:
    """LayerNormalization (the op, or its ReduceMean/Sub/Pow/Sqrt/Div form), optionally after a residual add
    with an earlier value, the input itself (h + h) or a new graph input."""
    form = draw(st.sampled_from(["op", "decomposed"]))
    two = form == "op" and len(net.shape) == 3 and net.shape[-2] != BATCH  # not over a symbolic axis
    axis = draw(st.sampled_from([-1, -1, -2])) if two else -1  # -2 declines
    gamma = None  # the normalized shape; the decomposed form takes any that broadcasts: (S, 1) with S == F ...
    if form == "decomposed" and len(net.shape) >= 2:
        gamma = draw(st.sampled_from([None, fixed((net.shape[-2], 1))]) | broadcast_shapes(net.shape))
    return dict(form=form, residual=draw(st.sampled_from([None, "input", net.cur, *net.same_shape()])),
                epsilon=draw(st.sampled_from([1e-5, 1e-3])), axis=axis, gamma=gamma)


def emit_layer_norm(net: Net, form, residual, epsilon, axis=-1, gamma=None) -> None:
    """`gamma`: the scale's shape when not the normalized shape (decomposed form: any that broadcasts)."""
    shape, h = net.shape, net.cur
    if residual == "input":
        residual = net.g.input(f"r{len(net.inputs)}", list(shape))
        net.inputs.append(residual)
    if residual:
        h = net.g.op("Add", [h, residual])
    gamma, beta = net.uniform(shape[axis:] if gamma is None else gamma), net.normal(shape[axis:], std=0.1)
    if form == "op":
        net.set(net.g.op("LayerNormalization", [h, gamma, beta], axis=axis, epsilon=epsilon), shape)
        return
    net.needs_opset(DECOMPOSED_LN_OPSET)
    axes = net.g.const(np.array([-1], np.int64))
    centered = net.g.op("Sub", [h, net.g.op("ReduceMean", [h, axes])])
    var = net.g.op("ReduceMean", [net.g.op("Pow", [centered, net.g.const(np.array(2.0, np.float32))]), axes])
    std = net.g.op("Sqrt", [net.g.op("Add", [var, net.g.const(np.array(epsilon, np.float32))])])
    net.set(net.g.op("Add", [net.g.op("Mul", [net.g.op("Div", [centered, std]), gamma]), beta]), shape)


@dataclass(frozen=True)
class LayerKind:
    """One row of the table: how to draw a layer's parameters and how to emit it, and where it applies."""

    draw: Callable  # (draw, net, keep_shape) -> params for the current value
    emit: Callable  # (net, **params): appends the nodes and moves net.cur on
    domains: tuple = DOMAINS
    weight: int = 1  # how often it is drawn, relative to the other kinds that apply
    branch: bool = False  # may be a branch of a fork (keeps the shape when asked to)
    when: Callable = lambda net: True  # applies to the current value

    def applies(self, net: Net) -> bool:
        return net.domain in self.domains and self.when(net)


#: the layer kinds, simplest first (Hypothesis shrinks towards the first)
LAYER_KINDS = {
    "act": LayerKind(draw_act, emit_act, weight=3, branch=True),
    "bn": LayerKind(draw_nothing, emit_bn, weight=2, branch=True, when=lambda net: net.shape[1] != BATCH),
    "bias_add": LayerKind(draw_bias_add, emit_bias_add, branch=True),
    "elementwise": LayerKind(draw_elementwise, emit_elementwise, weight=2, branch=True),
    "conv": LayerKind(draw_conv, emit_conv, domains=("image",), weight=4, branch=True),
    "dense": LayerKind(draw_dense, emit_dense, domains=("tokens",), weight=4, branch=True),
    "layer_norm": LayerKind(draw_layer_norm, emit_layer_norm, domains=("tokens",), weight=3, branch=True),
    "block": LayerKind(draw_block, emit_block, weight=4, branch=True),
    "off_axis": LayerKind(draw_off_axis, emit_block, weight=3, branch=True),
    "squeeze_excite": LayerKind(draw_squeeze_excite, emit_squeeze_excite, domains=("image",), weight=3, branch=True),
    "attention": LayerKind(draw_attention, emit_attention, domains=("tokens",), weight=3, branch=True,
                           when=lambda net: len(net.shape) == 3),
    "skip_add": LayerKind(draw_skip_add, emit_skip_add, weight=2, when=lambda net: bool(net.same_shape())),
    "fork": LayerKind(draw_fork, emit_fork),
    "near_act": LayerKind(draw_near_act, emit_near_act, weight=2, branch=True),
    "pair": LayerKind(draw_pair, emit_pair, weight=2, branch=True),
    "if": LayerKind(draw_if, emit_if, branch=True),
    "nested": LayerKind(draw_nested, emit_nested, weight=2, branch=True),
    "escape": LayerKind(draw_nothing, emit_escape,
                        when=lambda net: net.cur not in net.inputs and net.cur not in net.outputs),
    "to_tokens": LayerKind(draw_to_tokens, emit_to_tokens, domains=("image",)),
}


def _fmt(params: dict) -> str:
    def value(v):
        if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str) and isinstance(v[1], dict):
            return f"{v[0]}({_fmt(v[1])})"  # a fork's branch
        if isinstance(v, tuple) and v and all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], dict)
                                              for x in v):
            return " -> ".join(value(x) for x in v)  # a block's layers
        return repr(v)

    return ", ".join(f"{k}={value(v)}" for k, v in params.items())


def _add(net: Net, name: str, params: dict) -> None:
    LAYER_KINDS[name].emit(net, **params)
    net.log.append(f"  {name}({_fmt(params)}) -> {net.cur} {list(net.shape)}")


def build(plan: Plan) -> RandomGraph:
    """The graph of a plan (drawn, printed in a failure's .txt file, or written by hand)."""
    net = Net.start(plan.domain, plan.input_shape, plan.seed)
    for name, params in plan.layers:
        _add(net, name, params)
    return net.finish(plan)


def _input_shapes(domain: str):
    if domain == "image":
        return st.tuples(st.integers(1, 2), st.integers(1, MAX_CHANNELS), st.integers(3, MAX_SPATIAL),
                         st.integers(3, MAX_SPATIAL)) | \
            st.integers(3, MAX_SPATIAL).map(lambda c: (1, c, c, c))  # C == H == W
    # [batch, features]: Gemm applies; [1, F, F]: a (F, 1) constant has F elements but is not per feature;
    # ranks 4 and 5: batched MatMul, LayerNorm and elementwise ops over more axes
    return st.tuples(st.integers(1, 2), st.integers(1, 8), st.integers(2, MAX_CHANNELS)) | \
        st.tuples(st.integers(1, 4), st.integers(2, MAX_CHANNELS)) | \
        st.integers(2, 8).map(lambda f: (1, f, f)) | \
        st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 4), st.integers(2, 8)) | \
        st.tuples(st.integers(1, 2), st.integers(1, 2), st.integers(1, 3), st.integers(1, 3), st.integers(2, 6))


@st.composite
def onnx_graphs(draw, domains=DOMAINS, max_layers: int = MAX_LAYERS, dtypes=DTYPES, without=()) -> RandomGraph:
    """Draws a small random ONNX graph: an image or token input, then 1 to `max_layers` layers from LAYER_KINDS
    (conv, BatchNorm, activations in every ONNX form and with nudged constants, broadcast constants, Max/Min/
    Sum/Mean pairs, elementwise ops, MatMul/Gemm, LayerNorm, conv/dense blocks, squeeze-excite, attention, If,
    forks and escaped intermediates), then up to 4 odd node / value names, as a
    RandomGraph(model, description, plan). Half the graphs have a symbolic batch (BATCH); a third each are
    float32, float16 and bfloat16 (the float32 graph converted: `Plan.dtype`), or one of `dtypes`; a symbolic
    batch has an upper bound half the time (`Plan.bound`). `without`: layer kinds not drawn."""
    domain = draw(st.sampled_from(domains))
    shape = draw(_input_shapes(domain))
    bound = None
    if draw(st.booleans()):
        shape = (BATCH, *shape[1:])
        bound = draw(st.sampled_from(BOUNDS))
    seed = draw(st.integers(0, 2**16 - 1))
    net = Net.start(domain, shape, seed)
    layers = []
    for _ in range(draw(st.integers(1, max_layers))):
        choices = [name for name, kind in LAYER_KINDS.items() if kind.applies(net) and name not in without
                   for _ in range(kind.weight)]
        name = draw(st.sampled_from(choices))
        params = LAYER_KINDS[name].draw(draw, net, keep_shape=False)
        _add(net, name, params)
        layers.append((name, params))
    names = draw_names(draw, len(net.g.nodes))
    dtype = draw(st.sampled_from(dtypes))
    return net.finish(Plan(domain, shape, seed, tuple(layers), names, dtype, bound))
