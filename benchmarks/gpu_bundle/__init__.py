"""The GPU check's bundle: libraries of an example model with their weights as recipes over its seed.

    from gpu_bundle import bundle_with_recipes        # benchmarks/ on sys.path (gpu_check.py runs from there)
    result = bundle_with_recipes(lib, "deploy/", others=[lib_unfused, ...], numpy_wheel=True)

tvm_fusion.deploy.bundle copies each library with its weights file; here each library's lifted weights become a
recipe instead (weights_recipe.py: the seeded draws and the fold of each weight; ResNet-50: 0.3 MB for
102 MB), libraries with the same weights share one, and site/recipe_replay.py goes with them: the bundle's
run.py regenerates the weights there with numpy and checks each against its sha256. Only a library
compiled from an example model (`--example`, tvm_fusion/examples.py) with --external-weights has a recipe.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tvm_fusion.bundle import BundleResult, bundle
from tvm_fusion.errors import FusionError
from tvm_fusion.runtime.manifest import Manifest

from . import recipe_replay
from .weights_recipe import make_recipe, step_counts, write_recipe

__all__ = ["RecipeWeights", "bundle_with_recipes"]


class RecipeWeights:
    """bundle(..., carry_weights=RecipeWeights()): writes `<library>.recipe.json` (+ .npz) into the bundle
    instead of the weights file, and names it in the library's manifest (weights.recipe, recipe_bytes,
    recipe_steps). A library whose weights equal an earlier one's (by the sha256 of every weight in order:
    a dynamic-batch build of the same model, a build without its CUDA graph) names that recipe."""

    def __init__(self):
        self.recipes: dict[tuple, dict] = {}

    def __call__(self, library: Path, manifest: Manifest, out: Path) -> None:
        import tvm.runtime

        entry = manifest.weights
        values = tvm.runtime.load_param_dict(library.with_name(entry.file).read_bytes())
        lifted = {n: values[n].numpy() for n in entry.params}
        key = tuple((n, recipe_replay.digest(v)) for n, v in lifted.items())
        if key not in self.recipes:
            made, stored = make_recipe(manifest.model, lifted)
            name = library.name + ".recipe.json"
            self.recipes[key] = dict(recipe=name, recipe_bytes=write_recipe(out / name, made, stored),
                                     recipe_steps=step_counts(made))
        entry.extra.update(self.recipes[key])


def bundle_with_recipes(library, out_dir, python: str | None = None, *, numpy_wheel: bool = False,
                        others=()) -> BundleResult:
    """tvm_fusion.deploy.bundle.bundle with every library's weights as a recipe (RecipeWeights) and
    site/recipe_replay.py, which regenerates them; FusionError for a library with its weights inside."""
    for lib in (library, *others):
        manifest = Manifest.of_library(lib)
        if manifest is not None and manifest.weights is None:
            raise FusionError(f"{lib}: a weights recipe needs a library compiled with --external-weights")
    result = bundle(library, out_dir, python, numpy_wheel=numpy_wheel, others=others, carry_weights=RecipeWeights())
    shutil.copy2(recipe_replay.__file__, result.path / "site" / "recipe_replay.py")
    size = sum(p.stat().st_size for p in result.path.rglob("*") if p.is_file())
    return BundleResult(result.path, size, result.python, result.notes)
