"""No import cycles: every module of tvm_fusion and its subpackages (tvm_fusion.patterns, tvm_fusion.schedules,
the stage packages) imports on its own, in a fresh package. One child interpreter loads the third-party libraries once (tvm, onnx, numpy) and
forks a process per module, so each module is the first of ours imported there."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent

#: forks a child per module name read from stdin; prints "FAIL <module> <error>" for each that fails
_CHILD = r'''
import os, sys, traceback
import numpy, onnx, onnxruntime, tvm, tvm.relax  # third-party, loaded once before the forks
failed = 0
for name in sys.stdin.read().split():
    pid = os.fork()
    if pid == 0:
        try:
            __import__(name)
            code = 0
        except BaseException as err:
            last = traceback.format_exception_only(type(err), err)[-1].strip()
            print(f"FAIL {name} {last}", flush=True)
            code = 1
        os._exit(code)
    failed += os.waitpid(pid, 0)[1] != 0
sys.exit(1 if failed else 0)
'''


def _modules() -> list[str]:
    names = []
    for path in sorted((ROOT / "tvm_fusion").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            names.append(".".join(parts[:-1]))
        elif parts[-1] != "__main__" and not parts[-1].endswith("_test"):
            names.append(".".join(parts))
    return names


def test_every_module_imports_alone():
    modules = _modules()
    assert len(modules) > 60 and "tvm_fusion.patterns.conv_epilogue" in modules
    run = subprocess.run([sys.executable, "-c", _CHILD], input="\n".join(modules), capture_output=True,
                         text=True, timeout=600, cwd=ROOT)
    failures = [line for line in run.stdout.splitlines() if line.startswith("FAIL")]
    assert run.returncode == 0 and not failures, "\n".join(failures) or run.stderr[-3000:]
