"""A library's lifted weights as a recipe over the example's seeded draws: W' = steps(draws(seed)).

    recipe, stored = make_recipe(model_path, lifted)          # lifted: {param: array} (the .weights file)
    write_recipe(library_with_recipe, recipe, stored)         # <library>.recipe.json + .recipe.npz

For a library compiled from an example model (`--example resnet50`: seeded numpy draws, tvm_fusion/examples.py), each
lifted weight is matched, bit for bit, with a candidate derivation from the model's initializers:
    draw(X)                          an initializer exactly as drawn (unfused / tvm conv weights)
    transpose(draw(X))               a Gemm weight after TVM's folded permute_dims
    scale_rows(draw(X), s)           a conv weight with its BatchNorm folded (patterns/conv_epilogue.py):
                                     s = float32(gamma / sqrt(var + eps)) from the model's BatchNorm
    ...(cast(draw(X), float16))      each of them over the float16 cast of the draw, for a library built with
                                     `--precision fp16`: ToMixedPrecision casts each conv / matmul weight,
                                     FoldConstant folds the cast, the conv rule folds BatchNorm into the cast
                                     weight (and a float16 dense's bias is that cast widened to float32 again)
and anything else (biases, calibrated statistics, a weight no candidate reproduces) is stored as it is.
The recipe is then replayed with recipe_replay (numpy only, what the target machine runs) and every weight
is checked against the lifted one; ResNet-50's 102 MB of weights become about 0.2 MB.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tvm_fusion.errors import FusionError

from . import recipe_replay

__all__ = ["make_recipe", "step_counts", "write_recipe"]


def _initializers(model) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _bn_scales(model, inits) -> dict[str, np.ndarray]:
    """conv weight name -> s = float32(gamma / sqrt(var + eps)) of the BatchNorm that alone reads the conv's
    output (fuse.normalize_batch_norm's formula, in float64 then rounded)."""
    readers: dict[str, list] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    out = {}
    for conv in (n for n in model.graph.node if n.op_type == "Conv" and n.input[1] in inits):
        after = readers.get(conv.output[0], [])
        if len(after) != 1 or after[0].op_type != "BatchNormalization":
            continue
        bn = after[0]
        if not all(name in inits for name in bn.input[1:5]):
            continue
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        gamma, var = (inits[name].astype(np.float64) for name in (bn.input[1], bn.input[4]))
        out[conv.input[1]] = (gamma / np.sqrt(var + float(eps))).astype(np.float32)
    return out


def _candidates(drawn: dict, inits: dict, scales: dict) -> dict[tuple, list]:
    """(shape, dtype) -> [make(param) -> (step, stored)] for every initializer the draws reproduce exactly."""
    out: dict[tuple, list] = {}
    for name, value in drawn.items():
        if name not in inits or not _same(value, inits[name]):
            continue  # calibrated after the draw (BatchNorm statistics, LSUV-rescaled weights)
        draw = {"op": "draw", "name": name}
        half = {"op": "cast", "of": draw, "dtype": "float16"}
        # the draw; its float16 cast; and that cast widened again (the float32 bias of a float16 dense)
        for dtype, base in (("float32", draw), ("float16", half), ("float32", {"op": "cast", "of": half,
                                                                               "dtype": "float32"})):
            out.setdefault((value.shape, dtype), []).append(lambda p, d=base: (d, {}))
            if value.ndim == 2:
                out.setdefault((value.T.shape, dtype), []).append(lambda p, d=base: ({"op": "transpose", "of": d}, {}))
            if name in scales:
                out.setdefault((value.shape, dtype), []).append(lambda p, d=base, s=scales[name]: (
                    {"op": "scale_rows", "of": d, "by": {"op": "stored", "key": f"{p}.by"}}, {f"{p}.by": s}))
    return out


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit (a -0.0 is not a 0.0, a NaN equals the same NaN)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def make_recipe(model_path, lifted: dict) -> tuple[dict, dict]:
    """The recipe of `lifted` ({param: array}, main's parameter order) for a library compiled from the example
    model at `model_path`, and the tensors it stores. FusionError when the model is no example."""
    import onnx

    from tvm_fusion.examples import draw_plan, example_of

    example = example_of(model_path)
    if example is None or not Path(model_path).exists():
        raise FusionError(f"a weights recipe needs a library compiled from an example model (--example); "
                          f"this one was compiled from {model_path}: bundle it with its .weights file")
    name, seed = example
    model = onnx.load(str(model_path))
    inits = _initializers(model)
    recipe = {"format": recipe_replay.FORMAT, "example": name, "seed": seed, "numpy": np.__version__,
              "draws": draw_plan(name, seed), "params": {}, "sha256": {}}
    drawn = recipe_replay.draws(recipe)
    candidates = _candidates(drawn, inits, _bn_scales(model, inits))
    values: dict[int, np.ndarray] = {}  # id(candidate) -> its value, computed once
    stored: dict[str, np.ndarray] = {}
    for param, tensor in lifted.items():
        target = tensor.numpy() if hasattr(tensor, "numpy") else np.asarray(tensor)
        step, keep = {"op": "stored", "key": param}, {param: target}
        for make in candidates.get((target.shape, str(target.dtype)), []):
            s, k = make(param)
            if id(make) not in values:
                values[id(make)] = recipe_replay.evaluate(s, {"draws": drawn, "stored": k})
            if _same(values[id(make)], target):
                step, keep = s, k
                break
        recipe["params"][param] = step
        recipe["sha256"][param] = recipe_replay.digest(target)
        stored.update(keep)
    return recipe, stored


def write_recipe(path, recipe: dict, stored: dict) -> int:
    """Write `path` (.recipe.json) and its .npz of stored tensors, replay it with recipe_replay (numpy only,
    as the target does) and check every weight against the lifted one; returns the bytes written."""
    path = Path(path)
    npz = path.with_suffix(".npz")
    np.savez(npz, **stored)
    path.write_text(json.dumps({**recipe, "stored": npz.name}))
    try:
        recipe_replay.regenerate(path)
    except recipe_replay.RecipeMismatch as err:
        raise FusionError(f"internal error: the weights recipe does not reproduce the library's weights: "
                          f"{err}") from None
    return path.stat().st_size + npz.stat().st_size


def step_counts(recipe: dict) -> dict[str, int]:
    """How many parameters each step kind covers (for reports)."""
    kinds: dict[str, int] = {}
    for step in recipe["params"].values():
        kinds[step["op"]] = kinds.get(step["op"], 0) + 1
    return kinds
