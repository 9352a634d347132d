"""Build a model three ways (unfused / tvm / fused), run them and onnxruntime on the same seeded inputs,
and report numerics, kernel counts and latency side by side."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import numpy as np
import onnx

from . import frontend
from ._tvm import relax, tvm
from .build import Built, build, resolve_target
from .errors import FusionError
from .export import compile_cuda_source, cuda_source
from .rules import RuleSet
from .runtime import as_arrays  # noqa: F401  (differential imports it from here)
from .testing import ErrorStats, error_stats

__all__ = ["CompareReport", "compare", "random_inputs", "run_onnxruntime", "gpu_available"]

MODES = ("unfused", "tvm", "fused")
_NP_DTYPES = {1: np.float32, 10: np.float16, 11: np.float64, 6: np.int32, 7: np.int64, 9: np.bool_}


def random_inputs(model: onnx.ModelProto, shapes: dict | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs for the model's graph inputs (standard normal floats, small integers)."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    out = {}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        tt = inp.type.tensor_type
        shape = (shapes or {}).get(inp.name) or [d.dim_value for d in tt.shape.dim]
        dtype = _NP_DTYPES.get(tt.elem_type)
        if dtype is None:
            raise FusionError(f"input {inp.name!r} has ONNX element type {tt.elem_type}; not supported by compare")
        if np.issubdtype(dtype, np.floating):
            out[inp.name] = rng.standard_normal(shape).astype(dtype)
        else:
            out[inp.name] = rng.integers(0, 8, shape).astype(dtype)
    return out


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


def input_tensors(proto: onnx.ModelProto, shapes: dict | None, seed: int, dev) -> tuple[dict, list]:
    """Seeded inputs by name (for onnxruntime) and as device tensors in graph order (for the VM)."""
    inputs = random_inputs(proto, {k: list(v) for k, v in (shapes or {}).items()}, seed)
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
    errors: dict[str, list[ErrorStats]]  # "fused vs unfused" -> per-output stats
    counts: dict[str, int]
    executed: bool
    skipped_reason: str = ""
    ort_latencies: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(s.ok for stats in self.errors.values() for s in stats)

    def failures(self) -> list[str]:
        return [f"{pair}, output {self.outputs[i]}: max abs {s.max_abs:.3g} > allowed {s.bound:.3g}"
                for pair, stats in self.errors.items() for i, s in enumerate(stats) if not s.ok]

    def __str__(self) -> str:
        lines = [f"model {self.model}  target {self.target}"]
        fired = ", ".join(f"{k} {v}" for k, v in self.counts.items() if v) or "none"
        lines.append(f"rules fired: {fired} (total {sum(self.counts.values())})")
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
                rows.append([pair, name, f"{s.max_abs:.3g}", f"{s.max_rel:.3g}", f"{s.bound:.3g}", "ok" if s.ok else "FAIL"])
        lines.append(_table(["comparison", "output", "max abs err", "max rel err", "allowed abs", ""], rows))
        med = {m: statistics.median(b.latencies) for m, b in self.builds.items() if b.latencies}
        if "fused" in med:
            ratios = [f"{m}/fused {med[m] / med['fused']:.2f}x" for m in med if m != "fused"]
            if self.ort_latencies:
                ratios.append(f"onnxruntime/fused {statistics.median(self.ort_latencies) / med['fused']:.2f}x")
            lines += ["", "speedup of fused (median latency ratio, >1 means fused is faster): " + ", ".join(ratios)]
        lines += ["", "PASS: fused is within tolerance" if self.ok else "FAIL: " + "; ".join(self.failures())]
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
            repeat: int = 10, seed: int = 0, arch: str = "sm_90", modes=MODES) -> CompareReport:
    """Build `model` in `modes`, run them and onnxruntime on the same seeded inputs, return the report."""
    name = str(model) if not isinstance(model, onnx.ModelProto) else (model.graph.name or "<ModelProto>")
    proto = frontend.load_onnx(model)
    mod = frontend.import_onnx(proto, shapes)
    tgt = resolve_target(target, arch)
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
            return CompareReport(name, str(tgt), outputs, stats, {}, counts, False, why)
    dev = tvm.cuda(0) if kind == "cuda" else tvm.cpu(0)
    inputs, tensors = input_tensors(proto, shapes, seed, dev)
    vms = {m: relax.VirtualMachine(b.executable, dev) for m, b in builds.items()}
    results = {m: as_arrays(vm["main"](*tensors)) for m, vm in vms.items()}
    sess, ort_names = run_onnxruntime(proto, inputs)
    ref = sess.run(None, inputs)
    ort_lat = []
    for _ in _progress(range(repeat), "timing"):  # interleaved: one run of each per round
        for m, vm in vms.items():
            t = vm.time_evaluator("main", dev, number=1, repeat=1)(*tensors)
            stats[m].latencies.append(t.median)
        t0 = time.perf_counter()
        sess.run(None, inputs)
        ort_lat.append(time.perf_counter() - t0)
    errors = {}
    if "fused" in results:
        if "unfused" in results:
            errors["fused vs unfused"] = [error_stats(a, b) for a, b in zip(results["fused"], results["unfused"])]
        errors["fused vs onnxruntime"] = [error_stats(a, b) for a, b in zip(results["fused"], ref)]
    return CompareReport(name, str(tgt), outputs, stats, errors, counts, True, "", ort_lat)
