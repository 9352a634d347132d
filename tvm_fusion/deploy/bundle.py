"""A runtime-only deployment bundle: the library, its manifest and weights, and the TVM runtime alone.

    tvm-fusion bundle model.so -o deploy/ [--python 3.12]

    deploy/model.so (+ .json, + .weights)   the exported library
    deploy/site/tvm                         TVM's Python package and runtime libraries, without
                                            libtvm_compiler.so (~250 MB) and the C++ sources
    deploy/site/tvm_ffi                     tvm-ffi for the target Python (copied, or downloaded with pip)
    deploy/site/tvm/lib/libcudart.so.13     for a CUDA library: the CUDA runtime TVM links (the GPU server
                                            needs only the driver), when this host has it
    deploy/site/typing_extensions.py        tvm-ffi's one pure-Python dependency
    deploy/site/tvm_fusion_manifest.py      tvm_fusion/runtime/manifest.py, through which run.py reads the manifest
    deploy/run.py                           loads and runs the library with TVM_USE_RUNTIME_LIB=1

    --numpy            deploy/wheels/numpy-*.whl for the target Python, unpacked by run.py where the
                       target has no numpy

`carry_weights` (Python API) carries a library's weights another way than its file: the GPU check's
bundle (benchmarks/gpu_bundle) writes them as a recipe over an example model's seed, which run.py
regenerates with the site/recipe_replay.py that bundle adds.

On the target machine (Python, no TVM): `python deploy/run.py`. It needs nothing of tvm_fusion.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from tvm_fusion.errors import FusionError
from tvm_fusion.runtime import manifest as manifest_module
from tvm_fusion.runtime.manifest import Manifest, manifest_path_of

__all__ = ["BundleResult", "MAX_BYTES", "bundle"]

MAX_BYTES = 64 << 20  # what the lent GPU machine takes per call

_NOT_RUNTIME = ("libtvm_compiler.so", "__pycache__", "include", "src", "3rdparty", "web", "cmake")
_CUDART = "libcudart.so.13"  # what libtvm_runtime_cuda.so links (`ldd`)
_RUN = Path(__file__).with_name("bundle_run.py")
_MANIFEST = Path(manifest_module.__file__)  # run.py reads the manifest through it: site/tvm_fusion_manifest.py


@dataclass
class BundleResult:
    path: Path
    bytes: int
    python: str
    notes: list[str] = field(default_factory=list)  # what the bundle does not carry, and why

    def __str__(self) -> str:
        lines = [f"wrote {self.path} ({self.bytes / 2**20:.1f} MiB, Python {self.python}); run: python "
                 f"{self.path / 'run.py'}"]
        return "\n".join(lines + [f"note: {n}" for n in self.notes])


def _package_dir(name: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FusionError(f"package {name} is not installed here; bundle needs it to copy the runtime")
    return Path(list(spec.submodule_search_locations)[0])


def _copy_tvm(site: Path) -> None:
    shutil.copytree(_package_dir("tvm"), site / "tvm", ignore=shutil.ignore_patterns(*_NOT_RUNTIME))


def _pip_download(requirement: str, python: str, dest: Path) -> Path:
    """The binary wheel of `requirement` for `python` on this machine's platform, fetched with pip into `dest`."""
    machine = os.uname().machine
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", requirement, "--no-deps", "--only-binary=:all:",
           "--python-version", python, "-d", str(dest), "--quiet",
           *[a for p in ("manylinux2014", "manylinux_2_17", "manylinux_2_28") for a in ("--platform", f"{p}_{machine}")]]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        raise FusionError(f"could not download {requirement} for Python {python} ({machine}); run bundle with "
                          "that Python, or check the package index is reachable")
    return wheels[0]


def _tvm_ffi(site: Path, python: str) -> None:
    """tvm-ffi for `python`: this interpreter's copy, or the same version's wheel from the package index."""
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if python == here:
        shutil.copytree(_package_dir("tvm_ffi"), site / "tvm_ffi", ignore=shutil.ignore_patterns(*_NOT_RUNTIME[1:]))
        return
    import tvm_ffi

    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(_pip_download(f"apache-tvm-ffi=={tvm_ffi.__version__}", python, Path(tmp))) as whl:
            whl.extractall(site, [n for n in whl.namelist() if n.startswith("tvm_ffi/")])


def _cudart() -> Path | None:
    """The libcudart TVM's CUDA runtime resolves to on this host (ldd), if any."""
    lib = _package_dir("tvm") / "lib" / "libtvm_runtime_cuda.so"
    try:
        out = subprocess.run(["ldd", str(lib)], capture_output=True, text=True).stdout
    except OSError:
        return None
    m = re.search(rf"{re.escape(_CUDART)} => (\S+)", out)
    return Path(m.group(1)) if m and Path(m.group(1)).exists() else None


def _copy_weights(library: Path, manifest: Manifest, out: Path) -> None:
    shutil.copy2(library.with_name(manifest.weights.file), out / manifest.weights.file)


def _add_library(library: Path, out: Path, carry_weights) -> Manifest:
    """Copy `library`, its manifest and its weights (`carry_weights(library, manifest, out)`, which may
    add to the manifest's weights entry) into `out`."""
    manifest_path = manifest_path_of(library)
    if not library.exists() or not manifest_path.exists():
        raise FusionError(f"{library}: library or its manifest {manifest_path.name} missing; "
                          "run tvm-fusion compile first")
    manifest = Manifest.load(manifest_path)
    shutil.copy2(library, out / library.name)
    if manifest.weights is not None:
        carry_weights(library, manifest, out)
    manifest.save(out / manifest_path.name)
    return manifest


def bundle(library, out_dir, python: str | None = None, *, numpy_wheel: bool = False, others=(),
           carry_weights=_copy_weights) -> BundleResult:
    """Write a runtime-only bundle of an exported `library` (with its `<library>.json`) to `out_dir`;
    `others`: more libraries to carry beside it (the GPU check's unfused and tvm builds); `carry_weights`:
    how the weights of a library that has them outside go into the bundle (default: their file)."""
    library, out = Path(library), Path(out_dir)
    python = python or f"{sys.version_info.major}.{sys.version_info.minor}"
    if out.exists():
        shutil.rmtree(out)
    site = out / "site"
    site.mkdir(parents=True)
    manifest = _add_library(library, out, carry_weights)
    for other in others:
        _add_library(Path(other), out, carry_weights)
    _copy_tvm(site)
    _tvm_ffi(site, python)
    import typing_extensions  # tvm-ffi's one pure-Python dependency; numpy is the target's own or the wheel

    shutil.copy2(typing_extensions.__file__, site / "typing_extensions.py")
    shutil.copy2(_MANIFEST, site / "tvm_fusion_manifest.py")
    if numpy_wheel:
        import numpy

        _pip_download(f"numpy=={numpy.__version__}", python, out / "wheels")
    notes = []
    if manifest.cuda_binary is not None:
        cudart = _cudart()
        if cudart:
            shutil.copy2(cudart, site / "tvm" / "lib" / _CUDART)
        else:
            notes.append(f"{_CUDART} not found on this host, not bundled: the GPU server needs the CUDA runtime "
                         "(e.g. pip install nvidia-cuda-runtime) beside its driver")
    run = _RUN.read_text().replace('LIBRARY = "model.so"', f"LIBRARY = {library.name!r}")
    (out / "run.py").write_text(run)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    if size > MAX_BYTES:
        notes.append(f"{size / 2**20:.1f} MiB: more than the {MAX_BYTES >> 20} MiB a lent GPU machine takes per call")
    return BundleResult(out, size, python, notes)
