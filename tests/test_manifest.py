"""The typed manifest (tvm_fusion/runtime/manifest.py): compile writes it, the runtime reads it through the same class;
a round trip keeps every field, a newer schema or a missing field is one error naming the file, and a file
written before the schema was versioned still loads."""

import json

import numpy as np
import onnx
import pytest

from tvm_fusion.deploy.compile import compile_model
from tvm_fusion.errors import FusionError
from tvm_fusion.runtime.manifest import SCHEMA_VERSION, CudaBinary, DimLimit, Manifest, TensorSpec, WeightsFile
from tvm_fusion.runtime import load
from tvm_fusion.testing import residual_block

UNVERSIONED = {  # a manifest as compile wrote it before `schema_version` (a CPU library, weights outside)
    "model": "m.onnx", "library": "m.so", "target": '{"kind":"llvm","mcpu":"x86-64-v3"}',
    "cpu_triple": "x86_64-linux-gnu", "cpu_features": ["avx", "avx2", "fma"], "arch": None, "tvm_version": "0.27",
    "inputs": [{"name": "x", "shape": ["N", 3, 8, 8], "dtype": "float32"}],
    "outputs": [{"name": "y", "shape": ["N", 8, 8, 8], "dtype": "float32"}],
    "symbolic_dims": {"N": {"upper_bound": None, "max_size": 1048576}},
    "precision": {"name": "fp32", "converted": False}, "rule_counts": {"conv2d_bias_relu": 1},
    "groups": [{"rule": "conv2d_bias_relu", "function": "fused_0", "onnx_nodes": ["conv", "relu"], "attrs": {}}],
    "tensor_core_groups": 0, "builds": {"fused": {"primfuncs": 1, "kernel_calls": 1}}, "declined": [],
    "unscheduled": [], "verification": {"verified": False, "reason": "--no-verify"}, "simplify": {"ran": True},
    "weights": {"file": "m.so.weights", "bytes": 100, "params": ["w0", "w1"]},
}


def test_an_unversioned_manifest_loads_and_round_trips(tmp_path):
    path = tmp_path / "m.so.json"
    path.write_text(json.dumps(UNVERSIONED))
    m = Manifest.load(path)
    assert m.schema_version == SCHEMA_VERSION == 1
    assert m.inputs == [TensorSpec("x", ["N", 3, 8, 8], "float32")]
    assert m.symbolic_dims == {"N": DimLimit(None, 1048576)}
    assert m.weights == WeightsFile("m.so.weights", 100, ["w0", "w1"])
    assert (m.target_kind, m.cuda_binary, m.extra) == ("llvm", None, {})
    m.save(tmp_path / "again.json")
    again = json.loads((tmp_path / "again.json").read_text())
    assert again == {"schema_version": 1, **UNVERSIONED} and list(again) == ["schema_version", *UNVERSIONED]
    assert Manifest.load(tmp_path / "again.json") == m
    assert m["groups"] == UNVERSIONED["groups"] and m.get("cuda_graph") is None and "weights" in m


def test_a_cuda_manifest_with_unknown_keys_round_trips(tmp_path):
    m = Manifest(model="m.onnx", library="m.so", target='{"kind":"cuda","arch":"sm_90"}', arch="sm_90",
                 inputs=[TensorSpec("x", [1, 3], "float16")], outputs=[TensorSpec("y")],
                 cuda_binary=CudaBinary("cubin", 1234, ["fused_0_kernel"], "nvcc", "export", 2.5),
                 weights=WeightsFile("m.so.weights", 8, ["w0"], extra={"recipe": "m.so.recipe.json"}),
                 extra={"mode": "unfused"})
    m.save(tmp_path / "m.so.json")
    data = json.loads((tmp_path / "m.so.json").read_text())
    assert list(data)[0] == "schema_version" and data["mode"] == "unfused"
    assert data["outputs"] == [{"name": "y"}] and data["weights"]["recipe"] == "m.so.recipe.json"
    assert Manifest.load(tmp_path / "m.so.json") == m
    assert m.target_kind == "cuda"
    # a GPU binary recorded without its compiler (the GPU check's unfused builds) writes no compiler fields
    assert CudaBinary("ptx", 10, []).to_dict() == {"format": "ptx", "bytes": 10, "kernels": []}


@pytest.mark.parametrize("version", [SCHEMA_VERSION + 1, 0, "1"])
def test_a_manifest_of_another_schema_is_refused_naming_the_file(tmp_path, version):
    path = tmp_path / "m.so.json"
    path.write_text(json.dumps({**UNVERSIONED, "schema_version": version}))
    with pytest.raises(FusionError, match=rf"^{path}: manifest schema_version {version!r} is not one this "
                                          rf"tvm_fusion reads \(1 to {SCHEMA_VERSION}\)"):
        Manifest.load(path)


def test_a_manifest_missing_a_field_is_one_error_naming_the_file_and_field(tmp_path):
    path = tmp_path / "m.so.json"
    path.write_text(json.dumps({k: v for k, v in UNVERSIONED.items() if k not in ("target", "inputs")}))
    with pytest.raises(FusionError, match=rf"^{path}: no 'target', 'inputs' \(a manifest has model, library"):
        Manifest.load(path)
    path.write_text(json.dumps({**UNVERSIONED, "weights": {"file": "m.so.weights", "params": []}}))
    with pytest.raises(FusionError, match=rf"^{path}.weights: no 'bytes'"):
        Manifest.load(path)
    path.write_text("{ not json")
    with pytest.raises(FusionError, match=rf"^{path}: not JSON"):
        Manifest.load(path)
    path.write_text("[1, 2]")
    with pytest.raises(FusionError, match=rf"^{path}: not a tvm_fusion manifest \(a JSON object expected, got list\)"):
        Manifest.load(path)


def test_compile_writes_and_the_runtime_reads_the_same_class(tmp_path):
    model = residual_block(c=8, hw=(6, 6))
    onnx.save(model, str(tmp_path / "m.onnx"))
    result = compile_model(tmp_path / "m.onnx", tmp_path / "m.so", "llvm", counts_of_other_builds=False,
                           verify=False, external_weights=True)
    assert isinstance(result.manifest, Manifest)
    on_disk = json.loads(result.manifest_path.read_text())
    assert on_disk["schema_version"] == SCHEMA_VERSION and on_disk == result.manifest.to_dict()
    loaded = load(result.library)
    assert loaded.manifest == result.manifest == Manifest.load(result.manifest_path)
    assert loaded.input_names == ["x"] and loaded.output_names == [o.name for o in model.graph.output]
    assert len(loaded.weights) == len(result.manifest.weights.params) > 0
    x = np.zeros(result.manifest.inputs[0].shape, result.manifest.inputs[0].dtype)
    assert loaded(x)[0].shape == tuple(result.manifest.outputs[0].shape)
    on_disk["schema_version"] = SCHEMA_VERSION + 1  # a library from a newer tvm_fusion: refused before loading
    result.manifest_path.write_text(json.dumps(on_disk))
    with pytest.raises(FusionError, match=rf"^{result.manifest_path}: manifest schema_version {SCHEMA_VERSION + 1}"):
        load(result.library)


def test_every_field_is_written_in_the_json_order():
    """The JSON keeps compile's key order; a field added to the class but not to that order would not be written."""
    from dataclasses import fields

    for cls in (Manifest, CudaBinary):
        assert sorted(cls._order) == sorted(f.name for f in fields(cls) if f.name != "schema_version"), cls
