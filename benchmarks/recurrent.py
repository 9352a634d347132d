"""One LSTM / GRU layer against onnxruntime's own kernel: CPU time per inference, one thread, side by side.

    python benchmarks/recurrent.py                                   # the default layers, this CPU's target
    python benchmarks/recurrent.py --layers LSTM:512:50 --target '{"kind":"llvm","mcpu":"x86-64-v3"}'

Each layer (`OP:HIDDEN:STEPS`, batch 1, 64 inputs, initial states given, seeded weights drawn as PyTorch
initializes them, uniform in +-1/sqrt(HIDDEN): larger ones make a long sequence chaotic, where onnxruntime's
own float32 result drifts from float64 by more than any tolerance) is built fused
(the input projection as one dense kernel, the time loop as one recurrence kernel), checked element by
element against onnxruntime, then timed: `--rounds` interleaved blocks of `--number` inferences of each,
the median of the per-block mean CPU time (time.process_time), TVM's pool and onnxruntime's intra-op pool at
one thread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

from tvm_fusion._tvm import relax, tvm  # noqa: E402
from tvm_fusion.build.builder import build, resolve_target  # noqa: E402
from tvm_fusion.frontend.importer import import_onnx  # noqa: E402
from tvm_fusion.testing import assert_close  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_recurrent import recurrent_model  # noqa: E402  (the tests' one-node model builder)

DEFAULT_LAYERS = "LSTM:32:124,LSTM:128:80,GRU:128:80,LSTM:256:50"


def _block(fn, number: int) -> float:
    start = time.process_time()
    for _ in range(number):
        fn()
    return (time.process_time() - start) / number


def _torch_like(model, hidden: int, seed: int = 0):
    """`model` with its W, R and B uniform in +-1/sqrt(hidden) (torch.nn.LSTM / GRU's initialization)."""
    from onnx import numpy_helper

    rng = np.random.default_rng(seed)
    bound = 1.0 / np.sqrt(hidden)
    for i, t in enumerate(model.graph.initializer):
        shape = numpy_helper.to_array(t).shape
        model.graph.initializer[i].CopyFrom(
            numpy_helper.from_array(rng.uniform(-bound, bound, shape).astype(np.float32), t.name))
    return model


def run_layer(op: str, hidden: int, steps: int, target, rounds: int, number: int) -> tuple[float, float]:
    """(fused ms, onnxruntime ms) for one layer, after checking the fused outputs."""
    model, feeds = recurrent_model(op, steps=steps, batch=1, inputs=64, hidden=hidden, initial=True)
    model = _torch_like(model, hidden)
    built = build(import_onnx(model, {k: v.shape for k, v in feeds.items()}), target, "fused")
    vm = relax.VirtualMachine(built.executable, tvm.cpu())
    args = [tvm.runtime.tensor(feeds[i.name]) for i in model.graph.input]
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    outs = vm["main"](*args)
    for got, ref in zip([outs[i].numpy() for i in range(len(outs))], sess.run(None, feeds), strict=True):
        assert_close(got, ref, f"{op} hidden {hidden}")
    ours, theirs = [], []
    for _ in range(rounds):
        ours.append(_block(lambda: vm["main"](*args), number))
        theirs.append(_block(lambda: sess.run(None, feeds), number))
    return 1e3 * statistics.median(ours), 1e3 * statistics.median(theirs)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default=DEFAULT_LAYERS, help=f"OP:HIDDEN:STEPS, comma separated (default {DEFAULT_LAYERS})")
    ap.add_argument("--target", default="llvm")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--number", type=int, default=50)
    args = ap.parse_args(argv)
    target = resolve_target(args.target)
    print(f"target {target}; batch 1, 64 inputs; medians of {args.rounds} interleaved blocks of {args.number}\n")
    print("| layer | fused ms | onnxruntime ms | fused / ort |\n|---|---|---|---|")
    for spec in args.layers.split(","):
        op, hidden, steps = spec.split(":")
        ours, theirs = run_layer(op.upper(), int(hidden), int(steps), target, args.rounds, args.number)
        print(f"| {op.upper()} hidden {hidden}, {steps} steps | {ours:.3g} | {theirs:.3g} | {ours / theirs:.2f}x |")


if __name__ == "__main__":
    main()
