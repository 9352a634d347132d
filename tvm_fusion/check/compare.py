"""Build a model three ways (unfused / tvm / fused), run them and onnxruntime on the same seeded inputs,
and report numerics, kernel counts and latency side by side."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from tvm_fusion.frontend import importer as frontend
from tvm_fusion._tvm import relax, tvm
from tvm_fusion.build.builder import Built, build
from tvm_fusion.build.memory import MemoryPlan, plan_memory, report_lines
from tvm_fusion.console import progress, table
from tvm_fusion.errors import FusionError
from tvm_fusion.build.cuda_compiler import compile_cuda_source, cuda_source
from tvm_fusion.check.io import (INPUTS_SYNTAX, as_arrays, available_memory, check_inputs,  # noqa: F401 (re-exported)
                                 check_memory, device, gpu_available, graph_inputs, input_tensors, load_inputs,
                                 random_inputs, run_onnxruntime)
from tvm_fusion.build.pipeline import MODES
from tvm_fusion.check.prepared import prepare
from tvm_fusion.rules import RuleSet
from tvm_fusion.check.numerics import ErrorStats, error_stats
from tvm_fusion.check.half_reference import half_baseline
from tvm_fusion.precision import check_precision, verdict_dtype
from tvm_fusion.check.reference import Reference
from tvm_fusion.check.differential import check_groups

__all__ = ["CompareReport", "compare", "random_inputs", "load_inputs", "check_inputs", "check_modes", "run_onnxruntime",
           "gpu_available"]


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


@dataclass
class BuildStats:
    mode: str
    primfuncs: int
    kernel_calls: int
    build_seconds: float
    latencies: list[float] = field(default_factory=list)  # seconds
    nvcc_seconds: float | None = None
    memory: MemoryPlan | None = None  # TVM's memory plan of the build: its peak activation memory


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
    reported: list[str] = field(default_factory=list)  # comparisons shown but not judged (half_reference.half_baseline)
    groups: object = None  # differential.GroupReport: fusion judged per group (a model ill-conditioned for half)
    cpu_threads: int = 0  # threads of TVM's CPU pool while timing (0: not timed on the CPU)
    noise: dict = field(default_factory=dict)  # output (" at N=3") -> (elements where onnxruntime's runs differ, max)

    def judged(self) -> dict[str, list[ErrorStats]]:
        return {pair: stats for pair, stats in self.errors.items() if pair not in self.reported}

    @property
    def ok(self) -> bool:
        return (all(s.ok for stats in self.judged().values() for s in stats)
                and (self.groups is None or not self.groups.failing))

    def failures(self) -> list[str]:
        return ([f"{pair}, output {self.outputs[i]}: {s.describe()}"
                 for pair, stats in self.judged().items() for i, s in enumerate(stats) if not s.ok]
                + ([f"per-group check at {self.precision}: {self.groups.first_failure()}"]
                   if self.groups is not None and self.groups.failing else []))

    def failing_builds(self) -> list[str]:
        """The builds with a comparison over tolerance ("fused vs unfused" and a failing group blame fused)."""
        return list(dict.fromkeys([pair.split(" vs ")[0] for pair, stats in self.judged().items()
                                   if not all(s.ok for s in stats)]
                                  + (["fused"] if self.groups is not None and self.groups.failing else [])))

    def verdict(self) -> str:
        """The last line: what was compared and whether it is within tolerance."""
        if not self.ok:
            return "FAIL: " + "; ".join(self.failures())
        if not self.judged() and self.groups is None:
            return ("NOT JUDGED: ill-conditioned for the half dtype (see the baseline row), so the rows are reported "
                    "only, and without a fused build there is no group to check (add fused to --modes)")
        if self.groups is not None:
            return (f"PASS: every fused group is within {check_precision(self.precision)}'s tolerance of its unfused "
                    f"ops at {self.precision} ({len(self.groups.groups)} groups); the errors against the float32 "
                    "model are reported, not judged (ill-conditioned for the dtype: see the baseline row)")
        if "fused" in self.builds:
            return "PASS: fused is within tolerance (" + ", ".join(self.judged()) + ")"
        return f"PASS: no fused build; compared only {', '.join(self.judged())}: all within tolerance"

    def __str__(self) -> str:
        lines = [f"model {self.model}  target {self.target}"]
        if self.precision:
            half = check_precision(self.precision)
            lines.append(f"precision {self.precision}: converted from float32 (ToMixedPrecision); " + (
                f"every build is judged against the float32 model with {half}'s tolerance" if self.groups is None else
                f"rounding the input and weights to {half} alone (the baseline row) is over {half}'s tolerance, so "
                "the model is ill-conditioned for it: the errors against the float32 model and between builds "
                f"are reported, and fusion is judged per group at {self.precision}"))
        fired = ", ".join(f"{k} {v}" for k, v in self.counts.items() if v) or "none"
        lines.append(f"rules fired: {fired} (total {sum(self.counts.values())})" if "fused" in self.builds
                     else "rules fired: - (no fused build)")
        lines.append("")
        lines.append(table(["build", "PrimFuncs", "kernel calls", "build s", "median ms", "min ms", "max ms"],
                            [[b.mode, b.primfuncs, b.kernel_calls, f"{b.build_seconds:.1f}", *_lat(b.latencies)]
                             for b in self.builds.values()]
                            + ([["onnxruntime", "-", "-", "-", *_lat(self.ort_latencies)]] if self.ort_latencies else [])))
        lines += report_lines((m, b.memory) for m, b in self.builds.items())
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
                off = f"{s.n_bad}/{s.size}" + (f" ({s.n_noise_only} in noise)" if s.n_noise_only else "")
                rows.append([pair, name, s.dtype, off, f"{s.max_abs:.3g}", f"{s.max_rel:.3g}",
                             s.worst_element(),
                             ("ok" if s.ok else "FAIL") if pair not in self.reported else "reported"])
        lines.append(table(["comparison", "output", "dtype", "elements off", "max abs err", "max rel err",
                             "worst element: actual vs reference", ""], rows))
        med = {m: statistics.median(b.latencies) for m, b in self.builds.items() if b.latencies}
        if "fused" in med:
            ratios = [f"{m}/fused {med[m] / med['fused']:.2f}x" for m in med if m != "fused"]
            if self.ort_latencies:
                ratios.append(f"onnxruntime/fused {statistics.median(self.ort_latencies) / med['fused']:.2f}x")
            lines += ["", "speedup of fused (median latency ratio, >1 means fused is faster): " + ", ".join(ratios)]
        lines += self._stall_note()
        if self.groups is not None:
            lines += ["", str(self.groups)]
        lines += self._noise_lines()
        lines += ["", "element-wise: |a - r| <= atol * max(rms(r), max|r|/10) + rtol * |r| + noise(r) per element, "
                  "(rtol, atol) by the reference's dtype (tvm_fusion.check.numerics); noise(r): |onnxruntime optimized - "
                  "as written|", self.verdict()]
        return "\n".join(lines)

    def _noise_lines(self) -> list[str]:
        """Where onnxruntime's optimized and as-written runs differ, and how many elements needed that allowance."""
        noisy = {out: v for out, v in self.noise.items() if v[0]}
        if not noisy:
            return []
        needed = sum(s.n_noise_only for pair, stats in self.errors.items() for s in stats if pair not in self.reported)
        spread = ", ".join(f"{out} at {n} elements (max {m:.3g})" for out, (n, m) in noisy.items())
        return ["", f"onnxruntime's own runs (graph optimized vs as written) differ on {spread}: an element may differ "
                f"from the reference by that much more; {needed} element(s) of the comparisons above needed it"]

    def _stall_note(self) -> list[str]:
        """A note when a build's timed runs on a CPU pool of several threads spread over STALL_SPREAD x."""
        spread = {m: max(b.latencies) / min(b.latencies) for m, b in self.builds.items()
                  if b.latencies and min(b.latencies) > 0}
        worst = max(spread, key=spread.get, default=None)
        if self.cpu_threads < 2 or worst is None or spread[worst] < STALL_SPREAD:
            return []
        return ["", f"note: {worst}'s timed runs spread {spread[worst]:.0f}x (fastest to slowest) on TVM's pool of "
                f"{self.cpu_threads} threads: other processes busy on these cores stall that pool at every kernel "
                "(it waits for each of its threads). Time it on the cores that are free (TVM_NUM_THREADS, taskset); "
                "README: 'A host shared with other busy processes'"]


#: a CPU build's slowest timed run over its fastest beyond which the report says the host looks shared: on the
#: idle 2-vCPU host ShuffleNet's runs spread 1.1x, with two other processes spinning 35x (20 to 724 ms)
STALL_SPREAD = 5.0


def _lat(values: list[float]) -> list[str]:
    if not values:
        return ["-", "-", "-"]
    return [f"{statistics.median(values) * 1e3:.2f}", f"{min(values) * 1e3:.2f}", f"{max(values) * 1e3:.2f}"]


def compare(model, target="llvm", *, shapes: dict | None = None, rules: RuleSet | None = None,
            repeat: int = 10, seed: int = 0, arch: str = "sm_90", modes=MODES, inputs=None,
            precision: str | None = None, simplify: bool = True) -> CompareReport:
    """Build `model` in `modes`, run them and onnxruntime on the same inputs, return the report.
    `model`: a path, a ModelProto, or a prepared.PreparedModel (then its target, shapes, inputs, precision
    and simplifier choice are used). `simplify=False`: import the model as given (no ONNX simplifier).

    `precision` "fp16" / "bf16": convert the float32 model first (tvm_fusion.precision); onnxruntime runs the
    float32 model and every output is judged with the half dtype's tolerance.

    `inputs`: a dict name -> array or the path of an .npz file, for some or all of the graph inputs (the
    rest are seeded random values: give token ids and masks yourself)."""
    modes = check_modes(modes)
    precision = precision if check_precision(precision) else None
    if repeat < 0:
        raise FusionError(f"repeat {repeat} is negative; use 0 (no timing) or more")
    prepared = prepare(model, target, arch=arch, shapes=shapes, inputs=inputs, precision=precision, simplify=simplify)
    name, proto, mod, tgt, shapes, given = (prepared.name, prepared.proto, prepared.mod, prepared.target,
                                            prepared.shapes, prepared.given)
    precision, arch = prepared.precision, prepared.arch
    if tgt.kind.name != "cuda" or gpu_available()[0]:  # before building: refuse what cannot run
        check_memory(mod, len(modes) + 1, name)
    builds: dict[str, Built] = {}
    for mode in progress(modes, "building"):
        builds[mode] = build(mod, tgt, mode, rules=rules)
    stats = {m: BuildStats(m, b.primfuncs, b.kernel_calls, b.build_seconds, memory=plan_memory(b.module, tgt))
             for m, b in builds.items()}
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
    dev = device(tgt)
    vms = {m: relax.VirtualMachine(b.executable, dev) for m, b in builds.items()}
    errors, baseline, noisy = {}, [], {}
    for size in frontend.check_sizes(shapes, given):  # symbolic dims: run at 1 and a larger size (timed there)
        inputs, tensors = input_tensors(proto, frontend.concrete_shapes(shapes, size), seed, dev, given)
        reference = Reference(proto, inputs, name)  # first: inputs onnxruntime refuses must not reach our kernels
        ref, noise = reference.values, reference.noise()
        results = {m: as_arrays(vm["main"](*tensors)) for m, vm in vms.items()}
        suffix = f" at {frontend.sizes_text(size)}" if size else ""
        noisy.update({o + suffix: _noise_summary(n) for o, n in zip(outputs, noise)})
        if precision:  # what rounding alone costs: is the float32 reference a meaningful verdict at this dtype?
            baseline.append(f"onnxruntime, input and weights rounded to {check_precision(precision)}, "
                            f"vs onnxruntime{suffix}")
            errors[baseline[-1]] = half_baseline(proto, inputs, ref, precision)
        errors.update(_judge_all(results, ref, outputs, suffix, precision, noise))
    reported, groups = list(baseline), None
    if any(not s.ok for pair in baseline for s in errors[pair]):  # ill-conditioned: judge fusion per group
        reported = list(errors)
        if "fused" in builds:
            groups = check_groups(prepared, rules=rules, seed=seed)
    ort_lat = _time_interleaved(vms, dev, tensors, stats, reference.optimized_session(), inputs, repeat)
    threads = int(tvm.get_global_func("runtime.NumThreads")()) if kind == "llvm" and repeat else 0
    return CompareReport(name, str(tgt), outputs, stats, errors, counts, True, "", ort_lat, precision, reported, groups,
                         threads, noisy)


def _time_interleaved(vms: dict, dev, tensors, stats: dict, session, inputs: dict, repeat: int) -> list[float]:
    """`repeat` rounds of one run of each build (appended to `stats[mode].latencies`) and one of onnxruntime's
    `session` (returned), interleaved so that a host's changing load falls on all of them alike."""
    ort_lat = []
    for _ in progress(range(repeat), "timing"):
        for m, vm in vms.items():
            t = vm.time_evaluator("main", dev, number=1, repeat=1)(*tensors)
            stats[m].latencies.append(t.median)
        t0 = time.perf_counter()
        session.run(None, inputs)
        ort_lat.append(time.perf_counter() - t0)
    return ort_lat


def _noise_summary(noise: np.ndarray) -> tuple[int, float]:
    finite = np.where(np.isfinite(noise), noise, 0.0)
    return int((finite > 0).sum()), float(finite.max()) if finite.size else 0.0


def _judge_all(results: dict, ref: list, outputs: list[str], suffix: str = "",
               precision: str | None = None, noise: list | None = None) -> dict[str, list[ErrorStats]]:
    """Fused vs unfused and each build vs onnxruntime; `suffix` names the sizes of symbolic dims (" at N=3");
    `precision`: the half dtype a float32 model was converted to judges its outputs; `noise`: onnxruntime's own
    per output (reference.Reference.noise), allowed in every comparison: how far two correct implementations
    of the model land apart on these inputs."""
    errors = {}
    # the model's output dtypes choose the tolerance (the half dtype for a model converted with `precision`)
    dtypes = [verdict_dtype(np.asarray(r).dtype, precision) for r in ref]
    if "fused" in results and "unfused" in results:
        errors["fused vs unfused" + suffix] = _judge(results["fused"], results["unfused"], dtypes, outputs, noise)
    for m in sorted(results, key=lambda m: m != "fused"):  # fused first, then the others in their order
        errors[f"{m} vs onnxruntime{suffix}"] = _judge(results[m], ref, dtypes, outputs, noise)
    return errors


def _judge(actual: list, reference: list, dtypes: list, names: list[str], noise: list | None = None) -> list[ErrorStats]:
    """Per output; a build that returns a different number of outputs is an internal error, named."""
    if len(actual) != len(reference):
        raise RuntimeError(f"the build returned {len(actual)} outputs, the reference {len(reference)} ({names})")
    noise = noise if noise is not None else [None] * len(reference)
    return [error_stats(a, r, d, n) for a, r, d, n in zip(actual, reference, dtypes, noise)]
