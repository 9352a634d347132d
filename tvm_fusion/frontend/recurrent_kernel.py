"""One direction of an LSTM / GRU / RNN over all its steps in one kernel (the recurrence's time loop in TIR).

The front door (recurrent.py) rewrites a recurrent node into its input projection (one MatMul over every
step) and, per direction, one `tvm_fusion.frontend.recurrent::RecurrentScan` node (float32 or float64; a float16 or
bfloat16 node's between Casts to float32 and back), which the importer turns into a call of the kernel made
here. Per step the kernel computes the recurrent product h @ R^T + Rb and the cell's
update, with the state kept in the kernel:

    llvm : batch entries in parallel (a static batch of 1 runs serially); per step, for k < H: a vector
           multiply-add of h[k] times row k of R^T into the gates (rows of R^T are contiguous), then the cell
           update as a vector over the hidden units
    cuda : one thread block per batch entry, a thread per gate (in chunks of the block); the state and the
           gates in shared memory, a barrier between the phases of a step

A sequence length or batch unknown at compile time is a loop bound read from the tensors' shapes: a symbolic
length needs no unrolling. `sequence_lens` holds an entry's state past its length and zeroes its outputs there
(a reverse direction starts at the entry's last step); an entry of length 0 ends with zero states, as in
onnxruntime. The PrimFunc made at import is the llvm form; `for_target` remakes it for a GPU target from the
parameters it records (`ATTR`).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from tvm_fusion._tvm import te, tirx, tvm
from tvm_fusion.errors import FusionError
from tvm_fusion.hardware import cuda_facts
from tvm_fusion.schedules.activations import KernelMath
from tvm_fusion.schedules.llvm import fast_math  # noqa: F401  (registers the llvm float32 forms)

__all__ = ["SCAN_DOMAIN", "SCAN_OP", "ATTR", "Cell", "check_target", "convert", "for_target"]

SCAN_DOMAIN, SCAN_OP = "tvm_fusion.recurrent", "RecurrentScan"
ATTR = "tvm_fusion.recurrent_scan"  # the PrimFunc attribute: the Cell as JSON
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}  # the gates of each op, in its weights' order
_OPTIONAL = ("h0", "c0", "P", "lens")  # inputs after xw, rt, rb, in this order


@dataclass(frozen=True)
class Cell:
    """What one RecurrentScan node computes."""

    op: str  # LSTM, GRU or RNN
    hidden: int
    acts: tuple  # ((name, alpha, beta), ...) as recurrent.Activation, per the op's activation slots
    clip: float | None
    input_forget: bool
    linear_before_reset: bool
    reverse: bool
    layout: int  # 0: xw [T, N, G*H], y [T, N, H]; 1: xw [N, T, G*H], y [N, T, H]
    given: tuple  # which of _OPTIONAL the node has
    dtype: str = "float32"  # float32 or float64: the tensors' and the arithmetic's (recurrent.py casts half types)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "Cell":
        d = json.loads(text)
        return Cell(**{**d, "acts": tuple(tuple(a) for a in d["acts"]), "given": tuple(d["given"])})


# ------------------------------------------------------------------------------------------------ the math


class _Math:
    """Constants in the compute type; exp, sigmoid and tanh as activations.KernelMath gives them: on the CPU the
    vectorizable float32 forms of schedules/llvm/fast_math.py (LLVM makes a vector exp one libm call per lane),
    elsewhere TVM's intrinsics."""

    def __init__(self, gpu: bool, dtype: str):
        self.dtype = dtype
        kernel = KernelMath.of(not gpu, "llvm")
        self.exp, self.sigmoid, self.tanh = kernel.exp, kernel.sigmoid, kernel.tanh

    def c(self, v) -> tirx.PrimExpr:
        return tirx.const(float(v), self.dtype)


def _act(act, x, math: _Math):
    name, a, b = act
    c = math.c
    zero, one = c(0), c(1)
    if name == "sigmoid":
        return math.sigmoid(x)
    if name == "tanh":
        return math.tanh(x)
    if name == "relu":
        return tirx.max(x, zero)
    if name == "softsign":
        return x / (one + tirx.abs(x))
    if name == "softplus":
        return tirx.log(one + math.exp(x))
    if name == "affine":
        return c(a) * x + c(b)
    if name == "leakyrelu":
        return tirx.Select(x < zero, c(a) * x, x)
    if name == "thresholdedrelu":
        return tirx.Select(x > c(a), x, zero)
    if name == "scaledtanh":
        return c(a) * math.tanh(c(b) * x)
    if name == "hardsigmoid":
        return tirx.max(zero, tirx.min(one, c(a) * x + c(b)))
    if name == "elu":
        return tirx.Select(x < zero, c(a) * (math.exp(x) - one), x)
    raise AssertionError(name)  # recurrent._activations admits only its ACTIVATIONS


def _clip(cell: Cell, x, math: _Math):
    return x if cell.clip is None else tirx.max(math.c(-cell.clip), tirx.min(math.c(cell.clip), x))


# ------------------------------------------------------------------------------------------------ the kernel


class _Body:
    """Writes the kernel with TVM's IR builder: `each(n)` is a loop over n lanes (a vector loop on the CPU; the
    block's threads, in chunks where n is larger, then a barrier, on a GPU). A lane's own state (`own`) is
    read and written by that lane only: on a GPU it lives in the thread's registers, so no thread reads back
    from shared memory what it wrote in the same phase (which would need a barrier inside the phase's
    condition); the hidden state is also kept in shared memory (`h`), which every lane reads in the product."""

    def __init__(self, cell: Cell, gpu: bool, threads: int, serial_threads: bool = False):
        from tvm.script.ir_builder import tirx as T

        self.T, self.cell, self.gpu, self.threads = T, cell, gpu, threads
        self.serial = serial_threads  # the GPU form with its threads as serial loops, to run on the CPU
        self.tx, self.lane = None, 0
        self.math = _Math(gpu, cell.dtype)

    def act(self, slot: int, x, clip: bool = True):
        """The cell's activation `slot` of x, its input clipped where the node has `clip` (every activation's
        but an LSTM's h of its cell state)."""
        return _act(self.cell.acts[slot], _clip(self.cell, x, self.math) if clip else x, self.math)

    def c(self, v):
        return self.math.c(v)

    def sync(self):
        if self.gpu and not self.serial:
            self.T.evaluate(tvm.ir.Call("tirx.tvm_storage_sync", [tvm.ir.StringImm("shared")], ret_ty="void"))

    def _chunks(self, n: int) -> int:
        return (n + self.threads - 1) // self.threads

    @contextmanager
    def each(self, n: int):
        T = self.T
        if not self.gpu:
            with T.vectorized(0, n) as i:
                yield i
            return
        if self.serial:  # each thread's part of the phase in turn; the loop's end is the barrier
            with T.serial(0, self.threads) as tx:
                self.tx = tx
                with self._lanes(n) as i:
                    yield i
            return
        with self._lanes(n) as i:
            yield i
        self.sync()

    @contextmanager
    def _lanes(self, n: int):
        """Thread `tx`'s lanes of n: itself, or its lane in each chunk of the block."""
        T = self.T
        if self._chunks(n) == 1:
            with T.If(self.tx < n):
                with T.Then():
                    self.lane = 0
                    yield self.tx
        else:
            with T.serial(0, self._chunks(n)) as chunk:
                i = chunk * self.threads + self.tx
                with T.If(i < n):
                    with T.Then():
                        self.lane = chunk
                        yield i

    def scratch(self, n: int):
        return self.T.decl_buffer([n], self.cell.dtype, scope="shared" if self.gpu and not self.serial else "global")

    def own(self, n: int):
        if not self.gpu:
            return self.scratch(n)
        if self.serial:  # every thread's registers
            return self.T.decl_buffer([self._chunks(n) * self.threads], self.cell.dtype, scope="global")
        return self.T.decl_buffer([self._chunks(n)], self.cell.dtype, scope="local")

    def _own_index(self):
        return self.lane * self.threads + self.tx if self.serial else self.lane

    def mine(self, buf, j):
        """The lane's element `j` of an `own` buffer."""
        return buf[self._own_index()] if self.gpu else buf[j]

    def set_state(self, own, shared, value, j):
        """own[j] (and shared[j]) = value; the value for the rest of the phase."""
        T = self.T
        if not self.gpu:  # one buffer: `shared` is `own` or None
            T.buffer_store(own, value, [j])
            return own[j]
        reg = T.decl_buffer([1], self.cell.dtype, scope="local")
        T.buffer_store(reg, value, [0])
        T.buffer_store(own, reg[0], [self._own_index()])
        if shared is not None:
            T.buffer_store(shared, reg[0], [j])
        return reg[0]

    def matvec(self, acc, h, rt, bias, col0: int, cols: int):
        """acc[g] = bias[col0 + g] + sum_k h[k] * rt[k, col0 + g] for g < cols."""
        T, hidden = self.T, self.cell.hidden
        if self.gpu:
            part = T.decl_buffer([1], self.cell.dtype, scope="local")
            with self.each(cols) as g:
                T.buffer_store(part, bias[col0 + g], [0])
                with T.serial(0, hidden) as k:
                    T.buffer_store(part, part[0] + h[k] * rt[k, col0 + g], [0])
                T.buffer_store(acc, part[0], [g])
            return
        with self.each(cols) as g:
            T.buffer_store(acc, bias[col0 + g], [g])
        with T.serial(0, hidden) as k:
            with self.each(cols) as g:
                T.buffer_store(acc, acc[g] + h[k] * rt[k, col0 + g], [g])


class _State:
    """One batch entry's buffers: the hidden state shared (h) and the lane's own copy (h_own; the same buffer
    on the CPU), the cell state (c, LSTM), the gates (acc), and a GRU's z and r * h (linear_before_reset=0)."""

    def __init__(self, body: _Body, cell: Cell):
        hidden, gh = cell.hidden, GATES[cell.op] * cell.hidden
        self.h = body.scratch(hidden)
        self.h_own = body.own(hidden) if body.gpu else self.h
        self.c = body.own(hidden) if cell.op == "LSTM" else None
        self.acc = body.scratch(gh)
        split = cell.op == "GRU" and not cell.linear_before_reset
        self.z = body.own(hidden) if split else None
        self.rh = body.scratch(hidden) if split else None

    def new_h(self, body: _Body, value, j):
        return body.set_state(self.h_own, self.h if body.gpu else None, value, j)


def _kernel(cell: Cell, form: str, threads: int, ins, outs):
    from tvm.script.ir_builder import IRBuilder

    gpu = form != "llvm"
    with IRBuilder() as ib:
        body = _Body(cell, gpu, threads, serial_threads=form == "gpu_serial")
        T = body.T
        xw, rt, rb = ins[:3]
        opt = dict(zip(cell.given, ins[3:]))
        y, hn = outs[:2]
        cn = outs[2] if cell.op == "LSTM" else None
        steps, batch = (xw.shape[0], xw.shape[1]) if cell.layout == 0 else (xw.shape[1], xw.shape[0])
        if form == "gpu":
            bx, tx = te.thread_axis("blockIdx.x"), te.thread_axis("threadIdx.x")
            body.tx = tx.var
            with T.frame_scope([T.attr(tx, "thread_extent", threads), T.attr(bx, "thread_extent", batch)]):
                _entry(body, cell, bx.var, steps, xw, rt, rb, opt, y, hn, cn)
        else:
            serial = gpu or isinstance(batch, tirx.IntImm) and batch.value == 1
            with (T.serial if serial else T.parallel)(0, batch) as b:
                _entry(body, cell, b, steps, xw, rt, rb, opt, y, hn, cn)
        return ib.get()


def _entry(body: _Body, cell: Cell, b, steps, xw, rt, rb, opt, y, hn, cn):
    """One batch entry: its state through every step, then its final state."""
    T, hidden = body.T, cell.hidden
    st = _State(body, cell)
    with body.each(hidden) as j:
        st.new_h(body, opt["h0"][b, j] if "h0" in opt else body.c(0), j)
        if st.c is not None:
            body.set_state(st.c, None, opt["c0"][b, j] if "c0" in opt else body.c(0), j)

    def at(t, j):
        return xw[t, b, j] if cell.layout == 0 else xw[b, t, j]

    def put(value, t, j):
        T.buffer_store(y, value, [t, b, j] if cell.layout == 0 else [b, t, j])

    with T.serial(0, steps) as s:
        t = steps - 1 - s if cell.reverse else s
        step = _STEPS[cell.op]
        if "lens" not in opt:
            step(body, cell, st, rt, rb, opt, lambda j: at(t, j), lambda v, j: put(v, t, j))
        else:
            with T.If(t < opt["lens"][b]):
                with T.Then():
                    step(body, cell, st, rt, rb, opt, lambda j: at(t, j), lambda v, j: put(v, t, j))
                with T.Else():
                    with body.each(hidden) as j:
                        put(body.c(0), t, j)
    alive = (opt["lens"][b] > 0) if "lens" in opt else None
    with body.each(hidden) as j:
        for final, own in ((hn, st.h_own), (cn, st.c)):
            if final is not None:
                value = body.mine(own, j)
                value = value if alive is None else tirx.Select(alive, value, body.c(0))
                T.buffer_store(final, value, [b, j])


def _lstm(body: _Body, cell: Cell, st: _State, rt, rb, opt, x, put):
    H = cell.hidden
    body.matvec(st.acc, st.h, rt, rb, 0, 4 * H)
    p = opt.get("P")
    with body.each(H) as j:
        c = body.mine(st.c, j)
        gi, go, gf, gc = (st.acc[k * H + j] + x(k * H + j) for k in range(4))
        if p is not None:
            gi, gf = gi + p[j] * c, gf + p[2 * H + j] * c
        i = body.act(0, gi)
        fg = body.c(1) - i if cell.input_forget else body.act(0, gf)
        c_new = body.set_state(st.c, None, fg * c + i * body.act(1, gc), j)
        if p is not None:
            go = go + p[H + j] * c_new
        put(st.new_h(body, body.act(0, go) * body.act(2, c_new, clip=False), j), j)


def _gru(body: _Body, cell: Cell, st: _State, rt, rb, opt, x, put):
    H = cell.hidden
    if cell.linear_before_reset:  # h~ = g(x_h + r * (h @ R_h^T + Rb_h)): one product of all three gates
        body.matvec(st.acc, st.h, rt, rb, 0, 3 * H)
        with body.each(H) as j:
            z = body.act(0, x(j) + st.acc[j])
            r = body.act(0, x(H + j) + st.acc[H + j])
            cand = body.act(1, x(2 * H + j) + r * st.acc[2 * H + j])
            put(st.new_h(body, (body.c(1) - z) * cand + z * body.mine(st.h_own, j), j), j)
        return
    body.matvec(st.acc, st.h, rt, rb, 0, 2 * H)  # h~ = g(x_h + (r * h) @ R_h^T + Rb_h): the reset gate first
    with body.each(H) as j:
        body.set_state(st.z, None, body.act(0, x(j) + st.acc[j]), j)
        r = body.act(0, x(H + j) + st.acc[H + j])
        body.T.buffer_store(st.rh, r * body.mine(st.h_own, j), [j])
    body.matvec(st.acc, st.rh, rt, rb, 2 * H, H)
    with body.each(H) as j:
        z = body.mine(st.z, j)
        cand = body.act(1, x(2 * H + j) + st.acc[j])
        put(st.new_h(body, (body.c(1) - z) * cand + z * body.mine(st.h_own, j), j), j)


def _rnn(body: _Body, cell: Cell, st: _State, rt, rb, opt, x, put):
    body.matvec(st.acc, st.h, rt, rb, 0, cell.hidden)
    with body.each(cell.hidden) as j:
        put(st.new_h(body, body.act(0, x(j) + st.acc[j]), j), j)


_STEPS = {"LSTM": _lstm, "GRU": _gru, "RNN": _rnn}


def _threads(cell: Cell) -> int:
    """A GPU block's threads: the gates rounded up to a warp, at most 1024."""
    gh = GATES[cell.op] * cell.hidden
    return min(1024, (gh + 31) // 32 * 32)


def _shared_bytes(cell: Cell) -> int:
    gh, H = GATES[cell.op] * cell.hidden, cell.hidden
    return (8 if cell.dtype == "float64" else 4) * (H + gh + (H if cell.op == "GRU" and not cell.linear_before_reset else 0))


#: the kernel's forms: the CPU's, the GPU's, and the GPU's with its threads as serial loops (runs on the CPU:
#: the GPU form's indexing, lanes, chunks and phases checked without a GPU; not its barriers)
FORMS = ("llvm", "gpu", "gpu_serial")


def scan_te(cell: Cell, form: str, *tensors):
    """The kernel (`form`, one of FORMS) as a TE extern: (y, h_n[, c_n]) of xw, R^T, Rb and the optional
    inputs `cell.given`."""
    xw = tensors[0]
    batch = xw.shape[1 - cell.layout]
    y_shape = (*xw.shape[:2], cell.hidden)
    shapes = [y_shape, (batch, cell.hidden)] + ([(batch, cell.hidden)] if cell.op == "LSTM" else [])
    threads = _threads(cell)
    outs = te.extern(shapes, list(tensors), lambda ins, outs: _kernel(cell, form, threads, ins, outs),
                     dtype=[cell.dtype] * len(shapes), name=f"{cell.op.lower()}_scan", tag="recurrent_scan")
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]


# ------------------------------------------------------------------------------------------------ import


def cell_of(attrs: dict) -> Cell:
    """The Cell of a RecurrentScan node from the importer's attribute dict."""
    text = attrs["cell"]
    return Cell.from_json(text.decode() if isinstance(text, bytes) else text)


def convert(bb, inputs, attrs):
    """The importer's converter of a RecurrentScan node: a call of the llvm form of the kernel."""
    cell = cell_of(attrs)
    args = [x for x in inputs if x is not None]
    return bb.call_te(lambda *ts: scan_te(cell, "llvm", *ts), *args,
                      primfunc_name_hint=f"{cell.op.lower()}_scan",
                      primfunc_attrs={ATTR: cell.to_json(), "op_pattern": 8, "tirx.is_scheduled": True})


def _kernels(mod):
    return [(gv, f) for gv, f in mod.functions.items()
            if isinstance(f, tirx.PrimFunc) and f.attrs is not None and ATTR in f.attrs]


def check_target(mod, target) -> None:
    """A FusionError for a recurrence kernel the target cannot hold (a GPU block's shared memory), before the
    build's passes run (an error raised inside a pass reaches the caller as TVM's RuntimeError)."""
    if "gpu" not in target.keys:
        return
    limit = (cuda_facts(target).shared_static_bytes if target.kind.name == "cuda"  # static shared memory per block
             else int(target.attrs.get("max_shared_memory_per_block", 48 * 1024)))
    for gv, func in _kernels(mod):
        cell = Cell.from_json(str(func.attrs[ATTR]))
        if _shared_bytes(cell) > limit:
            raise FusionError(f"recurrence kernel {gv.name_hint!r}: a {cell.op} of hidden size {cell.hidden} needs "
                              f"{_shared_bytes(cell)} bytes of shared memory per batch entry on a GPU, which holds "
                              f"at most {limit}; build it for the CPU (--target llvm)")


def _gpu_form(func: tirx.PrimFunc) -> tirx.PrimFunc:
    cell = Cell.from_json(str(func.attrs[ATTR]))
    n_in = 3 + len(cell.given)
    placeholders = [te.placeholder(tuple(p.shape), p.dtype, f"in{i}") for i, p in enumerate(func.params[:n_in])]
    outs = scan_te(cell, "gpu", *placeholders)
    made = te.create_prim_func(placeholders + outs).without_attr("global_symbol")
    for key, value in func.attrs.items():  # the original's, its name included
        made = made.with_attr(key, value)
    return made


def for_target(target):
    """A module pass remaking every recurrence kernel in the target's form (llvm: the form made at import)."""

    @tvm.transform.module_pass(opt_level=0, name="RecurrenceKernelsForTarget")
    def remake(mod, _ctx):
        if "gpu" not in target.keys:
            return mod
        for gv, func in _kernels(mod):
            mod[gv] = _gpu_form(func)
        return mod

    return remake


def scan_node_inputs(xw: str, rt: str, rb: str, optional: dict) -> tuple[list[str], tuple]:
    """A RecurrentScan node's input names ("" for an absent one, ONNX's convention) and the Cell's `given`."""
    return [xw, rt, rb] + [optional.get(k) or "" for k in _OPTIONAL], tuple(k for k in _OPTIONAL if optional.get(k))

