"""Run a bundled tvm_fusion library with the TVM runtime alone (no compiler, no tvm_fusion).

    python run.py [--device cpu|cuda] [--seed 0] [--save outputs.npz]

Seeded standard-normal inputs of the shapes in the manifest; prints one JSON line: the device, the output
shapes, and whether TVM's compiler library is loaded in this process (it must not be).
"""

import argparse
import ctypes
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
LIBRARY = "model.so"  # written by tvm_fusion.bundle
os.environ["TVM_USE_RUNTIME_LIB"] = "1"
sys.path.insert(0, os.path.join(HERE, "site"))

import numpy as np  # noqa: E402
import tvm  # noqa: E402
import tvm.runtime.vm  # noqa: E402


def main() -> None:
    path = os.path.join(HERE, LIBRARY)
    manifest = json.load(open(path + ".json"))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if manifest.get("cuda_binary") else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save", help="write the outputs to this .npz")
    args = ap.parse_args()
    if args.device == "cuda":  # the runtime-only mode loads libtvm_runtime alone: add TVM's CUDA runtime
        ctypes.CDLL(os.path.join(os.path.dirname(tvm.__file__), "lib", "libtvm_runtime_cuda.so"), ctypes.RTLD_GLOBAL)
    dev = tvm.cuda(0) if args.device == "cuda" else tvm.cpu(0)
    vm = tvm.runtime.vm.VirtualMachine(tvm.runtime.load_module(path), dev)
    rng = np.random.default_rng(args.seed)
    inputs = [tvm.runtime.tensor(rng.standard_normal(i["shape"]).astype(i["dtype"]), dev) for i in manifest["inputs"]]
    weights = []
    if manifest.get("weights"):
        values = tvm.runtime.load_param_dict(open(os.path.join(HERE, manifest["weights"]["file"]), "rb").read())
        weights = [values[name].copyto(dev) for name in manifest["weights"]["params"]]
    out = vm["main"](*inputs, *weights)
    outs = [o.numpy() for o in ([out] if hasattr(out, "numpy") else out)]
    if args.save:
        np.savez(args.save, *outs)
    maps = open("/proc/self/maps").read() if os.path.exists("/proc/self/maps") else ""
    print(json.dumps({"device": str(dev), "outputs": [list(o.shape) for o in outs], "tvm": tvm.__file__,
                      "compiler_loaded": "libtvm_compiler" in maps}))


if __name__ == "__main__":
    main()
