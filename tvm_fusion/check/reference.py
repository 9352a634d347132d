"""onnxruntime as the reference: a model's outputs on one input set, and how exact onnxruntime itself is there.

    values = onnxruntime(model, graph as written)(x)                       ORT_DISABLE_ALL
    noise  = |onnxruntime(model, graph optimized)(x) - values|   per element, ORT_ENABLE_ALL

The graph as written is the model as ONNX defines it (and a faster session start). The optimized graph
computes the same model another way (fused Conv + BatchNorm, Gelu, LayerNorm, int8 kernels for QDQ pairs,
NCHWc layouts); where the two runs differ, the reference is only known to within their difference, and the
verdict (`numerics.error_stats(..., noise=)`) allows that much more at that element. `compare` and compile's
verify step judge with it; anything else that compares against onnxruntime can call `reference_noise`.
"""

from __future__ import annotations

import numpy as np
import onnx

from tvm_fusion.errors import FusionError
from tvm_fusion.check.io import INPUTS_SYNTAX, onnxruntime_reason, run_onnxruntime

__all__ = ["Reference", "reference_noise"]


class Reference:
    """onnxruntime's outputs of `proto` on `inputs` (the graph as written), its output names, and its noise,
    computed once on first use (`noise()`). onnxruntime refusing the model or the inputs is bad input."""

    def __init__(self, proto: onnx.ModelProto, inputs: dict, name: str = "the model"):
        self.proto, self.inputs, self.name = proto, inputs, name
        self.session, self.names = _session(proto, inputs, name, optimize=False)
        self.values = _run(self.session, inputs, name)
        self._optimized = None
        self._noise: list[np.ndarray] | None = None

    def optimized_session(self):
        """The session with onnxruntime's graph optimizations on (what compare times)."""
        if self._optimized is None:
            self._optimized, _ = _session(self.proto, self.inputs, self.name, optimize=True)
        return self._optimized

    def noise(self) -> list[np.ndarray]:
        """Per output, |optimized - as written| per element (float64; NaN where one run is not finite)."""
        if self._noise is None:
            self._noise = spread(_run(self.optimized_session(), self.inputs, self.name), self.values)
        return self._noise


def reference_noise(proto: onnx.ModelProto, inputs: dict, values: list | None = None) -> list[np.ndarray]:
    """onnxruntime's own noise on `inputs`: per output, |optimized - as written| per element, for
    `numerics.error_stats(actual, values[i], noise=noise[i])`. `values`: the outputs of the graph as
    written when already run (they are the reference this noise belongs to); else it is run here."""
    if values is None:
        return Reference(proto, inputs).noise()
    optimized, _ = _session(proto, inputs, "the model", optimize=True)
    return spread(_run(optimized, inputs, "the model"), values)


def spread(one: list, other: list) -> list[np.ndarray]:
    """|one - other| per element of each output, in float64 (bools: 1 where they differ)."""
    out = []
    for a, b in zip(one, other):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype == bool or b.dtype == bool:
            out.append((a != b).astype(np.float64))
            continue
        with np.errstate(invalid="ignore", over="ignore"):
            out.append(np.abs(a.astype(np.float64) - b.astype(np.float64)))
    return out


def _session(proto, inputs, name: str, optimize: bool):
    return run_onnxruntime(proto, inputs, optimize=optimize, name=name)  # a model it refuses: FusionError


def _run(session, inputs: dict, name: str) -> list[np.ndarray]:
    try:
        return session.run(None, inputs)
    except Exception as err:  # noqa: BLE001
        raise FusionError(f"{name}: onnxruntime cannot run the model on these inputs ({onnxruntime_reason(err)}); random "
                          f"integer inputs are drawn from [0, 8): give token ids, indices and masks with "
                          f"{INPUTS_SYNTAX}") from None
