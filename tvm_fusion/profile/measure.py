"""`profile`: where the time and the memory traffic go, per kernel, before and after fusion, and what to fuse next.

    builds      unfused (one kernel per op; convolutions through the `conv2d` rule alone, so they run the
                same scheduled kernel as in the fused build and before/after isolates fusion), fused, tvm
    timing      VirtualMachine.set_instrument around every kernel call; medians over `repeat` inferences
    mapping     call site -> ONNX nodes: fused groups from FuseResult.groups (in binding order), other
                kernels from the module attribute `tvm_fusion.onnx_nodes` (an unnamed var: its consumer's node);
                a kernel TVM's FuseOps made of several ops: the nodes of each (unscheduled.kernel_origins)
    traffic     a kernel reads its input buffers and writes its outputs once (shape x dtype); a group saves
                one write and one read of each intermediate that no longer goes to memory
    roofline    roofline.Peaks: measured on the host, or a datasheet for known GPUs
    memory      each build's peak activation memory from TVM's own plan (build/memory.py); per group, the
                storage TVM plans for its ops alone in the unfused build against its kernel in the fused one
"""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import onnx

from tvm_fusion import _tvm
from tvm_fusion.frontend import importer as frontend
from tvm_fusion._tvm import relax, tvm
from tvm_fusion.build.builder import legalize_traced
from tvm_fusion.build.memory import MemoryPlan, format_bytes, plan_groups, plan_memory, report_lines
from tvm_fusion.check.prepared import PreparedModel, prepare
from tvm_fusion.console import table
from tvm_fusion.errors import FusionError
from tvm_fusion.fusion.fuse import FuseResult, fuse
from tvm_fusion.check.io import gpu_available, input_tensors, nbytes
from tvm_fusion.build.pipeline import MODES, lower_passes, sequential
from tvm_fusion.profile.roofline import KNOWN_GPUS, Peaks, gpu_peaks, host_peaks
from tvm_fusion.rules import RuleSet
from tvm_fusion.build.unscheduled import find_unscheduled, node_of_vars, users_of
from tvm_fusion.fusion.loader import load_rules_for
from tvm_fusion.profile.html import render

__all__ = ["ProfileReport", "profile", "Site", "GroupProfile", "Candidate", "BuildProfile", "SCHEMA_VERSION"]

SCHEMA_VERSION = 1
BASELINE_RULE = "conv2d"  # the one-op rule of the unfused build: same conv schedule, nothing fused
ELEMENTWISE_PATTERN = 1  # op_pattern <= 1: elementwise or broadcast (TVM's AnnotateTIROpPattern)
SMALL_KERNEL_CALLS = 3  # "frequent": at least this many calls per inference
SMALL_KERNEL_LAUNCHES = 10  # "small": a call takes at most this many times the cheapest kernel call
PLAIN_RUNS = 3  # whole-inference runs without the instrument, per build
MB = 1e6


# ---------------------------------------------------------------- data
@dataclass
class Site:
    """One kernel call per inference: what runs, where it came from, what it moves and how long it takes."""

    index: int
    kernel: str  # PrimFunc symbol
    origin: str  # rule name (a fused group) or the op it was legalized from
    onnx_nodes: list[str]
    group: int | None  # index in FuseResult.groups
    reads: int  # bytes
    writes: int
    flops: float
    op_pattern: int
    times: list[float] = field(default_factory=list, repr=False)  # seconds, one per repetition
    median: float = 0.0
    var: str = field(default="", repr=False)

    @property
    def nbytes(self) -> int:
        return self.reads + self.writes

    @property
    def intensity(self) -> float:
        return self.flops / self.nbytes if self.nbytes else 0.0


@dataclass
class BuildProfile:
    mode: str
    sites: list[Site]
    latency: float  # median whole-inference time without the instrument (time_evaluator)
    instrumented: float  # median whole-inference time with it
    build_seconds: float
    overhead_per_call: float  # instrumented runs: time outside kernels per call (instrument + VM dispatch)
    memory: MemoryPlan | None = None  # TVM's memory plan: peak activation memory (build/memory.py)

    @property
    def kernel_time(self) -> float:
        return sum(s.median for s in self.sites)

    def kernels(self) -> list[dict]:
        """Per kernel symbol: origin, ONNX nodes, calls, summed median time, share of the total."""
        rows: dict[str, dict] = {}
        total = self.kernel_time or 1.0
        for s in self.sites:
            r = rows.setdefault(s.kernel, {"kernel": s.kernel, "origin": s.origin, "onnx_nodes": [], "calls": 0,
                                           "median_s": 0.0, "reads": 0, "writes": 0, "flops": 0.0})
            r["onnx_nodes"] += [n for n in s.onnx_nodes if n not in r["onnx_nodes"]]
            r["calls"] += 1
            r["median_s"] += s.median
            r["reads"] += s.reads
            r["writes"] += s.writes
            r["flops"] += s.flops
        for r in rows.values():
            r["share"] = r["median_s"] / total
        return sorted(rows.values(), key=lambda r: -r["median_s"])


@dataclass
class GroupProfile:
    """One fused group: its original ops in the unfused build next to its fused kernel."""

    index: int
    rule: str
    kernel: str
    onnx_nodes: list[str]
    attrs: str
    before_s: float  # summed median time of the original ops' kernels
    after_s: float
    before_launches: int
    after_launches: int
    intermediates: list[dict]  # {"name", "shape", "dtype", "bytes"}: no longer written and read back
    bytes_saved: int  # 2 x intermediate bytes
    reads: int  # what the fused kernel still reads and writes
    writes: int
    flops: float
    roofline_fraction: float  # roofline time / measured time
    #: storage TVM's memory plan gives the group's ops alone (their intermediates; inputs and outputs not
    #: counted): its ops in the unfused build, its kernel in the fused one (None: not plannable alone)
    storage_before: int | None = None
    storage_after: int | None = None

    @property
    def launches_removed(self) -> int:
        return self.before_launches - self.after_launches

    @property
    def storage_saved(self) -> int | None:
        """Bytes of peak memory the fusion saves while the group runs: the intermediates' planned storage."""
        if self.storage_before is None or self.storage_after is None:
            return None
        return self.storage_before - self.storage_after


@dataclass
class Candidate:
    """Something the build leaves unfused, with the saving the traffic model estimates."""

    kind: str  # "elementwise chain" | "frequent small kernel" | "launch-bound kernel"
    onnx_nodes: list[str]
    ops: list[str]
    reasons: list[str]
    bytes_saved: int
    launches_saved: int
    seconds_saved: float
    measured_s: float


# ---------------------------------------------------------------- structure of a legalized module
def _is_call_tir(expr) -> bool:
    return isinstance(expr, relax.Call) and expr.op.same_as(tvm.ir.Op.get("relax.call_tir"))


def _flops(func, out_elements: int) -> float:
    """Floating-point ops of a PrimFunc counted from its TIR (a conv / matmul: 2 per multiply-add exactly),
    and at least one per output element."""
    try:
        counted = float(_tvm.estimate_tir_flops(tvm.IRModule({"main": func})))
    except Exception:  # noqa: BLE001 - the estimator rejects some loop nests (e.g. dynamic extents)
        counted = 0.0
    return max(counted, float(out_elements))  # it skips intrinsics (sin, abs): at least one per element


def _origin(kernel: str) -> str:
    return re.sub(r"\d+$", "", kernel)


def _output_vars(func, bindings) -> list:
    """The vars `main` returns, in order (through a returned tuple)."""
    ret = func.body.body
    value = {b.var: b.value for b in bindings}.get(ret, ret)
    fields = value.fields if isinstance(value, relax.Tuple) else [ret]
    return [f for f in fields if isinstance(f, relax.Var)]


def call_sites(legal: tvm.IRModule, fused: FuseResult | None, names: dict[str, str], outputs=(),
               origins: dict | None = None):
    """The kernel calls of `main` in order, each mapped to its rule/op and ONNX nodes (`outputs`: the ONNX
    nodes producing the graph outputs, for the vars main returns, which the importer does not name;
    `origins`: unscheduled.kernel_origins, the ONNX nodes of each kernel TVM's FuseOps made of several ops).

    Returns (sites, users, var of each site); groups are matched to their call_tir in binding order."""
    bindings = [b for blk in legal["main"].body.blocks for b in blk.bindings]
    users = users_of(bindings)
    node_of = node_of_vars(bindings, users, names)
    labels = set(names.values())
    for var, node in zip(_output_vars(legal["main"], bindings), outputs):
        node_of.setdefault(var, node)
    groups = list(fused.groups) if fused else []
    group_funcs = {g.function for g in groups}
    next_group = 0
    sites, site_vars = [], []
    for b in bindings:
        if not _is_call_tir(b.value):
            continue
        gv = b.value.args[0]
        kernel = gv.name_hint
        func = legal[gv]
        n_out = len(b.var.ty.fields) if isinstance(b.var.ty, relax.TupleType) else 1
        params = list(func.params)
        reads = sum(nbytes(p) for p in params[:-n_out])
        writes = sum(nbytes(p) for p in params[-n_out:])
        out_elems = sum(int(np.prod([int(d) for d in p.shape])) for p in params[-n_out:])
        pattern = int((func.attrs or {}).get("op_pattern", 8))
        group = None
        if kernel in group_funcs:
            for j in range(next_group, len(groups)):
                if groups[j].function == kernel:
                    group, next_group = j, j + 1
                    break
        own = [node_of[b.var]] if b.var in node_of else []
        if group is not None:  # a one-op group may not know its node (an unnamed conv): its consumer's
            origin, nodes = groups[group].rule, list(groups[group].onnx_nodes) or own
        else:
            ops, traced = (origins or {}).get(kernel, ((), ()))
            # a kernel FuseOps made of several ops: the nodes of all of them, not only its last consumer's
            nodes = [n for n in traced if n in labels] if len(ops) > 1 else []
            origin, nodes = _origin(kernel), nodes or own
        sites.append(Site(len(sites), kernel, origin, nodes, group, reads, writes, _flops(func, out_elems),
                          pattern, var=b.var.name))
        site_vars.append(b.var)
    return sites, users, site_vars


# ---------------------------------------------------------------- timing
class _Timer:
    """One build's VM: whole-inference runs without the instrument, and runs timing every kernel call."""

    def __init__(self, executable, dev, tensors, sites: list[Site], gpu: bool):
        self.vm = relax.VirtualMachine(executable, dev)
        self.dev, self.tensors, self.sites = dev, tensors, sites
        self.sync = dev.sync if gpu else (lambda: None)  # a GPU kernel is timed from launch to completion
        self.vm["main"](*tensors)  # warm-up
        self.plain: list[float] = []
        self.walls: list[float] = []
        self.outside: list[float] = []  # per instrumented run: time not inside a kernel call
        self.order: list[int] | None = None

    def run_plain(self) -> None:
        self.plain.append(self.vm.time_evaluator("main", self.dev, number=1, repeat=1)(*self.tensors).median)

    def run_instrumented(self) -> None:
        events: list[tuple[str, float]] = []
        start = [0.0]
        sync = self.sync

        def instrument(func, symbol, before_run, ret_value, *args):
            symbol = str(symbol)
            if symbol.startswith("vm.builtin."):
                return 0
            sync()
            if before_run:
                start[0] = time.perf_counter()
            else:
                events.append((symbol, time.perf_counter() - start[0]))
            return 0

        self.vm.set_instrument(instrument)
        t0 = time.perf_counter()
        self.vm["main"](*self.tensors)
        sync()
        self.walls.append(time.perf_counter() - t0)
        self.outside.append(self.walls[-1] - sum(dt for _, dt in events))
        self.vm.set_instrument(lambda *args: 0)
        if self.order is None:
            self.order = _align([sym for sym, _ in events], self.sites)
        for (_, dt), i in zip(events, self.order):
            self.sites[i].times.append(dt)

    def medians(self) -> tuple[float, float, float]:
        """(plain latency, instrumented latency, time per kernel call outside the kernels), all medians. The
        last bounds the instrument's overhead (it also holds the VM's own dispatch); unlike a difference of
        whole runs, it is not swamped when a busy host stalls a parallel kernel."""
        for s in self.sites:
            s.median = statistics.median(s.times) if s.times else 0.0
        calls = max(1, len(self.order or ()))
        return (statistics.median(self.plain), statistics.median(self.walls),
                statistics.median(self.outside) / calls)


def _align(symbols: list[str], sites: list[Site]) -> list[int]:
    """Runtime calls -> call sites, in order; a site the lowering turned into a VM builtin (a reshape) never
    runs and is skipped."""
    out, j = [], 0
    for sym in symbols:
        k = j
        while k < len(sites) and sites[k].kernel != sym:
            k += 1
        if k == len(sites):
            raise FusionError(f"profile: the VM called kernel {sym!r}, which is not a call_tir of main in "
                              "order; cannot attribute its time")
        out.append(k)
        j = k + 1
    return out


# ---------------------------------------------------------------- analysis
def _group_profiles(unfused: BuildProfile, fused: BuildProfile, result: FuseResult, users, site_vars,
                    peaks: Peaks) -> list[GroupProfile]:
    """Before/after and traffic of every fused group."""
    executed = [s for s in unfused.sites if s.times]
    var_of = {s.index: v for s, v in zip(unfused.sites, site_vars)}
    out = []
    for gi, g in enumerate(result.groups):
        members = set(g.onnx_nodes)
        before = [s for s in executed if members.intersection(s.onnx_nodes)]
        inside = {var_of[s.index] for s in before}
        intermediates = []
        for s in before:
            readers = users.get(var_of[s.index], [])
            if readers and all(r in inside or _feeds_only(r, inside, users) for r in readers):
                ty = var_of[s.index].ty
                intermediates.append({"name": s.var, "shape": [int(d) for d in getattr(ty, "shape", [])],
                                      "dtype": str(getattr(ty, "dtype", "")), "bytes": s.writes})
        after = [s for s in fused.sites if s.group == gi]
        a = after[0] if after else None
        t_after = sum(s.median for s in after)
        rf = peaks.roofline_seconds(a.flops, a.nbytes) / t_after if a and t_after else 0.0
        out.append(GroupProfile(gi, g.rule, g.function, list(g.onnx_nodes), _attrs(g.attrs),
                                sum(s.median for s in before), t_after, len(before), len(after), intermediates,
                                2 * sum(i["bytes"] for i in intermediates), a.reads if a else 0,
                                a.writes if a else 0, a.flops if a else 0.0, rf))
    return out


def _group_storage(groups: list[GroupProfile], builds: dict, legals: dict, site_vars: dict, target) -> None:
    """Each group's storage in TVM's plan of its ops alone: the unfused build's kernels of its ONNX nodes
    against the fused build's kernel(s) of the group (storage_before / storage_after)."""
    unfused, fused = builds["unfused"].sites, builds["fused"].sites
    before = [[site_vars["unfused"][s.index] for s in unfused if s.times and set(g.onnx_nodes) & set(s.onnx_nodes)]
              for g in groups]
    after = [[site_vars["fused"][s.index] for s in fused if s.group == g.index] for g in groups]
    for g, b, a in zip(groups, plan_groups(legals["unfused"], target, before),
                       plan_groups(legals["fused"], target, after)):
        if b is not None and a is not None and b.static and a.static:
            g.storage_before, g.storage_after = b.planned, a.planned


def _feeds_only(var, inside: set, users) -> bool:
    """A non-kernel binding (tuple item, reshape view) whose readers are all inside the group."""
    readers = users.get(var, [])
    return bool(readers) and all(r in inside for r in readers)


def _attrs(attrs: dict) -> str:
    text = ", ".join(f"{k}={v}" for k, v in attrs.items() if k != "recipe")
    return text if len(text) < 200 else text[:197] + "..."


def _chains(unfused: BuildProfile, site_vars, users, covered: set[str]) -> list[list[Site]]:
    """Maximal producer -> consumer runs of >= 3 elementwise kernels of the unfused build no group took."""
    by_var = {v: s for s, v in zip(unfused.sites, site_vars)}
    ok = {s.index for s in unfused.sites
          if s.op_pattern <= ELEMENTWISE_PATTERN and s.times and not covered.intersection(s.onnx_nodes)}
    succ: dict[int, list[int]] = {}
    pred: dict[int, int] = {}
    for s, v in zip(unfused.sites, site_vars):
        if s.index not in ok:
            continue
        for u in users.get(v, []):
            t = by_var.get(u)
            if t is not None and t.index in ok and t.index not in pred:
                succ.setdefault(s.index, []).append(t.index)
                pred[t.index] = s.index
    chains = []
    for i in sorted(ok):
        if i in pred and len(succ.get(pred[i], [])) == 1:
            continue  # not the head of a chain
        chain = [i]
        while len(succ.get(chain[-1], [])) == 1:
            chain.append(succ[chain[-1]][0])
        if len(chain) >= 3:
            chains.append([unfused.sites[k] for k in chain])
    return chains


def _candidates(unfused, fused, result, site_vars, users, peaks, explain_reasons) -> list[Candidate]:
    covered = {n for g in result.groups for n in g.onnx_nodes}
    launch = min((s.median for s in unfused.sites if s.times), default=0.0)  # the cheapest call bounds a launch
    out = []
    var_of = dict(zip((s.index for s in unfused.sites), site_vars))
    for chain in _chains(unfused, site_vars, users, covered):
        nodes = [n for s in chain for n in s.onnx_nodes]
        inside = {var_of[s.index] for s in chain}
        saved = sum(2 * s.writes for s in chain[:-1] if all(u in inside for u in users.get(var_of[s.index], [])))
        reasons = [r for n in dict.fromkeys(nodes) for r in explain_reasons.get(n, [])]
        if not reasons:
            reasons = [f"no rule's pattern covers {' -> '.join(s.origin for s in chain)}"]
        merged = _merged_by_tvm(chain, fused, list(dict.fromkeys(nodes)))
        if merged:
            reasons.append(f"TVM's own FuseOps merged it into {merged} in the fused build: a rule would give it a "
                           "name, an ONNX trace and a schedule of its own")
        measured = sum(s.median for s in chain)
        est = min(measured, saved / peaks.bandwidth + (len(chain) - 1) * launch)
        out.append(Candidate("elementwise chain", list(dict.fromkeys(nodes)), [s.origin for s in chain], reasons,
                             saved, len(chain) - 1, est, measured))
    out += _small_kernels(fused or unfused, peaks, launch)
    return sorted(out, key=lambda c: (-c.seconds_saved, -c.bytes_saved))


def _merged_by_tvm(chain: list[Site], fused: BuildProfile | None, nodes: list[str]) -> str | None:
    """The fused build's kernel TVM's FuseOps made of the chain (named fused_<op>_<op>...), if any; it gets the
    chain's ONNX nodes, which TVM's kernels do not carry."""
    ops = "_".join(s.origin for s in chain)
    for site in fused.sites if fused else []:
        if site.kernel.startswith("fused_") and ops in site.kernel:
            site.onnx_nodes = site.onnx_nodes or nodes
            return site.kernel
    return None


def _small_kernels(build: BuildProfile, peaks: Peaks, launch: float) -> list[Candidate]:
    """Kernels of the final build whose time is mostly launch overhead, and small ones called often."""
    out = []
    for row in build.kernels():
        sites = [s for s in build.sites if s.kernel == row["kernel"] and s.times]
        if not sites:
            continue
        per_call = row["median_s"] / row["calls"]
        roof = sum(peaks.roofline_seconds(s.flops, s.nbytes) for s in sites) / len(sites)
        overhead = max(0.0, per_call - roof)
        if overhead < 0.5 * per_call:
            continue
        if per_call > SMALL_KERNEL_LAUNCHES * max(launch, 1e-9):
            continue  # not small: its time is the schedule's, not the launch's
        kind = "frequent small kernel" if row["calls"] >= SMALL_KERNEL_CALLS else "launch-bound kernel"
        reason = (f"{row['calls']} calls of {per_call * 1e6:.1f} us; the roofline allows {roof * 1e6:.2f} us, "
                  f"so {overhead / per_call:.0%} is launch overhead and schedule: fuse it into its producer or "
                  "consumer")
        out.append(Candidate(kind, row["onnx_nodes"], [row["origin"]], [reason], 2 * row["writes"],
                             row["calls"], min(row["median_s"], row["calls"] * launch), row["median_s"]))
    return out


# ---------------------------------------------------------------- report
@dataclass
class ProfileReport:
    model: str
    target: str
    device: str
    repeat: int
    peaks: Peaks
    builds: dict[str, BuildProfile]
    groups: list[GroupProfile]
    candidates: list[Candidate]
    counts: dict[str, int]
    declined: list[dict]  # {"rule", "onnx_node", "reason"} from the fuse stage (what `explain` shows)
    onnx_graph: dict = field(default_factory=dict, repr=False)  # nodes and edges, for the picture
    #: the fused build's kernels without a schedule: {"function", "ops", "onnx_nodes"} (unscheduled.py)
    unscheduled: list[dict] = field(default_factory=list)
    #: the sizes symbolic dims were bound to for profiling ("N=3"); "" when the model's shapes are static
    bound_at: str = ""
    precision: str = ""  # "fp16" / "bf16": the float32 model converted before the builds

    @property
    def bytes_saved(self) -> int:
        return sum(g.bytes_saved for g in self.groups)

    @property
    def launches_removed(self) -> int:
        return sum(g.launches_removed for g in self.groups)

    def summary(self) -> str:
        mb = self.bytes_saved / MB
        return (f"fusion saved {mb:.1f} MB" if mb >= 1 else f"fusion saved {mb:.3f} MB") + \
            f" of memory traffic and {self.launches_removed} launches per inference"

    def memory_summary(self) -> str:
        """`peak activation memory (TVM's memory plan): unfused 1.2 MB -> fused 0.8 MB (saves 0.4 MB)`."""
        plans = {m: b.memory for m, b in self.builds.items() if b.memory is not None}
        if not plans:
            return ""
        at = f", at {self.bound_at}" if self.bound_at else ""
        text = f"peak activation memory (TVM's memory plan{at}): " + ", ".join(
            f"{m} {format_bytes(p.peak)}" for m, p in plans.items())
        if {"unfused", "fused"} <= set(plans) and plans["unfused"].static and plans["fused"].static:
            saved = plans["unfused"].peak - plans["fused"].peak
            text += (f"; fused saves {format_bytes(saved)} against unfused" if saved >= 0 else
                     f"; fused needs {format_bytes(-saved)} more than unfused")
        return text

    def to_json(self) -> dict:
        def build(b: BuildProfile) -> dict:
            return {"mode": b.mode, "latency_s": b.latency, "instrumented_s": b.instrumented,
                    "kernel_time_s": b.kernel_time, "overhead_per_call_s": b.overhead_per_call,
                    "build_seconds": b.build_seconds, "calls": len([s for s in b.sites if s.times]),
                    "sites": [{**{k: v for k, v in asdict(s).items() if k != "times"}, "times_s": s.times,
                               "median_s": s.median, "intensity": s.intensity} for s in b.sites],
                    "kernels": b.kernels(),
                    "traffic_bytes": sum(s.nbytes for s in b.sites if s.times),
                    "memory": b.memory.to_json() if b.memory is not None else None}

        return {
            "schema": SCHEMA_VERSION, "model": self.model, "target": self.target, "device": self.device,
            "repeat": self.repeat, "peaks": self.peaks.to_json(), "counts": self.counts,
            "builds": {m: build(b) for m, b in self.builds.items()},
            "groups": [{**asdict(g), "launches_removed": g.launches_removed, "storage_saved": g.storage_saved}
                       for g in self.groups],
            "candidates": [asdict(c) for c in self.candidates],
            "declined": self.declined,
            "unscheduled": self.unscheduled,
            "bound_at": self.bound_at,
            "totals": {"bytes_saved": self.bytes_saved, "launches_removed": self.launches_removed,
                       "groups": len(self.groups), "summary": self.summary(),
                       "memory_summary": self.memory_summary()},
        }

    def write_json(self, path) -> None:
        import json

        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=1)

    def write_html(self, path) -> None:
        with open(path, "w") as f:
            f.write(render(self))

    def __str__(self) -> str:
        return render_text(self)


def _graph(proto: onnx.ModelProto) -> dict:
    """ONNX nodes (the names the import table uses) and producer -> consumer edges."""
    producer, nodes, edges = {}, [], []
    for i, n in enumerate(proto.graph.node):
        name = n.name or f"{n.op_type}_{i}"
        nodes.append({"name": name, "op": n.op_type})
        for o in n.output:
            producer[o] = name
        for x in n.input:
            if x in producer:
                edges.append([producer[x], name, x])
    return {"nodes": nodes, "edges": edges}


def _output_nodes(proto: onnx.ModelProto) -> list[str]:
    producer = {o: n.name or f"{n.op_type}_{i}" for i, n in enumerate(proto.graph.node) for o in n.output}
    return [producer.get(o.name, o.name) for o in proto.graph.output]


def _device(kind: str):
    if kind == "cuda":
        ok, why = gpu_available()
        if not ok:
            raise FusionError(f"profile --target cuda needs a GPU to time kernels on: {why}")
        dev = tvm.cuda(0)
        name = str(dev.device_name)
        peaks = gpu_peaks(name)
        if peaks is None:
            raise FusionError(f"no roofline figures for GPU {name!r}; known: {', '.join(KNOWN_GPUS)}")
        return dev, name, peaks
    import platform

    cpu = f"CPU {platform.processor() or platform.machine()}, {_tvm.HOST_CORES} cores"
    return tvm.cpu(0), cpu, host_peaks()


def _raised(peaks: Peaks, sites: list[Site]) -> Peaks:
    """A kernel that ran faster than the probed FLOP rate proves the probe low (a busy host): the compute
    roof is raised to the fastest kernel's rate, and the source says so."""
    best = max((s.flops / s.median for s in sites if s.median > 0), default=0.0)
    if best <= peaks.flops:
        return peaks
    return Peaks(peaks.bandwidth, best, f"{peaks.source}; FLOP roof raised from {peaks.flops / 1e9:.1f} to "
                                        f"{best / 1e9:.1f} GFLOP/s, the fastest kernel measured")


def _build(mod, target, mode: str, rules: RuleSet):
    """(legalized module, FuseResult or None, executable, seconds, kernel origins: unscheduled.kernel_origins)
    for one profile mode."""
    t0 = time.perf_counter()
    fused = None
    if mode == "fused":
        fused = fuse(mod, target, rules)
    elif mode == "unfused":
        fused = fuse(mod, target, load_rules_for(only=[BASELINE_RULE], plugins=False))
    legal, origins = legalize_traced(fused.mod if fused else mod, target, "unfused" if mode == "unfused" else mode)
    ex = tvm.compile(legal, target, relax_pipeline=sequential(lower_passes(target), "lower"))
    return legal, fused, ex, time.perf_counter() - t0, origins


def profile(model, target="llvm", *, shapes: dict | None = None, rules: RuleSet | None = None,
            modes=("unfused", "fused"), repeat: int = 5, seed: int = 0, arch: str = "sm_90",
            simplify: bool = True, precision: str | None = None) -> ProfileReport:
    """Build `model` in `modes`, time every kernel over `repeat` inferences on the same seeded inputs, and
    model the memory traffic and what is left to fuse. Needs the unfused and fused builds for before/after.
    `simplify=False`: import the model as given (no ONNX simplifier). `model`: a path, a ModelProto, or a
    prepared.PreparedModel (its target, shapes and simplifier choice are used; symbolic dims bound).
    `precision` "fp16" / "bf16": the float32 model converted first, as compare and compile do."""
    modes = list(dict.fromkeys(modes))
    for m in modes:
        if m not in MODES:
            raise FusionError(f"unknown build mode {m!r}; use some of {', '.join(MODES)}")
    if not {"unfused", "fused"} <= set(modes):
        raise FusionError(f"profile needs the unfused and fused builds for before/after; got --modes {','.join(modes)}")
    if repeat < 1:
        raise FusionError(f"--repeat must be at least 1, got {repeat}")
    # a symbolic dim is profiled bound to the larger size compare checks (3, or its upper bound up to 8):
    # the traffic model and the FLOP counts need static shapes
    declared = (model.shapes, model.given) if isinstance(model, PreparedModel) else (shapes or {}, {})
    bound_at = frontend.sizes_text(frontend.check_sizes(*declared)[-1])
    prepared = prepare(model, target, arch=arch, shapes=shapes, simplify=simplify, bound=True, precision=precision)
    name, proto, mod, tgt, shapes = prepared.name, prepared.proto, prepared.mod, prepared.target, prepared.shapes
    names = frontend.onnx_node_names(mod)
    dev, device, peaks = _device(tgt.kind.name)
    rules = rules if rules is not None else load_rules_for()
    _, tensors = input_tensors(proto, shapes, seed, dev)
    builds, structure, results = {}, {}, {}
    timers, seconds, unscheduled, legals = {}, {}, {}, {}
    for mode in modes:
        legal, fused, ex, seconds[mode], origins = _build(mod, tgt, mode, rules)
        legals[mode] = legal
        unscheduled[mode] = find_unscheduled(legal, origins)
        sites, users, site_vars = call_sites(legal, fused, names, _output_nodes(proto), origins)
        timers[mode] = _Timer(ex, dev, tensors, sites, tgt.kind.name == "cuda")
        structure[mode], results[mode] = (users, site_vars), fused
    for i in range(repeat):  # interleaved: one run of each build per round, so load changes hit them alike
        for t in timers.values():
            if i < PLAIN_RUNS:  # only for the instrument's overhead: a few are enough
                t.run_plain()
            t.run_instrumented()
    for mode, t in timers.items():
        latency, instrumented, overhead = t.medians()
        builds[mode] = BuildProfile(mode, t.sites, latency, instrumented, seconds[mode], overhead,
                                    plan_memory(legals[mode], tgt))
    result = results["fused"]
    users, site_vars = structure["unfused"]
    peaks = _raised(peaks, [s for b in builds.values() for s in b.sites])
    groups = _group_profiles(builds["unfused"], builds["fused"], result, users, site_vars, peaks)
    _group_storage(groups, builds, legals, {m: v for m, (_, v) in structure.items()}, tgt)
    reasons: dict[str, list[str]] = {}
    for d in result.decisions:
        if d.reason:
            reasons.setdefault(d.onnx_node, []).append(f"{d.rule}: {d.reason}")
    candidates = _candidates(builds["unfused"], builds["fused"], result, site_vars, users, peaks, reasons)
    declined = [{"rule": d.rule, "onnx_node": d.onnx_node, "reason": d.reason} for d in result.decisions if d.reason]
    return ProfileReport(name, str(tgt), device, repeat, peaks, builds, groups, candidates, dict(result.counts),
                         declined, _graph(proto), [u.record() for u in unscheduled["fused"]], bound_at,
                         prepared.precision or "")


# ---------------------------------------------------------------- text
def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def _nodes(nodes: list[str], limit: int = 4) -> str:
    return ", ".join(nodes[:limit]) + (f", +{len(nodes) - limit}" if len(nodes) > limit else "") if nodes else "-"


def render_text(r: ProfileReport, top: int = 12) -> str:
    p = r.peaks
    lines = [f"model {r.model}  target {r.target}  device {r.device}"
             + (f"  precision {r.precision} (converted from float32)" if r.precision else ""),
             f"roofs: {p.bandwidth / 1e9:.1f} GB/s, {p.flops / 1e9:.1f} GFLOP/s (ridge {p.ridge:.1f} FLOP/byte); "
             f"{p.source}",
             f"medians of {r.repeat} inferences; instrument + VM dispatch per kernel call (outside the kernels): "
             + ", ".join(f"{m} {b.overhead_per_call * 1e6:.1f} us" for m, b in r.builds.items()), ""]
    lines.append(table(["build", "kernel calls", "latency ms", "sum of kernels ms", "traffic MB", "build s"],
                        [[m, len([s for s in b.sites if s.times]), _ms(b.latency), _ms(b.kernel_time),
                          f"{sum(s.nbytes for s in b.sites if s.times) / MB:.1f}", f"{b.build_seconds:.1f}"]
                         for m, b in r.builds.items()]))
    lines += report_lines(((m, b.memory) for m, b in r.builds.items()), r.bound_at)
    for m, b in r.builds.items():
        rows = b.kernels()
        lines += ["", f"{m}: kernels by time (top {min(top, len(rows))} of {len(rows)})"]
        lines.append(table(["kernel", "rule / op", "ONNX nodes", "calls", "median ms", "share"],
                            [[k["kernel"], k["origin"], _nodes(k["onnx_nodes"], 3), k["calls"], _ms(k["median_s"]),
                              f"{k['share']:.1%}"] for k in rows[:top]]))
    if r.unscheduled:
        lines += ["", "fused: kernels without a schedule (TVM's bare loops: one element at a time, one thread):"]
        lines += [f"  {u['function']} ({', '.join(u['ops'])}) <- {_nodes(u['onnx_nodes'], 6)}" for u in r.unscheduled]
    lines += ["", "fused groups: before (original ops, unfused build) / after (fused kernel)"]
    lines.append(table(
        ["#", "rule", "ONNX nodes", "before ms", "after ms", "launches", "saved MB", "still r/w MB", "GFLOP",
         "FLOP/B", "roofline", "peak saved MB"],
        [[g.index, g.rule, _nodes(g.onnx_nodes, 3), _ms(g.before_s), _ms(g.after_s),
          f"{g.before_launches}->{g.after_launches}", f"{g.bytes_saved / MB:.2f}",
          f"{(g.reads + g.writes) / MB:.2f}", f"{g.flops / 1e9:.3f}",
          f"{g.flops / max(1, g.reads + g.writes):.1f}", f"{g.roofline_fraction:.0%}", _saved(g)] for g in r.groups]))
    lines.append("  saved MB: traffic (one write and one read of each intermediate); peak saved MB: the storage TVM's "
                 "memory plan gives the group's intermediates when its ops run unfused")
    lines += ["", "what to fuse next (estimated saving from the traffic model):"]
    if not r.candidates:
        lines.append("  nothing: no unfused elementwise chain, no launch-bound kernel")
    for i, c in enumerate(r.candidates[:top], 1):
        lines.append(f"  {i}. {c.kind}: {' -> '.join(c.ops)} [{_nodes(c.onnx_nodes, 6)}]: saves "
                     f"{c.bytes_saved / MB:.2f} MB, {c.launches_saved} launches, ~{_ms(c.seconds_saved)} ms "
                     f"of {_ms(c.measured_s)} ms")
        lines += [f"       {reason}" for reason in c.reasons[:4]]
    lines += ["", r.summary()] + ([r.memory_summary()] if r.memory_summary() else [])
    return "\n".join(lines)


def _saved(g: GroupProfile) -> str:
    return "-" if g.storage_saved is None else f"{g.storage_saved / MB:.2f}"
