"""Conv chains in NCHW[x]c (`chain_layout.py`): which groups run blocked, which tensors stay NCHW and why, and
the fused build against onnxruntime element by element with the chain, without it, and where it declines
(a chain's tensor that is a graph output, a symbolic batch, half precision, an AVX2 target)."""

from __future__ import annotations

import pytest

from tvm_fusion._tvm import relax, tvm
from tvm_fusion.build.builder import build
from tvm_fusion.frontend.importer import import_onnx
from tvm_fusion.fusion.chain_layout import BLOCKED_ISAS, MAX_UNBLOCK_SHARE
from tvm_fusion.hardware import cpu_facts
from tvm_fusion.schedules.llvm.conv2d_test import AVX2, NO_AVX2, TARGET
from tvm_fusion.check.io import run_onnxruntime
from tvm_fusion.frontend.importer import SymDim
from tvm_fusion.testing import (GraphBuilder, apply_activation_onnx, assert_close, block_in_if_branches,
                                check_fused, check_half, check_symbolic_batch, random_inputs, run_build)

BLOCKED = "chain ("  # in every chain group's kernel note (conv2d_blocked.chain_note)
#: the host target (or TVM_FUSION_CPU's) chains convs: AVX-512 does, AVX2 does not
CHAINS = cpu_facts(TARGET).isa in BLOCKED_ISAS


def bottleneck(g: GraphBuilder, y: str, c: int) -> str:
    """A ResNet bottleneck on y (1x1 c -> c/2, 3x3, 1x1 back + the residual, ReLU)."""
    h = g.op("Relu", [g.bn(g.conv(y, c, c // 2, k=1), c // 2)])
    h = g.op("Relu", [g.bn(g.conv(h, c // 2, c // 2, k=3), c // 2)])
    h = g.bn(g.conv(h, c // 2, c, k=1), c)
    return g.op("Relu", [g.op("Add", [h, y])])


def bottlenecks(blocks: int = 2, c: int = 32, hw: int = 14, n: int = 1, extra_output: bool = False, seed: int = 3):
    """`blocks` ResNet bottlenecks, then a global average pool; `extra_output`: the first block's output is a
    graph output too."""
    g = GraphBuilder(seed)
    y = g.input("x", [n, c, hw, hw])
    outs = []
    for i in range(blocks):
        y = bottleneck(g, y, c)
        if extra_output and i == 0:
            outs.append(y)
    return g.model([g.op("GlobalAveragePool", [y]), *outs])


def inverted_residuals(c: int = 16, hidden: int = 64, hw: int = 14, kernels=(3, 5), dw_groups=None, seed: int = 5):
    """MobileNetV2 blocks (1x1 c -> hidden, ReLU6; depthwise k x k, ReLU6; 1x1 back + the residual), one per
    kernel size, then a global average pool; `dw_groups` makes the last block's depthwise conv a grouped conv
    of that many groups instead."""
    g = GraphBuilder(seed)
    y = g.input("x", [1, c, hw, hw])
    relu6 = lambda v: apply_activation_onnx(g, v, "Clip")  # noqa: E731
    for i, k in enumerate(kernels):
        groups = dw_groups if dw_groups and i == len(kernels) - 1 else hidden
        h = relu6(g.bn(g.conv(y, c, hidden, k=1), hidden))
        h = relu6(g.bn(g.conv(h, hidden, hidden, k=k, groups=groups), hidden))
        y = g.op("Add", [g.bn(g.conv(h, hidden, c, k=1), c), y])
    return g.model([g.op("GlobalAveragePool", [y])])


def _kernels(built) -> list[str]:
    """BLOCKED for each chain group, else its kernel note."""
    return [BLOCKED if BLOCKED in g.kernel else g.kernel for g in built.fused.groups]


def _blocked_tensors(built) -> int:
    """call_tir results of rank 5 in the fused module's main."""
    count = 0

    def visit(e):
        nonlocal count
        if isinstance(e, relax.Call) and e.op.same_as(tvm.ir.Op.get("relax.call_tir")):
            count += len(e.ty.shape) == 5 if hasattr(e.ty, "shape") and e.ty.shape is not None else 0

    relax.analysis.post_order_visit(built.fused.mod["main"], visit)
    return count


def test_bottleneck_chain_runs_blocked_and_matches_onnxruntime():
    """Six convs joined by blocked tensors: on an AVX-512 target every one runs blocked, the last writes NCHW
    for the pool (one end of six, under MAX_UNBLOCK_SHARE); an AVX2 target keeps NCHW. Fused matches
    onnxruntime and the unfused build element by element."""
    built = check_fused(bottlenecks())
    assert _kernels(built).count(BLOCKED) == (6 if CHAINS else 0)
    assert _blocked_tensors(built) == (5 if CHAINS else 0)
    assert 1 / 6 <= MAX_UNBLOCK_SHARE
    if CHAINS:  # what explain and the manifest say: the first conv reads NCHW, the last writes it
        lanes = cpu_facts(TARGET).float32_lanes
        notes = [g.kernel for g in built.fused.groups]
        assert notes[0] == f"NCHW{lanes}c chain (NCHW in, NCHW{lanes}c out)"
        assert notes[-1] == f"NCHW{lanes}c chain (NCHW{lanes}c in, NCHW out)"
        assert notes[1:-1] == [f"NCHW{lanes}c chain (NCHW{lanes}c in, NCHW{lanes}c out)"] * 4


def test_inverted_residuals_chain_their_depthwise_convs():
    """MobileNetV2 blocks: the depthwise convs (3x3 and 5x5) run blocked between the 1x1 convs
    (`depthwise_blocked`), all six convs in one chain whose last writes NCHW for the pool; fused matches
    onnxruntime and the unfused build element by element."""
    built = check_fused(inverted_residuals())
    assert _kernels(built).count(BLOCKED) == (6 if CHAINS else 0)
    assert _blocked_tensors(built) == (5 if CHAINS else 0)
    if CHAINS:
        lanes = cpu_facts(TARGET).float32_lanes
        depthwise = [g.kernel for g in built.fused.groups if g.compute == "depthwise_conv2d_affine_blocked"]
        assert depthwise == [f"depthwise NCHW{lanes}c chain (NCHW{lanes}c in, NCHW{lanes}c out)"] * 2


def test_a_grouped_conv_is_not_chained():
    """A grouped conv (two input channels per group) has no blocked kernel: it reads and writes NCHW, so the
    1x1 conv before it writes NCHW and the one after it reads NCHW and writes NCHW for the pool: two NCHW ends
    of the five other convs (over MAX_UNBLOCK_SHARE), nothing chains; the build still matches onnxruntime."""
    built = check_fused(inverted_residuals(dw_groups=32))
    grouped = [g for g in built.fused.groups if g.attrs.get("groups") == 32]
    assert len(grouped) == 1 and BLOCKED not in grouped[0].kernel
    assert 2 / 5 > MAX_UNBLOCK_SHARE and BLOCKED not in _kernels(built)


def test_a_chain_beside_if_branches():
    """Two bottlenecks, then an If whose branches each run a bottleneck on their output: the six convs before
    the If chain (the If reads their last output, which stays NCHW); the convs inside the branches (nested
    functions' bindings, not the function's own) keep NCHW; fused matches onnxruntime either way."""
    g = GraphBuilder(3)
    y = g.input("x", [1, 32, 14, 14])
    for _ in range(2):
        y = bottleneck(g, y, 32)
    z = block_in_if_branches(g, y, lambda b, x: bottleneck(b, x, 32))
    built = check_fused(g.model([g.op("GlobalAveragePool", [z])]))
    kernels = _kernels(built)
    assert len(kernels) == 12 and kernels.count(BLOCKED) == (6 if CHAINS else 0)


def test_without_the_layout_every_tensor_is_nchw():
    model = bottlenecks()
    mod = import_onnx(model)
    built = build(mod, "llvm", "fused", blocked_layout=False)
    assert BLOCKED not in _kernels(built) and _blocked_tensors(built) == 0
    inputs = random_inputs(model)
    blocked = build(mod, "llvm", "fused")
    for a, b in zip(run_build(built, [inputs["x"]]), run_build(blocked, [inputs["x"]])):
        assert_close(b, a, "blocked vs NCHW build")


def test_a_chain_tensor_read_outside_the_chain_stays_nchw():
    """The first block's output is also a graph output: it stays NCHW, which leaves two chains of three convs
    with one NCHW end each (1/3 > MAX_UNBLOCK_SHARE): nothing runs blocked."""
    built = check_fused(bottlenecks(extra_output=True))
    assert BLOCKED not in _kernels(built) and _blocked_tensors(built) == 0


def test_symbolic_batch_and_half_precision_keep_nchw():
    """The blocked conv takes static shapes and float32: a symbolic batch and float16 / bfloat16 keep every
    kernel NCHW (where the same model in float32 with a static batch chains: test_batch_of_two_runs_blocked),
    and both still match onnxruntime."""
    model = bottlenecks(blocks=2, c=32, hw=8, n="N")  # static, the same model runs blocked
    built = check_symbolic_batch(model, {"x": (SymDim("N"), 32, 8, 8)}, batches=(1, 2))
    assert BLOCKED not in _kernels(built)
    for dtype in ("float16", "bfloat16"):
        assert BLOCKED not in _kernels(check_half(bottlenecks(blocks=2, c=32, hw=8), dtype))


def test_batch_of_two_runs_blocked():
    built = check_fused(bottlenecks(blocks=2, c=32, hw=8, n=2))
    assert _kernels(built).count(BLOCKED) == (6 if CHAINS else 0)


@NO_AVX2
def test_avx2_targets_keep_nchw():
    """An AVX2 target (`BLOCKED_ISAS`: measured slower chained) keeps every conv NCHW, and matches
    onnxruntime."""
    model = bottlenecks(c=32, hw=14)
    target = tvm.target.Target(AVX2)
    built = build(import_onnx(model), target, "fused")
    assert BLOCKED not in _kernels(built)
    inputs = random_inputs(model)
    ref = run_onnxruntime(model, inputs)[0].run(None, inputs)
    for got, want in zip(run_build(built, [inputs["x"]]), ref):
        assert_close(got, want, "AVX2 build vs onnxruntime")


@pytest.mark.parametrize("target", ["cuda"])
def test_other_targets_plan_no_chain(target):
    """The layout is an llvm schedule: a CUDA build's conv groups keep their NCHW kernels (compiled only)."""
    from tvm_fusion.build.builder import resolve_target
    from tvm_fusion.fusion.fuse import fuse
    from tvm_fusion.fusion.loader import load_rules_for

    result = fuse(import_onnx(bottlenecks()), resolve_target(target), load_rules_for())
    assert all("blocked" not in g.compute for g in result.groups) and len(result.groups) >= 6


def test_an_avx512_target_chains_whatever_the_host():
    """The plan reads the target, not the host: an AVX-512 target chains the six convs (built here, nothing
    runs: the host may lack AVX-512)."""
    target = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})
    built = build(import_onnx(bottlenecks()), target, "fused")
    assert _kernels(built).count(BLOCKED) == 6 and _blocked_tensors(built) == 5


def test_compile_writes_the_chain_and_turns_it_off(tmp_path):
    """`tvm-fusion compile` (compile_model) on an AVX-512 target: the manifest's groups name the blocked
    kernel; `--no-blocked-layout` (blocked_layout=False) none; both libraries verified and loadable."""
    from tvm_fusion.deploy.compile import compile_model
    from tvm_fusion.runtime import load

    target = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}
    model = bottlenecks(blocks=2, c=32, hw=8)
    engines = {}
    for on in (True, False):
        out = tmp_path / f"chain_{on}.so"
        result = compile_model(model, out, target if not CHAINS else "llvm", counts_of_other_builds=False,
                               verify=CHAINS, blocked_layout=on)
        engines[on] = [BLOCKED if BLOCKED in g.get("engine", "") else "" for g in result.manifest.groups]
        if CHAINS:  # the host runs AVX-512 code: the library loads and runs
            x = random_inputs(model)["x"]
            assert_close(load(out)(x)[0], run_onnxruntime(model, {"x": x})[0].run(None, {"x": x})[0],
                         "the compiled library vs onnxruntime")
    assert engines[True].count(BLOCKED) == 6 and BLOCKED not in engines[False]
