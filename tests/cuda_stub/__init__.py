"""A stub CUDA driver + runtime (stub.c) so TVM's real CUDA loader and VM run without a GPU.

    libdir = build_stub(tmp_dir)                    # libcuda.so.1 + libcudart.so.13, built with `cc`
    run = run_with_stub(libdir, "x.so", shapes)      # TVM loads x.so and runs main once, in a subprocess
    run.launches                                     # every kernel launch TVM issued, from the stub's log
    problems = check_launches(library_cuda_module("x.so"), run.launches)

The kernels do not run (results are garbage); what is checked is everything up to the GPU: the library
loads through TVM's loader, each kernel is found in the compiled image, and each launch is well-formed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tvm_fusion.deploy.cuda_binary import CudaModule, fatbin_kernels

HERE = Path(__file__).parent
RUNTIME_SONAME = "libcudart.so.13"  # what libtvm_runtime_cuda.so links (`ldd`), symbols versioned by it


def build_stub(out_dir) -> Path:
    """Compile stub.c into libcuda.so.1 and libcudart.so.13 under `out_dir`."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc) on PATH: the CUDA stub tests need one")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    script = out / "cudart.map"
    script.write_text(f"{RUNTIME_SONAME} {{ global: cuda*; local: *; }};\n")
    common = [cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", str(HERE / "stub.c")]
    subprocess.run([*common, "-DSTUB_DRIVER", "-Wl,-soname,libcuda.so.1", "-o", str(out / "libcuda.so.1"), "-ldl"],
                   check=True)
    subprocess.run([*common, "-DSTUB_RUNTIME", f"-Wl,-soname,{RUNTIME_SONAME}", f"-Wl,--version-script={script}",
                    "-o", str(out / RUNTIME_SONAME)], check=True)
    return out


def stub_env(libdir, log) -> dict:
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join([str(libdir), *filter(None, [env.get("LD_LIBRARY_PATH")])])
    env["STUB_CUDA_LOG"] = str(log)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


@dataclass(frozen=True)
class Launch:
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shmem: int


_LAUNCH = re.compile(r"launch (\w+) grid=(\d+),(\d+),(\d+) block=(\d+),(\d+),(\d+) shmem=(\d+)")


def per_inference(lines: list[str]) -> list[dict]:
    """For each `inference N` section of a log: its kernel launches, graph launches, kernels captured into a
    graph and kernels a graph replayed (counts)."""
    out = []
    for line in lines:
        if line.startswith("inference "):
            out.append({"launch": 0, "graph_launch": 0, "capture": 0, "replay": 0})
        elif out and line.split(" ", 1)[0] in out[-1]:
            out[-1][line.split(" ", 1)[0]] += 1
    return out


def read_log(log) -> tuple[list[str], list[Launch]]:
    lines = Path(log).read_text().splitlines() if Path(log).exists() else []
    launches = []
    for line in lines:
        m = _LAUNCH.fullmatch(line)
        if m:
            v = [int(x) for x in m.groups()[1:]]
            launches.append(Launch(m.group(1), tuple(v[0:3]), tuple(v[3:6]), v[6]))
    return lines, launches


@dataclass
class StubRun:
    returncode: int
    output: str  # the subprocess's stdout + stderr
    result: dict  # what run_library.py printed: devices, outputs
    log: list[str]  # every call the stub saw
    launches: list[Launch]


def run_with_stub(libdir, library, shapes: dict, log, timeout: int = 600, runs: int = 1) -> StubRun:
    """Load `library` with TVM on tvm.cuda(0) under the stub and run `main` `runs` times, in a fresh process."""
    Path(log).unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, str(HERE / "run_library.py"), str(library), json.dumps(shapes), str(runs)],
                          env=stub_env(libdir, log), capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    result = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
    lines, launches = read_log(log)
    return StubRun(proc.returncode, out, result, lines, launches)


def _product(v) -> int:
    out = 1
    for x in v:
        out *= x
    return out


def check_launches(module: CudaModule, launches: list[Launch]) -> list[str]:
    """What is wrong between a library's function table, its compiled code and the launches TVM issued."""
    ptx, elf = fatbin_kernels(module.data)
    problems = []
    for key, f in module.functions.items():
        if f.name not in ptx and f.name not in elf:
            problems.append(f"{f.name}: in the function table, not in the compiled code")
            continue
        if f.name in ptx and ptx[f.name].params != len(f.arg_types):
            problems.append(f"{f.name}: {len(f.arg_types)} args in the function table, "
                            f"{ptx[f.name].params} params in the PTX")
    for launch in launches:
        k = ptx.get(launch.kernel)
        if launch.kernel not in {f.name for f in module.functions.values()}:
            problems.append(f"{launch.kernel}: launched but not in the function table")
        elif k is not None and k.maxntid is not None:
            # .maxntid bounds the block's thread count, not each dimension (__launch_bounds__(160) is
            # `.maxntid 160, 1, 1` and a 10 x 16 block is valid)
            threads, limit = _product(launch.block), _product(k.maxntid)
            if threads > limit:
                problems.append(f"{launch.kernel}: block {launch.block} exceeds .maxntid {k.maxntid}")
        if launch.shmem >= 48 * 1024:
            problems.append(f"{launch.kernel}: {launch.shmem} B of dynamic shared memory (over 48 KB needs opt-in)")
    return problems
