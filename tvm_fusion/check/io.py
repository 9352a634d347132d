"""Inputs and running: the model's inputs (given, checked, or seeded random), onnxruntime as the reference,
the device for a target, and a VM's results as a flat list of numpy arrays.

compare, the per-group check, compile's verify step, the profiler and the tests all feed and run models
through these, so "the same inputs" and "the same outputs" mean the same everywhere.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import onnx

from tvm_fusion import _tvm
from tvm_fusion.frontend import importer as frontend
from tvm_fusion._tvm import relax, tvm
from tvm_fusion.errors import FusionError
from tvm_fusion.frontend.recurrent import sequence_first
from tvm_fusion.runtime import as_arrays

__all__ = ["INPUTS_SYNTAX", "as_arrays", "available_memory", "check_inputs", "check_memory", "device",
           "gpu_available", "graph_inputs", "input_tensors", "load_inputs", "nbytes", "random_inputs",
           "onnxruntime_reason", "run_onnxruntime", "run_vm"]

_NP_DTYPES = {1: np.float32, 10: np.float16, 11: np.float64, 6: np.int32, 7: np.int64, 9: np.bool_}
INPUTS_SYNTAX = "--inputs inputs.npz (numpy.savez with one array per graph input name)"


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs that are not initializers, in order."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def _input_dtype(inp) -> type:
    tt = inp.type.tensor_type
    dtype = _NP_DTYPES.get(tt.elem_type)
    if dtype is None:
        raise FusionError(f"input {inp.name!r} has ONNX element type "
                          f"{onnx.TensorProto.DataType.Name(tt.elem_type)}; not supported by compare")
    return dtype


def load_inputs(inputs) -> dict[str, np.ndarray]:
    """User inputs: a dict name -> array, or the path of an .npz file (numpy.savez(path, name=array, ...))."""
    if inputs is None:
        return {}
    if isinstance(inputs, dict):
        return {str(k): np.asarray(v) for k, v in inputs.items()}
    path = Path(os.fspath(inputs))
    if not path.is_file():
        raise FusionError(f"--inputs {path}: no such file (expected {INPUTS_SYNTAX})")
    try:
        with np.load(path, allow_pickle=False) as data:
            if not hasattr(data, "files"):
                raise ValueError("a single .npy array, not an .npz archive of named arrays")
            return {k: data[k] for k in data.files}
    except Exception as err:  # noqa: BLE001 - numpy raises many kinds for a bad file
        raise FusionError(f"--inputs {path}: not a readable .npz file ({type(err).__name__}: {err}); "
                          f"expected {INPUTS_SYNTAX}") from None


def check_inputs(model: onnx.ModelProto, given: dict[str, np.ndarray], shapes: dict | None) -> dict:
    """Validate user inputs against the model (names, dtypes, declared and --shape dims); return the
    shapes to import with: `shapes` plus the shape of every given array."""
    declared = {i.name: i for i in graph_inputs(model)}
    for name in given:
        if name not in declared:
            raise FusionError(f"--inputs has an array {name!r}, but the model's inputs are {list(declared)}")
    out = {k: tuple(v) for k, v in (shapes or {}).items()}
    for name, array in given.items():
        inp = declared[name]
        want = np.dtype(_input_dtype(inp))
        if array.dtype != want:
            raise FusionError(f"--inputs {name!r}: dtype {array.dtype}, the model expects {want}; "
                              f"save it with .astype(numpy.{want})")
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                for d in inp.type.tensor_type.shape.dim]
        bound = out.get(name)
        fits = len(dims) == array.ndim and all(d is None or d == s for d, s in zip(dims, array.shape))
        if not fits or (bound is not None and not _fits_bound(bound, array.shape)):
            expected = "x".join(str(d or "?") for d in dims) if bound is None else frontend.format_shape(bound)
            raise FusionError(f"--inputs {name!r}: shape {'x'.join(map(str, array.shape)) or '()'}, the model "
                              f"expects {expected or '()'}")
        if bound is None or not any(isinstance(d, frontend.SymDim) for d in bound):
            out[name] = tuple(array.shape)  # a symbolic --shape dim stays symbolic: the array sets its checked size
    return out


def _fits_bound(bound, shape) -> bool:
    """Whether an array's shape fits a --shape (a symbolic dim takes any size up to its upper bound)."""
    return len(bound) == len(shape) and all(
        (d.upper is None or s <= d.upper) if isinstance(d, frontend.SymDim) else d == s for d, s in zip(bound, shape))


def random_inputs(model: onnx.ModelProto, shapes: dict | None = None, seed: int = 0,
                  given: dict | None = None) -> dict[str, np.ndarray]:
    """Inputs for the model's graph inputs: the `given` arrays, and seeded random values for the rest
    (standard normal floats; integers and bools uniform in [0, 8) and {0, 1}). Random token ids or
    attention masks can make a correct model produce NaN: give such inputs (`given`, --inputs)."""
    if seed < 0:
        raise FusionError(f"seed {seed} is negative; use a seed >= 0")
    rng = np.random.default_rng(seed)
    out = {}
    for inp in graph_inputs(model):
        if given and inp.name in given:
            out[inp.name] = np.asarray(given[inp.name])
            continue
        tt = inp.type.tensor_type
        shape = (shapes or {}).get(inp.name) or [d.dim_value for d in tt.shape.dim]
        dtype = _input_dtype(inp)
        if np.issubdtype(dtype, np.floating):
            out[inp.name] = rng.standard_normal(shape).astype(dtype)
        else:
            out[inp.name] = rng.integers(0, 2 if dtype is np.bool_ else 8, shape).astype(dtype)
    return out


def check_memory(mod, n_results: int, where: str, extra=()) -> int:
    """Refuse to run when the inputs plus `n_results` copies of the outputs (one per build and one for
    onnxruntime), plus the values in `extra` (relax vars kept alive), would not fit in the available
    memory. Returns the estimate in bytes."""
    main = mod["main"]
    inputs = sum(nbytes(_tvm.expr_type(p)) for p in main.params)
    outputs = nbytes(_tvm.expr_type(main.body.body))
    kept = sum(nbytes(_tvm.expr_type(v)) for v in extra)
    need = inputs * 2 + outputs * n_results + kept  # inputs: numpy copy + device copy
    avail = available_memory()
    if avail is not None and need > avail:
        raise FusionError(f"{where}: running the model needs at least {need / 2**30:.1f} GiB for its inputs and "
                          f"outputs ({n_results} copies of the outputs), but only {avail / 2**30:.1f} GiB is "
                          "available; use smaller --shape values or fewer --modes")
    return need


def nbytes(ty) -> int:
    """Bytes of a (tuple of) tensor type(s), or a TIR buffer, with static shapes; 0 for what is not known."""
    if ty is None:
        return 0
    fields = getattr(ty, "fields", None)
    if fields is not None:
        return sum(nbytes(f) for f in fields)
    shape, dtype = getattr(ty, "shape", None), getattr(ty, "dtype", None)
    try:
        return int(np.prod([int(d) for d in shape], dtype=object)) * np.dtype(str(dtype)).itemsize
    except (TypeError, ValueError):
        return 0


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo, in bytes (None where unknown)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def run_onnxruntime(model: onnx.ModelProto, inputs: dict, threads: int | None = None, optimize: bool = True,
                    name: str = "the model"):
    """An onnxruntime CPU session of `model`; optimize=False runs the graph as written (the literal reference,
    and a faster session start). onnxruntime refusing the model is bad input: a FusionError naming `name`."""
    try:
        return _session(model, threads, optimize)
    except Exception as err:  # noqa: BLE001 - onnxruntime raises its own exception types
        how = "" if optimize else " (its graph as written)"
        raise FusionError(f"{name}: onnxruntime cannot load the model{how}: {onnxruntime_reason(err)}; check it with "
                          "onnx.checker.check_model(model, full_check=True)") from None


def onnxruntime_reason(err: Exception) -> str:
    """The reason in an onnxruntime exception, without its error code, the model's path and the C++ function
    that raised: `[ONNXRuntimeError] : 1 : FAIL : Load model from m.onnx failed:/src/x.h:46 void f(int) The
    reason.` -> `The reason.`"""
    text = " ".join(str(err).split())
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
    text = re.sub(r"^Load model from .*? failed: ?", "", text)
    text = re.sub(r"^/\S+:\d+ [^()]*\(.*?\) ", "", text)
    return text[:400] or type(err).__name__


def _session(model: onnx.ModelProto, threads: int | None, optimize: bool):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if threads:
        opts.intra_op_num_threads = threads
    model = sequence_first(model)  # onnxruntime runs no batch-first LSTM / GRU / RNN: the same between Transposes
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess, [o.name for o in sess.get_outputs()]


def gpu_available() -> tuple[bool, str]:
    try:
        if tvm.cuda(0).exist:
            return True, ""
    except Exception as err:  # noqa: BLE001 - the CUDA runtime may not even load
        return False, f"no usable CUDA device ({type(err).__name__}: {err})"
    return False, "no CUDA device on this machine (tvm.cuda(0).exist is False)"


def input_tensors(proto: onnx.ModelProto, shapes: dict | None, seed: int, dev,
                  given: dict | None = None) -> tuple[dict, list]:
    """Inputs by name (for onnxruntime) and as device tensors in graph order (for the VM): the `given`
    arrays (already checked with check_inputs) and seeded random values for the rest."""
    inputs = random_inputs(proto, {k: list(v) for k, v in (shapes or {}).items()}, seed, given)
    order = [i.name for i in proto.graph.input if i.name in inputs]
    return inputs, [tvm.runtime.tensor(inputs[k], dev) for k in order]


def device(target):
    """The device a build for `target` (a Target or its kind name) runs on: the first GPU for cuda, else the CPU."""
    kind = target if isinstance(target, str) else target.kind.name
    return tvm.cuda(0) if kind == "cuda" else tvm.cpu(0)


def run_vm(executable, dev, args) -> list[np.ndarray]:
    """Run `main` of a built executable on `dev` with `args` (numpy arrays or device tensors); the outputs
    as a flat list of numpy arrays."""
    args = [a if isinstance(a, tvm.runtime.Tensor) else tvm.runtime.tensor(a, dev) for a in args]
    return as_arrays(relax.VirtualMachine(executable, dev)["main"](*args))
