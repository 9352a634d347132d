"""CUDA graphs (cuda_graph.py): the fused CUDA build's kernels captured by TVM's RewriteCUDAGraph behind one
copy of the input, checked on the VM code and the lowered Relax (no GPU); tests/cuda_stub runs the capture
and the replay under the stub driver."""

import re

import pytest

from tvm_fusion.build import cuda_graph
from tvm_fusion.frontend import importer as frontend
from tvm_fusion._tvm import relax, tvm
from tvm_fusion.build.builder import build, resolve_target
from tvm_fusion.testing import GraphBuilder, residual_block


def chain(n: int = 4, c: int = 8, hw=(10, 10)):
    """n x (conv -> bn -> relu): n fused kernels in a row."""
    g = GraphBuilder(0)
    y = g.input("x", [1, c, *hw])
    for _ in range(n):
        y = g.op("Relu", [g.bn(g.conv(y, c, c), c)])
    return g.model([y])


def _calls(vm_code: str, name: str) -> int:
    """How many times the VM code (Executable.as_text) calls `name`."""
    return len(re.findall(rf"call\s+{re.escape(name)} ", vm_code))


@pytest.fixture(scope="module")
def cuda():
    return resolve_target("cuda", "sm_90")


def test_a_chain_is_captured_behind_a_copy_of_its_input(cuda):
    """4 kernels: the input copy and 1 graph launch replaying 3 of them, and the last (it writes main's
    output, which a graph cannot own) outside: 3 launches per inference instead of 4."""
    built = build(frontend.import_onnx(chain(4)), cuda, "fused")
    assert built.kernel_calls == 4 and built.counts["conv2d_bn_relu"] == 4  # counts are those before the graph
    assert built.cuda_graph == {"enabled": True, "reason": None,
                                "launches": {"without_graph": 5, "with_graph": 3, "graphs": 1, "captured": 3}}
    code = built.executable.as_text()
    assert _calls(code, cuda_graph.RUN_OR_CAPTURE) == 1 and _calls(code, "vm.builtin.cuda_graph.get_cached_alloc") == 1
    main = str(built.lowered["main"])
    assert main.index("copy_input(x, ") < main.index(cuda_graph.RUN_OR_CAPTURE)
    captured = [f for gv, f in built.lowered.functions.items() if gv.name_hint.endswith("_cuda_graph_capture")]
    assert len(captured) == 1 and str(captured[0]).count("conv2d_bn_relu") == 3


def test_no_cuda_graph_on_request(cuda):
    built = build(frontend.import_onnx(chain(4)), cuda, "fused", cuda_graph=False)
    assert (built.cuda_graph["enabled"], built.cuda_graph["reason"]) == (False, "turned off (--no-cuda-graph)")
    assert built.cuda_graph["launches"]["with_graph"] == built.cuda_graph["launches"]["without_graph"] == 4
    assert "cuda_graph" not in built.executable.as_text() and "copy_input" not in str(built.lowered)


def test_no_graph_where_it_would_not_save_a_launch(cuda):
    built = build(frontend.import_onnx(residual_block()), cuda, "fused")
    assert built.cuda_graph["reason"] == "the graph would not save launches (3 with it, 2 without)"
    assert "cuda_graph" not in built.executable.as_text()


def test_weights_outside_the_library_get_a_graph_only_when_asked(cuda):
    """A replay reads the weight tensors of the first call (TVM caches the graph by shape): a library whose
    weights are passed in gets a graph only with cuda_graph=True."""
    mod = frontend.import_onnx(chain(4))
    off = build(mod, cuda, "fused", external_weights=True)
    assert off.cuda_graph["reason"].startswith("off by default with weights outside the library")
    on = build(mod, cuda, "fused", external_weights=True, cuda_graph=True)
    assert on.cuda_graph["enabled"] and on.cuda_graph["launches"]["with_graph"] == 3
    assert _calls(on.executable.as_text(), cuda_graph.RUN_OR_CAPTURE) == 1


def test_no_graph_for_the_cpu_or_other_builds(cuda):
    mod = frontend.import_onnx(chain(4))
    assert build(mod, "llvm", "fused").cuda_graph is None
    unfused = build(mod, cuda, "unfused")
    assert unfused.cuda_graph["reason"] == "off by default for the unfused build (pass cuda_graph=True)"
    assert "cuda_graph" not in unfused.executable.as_text()


def test_a_symbolic_shape_gets_no_graph(cuda):
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType([n, 8], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], {"num_input": 1}):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.relu(x))
        bb.emit_func_output(y)
    assert cuda_graph.applies(bb.get(), cuda) == "input x has a symbolic shape; a graph needs static shapes"
    assert cuda_graph.applies(bb.get(), resolve_target("llvm")) == "target kind llvm: CUDA graphs are for cuda"
