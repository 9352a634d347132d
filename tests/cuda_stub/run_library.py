"""Run under the stub driver: load an exported CUDA library with TVM and call `main` once on tvm.cuda(0).

    python run_library.py LIB.so '{"input": [1, 3, 224, 224]}' [RUNS]   -> prints one line `RESULT {json}`

With RUNS > 1, main runs that many times and `inference N` is written to the stub's log before each run
(the first run of a CUDA graph captures it, the next ones replay it).
"""

import json
import os
import sys

import numpy as np
import tvm
from tvm import relax

from tvm_fusion.runtime.weights import load_weights


def main(library: str, shapes: dict, runs: int = 1) -> None:
    dev = tvm.cuda(0)
    if not dev.exist:
        raise SystemExit("tvm.cuda(0) does not exist: the stub driver was not loaded")
    vm = relax.VirtualMachine(tvm.runtime.load_module(library), dev)
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.standard_normal(s).astype("float32"), dev) for s in shapes.values()]
    args += load_weights(library, dev)  # a library built with --external-weights: <library>.weights
    for i in range(runs):
        if runs > 1:
            with open(os.environ["STUB_CUDA_LOG"], "a") as log:
                log.write(f"inference {i + 1}\n")
        out = vm["main"](*args)
    outs = [out] if hasattr(out, "numpy") else list(out)
    shapes_out = [list(o.numpy().shape) for o in outs]
    print("RESULT " + json.dumps({"device": dev.device_name, "outputs": shapes_out, "weights": len(args) - len(shapes)}))


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 1)
