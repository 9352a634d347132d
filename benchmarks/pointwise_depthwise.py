"""Pointwise -> depthwise in one kernel, worth it or not: per shape, the fused group against the two conv
kernels it replaces and onnxruntime, one thread.

    python benchmarks/pointwise_depthwise.py                       # MobileNetV2's expand -> depthwise pairs
    python benchmarks/pointwise_depthwise.py --target '{"kind":"llvm","mcpu":"x86-64-v3"}'     # AVX2
    python benchmarks/pointwise_depthwise.py --shapes 1x16x112x112:96/2 --rounds 9 --clock cpu

A shape `NxCxHxW:D/S` (`k5`: a 5x5 depthwise kernel) is x -> 1x1 conv to D channels -> BatchNorm -> ReLU6
-> depthwise 3x3 (stride S, padding 1) -> BatchNorm -> ReLU6. Each is built three ways and checked element
by element against onnxruntime (tvm_fusion.check.numerics), as benchmarks/depthwise_pointwise.py does:
fused (the pointwise_depthwise rules, the CPU schedule's measured declines switched off), two kernels (those
rules disabled: the conv family's 1x1 and depthwise kernels), onnxruntime (one intra-op thread); then timed
in interleaved rounds. The last column says what the rule does with the shape on this target.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from depthwise_pointwise import run  # noqa: E402

from tvm_fusion.schedules.llvm import pointwise_depthwise as pwdw_llvm  # noqa: E402
from tvm_fusion.testing import GraphBuilder  # noqa: E402

#: MobileNetV2 1.0's expand -> depthwise pairs (the expand's input, its channels, the depthwise stride), then
#: EfficientNet-B0's strided 5x5 ones
MOBILENET_V2 = ("1x16x112x112:96/2", "1x24x56x56:144/1", "1x24x56x56:144/2", "1x32x28x28:192/1",
                "1x32x28x28:192/2", "1x64x14x14:384/1", "1x96x14x14:576/1", "1x96x14x14:576/2",
                "1x160x7x7:960/1")
EFFICIENTNET = ("1x24x56x56:144/2k5", "1x40x28x28:240/2k5")


def parse(shape: str):
    dims, rest = shape.split(":")
    d, tail = rest.split("/")
    stride, k = (tail.split("k") + ["3"])[:2]
    return [int(v) for v in dims.split("x")], int(d), int(stride), int(k)


def block_model(shape: str):
    """The ONNX model of `shape` (seeded weights) and its inputs."""
    (n, c, h, w), d, stride, k = parse(shape)
    g = GraphBuilder(0)
    x = g.input("x", [n, c, h, w])
    clip = [g.const(np.float32(0)), g.const(np.float32(6))]
    y = g.op("Clip", [g.bn(g.conv(x, c, d, k=1, pads=[0] * 4), d), *clip])
    y = g.op("Clip", [g.bn(g.conv(y, d, d, k=k, stride=stride, pads=[k // 2] * 4, groups=d), d), *clip])
    return g.model([y]), {"x": g.rng.standard_normal((n, c, h, w)).astype(np.float32)}


def main(argv=None) -> int:
    return run(argv, description=__doc__.splitlines()[0], shapes=MOBILENET_V2 + EFFICIENTNET,
               header="shape (x : expanded channels / depthwise stride)", model=block_model, prefix="pointwise_",
               loses=pwdw_llvm.LOSES)


if __name__ == "__main__":
    sys.exit(main())
