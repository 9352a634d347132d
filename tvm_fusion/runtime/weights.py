"""Weights outside the library: `main`'s constant kernel arguments become parameters, saved to a file.

    lifted, weights = lift_weights(legal)        # main(x) -> main(x, w0, w1, ...); weights: {"w0": array}
    save_weights("model.so.weights", weights)    # TVM's param-dict format (tvm.runtime.save_param_dict)
    args = load_weights("model.so", dev)         # runtime only: the tensors in `main`'s parameter order

The library then carries kernels and host code only (ResNet-50 on CUDA: about 100 MB of embedded
weights less), the weights can be swapped without recompiling (same shapes and dtypes), and a library is
run as `vm["main"](x, *load_weights(lib, dev))`. The manifest's "weights" entry names the file and the
parameter order. Loading needs only `tvm.runtime` (no compiler).
"""

from __future__ import annotations

from pathlib import Path

from tvm_fusion.errors import FusionError
from tvm_fusion.runtime.manifest import Manifest, manifest_path_of

__all__ = ["WEIGHTS_SUFFIX", "lift_weights", "save_weights", "load_weights"]

WEIGHTS_SUFFIX = ".weights"


def lift_weights(mod):
    """`mod` whose `main` takes each constant argument of its kernel calls as a parameter (w0, w1, ...),
    and the values, in parameter order."""
    from tvm_fusion import _tvm  # local: the runtime imports this module, and must not load TVM's compiler
    from tvm_fusion._tvm import relax, tvm  # local: as above

    call_tir = tvm.ir.Op.get("relax.call_tir")

    @relax.expr_functor.mutator
    class _Lift(relax.PyExprMutator):
        def __init__(self, module):
            super().__init__(module)
            self.params, self.values = [], {}

        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not (call.op.same_as(call_tir) and isinstance(call.args[1], relax.Tuple)):
                return call
            fields = []
            for arg in call.args[1].fields:
                if _tvm.is_constant(arg):
                    var = relax.Var(f"w{len(self.params)}", _tvm.expr_type(arg))
                    self.params.append(var)
                    self.values[var.name if hasattr(var, "name") else var.name_hint] = arg.value
                    arg = var
                fields.append(arg)
            return _tvm.call_args_with(call, [call.args[0], relax.Tuple(fields), *call.args[2:]])

    lift = _Lift(mod)
    main = mod["main"]
    body = lift.visit_expr(main.body)
    out = tvm.IRModule({gv: f for gv, f in mod.functions.items()}, attrs=mod.attrs)
    out[out.get_global_var("main")] = _tvm.with_params(main, lift.params, body)
    return out, lift.values


def save_weights(path, weights: dict) -> int:
    """Write `weights` ({name: tensor}) in TVM's param-dict format; returns the bytes written."""
    from tvm_fusion._tvm import tvm  # local: the runtime imports this module, and must not load TVM's compiler

    data = tvm.runtime.save_param_dict(weights)
    Path(path).write_bytes(data)
    return len(data)


def load_weights(library, dev, manifest=None) -> list:
    """The weights of an exported library (its manifest, `<library>.json` unless given, names the file and
    the order), as tensors on `dev`, in `main`'s parameter order; [] for a library with embedded weights.
    (A bundle whose weights travel another way than their file, e.g. the GPU check's recipes, is run by its
    own run.py.)"""
    import tvm.runtime  # the runtime alone

    library = Path(library)
    entry = (manifest or Manifest.load(manifest_path_of(library))).weights
    if entry is None:
        return []
    path = library.with_name(entry.file)
    if not path.exists():
        how = " (its manifest names a weights recipe: run the bundle's run.py)" if entry.extra.get("recipe") else ""
        raise FusionError(f"{library}: its weights file {entry.file} is missing beside it{how}; copy it there, "
                          "or compile the model again")
    values = tvm.runtime.load_param_dict(path.read_bytes())
    return [values[name].copyto(dev) for name in entry.params]
