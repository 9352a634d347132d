"""Compile a CUDA build's kernels: the generated CUDA C to a fatbin (nvcc) or a cubin (NVRTC).

TVM 0.27 compiles the kernels itself during the build when a CUDA driver is present (through the global
`tvm_callback_cuda_compile`), and keeps them as source when there is none (the export compiles them then).
Both paths go through `compile_cuda_source` here: `build_time_compiler` puts it in TVM's callback during a
build, and tvm_fusion.deploy.export calls it on a module still in source form. The compiler is chosen once,
explicitly: nvcc when it is on PATH (a fatbin: SASS for the arch + PTX for newer GPUs), else NVRTC through the
`[cuda]` extra (`cuda-bindings`, a cubin).
"""

from __future__ import annotations

import shutil

from tvm_fusion import _tvm
from tvm_fusion._tvm import tvm
from tvm_fusion.errors import FusionError

__all__ = ["build_time_compiler", "compile_cuda_source", "cuda_compiler", "cuda_modules", "cuda_source"]


def cuda_modules(module):
    for m in module.imports:
        if m.kind == "cuda":
            yield m
        yield from cuda_modules(m)


def cuda_source(executable) -> str:
    """The generated CUDA C of a CUDA build (all kernels)."""
    mods = list(cuda_modules(executable.mod))
    if not mods:
        raise FusionError("the executable has no CUDA module; was it built for target cuda?")
    return "\n".join(m.inspect_source() for m in mods)


def _has_nvrtc() -> bool:
    try:
        from cuda.bindings import nvrtc  # noqa: F401
    except ImportError:
        return False
    return True


def cuda_compiler() -> str:
    """The CUDA compiler this host uses: 'nvcc' when on PATH, else 'nvrtc' (cuda-bindings)."""
    if shutil.which("nvcc"):
        return "nvcc"
    if _has_nvrtc():
        return "nvrtc"
    raise FusionError("no CUDA compiler: put the CUDA toolkit's nvcc on PATH, "
                      "or pip install 'tvm_fusion[cuda]' for NVRTC (cuda-bindings)")


def compile_cuda_source(source: str, arch: str, compiler: str | None = None) -> bytes:
    """CUDA C -> a fatbin (nvcc: SASS for `arch` and PTX for newer GPUs) or a cubin (NVRTC)."""
    compiler = compiler or cuda_compiler()
    fmt = "fatbin" if compiler == "nvcc" else "cubin"
    with tvm.target.Target({"kind": "cuda", "arch": arch}):
        try:
            return bytes(_tvm.nvcc.compile_cuda(source, target_format=fmt, arch=arch, compiler=compiler))
        except Exception as err:
            raise FusionError(f"{compiler} failed to compile the generated CUDA for {arch}: {_first_error(err)}") from None


def _first_error(err: Exception) -> str:
    """The compiler's own message in TVM's error (which quotes the whole source first)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    if "Compilation error:" in lines:
        lines = lines[lines.index("Compilation error:") + 1:]
    hits = [ln for ln in lines if "error" in ln.lower() or "fatal" in ln.lower()]
    return (hits or lines or [type(err).__name__])[0]


def build_time_compiler(arch: str):
    """`with build_time_compiler(arch): tvm.compile(...)`: when a driver is present and TVM compiles the
    kernels during the build, it uses the same compiler and options as a driverless export."""

    def compile_callback(code):
        return bytearray(compile_cuda_source(str(code), _tvm.current_cuda_arch(arch)))

    return _tvm.override_global_func(_tvm.CUDA_COMPILE_CALLBACK, compile_callback)
