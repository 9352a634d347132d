"""A rule with a new kernel is two files: patterns/README.md section 5 (`conv2d_bn_mish`: a new epilogue
activation, its pattern, compute and rule in `mish_rules.py`, and `test_mish_rules.py`), written as the
only files of an empty folder and tested there by a fresh pytest: the rule loads through the public
user-rules path (`tvm_fusion.rules([file])`, `--rules FILE`), fires with the exact count, matches unfused
and onnxruntime on the CPU, and its CUDA build compiles."""

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).parent.parent / "tvm_fusion" / "patterns" / "README.md"


def _files() -> dict[str, str]:
    """Section 5's files: each python block follows the sentence naming its file."""
    section = README.read_text().split("## 5. ", 1)[1]
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
