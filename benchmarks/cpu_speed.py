"""CPU speed against onnxruntime, model by model: the nine light architectures, the zoo corpus, its cross-layer
models at their published widths (`--models full`: corpus.FULL_SIZE, exported on first use by make_zoo.py --full,
which needs torch, and cached) and QDQ int8 models at realistic sizes (`--models qdq`: qdq_models.py, made on
the fly and cached).

    python benchmarks/cpu_speed.py                                       # this CPU's own target
    python benchmarks/cpu_speed.py --target '{"kind":"llvm","mcpu":"x86-64-v3"}'   # forced AVX2
    TVM_FUSION_CPU='{"kind":"llvm","mcpu":"x86-64-v3"}' python benchmarks/cpu_speed.py   # the same
    python benchmarks/cpu_speed.py --models alexnet,bert_ts14 --threads 1,2 --rounds 9
    python benchmarks/cpu_speed.py --models mobilenetv2_ts13,resnet_stem_ts17 --threads 1 --modes unfused,tvm,fused
    python benchmarks/cpu_speed.py --models resnet50 --threads 1,2 --clock both --modes fused,no-chunks
    python benchmarks/cpu_speed.py --models resnet50,vgg19 --threads 1 --clock cpu --modes fused,nchw
    python benchmarks/cpu_speed.py --models vgg19,inception_v2 --threads 1,2 --clock both --modes fused,no-winograd
    python benchmarks/cpu_speed.py --models resnet50 --threads 1,2 --modes fused,bf16      # bfloat16 (AMX)

For each model (tvm_fusion.examples with seeded weights, and tests/zoo through the simplifier, on the
corpus entries' own inputs) the fused build is checked element-wise against onnxruntime (the
tvm_fusion.check.numerics table), then timed against onnxruntime at each thread count: TVM's pool and
onnxruntime's intra-op pool both set to that count, `--rounds` interleaved rounds, each one block of
fused runs then one block of onnxruntime runs (blocks of about `--block-ms`), and the medians of the
per-block means compared (`--modes unfused,tvm,fused`: the unfused and TVM-default builds too, each checked
against onnxruntime and timed in the same rounds, with their kernel calls). onnxruntime's worker threads are told not to spin (they would otherwise steal
the cores from TVM's next block). `--busy N` times a shared host: N other processes spin on the cores while
the blocks run (`TVM_THREAD_POOL_SPIN_COUNT=0` in the environment makes TVM's idle workers sleep). Prints one markdown table per thread count with the geometric mean of
fused / onnxruntime; exits 1 if a fused build is out of tolerance. A QDQ model out of tolerance against
onnxruntime passes when it differs from onnxruntime's unoptimized session (the graph as ONNX defines it) by
no more than onnxruntime's optimized session does (a value that rounds the other way before a quantize moves
whole quantization steps; the row says so).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "zoo"))

from tvm_fusion._tvm import relax, tvm  # noqa: E402
from tvm_fusion.build.builder import build, resolve_target  # noqa: E402
from tvm_fusion.build.mixed_precision import convert  # noqa: E402
from tvm_fusion.precision import PRECISIONS  # noqa: E402
from tvm_fusion.check.compare import as_arrays, check_modes  # noqa: E402
from tvm_fusion.check.numerics import error_stats  # noqa: E402


def _light(name: str):
    """(module, onnx model, feeds in graph order) of a light architecture."""
    from tvm_fusion.frontend import importer as frontend
    from tvm_fusion.check.compare import random_inputs
    from tvm_fusion.examples import example_path

    proto = onnx.load(str(example_path(name)))
    return frontend.import_onnx(proto), proto, random_inputs(proto)


def _zoo(name: str):
    from corpus import make_inputs, model_path
    from test_zoo import imported

    return imported(name), onnx.load(str(model_path(name))), make_inputs(name)


def _qdq(name: str):
    from qdq_models import inputs, qdq_path

    from tvm_fusion.frontend import importer as frontend

    proto = onnx.load(str(qdq_path(name)))
    return frontend.import_onnx(proto), proto, inputs(proto)


def _full(name: str):
    """A corpus model at its published width (corpus.FULL_SIZE), on its checked-in entry's inputs."""
    from corpus import FULL_SIZE, full_size_path, make_inputs, shapes

    import tvm_fusion as tf

    base, path = FULL_SIZE[name][0], full_size_path(name)
    return tf.import_onnx(path, shapes(base)), onnx.load(str(path)), make_inputs(base)


LOADERS = {"light": _light, "zoo": _zoo, "qdq": _qdq, "full": _full}


def model_names() -> dict[str, str]:
    """model name -> 'light', 'zoo', 'full' or 'qdq', in table order."""
    from corpus import ENTRIES, FULL_SIZE
    from qdq_models import QDQ_MODELS

    from tvm_fusion.examples import EXAMPLES

    return {**{n: "light" for n in EXAMPLES}, **{n: "zoo" for n in ENTRIES}, **{n: "full" for n in FULL_SIZE},
            **{n: "qdq" for n in QDQ_MODELS}}


def _within_reference_noise(proto, feeds, out, stats) -> str | None:
    """For a QDQ model over tolerance: a note when every output differs from onnxruntime's unoptimized session
    by no more (max |d|) than onnxruntime's optimized session does, else None."""
    if not any(n.op_type == "QuantizeLinear" for n in proto.graph.node):
        return None
    from tvm_fusion.check.io import run_onnxruntime

    plain = run_onnxruntime(proto, feeds, optimize=False)[0].run(None, feeds)
    optimized = ort_session(proto, 1).run(None, feeds)
    ours = [float(abs(a.astype("float64") - r).max()) for a, r in zip(out, plain)]
    theirs = [float(abs(o.astype("float64") - r).max()) for o, r in zip(optimized, plain)]
    if any(a > b for a, b in zip(ours, theirs)):
        return None
    return ("QDQ: within onnxruntime's own optimized-vs-unoptimized difference (max |d| vs the unoptimized "
            f"session {max(ours):.3g}, onnxruntime optimized {max(theirs):.3g}; {stats})")


def set_tvm_threads(n: int) -> int:
    """Resize TVM's CPU pool to `n` threads; returns the count it reports."""
    tvm.get_global_func("runtime.config_threadpool")(1, n)  # 1: the big cores (all of them on x86)
    return int(tvm.get_global_func("runtime.NumThreads")())


def ort_session(proto, threads: int, profile_prefix: str | None = None):
    """onnxruntime on `threads` intra-op threads, all graph optimizations (its default); its profiler
    writing to `profile_prefix` when given."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if profile_prefix:
        opts.enable_profiling, opts.profile_file_prefix = True, profile_prefix
    return ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])


CLOCKS = ("wall", "cpu")  # time.perf_counter; time.process_time (this process's CPU time, all its threads)


def _block(fn, number: int) -> dict[str, float]:
    """Mean seconds per run of a block of `number` runs, on each clock."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(number):
        fn()
    return {"wall": (time.perf_counter() - wall) / number, "cpu": (time.process_time() - cpu) / number}


def interleaved(fns: dict, rounds: int, block_ms: float) -> dict[str, dict]:
    """clock -> {name: ms}: for each of `fns` ({name: callable}), the median over `rounds` of the mean of a
    block of runs (about `block_ms` long), the blocks alternating; both clocks read around the same blocks."""
    for f in fns.values():
        f()  # warm up
    number = {k: max(1, int(block_ms / 1e3 / max(_block(f, 1)["wall"], 1e-6))) for k, f in fns.items()}
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            times[k].append(_block(f, number[k]))
    return {c: {k: 1e3 * statistics.median(t[c] for t in times[k]) for k in fns} for c in CLOCKS}


def interleaved_ms(fused, ort, rounds: int, block_ms: float) -> dict[str, tuple[float, float]]:
    """clock -> (fused ms, onnxruntime ms): `interleaved` of the two."""
    ms = interleaved({"fused": fused, "ort": ort}, rounds, block_ms)
    return {c: (ms[c]["fused"], ms[c]["ort"]) for c in CLOCKS}


@contextlib.contextmanager
def busy_processes(count: int):
    """`count` other processes, each spinning on a core, while the block runs (a host shared with other jobs)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


#: a benchmark-only build: fused with the cross-layer rules (conv -> pool, depthwise -> pointwise, pointwise ->
#: depthwise) disabled, so each of their groups runs as the two kernels it replaces
NO_CROSS = "no-cross"
#: a benchmark-only build: fused with the tiled convs' whole reduction per tile of pixels, their reduction
#: chunks (`schedules/llvm/conv2d.reduction_chunk`) off
NO_CHUNKS = "no-chunks"
#: a benchmark-only build: fused with the 3x3 stride-1 convs on the direct kernel, the Winograd conv
#: (`schedules/llvm/conv2d_winograd.py`) off
NO_WINOGRAD = "no-winograd"
#: a benchmark-only build: fused with every kernel's tensors in NCHW, no conv chain in NCHW[x]c
#: (`fusion/chain_layout.py`)
NCHW_ONLY = "nchw"
#: benchmark-only builds: the float32 model converted (`--precision bf16` / `fp16`: build.mixed_precision) and
#: fused; their error against onnxruntime's float32 model is reported, not judged (`compare --precision` judges
#: a converted model, per group where the dtype cannot carry the whole model: ResNet-50 in bfloat16)
HALF_MODES = ("bf16", "fp16")
BENCH_MODES = (NO_CROSS, NO_CHUNKS, NO_WINOGRAD, NCHW_ONLY, *HALF_MODES)


@contextlib.contextmanager
def reduction_chunks_off():
    """The llvm conv plans without reduction chunks while the block runs (the step costs restored after)."""
    from dataclasses import replace

    from tvm_fusion.schedules.llvm import conv2d

    keep = conv2d.TILED_STEP_COSTS
    conv2d.TILED_STEP_COSTS = {isa: replace(cost, chunked_reduction=False) for isa, cost in keep.items()}
    try:
        yield
    finally:
        conv2d.TILED_STEP_COSTS = keep


@contextlib.contextmanager
def winograd_off():
    """The llvm conv plans without the Winograd conv while the block runs."""
    from tvm_fusion.schedules.llvm import conv2d_winograd

    keep = conv2d_winograd.WINOGRAD_ISAS
    conv2d_winograd.WINOGRAD_ISAS = ()
    try:
        yield
    finally:
        conv2d_winograd.WINOGRAD_ISAS = keep


def cross_layer_off():
    """The built-in rules but the cross-layer families' (patterns/conv_pool.py, depthwise_pointwise.py,
    pointwise_depthwise.py)."""
    from tvm_fusion.fusion.loader import load_rules_for

    cross = [r.name for r in load_rules_for()
             if r.name.endswith("_pool") or r.name.startswith(("depthwise_", "pointwise_"))]
    return load_rules_for(disable=cross)


def _builds(mod, target, modes, args, ref, dev) -> tuple[dict, dict, list, list]:
    """{mode: VM main} and {mode: kernel calls} of `mod` built in each of `modes`, the fused build's outputs,
    and (mode, error stats) of every build's outputs against `ref` (onnxruntime)."""
    mains, calls, outs, stats = {}, {}, {}, []
    for mode in modes:
        if mode == NO_CROSS:
            built = build(mod, target, "fused", rules=cross_layer_off())
        elif mode == NO_CHUNKS:
            with reduction_chunks_off():
                built = build(mod, target, "fused")
        elif mode == NO_WINOGRAD:
            with winograd_off():
                built = build(mod, target, "fused")
        elif mode == NCHW_ONLY:
            built = build(mod, target, "fused", blocked_layout=False)
        elif mode in HALF_MODES:
            built = build(convert(mod, mode), target, "fused")
        else:
            built = build(mod, target, mode)
        mains[mode] = relax.VirtualMachine(built.executable, dev)["main"]
        calls[mode], outs[mode] = built.kernel_calls, as_arrays(mains[mode](*args))
        dtype = PRECISIONS.get(mode)
        stats += [(mode, error_stats(a.astype("float32") if dtype else a, r, dtype)) for a, r in zip(outs[mode], ref)]
    return mains, calls, outs["fused"], stats


def measure(name: str, kind: str, target, threads: list[int], rounds: int, block_ms: float,
            busy: int = 0, modes=("fused",)) -> dict:
    """The model's row: its builds in `modes` (fused among them) checked against onnxruntime, then timed with
    it at each thread count in the same interleaved rounds. row[clock][threads] is (fused ms, onnxruntime
    ms); row["ms"][clock][threads] has every mode's ms and "ort"."""
    mod, proto, feeds = LOADERS[kind](name)
    dev = tvm.cpu()
    order = [i.name for i in proto.graph.input if i.name in feeds]
    args = [tvm.runtime.tensor(feeds[k], dev) for k in order]
    ref = ort_session(proto, max(threads)).run(None, feeds)
    mains, calls, out, stats = _builds(mod, target, modes, args, ref, dev)
    named = lambda mode, s: s.describe() if mode == "fused" else f"{mode}: {s.describe()}"  # noqa: E731
    judged = [(m, s) for m, s in stats if m not in HALF_MODES]
    row = {"model": name, "kind": kind, "ok": all(s.ok for _, s in judged), "calls": calls,
           "error": "; ".join(named(m, s) for m, s in judged if not s.ok), "ms": {c: {} for c in CLOCKS},
           **{c: {} for c in CLOCKS}}
    half = [f"{m} vs onnxruntime's float32 model: max rel err {s.max_rel:.2g} (reported)" for m, s in stats
            if m in HALF_MODES]
    note = None if row["ok"] else _within_reference_noise(proto, feeds, out, row["error"])
    if note:
        row.update(ok=True, error="", note=note)
    if half:
        row["note"] = "; ".join(filter(None, [row.get("note"), *dict.fromkeys(half)]))
    for n in threads:
        set_tvm_threads(n)
        sess = ort_session(proto, n)
        runs = {**{m: (lambda f=f: f(*args)) for m, f in mains.items()}, "ort": lambda: sess.run(None, feeds)}
        with busy_processes(busy):
            ms = interleaved(runs, rounds, block_ms)
        for c in CLOCKS:
            row[c][n], row["ms"][c][n] = (ms[c]["fused"], ms[c]["ort"]), ms[c]
    return row


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def table(rows: list[dict], threads: int, clock: str = "wall") -> str:
    lines = ["| model | fused ms | onnxruntime ms | fused / ort |", "|---|---|---|---|"]
    ratios = []
    for r in rows:
        fused, ort = r[clock][threads]
        ratios.append(fused / ort)
        flag = " (OUT OF TOLERANCE)" if not r["ok"] else " (QDQ: within onnxruntime's own noise)" if r.get("note") else ""
        lines.append(f"| {r['model']}{flag} | {fused:.3g} | {ort:.3g} | {fused / ort:.2f}x |")
    lines.append(f"| **geometric mean** ({len(ratios)} models) | | | **{geomean(ratios):.2f}x** |")
    worst = max(rows, key=lambda r: r[clock][threads][0] / r[clock][threads][1])
    lines.append(f"\nworst: {worst['model']} {worst[clock][threads][0] / worst[clock][threads][1]:.2f}x")
    return "\n".join(lines)


def _ratio(r: float) -> str:
    return f"{r:.2f}x" if r < 10 else f"{r:.1f}x"


def modes_table(rows: list[dict], threads: int, modes, clock: str = "wall") -> str:
    """One row per model: kernel calls and ms of each build in `modes`, onnxruntime's ms, each other mode's
    time over the fused build's, and fused over onnxruntime."""
    others = [m for m in modes if m != "fused"]
    head = (["model", f"kernel calls {' / '.join(modes)}", *(f"{m} ms" for m in modes), "onnxruntime ms",
             *(f"{m} / fused" for m in others), "fused / ort"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ms = r["ms"][clock][threads]
        flag = " (OUT OF TOLERANCE)" if not r["ok"] else ""
        cells = [f"{r['model']}{flag}", " / ".join(str(r["calls"][m]) for m in modes),
                 *(f"{ms[m]:.3g}" for m in modes), f"{ms['ort']:.3g}",
                 *(_ratio(ms[m] / ms["fused"]) for m in others), f"{ms['fused'] / ms['ort']:.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    names = model_names()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="llvm",
                    help="'llvm' (this CPU, or TVM_FUSION_CPU) or a JSON llvm target, e.g. "
                         "'{\"kind\":\"llvm\",\"mcpu\":\"x86-64-v3\"}' for AVX2")
    ap.add_argument("--models", default="all",
                    help=f"comma separated, or 'all' (but full), 'light', 'zoo', 'full', 'qdq'; of: {', '.join(names)}")
    ap.add_argument("--threads", default="1,2", help="thread counts to time at, comma separated")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (a block of each runtime per round)")
    ap.add_argument("--block-ms", type=float, default=150.0, help="about how long one block of runs takes")
    ap.add_argument("--clock", choices=(*CLOCKS, "both"), default="wall",
                    help="wall: elapsed time; cpu: this process's CPU time (time.process_time: robust to other "
                         "processes taking the cores, at 1 thread); both: one table of each, from the same blocks")
    ap.add_argument("--modes", default="fused",
                    help="builds to time, comma separated, fused among them: fused (default), unfused (one kernel "
                         "per op), tvm (TVM's own FuseOps), no-cross (fused without the cross-layer rules: their "
                         "groups as two kernels), no-chunks (fused, the tiled convs' reductions in one pass per "
                         "tile), no-winograd (fused, 3x3 convs on the direct kernel), nchw (fused, no conv chain "
                         "in NCHW[x]c), bf16 / fp16 (the model converted, then fused: "
                         "AMX tiles for its convs where the CPU has them); more than fused prints one column of each")
    ap.add_argument("--busy", type=int, default=0,
                    help="other processes spinning on the cores while timing (a shared host)")
    args = ap.parse_args(argv)
    groups = {"all": [n for n, k in names.items() if k != "full"],  # the full-size exports need torch
              **{kind: [n for n, k in names.items() if k == kind] for kind in ("light", "zoo", "full", "qdq")}}
    models = groups.get(args.models) or [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in names]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(names)}")
    threads = [int(t) for t in args.threads.split(",") if t]
    asked = [m for m in args.modes.split(",") if m]
    modes = check_modes([m for m in asked if m not in BENCH_MODES]) + [m for m in BENCH_MODES if m in asked]
    if "fused" not in modes:
        ap.error(f"--modes {args.modes}: include fused (the ratios are to the fused build)")
    target = resolve_target(args.target)
    rows = []
    for name in models:
        t0 = time.perf_counter()
        row = measure(name, names[name], target, threads, args.rounds, args.block_ms, args.busy, modes)
        rows.append(row)
        speeds = ", ".join(f"{n}t {c} {f:.1f}/{o:.1f} ms" for c in CLOCKS for n, (f, o) in row[c].items())
        print(f"{name}: {speeds}{'' if row['ok'] else ' FAIL ' + row['error']}{' (' + row['note'] + ')' if row.get('note') else ''} "
              f"({time.perf_counter() - t0:.0f}s)", file=sys.stderr, flush=True)
    busy = f"; {args.busy} other processes spinning" if args.busy else ""
    spin = os.environ.get("TVM_THREAD_POOL_SPIN_COUNT")
    spin = f"; TVM_THREAD_POOL_SPIN_COUNT={spin}" if spin is not None else ""
    print(f"\ntarget {target}; batch 1; medians of {args.rounds} interleaved rounds (blocks of ~{args.block_ms:.0f} ms)"
          f"{busy}{spin}")
    for clock in (CLOCKS if args.clock == "both" else (args.clock,)):
        for n in threads:
            print(f"\n### {n} thread{'s' if n > 1 else ''} (TVM pool and onnxruntime intra-op), {clock} time\n")
            print(table(rows, n, clock) if modes == ["fused"] else modes_table(rows, n, modes, clock))
    failures = [f"{r['model']}: {r['error']}" for r in rows if not r["ok"]]
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
