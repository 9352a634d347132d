"""torch.nn.LSTM / GRU / RNN exported by both torch.onnx exporters (TorchScript, dynamo=False, and dynamo),
imported through the front door (the recurrent nodes unrolled), fused llvm build vs onnxruntime element by
element with the dtype table, and vs torch itself. Needs torch (`pip install torch==2.13.0 onnxscript`):
skipped without it, and slow (each export and build takes seconds); CI runs the checked-in corpus exports
instead (tests/zoo: CRNNs with LSTM and GRU, a voice-activity detector)."""

from __future__ import annotations

import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import onnx  # noqa: E402

from tvm_fusion.build.builder import build  # noqa: E402
from tvm_fusion.frontend.importer import SymDim, import_onnx  # noqa: E402
from tvm_fusion.check.io import run_onnxruntime  # noqa: E402
from tvm_fusion.testing import assert_close, run_build  # noqa: E402

pytestmark = pytest.mark.slow


class Recurrent(nn.Module):
    """The recurrent layer, its output (and final states) through a Linear, as models use them."""

    def __init__(self, cell, states: bool, **kw):
        super().__init__()
        self.rnn = cell(8, 16, **kw)
        width = 16 * (2 if kw.get("bidirectional") else 1)
        self.fc = nn.Linear(width, 4)
        self.states = states

    def forward(self, x):
        y, state = self.rnn(x)
        h = state[0] if isinstance(state, tuple) else state
        return (self.fc(y), h) if self.states else self.fc(y)


VARIANTS = {
    "lstm": (nn.LSTM, {}), "lstm_bidirectional": (nn.LSTM, dict(bidirectional=True)),
    "lstm_two_layers": (nn.LSTM, dict(num_layers=2, bidirectional=True)),
    "lstm_batch_first": (nn.LSTM, dict(batch_first=True)), "lstm_no_bias": (nn.LSTM, dict(bias=False)),
    "gru": (nn.GRU, {}), "gru_bidirectional_two_layers": (nn.GRU, dict(num_layers=2, bidirectional=True)),
    "gru_batch_first": (nn.GRU, dict(batch_first=True)),
    "rnn_tanh": (nn.RNN, {}), "rnn_relu_bidirectional": (nn.RNN, dict(nonlinearity="relu", bidirectional=True)),
}


def export(module, x, dynamo: bool, batch_axis: int, opset: int) -> onnx.ModelProto:
    names, outputs = ["x"], ["y", "h"] if module.states else ["y"]
    with torch.no_grad():
        if dynamo:
            return torch.onnx.export(module, (x,), input_names=names, output_names=outputs, opset_version=opset,
                                     dynamo=True, verbose=False).model_proto
        buf = io.BytesIO()
        torch.onnx.export(module, (x,), buf, input_names=names, output_names=outputs, opset_version=opset,
                          dynamo=False, dynamic_axes={"x": {batch_axis: "batch"}})
        return onnx.load_from_string(buf.getvalue())


def check(model: onnx.ModelProto, x: np.ndarray, shapes: dict, torch_out, what: str):
    built = build(import_onnx(model, shapes), "llvm", "fused")
    got = run_build(built, [x])
    sess, _ = run_onnxruntime(model, {"x": x}, optimize=False)
    ref = sess.run(None, {"x": x})
    assert len(got) == len(ref)
    for i, (g, r, t) in enumerate(zip(got, ref, torch_out)):
        assert g.shape == r.shape == tuple(t.shape), f"{what} output {i}: {g.shape}, {r.shape}, torch {tuple(t.shape)}"
        assert_close(g, r, f"{what} output {i} vs onnxruntime")
        assert_close(g, t.numpy(), f"{what} output {i} vs torch")
    assert built.counts.get("dense_bias", 0) > 0 or built.counts.get("dense_bias_relu", 0) > 0, built.counts
    return built


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_export_matches(variant, dynamo):
    cell, kw = VARIANTS[variant]
    torch.manual_seed(0)
    module = Recurrent(cell, states=not kw.get("batch_first"), **kw).eval()
    batch_axis = 0 if kw.get("batch_first") else 1
    x = torch.randn((2, 5, 8) if batch_axis == 0 else (5, 2, 8))
    with torch.no_grad():
        out = module(x)
    out = out if isinstance(out, tuple) else (out,)
    model = export(module, x, dynamo, batch_axis, 18 if dynamo else 14)
    check(model, x.numpy(), {"x": tuple(x.shape)}, out, f"{variant} {'dynamo' if dynamo else 'torchscript'}")


def test_symbolic_batch():
    """The TorchScript export's dynamic batch kept symbolic (--shape x=5xN...): its zero initial states are
    computed from the input's shape at run time."""
    torch.manual_seed(0)
    module = Recurrent(nn.LSTM, states=True, bidirectional=True).eval()
    model = export(module, torch.randn(5, 2, 8), False, 1, 14)
    built = build(import_onnx(model, {"x": (5, SymDim("N"), 8)}), "llvm", "fused")
    for batch in (1, 3):
        x = torch.randn(5, batch, 8)
        with torch.no_grad():
            out = module(x)
        sess, _ = run_onnxruntime(model, {"x": x.numpy()}, optimize=False)
        for g, r, t in zip(run_build(built, [x.numpy()]), sess.run(None, {"x": x.numpy()}), out):
            assert_close(g, r, f"batch {batch} vs onnxruntime")
            assert_close(g, t.numpy(), f"batch {batch} vs torch")


def test_long_sequence():
    torch.manual_seed(0)
    module = Recurrent(nn.LSTM, states=True).eval()
    x = torch.randn(200, 1, 8)
    with torch.no_grad():
        out = module(x)
    check(export(module, x, False, 1, 17), x.numpy(), {"x": (200, 1, 8)}, out, "200 steps")
