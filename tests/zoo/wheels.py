"""Pretrained ONNX models that packages on the package index ship inside their wheels, fetched by package
name and pinned version and checked by sha256: `fetch(name) -> Path`.

    pip download --no-deps PACKAGE==VERSION  ->  unzip MEMBER  ->  sha256 == SHA256  ->  cache

The file is cached as `$TVM_FUSION_CACHE/wheels/<package>-<version>/<member's file name>` (default
`~/.cache/tvm_fusion`); a cached file is checked again before use. Nothing else is downloaded at run time
(no model hub). When the package index cannot be reached, `fetch` raises `RegistryUnreachable` (the tests
skip with its reason); any other failure (a wrong checksum, a missing member, pip refusing the pin) raises
`WheelError`.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from tvm_fusion.examples import cache_dir

__all__ = ["WHEEL_MODELS", "RegistryUnreachable", "WheelError", "cached_path", "fetch"]


def _model(package: str, version: str, member: str, sha256: str, size: int) -> dict:
    return {"package": package, "version": version, "member": member, "sha256": sha256, "size": size}


_OCR = "rapidocr_onnxruntime/models/"
#: name -> the wheel that ships it, the member's path inside, its sha256 and size in bytes
WHEEL_MODELS = {
    # PaddleOCR (PP-OCRv4 detector and recogniser, PP-OCR v2 mobile direction classifier): paddle2onnx
    "ppocr_det": _model("rapidocr-onnxruntime", "1.4.4", _OCR + "ch_PP-OCRv4_det_infer.onnx",
                        "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9", 4745517),
    "ppocr_rec": _model("rapidocr-onnxruntime", "1.4.4", _OCR + "ch_PP-OCRv4_rec_infer.onnx",
                        "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b", 10857958),
    "ppocr_cls": _model("rapidocr-onnxruntime", "1.4.4", _OCR + "ch_ppocr_mobile_v2.0_cls_infer.onnx",
                        "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c", 585532),
    # NudeNet's detector: an ultralytics YOLOv8n, exported by pytorch 2.3.1 at opset 17
    "nudenet_yolov8n": _model("nudenet", "3.4.2", "nudenet/320n.onnx",
                              "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f", 12150158),
    # Google's Magika file-type classifier (bytes -> 214 content types): jax2tf, then tf2onnx 1.16.1
    "magika_v3_3": _model("magika", "1.0.3", "magika/models/standard_v3_3/model.onnx",
                          "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c", 3163737),
    # Spotify's Basic Pitch (audio -> note, onset and contour maps), its constant-Q transform in the graph: tf2onnx
    "basic_pitch": _model("basic-pitch", "0.4.0", "basic_pitch/saved_models/icassp_2022/nmp.onnx",
                          "2c3c1d144bfa61ad236e92e169c13535c880469a12a047d4e73451f2c059a0ec", 230444),
    # ddddocr's YOLOX-style text-box detector, exported by pytorch at opset 11
    "ddddocr_det": _model("ddddocr", "1.6.1", "ddddocr/common_det.onnx",
                          "6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6", 20127694),
    # Silero VAD's 16 kHz model, exported by pytorch at opset 15: an STFT by Conv1d, a conv encoder, and an
    # ONNX LSTM inside the If branches that pick the sample rate
    "silero_vad": _model("silero-vad", "6.2.3", "silero_vad/data/silero_vad_16k_op15.onnx",
                         "7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49", 1289603),
}

#: what pip prints when it cannot reach the index (as opposed to the index refusing the pin)
_UNREACHABLE = re.compile(r"NewConnectionError|Max retries exceeded|Temporary failure in name resolution|"
                          r"Network is unreachable|Connection refused|ConnectTimeout|ReadTimeout|ProxyError|"
                          r"Failed to establish a new connection|Name or service not known")


class WheelError(RuntimeError):
    """The wheel was reached but does not give the pinned model (checksum, member, version)."""


class RegistryUnreachable(WheelError):
    """The package index could not be reached: the model cannot be fetched on this machine."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cached_path(name: str) -> Path:
    spec = WHEEL_MODELS[name]
    return cache_dir("wheels") / f"{spec['package']}-{spec['version']}" / Path(spec["member"]).name


def _download(package: str, version: str, into: Path) -> Path:
    """The wheel of package==version for this platform, by pip (no dependencies, binary only)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
           "--disable-pip-version-check", "--retries", "1", "--timeout", "30", "-d", str(into),
           f"{package}=={version}"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired as err:
        raise RegistryUnreachable(f"pip download {package}=={version} took over 600 s") from err
    if done.returncode != 0:
        text = done.stdout + done.stderr
        last = [line for line in text.splitlines() if line.strip()][-1:] or ["(no output)"]
        kind = RegistryUnreachable if _UNREACHABLE.search(text) else WheelError
        raise kind(f"pip download {package}=={version} failed (exit {done.returncode}): {last[0].strip()}")
    wheels = list(into.glob("*.whl"))
    if len(wheels) != 1:
        raise WheelError(f"pip download {package}=={version} gave {[w.name for w in wheels]}, not one wheel")
    return wheels[0]


def fetch(name: str) -> Path:
    """Path of the named model, from the cache when its checksum holds, else from its wheel."""
    if name not in WHEEL_MODELS:
        raise KeyError(f"unknown wheel model {name!r}; known: {', '.join(WHEEL_MODELS)}")
    spec, path = WHEEL_MODELS[name], cached_path(name)
    if path.exists() and _sha256(path) == spec["sha256"]:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        wheel = _download(spec["package"], spec["version"], Path(tmp))
        with zipfile.ZipFile(wheel) as zf:
            if spec["member"] not in zf.namelist():
                raise WheelError(f"{wheel.name} has no {spec['member']}")
            # every model of the same wheel is unpacked at once: one download per wheel
            for other, o in WHEEL_MODELS.items():
                if (o["package"], o["version"]) == (spec["package"], spec["version"]) and o["member"] in zf.namelist():
                    out = Path(tmp) / Path(o["member"]).name
                    out.write_bytes(zf.read(o["member"]))
                    got = _sha256(out)
                    if got != o["sha256"]:
                        raise WheelError(f"{wheel.name}: {o['member']} has sha256 {got}, expected {o['sha256']} "
                                         f"(model {other!r}); refusing to use it")
                    os.replace(out, cached_path(other))
    return path
