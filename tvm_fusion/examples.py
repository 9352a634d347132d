"""Example models made on the fly from architectures the onnx wheel ships (no downloads).

`resnet50(seed)`: onnx's `light_resnet50.onnx` (placeholder weights 0.02) with seeded random weights at
realistic scales: He-normal convs, gamma ~ U(0.5, 1.5), beta ~ N(0, 0.1), and BatchNorm running
statistics calibrated on random inputs so every BN sees mean 0 / variance 1 (activations stay O(1)
through the depth). The logits (input of the final Softmax) are added as a second output.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["EXAMPLES", "example_model", "example_path", "light_model_path"]

EXAMPLES = ("resnet50",)
CALIBRATION_BATCH = 1  # the model's Reshape fixes batch 1


def light_model_path(name: str) -> Path:
    """A model of `onnx/backend/test/data/light/` (shipped inside the onnx wheel)."""
    path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the installed onnx wheel does not ship light_{name}")
    return path


def _cache_dir() -> Path:
    root = os.environ.get("TVM_FUSION_CACHE") or Path.home() / ".cache" / "tvm_fusion"
    path = Path(root) / "examples"
    path.mkdir(parents=True, exist_ok=True)
    return path


PARAM_SLOTS = {"Conv": (1, 2), "Gemm": (1, 2), "BatchNormalization": (1, 2, 3, 4)}


def _placeholders(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """The weights (ConstantOfShape outputs or initializers feeding a parameter slot) and their shapes."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    shapes = {n.output[0]: tuple(int(d) for d in inits[n.input[0]])
              for n in model.graph.node if n.op_type == "ConstantOfShape"}
    for node in model.graph.node:
        for i in PARAM_SLOTS.get(node.op_type, ()):
            if i < len(node.input) and node.input[i] in inits and node.input[i] not in shapes:
                shapes[node.input[i]] = inits[node.input[i]].shape
    return shapes


def _roles(model: onnx.ModelProto, names) -> dict[str, tuple[str, int]]:
    """placeholder name -> (consumer op type, input index)."""
    roles = {}
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if name in names:
                roles[name] = (node.op_type, i)
    return roles


def _random_weights(model, rng) -> dict[str, np.ndarray]:
    shapes = _placeholders(model)
    values = {}
    for name, (op, idx) in _roles(model, shapes).items():
        shape = shapes[name]
        if (op, idx) == ("Conv", 1):
            fan_in = int(np.prod(shape[1:]))
            values[name] = rng.normal(0.0, np.sqrt(2.0 / fan_in), shape)
        elif (op, idx) == ("Gemm", 1):
            values[name] = rng.normal(0.0, np.sqrt(1.0 / shape[-1]), shape)
        elif op in ("Conv", "Gemm"):  # biases
            values[name] = rng.normal(0.0, 0.01, shape)
        elif (op, idx) == ("BatchNormalization", 1):
            values[name] = rng.uniform(0.5, 1.5, shape)
        elif (op, idx) == ("BatchNormalization", 2):
            values[name] = rng.normal(0.0, 0.1, shape)
        elif (op, idx) == ("BatchNormalization", 3):
            values[name] = np.zeros(shape)
        elif (op, idx) == ("BatchNormalization", 4):
            values[name] = np.ones(shape)
        else:
            raise ValueError(f"placeholder {name} feeds {op} input {idx}; no generator for it")
    return {k: v.astype(np.float32) for k, v in values.items()}


def _with_values(model, values: dict[str, np.ndarray], as_inputs: bool) -> onnx.ModelProto:
    """The model with placeholders replaced by initializers (or by graph inputs, for calibration)."""
    g = model.graph
    drop = {n.input[0] for n in g.node if n.op_type == "ConstantOfShape" and n.output[0] in values}
    nodes = [n for n in g.node if not (n.op_type == "ConstantOfShape" and n.output[0] in values)]
    used = {i for n in nodes for i in n.input}
    inits = [t for t in g.initializer if t.name not in drop and t.name not in values and t.name in used]
    init_names = {t.name for t in inits}
    inputs = [i for i in g.input
              if i.name in used and i.name not in values and i.name not in drop and i.name not in init_names]
    if as_inputs:
        inputs += [helper.make_tensor_value_info(k, onnx.TensorProto.FLOAT, v.shape) for k, v in values.items()]
    else:
        inits += [numpy_helper.from_array(v, k) for k, v in values.items()]
    graph = helper.make_graph(nodes, g.name or "resnet50", inputs, list(g.output), inits)
    out = helper.make_model(graph, opset_imports=list(model.opset_import), producer_name="tvm_fusion.examples")
    out.ir_version = max(model.ir_version, 7)  # IR >= 4: initializers need not be graph inputs
    return out


def _add_outputs(model: onnx.ModelProto, names, shapes=None) -> onnx.ModelProto:
    shapes = shapes or {}
    model = onnx.ModelProto.FromString(model.SerializeToString())
    have = {o.name for o in model.graph.output}
    for n in names:
        if n not in have:
            model.graph.output.append(helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, shapes.get(n)))
    return model


def _bn_depths(model) -> dict[str, int]:
    """BatchNormalization node name -> number of BNs on the longest path before it."""
    depth_of_value: dict[str, int] = {}
    depths = {}
    for node in model.graph.node:  # ONNX graphs are topologically sorted
        d = max((depth_of_value.get(i, 0) for i in node.input), default=0)
        if node.op_type == "BatchNormalization":
            depths[node.name or node.output[0]] = d
            d += 1
        for o in node.output:
            depth_of_value[o] = d
    return depths


def _calibrate(model, values, rng) -> None:
    """Set BN running mean/var to the statistics of their inputs, one BN depth level per pass
    (a BN is calibrated once every BN before it is, so activations never blow up)."""
    import onnxruntime as ort

    bns = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    probe = _add_outputs(_with_values(model, values, as_inputs=True), [n.input[0] for n in bns])
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    data = model.graph.input[0]
    shape = [d.dim_value for d in data.type.tensor_type.shape.dim]
    x = rng.standard_normal([CALIBRATION_BATCH, *shape[1:]]).astype(np.float32)
    names = [o.name for o in sess.get_outputs()]
    depths = _bn_depths(model)
    levels = sorted(set(depths.values()))
    for level in levels:
        outs = dict(zip(names, sess.run(None, {data.name: x, **values})))
        for bn in bns:
            if depths[bn.name or bn.output[0]] != level:
                continue
            act = outs[bn.input[0]].astype(np.float64)
            values[bn.input[3]] = act.mean(axis=(0, 2, 3)).astype(np.float32)
            values[bn.input[4]] = (act.var(axis=(0, 2, 3)) + 1e-3).astype(np.float32)


def _build_resnet50(seed: int) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    base = onnx.load(str(light_model_path("resnet50")))
    values = _random_weights(base, rng)
    _calibrate(base, values, rng)
    model = _with_values(base, values, as_inputs=False)
    softmax = [n for n in model.graph.node if n.op_type == "Softmax"][0]
    logits_shape = [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim]
    model = _add_outputs(model, [softmax.input[0]], {softmax.input[0]: logits_shape})
    onnx.checker.check_model(model)
    return model


_BUILDERS = {"resnet50": _build_resnet50}


def example_path(name: str = "resnet50", seed: int = 0) -> Path:
    """Path of the example model, generated (and cached) on first use."""
    if name not in _BUILDERS:
        raise ValueError(f"unknown example {name!r}; available: {', '.join(EXAMPLES)}")
    path = _cache_dir() / f"{name}-seed{seed}.onnx"
    if not path.exists():
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        onnx.save(_BUILDERS[name](seed), str(tmp))
        tmp.replace(path)
    return path


def example_model(name: str = "resnet50", seed: int = 0) -> onnx.ModelProto:
    return onnx.load(str(example_path(name, seed)))
