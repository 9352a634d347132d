"""The GPU steps of gpu_check.py on a GPU machine with the TVM runtime alone (inside a bundle it wrote).

    python BUNDLE/gpu_check_device.py --out DIR [--rounds 20]

Starts from the build host's report (gpu_check_host.json: the builds, the CPU build against onnxruntime),
loads the bundle's fused (with and without its CUDA graph), unfused and tvm CUDA libraries with
TVM_USE_RUNTIME_LIB=1 (no compiler, no tvm_fusion), regenerates their weights from the recipes (recipe_replay: numpy, each weight checked by
sha256), runs them on the inputs the build host used (references.npz), compares element by element
(numerics.py: the same tolerance table) fused vs unfused on the GPU, vs the host's CPU build and vs
onnxruntime, times the builds interleaved and each fused kernel, and writes DIR/gpu_check.json and .md.
"""

import argparse
import ctypes
import json
import os
import sys
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ["TVM_USE_RUNTIME_LIB"] = "1"
sys.path.insert(0, HERE)
import run  # noqa: E402  (the bundle's run.py: site/ on the path, numpy from its wheel, weights())

import numpy as np  # noqa: E402
import tvm  # noqa: E402
import tvm.runtime.vm  # noqa: E402

from gpu_check import GPU_STEPS, NO_GRAPH, Report, run_gpu_steps  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for gpu_check.json / gpu_check.md")
    ap.add_argument("--rounds", type=int, default=20, help="interleaved timing rounds")
    args = ap.parse_args(argv)
    host = json.load(open(os.path.join(HERE, "gpu_check_host.json")))
    rep = Report(host["model"], host["arch"])
    rep.data.update({k: v for k, v in host.items() if k not in ("gpu", "skipped", "kernels", "kernels_device")})
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
        count = len([k for k in refs.files if k.startswith("input")])
        inputs = [tvm.runtime.tensor(refs[f"input{i}"], dev) for i in range(count)]
        n_out = len([k for k in refs.files if k.startswith("cpu")])
        cpu_out, ort = [refs[f"cpu{i}"] for i in range(n_out)], [refs[f"ort{i}"] for i in range(n_out)]
        outputs = [n["output"] for n in host["numerics"] if n["comparison"] == "fused CPU vs onnxruntime"]

        def load(mode):
            t0 = time.perf_counter()
            lib = os.path.join(HERE, host["bundle"]["libraries"][mode])
            manifest = json.load(open(lib + ".json"))
            vm = tvm.runtime.vm.VirtualMachine(tvm.runtime.load_module(lib), dev)
            args = inputs + run.weights(manifest, dev)
            rep.data.setdefault("weights_seconds", {})[mode] = round(time.perf_counter() - t0, 2)
            return vm, args

        runs = {mode: load(mode) for mode in host["bundle"]["libraries"]}
        run_gpu_steps(rep, runs, lambda: load(NO_GRAPH), dev, outputs, cpu_out, ort, args.rounds)
    maps = open("/proc/self/maps").read() if os.path.exists("/proc/self/maps") else ""
    rep.data["runtime"] = {"tvm": tvm.__file__, "numpy": np.__file__, "compiler_loaded": "libtvm_compiler" in maps}
    js, md = rep.write(Path(args.out))
    print(f"wrote {js} and {md}: {'PASS' if rep.data['ok'] else 'FAIL'}")
    return 0 if rep.data["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
