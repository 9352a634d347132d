"""ONNX model -> fused library + JSON manifest (groups, rules, ONNX nodes, kernels, kernel counts)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import onnx

from tvm_fusion import _tvm, cpu_features
from tvm_fusion.frontend import importer as frontend
from tvm_fusion.build import cuda_graph as graphs
from tvm_fusion._tvm import relax, tvm
from tvm_fusion.build.builder import build, count_kernel_calls, legalize, resolve_target
from tvm_fusion.check.prepared import PreparedModel, prepare
from tvm_fusion.console import progress
from tvm_fusion.errors import FusionError
from tvm_fusion.deploy.export import export_library
from tvm_fusion.fusion.fuse import ELEMENTS_PER_BATCH_ATTR
from tvm_fusion.hardware import cuda_facts
from tvm_fusion.runtime.manifest import CudaBinary, DimLimit, Manifest, TensorSpec, WeightsFile, manifest_path_of
from tvm_fusion.precision import PRECISIONS, check_precision
from tvm_fusion.rules import RuleSet, dim_name
from tvm_fusion.frontend.simplify import record_of as simplify_record
from tvm_fusion.build.tune import TuneOptions
from tvm_fusion.build.tune import check_options as check_tune_options
from tvm_fusion.check.verify import DEFAULT_SEARCH_TIMEOUT, skipped, verify_fused
from tvm_fusion.runtime.weights import WEIGHTS_SUFFIX, save_weights

__all__ = ["CompileResult", "build_manifest", "compile_model", "cpu_linker", "kernel_counts", "kernel_launches"]


@dataclass
class CompileResult:
    library: Path
    manifest_path: Path
    manifest: Manifest
    seconds: float
    tuning: object = None  # tune.TuneReport with tune=TuneOptions(...)

    def __str__(self) -> str:
        m = self.manifest
        fired = ", ".join(f"{k} {v}" for k, v in m.rule_counts.items() if v) or "none"
        w = m.weights
        return "\n".join([
            f"wrote {self.library} ({m.target}) in {self.seconds:.1f}s",
            f"      {self.manifest_path}",
            *([f"      {w.file} ({w.bytes} bytes, {len(w.params)} weights outside the library)"] if w else []),
            f"fused groups: {len(m.groups)} ({fired})",
            *([f"tensor cores: {m.tensor_core_groups} of {len(m.groups)} groups (groups[].engine says why "
               "not for the others; `explain` too)"] if m.tensor_core_groups else []),
            _verified(m.verification),
            *_unscheduled_lines(m.unscheduled),
            "kernel calls per inference: " + ", ".join(f"{k} {v['kernel_calls']}" for k, v in m.builds.items()),
            *([_binary_line(m.cuda_binary, m.arch)] if m.cuda_binary else []),
            *([_graph_line(m.cuda_graph)] if m.cuda_graph else []),
            *([f"note: {m.cuda_facts['note']}"] if (m.cuda_facts or {}).get("note") else []),
            *([str(self.tuning)] if self.tuning is not None else []),
        ])


def _unscheduled_lines(kernels: list[dict]) -> list[str]:
    """A warning per kernel that runs without a schedule (TVM's bare loop nest on the CPU)."""
    if not kernels:
        return []
    return [f"warning: {len(kernels)} kernel(s) run without a schedule (TVM's bare loops; `explain` names them):"] + \
        [f"  {k['function']} ({', '.join(k['ops'])}) <- {', '.join(k['onnx_nodes']) or '?'}" for k in kernels]


def _verified(v: dict) -> str:
    if not v["verified"]:
        return f"not verified ({v['reason']})"
    if not v.get("agrees_with_reference", True):
        return (f"verified against the unfused build: onnxruntime differs from both on {', '.join(v['importer'])} "
                f"(TVM's importer, not fusion: see the warning; the manifest's verification.importer) "
                f"({v['seconds']:.1f}s)")
    worst = max((o["max_rel"] for o in v["outputs"].values()), default=0.0)
    sizes = v.get("symbolic_dims_checked_at")
    at = f" at {' and '.join(', '.join(f'{k}={n}' for k, n in s.items()) for s in sizes)}" if sizes else ""
    if v.get("groups"):
        base = max(o["max_rel"] for o in v["half_baseline"].values())
        return (f"verified per group: all {v['groups']['checked']} fused groups within tolerance of their unfused ops "
                f"at the half precision{at}; against the float32 model (reported) max rel error {worst:.2g}, rounding "
                f"the input and weights alone {base:.2g}: ill-conditioned for the dtype ({v['seconds']:.1f}s)")
    return f"verified: {v['method']}{at}; worst max rel error {worst:.2g} ({v['seconds']:.1f}s)"


def _binary_line(b: CudaBinary, arch: str | None) -> str:
    how = (f"{b.compiler} {b.compile_seconds:.1f}s at export" if b.compiled_at == "export"
           else f"{b.compiler}, compiled by TVM during the build (CUDA driver present)")
    return f"GPU code: {b.format} for {arch}, {b.bytes} bytes, {len(b.kernels)} kernels ({how})"


def _graph_line(g: dict) -> str:
    n = g["launches_per_inference"]
    if not g["enabled"]:
        return f"CUDA graph: off ({g['reason']}); {n['without_graph']} launches per inference"
    return (f"CUDA graph: on; launches per inference {n['with_graph']} with it ({g['captured_kernels']} kernels "
            f"replayed by {g['graphs']} graph launch), {n['without_graph']} without (--no-cuda-graph)")


def _tensor_record(name: str, ty) -> TensorSpec:
    shape = [int(d) if isinstance(d, _tvm.tirx.IntImm) else dim_name(d) for d in ty.shape]  # "N": symbolic
    return TensorSpec(name, shape, str(ty.dtype))


def _inputs(built, onnx_names: dict[str, str]) -> list[TensorSpec]:
    """Name (the model's, `onnx_names` undoing import's sanitizing), shape and dtype of each input of `main`
    (the weights, when lifted, come after them)."""
    params = list(built.module["main"].params)
    params = params[:len(params) - len(built.weights or {})]
    return [_tensor_record(onnx_names.get(_tvm.var_name(p), _tvm.var_name(p)), _tvm.expr_type(p)) for p in params]


def _outputs(built, proto: onnx.ModelProto) -> list[TensorSpec]:
    """Name (the model's), shape and dtype of each output of `main`, in the order the library returns them."""
    ret = built.module["main"].ret_ty
    types = list(ret.fields) if isinstance(ret, _tvm.relax.TupleType) else [ret]
    names = [o.name for o in proto.graph.output]
    if len(names) != len(types) or not all(isinstance(t, _tvm.relax.TensorType) for t in types):
        return [TensorSpec(n) for n in names]
    return [_tensor_record(n, t) for n, t in zip(names, types)]


def symbolic_record(built, shapes: dict) -> dict:
    """{dim: {"upper_bound", "max_size"}} for each symbolic dim of the inputs: max_size is the largest size
    our kernels' int32 indexing allows (MAX_ELEMENTS over the most elements a kernel stage holds per unit).
    A bound above it is bad input: at that size some kernel would index past int32."""
    per_unit = max((int(f.attrs[ELEMENTS_PER_BATCH_ATTR]) for f in built.module.functions.values()
                    if isinstance(f, tvm.tirx.PrimFunc) and f.attrs and ELEMENTS_PER_BATCH_ATTR in f.attrs), default=1)
    record = {}
    for name, upper in frontend.symbolic_dims(shapes).items():
        largest = frontend.MAX_ELEMENTS // per_unit
        if upper is not None and upper > largest:
            raise FusionError(f"--shape: {name}<={upper} is more than the fused kernels' int32 indexing allows "
                              f"({name}<={largest}: a kernel holds {per_unit} elements per unit of {name}); "
                              f"use {name}<={largest} or less")
        record[name] = {"upper_bound": upper, "max_size": upper or largest}
    return record


def kernel_counts(mod, target, mode: str) -> dict:
    """PrimFuncs and kernel calls of `mode` without compiling (legalize stage only)."""
    primfuncs, calls = count_kernel_calls(legalize(mod, target, mode))
    return {"primfuncs": primfuncs, "kernel_calls": calls}


def _kernels_of(primfunc: str, kernels: list[str]) -> list[str]:
    """The CUDA kernels TVM split `primfunc` into: `<primfunc>_kernel`, `<primfunc>_kernel_1`, ..."""
    return [k for k in kernels if re.fullmatch(rf"{re.escape(primfunc)}_kernel(?:_?\d+)?", k)]


def kernel_launches(legal, kernels: list[str]) -> int:
    """GPU kernel launches per inference: each call_tir in `main` launches its PrimFunc's kernels (those of
    the function table named `<primfunc>_kernel[_N]`), except reshapes, which TVM turns into views."""
    launches = 0

    def visit(expr):
        nonlocal launches
        if isinstance(expr, relax.Call) and expr.op.same_as(tvm.ir.Op.get("relax.call_tir")):
            name = expr.args[0].name_hint
            if not relax.analysis.has_reshape_pattern(legal[name]):
                launches += len(_kernels_of(name, kernels))

    relax.analysis.post_order_visit(legal["main"], visit)
    return launches


def check_output(output: Path, model=None) -> None:
    """Refuse, before any work, an output the library or its manifest cannot be written to, or one that
    would overwrite the input model; creates the output's directory."""
    if output.is_dir() or not output.name:
        raise FusionError(f"-o {str(output)!r}: is a directory; give the library's file path, e.g. "
                          f"{output / 'model.so'}")
    manifest = manifest_path_of(output)
    if manifest.is_dir():
        raise FusionError(f"-o {output}: the manifest path {manifest} is a directory; remove it or choose another -o")
    if model is not None and not isinstance(model, onnx.ModelProto):
        src = Path(model).resolve()
        for path in (output, manifest):
            if path.resolve() == src:
                raise FusionError(f"-o {output}: would overwrite the input model {model}; choose another output path")
    parent = output.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".tvm_fusion_write_test_"):
            pass  # os.access lies to root: try a real write
    except OSError as err:
        raise FusionError(f"-o {output}: cannot write into {parent} ({err.strerror or err}); "
                          "choose a writable directory") from None


def cpu_linker(target, cc: str | None = None) -> str | None:
    """The C compiler that links a library for an llvm target: `cc` when given; None (TVM's default)
    for this machine's architecture; `<mtriple>-gcc` (e.g. aarch64-linux-gnu-gcc) for another one,
    FusionError when that is not on PATH. None for other target kinds (export_library links them)."""
    if target.kind.name != "llvm":
        return None
    if cc:
        return cc
    triple = _tvm.llvm_triple(target)
    if cpu_features.arch_of(triple) == cpu_features.arch_of():
        return None
    cross = f"{triple}-gcc"
    if shutil.which(cross) is None:
        raise FusionError(f"linking a library for {triple} needs a cross toolchain: put {cross} on PATH "
                          f"(Debian/Ubuntu: apt-get install gcc-{triple}) or pass cc=...")
    return cross


def _graph_record(built, kernels: list[str], launches: int | None) -> dict:
    """The manifest's cuda_graph entry: on or off (and why), and the GPU launches per inference with and
    without the graph (counted on the function table's kernels when there is one)."""
    g = built.cuda_graph
    count = graphs.launches(built.lowered, (lambda n: len(_kernels_of(n, kernels))) if kernels else (lambda n: 1))
    without = launches if launches is not None else count["without_graph"]
    return {"enabled": g["enabled"], "reason": g["reason"],
            # a replay reads the weight tensors the first call passed (TVM caches the graph by shape only)
            **({"same_weight_tensors_every_call": True} if g["enabled"] and built.weights is not None else {}),
            "launches_per_inference": {"with_graph": count["with_graph"] if g["enabled"] else without,
                                       "without_graph": without},
            "captured_kernels": count["captured"], "graphs": count["graphs"]}


def _precision_record(precision: str | None) -> dict:
    """The compute precision: fp32 (the model's own dtypes) or the half dtype a float32 model was converted to."""
    if check_precision(precision) is None:
        return {"name": "fp32", "converted": False}
    return {"name": precision, "dtype": PRECISIONS[precision], "converted": True, "accumulator": "float32",
            "method": "BatchNorm as x * s + t, then Relax ToMixedPrecision (softmax, layer-norm statistics and "
                      "reductions kept in float32)"}


def _target_record(target) -> dict:
    """What the manifest says about the target: its exact JSON, and for a CPU target the triple and
    every feature the code may use (tvm_fusion.runtime.load checks them against the host)."""
    record = {"target": str(target)}
    if target.kind.name == "llvm":
        record["cpu_triple"] = _tvm.llvm_triple(target)
        record["cpu_features"] = sorted(_tvm.target_cpu_features(target))
    return record


def compile_model(model, output, target="cuda", *, arch: str = "sm_90", shapes: dict | None = None,
                  rules: RuleSet | None = None, counts_of_other_builds: bool = True, verify: bool = True,
                  seed: int = 0, cc: str | None = None, external_weights: bool = False,
                  inputs=None, cuda_graph: bool | None = None, precision: str | None = None,
                  tune: TuneOptions | None = None, strict: bool = False,
                  search_timeout: float = DEFAULT_SEARCH_TIMEOUT, simplify: bool = True,
                  blocked_layout: bool = True) -> CompileResult:
    """Fuse and build `model` for `target`, verify it against onnxruntime on inputs seeded with `seed`
    and the `inputs` given (a dict or an .npz path, as for compare), export the library to `output`, write
    `<output>.json` (manifest.Manifest; verify.py: nothing is written when fusion changed the result; a
    difference from onnxruntime that the unfused build shares is written with a warning,
    `manifest.verification["warning"]`, or refused with `strict`; the culprit search stops after
    `search_timeout` seconds).
    `cc` links a CPU library (default: the system compiler, or `<mtriple>-gcc` for another architecture);
    with `external_weights` the weights go to `<output>.weights` instead of into the library (weights.py);
    `cuda_graph=False` keeps every kernel a launch of its own (default for CUDA with the weights inside the
    library: captured in a CUDA graph, cuda_graph.py; with external weights only when True, and then every
    call must pass the same weight tensors, which the graph keeps from the first call).
    `precision` "fp16" / "bf16" converts the float32 model first (tvm_fusion.precision); the verify step then
    judges it against the float32 model with the half dtype's tolerance.
    `tune` (tune.TuneOptions: trials per kernel, database folder, RPC tracker) tunes the fused kernels with
    MetaSchedule first; the manifest's `tuning` and the result's `tuning` say what each kernel gained.
    `simplify=False` imports the model as given, without the ONNX simplifier (the verify step's checks too).
    `blocked_layout=False` keeps every kernel's tensors NCHW (by default an AVX-512 target's conv chains pass
    theirs in NCHW[x]c: fusion/chain_layout.py).
    `model`: a path, a ModelProto, or a prepared.PreparedModel (its target, shapes, inputs, precision and
    simplifier choice are used)."""
    start = time.perf_counter()
    check_precision(precision)
    if tune is not None:
        check_tune_options(tune)
    output = Path(output)
    check_output(output, None if isinstance(model, PreparedModel) else model)
    tgt = model.target if isinstance(model, PreparedModel) else resolve_target(target, arch)
    linker = cpu_linker(tgt, cc)
    steps = ["import", "fuse + tune + build" if tune is not None else "fuse + build", "verify" if verify else "(not verified)",
             "compile GPU code + export" if tgt.kind.name == "cuda" else "export"]
    if counts_of_other_builds:
        steps.append("count unfused / tvm kernels")
    partial = output.with_name(f".partial-{os.getpid()}-{output.name}")  # renamed only once verified
    with progress(steps) as bar:
        # given arrays bind symbolic dims, as in compare
        prepared = prepare(model, tgt, arch=arch, shapes=shapes, inputs=inputs, precision=precision, simplify=simplify)
        name, proto, mod, shapes, given = prepared.name, prepared.proto, prepared.mod, prepared.shapes, prepared.given
        precision, simplify = prepared.precision, prepared.simplify
        bar.update()
        built = build(mod, tgt, "fused", rules=rules, external_weights=external_weights, cuda_graph=cuda_graph,
                      tune=tune, blocked_layout=blocked_layout)
        symbolic = symbolic_record(built, shapes)  # a bound past int32 indexing: refused before any work
        bar.update()
        verification = (verify_fused(proto, built, shapes=shapes, rules=rules, seed=seed, inputs=given,
                                     precision=precision, strict=strict, search_timeout=search_timeout,
                                     simplify=simplify, name=name)
                        if verify else skipped())
        bar.update()
        try:
            binary = export_library(built.executable, partial, arch, cc=linker)
            os.replace(partial, output)
        finally:
            partial.unlink(missing_ok=True)
        bar.update()
        others = {}
        if counts_of_other_builds:
            others = {m: kernel_counts(mod, tgt, m) for m in ("unfused", "tvm")}
            bar.update()
    manifest = build_manifest(name, output, arch, proto, mod, built, binary, symbolic=symbolic,
                              precision=precision, verification=verification.manifest(), other_builds=others,
                              weights=_save_weights(output, built.weights))
    manifest.save(manifest_path_of(output))
    return CompileResult(output, manifest_path_of(output), manifest, time.perf_counter() - start, built.tuning)


def _groups_record(built, kernels: list[str]) -> list[dict]:
    """The manifest's groups: rule, function, ONNX nodes and attrs of each fused group (its CUDA kernels,
    and the engine its kernel runs on, when known)."""
    groups = []
    for g in built.fused.groups:
        entry = {"rule": g.rule, "function": g.function, "onnx_nodes": g.onnx_nodes,
                 "attrs": {k: list(v) if isinstance(v, tuple) else v for k, v in g.attrs.items()}}
        if kernels:
            entry["kernels"] = _kernels_of(g.function, kernels)
        if g.kernel:
            entry["engine"] = g.kernel
        groups.append(entry)
    return groups


def _cuda_records(built, binary, kernels: list[str], launches: int | None) -> dict:
    """The manifest's CUDA entries: the limits the schedules sized for, the GPU code, the CUDA graph."""
    records = {}
    if built.target.kind.name == "cuda":
        records["cuda_facts"] = asdict(cuda_facts(built.target))
    if binary is not None:
        records["cuda_binary"] = CudaBinary(format=binary.fmt, bytes=binary.size, kernels=binary.kernels,
                                            compiler=binary.compiler, compiled_at=binary.compiled_at,
                                            compile_seconds=binary.compile_seconds)
    if built.cuda_graph is not None:
        records["cuda_graph"] = _graph_record(built, kernels, launches)
    return records


def build_manifest(name: str, output: Path, arch: str, proto: onnx.ModelProto, mod, built, binary, *,
                   symbolic: dict, precision: str | None, verification: dict, other_builds: dict,
                   weights: WeightsFile | None = None) -> Manifest:
    """The manifest of the library `built` exported to `output` (its GPU code `binary`, None for a CPU
    library; `weights` the file its weights went to when outside). `mod`: the imported module (before
    fusion), `other_builds`: kernel counts of the unfused / tvm builds, `verification` the verify step's record."""
    tgt = built.target
    kernels = binary.kernels if binary is not None else []
    builds = {**other_builds, "fused": {"primfuncs": built.primfuncs, "kernel_calls": built.kernel_calls}}
    if kernels:
        builds["fused"]["kernel_launches"] = kernel_launches(built.module, kernels)
    target = _target_record(tgt)
    return Manifest(
        model=name, library=str(output), **target, arch=arch if tgt.kind.name == "cuda" else None,
        tvm_version=_tvm.TVM_VERSION, inputs=_inputs(built, frontend.onnx_input_names(mod)),
        outputs=_outputs(built, proto), symbolic_dims={k: DimLimit(**v) for k, v in symbolic.items()},
        precision=_precision_record(precision), rule_counts=built.counts, groups=_groups_record(built, kernels),
        tensor_core_groups=sum(g.kernel.startswith("tensor cores") for g in built.fused.groups),
        builds=builds, declined=[asdict(d) for d in built.fused.decisions if d.reason],
        unscheduled=[u.record() for u in built.unscheduled], verification=verification,
        simplify=simplify_record(mod), **_cuda_records(built, binary, kernels, builds["fused"].get("kernel_launches")),
        tuning=built.tuning.manifest() if built.tuning is not None else None,
        weights=weights)


def _save_weights(output: Path, weights: dict | None) -> WeightsFile | None:
    """`<output>.weights` for a build with its weights outside the library."""
    if weights is None:
        return None
    path = output.with_name(output.name + WEIGHTS_SUFFIX)
    return WeightsFile(file=path.name, bytes=save_weights(path, weights), params=list(weights))
