"""Tensor-core dense schedule, without a GPU: which cases take tensor cores and why the others do not, the
kernels within each sm_80+ arch's launch limits (opt-in dynamic shared memory), contiguous cp.async
copies, wmma / cp.async in the generated CUDA and PTX (nvcc for sm_80 and sm_90), and the same schedule
without the tensor intrinsics and thread bindings run on the CPU against float64 NumPy."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

from tvm_fusion._tvm import te, tvm
from tvm_fusion.build.builder import codegen_config
from tvm_fusion.build.cuda_compiler import cuda_source
from tvm_fusion.hardware import cuda_facts
from tvm_fusion.precision import numpy_dtype
from tvm_fusion.schedules.cuda.dense import schedule_dense_cuda, tensor_core_plan
from tvm_fusion.schedules.cuda.gpu_limits import check_gpu_limits, vector_copy_strides
from tvm_fusion.schedules.cuda.tensor_core import plan, schedule_tensor_core, tile_shared_bytes
from tvm_fusion.schedules.dense import dense_affine
from tvm_fusion.testing import assert_close


def cuda(arch):
    return tvm.target.Target({"kind": "cuda", "arch": arch})


def dense_func(m, k, n, dtype, activation="relu", bias_dtype="float32"):
    x, w = te.placeholder((m, k), dtype, name="x"), te.placeholder((k, n), dtype, name="w")
    b = te.placeholder((n,), bias_dtype, name="b")
    return te.create_prim_func([x, w, b, dense_affine(x, w, b, activation=activation)]).without_attr("global_symbol")


def scheduled_dense(func, target):
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    with target:
        engine = schedule_dense_cuda(sch, {}, target)
    return sch.mod["main"], engine


def test_which_cases_take_tensor_cores():
    sm90 = cuda("sm_90")
    assert plan(128, 3072, 768, "float16", sm90).reason is None
    assert plan(128, 3072, 768, "bfloat16", cuda("sm_80")).reason is None
    assert plan(128, 3072, 768, "float32", sm90).engine == \
        "CUDA cores (float32 inputs; tensor cores take float16 or bfloat16)"
    assert plan(128, 3072, 768, "float16", cuda("sm_75")).engine == \
        "CUDA cores (arch sm_75 is below sm_80 (bfloat16 wmma and cp.async need sm_80))"
    assert plan(1, 1000, 2048, "float16", sm90).engine == (
        "CUDA cores (M, N, K = 1, 1000, 2048 fill 2% of the fullest tensor-core tile (64x64x32); the schedule "
        "wants 50%)")
    # small problems take the 64x64x32 tile where it is at least half full
    assert plan(130, 300, 200, "float16", sm90).tile == (2, 2, 2, 2, 2)
    assert "symbolic" in plan(tvm.tirx.Var("N", "int32"), 1000, 2048, "float16", sm90).reason
    assert plan(128, 1000, 2050, "float16", sm90).engine == \
        "CUDA cores (K = 2050 is not a multiple of 4: the 8-byte copies of x's rows would be misaligned)"
    assert plan(128, 3072, 768, "float16", sm90).engine == (
        "tensor cores: wmma m16n16k16 float16 -> float32, block tile 128x128x64, 16 warps, "
        "72 KB dynamic shared memory, cp.async pipeline")


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_90"])
def test_tile_fits_the_archs_dynamic_shared_memory(arch):
    """The large tile needs more than the 48 KB static limit (the opt-in is what makes it run) and fits every
    sm_80+ arch's opt-in maximum."""
    tc = plan(256, 1024, 512, "float16", cuda(arch))
    facts = cuda_facts(arch)
    assert tc.reason is None and 48 * 1024 < tc.shared_bytes <= facts.shared_optin_bytes
    assert tile_shared_bytes(tc.tile, 2, True) == tc.shared_bytes


@pytest.mark.parametrize("arch,dtype,shape", [("sm_80", "float16", (256, 512, 1024)),
                                              ("sm_86", "bfloat16", (130, 200, 300)),
                                              ("sm_89", "float16", (128, 768, 3072)),
                                              ("sm_90", "bfloat16", (512, 1024, 256))], ids=str)
def test_within_launch_limits_with_contiguous_async_copies(arch, dtype, shape):
    target = cuda(arch)
    func, engine = scheduled_dense(dense_func(*shape, dtype), target)
    assert engine.startswith("tensor cores")
    assert_within_limits(func, target, plan(shape[0], shape[2], shape[1], dtype, target))
    strides = vector_copy_strides(func, target)
    assert strides and set(strides) == {1}  # every x and W tile copy reads contiguous elements


def assert_within_limits(func, target, tc):
    """verify_gpu_code with the opt-in limit; the kernel allocates at most the tile model (TVM merges the
    accumulator tiles into A's and B's space), and needs the opt-in exactly when it passes 48 KB."""
    check = check_gpu_limits(func, target)
    assert check.ok and check.shared_bytes == 0 and 0 < check.dynamic_shared_bytes <= tc.shared_bytes, check
    static_only = check_gpu_limits(func, target, cuda_facts(target).gpu_limits())
    assert static_only.ok == (check.dynamic_shared_bytes <= 48 * 1024), static_only


def _build(funcs: dict, target):
    mod = tvm.IRModule({name: f.with_attr("global_symbol", name) for name, f in funcs.items()})
    with tvm.transform.PassContext(opt_level=3, config=codegen_config(target)):
        return tvm.compile(mod, target)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("arch,dtype", [("sm_80", "float16"), ("sm_90", "bfloat16")])
def test_generated_code_uses_tensor_cores(arch, dtype):
    """CUDA source: wmma fragments of the half dtype, mma_sync, cp.async, dynamic shared memory; PTX (nvcc
    for the arch): wmma.mma.sync with float32 accumulators and cp.async; the fatbin compiles."""
    from tvm_fusion._tvm import nvcc

    target = cuda(arch)
    func, _ = scheduled_dense(dense_func(256, 512, 1024, dtype, "gelu_erf"), target)
    src = cuda_source(_build({"dense": func}, target))
    ctype = {"float16": "half", "bfloat16": "nv_bfloat16"}[dtype]
    assert f"nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, {ctype}" in src
    assert "nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>" in src
    assert "nvcuda::wmma::mma_sync" in src and "cp.async.ca.shared.global" in src
    assert "extern __shared__" in src
    with target:
        ptx = nvcc.compile_cuda(src, target_format="ptx", arch=arch, compiler="nvcc").decode()
        assert nvcc.compile_cuda(src, target_format="fatbin", arch=arch, compiler="nvcc")
    ptx_type = {"float16": "f16", "bfloat16": "bf16"}[dtype]
    assert re.search(rf"wmma\.load\.a\.sync\.aligned\.row\.m16n16k16(\.shared)?\.{ptx_type}\b", ptx)
    # f32 accumulators (D and C); PTX names the A/B type only for bf16 (f16 is implied)
    mma = {"float16": "m16n16k16.f32.f32", "bfloat16": "m16n16k16.f32.bf16.bf16.f32"}[dtype]
    assert f"wmma.mma.sync.aligned.row.row.{mma}" in ptx
    assert "cp.async.ca.shared.global" in ptx and "cp.async.wait_group" in ptx


def test_float32_kernels_are_unchanged_by_async_copies():
    """The cp.async option changes only kernels with async pipeline stages: a float32 dense and a half dense
    on CUDA cores generate the same source with and without it."""
    target = cuda("sm_90")
    funcs = {"f32": scheduled_dense(dense_func(128, 768, 3072, "float32"), target)[0],
             "gemv": scheduled_dense(dense_func(1, 2048, 1000, "float16"), target)[0]}
    mod = tvm.IRModule({name: f.with_attr("global_symbol", name) for name, f in funcs.items()})
    plain = cuda_source(tvm.compile(mod, target))
    assert cuda_source(_build(funcs, target)) == plain and "cp.async" not in plain


class _OnTheCpu:
    """The schedule without tensor intrinsics, thread bindings or async copies, and with its GPU scopes as
    plain buffers: the same loop nest (tiles, padding, two-stage pipeline, epilogue placement) as serial
    loops that LLVM runs."""

    SCOPES = {"shared.dyn": "global", "wmma.matrix_a": "local", "wmma.matrix_b": "local",
              "wmma.accumulator": "local"}

    def __init__(self, sch):
        self._sch = sch

    def bind(self, loop, thread):
        pass

    def tensorize(self, loop, intrin):
        pass

    def annotate(self, loop, key, value):
        if key != "software_pipeline_async_stages":
            self._sch.annotate(loop, key, value)

    def cache_read(self, block, index, scope, **kw):
        return self._sch.cache_read(block, index, self.SCOPES.get(scope, scope), **kw)

    def cache_write(self, block, index, scope, **kw):
        return self._sch.cache_write(block, index, self.SCOPES.get(scope, scope), **kw)

    def __getattr__(self, name):
        return getattr(self._sch, name)


def cpu_library(func, tc):
    """The tensor-core schedule of `func` applied without its GPU parts (_OnTheCpu), built for llvm."""
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    assert schedule_tensor_core(_OnTheCpu(sch), tc)
    return tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}), "llvm")


def _gelu(v):
    from math import erf

    return 0.5 * v * (1 + np.vectorize(erf)(v / np.sqrt(2)))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("shape,activation", [((130, 200, 300), "relu"), ((256, 128, 96), None),
                                              ((100, 96, 136), "gelu_erf")], ids=str)
def test_schedule_keeps_the_numerics(shape, activation, dtype):
    """x, W half; b float32 (a half model's folded bias); out half; judged element by element against float64
    NumPy with the half dtype's tolerance (numerics.py)."""
    m, k, n = shape
    func = dense_func(m, k, n, dtype, activation)
    tc = tensor_core_plan(func, cuda("sm_90"))
    assert tc.reason is None
    lib = cpu_library(func, tc)
    rng = np.random.default_rng(0)
    half = numpy_dtype(dtype)
    x, w = rng.standard_normal((m, k)).astype(half), rng.standard_normal((k, n)).astype(half)
    b = rng.standard_normal(n).astype(np.float32)
    out = tvm.runtime.tensor(np.full((m, n), np.nan, half))
    lib["main"](*map(tvm.runtime.tensor, (x, w, b)), out)
    want = x.astype(np.float64) @ w.astype(np.float64) + b
    want = {"relu": lambda v: np.maximum(v, 0), None: lambda v: v, "gelu_erf": _gelu}[activation](want)
    got = out.numpy()
    assert not np.isnan(got.astype(np.float32)).any(), "an output was never written"
    assert_close(got, want, f"{dtype} {shape} {activation}", dtype=dtype)
