"""MetaSchedule tuning of the fused kernels:  hand-scheduled kernel  ==>  min(hand, best of TRIALS trials).

Only the PrimFuncs our rules produced are tuned, from the plain compute their hand schedule was applied to
(FuseResult.plain). The hand schedule stays the default and the baseline: a tuned schedule replaces it only
when one runner, measuring both side by side, found it faster. Workloads are keyed by the structural hash of
the plain compute (MetaSchedule's JSONDatabase keys them so), so a database tuned once serves every model
with the same fused group shapes; what we chose per kernel and target (both times, the trials behind them) is
kept beside it in `tvm_fusion_choices.json`, and a kernel found there is neither tuned nor measured again.

Measuring happens here (MetaSchedule's LocalRunner), or on other machines through TVM's RPC tracker
(`rpc="HOST:PORT:KEY"`, MetaSchedule's RPCRunner); candidates are always built here.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tvm_fusion import _tvm
from tvm_fusion._tvm import tvm
from tvm_fusion.console import progress, table
from tvm_fusion.errors import FusionError
from tvm_fusion.rules import close_names
from tvm_fusion.schedules.llvm.conv2d_amx import runs_on_tiles
from tvm_fusion.schedules.llvm.conv2d_dpbf16 import runs_dot_products

__all__ = ["KernelTuning", "TuneOptions", "TuneReport", "check_options", "parse_rpc", "tune_fused"]

#: kernels whose stage is a hand-written loop nest of instructions (no TE compute to schedule): not tuned
HAND_WRITTEN = ((runs_on_tiles, "AMX tiles: a hand-written loop nest of tile instructions"),
                (runs_dot_products, "AVX512-BF16: a hand-written loop nest of dot-product instructions"))

CHOICES_FILE = "tvm_fusion_choices.json"
#: side-by-side rounds of (hand, tuned) when choosing between them; each round is one runner measurement
COMPARE_ROUNDS = 3
KEEP = ("faster", "tuned")


@dataclass(frozen=True)
class TuneOptions:
    """`trials`: MetaSchedule trials per fused kernel; `db`: the database folder (made when missing);
    `rpc`: "HOST:PORT:KEY" of a TVM RPC tracker whose servers measure (None: measure on this machine);
    `rpc_workers`: measurements in flight at once over RPC (one per server you want busy);
    `keep`: "faster" (the tuned schedule only where it measured faster than the hand schedule) or "tuned"
    (wherever one exists: to check the tuned kernels' numerics); `kernels`: the PrimFunc names to tune (the
    manifest's groups' `function`, e.g. the slowest ones `tvm-fusion profile` shows), None for all."""

    trials: int
    db: str | os.PathLike
    rpc: str | None = None
    rpc_workers: int = 1
    keep: str = "faster"
    kernels: tuple[str, ...] | None = None  # tune only these fused kernels (PrimFunc names); None: every one


@dataclass
class KernelTuning:
    """One fused kernel: both times as one runner measured them side by side, and which one the build uses."""

    kernel: str  # the PrimFunc's name in the module
    workload: str  # structural hash of the plain compute, hex
    hand_ms: float
    tuned_ms: float | None  # None: no tuned candidate built and ran
    chosen: str  # "tuned" or "hand"
    trials: int  # MetaSchedule trials asked for this kernel (all runs of this database)
    new_trials: int = 0  # trials asked by this call (0: taken from the database)
    measured: int = 0  # candidates MetaSchedule measured in all (fewer than the trials where its space is small)

    @property
    def gain(self) -> float | None:
        """hand ms / tuned ms (> 1: tuning made it faster)."""
        return self.hand_ms / self.tuned_ms if self.tuned_ms else None


@dataclass
class TuneReport:
    kernels: list[KernelTuning]
    db: str
    runner: str
    seconds: float
    skipped: dict = field(default_factory=dict)  # {kernel: why it was not tuned}

    @property
    def new_trials(self) -> int:
        return sum(k.new_trials for k in self.kernels)

    def table(self) -> str:
        rows = [[k.kernel, f"{k.hand_ms:.4f}", "-" if k.tuned_ms is None else f"{k.tuned_ms:.4f}",
                 "-" if k.gain is None else f"{k.gain:.2f}x", k.chosen, k.trials, k.measured,
                 k.new_trials if k.new_trials else "from db"] for k in self.kernels]
        return table(["kernel", "hand ms", "tuned ms", "gain", "uses", "trials", "measured", "new trials"], rows)

    def __str__(self) -> str:
        used = sum(k.chosen == "tuned" for k in self.kernels)
        return (f"tuning ({self.runner}; database {self.db}): {used} of {len(self.kernels)} fused kernels use "
                f"the tuned schedule, {self.new_trials} new trials in {self.seconds:.1f}s\n{self.table()}"
                + "".join(f"\nnot tuned: {k} ({why})" for k, why in self.skipped.items()))

    def manifest(self) -> dict:
        return {"db": self.db, "runner": self.runner, "seconds": round(self.seconds, 2),
                "new_trials": self.new_trials, "measured": sum(k.measured for k in self.kernels),
                "skipped": self.skipped,
                "kernels": [{**asdict(k), "gain": k.gain} for k in self.kernels]}


def parse_rpc(text: str) -> tuple[str, int, str]:
    """"HOST:PORT:KEY" -> (host, port, key); FusionError naming the form otherwise."""
    m = re.fullmatch(r"\[?([^\[\]]+?)\]?:(\d{1,5}):([^:\s]+)", text or "")
    if m is None or not 0 < int(m.group(2)) < 65536:
        raise FusionError(f"--tune-rpc {text!r}: expected HOST:PORT:KEY of a TVM RPC tracker, e.g. "
                          "127.0.0.1:9190:h200 (the key the servers registered with --key)")
    return m.group(1), int(m.group(2)), m.group(3)


def check_options(options: TuneOptions) -> TuneOptions:
    """Options that are wrong before any work: trials, the database folder, the RPC address."""
    if isinstance(options.trials, bool) or not isinstance(options.trials, int) or options.trials < 1:
        raise FusionError(f"--tune {options.trials!r}: give the MetaSchedule trials per fused kernel, 1 or more "
                          "(e.g. --tune 64)")
    db = Path(options.db)
    if db.exists() and not db.is_dir():
        raise FusionError(f"--tune-db {db}: is a file; give a folder (made when missing)")
    try:
        db.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise FusionError(f"--tune-db {db}: cannot make the folder ({err.strerror or err}); "
                          "choose a writable one") from None
    missing = [m for m in ("cloudpickle", "xgboost") if importlib.util.find_spec(m) is None]
    if missing:
        raise FusionError(f"--tune needs {' and '.join(missing)} (MetaSchedule's workers and cost model): "
                          "pip install 'tvm_fusion[tune]'")
    if options.rpc is not None:
        parse_rpc(options.rpc)
    if options.keep not in KEEP:
        raise FusionError(f"TuneOptions(keep={options.keep!r}): use one of {', '.join(KEEP)}")
    if options.rpc_workers < 1:
        raise FusionError(f"--tune-rpc-workers {options.rpc_workers}: use 1 or more")
    return options


#: the build function of our builder workers (registered in each by _register_build)
BUILD_FUNC = "tvm_fusion.tune.build"
#: seconds a builder worker may take for one candidate (its first also imports TVM: slow on a loaded host)
BUILD_TIMEOUT_S = 300


def _build(mod, target, _params):
    """MetaSchedule's default_build without its import of every vendor's tensor intrinsics (a minute on a
    loaded 2-core host, in every worker): a tensorized candidate already carries the intrinsic's body."""
    return tvm.tirx.build(_tvm.RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


def _register_build() -> None:
    """Run in each builder worker process: register _build as BUILD_FUNC."""
    import tvm_ffi

    tvm_ffi.register_global_func(BUILD_FUNC, _build, override=True)


def _builder():
    """MetaSchedule's LocalBuilder, one worker per core this process may use (processes, never threads)."""
    ms = _tvm.meta_schedule()
    return ms.builder.LocalBuilder(max_workers=_cores(), timeout_sec=BUILD_TIMEOUT_S, f_build=BUILD_FUNC,
                                   initializer=_register_build)


def _device_type(target) -> str:
    """The runtime's device name for a target (what RunnerInput takes): cpu for llvm."""
    return {"llvm": "cpu"}.get(target.kind.name, target.kind.name)


def _symbolic(func) -> bool:
    return any(not isinstance(d, _tvm.tirx.IntImm) for buf in func.params for d in buf.shape)


def _quiet_logs() -> None:
    """MetaSchedule's console log at WARNING (its log files under DB/logs keep everything). Its logger setup
    lists the logger's handlers by name and fails on an unnamed one (pytest's capture handlers): drop those,
    as its dictConfig would."""
    logger = logging.getLogger("tvm.s_tir.meta_schedule")
    logger.setLevel(logging.WARNING)
    for handler in [h for h in logger.handlers if h.get_name() is None]:
        logger.removeHandler(handler)


def _cores() -> int:
    return _tvm.HOST_CORES


def _workload(plain) -> "tvm.IRModule":
    """The module MetaSchedule tunes and keys the database by: the plain compute as `main`."""
    return tvm.IRModule({"main": plain.with_attr("global_symbol", "main")})


def _runner(options: TuneOptions, evaluator=None):
    ms = _tvm.meta_schedule()
    if options.rpc is None:
        return ms.runner.LocalRunner(evaluator_config=evaluator)
    host, port, key = parse_rpc(options.rpc)
    config = ms.runner.RPCConfig(tracker_host=host, tracker_port=port, tracker_key=key, session_timeout_sec=60)
    return ms.runner.RPCRunner(config, evaluator, max_workers=options.rpc_workers)


def _runner_name(options: TuneOptions) -> str:
    if options.rpc is None:
        return "measured on this machine"
    host, port, key = parse_rpc(options.rpc)
    return f"measured over RPC: tracker {host}:{port}, key {key}"


def _check_device(target, options: TuneOptions) -> None:
    """Tuning for CUDA measures on a GPU: here (one present) or on RPC servers."""
    if target.kind.name == "cuda" and options.rpc is None and not _tvm.has_cuda_device():
        raise FusionError("--tune for --target cuda measures every candidate on a GPU, and this machine has none "
                          "(tvm.cuda(0).exist is False); pass --tune-rpc HOST:PORT:KEY of a TVM RPC tracker whose "
                          "servers have the GPU (README: 'Tuning on a build farm'), or run the compile on the GPU host")


class _Choices:
    """`tvm_fusion_choices.json` in the database folder: {target: {workload hash: what was chosen}}."""

    def __init__(self, db: Path, target):
        self.path, self.target = db / CHOICES_FILE, str(target)
        self.all = json.loads(self.path.read_text()) if self.path.exists() else {}

    def get(self, workload: str) -> dict | None:
        return self.all.get(self.target, {}).get(workload)

    def put(self, k: KernelTuning) -> None:
        self.all.setdefault(self.target, {})[k.workload] = {
            "kernel": k.kernel, "hand_ms": k.hand_ms, "tuned_ms": k.tuned_ms, "trials": k.trials,
            "measured": k.measured}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.all, indent=1, sort_keys=True))
        os.replace(tmp, self.path)


def _records(db, workload_mod, target) -> list:
    """This target's tuning records of a workload that built and ran, best first."""
    if not db.has_workload(workload_mod):
        return []
    records = db.get_top_k(db.commit_workload(workload_mod), 1 << 30)
    return [r for r in records if str(r.target) == str(target) and r.run_secs]


def _tuned_func(db, workload_mod, target):
    """The best tuned schedule of a workload for `target` as a PrimFunc (None without a record)."""
    records = _records(db, workload_mod, target)
    if not records:
        return None
    sch = _tvm.Schedule(workload_mod)
    records[0].trace.apply_to_schedule(sch, remove_postproc=False)
    return sch.mod["main"]


class _Progress:
    """One bar over the trials of every kernel being tuned, described by the kernel measured last."""

    def __init__(self, names: list[str], trials: int):
        self.names = names
        self.bar = progress(range(len(names) * trials), "tuning")
        self.measured = dict.fromkeys(names, 0)  # candidates measured per kernel

    def callback(self):
        ms = _tvm.meta_schedule()
        outer = self

        @_tvm.derived_object
        class _Tick(ms.measure_callback.PyMeasureCallback):
            def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
                name = outer.names[task_id]
                outer.bar.describe(f"tuning {name}")
                outer.measured[name] += len(runner_results)
                for _ in runner_results:
                    outer.bar.update()

        return _Tick()


def _strategy(trials: int):
    """Evolutionary search sized to the trials: MetaSchedule's defaults (population 512, 4 generations) cost
    about a minute per kernel even for 4 trials; a few trials need a far smaller population."""
    ms = _tvm.meta_schedule()
    population = min(512, max(64, 8 * trials))
    return ms.search_strategy.EvolutionarySearch(population_size=population,
                                                 init_min_unmeasured=min(50, population // 2),
                                                 genetic_num_iters=4 if trials >= 64 else 2)


def _tune(todo: dict, trials: int, target, options: TuneOptions, db, builder, work_dir: Path) -> dict:
    """Run `trials` MetaSchedule trials for each {name: workload module} in `todo` (one task scheduler);
    returns {name: candidates measured}."""
    ms = _tvm.meta_schedule()
    _quiet_logs()  # each time: MetaSchedule's logger setup leaves its logger at DEBUG
    names = sorted(todo)
    cores = _cores()
    tick = _Progress(names, trials)
    tasks = [ms.TuneContext(mod=todo[n], target=target, space_generator="post-order-apply",
                            search_strategy=_strategy(trials), task_name=n, num_threads=cores,
                            logger=logger, rand_state=seed).clone()
             for n, logger, seed in zip(names, ms.logging.get_loggers_from_work_dir(str(work_dir), names),
                                        ms.utils.fork_seed(0, n=len(names)))]
    try:
        ms.tune.tune_tasks(tasks=tasks, task_weights=[1.0] * len(tasks), work_dir=str(work_dir),
                           max_trials_global=trials * len(tasks), max_trials_per_task=trials,
                           num_trials_per_iter=min(64, trials), builder=builder,
                           runner=_runner(options), database=db,
                           cost_model=ms.cost_model.XGBModel(num_tuning_cores=cores),
                           measure_callbacks=[*ms.measure_callback.MeasureCallback.create("default"), tick.callback()],
                           task_scheduler="round-robin")
    finally:
        tick.bar.close()
    return tick.measured


def _measure(funcs: list, args_info, target, options: TuneOptions, builder) -> list[float | None]:
    """Median ms of each PrimFunc in `funcs`, built by `builder` and run by one runner side by side
    (COMPARE_ROUNDS interleaved rounds); None for one that fails to build or run."""
    ms = _tvm.meta_schedule()
    built = builder.build([ms.builder.BuilderInput(tvm.IRModule({"main": f.with_attr("global_symbol", "main")}),
                                                   target) for f in funcs])
    runner = _runner(options, ms.runner.EvaluatorConfig(number=3, repeat=3, min_repeat_ms=50))
    times: list[list[float]] = [[] for _ in funcs]
    for _ in range(COMPARE_ROUNDS):
        inputs = [(i, ms.runner.RunnerInput(b.artifact_path, _device_type(target), args_info))
                  for i, b in enumerate(built) if b.error_msg is None]
        for (i, _), future in zip(inputs, runner.run([x for _, x in inputs])):
            result = future.result()
            if result.error_msg is None:
                times[i].extend(float(s) * 1e3 for s in result.run_secs)
    return [statistics.median(t) if t else None for t in times]


def _chosen(hand_ms: float, tuned_ms: float | None, keep: str) -> str:
    return "tuned" if tuned_ms is not None and (keep == "tuned" or tuned_ms < hand_ms) else "hand"


def _decide(name: str, workload: str, hand, tuned, trials: int, new: int, measured: int, target, options, builder,
            args_info) -> KernelTuning:
    hand_ms, tuned_ms = _measure([hand] + ([tuned] if tuned is not None else []), args_info, target, options,
                                 builder) + ([None] if tuned is None else [])
    if hand_ms is None:
        raise FusionError(f"tuning: the hand-scheduled kernel {name} did not build or run under MetaSchedule's "
                          f"runner ({_runner_name(options)}); check the RPC servers, or compile without --tune")
    return KernelTuning(name, workload, hand_ms, tuned_ms, _chosen(hand_ms, tuned_ms, options.keep), trials, new,
                        measured)


def tune_fused(mod, plain: dict, target, options: TuneOptions):
    """(`mod` with each fused kernel in `plain` replaced by its tuned schedule where that measured faster,
    TuneReport). `plain`: {PrimFunc name: the plain compute its hand schedule took} (FuseResult.plain)."""
    options = check_options(options)
    start = time.perf_counter()
    db_dir = Path(options.db)
    choices = _Choices(db_dir, target)
    plain = _selected(plain, options.kernels)
    skipped = {name: "a symbolic dim: MetaSchedule measures fixed shapes" for name, f in plain.items() if _symbolic(f)}
    for runs_on, what in HAND_WRITTEN:
        skipped.update({name: f"{what}, not a compute MetaSchedule schedules" for name, f in plain.items()
                        if name not in skipped and runs_on(f)})
    workloads = {name: _workload(f) for name, f in sorted(plain.items()) if name not in skipped}
    keys = {name: f"{_tvm.structural_hash(w):016x}" for name, w in workloads.items()}
    had = {name: (choices.get(keys[name]) or {}).get("trials", 0) for name in workloads}
    more = {name: options.trials - had[name] for name in workloads if had[name] < options.trials}
    if more:
        _check_device(target, options)
    ms = _tvm.meta_schedule(target.kind.name)
    db = ms.database.JSONDatabase(work_dir=str(db_dir), module_equality="structural")
    builder = _builder()
    measured = {}
    for trials in sorted(set(more.values())):  # kernels tuned before with fewer trials get the rest
        measured.update(_tune({n: workloads[n] for n, t in more.items() if t == trials}, trials, target, options,
                              db, builder, db_dir))  # MetaSchedule writes its logs to DIR/logs
    kernels = []
    for name, w in workloads.items():
        if name not in more:
            c = choices.get(keys[name])
            chosen = _chosen(c["hand_ms"], c["tuned_ms"], options.keep)
            kernels.append(KernelTuning(name, keys[name], c["hand_ms"], c["tuned_ms"], chosen, c["trials"], 0,
                                        c.get("measured", 0)))
            continue
        prior = (choices.get(keys[name]) or {}).get("measured", 0)
        k = _decide(name, keys[name], mod[name], _tuned_func(db, w, target), options.trials, more[name],
                    prior + measured[name], target, options, builder, ms.arg_info.ArgInfo.from_prim_func(plain[name]))
        choices.put(k)
        kernels.append(k)
    out = mod
    for k in kernels:
        if k.chosen == "tuned":
            func = _tuned_func(db, workloads[k.kernel], target)
            if func is None:
                raise FusionError(f"--tune-db {db_dir}: {CHOICES_FILE} says kernel {k.kernel} (workload {k.workload}) "
                                  "uses a tuned schedule, but the database has no record of it for this target; "
                                  "delete the folder's files or use another --tune-db")
            out = _replace(out, k.kernel, func, mod[k.kernel])
    return out, TuneReport(kernels, str(db_dir), _runner_name(options), time.perf_counter() - start, skipped)


def _selected(plain: dict, kernels) -> dict:
    """The fused kernels named in `kernels` (all without); FusionError for a name that is not one of them."""
    if kernels is None:
        return plain
    unknown = [k for k in kernels if k not in plain]
    if unknown:
        raise FusionError(f"--tune-kernels {unknown[0]}: not a fused kernel of this model; "
                          f"{close_names(unknown[0], set(plain))}")
    return {k: plain[k] for k in kernels}


def _replace(mod, name: str, tuned, hand):
    """`mod` with PrimFunc `name` replaced by `tuned`, carrying the hand-scheduled function's attributes."""
    func = tuned.without_attr("global_symbol")
    for key, value in (hand.attrs or {}).items():
        func = func.with_attr(key, value)
    out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    out[mod.get_global_var(name)] = func
    return out
