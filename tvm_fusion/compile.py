"""ONNX model -> fused library + JSON manifest (groups, rules, ONNX nodes, kernels, kernel counts)."""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import onnx

from . import _tvm, frontend, pipeline
from .build import build, count_kernel_calls, resolve_target
from .export import cuda_source, export_library
from .rules import RuleSet
from .simplify import record_of as simplify_record
from .verify import skipped, verify_fused

__all__ = ["CompileResult", "compile_model", "kernel_counts"]


@dataclass
class CompileResult:
    library: Path
    manifest_path: Path
    manifest: dict
    seconds: float

    def __str__(self) -> str:
        m = self.manifest
        fired = ", ".join(f"{k} {v}" for k, v in m["rule_counts"].items() if v) or "none"
        b = m["builds"]
        return "\n".join([
            f"wrote {self.library} ({m['target']}) in {self.seconds:.1f}s",
            f"      {self.manifest_path}",
            f"fused groups: {len(m['groups'])} ({fired})",
            _verified(m["verification"]),
            "kernel calls per inference: " + ", ".join(f"{k} {v['kernel_calls']}" for k, v in b.items()),
            *( [f"GPU code: {m['cuda_binary']['format']} for {m['arch']}, {m['cuda_binary']['bytes']} bytes "
                f"(nvcc {m['cuda_binary']['nvcc_seconds']:.1f}s)"] if m.get("cuda_binary") else []),
        ])


def _verified(v: dict) -> str:
    if not v["verified"]:
        return f"not verified ({v['reason']})"
    worst = max((o["max_rel"] for o in v["outputs"].values()), default=0.0)
    return f"verified: {v['method']}; worst max rel error {worst:.2g} ({v['seconds']:.1f}s)"


def kernel_counts(mod, target, mode: str) -> dict:
    """PrimFuncs and kernel calls of `mode` without compiling (legalize stage only)."""
    with target, _tvm.tvm.transform.PassContext(opt_level=3):
        legal = pipeline.sequential(pipeline.legalize_passes(mode, target), mode)(mod)
    primfuncs, calls = count_kernel_calls(legal)
    return {"primfuncs": primfuncs, "kernel_calls": calls}


def _kernels(source: str) -> list[str]:
    """CUDA kernel names of a source, each once (declarations and definitions both match)."""
    found = re.findall(r"__global__\s+void\s+(?:__launch_bounds__\(\d+\)\s+)?(\w+)\s*\(", source)
    return list(dict.fromkeys(found))


class _progress:
    """A progress bar over named steps on a terminal (tqdm), silent elsewhere."""

    def __init__(self, steps: list[str]):
        from tqdm import tqdm

        self.steps = steps
        self.bar = tqdm(total=len(steps), desc=steps[0], leave=False, disable=None)

    def __enter__(self):
        return self

    def update(self) -> None:
        self.bar.update()
        if self.bar.n < len(self.steps):
            self.bar.set_description(self.steps[self.bar.n])

    def __exit__(self, *exc) -> None:
        self.bar.close()


def compile_model(model, output, target="cuda", *, arch: str = "sm_90", shapes: dict | None = None,
                  rules: RuleSet | None = None, counts_of_other_builds: bool = True, verify: bool = True,
                  seed: int = 0) -> CompileResult:
    """Fuse and build `model` for `target`, verify it against onnxruntime on inputs seeded with `seed`
    (verify.py: nothing is written when it differs), export the library to `output`, write `<output>.json`."""
    start = time.perf_counter()
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    name = str(model) if not isinstance(model, onnx.ModelProto) else (model.graph.name or "<ModelProto>")
    tgt = resolve_target(target, arch)
    steps = ["import", "fuse + build", "verify" if verify else "(not verified)",
             "compile GPU code + export" if tgt.kind.name == "cuda" else "export"]
    if counts_of_other_builds:
        steps.append("count unfused / tvm kernels")
    partial = output.with_name(f".partial-{os.getpid()}-{output.name}")  # renamed only once verified
    with _progress(steps) as bar:
        proto = frontend.load_onnx(model)
        mod = frontend.import_onnx(proto, shapes)
        bar.update()
        built = build(mod, tgt, "fused", rules=rules)
        bar.update()
        verification = verify_fused(proto, built, shapes=shapes, rules=rules, seed=seed) if verify else skipped()
        bar.update()
        try:
            binary = export_library(built.executable, partial, arch)
            os.replace(partial, output)
        finally:
            partial.unlink(missing_ok=True)
        kernels = _kernels(cuda_source(built.executable)) if tgt.kind.name == "cuda" else []
        bar.update()
        builds = {}
        if counts_of_other_builds:
            builds = {m: kernel_counts(mod, tgt, m) for m in ("unfused", "tvm")}
            bar.update()
    builds["fused"] = {"primfuncs": built.primfuncs, "kernel_calls": built.kernel_calls}
    groups = []
    for g in built.fused.groups:
        entry = {"rule": g.rule, "function": g.function, "onnx_nodes": g.onnx_nodes,
                 "attrs": {k: list(v) if isinstance(v, tuple) else v for k, v in g.attrs.items()}}
        if kernels:
            entry["kernels"] = [k for k in kernels if re.fullmatch(rf"{re.escape(g.function)}_kernel\d*", k)]
        groups.append(entry)
    manifest = {
        "model": name,
        "library": str(output),
        "target": str(tgt),
        "arch": arch if tgt.kind.name == "cuda" else None,
        "tvm_version": _tvm.TVM_VERSION,
        "rule_counts": built.counts,
        "groups": groups,
        "builds": builds,
        "declined": [asdict(d) for d in built.fused.decisions if d.reason],
        "verification": verification.manifest(),
        "simplify": simplify_record(mod),
    }
    if binary is not None:
        manifest["cuda_binary"] = {"format": binary.fmt, "bytes": binary.size, "nvcc_seconds": binary.compile_seconds}
    manifest_path = output.with_name(output.name + ".json")
    manifest_path.write_text(json.dumps(manifest, indent=2))
    return CompileResult(output, manifest_path, manifest, time.perf_counter() - start)
