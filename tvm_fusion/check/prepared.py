"""A model prepared once per command: loaded, its given inputs checked, imported to Relax, the target resolved.

    prepared = prepare("model.onnx", "llvm", shapes={"x": (SymDim("N"), 3)}, inputs="x.npz", precision="fp16")
    compare(prepared)            # as compare("model.onnx", ...), without loading or importing it again
    check_groups(prepared)       # the per-group check binds a symbolic dim first (PreparedModel.bound)

compile_model, compare, check_groups, bisect and profile take a path, a ModelProto or a PreparedModel; given
a PreparedModel they use its target, shapes, inputs, precision and simplifier choice, and pass it on to the
stages they call (compare's per-group check, every round of bisect), so nothing is imported twice.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import onnx

from tvm_fusion._tvm import tvm
from tvm_fusion.build.builder import resolve_target
from tvm_fusion.build.mixed_precision import convert
from tvm_fusion.check.io import check_inputs, load_inputs
from tvm_fusion.frontend import importer as frontend

__all__ = ["PreparedModel", "model_name", "prepare"]


@dataclass(frozen=True)
class PreparedModel:
    name: str  # for messages and reports: the file as given, or the ModelProto's graph name
    proto: onnx.ModelProto
    mod: tvm.IRModule  # imported (through the simplifier unless `simplify` is False), converted to `precision`
    shapes: dict  # what it was imported with: --shape, and the given arrays' shapes (SymDim: a symbolic dim)
    given: dict  # the given input arrays (--inputs), by name
    target: tvm.target.Target
    arch: str  # the CUDA architecture (sm_XX) a CUDA build exports for
    precision: str | None = None  # "fp16" / "bf16": converted from float32
    simplify: bool = True

    def bound(self) -> PreparedModel:
        """This model with every symbolic dim bound to the size checked last (frontend.check_sizes: a given
        array's, else the larger size compare runs) and imported again at those shapes; itself when no dim
        is symbolic. For the stages that need static shapes (the per-group check, profile)."""
        sizes = frontend.check_sizes(self.shapes, self.given)[-1]
        if not sizes:
            return self
        shapes = frontend.concrete_shapes(self.shapes, sizes)
        return replace(self, shapes=shapes, mod=_import(self.proto, shapes, self.precision, self.simplify))


def model_name(model) -> str:
    """How reports name `model`: the path as given, or a ModelProto's graph name."""
    if isinstance(model, PreparedModel):
        return model.name
    return str(model) if not isinstance(model, onnx.ModelProto) else (model.graph.name or "<ModelProto>")


def _import(proto, shapes: dict, precision: str | None, simplify: bool):
    return convert(frontend.import_onnx(proto, shapes, simplify=simplify), precision)


def prepare(model, target="llvm", *, arch: str = "sm_90", shapes: dict | None = None, inputs=None,
            precision: str | None = None, simplify: bool = True, bound: bool = False) -> PreparedModel:
    """`model` (a path or ModelProto; a PreparedModel is returned as it is) loaded, `inputs` (a dict or an
    .npz path, some or all of the graph inputs) read and checked against it and `shapes`, imported to Relax
    and converted to `precision`; `target` resolved (build.resolve_target; a Target is kept). `bound`:
    symbolic dims bound before the import (PreparedModel.bound, without importing twice)."""
    if isinstance(model, PreparedModel):
        return model.bound() if bound else model
    tgt = target if isinstance(target, tvm.target.Target) else resolve_target(target, arch)
    proto = frontend.load_onnx(model)
    given = load_inputs(inputs)
    shapes = check_inputs(proto, given, shapes)
    if bound:
        shapes = frontend.concrete_shapes(shapes, frontend.check_sizes(shapes, given)[-1])
    return PreparedModel(model_name(model), proto, _import(proto, shapes, precision, simplify), shapes, given, tgt,
                         arch, precision, simplify)
