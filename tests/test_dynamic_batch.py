"""A symbolic batch dim (`--shape x=Nx4x8x8`, `N<=4`): it stays symbolic through the fused kernels, so one
library serves every batch; checked against onnxruntime element by element at several batches, with the
same rule counts as the static build. The whole-ResNet-50 checks are `slow`."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from tvm_fusion import cli
from tvm_fusion._tvm import relax, tvm
from tvm_fusion.build.builder import build, resolve_target
from tvm_fusion.check.compare import run_onnxruntime
from tvm_fusion.errors import FusionError
from tvm_fusion.frontend.importer import SymDim, check_sizes, import_onnx, parse_shape
from tvm_fusion.fusion.fuse import fuse
from tvm_fusion.build.builder import default_rules
from tvm_fusion.runtime import load
from tvm_fusion.rules import shape_text
from tvm_fusion.testing import GraphBuilder, assert_close, run_build

#: every rule family, batch first: conv + BN + ReLU, conv + BN + residual + ReLU, a depthwise conv + ReLU,
#: an elementwise chain, global pool, a dense + bias + ReLU on [N, 16] and a LayerNorm over its features
FAMILIES = {"conv2d_bn_relu": 1, "conv2d_bn_add_relu": 1, "conv2d_relu": 1, "elementwise_chain_3": 1,
            "dense_bias_relu": 1, "layer_norm": 1}


def _families(batch) -> onnx.ModelProto:
    g = GraphBuilder(7)
    x = g.input("x", [batch, 4, 8, 8])
    y = g.op("Relu", [g.bn(g.conv(x, 4, 16), 16)])  # 16 channels: the CPU's register-tiled conv schedule
    y = g.op("Relu", [g.op("Add", [g.bn(g.conv(y, 16, 16), 16), y])])
    y = g.op("Relu", [g.conv(y, 16, 16, groups=16, bias=False)])  # depthwise: the generic / CUDA depthwise path
    y = g.op("Tanh", [g.op("Mul", [g.op("Add", [y, g.const(np.full((16, 1, 1), 0.5, np.float32))]),
                                   g.const(np.full((1, 16, 1, 1), 0.25, np.float32))])])
    y = g.op("Flatten", [g.op("GlobalAveragePool", [y])])
    w = g.const(g.rng.normal(0, 0.3, (16, 16)).astype(np.float32))
    y = g.op("Relu", [g.op("Gemm", [y, w, g.const(g.rng.normal(0, 0.1, 16).astype(np.float32))], transB=1)])
    ln = g.op("LayerNormalization", [y, g.const(np.full(16, 1.5, np.float32)), g.const(np.zeros(16, np.float32))],
              axis=-1, epsilon=1e-5)
    return g.model([ln], opset=18)


@pytest.fixture(scope="module")
def symbolic_model():
    return _families("N")


def _fired(counts):
    return {k: v for k, v in counts.items() if v}


def _batch(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + n).standard_normal((n, 4, 8, 8)).astype(np.float32)


# ---------------------------------------------------------------- the --shape syntax
def test_shape_syntax_names_symbolic_dims():
    assert parse_shape("x=Nx3x224x224") == ("x", (SymDim("N"), 3, 224, 224))
    assert parse_shape("in:0=batch<=64x128") == ("in:0", (SymDim("batch", 64), 128))
    assert str(parse_shape("x=N<=64x3")[1][0]) == "N<=64"
    with pytest.raises(FusionError, match="every dim must be at least 1"):
        parse_shape("x=N<=0x3")
    with pytest.raises(FusionError, match=r"dim 'N<16' is neither a positive integer nor a symbolic name"):
        parse_shape("x=N<16x3")


def test_symbolic_dim_on_a_declared_size_is_refused():
    with pytest.raises(FusionError, match=r"makes dim 0 symbolic, but the model declares it as 2 .*dynamic_axes"):
        import_onnx(_families(2), {"x": (SymDim("N"), 4, 8, 8)})


def test_one_name_two_bounds_is_refused():
    g = GraphBuilder(0)
    a, b = g.input("a", ["N", 8]), g.input("b", ["N", 8])
    model = g.model([g.op("Add", [a, b])])
    with pytest.raises(FusionError, match="symbolic dim N has upper bound 8 here and 4 in another --shape"):
        import_onnx(model, {"a": (SymDim("N", 4), 8), "b": (SymDim("N", 8), 8)})


def test_check_sizes():
    assert check_sizes({"x": (1, 3)}) == [{}]
    assert check_sizes({"x": (SymDim("N"), 3)}) == [{"N": 1}, {"N": 3}]
    assert check_sizes({"x": (SymDim("N", 64), 3)}) == [{"N": 1}, {"N": 8}]
    assert check_sizes({"x": (SymDim("N", 2), 3)}) == [{"N": 1}, {"N": 2}]
    assert check_sizes({"x": (SymDim("N"), 3)}, {"x": np.zeros((5, 3))}) == [{"N": 5}]


# ---------------------------------------------------------------- every family, one library, every batch
def test_families_keep_the_batch_symbolic_and_match_onnxruntime(symbolic_model):
    """Same rule counts as the static build; each fused kernel takes N from its input; batches 1, 2 and 5
    of the one build match onnxruntime element by element."""
    mod = import_onnx(symbolic_model, {"x": (SymDim("N", 8), 4, 8, 8)})
    assert mod["main"].attrs["tir_var_upper_bound"]["N"] == 8
    built = build(mod, "llvm", "fused")
    static = build(import_onnx(_families(2)), "llvm", "fused")
    assert _fired(built.counts) == _fired(static.counts) == FAMILIES
    assert built.kernel_calls == static.kernel_calls
    assert built.module["main"].attrs["tir_var_upper_bound"]["N"] == 8  # reaches memory planning
    assert shape_text(built.module["main"].body.body) == "(N, 16)"
    vm = relax.VirtualMachine(built.executable, tvm.cpu())
    sess, _ = run_onnxruntime(symbolic_model, {}, optimize=False)
    for n in (1, 2, 5):
        x = _batch(n)
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        assert got.shape == (n, 16)
        assert_close(got, sess.run(None, {"x": x})[0], f"batch {n}")


def test_a_batch_dim_named_like_tvmscripts_prefix_fuses():
    """A batch dim named T (TVMScript prints a TIR variable called T as T_1, since T is its module's name): the
    kernels take it by its own name, the same families fire and batch 3 matches onnxruntime."""
    model = _families("T")
    built = build(import_onnx(model, {"x": (SymDim("T"), 4, 8, 8)}), "llvm", "fused")
    assert _fired(built.counts) == FAMILIES
    sess, _ = run_onnxruntime(model, {}, optimize=False)
    assert_close(run_build(built, [_batch(3)])[0], sess.run(None, {"x": _batch(3)})[0], "batch 3 of T")


def _loops(func, kinds) -> list[str]:
    """The loop headers of a PrimFunc's script whose kind is one of `kinds` (T.parallel, T.vectorized, ...)."""
    return [line.strip() for line in func.script().splitlines()
            if line.strip().startswith("for ") and any(k in line for k in kinds)]


def test_cpu_schedules_parallelize_the_batch_and_never_vectorize_it(symbolic_model):
    built = build(import_onnx(symbolic_model, {"x": (SymDim("N"), 4, 8, 8)}), "llvm", "fused")
    kernels = {gv.name_hint: f for gv, f in built.fused.mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert set(kernels) == set(FAMILIES)
    for name, func in kernels.items():
        assert not [h for h in _loops(func, ("T.vectorized", "T.unroll")) if "N" in h.split(" in ")[1]], name
        if name != "dense_bias_relu":  # the dense parallelizes its column blocks and walks the rows
            assert any("N" in h.split(" in ")[1] for h in _loops(func, ("T.parallel",))), name


def test_non_batch_symbolic_dims_decline_with_reason():
    g = GraphBuilder(1)
    x = g.input("x", [1, 4, "H", 8])
    model = g.model([g.op("Relu", [g.bn(g.conv(x, 4, 8), 8)])])
    mod = import_onnx(model, {"x": (1, 4, SymDim("H"), 8)})
    result = fuse(mod, resolve_target("llvm"), default_rules())
    assert result.total == 0
    reasons = {d.reason for d in result.decisions if d.rule == "conv2d_bn_relu"}
    assert reasons == {"conv2d input has shape (1, 4, H, 8); only the outermost (batch) dim may stay symbolic: "
                       "bind the others with --shape (e.g. NAME=Nx3x224x224)"}


def test_symbolic_sequence_dim_declines_layer_norm_and_chains_with_reason():
    g = GraphBuilder(3)
    x = g.input("x", [1, "S", 16])
    half = g.const(np.full(16, 0.5, np.float32))
    y = g.op("Tanh", [g.op("Mul", [g.op("Add", [x, g.const(np.ones(16, np.float32))]), half])])
    ln = g.op("LayerNormalization", [y, g.const(np.ones(16, np.float32)), g.const(np.zeros(16, np.float32))], axis=-1)
    result = fuse(import_onnx(g.model([ln], opset=18), {"x": (1, SymDim("S"), 16)}), resolve_target("llvm"),
                  default_rules())
    assert result.total == 0
    reasons = {d.rule: d.reason for d in result.decisions}
    tail = "; only the outermost (batch) dim may stay symbolic: bind the others with --shape (e.g. NAME=Nx3x224x224)"
    assert reasons["layer_norm"] == "layer norm input has shape (1, S, 16)" + tail
    assert reasons["elementwise_chain_3"] == "elementwise chain output has shape (1, S, 16)" + tail


def test_rank3_dense_with_symbolic_batch_declines_with_reason():
    g = GraphBuilder(2)
    x = g.input("x", ["N", 5, 16])
    w = g.const(g.rng.normal(0, 0.2, (16, 8)).astype(np.float32))
    model = g.model([g.op("Relu", [g.op("Add", [g.op("MatMul", [x, w]), g.const(np.ones(8, np.float32))])])])
    result = fuse(import_onnx(model, {"x": (SymDim("N"), 5, 16)}), resolve_target("llvm"), default_rules())
    reasons = {d.reason for d in result.decisions if d.rule == "dense_bias_relu"}
    assert reasons == {"matmul input has shape (N, 5, 16); with a symbolic batch the kernel takes a 2-D x only "
                       "(it would view x as [rows, K] with rows a product of dims)"}
    assert result.counts["dense_bias_relu"] == 0


def _hann_window() -> onnx.ModelProto:
    """The ONNX suite's HannWindow body as the simplifier leaves it (test_hannwindow_expanded): a Range whose
    length is the input's value, times a scalar computed from the same input."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Cast", ["x"], ["n"], to=TensorProto.FLOAT),
             helper.make_node("Sub", ["n", "one"], ["n1"]),
             helper.make_node("Mul", ["n1", "zero"], ["symmetric"]),
             helper.make_node("Add", ["n", "symmetric"], ["size"]),
             helper.make_node("Div", ["two_pi", "size"], ["step"]),
             helper.make_node("Range", ["zero", "n", "one"], ["k"]),
             helper.make_node("Mul", ["k", "step"], ["angle"]),
             helper.make_node("Cos", ["angle"], ["cos"]),
             helper.make_node("Mul", ["half", "cos"], ["half_cos"]),
             helper.make_node("Sub", ["half", "half_cos"], ["y"])]
    inits = [helper.make_tensor(name, TensorProto.FLOAT, [], [v])
             for name, v in (("one", 1.0), ("zero", 0.0), ("two_pi", 2 * np.pi), ("half", 0.5))]
    graph = helper.make_graph(nodes, "hann", [helper.make_tensor_value_info("x", TensorProto.INT32, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["L"])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_dim_computed_inside_the_graph_is_not_a_batch():
    """Range's length (range_len_0, bound by a match_cast inside the graph) was taken for a symbolic batch:
    the window's chain fused across it, the fused call landed before the match_cast and the VM's shape
    lowering failed ("range_len_0 ... has not been computed"). Only the scalar part fuses now, and every
    chain over the Range declines naming the dim."""
    model = _hann_window()
    mod = import_onnx(model, simplify=False)
    assert not [p for p in mod["main"].params if shape_text(p) != "()"]  # nothing declared symbolic
    fused = build(mod, "llvm", "fused")
    assert {k: v for k, v in fused.counts.items() if v} == {"elementwise_chain_4": 1}  # size and step, scalars
    reasons = {d.reason for d in fused.fused.decisions if d.reason}
    assert reasons and all("its dim range_len_0 is computed inside the graph (by a data-dependent op such as "
                           "Range), not a batch dim declared with --shape (none declared)" in r for r in reasons)
    x = np.array(10, np.int32)
    got, unfused = (run_build(b, [x])[0] for b in (fused, build(mod, "llvm", "unfused")))
    assert got.shape == (10,)
    assert_close(got, unfused, "fused vs unfused")
    sess, _ = run_onnxruntime(model, {"x": x})
    assert_close(got, sess.run(None, {"x": x})[0], "fused vs onnxruntime")


def test_declared_batch_dims_are_the_inputs_symbolic_dims():
    """batch_shape with Match.batch_dims keeps a declared N outermost, refuses any other variable there."""
    from tvm_fusion._tvm import tirx
    from tvm_fusion.rules import batch_shape, declared_batch_dims, symbolic_reason

    n, k = tirx.Var("N", "int64"), tirx.Var("range_len_0", "int64")
    x = relax.Var("x", relax.TensorType((n, 4), "float32"))
    assert declared_batch_dims(relax.Function([x], x)) == {"N"}
    inner = relax.Var("r", relax.TensorType((k, 4), "float32"))
    assert batch_shape(x, {"N"}) == (n, 4) and batch_shape(inner, {"N"}) is None
    assert symbolic_reason("Range (node 5)", inner, {"N"}) == (
        "Range (node 5) has shape (range_len_0, 4); its dim range_len_0 is computed inside the graph (by a "
        "data-dependent op such as Range), not a batch dim declared with --shape (N); only a declared batch may "
        "stay symbolic")


def test_families_build_for_cuda_with_a_symbolic_grid(symbolic_model):
    """Compile check (no GPU): same counts, each kernel within the launch limits, the grid sized from N
    (blockIdx.x's extent is symbolic), and nvcc compiles the source."""
    from tvm_fusion.build.cuda_compiler import compile_cuda_source, cuda_source
    from tvm_fusion.schedules.cuda.gpu_limits import check_gpu_limits

    target = resolve_target("cuda")
    built = build(import_onnx(symbolic_model, {"x": (SymDim("N", 64), 4, 8, 8)}), target, "fused")
    assert _fired(built.counts) == FAMILIES
    kernels = [(gv.name_hint, f) for gv, f in built.fused.mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(kernels) == len(FAMILIES)
    for name, func in kernels:
        check = check_gpu_limits(func, target)
        assert check.ok, f"{name}: {check}"
        assert any(p.shape and not isinstance(p.shape[0], tvm.tirx.IntImm) for p in func.params), name
        grid = [h for h in _loops(func, ("blockIdx",)) if "N" in h.split(" in ")[1]]
        assert grid, f"{name}: the grid does not grow with N"
    source = cuda_source(built.executable)
    assert "int N" in source  # the kernels take the batch as an argument
    assert compile_cuda_source(source, "sm_90")[:4] == b"\x50\xed\x55\xba"


# ---------------------------------------------------------------- the command line, the manifest, the runtime
def test_compile_records_the_symbolic_batch_and_the_runtime_enforces_its_bound(tmp_path, symbolic_model, capsys):
    path, lib = tmp_path / "m.onnx", tmp_path / "m.so"
    onnx.save(symbolic_model, str(path))
    assert cli.main(["compile", str(path), "--shape", "x=N<=4x4x8x8", "--target", "llvm", "-o", str(lib)]) == 0
    assert "against onnxruntime on seeded inputs at N=1 and N=4" in capsys.readouterr().out
    manifest = json.loads((tmp_path / "m.so.json").read_text())
    assert manifest["inputs"] == [{"name": "x", "shape": ["N", 4, 8, 8], "dtype": "float32"}]
    assert manifest["symbolic_dims"] == {"N": {"upper_bound": 4, "max_size": 4}}
    assert manifest["verification"]["symbolic_dims_checked_at"] == [{"N": 1}, {"N": 4}]
    assert set(manifest["verification"]["outputs"]) == {f"{manifest_out} at N={n}" for n in (1, 4)
                                                       for manifest_out in [symbolic_model.graph.output[0].name]}
    assert _fired(manifest["rule_counts"]) == FAMILIES
    model = load(lib)
    sess, _ = run_onnxruntime(symbolic_model, {}, optimize=False)
    for n in (1, 3):
        x = _batch(n, seed=9)
        assert_close(model(x)[0], sess.run(None, {"x": x})[0], f"batch {n}")
    with pytest.raises(FusionError, match=r"input 'x' has N = 5, more than the library allows \(N <= 4\)"):
        model(_batch(5))


def test_bound_past_int32_indexing_is_bad_input(tmp_path, symbolic_model, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(symbolic_model, str(path))
    out = ["--target", "llvm", "-o", str(tmp_path / "m.so")]
    assert cli.main(["compile", str(path), "--shape", "x=N<=99999999x4x8x8", *out]) == 2
    assert ("--shape x=N<=99999999x4x8x8 has 25599999744 elements at its upper bound, more than TVM's int32 "
            "indexing allows") in capsys.readouterr().err
    # the input fits (256 elements per image), but the padded 16-channel conv stages hold 16 * 10 * 10 per image
    assert cli.main(["compile", str(path), "--shape", "x=N<=5000000x4x8x8", *out]) == 2
    assert ("N<=5000000 is more than the fused kernels' int32 indexing allows (N<=1342177: a kernel holds 1600 "
            "elements per unit of N)") in capsys.readouterr().err
    assert not (tmp_path / "m.so").exists()


def test_compare_checks_batch_1_and_3(tmp_path, symbolic_model, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(symbolic_model, str(path))
    assert cli.main(["compare", str(path), "--shape", "x=Nx4x8x8", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    for pair in ("fused vs unfused", "fused vs onnxruntime", "unfused vs onnxruntime", "tvm vs onnxruntime"):
        for n in (1, 3):
            assert f"{pair} at N={n}" in out
    assert "PASS" in out.splitlines()[-2] + out.splitlines()[-1]
    assert cli.main(["compare", str(path), "--shape", "x=Nx4x8x8", "--per-group"]) == 0  # bound to N=3


# ---------------------------------------------------------------- ResNet-50 (slow)
@pytest.mark.slow
def test_resnet50_batch_symbolic_library_runs_at_1_3_8(tmp_path, capsys):
    from tests.test_resnet50 import _cpu_counts
    from tvm_fusion.examples import example_model

    lib = tmp_path / "r50.so"
    assert cli.main(["compile", "--example", "resnet50", "--shape", "gpu_0/data_0=Nx3x224x224", "--target", "llvm",
                     "-o", str(lib)]) == 0
    assert "at N=1 and N=3" in capsys.readouterr().out
    manifest = json.loads((tmp_path / "r50.so.json").read_text())
    assert _fired(manifest["rule_counts"]) == _cpu_counts()
    assert manifest["inputs"][0]["shape"] == ["N", 3, 224, 224]
    proto = example_model("resnet50", dynamic_batch=True)
    sess, _ = run_onnxruntime(proto, {}, optimize=False)
    model = load(lib)
    for n in (1, 3, 8):
        x = np.random.default_rng(n).standard_normal((n, 3, 224, 224)).astype(np.float32)
        for got, ref, name in zip(model(x), sess.run(None, {"gpu_0/data_0": x}), ("softmax", "logits")):
            assert got.shape == (n, 1000)
            assert_close(got, ref, f"{name} at batch {n}")


@pytest.mark.slow
def test_resnet50_batch_symbolic_cuda_library(tmp_path, capsys):
    from tests.test_resnet50 import RESNET50_COUNTS

    lib = tmp_path / "r50.so"
    assert cli.main(["compile", "--example", "resnet50", "--shape", "gpu_0/data_0=N<=64x3x224x224",
                     "--target", "cuda", "-o", str(lib)]) == 0
    manifest = json.loads((tmp_path / "r50.so.json").read_text())
    assert _fired(manifest["rule_counts"]) == RESNET50_COUNTS
    assert manifest["symbolic_dims"] == {"N": {"upper_bound": 64, "max_size": 64}}
    assert manifest["cuda_binary"]["format"] == "fatbin"
    kernels = set(manifest["cuda_binary"]["kernels"])
    assert all(g["kernels"] and set(g["kernels"]) <= kernels for g in manifest["groups"])
    assert manifest["verification"]["symbolic_dims_checked_at"] == [{"N": 1}, {"N": 8}]


def test_inputs_array_sets_the_checked_batch(tmp_path, symbolic_model):
    """--inputs with a symbolic batch: the array's batch is the one checked, and it must fit the bound."""
    from tvm_fusion.deploy.compile import compile_model

    path = tmp_path / "m.onnx"
    onnx.save(symbolic_model, str(path))
    result = compile_model(path, tmp_path / "m.so", "llvm", shapes={"x": (SymDim("N", 8), 4, 8, 8)},
                           inputs={"x": _batch(5)}, counts_of_other_builds=False)
    verification = result.manifest["verification"]
    assert verification["symbolic_dims_checked_at"] == [{"N": 5}] and verification["inputs_given"] == ["x"]
    assert result.manifest["inputs"][0]["shape"] == ["N", 4, 8, 8]  # still symbolic
    with pytest.raises(FusionError, match=r"--inputs 'x': shape 9x4x8x8, the model expects N<=8x4x8x8"):
        compile_model(path, tmp_path / "n.so", "llvm", shapes={"x": (SymDim("N", 8), 4, 8, 8)},
                      inputs={"x": _batch(9)})
