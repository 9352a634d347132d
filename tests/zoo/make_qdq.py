"""Regenerate the corpus's quantized (QDQ) models: `python tests/zoo/make_qdq.py [OUT_DIR]` (no torch needed).

Each entry of corpus.ENTRIES with a `quantized` record is a checked-in float model of the corpus (`source`)
quantized as onnxruntime's documentation tells users to: `quant_pre_process` (shape inference and
onnxruntime's graph optimizer), then `quantize_static` in the QDQ format, int8 activations and weights,
per-tensor or `per_channel`, MinMax calibration on `CALIBRATION` seeded inputs of the source entry
(`make_inputs(source, seed=100 + i)`). The output is deterministic for a given onnxruntime (the files were
made with 1.32.0); unused opset imports the pre-processing adds are dropped.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import onnx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from corpus import ENTRIES, QUANTIZED, make_inputs  # noqa: E402

CALIBRATION = 8


class _Reader:
    """onnxruntime's CalibrationDataReader protocol: the source entry's inputs for seeds 100, 101, ..."""

    def __init__(self, source: str):
        self._feeds = iter([make_inputs(source, seed=100 + i) for i in range(CALIBRATION)])

    def get_next(self):
        return next(self._feeds, None)


def quantize(name: str) -> bytes:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    spec = ENTRIES[name]["quantized"]
    with tempfile.TemporaryDirectory() as tmp:
        pre, out = Path(tmp) / "pre.onnx", Path(tmp) / "qdq.onnx"
        quant_pre_process(str(HERE / f"{spec['source']}.onnx"), str(pre))
        quantize_static(str(pre), str(out), _Reader(spec["source"]), quant_format=QuantFormat.QDQ,
                        per_channel=spec["per_channel"], activation_type=QuantType.QInt8,
                        weight_type=QuantType.QInt8)
        model = onnx.load(str(out))
    used = {n.domain for n in model.graph.node}
    kept = [o for o in model.opset_import if o.domain in used or o.domain in ("", "ai.onnx")]
    del model.opset_import[:]
    model.opset_import.extend(kept)
    model.graph.name = name
    onnx.checker.check_model(model)
    return model.SerializeToString(deterministic=True)


def main(out_dir: Path = HERE) -> None:
    for name in QUANTIZED:
        data = quantize(name)
        (Path(out_dir) / f"{name}.onnx").write_bytes(data)
        print(f"{name}.onnx: {len(data) / 1024:.0f} KiB")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
