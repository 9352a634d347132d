"""Build a model three ways (unfused / tvm / fused), run them and onnxruntime on the same seeded inputs,
and report numerics, kernel counts and latency side by side."""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from . import _tvm, frontend
from ._tvm import relax, tvm
from .build import Built, build, resolve_target
from .errors import FusionError
from .export import compile_cuda_source, cuda_source
from .rules import RuleSet
from .numerics import ErrorStats, error_stats
from .precision import check_precision, convert, verdict_dtype
from .runtime import as_arrays  # noqa: F401  (differential imports it from here)

__all__ = ["CompareReport", "compare", "random_inputs", "load_inputs", "check_inputs", "check_modes", "run_onnxruntime",
           "gpu_available"]

MODES = ("unfused", "tvm", "fused")
_NP_DTYPES = {1: np.float32, 10: np.float16, 11: np.float64, 6: np.int32, 7: np.int64, 9: np.bool_}
INPUTS_SYNTAX = "--inputs inputs.npz (numpy.savez with one array per graph input name)"


def check_modes(modes) -> list[str]:
    """The build modes to compare, validated: known, not repeated, at least one."""
    modes = [m.strip() for m in ([modes] if isinstance(modes, str) else list(modes))]
    modes = [m for part in modes for m in part.split(",") if m]
    if not modes:
        raise FusionError(f"--modes is empty; give one or more of {', '.join(MODES)} (comma separated)")
    for m in modes:
        if m not in MODES:
            raise FusionError(f"--modes: unknown build mode {m!r}; use one or more of {', '.join(MODES)}")
    if len(set(modes)) != len(modes):
        raise FusionError(f"--modes {','.join(modes)} names a mode twice")
    return modes


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
        if not fits or (bound is not None and tuple(bound) != array.shape):
            expected = "x".join(str(d or "?") for d in dims) if bound is None else "x".join(map(str, bound))
            raise FusionError(f"--inputs {name!r}: shape {'x'.join(map(str, array.shape)) or '()'}, the model "
                              f"expects {expected or '()'}")
        out[name] = tuple(array.shape)
    return out


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
    inputs = sum(_nbytes(_tvm.expr_type(p)) for p in main.params)
    outputs = _nbytes(_tvm.expr_type(main.body.body))
    kept = sum(_nbytes(_tvm.expr_type(v)) for v in extra)
    need = inputs * 2 + outputs * n_results + kept  # inputs: numpy copy + device copy
    avail = available_memory()
    if avail is not None and need > avail:
        raise FusionError(f"{where}: running the model needs at least {need / 2**30:.1f} GiB for its inputs and "
                          f"outputs ({n_results} copies of the outputs), but only {avail / 2**30:.1f} GiB is "
                          "available; use smaller --shape values or fewer --modes")
    return need


def _nbytes(ty) -> int:
    """Bytes of a (tuple of) tensor type(s) with static shapes; 0 for what is not known."""
    if ty is None:
        return 0
    fields = getattr(ty, "fields", None)
    if fields is not None:
        return sum(_nbytes(f) for f in fields)
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


def run_onnxruntime(model: onnx.ModelProto, inputs: dict, threads: int | None = None, optimize: bool = True):
    """An onnxruntime CPU session of `model`; optimize=False runs the graph as written (the literal reference,
    and a faster session start)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if threads:
        opts.intra_op_num_threads = threads
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


@dataclass
class BuildStats:
    mode: str
    primfuncs: int
    kernel_calls: int
    build_seconds: float
    latencies: list[float] = field(default_factory=list)  # seconds
    nvcc_seconds: float | None = None


@dataclass
class CompareReport:
    model: str
    target: str
    outputs: list[str]
    builds: dict[str, BuildStats]
    errors: dict[str, list[ErrorStats]]  # "fused vs unfused", "<mode> vs onnxruntime" -> per-output stats
    counts: dict[str, int]
    executed: bool
    skipped_reason: str = ""
    ort_latencies: list[float] = field(default_factory=list)
    precision: str | None = None  # --precision fp16 / bf16: the model was converted from float32

    @property
    def ok(self) -> bool:
        return all(s.ok for stats in self.errors.values() for s in stats)

    def failures(self) -> list[str]:
        return [f"{pair}, output {self.outputs[i]}: {s.describe()}"
                for pair, stats in self.errors.items() for i, s in enumerate(stats) if not s.ok]

    def failing_builds(self) -> list[str]:
        """The builds with a comparison over tolerance ("fused vs unfused" blames fused)."""
        return list(dict.fromkeys(pair.split(" vs ")[0] for pair, stats in self.errors.items()
                                  if not all(s.ok for s in stats)))

    def verdict(self) -> str:
        """The last line: what was compared and whether it is within tolerance."""
        if not self.ok:
            return "FAIL: " + "; ".join(self.failures())
        if "fused" in self.builds:
            return "PASS: fused is within tolerance (" + ", ".join(self.errors) + ")"
        return f"PASS: no fused build; compared only {', '.join(self.errors)}: all within tolerance"

    def __str__(self) -> str:
        lines = [f"model {self.model}  target {self.target}"]
        if self.precision:
            lines.append(f"precision {self.precision}: converted from float32 (ToMixedPrecision); every build is "
                         f"judged against the float32 model with {check_precision(self.precision)}'s tolerance")
        fired = ", ".join(f"{k} {v}" for k, v in self.counts.items() if v) or "none"
        lines.append(f"rules fired: {fired} (total {sum(self.counts.values())})" if "fused" in self.builds
                     else "rules fired: - (no fused build)")
        lines.append("")
        lines.append(_table(["build", "PrimFuncs", "kernel calls", "build s", "median ms", "min ms", "max ms"],
                            [[b.mode, b.primfuncs, b.kernel_calls, f"{b.build_seconds:.1f}", *_lat(b.latencies)]
                             for b in self.builds.values()]
                            + ([["onnxruntime", "-", "-", "-", *_lat(self.ort_latencies)]] if self.ort_latencies else [])))
        if not self.executed:
            lines += ["", f"execution skipped: {self.skipped_reason}"]
            nv = [f"{b.mode} {b.nvcc_seconds:.1f}s" for b in self.builds.values() if b.nvcc_seconds is not None]
            if nv:
                lines.append("nvcc compiled the generated CUDA of: " + ", ".join(nv))
            return "\n".join(lines)
        lines.append("")
        rows = []
        for pair, stats in self.errors.items():
            for name, s in zip(self.outputs, stats):
                rows.append([pair, name, s.dtype, f"{s.n_bad}/{s.size}", f"{s.max_abs:.3g}", f"{s.max_rel:.3g}",
                             s.worst_element(),
                             "ok" if s.ok else "FAIL"])
        lines.append(_table(["comparison", "output", "dtype", "elements off", "max abs err", "max rel err",
                             "worst element: actual vs reference", ""], rows))
        med = {m: statistics.median(b.latencies) for m, b in self.builds.items() if b.latencies}
        if "fused" in med:
            ratios = [f"{m}/fused {med[m] / med['fused']:.2f}x" for m in med if m != "fused"]
            if self.ort_latencies:
                ratios.append(f"onnxruntime/fused {statistics.median(self.ort_latencies) / med['fused']:.2f}x")
            lines += ["", "speedup of fused (median latency ratio, >1 means fused is faster): " + ", ".join(ratios)]
        lines += ["", "element-wise: |a - r| <= atol * rms(r) + rtol * |r| per element, (rtol, atol) by the "
                  "reference's dtype (tvm_fusion.numerics)", self.verdict()]
        return "\n".join(lines)


def _lat(values: list[float]) -> list[str]:
    if not values:
        return ["-", "-", "-"]
    return [f"{statistics.median(values) * 1e3:.2f}", f"{min(values) * 1e3:.2f}", f"{max(values) * 1e3:.2f}"]


def _table(header: list, rows: list[list]) -> str:
    cells = [list(map(str, header))] + [list(map(str, r)) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(cells[0]), fmt(["-" * w for w in widths])] + [fmt(r) for r in cells[1:]])


def _progress(items, desc):
    try:
        from tqdm import tqdm

        return tqdm(items, desc=desc, leave=False, disable=None)  # None: only on a terminal
    except ImportError:  # pragma: no cover
        return items


def compare(model, target="llvm", *, shapes: dict | None = None, rules: RuleSet | None = None,
            repeat: int = 10, seed: int = 0, arch: str = "sm_90", modes=MODES, inputs=None,
            precision: str | None = None) -> CompareReport:
    """Build `model` in `modes`, run them and onnxruntime on the same inputs, return the report.

    `precision` "fp16" / "bf16": convert the float32 model first (tvm_fusion.precision); onnxruntime runs the
    float32 model and every output is judged with the half dtype's tolerance.

    `inputs`: a dict name -> array or the path of an .npz file, for some or all of the graph inputs (the
    rest are seeded random values: give token ids and masks yourself)."""
    modes = check_modes(modes)
    precision = precision if check_precision(precision) else None
    if repeat < 0:
        raise FusionError(f"repeat {repeat} is negative; use 0 (no timing) or more")
    name = str(model) if not isinstance(model, onnx.ModelProto) else (model.graph.name or "<ModelProto>")
    proto = frontend.load_onnx(model)
    if not proto.graph.output:
        raise FusionError(f"{name}: the graph has no outputs; nothing to compare")
    given = load_inputs(inputs)
    shapes = check_inputs(proto, given, shapes)
    mod = convert(frontend.import_onnx(proto, shapes), precision)
    tgt = resolve_target(target, arch)
    if tgt.kind.name != "cuda" or gpu_available()[0]:  # before building: refuse what cannot run
        check_memory(mod, len(modes) + 1, name)
    builds: dict[str, Built] = {}
    for mode in _progress(modes, "building"):
        builds[mode] = build(mod, tgt, mode, rules=rules)
    stats = {m: BuildStats(m, b.primfuncs, b.kernel_calls, b.build_seconds) for m, b in builds.items()}
    counts = builds["fused"].counts if "fused" in builds else {}
    outputs = [o.name for o in proto.graph.output]
    kind = tgt.kind.name
    if kind == "cuda":
        ok, why = gpu_available()
        if not ok:
            for m, b in builds.items():
                t0 = time.perf_counter()
                compile_cuda_source(cuda_source(b.executable), arch)
                stats[m].nvcc_seconds = time.perf_counter() - t0
            return CompareReport(name, str(tgt), outputs, stats, {}, counts, False, why, precision=precision)
    dev = tvm.cuda(0) if kind == "cuda" else tvm.cpu(0)
    inputs, tensors = input_tensors(proto, shapes, seed, dev, given)
    sess, ref = _reference(proto, inputs, name)  # first: inputs onnxruntime refuses must not reach our kernels
    vms = {m: relax.VirtualMachine(b.executable, dev) for m, b in builds.items()}
    results = {m: as_arrays(vm["main"](*tensors)) for m, vm in vms.items()}
    ort_lat = []
    for _ in _progress(range(repeat), "timing"):  # interleaved: one run of each per round
        for m, vm in vms.items():
            t = vm.time_evaluator("main", dev, number=1, repeat=1)(*tensors)
            stats[m].latencies.append(t.median)
        t0 = time.perf_counter()
        sess.run(None, inputs)
        ort_lat.append(time.perf_counter() - t0)
    errors = {}
    # the model's output dtypes choose the tolerance (the half dtype for a model converted with `precision`)
    dtypes = [verdict_dtype(np.asarray(r).dtype, precision) for r in ref]
    if "fused" in results and "unfused" in results:
        errors["fused vs unfused"] = _judge(results["fused"], results["unfused"], dtypes, outputs)
    for m in sorted(results, key=lambda m: m != "fused"):  # fused first, then the others in their order
        errors[f"{m} vs onnxruntime"] = _judge(results[m], ref, dtypes, outputs)
    return CompareReport(name, str(tgt), outputs, stats, errors, counts, True, "", ort_lat, precision)


def _reference(proto: onnx.ModelProto, inputs: dict, name: str):
    """onnxruntime's session and outputs; what it refuses is bad input, said in one line."""

    def first_line(err: Exception) -> str:
        return next((ln.strip() for ln in str(err).splitlines() if ln.strip()), type(err).__name__)[:300]

    try:
        sess, _ = run_onnxruntime(proto, inputs)
    except Exception as err:  # noqa: BLE001 - onnxruntime raises its own exception types
        raise FusionError(f"{name}: onnxruntime, the reference, cannot load the model ({first_line(err)})") from None
    try:
        return sess, sess.run(None, inputs)
    except Exception as err:  # noqa: BLE001
        raise FusionError(f"{name}: onnxruntime cannot run the model on these inputs ({first_line(err)}); random "
                          f"integer inputs are drawn from [0, 8): give token ids, indices and masks with "
                          f"{INPUTS_SYNTAX}") from None


def _judge(actual: list, reference: list, dtypes: list, names: list[str]) -> list[ErrorStats]:
    """Per output; a build that returns a different number of outputs is an internal error, named."""
    if len(actual) != len(reference):
        raise RuntimeError(f"the build returned {len(actual)} outputs, the reference {len(reference)} ({names})")
    return [error_stats(a, r, d) for a, r, d in zip(actual, reference, dtypes)]
