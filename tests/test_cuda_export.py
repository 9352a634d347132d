"""build/cuda_compiler.py, deploy/export.py, deploy/cuda_binary.py: every format TVM's CUDA module can carry is
exported as compiled code, the function table survives a parse/serialize round trip, and a host without a CUDA
compiler gets one line."""

from __future__ import annotations

import pytest

from tvm_fusion.build import cuda_compiler as compiler
from tvm_fusion.deploy import export
from tvm_fusion.deploy.cuda_binary import (CudaModule, KernelInfo, code_format, parse_cuda_module,
                                           serialize_cuda_module)
from tvm_fusion.errors import FusionError

SOURCE = """
extern "C" __global__ void __launch_bounds__(64) scale_kernel(float* __restrict__ x, float* __restrict__ y, int n) {
  int i = blockIdx.x * 64 + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i];
}
"""
TABLE = {"scale_kernel": KernelInfo("scale_kernel", ["handle", "handle", "int32"], ["blockIdx.x", "threadIdx.x"],
                                    [0, 0, 0])}


def test_function_table_round_trip():
    m = CudaModule("cuda", TABLE, SOURCE.encode())
    assert parse_cuda_module(serialize_cuda_module(m)) == m


@pytest.mark.parametrize("fmt", ["cuda", "ptx", "cubin", "fatbin"])
def test_every_format_is_exported_as_compiled_code(fmt):
    data = SOURCE.encode()
    if fmt != "cuda":
        with export._tvm.cuda_target("sm_90"):
            data = bytes(export._tvm.nvcc.compile_cuda(SOURCE, target_format=fmt, arch="sm_90", compiler="nvcc"))
    module, binary = export._compiled(CudaModule("cubin" if fmt == "fatbin" else fmt, TABLE, data), "sm_90", "nvcc")
    assert module.functions == TABLE and binary.kernels == ["scale_kernel"]
    if fmt == "cuda":  # source is compiled at export, into a fatbin
        assert (module.fmt, binary.compiled_at) == ("fatbin", "export") and code_format(module.data) == "fatbin"
    else:  # compiled by TVM at build time: kept byte for byte, named for what it is
        assert (module.fmt, binary.compiled_at, module.data) == (fmt, "build", data)


def test_no_cuda_compiler_is_one_line(monkeypatch):
    monkeypatch.setattr(compiler.shutil, "which", lambda name: None)
    monkeypatch.setattr(compiler, "_has_nvrtc", lambda: False)
    with pytest.raises(FusionError) as err:
        compiler.cuda_compiler()
    assert str(err.value).count("\n") == 0
    assert "nvcc" in str(err.value) and "tvm_fusion[cuda]" in str(err.value)


def test_nvcc_is_chosen_when_on_path():
    assert compiler.cuda_compiler() == "nvcc"  # this host and CI have the CUDA toolkit (nvcc 13)


def _cuda_headers() -> str | None:
    import glob
    import os

    for root in [os.environ.get("CUDA_PATH"), "/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"))]:
        if root and os.path.exists(os.path.join(root, "include", "cuda_runtime.h")):
            return root
    return None


def test_nvrtc_path_without_nvcc(monkeypatch):
    """A host without nvcc compiles with NVRTC (the [cuda] extra): a cubin carrying the kernel."""
    from tvm_fusion.deploy.cuda_binary import fatbin_kernels

    headers = _cuda_headers()
    if headers is None:
        pytest.skip("NVRTC path not run: no CUDA headers (CUDA_PATH or /usr/local/cuda*/include)")
    monkeypatch.setenv("CUDA_PATH", headers)
    monkeypatch.setattr(compiler.shutil, "which", lambda name: None)
    assert compiler.cuda_compiler() == "nvrtc"
    module, binary = export._compiled(CudaModule("cuda", TABLE, SOURCE.encode()), "sm_90", "nvrtc")
    assert (module.fmt, binary.compiler, binary.compiled_at) == ("cubin", "nvrtc", "export")
    assert fatbin_kernels(module.data)[1] == ["scale_kernel"]


def test_nvcc_error_is_the_compilers_own_line():
    with pytest.raises(FusionError) as err:
        compiler.compile_cuda_source(SOURCE, "sm_72", "nvcc")  # nvcc 13 dropped sm_72
    assert str(err.value) == "nvcc failed to compile the generated CUDA for sm_72: " \
                             "nvcc fatal   : Unsupported gpu architecture 'sm_72'"


def test_unknown_arch_is_noted_in_the_manifest(tmp_path):
    import onnx

    from tvm_fusion.deploy.compile import compile_model
    from tvm_fusion.testing import residual_block

    model = tmp_path / "block.onnx"
    onnx.save(residual_block(), str(model))
    result = compile_model(str(model), tmp_path / "b.so", "cuda", arch="sm_87", counts_of_other_builds=False)
    facts = result.manifest["cuda_facts"]
    assert facts["known"] is False and facts["arch"] == "sm_87" and "conservative" in facts["note"]
    assert f"note: {facts['note']}" in str(result)
    assert result.manifest["builds"]["fused"] == {"primfuncs": 2, "kernel_calls": 2, "kernel_launches": 2}
