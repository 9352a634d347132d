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
from tvm_fusion.explain import explain
from tvm_fusion.testing import GraphBuilder, as_float16

ENGINES = {  # rule -> engine of its group, for the model below on sm_90
    "dense_bias_relu": "tensor cores: wmma m16n16k16 {dtype} -> float32, block tile 128x128x64, 16 warps, "
                       "72 KB dynamic shared memory, cp.async pipeline",
    "dense_bias": "tensor cores: wmma m16n16k16 {dtype} -> float32, block tile 128x128x64, 16 warps, "
                  "72 KB dynamic shared memory, cp.async pipeline",
    "dense_bias_sigmoid": "CUDA cores (N = 10 <= 64: a tensor-core tile would be mostly padding)",
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


def test_explain_says_which_kernels_use_tensor_cores():
    result = explain(as_float16(mlp()), {"kind": "cuda", "arch": "sm_90"}).result
    assert {g.rule: g.kernel for g in result.groups} == {r: e.format(dtype="float16") for r, e in ENGINES.items()}
    text = str(explain(as_float16(mlp()), {"kind": "cuda", "arch": "sm_80"}))
    assert text.count("kernel: tensor cores: wmma") == 2 and text.count("kernel: CUDA cores (N = 10 <= 64") == 1
    fp32 = explain(mlp(), {"kind": "cuda", "arch": "sm_90"}).result.groups
    assert {g.kernel for g in fp32} == {"CUDA cores (float32 inputs; tensor cores take float16 or bfloat16)"}
    sm75 = explain(as_float16(mlp()), {"kind": "cuda", "arch": "sm_75"}).result.groups
    assert {g.kernel for g in sm75} == \
        {"CUDA cores (arch sm_75 is below sm_80 (bfloat16 wmma and cp.async need sm_80))"}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_compile_for_sm90_reports_tensor_core_kernels(tmp_path, precision):
    """The manifest counts the tensor-core groups and gives each group's engine; the library's CUDA code
    (compiled by nvcc for sm_90) has wmma and cp.async; the verify step judged the half build against the
    float32 model (fp16: a float16 model, judged against onnxruntime) on the CPU."""
    path = tmp_path / "mlp.onnx"
    onnx.save(as_float16(mlp()) if precision == "fp16" else mlp(), str(path))
    args = ["compile", str(path), "-o", str(tmp_path / "mlp.so"), "--target", "cuda", "--arch", "sm_90",
            "--no-counts"]
    assert main(args + ([] if precision == "fp16" else ["--precision", "bf16"])) == 0
    manifest = json.loads((tmp_path / "mlp.so.json").read_text())
    dtype = {"fp16": "float16", "bf16": "bfloat16"}[precision]
    assert manifest["tensor_core_groups"] == 2
    engines = {g["rule"]: g["engine"] for g in manifest["groups"]}
    assert engines == {r: e.format(dtype=dtype) for r, e in ENGINES.items()}
    assert manifest["cuda_binary"]["format"] in ("fatbin", "cubin", "ptx")
