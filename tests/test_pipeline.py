"""The build's pass lists (tvm_fusion/build/pipeline.py): a dlight rule that raises declines instead of stopping
the build, so the next rule of the list schedules the PrimFunc."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import tvm_fusion as tf
from tvm_fusion.build import pipeline
from tvm_fusion._tvm import dlight
from tvm_fusion.build.builder import resolve_target


def _depthwise_conv1d_model() -> onnx.ModelProto:
    """An FSMN memory block's core: a depthwise Conv1d over time (48 channels, 10 taps, no bias)."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((48, 1, 10)).astype(np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], group=48, pads=[9, 0])
    graph = helper.make_graph([node], "memory", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 48, 100])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 48, 100])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


class _Raises(dlight.ScheduleRule):
    def apply(self, func, target, tunable):
        raise AttributeError("'Add' object has no attribute 'value'")


class _Takes(dlight.ScheduleRule):
    def apply(self, func, target, tunable):
        return "taken"


def test_a_rule_that_raises_declines_and_the_next_one_applies():
    rules = [pipeline.GuardedRule(_Raises()), pipeline.GuardedRule(_Takes())]
    assert [r.apply(None, None, False) for r in rules] == [None, "taken"]


def test_every_default_schedule_pass_is_guarded():
    passes = pipeline.legalize_passes("fused", resolve_target("cuda"))
    schedules = [p for p in passes if p.info.name == "ApplyDefaultSchedule"]
    assert schedules and all(isinstance(r, pipeline.GuardedRule) for p in schedules for r in p.rules)
    names = [type(r.rule).__name__ for r in schedules[0].rules]
    assert names[-1] == "Fallback", names


def test_depthwise_conv1d_builds_for_cuda():
    """TVM 0.27's CUDA GEMV rule raises on this PrimFunc; guarded, Fallback schedules it and nvcc-ready CUDA
    source comes out for all three modes."""
    mod = tf.import_onnx(_depthwise_conv1d_model())
    for mode in ("unfused", "tvm", "fused"):
        built = tf.build(mod, "cuda", mode)
        assert built.kernel_calls >= 1, mode
