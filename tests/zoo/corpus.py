"""The corpus of real exporters' graphs: what each entry is, how it was exported, and its inputs.

Three sources: graphs made by torch.onnx from small random-weight architectures (tests/zoo/*.onnx, checked
in, made by make_zoo.py), some of them quantized by onnxruntime.quantization into QDQ models (checked in,
made by make_qdq.py from the float files; `quantized` says from which and how), and pretrained models that packages ship inside their wheels (`wheel` entries,
fetched by package name, version and sha256 through wheels.py and cached).

Each entry states its inputs so a run feeds meaningful values: `ids` are token ids in [low, high) (inside
the vocabulary), `mask` is an attention mask of 0/1 with at least the first token kept, `normal` is
N(0, 1) float32, `image` is uniform 8-bit pixels and `text` dark lines of text on a light page (a 5x7 bitmap
font scaled up, pixel noise added), both preprocessed as the package does, `(p / 255 - mean) / std`;
`tone` is a chord of sine waves at `hz` sampled at `rate` with a little noise;
`file_bytes` are a real file's first and last `size` bytes (whitespace stripped, `pad` filling a short
file), as Magika reads a file.
`shapes` binds the dynamic axes (batch, image size) the exports declare.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["CHECKED_IN", "ENTRIES", "FULL_SIZE", "QUANTIZED", "WHEEL_ENTRIES", "ZOO_DIR", "full_size_path", "make_inputs",
           "model_path"]

ZOO_DIR = Path(__file__).resolve().parent

_IMAGE = {"pixels": {"kind": "normal", "shape": [1, 3, 32, 32]}}
_YOLO = {"images": {"kind": "normal", "shape": [1, 3, 32, 32]}}
_AUDIO = {"audio": {"kind": "normal", "shape": [1, 1, 4000]}}
_FEATS = {"feats": {"kind": "normal", "shape": [1, 100, 80]}}
_YOLOX = {"images": {"kind": "normal", "shape": [1, 3, 64, 64]}}
_IMAGE224 = {"pixels": {"kind": "normal", "shape": [1, 3, 224, 224]}}
#: reduced widths (the files stay small; the blocks, kernels, strides and depth are the published ones)
_MOBILENETV2 = {"arch_args": {"width": 0.25}}
_RESNET_STEM = {"arch_args": {"width": 32}}
_TOKENS = {"input_ids": {"kind": "ids", "shape": [1, 16], "low": 0, "high": 100},
           "attention_mask": {"kind": "mask", "shape": [1, 16]}}


def _image(shape, mean: float, std: float) -> dict:
    return {"kind": "image", "shape": shape, "mean": mean, "std": std}


def _text(shape, lines: list[str], scale: int, mean: float, std: float) -> dict:
    return {"kind": "text", "shape": shape, "lines": lines, "scale": scale, "mean": mean, "std": std}


#: a 5x7 bitmap font: each glyph is 7 rows of 5 bits (hex, the high bit on the left)
_FONT = {"0": "0E 11 13 15 19 11 0E", "2": "0E 11 01 02 04 08 1F", "6": "06 08 10 1E 11 11 0E",
         "C": "0E 11 10 10 10 11 0E", "E": "1F 10 10 1E 10 10 1F", "F": "1F 10 10 1E 10 10 10",
         "I": "0E 04 04 04 04 04 0E", "M": "11 1B 15 15 11 11 11", "N": "11 19 15 13 11 11 11",
         "O": "0E 11 11 11 11 11 0E", "R": "1E 11 11 1E 14 12 11", "S": "0F 10 10 0E 01 01 1E",
         "T": "1F 04 04 04 04 04 04", "U": "11 11 11 11 11 11 0E", "V": "11 11 11 11 11 0A 04", " ": "00"}


def _render_text(spec, rng) -> np.ndarray:
    """8-bit pixels of `lines` in dark ink (0-60) on a light page (200-255), each glyph 5x7 cells of
    `scale` pixels, one cell between glyphs, the lines centred."""
    n, c, h, w = spec["shape"]
    scale, lines = spec["scale"], spec["lines"]
    ink = np.zeros((h, w), dtype=bool)
    line_h = 9 * scale
    top = (h - line_h * len(lines)) // 2 + scale
    for row, line in enumerate(lines):
        left = (w - 6 * scale * len(line)) // 2
        for k, char in enumerate(line):
            bits = [int(x, 16) for x in _FONT[char].split()]
            for y, word in enumerate(bits):
                for x in range(5):
                    if word >> (4 - x) & 1:
                        y0, x0 = top + row * line_h + y * scale, left + k * 6 * scale + x * scale
                        ink[y0:y0 + scale, x0:x0 + scale] = True
    if not ink.any() or ink.shape != (h, w):
        raise ValueError(f"text {lines} at scale {scale} does not fit {h}x{w}")
    page = rng.integers(200, 256, (n, c, h, w)).astype(np.float32)
    return np.where(ink, rng.integers(0, 61, (n, c, h, w)).astype(np.float32), page)


#: PaddleOCR's preprocessing in rapidocr-onnxruntime 1.4.4 (config.yaml, text_cls.py): (p / 255 - 0.5) / 0.5
_OCR = {"mean": 0.5, "std": 0.5}
#: a text line for the CRNNs (32 pixels high: 32 columns after their pooling, so 32 LSTM / GRU steps) and a
#: quarter second of 16 kHz audio for the voice-activity detector (124 frames: 124 LSTM steps)
_LINE = {"line": _text([1, 1, 32, 128], ["TVM FUSION"], 2, **_OCR)}


def _entry(arch, exporter, opset, inputs, outputs, seed=0, **extra):
    return {"arch": arch, "exporter": exporter, "opset": opset, "inputs": inputs, "outputs": outputs,
            "seed": seed, **extra}


#: name -> how it is made (tests/zoo/make_zoo.py) and fed
ENTRIES = {
    "mobilenetv3_ts13": _entry("mobilenetv3", "torchscript", 13, _IMAGE, ["logits"]),
    "mobilenetv3_dynamo18": _entry("mobilenetv3", "dynamo", 18, _IMAGE, ["logits"]),
    "efficientnet_ts15": _entry("efficientnet", "torchscript", 15, _IMAGE, ["logits"]),
    "efficientnet_dynamo18": _entry("efficientnet", "dynamo", 18, _IMAGE, ["logits"]),
    # ImageNet-sized inputs for the cross-layer pairs: MobileNetV2's depthwise -> pointwise blocks and the ResNet
    # stem's 112x112 conv output read back by its max pool
    "mobilenetv2_ts13": _entry("mobilenetv2", "torchscript", 13, _IMAGE224, ["logits"], **_MOBILENETV2),
    "mobilenetv2_dynamo18": _entry("mobilenetv2", "dynamo", 18, _IMAGE224, ["logits"], **_MOBILENETV2),
    "resnet_stem_ts17": _entry("resnet_stem", "torchscript", 17, _IMAGE224, ["features"], **_RESNET_STEM),
    "resnet_stem_dynamo18": _entry("resnet_stem", "dynamo", 18, _IMAGE224, ["features"], **_RESNET_STEM),
    "convnext_ts17": _entry("convnext", "torchscript", 17, _IMAGE, ["logits"]),
    "convnext_dynamo18": _entry("convnext", "dynamo", 18, _IMAGE, ["logits"]),
    "bert_ts14": _entry("bert", "torchscript", 14, _TOKENS, ["last_hidden_state", "pooled"]),
    "bert_dynamo18": _entry("bert", "dynamo", 18, _TOKENS, ["last_hidden_state", "pooled"]),
    "yolo_ts17": _entry("yolo", "torchscript", 17, _YOLO, ["preds"]),
    "yolo_constants_ts13": _entry("yolo", "torchscript", 13, _YOLO, ["preds"], constant_weights=True),
    # QDQ int8 models: the float entry `source` through onnxruntime's quant_pre_process and quantize_static
    # (make_qdq.py): per-tensor for the encoder, per-channel weights for the CNN
    "bert_qdq": _entry("bert", "onnxruntime.quantization 1.32.0", 14, _TOKENS, ["last_hidden_state", "pooled"],
                       quantized={"source": "bert_ts14", "per_channel": False}),
    "mobilenetv3_qdq_pc": _entry("mobilenetv3", "onnxruntime.quantization 1.32.0", 13, _IMAGE, ["logits"],
                                 quantized={"source": "mobilenetv3_ts13", "per_channel": True}),
    # audio, speech and dense-prediction models: conv1d, FSMN memory blocks, ViT attention written out
    # (MatMul of two activations, rank 4), ConvTranspose decoders, in-graph box decoding
    "audio1d_ts17": _entry("audio1d", "torchscript", 17, _AUDIO, ["log_probs"]),
    "audio1d_dynamo18": _entry("audio1d", "dynamo", 18, _AUDIO, ["log_probs"]),
    "fsmn_ts13": _entry("fsmn", "torchscript", 13, _FEATS, ["probs"]),
    "fsmn_dynamo18": _entry("fsmn", "dynamo", 18, _FEATS, ["probs"]),
    "vit_seg_ts17": _entry("vit_seg", "torchscript", 17, _IMAGE, ["scores"]),
    "vit_seg_dynamo18": _entry("vit_seg", "dynamo", 18, _IMAGE, ["scores"]),
    "yolox_ts13": _entry("yolox", "torchscript", 13, _YOLOX, ["detections"]),
    "yolox_dynamo18": _entry("yolox", "dynamo", 18, _YOLOX, ["detections"]),
    # recurrent: the exporters write ONNX LSTM / GRU nodes, which the front door unrolls (tvm_fusion/frontend/recurrent.py)
    "crnn_lstm_ts14": _entry("crnn_lstm", "torchscript", 14, _LINE, ["log_probs"]),
    "crnn_lstm_dynamo18": _entry("crnn_lstm", "dynamo", 18, _LINE, ["log_probs"]),
    "crnn_gru_ts17": _entry("crnn_gru", "torchscript", 17, _LINE, ["log_probs"]),
    "crnn_gru_dynamo18": _entry("crnn_gru", "dynamo", 18, _LINE, ["log_probs"]),
    "vad_lstm_ts17": _entry("vad_lstm", "torchscript", 17, _AUDIO, ["speech"]),
    "vad_lstm_dynamo18": _entry("vad_lstm", "dynamo", 18, _AUDIO, ["speech"]),
    # pretrained, from wheels (wheels.WHEEL_MODELS: package, version, sha256), at the sizes the packages use
    "ppocr_det": _entry("PP-OCRv4 text detector (DB)", "paddle2onnx", 12,
                        {"x": _text([1, 3, 96, 192], ["TVM FUSION", "2026"], 2, **_OCR)}, ["sigmoid_0.tmp_0"], wheel=True),
    "ppocr_rec": _entry("PP-OCRv4 text recogniser (SVTR)", "paddle2onnx", 12,
                        {"x": _text([1, 3, 48, 320], ["TVM FUSION 2026"], 3, **_OCR)}, ["softmax_11.tmp_0"], wheel=True),
    "ppocr_cls": _entry("PP-OCR v2 direction classifier (MobileNetV3)", "paddle2onnx", 11,
                        {"x": _text([1, 3, 48, 192], ["FUSION"], 4, **_OCR)}, ["save_infer_model/scale_0.tmp_1"], wheel=True),
    # nudenet.py: cv2.dnn.blobFromImage(img, 1 / 255.0, (320, 320)): pixels in [0, 1]
    "nudenet_yolov8n": _entry("YOLOv8n detector (ultralytics)", "pytorch 2.3.1", 17,
                              {"images": _image([1, 3, 320, 320], mean=0.0, std=1.0)}, ["output0"], wheel=True),
    # magika's model input: 1024 leading + 1024 trailing bytes of a file, 256 the padding token; the file is
    # onnx/__init__.py of the pinned onnx wheel (Python source: Magika's label "python")
    "magika_v3_3": _entry("Magika file-type classifier", "tf2onnx 1.16.1", 15,
                          {"bytes": {"kind": "file_bytes", "shape": [1, 2048], "file": "onnx/__init__.py",
                                     "size": 1024, "pad": 256, "dtype": "int32"}},
                          ["target_label"], wheel=True),
    # basic_pitch/inference.py: mono audio at 22050 Hz in windows of 43844 samples; a chord of three tones
    "basic_pitch": _entry("Basic Pitch note transcriber (CQT + CNN)", "tf2onnx", 15,
                          {"serving_default_input_2:0": {"kind": "tone", "shape": [1, 43844, 1], "rate": 22050,
                                                         "hz": [220.0, 277.2, 329.6]}},
                          ["StatefulPartitionedCall:2", "StatefulPartitionedCall:1", "StatefulPartitionedCall:0"],
                          wheel=True),
    # ddddocr's detector: the letterboxed 416x416 image as 0-255 floats (no normalisation, as YOLOX feeds it)
    "ddddocr_det": _entry("YOLOX text-box detector (ddddocr)", "pytorch", 11,
                          {"images": _image([1, 3, 416, 416], mean=0.0, std=1 / 255)}, ["output"], wheel=True),
    # silero_vad/model.py: windows of 512 samples at 16 kHz, the LSTM state carried between calls, sr = 16000
    "silero_vad": _entry("Silero VAD (STFT conv + LSTM inside If)", "pytorch", 15,
                         {"input": {"kind": "tone", "shape": [1, 512], "rate": 16000, "hz": [180.0, 360.0, 540.0]},
                          "state": {"kind": "normal", "shape": [2, 1, 128]},
                          "sr": {"kind": "value", "shape": [], "value": 16000, "dtype": "int64"}},
                         ["output", "stateN"], wheel=True),
}
#: the cross-layer models at their published widths, for benchmarks (not checked in: MobileNetV2 1.0 is 9 MB):
#: name -> (the checked-in entry whose inputs and exporter they take, what they change in it); `make_zoo.py
#: --full DIR` writes them
FULL_SIZE = {"mobilenetv2_full_ts13": ("mobilenetv2_ts13", {"arch_args": {"width": 1.0}}),
             "resnet_stem_full_ts17": ("resnet_stem_ts17", {"arch_args": {"width": 64}}),
             "efficientnet_b0_full_ts15": ("mobilenetv2_ts13", {"arch": "efficientnet_b0", "opset": 15,
                                                               "arch_args": {"width": 1.0}})}
WHEEL_ENTRIES = tuple(n for n, e in ENTRIES.items() if e.get("wheel"))
CHECKED_IN = tuple(n for n in ENTRIES if n not in WHEEL_ENTRIES)
QUANTIZED = tuple(n for n, e in ENTRIES.items() if e.get("quantized"))  # made by make_qdq.py, not make_zoo.py


def model_path(name: str) -> Path:
    """The checked-in file, or the wheel's model fetched (wheels.RegistryUnreachable without the index)."""
    if ENTRIES[name].get("wheel"):
        from wheels import fetch

        return fetch(name)
    return ZOO_DIR / f"{name}.onnx"


def full_size_path(name: str) -> Path:
    """A FULL_SIZE model, exported on first use by `make_zoo.py --full` (torch needed then) and cached under
    ~/.cache/tvm_fusion/zoo_full (TVM_FUSION_CACHE moves it)."""
    import os
    import subprocess
    import sys
    import tempfile

    folder = Path(os.environ.get("TVM_FUSION_CACHE", Path.home() / ".cache" / "tvm_fusion")) / "zoo_full"
    if not (folder / f"{name}.onnx").exists():
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            done = subprocess.run([sys.executable, str(ZOO_DIR / "make_zoo.py"), "--full", tmp], capture_output=True,
                                  text=True)
            if done.returncode:
                last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                raise RuntimeError(f"make_zoo.py --full failed ({last}); it needs torch (pip install torch==2.13.0), "
                                   f"or run it with a Python that has torch: make_zoo.py --full {folder}")
            for made in Path(tmp).glob("*.onnx"):
                made.replace(folder / made.name)
    return folder / f"{name}.onnx"


def _file_bytes(spec) -> np.ndarray:
    """Magika's features of `spec["file"]` (a path inside site-packages): the first `size` bytes of the
    first 4 KiB with leading whitespace stripped, padded after, then the last `size` of the last 4 KiB
    with trailing whitespace stripped, padded before."""
    import onnx

    data = (Path(onnx.__file__).parents[1] / spec["file"]).read_bytes()
    size, pad = spec["size"], spec["pad"]
    beg = list(data[:4096].lstrip()[:size])
    end = list(data[-4096:].rstrip()[-size:])
    row = beg + [pad] * (size - len(beg)) + [pad] * (size - len(end)) + end
    return np.array(row, dtype=spec["dtype"]).reshape(spec["shape"])


def make_inputs(name: str, seed: int = 0) -> dict[str, np.ndarray]:
    """The entry's inputs: token ids inside the vocabulary, 0/1 masks (the tail masked), N(0, 1) floats,
    preprocessed 8-bit pixels."""
    rng = np.random.default_rng(seed)
    out = {}
    for input_name, spec in ENTRIES[name]["inputs"].items():
        shape = spec["shape"]
        if spec["kind"] == "ids":
            out[input_name] = rng.integers(spec["low"], spec["high"], shape).astype(spec.get("dtype", "int64"))
        elif spec["kind"] == "mask":
            keep = rng.integers(1, shape[-1] + 1, shape[:-1])[..., None]
            out[input_name] = (np.arange(shape[-1]) < keep).astype(np.int64)
        elif spec["kind"] == "file_bytes":
            out[input_name] = _file_bytes(spec)
        elif spec["kind"] == "tone":
            t = np.arange(shape[1]) / spec["rate"]
            wave = sum(np.sin(2 * np.pi * hz * t) for hz in spec["hz"]) / len(spec["hz"])
            noise = 0.01 * rng.standard_normal(shape[1])
            out[input_name] = (0.5 * wave + noise).astype(np.float32).reshape(shape)
        elif spec["kind"] == "value":
            out[input_name] = np.full(shape, spec["value"], dtype=spec["dtype"])
        elif spec["kind"] in ("image", "text"):
            pixels = _render_text(spec, rng) if spec["kind"] == "text" else rng.integers(0, 256, shape).astype(np.float32)
            out[input_name] = ((pixels / 255 - spec["mean"]) / spec["std"]).astype(np.float32)
        else:
            out[input_name] = rng.standard_normal(shape, dtype=np.float32)
    return out


def shapes(name: str) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v["shape"]) for k, v in ENTRIES[name]["inputs"].items()}
