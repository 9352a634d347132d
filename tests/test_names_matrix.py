"""Names that need sanitizing (`y/0`, `a:0`, `1x`, `conv.weight`, spaces, unicode, C keywords, Relax's own var
names), each in every position a tensor can take: a graph input, an initializer, an intermediate inside a fused
group, a graph output, an outer tensor read inside both branches of an If, an outer initializer read inside a
branch, a value inside a branch. Each model has a fusible chain outside the If (Conv -> BatchNormalization ->
Relu) and in each branch (Conv -> BatchNormalization -> Relu; MatMul -> Add -> Relu); it is built fused for
llvm and run against onnxruntime element by element on both branches, and the library keeps the user's names."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_fusion import explain
from tvm_fusion.build.builder import build
from tvm_fusion.frontend.importer import import_onnx
from tvm_fusion.check.io import run_onnxruntime
from tvm_fusion.testing import assert_close, check_cuda_build, run_build

NAMES = ["y/0", "a:0", "1x", "conv.weight", "with space", "ünï/çødé", "if", "main", "lv0", "x-1"]
POSITIONS = ["input", "initializer", "intermediate", "outer_read", "outer_weight", "branch_value", "output", "cond"]
C = 4  # channels
HW = 6


#: a sanitized name may also collide with a plain one (`y_0`) or with a name the sanitizer makes itself
PLAIN = {"input": "x", "initializer": "w", "intermediate": "h", "outer_read": "r", "outer_weight": "w2",
         "branch_value": "t", "output": "out", "cond": "c"}
#: what fires in names_model: the chain outside the If and the one in its then branch, the else branch's dense
FIRED = {"conv2d_bn_relu": 2, "dense_bias_relu": 1}


def names_model(names: dict[str, str] | None = None, branches_read: str = "outer_read") -> onnx.ModelProto:
    """x -> Conv(w) -> h -> BN -> Relu = r (also a graph output); If(c): then Conv(r, w2) -> BN -> t -> Relu,
    else MatMul(r, m) -> Add -> Relu; the If's result is `out`. `names` maps a position (POSITIONS) to the name
    its tensor takes; `branches_read="intermediate"` has the branches read h (inside the outer chain) instead."""
    n = {**PLAIN, **(names or {})}
    rng = np.random.default_rng(0)

    def const(name, a):
        return numpy_helper.from_array(np.asarray(a, np.float32), name)

    def bn(prefix, x, out):
        vals = [rng.uniform(0.5, 1.5, C), rng.normal(0, 0.1, C), rng.normal(0, 0.5, C), rng.uniform(0.5, 2.0, C)]
        inits = [const(f"{prefix}_bn{i}", v) for i, v in enumerate(vals)]
        return inits, helper.make_node("BatchNormalization", [x] + [t.name for t in inits], [out],
                                       name=f"{prefix}/bn", epsilon=1e-5)

    conv, shape, read = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), [1, C, HW, HW], n[branches_read]
    main_inits = [const(n["initializer"], rng.normal(0, 0.5, (C, C, 3, 3))), const("b", rng.normal(0, 0.1, C)),
                  const(n["outer_weight"], rng.normal(0, 0.5, (C, C, 3, 3)))]
    bn_inits, bn_node = bn("main", n["intermediate"], "bn_out")
    nodes = [helper.make_node("Conv", [n["input"], n["initializer"], "b"], [n["intermediate"]], name="main/conv",
                              **conv),
             bn_node, helper.make_node("Relu", ["bn_out"], [n["outer_read"]], name="main/relu")]
    then_inits, then_bn = bn("then", "then_conv", n["branch_value"])
    then = helper.make_graph(
        [helper.make_node("Conv", [read, n["outer_weight"]], ["then_conv"], name="then/conv", **conv),
         then_bn, helper.make_node("Relu", [n["branch_value"]], ["then_out"], name="then/relu")],
        "then", [], [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, shape)], then_inits)
    other = helper.make_graph(
        [helper.make_node("MatMul", [read, "m"], ["else_mm"], name="else/matmul"),
         helper.make_node("Add", ["else_mm", "m_bias"], ["else_add"], name="else/add"),
         helper.make_node("Relu", ["else_add"], ["else_out"], name="else/relu")],
        "else", [], [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, shape)],
        [const("m", rng.normal(0, 0.5, (HW, HW))), const("m_bias", rng.normal(0, 0.1, HW))])
    nodes.append(helper.make_node("If", [n["cond"]], [n["output"]], name="branch", then_branch=then, else_branch=other))
    graph = helper.make_graph(
        nodes, "names", [helper.make_tensor_value_info(n["input"], TensorProto.FLOAT, shape),
                         helper.make_tensor_value_info(n["cond"], TensorProto.BOOL, [])],
        [helper.make_tensor_value_info(n["output"], TensorProto.FLOAT, shape),
         helper.make_tensor_value_info(n["outer_read"], TensorProto.FLOAT, shape)],
        main_inits + bn_inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def _feeds(model, taken: bool, batch: int = 1, dtype=np.float32, seed: int = 1) -> dict:
    x, c = (i.name for i in model.graph.input)
    return {x: np.random.default_rng(seed).normal(0, 1, (batch, C, HW, HW)).astype(dtype), c: np.array(taken)}


def check_both_branches(model, run, batches=(1,), dtype=np.float32) -> None:
    """`run(list of arrays) -> outputs` against onnxruntime, element by element, on either branch."""
    for batch in batches:
        for taken in (True, False):
            feeds = _feeds(model, taken, batch, dtype)
            sess, _ = run_onnxruntime(model, feeds, optimize=False)
            ref = sess.run(None, feeds)
            got = run(list(feeds.values()))
            assert len(got) == len(ref)
            for i, (a, r) in enumerate(zip(got, ref)):
                assert str(a.dtype) == str(r.dtype)
                assert_close(a, r, f"output {model.graph.output[i].name!r}, branch {taken}, batch {batch}")


def built_fused(model, shapes=None, batches=(1,), dtype=np.float32):
    built = build(import_onnx(model, shapes), "llvm", "fused")
    check_both_branches(model, lambda arrays: run_build(built, arrays), batches, dtype)
    return built


def symbolic_batch(model) -> onnx.ModelProto:
    """The model with dim 0 of its first input, its outputs and its branches' outputs named `N`."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graphs = [model.graph] + [a.g for n in model.graph.node for a in n.attribute if a.HasField("g")]
    for v in [model.graph.input[0], *(o for g in graphs for o in g.output)]:
        v.type.tensor_type.shape.dim[0].dim_param = "N"
    return model


def _fired(built) -> dict:
    return {k: v for k, v in built.counts.items() if v}


#: the default run takes one name in every position and a few in the outer tensor the branches read
_QUICK = {(p, "y/0") for p in POSITIONS} | {("outer_read", name) for name in ("a:0", "ünï/çødé")}
CASES = [pytest.param(p, name, id=f"{p}-{name}", marks=() if (p, name) in _QUICK else pytest.mark.slow)
         for p in POSITIONS for name in NAMES]


@pytest.mark.parametrize("position, name", CASES)
def test_name_in_each_position(position, name):
    built = built_fused(names_model({position: name}))
    assert _fired(built) == FIRED
    assert not built.unscheduled


def test_symbolic_batch_with_every_name_to_sanitize():
    """--shape y/0=Nx4x6x6: built once, run at batch 1 and 3 on either branch (the else branch's MatMul is a
    batched one then: its batch is symbolic)."""
    names = dict(zip(POSITIONS, NAMES))
    built = built_fused(symbolic_batch(names_model(names)), {names["input"]: ("N", C, HW, HW)}, batches=(1, 3))
    assert _fired(built) == {"conv2d_bn_relu": 2, "batch_matmul_relu": 1}


def test_float16_with_every_name_to_sanitize():
    from tvm_fusion.testing import as_float16

    built = built_fused(as_float16(names_model(dict(zip(POSITIONS, NAMES)))), dtype=np.float16)
    assert _fired(built) == FIRED


def test_bfloat16_with_every_name_to_sanitize():
    """onnxruntime has no bfloat16 Conv: the float32 model's outputs are the reference, judged with bfloat16's
    tolerance."""
    import ml_dtypes

    from tvm_fusion.testing import as_float16

    names = dict(zip(POSITIONS, NAMES))
    model = names_model(names)
    built = build(import_onnx(as_float16(model, "bfloat16")), "llvm", "fused")
    assert _fired(built) == FIRED
    for taken in (True, False):
        feeds = _feeds(model, taken)
        feeds[names["input"]] = feeds[names["input"]].astype(ml_dtypes.bfloat16).astype(np.float32)
        sess, _ = run_onnxruntime(model, feeds, optimize=False)
        got = run_build(built, [feeds[names["input"]].astype(ml_dtypes.bfloat16), feeds[names["cond"]]])
        for a, r in zip(got, sess.run(None, feeds), strict=True):
            assert str(a.dtype) == "bfloat16"
            assert_close(a.astype(np.float32), r, f"bfloat16, branch {taken}", dtype="bfloat16")


def test_sanitized_name_beside_its_own_sanitized_form():
    """`y/0` and `y_0` (what `y/0` would become) in one model: two tensors, two names."""
    built = built_fused(names_model({"outer_read": "y/0", "intermediate": "y_0", "branch_value": "y_0_1",
                                     "input": "y:0"}))
    assert _fired(built) == FIRED


@pytest.mark.parametrize("name", [pytest.param("h", marks=pytest.mark.slow), "y/0"])
def test_branches_read_an_intermediate_of_the_outer_chain(name):
    """The branches read the conv's output, inside the outer conv -> BN -> Relu: that chain declines (the
    intermediate has readers in the branches) and fuses as conv + bias and BN + Relu; both branches fuse."""
    model = names_model({"intermediate": name}, branches_read="intermediate")
    built = built_fused(model)
    assert _fired(built) == {"conv2d_bn_relu": 1, "dense_bias_relu": 1, "conv2d_bias": 1, "elementwise_chain_3": 1}
    reasons = {d.rule: d.reason for d in explain(model).declined() if d.onnx_node == "main/relu"}
    assert reasons["conv2d_bn_relu"] == ("intermediate main/conv has 3 consumers (main/bn, then/conv, else/matmul); "
                                         "fusing would hide it from then/conv, else/matmul")


@pytest.mark.parametrize("at", [pytest.param(0, marks=pytest.mark.slow), 1, 2, pytest.param(3, marks=pytest.mark.slow)])
def test_if_anywhere_in_node_order(at):
    """The branches read the graph input `y/0`, and the If comes at `at` in the node list (before, inside or after
    the outer conv -> BN -> Relu; all valid orders): the outer chain fuses whatever the order (an If between its
    ops once split it across two dataflow blocks: a composite function that no longer matched its pattern)."""
    model = names_model({"input": "y/0", "intermediate": "h/0"}, branches_read="input")
    nodes = list(model.graph.node)
    order = [n for n in nodes if n.op_type != "If"]
    order.insert(at, nodes[-1])
    del model.graph.node[:]
    model.graph.node.extend(order)
    onnx.checker.check_model(model, full_check=True)
    assert _fired(built_fused(model)) == FIRED


def test_chain_across_an_if():
    """conv -> Add(the If's result) -> Relu: the add reads what the If computes, so the chain has its conv before
    the If and its add after it, in two dataflow blocks; it declines with that reason and the result is right."""
    model = names_model({"output": "if/0", "outer_read": "r/0"})
    g = model.graph
    g.node.extend([helper.make_node("Conv", ["x", "w2"], ["after/conv:0"], name="after/conv", kernel_shape=[3, 3],
                                    pads=[1, 1, 1, 1]),
                   helper.make_node("Add", ["after/conv:0", "if/0"], ["sum/0"], name="after/add"),
                   helper.make_node("Relu", ["sum/0"], ["after:0"], name="after/relu")])
    g.output.append(helper.make_tensor_value_info("after:0", TensorProto.FLOAT, [1, C, HW, HW]))
    onnx.checker.check_model(model, full_check=True)
    built_fused(model)
    reasons = {d.rule: d.reason for d in explain(model).declined() if d.onnx_node == "after/relu"}
    assert reasons["conv2d_add_relu"] == (
        "the match spans two dataflow blocks (intermediate after/conv is read after the block that computes it, "
        "past an If); a fused call cannot take values from two blocks")


def test_cuda_build_with_names_to_sanitize():
    """Every position named at once, built for CUDA (compiled by nvcc, nothing runs)."""
    check_cuda_build(names_model(dict(zip(POSITIONS, NAMES))), expect=FIRED)


def test_compiled_library_keeps_the_models_names(tmp_path):
    """compile (verified against onnxruntime) with a name to sanitize in every position: the manifest lists the
    inputs and outputs under the model's names, runtime.load gives them in call order, and the loaded library
    computes onnxruntime's values on either branch."""
    from tvm_fusion import runtime
    from tvm_fusion.deploy.compile import compile_model

    names = dict(zip(POSITIONS, NAMES))
    model = names_model(names)
    result = compile_model(model, tmp_path / "names.so", target="llvm", counts_of_other_builds=False)
    shape = [1, C, HW, HW]
    assert result.manifest["inputs"] == [{"name": names["input"], "shape": shape, "dtype": "float32"},
                                         {"name": names["cond"], "shape": [], "dtype": "bool"}]
    assert result.manifest["outputs"] == [{"name": names["output"], "shape": shape, "dtype": "float32"},
                                          {"name": names["outer_read"], "shape": shape, "dtype": "float32"}]
    assert list(result.manifest["verification"]["outputs"]) == [names["output"], names["outer_read"]]
    assert {k: v for k, v in result.manifest["rule_counts"].items() if v} == FIRED
    loaded = runtime.load(tmp_path / "names.so")
    assert loaded.input_names == [names["input"], names["cond"]]
    assert loaded.output_names == [names["output"], names["outer_read"]]
    check_both_branches(model, lambda arrays: loaded(*arrays))


# ---------------------------------------------------------------- a Loop body (unrolled: TVM imports no Loop)
LOOP_POSITIONS = ["input", "outer_weight", "outer_read", "body_value", "output"]
LOOP_PLAIN = {"input": "x", "outer_weight": "w2", "outer_read": "r", "body_value": "v", "output": "final"}
#: the chain outside the Loop and the one in each of its 3 iterations
LOOP_FIRED = {"dense_bias_relu": 4}
D = 8


def loop_model(names: dict[str, str] | None = None) -> onnx.ModelProto:
    """x -> MatMul -> Add -> Relu = r; Loop 3 times over v (from r): v' = Relu(MatMul(v, w2) + b), scan v' + r;
    outputs: the final v and the stacked scans. `names` maps a position (LOOP_POSITIONS) to its tensor's name."""
    n = {**LOOP_PLAIN, **(names or {})}
    rng = np.random.default_rng(3)
    f = TensorProto.FLOAT

    def const(name, a, dtype=np.float32):
        return numpy_helper.from_array(np.asarray(a, dtype), name)

    body = helper.make_graph(
        [helper.make_node("MatMul", [n["body_value"], n["outer_weight"]], ["body_mm"], name="body/matmul"),
         helper.make_node("Add", ["body_mm", "body_b"], ["body_add"], name="body/add"),
         helper.make_node("Relu", ["body_add"], ["v_next"], name="body/relu"),
         helper.make_node("Add", ["v_next", n["outer_read"]], ["scan"], name="body/scan"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body/cond")],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info(n["body_value"], f, [2, D])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_next", f, [2, D]), helper.make_tensor_value_info("scan", f, [2, D])],
        [const("body_b", rng.normal(0, 0.1, D))])
    nodes = [helper.make_node("MatMul", [n["input"], "w"], ["mm"], name="main/matmul"),
             helper.make_node("Add", ["mm", "b"], ["add"], name="main/add"),
             helper.make_node("Relu", ["add"], [n["outer_read"]], name="main/relu"),
             helper.make_node("Loop", ["trips", "", n["outer_read"]], [n["output"], "scans"], name="loop/0", body=body)]
    graph = helper.make_graph(
        nodes, "loop", [helper.make_tensor_value_info(n["input"], f, [2, D])],
        [helper.make_tensor_value_info(n["output"], f, [2, D]), helper.make_tensor_value_info("scans", f, [3, 2, D])],
        [const("w", rng.normal(0, 0.5, (D, D))), const("b", rng.normal(0, 0.1, D)),
         const(n["outer_weight"], rng.normal(0, 0.5, (D, D))), const("trips", 3, np.int64)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def check_loop(model) -> None:
    built = build(import_onnx(model), "llvm", "fused")
    assert _fired(built) == LOOP_FIRED
    feeds = {model.graph.input[0].name: np.random.default_rng(2).normal(0, 1, (2, D)).astype(np.float32)}
    sess, _ = run_onnxruntime(model, feeds, optimize=False)
    for i, (a, r) in enumerate(zip(run_build(built, list(feeds.values())), sess.run(None, feeds), strict=True)):
        assert_close(a, r, f"output {model.graph.output[i].name!r}")


LOOP_CASES = [pytest.param(p, name, id=f"{p}-{name}",
                           marks=() if (p, name) in {("outer_read", "y/0"), ("body_value", "y/0")} else pytest.mark.slow)
              for p in LOOP_POSITIONS for name in NAMES]


@pytest.mark.parametrize("position, name", LOOP_CASES)
def test_name_in_a_loop_body(position, name):
    check_loop(loop_model({position: name}))


def test_every_name_in_a_loop_body_at_once():
    check_loop(loop_model(dict(zip(LOOP_POSITIONS, NAMES[1:]))))


def test_cuda_build_of_a_loop_body_with_names_to_sanitize():
    check_cuda_build(loop_model(dict(zip(LOOP_POSITIONS, NAMES))), expect=LOOP_FIRED)


def test_imported_names_are_ascii_c_identifiers():
    """Every relax var of the imported module is an ASCII C identifier (names may reach generated C / CUDA),
    for unicode names in every position."""
    import re

    from tvm_fusion import _tvm

    mod = import_onnx(names_model({p: f"ünï/{p}" for p in POSITIONS}))
    main = mod["main"]
    names = [_tvm.var_name(p) for p in main.params]
    names += [_tvm.var_name(b.var) for block in main.body.blocks for b in block.bindings]
    assert names and all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n) for n in names), names
