"""A library's manifest, `<library>.json`: what compile wrote and what the runtime needs to run it.

    manifest = Manifest.load("model.so.json")   # FusionError naming the file: unreadable, a newer schema, a field missing
    manifest.inputs[0].shape                    # [1, 3, 224, 224], or ["N", 3, 224, 224] for a symbolic batch
    manifest.save("model.so.json")              # JSON, `schema_version` first

Compile builds it (compile.build_manifest), the runtime (runtime/__init__.py, runtime/weights.py, a
bundle's run.py) reads it through this class. The fields the runtime acts on are typed (target, CPU triple
and features, inputs, outputs, symbolic dims, weights, GPU binary); the reports of the compiler's stages (groups, builds,
verification, tuning, ...) are the records those stages write, kept as JSON objects. Keys this schema does
not know are kept (`extra`) and written back, so a bundle may add its own (a weights recipe).
A file without `schema_version` is one written before the schema was versioned: read as version 1.
`manifest["groups"]`, `manifest.get("weights")`: the JSON form's keys, for code that reads it as a dict.

Imports the standard library only (and tvm_fusion.errors when it is there): the runtime imports no compiler
module, and a bundle carries this file to a machine without tvm_fusion.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

try:
    from tvm_fusion.errors import FusionError
except ImportError:  # a bundle's copy, imported on its own beside run.py
    FusionError = ValueError

__all__ = ["SCHEMA_VERSION", "SUFFIX", "CudaBinary", "DimLimit", "Manifest", "TensorSpec", "WeightsFile",
           "manifest_path_of"]

SCHEMA_VERSION = 1
SUFFIX = ".json"


def manifest_path_of(library) -> Path:
    """`<library>.json`, beside the library."""
    library = Path(library)
    return library.with_name(library.name + SUFFIX)


class _Missing(Exception):
    """A required key is absent (turned into one FusionError naming the file by Manifest.load)."""


def _known(cls, data: dict, where: str) -> tuple[dict, dict]:
    """`data` split into the keys `cls` has (each required one present) and the others."""
    names = {f.name for f in fields(cls)} - {"extra"}
    required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
    missing = [k for k in required if k not in data]
    if missing:
        raise _Missing(f"{where}: no {', '.join(repr(k) for k in missing)}")
    return {k: v for k, v in data.items() if k in names}, {k: v for k, v in data.items() if k not in names}


def _dict(obj, always=()) -> dict:
    """The JSON object of a record: its fields in `_order` (else field) order, a None left out unless in
    `always`, then `extra`."""
    out = {}
    names = getattr(obj, "_order", None) or [f.name for f in fields(obj)]
    for name in names:
        value = getattr(obj, name)
        if name == "extra":
            out.update(value)
        elif value is not None or name in always:
            out[name] = value.to_dict() if hasattr(value, "to_dict") else value
    return out


class _Record:
    """A nested part of the manifest: read from its JSON object (keys it does not know go to `extra` where
    it has one, else are dropped), written back with its None fields left out (but those in `_always`)."""

    _always: tuple = ()

    @classmethod
    def from_dict(cls, data: dict, where: str):
        known, extra = _known(cls, data, where)
        return cls(**known, **({"extra": extra} if "extra" in {f.name for f in fields(cls)} else {}))

    def to_dict(self) -> dict:
        return _dict(self, self._always)


@dataclass(frozen=True)
class TensorSpec(_Record):
    """An input or output of `main`: the model's name, its shape (a str is a symbolic dim) and dtype
    (both None for an output whose type the build does not know)."""

    name: str
    shape: list[int | str] | None = None
    dtype: str | None = None


@dataclass(frozen=True)
class DimLimit(_Record):
    """A symbolic dim's bound: the --shape upper bound (None: unbounded) and the largest size the library
    runs (its memory plan's, or the int32 indexing limit of its kernels)."""

    upper_bound: int | None
    max_size: int
    _always = ("upper_bound",)  # None is written: unbounded


@dataclass(frozen=True)
class WeightsFile(_Record):
    """Weights outside the library: the file beside it (TVM's param-dict format), its size and `main`'s
    weight parameters in order; `extra` what a bundle adds (a recipe that regenerates them)."""

    file: str
    bytes: int
    params: list[str]
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CudaBinary(_Record):
    """The GPU code in a CUDA library: format (cubin / fatbin / ptx), size, and how and when it was compiled."""

    format: str
    bytes: int
    kernels: list[str]
    compiler: str | None = None
    compiled_at: str | None = None  # "export" (nvcc) or "build" (TVM, with a CUDA driver)
    compile_seconds: float | None = None

    _order = ("format", "bytes", "compiler", "compiled_at", "compile_seconds", "kernels")

    def to_dict(self) -> dict:
        return _dict(self, always=("compile_seconds",) if self.compiler else ())


_NESTED = {"inputs": TensorSpec, "outputs": TensorSpec, "symbolic_dims": DimLimit, "weights": WeightsFile,
           "cuda_binary": CudaBinary}


def _nested(key: str, value, where: str):
    cls = _NESTED[key]
    if value is None:
        return None
    if isinstance(value, list):
        return [cls.from_dict(v, f"{where}.{key}[{i}]") for i, v in enumerate(value)]
    if key == "symbolic_dims":
        return {k: cls.from_dict(v, f"{where}.{key}.{k}") for k, v in value.items()}
    return cls.from_dict(value, f"{where}.{key}")


@dataclass
class Manifest:
    """`<library>.json`. Required: model, library, target, inputs; the rest as the build had them."""

    model: str  # the ONNX file (or the ModelProto's graph name)
    library: str
    target: str  # the target's exact JSON
    inputs: list[TensorSpec]  # in the order `main` takes them (the weights, when outside, after them)
    cpu_triple: str | None = None  # an llvm target: what runtime.load checks against the host
    cpu_features: list[str] | None = None
    arch: str | None = None  # sm_XX for a CUDA target
    tvm_version: str | None = None
    outputs: list[TensorSpec] | None = None  # None: a file written before outputs were recorded
    symbolic_dims: dict[str, DimLimit] = field(default_factory=dict)
    precision: dict | None = None  # {"name": "fp32"|"fp16"|"bf16", ...}
    rule_counts: dict[str, int] = field(default_factory=dict)
    groups: list[dict] = field(default_factory=list)  # rule, function, onnx_nodes, attrs[, kernels, engine]
    tensor_core_groups: int | None = None
    builds: dict[str, dict] = field(default_factory=dict)  # mode -> primfuncs, kernel_calls[, kernel_launches]
    declined: list[dict] | None = None
    unscheduled: list[dict] = field(default_factory=list)
    verification: dict | None = None  # verify.Verification.manifest()
    simplify: dict | None = None
    cuda_facts: dict | None = None  # hardware.CudaFacts: the limits the CUDA schedules sized for
    cuda_binary: CudaBinary | None = None
    cuda_graph: dict | None = None
    tuning: dict | None = None
    weights: WeightsFile | None = None
    schema_version: int = SCHEMA_VERSION
    extra: dict[str, Any] = field(default_factory=dict)  # keys this schema does not know, kept as they are

    @classmethod
    def from_dict(cls, data: dict, where: str = "manifest") -> Manifest:
        """FusionError, naming `where`, for a newer schema or a missing field."""
        if not isinstance(data, dict):
            raise FusionError(f"{where}: not a tvm_fusion manifest (a JSON object expected, got "
                              f"{type(data).__name__})")
        version = data.get("schema_version", 1)  # unversioned: written before the schema had a version
        if not isinstance(version, int) or version > SCHEMA_VERSION or version < 1:
            raise FusionError(f"{where}: manifest schema_version {version!r} is not one this tvm_fusion reads "
                              f"(1 to {SCHEMA_VERSION}); load the library with the tvm_fusion that wrote it, or "
                              "compile the model again with this one")
        try:
            known, extra = _known(cls, data, where)
            known = {k: _nested(k, v, where) if k in _NESTED else v for k, v in known.items()}
        except _Missing as err:
            raise FusionError(f"{err} (a manifest has model, library, target and inputs); compile the model "
                              "again to write a complete one") from None
        except (TypeError, AttributeError) as err:
            raise FusionError(f"{where}: a field of the wrong type ({err}); compile the model again") from None
        return cls(**{**known, "schema_version": SCHEMA_VERSION}, extra=extra)

    # the JSON's key order (the dataclass needs its required fields first)
    _order = ("model", "library", "target", "cpu_triple", "cpu_features", "arch", "tvm_version", "inputs", "outputs",
              "symbolic_dims", "precision", "rule_counts", "groups", "tensor_core_groups", "builds", "declined",
              "unscheduled", "verification", "simplify", "cuda_facts", "cuda_binary", "cuda_graph", "tuning",
              "weights", "extra")

    def to_dict(self) -> dict:
        out = {"schema_version": self.schema_version, **_dict(self, always=("arch",))}
        for key in ("inputs", "outputs"):
            if out.get(key) is not None:
                out[key] = [t.to_dict() for t in out[key]]
        out["symbolic_dims"] = {k: v.to_dict() for k, v in self.symbolic_dims.items()}
        return out

    @classmethod
    def load(cls, path) -> Manifest:
        """The manifest at `path` (a `<library>.json`); FusionError naming the file when it cannot be read."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except OSError as err:
            raise FusionError(f"{path}: cannot read the manifest ({err.strerror or err})") from None
        except ValueError as err:
            raise FusionError(f"{path}: not JSON ({err}); compile the model again to write its manifest") from None
        return cls.from_dict(data, str(path))

    @classmethod
    def of_library(cls, library) -> Manifest | None:
        """`<library>.json` beside `library`, or None where there is none."""
        path = manifest_path_of(library)
        return cls.load(path) if path.exists() else None

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2))

    @property
    def target_kind(self) -> str:
        """"llvm", "cuda", ... from the target's JSON (a plain string target: its first word)."""
        try:
            return json.loads(self.target).get("kind", "llvm")
        except ValueError:
            return self.target.split()[0] if self.target else "llvm"

    # the JSON form's keys, for code that reads the manifest as the dict it was
    def __getitem__(self, key: str):
        return self.to_dict()[key]

    def get(self, key: str, default=None):
        return self.to_dict().get(key, default)

    def __contains__(self, key: str) -> bool:
        return key in self.to_dict()
