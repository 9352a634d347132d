"""LSTM / GRU / RNN (tvm_fusion/frontend/recurrent.py, tvm_fusion/frontend/recurrent_kernel.py): the unrolled graph against
onnxruntime's own kernels, attribute by attribute (onnxruntime runs both graphs: fast); the time-loop kernel
of float32 nodes in fused llvm builds against onnxruntime on the same attributes; fused and unfused builds
element by element with the dtype table, exact dense_bias and kernel counts, a symbolic batch, a symbolic
length, float16 / bfloat16 / double, names to sanitize, an If branch, the CUDA form (compiled, and run with its
threads as serial loops), and the errors."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_fusion import FusionError
from tvm_fusion.build.builder import build
from tvm_fusion.frontend.importer import SymDim, import_onnx, onnx_node_names
from tvm_fusion.check.io import run_onnxruntime
from tvm_fusion._tvm import tirx
from tvm_fusion.frontend.recurrent import ACTIVATIONS, decompose_recurrent
from tvm_fusion.frontend.recurrent_kernel import ATTR
from tvm_fusion.testing import assert_close, run_build

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
OUTPUTS = {"LSTM": ("Y", "Y_h", "Y_c"), "GRU": ("Y", "Y_h"), "RNN": ("Y", "Y_h")}


def recurrent_model(op, *, steps=3, batch=2, inputs=4, hidden=5, direction="forward", layout=0, opset=22,
                    bias=True, lengths=None, initial=False, peepholes=False, outputs=None, dtype=np.float32,
                    name="rec/0", seed=0, **attrs):
    """(model, feeds): one recurrent node, W / R / B / P initializers, X and the optional sequence_lens and
    initial states as graph inputs."""
    rng = np.random.default_rng(seed)
    dirs, gh = 2 if direction == "bidirectional" else 1, GATES[op] * hidden
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    x_shape = [steps, batch, inputs] if layout == 0 else [batch, steps, inputs]
    state_shape = [dirs, batch, hidden] if layout == 0 else [batch, dirs, hidden]
    feeds = {"X": rng.normal(0, 1, x_shape).astype(dtype)}
    graph_inputs = [helper.make_tensor_value_info("X", elem, x_shape)]
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (dirs, gh, inputs)).astype(dtype), "W"),
             numpy_helper.from_array(rng.normal(0, 0.5, (dirs, gh, hidden)).astype(dtype), "R")]
    names = ["X", "W", "R", "", "", "", "", ""]
    if bias:
        inits.append(numpy_helper.from_array(rng.normal(0, 0.3, (dirs, 2 * gh)).astype(dtype), "B"))
        names[3] = "B"
    if lengths is not None:
        feeds["seq"] = np.array(lengths, np.int32)
        graph_inputs.append(helper.make_tensor_value_info("seq", TensorProto.INT32, [batch]))
        names[4] = "seq"
    for slot, state in ((5, "h0"), (6, "c0")) if initial else ():
        if slot == 6 and op != "LSTM":
            continue
        feeds[state] = rng.normal(0, 1, state_shape).astype(dtype)
        graph_inputs.append(helper.make_tensor_value_info(state, elem, state_shape))
        names[slot] = state
    if peepholes:
        inits.append(numpy_helper.from_array(rng.normal(0, 0.5, (dirs, 3 * hidden)).astype(dtype), "P"))
        names[7] = "P"
    while not names[-1]:
        names.pop()
    wanted = outputs or OUTPUTS[op]
    outs = [o if o in wanted else "" for o in OUTPUTS[op]]
    while not outs[-1]:
        outs.pop()
    node = helper.make_node(op, names, outs, name=name, hidden_size=hidden, direction=direction,
                            **({"layout": layout} if layout else {}), **attrs)
    graph = helper.make_graph([node], "recurrent", graph_inputs,
                              [helper.make_tensor_value_info(o, elem, None) for o in outs if o], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), feeds


def reference(op, **kw) -> list[np.ndarray]:
    """onnxruntime's outputs; it runs no layout=1 node, so for layout 1 the layout-0 twin on transposed inputs,
    its outputs transposed back (by hand here, independent of recurrent.sequence_first)."""
    layout = kw.get("layout", 0)
    model, feeds = recurrent_model(op, **{**kw, "layout": 0})
    if layout:
        _, batch_first = recurrent_model(op, **kw)
        feeds = {k: v.transpose(1, 0, 2) if k in ("X", "h0", "c0") else v for k, v in batch_first.items()}
    sess, names = run_onnxruntime(model, feeds, optimize=False)
    out = sess.run(None, feeds)
    if layout:
        out = [o.transpose(2, 0, 1, 3) if n == "Y" else o.transpose(1, 0, 2) for n, o in zip(names, out)]
    return out


def unrolled_in_onnxruntime(op, **kw) -> list[np.ndarray]:
    model, feeds = recurrent_model(op, **kw)
    unrolled, origins = decompose_recurrent(model, {k: v.shape for k, v in feeds.items()}, "test", kernel=False)
    assert not any(n.op_type in GATES for n in unrolled.graph.node) and set(origins.values()) == {"rec/0"}
    sess, _ = run_onnxruntime(unrolled, feeds, optimize=False)
    return sess.run(None, feeds)


def assert_all_close(actual, ref, what):
    assert len(actual) == len(ref), f"{what}: {len(actual)} outputs, reference {len(ref)}"
    for i, (a, r) in enumerate(zip(actual, ref)):
        assert a.shape == r.shape, f"{what} output {i}: shape {a.shape}, reference {r.shape}"
        assert_close(a, r, f"{what} output {i}")


# ---------------------------------------------------------------- semantics: unrolled graph vs onnxruntime

CASES = [
    *[(op, dict(direction=d, layout=lay)) for op in GATES for d in ("forward", "reverse", "bidirectional")
      for lay in (0, 1)],
    *[(op, dict(direction="bidirectional", initial=True, lengths=[3, 1])) for op in GATES],
    *[(op, dict(direction="bidirectional", layout=1, lengths=[2, 3], initial=True)) for op in GATES],
    *[(op, dict(direction="bidirectional", lengths=[0, 2], initial=True)) for op in GATES],  # length 0: zero states
    *[(op, dict(bias=False, clip=0.5, initial=True)) for op in GATES],
    ("LSTM", dict(peepholes=True, initial=True, lengths=[3, 2], clip=0.7)),
    ("LSTM", dict(peepholes=True, direction="bidirectional")),
    ("LSTM", dict(input_forget=1, initial=True)),
    ("GRU", dict(linear_before_reset=1, direction="bidirectional", initial=True)),
    ("GRU", dict(linear_before_reset=1, lengths=[1, 3])),
    ("LSTM", dict(outputs=("Y_c",))), ("LSTM", dict(outputs=("Y",), direction="reverse")),
    ("GRU", dict(outputs=("Y_h",), steps=1)), ("RNN", dict(steps=1, batch=1, direction="bidirectional")),
    # older opsets: Slice / Unsqueeze / Clip with attributes, no Where (opset < 9)
    ("LSTM", dict(opset=7, clip=0.7, peepholes=True, lengths=[1, 3], initial=True)),
    ("GRU", dict(opset=9, lengths=[3, 1], clip=1.0)), ("RNN", dict(opset=11, lengths=[2, 1])),
    ("LSTM", dict(opset=14, clip=0.7, direction="bidirectional", lengths=[1, 3], initial=True)),
]


@pytest.mark.parametrize("op, kw", CASES, ids=[f"{op}-{'-'.join(f'{k}={v}' for k, v in kw.items())}" for op, kw in CASES])
def test_unrolled_graph_computes_what_onnxruntime_does(op, kw):
    assert_all_close(unrolled_in_onnxruntime(op, **kw), reference(op, **kw), f"{op} {kw}")


def kernel_outputs(op, **kw) -> list[np.ndarray]:
    """The fused llvm build's outputs (float32: the time-loop kernel)."""
    model, feeds = recurrent_model(op, **kw)
    built = build(import_onnx(model, {k: v.shape for k, v in feeds.items()}), "llvm", "fused")
    assert recurrence_kernels(built) and not built.unscheduled
    return run_build(built, [feeds[i.name] for i in model.graph.input])


#: the kernel's cases in the default run (every attribute once); all of CASES under slow
KERNEL_CASES = [CASES[i] for i in (7, 18, 22, 24, 29, 30, 33, 34)]


@pytest.mark.parametrize("op, kw", [
    *[pytest.param(op, kw, marks=() if (op, kw) in KERNEL_CASES else pytest.mark.slow) for op, kw in CASES]],
    ids=[f"{op}-{'-'.join(f'{k}={v}' for k, v in kw.items())}" for op, kw in CASES])
def test_kernel_computes_what_onnxruntime_does(op, kw):
    assert_all_close(kernel_outputs(op, **kw), reference(op, **kw), f"{op} {kw}")


ACTIVATION_NAMES = ["Relu", "Tanh", "Sigmoid", "Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "HardSigmoid",
                    "Elu", "Softsign", "Softplus"]


@pytest.mark.parametrize("name", ACTIVATION_NAMES)
@pytest.mark.parametrize("params", [{}, dict(activation_alpha=[0.3], activation_beta=[0.7])], ids=["default", "given"])
def test_every_activation_with_and_without_parameters(name, params):
    """onnxruntime's defaults: 0 for Affine, ThresholdedRelu and ScaledTanh (so two of them give 0)."""
    kw = dict(activations=[name], **params)
    assert_all_close(unrolled_in_onnxruntime("RNN", **kw), reference("RNN", **kw), name)


@pytest.mark.parametrize("names", [ACTIVATION_NAMES[:6], ACTIVATION_NAMES[6:] + ["Tanh"]], ids=["first6", "last5"])
@pytest.mark.parametrize("params", [{}, pytest.param(dict(activation_alpha=[0.3] * 6, activation_beta=[0.7] * 6),
                                                     marks=pytest.mark.slow)], ids=["default", "given"])
def test_the_kernel_takes_every_activation(names, params):
    """A bidirectional LSTM has six activation slots: every activation in two builds, with and without
    parameters."""
    kw = dict(activations=names, direction="bidirectional", initial=True, **params)
    assert_all_close(kernel_outputs("LSTM", **kw), reference("LSTM", **kw), f"{names} kernel")


@pytest.mark.parametrize("op, acts, alphas, betas", [
    ("LSTM", ["HardSigmoid", "LeakyRelu", "ScaledTanh"], [0.3, 0.2, 0.9], [0.4, 1.5]),
    ("LSTM", ["Tanh", "Sigmoid", "Affine", "Elu", "Relu", "HardSigmoid"], [0.3, 0.2, 0.9], [0.4, 1.5]),
    ("GRU", ["Softsign", "Softplus", "ThresholdedRelu", "Affine"], [0.3, 0.2], [0.4]),
])
def test_parameters_are_consumed_by_the_activations_that_take_them(op, acts, alphas, betas):
    kw = dict(activations=acts, activation_alpha=alphas, activation_beta=betas,
              direction="bidirectional" if len(acts) > len(OUTPUTS[op]) else "forward")
    assert_all_close(unrolled_in_onnxruntime(op, **kw), reference(op, **kw), f"{op} {acts}")
    assert_all_close(kernel_outputs(op, **kw), reference(op, **kw), f"{op} {acts} kernel")


@pytest.mark.parametrize("op", GATES)
def test_onnxruntime_runs_batch_first_nodes_between_transposes(op):
    """io.run_onnxruntime (compile's and compare's reference) gives a layout-1 node to onnxruntime, which runs
    none, as a layout-0 node between Transposes (recurrent.sequence_first)."""
    kw = dict(layout=1, direction="bidirectional", initial=True, lengths=[2, 3])
    model, feeds = recurrent_model(op, **kw)
    sess, _ = run_onnxruntime(model, feeds, optimize=False)
    assert_all_close(sess.run(None, feeds), reference(op, **kw), f"{op} batch first")


def test_the_table_of_activations_is_onnx_s():
    assert sorted(ACTIVATIONS) == sorted(n.lower() for n in ACTIVATION_NAMES)


# ---------------------------------------------------------------- builds: fused and unfused llvm


def built_outputs(model, feeds, shapes=None, modes=("fused", "unfused")):
    mod = import_onnx(model, shapes or {k: v.shape for k, v in feeds.items()})
    arrays = [feeds[i.name] for i in model.graph.input]
    out = {}
    for mode in modes:
        built = build(mod, "llvm", mode)
        out[mode] = (built, run_build(built, arrays))
    return mod, out


def recurrence_kernels(built) -> list[str]:
    """The names of the build's time-loop kernels (recurrent_kernel.py)."""
    return sorted(gv.name_hint for gv, f in built.module.functions.items()
                  if isinstance(f, tirx.PrimFunc) and f.attrs is not None and ATTR in f.attrs)


@pytest.mark.parametrize("op, kw, modes", [
    ("LSTM", dict(direction="bidirectional", initial=True, lengths=[3, 1], peepholes=True, clip=0.8),
     ("fused", "unfused")),
    ("GRU", dict(direction="reverse", steps=4), ("fused",)),
    pytest.param("GRU", dict(linear_before_reset=1, initial=True, layout=1), ("fused",), marks=pytest.mark.slow),
    pytest.param("RNN", dict(activations=["Relu"], lengths=[2, 3]), ("fused",), marks=pytest.mark.slow),
])
def test_fused_builds_match_onnxruntime(op, kw, modes):
    """One dense_bias per direction (the projection of every step) and one time-loop kernel per direction,
    in each build mode."""
    model, feeds = recurrent_model(op, **kw)
    mod, out = built_outputs(model, feeds, modes=modes)
    ref = reference(op, **kw)
    directions = 2 if kw.get("direction") == "bidirectional" else 1
    for mode, (built, got) in out.items():
        assert_all_close(got, ref, f"{op} {mode}")
        assert len(recurrence_kernels(built)) == directions, recurrence_kernels(built)
        assert mode == "unfused" or not built.unscheduled
    fired = {k: v for k, v in out["fused"][0].counts.items() if v}
    assert fired.get("dense_bias") == directions, fired  # every MatMul with a constant weight fused
    assert set(onnx_node_names(mod).values()) == {"rec/0"}  # each op names the recurrent node


def test_symbolic_batch():
    """--shape X=3xN..., the initial states and lengths too: the projection of every step is a matmul of a
    symbolic 3-D operand, which the dense rules decline (a symbolic dim only in 2-D): the fallback schedules it."""
    kw = dict(direction="bidirectional", initial=True, lengths=[2, 3])
    model, feeds = recurrent_model("LSTM", **kw)
    for v in model.graph.input:
        v.type.tensor_type.shape.dim[0 if v.name == "seq" else 1].dim_param = "N"
    shapes = {k: tuple(SymDim("N") if i == (0 if k == "seq" else 1) else d for i, d in enumerate(v.shape))
              for k, v in feeds.items()}
    _, out = built_outputs(model, feeds, shapes, modes=("fused",))
    built, got = out["fused"]
    assert_all_close(got, reference("LSTM", **kw), "symbolic batch")
    assert not built.counts["dense_bias"] and len(recurrence_kernels(built)) == 2 and not built.unscheduled


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_symbolic_sequence_length_and_batch(op):
    """--shape X=TxNx4: one build runs any length and batch (the kernel's time loop reads T from X's shape),
    against onnxruntime on the same model."""
    model, _ = recurrent_model(op, steps=6, batch=3, direction="bidirectional", initial=True)
    for v in model.graph.input:
        dims = v.type.tensor_type.shape.dim
        if v.name == "X":
            dims[0].dim_param, dims[1].dim_param = "T", "N"
        else:
            dims[1].dim_param = "N"
    shapes = {"X": (SymDim("T"), SymDim("N"), 4), **{s: (2, SymDim("N"), 5) for s in ("h0", "c0")[:2 if op == "LSTM" else 1]}}
    built = build(import_onnx(model, shapes), "llvm", "fused")
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for steps, batch in ((6, 3), (1, 1), (11, 2)):
        rng = np.random.default_rng(steps)
        feeds = {i.name: rng.normal(0, 1, (steps, batch, 4) if i.name == "X" else (2, batch, 5)).astype(np.float32)
                 for i in model.graph.input}
        got = run_build(built, [feeds[i.name] for i in model.graph.input])
        assert_all_close(got, sess.run(None, feeds), f"{op} T={steps} N={batch}")
    assert len(recurrence_kernels(built)) == 2 and not built.unscheduled


def test_float16():
    """The kernel reads and writes float16 and computes in float32; a symbolic length works as in float32."""
    kw = dict(direction="bidirectional", initial=True, peepholes=True, dtype=np.float16, steps=8)
    model, feeds = recurrent_model("LSTM", **kw)
    _, out = built_outputs(model, feeds, modes=("fused",))
    built, got = out["fused"]
    assert all(g.dtype == np.float16 for g in got) and len(recurrence_kernels(built)) == 2
    assert_all_close(got, reference("LSTM", **kw), "float16")
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "T"
    shapes = {k: (SymDim("T"), *v.shape[1:]) if k == "X" else v.shape for k, v in feeds.items()}
    built = build(import_onnx(model, shapes), "llvm", "fused")
    assert_all_close(run_build(built, [feeds[i.name] for i in model.graph.input]), reference("LSTM", **kw),
                     "float16, symbolic length")


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_double_and_bfloat16(dtype):
    """onnxruntime runs neither: its float32 kernel on the same seeded values is the reference, judged at
    float32's tolerance (double) or bfloat16's."""
    import ml_dtypes

    kw = dict(direction="bidirectional", initial=True, lengths=[3, 1])
    model, feeds = recurrent_model("GRU", dtype=np.float64 if dtype == "float64" else ml_dtypes.bfloat16, **kw)
    _, out = built_outputs(model, feeds, modes=("fused",))
    for i, (got, ref) in enumerate(zip(out["fused"][1], reference("GRU", **kw), strict=True)):
        assert str(got.dtype) == dtype
        assert_close(got.astype(np.float32), ref, f"{dtype} output {i}", dtype="float32" if dtype == "float64" else dtype)


def test_inside_an_if_branch_with_names_to_sanitize():
    model, feeds = recurrent_model("GRU", steps=4, outputs=("Y_h",), name="gru/0")
    then = helper.make_graph(list(model.graph.node), "then", [],
                             [helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, [1, 2, 5])])
    zero = helper.make_node("Constant", [], ["zero/0"], value=numpy_helper.from_array(np.zeros((1, 2, 5), np.float32)))
    other = helper.make_graph([zero], "else", [], [helper.make_tensor_value_info("zero/0", TensorProto.FLOAT, [1, 2, 5])])
    branch = helper.make_node("If", ["cond"], ["out/0"], name="if/0", then_branch=then, else_branch=other)
    graph = helper.make_graph([branch], "g", [model.graph.input[0], helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("out/0", TensorProto.FLOAT, [1, 2, 5])],
                              list(model.graph.initializer))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    built = build(import_onnx(model, {"X": feeds["X"].shape, "cond": ()}), "llvm", "fused")
    sess, _ = run_onnxruntime(model, {"X": feeds["X"], "cond": np.array(True)}, optimize=False)
    for cond in (True, False):
        given = {"X": feeds["X"], "cond": np.array(cond)}
        assert_all_close(run_build(built, [given["X"], given["cond"]]), sess.run(None, given), f"If {cond}")


@pytest.mark.parametrize("op, kw", [("LSTM", dict(peepholes=True, lengths=[3, 1], initial=True)),
                                      ("GRU", dict(direction="bidirectional", hidden=300))])
def test_cuda_form(op, kw):
    """For CUDA the kernel is remade with a thread block per batch entry, a thread per gate, barriers between
    the phases of a step, and the state in shared memory; a symbolic length compiles too (it runs on a GPU
    only: benchmarks/gpu_check.py)."""
    model, feeds = recurrent_model(op, **kw)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "T"
    shapes = {k: (SymDim("T"), *v.shape[1:]) if k == "X" else v.shape for k, v in feeds.items()}
    built = build(import_onnx(model, shapes), "cuda", "fused")
    kernels = [f for gv, f in built.module.functions.items() if isinstance(f, tirx.PrimFunc) and ATTR in (f.attrs or {})]
    assert len(kernels) == (2 if kw.get("direction") == "bidirectional" else 1)
    for func in kernels:
        text = func.script()
        assert 'T.launch_thread("blockIdx.x"' in text and 'T.tvm_storage_sync("shared")' in text, text
        assert "T.alloc_shared" in text and "T.vectorized" not in text and "T.parallel" not in text
    (cuda,) = [m for host in built.executable.mod.imports for m in host.imports if m.kind == "cuda"]
    names = [f"{op.lower()}_scan"]
    assert all(f"{n}_kernel" in cuda.inspect_source() for n in names) and "__syncthreads()" in cuda.inspect_source()


SERIAL_CASES = [
    ("LSTM", 5, dict(given=("h0", "c0", "P", "lens"), clip=0.7)),
    pytest.param("LSTM", 300, dict(given=("h0",), reverse=True), marks=pytest.mark.slow),  # 1,200 gates: 2 chunks
    ("GRU", 7, dict(given=("h0", "lens"), layout=1)),
    ("GRU", 6, dict(given=(), linear_before_reset=True, reverse=True)),
    ("RNN", 4, dict(given=("lens",), acts=(("relu", None, None),))),
]


@pytest.mark.parametrize("op, hidden, kw", SERIAL_CASES, ids=["LSTM-5", "LSTM-300", "GRU-7", "GRU-6", "RNN-4"])
def test_gpu_form_with_serial_threads_computes_what_the_cpu_form_does(op, hidden, kw):
    """The GPU form (lanes, chunks, registers, phases; its barriers aside) with its threads run as serial
    loops on the CPU, against the llvm form on the same inputs (which the builds check against onnxruntime)."""
    from tvm_fusion._tvm import te, tvm
    from tvm_fusion.build.builder import resolve_target
    from tvm_fusion.frontend.recurrent_kernel import Cell, scan_te

    acts = kw.pop("acts", None) or {"LSTM": (("sigmoid", None, None), ("tanh", None, None), ("tanh", None, None)),
                                    "GRU": (("sigmoid", None, None), ("tanh", None, None))}[op]
    cell = Cell(op, hidden, acts, kw.pop("clip", None), False, kw.pop("linear_before_reset", False),
                kw.pop("reverse", False), kw.pop("layout", 0), kw.pop("given"))
    steps, batch, gh = 4, 3, GATES[op] * hidden
    lead = (steps, batch) if cell.layout == 0 else (batch, steps)
    shapes = {"xw": (*lead, gh), "rt": (hidden, gh), "rb": (gh,), "h0": (batch, hidden), "c0": (batch, hidden),
              "P": (3 * hidden,), "lens": (batch,)}
    names = ["xw", "rt", "rb", *cell.given]
    rng = np.random.default_rng(hidden)
    values = [np.array([4, 1, 0], np.int32) if n == "lens" else rng.normal(0, 0.4, shapes[n]).astype(np.float32)
              for n in names]
    outs = {}
    for form in ("llvm", "gpu_serial"):
        holders = [te.placeholder(shapes[n], "int32" if n == "lens" else "float32", n) for n in names]
        func = te.create_prim_func(holders + scan_te(cell, form, *holders))
        lib = tvm.compile(tvm.IRModule({"main": func}), resolve_target("llvm"))
        results = [tvm.runtime.tensor(np.full(s, np.nan, np.float32))
                   for s in ((*lead, hidden), (batch, hidden), (batch, hidden))[:3 if op == "LSTM" else 2]]
        lib["main"](*[tvm.runtime.tensor(v) for v in values], *results)
        outs[form] = [r.numpy() for r in results]
    for i, (got, want) in enumerate(zip(outs["gpu_serial"], outs["llvm"], strict=True)):
        assert not np.isnan(got).any(), f"output {i}: an element was never written"
        assert_close(got, want, f"{op} output {i}")


def test_cuda_refuses_a_hidden_size_beyond_shared_memory():
    """Checked on the module before the build's passes (recurrent_kernel.check_target), on the kernel's
    parameters alone; the CPU takes any size."""
    from tvm_fusion._tvm import te, tvm
    from tvm_fusion.build.builder import resolve_target
    from tvm_fusion.frontend.recurrent_kernel import Cell, check_target, scan_te

    cell = Cell("LSTM", 2500, (("sigmoid", None, None), ("tanh", None, None), ("tanh", None, None)), None, False,
                False, False, 0, ())
    holders = [te.placeholder(shape, "float32", n) for n, shape in (("xw", (1, 1, 10000)), ("rt", (2500, 10000)),
                                                                     ("rb", (10000,)))]
    func = te.create_prim_func(holders + scan_te(cell, "llvm", *holders)).with_attr(ATTR, cell.to_json())
    mod = tvm.IRModule({"lstm_scan": func})
    check_target(mod, resolve_target("llvm"))
    with pytest.raises(FusionError, match="^recurrence kernel 'lstm_scan': a LSTM of hidden size 2500 needs 50000 "
                                          "bytes of shared memory per batch entry on a GPU, which holds at most 49152"):
        check_target(mod, resolve_target("cuda"))


@pytest.mark.slow
def test_long_sequence():
    """200 steps: the fused build stays within the float32 tolerance of onnxruntime's kernel."""
    kw = dict(steps=200, batch=1, inputs=16, hidden=32, initial=True)
    model, feeds = recurrent_model("LSTM", **kw)
    _, out = built_outputs(model, feeds, modes=("fused",))
    assert_all_close(out["fused"][1], reference("LSTM", **kw), "200 steps")


# ---------------------------------------------------------------- what is refused, and how


def test_unrolled_with_a_symbolic_length_names_the_shape_to_give():
    model, _ = recurrent_model("LSTM")
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "T"
    with pytest.raises(FusionError) as err:
        decompose_recurrent(model, {"X": (SymDim("T"), 2, 4)}, "recurrent", kernel=False)
    assert str(err.value) == (
        "recurrent: node 'rec/0' (LSTM) runs over a sequence of symbolic length 'T' (dim 0 of its input 'X'); "
        "unrolled, the recurrence needs a fixed number of steps: give it with --shape X=LENx2x4 (LEN: the number "
        "of steps)")


@pytest.mark.parametrize("attrs, message", [
    (dict(activations=["Sigmoid", "Swish", "Tanh"]), "activation 'Swish' is not one of ONNX's recurrent activations"),
    (dict(activations=["Sigmoid", "Tanh"]), "has 2 activations ['Sigmoid', 'Tanh']; LSTM with 1 direction(s) takes 3"),
    (dict(layout=2), "layout 2 is neither 0 (sequence first) nor 1 (batch first)"),
    (dict(steps=0), "its input 'X' is a sequence of 0 steps; give at least one"),
])
def test_bad_attributes_name_the_node(attrs, message):
    model, feeds = recurrent_model("LSTM", **attrs)
    with pytest.raises(FusionError, match="^recurrent: node 'rec/0' \\(LSTM\\)") as err:
        import_onnx(model, {"X": feeds["X"].shape})  # an empty sequence from Python: ONNX declares no 0 dim
    assert message in str(err.value)


def test_the_command_line_exits_2_with_one_line(tmp_path, capsys):
    import onnx

    from tvm_fusion.cli import main

    model, _ = recurrent_model("GRU", activations=["Sigmoid", "Swish"])
    path = tmp_path / "gru.onnx"
    onnx.save(model, str(path))
    assert main(["explain", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "activation 'Swish' is not one of" in err


@pytest.mark.slow
def test_the_benchmark_checks_and_prints_its_table(capsys):
    """benchmarks/recurrent.py: each layer checked against onnxruntime, then a row of the side-by-side table."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "recurrent.py"
    spec = importlib.util.spec_from_file_location("recurrent_benchmark", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.main(["--layers", "GRU:8:3,LSTM:4:2", "--rounds", "1", "--number", "1"])
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| GRU") or ln.startswith("| LSTM")]
    assert [r.split(" |")[0] for r in rows] == ["| GRU hidden 8, 3 steps", "| LSTM hidden 4, 2 steps"]
