"""The serialized CUDA module TVM links into a library, read and written without a GPU.

TVM's CUDA module saves itself as [fmt][function table][data] (src/backend/cuda/runtime/cuda_module.cc):
  fmt             string: "cuda" (source, compiled when loaded), "ptx", "cubin" or "fatbin" (cuModuleLoadData)
  function table  u64 count, then per kernel: key, name, arg dtypes (u64 n, n x DLDataType), launch param
                  tags (u64 n, n strings: "blockIdx.x", "threadIdx.x", ...), arg extra tags (u64 n, n x i32)
  data            string: the source or the compiled code
Strings are a u64 byte count then the bytes, all little-endian.

`fatbin_kernels` lists the kernels a compiled module really carries (name, PTX parameter count, `.maxntid`)
with `cuobjdump`, from the CUDA toolkit or the `nvidia-cuda-cuobjdump` package.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tvm_fusion.errors import FusionError

__all__ = ["KernelInfo", "CudaModule", "parse_cuda_module", "serialize_cuda_module", "code_format",
           "library_cuda_module", "FatbinKernel", "fatbin_kernels", "cuobjdump_path"]

FATBIN_MAGIC = b"\x50\xed\x55\xba"  # little-endian 0xBA55ED50
ELF_MAGIC = b"\x7fELF"
_DTYPE_CODES = {0: "int", 1: "uint", 2: "float", 3: "handle", 4: "bfloat"}


@dataclass
class KernelInfo:
    """One row of the function table: what TVM's launcher passes to a kernel."""
    name: str
    arg_types: list[str]  # "handle" for buffer pointers, else e.g. "int32"
    launch_param_tags: list[str]  # e.g. ["blockIdx.x", "threadIdx.x"]: the launch extents TVM appends
    arg_extra_tags: list[int] = field(default_factory=list)


@dataclass
class CudaModule:
    fmt: str
    functions: dict[str, KernelInfo]
    data: bytes


class _Reader:
    def __init__(self, data: bytes, pos: int = 0):
        self.data, self.pos = data, pos

    def take(self, n: int) -> bytes:
        out = self.data[self.pos:self.pos + n]
        if len(out) != n:
            raise FusionError("unexpected CUDA module layout (truncated); did TVM's format change?")
        self.pos += n
        return out

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def raw(self) -> bytes:
        return self.take(self.u64())

    def str(self) -> str:
        return self.raw().decode()


def _u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def _string(b: bytes | str) -> bytes:
    b = b.encode() if isinstance(b, str) else b
    return _u64(len(b)) + b


def _dtype(raw: bytes) -> str:
    code, bits, lanes = raw[0], raw[1], struct.unpack("<H", raw[2:4])[0]
    name = _DTYPE_CODES.get(code, f"code{code}")
    return name if code == 3 else f"{name}{bits}" + (f"x{lanes}" if lanes != 1 else "")


def _dtype_bytes(name: str) -> bytes:
    if name == "handle":
        return bytes([3, 64, 1, 0])
    m = re.fullmatch(r"([a-z]+?)(\d+)(?:x(\d+))?", name)
    code = {v: k for k, v in _DTYPE_CODES.items()}[m.group(1)]
    return bytes([code, int(m.group(2))]) + struct.pack("<H", int(m.group(3) or 1))


def parse_cuda_module(payload: bytes) -> CudaModule:
    r = _Reader(payload)
    fmt = r.str()
    functions = {}
    for _ in range(r.u64()):
        key, name = r.str(), r.str()
        arg_types = [_dtype(r.take(4)) for _ in range(r.u64())]
        tags = [r.str() for _ in range(r.u64())]
        extra = [struct.unpack("<i", r.take(4))[0] for _ in range(r.u64())]
        functions[key] = KernelInfo(name, arg_types, tags, extra)
    data = r.raw()
    if r.pos != len(payload):
        raise FusionError("unexpected CUDA module layout (trailing bytes); did TVM's format change?")
    return CudaModule(fmt, functions, data)


def serialize_cuda_module(m: CudaModule) -> bytes:
    out = [_string(m.fmt), _u64(len(m.functions))]
    for key, f in m.functions.items():
        out += [_string(key), _string(f.name), _u64(len(f.arg_types)), *map(_dtype_bytes, f.arg_types),
                _u64(len(f.launch_param_tags)), *map(_string, f.launch_param_tags),
                _u64(len(f.arg_extra_tags)), *(struct.pack("<i", t) for t in f.arg_extra_tags)]
    return b"".join(out + [_string(m.data)])


def code_format(data: bytes) -> str:
    """What compiled CUDA code is, from its first bytes: 'fatbin', 'cubin' (ELF) or 'ptx' (text)."""
    if data.startswith(FATBIN_MAGIC):
        return "fatbin"
    if data.startswith(ELF_MAGIC):
        return "cubin"
    if data[:1] in (b"/", b".") or data.lstrip()[:1] in (b"/", b"."):
        return "ptx"
    raise FusionError(f"unknown compiled CUDA code (starts with {data[:4].hex()}); expected fatbin, cubin or PTX")


_KEY = _string(b"cuda")


def library_cuda_module(path) -> CudaModule:
    """The CUDA module embedded in an exported library (its function table and code)."""
    data = Path(path).read_bytes()
    found, pos = [], data.find(_KEY)
    while pos >= 0:
        r = _Reader(data, pos + len(_KEY))
        try:
            found.append(parse_cuda_module(r.raw()))
        except (FusionError, UnicodeDecodeError, struct.error, KeyError):
            pass
        pos = data.find(_KEY, pos + 1)
    if len(found) != 1:
        raise FusionError(f"{path}: expected one CUDA module in the library, found {len(found)}; "
                          "was it exported with --target cuda?")
    return found[0]


# ---- what the compiled code carries (cuobjdump)
@dataclass(frozen=True)
class FatbinKernel:
    name: str
    params: int  # .param entries of the PTX .entry
    maxntid: tuple[int, ...] | None  # the launch bound (__launch_bounds__), None when the kernel has none


def cuobjdump_path() -> str | None:
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import nvidia.cu13  # the nvidia-cuda-cuobjdump package
    except ImportError:
        return None
    for root in nvidia.cu13.__path__:
        if (Path(root) / "bin" / "cuobjdump").exists():
            return str(Path(root) / "bin" / "cuobjdump")
    return None


_ENTRY = re.compile(r"\.entry\s+(\w+)\s*\(([^)]*)\)\s*((?:\.\w+[^{]*?)*)\{", re.S)


def ptx_kernels(ptx: str) -> dict[str, FatbinKernel]:
    kernels = {}
    for m in _ENTRY.finditer(ptx):
        ntid = re.search(r"\.maxntid\s+([\d,\s]+)", m.group(3))
        maxntid = tuple(int(v) for v in ntid.group(1).replace(" ", "").strip(",").split(",")) if ntid else None
        kernels[m.group(1)] = FatbinKernel(m.group(1), m.group(2).count(".param"), maxntid)
    return kernels


def fatbin_kernels(code: bytes) -> tuple[dict[str, FatbinKernel], list[str]]:
    """(kernels of the PTX in `code`, kernels of its ELF/SASS: one `.nv.info.<kernel>` section each) read
    with cuobjdump."""
    tool = cuobjdump_path()
    if tool is None:
        raise FusionError("cuobjdump not found: put the CUDA toolkit on PATH or pip install nvidia-cuda-cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"code.{code_format(code)}"
        path.write_bytes(code)
        ptx = subprocess.run([tool, "-ptx", str(path)], capture_output=True, text=True, check=True).stdout
        elf = subprocess.run([tool, "-elf", str(path)], capture_output=True, text=True, check=True).stdout
    return ptx_kernels(ptx), sorted(set(re.findall(r"^\.nv\.info\.(\w+)$", elf, re.M)))
