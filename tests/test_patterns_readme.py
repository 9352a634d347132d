"""patterns/README.md's worked example runs as written."""

import re
from pathlib import Path

import numpy as np
import onnx

from tvm_fusion.cli import main
from tvm_fusion.testing import GraphBuilder, check_fused

README = Path(__file__).parent.parent / "tvm_fusion" / "patterns" / "README.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), re.S)


def _clipped_block() -> onnx.ModelProto:
    """conv -> BN -> Clip(0, 4) (a ReLU-4), then a conv -> BN -> ReLU block."""
    g = GraphBuilder(11)
    x = g.input("x", [2, 8, 10, 10])
    y = g.op("Clip", [g.bn(g.conv(x, 8, 8), 8), g.const(np.float32(0)), g.const(np.float32(4))])
    return g.model([g.op("Relu", [g.bn(g.conv(y, 8, 8), 8)])])


def test_worked_example(tmp_path, monkeypatch, capsys):
    rules_file, python_usage = _blocks("python")[:2]  # sections 2 and 3; section 5: test_two_file_rule.py
    (tmp_path / "my_rules.py").write_text(rules_file)
    onnx.save(_clipped_block(), str(tmp_path / "model.onnx"))
    monkeypatch.chdir(tmp_path)

    assert main(["explain", "model.onnx"]) == 0  # before: the clip is left alone
    out = capsys.readouterr().out
    assert "rules fired: conv2d_bn_relu 1, conv2d_bn 1" in out and "clip bounds are (0, 4); relu6 needs (0, 6)" in out

    assert main(["explain", "model.onnx", "--rules", "my_rules.py"]) == 0
    out = capsys.readouterr().out
    assert "rules fired: conv2d_bn_clip 1, conv2d_bn_relu 1" in out

    exec(compile(python_usage, "README python block", "exec"), {})  # noqa: S102 - our own docs
    assert "conv2d_bn_clip" in capsys.readouterr().out

    import tvm_fusion as tf

    check_fused(_clipped_block(), tf.rules(["my_rules.py"]),
                expect={"conv2d_bn_clip": 1, "conv2d_bn_relu": 1})
    assert main(["compare", "model.onnx", "--rules", "my_rules.py", "--repeat", "1"]) == 0
