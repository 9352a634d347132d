"""Tensor cores in a whole model, without a GPU: `tvm-fusion compile` of a float16 model (and of a float32 one
with --precision bf16) for CUDA sm_90 says which groups run on tensor cores and why the others do not, in
the manifest and in explain, with exact counts; the generated code has the wmma and cp.async instructions."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest

from tvm_fusion.cli import main
from tvm_fusion.check.explain import explain
from tvm_fusion.testing import GraphBuilder, as_float16

ENGINES = {  # rule -> engine of its group, for the model below on sm_90
    "dense_bias_relu": "tensor cores: wmma m16n16k16 {dtype} -> float32, block tile 128x128x64, 16 warps, "
                       "72 KB dynamic shared memory, cp.async pipeline",
    "dense_bias": "tensor cores: wmma m16n16k16 {dtype} -> float32, block tile 128x128x64, 16 warps, "
                  "72 KB dynamic shared memory, cp.async pipeline",
    "dense_bias_sigmoid": "CUDA cores (M, N, K = 128, 10, 256 fill 16% of the fullest tensor-core tile (64x64x32); "
                          "the schedule wants 50%)",
}


def mlp():
    """x[128, 256] -> Gemm 512 + Relu -> MatMul 256 + bias -> Gemm 10 + Sigmoid (a classifier head)."""
    g = GraphBuilder(5)
    x = g.input("x", [128, 256])

    def const(scale, *shape):
        return g.const(g.rng.normal(0, scale, shape).astype(np.float32))

    h = g.op("Relu", [g.op("Gemm", [x, const(0.06, 512, 256), const(0.1, 512)], transB=1)])
    h = g.op("Add", [g.op("MatMul", [h, const(0.04, 512, 256)]), const(0.1, 256)])
    w3, b3 = const(0.06, 256, 10), const(0.1, 10)
    return g.model([g.op("Sigmoid", [g.op("Gemm", [h, w3, b3])])])


def conv_net():
    """A bottleneck: 1x1 96->128 + BN + Relu, 3x3 128->128 + BN + the 1x1's output + Relu, 3x3 stride 2 128->64
    + Relu (64 output channels: the small tile), depthwise 3x3 + Relu (one channel per group)."""
    g = GraphBuilder(6)
    x = g.input("x", [1, 96, 28, 28])
    a = g.op("Relu", [g.bn(g.conv(x, 96, 128, k=1, pads=[0] * 4, bias=False), 128)])
    y = g.op("Relu", [g.op("Add", [g.bn(g.conv(a, 128, 128, pads=[1] * 4, bias=False), 128), a])])
    y = g.op("Relu", [g.conv(y, 128, 64, stride=2, pads=[1] * 4)])
    return g.model([g.op("Relu", [g.conv(y, 64, 64, pads=[1] * 4, groups=64)])])


TENSOR_CORES = ("tensor cores: wmma m16n16k16 float16 -> float32, block tile 128x128x64, 16 warps, "
                "72 KB dynamic shared memory, cp.async pipeline")
CONV_ENGINES = [  # (rule, engine) of each group of conv_net() on sm_90, in the model's order
    ("conv2d_bn_relu", TENSOR_CORES),
    ("conv2d_bn_add_relu", TENSOR_CORES),
    ("conv2d_bias_relu", "tensor cores: wmma m16n16k16 float16 -> float32, block tile 64x64x32, 4 warps, "  # M = 64
                         "20 KB dynamic shared memory, cp.async pipeline"),
    ("conv2d_bias_relu", "CUDA cores (M, N, K = 1, 196, 9 fill 0% of the fullest tensor-core tile (64x64x32); "
                         "the schedule wants 50%)"),  # depthwise: one channel per group
]


def test_explain_says_which_convs_use_tensor_cores():
    groups = explain(as_float16(conv_net()), {"kind": "cuda", "arch": "sm_90"}).result.groups
    assert sorted((g.rule, g.kernel) for g in groups) == sorted(CONV_ENGINES)


def test_explain_says_which_kernels_use_tensor_cores():
    result = explain(as_float16(mlp()), {"kind": "cuda", "arch": "sm_90"}).result
    assert {g.rule: g.kernel for g in result.groups} == {r: e.format(dtype="float16") for r, e in ENGINES.items()}
    text = str(explain(as_float16(mlp()), {"kind": "cuda", "arch": "sm_80"}))
    assert text.count("kernel: tensor cores: wmma") == 2 and text.count("kernel: CUDA cores (M, N, K = 128, 10,") == 1
    fp32 = explain(mlp(), {"kind": "cuda", "arch": "sm_90"}).result.groups
    assert {g.kernel for g in fp32} == {"CUDA cores (float32 inputs; tensor cores take float16 or bfloat16)"}
    sm75 = explain(as_float16(mlp()), {"kind": "cuda", "arch": "sm_75"}).result.groups
    assert {g.kernel for g in sm75} == \
        {"CUDA cores (arch sm_75 is below sm_80 (bfloat16 wmma and cp.async need sm_80))"}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_compile_for_sm90_reports_tensor_core_kernels(tmp_path, capsys, precision):
    """The manifest counts the tensor-core groups and gives each group's engine; nvcc compiled the library's
    CUDA code for sm_90 (cuda_binary); the verify step judged the half build on the CPU against the float32
    model (bf16) or onnxruntime (a float16 model)."""
    path = tmp_path / "mlp.onnx"
    onnx.save(as_float16(mlp()) if precision == "fp16" else mlp(), str(path))
    args = ["compile", str(path), "-o", str(tmp_path / "mlp.so"), "--target", "cuda", "--arch", "sm_90",
            "--no-counts"]
    assert main(args + ([] if precision == "fp16" else ["--precision", "bf16"])) == 0
    assert "tensor cores: 2 of 3 groups" in capsys.readouterr().out
    manifest = json.loads((tmp_path / "mlp.so.json").read_text())
    dtype = {"fp16": "float16", "bf16": "bfloat16"}[precision]
    assert manifest["tensor_core_groups"] == 2
    engines = {g["rule"]: g["engine"] for g in manifest["groups"]}
    assert engines == {r: e.format(dtype=dtype) for r, e in ENGINES.items()}
    assert manifest["cuda_binary"]["format"] in ("fatbin", "cubin", "ptx")


@pytest.mark.slow
def test_resnet50_fp16_on_sm90_runs_52_convs_on_tensor_cores(resnet50_mod, rules):
    """--precision fp16 ResNet-50 for sm_90: 52 of its 53 convs on tensor cores. 15 on the 64x64x32 tile: the
    first stage's six with 64 output channels (half of a 128 tile) and the last stage's nine with 7 x 7 = 49
    output pixels (the 3x3 stride 2, the downsample and the 1x1 after it in the first block, the three convs
    of the other two). The stem's K = 3 * 7 * 7 = 147 is not a multiple of 4 and the classifier (M = 1)
    fills 2% of a tile: CUDA cores."""
    from collections import Counter

    from tvm_fusion.build.builder import resolve_target
    from tvm_fusion.fusion.fuse import fuse
    from tvm_fusion.build.mixed_precision import convert

    groups = fuse(convert(resnet50_mod, "fp16"), resolve_target("cuda", "sm_90"), rules).groups
    engines = Counter((g.rule.startswith("conv2d"), g.kernel.split(", 16 warps")[0].split(", 4 warps")[0]
                       .split(" (")[0]) for g in groups)
    large, small = (f"tensor cores: wmma m16n16k16 float16 -> float32, block tile {t}" for t in ("128x128x64",
                                                                                                  "64x64x32"))
    # the stem's conv -> BN -> ReLU -> max pool is one conv -> pool kernel (CUDA cores, its halo recomputed)
    stem = "CUDA cores, halo recomputed: 20% more conv outputs per tile"
    assert engines == {(True, large): 37, (True, small): 15, (True, stem): 1, (False, "CUDA cores"): 1}
    assert [g.rule for g in groups if g.kernel.startswith(stem)] == ["conv2d_bn_relu_pool"]
    assert [g.kernel for g in groups if not g.rule.startswith("conv2d")] == [
        "CUDA cores (M, N, K = 1, 1000, 2048 fill 2% of the fullest tensor-core tile (64x64x32); the schedule "
        "wants 50%)"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_compile_conv_net_for_sm90_reports_tensor_core_kernels(tmp_path, capsys):
    """Both tiles and the CUDA-core depthwise kernel in one library, compiled by nvcc for sm_90."""
    path = tmp_path / "convs.onnx"
    onnx.save(as_float16(conv_net()), str(path))
    assert main(["compile", str(path), "-o", str(tmp_path / "convs.so"), "--target", "cuda", "--arch", "sm_90",
                 "--no-counts"]) == 0
    assert "tensor cores: 3 of 4 groups" in capsys.readouterr().out
    manifest = json.loads((tmp_path / "convs.so.json").read_text())
    assert manifest["tensor_core_groups"] == 3
    assert sorted((g["rule"], g["engine"]) for g in manifest["groups"]) == sorted(CONV_ENGINES)
    assert manifest["cuda_binary"]["format"] in ("fatbin", "cubin", "ptx")
