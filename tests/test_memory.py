"""Peak activation memory from TVM's own memory plan (build/memory.py), in compare and for a group alone.

The expected plans are worked out by hand from StaticPlanBlockMemory's rule: an intermediate gets a free storage
of its dtype if one is free when it is allocated (a tensor is freed after its last reader), else a new one; the
outputs `main` returns are not planned. T is the bytes of one 1x8x32x32 float32 tensor.
"""

import re

import onnx
import pytest

from tvm_fusion.build import memory
from tvm_fusion.build.builder import build, resolve_target
from tvm_fusion.check.compare import compare
from tvm_fusion.frontend.importer import SymDim, import_onnx
from tvm_fusion.testing import GraphBuilder

SHAPE = (1, 8, 32, 32)
T = 8 * 32 * 32 * 4


@pytest.fixture(scope="module")
def target():
    return resolve_target("llvm")


def _plan(model, target, mode="unfused", shapes=None):
    built = build(import_onnx(model, shapes or {"x": SHAPE}), target, mode)
    return built, memory.plan_memory(built.module, target)


def elementwise_chain(batch=1):
    """Abs -> Sin -> Cos -> Tanh: one kernel per op unfused; no rule takes it, TVM's FuseOps merges it in the
    fused build."""
    g = GraphBuilder()
    x = g.input("x", [batch, *SHAPE[1:]])
    y = x
    for op in ("Abs", "Sin", "Cos", "Tanh"):
        y = g.op(op, [y])
    return g.model([y])


def test_a_chain_reuses_two_storages(target):
    # abs -> storage 1; sin (abs still read) -> storage 2; cos reuses 1 (abs freed); tanh is the output
    _, plan = _plan(elementwise_chain(), target)
    assert (plan.storages, plan.tensors, plan.unplanned, plan.peak) == ((T, T), 3, T, 3 * T)
    assert plan.describe() == "0.098 MB (2 storages 0.066 MB for 3 tensors + outputs 0.033 MB)"


def test_a_tensor_read_later_keeps_its_storage(target):
    # Add(abs, cos(sin(abs))): abs stays live to the Add, so sin and cos each need a storage of their own
    g = GraphBuilder()
    a = g.op("Abs", [g.input("x", list(SHAPE))])
    y = g.op("Add", [a, g.op("Cos", [g.op("Sin", [a])])])
    _, plan = _plan(g.model([y]), target)
    assert (plan.storages, plan.tensors, plan.peak) == ((T, T, T), 3, 4 * T)


def two_conv_bn_relu():
    g = GraphBuilder()
    y = g.input("x", list(SHAPE))
    for _ in range(2):
        y = g.op("Relu", [g.bn(g.conv(y, 8, 8), 8)])
    return g.model([y])


def test_fused_conv_bn_relu_peak_is_below_unfused(target):
    model = two_conv_bn_relu()
    built, fused = _plan(model, target, "fused")
    assert built.counts["conv2d_bn_relu"] == 2
    # the first block's output is the one intermediate left; the second's is the output
    assert (fused.storages, fused.unplanned, fused.peak) == ((T,), T, 2 * T)
    _, unfused = _plan(model, target, "unfused")
    _, tvm_default = _plan(model, target, "tvm")
    # unfused: conv, scale, shift and relu outputs of each block reuse two storages (and the BN vectors)
    assert unfused.peak > fused.peak and unfused.storages[:2] == (T, T)
    assert tvm_default.peak >= fused.peak


def _symbolic(model):
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    model.graph.output[0].type.tensor_type.shape.dim[0].ClearField("dim_value")
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "N"
    onnx.checker.check_model(model)
    return model


def test_symbolic_batch_is_per_sample_without_a_bound(target):
    _, plan = _plan(_symbolic(elementwise_chain()), target, shapes={"x": (SymDim("N"), *SHAPE[1:])})
    assert not plan.static and plan.per_sample() == ("N", 3 * T, 0)
    assert plan.describe().startswith("N x 0.098 MB per sample (2 storages N x 0.066 MB per sample")
    data = plan.to_json()
    assert data["peak_bytes"] is None and data["per_sample"] == {"dim": "N", "bytes": 3 * T, "constant_bytes": 0}
    assert re.fullmatch(r"N \* T\.int64\(98304\)", data["formula"])


def test_symbolic_batch_is_planned_at_its_upper_bound(target):
    _, plan = _plan(_symbolic(elementwise_chain()), target, shapes={"x": (SymDim("N", 4), *SHAPE[1:])})
    # TVM plans the storages at N=4; the outputs (not planned) are taken at the bound too
    assert (plan.storages, plan.unplanned, plan.peak, plan.bounds) == ((4 * T, 4 * T), 4 * T, 12 * T, {"N": 4})
    assert plan.describe().endswith("at the upper bound N<=4")
    assert plan.to_json()["peak_bytes"] == 12 * T


def test_a_cross_layer_group_alone(target):
    """conv -> bias -> relu -> maxpool planned alone: the conv-sized intermediates are what fusing the pool
    into the conv keeps out of memory (the figure profile shows as the group's peak saved)."""
    g = GraphBuilder()
    y = g.op("MaxPool", [g.op("Relu", [g.conv(g.input("x", list(SHAPE)), 8, 16)])], kernel_shape=[2, 2],
             strides=[2, 2])
    built = build(import_onnx(g.model([y]), {"x": SHAPE}), target, "unfused")
    kernels = [b.var for blk in built.module["main"].body.blocks for b in blk.bindings][:4]  # conv, bias, relu, pool
    conv_out, pool_out = 2 * T, 2 * T // 4
    whole, pool_only, empty = memory.plan_groups(built.module, target, [kernels, kernels[3:], []])
    # conv -> storage 1; bias add (conv still read) -> 2; relu reuses 1; the pool's output is the slice's output
    assert (whole.storages, whole.tensors, whole.unplanned) == ((conv_out, conv_out), 3, pool_out)
    assert (pool_only.storages, pool_only.unplanned) == ((), pool_out)
    assert empty is None


def test_compare_prints_one_line_per_build(target):
    report = compare(elementwise_chain(), "llvm", repeat=0, modes="unfused,fused")
    text = str(report)
    assert "peak activation memory (TVM's static memory plan: reused storages + outputs; inputs and weights not " \
           "counted):" in text
    assert "  unfused  0.098 MB (2 storages 0.066 MB for 3 tensors + outputs 0.033 MB)" in text.splitlines()
    assert report.builds["fused"].memory.peak == T  # one kernel (TVM's FuseOps): no intermediate left
    assert "  fused    0.033 MB (0 storages 0.000 MB for 0 tensors + outputs 0.033 MB)" in text.splitlines()


def test_an_if_counts_what_its_branches_read(target):
    """TVM's importer computes both branches of an If before it (the If only picks a value), so both branch
    values are live at once; the planner leaves a tensor an If reads to the runtime (counted, not planned)."""
    from onnx import TensorProto, helper

    def value(name):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(SHAPE))

    then = helper.make_graph([helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Sin", ["a"], ["s"]),
                              helper.make_node("Cos", ["s"], ["t"])], "then", [], [value("t")])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [value("e")])
    graph = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "g",
                              [value("x"), helper.make_tensor_value_info("c", TensorProto.BOOL, [])], [value("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    # unfused: abs and sin on two storages, cos (then's value) and neg (else's value) left to the runtime
    _, plan = _plan(model, target, shapes={"x": SHAPE, "c": ()})
    assert (plan.storages, plan.unplanned, plan.peak) == ((T, T), 2 * T, 4 * T)


def test_profile_says_the_size_a_symbolic_batch_was_built_at():
    """profile binds a symbolic batch (to 3 without an upper bound) before building: its plan is that size's,
    and the report says so."""
    from tvm_fusion.profile.measure import profile

    report = profile(_symbolic(elementwise_chain()), shapes={"x": (SymDim("N"), *SHAPE[1:])}, repeat=1)
    assert report.bound_at == "N=3" and report.builds["unfused"].memory.peak == 3 * 3 * T
    assert ("peak activation memory (TVM's static memory plan: reused storages + outputs; inputs and weights not "
            "counted) at N=3, the size built:") in str(report).splitlines()
    assert report.memory_summary().startswith("peak activation memory (TVM's memory plan, at N=3): unfused 0.295 MB")
