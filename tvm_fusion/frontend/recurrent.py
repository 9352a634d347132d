"""LSTM / GRU / RNN  ==>  a MatMul over every step and a time-loop kernel, or ops unrolled over time.

TVM's ONNX importer has no converter for the recurrent ops, so the front door rewrites each one before it runs.
Per direction:

    XW = X @ W^T + Wb                      one MatMul for every step ([T, N, I] x [I, G*H]; dense_bias)
    per step t:  gates = XW[t] + (H @ R^T + Rb)
    LSTM  i, o, f, c~ = f(gates_i + P_i * C), f(... + P_o * C'), f(... + P_f * C), g(gates_c)
          C' = f * C + i * c~ (f = 1 - i with input_forget),  H' = o * h(C')
    GRU   z, r = f(gates_z), f(gates_r);  h~ = g(XW_h + (r * H) @ R_h^T + Rb_h)   (linear_before_reset=0)
                                          h~ = g(XW_h + r * (H @ R_h^T + Rb_h))   (linear_before_reset=1)
          H' = (1 - z) * h~ + z * H
    RNN   H' = f(gates)

The steps are one `RecurrentScan` node per direction, which the importer makes one kernel with the time loop
inside (recurrent_kernel.py; it computes in float32, float64 for double): one call per direction instead of a
few per step, and a sequence length that may be symbolic. With `kernel=False` the steps are unrolled instead
into ops TVM and onnxruntime import (H @ R^T + Rb: MatMul and Add), for a length known at compile time (a
symbolic one is refused, naming the `--shape` to give): the same semantics as a plain ONNX graph, which the
tests run in onnxruntime beside the node itself.

`clip` bounds every activation's input; `sequence_lens` holds a batch entry's state past its length and zeroes
its outputs there (as onnxruntime does; a reverse direction then starts at the entry's last step, and an entry
of length 0 ends with zero states); a missing initial state is zero (the first step has no recurrent MatMul).
Unrolled with a symbolic batch, the input projection is made per step on a 2-D [N, I] slice (the dense kernels
take a symbolic batch only in 2-D). Activation parameters are consumed in order by the activations that take
them (onnxruntime's rule). Unrolled, Y is one Concat of the steps and a Reshape per direction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tvm_fusion.frontend import recurrent_kernel as _kernel
from tvm_fusion.errors import FusionError
from tvm_fusion.frontend.simplify import bind_input_shapes

__all__ = ["RECURRENT_OPS", "ACTIVATIONS", "decompose_recurrent", "sequence_first"]

RECURRENT_OPS = ("LSTM", "GRU", "RNN")
_DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}
#: activation (lower case) -> (alphas it takes, betas it takes, default alpha, default beta), as onnxruntime
#: reads them: a function without parameters consumes no entry of activation_alpha / _beta, and a missing
#: parameter is 0 except for LeakyRelu, HardSigmoid and Elu (so Affine and ScaledTanh without parameters give 0)
ACTIVATIONS = {
    "sigmoid": (0, 0, None, None), "tanh": (0, 0, None, None), "relu": (0, 0, None, None),
    "softsign": (0, 0, None, None), "softplus": (0, 0, None, None),
    "affine": (1, 1, 0.0, 0.0), "leakyrelu": (1, 0, 0.01, None), "thresholdedrelu": (1, 0, 0.0, None),
    "scaledtanh": (1, 1, 0.0, 0.0), "hardsigmoid": (1, 1, 0.2, 0.5), "elu": (1, 0, 1.0, None),
}
_FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16)


@dataclass(frozen=True)
class Activation:
    name: str  # lower case, a key of ACTIVATIONS
    alpha: float | None = None
    beta: float | None = None


@dataclass
class _Spec:
    """One recurrent node, read and checked."""

    op: str
    label: str
    hidden: int
    directions: tuple[str, ...]  # ("forward",), ("reverse",) or ("forward", "reverse")
    activations: list[list[Activation]]  # per direction
    clip: float | None
    input_forget: bool
    layout: int
    linear_before_reset: bool
    steps: int | str | None  # a static length, a symbolic one (its name), or unknown
    batch: int | str | None  # a static batch, a symbolic one (its name), or unknown
    inputs: dict  # name in the spec (X, W, R, B, sequence_lens, initial_h, initial_c, P) -> value name
    outputs: list[str]  # Y, Y_h[, Y_c]: "" where not wanted


# ------------------------------------------------------------------------------------------------ reading


def _attrs(node: onnx.NodeProto) -> dict:
    out = {}
    for a in node.attribute:
        value = helper.get_attribute_value(a)
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, list):
            value = [v.decode() if isinstance(v, bytes) else v for v in value]
        out[a.name] = value
    return out


def _activations(op: str, attrs: dict, directions: int, where: str) -> list[list[Activation]]:
    per_dir = len(_DEFAULT_ACTIVATIONS[op])
    names = attrs.get("activations") or list(_DEFAULT_ACTIVATIONS[op]) * directions
    if len(names) != per_dir * directions:
        raise FusionError(f"{where}: has {len(names)} activations {names}; {op} with {directions} direction(s) "
                          f"takes {per_dir * directions} ({per_dir} per direction)")
    alphas, betas = list(attrs.get("activation_alpha", [])), list(attrs.get("activation_beta", []))
    out = []
    for name in names:
        key = name.lower()
        if key not in ACTIVATIONS:
            raise FusionError(f"{where}: activation {name!r} is not one of ONNX's recurrent activations "
                              f"({', '.join(sorted(ACTIVATIONS))})")
        n_alpha, n_beta, alpha, beta = ACTIVATIONS[key]
        if n_alpha:
            alpha = float(alphas.pop(0)) if alphas else alpha
        if n_beta:
            beta = float(betas.pop(0)) if betas else beta
        out.append(Activation(key, alpha, beta))
    return [out[d * per_dir:(d + 1) * per_dir] for d in range(directions)]


_INPUTS = {"LSTM": ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"),
           "GRU": ("X", "W", "R", "B", "sequence_lens", "initial_h"),
           "RNN": ("X", "W", "R", "B", "sequence_lens", "initial_h")}


def _read(node: onnx.NodeProto, label: str, where: str, types: _Types) -> _Spec:
    op = node.op_type
    here = f"{where}: node {label!r} ({op})"
    attrs = _attrs(node)
    direction = attrs.get("direction", "forward")
    dirs = {"forward": ("forward",), "reverse": ("reverse",), "bidirectional": ("forward", "reverse")}.get(direction)
    if dirs is None:
        raise FusionError(f"{here}: direction {direction!r} is not forward, reverse or bidirectional")
    layout = int(attrs.get("layout", 0))
    if layout not in (0, 1):
        raise FusionError(f"{here}: layout {layout} is neither 0 (sequence first) nor 1 (batch first)")
    inputs = {k: v for k, v in zip(_INPUTS[op], node.input) if v}
    x_type, x_dims = types.values.get(inputs["X"], (None, None))
    if x_type is not None and x_type not in _FLOATS:
        raise FusionError(f"{here}: input X has type {TensorProto.DataType.Name(x_type)}; expected a float type")
    steps = x_dims[layout] if x_dims is not None and len(x_dims) == 3 else None
    if isinstance(steps, int) and steps < 1:
        raise FusionError(f"{here}: its input {inputs['X']!r} is a sequence of {steps} steps; give at least one")
    hidden = attrs.get("hidden_size")
    if hidden is None:
        r_dims = types.values.get(inputs["R"], (None, None))[1]
        hidden = r_dims[2] if r_dims is not None and len(r_dims) == 3 and isinstance(r_dims[2], int) else None
        if hidden is None:
            raise FusionError(f"{here}: has no hidden_size attribute and the shape of R is unknown; "
                              "set hidden_size on the node")
    clip = attrs.get("clip")
    dims = x_dims if x_dims is not None and len(x_dims) == 3 else [None, None, None]
    return _Spec(op=op, label=label, hidden=int(hidden), directions=dirs,
                 activations=_activations(op, attrs, len(dirs), here),
                 clip=None if clip is None else float(clip), input_forget=bool(attrs.get("input_forget", 0)),
                 layout=layout, linear_before_reset=bool(attrs.get("linear_before_reset", 0)), steps=steps,
                 batch=dims[1 - layout], inputs=inputs,
                 outputs=list(node.output) + [""] * (3 - len(node.output)))


def _symbolic_length(here: str, x: str, layout: int, dim, types: "_Types") -> str:
    """The error for a sequence length unknown at compile time where the steps are unrolled, naming the input
    dims that set it."""
    what = f"symbolic length {dim!r}" if isinstance(dim, str) else "a length unknown at compile time"
    binds = []
    for name in types.inputs:
        dims = types.values.get(name, (None, None))[1] or []
        if isinstance(dim, str) and dim in dims:
            text = "x".join("LEN" if d == dim else str(d) for d in dims)
            binds.append(f"--shape {name}={text}")
    remedy = (f"give it with {' and '.join(binds)} (LEN: the number of steps)" if binds
              else "bind the input dims that set it with --shape")
    return (f"{here} runs over a sequence of {what} (dim {layout} of its input {x!r}); unrolled, the recurrence "
            f"needs a fixed number of steps: {remedy}")


@dataclass
class _Types:
    """What ONNX shape inference says: {value name: (elem type, dims)} over the model and its subgraphs (a dim
    is an int, a dim_param's name, or None), and the main graph's input names."""

    values: dict
    inputs: tuple


def _value_types(model: onnx.ModelProto) -> _Types:
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - inference is a help here; what it cannot say is reported per node
        inferred = model
    out: dict = {}

    def dims(t):
        if not t.HasField("shape"):
            return None
        return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]

    for graph in _graphs(inferred.graph):
        for v in list(graph.input) + list(graph.value_info) + list(graph.output):
            if v.type.HasField("tensor_type"):
                out.setdefault(v.name, (v.type.tensor_type.elem_type, dims(v.type.tensor_type)))
        for t in graph.initializer:
            out.setdefault(t.name, (t.data_type, list(t.dims)))
    return _Types(out, tuple(i.name for i in model.graph.input))


# ------------------------------------------------------------------------------------------------ emitting


class _Emitter:
    """Appends ONNX nodes and initializers that compute one recurrent node, in its model's opset and dtype.
    Every name is new in the model (`taken`); every node is named `<node>/<what>`."""

    def __init__(self, prefix: str, opset: int, elem_type: int, taken: set[str]):
        self.prefix, self.opset, self.elem_type, self.taken = prefix, opset, elem_type, taken
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._consts: dict = {}

    def name(self, hint: str) -> str:
        base = f"{self.prefix}/{hint}"
        name, i = base, 1
        while name in self.taken:
            name, i = f"{base}_{i}", i + 1
        self.taken.add(name)
        return name

    def op(self, op_type: str, inputs: list[str], hint: str = "", out: str | None = None, **attrs) -> str:
        out = out or self.name(hint or op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=self.name(f"{hint or op_type}_node"), **attrs))
        return out

    def const(self, value, hint: str = "const", elem_type: int | None = None) -> str:
        """An initializer (the model's float dtype unless `elem_type`), made once per value."""
        elem_type = self.elem_type if elem_type is None else elem_type
        array = np.asarray(value, dtype=helper.tensor_dtype_to_np_dtype(elem_type))
        key = (elem_type, array.shape, array.tobytes())
        if key not in self._consts:
            if elem_type == TensorProto.BFLOAT16:
                tensor = helper.make_tensor(self.name(hint), elem_type, array.shape,
                                            np.asarray(value, np.float32).flatten().tolist())
            else:
                tensor = numpy_helper.from_array(array, self.name(hint))
            self.initializers.append(tensor)
            self._consts[key] = tensor.name
        return self._consts[key]

    def ints(self, values, hint: str = "index") -> str:
        return self.const(np.asarray(values, np.int64), hint, TensorProto.INT64)

    # opset-dependent forms
    def slice(self, x: str, axis: int, start: int, end: int, hint: str = "slice") -> str:
        if self.opset >= 10:
            return self.op("Slice", [x, self.ints([start]), self.ints([end]), self.ints([axis])], hint)
        # TVM's importer fails on the attribute form (opset < 10): a Gather of the indices computes the same
        return self.op("Gather", [x, self.ints(list(range(start, end)))], hint, axis=axis)

    def unsqueeze(self, x: str, axes: list[int], hint: str = "unsqueeze", out: str | None = None) -> str:
        if self.opset >= 13:
            return self.op("Unsqueeze", [x, self.ints(axes)], hint, out)
        return self.op("Unsqueeze", [x], hint, out, axes=axes)

    def squeeze(self, x: str, axes: list[int], hint: str = "squeeze") -> str:
        if self.opset >= 13:
            return self.op("Squeeze", [x, self.ints(axes)], hint)
        return self.op("Squeeze", [x], hint, axes=axes)

    def unstack(self, x: str, axis: int, count: int, hint: str) -> list[str]:
        """x's `count` slices along `axis`, the axis dropped: a Slice and a Squeeze each, which TVM fuses into
        their consumer (one Split with `count` outputs made one kernel whose scheduling took quadratic time)."""
        return [self.squeeze(self.slice(x, axis, k, k + 1, f"{hint}{k}_slice"), [axis], f"{hint}{k}")
                for k in range(count)]

    def clip(self, x: str, bound: float | None) -> str:
        if bound is None:
            return x
        if self.opset >= 11:
            return self.op("Clip", [x, self.const(-bound, "clip_min"), self.const(bound, "clip_max")], "clip")
        return self.op("Clip", [x], "clip", min=-bound, max=bound)

    def gather(self, x: str, index: int, axis: int, hint: str) -> str:
        """x[index] along `axis`, the axis dropped."""
        return self.op("Gather", [x, self.ints(index)], hint, axis=axis)

    def select(self, mask: str | None, new: str, old: str | None, hint: str) -> str:
        """Where(mask, new, old) with old = 0 when None; `new` when there is no mask."""
        if mask is None:
            return new
        old = old or self.const(0.0, "zero")
        if self.opset >= 9:
            return self.op("Where", [mask, new, old], hint)
        keep = self.op("Cast", [mask], "mask", to=self.elem_type)  # opset < 9: m * new + (1 - m) * old
        drop = self.op("Sub", [self.const(1.0, "one"), keep], "unmask")
        return self.op("Add", [self.op("Mul", [keep, new]), self.op("Mul", [drop, old])], hint)

    def activation(self, act: Activation, x: str, hint: str) -> str:
        a, b = act.alpha, act.beta
        simple = {"sigmoid": "Sigmoid", "tanh": "Tanh", "relu": "Relu", "softsign": "Softsign", "softplus": "Softplus"}
        if act.name in simple:
            return self.op(simple[act.name], [x], hint)
        if act.name == "leakyrelu":
            return self.op("LeakyRelu", [x], hint, alpha=a)
        if act.name == "elu":
            return self.op("Elu", [x], hint, alpha=a)
        if act.name == "hardsigmoid":
            return self.op("HardSigmoid", [x], hint, alpha=a, beta=b)
        if act.name == "affine":
            return self.op("Add", [self.op("Mul", [x, self.const(a, "alpha")]), self.const(b, "beta")], hint)
        if act.name == "scaledtanh":
            inner = self.op("Tanh", [self.op("Mul", [x, self.const(b, "beta")])])
            return self.op("Mul", [inner, self.const(a, "alpha")], hint)
        if act.name == "thresholdedrelu":  # x where x > alpha, else 0 (the op itself is opset 10)
            above = self.op("Cast", [self.op("Greater", [x, self.const(a, "alpha")])], to=self.elem_type)
            return self.op("Mul", [x, above], hint)
        raise AssertionError(act.name)  # _activations admits only ACTIVATIONS


# ------------------------------------------------------------------------------------------------ one node


@dataclass
class _Direction:
    """One direction's operands: W^T [I, G*H], R^T [H, G*H], the biases [G*H], initial states [N, H] (None:
    zero), peepholes (p_i, p_o, p_f) [H]."""

    index: int
    reverse: bool
    acts: list[Activation]
    wt: str
    wb: str
    rt: str
    rb: str
    h0: str | None
    c0: str | None
    peep: tuple[str, str, str] | None
    split: dict  # GRU with linear_before_reset=0: R^T and Rb of the z, r gates and of the h gate


def _direction(e: _Emitter, spec: _Spec, d: int) -> _Direction:
    ins, hsz = spec.inputs, spec.hidden
    gh = _kernel.GATES[spec.op] * hsz
    wt = e.op("Transpose", [e.gather(ins["W"], d, 0, f"W{d}")], f"W{d}_t", perm=[1, 0])
    rt = e.op("Transpose", [e.gather(ins["R"], d, 0, f"R{d}")], f"R{d}_t", perm=[1, 0])
    if "B" in ins:
        b = e.gather(ins["B"], d, 0, f"B{d}")
        wb, rb = e.slice(b, 0, 0, gh, f"Wb{d}"), e.slice(b, 0, gh, 2 * gh, f"Rb{d}")
    else:
        wb = rb = e.const(np.zeros(gh), "zero_bias")
    state_axis = 0 if spec.layout == 0 else 1  # initial states: [D, N, H] or [N, D, H]
    h0 = e.gather(ins["initial_h"], d, state_axis, f"h0_{d}") if "initial_h" in ins else None
    c0 = e.gather(ins["initial_c"], d, state_axis, f"c0_{d}") if "initial_c" in ins else None
    peep = None
    if "P" in ins:
        p = e.gather(ins["P"], d, 0, f"P{d}")
        peep = tuple(e.slice(p, 0, k * hsz, (k + 1) * hsz, f"P{d}_{g}") for k, g in enumerate("iof"))
    split = {}
    if spec.op == "GRU" and not spec.linear_before_reset:
        split = {"rt_zr": e.slice(rt, 1, 0, 2 * hsz, f"R{d}_zr_t"), "rt_h": e.slice(rt, 1, 2 * hsz, gh, f"R{d}_h_t"),
                 "rb_zr": e.slice(rb, 0, 0, 2 * hsz, f"Rb{d}_zr"), "rb_h": e.slice(rb, 0, 2 * hsz, gh, f"Rb{d}_h")}
    return _Direction(d, spec.directions[d] == "reverse", spec.activations[d], wt, wb, rt, rb, h0, c0, peep, split)


def _recurrent(e: _Emitter, h: str | None, rt: str, rb: str, hint: str) -> str:
    """h @ R^T + Rb (dense_bias); Rb alone when the state is zero."""
    return rb if h is None else e.op("Add", [e.op("MatMul", [h, rt], f"{hint}_mm"), rb], hint)


def _lstm_step(e: _Emitter, spec: _Spec, dr: _Direction, xw: str, h, c, t: int):
    hsz, (f, g, hact) = spec.hidden, dr.acts
    gates = e.op("Add", [xw, _recurrent(e, h, dr.rt, dr.rb, f"d{dr.index}t{t}_rec")], f"d{dr.index}t{t}_gates")
    gi, go, gf, gc = (e.slice(gates, 1, k * hsz, (k + 1) * hsz, f"d{dr.index}t{t}_{n}") for k, n in enumerate("iofc"))
    if dr.peep and c is not None:
        gi = e.op("Add", [gi, e.op("Mul", [c, dr.peep[0]])])
        gf = e.op("Add", [gf, e.op("Mul", [c, dr.peep[2]])])
    i = e.activation(f, e.clip(gi, spec.clip), "input_gate")
    if spec.input_forget:
        fg = e.op("Sub", [e.const(1.0, "one"), i], "forget_gate")
    else:
        fg = e.activation(f, e.clip(gf, spec.clip), "forget_gate")
    cand = e.activation(g, e.clip(gc, spec.clip), "cell_candidate")
    c_new = e.op("Mul", [i, cand])
    if c is not None:
        c_new = e.op("Add", [e.op("Mul", [fg, c]), c_new], f"d{dr.index}t{t}_c")
    if dr.peep:
        go = e.op("Add", [go, e.op("Mul", [c_new, dr.peep[1]])])
    o = e.activation(f, e.clip(go, spec.clip), "output_gate")
    return e.op("Mul", [o, e.activation(hact, c_new, "cell_out")], f"d{dr.index}t{t}_h"), c_new


def _gates(e: _Emitter, x: str, count: int, hidden: int, rank: int, hint: str) -> list[str]:
    """x's `count` gates of `hidden` each along its last axis: a step's [N, count * H], or a bias alone [count * H]
    where the state is zero. Slices, which TVM fuses into their consumers (a Split made fewer, slower kernels)."""
    return [e.slice(x, rank - 1, k * hidden, (k + 1) * hidden, f"{hint}{k}") for k in range(count)]


def _gru_step(e: _Emitter, spec: _Spec, dr: _Direction, xw: str, h, c, t: int):
    f, g = dr.acts
    x_part = _gates(e, xw, 3, spec.hidden, 2, f"d{dr.index}t{t}_x")
    if spec.linear_before_reset:  # h~ = g(x_h + r * (H @ R_h^T + Rb_h)): one MatMul of all three gates
        rec = _recurrent(e, h, dr.rt, dr.rb, f"d{dr.index}t{t}_rec")
        h_part = _gates(e, rec, 3, spec.hidden, 1 if h is None else 2, f"d{dr.index}t{t}_rec")
        z, r = (e.activation(f, e.clip(e.op("Add", [x, hp]), spec.clip), n)
                for x, hp, n in zip(x_part, h_part, ("update_gate", "reset_gate")))
        pre = e.op("Add", [x_part[2], e.op("Mul", [r, h_part[2]])])
    else:  # h~ = g(x_h + (r * H) @ R_h^T + Rb_h): the reset gate comes before the third MatMul
        rt_zr, rt_h, rb_zr, rb_h = (dr.split[k] for k in ("rt_zr", "rt_h", "rb_zr", "rb_h"))
        rec_zr = _gates(e, _recurrent(e, h, rt_zr, rb_zr, f"d{dr.index}t{t}_rec"), 2, spec.hidden,
                        1 if h is None else 2, f"d{dr.index}t{t}_rec")
        z, r = (e.activation(f, e.clip(e.op("Add", [x, hp]), spec.clip), n)
                for x, hp, n in zip(x_part, rec_zr, ("update_gate", "reset_gate")))
        reset = None if h is None else e.op("Mul", [r, h], f"d{dr.index}t{t}_reset")
        pre = e.op("Add", [x_part[2], _recurrent(e, reset, rt_h, rb_h, f"d{dr.index}t{t}_rec_h")])
    cand = e.activation(g, e.clip(pre, spec.clip), "hidden_candidate")
    h_new = e.op("Mul", [e.op("Sub", [e.const(1.0, "one"), z]), cand])
    if h is not None:
        h_new = e.op("Add", [h_new, e.op("Mul", [z, h])], f"d{dr.index}t{t}_h")
    return h_new, None


def _rnn_step(e: _Emitter, spec: _Spec, dr: _Direction, xw: str, h, c, t: int):
    pre = e.op("Add", [xw, _recurrent(e, h, dr.rt, dr.rb, f"d{dr.index}t{t}_rec")])
    return e.activation(dr.acts[0], e.clip(pre, spec.clip), f"d{dr.index}t{t}_h"), None


_STEP = {"LSTM": _lstm_step, "GRU": _gru_step, "RNN": _rnn_step}


def _masks(e: _Emitter, spec: _Spec, constants: dict) -> list[str | None]:
    """Per step, [N, 1] bool: t < sequence_lens (None everywhere when there are no lengths, or they are
    constants equal to the sequence length)."""
    lens = spec.inputs.get("sequence_lens")
    if lens is None or (lens in constants and (np.asarray(constants[lens]) == spec.steps).all()):
        return [None] * spec.steps
    lens_f = e.op("Cast", [lens], "lengths", to=TensorProto.FLOAT)
    return [e.unsqueeze(e.op("Less", [e.const(float(t), f"t{t}", TensorProto.FLOAT), lens_f]), [1], f"t{t}_valid")
            for t in range(spec.steps)]


def _projection(e: _Emitter, spec: _Spec, dr: _Direction, x_steps: list) -> list[str]:
    """X @ W^T + Wb per step ([N, G*H]): one MatMul over all steps with a static batch, else one per step on
    the step's [N, I] slice (shared by the directions through `x_steps`)."""
    x, axis = spec.inputs["X"], spec.layout
    if isinstance(spec.batch, int):
        xw = e.op("Add", [e.op("MatMul", [x, dr.wt], f"d{dr.index}_xw_mm"), dr.wb], f"d{dr.index}_xw")
        return e.unstack(xw, axis, spec.steps, f"d{dr.index}_xw_t")
    if not x_steps:
        x_steps += e.unstack(x, axis, spec.steps, "x_t")
    return [e.op("Add", [e.op("MatMul", [x_steps[t], dr.wt]), dr.wb], f"d{dr.index}t{t}_xw")
            for t in range(spec.steps)]


def _emit(e: _Emitter, spec: _Spec, constants: dict) -> None:
    masks = _masks(e, spec, constants)
    step = _STEP[spec.op]
    x_steps: list[str] = []
    ys, finals = [], []
    for d in range(len(spec.directions)):
        dr = _direction(e, spec, d)
        xw = _projection(e, spec, dr, x_steps)
        h, c, y = dr.h0, dr.c0, [None] * spec.steps
        for t in (reversed(range(spec.steps)) if dr.reverse else range(spec.steps)):
            h_new, c_new = step(e, spec, dr, xw[t], h, c, t)
            y[t] = e.select(masks[t], h_new, None, f"d{d}t{t}_y")
            h = e.select(masks[t], h_new, h, f"d{d}t{t}_h_state")
            c = e.select(masks[t], c_new, c, f"d{d}t{t}_c_state") if c_new is not None else None
        ys.append(y)
        # an entry of length 0 ends with zero states, not its initial ones (onnxruntime); masks[0]: length > 0
        finals.append(tuple(s if s is None else e.select(masks[0], s, None, f"d{d}_final") for s in (h, c)))
    _outputs(e, spec, ys, finals)


def _emit_scan(e: _Emitter, spec: _Spec, constants: dict) -> None:
    """Per direction: XW = X @ W^T + Wb over every step (one MatMul), then one RecurrentScan node (the kernel
    of recurrent_kernel.py) for the time loop; Y's directions stacked, the final states as _outputs makes them."""
    lens = spec.inputs.get("sequence_lens")
    if lens in constants and spec.steps is not None and (np.asarray(constants[lens]) == spec.steps).all():
        lens = None  # every entry runs the whole sequence
    ys, finals = [], []
    for d in range(len(spec.directions)):
        dr = _direction(e, spec, d)
        xw = e.op("Add", [e.op("MatMul", [spec.inputs["X"], dr.wt], f"d{d}_xw_mm"), dr.wb], f"d{d}_xw")
        optional = {"h0": dr.h0, "lens": lens}
        if spec.op == "LSTM":
            optional |= {"c0": dr.c0, "P": e.gather(spec.inputs["P"], d, 0, f"P{d}") if "P" in spec.inputs else None}
        double = e.elem_type == TensorProto.DOUBLE
        half = not double and e.elem_type != TensorProto.FLOAT  # float16 / bfloat16: the kernel's in float32
        wide = (lambda v: e.op("Cast", [v], "to_float", to=TensorProto.FLOAT)) if half else (lambda v: v)
        names, given = _kernel.scan_node_inputs(wide(xw), wide(dr.rt), wide(dr.rb),
                                                {k: v and (v if k == "lens" else wide(v)) for k, v in optional.items()})
        cell = _kernel.Cell(spec.op, spec.hidden, tuple((a.name, a.alpha, a.beta) for a in dr.acts), spec.clip,
                            spec.input_forget, spec.linear_before_reset, dr.reverse, spec.layout, given,
                            "float64" if double else "float32")
        outs = [e.name(f"d{d}_{k}") for k in (("Y", "h", "c") if spec.op == "LSTM" else ("Y", "h"))]
        e.nodes.append(helper.make_node(_kernel.SCAN_OP, names, outs, name=e.name(f"d{d}_scan"),
                                        domain=_kernel.SCAN_DOMAIN, cell=cell.to_json()))
        if half:
            outs = [e.op("Cast", [o], "from_float", to=e.elem_type) for o in outs]
        ys.append(outs[0])
        finals.append((outs[1], outs[2] if spec.op == "LSTM" else None))
    y_out = spec.outputs[0]
    if y_out:  # [T, N, H] per direction -> [T, D, N, H] (layout 1: [N, T, H] -> [N, T, D, H])
        axis = 1 if spec.layout == 0 else 2
        per_dir = [e.unsqueeze(y, [axis], f"d{d}_Y", y_out if len(ys) == 1 else None) for d, y in enumerate(ys)]
        if len(per_dir) > 1:
            e.op("Concat", per_dir, "Y", y_out, axis=axis)
    _final_states(e, spec, finals)


def _outputs(e: _Emitter, spec: _Spec, ys: list[list[str]], finals: list[tuple]) -> None:
    """Y [T, D, N, H] (layout 1: [N, T, D, H]), Y_h and Y_c [D, N, H] (layout 1: [N, D, H])."""
    y_out, h_out, c_out = spec.outputs[:3]
    if y_out:
        # the steps' [N, H] joined on axis 0 are [T, N, H] in memory, on axis 1 [N, T, H]: one Concat and a
        # Reshape per direction (-1: the batch, which may be symbolic)
        shape, dir_axis = ([spec.steps, 1, -1, spec.hidden], 1) if spec.layout == 0 else ([-1, spec.steps, 1, spec.hidden], 2)
        per_dir = []
        for d, y in enumerate(ys):
            joined = y[0] if len(y) == 1 else e.op("Concat", y, f"d{d}_Y_steps", axis=spec.layout)
            out = y_out if len(ys) == 1 else None
            per_dir.append(e.op("Reshape", [joined, e.ints(shape, "Y_shape")], f"d{d}_Y", out))
        if len(per_dir) > 1:
            e.op("Concat", per_dir, "Y", y_out, axis=dir_axis)
    _final_states(e, spec, finals)


def _final_states(e: _Emitter, spec: _Spec, finals: list[tuple]) -> None:
    """Y_h and Y_c [D, N, H] (layout 1: [N, D, H]) of each direction's final (h, c) [N, H]."""
    _, h_out, c_out = spec.outputs[:3]
    state_axis = 0 if spec.layout == 0 else 1
    for out, k, what in ((h_out, 0, "Y_h"), (c_out, 1, "Y_c")):
        if out:
            states = [f[k] for f in finals]
            if len(states) == 1:
                e.unsqueeze(states[0], [state_axis], what, out)
            else:
                e.op("Concat", [e.unsqueeze(s, [state_axis]) for s in states], what, out, axis=state_axis)


# ------------------------------------------------------------------------------------------------ the model


def _graphs(graph: onnx.GraphProto):
    """`graph` and every subgraph (If / Loop / Scan bodies), depth first."""
    yield graph
    for node in graph.node:
        for a in node.attribute:
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                yield from _graphs(g)


def _is_recurrent(node: onnx.NodeProto) -> bool:
    return node.op_type in RECURRENT_OPS and node.domain in ("", "ai.onnx")


def _taken_names(model: onnx.ModelProto) -> set[str]:
    names = set()
    for g in _graphs(model.graph):
        names.update(v.name for v in list(g.input) + list(g.output) + list(g.value_info))
        names.update(t.name for t in g.initializer)
        for n in g.node:
            names.update([n.name, *n.input, *n.output])
    return names


def decompose_recurrent(model: onnx.ModelProto, shapes: dict, where: str,
                        kernel: bool = True) -> tuple[onnx.ModelProto, dict[str, str]]:
    """`model` with every LSTM, GRU and RNN node (subgraphs included) replaced by the ops that compute it.

    `shapes`: the input shapes import_onnx binds ({name: dims}; a symbolic dim is a frontend.SymDim), which
    fix the sequence length. `kernel`: each node becomes RecurrentScan nodes (False: unrolled, a graph
    onnxruntime runs). Returns the model (the same object when it has no recurrent node) and
    {new node name: name of the recurrent node it came from}. A sequence length unknown at compile time, an
    unknown activation or a malformed attribute is a FusionError naming the node."""
    if not any(_is_recurrent(n) for g in _graphs(model.graph) for n in g.node):
        return model, {}

    model = onnx.ModelProto.FromString(model.SerializeToString())
    types = _value_types(bind_input_shapes(model, shapes))
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=1)
    taken, origins, scans = _taken_names(model), {}, False
    initializers = {t.name: t for g in _graphs(model.graph) for t in g.initializer}
    for graph in reversed(list(_graphs(model.graph))):  # branches first: rewriting a graph copies its nodes
        nodes = []
        for i, node in enumerate(graph.node):
            if not _is_recurrent(node):
                nodes.append(node)
                continue
            label = node.name or f"{node.op_type} (node {i})"
            spec = _read(node, label, where, types)
            elem = next((types.values[v][0] for v in (spec.inputs["X"], spec.inputs["W"]) if v in types.values),
                        TensorProto.FLOAT)
            e = _Emitter(node.name or f"{node.op_type}_{i}", opset, elem, taken)
            lens = spec.inputs.get("sequence_lens")
            constants = {lens: numpy_helper.to_array(initializers[lens])} if lens in initializers else {}
            if kernel:
                _emit_scan(e, spec, constants)
                scans = True
            elif isinstance(spec.steps, int):
                _emit(e, spec, constants)
            else:
                raise FusionError(_symbolic_length(f"{where}: node {label!r} ({spec.op})", spec.inputs["X"],
                                                   spec.layout, spec.steps, types))
            nodes += e.nodes
            model.graph.initializer.extend(e.initializers)  # the main graph's: visible in every subgraph
            origins.update({n.name: label for n in e.nodes})
        del graph.node[:]
        graph.node.extend(nodes)
    if scans:
        model.opset_import.append(helper.make_opsetid(_kernel.SCAN_DOMAIN, 1))
    return model, origins


def sequence_first(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with every batch-first (layout=1) LSTM / GRU / RNN as a layout-0 node between Transposes, which
    computes the same: onnxruntime runs no layout-1 node, and is the reference that checks our builds. The
    same object when there is none."""
    if not any(_is_recurrent(n) and _attrs(n).get("layout", 0) == 1 for g in _graphs(model.graph) for n in g.node):
        return model
    model = onnx.ModelProto.FromString(model.SerializeToString())
    taken = _taken_names(model)

    def fresh(base: str) -> str:
        name, i = base, 1
        while name in taken:
            name, i = f"{base}_{i}", i + 1
        taken.add(name)
        return name

    for graph in reversed(list(_graphs(model.graph))):
        nodes = []
        for node in graph.node:
            if not (_is_recurrent(node) and _attrs(node).get("layout", 0) == 1):
                nodes.append(node)
                continue
            for slot in (0, 5, 6):  # X, initial_h, initial_c: [N, T or D, *] -> [T or D, N, *]
                if len(node.input) > slot and node.input[slot]:
                    moved = fresh(f"{node.input[slot]}_sequence_first")
                    nodes.append(helper.make_node("Transpose", [node.input[slot]], [moved], name=fresh(moved), perm=[1, 0, 2]))
                    node.input[slot] = moved
            after = []
            for slot, perm in ((0, [2, 0, 1, 3]), (1, [1, 0, 2]), (2, [1, 0, 2])):  # Y, Y_h, Y_c back to batch first
                if len(node.output) > slot and node.output[slot]:
                    wanted, node.output[slot] = node.output[slot], fresh(f"{node.output[slot]}_sequence_first")
                    after.append(helper.make_node("Transpose", [node.output[slot]], [wanted], name=fresh(wanted), perm=perm))
            for a in node.attribute:
                if a.name == "layout":
                    a.i = 0
            nodes += [node, *after]
        del graph.node[:]
        graph.node.extend(nodes)
    return model
