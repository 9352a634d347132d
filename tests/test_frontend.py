"""import_onnx: sanitised names, shape binding, Sum -> add, clear errors."""

import pytest
from onnx import TensorProto, helper

from tvm_fusion import FusionError
from tvm_fusion._tvm import relax
from tvm_fusion.frontend.importer import SymDim, import_onnx, onnx_node_names, parse_shape
from tvm_fusion.testing import GraphBuilder, assert_close, conv_bn_relu


def _ops(mod):
    ops = []
    relax.analysis.post_order_visit(mod["main"], lambda e: isinstance(e, relax.Call) and hasattr(e.op, "name")
                                    and ops.append(e.op.name))
    return ops


def test_slash_in_input_name_is_sanitised():
    model = conv_bn_relu()
    model.graph.input[0].name = "gpu_0/data_0"
    model.graph.node[0].input[0] = "gpu_0/data_0"
    mod = import_onnx(model)
    assert [p.name for p in mod["main"].params] == ["gpu_0_data_0"]


def test_opset9_sum_of_two_becomes_add():
    g = GraphBuilder()
    a, b = g.input("a", [1, 4, 5, 5]), g.input("b", [1, 4, 5, 5])
    mod = import_onnx(g.model([g.op("Sum", [a, b])], opset=9))
    assert _ops(mod) == ["relax.add"]


@pytest.mark.parametrize("opset", [9, 17])
def test_inference_dropout_is_removed(opset):
    """Dropout at inference is the identity: gone at import, so Gemm + bias + relu fuse across it."""
    from tvm_fusion.testing import check_fused

    g = GraphBuilder()
    x = g.input("x", [2, 8])
    y = g.op("MatMul", [x, g.const(g.rng.normal(0, 0.3, (8, 6)).astype("float32"))])
    y = g.op("Add", [y, g.const(g.rng.normal(0, 0.1, 6).astype("float32"))])
    y = g.op("Dropout", [y], **({"ratio": 0.5} if opset < 12 else {}))
    model = g.model([g.op("Relu", [y])], opset=opset)
    assert _ops(import_onnx(model)) == ["relax.matmul", "relax.add", "relax.nn.relu"]
    check_fused(model, expect={"dense_bias_relu": 1})


def test_constants_folded_and_dead_bn_outputs_removed():
    mod = import_onnx(conv_bn_relu())
    assert _ops(mod) == ["relax.nn.conv2d", "relax.add", "relax.nn.batch_norm", "relax.nn.relu"]
    assert len(mod["main"].params) == 1  # weights became constants


def test_node_names_recorded():
    model = conv_bn_relu()
    model.graph.node[0].name = "backbone/conv 1"
    table = onnx_node_names(import_onnx(model))
    assert table["backbone_conv_1"] == "backbone/conv 1"
    assert set(table.values()) == {n.name for n in model.graph.node}


def test_a_clip_names_its_node_in_the_conv_group():
    """TVM's Clip converter binds its result itself (maximum, then minimum, each emit_te'd): the node's name
    still reaches the module's table, and the conv -> Clip(0, 6) group lists both nodes (what `explain`
    prints), as a ReLU's group does."""
    import numpy as np

    import tvm_fusion as tf

    g = GraphBuilder()
    x = g.input("x", [1, 8, 10, 10])
    w = g.const(np.random.default_rng(0).standard_normal((16, 8, 3, 3)).astype(np.float32))
    conv = g.op("Conv", [x, w], pads=[1, 1, 1, 1])
    clip = g.op("Clip", [conv, g.const(np.float32(0.0)), g.const(np.float32(6.0))])
    model = g.model([clip], opset=13)
    model.graph.node[0].name, model.graph.node[1].name = "stem/conv", "stem/relu6"
    mod = import_onnx(model)
    assert set(onnx_node_names(mod).values()) == {"stem/conv", "stem/relu6"}
    groups = tf.fuse(mod, "llvm").groups
    assert [(g.rule, g.onnx_nodes) for g in groups] == [("conv2d_relu6", ["stem/conv", "stem/relu6"])]


def _symbolic():
    g = GraphBuilder()
    x = g.input("images", ["N", 3, 8, 8])
    return g.model([g.op("Relu", [x])])


def test_symbolic_dim_refused_with_syntax():
    with pytest.raises(FusionError, match=r"input 'images' has symbolic shape \?x3x8x8; bind it with --shape images="):
        import_onnx(_symbolic())


def test_symbolic_dim_bound_from_shapes():
    mod = import_onnx(_symbolic(), shapes={"images": (2, 3, 8, 8)})
    assert [int(d) for d in mod["main"].params[0].ty.shape] == [2, 3, 8, 8]


@pytest.mark.parametrize("dim", ["N", "N<=4", SymDim("N", 4)])
def test_symbolic_dim_from_python_as_a_string_or_symdim(dim):
    """shapes= from Python takes the CLI's dims as strings too ('N', 'N<=4'), not only SymDim."""
    mod = import_onnx(_symbolic(), shapes={"images": (dim, 3, 8, 8)})
    n, *rest = mod["main"].params[0].ty.shape
    assert str(n) == "N" and [int(d) for d in rest] == [3, 8, 8]


@pytest.mark.parametrize("dims", [("N?", 3, 8, 8), (-1, 3, 8, 8), (2.0, 3, 8, 8), (True, 3, 8, 8), 7])
def test_bad_python_shape_is_a_fusion_error(dims):
    """A dim that is neither a non-negative int (0: an empty tensor, as the ONNX backend tests bind) nor a
    symbolic name is a FusionError naming it (was a TypeError from deep in the frontend for a string dim)."""
    with pytest.raises(FusionError, match=r"bad shape .?shapes=\{'images': "):
        import_onnx(_symbolic(), shapes={"images": dims})


def test_shape_for_unknown_input_lists_inputs():
    with pytest.raises(FusionError, match=r"model's inputs are \['images'\]"):
        import_onnx(_symbolic(), shapes={"image": (1, 3, 8, 8)})


@pytest.mark.parametrize("text", ["x", "x=", "x=1x?", "=1x2", "x=0x3"])  # x=1xa: a symbolic dim a
def test_parse_shape_rejects(text):
    with pytest.raises(FusionError, match="expected --shape NAME=1x3x224x224"):
        parse_shape(text)


def test_parse_shape():
    assert parse_shape("gpu_0/data_0=1x3x224x224") == ("gpu_0/data_0", (1, 3, 224, 224))


def test_missing_and_non_onnx_files(tmp_path):
    with pytest.raises(FusionError, match="no such file"):
        import_onnx(tmp_path / "nope.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_text("not a model")
    with pytest.raises(FusionError, match="bad.onnx: not an ONNX model"):
        import_onnx(bad)


def test_unsupported_op_named():
    node = helper.make_node("FancyOp", ["x"], ["y"], name="my_fancy_node", domain="com.example")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    with pytest.raises(FusionError, match="node 'my_fancy_node' uses op com.example::FancyOp"):
        import_onnx(model)


# ---------------------------------------------------------------- every normalisation keeps shape and dtype
def _output_types(mod):
    ty = mod["main"].body.ty
    fields = ty.fields if isinstance(ty, relax.TupleType) else [ty]
    return [([int(d) for d in t.shape], str(t.dtype)) for t in fields]


def _assert_matches_onnxruntime(model, seed=0):
    """Imported output types == onnxruntime's outputs; fused and unfused llvm builds == onnxruntime,
    element by element (numerics' table; integers exactly). Returns the imported module."""

    from tvm_fusion.build.builder import build
    from tvm_fusion.check.compare import random_inputs, run_onnxruntime
    from tvm_fusion.testing import run_build

    mod = import_onnx(model)
    inputs = random_inputs(model, seed=seed)
    ref = run_onnxruntime(model, inputs)[0].run(None, inputs)
    assert _output_types(mod) == [(list(r.shape), str(r.dtype)) for r in ref]
    arrays = [inputs[i.name] for i in model.graph.input if i.name in inputs]
    for mode in ("unfused", "fused"):
        got = run_build(build(mod, "llvm", mode), arrays)
        for g, r in zip(got, ref):
            assert g.shape == r.shape and g.dtype == r.dtype, (mode, g.shape, g.dtype, r.shape, r.dtype)
            assert_close(g, r, f"{mode} vs onnxruntime")
    return mod


_FULL = [2, 3, 4, 5, 6]
#: (constant shape, input shape) for rank r: the constant broadcasts, the input broadcasts, the constant
#: adds leading axes (the rank-5 case that lost its leading axis)
_LAYOUTS = {
    "const_broadcasts": lambda r: ([1] * (r - 1) + [_FULL[r - 1]], _FULL[:r]),
    "input_broadcasts": lambda r: (_FULL[:r], [1] * r),
    "const_adds_axes": lambda r: ([2] + [1] * (r - 1), _FULL[1:r]),
}


@pytest.mark.parametrize("op,relax_op", [("Sum", "relax.add"), ("Max", "relax.maximum"), ("Min", "relax.minimum")])
@pytest.mark.parametrize("rank", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("layout", sorted(_LAYOUTS))
@pytest.mark.parametrize("const_first", [True, False])
def test_sum_max_min_of_two_keep_onnx_broadcast_shape(op, relax_op, rank, layout, const_first):
    """A uniform constant (what the importer makes of a scalar) must not become a scalar where its own
    shape decides the output's: Sum(x[1,4], c[3,4]) is [3,4], not [1,4]."""
    import numpy as np

    if layout == "const_adds_axes" and rank == 1:
        pytest.skip("no rank-0 input")
    cshape, xshape = _LAYOUTS[layout](rank)
    g = GraphBuilder()
    x = g.input("x", xshape)
    c = g.const(np.full(cshape, 0.25, np.float32))
    model = g.model([g.op(op, [c, x] if const_first else [x, c])], opset=9)
    mod = _assert_matches_onnxruntime(model)
    assert _ops(mod) == [relax_op]


@pytest.mark.parametrize("rank", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("bound_rank", [0, 1, 6])
def test_clip_forms_keep_shape(rank, bound_rank):
    """Clip with constant bounds and Min(Max(x, lo), hi) become clip only where that keeps the shape: a
    size-1 bound of higher rank than x broadcasts x to more axes."""
    import numpy as np

    g = GraphBuilder()
    x = g.input("x", _FULL[:rank])
    lo, hi = (g.const(np.full([1] * bound_rank, v, np.float32)) for v in (-0.5, 0.5))
    clip = g.op("Clip", [x, g.const(np.float32(-0.75)), g.const(np.float32(0.75))])
    maxmin = g.op("Min", [g.op("Max", [x, lo]), hi])
    mod = _assert_matches_onnxruntime(g.model([clip, maxmin], opset=13))
    expected = ["relax.clip", "relax.clip"] if bound_rank <= rank else ["relax.clip", "relax.maximum",
                                                                         "relax.minimum"]
    assert _ops(mod) == expected


@pytest.mark.parametrize("rank", [1, 2, 3, 4, 5])
def test_dropout_removal_keeps_shape(rank):
    g = GraphBuilder()
    x = g.input("x", _FULL[:rank])
    mod = _assert_matches_onnxruntime(g.model([g.op("Relu", [g.op("Dropout", [x])])]))
    assert _ops(mod) == ["relax.nn.relu"]


_F16_FORMS = {"Sum": ["relax.add"], "Max": ["relax.maximum"], "Min": ["relax.minimum"], "Clip": ["relax.clip"],
              "MaxMin": ["relax.clip"], "Dropout": []}


@pytest.mark.parametrize("form", sorted(_F16_FORMS))
def test_normalisations_keep_float16(form):
    import numpy as np
    from onnx import TensorProto

    g = GraphBuilder()
    x = g.input("x", [1, 3, 4, 5], TensorProto.FLOAT16)
    f16 = lambda v, shape=(): g.const(np.full(shape, v, np.float16))  # noqa: E731
    if form in ("Sum", "Max", "Min"):
        y = g.op(form, [f16(0.25, (2, 3, 4, 5)), x])
    elif form == "Clip":
        y = g.op("Clip", [x, f16(-0.5), f16(0.5)])
    elif form == "MaxMin":
        y = g.op("Min", [g.op("Max", [x, f16(-0.5, (1,))]), f16(0.5, (1,))])
    else:
        y = g.op("Dropout", [x])
    mod = _assert_matches_onnxruntime(g.model([y], opset=13, dtype=TensorProto.FLOAT16))
    assert _ops(mod) == _F16_FORMS[form]


def test_normalisation_that_changes_a_shape_is_refused():
    """The root check: a rewrite whose result has another type than the original is not applied."""
    from tvm_fusion.frontend import importer as frontend
    from tvm_fusion._tvm import dpl

    def drop_broadcast():  # add(x, c) -> x: wrong whenever c widens x
        x = dpl.wildcard()
        return dpl.is_op("relax.add")(x, dpl.is_const()), lambda expr, m: m[x]

    g = GraphBuilder()
    import numpy as np

    x = g.input("x", [1, 4])
    mod = import_onnx(g.model([g.op("Add", [x, g.const(np.ones((3, 4), np.float32))])]))
    kept = frontend._normalize(mod, [("drop_broadcast", drop_broadcast)])
    assert _ops(kept) == ["relax.add"] and _output_types(kept) == [([3, 4], "float32")]
    g = GraphBuilder()
    x = g.input("x", [3, 4])
    mod = import_onnx(g.model([g.op("Add", [x, g.const(np.ones((1, 4), np.float32))])]))
    assert _ops(frontend._normalize(mod, [("drop_broadcast", drop_broadcast)])) == []  # same type: applied


# ---------------------------------------------------------------- input dtypes
def _fp16_model(bn: bool):
    import numpy as np
    from onnx import TensorProto

    g = GraphBuilder()
    x = g.input("x", [1, 4, 6, 6], TensorProto.FLOAT16)
    f16 = lambda a: g.const(np.asarray(a, np.float16))  # noqa: E731
    if bn:
        w = f16(g.rng.normal(0, 0.3, (8, 4, 3, 3)))
        y = g.op("Conv", [x, w, f16(g.rng.normal(0, 0.1, 8))], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
        stats = [g.rng.uniform(0.5, 1.5, 8), g.rng.normal(0, 0.1, 8), g.rng.normal(0, 0.5, 8), g.rng.uniform(0.5, 2, 8)]
        y = g.op("BatchNormalization", [y, *map(f16, stats)], epsilon=1e-5)
    else:
        y = g.op("Add", [x, f16(g.rng.normal(0, 1, (1, 4, 1, 1)))])
    return g.model([g.op("Relu", [y])], dtype=TensorProto.FLOAT16)


@pytest.mark.parametrize("bn", [False, True], ids=["add_relu", "conv_bn_relu"])
def test_float16_model_keeps_float16(bn):
    """Inputs and outputs stay float16, and so do the unfused build's arrays (TVM legalizes a float16
    batch_norm to a float32 result; the import computes it in float32 and casts back)."""
    mod = import_onnx(_fp16_model(bn))
    assert [str(p.ty.dtype) for p in mod["main"].params] == ["float16"]
    assert _output_types(mod) == [([1, 8 if bn else 4, 6, 6], "float16")]
    _assert_matches_onnxruntime(_fp16_model(bn))


def test_integer_model_keeps_its_dtypes():
    import numpy as np
    from onnx import TensorProto

    g = GraphBuilder()
    a = g.input("a", [2, 3], TensorProto.INT32)
    model = g.model([g.op("Mul", [g.op("Add", [a, g.const(np.full((2, 3), 3, np.int32))]), a])],
                    dtype=TensorProto.INT32)
    mod = _assert_matches_onnxruntime(model)
    assert [str(p.ty.dtype) for p in mod["main"].params] == ["int32"]
    assert _output_types(mod) == [([2, 3], "int32")]


# ---------------------------------------------------------------- unusual node and value names
def _named_chain(node_names, value_names=None):
    """x -> Relu -> Neg -> Relu ... with the given node names (and optionally value names)."""
    from onnx import TensorProto
    from onnx import helper as h

    values = value_names or [f"v{i}" for i in range(len(node_names) + 1)]
    ops = ["Relu", "Neg"] * len(node_names)
    nodes = [h.make_node(ops[i], [values[i]], [values[i + 1]], name=n) for i, n in enumerate(node_names)]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info(values[0], TensorProto.FLOAT, [2, 3])],
                         [h.make_tensor_value_info(values[-1], TensorProto.FLOAT, [2, 3])])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


_ODD_NAMES = {
    "main": ["main", "relu"],
    "tvm_function_names": ["maximum", "minimum", "add", "relu"],
    "importer_var_names": ["lv", "gv", "lv1", "gv2"],
    "python_c_keywords": ["if", "return", "int", "class", "lambda", "None"],
    "collide_after_sanitising": ["a/b", "a.b", "a:b", "a_b"],
    "empty": ["", "", ""],
    "punctuation": ["/model/conv.1:0", "x", "1st", "v0"],
}


@pytest.mark.parametrize("case", sorted(_ODD_NAMES))
def test_unusual_node_names_import_and_stay_distinct(case):
    """TVM's own importer takes these models; so must we, and each node keeps its own label."""
    names = _ODD_NAMES[case]
    model = _named_chain(names)
    mod = _assert_matches_onnxruntime(model)
    table = onnx_node_names(mod)
    labels = set(table.values())
    assert len(labels) == len(names), table
    if case == "empty":
        assert labels == {"Relu (node 0)", "Neg (node 1)", "Relu (node 2)"}
    else:
        assert labels == set(names)


@pytest.mark.parametrize("values", [["main", "if", "a/b", "a.b"], ["lv", "gv", "x:0", "maximum"]])
def test_unusual_value_names(values):
    _assert_matches_onnxruntime(_named_chain(["n1", "n2", "n3"], values))


def test_duplicate_node_names_stay_distinct():
    model = _named_chain(["dup", "dup", "other", "dup"])
    labels = sorted(set(onnx_node_names(import_onnx(model)).values()))
    assert labels == ["dup (node 0)", "dup (node 1)", "dup (node 3)", "other"]
