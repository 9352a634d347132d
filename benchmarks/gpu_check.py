"""One GPU check: build and load the fused CUDA library, check it on the GPU, time it, report.

    python benchmarks/gpu_check.py --out DIR [--example resnet50 | --model m.onnx] [--arch sm_90] [--cpu-only]
    python benchmarks/gpu_check.py --out DIR --bundle B [--python 3.12]   # for a GPU machine without TVM
    python B/gpu_check_device.py --out DIR                                # there: the GPU steps, runtime only

On a machine with a CUDA GPU (and TVM + tvm_fusion installed), in a few minutes:
  1. builds the fused library (`compile_model`, the same as `tvm-fusion compile --target cuda`) and loads
     it with the TVM runtime on the GPU; builds the unfused and TVM-default CUDA builds and a fused CPU build
  2. numerics, element by element (testing.TOLERANCES): fused library on the GPU vs unfused on the GPU,
     vs the CPU build, vs onnxruntime
  3. latency: fused (with and without its CUDA graph) / unfused / tvm on the GPU, interleaved rounds, medians
  4. each fused kernel timed on its own (the library without the graph; VM set_instrument, device
     synchronised around every call)
and writes DIR/gpu_check.json and DIR/gpu_check.md. Without a GPU (or with --cpu-only) it runs every
part that needs none (the builds, the CPU build against onnxruntime, per-kernel timing of the CPU build)
and lists each GPU step under "skipped" with the reason. Exit status: 0 when everything that ran passed.

With --bundle B it also writes a runtime-only bundle for a GPU machine that has Python, a CUDA driver and
no TVM (tvm_fusion.bundle, at most 64 MiB): the fused (with and without its CUDA graph), unfused and tvm
CUDA libraries with their weights as recipes over the example's seed (weights_recipe.py: ResNet-50's 102 MB of weights regenerated there with
numpy, each checked by sha256), the TVM runtime, numpy's wheel, the inputs and the CPU / onnxruntime outputs
(references.npz), this report so far, and benchmarks/gpu_check_device.py, which runs the four GPU steps
there and completes the report.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

GPU_STEPS = ("load the library on the GPU", "GPU numerics (fused vs unfused vs CPU vs onnxruntime)",
             "GPU latency (fused / unfused / tvm, interleaved medians)", "GPU per-kernel timing (fused)")


class Report:
    def __init__(self, model: str, arch: str):
        self.data = {"model": model, "arch": arch, "gpu": None, "steps": [], "skipped": [], "builds": {},
                     "numerics": [], "latency_ms": {}, "kernels": [], "ok": True}

    def step(self, name: str, seconds: float, **detail) -> None:
        self.data["steps"].append({"step": name, "seconds": round(seconds, 2), **detail})
        print(f"[{seconds:6.1f}s] {name}", flush=True)

    def skip(self, name: str, why: str) -> None:
        self.data["skipped"].append({"step": name, "why": why})
        print(f"[ skipped] {name}: {why}", flush=True)

    def compare(self, pair: str, outputs: list[str], actual, reference) -> None:
        try:
            from tvm_fusion.numerics import error_stats
        except ImportError:  # in a bundle on the GPU machine: numerics.py is carried beside the runtime
            from numerics import error_stats

        for name, a, r in zip(outputs, actual, reference):
            s = error_stats(a, r)
            self.data["numerics"].append({"comparison": pair, "output": name, "max_abs": s.max_abs,
                                          "max_rel": s.max_rel, "allowed_abs": s.bound, "ok": bool(s.ok)})
            self.data["ok"] &= bool(s.ok)

    def write(self, out: Path) -> tuple[Path, Path]:
        out.mkdir(parents=True, exist_ok=True)
        js, md = out / "gpu_check.json", out / "gpu_check.md"
        js.write_text(json.dumps(self.data, indent=2))
        md.write_text(markdown(self.data))
        return js, md


def markdown(d: dict) -> str:
    gpu = d["gpu"] or {}
    lines = [f"# GPU check: {d['model']} ({d['arch']})", "",
             f"GPU: {gpu.get('name') or 'none'}" + (f" — {gpu['why']}" if gpu.get("why") else ""), "",
             f"**Verdict: {'PASS' if d['ok'] else 'FAIL'}**"
             + (f" (of what ran; {len(d['skipped'])} steps skipped, listed below)" if d["skipped"] else ""), ""]
    if d["skipped"]:
        lines += ["## Skipped (not run, not passed)", ""] + [f"- {s['step']}: {s['why']}" for s in d["skipped"]] + [""]
    lines += ["## Steps run", "", "| step | seconds |", "|---|---|"]
    lines += [f"| {s['step']} | {s['seconds']} |" for s in d["steps"]] + [""]
    if d["builds"]:
        lines += ["## Builds", "", "| build | target | PrimFuncs | kernel calls | build s |", "|---|---|---|---|---|"]
        lines += [f"| {k} | {b['target']} | {b['primfuncs']} | {b['kernel_calls']} | {b['seconds']} |"
                  for k, b in d["builds"].items()] + [""]
    if d["numerics"]:
        lines += ["## Numerics (element by element)", "", "| comparison | output | max abs | max rel | allowed abs | |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {n['comparison']} | {n['output']} | {n['max_abs']:.3g} | {n['max_rel']:.3g} | "
                  f"{n['allowed_abs']:.3g} | {'ok' if n['ok'] else 'FAIL'} |" for n in d["numerics"]] + [""]
    if d.get("cuda_graph"):
        g, n = d["cuda_graph"], d["cuda_graph"]["launches_per_inference"]
        lines += ["## CUDA graph", "", (f"On: {n['with_graph']} launches per inference with it ({g['captured_kernels']} "
                  f"kernels replayed by {g['graphs']} graph launch), {n['without_graph']} without." if g["enabled"]
                  else f"Off ({g['reason']}): {n['without_graph']} launches per inference."), ""]
    if d["latency_ms"]:
        lines += ["## Latency (interleaved rounds)", "", "| build | median ms | min ms | max ms |", "|---|---|---|---|"]
        lines += [f"| {k} | {v['median']:.3f} | {v['min']:.3f} | {v['max']:.3f} |" for k, v in d["latency_ms"].items()]
        lines += [""]
    if d["kernels"]:
        lines += [f"## Per-kernel time ({d['kernels_device']}, slowest first)", "",
                  "| kernel | calls | total ms | share |", "|---|---|---|---|"]
        total = sum(k["total_ms"] for k in d["kernels"]) or 1.0
        lines += [f"| {k['kernel']} | {k['calls']} | {k['total_ms']:.3f} | {100 * k['total_ms'] / total:.1f}% |"
                  for k in d["kernels"][:30]] + [""]
    return "\n".join(lines)


def detect_gpu(cpu_only: bool) -> dict:
    from tvm_fusion.compare import gpu_available

    if cpu_only:
        return {"present": False, "why": "--cpu-only given"}
    ok, why = gpu_available()
    if not ok:
        return {"present": False, "why": why}
    import tvm

    dev = tvm.cuda(0)
    return {"present": True, "name": dev.device_name, "compute": dev.compute_version,
            "arch": "sm_" + dev.compute_version.replace(".", "")}


def interleaved(runs: dict, dev, rounds: int) -> dict:
    """runs: build -> (vm, args). Medians of `rounds` interleaved timings in ms."""
    times = {m: [] for m in runs}
    for _ in range(rounds):  # one run of each build per round: machine noise hits every build alike
        for m, (vm, args) in runs.items():
            times[m].append(vm.time_evaluator("main", dev, number=1, repeat=1)(*args).median * 1e3)
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


NO_GRAPH = "fused (no CUDA graph)"


def run_gpu_steps(rep: Report, runs: dict, fresh_fused, dev, outputs, cpu_out, ref, rounds: int) -> None:
    """The four GPU steps. runs: build -> (vm, args) for fused, NO_GRAPH, unfused, tvm; fresh_fused() ->
    (vm, args) of another fused VM without the graph, for the per-kernel timing (instrumented)."""
    t0 = time.perf_counter()
    results = {m: arrays(vm["main"](*a)) for m, (vm, a) in runs.items()}
    rep.step(GPU_STEPS[0], time.perf_counter() - t0)
    t0 = time.perf_counter()
    rep.compare("fused GPU vs unfused GPU", outputs, results["fused"], results["unfused"])
    rep.compare("fused GPU vs fused GPU without the CUDA graph", outputs, results["fused"], results[NO_GRAPH])
    rep.compare("fused GPU vs fused CPU", outputs, results["fused"], cpu_out)
    rep.compare("fused GPU vs onnxruntime", outputs, results["fused"], ref)
    rep.compare("tvm GPU vs onnxruntime", outputs, results["tvm"], ref)
    rep.step(GPU_STEPS[1], time.perf_counter() - t0)
    t0 = time.perf_counter()
    rep.data["latency_ms"] = interleaved(runs, dev, rounds)
    rep.step(GPU_STEPS[2], time.perf_counter() - t0)
    t0 = time.perf_counter()
    vm, args = fresh_fused()
    rep.data["kernels"] = time_kernels(vm, dev, args)
    rep.data["kernels_device"] = f"GPU {rep.data['gpu']['name']}, fused library without the CUDA graph"
    rep.step(GPU_STEPS[3], time.perf_counter() - t0)


def _export_other(built, path: Path, model_path: Path, arch: str) -> Path:
    """A CUDA library of an unfused / tvm build with its weights outside, and the manifest entries a bundle
    reads (model, target, inputs, weights, cuda_binary)."""
    from tvm_fusion.compile import _inputs
    from tvm_fusion.export import export_library
    from tvm_fusion.weights import WEIGHTS_SUFFIX, save_weights

    binary = export_library(built.executable, path, arch)
    weights = path.with_name(path.name + WEIGHTS_SUFFIX)
    size = save_weights(weights, built.weights)
    manifest = {"model": str(model_path), "target": str(built.target), "arch": arch, "mode": built.mode,
                "inputs": _inputs(built),
                "weights": {"file": weights.name, "bytes": size, "params": list(built.weights)},
                "cuda_binary": {"format": binary.fmt, "bytes": binary.size, "kernels": binary.kernels}}
    path.with_name(path.name + ".json").write_text(json.dumps(manifest, indent=2))
    return path


def write_bundle(rep: Report, dest: Path, libs: dict, inputs: list, cpu_out, ref, python: str | None) -> None:
    """The runtime-only bundle of the GPU check (module docstring); fails when over 64 MiB."""
    import shutil

    import numpy as np

    from tvm_fusion import numerics
    from tvm_fusion.bundle import MAX_BYTES, bundle

    t0 = time.perf_counter()
    from tvm_fusion.examples import example_of

    recipe = example_of(rep.data["model"]) is not None  # an example's weights travel as a recipe, others as files
    result = bundle(libs["fused"], dest, python, recipe=recipe, numpy_wheel=True,
                    others=[v for k, v in libs.items() if k != "fused"])
    here = Path(__file__).parent
    for f in (here / "gpu_check.py", here / "gpu_check_device.py"):
        shutil.copy2(f, dest / f.name)
    shutil.copy2(numerics.__file__, dest / "site" / "numerics.py")
    np.savez(dest / "references.npz", **{f"input{i}": a for i, a in enumerate(inputs)},
             **{f"cpu{i}": a for i, a in enumerate(cpu_out)}, **{f"ort{i}": a for i, a in enumerate(ref)})
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    rep.data["bundle"] = {"path": str(dest), "bytes": size, "libraries": {k: v.name for k, v in libs.items()},
                          "python": result.python, "notes": result.notes}
    (dest / "gpu_check_host.json").write_text(json.dumps(rep.data, indent=2))
    rep.step(f"write the GPU machine's bundle ({size / 2**20:.1f} MiB)", time.perf_counter() - t0, path=str(dest))
    if size > MAX_BYTES:
        rep.data["ok"] = False
        print(f"error: the bundle is {size / 2**20:.1f} MiB, over the {MAX_BYTES >> 20} MiB a GPU machine takes")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for gpu_check.json / gpu_check.md and the library")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--example", default="resnet50", help="example model (default: resnet50)")
    src.add_argument("--model", help="an ONNX model instead of the example")
    ap.add_argument("--arch", default=None, help="CUDA arch (default: the GPU's, else sm_90)")
    ap.add_argument("--rounds", type=int, default=20, help="interleaved timing rounds on the GPU")
    ap.add_argument("--cpu-only", action="store_true", help="run only the parts that need no GPU")
    ap.add_argument("--bundle", metavar="DIR", help="also write a runtime-only bundle of the GPU steps for a GPU "
                    "machine without TVM (an example model: its weights travel as a recipe)")
    ap.add_argument("--python", default=None, help="the GPU machine's Python for --bundle (default: 3.12)")
    args = ap.parse_args(argv)

    import onnx
    import tvm

    from tvm_fusion import frontend
    from tvm_fusion._tvm import relax
    from tvm_fusion.build import build, resolve_target
    from tvm_fusion.compare import input_tensors, run_onnxruntime
    from tvm_fusion.compile import compile_model
    from tvm_fusion.examples import example_path
    from tvm_fusion.weights import load_weights

    out = Path(args.out)
    model_path = Path(args.model) if args.model else example_path(args.example, 0)
    gpu = detect_gpu(args.cpu_only)
    arch = args.arch or gpu.get("arch") or "sm_90"
    rep = Report(model_path.name, arch)
    rep.data["gpu"] = gpu
    proto = onnx.load(str(model_path))
    outputs = [o.name for o in proto.graph.output]
    external = bool(args.bundle)  # a bundle carries the weights as a recipe, so every library leaves them out

    t0 = time.perf_counter()
    lib = out / (model_path.stem + "_fused.so")
    result = compile_model(str(model_path), lib, "cuda", arch=arch, counts_of_other_builds=False,
                           external_weights=external, cuda_graph=True)  # the same weights every call, below
    b = result.manifest["cuda_binary"]
    rep.step("build + export the fused CUDA library", time.perf_counter() - t0, library=str(lib),
             kernels=len(b["kernels"]), code=f"{b['format']} ({b['compiler']}, compiled at {b['compiled_at']})")
    t0 = time.perf_counter()
    lib_ng = out / (model_path.stem + "_fused_no_graph.so")
    compile_model(str(model_path), lib_ng, "cuda", arch=arch, counts_of_other_builds=False, verify=False,
                  external_weights=external, cuda_graph=False)
    rep.step("build + export it without the CUDA graph", time.perf_counter() - t0, library=str(lib_ng))
    rep.data["cuda_graph"] = result.manifest["cuda_graph"]
    mod = frontend.import_onnx(proto)
    tgt = resolve_target("cuda", arch)
    builds = {"fused": None}
    libs = {"fused": lib, NO_GRAPH: lib_ng}
    for mode in ("unfused", "tvm"):
        t0 = time.perf_counter()
        builds[mode] = build(mod, tgt, mode, external_weights=external)
        if external:
            libs[mode] = _export_other(builds[mode], out / f"{model_path.stem}_{mode}.so", model_path, arch)
        rep.step(f"build {mode} for CUDA", time.perf_counter() - t0)
    t0 = time.perf_counter()
    cpu = build(mod, "llvm", "fused")
    rep.step("build fused for the CPU", time.perf_counter() - t0)
    rep.data["builds"] = {m: {"target": arch, "primfuncs": bb.primfuncs, "kernel_calls": bb.kernel_calls,
                              "seconds": round(bb.build_seconds, 2)} for m, bb in builds.items() if bb}
    rep.data["builds"]["fused"] = {"target": arch, **result.manifest["builds"]["fused"],
                                   "seconds": round(result.seconds, 2)}
    rep.data["builds"]["fused (CPU)"] = {"target": "llvm", "primfuncs": cpu.primfuncs,
                                         "kernel_calls": cpu.kernel_calls, "seconds": round(cpu.build_seconds, 2)}

    t0 = time.perf_counter()
    inputs, cpu_tensors = input_tensors(proto, None, 0, tvm.cpu(0))
    cpu_vm = relax.VirtualMachine(cpu.executable, tvm.cpu(0))
    cpu_out = arrays(cpu_vm["main"](*cpu_tensors))
    sess, _ = run_onnxruntime(proto, inputs)
    ref = sess.run(None, inputs)
    rep.compare("fused CPU vs onnxruntime", outputs, cpu_out, ref)
    rep.step("run the CPU build and onnxruntime", time.perf_counter() - t0)
    if args.bundle:
        write_bundle(rep, Path(args.bundle), libs, [t.numpy() for t in cpu_tensors], cpu_out, ref,
                     args.python or "3.12")

    if not gpu["present"]:
        for name in GPU_STEPS:
            rep.skip(name, gpu["why"])
        t0 = time.perf_counter()
        rep.data["kernels"] = time_kernels(cpu_vm, tvm.cpu(0), cpu_tensors, runs=1)
        rep.data["kernels_device"] = "CPU build: the per-kernel timing path, exercised without a GPU"
        rep.step("per-kernel timing of the CPU build (instrumented VM)", time.perf_counter() - t0)
    else:
        dev = tvm.cuda(0)
        _, tensors = input_tensors(proto, None, 0, dev)

        def library(mode):
            path = str(libs[mode])
            return relax.VirtualMachine(tvm.runtime.load_module(path), dev), tensors + load_weights(path, dev)

        def other(mode):
            return library(mode) if external else (relax.VirtualMachine(builds[mode].executable, dev), tensors)

        runs = {"fused": library("fused"), NO_GRAPH: library(NO_GRAPH), "unfused": other("unfused"), "tvm": other("tvm")}
        run_gpu_steps(rep, runs, lambda: library(NO_GRAPH), dev, outputs, cpu_out, ref, args.rounds)
    js, md = rep.write(out)
    print(f"wrote {js} and {md}: {'PASS' if rep.data['ok'] else 'FAIL'}"
          + (f"; skipped {len(rep.data['skipped'])} GPU steps" if rep.data["skipped"] else ""))
    return 0 if rep.data["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
