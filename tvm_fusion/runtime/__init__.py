"""Load and run an exported library with the TVM runtime alone (no compiler, no ONNX, no onnxruntime).

    from tvm_fusion.runtime import load
    model = load("model.so")          # reads model.so.json beside it when present
    outputs = model(x)                # numpy in, list of numpy arrays out; model.main is the VM's main

A library compiled with --external-weights gets its weights from the file the manifest names (or, in a
bundle, regenerated from its recipe), loaded once and passed to every call after the inputs (the same
tensors every call, as a CUDA graph needs).

Nothing here imports the compiler side of tvm_fusion or TVM's Relax compiler modules. `import tvm` itself
loads TVM's compiler library unless `TVM_USE_RUNTIME_LIB=1` is set (then only libtvm_runtime, ~8 MB).

The manifest is read through manifest.Manifest (standard library only). Before running anything, `load` compares the CPU the library was built for (triple and features, from the
manifest) with this host's `/proc/cpuinfo`, and raises a FusionError naming what is missing: a library
with AVX-512 code on a host without it would otherwise die with SIGILL.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from tvm_fusion.cpu_features import arch_of, host_features, missing_features
from tvm_fusion.errors import FusionError
from tvm_fusion.runtime.manifest import Manifest
from tvm_fusion.quiet import SCOPE_LINES, tvm_output

# TVM's pool reads TVM_NUM_THREADS when it starts (first parallel kernel); without it, it halves the
# cores on x86 (one thread on a 2-vCPU machine). Use every core this process may run on.
os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))

import numpy as np  # noqa: E402
import tvm  # noqa: E402
import tvm.runtime  # noqa: E402,F401
from tvm.runtime.vm import VirtualMachine  # noqa: E402

__all__ = ["LoadedModel", "as_arrays", "check_cpu", "check_host", "check_sizes", "load", "read_manifest"]


def read_manifest(library) -> Manifest | None:
    """`<library>.json` beside the library, or None; FusionError naming the file when it is not a manifest
    this version reads."""
    return Manifest.of_library(library)


def check_host(manifest: Manifest | None, library="the library", cpuinfo: str | None = None) -> None:
    """FusionError when this host cannot run CPU code built for the manifest's triple and features.
    Silent when the manifest says nothing about the CPU (see check_cpu)."""
    if manifest is not None and manifest.cpu_features is not None:
        check_cpu(manifest.cpu_triple, manifest.cpu_features, library, cpuinfo)


def check_cpu(triple: str | None, features, library="the library", cpuinfo: str | None = None) -> None:
    """FusionError when this host cannot run CPU code built for `triple` with `features`. Silent when the
    host's features cannot be read. `cpuinfo` (a /proc/cpuinfo path) stands for another machine in tests."""
    built_for, here = arch_of(triple), arch_of()
    if built_for != here:
        raise FusionError(f"{library} was built for {triple} ({built_for}); this machine "
                          f"is {platform.machine()}: rebuild it with a target for this machine")
    available = host_features(cpuinfo) if cpuinfo else host_features()
    if available is None:
        return
    missing = missing_features(features, available)
    if missing:
        raise FusionError(
            f"{library} uses CPU features this machine does not expose: {', '.join(missing)} (not in "
            f"/proc/cpuinfo); running it would die with SIGILL. Rebuild it here (--target llvm) or for a "
            f"baseline the machine has, e.g. --target '{{\"kind\":\"llvm\",\"mcpu\":\"x86-64-v3\"}}'")


def _device(manifest: Manifest | None, device):
    if device is not None:
        return device
    kind = manifest.target_kind if manifest is not None else "llvm"
    return tvm.cuda(0) if kind == "cuda" else tvm.cpu(0)


def as_arrays(out) -> list[np.ndarray]:
    """A VM result (a tensor, or nested tuples of them) as a flat list of numpy arrays."""
    if hasattr(out, "numpy"):
        return [out.numpy()]
    return [a for o in out for a in as_arrays(o)]


class LoadedModel:
    """An exported model ready to run: `model(*arrays)` -> list of numpy outputs."""

    def __init__(self, library: Path, module, device, manifest: Manifest | None):
        self.library = library
        self.device = device
        self.manifest = manifest
        self.vm = VirtualMachine(module, device)
        self.main = self.vm["main"]
        self.weights = []  # main's parameters after the inputs, for a library with its weights outside
        if manifest is not None and manifest.weights is not None:
            from tvm_fusion.runtime.weights import load_weights  # local: loaded for external weights only (tvm.runtime and numpy)

            self.weights = load_weights(library, device, manifest)

    @property
    def input_names(self) -> list[str] | None:
        """The model's input names, in the order `model(*arrays)` takes them (None without a manifest)."""
        return [i.name for i in self.manifest.inputs] if self.manifest is not None else None

    @property
    def output_names(self) -> list[str] | None:
        """The model's output names, in the order `model(*arrays)` returns them (None without a manifest, or
        one written before the manifest listed them)."""
        outputs = self.manifest.outputs if self.manifest is not None else None
        return [o.name for o in outputs] if outputs is not None else None

    @property
    def threads(self) -> int:
        """Threads of TVM's CPU pool (starts it)."""
        return int(tvm.get_global_func("runtime.NumThreads")())

    def __call__(self, *arrays) -> list[np.ndarray]:
        check_sizes(self.manifest, arrays, self.library)
        inputs = [tvm.runtime.tensor(np.asarray(a, order="C"), self.device) for a in arrays]  # 0-d stays 0-d
        return as_arrays(self.main(*inputs, *self.weights))


def check_sizes(manifest: Manifest | None, arrays, library="the library") -> None:
    """FusionError when an input's symbolic dim (manifest `inputs` shape "N") is larger than the library
    allows (`symbolic_dims`: its upper bound, which sized the memory plan, or the int32 indexing limit):
    the kernels would write past their buffers."""
    if manifest is None or not manifest.symbolic_dims:
        return
    for spec, array in zip(manifest.inputs, arrays):
        for axis, dim in enumerate(spec.shape or []):
            limit = manifest.symbolic_dims.get(dim) if isinstance(dim, str) else None
            size = np.shape(array)[axis] if axis < np.ndim(array) else None
            if limit and size is not None and size > limit.max_size:
                raise FusionError(f"{library}: input {spec.name!r} has {dim} = {size}, more than the library "
                                  f"allows ({dim} <= {limit.max_size}); rebuild it with {dim}<={size} or more in its --shape")


def load(path, device=None) -> LoadedModel:
    """Load an exported library (and `<path>.json` when present), check that this host can run it, and
    return a LoadedModel on `device` (default: the manifest's target kind, else the CPU)."""
    library = Path(path)
    if not library.exists():
        raise FusionError(f"{library}: no such file (expected a library written by `tvm-fusion compile`)")
    manifest = read_manifest(library)
    check_host(manifest, library)
    with tvm_output(drop=SCOPE_LINES):  # TVM's VM logs a warning per function it loads
        module = tvm.runtime.load_module(str(library))
    return LoadedModel(library, module, _device(manifest, device), manifest)
