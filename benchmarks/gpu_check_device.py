"""The GPU steps of gpu_check.py on a GPU machine with the TVM runtime alone (inside a bundle it wrote).

    python BUNDLE/gpu_check_device.py --out DIR [--rounds 20] [--budget-s 420]

Starts from the build host's report (gpu_check_host.json: the matrix, the builds, the CPU build against
onnxruntime), and for each configuration (precision x batch) loads the bundle's four CUDA libraries (fused
with and without its CUDA graph, unfused, tvm) with TVM_USE_RUNTIME_LIB=1 (no compiler, no tvm_fusion),
regenerates their weights from the recipes (recipe_replay: numpy, each weight checked by sha256; a recipe
that several libraries share is regenerated and uploaded once) and the inputs from their seed (checked by
sha256), runs them, compares element by element (numerics.py: the same tolerance table) fused vs unfused
on the GPU, vs the host's CPU build and vs onnxruntime, times the builds interleaved (within --budget-s)
and each fused kernel, and writes DIR/gpu_check.json and .md with the bars.
"""

import argparse
import ctypes
import json
import os
import sys
import time
from pathlib import Path

START = time.perf_counter()
HERE = os.path.dirname(os.path.abspath(__file__))
os.environ["TVM_USE_RUNTIME_LIB"] = "1"
sys.path.insert(0, HERE)
import run  # noqa: E402  (the bundle's run.py: site/ on the path, numpy from its wheel)

import numpy as np  # noqa: E402
import tvm  # noqa: E402
import tvm.runtime.vm  # noqa: E402

from gpu_check import GPU_STEPS, Report, regenerate_inputs, run_gpu_steps, run_matrix_on_gpu  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for gpu_check.json / gpu_check.md")
    ap.add_argument("--rounds", type=int, default=20, help="interleaved timing rounds (at most)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="seconds the GPU steps may take (default 420)")
    args = ap.parse_args(argv)
    host = json.load(open(os.path.join(HERE, "gpu_check_host.json")))
    rep = Report(host["model"], host["arch"])
    rep.data.update({k: v for k, v in host.items() if k not in ("gpu", "skipped", "bars")})
    rep.data["skipped"] = [s for s in host["skipped"] if s["step"] not in GPU_STEPS]  # configurations not built
    keys = [k for k, c in host["configs"].items() if not c.get("skipped")]
    for key in keys:
        rep.data["configs"][key].pop("kernels", None)
        rep.data["configs"][key].pop("kernels_device", None)
    ctypes.CDLL(os.path.join(os.path.dirname(tvm.__file__), "lib", "libtvm_runtime_cuda.so"), ctypes.RTLD_GLOBAL)
    dev = tvm.cuda(0)
    if not dev.exist:
        rep.data["gpu"] = {"present": False, "why": "tvm.cuda(0) does not exist on this machine"}
        for name in GPU_STEPS:
            rep.skip(name, rep.data["gpu"]["why"])
        rep.data["ok"] = False
    else:
        rep.data["gpu"] = {"present": True, "name": dev.device_name, "compute": dev.compute_version,
                           "arch": "sm_" + dev.compute_version.replace(".", "")}
        refs = np.load(os.path.join(HERE, "references.npz"))
        weights = {}  # recipe (or weights file) -> tensors on the GPU: libraries with the same weights share them
        rep.data["weights_seconds"] = {}

        def tensors(manifest):
            entry = manifest.weights
            source = entry and (entry.extra.get("recipe") or entry.file)
            if source not in weights:
                t0 = time.perf_counter()
                weights[source] = run.weights(manifest, dev)
                rep.data["weights_seconds"][source] = round(time.perf_counter() - t0, 2)
            return weights[source]

        def run_one(key, budget_s):
            cfg = rep.data["configs"][key]
            if cfg["inputs"].get("stored"):
                arrays = [refs[f"{key}|input{i}"] for i in range(len(cfg["input_names"]))]
            else:
                arrays = regenerate_inputs(cfg["inputs"])
            inputs = [tvm.runtime.tensor(a, dev) for a in arrays]
            outputs = [n["output"] for n in host["numerics"]
                       if n["config"] == key and n["comparison"] == "fused CPU vs onnxruntime"]
            cpu_out = [refs[f"{key}|cpu{i}"] for i in range(len(outputs))]
            ort = [refs[f"{key}|ort{i}"] for i in range(len(outputs))]

            def load(mode):
                lib = os.path.join(HERE, cfg["libraries"][mode])
                manifest = run.Manifest.load(lib + ".json")
                return tvm.runtime.vm.VirtualMachine(tvm.runtime.load_module(lib), dev), inputs + tensors(manifest)

            run_gpu_steps(rep, key, load, dev, outputs, cpu_out, ort, args.rounds, budget_s)

        run_matrix_on_gpu(rep, keys, run_one, args.budget_s - (time.perf_counter() - START))
    maps = open("/proc/self/maps").read() if os.path.exists("/proc/self/maps") else ""
    rep.data["runtime"] = {"tvm": tvm.__file__, "numpy": np.__file__, "compiler_loaded": "libtvm_compiler" in maps}
    rep.data["device_seconds"] = round(time.perf_counter() - START, 1)
    js, md = rep.write(Path(args.out))
    print(f"wrote {js} and {md}: {'PASS' if rep.data['ok'] else 'FAIL'} in {rep.data['device_seconds']} s")
    return 0 if rep.data["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
