"""CPU (llvm) conv3d kernel: the plan takes the target's vector width, the scheduled PrimFunc has a parallel
outer loop over (batch, channel blocks, output planes), vectorized channels at that width and accumulators in
registers (not the leftover schedule's loops), W packed taps first; numerics against numpy on the host and on
an AVX2 target."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_fusion._tvm import te, tvm
from tvm_fusion.build import resolve_target
from tvm_fusion.cpu_features import host_features
from tvm_fusion.hardware import cpu_facts
from tvm_fusion.schedules.conv2d import pack_channel_blocks
from tvm_fusion.schedules.conv3d import conv3d_out_sizes
from tvm_fusion.schedules.llvm.conv3d import conv3d_llvm, conv3d_plan, pack_conv3d, schedule_conv3d_llvm, supports
from tvm_fusion.testing import assert_close

HOST = resolve_target("llvm")  # the host, or TVM_FUSION_CPU
AVX2 = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v3", "num-cores": 2})
AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})

# (x shape, cout, kernel, strides, padding (front, top, left, back, bottom, right), dilation, groups)
CASES = {
    "3x3x3": ((1, 8, 5, 9, 9), 16, (3, 3, 3), (1, 1, 1), (1,) * 6, (1, 1, 1), 1),
    "stem-s2": ((2, 3, 8, 17, 17), 20, (3, 7, 7), (1, 2, 2), (1, 3, 3, 1, 3, 3), (1, 1, 1), 1),
    "asym-dil": ((1, 6, 7, 10, 12), 9, (3, 3, 1), (1, 1, 1), (0, 1, 0, 2, 1, 0), (2, 1, 1), 1),
    "groups": ((1, 16, 4, 6, 6), 24, (1, 3, 3), (1, 1, 1), (0, 1, 1, 0, 1, 1), (1, 1, 1), 2),
}


def _attrs(case):
    _, _, kernel, strides, padding, dilation, groups = case
    return dict(strides=strides, padding=padding, dilation=dilation, groups=groups, activation="relu",
                activation_params={})


def _primfunc(case, target):
    """The fused kernel as fuse.py builds it: W packed by the schedule's pack hook, the llvm compute."""
    x_shape, cout, kernel, *_, groups = case
    attrs = _attrs(case)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((cout, x_shape[1] // groups, *kernel)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    wp, b = pack_conv3d([w, b], attrs, [x_shape, w.shape, b.shape], target)
    x, wt, bt = (te.placeholder(s, "float32", name=n) for s, n in ((x_shape, "x"), (wp.shape, "w"), (b.shape, "b")))
    out = conv3d_llvm(x, wt, bt, target=target, **attrs)
    func = te.create_prim_func([x, wt, bt, out]).without_attr("global_symbol")
    return func, attrs, (w, wp, b)


def _scheduled(case, target):
    func, attrs, consts = _primfunc(case, target)
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    with target:
        schedule_conv3d_llvm(sch, attrs, target)
    return sch, attrs, consts


def _reference(x, w, b, case):
    """act(conv3d(x, W) + b) in float64, one output at a time over numpy windows."""
    _, cout, kernel, strides, padding, dilation, groups = case
    n, cin = x.shape[:2]
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0)] + [(padding[i], padding[i + 3]) for i in range(3)])
    out = np.zeros((n, cout, *conv3d_out_sizes(x.shape[2:], kernel, strides, padding, dilation)))
    cpg, opg = cin // groups, cout // groups
    for idx in np.ndindex(*out.shape[2:]):
        lo = [idx[i] * strides[i] for i in range(3)]
        win = xp[:, :, lo[0]:lo[0] + (kernel[0] - 1) * dilation[0] + 1:dilation[0],
                 lo[1]:lo[1] + (kernel[1] - 1) * dilation[1] + 1:dilation[1],
                 lo[2]:lo[2] + (kernel[2] - 1) * dilation[2] + 1:dilation[2]]
        for g in range(groups):
            out[(slice(None), slice(g * opg, (g + 1) * opg), *idx)] = np.einsum(
                "ncdhw,ocdhw->no", win[:, g * cpg:(g + 1) * cpg], w[g * opg:(g + 1) * opg])
    return np.maximum(out + b[None, :, None, None, None], 0)


def _loop_kinds(sch):
    conv = sch.get_sblock("conv_update")  # the reduction, after decompose_reduction
    return [(sch.get(loop).kind, int(sch.get(loop).extent)) for loop in sch.get_loops(conv)]


@pytest.mark.parametrize("target", [AVX512, AVX2], ids=["avx512", "avx2"])
def test_the_vector_width_comes_from_the_target(target):
    """The tile's channels are whole vectors of the target's lanes (16 with AVX-512, 8 with AVX2)."""
    lanes = cpu_facts(target).float32_lanes
    assert lanes == {"avx512": 16, "avx2": 8}[cpu_facts(target).isa]
    plan = conv3d_plan(*CASES["3x3x3"][:1], 16, (8, 3, 3, 3), (1, 1, 1), (1,) * 6, (1, 1, 1), 1, cpu_facts(target))
    assert plan.tile.lanes == lanes and plan.padding.channel_block % lanes == 0 and plan.depth == 5


@pytest.mark.parametrize("target", [HOST, AVX2], ids=["host", "avx2"])
@pytest.mark.parametrize("name", CASES)
def test_scheduled_kernel_structure_and_numerics(name, target):
    """Parallel outer loop (batch x channel blocks x planes), one vectorized loop of whole vectors of channels,
    local accumulators; TVM's conv3d block (the leftover schedule's) is absent; matches numpy."""
    case = CASES[name]
    sch, _, (w, _, b) = _scheduled(case, target)
    kinds = _loop_kinds(sch)
    lanes = cpu_facts(target).float32_lanes
    assert kinds[0][0] == tvm.tirx.ForKind.PARALLEL, kinds
    plan_depth = conv3d_out_sizes(case[0][2:], case[2], case[3], case[4], case[5])[0]
    assert kinds[0][1] % plan_depth == 0, kinds  # the planes are among the parallel tasks
    vector = [extent for kind, extent in kinds if kind == tvm.tirx.ForKind.VECTORIZED]
    assert len(vector) == 1 and vector[0] % lanes == 0, kinds
    script = sch.mod["main"].script()
    assert 'scope="local"' in script and "conv3d_ncdhw" not in script
    if target is AVX2 and "avx2" not in (host_features() or ()):
        return
    x = np.random.default_rng(1).standard_normal(case[0]).astype(np.float32)
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}), target=target)
    out_shape = [int(d) for d in sch.mod["main"].params[-1].shape]
    args = [tvm.runtime.tensor(a) for a in (x, *_primfunc_consts(case, target))] + [
        tvm.runtime.tensor(np.zeros(out_shape, np.float32))]
    lib["main"](*args)
    assert_close(args[-1].numpy(), _reference(x, w, b, case).astype(np.float32), f"conv3d {name}")


def _primfunc_consts(case, target):
    _, _, (_, wp, b) = _primfunc(case, target)
    return wp, b


def test_weights_are_packed_taps_first():
    """Wp[o // B, q, r, s, c, o % B] = W[o, c, q, r, s]; each group's padded channels zero."""
    w = np.arange(12 * 2 * 3 * 1 * 2, dtype=np.float32).reshape(12, 2, 3, 1, 2)
    wp = pack_channel_blocks(w, groups=2, group_channels=8, block=8, taps_first=True)
    assert wp.shape == (2, 3, 1, 2, 2, 8)
    assert wp[1, 2, 0, 1, 0, 3] == w[6 + 3, 0, 2, 0, 1] and not wp[0, :, :, :, :, 6:].any()


def test_supports_names_actual_and_expected_values():
    shapes = [(1, 8, 4, 8, 8), (8, 1, 3, 3, 3), (8,)]
    attrs = dict(strides=(1, 1, 1), padding=(1,) * 6, dilation=(1, 1, 1), groups=8)
    assert supports(attrs, shapes, AVX2) == ("conv3d has 8 groups of 1 output channels; the llvm conv3d kernel "
                                             "computes whole vectors of 8 channels per group (8), more than 2x "
                                             "the real work: left to TVM's kernel")
    empty = dict(attrs, groups=1, padding=(0,) * 6)
    assert supports(empty, [(1, 8, 2, 8, 8), (8, 8, 3, 3, 3), (8,)], AVX2) == "conv3d output is empty (0x6x6)"
