"""compile's verify step: the fused build against the model on seeded inputs, before a library is written.

    fused_cpu(x) ~= onnxruntime(x)   element by element, with the tolerance of each output's dtype

The fused build that runs is the one being exported when the target is the CPU; for CUDA (no GPU needed)
the same fused graph, with the same matches and the same folded constants, is built for the host CPU:
that checks the patterns, the BatchNorm folding and the shapes, while the CUDA schedules' own numerics stay
covered by their CPU-emulation tests. onnxruntime is the reference: it is the model as ONNX defines it,
and it is ~100x cheaper than TVM's unfused CPU build (4 s per ResNet-50 inference, untuned).

On a difference, the per-group check (`differential.bisect`) runs against the unfused build: it names the
first group over tolerance and the `--disable` that avoids it, or says that the unfused build differs from
onnxruntime too (then fusion did not cause it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import onnx

from . import _tvm
from ._tvm import relax, tvm
from .build import Built, build, resolve_target
from .io import as_arrays, input_tensors, run_onnxruntime
from .errors import FusionError, ToleranceExceeded
from .frontend import check_sizes, concrete_shapes, sizes_text
from .fuse import lower
from .rules import RuleSet
from .runtime import check_host
from .numerics import ErrorStats, error_stats
from .precision import half_baseline, verdict_dtype

__all__ = ["Verification", "verify_fused"]

METHOD_CPU = "the fused build, run on the host CPU, against onnxruntime on seeded inputs"
METHOD_CUDA = ("the same fused graph and folded constants built for the host CPU (the target's own "
               "schedules are checked by their CPU-emulation tests), against onnxruntime on seeded inputs")


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
    baseline: dict[str, ErrorStats] = field(default_factory=dict)  # --precision: precision.half_baseline
    groups: dict | None = None  # a model ill-conditioned for half: the per-group check that judged fusion

    def manifest(self) -> dict:
        if not self.verified:
            return {"verified": False, "reason": self.method}
        record = {"verified": True, "method": self.method, "reference": "onnxruntime", "seed": self.seed,
                  "inputs_given": self.given, "target": self.target, "seconds": round(self.seconds, 3),
                  "outputs": {k: _record(v) for k, v in self.outputs.items()}}
        if self.sizes:
            record["symbolic_dims_checked_at"] = self.sizes
        if self.baseline:
            record["half_baseline"] = {k: _record(v) for k, v in self.baseline.items()}
        if self.groups is not None:
            record["judged"] = "per group (ill-conditioned for the half dtype: the outputs above are reported)"
            record["groups"] = self.groups
        return record


def _record(s: ErrorStats) -> dict:
    return {"ok": s.ok, "elements": s.size, "elements_off": s.n_bad, "max_abs": s.max_abs, "max_rel": s.max_rel,
            "rule": s.rule(), "worst": s.worst_element()}


def skipped(reason: str = "skipped with --no-verify") -> Verification:
    return Verification(False, reason)


def verify_fused(proto: onnx.ModelProto, built: Built, *, shapes: dict | None = None,
                 rules: RuleSet | None = None, seed: int = 0, inputs: dict | None = None,
                 precision: str | None = None) -> Verification:
    """Run `built` (or, for a non-CPU target, the same fused graph built for the host CPU) on the given
    `inputs` (checked with io.check_inputs) and seeded values for the rest, and compare every output
    with onnxruntime; raise ToleranceExceeded naming the group to blame. With `precision` (a float32 model
    converted to fp16 / bf16) the outputs are judged with the half dtype's tolerance."""
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
    stats, baseline, ill = {}, {}, False
    for size in sizes:  # a symbolic batch: at 1 and at a larger size, each against onnxruntime
        run_shapes = concrete_shapes(shapes or {}, size)
        values, tensors = input_tensors(proto, run_shapes, seed, dev, inputs)
        got = as_arrays(vm["main"](*tensors, *weights))
        sess, names = run_onnxruntime(proto, values, optimize=False)
        at = f" at {sizes_text(size)}" if size else ""
        ref = sess.run(None, values)
        found = {n + at: error_stats(g, r, verdict_dtype(r.dtype, precision)) for n, g, r in zip(names, got, ref)}
        stats.update(found)
        bad = [n for n, s in found.items() if not s.ok]
        if precision in (None, "fp32"):
            if bad:
                raise ToleranceExceeded(_blame(proto, cpu, run_shapes, rules, seed, inputs, bad, found))
            continue
        base = dict(zip((n + at for n in names), half_baseline(proto, values, ref, precision)))
        baseline.update(base)
        ill |= not all(s.ok for s in base.values())
        if bad and not ill:
            raise ToleranceExceeded(f"verify: the {precision} fused build differs from the float32 model on output(s) "
                                    + ", ".join(f"{n} ({found[n].describe()})" for n in bad)
                                    + f"; no library written (rounding the input and weights alone is within "
                                    f"tolerance). `tvm-fusion compare --precision {precision} --modes unfused,fused` "
                                    "shows whether the conversion or fusion causes it")
    groups = _judge_groups(proto, cpu, shapes, rules, seed, inputs, precision) if ill else None
    return Verification(True, METHOD_CPU if on_cpu else METHOD_CUDA, seed, str(cpu), stats,
                        time.perf_counter() - start, sorted(inputs or {}), [s for s in sizes if s], baseline, groups)


def _judge_groups(proto, cpu, shapes, rules, seed, inputs, precision) -> dict:
    """A model ill-conditioned for the half dtype (precision.half_baseline over tolerance): every fused group
    against its unfused ops at the same precision on the host CPU (differential.check_groups, matched for the
    CPU); ToleranceExceeded naming the first group over tolerance."""
    from .differential import check_groups

    report = check_groups(proto, cpu, shapes=shapes, rules=rules, seed=seed, inputs=inputs, precision=precision)
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
        check_host({"cpu_triple": _tvm.llvm_triple(target), "cpu_features": _tvm.target_cpu_features(target)})
    except FusionError:
        return False
    return True


def _quick_cpu():
    """The host CPU with LLVM's optimizer off: the verify build runs once, so compiling fast is what counts
    (ResNet-50: 0.4 s instead of 1.3 s); TIR and IEEE float semantics are the same at every opt-level."""
    return tvm.target.Target({**resolve_target("llvm").export(), "opt-level": 0})


def _blame(model, cpu, shapes, rules, seed, inputs, bad: list[str], stats: dict[str, ErrorStats]) -> str:
    from .differential import bisect

    worst = ", ".join(f"{n} ({stats[n].describe()})" for n in bad)
    head = f"verify: the fused build differs from onnxruntime on output(s) {worst}; no library written"
    report = bisect(model, cpu, shapes=shapes, rules=rules, seed=seed, inputs=inputs)
    if report.culprits:
        where = report.first.first_failure() or "the whole-model outputs"
        return (f"{head}. {where}; " + " ".join(f"--disable {r}" for r in report.culprits)
                + " avoids it (or --no-verify to write it anyway)")
    if report.first.ok:
        return (f"{head}. The unfused TVM build gives the same values, so fusion did not cause it (TVM's "
                "importer and onnxruntime disagree); --no-verify writes the library anyway")
    return f"{head}. {report.verdict}; --no-verify writes the library anyway"
