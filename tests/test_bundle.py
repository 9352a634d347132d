"""`tvm-fusion bundle`: a library, its weights and the TVM runtime alone run in a fresh virtualenv that has
neither TVM's compiler library nor tvm_fusion, and give the same outputs as the library run here."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from tvm_fusion._tvm import relax, tvm
from tvm_fusion.cli import main
from tvm_fusion.testing import residual_block
from tvm_fusion.runtime.weights import load_weights


@pytest.fixture(scope="module")
def fresh_python(tmp_path_factory) -> str:
    """A new virtualenv of this Python with numpy and nothing else (no TVM, no tvm_fusion)."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys._base_executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    if subprocess.run([python, "-c", "import numpy"], capture_output=True).returncode != 0:
        subprocess.run([python, "-m", "pip", "install", "--quiet", "numpy"], check=True)
    for absent in ("tvm", "tvm_ffi", "tvm_fusion"):
        # from the venv's own folder: the checkout's tvm_fusion/ must not be found through the working directory
        found = subprocess.run([python, "-c", f"import {absent}"], capture_output=True, cwd=venv)
        assert found.returncode != 0, f"{absent} is importable in the fresh virtualenv"
    return python


def test_bundle_runs_in_a_fresh_venv_without_the_compiler(tmp_path, fresh_python, capsys):
    model = tmp_path / "block.onnx"
    onnx.save(residual_block(), str(model))
    lib = tmp_path / "block.so"
    assert main(["compile", str(model), "--target", "llvm", "-o", str(lib), "--no-counts", "--external-weights"]) == 0
    assert main(["bundle", str(lib), "-o", str(tmp_path / "deploy")]) == 0
    assert "wrote " in capsys.readouterr().out
    deploy = tmp_path / "deploy"
    assert {p.name for p in deploy.iterdir()} == {"block.so", "block.so.json", "block.so.weights", "run.py", "site"}
    assert not list(deploy.rglob("libtvm_compiler.so"))
    assert sum(p.stat().st_size for p in deploy.rglob("*") if p.is_file()) < 64 << 20

    proc = subprocess.run([fresh_python, str(deploy / "run.py"), "--save", str(tmp_path / "out.npz")],
                          capture_output=True, text=True, cwd=tmp_path,
                          env={k: v for k, v in os.environ.items() if k != "TVM_NUM_THREADS"})  # run.py sizes it
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr  # no per-function warning from TVM's VM
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["compiler_loaded"] is False and result["tvm"].startswith(str(deploy / "site"))
    assert result["threads"] == len(os.sched_getaffinity(0))  # run.py sizes TVM's pool, as tvm_fusion.runtime does
    assert result["outputs"] == [[1, 8, 10, 10]]

    dev = tvm.cpu(0)  # the same library, inputs and weights, run here with the full TVM
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(lib)), dev)
    x = np.random.default_rng(0).standard_normal((1, 8, 10, 10)).astype(np.float32)
    here = vm["main"](tvm.runtime.tensor(x, dev), *load_weights(lib, dev)).numpy()
    np.testing.assert_array_equal(np.load(tmp_path / "out.npz")["arr_0"], here)


def test_the_library_does_not_carry_the_gpu_checks_weights_recipes(capsys):
    """The example-weight recipes serve the GPU check's bundle (benchmarks/gpu_bundle): no module of the
    library is one or imports one, and `bundle` has no recipe option."""
    package = Path(__file__).parents[1] / "tvm_fusion"
    assert not [p for p in package.rglob("*.py") if p.stem in ("weights_recipe", "recipe_replay")]
    code = ("import sys, tvm_fusion, tvm_fusion.cli, tvm_fusion.deploy.compile, tvm_fusion.deploy.bundle, tvm_fusion.runtime, "
            "tvm_fusion.runtime.weights; print(sorted(m for m in sys.modules if 'recipe' in m or 'gpu_bundle' in m))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"
    assert main(["bundle", "m.so", "-o", "d", "--weights-recipe"]) == 2
    assert "unrecognized arguments: --weights-recipe" in capsys.readouterr().err


def test_bundle_of_a_missing_library_is_one_line(tmp_path, capsys):
    assert main(["bundle", str(tmp_path / "nope.so"), "-o", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run tvm-fusion compile first" in err


@pytest.mark.slow
def test_libraries_with_the_same_weights_share_one_recipe(tmp_path):
    """A batch-1 library of one example and a library of its dynamic-batch variant (the batch symbolic, so its
    conv tiles are planned for batch 1 like the first's and the weights are packed alike) lift the same
    weights: the bundle writes one recipe, both manifests name it, and it regenerates the weights of each
    library bit for bit. (A library bound to batch 2 may pack its conv weights for another tile: its own
    recipe.)"""
    from benchmarks.gpu_bundle import bundle_with_recipes, recipe_replay
    from tvm_fusion.deploy.compile import compile_model
    from tvm_fusion.examples import example_path
    from tvm_fusion.frontend.importer import parse_shape

    libs = [tmp_path / "sq_b1.so", tmp_path / "sq_dyn.so"]
    compile_model(example_path("squeezenet", 0), libs[0], "llvm", verify=False, counts_of_other_builds=False,
                  external_weights=True)
    compile_model(example_path("squeezenet", 0, dynamic_batch=True), libs[1], "llvm", verify=False,
                  counts_of_other_builds=False, external_weights=True, shapes=dict([parse_shape("data_0=Nx3x224x224")]))
    result = bundle_with_recipes(libs[0], tmp_path / "deploy", others=[libs[1]])
    deploy = result.path
    assert sorted(p.name for p in deploy.glob("*.recipe.json")) == ["sq_b1.so.recipe.json"]
    assert not list(deploy.glob("*.weights"))
    for lib in libs:
        entry = json.loads((deploy / f"{lib.name}.json").read_text())["weights"]
        assert entry["recipe"] == "sq_b1.so.recipe.json", lib.name
        values = recipe_replay.regenerate(deploy / entry["recipe"])
        lifted = load_weights(lib, tvm.cpu(0))
        assert len(lifted) == len(entry["params"])
        for name, value in zip(entry["params"], lifted):
            np.testing.assert_array_equal(values[name], value.numpy(), err_msg=f"{lib.name} {name}")
