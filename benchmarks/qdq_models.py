"""QDQ int8 models at realistic sizes for benchmarks/cpu_speed.py (`--models qdq`), made on the fly and cached.

    encoder_qdq    4 post-LN encoder layers, d 384, 6 heads, FFN 1536 (Whisper-tiny's encoder layers) on
                   256 frames (tvm_fusion.testing.encoder)
    resnet50_qdq   the ResNet-50 example (tvm_fusion.examples) at 224x224, converted to opset 13

Each float model goes through onnxruntime's `quant_pre_process`, then `quantize_static` (QDQ format, int8
activations and per-channel int8 weights, MinMax calibration on 4 seeded N(0, 1) inputs), as onnxruntime's
documentation tells users to. Files are cached under ~/.cache/tvm_fusion/qdq (TVM_FUSION_CACHE moves it).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx

QDQ_MODELS = ("encoder_qdq", "resnet50_qdq")
CALIBRATION = 4


def _float_model(name: str) -> onnx.ModelProto:
    if name == "encoder_qdq":
        from tvm_fusion.testing import encoder

        return encoder(d=384, heads=6, layers=4, seq=256, seed=0)
    from onnx import version_converter

    from tvm_fusion.examples import example_path

    return version_converter.convert_version(onnx.load(str(example_path("resnet50"))), 13)


def inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {i.name: rng.standard_normal([d.dim_value or 1 for d in i.type.tensor_type.shape.dim], dtype=np.float32)
            for i in model.graph.input}


def qdq_path(name: str) -> Path:
    """The cached QDQ model `name` (one of QDQ_MODELS), made on first use (a minute or two)."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    if name not in QDQ_MODELS:
        raise ValueError(f"unknown QDQ model {name!r}; known: {', '.join(QDQ_MODELS)}")
    folder = Path(os.environ.get("TVM_FUSION_CACHE", Path.home() / ".cache" / "tvm_fusion")) / "qdq"
    out = folder / f"{name}.onnx"
    if out.exists():
        return out
    folder.mkdir(parents=True, exist_ok=True)
    model = _float_model(name)
    float_path, pre = folder / f"{name}.float.onnx", folder / f"{name}.pre.onnx"
    onnx.save(model, str(float_path))
    quant_pre_process(str(float_path), str(pre))
    feeds = iter([inputs(model, seed=100 + i) for i in range(CALIBRATION)])

    class Reader:  # onnxruntime's CalibrationDataReader protocol
        def get_next(self):
            return next(feeds, None)

    partial = folder / f"{name}.partial.onnx"
    quantize_static(str(pre), str(partial), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    partial.rename(out)
    float_path.unlink()
    pre.unlink()
    return out
