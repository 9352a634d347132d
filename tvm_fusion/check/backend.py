"""An ONNX backend (onnx.backend.base.Backend) that compiles with tvm_fusion.

    import tvm_fusion.check.backend as backend
    rep = backend.prepare(model, "CPU")              # fused build (mode="unfused" for the reference)
    outputs = rep.run([x])

The graph goes to TVM's importer as written (`simplify=False`: the suite tests TVM's importer as it is);
`prepare(..., simplify=True)` or `SimplifiedBackend` first runs the ONNX simplifier, as `import_onnx` does.

Builds are made per input-shape signature on first use (a model with symbolic dims runs at any shape).

With `against_unfused=True` (or a backend class with AGAINST_UNFUSED) every fused run is checked against
the unfused build of the same imported module, element by element with numerics' tolerance table, and a
disagreement raises FusionMismatch: an output off, or one build failing where the other ran. Where fuse()
left the module unchanged (no rule fired, no BatchNorm rewritten: fuse.unchanged, a structural comparison)
the two builds compute the same thing and the unfused one is not made. The conformance suite runs this way,
so a fusion regression shows even inside a test that is expected to fail against the ONNX reference.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from tvm_fusion._tvm import relax, tvm
from tvm_fusion.build.builder import build, resolve_target
from tvm_fusion.errors import FusionMismatch
from tvm_fusion.frontend.importer import import_onnx
from tvm_fusion.fusion.fuse import unchanged
from tvm_fusion.check.io import as_arrays, device, gpu_available
from tvm_fusion.check.numerics import error_stats
from tvm_fusion.rules import RuleSet

__all__ = ["SimplifiedBackend", "TVMFusionBackend", "TVMFusionRep", "UnfusedBackend", "prepare", "run_model",
           "run_node", "supports_device"]

_TARGETS = {"CPU": "llvm", "CUDA": "cuda"}


def _device(device: str):
    kind = str(device).split(":")[0].upper()
    if kind not in _TARGETS:
        raise ValueError(f"device {device!r} is not supported; use CPU or CUDA")
    return kind


class TVMFusionRep(BackendRep):
    def __init__(self, model: onnx.ModelProto, device: str, mode: str, rules: RuleSet | None,
                 simplify: bool = False, against_unfused: bool = False):
        self.model, self.kind, self.mode, self.rules = model, _device(device), mode, rules
        self.simplify = simplify
        self.against_unfused = against_unfused and mode == "fused"
        inits = {t.name for t in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in inits]
        self._vms: dict = {}
        #: per input signature: did the fused run need the unfused one (a rule fired or the module changed)?
        self.checked_against_unfused: dict = {}

    def _vm(self, arrays):
        key = tuple((a.shape, str(a.dtype)) for a in arrays)
        if key not in self._vms:
            shapes = {n: a.shape for n, a in zip(self.input_names, arrays)}
            mod = import_onnx(self.model, shapes, simplify=self.simplify)
            target, dev = resolve_target(_TARGETS[self.kind]), device(_TARGETS[self.kind])
            try:
                built = build(mod, target, self.mode, rules=self.rules)
            except Exception as err:
                if self.against_unfused:
                    self._unfused_runs_where_fused_failed(mod, target, dev, arrays, "build", err)
                raise
            unfused = None
            if self.against_unfused and not unchanged(built.fused, mod):
                try:
                    unfused = relax.VirtualMachine(build(mod, target, "unfused").executable, dev)
                except Exception as err:
                    raise FusionMismatch(f"the unfused build failed ({type(err).__name__}: {_first_line(err)}); "
                                         "the fused build of the same module built") from err
            self._vms[key] = (relax.VirtualMachine(built.executable, dev), dev, mod, target, unfused)
            self.checked_against_unfused[key] = unfused is not None
        return self._vms[key]

    def _unfused_runs_where_fused_failed(self, mod, target, dev, arrays, stage: str, err: Exception) -> None:
        """FusionMismatch if the unfused build of `mod` runs on `arrays` (the fused one failed to `stage`)."""
        try:
            _outputs(relax.VirtualMachine(build(mod, target, "unfused").executable, dev), dev, arrays)
        except Exception:  # noqa: BLE001 - both fail: not a fusion problem
            return
        raise FusionMismatch(f"the fused build failed to {stage} ({type(err).__name__}: {_first_line(err)}); "
                             "the unfused build of the same module ran") from err

    def run(self, inputs, **kwargs):
        if isinstance(inputs, dict):
            arrays = [np.asarray(inputs[n]) for n in self.input_names]
        else:
            arrays = [np.asarray(a) for a in (inputs if isinstance(inputs, (list, tuple)) else [inputs])]
        if len(arrays) != len(self.input_names):
            raise ValueError(f"model has inputs {self.input_names}, got {len(arrays)} arrays")
        vm, dev, mod, target, unfused = self._vm(arrays)
        try:
            got = _outputs(vm, dev, arrays)
        except Exception as err:
            if self.against_unfused:
                self._unfused_runs_where_fused_failed(mod, target, dev, arrays, "run", err)
            raise
        if unfused is not None:
            _same_as_unfused(got, _outputs(unfused, dev, arrays))
        return got


def _outputs(vm, dev, arrays) -> tuple:
    return tuple(as_arrays(vm["main"](*[tvm.runtime.tensor(a, dev) for a in arrays])))


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [""])[0]


def _same_as_unfused(fused, unfused) -> None:
    """FusionMismatch unless every fused output equals the unfused one element by element (numerics)."""
    if len(fused) != len(unfused):
        raise FusionMismatch(f"the fused build returned {len(fused)} outputs; the unfused build {len(unfused)}")
    for i, (f, u) in enumerate(zip(fused, unfused)):
        stats = error_stats(f, u)
        if not stats.ok:
            raise FusionMismatch(f"output {i}: fused vs unfused: {stats.describe()}")


class TVMFusionBackend(Backend):
    """tvm_fusion as an ONNX backend; `mode` is 'fused' (default), 'tvm' or 'unfused'."""

    MODE = "fused"
    SIMPLIFY = False
    AGAINST_UNFUSED = False  # check every fused run against the unfused build (see the module docstring)

    @classmethod
    def is_compatible(cls, model, device: str = "CPU", **kwargs) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model, device: str = "CPU", mode: str | None = None, rules: RuleSet | None = None,
                simplify: bool | None = None, against_unfused: bool | None = None, **kwargs) -> TVMFusionRep:
        super().prepare(model, device, **kwargs)
        return TVMFusionRep(model, device, mode or cls.MODE, rules, cls.SIMPLIFY if simplify is None else simplify,
                            cls.AGAINST_UNFUSED if against_unfused is None else against_unfused)

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node, inputs, device: str = "CPU", outputs_info=None, **kwargs):
        """One node as a model: inputs named as the node's inputs, outputs typed from `outputs_info`."""
        super().run_node(node, inputs, device=device, outputs_info=outputs_info, **kwargs)
        arrays = [np.asarray(a) for a in inputs]
        ins = [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
               for n, a in zip(node.input, arrays)]
        outs = [onnx.helper.make_empty_tensor_value_info(n) for n in node.output]  # typed below
        if outputs_info:
            outs = [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dt)), shape)
                    for n, (dt, shape) in zip(node.output, outputs_info)]
        opset = kwargs.pop("opset_version", None)
        imports = [onnx.helper.make_opsetid("", opset)] if opset else None
        model = onnx.helper.make_model(onnx.helper.make_graph([node], "node", ins, outs), opset_imports=imports)
        if not outputs_info:  # type the outputs by shape inference
            inferred = onnx.shape_inference.infer_shapes(model)
            known = {v.name: v for v in inferred.graph.value_info}
            del model.graph.output[:]
            model.graph.output.extend(known.get(n, onnx.helper.make_tensor_value_info(
                n, ins[0].type.tensor_type.elem_type, None)) for n in node.output)
        return cls.run_model(model, arrays, device, **kwargs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        kind = str(device).split(":")[0].upper()
        if kind == "CPU":
            return True
        if kind == "CUDA":
            return gpu_available()[0]
        return False


class UnfusedBackend(TVMFusionBackend):
    """The same backend building every op as its own kernel: the suite's reference for 'fusion changed nothing'."""

    MODE = "unfused"


class SimplifiedBackend(TVMFusionBackend):
    """The fused backend behind the front door users get: the ONNX simplifier runs before TVM's importer."""

    SIMPLIFY = True


prepare = TVMFusionBackend.prepare
run_model = TVMFusionBackend.run_model
run_node = TVMFusionBackend.run_node
supports_device = TVMFusionBackend.supports_device
