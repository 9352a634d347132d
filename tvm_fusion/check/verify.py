"""compile's verify step: the fused build against the model on seeded inputs, before a library is written.

    fused_cpu(x) ~= onnxruntime(x)   element by element, with the tolerance of each output's dtype
                                     (numerics.error_stats) and, where an output is over it, onnxruntime's
                                     own noise (reference.py: its optimized vs as-written runs)

The fused build that runs is the one being exported when the target is the CPU; for CUDA (no GPU needed)
the same fused graph, with the same matches and the same folded constants, is built for the host CPU:
that checks the patterns, the BatchNorm folding and the shapes, while the CUDA schedules' own numerics stay
covered by their CPU-emulation tests. onnxruntime is the reference: it is the model as ONNX defines it,
and it is ~100x cheaper than TVM's unfused CPU build (4 s per ResNet-50 inference, untuned).

Where an output is over tolerance, the unfused build (the same matched graph with every group's ops left
unfused: no rule of ours involved) runs on the same inputs, and fused is judged against it:
- within tolerance on every output: fusion did not change the result; TVM's import and lowering disagree
  with onnxruntime. The library is written with a warning, recorded in the manifest's
  `verification.importer` (`strict`: refused, ToleranceExceeded);
- over it: fusion changed the result. The culprit search (`differential.bisect`: the per-group check, then
  rules disabled and rebuilt) names the first group over tolerance and the `--disable` that avoids it,
  stopping after `search_timeout` seconds; ToleranceExceeded either way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import onnx

from tvm_fusion import _tvm
from tvm_fusion._tvm import relax, tvm
from tvm_fusion.build.builder import Built, build, resolve_target
from tvm_fusion.check.io import as_arrays, input_tensors
from tvm_fusion.errors import FusionError, ToleranceExceeded
from tvm_fusion.frontend.importer import check_sizes, concrete_shapes, sizes_text
from tvm_fusion.fusion.fuse import lower
from tvm_fusion.check.reference import Reference
from tvm_fusion.rules import RuleSet
from tvm_fusion.runtime import check_cpu
from tvm_fusion.check.numerics import ErrorStats, error_stats
from tvm_fusion.check.half_reference import half_baseline
from tvm_fusion.precision import verdict_dtype
from tvm_fusion.check.differential import bisect, check_groups, unfused_module

__all__ = ["Verification", "verify_fused", "DEFAULT_SEARCH_TIMEOUT"]

METHOD_CPU = "the fused build, run on the host CPU, against onnxruntime on seeded inputs"
METHOD_CUDA = ("the same fused graph and folded constants built for the host CPU (the target's own "
               "schedules are checked by their CPU-emulation tests), against onnxruntime on seeded inputs")
#: seconds the culprit search may run (--search-timeout): a per-group check and a few rebuilds of a ResNet-50-
#: sized model (its per-group check took 80 s on 2 busy cores, load ~6; README: bisect 14 s on 2 idle ones)
DEFAULT_SEARCH_TIMEOUT = 120.0


@dataclass
class Verification:
    """What compile's verify step ran and found; `manifest()` is what the library's manifest records."""

    verified: bool
    method: str = ""
    seed: int | None = None
    target: str = ""
    outputs: dict[str, ErrorStats] = field(default_factory=dict)
    seconds: float = 0.0
    given: list[str] = field(default_factory=list)  # inputs the user gave (--inputs); the rest were seeded
    sizes: list[dict] = field(default_factory=list)  # the sizes symbolic dims were run at ({"N": 3}); outputs
    # are then named "<output> at N=3"
    baseline: dict[str, ErrorStats] = field(default_factory=dict)  # --precision: half_reference.half_baseline
    groups: dict | None = None  # a model ill-conditioned for half: the per-group check that judged fusion
    noise_measured: bool = False  # onnxruntime's optimized run was made (only where an output needed it)
    importer: dict | None = None  # over tolerance against onnxruntime, within it against the unfused build
    warning: str = ""  # the line compile prints when `importer` is set

    def manifest(self) -> dict:
        if not self.verified:
            return {"verified": False, "reason": self.method}
        record = {"verified": True, "method": self.method, "reference": "onnxruntime", "seed": self.seed,
                  "inputs_given": self.given, "target": self.target, "seconds": round(self.seconds, 3),
                  "agrees_with_reference": self.importer is None,
                  "reference_noise": ("onnxruntime's graph optimized vs as written, per element (outputs[].noise)"
                                      if self.noise_measured else
                                      "not measured: every output within the tolerance without it"),
                  "outputs": {k: _record(v) for k, v in self.outputs.items()}}
        if self.importer is not None:
            record["warning"] = self.warning
            record["importer"] = self.importer
        if self.sizes:
            record["symbolic_dims_checked_at"] = self.sizes
        if self.baseline:
            record["half_baseline"] = {k: _record(v) for k, v in self.baseline.items()}
        if self.groups is not None:
            record["judged"] = "per group (ill-conditioned for the half dtype: the outputs above are reported)"
            record["groups"] = self.groups
        return record


def _record(s: ErrorStats) -> dict:
    record = {"ok": s.ok, "elements": s.size, "elements_off": s.n_bad, "max_abs": s.max_abs, "max_rel": s.max_rel,
              "rule": s.rule(), "scale": s.scale_of, "worst": s.worst_element()}
    if s.noise is not None:
        record["noise"] = {"max": s.noise, "elements": s.n_noisy, "needed_by": s.n_noise_only}
    return record


def skipped(reason: str = "skipped with --no-verify") -> Verification:
    return Verification(False, reason)


@dataclass
class _Run:
    """One input set of the verify step: the fused build's outputs, onnxruntime's, and the model's dtypes."""

    got: list
    reference: Reference
    dtypes: list
    at: str  # " at N=3" for a symbolic dim's size, else ""
    shapes: dict  # the concrete input shapes it ran at
    tensors: list

    def judge(self, actual: list, against: list | None = None, noise: bool = True) -> list[ErrorStats]:
        ref = self.reference.values if against is None else against
        spread = self.reference.noise() if noise else [None] * len(ref)
        return [error_stats(a, r, d, n) for a, r, d, n in zip(actual, ref, self.dtypes, spread)]

    def named(self, stats: list[ErrorStats]) -> dict[str, ErrorStats]:
        return {n + self.at: s for n, s in zip(self.reference.names, stats)}


def verify_fused(proto: onnx.ModelProto, built: Built, *, shapes: dict | None = None,
                 rules: RuleSet | None = None, seed: int = 0, inputs: dict | None = None,
                 precision: str | None = None, strict: bool = False,
                 search_timeout: float = DEFAULT_SEARCH_TIMEOUT, name: str = "the model",
                 simplify: bool = True) -> Verification:
    """Run `built` (or, for a non-CPU target, the same fused graph built for the host CPU) on the given
    `inputs` (checked with io.check_inputs) and seeded values for the rest, and compare every output
    with onnxruntime. An output over tolerance is checked against the unfused build: shared with it, the
    result carries a warning (`strict`: ToleranceExceeded); not shared, ToleranceExceeded naming the group to
    blame (the culprit search stops after `search_timeout` seconds; 0 skips it). With `precision` (a float32
    model converted to fp16 / bf16) the outputs are judged with the half dtype's tolerance. `name`: the model,
    as errors name it (its path). `simplify`: whether the checks that re-import the model (the per-group check,
    the culprit search) run the ONNX simplifier, as the build's import did."""
    start = time.perf_counter()
    on_cpu = _runs_here(built.target)
    cpu = built.target if on_cpu else _quick_cpu()
    if on_cpu:
        runnable = built
    else:  # the matches made for the target, lowered for the CPU: the same groups, the same folded constants
        graph, _ = lower(built.fused.matched, cpu, any_target=True)
        runnable = build(graph, cpu, "tvm")
    dev = tvm.cpu(0)
    vm = relax.VirtualMachine(runnable.executable, dev)
    weights = list((runnable.weights or {}).values())  # built with external weights: main takes them last
    sizes = check_sizes(shapes or {}, inputs)
    unfused = _Unfused(built, dev)
    stats, baseline, ill, measured, importer, warnings = {}, {}, False, False, {}, []
    for size in sizes:  # a symbolic batch: at 1 and at a larger size, each against onnxruntime
        run_shapes = concrete_shapes(shapes or {}, size)
        values, tensors = input_tensors(proto, run_shapes, seed, dev, inputs)
        got = as_arrays(vm["main"](*tensors, *weights))
        reference = Reference(proto, values, name)  # names the model if onnxruntime refuses it
        run = _Run(got, reference, [verdict_dtype(r.dtype, precision) for r in reference.values],
                   f" at {sizes_text(size)}" if size else "", run_shapes, tensors)
        found = run.judge(got, noise=False)
        if not all(s.ok for s in found):  # onnxruntime's own noise only widens the bound: measured where needed
            found, measured = run.judge(got), True
        stats.update(run.named(found))
        bad = [n for n, s in run.named(found).items() if not s.ok]
        if precision in (None, "fp32"):
            if bad:
                shared, warning = _against_unfused(run, unfused, bad, stats, proto, cpu, rules, seed, inputs, strict,
                                                   search_timeout, simplify)
                importer.update(shared)
                warnings.append(warning)
            continue
        ref = reference.values
        base = run.named(half_baseline(proto, values, ref, precision))
        baseline.update(base)
        ill |= not all(s.ok for s in base.values())
        if bad and not ill:
            raise ToleranceExceeded(f"verify: the {precision} fused build differs from the float32 model on output(s) "
                                    + ", ".join(f"{n} ({stats[n].describe()})" for n in bad)
                                    + f"; no library written (rounding the input and weights alone is within "
                                    f"tolerance). `tvm-fusion compare --precision {precision} --modes unfused,fused` "
                                    "shows whether the conversion or fusion causes it")
    groups = _judge_groups(proto, cpu, shapes, rules, seed, inputs, precision, simplify) if ill else None
    return Verification(True, METHOD_CPU if on_cpu else METHOD_CUDA, seed, str(cpu), stats,
                        time.perf_counter() - start, sorted(inputs or {}), [s for s in sizes if s], baseline, groups,
                        measured, importer or None, "; ".join(warnings))


class _Unfused:
    """The unfused build of the fused build's matched graph, for the host CPU, made on first use. With LLVM's
    optimizer on: its kernels are unscheduled loops, so running them is what costs (ResNet-50 on 2 busy cores:
    build 2.1 s + run 6.8 s; with the optimizer off 0.7 s + 17.4 s)."""

    def __init__(self, built: Built, dev):
        self.built, self.dev, self.vm = built, dev, None

    def run(self, tensors) -> list:
        if self.vm is None:
            exe = build(unfused_module(self.built.fused.matched), resolve_target("llvm"), "unfused").executable
            self.vm = relax.VirtualMachine(exe, self.dev)
        return as_arrays(self.vm["main"](*tensors))


def _against_unfused(run: _Run, unfused: _Unfused, bad: list[str], stats: dict, proto, cpu, rules, seed, inputs,
                     strict: bool, search_timeout: float, simplify: bool) -> tuple[dict, str]:
    """Outputs `bad` are over tolerance against onnxruntime: judge fused against the unfused build. Within
    tolerance: ({output: what each comparison found}, the warning line), or ToleranceExceeded with `strict`.
    Over it: ToleranceExceeded from the culprit search."""
    plain = unfused.run(run.tensors)
    vs_unfused, vs_ort = run.named(run.judge(run.got, plain)), run.named(run.judge(plain))
    against = ", ".join(f"{n} ({stats[n].describe()})" for n in bad)
    head = f"the fused build differs from onnxruntime on output(s) {against}"
    differ = [n for n, s in vs_unfused.items() if not s.ok]
    if differ:
        where = "; ".join(f"{n}: {vs_unfused[n].n_bad} of {vs_unfused[n].size} elements off" for n in differ)
        raise ToleranceExceeded(_blame(proto, cpu, run, rules, seed, inputs, f"verify: {head}, and from the unfused "
                                       f"TVM build ({where}): fusion changed the result; no library written",
                                       search_timeout, simplify))
    unfused_off = [n for n in bad if not vs_ort[n].ok]
    off = "; ".join(f"{n}: {vs_ort[n].n_bad} of {vs_ort[n].size} elements off" for n in unfused_off)
    cause = (f"the unfused TVM build (no fusion rule involved) gives the same values within tolerance and differs "
             f"from onnxruntime too ({off}): TVM's importer and onnxruntime disagree there, not fusion"
             if unfused_off else
             "the fused build is within tolerance of the unfused TVM build (no fusion rule involved), which is itself "
             "within tolerance of onnxruntime: the two differences, each within tolerance, add up over it")
    text = f"{head}; {cause}"
    if strict:
        raise ToleranceExceeded(f"verify: {text}; --strict: no library written (without it the library is written "
                                "with this warning)")
    record = {n: {"fused_vs_onnxruntime": _record(stats[n]), "fused_vs_unfused": _record(vs_unfused[n]),
                  "unfused_vs_onnxruntime": _record(vs_ort[n])} for n in bad}
    return record, f"{text}; the library is written (--strict refuses it)"


def _judge_groups(proto, cpu, shapes, rules, seed, inputs, precision, simplify: bool) -> dict:
    """A model ill-conditioned for the half dtype (half_reference.half_baseline over tolerance): every fused group
    against its unfused ops at the same precision on the host CPU (differential.check_groups, matched for the
    CPU); ToleranceExceeded naming the first group over tolerance."""
    report = check_groups(proto, cpu, shapes=shapes, rules=rules, seed=seed, inputs=inputs, precision=precision,
                          simplify=simplify)
    if report.failing:
        raise ToleranceExceeded(f"verify: the {precision} fused build (a model ill-conditioned for {precision}: "
                                f"rounding its input and weights alone is over tolerance): {report.first_failure()}; "
                                "no library written")
    worst = max(report.groups, key=lambda g: g.stats.max_rel, default=None)
    return {"checked": len(report.groups), "ok": True,
            "worst": f"{worst.describe()}: {worst.stats.describe()}" if worst else None}


def _runs_here(target) -> bool:
    """Whether code built for `target` runs on this machine (a CPU target for this architecture whose
    features the host has); a library for another machine is verified like a CUDA one."""
    if target.kind.name != "llvm":
        return False
    try:
        check_cpu(_tvm.llvm_triple(target), _tvm.target_cpu_features(target))
    except FusionError:
        return False
    return True


def _quick_cpu():
    """The host CPU with LLVM's optimizer off: the verify build runs once, so compiling fast is what counts
    (ResNet-50: 0.4 s instead of 1.3 s); TIR and IEEE float semantics are the same at every opt-level."""
    return tvm.target.Target({**resolve_target("llvm").export(), "opt-level": 0})


def _blame(model, cpu, run: _Run, rules, seed, inputs, head: str, timeout: float, simplify: bool) -> str:
    """The error of a fused build that differs from the unfused one: `head`, then what the culprit search
    (differential.bisect, at most `timeout` seconds; 0: not run) found."""
    rerun = "`tvm-fusion compare --bisect` (with the same model, --shape, --inputs and rules) runs it without a bound"
    if timeout <= 0:
        return f"{head}. The culprit search is off (--search-timeout 0); {rerun}; --no-verify writes the library anyway"
    report = bisect(model, cpu, shapes=run.shapes, rules=rules, seed=seed, inputs=inputs, timeout=timeout,
                    noise=run.reference.noise(), simplify=simplify)
    if report.culprits:
        where = report.first.first_failure() or "the whole-model outputs"
        return (f"{head}. {where}; " + " ".join(f"--disable {r}" for r in report.culprits)
                + " avoids it (or --no-verify to write it anyway)")
    if report.timed_out:
        suspects = [g.rule for g in report.first.failing] if report.first is not None else []
        hint = (f"; --disable {suspects[0]} may avoid it" if suspects else "")
        return (f"{head}. {report.verdict} (--search-timeout {timeout:g}){hint}; {rerun}; --no-verify writes the "
                "library anyway")
    if report.first.ok:
        return (f"{head}. The per-group check finds every group within tolerance of its ops unfused (at the inputs "
                f"it binds); {report.verdict}; --no-verify writes the library anyway")
    return f"{head}. {report.verdict}; --no-verify writes the library anyway"
