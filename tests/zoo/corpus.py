"""The corpus of real exporters' graphs: what each entry is, how it was exported, and its inputs.

Each entry states its inputs so a run feeds meaningful values: `ids` are token ids in [low, high) (inside
the vocabulary), `mask` is an attention mask of 0/1 with at least the first token kept, `normal` is
N(0, 1) float32. `shapes` binds the dynamic batch axis the TorchScript exports declare.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["ENTRIES", "ZOO_DIR", "make_inputs", "model_path"]

ZOO_DIR = Path(__file__).resolve().parent

_IMAGE = {"pixels": {"kind": "normal", "shape": [1, 3, 32, 32]}}
_YOLO = {"images": {"kind": "normal", "shape": [1, 3, 32, 32]}}
_TOKENS = {"input_ids": {"kind": "ids", "shape": [1, 16], "low": 0, "high": 100},
           "attention_mask": {"kind": "mask", "shape": [1, 16]}}


def _entry(arch, exporter, opset, inputs, outputs, seed=0, **extra):
    return {"arch": arch, "exporter": exporter, "opset": opset, "inputs": inputs, "outputs": outputs,
            "seed": seed, **extra}


#: name -> how it is made (tests/zoo/make_zoo.py) and fed
ENTRIES = {
    "mobilenetv3_ts13": _entry("mobilenetv3", "torchscript", 13, _IMAGE, ["logits"]),
    "mobilenetv3_dynamo18": _entry("mobilenetv3", "dynamo", 18, _IMAGE, ["logits"]),
    "efficientnet_ts15": _entry("efficientnet", "torchscript", 15, _IMAGE, ["logits"]),
    "convnext_ts17": _entry("convnext", "torchscript", 17, _IMAGE, ["logits"]),
    "convnext_dynamo18": _entry("convnext", "dynamo", 18, _IMAGE, ["logits"]),
    "bert_ts14": _entry("bert", "torchscript", 14, _TOKENS, ["last_hidden_state", "pooled"]),
    "bert_dynamo18": _entry("bert", "dynamo", 18, _TOKENS, ["last_hidden_state", "pooled"]),
    "yolo_ts17": _entry("yolo", "torchscript", 17, _YOLO, ["preds"]),
    "yolo_constants_ts13": _entry("yolo", "torchscript", 13, _YOLO, ["preds"], constant_weights=True),
}


def model_path(name: str) -> Path:
    return ZOO_DIR / f"{name}.onnx"


def make_inputs(name: str, seed: int = 0) -> dict[str, np.ndarray]:
    """The entry's inputs: token ids inside the vocabulary, 0/1 masks (the tail masked), N(0, 1) floats."""
    rng = np.random.default_rng(seed)
    out = {}
    for input_name, spec in ENTRIES[name]["inputs"].items():
        shape = spec["shape"]
        if spec["kind"] == "ids":
            out[input_name] = rng.integers(spec["low"], spec["high"], shape, dtype=np.int64)
        elif spec["kind"] == "mask":
            keep = rng.integers(1, shape[-1] + 1, shape[:-1])[..., None]
            out[input_name] = (np.arange(shape[-1]) < keep).astype(np.int64)
        else:
            out[input_name] = rng.standard_normal(shape, dtype=np.float32)
    return out


def shapes(name: str) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v["shape"]) for k, v in ENTRIES[name]["inputs"].items()}
