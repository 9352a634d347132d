"""Weights as a recipe over the example's seed (benchmarks/gpu_bundle: weights_recipe.py, recipe_replay.py, for
the GPU check's bundle): the regenerated weights equal the ones TVM lifted out of the library, element by
element, and a recipe that does not reproduce them fails naming the weight instead of running wrong weights."""

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from benchmarks.gpu_bundle import recipe_replay
from benchmarks.gpu_bundle.weights_recipe import make_recipe, step_counts, write_recipe
from tvm_fusion.errors import FusionError
from tvm_fusion.examples import draw_plan, example_of


def test_the_draw_plan_replays_the_example_initializers(resnet50_path):
    """Every float initializer of the ResNet-50 example is a replayed draw, bit for bit, except the BatchNorm
    running statistics (filled, not drawn, then calibrated on a forward pass), which the plan leaves out."""
    plan = draw_plan("resnet50", 0)
    drawn = recipe_replay.draws({"seed": 0, "draws": plan})
    inits = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(resnet50_path)).graph.initializer}
    same = {n for n, v in drawn.items() if n in inits and np.array_equal(v, inits[n])}
    bn = [n for n in onnx.load(str(resnet50_path)).graph.node if n.op_type == "BatchNormalization"]
    stats = {name for node in bn for name in node.input[3:5]}
    assert same == set(drawn) and len(stats) == 2 * 53
    assert {n for n, v in inits.items() if v.dtype == np.float32} - same == stats
    assert [d["call"] for d in plan[:2]] == ["normal", "uniform"]  # conv1 weight He-normal, then the BN gamma
    assert plan[0]["shape"] == [64, 3, 7, 7] and plan[0]["args"] == [0.0, float(np.sqrt(2.0 / 147))]


def _recipe(tmp_path):
    """A two-weight recipe over one draw: w0 = transpose(a), w1 = scale_rows(a, s)."""
    a = np.random.default_rng(3).normal(0.0, 1.0, [4, 3]).astype(np.float32)
    s = np.array([0.5, 2.0, 3.0, -1.0], np.float32)
    w1 = (a.astype(np.float64) * s.astype(np.float64)[:, None]).astype(np.float32)
    recipe = {"format": recipe_replay.FORMAT, "seed": 3, "numpy": np.__version__,
              "draws": [{"name": "a", "call": "normal", "args": [0.0, 1.0], "shape": [4, 3]}],
              "params": {"w0": {"op": "transpose", "of": {"op": "draw", "name": "a"}},
                         "w1": {"op": "scale_rows", "of": {"op": "draw", "name": "a"},
                                "by": {"op": "stored", "key": "s"}}},
              "sha256": {"w0": recipe_replay.digest(np.ascontiguousarray(a.T)), "w1": recipe_replay.digest(w1)}}
    write_recipe(tmp_path / "m.so.recipe.json", recipe, {"s": s})
    return tmp_path / "m.so.recipe.json", a, w1


def test_a_recipe_regenerates_its_weights(tmp_path):
    path, a, w1 = _recipe(tmp_path)
    out = recipe_replay.regenerate(path)
    assert list(out) == ["w0", "w1"]
    np.testing.assert_array_equal(out["w0"], a.T)
    np.testing.assert_array_equal(out["w1"], w1)


def test_a_weight_the_recipe_does_not_reproduce_is_named(tmp_path):
    path, _, _ = _recipe(tmp_path)
    np.savez(tmp_path / "m.so.recipe.npz", s=np.array([0.5, 2.0, 3.0, -1.000001], np.float32))
    with pytest.raises(recipe_replay.RecipeMismatch, match=r"weight w1 \(scale_rows\) regenerated here differs"):
        recipe_replay.regenerate(path)
    recipe = json.loads(path.read_text())
    recipe["params"]["w0"] = {"op": "cholesky", "of": {"op": "draw", "name": "a"}}
    path.write_text(json.dumps(recipe))
    with pytest.raises(ValueError, match="recipe step 'cholesky' is unknown; known: draw, stored"):
        recipe_replay.regenerate(path)


def test_a_cast_step_makes_float16_weights(tmp_path):
    """cast(draw) and scale_rows over it: the BatchNorm fold of a float16 weight, in float64, rounded once to
    float16; a cast to a dtype numpy alone cannot make is refused by name."""
    a = np.random.default_rng(3).normal(0.0, 1.0, [4, 3]).astype(np.float32)
    s = np.array([0.5, 2.0, 3.0, -1.0], np.float32)
    half = {"op": "cast", "of": {"op": "draw", "name": "a"}, "dtype": "float16"}
    w1 = (a.astype(np.float16).astype(np.float64) * s.astype(np.float64)[:, None]).astype(np.float16)
    recipe = {"format": recipe_replay.FORMAT, "seed": 3, "numpy": np.__version__,
              "draws": [{"name": "a", "call": "normal", "args": [0.0, 1.0], "shape": [4, 3]}],
              "params": {"w0": half, "w1": {"op": "scale_rows", "of": half, "by": {"op": "stored", "key": "s"}}},
              "sha256": {"w0": recipe_replay.digest(a.astype(np.float16)), "w1": recipe_replay.digest(w1)}}
    write_recipe(tmp_path / "m.so.recipe.json", recipe, {"s": s})
    out = recipe_replay.regenerate(tmp_path / "m.so.recipe.json")
    assert out["w0"].dtype == out["w1"].dtype == np.float16
    np.testing.assert_array_equal(out["w1"].view(np.uint16), w1.view(np.uint16))
    with pytest.raises(ValueError, match="recipe cast to 'bfloat16' is not supported; supported: float16, float32"):
        recipe_replay.evaluate({**half, "dtype": "bfloat16"}, {"draws": {"a": a}, "stored": {}})


def test_fp16_weights_are_casts_of_the_float32_recipe(tmp_path):
    """The weights lifted from a `--precision fp16` fused CUDA build of an example (ShuffleNet: 49 conv +
    BatchNorm, a Gemm) are float16 casts of its draws, with BatchNorm folded into them or transposed, and the
    recipe regenerates them bit for bit (write_recipe replays it and checks every sha256): only the float32
    biases are stored (the Gemm's: its float16 cast widened again)."""
    from tvm_fusion.build.builder import default_rules, legalize, resolve_target
    from tvm_fusion.examples import example_path
    from tvm_fusion.frontend.importer import import_onnx
    from tvm_fusion.fusion.fuse import fuse
    from tvm_fusion.build.mixed_precision import convert
    from tvm_fusion.runtime.weights import lift_weights

    path = example_path("shufflenet", 0)
    target = resolve_target("cuda", "sm_90")  # scheduled, not compiled: the weights are those of the library
    _, lifted = lift_weights(legalize(fuse(convert(import_onnx(str(path)), "fp16"), target, default_rules()).mod,
                                      target, "fused"))
    recipe, stored = make_recipe(path, {k: v.numpy() for k, v in lifted.items()})
    assert step_counts(recipe) == {"scale_rows": 49, "stored": 49, "transpose": 1, "cast": 1}
    assert all(s["of"] == {"op": "cast", "of": s["of"]["of"], "dtype": "float16"}
               for s in recipe["params"].values() if s["op"] in ("scale_rows", "transpose"))
    assert {str(v.dtype) for v in stored.values()} == {"float32"}
    write_recipe(tmp_path / "s.so.recipe.json", recipe, stored)
    again = recipe_replay.regenerate(tmp_path / "s.so.recipe.json")
    for name, value in lifted.items():
        value = value.numpy()
        assert again[name].dtype == value.dtype, name
        np.testing.assert_array_equal(again[name].view(np.uint8), value.view(np.uint8), err_msg=name)


def test_recipe_replay_needs_numpy_alone(tmp_path):
    """The file a bundle carries to the target imports numpy and the standard library only."""
    path, _, _ = _recipe(tmp_path)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import recipe_replay; "
            "print(len(recipe_replay.regenerate(sys.argv[2])), sorted(m.split('.')[0] for m in sys.modules "
            "if m.startswith(('tvm', 'onnx'))))")
    proc = subprocess.run([sys.executable, "-c", code, str(recipe_replay.__file__).rsplit("/", 1)[0], str(path)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2", "[]"]


def test_a_model_that_is_no_example_has_no_recipe(tmp_path):
    assert example_of("/x/resnet50-seed7.onnx") == ("resnet50", 7) and example_of("/x/model.onnx") is None
    assert example_of("/x/resnet50-seed7-batchN.onnx") == ("resnet50", 7)  # the same draws, a symbolic batch
    with pytest.raises(FusionError, match=r"compiled from .*model.onnx: bundle it with its .weights file"):
        make_recipe(tmp_path / "model.onnx", {})


@pytest.mark.slow
def test_resnet50_cuda_weights_regenerated_element_by_element(resnet50_path, tmp_path):
    """The 108 weights TVM lifted out of the fused ResNet-50 CUDA library (conv weights with BatchNorm
    folded at compile time, the Gemm weight transposed by TVM's FoldConstant) regenerated with numpy from the
    seed and 0.3 MB of stored vectors equal them bit for bit."""
    from tvm_fusion._tvm import tvm
    from tvm_fusion.deploy.compile import compile_model

    result = compile_model(str(resnet50_path), tmp_path / "r50.so", "cuda", verify=False,
                           counts_of_other_builds=False, external_weights=True)
    entry = result.manifest["weights"]
    values = tvm.runtime.load_param_dict((tmp_path / entry["file"]).read_bytes())
    lifted = {n: values[n].numpy() for n in entry["params"]}
    recipe, stored = make_recipe(resnet50_path, lifted)
    assert step_counts(recipe) == {"scale_rows": 53, "stored": 53, "transpose": 1, "draw": 1}
    size = write_recipe(tmp_path / "r50.so.recipe.json", recipe, stored)
    assert size < 1 << 20 and entry["bytes"] > 90 << 20
    again = recipe_replay.regenerate(tmp_path / "r50.so.recipe.json")
    assert list(again) == entry["params"]
    for name, value in lifted.items():
        assert again[name].dtype == value.dtype and again[name].shape == value.shape, name
        np.testing.assert_array_equal(again[name].view(np.uint32), value.view(np.uint32), err_msg=name)
