"""Weights regenerated from a recipe with numpy alone: seeded draws, then the steps that made each weight.

    weights = regenerate("model.so.recipe.json")   # {param: array}, each checked against its sha256

A recipe (written at bundle time by weights_recipe.py beside this file) is JSON beside an .npz of stored tensors:
    {"format": FORMAT, "seed": 0, "draws": [{"name", "call", "args", "shape"}, ...],   # examples.draw_plan
     "stored": "model.so.recipe.npz",
     "params": {"w0": {"op": "scale_rows", "of": {"op": "draw", "name": "conv1_w"},
                        "by": {"op": "stored", "key": "w0.by"}}, ...},
     "sha256": {"w0": "...", ...}}
Steps (STEPS): draw (an initializer replayed from the seed: the example's He-normal / uniform draws),
stored (kept as it is: biases, BatchNorm statistics), transpose (2-D), cast (to another float dtype: the
float16 weights of a `--precision fp16` build, `{"op": "cast", "of": ..., "dtype": "float16"}`), and
scale_rows, the BatchNorm fold of patterns/conv_epilogue.py, rounded once to W's own dtype:
W' = dtype(W)(float64(W) * float64(s)[:, None, ...]),  s per output channel (float32 for a float16 W too).
Every regenerated weight is checked against the sha256 of the weight the compiler lifted, so a numpy whose
Generator draws differently fails here, naming the weight, instead of running wrong weights.
Imports numpy and the standard library only: a bundle carries this file to a machine without TVM.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np

FORMAT = "tvm_fusion.weights_recipe/1"
__all__ = ["FORMAT", "STEPS", "RecipeMismatch", "digest", "draws", "evaluate", "regenerate"]


class RecipeMismatch(ValueError):
    """A regenerated weight differs from the one the compiler lifted."""


def digest(array: np.ndarray) -> str:
    """sha256 of the array's dtype, shape and bytes (C order)."""
    a = np.ascontiguousarray(array)
    return hashlib.sha256(f"{a.dtype}{list(a.shape)}".encode() + a.tobytes()).hexdigest()


def draws(recipe: dict) -> dict[str, np.ndarray]:
    """Every draw of the plan, in order, from numpy.random.default_rng(seed), as float32."""
    rng = np.random.default_rng(recipe["seed"])
    out = {}
    for d in recipe["draws"]:  # in order: each draw advances the stream the next one starts from
        out[d["name"]] = getattr(rng, d["call"])(*d["args"], d["shape"]).astype(np.float32)
    return out


def _scale_rows(w: np.ndarray, s: np.ndarray) -> np.ndarray:
    return (w.astype(np.float64) * s.astype(np.float64).reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)


#: the dtypes a cast step may produce (numpy's own names; bfloat16 would need ml_dtypes on the target)
CAST_DTYPES = ("float16", "float32")


def _cast(value: np.ndarray, dtype: str) -> np.ndarray:
    if dtype not in CAST_DTYPES:
        raise ValueError(f"recipe cast to {dtype!r} is not supported; supported: {', '.join(CAST_DTYPES)}")
    return value.astype(dtype)


#: op -> fn(step, evaluate an operand step, env)
STEPS = {
    "draw": lambda step, ev, env: env["draws"][step["name"]],
    "stored": lambda step, ev, env: env["stored"][step["key"]],
    "transpose": lambda step, ev, env: np.ascontiguousarray(ev(step["of"]).T),
    "cast": lambda step, ev, env: _cast(ev(step["of"]), step["dtype"]),
    "scale_rows": lambda step, ev, env: _scale_rows(ev(step["of"]), ev(step["by"])),
}


def evaluate(step: dict, env: dict) -> np.ndarray:
    """The value of one recipe step; env = {"draws": {...}, "stored": {...}}."""
    if step.get("op") not in STEPS:
        raise ValueError(f"recipe step {step.get('op')!r} is unknown; known: {', '.join(STEPS)}")
    return STEPS[step["op"]](step, lambda s: evaluate(s, env), env)


def regenerate(path) -> dict[str, np.ndarray]:
    """The weights of a recipe file, in `params` order, each checked against its recorded sha256."""
    recipe = json.loads(open(path).read())
    if recipe.get("format") != FORMAT:
        raise ValueError(f"{path}: not a weights recipe of format {FORMAT} (format: {recipe.get('format')!r})")
    with np.load(os.path.join(os.path.dirname(os.path.abspath(path)), recipe["stored"])) as npz:
        env = {"draws": draws(recipe), "stored": {k: npz[k] for k in npz.files}}
    out = {}
    for name, step in recipe["params"].items():
        value = evaluate(step, env)
        if digest(value) != recipe["sha256"][name]:
            raise RecipeMismatch(
                f"{path}: weight {name} ({step['op']}) regenerated here differs from the compiled one (numpy "
                f"{np.__version__}, recipe made with numpy {recipe.get('numpy')}); carry the .weights file instead")
        out[name] = value
    return out
