"""ResNet-50 batch 1: fused / unfused / TVM default / onnxruntime, measured side by side in one run.

    python benchmarks/resnet50.py [--target llvm|cuda|TARGET] [--rounds 7]
    python benchmarks/resnet50.py --target '{"kind":"llvm","mcpu":"x86-64-v3"}'   # AVX2 code on this host

Builds are timed interleaved (one run of each per round, after a warm-up) and medians are compared,
so machine noise hits every build alike. Prints median / min / max latency and the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time

import onnx


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="llvm", help="llvm, cuda, or any TVM target (a JSON dict, a kind, a tag)")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads (default: all)")
    args = ap.parse_args()

    import tvm

    from tvm_fusion import build
    from tvm_fusion import example_path, import_onnx
    from tvm_fusion._tvm import relax
    from tvm_fusion.check.compare import gpu_available, random_inputs, run_onnxruntime

    path = example_path("resnet50")
    model = onnx.load(str(path))
    mod = import_onnx(model)
    from tvm_fusion.build.builder import resolve_target

    args.target = resolve_target(args.target, args.arch)
    if args.target.kind.name == "cuda":
        ok, why = gpu_available()
        if not ok:
            raise SystemExit(f"--target cuda needs a GPU: {why}")
    dev = tvm.cuda(0) if args.target.kind.name == "cuda" else tvm.cpu(0)
    inputs = random_inputs(model, seed=0)
    name = model.graph.input[0].name
    x = tvm.runtime.tensor(inputs[name], dev)
    runners = {}
    for mode in ("fused", "tvm", "unfused"):
        t0 = time.perf_counter()
        built = build(mod, args.target, mode)
        vm = relax.VirtualMachine(built.executable, dev)
        vm["main"](x)  # warm-up
        runners[mode] = (vm, built)
        print(f"built {mode:8s} in {time.perf_counter() - t0:5.1f}s: {built.primfuncs} PrimFuncs, "
              f"{built.kernel_calls} kernel calls per inference", flush=True)
    sess, _ = run_onnxruntime(model, inputs, threads=args.threads)
    sess.run(None, inputs)
    times: dict[str, list[float]] = {m: [] for m in [*runners, "onnxruntime"]}
    for _ in range(args.rounds):
        for mode, (vm, _) in runners.items():
            times[mode].append(vm.time_evaluator("main", dev, number=1, repeat=1)(x).median)
        t0 = time.perf_counter()
        sess.run(None, inputs)
        times["onnxruntime"].append(time.perf_counter() - t0)
    med = {m: statistics.median(v) for m, v in times.items()}
    print(f"\nResNet-50 batch 1, target {args.target}, {args.rounds} interleaved rounds")
    print(f"{'build':12s} {'median ms':>10s} {'min ms':>8s} {'max ms':>8s}")
    for m, v in times.items():
        print(f"{m:12s} {med[m] * 1e3:10.2f} {min(v) * 1e3:8.2f} {max(v) * 1e3:8.2f}")
    f = med["fused"]
    print(f"\nunfused / fused      {med['unfused'] / f:7.2f}x  (fused is this much faster)")
    print(f"tvm / fused          {med['tvm'] / f:7.2f}x")
    print(f"onnxruntime / fused  {med['onnxruntime'] / f:7.2f}x  (<1: onnxruntime is faster)")
    print(f"fused / onnxruntime  {f / med['onnxruntime']:7.2f}x")


if __name__ == "__main__":
    main()
