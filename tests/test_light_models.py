"""The nine architectures the onnx wheel ships (tvm_fusion.examples, seeded random weights): exact rule
counts, kernel calls per inference of the three builds, fused vs unfused vs onnxruntime on the logits.

One build of each kind per model, shared by that model's tests: one test class per model (TestResnet50,
...) with a class-scoped fixture, so `--dist loadscope` hands each model to its own worker.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import pytest

from tvm_fusion.build.builder import Built, build, count_kernel_calls, legalize
from tvm_fusion.check.compare import random_inputs, run_onnxruntime
from tvm_fusion.examples import EXAMPLES, example_path, logits_name
from tvm_fusion.frontend.importer import import_onnx
from tvm_fusion.testing import assert_close, run_build

#: rule -> groups in the fused build (rules that fired)
LIGHT_COUNTS = {
    # the stem's conv -> BN -> ReLU -> MaxPool stays two kernels on AVX-512: a 32-channel task's 112x112 plane
    # (1.5 MiB) is past the CPU conv -> pool kernel's measured bound (llvm/conv_pool.py, MAX_PLANE_BYTES)
    "resnet50": {"conv2d_bn_add_relu": 16, "conv2d_bn_relu": 33, "conv2d_bn": 4, "dense_bias": 1},
    # BN -> Mul/Add scale layer -> ReLU folds into the conv before it (conv2d_bn_relu); the pre-activation
    # BN -> scale -> ReLU on each Concat is an elementwise chain; the 58 3x3 convs feed a Concat (bare conv2d),
    # 2 of the 3 transition convs take their average pool (conv2d_pool; the 56x56 one is a pixel-vector 1x1 on
    # AVX-512, whose tasks split a plane), the classifier is a 1x1 conv + bias; the stem as ResNet-50's
    "densenet121": {"conv2d_bn_relu": 59, "elementwise_chain_5": 62, "conv2d": 59, "conv2d_pool": 2,
                    "conv2d_bias": 1},
    # LRN is imported as expand_dims / avg_pool3d / squeeze and an elementwise tail (chain of 4); the 7x7/2
    # stem keeps its pool apart (a 1.5 MiB task plane)
    "inception_v1": {"conv2d_bias_relu": 57, "dense_bias": 1, "elementwise_chain_4": 2},
    "inception_v2": {"conv2d_bn_relu_pool": 1, "conv2d_bn_relu": 68, "dense_bias": 1},
    "shufflenet": {"conv2d_bn_add_relu": 13, "conv2d_bn_relu": 16, "conv2d_bn_relu_pool": 1, "conv2d_bn": 19,
                   "dense_bias": 1},
    # its classifier (512 -> 1000 on 13x13) is the pixel-vectorized 1x1 (`pixel_tail`), whose tasks split the
    # plane: the GlobalAveragePool after it is a kernel of its own
    "squeezenet": {"conv2d_bias_relu": 26},
    # VGG's first two blocks (3 -> 64 on 224x224, 64 -> 128 on 112x112) keep their pools apart: 6.1 and 1.5 MiB
    # task planes (llvm/conv_pool.py)
    "vgg19": {"conv2d_bias_relu": 13, "conv2d_relu_pool": 3, "dense_bias_relu": 2, "dense_bias": 1},
    "zfnet512": {"conv2d_bias_relu": 4, "conv2d_relu_pool": 1, "dense_bias_relu": 2, "dense_bias": 1,
                 "elementwise_chain_4": 2},
    "alexnet": {"conv2d_bias_relu": 4, "conv2d_relu_pool": 1, "dense_bias_relu": 2, "dense_bias": 1,
                "elementwise_chain_4": 2},
}

#: where an AVX2 build differs (the conv plans there decide which convs' tasks hold whole planes to pool): the
#: stems' 16-channel tasks hold 0.77 MiB planes and take their pools, one transition conv of DenseNet keeps its
#: pool, VGG's second block (0.77 MiB there) takes its pool, SqueezeNet's classifier is the tiled 1x1 and takes
#: its GlobalAveragePool. Other ISAs are not recorded.
AVX2_COUNTS = {**LIGHT_COUNTS,
               "resnet50": {"conv2d_bn_relu_pool": 1, "conv2d_bn_add_relu": 16, "conv2d_bn_relu": 32, "conv2d_bn": 4,
                            "dense_bias": 1},
               "densenet121": {"conv2d_bn_relu_pool": 1, "conv2d_bn_relu": 58, "elementwise_chain_5": 62, "conv2d": 60,
                               "conv2d_pool": 1, "conv2d_bias": 1},
               "inception_v1": {"conv2d_relu_pool": 1, "conv2d_bias_relu": 56, "dense_bias": 1,
                                "elementwise_chain_4": 2},
               "inception_v2": {"conv2d_bn_relu_pool": 2, "conv2d_bn_relu": 67, "dense_bias": 1},
               "vgg19": {"conv2d_bias_relu": 12, "conv2d_relu_pool": 4, "dense_bias_relu": 2, "dense_bias": 1},
               "squeezenet": {"conv2d_bias_relu": 25, "conv2d_relu_pool": 1}}


def _recorded(table: dict, avx2: dict, name: str):
    """The recorded value for the host target's ISA (AVX-512: `table`, AVX2: `avx2`); another ISA skips."""
    from tvm_fusion.build.builder import resolve_target
    from tvm_fusion.hardware import cpu_facts

    isa = cpu_facts(resolve_target("llvm")).isa
    if isa not in ("avx512", "avx2"):
        pytest.skip(f"counts are recorded for AVX-512 and AVX2 hosts; this one is {isa}")
    return (table if isa == "avx512" else avx2)[name]


#: kernel calls per inference: (unfused, tvm, fused). Fused makes 2 more than tvm per model with LRNs (TVM fuses
#: the LRN's squeeze into its elementwise tail, our elementwise chain starts after it), one fewer per conv ->
#: pool group (the pool is in the conv's kernel, where TVM runs it alone).
KERNEL_CALLS = {
    "resnet50": (179, 109, 60),
    "densenet121": (669, 301, 244),
    "inception_v1": (216, 91, 93),
    "inception_v2": (374, 130, 96),
    "shufflenet": (207, 108, 77),
    "squeezenet": (93, 41, 41),
    "vgg19": (65, 28, 25),
    "zfnet512": (46, 21, 22),
    "alexnet": (46, 21, 22),
}

AVX2_KERNEL_CALLS = {**KERNEL_CALLS, "resnet50": (179, 109, 59), "inception_v1": (216, 91, 92),
                     "inception_v2": (374, 130, 95), "vgg19": (65, 28, 24), "squeezenet": (93, 41, 40)}

#: the unfused CPU build runs TVM's unscheduled kernels: one inference takes 10-25 s on the first two; the
#: others take 30-75 s of builds each (ResNet-50 keeps its default checks in tests/test_resnet50.py)
SLOW = {"densenet121", "vgg19", "resnet50", "inception_v1", "inception_v2", "zfnet512"}


@dataclass
class Light:
    name: str
    model: onnx.ModelProto
    builds: dict[str, Built]  # unfused and fused
    tvm_kernel_calls: int


def _tvm_kernel_calls(mod) -> int:
    """The tvm build's kernel calls, counted as build() counts them, without compiling (10-15 s on the
    big models; its execution is not checked here)."""
    return count_kernel_calls(legalize(mod, "llvm", "tvm"))[1]


def _fired(counts):
    return {k: v for k, v in counts.items() if v}


def _ops(model, op_type):
    return sum(n.op_type == op_type for n in model.graph.node)


class LightModel:
    """The tests of one light model (MODEL); a subclass per model below, each its own xdist scope."""

    MODEL: str

    @pytest.fixture(scope="class")
    def light(self, rules):
        model = onnx.load(str(example_path(self.MODEL)))
        mod = import_onnx(model)
        builds = {mode: build(mod, "llvm", mode, rules=rules) for mode in ("unfused", "fused")}
        return Light(self.MODEL, model, builds, _tvm_kernel_calls(mod))

    def test_rule_counts(self, light):
        counts = light.builds["fused"].counts
        assert _fired(counts) == _recorded(LIGHT_COUNTS, AVX2_COUNTS, light.name)
        convs = sum(v for k, v in counts.items() if k.startswith("conv2d"))
        assert convs == _ops(light.model, "Conv")  # every conv runs a kernel of ours
        assert sum(v for k, v in counts.items() if k.startswith("dense")) == _ops(light.model, "Gemm")
        assert all(g.onnx_nodes for g in light.builds["fused"].fused.groups)

    def test_kernel_calls(self, light):
        b = light.builds
        calls = (b["unfused"].kernel_calls, light.tvm_kernel_calls, b["fused"].kernel_calls)
        assert calls == _recorded(KERNEL_CALLS, AVX2_KERNEL_CALLS, light.name)

    def test_fused_matches_unfused_and_onnxruntime(self, light):
        model = light.model
        inputs = random_inputs(model, seed=1)
        x = [inputs[i.name] for i in model.graph.input if i.name in inputs]
        got_fused, got_unfused = run_build(light.builds["fused"], x), run_build(light.builds["unfused"], x)
        sess, names = run_onnxruntime(model, inputs)
        ref = sess.run(None, inputs)
        assert names[-1] == logits_name(model)
        logits = ref[-1]
        assert np.isfinite(logits).all() and 0.1 < float(logits.std()) < 10, "example weights should give O(1) logits"
        for f, u, r, name in zip(got_fused, got_unfused, ref, names):
            assert_close(f, u, f"{light.name} {name}: fused vs unfused")
            assert_close(f, r, f"{light.name} {name}: fused vs onnxruntime")


def _model_class(name: str) -> type:
    cls = type(f"Test{name.title().replace('_', '')}", (LightModel,), {"MODEL": name})
    return pytest.mark.slow(cls) if name in SLOW else cls


MODEL_CLASSES = [_model_class(m) for m in EXAMPLES]
globals().update({cls.__name__: cls for cls in MODEL_CLASSES})


def test_examples_cover_the_light_models():
    assert set(EXAMPLES) == set(LIGHT_COUNTS) == set(KERNEL_CALLS) == {c.MODEL for c in MODEL_CLASSES}
    assert len(EXAMPLES) == 9 and len({c.__name__ for c in MODEL_CLASSES}) == 9


def test_placeholder_without_generator_is_refused(tmp_path):
    from onnx import TensorProto, helper, numpy_helper

    from tvm_fusion.examples import _random_weights

    shape = numpy_helper.from_array(np.array([1, 4], np.int64), "shape")
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["w"], name="cos"),
             helper.make_node("Div", ["x", "w"], ["y"], name="div")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    with pytest.raises(ValueError, match="placeholder w feeds Div 'div' input 1; no generator"):
        _random_weights(model, np.random.default_rng(0))
