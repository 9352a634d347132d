"""The llvm conv_pool plan: which conv kernels take the pool (one task per plane), the halo it states, the
measured decline of large planes; the scheduled kernel allocates the epilogue per task, inside its parallel
loop (the conv output never exists whole)."""

from __future__ import annotations

import pytest

from tvm_fusion._tvm import tvm
from tvm_fusion.build.builder import build, resolve_target
from tvm_fusion.frontend.importer import import_onnx
from tvm_fusion.hardware import cpu_facts
from tvm_fusion.patterns.conv_pool_test import conv_pool
from tvm_fusion.schedules.conv_pool import PoolWindow
from tvm_fusion.schedules.llvm.conv2d import ConvPlan, ConvPadding, ConvTile, plan_of
from tvm_fusion.schedules.llvm.conv_pool import MAX_PLANE_BYTES, pool_plan, supports

AVX512 = resolve_target('{"kind": "llvm", "mcpu": "skylake-avx512"}')
AVX2 = resolve_target('{"kind": "llvm", "mcpu": "x86-64-v3"}')
HOST = resolve_target("llvm")
MAX = {"pool_kind": "max", "pool_size": (3, 3), "pool_strides": (2, 2), "pool_padding": (1, 1, 1, 1),
       "pool_out": (56, 56)}
STEM = dict(strides=(2, 2), padding=(3, 3, 3, 3), dilation=(1, 1), groups=1)


def _stem(target):
    conv = plan_of((1, 3, 224, 224), 64, (3, 7, 7), STEM["strides"], STEM["padding"], STEM["dilation"], 1,
                   cpu_facts(target))
    return conv, pool_plan(conv, MAX)


def test_resnet_stem_fuses_with_no_halo_where_its_task_plane_fits():
    """AVX2's 16-channel tasks hold a 0.77 MiB plane of the 112x112 stem output: fused, no halo. AVX-512's
    32-channel tasks hold 1.5 MiB, past MAX_PLANE_BYTES: declined with the measured reason."""
    conv, plan = _stem(AVX2)
    assert (plan.kernel, plan.channels, plan.declined) == ("tiled", 16, "")
    assert plan.halo.startswith("none: each task pools whole planes")
    assert plan.plane_bytes == 16 * conv.padding.rows * conv.padding.cols * 4 <= MAX_PLANE_BYTES
    assert supports({**STEM, **MAX}, [(1, 3, 224, 224), (64, 3, 7, 7), (64,)], AVX2) is None
    conv, plan = _stem(AVX512)
    assert (plan.kernel, plan.channels) == ("tiled", 32)
    assert plan.declined.startswith("a task's conv output plane is 1.5 MiB (32 channels x 112 x 112)"), plan
    assert supports({**STEM, **MAX}, [(1, 3, 224, 224), (64, 3, 7, 7), (64,)], AVX512) == plan.declined


def test_a_kernel_that_splits_planes_declines():
    conv = ConvPlan("pointwise", ConvTile(1, 1, 8, 8), ConvPadding(64, 1, 64))
    assert pool_plan(conv, MAX).declined == ("the conv takes the pointwise kernel, whose parallel tasks split an "
                                             "output plane; the fused pool needs one task per plane (tiled, "
                                             "depthwise, depthwise_channels kernels)")


def test_a_plane_past_the_measured_bound_declines():
    """VGG's first block (3 -> 64 on 224x224): a task's plane of 32 channels is 6.1 MiB."""
    conv = ConvPlan("tiled", ConvTile(2, 1, 14, 16), ConvPadding(64, 224, 224, 32))
    why = pool_plan(conv, {"pool_kind": "max", "pool_size": (2, 2), "pool_strides": (2, 2)}).declined
    assert why.startswith("a task's conv output plane is 6.1 MiB (32 channels x 224 x 224)"), why


def test_the_epilogue_is_allocated_per_task():
    """Lowered, the epilogue buffer lives inside the parallel task loop with one block of channels."""
    built = build(import_onnx(conv_pool("max3s2p1", hw=(20, 20), cout=48)), HOST, "fused")
    func = next(f for gv, f in built.fused.mod.functions.items() if gv.name_hint == "conv2d_bn_relu_pool")
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    passes = tvm.s_tir.transform
    lowered = tvm.transform.Sequential([passes.LowerInitBlock(), passes.PlanAndUpdateBufferAllocationLocation(),
                                        passes.ConvertBlocksToOpaque(), passes.CompactBufferAllocation()])(mod)
    lines = [line.strip() for line in lowered.script().splitlines() if "T.parallel(" in line or "alloc" in line]
    task = next(i for i, line in enumerate(lines) if "_m in T.parallel(" in line)  # the merged task loop
    epilogue = next(i for i, line in enumerate(lines) if line.startswith("epilogue = "))
    assert epilogue == task + 1, lines
    channels = int(lines[epilogue].split("((")[1].split(",")[1])
    assert channels < 48 and 48 % channels == 0, lines  # one task's block of the 48 channels, not the tensor
    window = PoolWindow.of(MAX)
    assert window.recomputed() == pytest.approx(1.25)  # 3x3/2 windows read 2.25 taps per conv output
