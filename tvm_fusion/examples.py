"""Example models made on the fly from the nine architectures the onnx wheel ships (no downloads).

`onnx/backend/test/data/light/` holds ResNet-50, DenseNet-121, Inception v1 and v2, ShuffleNet,
SqueezeNet, VGG-19, ZFNet-512 and AlexNet with placeholder weights (ConstantOfShape 0.02, or
initializers in parameter slots). `example_path(name, seed)` replaces them with seeded random weights at
realistic scales:

- Conv weights He-normal, Gemm weights N(0, 1/fan_in), biases N(0, 0.01);
- BatchNormalization gamma ~ U(0.5, 1.5), beta ~ N(0, 0.1); the scale layers after it (DenseNet-121,
  Inception v2: Unsqueeze -> Mul, Unsqueeze -> Add) scale ~ U(0.5, 1.5), shift ~ N(0, 0.1);
- models with BatchNorm: running statistics calibrated on a random input so every BN sees mean 0 /
  variance 1, one BN depth level at a time;
- models without BatchNorm (AlexNet, ZFNet, VGG, SqueezeNet, Inception v1): each Conv/Gemm (weight and
  bias) rescaled so its output has unit std on a random input (LSUV), one depth level at a time, then the
  last level once more so the logits have unit std.

Activations stay O(1) through the depth. The logits (the input of the final Softmax) are added as an
output; a model without Softmax (DenseNet-121) already ends in its logits.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["EXAMPLES", "LIGHT_FILES", "cache_dir", "draw_plan", "example_model", "example_of", "example_path",
           "light_model_path", "logits_name", "with_dynamic_batch"]

#: short name -> the file's stem in onnx/backend/test/data/light/ (light_<stem>.onnx)
LIGHT_FILES = {
    "resnet50": "resnet50", "densenet121": "densenet121", "inception_v1": "inception_v1",
    "inception_v2": "inception_v2", "shufflenet": "shufflenet", "squeezenet": "squeezenet",
    "vgg19": "vgg19", "zfnet512": "zfnet512", "alexnet": "bvlc_alexnet",
}
EXAMPLES = tuple(LIGHT_FILES)
CALIBRATION_BATCH = 1  # the models' Reshapes fix batch 1


def light_model_path(name: str) -> Path:
    """A model of `onnx/backend/test/data/light/` (shipped inside the onnx wheel)."""
    path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the installed onnx wheel does not ship light_{name}")
    return path


def cache_dir(sub: str = "examples") -> Path:
    """`$TVM_FUSION_CACHE/<sub>` (default `~/.cache/tvm_fusion/<sub>`), created on first use."""
    root = os.environ.get("TVM_FUSION_CACHE") or Path.home() / ".cache" / "tvm_fusion"
    path = Path(root) / sub
    path.mkdir(parents=True, exist_ok=True)
    return path


# ---------------------------------------------------------------- placeholders and what they parameterise

PARAM_SLOTS = {"Conv": (1, 2), "Gemm": (1, 2), "BatchNormalization": (1, 2, 3, 4), "Unsqueeze": (0,),
               "Reshape": (0,)}
PASS_THROUGH = ("Unsqueeze", "Reshape")  # input 0 carries a weight on to the node it parameterises


def _placeholders(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """The weights (ConstantOfShape outputs or initializers feeding a parameter slot) and their shapes."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    shapes = {n.output[0]: tuple(int(d) for d in inits[n.input[0]])
              for n in model.graph.node if n.op_type == "ConstantOfShape"}
    for node in model.graph.node:
        for i in PARAM_SLOTS.get(node.op_type, ()):
            name = node.input[i] if i < len(node.input) else ""
            # float only: a Reshape's int64 target shape is no weight
            if name in inits and name not in shapes and inits[name].dtype == np.float32:
                shapes[name] = inits[name].shape
    return shapes


def _consumers(model: onnx.ModelProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    out: dict[str, list] = {}
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            out.setdefault(name, []).append((node, i))
    return out


def _roles(model: onnx.ModelProto, names) -> dict[str, tuple[onnx.NodeProto, int]]:
    """placeholder name -> (the node it parameterises, input index), looking through Unsqueeze/Reshape."""
    consumers = _consumers(model)
    roles = {}
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if name not in names or name in roles:
                continue
            target, slot = node, i
            while target.op_type in PASS_THROUGH and slot == 0 and len(consumers.get(target.output[0], [])) == 1:
                target, slot = consumers[target.output[0]][0]
            roles[name] = (target, slot)
    return roles


def _fan_in(shape) -> int:
    return int(np.prod(shape[1:]))


#: (op type, input index) -> random value of that shape. Mul / Add: the scale layer after a BatchNorm.
#: Gemm weights are [out, in, ...] (transB=1 in all nine models).
GENERATORS = {
    ("Conv", 1): lambda rng, shape: rng.normal(0.0, np.sqrt(2.0 / _fan_in(shape)), shape),
    ("Gemm", 1): lambda rng, shape: rng.normal(0.0, np.sqrt(1.0 / _fan_in(shape)), shape),
    ("Conv", 2): lambda rng, shape: rng.normal(0.0, 0.01, shape),
    ("Gemm", 2): lambda rng, shape: rng.normal(0.0, 0.01, shape),
    ("BatchNormalization", 1): lambda rng, shape: rng.uniform(0.5, 1.5, shape),
    ("BatchNormalization", 2): lambda rng, shape: rng.normal(0.0, 0.1, shape),
    ("BatchNormalization", 3): lambda rng, shape: np.zeros(shape),
    ("BatchNormalization", 4): lambda rng, shape: np.ones(shape),
    ("Mul", 0): lambda rng, shape: rng.uniform(0.5, 1.5, shape),
    ("Mul", 1): lambda rng, shape: rng.uniform(0.5, 1.5, shape),
    ("Add", 0): lambda rng, shape: rng.normal(0.0, 0.1, shape),
    ("Add", 1): lambda rng, shape: rng.normal(0.0, 0.1, shape),
}


class _Recorder:
    """The seeded Generator, logging each draw: {"name", "call", "args", "shape"} (what draw_plan returns)."""

    def __init__(self, rng, log: list, name: str):
        self.rng, self.log, self.name = rng, log, name

    def _draw(self, call: str, a, b, shape):
        self.log.append({"name": self.name, "call": call, "args": [float(a), float(b)], "shape": list(shape)})
        return getattr(self.rng, call)(a, b, shape)

    def normal(self, loc, scale, size):
        return self._draw("normal", loc, scale, size)

    def uniform(self, low, high, size):
        return self._draw("uniform", low, high, size)


def _random_weights(model, rng, log: list | None = None) -> dict[str, np.ndarray]:
    shapes = _placeholders(model)
    values = {}
    for name, (node, idx) in _roles(model, shapes).items():
        make = GENERATORS.get((node.op_type, idx))
        if make is None:
            raise ValueError(f"placeholder {name} feeds {node.op_type} {node.name or node.output[0]!r} input "
                             f"{idx}; no generator for it (known: {sorted(GENERATORS)})")
        values[name] = make(rng if log is None else _Recorder(rng, log, name), shapes[name])
    return {k: v.astype(np.float32) for k, v in values.items()}


def draw_plan(name: str, seed: int) -> list[dict]:
    """The seeded draws behind `example_path(name, seed)`'s weights, in order, one per weight drawn:
    {"name": initializer, "call": "normal" | "uniform", "args": [loc, scale] | [low, high], "shape"}.
    Replaying them on `numpy.random.default_rng(seed)` and casting to float32 gives those initializers
    (the BatchNorm statistics and LSUV scales are then calibrated, so those differ; the GPU check's
    weights recipes, benchmarks/gpu_bundle, store them)."""
    log: list[dict] = []
    _random_weights(onnx.load(str(light_model_path(LIGHT_FILES[name]))), np.random.default_rng(seed), log)
    return log


def example_of(path) -> tuple[str, int] | None:
    """(name, seed) when `path` is an example model file (`<name>-seed<N>.onnx`, or its dynamic-batch variant
    `<name>-seed<N>-batchN.onnx`: the same draws), else None."""
    import re

    m = re.fullmatch(r"(\w+)-seed(\d+)(?:-batchN)?\.onnx", Path(path).name)
    return (m.group(1), int(m.group(2))) if m and m.group(1) in LIGHT_FILES else None


# ---------------------------------------------------------------- graph surgery


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


def _data_input(model) -> onnx.ValueInfoProto:
    """The real data input: the first used graph input without an initializer (weights may be inputs too)."""
    inits = {t.name for t in model.graph.initializer}
    used = {i for n in model.graph.node for i in n.input}
    data = [i for i in model.graph.input if i.name not in inits and i.name in used]
    if len(data) != 1:
        raise ValueError(f"expected one data input, found {[i.name for i in data]}")
    return data[0]


def logits_name(model) -> str:
    """The input of the last Softmax, or the last graph output when there is no Softmax."""
    softmax = [n for n in model.graph.node if n.op_type == "Softmax"]
    return softmax[-1].input[0] if softmax else model.graph.output[-1].name


def _depths(model, op_types) -> dict[str, int]:
    """node name -> number of `op_types` nodes on the longest path before it (for nodes of `op_types`)."""
    depth_of_value: dict[str, int] = {}
    depths = {}
    for node in model.graph.node:  # ONNX graphs are topologically sorted
        d = max((depth_of_value.get(i, 0) for i in node.input), default=0)
        if node.op_type in op_types:
            depths[node.name or node.output[0]] = d
            d += 1
        for o in node.output:
            depth_of_value[o] = d
    return depths


# ---------------------------------------------------------------- calibration


class _Probe:
    """onnxruntime on the model with the weights as inputs and `watch` as extra outputs."""

    def __init__(self, model, values, watch, x):
        from tvm_fusion.check.io import run_onnxruntime  # local: `tvm-fusion --help` lists the examples without TVM

        probe = _add_outputs(_with_values(model, values, as_inputs=True), watch)
        self.sess, self.names = run_onnxruntime(probe, {})
        self.feed = {_data_input(model).name: x}

    def run(self, values) -> dict[str, np.ndarray]:
        return dict(zip(self.names, self.sess.run(None, {**self.feed, **values})))


def _random_data(model, rng) -> np.ndarray:
    shape = [d.dim_value for d in _data_input(model).type.tensor_type.shape.dim]
    return rng.standard_normal([CALIBRATION_BATCH, *shape[1:]]).astype(np.float32)


def _calibrate_bn(model, values, x) -> None:
    """Set BN running mean/var to the statistics of their inputs, one BN depth level per pass
    (a BN is calibrated once every BN before it is, so activations never blow up)."""
    bns = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    probe = _Probe(model, values, [n.input[0] for n in bns], x)
    depths = _depths(model, {"BatchNormalization"})
    for level in sorted(set(depths.values())):
        outs = probe.run(values)
        for bn in bns:
            if depths[bn.name or bn.output[0]] != level:
                continue
            act = outs[bn.input[0]].astype(np.float64)
            values[bn.input[3]] = act.mean(axis=(0, 2, 3)).astype(np.float32)
            values[bn.input[4]] = (act.var(axis=(0, 2, 3)) + 1e-3).astype(np.float32)


def _rescale(layer, values, roles, std: float) -> None:
    """Divide a Conv/Gemm's weight and bias (the placeholders feeding them) by `std`."""
    for idx in (1, 2):
        name = roles.get((layer.output[0], idx))
        if name is not None:
            values[name] = (values[name] / std).astype(np.float32)


def _calibrate_lsuv(model, values, x) -> None:
    """LSUV: level by level, rescale each Conv/Gemm so its output has unit std; then the last level
    again so the logits have unit std (SqueezeNet's logits are ReLU + global average pool of its last conv)."""
    layers = [n for n in model.graph.node if n.op_type in ("Conv", "Gemm")]
    roles = {(node.output[0], idx): name for name, (node, idx) in _roles(model, values).items()}
    logits = logits_name(model)
    probe = _Probe(model, values, [n.output[0] for n in layers] + [logits], x)
    depths = _depths(model, {"Conv", "Gemm"})
    levels = sorted(set(depths.values()))
    for level in levels:
        outs = probe.run(values)
        for layer in layers:
            if depths[layer.name or layer.output[0]] == level:
                _rescale(layer, values, roles, float(outs[layer.output[0]].std()))
    std = float(probe.run(values)[logits].std())
    for layer in layers:
        if depths[layer.name or layer.output[0]] == levels[-1]:
            _rescale(layer, values, roles, std)


# ---------------------------------------------------------------- the examples


def _build_light(name: str, seed: int) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    base = onnx.load(str(light_model_path(LIGHT_FILES[name])))
    values = _random_weights(base, rng)
    x = _random_data(base, rng)
    if any(n.op_type == "BatchNormalization" for n in base.graph.node):
        _calibrate_bn(base, values, x)
    else:
        _calibrate_lsuv(base, values, x)
    model = _with_values(base, values, as_inputs=False)
    logits = logits_name(model)
    softmax_out = {n.input[0]: n.output[0] for n in model.graph.node if n.op_type == "Softmax"}.get(logits)
    shapes = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in model.graph.output}
    model = _add_outputs(model, [logits], {logits: shapes.get(softmax_out)})
    onnx.checker.check_model(model)
    return model


def with_dynamic_batch(model: onnx.ModelProto, dim: str = "N") -> onnx.ModelProto:
    """Copy of an example whose batch is the symbolic dim `dim`: dim 0 of the data input and of every
    output becomes a dim_param, and each Reshape whose constant target shape starts with the batch the
    model was made for (CALIBRATION_BATCH) copies the input's dim 0 there instead (ONNX Reshape's 0).
    For the examples only: they are CNNs whose Reshapes keep the batch as dim 0 (checked by onnxruntime in
    the tests at several batch sizes)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for value in [_data_input(model), *model.graph.output]:
        first = value.type.tensor_type.shape.dim[0]
        first.Clear()
        first.dim_param = dim
    inits = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        target = inits.get(node.input[1]) if node.op_type == "Reshape" else None
        if target is not None:
            shape = numpy_helper.to_array(target).copy()
            if shape.ndim == 1 and shape.size and shape[0] == CALIBRATION_BATCH:
                shape[0] = 0
                target.CopyFrom(numpy_helper.from_array(shape, target.name))
    del model.graph.value_info[:]
    onnx.checker.check_model(model)
    return model


def example_path(name: str = "resnet50", seed: int = 0, *, dynamic_batch: bool = False) -> Path:
    """Path of the example model, generated (and cached) on first use; `dynamic_batch`: its variant with
    a symbolic batch dim N (with_dynamic_batch)."""
    if name not in LIGHT_FILES:
        raise ValueError(f"unknown example {name!r}; available: {', '.join(EXAMPLES)}")
    path = cache_dir() / f"{name}-seed{seed}{'-batchN' if dynamic_batch else ''}.onnx"
    if not path.exists():
        model = (with_dynamic_batch(example_model(name, seed)) if dynamic_batch else _build_light(name, seed))
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        onnx.save(model, str(tmp))
        tmp.replace(path)
    return path


def example_model(name: str = "resnet50", seed: int = 0, *, dynamic_batch: bool = False) -> onnx.ModelProto:
    return onnx.load(str(example_path(name, seed, dynamic_batch=dynamic_batch)))
