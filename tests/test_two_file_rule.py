"""A rule with a new kernel is two files: patterns/README.md section 5 (`conv2d_bn_mish`: a new epilogue
activation, its pattern, compute and rule in `mish_rules.py`, and `test_mish_rules.py`) and section 6 (the
`l2_normalize` family: rule, compute, CPU and CUDA schedules in `l2norm_rules.py`, and its test), each
written as the only files of an empty folder and tested there by a fresh pytest: the rule loads through the
public user-rules path (`tvm_fusion.rules([file or folder])`, `--rules`), fires with the exact count, matches
unfused and onnxruntime on the CPU, and its CUDA build compiles. A module dropped into the package is a
built-in family with nothing else edited (`patterns.families()`)."""

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).parent.parent / "tvm_fusion" / "patterns" / "README.md"


def _files(number: int = 5) -> dict[str, str]:
    """A section's files: each python block follows the sentence naming its file."""
    section = README.read_text().split(f"## {number}. ", 1)[1].split(f"## {number + 1}. ", 1)[0]
    blocks = re.findall(r"`(\w+\.py)`[^`]*?:\n\n```python\n(.*?)```", section, re.S)
    return dict(blocks)


def test_a_rule_with_a_new_kernel_is_two_files(tmp_path):
    files = _files()
    assert sorted(files) == ["mish_rules.py", "test_mish_rules.py"]
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mish_rules.py", "test_mish_rules.py"]
    env = {**os.environ, "TVM_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          "test_mish_rules.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0 and "2 passed" in run.stdout, run.stdout[-4000:] + run.stderr[-2000:]


def _run_pytest(folder: Path, test: str, passed: int) -> None:
    env = {**os.environ, "TVM_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", test],
                         cwd=folder, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0 and f"{passed} passed" in run.stdout, run.stdout[-4000:] + run.stderr[-2000:]


def test_a_family_with_its_own_kernel_is_two_files(tmp_path):
    files = _files(6)
    assert sorted(files) == ["l2norm_rules.py", "test_l2norm_rules.py"]
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    _run_pytest(tmp_path, "test_l2norm_rules.py", 3)


def test_a_module_in_the_package_is_a_builtin_family(tmp_path):
    """The family module on the package's path (as if written into tvm_fusion/patterns/): builtin_rules()
    finds it, with its compute and schedules, and nothing else lists it."""
    (tmp_path / "l2norm.py").write_text(_files(6)["l2norm_rules.py"])
    code = ("import sys, tvm_fusion.patterns as p; p.__path__.append(sys.argv[1]); "
            "from tvm_fusion import registry; "
            "names = [r.name for r in p.builtin_rules()]; "
            "assert 'tvm_fusion.patterns.l2norm' in p.families(), p.families(); "
            "assert 'l2_normalize' in names and registry.get_schedule('l2_normalize', 'llvm'), names; "
            "assert registry.get_schedule('l2_normalize', 'cuda'); print('found', len(names))")
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TVM_NUM_THREADS": "1"})
    assert run.returncode == 0 and "found" in run.stdout, run.stdout[-2000:] + run.stderr[-2000:]
