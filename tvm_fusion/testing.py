"""Test support for rule authors and our suites: `assert_close` (the verdict of numerics.py), small ONNX
graphs with seeded weights (GraphBuilder), and `check_fused` (fused vs unfused vs onnxruntime on llvm)."""

from __future__ import annotations

import dataclasses

import numpy as np

import onnx
from onnx import TensorProto, helper, numpy_helper

from .errors import ToleranceExceeded
from tvm_fusion.check.numerics import TOLERANCES, ErrorStats, Tolerance, error_stats
from tvm_fusion.precision import accumulator_dtype, numpy_dtype
from tvm_fusion.frontend.recurrent import _graphs
from tvm_fusion.check.differential import bisect, check_groups
from tvm_fusion.check.io import device, graph_inputs, random_inputs, run_onnxruntime, run_vm
from tvm_fusion.build.builder import build, resolve_target
from tvm_fusion.frontend.importer import import_onnx, SymDim
from tvm_fusion._tvm import te, tvm
from tvm_fusion.build.cuda_compiler import compile_cuda_source, cuda_source
from tvm_fusion.schedules.cuda.gpu_limits import check_gpu_limits
from tvm_fusion.fusion.fuse import fuse
from tvm_fusion.rules import RuleSet, rule
from tvm_fusion.schedules.activations import fast_math_allowed
from tvm_fusion.schedules.conv2d import CONV_FAMILY, conv2d_affine, conv2d_out_size as _conv_out
from tvm_fusion.registry import compute_options, get_compute
from tvm_fusion.schedules import load

__all__ = ["TOLERANCES", "Tolerance", "ErrorStats", "error_stats", "assert_close", "GraphBuilder", "OPSET",
           "check_fused", "check_half", "check_symbolic_batch", "symbolic_shapes", "check_cuda_build",
           "check_rule_property", "check_family_property", "check_wrong_rule_is_blamed", "block_in_if_branches",
           "conv_bn_relu", "residual_block", "encoder", "qdq_conv", "run_build", "ACTIVATION_FORMS",
           "GELU_OPSET", "apply_activation_onnx", "RESNET50_CONVS", "conv_primfunc", "as_float16"]

OPSET = 17


def assert_close(actual, reference, what: str = "output", dtype=None, noise=None) -> ErrorStats:
    """Element-wise verdict (numerics.error_stats; `dtype` picks the tolerance, default the reference's;
    `noise`: the reference's own per element, e.g. reference.Reference(model, inputs).noise()[i]); raises
    ToleranceExceeded naming how many elements are off and the worst one."""
    stats = error_stats(actual, reference, dtype, noise)
    if not stats.ok:
        raise ToleranceExceeded(f"{what}: {stats.describe()}")
    return stats


# ---------------------------------------------------------------- small ONNX graphs


class GraphBuilder:
    """Append nodes and seeded constants; `model()` returns a checked ModelProto."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.inputs, self.n = [], [], [], 0

    def name(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def input(self, name: str, shape, dtype=TensorProto.FLOAT) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, dtype, shape))
        return name

    def const(self, array: np.ndarray, prefix: str = "c") -> str:
        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(self, op_type: str, inputs, n_out: int = 1, **attrs):
        outs = [self.name(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=self.name(op_type), **attrs))
        return outs[0] if n_out == 1 else outs

    def conv(self, x: str, cin: int, cout: int, k=3, stride=1, pads=None, dilation=1, groups=1, bias=True) -> str:
        kh, kw = (k, k) if isinstance(k, int) else k
        fan_in = cin // groups * kh * kw
        w = self.const(self.rng.normal(0, np.sqrt(2.0 / fan_in), (cout, cin // groups, kh, kw)).astype(np.float32), "w")
        ins = [x, w]
        if bias:
            ins.append(self.const(self.rng.normal(0, 0.1, cout).astype(np.float32), "b"))
        pads = pads if pads is not None else [kh // 2 * dilation, kw // 2 * dilation] * 2
        return self.op("Conv", ins, kernel_shape=[kh, kw], strides=[stride, stride], pads=list(pads),
                       dilations=[dilation, dilation], group=groups)

    def bn(self, x: str, c: int, training: bool = False) -> str:
        vals = [self.rng.uniform(0.5, 1.5, c), self.rng.normal(0, 0.1, c), self.rng.normal(0, 0.5, c),
                self.rng.uniform(0.5, 2.0, c)]
        ins = [x] + [self.const(v.astype(np.float32), "bn") for v in vals]
        if training:
            return self.op("BatchNormalization", ins, n_out=3, epsilon=1e-5, training_mode=1)[0]
        return self.op("BatchNormalization", ins, epsilon=1e-5)

    def model(self, outputs, opset: int = OPSET, dtype=TensorProto.FLOAT) -> onnx.ModelProto:
        outs = [helper.make_tensor_value_info(o, dtype, None) for o in outputs]
        graph = helper.make_graph(self.nodes, "test", self.inputs, outs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model = onnx.shape_inference.infer_shapes(model)
        onnx.checker.check_model(model)
        return model


def as_float16(model: onnx.ModelProto, dtype: str = "float16") -> onnx.ModelProto:
    """The same graph in float16 (or `dtype` "bfloat16"): float32 initializers and Constant nodes rounded,
    float32 inputs, outputs and value infos declared in the half dtype (what an exporter's `model.half()`
    writes), If / Loop bodies included."""
    elem = {"float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}[dtype]
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for g in _graphs(out.graph):
        constants = [a.t for n in g.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"]
        for t in [*g.initializer, *constants]:
            a = numpy_helper.to_array(t)
            if a.dtype == np.float32:
                t.CopyFrom(numpy_helper.from_array(a.astype(numpy_dtype(dtype)), t.name))
        for v in [*g.input, *g.output, *g.value_info]:
            if v.type.tensor_type.elem_type == TensorProto.FLOAT:
                v.type.tensor_type.elem_type = elem
    onnx.checker.check_model(out)
    return out


def conv_bn_relu(n=1, cin=8, cout=16, hw=(12, 12), seed=0, bn=True, relu=True, bias=True, **conv) -> onnx.ModelProto:
    g = GraphBuilder(seed)
    x = g.input("x", [n, cin, *hw])
    y = g.conv(x, cin, cout, bias=bias, **conv)
    if bn:
        y = g.bn(y, cout)
    if relu:
        y = g.op("Relu", [y])
    return g.model([y])


def residual_block(n=1, c=8, hw=(10, 10), seed=0) -> onnx.ModelProto:
    """relu(bn(conv(relu(bn(conv(x))))) + x): a ResNet basic block."""
    g = GraphBuilder(seed)
    x = g.input("x", [n, c, *hw])
    y = g.op("Relu", [g.bn(g.conv(x, c, c), c)])
    y = g.bn(g.conv(y, c, c), c)
    return g.model([g.op("Relu", [g.op("Add", [y, x])])])


def encoder(d=16, heads=2, layers=1, seq=8, seed=12) -> onnx.ModelProto:
    """Post-LN transformer encoder layers on x [1, seq, d] (opset 17): q, k, v as MatMul + Add, scores
    `MatMul(q, kT) / sqrt(d / heads)` -> Softmax -> MatMul(., v), output MatMul + Add, residual Add ->
    LayerNormalization, FFN MatMul + Add -> GELU written out (Div, Erf, Add, Mul, Mul) -> MatMul + Add,
    residual Add -> LayerNormalization; weights N(0, 1 / fan_in), LayerNorm affine parameters random."""
    g = GraphBuilder(seed)
    x = g.input("x", [1, seq, d])

    def linear(v, n_in, n_out):
        w = g.const(g.rng.normal(0, n_in ** -0.5, (n_in, n_out)).astype(np.float32), "w")
        return g.op("Add", [g.op("MatMul", [v, w]), g.const(g.rng.normal(0, 0.1, n_out).astype(np.float32), "b")])

    def norm(v):
        return g.op("LayerNormalization", [v, g.const(g.rng.uniform(0.5, 1.5, d).astype(np.float32), "g"),
                                           g.const(g.rng.normal(0, 0.1, d).astype(np.float32), "b")], axis=-1)

    def split(v):
        v = g.op("Reshape", [v, g.const(np.array([1, seq, heads, d // heads], np.int64))])
        return g.op("Transpose", [v], perm=[0, 2, 1, 3])

    for _ in range(layers):
        q, k, v = (split(linear(x, d, d)) for _ in range(3))
        scores = g.op("Div", [g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])]),
                              g.const(np.float32(np.sqrt(d // heads)))])
        ctx = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
        ctx = g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]), g.const(np.array([1, seq, d], np.int64))])
        h = norm(g.op("Add", [x, linear(ctx, d, d)]))
        f = linear(h, d, 4 * d)
        erf = g.op("Erf", [g.op("Div", [f, g.const(np.float32(np.sqrt(2)))])])
        gelu = g.op("Mul", [g.op("Mul", [f, g.op("Add", [erf, g.const(np.float32(1))])]), g.const(np.float32(0.5))])
        x = norm(g.op("Add", [h, linear(gelu, 4 * d, d)]))
    return g.model([x], opset=17)


def qdq_conv(cin=8, cout=16, hw=(16, 16), seed=0, out_scale=0.05) -> onnx.ModelProto:
    """A QDQ int8 conv (per-tensor, zero points 0): x -> Q -> DQ, int8 weights -> DQ, Conv + bias, -> Q -> DQ.
    onnxruntime runs it as written in float and, optimized, as an int8 QLinearConv: the two runs land one
    output step (`out_scale`) apart at a few elements (a rounding flip)."""
    g = GraphBuilder(seed)
    x = g.input("x", [1, cin, *hw])
    w = g.rng.normal(0, 0.3, (cout, cin, 3, 3)).astype(np.float32)
    w_scale = np.float32(np.abs(w).max() / 127)
    w_q = g.const(np.clip(np.round(w / w_scale), -127, 127).astype(np.int8), "w_q")

    def qdq(value, scale):
        s, z = g.const(np.array(scale, np.float32), "scale"), g.const(np.array(0, np.int8), "zero")
        return g.op("DequantizeLinear", [g.op("QuantizeLinear", [value, s, z]), s, z])

    zero = g.const(np.array(0, np.int8), "zero")
    weights = g.op("DequantizeLinear", [w_q, g.const(np.array(w_scale, np.float32), "w_scale"), zero])
    bias = g.const(g.rng.normal(0, 0.1, cout).astype(np.float32), "bias")
    y = g.op("Conv", [qdq(x, 0.03), weights, bias], pads=[1, 1, 1, 1])
    return g.model([qdq(y, out_scale)], opset=13)


# ---------------------------------------------------------------- fused vs unfused vs onnxruntime
def run_build(built, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Run a CPU build's `main` on numpy inputs; its outputs as a flat list of numpy arrays."""
    return run_vm(built.executable, device("llvm"), inputs)


def check_fused(model, rules=None, seed: int = 0, expect: dict | None = None):
    """Build unfused and fused on llvm; both must match onnxruntime and each other. Returns the fused build."""
    mod = import_onnx(model)
    inputs = random_inputs(model, seed=seed)
    order = [i.name for i in model.graph.input if i.name in inputs]
    arrays = [inputs[k] for k in order]
    fused = build(mod, "llvm", "fused", rules=rules)
    unfused = build(mod, "llvm", "unfused", rules=rules)
    sess, _ = run_onnxruntime(model, inputs)
    ref = sess.run(None, inputs)
    got_f, got_u = run_build(fused, arrays), run_build(unfused, arrays)
    for i, (f, u, r) in enumerate(zip(got_f, got_u, ref)):
        assert_close(f, u, f"output {i}: fused vs unfused", dtype=r.dtype)  # the model's dtype decides
        assert_close(f, r, f"output {i}: fused vs onnxruntime")
    _assert_fired(fused, expect)
    return fused


def check_half(model, dtype: str, rules=None, expect: dict | None = None, shapes: dict | None = None,
               batches=(1,), seed: int = 0):
    """The float32 `model` as `dtype` (float16 or bfloat16: `as_float16`) built fused and unfused on llvm
    (`shapes`: its symbolic dims kept symbolic, the one build run at each of `batches`): every output in `dtype`,
    fused within `dtype`'s tolerance of unfused and of onnxruntime's float32 run of `model` on the same rounded
    inputs (onnxruntime has no bfloat16 CPU kernels for most ops), element by element. Returns the fused build;
    `expect`: its exact rule counts."""
    half = numpy_dtype(dtype)
    mod = import_onnx(as_float16(model, dtype), shapes)
    fused, unfused = build(mod, "llvm", "fused", rules=rules), build(mod, "llvm", "unfused", rules=rules)
    _assert_fired(fused, expect)
    sess, _ = run_onnxruntime(model, {}, optimize=False)
    for n in batches if shapes else (None,):
        concrete = {k: [d if isinstance(d, int) else n for d in shape] for k, shape in (shapes or {}).items()}
        inputs = {k: v.astype(half).astype(np.float32) if v.dtype == np.float32 else v
                  for k, v in random_inputs(model, concrete or None, seed=seed).items()}
        args = [inputs[i.name].astype(half) if inputs[i.name].dtype == np.float32 else inputs[i.name]
                for i in graph_inputs(model)]
        at = f" at batch {n}" if n is not None else ""
        for i, (f, u, r) in enumerate(zip(run_build(fused, args), run_build(unfused, args), sess.run(None, inputs),
                                          strict=True)):
            assert f.dtype == half and f.shape == r.shape, f"output {i}{at}: {f.dtype} {f.shape}, want {dtype} {r.shape}"
            assert_close(f, u, f"output {i}{at}: fused vs unfused {dtype}", dtype=dtype)
            assert_close(f, r, f"output {i}{at}: fused {dtype} vs the float32 model", dtype=dtype)
    return fused


def symbolic_shapes(model, bound: int | None = None) -> dict:
    """The `--shape` of every graph input as the model declares it: each named dim (`N`) a SymDim with upper
    bound `bound`, the others their sizes."""
    return {i.name: tuple(SymDim(d.dim_param, bound) if d.dim_param else d.dim_value
                          for d in i.type.tensor_type.shape.dim) for i in graph_inputs(model)}


def check_symbolic_batch(model, shapes: dict, rules=None, expect: dict | None = None, batches=(1, 3), seed: int = 0):
    """Build fused on llvm with the symbolic dims of `shapes` (`{"x": (SymDim("N"), 4, 8, 8)}`) kept symbolic,
    then run that one build at each batch in `batches` against onnxruntime, element by element. Returns the
    build; `expect`: its exact rule counts."""
    fused = build(import_onnx(model, shapes), "llvm", "fused", rules=rules)
    _assert_fired(fused, expect)
    sess, _ = run_onnxruntime(model, {}, optimize=False)
    for n in batches:
        concrete = {k: [d if isinstance(d, int) else n for d in shape] for k, shape in shapes.items()}
        inputs = random_inputs(model, concrete, seed=seed + n)
        got = run_build(fused, [inputs[i.name] for i in graph_inputs(model)])
        for i, (f, r) in enumerate(zip(got, sess.run(None, inputs))):
            assert f.shape == r.shape, f"output {i} at batch {n}: shape {f.shape}, onnxruntime {r.shape}"
            assert_close(f, r, f"output {i} at batch {n}: fused vs onnxruntime")
    return fused


def _assert_fired(built, expect: dict | None) -> None:
    if expect is not None:
        fired = {k: v for k, v in built.counts.items() if v}
        assert fired == expect, f"rules fired {fired}; expected {expect}"


#: the first bytes of what compile_cuda_source returns: a fatbin (nvcc) or an ELF cubin (NVRTC)
_CUDA_BINARY = (b"\x50\xed\x55\xba", b"\x7fELF")


def check_cuda_build(model, rules=None, expect: dict | None = None, arch: str = "sm_90", shapes: dict | None = None):
    """Build fused for CUDA `arch` with no GPU: exact counts (`expect`), every kernel within the arch's launch
    limits (verify_gpu_code, hardware.cuda_facts) and the generated CUDA C compiled by nvcc (or NVRTC); nothing
    runs. `shapes`: input shapes for import_onnx (a symbolic batch). Returns the build."""
    target = resolve_target("cuda", arch)
    built = build(import_onnx(model, shapes), target, "fused", rules=rules)
    _assert_fired(built, expect)
    for gv, func in built.fused.mod.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc):
            check = check_gpu_limits(func, target)
            assert check.ok, f"{gv.name_hint}: {check}"
    binary = compile_cuda_source(cuda_source(built.executable), arch)
    assert binary[:4] in _CUDA_BINARY, f"the CUDA compiler returned {binary[:8]!r}..., not a fatbin or cubin"
    return built



#: ONNX forms of each activation: name -> list of form names accepted by `apply_activation_onnx`
ACTIVATION_FORMS = {
    "relu": ["Relu"],
    "relu6": ["Clip", "MaxMin"],
    "leaky_relu": ["LeakyRelu"],
    "sigmoid": ["Sigmoid"],
    "tanh": ["Tanh"],
    "silu": ["x*Sigmoid", "Sigmoid*x"],
    "hardsigmoid": ["HardSigmoid"],
    "hardswish": ["HardSwish", "x*HardSigmoid", "x*Clip(x+3)/6"],
    "gelu_erf": ["Gelu", "erf-decomposed"],  # apply_activation_onnx also writes "erf-dynamo" and "erf-hf"
    "gelu_tanh": ["Gelu(tanh)", "tanh-decomposed"],
}
GELU_OPSET = 20  # the Gelu op


def apply_activation_onnx(g: "GraphBuilder", y: str, form: str) -> str:
    """Append ONNX nodes computing an activation of `y` in the given form (see ACTIVATION_FORMS)."""
    f32 = lambda v: g.const(np.array(v, np.float32))  # noqa: E731
    if form in ("Relu", "Sigmoid", "Tanh", "HardSwish"):
        return g.op(form, [y])
    if form == "Clip":
        return g.op("Clip", [y, f32(0.0), f32(6.0)])
    if form == "MaxMin":
        return g.op("Min", [g.op("Max", [y, f32(0.0)]), f32(6.0)])
    if form == "LeakyRelu":
        return g.op("LeakyRelu", [y], alpha=0.1)
    if form == "x*Sigmoid":
        return g.op("Mul", [y, g.op("Sigmoid", [y])])
    if form == "Sigmoid*x":
        return g.op("Mul", [g.op("Sigmoid", [y]), y])
    if form == "HardSigmoid":
        return g.op("HardSigmoid", [y], alpha=0.2, beta=0.5)
    if form == "x*HardSigmoid":
        return g.op("Mul", [y, g.op("HardSigmoid", [y], alpha=1.0 / 6.0, beta=0.5)])
    if form == "x*Clip(x+3)/6":
        relu6 = g.op("Clip", [g.op("Add", [y, f32(3.0)]), f32(0.0), f32(6.0)])
        return g.op("Div", [g.op("Mul", [y, relu6]), f32(6.0)])
    if form == "Gelu":
        return g.op("Gelu", [y])
    if form == "Gelu(tanh)":
        return g.op("Gelu", [y], approximate="tanh")
    if form == "erf-decomposed":  # as PyTorch exports it
        erf = g.op("Erf", [g.op("Div", [y, f32(1.4142135381698608)])])
        return g.op("Mul", [g.op("Mul", [y, g.op("Add", [erf, f32(1.0)])]), f32(0.5)])
    if form in ("erf-dynamo", "erf-hf"):  # torch.onnx's dynamo exporter; Hugging Face's 0.5 * x * (1 + erf(.))
        erf_one = g.op("Add", [g.op("Erf", [g.op("Div", [y, f32(1.4142135381698608)])]), f32(1.0)])
        if form == "erf-dynamo":
            return g.op("Mul", [y, g.op("Mul", [erf_one, f32(0.5)])])
        return g.op("Mul", [g.op("Mul", [f32(0.5), y]), erf_one])
    if form == "tanh-decomposed":
        cube = g.op("Pow", [y, f32(3.0)])
        inner = g.op("Mul", [g.op("Add", [y, g.op("Mul", [cube, f32(0.044715)])]), f32(0.7978845834732056)])
        return g.op("Mul", [g.op("Mul", [y, g.op("Add", [g.op("Tanh", [inner]), f32(1.0)])]), f32(0.5)])
    raise ValueError(f"unknown activation form {form!r}")


def check_rule_property(model, rules, rule_name: str, seed: int = 0) -> bool:
    """The property every rule must have, with only `rule_name` active: if it fired, the fused build
    matches the unfused build and onnxruntime; if it declined, the fused module is the module with no
    rules at all. Returns whether it fired."""
    only = RuleSet([rules[rule_name]])
    target = resolve_target("llvm")
    mod = import_onnx(model)
    result = fuse(mod, target, only)
    if result.counts[rule_name]:
        check_fused(model, only, seed=seed)
        return True

    tvm.ir.assert_structural_equal(result.mod["main"], fuse(mod, target, RuleSet()).mod["main"])
    return False


def block_in_if_branches(g: "GraphBuilder", x: str, block, name: str = "branch/0") -> str:
    """An If node on a condition computed from `x` (nothing folds it) whose two branches each run `block(b,
    x)` (b: the branch's own GraphBuilder, seeded 1 and 2, its names numbered past the outer graph's and
    the other branch's: ONNX names are unique across scopes; x read from the outer graph). Returns its output."""
    def branch(graph_name, seed):
        b = GraphBuilder(seed)
        b.nodes, b.inits = [], []
        b.n = g.n + 100_000 * seed
        out = b.op("Identity", [block(b, x)])
        outputs = [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)]
        return helper.make_graph(b.nodes, graph_name, [], outputs, b.inits)

    cond = g.op("Greater", [g.op("ReduceSum", [x], keepdims=0), g.const(np.array(0, np.float32))])
    out = f"{name}_out"
    g.nodes.append(helper.make_node("If", [cond], [out], name=name, then_branch=branch("then", 1),
                                    else_branch=branch("else", 2)))
    return out


def check_wrong_rule_is_blamed(model, rules, name: str, spec, constant: int, factor: float = 1.01) -> None:
    """`spec` (a rule's Spec) as a rule `name` above every other whose lowering scales its constant number
    `constant` by `factor`: the per-group check must find its one group wrong, and bisect must blame it."""
    @rule(name, priority=10_000)
    def wrong():
        def lower(m):
            lowering = spec.lower(m)
            lowering.constants[constant] = lowering.constants[constant] * factor
            return lowering

        return dataclasses.replace(spec, lower=lower)

    with_wrong = rules + RuleSet([wrong])
    report = check_groups(model, rules=with_wrong)
    assert [(g.rule, g.stats.ok) for g in report.groups] == [(name, False)], str(report)
    assert bisect(model, rules=with_wrong).culprits == [name]


def check_family_property(cases, rules, min_share: float) -> tuple[int, int]:
    """check_rule_property over every example the hypothesis strategy `cases` generates (each a
    (model, rule_name) pair), under the active settings profile: each fired rule matches unfused and
    onnxruntime, each declined one leaves the module unchanged, and the rules fired on at least `min_share`
    of the examples (a rule that never fires fails). Returns (fired, examples)."""
    from hypothesis import given

    fired = []

    @given(case=cases)
    def each(case):
        model, rule_name = case
        fired.append(check_rule_property(model, rules, rule_name))

    each()
    n, hits = len(fired), sum(fired)
    assert n and hits >= min_share * n, \
        f"the rules fired on {hits} of {n} generated examples; at least {min_share:.0%} expected"
    return hits, n


#: (n, c, h, w, oc, k, stride, pad): the 23 distinct convs of ResNet-50 at batch 1
RESNET50_CONVS = [
    (1, 3, 224, 224, 64, 7, 2, 3), (1, 64, 56, 56, 64, 1, 1, 0), (1, 64, 56, 56, 64, 3, 1, 1),
    (1, 64, 56, 56, 256, 1, 1, 0), (1, 256, 56, 56, 64, 1, 1, 0), (1, 256, 56, 56, 128, 1, 1, 0),
    (1, 128, 56, 56, 128, 3, 2, 1), (1, 128, 28, 28, 512, 1, 1, 0), (1, 256, 56, 56, 512, 1, 2, 0),
    (1, 512, 28, 28, 128, 1, 1, 0), (1, 128, 28, 28, 128, 3, 1, 1), (1, 512, 28, 28, 256, 1, 1, 0),
    (1, 256, 28, 28, 256, 3, 2, 1), (1, 256, 14, 14, 1024, 1, 1, 0), (1, 512, 28, 28, 1024, 1, 2, 0),
    (1, 1024, 14, 14, 256, 1, 1, 0), (1, 256, 14, 14, 256, 3, 1, 1), (1, 1024, 14, 14, 512, 1, 1, 0),
    (1, 512, 14, 14, 512, 3, 2, 1), (1, 512, 7, 7, 2048, 1, 1, 0), (1, 1024, 14, 14, 2048, 1, 2, 0),
    (1, 2048, 7, 7, 512, 1, 1, 0), (1, 512, 7, 7, 512, 3, 1, 1),
]


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def conv_primfunc(n, c, h, w, oc, k, stride=1, pad=0, dil=1, groups=1, residual=False, activation="relu",
                  target=None, dtype="float32"):
    """The fused conv PrimFunc as tvm_fusion.fusion.fuse builds it for `target` (its kind's compute, given the
    target; None: the generic compute): (func, attrs, input shapes) for the schedule tests.
    `dtype`: of x, W, the residual and the output; the bias is in the accumulator dtype (float32 for half)."""
    (kh, kw), strides, dilation = _pair(k), _pair(stride), _pair(dil)
    padding = (pad,) * 4 if isinstance(pad, int) else tuple(pad)
    attrs = dict(strides=strides, padding=padding, dilation=dilation, groups=groups, activation=activation)

    x = te.placeholder((n, c, h, w), dtype, name="x")
    wt = te.placeholder((oc, c // groups, kh, kw), dtype, name="w")
    b = te.placeholder((oc,), accumulator_dtype(dtype), name="b")
    oh = _conv_out(h, kh, strides[0], padding[0], padding[2], dilation[0])
    ow = _conv_out(w, kw, strides[1], padding[1], padding[3], dilation[1])
    inputs = [x] + ([te.placeholder((n, oc, oh, ow), dtype, name="r")] if residual else [])
    fast_math = fast_math_allowed(t.dtype for t in (*inputs, wt, b))
    if target is None:
        out = conv2d_affine(x, wt, b, *inputs[1:], **attrs, fast_math=fast_math)
    else:

        load()
        compute = get_compute(CONV_FAMILY, target.kind.name)
        out = compute(x, wt, b, *inputs[1:], **attrs, **compute_options(compute, fast_math=fast_math, target=target))
    func = te.create_prim_func([*inputs, wt, b, out]).without_attr("global_symbol")
    shapes = [tuple(int(d) for d in t.shape) for t in (*inputs, wt, b)]
    return func, attrs, shapes
