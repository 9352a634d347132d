"""Peak memory bandwidth and FLOP rate of the device a profile runs on: the roofs of the roofline.

CPU: measured once per process on the host, a STREAM-style probe (numpy copy and a two-pass triad over arrays
far larger than the caches) for bandwidth and a float32 matmul (numpy's BLAS, every core) for the FLOP rate.
CUDA: the vendor figures of known GPUs (FP32 without tensor cores, HBM bandwidth), matched by device name.
"""

from __future__ import annotations

import functools
import time
from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["Peaks", "host_peaks", "gpu_peaks", "KNOWN_GPUS"]

#: device-name fragment -> (bytes/s, FP32 FLOP/s); datasheet values
KNOWN_GPUS = {
    "H200": (4.8e12, 67e12),
    "H100 PCIe": (2.0e12, 51e12),
    "H100": (3.35e12, 67e12),
    "A100": (2.0e12, 19.5e12),
    "L40S": (0.864e12, 91.6e12),
    "L4": (0.3e12, 30.3e12),
    "A10": (0.6e12, 31.2e12),
    "V100": (0.9e12, 15.7e12),
    "T4": (0.32e12, 8.1e12),
    "RTX 4090": (1.008e12, 82.6e12),
}
_STREAM_ELEMENTS = 1 << 23  # 32 MB per float32 array: a copy streams 64 MB, past the last-level cache
_MATMUL_N = 1024


@dataclass(frozen=True)
class Peaks:
    bandwidth: float  # bytes/s
    flops: float  # FLOP/s
    source: str  # how they were found

    @property
    def ridge(self) -> float:
        """Arithmetic intensity (FLOP/byte) where the two roofs meet."""
        return self.flops / self.bandwidth

    def roofline_seconds(self, flops: float, nbytes: float) -> float:
        """The least time a kernel moving `nbytes` and doing `flops` can take on this device."""
        return max(flops / self.flops, nbytes / self.bandwidth)

    def to_json(self) -> dict:
        return {**asdict(self), "ridge": self.ridge}


def _best(fn, tries: int) -> float:
    best = float("inf")
    for _ in range(tries):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


@functools.lru_cache(maxsize=1)
def host_peaks() -> Peaks:
    """Measure the host once: best of a few copy / triad passes and float32 matmuls."""
    a, b, c = (np.full(_STREAM_ELEMENTS, v, np.float32) for v in (1.0, 2.0, 3.0))
    nbytes = _STREAM_ELEMENTS * 4
    copy = 2 * nbytes / _best(lambda: np.copyto(a, b), 3)

    def triad():  # a = b + 3 c in two passes: read c, write a; read a and b, write a
        np.multiply(c, 3.0, out=a)
        np.add(a, b, out=a)

    bandwidth = max(copy, 5 * nbytes / _best(triad, 3))
    m = np.random.default_rng(0).standard_normal((_MATMUL_N, _MATMUL_N)).astype(np.float32)
    m @ m  # noqa: B018 - warm the BLAS threads
    flops = 2 * _MATMUL_N**3 / _best(lambda: m @ m, 3)
    return Peaks(bandwidth, flops, f"measured on this host (numpy copy/triad over {nbytes >> 20} MB arrays, "
                                   f"float32 matmul {_MATMUL_N}x{_MATMUL_N})")


def gpu_peaks(device_name: str) -> Peaks | None:
    """Datasheet roofs for a known GPU, or None."""
    for fragment, (bw, fl) in KNOWN_GPUS.items():
        if fragment.lower() in device_name.lower():
            return Peaks(bw, fl, f"datasheet of {fragment} (FP32, no tensor cores)")
    return None
