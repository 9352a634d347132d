"""Export a built CUDA executable as a library that carries compiled GPU code (fatbin), not CUDA source.

TVM 0.27 stores the CUDA module of a build made without a CUDA driver as *source* (format "cuda"), which
needs a CUDA compiler wherever the library is loaded. `export_library` below compiles that source with
nvcc here (SASS for the arch + PTX for forward compatibility) and writes the module as format "fatbin",
in the same serialized layout TVM's CUDA module loader reads: [fmt][function table][code].
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from pathlib import Path

from . import _tvm
from ._tvm import tvm
from .errors import FusionError

__all__ = ["CudaBinary", "export_library", "cuda_source", "compile_cuda_source", "library_cuda_modules"]

FATBIN_MAGIC = b"\x50\xed\x55\xba"  # little-endian 0xBA55ED50


@dataclass
class CudaBinary:
    fmt: str
    size: int
    compile_seconds: float


def _cuda_modules(module):
    for m in module.imports:
        if m.kind == "cuda":
            yield m
        yield from _cuda_modules(m)


def cuda_source(executable) -> str:
    """The generated CUDA C of a CUDA build (all kernels)."""
    mods = list(_cuda_modules(executable.mod))
    if not mods:
        raise FusionError("the executable has no CUDA module; was it built for target cuda?")
    return "\n".join(m.inspect_source() for m in mods)


def compile_cuda_source(source: str, arch: str) -> bytes:
    """nvcc: CUDA C -> fatbin (SASS for `arch` and PTX for newer GPUs)."""
    with tvm.target.Target({"kind": "cuda", "arch": arch}):
        try:
            return bytes(_tvm.nvcc.compile_cuda(source, target_format="fatbin", arch=arch, compiler="nvcc"))
        except Exception as err:
            raise FusionError(f"nvcc failed to compile the generated CUDA for {arch}: {_nvcc_message(err)}") from None


def _nvcc_message(err: Exception) -> str:
    """nvcc's own diagnostics from TVM's error, without the generated source it quotes in full."""
    text = str(err)
    tail = text.rsplit("Compilation error:", 1)[-1]
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    diag = [ln for ln in lines if "error" in ln.lower() or "fatal" in ln.lower()] or lines[-1:]
    msg = "; ".join(diag[:3]) + (f" (+{len(diag) - 3} more)" if len(diag) > 3 else "")
    return msg[:500] or type(err).__name__


# ---- the blob TVM links into a library: [u64 nbytes][import tree][per module: key, payload]
class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def u64(self) -> int:
        (v,) = struct.unpack_from("<Q", self.data, self.pos)
        self.pos += 8
        return v

    def raw(self) -> bytes:
        n = self.u64()
        out = self.data[self.pos:self.pos + n]
        if len(out) != n:
            raise FusionError("unexpected library blob layout (truncated); TVM's format changed?")
        self.pos += n
        return out


def _u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def _string(b: bytes) -> bytes:
    return _u64(len(b)) + b


def _patch_blob(blob: bytes, compiled: bytes, source: bytes) -> bytes:
    r = _Reader(blob)
    total = r.u64()
    if total != len(blob) - 8:
        raise FusionError("unexpected library blob layout (size); TVM's format changed?")
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
            p = _Reader(payload)
            fmt = p.raw()
            tail = _string(source)
            if fmt != b"cuda" or not payload.endswith(tail):
                raise FusionError(f"CUDA module has format {fmt.decode()!r}, expected source to compile")
            fmap = payload[p.pos:len(payload) - len(tail)]
            payload = _string(b"fatbin") + fmap + _string(compiled)
            patched += 1
        out.append(_string(payload))
    if patched != 1:
        raise FusionError(f"expected one CUDA module in the library, found {patched}")
    body = b"".join(out)
    return _u64(len(body)) + body


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


def export_library(executable, path, arch: str = "sm_90") -> CudaBinary | None:
    """Export `executable` to a shared library; a CUDA module inside is compiled to fatbin first."""
    path = Path(path)
    mods = list(_cuda_modules(executable.mod))
    if not mods:
        executable.export_library(str(path))
        return None
    source = mods[0].inspect_source()
    start = time.perf_counter()
    compiled = compile_cuda_source(source, arch)
    seconds = time.perf_counter() - start
    if not compiled.startswith(FATBIN_MAGIC):
        raise FusionError("nvcc output is not a fatbin")

    def pack(mod, is_system_lib, prefix, workspace_dir):
        if is_system_lib or prefix:
            raise FusionError("system-lib export of CUDA builds is not supported; export a shared library")
        blob = _tvm.pack_imports_to_bytes(mod)
        blob_path = Path(workspace_dir) / "devc.bin"
        blob_path.write_bytes(_patch_blob(blob, compiled, source.encode()))
        asm = Path(workspace_dir) / "devc.S"
        asm.write_text(_asm_blob(LIBRARY_SYMBOL, blob_path))
        return str(asm)

    executable.export_library(str(path), fpack_imports=pack)
    return CudaBinary("fatbin", len(compiled), seconds)


def library_cuda_modules(path) -> list[str]:
    """Formats of the CUDA modules embedded in an exported library: 'fatbin', or 'cuda' for source."""
    data = Path(path).read_bytes()
    key = _string(b"cuda")
    found, pos = [], data.find(key)
    while pos >= 0:
        r = _Reader(data)
        r.pos = pos + len(key) + 8  # skip the key and the payload length
        try:
            fmt = r.raw()
        except (FusionError, struct.error):
            fmt = b""
        if fmt in (b"fatbin", b"cubin", b"ptx", b"cuda"):
            found.append(fmt.decode())
        pos = data.find(key, pos + 1)
    return found
