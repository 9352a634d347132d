"""A conv kernel in NCHW[x]c (`schedules/conv2d_blocked.py`, what a conv chain runs) against the NCHW kernel the
same conv gets alone (`schedules/llvm/conv2d.py`), one thread, CPU time, interleaved in one process; hot, and
single calls after an 8 MiB write (`--evict`, as inside a model: weights and input from L3).

    TVM_NUM_THREADS=1 .venv/bin/python benchmarks/blocked_convs.py                      # ResNet-50's convs
    TVM_NUM_THREADS=1 .venv/bin/python benchmarks/blocked_convs.py resnet50_3x3_256 --evict 64
    TVM_NUM_THREADS=1 .venv/bin/python benchmarks/blocked_convs.py --target '{"kind":"llvm","mcpu":"x86-64-v3"}'

Shapes are `strided_convs.py`'s (conv + ReLU, no residual; a depthwise shape runs the blocked depthwise
kernel); the blocked kernel reads its input in NCHW[x]c and writes its output so (a conv inside a chain), x
the target's float32 lanes. Both are checked against
each other (float32 sums in another order: within 1e-4 relative).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import strided_convs  # noqa: E402  (the NCHW kernel's packed build and the timing loops)
from cpu_speed import set_tvm_threads  # noqa: E402

from tvm_fusion import _tvm, registry  # noqa: E402
from tvm_fusion._tvm import te, tvm  # noqa: E402
from tvm_fusion.build.builder import resolve_target  # noqa: E402
from tvm_fusion.schedules import load  # noqa: E402
from tvm_fusion.hardware import cpu_facts  # noqa: E402
from tvm_fusion.schedules.conv2d_blocked import (BLOCKED_CONV, BLOCKED_DEPTHWISE, blocked_shape,  # noqa: E402
                                                 from_blocked, to_blocked)

RESNET50 = [name for name in strided_convs.SHAPES if name.startswith("resnet50_") and name != "resnet50_stem"]


def blocked_build(shape, arrays, target):
    """(a call of the blocked kernel on `arrays` (x, W, b as the NCHW build's), its output as NCHW)."""
    n, c, h, w, oc, k, stride, pad = shape[:8]
    groups = shape[8] if len(shape) > 8 else 1
    compute = BLOCKED_CONV if groups == 1 else BLOCKED_DEPTHWISE
    block = cpu_facts(target).float32_lanes
    attrs = dict(strides=(stride, stride), padding=(pad,) * 4, dilation=(1, 1), groups=groups, out_blocked=True,
                 activation="relu")
    x = to_blocked(arrays[0], block)
    rng = np.random.default_rng(2)  # the draws of conv2d_test._packed_build: x, then W, then b
    rng.standard_normal(arrays[0].shape)
    wt = rng.standard_normal((oc, c // groups, k, k)).astype("float32")
    sched = registry.get_schedule(compute, "llvm")
    consts = sched.packed([wt, arrays[2]], attrs, [x.shape], target)
    tensors = [te.placeholder(a.shape, "float32", name=f"in{i}") for i, a in enumerate([x, *consts])]
    out = registry.get_compute(compute, "llvm")(*tensors, None, **attrs, target=target)
    sch = _tvm.Schedule(tvm.IRModule({"main": te.create_prim_func([*tensors, out])}))
    with target:
        sched.apply(sch, attrs, target)
    lib = tvm.compile(sch.mod, target)
    args = [tvm.runtime.tensor(a) for a in (x, *consts)]
    args.append(tvm.runtime.tensor(np.zeros(blocked_shape((n, oc, *[int(d) for d in out.shape[2:4]]), block),
                                            "float32")))

    return (lambda: lib["main"](*args)), (lambda: from_blocked(args[-1].numpy()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shapes", nargs="*", choices=[[], *strided_convs.SHAPES], help="default: ResNet-50's")
    ap.add_argument("--target", default="llvm")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--evict", type=int, default=8, metavar="MB", help="the single calls' write before each (MiB)")
    args = ap.parse_args(argv)
    load()
    target = resolve_target(args.target)
    set_tvm_threads(1)
    print(f"target {target}; ms per call, one thread: hot (blocks of ~100 ms) | after a {args.evict} MiB write")
    for name in args.shapes or RESNET50:
        shape = strided_convs.SHAPES[name]
        groups = shape[8] if len(shape) > 8 else 1
        if groups != 1 and not groups == shape[1] == shape[4]:
            print(f"{name:26s} skipped: grouped (the blocked convs take groups 1 or depthwise)")
            continue
        case = dict(zip(("n", "c", "h", "w", "oc", "k", "stride", "pad", "groups"), shape), activation="relu")
        nchw, out, arrays = strided_convs._build(case, target, {})
        blocked, blocked_out = blocked_build(shape, arrays, target)
        runs = {"nchw": nchw, "blocked": blocked}
        hot = strided_convs._interleaved(runs, args.rounds)
        cold = strided_convs._after_eviction(runs, args.rounds, args.evict)
        want = out.numpy()
        agree = np.allclose(blocked_out(), want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
        print(f"{name:26s} nchw {hot['nchw']:.3f} | {cold['nchw']:.3f}   blocked {hot['blocked']:.3f} | "
              f"{cold['blocked']:.3f}   blocked / nchw {hot['blocked'] / hot['nchw']:.2f} | "
              f"{cold['blocked'] / cold['nchw']:.2f}   agree {agree}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
