"""Export a built CUDA executable as a library that carries compiled GPU code, never CUDA source.

TVM 0.27 compiles the kernels itself during the build when a CUDA driver is present, and keeps them as *source*
(format "cuda") when there is none. `export_library` compiles a module still in source form with the compiler a
build with a driver uses (tvm_fusion.build.cuda_compiler), so a build host with a driver and one without produce
the same kernels. The module is written in the layout TVM's CUDA loader reads (see cuda_binary.py); any
format TVM produced ("cuda", "ptx", "cubin", "fatbin") is accepted.

Every library exported here links `thread_pool.c`: loaded by any process (a plain `tvm.runtime.load_module`
too), it sets TVM_NUM_THREADS to the cores that process may run on unless TVM_NUM_THREADS or OMP_NUM_THREADS
is set, before TVM's CPU thread pool starts (TVM's default halves the machine's cores on x86).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from tvm_fusion import _tvm
from tvm_fusion.deploy.cuda_binary import (FATBIN_MAGIC, CudaModule, _Reader, _string, _u64, code_format,
                                           library_cuda_module, parse_cuda_module, serialize_cuda_module)
from tvm_fusion.build.cuda_compiler import compile_cuda_source, cuda_compiler, cuda_modules
from tvm_fusion.errors import FusionError
from tvm_fusion.quiet import SCOPE_LINES, tvm_output

__all__ = ["CudaBinary", "export_library", "library_cuda_modules", "FATBIN_MAGIC"]


@dataclass
class CudaBinary:
    fmt: str  # what the library carries: "fatbin" (nvcc), "cubin" (NVRTC) or "ptx"
    size: int
    compile_seconds: float  # 0.0 when TVM had compiled the kernels during the build
    compiler: str  # "nvcc" or "nvrtc"
    compiled_at: str  # "export" (no driver: the build kept source) or "build" (TVM compiled with a driver)
    kernels: list[str] = field(default_factory=list)  # the function table, in order


# ---- the blob TVM links into a library: [u64 nbytes][import tree][per module: key, payload]
def _walk_blob(blob: bytes, patch_cuda) -> bytes:
    """The blob with each CUDA module payload replaced by `patch_cuda(payload)`."""
    r = _Reader(blob)
    if r.u64() != len(blob) - 8:
        raise FusionError("unexpected library blob layout (size); did TVM's format change?")
    row_ptr = [r.u64() for _ in range(r.u64())]
    children = [r.u64() for _ in range(r.u64())]
    out = [_u64(len(row_ptr)), *map(_u64, row_ptr), _u64(len(children)), *map(_u64, children)]
    patched = 0
    while r.pos < len(blob):
        key = r.raw()
        out.append(_string(key))
        if key == b"_lib":
            continue
        payload = r.raw()
        if key == b"cuda":
            payload = patch_cuda(payload)
            patched += 1
        out.append(_string(payload))
    if patched != 1:
        raise FusionError(f"expected one CUDA module in the library, found {patched}")
    body = b"".join(out)
    return _u64(len(body)) + body


def _compiled(module: CudaModule, arch: str, compiler: str) -> tuple[CudaModule, CudaBinary]:
    """`module` with compiled code: source is compiled now; code TVM compiled at build time is kept."""
    start = time.perf_counter()
    if module.fmt == "cuda":
        data, when = compile_cuda_source(module.data.decode(), arch, compiler), "export"
    else:
        data, when = module.data, "build"
    fmt = code_format(data)  # TVM names a fatbin compiled at build time "cubin": say what it is
    seconds = time.perf_counter() - start if when == "export" else 0.0
    binary = CudaBinary(fmt, len(data), seconds, compiler, when, [f.name for f in module.functions.values()])
    return CudaModule(fmt, module.functions, data), binary


LIBRARY_SYMBOL = "__tvm_ffi__library_bin"


def _asm_blob(symbol: str, blob_path: Path) -> str:
    """Assembly that embeds the blob file as the symbol the TVM loader looks for."""
    return (
        "\t.section .rodata\n"
        f"\t.globl {symbol}\n\t.type {symbol}, @object\n\t.balign 16\n"
        f"{symbol}:\n\t.incbin \"{blob_path}\"\n"
        f"\t.size {symbol}, .-{symbol}\n"
        "\t.section .note.GNU-stack,\"\",@progbits\n"
    )


#: C source linked into every exported library: sizes TVM's CPU thread pool when the library is loaded
THREAD_POOL_SOURCE = Path(__file__).with_name("thread_pool.c")


def export_library(executable, path, arch: str = "sm_90", cc: str | None = None) -> CudaBinary | None:
    """Export `executable` to a shared library whose CUDA module (if any) carries compiled code, linked
    with `THREAD_POOL_SOURCE` (by `cc`, e.g. a cross gcc; None: TVM's default compiler)."""
    path = Path(path)
    link = {"addons": [str(THREAD_POOL_SOURCE)], **({"cc": cc} if cc else {})}
    if not list(cuda_modules(executable.mod)):
        with tvm_output(drop=SCOPE_LINES):  # TVM's VM logs a warning per function it saves
            executable.export_library(str(path), **link)
        return None
    compiler = cuda_compiler()
    result = []

    def patch(payload: bytes) -> bytes:
        module, binary = _compiled(parse_cuda_module(payload), arch, compiler)
        result.append(binary)
        return serialize_cuda_module(module)

    def pack(mod, is_system_lib, prefix, workspace_dir):
        if is_system_lib or prefix:
            raise FusionError("system-lib export of CUDA builds is not supported; export a shared library")
        blob_path = Path(workspace_dir) / "devc.bin"
        blob_path.write_bytes(_walk_blob(_tvm.pack_imports_to_bytes(mod), patch))
        asm = Path(workspace_dir) / "devc.S"
        asm.write_text(_asm_blob(LIBRARY_SYMBOL, blob_path))
        return str(asm)

    with tvm_output(drop=SCOPE_LINES):
        executable.export_library(str(path), fpack_imports=pack, **link)
    return result[0]


def library_cuda_modules(path) -> list[str]:
    """Formats of the CUDA modules embedded in an exported library: 'fatbin', 'cubin', 'ptx' or 'cuda'."""
    try:
        return [library_cuda_module(path).fmt]
    except FusionError:
        return []
