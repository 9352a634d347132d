"""CUDA conv2d on tensor cores (an implicit GEMM, schedules/cuda/conv2d.py), without a GPU: which convs take
them and why the others do not, launch limits with the opt-in dynamic shared memory, contiguous cp.async
copies, wmma and cp.async in the generated code (nvcc for sm_80 and sm_90), and the same schedule without
tensor intrinsics and thread bindings run on the CPU against a float64 NumPy conv."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from tvm_fusion._tvm import tvm
from tvm_fusion.build.cuda_compiler import cuda_source
from tvm_fusion.precision import numpy_dtype
from tvm_fusion.schedules.cuda.conv2d import schedule_conv2d_cuda, tensor_core_plan
from tvm_fusion.schedules.cuda.gpu_limits import vector_copy_strides
from tvm_fusion.schedules.cuda.tensor_core_test import _build, assert_within_limits, cpu_library, cuda
from tvm_fusion.schedules.llvm.conv2d_test import conv_reference
from tvm_fusion.testing import assert_close, conv_primfunc

SM90 = cuda("sm_90")
CASES = {  # name -> conv_primfunc arguments
    "1x1": dict(n=2, c=256, h=28, w=28, oc=128, k=1),  # a GEMM over the pixels: contiguous, cp.async
    "3x3": dict(n=1, c=64, h=56, w=56, oc=128, k=3, pad=1),  # im2col through shared memory
    "3x3-s2": dict(n=1, c=128, h=28, w=28, oc=256, k=3, stride=2, pad=1),
    "1x1-s2": dict(n=1, c=256, h=56, w=56, oc=512, k=1, stride=2),  # ResNet's downsample
    "7x7-odd": dict(n=1, c=68, h=15, w=13, oc=112, k=7, pad=(3, 2, 1, 3)),  # tiles cut by every extent
}


def conv_case(name, dtype, target=SM90, residual=True):
    return conv_primfunc(**CASES[name], residual=residual, dtype=dtype, target=target)


def scheduled(func, attrs, target=SM90):
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    with target:
        engine = schedule_conv2d_cuda(sch, attrs, target)
    return sch.mod["main"], engine


def _plan(case, dtype, arch="sm_90", **over):
    c = {**CASES[case], **over}
    _, attrs, shapes = conv_primfunc(**c, dtype="float32")
    return tensor_core_plan(attrs, list(shapes[0]), list(shapes[-2]), dtype, cuda(arch))


def test_which_convs_take_tensor_cores():
    assert _plan("1x1", "float16").reason is None and _plan("3x3", "bfloat16", "sm_80").reason is None
    assert _plan("1x1", "float32").engine == "CUDA cores (float32 inputs; tensor cores take float16 or bfloat16)"
    assert _plan("1x1", "float16", "sm_75").reason.startswith("arch sm_75 is below sm_80")
    assert _plan("3x3", "float16", oc=16).engine == ("CUDA cores (M, N, K = 16, 3136, 576 fill 25% of the fullest "
                                                     "tensor-core tile (64x64x32); the schedule wants 50%)")
    assert _plan("3x3", "float16", oc=64).tile == (2, 2, 2, 2, 2)  # 64 output channels: the 64x64 tile
    assert _plan("3x3", "float16", oc=256, groups=2).engine == "CUDA cores (2 groups; the implicit GEMM takes one)"
    assert _plan("7x7-odd", "float16", c=3).engine == \
        "CUDA cores (K = 147 is not a multiple of 4: the 8-byte copies of W's rows would be misaligned)"


def test_float32_conv_is_unchanged():
    """The CUDA compute of a float32 conv is the generic compute, node for node, and its kernel's source is
    the same with and without the async-copy option a sm_80+ build turns on."""
    for name in CASES:
        generic, _, _ = conv_primfunc(**CASES[name], residual=True)
        on_cuda, _, _ = conv_primfunc(**CASES[name], residual=True, target=SM90)
        tvm.ir.assert_structural_equal(generic, on_cuda)
    func, attrs, _ = conv_case("3x3", "float32")
    func, engine = scheduled(func, attrs)
    assert engine == "CUDA cores (float32 inputs; tensor cores take float16 or bfloat16)"
    mod = tvm.IRModule({"conv": func.with_attr("global_symbol", "conv")})
    assert cuda_source(_build({"conv": func}, SM90)) == cuda_source(tvm.compile(mod, SM90))


@pytest.mark.parametrize("arch,dtype,name", [("sm_80", "float16", "1x1"), ("sm_86", "bfloat16", "3x3"),
                                             ("sm_89", "float16", "3x3-s2"), ("sm_90", "bfloat16", "1x1-s2"),
                                             ("sm_90", "float16", "7x7-odd")])
def test_within_launch_limits_with_contiguous_async_copies(arch, dtype, name):
    target = cuda(arch)
    func, attrs, _ = conv_case(name, dtype, target)
    func, engine = scheduled(func, attrs, target)
    assert engine.startswith("tensor cores: wmma m16n16k16"), engine
    assert_within_limits(func, target, _plan(name, dtype, arch))
    strides = vector_copy_strides(func, target)
    assert strides and set(strides) == {1}  # W's rows (and a 1x1 conv's pixels): contiguous


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("arch,dtype", [("sm_80", "float16"), ("sm_90", "bfloat16")])
def test_generated_code_uses_tensor_cores(arch, dtype):
    from tvm_fusion._tvm import nvcc

    target = cuda(arch)
    funcs = {}
    for name in ("1x1", "3x3"):
        func, attrs, _ = conv_case(name, dtype, target)
        funcs[name.replace("x", "_")] = scheduled(func, attrs, target)[0]
    src = cuda_source(_build({f"conv{k}": f for k, f in funcs.items()}, target))
    assert src.count("nvcuda::wmma::mma_sync") == 4 and "cp.async.ca.shared.global" in src  # 2 per kernel
    with target:
        ptx = nvcc.compile_cuda(src, target_format="ptx", arch=arch, compiler="nvcc").decode()
        assert nvcc.compile_cuda(src, target_format="fatbin", arch=arch, compiler="nvcc")
    assert "wmma.mma.sync.aligned.row.row.m16n16k16.f32" in ptx and "cp.async.ca.shared.global" in ptx


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name,small", [("1x1", dict(n=2, c=96, h=12, w=12, oc=80)),  # the 64x64x32 tile
                                        ("3x3-s2", dict(n=2, c=20, h=19, w=17, oc=96)),  # the 64x64x32 tile
                                        ("7x7-odd", {})])  # the 128x128x64 tile
def test_schedule_keeps_the_numerics(name, small, dtype):
    """x, W, residual half; b float32; relu; judged element by element against float64 NumPy with the half
    dtype's tolerance."""
    case = {**CASES[name], **small}
    func, attrs, shapes = conv_primfunc(**case, residual=True, dtype=dtype, target=SM90)
    tc = tensor_core_plan(attrs, list(shapes[0]), list(shapes[2]), dtype, SM90)
    assert tc.reason is None
    lib = cpu_library(func, tc)
    rng = np.random.default_rng(0)
    half = numpy_dtype(dtype)
    x, r, w = (rng.standard_normal(s).astype(half) for s in shapes[:3])
    b = rng.standard_normal(shapes[3]).astype(np.float32)
    out = tvm.runtime.tensor(np.full([int(d) for d in func.params[-1].shape], np.nan, half))
    lib["main"](*map(tvm.runtime.tensor, (x, r, w, b)), out)
    got = out.numpy()
    assert not np.isnan(got.astype(np.float32)).any(), "an output was never written"
    want = conv_reference(*(a.astype(np.float64) for a in (x, w, b, r)), attrs)
    assert_close(got, want, f"{dtype} {name}", dtype=dtype)
