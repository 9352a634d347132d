"""Weights outside the library (weights.py, `compile --external-weights`): the same results as embedded
weights, a smaller library, and the weights really come from the file (swapping them changes the output)."""

import json

import numpy as np
import onnx
import pytest

from tvm_fusion._tvm import relax, tvm
from tvm_fusion.cli import main
from tvm_fusion.errors import FusionError
from tvm_fusion.testing import residual_block
from tvm_fusion.runtime.weights import load_weights, save_weights


def _run(lib, x, weights=None):
    dev = tvm.cpu(0)
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(lib)), dev)
    w = load_weights(lib, dev) if weights is None else weights
    return vm["main"](tvm.runtime.tensor(x, dev), *w).numpy()


def test_external_weights_match_embedded(tmp_path, capsys):
    model = tmp_path / "block.onnx"
    onnx.save(residual_block(c=32), str(model))
    embedded, external = tmp_path / "embedded.so", tmp_path / "external.so"
    assert main(["compile", str(model), "--target", "llvm", "-o", str(embedded), "--no-counts"]) == 0
    assert main(["compile", str(model), "--target", "llvm", "-o", str(external), "--no-counts",
                 "--external-weights"]) == 0
    assert "external.so.weights (" in capsys.readouterr().out
    manifest = json.loads((tmp_path / "external.so.json").read_text())
    assert manifest["weights"]["file"] == "external.so.weights"
    assert manifest["weights"]["params"] == ["w0", "w1", "w2", "w3"]
    assert "weights" not in json.loads((tmp_path / "embedded.so.json").read_text())
    weight_bytes = 2 * (32 * 32 * 9 + 32) * 4
    assert external.stat().st_size + weight_bytes // 2 < embedded.stat().st_size
    assert load_weights(embedded, tvm.cpu(0)) == []

    x = np.random.default_rng(0).standard_normal((1, 32, 10, 10)).astype(np.float32)
    np.testing.assert_array_equal(_run(external, x), _run(embedded, x, []))  # same kernels, same values

    weights = load_weights(external, tvm.cpu(0))
    zeros = [tvm.runtime.tensor(np.zeros(w.shape, np.float32)) for w in weights]
    save_weights(tmp_path / "external.so.weights", dict(zip(manifest["weights"]["params"], zeros)))
    # zero weights and biases: both convs give 0, so the block is relu(0 + x)
    np.testing.assert_array_equal(_run(external, x), np.maximum(x, 0))
    (tmp_path / "external.so.weights").unlink()
    with pytest.raises(FusionError, match=r"external.so: its weights file external.so.weights is missing beside it; "):
        load_weights(external, tvm.cpu(0))
