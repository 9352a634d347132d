"""Structural: every fused group has exactly the type (shape and dtype) of the subgraph it replaces, over
models of every rule family and random graphs; a lowering that would change it is an internal error."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from tvm_fusion import _tvm, rule
from tvm_fusion._tvm import relax
from tvm_fusion.build.builder import resolve_target
from tvm_fusion.check.differential import _composite_calls, _group_module
from tvm_fusion.errors import LoweringError
from tvm_fusion.frontend.importer import import_onnx
from tvm_fusion.fusion.fuse import Matched, lower, match
from tvm_fusion.patterns.dense_epilogue import dense_epilogue
from tvm_fusion.rules import RuleSet, static_shape
from tvm_fusion.testing import GraphBuilder, conv_bn_relu, residual_block

from fuzz.strategies import onnx_graphs

LN_OPSET = 18


def _dense(x_shape, bias_shape, bn=False):
    g = GraphBuilder(1)
    x = g.input("x", list(x_shape))
    y = g.op("MatMul", [x, g.const(g.rng.normal(0, 0.3, (x_shape[-1], 5)).astype(np.float32))])
    y = g.op("Add", [y, g.const(g.rng.normal(0, 0.1, bias_shape).astype(np.float32))])
    return g.model([g.bn(y, 5) if bn else g.op("Relu", [y])])


def _conv_tail(shape_c, shape_d, bn):
    g = GraphBuilder(2)
    x = g.input("x", [1, 4, 8, 8])
    y = g.conv(x, 4, 8)
    y = g.bn(y, 8) if bn else y
    y = g.op("Add", [g.op("Mul", [y, g.const(np.full(shape_c, 1.5, np.float32))]),
                     g.const(np.full(shape_d, 0.1, np.float32))])
    return g.model([g.op("Relu", [y])])


def _layer_norm(shape, op, residual, gamma_shape=None):
    g = GraphBuilder(3)
    x = g.input("x", list(shape))
    h = g.op("Add", [x, g.input("r", list(shape))]) if residual else x
    gamma = g.const(np.full(gamma_shape or shape[-1:], 1.2, np.float32))
    beta = g.const(np.full(gamma_shape or shape[-1:], 0.1, np.float32))
    if op:
        return g.model([g.op("LayerNormalization", [h, gamma, beta], axis=-1, epsilon=1e-5)], opset=LN_OPSET)
    axes = g.const(np.array([-1], np.int64))
    centered = g.op("Sub", [h, g.op("ReduceMean", [h, axes])])
    var = g.op("ReduceMean", [g.op("Pow", [centered, g.const(np.float32(2))]), axes])
    std = g.op("Sqrt", [g.op("Add", [var, g.const(np.float32(1e-5))])])
    return g.model([g.op("Add", [g.op("Mul", [g.op("Div", [centered, std]), gamma]), beta])], opset=LN_OPSET)


def _elementwise(a_shape, b_shape, const_shape):
    g = GraphBuilder(4)
    a, b = g.input("a", list(a_shape)), g.input("b", list(b_shape))
    y = g.op("Mul", [g.op("Add", [a, b]), g.const(np.full(const_shape, 0.5, np.float32))])
    return g.model([g.op("Relu", [g.op("Sub", [y, a])]), g.op("Relu", [g.op("Add", [a, b])])])


#: family -> models (each family's shapes, including broadcasts that change the output rank)
MODELS = {
    "conv_bn_relu": lambda: conv_bn_relu(),
    "conv_residual_block": lambda: residual_block(n=2),
    "conv_scale_layer": lambda: _conv_tail((8, 1, 1), (1, 8, 1, 1), bn=True),
    "conv_c_vector_w_eq_c": lambda: _conv_tail((8,), (8,), bn=False),
    "dense_2d": lambda: _dense((3, 8), (5,)),
    "dense_batched": lambda: _dense((2, 3, 8), (1, 5)),
    "dense_rank_up_bias": lambda: _dense((2, 8), (1, 1, 5)),
    "dense_rank_up_bias_batched": lambda: _dense((1, 2, 8), (1, 1, 1, 5)),
    "dense_bn": lambda: _dense((4, 8), (5,), bn=True),
    "layer_norm_op": lambda: _layer_norm((2, 5, 16), op=True, residual=False),
    "add_layer_norm_decomposed": lambda: _layer_norm((3, 16), op=False, residual=True),
    "layer_norm_rank_up_gamma": lambda: _layer_norm((3, 16), op=False, residual=False, gamma_shape=(1, 1, 16)),
    "layer_norm_row_gamma": lambda: _layer_norm((2, 4, 4), op=False, residual=False, gamma_shape=(4, 1)),
    "elementwise_broadcast": lambda: _elementwise((2, 1, 4), (3, 4), (1, 1, 1, 4)),
    "add_relu_broadcast": lambda: _elementwise((1, 8, 4, 4), (4,), (8, 1, 1)),
    "squeeze_excite": lambda: _squeeze_excite(),
    "attention_rank3": lambda: _attention(),
}


def _attention():
    from tvm_fusion.patterns.attention_test import attention_block

    g = GraphBuilder(6)
    return g.model([attention_block(g, shape=(4, 7, 16), mask=(4, 1, None))], opset=17)


def _squeeze_excite():
    from tvm_fusion.patterns.se_test import se_block

    g = GraphBuilder(5)
    x = g.input("x", [2, 8, 3, 5])
    return g.model([se_block(g, x, 8, 2, gate_first=True)], opset=18)


def _type(expr) -> tuple:
    return static_shape(expr), str(_tvm.expr_type(expr).dtype)


def group_types(model, rules, shapes: dict | None = None) -> list[tuple[str, tuple, tuple]]:
    """(rule, type of the subgraph, type of the lowered group) for every fused group of `model`: the groups
    alone in one module returning every group's output (as the per-group check runs them), lowered."""
    target = resolve_target("llvm")
    matched = match(import_onnx(model, shapes), target, rules)
    calls = _composite_calls(matched.mod)
    inputs = list(dict.fromkeys(a for b in calls for a in b.value.args if isinstance(a, relax.Var)))
    group_mod = _group_module(matched, calls, inputs)
    lowered, groups = lower(Matched(group_mod, matched.rules, matched.members, []), target)
    got = _tvm.expr_type(lowered["main"].body.body).fields
    return [(g.rule, _type(b.var), (tuple(int(d) for d in t.shape), str(t.dtype)))
            for g, b, t in zip(groups, calls, got, strict=True)]


@pytest.mark.parametrize("name", MODELS)
def test_every_group_keeps_the_type_of_its_subgraph(name, rules):
    types = group_types(MODELS[name](), rules)
    assert types, f"{name}: no rule fired"
    for rule_name, want, got in types:
        assert got == want, f"{name}: group of rule {rule_name} has type {got}; the subgraph it replaces {want}"


@settings(max_examples=30, derandomize=True, database=None)
@given(graph=onnx_graphs())
def test_every_group_of_random_graphs_keeps_its_type(graph, rules):
    """A graph drawn with a symbolic batch is checked with the batch bound to 3 (the types here are static)."""
    shapes = {i.name: tuple(d.dim_value if d.HasField("dim_value") else 3 for d in i.type.tensor_type.shape.dim)
              for i in graph.model.graph.input}
    for rule_name, want, got in group_types(graph.model, rules, shapes):
        assert got == want, f"group of rule {rule_name} has type {got}; the subgraph it replaces {want}"


def _drops_the_view(match):
    """A wrong lowering: the kernel's [rows, N] output is not viewed back as the match's shape."""
    low = dense_epilogue().lower(match)
    low.out_shape = None
    return low


@rule("dense_bias_flat", priority=10_000)
def dense_bias_flat():
    """matmul(x, W) -> add b  ==>  dense_bias(x, W, b)   (wrong on purpose: the output stays [rows, N])"""
    spec = dense_epilogue()
    return type(spec)(spec.pattern, spec.annotations, _drops_the_view, spec.check)


def test_a_lowering_that_changes_the_shape_is_an_internal_error(rules):  # `rules` loads the schedules
    model = _dense((1, 2, 8), (5,))
    nodes = sorted(n.name for n in model.graph.node if n.op_type in ("MatMul", "Add"))
    with pytest.raises(LoweringError) as err:
        lower(match(import_onnx(model), resolve_target("llvm"), RuleSet([dense_bias_flat])), resolve_target("llvm"))
    assert str(err.value) == (f"internal error: rule dense_bias_flat (ONNX nodes {', '.join(nodes)}) lowers to a "
                              "kernel of shape (2, 5) float32; the subgraph it replaces has shape (1, 2, 5) float32")


def test_the_cli_reports_a_wrong_lowering_as_an_internal_error(tmp_path, capsys):
    """Our bug, not the user's input: exit 3 and one line, not 2 ('bad input') and not a traceback."""
    import onnx

    from tvm_fusion.cli import main

    path = tmp_path / "dense.onnx"
    onnx.save(_dense((1, 2, 8), (5,)), str(path))
    rules = tmp_path / "flat_rules.py"
    rules.write_text("from tests.test_group_shapes import dense_bias_flat\n")
    assert main(["explain", str(path), "--rules", str(rules)]) == 3
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: internal error in ") and "lowers to a kernel of shape (2, 5) float32" in err
    assert len(err.splitlines()) == 1
