"""One GPU check: the matrix {fp32, fp16} x batch {1, 8} x {fused, fused without CUDA graph, unfused, tvm}.

    python benchmarks/gpu_check.py --out DIR [--example resnet50 | --model m.onnx] [--arch sm_90] [--cpu-only]
                                   [--precisions fp32,fp16] [--batches 1,8] [--rounds 20] [--budget-s 420]
    python benchmarks/gpu_check.py --out DIR --cpu-only --bundle B [--python 3.12]  # for a GPU machine without TVM
    python B/gpu_check_device.py --out DIR [--budget-s 420]                        # there: the GPU steps, runtime only

For each precision (fp16: `--precision fp16`, tvm_fusion.precision) and batch of the matrix, in a few minutes:
  1. builds for CUDA (`--arch`, default the GPU's, else sm_90): the fused library with its CUDA graph
     (`compile_model`, as `tvm-fusion compile --target cuda`) and without it, the unfused and the TVM-default
     builds; and the fused build for the CPU. Batch 8 is a static build (the example's dynamic-batch variant,
     examples.with_dynamic_batch, bound to 8): CUDA graphs need static shapes, and each batch gets kernels
     scheduled for it.
  2. numerics, element by element with the dtype's tolerance (tvm_fusion.check.numerics; an fp16 build is judged
     against the float32 reference with float16's): the CPU build vs onnxruntime here; on the GPU the fused
     library vs unfused, vs itself without the graph, vs the CPU build and vs onnxruntime (and tvm vs
     onnxruntime, which shows what the conversion alone costs)
  3. latency on the GPU: the four builds in interleaved rounds, medians; launches per inference with and
     without the graph (from the manifest)
  4. each fused kernel timed on its own (the library without the graph; VM set_instrument, device
     synchronised around every call)
and writes DIR/gpu_check.json and DIR/gpu_check.md, with a "Bars" section: each bar the GPU build must meet (BARS), the
measured value and pass / fail, or "not measured" and why. Without a GPU (or with --cpu-only) it runs every
part that needs none and lists each GPU step under "skipped" with the reason. Exit status: 0 when every
comparison that ran passed (the bars are measurements, reported, not part of it), 1 otherwise.

The GPU steps stay within --budget-s (default 420 s): the latency rounds of each configuration stop when its
share of what is left is spent (at least MIN_ROUNDS rounds).

With --bundle B it also writes a runtime-only bundle for a GPU machine that has Python, a CUDA driver and
no TVM (tvm_fusion.deploy.bundle, at most 64 MiB): the 16 CUDA libraries with their weights as recipes over the
example's seed (gpu_bundle/weights_recipe.py: ResNet-50's 102 MB of weights regenerated there with numpy, float16 ones
as casts of them, each checked by sha256; libraries whose weights are identical share one recipe), the TVM
runtime, numpy's wheel, the CPU and onnxruntime outputs (references.npz; the inputs are regenerated there
from their seed and checked by sha256), this report so far, and benchmarks/gpu_check_device.py, which runs
the GPU steps there and completes the report.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

GPU_STEPS = ("load the libraries on the GPU", "GPU numerics (fused vs unfused vs CPU vs onnxruntime)",
             "GPU latency (fused / fused without graph / unfused / tvm, interleaved medians)",
             "GPU per-kernel timing (fused without graph)")
NO_GRAPH = "fused (no CUDA graph)"
BUILDS = ("fused", NO_GRAPH, "unfused", "tvm")
PRECISIONS = ("fp32", "fp16")
BATCHES = (1, 8)
#: the dtype whose tolerance judges each precision's outputs (tvm_fusion.precision.PRECISIONS; None: the output's)
VERDICT_DTYPE = {"fp32": None, "fp16": "float16"}
MIN_ROUNDS = 3
#: comparisons between the same kernels: judged even where a precision is ill-conditioned (Report.compare)
SAME_KERNELS = ("fused GPU vs fused GPU without the CUDA graph",)
BASELINE = "onnxruntime, input and weights rounded to the half dtype, vs onnxruntime"
PER_GROUP = "each fused CPU group vs its unfused ops"
#: the GPU build's bars: (configuration, the build fused's median is divided by (None: fused's median in ms), at most,
#: for an H200 only). "fused" is the default library (with its CUDA graph)
BARS = (("fp32 batch 1", "unfused", 0.4, False), ("fp32 batch 1", "tvm", 0.8, False),
        ("fp16 batch 1", "unfused", 0.4, False), ("fp16 batch 1", "tvm", 0.8, False),
        ("fp16 batch 1", None, 0.5, True))


def config_key(precision: str, batch: int) -> str:
    return f"{precision} batch {batch}"


def _error_stats():
    try:
        from tvm_fusion.check.numerics import error_stats
    except ImportError:  # in a bundle on the GPU machine: numerics.py is carried beside the runtime
        from numerics import error_stats
    return error_stats


class Report:
    def __init__(self, model: str, arch: str):
        self.data = {"model": model, "arch": arch, "gpu": None, "steps": [], "skipped": [], "configs": {},
                     "numerics": [], "bars": [], "ok": True}

    def step(self, name: str, seconds: float, **detail) -> None:
        self.data["steps"].append({"step": name, "seconds": round(seconds, 2), **detail})
        print(f"[{seconds:6.1f}s] {name}", flush=True)

    def skip(self, name: str, why: str) -> None:
        self.data["skipped"].append({"step": name, "why": why})
        print(f"[ skipped] {name}: {why}", flush=True)

    def compare(self, config: str, pair: str, outputs: list[str], actual, reference, judged: bool | None = None) -> None:
        """One numerics row per output; an fp16 configuration is judged with float16's tolerance. In a
        configuration ill-conditioned for its precision (tvm_fusion.check.half_reference.half_baseline) only the rows
        between the same kernels (SAME_KERNELS) are judged; the others are reported (`judged` False)."""
        cfg = self.data["configs"][config]
        dtype = VERDICT_DTYPE[cfg["precision"]]
        judged = (not cfg.get("ill_conditioned") or pair in SAME_KERNELS) if judged is None else judged
        for name, a, r in zip(outputs, actual, reference):
            s = _error_stats()(a, r, dtype)
            self.row(config, pair, name, s, judged)

    def row(self, config: str, pair: str, output: str, s, judged: bool = True) -> None:
        self.data["numerics"].append({"config": config, "comparison": pair, "output": output, "dtype": s.dtype,
                                      "max_abs": s.max_abs, "max_rel": s.max_rel, "allowed_abs": s.bound,
                                      "elements_off": s.n_bad, "elements": s.size, "ok": bool(s.ok),
                                      "judged": judged})
        self.data["ok"] &= bool(s.ok) or not judged

    def error(self, what: str, err: BaseException) -> None:
        """A step that raised: recorded (the report is still written), and the verdict is FAIL."""
        self.data.setdefault("errors", []).append({"step": what, "error": f"{type(err).__name__}: {err}"})
        self.data["ok"] = False
        print(f"[   error] {what}: {type(err).__name__}: {err}", flush=True)

    def write(self, out: Path) -> tuple[Path, Path]:
        self.data["bars"] = bars(self.data)
        out.mkdir(parents=True, exist_ok=True)
        js, md = out / "gpu_check.json", out / "gpu_check.md"
        js.write_text(json.dumps(self.data, indent=2))
        md.write_text(markdown(self.data))
        return js, md


def bars(d: dict) -> list[dict]:
    """Each bar of BARS with the measured value and pass / fail, or why it was not measured."""
    gpu, rows = d["gpu"] or {}, []
    for key, against, limit, h200 in BARS:
        measure = f"fused / {against}" if against else "fused ms"
        row = {"bar": f"{key}: {measure} <= {limit:g}" + (" on an H200" if h200 else ""), "config": key,
               "measure": measure, "limit": limit, "measured": None}
        cfg = d["configs"].get(key)
        lat = {m: v["median"] for m, v in (cfg or {}).get("latency_ms", {}).items()}
        if cfg is None or cfg.get("skipped"):
            row["status"] = "not measured: " + (cfg["skipped"] if cfg else f"{key} is not in this run's matrix")
        elif not gpu.get("present"):
            row["status"] = f"not measured: no GPU ({gpu.get('why', 'none')})"
        elif not lat:
            row["status"] = "not measured: no latency for this configuration (see errors)"
        elif min(lat["fused"], lat[against or "fused"]) <= 0:
            row["status"] = "not measured: a median of 0 ms (no kernel ran: a stub driver?)"
        else:
            value = lat["fused"] / lat[against] if against else lat["fused"]
            row.update(measured=round(value, 4), status="pass" if value <= limit else "fail")
            if h200 and "H200" not in str(gpu.get("name")):
                row["status"] += f" (measured on {gpu.get('name')}, not an H200)"
        rows.append(row)
    return rows


def _table(head: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(map(str, r)) + " |"
                                                                       for r in rows] + [""]


def markdown(d: dict) -> str:
    gpu = d["gpu"] or {}
    n_ok = sum(r["status"].startswith("pass") for r in d["bars"])
    measured = sum(r["measured"] is not None for r in d["bars"])
    lines = [f"# GPU check: {d['model']} ({d['arch']})", "",
             f"GPU: {gpu.get('name') or 'none'}" + (f" — {gpu['why']}" if gpu.get("why") else ""), "",
             f"**Verdict: {'PASS' if d['ok'] else 'FAIL'}** (numerics"
             + (f" of what ran; {len(d['skipped'])} steps skipped, listed below)" if d["skipped"] else ")")
             + f"; bars: {n_ok} of {measured} measured pass ({len(d['bars']) - measured} not measured)", ""]
    per = {}
    for n in d["numerics"]:
        per.setdefault(n["config"], []).append(n)
    if per:  # which configurations fail: an fp16 model may be over float16's tolerance while fp32 passes
        lines += _table(["config", "comparisons (one per output)", "failed"],
                        [[k, len(rows), ", ".join(sorted({r["comparison"] for r in rows
                                                          if not r["ok"] and r.get("judged", True)})) or "none"]
                         for k, rows in per.items()])
    ill = [k for k, c in d["configs"].items() if c.get("ill_conditioned")]
    if ill:
        lines += [f"Ill-conditioned for their precision: {', '.join(ill)} (rounding the input and weights alone, "
                  "the baseline row, is over the tolerance): their comparisons against the float32 model and "
                  "between different kernels are reported, not judged; fusion is judged per group on the CPU, and "
                  "the GPU library against itself without the CUDA graph.", ""]
    if d.get("errors"):
        lines += ["## Errors", ""] + [f"- {e['step']}: {e['error']}" for e in d["errors"]] + [""]
    lines += ["## Bars", ""]
    lines += _table(["bar", "measured", "status"], [[b["bar"], "-" if b["measured"] is None else b["measured"],
                                                      b["status"]] for b in d["bars"]])
    if d["skipped"]:
        lines += ["## Skipped (not run, not passed)", ""] + [f"- {s['step']}: {s['why']}" for s in d["skipped"]] + [""]
    lines += ["## Steps run", ""] + _table(["step", "seconds"], [[s["step"], s["seconds"]] for s in d["steps"]])
    cfgs = {k: c for k, c in d["configs"].items() if not c.get("skipped")}
    if cfgs:
        lines += ["## Builds", ""]
        lines += _table(["config", "build", "target", "PrimFuncs", "kernel calls", "build s"],
                        [[k, m, b["target"], b["primfuncs"], b["kernel_calls"], b["seconds"]]
                         for k, c in cfgs.items() for m, b in c["builds"].items()])
        lines += ["## Launches per inference (fused)", ""]
        lines += _table(["config", "CUDA graph", "with graph", "without graph", "kernels in the graph"],
                        [[k, "on" if c["cuda_graph"]["enabled"] else f"off ({c['cuda_graph']['reason']})",
                          c["cuda_graph"]["launches_per_inference"]["with_graph"],
                          c["cuda_graph"]["launches_per_inference"]["without_graph"],
                          c["cuda_graph"]["captured_kernels"]] for k, c in cfgs.items()])
    if d["numerics"]:
        lines += ["## Numerics (element by element)", ""]
        lines += _table(["config", "comparison", "output", "tolerance of", "max abs", "max rel", "allowed abs",
                         "elements off", ""],
                        [[n["config"], n["comparison"], n["output"], n["dtype"], f"{n['max_abs']:.3g}",
                          f"{n['max_rel']:.3g}", f"{n['allowed_abs']:.3g}", f"{n['elements_off']} of {n['elements']}",
                          ("ok" if n["ok"] else "FAIL") if n.get("judged", True) else "reported"]
                         for n in d["numerics"]])
    timed = {k: c for k, c in cfgs.items() if c.get("latency_ms")}
    if timed:
        lines += ["## Latency (interleaved rounds, ms)", ""]
        lines += _table(["config", "build", "median", "min", "max", "rounds", "x fused"],
                        [[k, m, f"{v['median']:.3f}", f"{v['min']:.3f}", f"{v['max']:.3f}", v["rounds"],
                          f"{v['median'] / c['latency_ms']['fused']['median']:.2f}"
                          if c["latency_ms"]["fused"]["median"] > 0 else "-"]
                         for k, c in timed.items() for m, v in c["latency_ms"].items()])
    for k, c in cfgs.items():
        if c.get("kernels"):
            total = sum(r["total_ms"] for r in c["kernels"]) or 1.0
            lines += [f"## Per-kernel time, {k} ({c['kernels_device']}, slowest 15)", ""]
            lines += _table(["kernel", "calls", "total ms", "share"],
                            [[r["kernel"], r["calls"], f"{r['total_ms']:.3f}", f"{100 * r['total_ms'] / total:.1f}%"]
                             for r in c["kernels"][:15]])
    return "\n".join(lines)


def detect_gpu(cpu_only: bool) -> dict:
    from tvm_fusion.check.compare import gpu_available

    if cpu_only:
        return {"present": False, "why": "--cpu-only given"}
    ok, why = gpu_available()
    if not ok:
        return {"present": False, "why": why}
    import tvm

    dev = tvm.cuda(0)
    return {"present": True, "name": dev.device_name, "compute": dev.compute_version,
            "arch": "sm_" + dev.compute_version.replace(".", "")}


def interleaved(runs: dict, dev, rounds: int, budget_s: float | None = None) -> dict:
    """runs: build -> (vm, args). Medians of up to `rounds` interleaved timings in ms; after MIN_ROUNDS rounds
    it stops when `budget_s` seconds are spent."""
    times = {m: [] for m in runs}
    start = time.perf_counter()
    for i in range(rounds):  # one run of each build per round: machine noise hits every build alike
        for m, (vm, args) in runs.items():
            times[m].append(vm.time_evaluator("main", dev, number=1, repeat=1)(*args).median * 1e3)
        if budget_s is not None and i + 1 >= MIN_ROUNDS and time.perf_counter() - start > budget_s:
            break
    return {m: {"median": statistics.median(t), "min": min(t), "max": max(t), "rounds": len(t)} for m, t in times.items()}


def time_kernels(vm, dev, tensors, runs: int = 3) -> list[dict]:
    """Each PrimFunc call of one inference timed on its own: sync, run, sync (set_instrument)."""
    totals: dict[str, list[float]] = {}
    start = [0.0]

    def instrument(func, symbol, before_run, ret_value, *args):
        dev.sync()
        if before_run:
            start[0] = time.perf_counter()
        else:
            totals.setdefault(str(symbol), []).append((time.perf_counter() - start[0]) * 1e3)
        return 0

    vm["main"](*tensors)  # warm-up, uninstrumented
    vm.set_instrument(instrument)
    for _ in range(runs):
        vm["main"](*tensors)
    rows = [{"kernel": k, "calls": len(v) // runs, "total_ms": sum(v) / runs} for k, v in totals.items()
            if not k.startswith("vm.builtin")]
    return sorted(rows, key=lambda r: -r["total_ms"])


def arrays(out) -> list:
    """A VM result (a tensor or nested tuples of them) as a flat list of numpy arrays (runtime only)."""
    return [out.numpy()] if hasattr(out, "numpy") else [a for o in out for a in arrays(o)]


def run_gpu_steps(rep: Report, key: str, load, dev, outputs, cpu_out, ref, rounds: int, budget_s: float) -> None:
    """The four GPU steps of one configuration. load(build) -> (vm, args) of a new VM of that build (BUILDS)."""
    cfg = rep.data["configs"][key]
    t0 = time.perf_counter()
    runs = {m: load(m) for m in BUILDS}
    results = {m: arrays(vm["main"](*a)) for m, (vm, a) in runs.items()}  # the first call captures the graph
    rep.step(f"{key}: {GPU_STEPS[0]}", time.perf_counter() - t0)
    t0 = time.perf_counter()
    rep.compare(key, "fused GPU vs unfused GPU", outputs, results["fused"], results["unfused"])
    rep.compare(key, "fused GPU vs fused GPU without the CUDA graph", outputs, results["fused"], results[NO_GRAPH])
    rep.compare(key, "fused GPU vs fused CPU", outputs, results["fused"], cpu_out)
    rep.compare(key, "fused GPU vs onnxruntime", outputs, results["fused"], ref)
    rep.compare(key, "tvm GPU vs onnxruntime", outputs, results["tvm"], ref)
    rep.step(f"{key}: {GPU_STEPS[1]}", time.perf_counter() - t0)
    t0 = time.perf_counter()
    cfg["latency_ms"] = interleaved(runs, dev, rounds, budget_s)
    rep.step(f"{key}: {GPU_STEPS[2]}", time.perf_counter() - t0, rounds=cfg["latency_ms"]["fused"]["rounds"],
             budget_s=round(budget_s, 1))
    del runs, results
    t0 = time.perf_counter()
    vm, args = load(NO_GRAPH)
    cfg["kernels"] = time_kernels(vm, dev, args)
    cfg["kernels_device"] = f"GPU {rep.data['gpu']['name']}, fused library without the CUDA graph"
    rep.step(f"{key}: {GPU_STEPS[3]}", time.perf_counter() - t0)


def run_matrix_on_gpu(rep: Report, keys: list[str], run_one, budget_s: float) -> None:
    """run_one(key, latency_budget_s) for each configuration, each getting an equal share of what is left of
    `budget_s` (less a reserve for its loads, numerics and kernel timing); an error in one is recorded and
    the others still run."""
    deadline = time.perf_counter() + budget_s
    for i, key in enumerate(keys):
        share = (deadline - time.perf_counter()) / (len(keys) - i)
        try:
            run_one(key, max(share * 0.6, 0.0))
        except Exception as err:  # noqa: BLE001 - the next configuration still runs, the report says why
            rep.error(f"{key}: GPU steps", err)


# ---------------------------------------------------------------- inputs regenerated from their seed


def input_spec(names: list[str], arrays_: list, seed: int) -> dict | None:
    """How inputs drawn by tvm_fusion.check.io.random_inputs are drawn again with numpy alone (regenerate_inputs),
    with each array's sha256; None when they are not all such draws (then they travel as arrays)."""
    import numpy as np

    spec = {"seed": seed, "inputs": [{"name": n, "shape": list(a.shape), "dtype": str(a.dtype),
                                      "sha256": _digest(a)} for n, a in zip(names, arrays_)]}
    if all(np.dtype(i["dtype"]).kind == "f" for i in spec["inputs"]):
        try:
            regenerate_inputs(spec)
            return spec
        except ValueError:
            pass
    return None


def regenerate_inputs(spec: dict) -> list:
    """The inputs of input_spec, drawn again (standard normal, in order) and checked against their sha256."""
    import numpy as np

    rng = np.random.default_rng(spec["seed"])
    out = []
    for i in spec["inputs"]:
        a = rng.standard_normal(i["shape"]).astype(i["dtype"])
        if _digest(a) != i["sha256"]:
            raise ValueError(f"input {i['name']} drawn here differs from the build host's (numpy {np.__version__})")
        out.append(a)
    return out


def _digest(a) -> str:
    import numpy as np

    a = np.ascontiguousarray(a)
    return hashlib.sha256(f"{a.dtype}{list(a.shape)}".encode() + a.tobytes()).hexdigest()


# ---------------------------------------------------------------- the build host's side


def plan(model_path: Path, example: str | None, precisions, batches) -> list[dict]:
    """The configurations: {"key", "precision", "batch", "model", "shapes"} or, where a batch cannot be built,
    {"key", ..., "skipped": why}. An example's batch 1 is the example itself, other batches its dynamic-batch
    variant bound to that batch; another model's symbolic batch dim (a dim_param) is bound to each batch."""
    import onnx

    from tvm_fusion.examples import CALIBRATION_BATCH, example_path
    from tvm_fusion.check.io import graph_inputs

    out = []
    for batch in batches:
        model, shapes, why = model_path, None, None
        if example is not None and batch != CALIBRATION_BATCH:
            model = example_path(example, 0, dynamic_batch=True)
        inputs = graph_inputs(onnx.load(str(model), load_external_data=False))
        dims = {i.name: i.type.tensor_type.shape.dim for i in inputs}
        if any(d[0].dim_param for d in dims.values()):
            shapes = {n: (batch, *(x.dim_value for x in d[1:])) for n, d in dims.items() if d[0].dim_param}
        elif any(d[0].dim_value != batch for d in dims.values()):
            why = (f"the model's batch dim is fixed ({', '.join(f'{n}: {d[0].dim_value}' for n, d in dims.items())}); "
                   f"batch {batch} needs a symbolic batch dim (a dim_param) in the model")
        for precision in precisions:
            cfg = {"key": config_key(precision, batch), "precision": precision, "batch": batch, "model": str(model),
                   "shapes": {k: list(v) for k, v in shapes.items()} if shapes else None}
            out.append({**cfg, "skipped": why} if why else cfg)
    return out


def _export_other(built, path: Path, model_path: str, arch: str) -> Path:
    """A CUDA library of an unfused / tvm build with its weights outside, and the manifest entries a bundle
    reads (model, target, inputs, weights, cuda_binary)."""
    from tvm_fusion.deploy.compile import _inputs
    from tvm_fusion.deploy.export import export_library
    from tvm_fusion.frontend.importer import onnx_input_names
    from tvm_fusion.runtime.manifest import CudaBinary, Manifest, WeightsFile, manifest_path_of
    from tvm_fusion.runtime.weights import WEIGHTS_SUFFIX, save_weights

    binary = export_library(built.executable, path, arch)
    weights = path.with_name(path.name + WEIGHTS_SUFFIX)
    size = save_weights(weights, built.weights)
    Manifest(model=model_path, library=str(path), target=str(built.target), arch=arch, extra={"mode": built.mode},
             inputs=_inputs(built, onnx_input_names(built.module)),  # the model's own input names
             weights=WeightsFile(file=weights.name, bytes=size, params=list(built.weights)),
             cuda_binary=CudaBinary(format=binary.fmt, bytes=binary.size, kernels=binary.kernels),
             ).save(manifest_path_of(path))
    return path


def _per_group(rep: Report, key: str, model: str, shapes, precision: str) -> None:
    """A configuration ill-conditioned for its precision: fusion judged per group on the CPU (each fused group
    against its unfused ops at the same precision, differential.check_groups); one row, the worst group."""
    from tvm_fusion.check.differential import check_groups

    t0 = time.perf_counter()
    groups = check_groups(model, "llvm", shapes=shapes, precision=precision)
    bad = groups.failing
    shown = bad[0] if bad else max(groups.groups, key=lambda g: g.stats.max_rel)
    rep.row(key, PER_GROUP, f"{len(groups.groups)} groups; {'first over tolerance' if bad else 'worst'}: "
            f"{shown.describe()}", shown.stats)
    rep.step(f"{key}: per-group check on the CPU ({precision} is ill-conditioned for this model)",
             time.perf_counter() - t0)


def build_config(rep: Report, cfg: dict, out: Path, arch: str, external: bool) -> dict:
    """The CUDA builds of one configuration (their libraries under `out`), the fused CPU build and the CPU
    numerics; returns what the GPU steps need: libraries, builds, inputs, CPU and onnxruntime outputs."""
    import onnx
    import tvm

    from tvm_fusion.frontend import importer as frontend
    from tvm_fusion._tvm import relax
    from tvm_fusion.build.builder import build, resolve_target
    from tvm_fusion.check.compare import input_tensors, run_onnxruntime
    from tvm_fusion.deploy.compile import compile_model
    from tvm_fusion.build.mixed_precision import convert

    key, precision, model = cfg["key"], cfg["precision"], cfg["model"]
    shapes = {k: tuple(v) for k, v in cfg["shapes"].items()} if cfg["shapes"] else None
    entry = rep.data["configs"][key] = {"precision": precision, "batch": cfg["batch"], "model": Path(model).name,
                                        "shapes": cfg["shapes"], "builds": {}, "libraries": {}}
    stem = out / f"{Path(model).stem}_{precision}_b{cfg['batch']}"
    libs, builds = {}, {}
    for mode, graph in (("fused", True), (NO_GRAPH, False)):
        t0 = time.perf_counter()
        libs[mode] = Path(f"{stem}_{'fused' if graph else 'fused_no_graph'}.so")
        result = compile_model(model, libs[mode], "cuda", arch=arch, shapes=shapes, precision=precision,
                               counts_of_other_builds=False, verify=False, external_weights=external,
                               cuda_graph=graph)  # the same weight tensors every call (run_gpu_steps)
        b = result.manifest["cuda_binary"]
        rep.step(f"{key}: build + export {mode} for CUDA", time.perf_counter() - t0, library=str(libs[mode]),
                 kernels=len(b["kernels"]), code=f"{b['format']} ({b['compiler']}, compiled at {b['compiled_at']})")
        entry["builds"][mode] = {"target": arch, **result.manifest["builds"]["fused"],
                                 "seconds": round(result.seconds, 2)}
        if graph:
            entry["cuda_graph"] = result.manifest["cuda_graph"]
    proto = onnx.load(model)
    mod = convert(frontend.import_onnx(proto, shapes), precision)
    tgt = resolve_target("cuda", arch)
    for mode in ("unfused", "tvm"):
        t0 = time.perf_counter()
        builds[mode] = build(mod, tgt, mode, external_weights=external)
        if external:
            libs[mode] = _export_other(builds[mode], Path(f"{stem}_{mode}.so"), model, arch)
        entry["builds"][mode] = {"target": arch, "primfuncs": builds[mode].primfuncs,
                                 "kernel_calls": builds[mode].kernel_calls,
                                 "seconds": round(builds[mode].build_seconds, 2)}
        rep.step(f"{key}: build {mode} for CUDA", time.perf_counter() - t0)
    t0 = time.perf_counter()
    cpu = build(mod, "llvm", "fused")
    entry["builds"]["fused (CPU)"] = {"target": "llvm", "primfuncs": cpu.primfuncs, "kernel_calls": cpu.kernel_calls,
                                      "seconds": round(cpu.build_seconds, 2)}
    rep.step(f"{key}: build fused for the CPU", time.perf_counter() - t0)
    t0 = time.perf_counter()
    inputs, cpu_tensors = input_tensors(proto, shapes, 0, tvm.cpu(0))
    cpu_out = arrays(relax.VirtualMachine(cpu.executable, tvm.cpu(0))["main"](*cpu_tensors))
    sess, _ = run_onnxruntime(proto, inputs)
    ref = sess.run(None, inputs)
    outputs = [o.name for o in proto.graph.output]
    if precision != "fp32":  # is float16's tolerance against the float32 model meaningful here?
        from tvm_fusion.check.half_reference import half_baseline_outputs

        rep.compare(key, BASELINE, outputs, half_baseline_outputs(proto, inputs, precision), ref, judged=False)
        entry["ill_conditioned"] = not all(n["ok"] for n in rep.data["numerics"]
                                           if n["config"] == key and n["comparison"] == BASELINE)
    rep.compare(key, "fused CPU vs onnxruntime", outputs, cpu_out, ref)
    if entry.get("ill_conditioned"):
        _per_group(rep, key, model, shapes, precision)
    rep.step(f"{key}: run the CPU build and onnxruntime", time.perf_counter() - t0)
    entry["libraries"] = {m: p.name for m, p in libs.items()}
    entry["input_names"] = [i.name for i in proto.graph.input if i.name in inputs]  # the VM's order
    return {"libs": libs, "builds": builds, "inputs": [t.numpy() for t in cpu_tensors], "cpu": cpu_out, "ref": ref,
            "outputs": outputs, "cpu_vm": (cpu, cpu_tensors)}


def write_bundle(rep: Report, dest: Path, done: dict, python: str | None) -> None:
    """The runtime-only bundle of the GPU check (module docstring); fails when over 64 MiB."""
    import shutil

    import numpy as np

    from tvm_fusion.check import numerics
    from tvm_fusion.deploy.bundle import MAX_BYTES, bundle
    from tvm_fusion.examples import example_of

    here = Path(__file__).parent
    if str(here) not in sys.path:  # loaded by path (tests) rather than run from benchmarks/
        sys.path.insert(0, str(here))
    from gpu_bundle import bundle_with_recipes

    t0 = time.perf_counter()
    libs = [p for r in done.values() for p in r["libs"].values()]
    # an example's weights travel as a recipe over its seed, others as files
    write = bundle_with_recipes if example_of(rep.data["model"]) is not None else bundle
    result = write(libs[0], dest, python, numpy_wheel=True, others=libs[1:])
    for f in (here / "gpu_check.py", here / "gpu_check_device.py"):
        shutil.copy2(f, dest / f.name)
    shutil.copy2(numerics.__file__, dest / "site" / "numerics.py")
    refs = {}
    for key, r in done.items():
        cfg = rep.data["configs"][key]
        spec = input_spec(cfg["input_names"], r["inputs"], 0)
        cfg["inputs"] = spec or {"stored": True}
        if spec is None:
            refs.update({f"{key}|input{i}": a for i, a in enumerate(r["inputs"])})
        refs.update({f"{key}|cpu{i}": a for i, a in enumerate(r["cpu"])})
        refs.update({f"{key}|ort{i}": a for i, a in enumerate(r["ref"])})
    np.savez(dest / "references.npz", **refs)
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    rep.data["bundle"] = {"path": str(dest), "bytes": size, "python": result.python, "notes": result.notes,
                          "recipes": len(list(dest.glob("*.recipe.json")))}
    (dest / "gpu_check_host.json").write_text(json.dumps(rep.data, indent=2))
    rep.step(f"write the GPU machine's bundle ({size / 2**20:.1f} MiB)", time.perf_counter() - t0, path=str(dest))
    if size > MAX_BYTES:
        rep.data["ok"] = False
        print(f"error: the bundle is {size / 2**20:.1f} MiB, over the {MAX_BYTES >> 20} MiB a GPU machine takes")


def _list(flag: str, text: str, allowed=None) -> list:
    """A comma-separated --precisions (of `allowed`) or --batches (positive integers); exit 2 on anything else."""
    try:
        values = [v if allowed else int(v) for v in text.split(",") if v]
    except ValueError:
        values = []
    if not values or any(v not in allowed if allowed else v < 1 for v in values):
        print(f"error: {flag} {text!r}: expected a comma-separated list of "
              + (", ".join(allowed) if allowed else "positive batch sizes, e.g. 1,8"), file=sys.stderr)
        sys.exit(2)
    return values


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for gpu_check.json / gpu_check.md and the libraries")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--example", default="resnet50", help="example model (default: resnet50)")
    src.add_argument("--model", help="an ONNX model instead of the example (batch 8 needs a symbolic batch dim)")
    ap.add_argument("--arch", default=None, help="CUDA arch (default: the GPU's, else sm_90)")
    ap.add_argument("--precisions", default="fp32,fp16", help="the matrix's precisions (default: fp32,fp16)")
    ap.add_argument("--batches", default="1,8", help="the matrix's batch sizes (default: 1,8)")
    ap.add_argument("--rounds", type=int, default=20, help="interleaved timing rounds on the GPU (at most)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="seconds the GPU steps may take (default 420)")
    ap.add_argument("--cpu-only", action="store_true", help="run only the parts that need no GPU")
    ap.add_argument("--bundle", metavar="DIR", help="also write a runtime-only bundle of the GPU steps for a GPU "
                    "machine without TVM (an example model: its weights travel as a recipe)")
    ap.add_argument("--python", default=None, help="the GPU machine's Python for --bundle (default: 3.12)")
    args = ap.parse_args(argv)
    precisions = _list("--precisions", args.precisions, PRECISIONS)
    batches = _list("--batches", args.batches)

    import tvm

    from tvm_fusion._tvm import relax
    from tvm_fusion.examples import example_path
    from tvm_fusion.runtime.weights import load_weights

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_path = Path(args.model) if args.model else example_path(args.example, 0)
    gpu = detect_gpu(args.cpu_only)
    arch = args.arch or gpu.get("arch") or "sm_90"
    rep = Report(model_path.name, arch)
    rep.data["gpu"] = gpu
    rep.data["matrix"] = {"precisions": precisions, "batches": batches, "builds": list(BUILDS)}
    external = bool(args.bundle)  # a bundle carries the weights as a recipe, so every library leaves them out
    configs = plan(model_path, None if args.model else args.example, precisions, batches)
    done = {}
    for cfg in configs:
        if cfg.get("skipped"):
            rep.data["configs"][cfg["key"]] = {"precision": cfg["precision"], "batch": cfg["batch"],
                                               "skipped": cfg["skipped"]}
            rep.skip(f"{cfg['key']}: every step", cfg["skipped"])
            continue
        done[cfg["key"]] = build_config(rep, cfg, out, arch, external)
    if args.bundle and done:
        write_bundle(rep, Path(args.bundle), done, args.python or "3.12")

    if not gpu["present"]:
        for name in GPU_STEPS:
            rep.skip(name, gpu["why"] + (f" (configurations: {', '.join(done)})" if done else ""))
        for key, r in list(done.items())[:1]:
            t0 = time.perf_counter()
            cpu, tensors = r["cpu_vm"]
            cfg = rep.data["configs"][key]
            cfg["kernels"] = time_kernels(relax.VirtualMachine(cpu.executable, tvm.cpu(0)), tvm.cpu(0), tensors, runs=1)
            cfg["kernels_device"] = "CPU build: the per-kernel timing path, exercised without a GPU"
            rep.step(f"{key}: per-kernel timing of the CPU build (instrumented VM)", time.perf_counter() - t0)
    else:
        dev = tvm.cuda(0)

        def run_one(key, budget_s):
            r = done[key]
            tensors = [tvm.runtime.tensor(a, dev) for a in r["inputs"]]
            weights = {}  # one set of weight tensors per library, the same every call (the CUDA graph keeps them)

            def load(mode):
                if mode in r["builds"]:
                    built = r["builds"][mode]
                    if not external:
                        return relax.VirtualMachine(built.executable, dev), tensors
                path = str(r["libs"][mode])
                if path not in weights:
                    weights[path] = load_weights(path, dev)
                return relax.VirtualMachine(tvm.runtime.load_module(path), dev), tensors + weights[path]

            run_gpu_steps(rep, key, load, dev, r["outputs"], r["cpu"], r["ref"], args.rounds, budget_s)

        run_matrix_on_gpu(rep, list(done), run_one, args.budget_s)
    js, md = rep.write(out)
    print(f"wrote {js} and {md}: {'PASS' if rep.data['ok'] else 'FAIL'}"
          + (f"; skipped {len(rep.data['skipped'])} steps" if rep.data["skipped"] else ""))
    return 0 if rep.data["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
