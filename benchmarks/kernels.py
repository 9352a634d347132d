"""A fused llvm build's kernels alone: CPU time per call, one thread, per kernel (`--match` picks them).

    python benchmarks/kernels.py --model ppocr_det --match conv2d_transpose     # tests/zoo entry
    python benchmarks/kernels.py --model resnet50 --match conv2d --rounds 9      # a light architecture
    python benchmarks/kernels.py --model shufflenet --target '{"kind":"llvm","mcpu":"x86-64-v3"}'
    python benchmarks/kernels.py --model squeezenet --ort               # and onnxruntime's nodes
    python benchmarks/kernels.py --model squeezenet --ort --threads 2   # both at 2 threads, wall time
    python benchmarks/kernels.py --model resnet50 --ort --in-model      # each call inside the model too
    python benchmarks/kernels.py --model resnet50 --match conv --ort --precision bf16   # AMX convs vs fp32 nodes

Builds the model fused, takes every PrimFunc whose name contains `--match` (as the fused build scheduled
it: rules' kernels and leftovers alike), compiles it alone and times it on random inputs of its parameter
shapes: `--rounds` blocks of about `--block-ms`, the median of the per-block mean CPU time
(time.process_time), TVM's pool at one thread. Kernels of the same PrimFunc called at several sites are
timed once. To compare two versions of a schedule, run it on both checkouts: the names and shapes line up.

`--ort` also profiles onnxruntime on the model's own inputs (its profiler, `--threads` intra-op threads, all
graph optimizations, `--ort-runs` inferences): each node's median `dur` (wall time of the node), a table of
nodes by time (op type, output shape), and next to each of our kernels the onnxruntime nodes with the same
first input and output shape (else output shape), the one whose second input (a conv's weights) is nearest
in size to ours first. `--threads N` (N > 1) times our kernels on N threads by wall time instead of CPU time.

`--in-model` also times every kernel call inside the model (VirtualMachine.set_instrument around each call,
`--in-model-runs` inferences, the median per call site on the same clock) and the whole inference without the
instrument, then prints one row per call site: in the model, alone (the PrimFunc timed above, when `--match`
took it), and with `--ort` the onnxruntime node run at the same place (nodes and call sites paired in order
by first input and output shape, else output shape), sorted by the gap to it; and the sums against the whole
inference (what is left is the VM's own work between kernels: allocation, reshapes, the instrument's calls).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_speed import LOADERS, _block, model_names, ort_session, set_tvm_threads

from tvm_fusion._tvm import relax, tirx, tvm
from tvm_fusion.build.builder import build, resolve_target
from tvm_fusion.build.mixed_precision import convert
from tvm_fusion.precision import numpy_dtype


def _median_ms(fn, rounds: int, block_ms: float, clock: str = "cpu") -> float:
    """Median over `rounds` blocks of about `block_ms` of the mean time per call on `clock`, in ms."""
    fn()
    number = max(1, int(block_ms / 1e3 / max(_block(fn, 1)[clock], 1e-6)))
    return 1e3 * statistics.median(_block(fn, number)[clock] for _ in range(rounds))


def _shape(args: dict, key: str, i: int = 0) -> tuple[int, ...]:
    """The shape of a profiled node's i-th input or output (`[{"float": [1, 64, 55, 55]}, ...]`); () if none."""
    tensors = args.get(key) or []
    return tuple(next(iter(tensors[i].values()), ())) if i < len(tensors) else ()


def ort_nodes(proto, feeds, threads: int, runs: int) -> list[dict]:
    """onnxruntime's nodes: name, op, output shape (first output), median ms per run, calls per run."""
    warm = 3  # runs whose events are dropped
    with tempfile.TemporaryDirectory() as tmp:
        sess = ort_session(proto, threads, os.path.join(tmp, "ort"))
        for _ in range(warm + runs):
            sess.run(None, feeds)
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    durs, info = defaultdict(list), {}
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        name = e["name"][: -len("_kernel_time")]
        durs[name].append(e["dur"] / 1e3)  # microseconds
        info.setdefault(name, (e["args"].get("op_name", "?"), _shape(e["args"], "input_type_shape"),
                               _shape(e["args"], "output_type_shape"), _shape(e["args"], "input_type_shape", 1)))
    return [{"name": n, "op": info[n][0], "input": info[n][1], "shape": info[n][2], "second": info[n][3],
             "ms": statistics.median(d[len(d) * warm // (warm + runs):]), "calls": len(d) / (warm + runs)}
            for n, d in durs.items()]


def _print_ort(nodes: list[dict], threads: int) -> None:
    total = sum(n["ms"] * n["calls"] for n in nodes)
    print(f"\nonnxruntime nodes, {threads} intra-op thread(s), median wall ms per node: {total:.3f} ms in all")
    by_op = defaultdict(float)
    for n in nodes:
        by_op[n["op"]] += n["ms"] * n["calls"]
    print("  by op type: " + ", ".join(f"{op} {ms:.3f}" for op, ms in sorted(by_op.items(), key=lambda kv: -kv[1])))
    for n in sorted(nodes, key=lambda n: -n["ms"]):
        print(f"  {n['name']:40s} {n['op']:22s} {'x'.join(map(str, n['shape'])):16s} {n['ms']:.3f} ms")


def in_model_sites(executable, args, runs: int, clock: str, ort_run=None) -> tuple[list[dict], dict]:
    """Every kernel call of one inference: symbol, first input and output shape, median ms per call over `runs`
    instrumented inferences on `clock`; and medians (ms) of: a whole inference without the instrument ("whole",
    on a second VM, one run after each instrumented one), with it ("instrumented"), its VM builtins' calls
    summed ("builtins": allocation, reshapes); with `ort_run`, one onnxruntime inference after each ("ort")."""
    read = time.process_time if clock == "cpu" else time.perf_counter
    vm, plain = (relax.VirtualMachine(executable, tvm.cpu()) for _ in range(2))
    plain["main"](*args)
    sites: list[dict] = []
    times: list[list[float]] = []
    totals = defaultdict(list)
    for run in range(runs + 1):  # the first run only lists the calls
        events, builtins, start = [], [], [0.0]

        def instrument(func, symbol, before_run, ret_value, *call_args, events=events, builtins=builtins,
                       start=start, first=run == 0):
            if before_run:
                start[0] = read()
                return 0
            ms = 1e3 * (read() - start[0])
            if str(symbol).startswith("vm.builtin."):
                builtins.append(ms)
                return 0
            events.append(ms)
            if first:
                shapes = [tuple(a.shape) for a in call_args if hasattr(a, "shape")]
                sites.append({"kernel": str(symbol), "input": shapes[0], "shape": shapes[-1]})
            return 0

        vm.set_instrument(instrument)
        t0 = read()
        vm["main"](*args)
        if run:
            times.append(events)
            totals["instrumented"].append(1e3 * (read() - t0))
            totals["builtins"].append(sum(builtins))
            totals["builtin calls"].append(len(builtins))
            t0 = read()
            plain["main"](*args)
            totals["whole"].append(1e3 * (read() - t0))
            if ort_run is not None:
                t0 = read()
                ort_run()
                totals["ort"].append(1e3 * (read() - t0))
    for i, site in enumerate(sites):
        site["ms"] = statistics.median(t[i] for t in times)
    return sites, {k: statistics.median(v) for k, v in totals.items()}


def _nchw(shape: tuple) -> tuple:
    """An NCHW[x]c shape (a conv chain's tensor: rank 5) as NCHW, the shape onnxruntime reports; others as
    they are."""
    if len(shape) == 5:
        n, cb, h, w, x = shape
        return (n, cb * x, h, w)
    return shape


def pair_ort(sites: list[dict], nodes: list[dict]) -> None:
    """Sets site["ort"] to the onnxruntime node run at the same place: nodes (in execution order) and sites
    paired in order by (first input, output) shape, else by output shape (a conv chain's NCHW[x]c shapes
    compared as NCHW where they match nothing as they are); a node is paired once."""
    queues = defaultdict(list)
    for n in nodes:
        queues[n["input"], n["shape"]].append(n)
        queues[n["shape"]].append(n)
    used = set()
    for site in sites:
        exact = ((site["input"], site["shape"]), site["shape"])
        logical = ((_nchw(site["input"]), _nchw(site["shape"])), _nchw(site["shape"]))
        for key in exact + tuple(k for k in logical if k not in exact):
            queue = queues.get(key, [])
            while queue and queue[0]["name"] in used:
                queue.pop(0)
            if queue:
                site["ort"] = queue.pop(0)
                used.add(site["ort"]["name"])
                break


def _print_in_model(sites: list[dict], summary: dict, alone: dict, nodes: list[dict], clock: str) -> None:
    ort_total = sum(n["ms"] * n["calls"] for n in nodes)
    print(f"\nIn the model, per call ({clock} ms), sorted by the gap to onnxruntime's node at the same place:")
    print(f"  {'#':>3s} {'kernel':36s} {'input -> output':32s} {'in model':>9s} {'alone':>7s} {'ort node':18s} "
          f"{'ort':>7s} {'gap':>7s}")

    def gap(site):
        return site["ms"] - site["ort"]["ms"] if "ort" in site else site["ms"]

    for i, site in sorted(enumerate(sites), key=lambda kv: -gap(kv[1])):
        io = f"{'x'.join(map(str, site['input']))} -> {'x'.join(map(str, site['shape']))}"
        one = f"{alone[site['kernel']]:7.3f}" if site["kernel"] in alone else f"{'':7s}"
        ort_node = site.get("ort", {"name": "-", "ms": 0.0})
        print(f"  {i:3d} {site['kernel']:36s} {io:32s} {site['ms']:9.3f} {one} {ort_node['name']:18s} "
              f"{ort_node['ms']:7.3f} {gap(site):+7.3f}")
    ours, whole = sum(s["ms"] for s in sites), summary["whole"]
    print(f"  ours: {len(sites)} calls sum to {ours:.2f} ms of a {whole:.2f} ms inference ({whole - ours:+.2f} ms "
          f"outside the kernels); instrumented inferences {summary['instrumented']:.2f} ms, of which "
          f"{summary['builtin calls']:.0f} VM builtin calls {summary['builtins']:.2f} ms")
    timed = [s for s in sites if s["kernel"] in alone]
    if timed:
        print(f"  the {len(timed)} calls also timed alone: {sum(s['ms'] for s in timed):.2f} ms in the model, "
              f"{sum(alone[s['kernel']] for s in timed):.2f} ms alone")
    if nodes:
        paired = {s["ort"]["name"] for s in sites if "ort" in s}
        rest = [n for n in nodes if n["name"] not in paired]
        print(f"  onnxruntime: {len(nodes)} nodes sum to {ort_total:.2f} ms (wall, profiled) of a {summary['ort']:.2f} ms "
              f"inference ({clock}, not profiled); its nodes paired with none of "
              "ours: " + (", ".join(f"{n['name']} {n['op']} {n['ms'] * n['calls']:.3f}" for n in rest) or "none"))


def _random(shape, dtype: str, rng) -> np.ndarray:
    if dtype.startswith(("int", "uint")):
        return rng.integers(0, 2, size=shape).astype(dtype)  # indices and masks: 0 / 1 stay in bounds
    return rng.normal(size=shape).astype(numpy_dtype(dtype))  # bfloat16: ml_dtypes'


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="ppocr_det", help=f"one of {', '.join(model_names())}")
    ap.add_argument("--match", default="", help="time only the kernels whose name contains this")
    ap.add_argument("--target", default="llvm")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--block-ms", type=float, default=150.0)
    ap.add_argument("--threads", type=int, default=1, help="TVM pool threads (and onnxruntime's); >1: wall time")
    ap.add_argument("--ort", action="store_true", help="also onnxruntime's per-node profile of the model")
    ap.add_argument("--ort-runs", type=int, default=60)
    ap.add_argument("--in-model", action="store_true", help="also time each kernel call inside the model")
    ap.add_argument("--in-model-runs", type=int, default=40)
    ap.add_argument("--precision", choices=("fp32", "fp16", "bf16"), default="fp32",
                    help="the float32 model converted first (bf16: its convs on AMX tiles where the CPU has them); "
                         "onnxruntime runs the float32 model")
    args = ap.parse_args(argv)
    kinds = model_names()
    if args.model not in kinds:
        ap.error(f"unknown model {args.model!r}; use one of {', '.join(kinds)}")
    target = resolve_target(args.target)
    if target.kind.name != "llvm":
        ap.error(f"--target must be an llvm (CPU) target, got {target.kind.name}")
    mod, proto, feeds = LOADERS[kinds[args.model]](args.model)
    nodes = ort_nodes(proto, feeds, args.threads, args.ort_runs) if args.ort else []
    by_shape = defaultdict(list)  # (first input, output) and output shape -> nodes
    for n in nodes:
        by_shape[n["input"], n["shape"]].append(n)
        by_shape[n["shape"]].append(n)
    built = build(convert(mod, args.precision), target, "fused")
    set_tvm_threads(args.threads)
    clock = "cpu" if args.threads == 1 else "wall"
    rng, dev = np.random.default_rng(0), tvm.cpu()
    alone = {}  # PrimFunc name -> ms alone
    for gv, func in sorted(built.module.functions.items(), key=lambda kv: kv[0].name_hint):
        if not (isinstance(func, tirx.PrimFunc) and args.match in gv.name_hint):
            continue
        if not all(isinstance(d, tirx.IntImm) for p in func.params for d in p.shape):
            print(f"{gv.name_hint:40s} skipped: a symbolic dim")
            continue
        kernel = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target)["main"]
        shapes = [[int(d) for d in p.shape] for p in func.params]
        tensors = [tvm.runtime.tensor(_random(s, str(p.dtype), rng), dev) for s, p in zip(shapes, func.params)]
        ms = alone[gv.name_hint] = _median_ms(lambda kernel=kernel, tensors=tensors: kernel(*tensors), args.rounds,
                                              args.block_ms, clock)
        # the first parameter is the data input and the last the output, as onnxruntime's first input / output
        same = by_shape.get((tuple(shapes[0]), tuple(shapes[-1]))) or by_shape.get(tuple(shapes[-1]), [])
        # several: the nearest second operand's size first (a conv's weights, ours packed and padded)
        size = math.prod(shapes[1]) if len(shapes) > 2 else 0
        same = sorted(same, key=lambda n: (abs(math.log(max(size, 1) / max(math.prod(n["second"]), 1))), -n["ms"]))
        ort_col = ("  | ort " + ", ".join(f"{n['op']} {n['ms']:.3f}" for n in same[:4])
                   if nodes else "")
        print(f"{gv.name_hint:40s} {' x '.join(map(str, shapes))}: {ms:.4f} ms {clock.upper()}{ort_col}", flush=True)
    if nodes:
        _print_ort(nodes, args.threads)
    if args.in_model:
        inputs = [tvm.runtime.tensor(feeds[i.name], dev) for i in proto.graph.input if i.name in feeds]
        sess = ort_session(proto, args.threads) if nodes else None
        sites, summary = in_model_sites(built.executable, inputs, args.in_model_runs, clock,
                                        (lambda: sess.run(None, feeds)) if sess else None)
        pair_ort(sites, nodes)
        _print_in_model(sites, summary, alone, nodes, clock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
