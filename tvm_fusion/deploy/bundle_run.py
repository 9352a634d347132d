"""Run a bundled tvm_fusion library with the TVM runtime alone (no compiler, no tvm_fusion).

    python run.py [--device cpu|cuda] [--seed 0] [--save outputs.npz]

Seeded standard-normal inputs of the shapes in the manifest (read by site/tvm_fusion_manifest.py); prints
one JSON line: the device, the output shapes, the threads of TVM's CPU pool, and whether TVM's compiler
library is loaded in this process (it must not be). The weights come from the weights file, or, in a bundle
that carries them as a recipe (the GPU check's: benchmarks/gpu_bundle), are regenerated with numpy by the
site/recipe_replay.py it added. Without numpy here, a bundled numpy wheel is unpacked beside this file. TVM's pool gets the cores this process may run on unless TVM_NUM_THREADS is set.
"""

import argparse
import ctypes
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
LIBRARY = "model.so"  # written by tvm_fusion.deploy.bundle
os.environ["TVM_USE_RUNTIME_LIB"] = "1"
os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))  # TVM's default: half the cores
sys.path.insert(0, os.path.join(HERE, "site"))


def _numpy_from_wheel() -> None:
    """Where this Python has no numpy, unpack the bundle's numpy wheel (wheels/) beside this file."""
    import glob
    import importlib.util
    import zipfile

    if importlib.util.find_spec("numpy") is not None:
        return
    wheels = sorted(glob.glob(os.path.join(HERE, "wheels", "numpy-*.whl")))
    if not wheels:
        sys.exit("numpy is not installed here and the bundle has no numpy wheel: pip install numpy, or bundle --numpy")
    target = os.path.join(HERE, "site-numpy")
    if not os.path.isdir(os.path.join(target, "numpy")):
        with zipfile.ZipFile(wheels[0]) as whl:
            whl.extractall(target)
    sys.path.insert(0, target)


_numpy_from_wheel()
import numpy as np  # noqa: E402
import tvm  # noqa: E402
import tvm.runtime.vm  # noqa: E402
try:
    from tvm_fusion_manifest import Manifest  # noqa: E402  (the bundle's copy of tvm_fusion/runtime/manifest.py)
except ImportError:  # this file read in the package, not in a bundle
    from tvm_fusion.runtime.manifest import Manifest  # noqa: E402


def weights(manifest: Manifest, dev) -> list:
    """The library's weights on `dev` in main's parameter order: regenerated from the recipe, or read."""
    entry = manifest.weights
    if entry is None:
        return []
    if entry.extra.get("recipe"):  # a bundle with recipes carries site/recipe_replay.py (benchmarks/gpu_bundle)
        from recipe_replay import regenerate

        values = regenerate(os.path.join(HERE, entry.extra["recipe"]))
        return [tvm.runtime.tensor(values[name], dev) for name in entry.params]
    values = tvm.runtime.load_param_dict(open(os.path.join(HERE, entry.file), "rb").read())
    return [values[name].copyto(dev) for name in entry.params]


def main() -> None:
    path = os.path.join(HERE, LIBRARY)
    manifest = Manifest.load(path + ".json")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if manifest.cuda_binary is not None else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save", help="write the outputs to this .npz")
    args = ap.parse_args()
    if args.device == "cuda":  # the runtime-only mode loads libtvm_runtime alone: add TVM's CUDA runtime
        ctypes.CDLL(os.path.join(os.path.dirname(tvm.__file__), "lib", "libtvm_runtime_cuda.so"), ctypes.RTLD_GLOBAL)
    dev = tvm.cuda(0) if args.device == "cuda" else tvm.cpu(0)
    vm = tvm.runtime.vm.VirtualMachine(tvm.runtime.load_module(path), dev)
    rng = np.random.default_rng(args.seed)
    inputs = [tvm.runtime.tensor(rng.standard_normal(i.shape).astype(i.dtype), dev) for i in manifest.inputs]
    params = weights(manifest, dev)
    out = vm["main"](*inputs, *params)
    outs = [o.numpy() for o in ([out] if hasattr(out, "numpy") else out)]
    if args.save:
        np.savez(args.save, *outs)
    maps = open("/proc/self/maps").read() if os.path.exists("/proc/self/maps") else ""
    print(json.dumps({"device": str(dev), "outputs": [list(o.shape) for o in outs], "tvm": tvm.__file__,
                      "threads": int(tvm.get_global_func("runtime.NumThreads")()), "numpy": np.__file__,
                      "weights": len(params),
                      "compiler_loaded": "libtvm_compiler" in maps}))


if __name__ == "__main__":
    main()
