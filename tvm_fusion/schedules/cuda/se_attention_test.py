"""CUDA squeeze-excite and attention schedules, without a GPU: the scheduled loop nest (shared stages under
the block loop, predicated thread splits) run serially on the CPU computes what the unscheduled compute
does, and the kernels stay within sm_90's launch limits."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_fusion._tvm import te, tvm
from tvm_fusion.schedules.attention import attention
from tvm_fusion.schedules.cuda.attention import schedule_attention_cuda
from tvm_fusion.schedules.cuda.conv2d_test import _run_cpu, _Serial
from tvm_fusion.schedules.cuda.gpu_limits import check_gpu_limits
from tvm_fusion.schedules.cuda.squeeze_excite import schedule_squeeze_excite_cuda
from tvm_fusion.schedules.squeeze_excite import squeeze_excite
from tvm_fusion.testing import assert_close

TARGET = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})


def _func(compute, shapes, **attrs):
    tensors = [te.placeholder(s, "float32", name=f"in{i}") for i, s in enumerate(shapes)]
    out = compute(*tensors, **attrs)
    return te.create_prim_func([*tensors, out]).without_attr("global_symbol"), [int(d) for d in out.shape]


def _check(schedule, compute, shapes, attrs):
    func, out_shape = _func(compute, shapes, **attrs)
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    with TARGET:
        schedule(sch, attrs, TARGET)
    check = check_gpu_limits(sch.mod["main"], TARGET)
    assert check.ok, check
    serial = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    with TARGET:
        schedule(_Serial(serial), attrs, TARGET)
    got, want = _run_cpu(serial.mod["main"], shapes, out_shape), _run_cpu(func, shapes, out_shape)
    assert not np.isnan(got).any(), "an output was never written"
    assert_close(got, want, "scheduled vs unscheduled")


SE = [((2, 16, 5, 7), 4, "relu", "hardsigmoid"), ((1, 300, 3, 3), 75, "silu", "sigmoid"),
      ((1, 8, 1, 1), 2, "hardswish", "hardsigmoid"),
      ((1, 384, 3, 6), 96, "relu", "hardsigmoid")]  # PP-OCRv4 det: more channels than 256 threads


@pytest.mark.parametrize("x,r,act,gate", SE, ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v))
def test_squeeze_excite_schedule_keeps_the_numerics(x, r, act, gate):
    c = x[1]
    _check(schedule_squeeze_excite_cuda, squeeze_excite, [x, (r, c), (r,), (c, r), (c,)],
           dict(activation=act, gate=gate))


@pytest.mark.parametrize("x,r", [(s[0], s[1]) for s in SE], ids=lambda v: "x".join(map(str, v))
                         if isinstance(v, tuple) else str(v))
def test_squeeze_excite_kernel_compiles_for_cuda(x, r):
    """Through tvm.compile's lowering (barriers included): a channel stage that loops with a predicate
    around its shared write made TVM fail with "Cannot insert syncs inside condition"."""
    c = x[1]
    func, _ = _func(squeeze_excite, [x, (r, c), (r,), (c, r), (c,)], activation="relu", gate="hardsigmoid")
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    with TARGET:
        schedule_squeeze_excite_cuda(sch, {}, TARGET)
    tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}), target=TARGET)


ATTENTION = [((2, 3, 5, 8), (2, 3, 8, 5), (2, 3, 5, 8), (2, 1, 1, 5)),  # padding mask
             ((1, 2, 300, 16), (1, 2, 16, 300), (1, 2, 300, 24), (1, 1, 300, 300)),  # more keys than threads
             ((1, 1, 3, 8), (1, 1, 8, 9), (1, 1, 9, 8), None),
             ((2, 1, 3, 4), (2, 1, 4, 2), (2, 1, 2, 1), None)]  # one output feature


@pytest.mark.parametrize("shapes", ATTENTION, ids=["mask", "long", "cross_no_mask", "one_feature"])
def test_attention_schedule_keeps_the_numerics(shapes):
    shapes = [s for s in shapes if s is not None]
    _check(schedule_attention_cuda, attention, shapes, dict(scale=2.0, scale_op="divide"))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("family", ["squeeze_excite", "attention"])
def test_half_schedule_sums_in_float32(family, dtype):
    """The CUDA schedule of a half SE / attention kernel, thread bindings left out, run on the CPU: within the
    half dtype's tolerance of float64 NumPy on the same half inputs (an attention row of 40 keys, an SE block of
    48 channels: more than one warp; the context's `store` stage rounds a float32 register)."""
    from tvm_fusion.precision import numpy_dtype

    half, rng = numpy_dtype(dtype), np.random.default_rng(1)
    if family == "attention":
        shapes, attrs = [(1, 2, 3, 8), (1, 2, 8, 40), (1, 2, 40, 16)], dict(scale=2.0, scale_op="divide")
        args = [rng.standard_normal(s).astype(half) for s in shapes]
        tensors = [te.placeholder(s, dtype, name=f"in{i}") for i, s in enumerate(shapes)]
        q, kt, v = (a.astype(np.float64) for a in args)
        scores = q @ kt / 2.0
        p = np.exp(scores - scores.max(-1, keepdims=True))
        want, schedule, compute = (p / p.sum(-1, keepdims=True)) @ v, schedule_attention_cuda, attention
    else:
        (n, c, h, w), r = (2, 48, 3, 5), 12
        shapes, attrs = [(n, c, h, w), (r, c), (r,), (c, r), (c,)], dict(activation="relu", gate="sigmoid")
        args = [rng.standard_normal(shapes[0]).astype(half)] + [rng.standard_normal(s).astype(np.float32) * 0.3
                                                                 for s in shapes[1:]]
        tensors = [te.placeholder(s, dtype if i == 0 else "float32", name=f"in{i}") for i, s in enumerate(shapes)]
        x, w1, b1, w2, b2 = (a.astype(np.float64) for a in args)
        hidden = np.maximum(x.mean((2, 3)) @ w1.T + b1, 0)
        want, schedule, compute = x / (1 + np.exp(-(hidden @ w2.T + b2)))[:, :, None, None], \
            schedule_squeeze_excite_cuda, squeeze_excite
    out = compute(*tensors, **attrs)
    func = te.create_prim_func([*tensors, out]).without_attr("global_symbol")
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    with TARGET:
        schedule(sch, attrs, TARGET)
    assert check_gpu_limits(sch.mod["main"], TARGET).ok
    serial = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    with TARGET:
        schedule(_Serial(serial), attrs, TARGET)
    got = tvm.runtime.tensor(np.zeros([int(d) for d in out.shape], half))
    tvm.compile(tvm.IRModule({"main": serial.mod["main"].with_attr("global_symbol", "main")}), "llvm")["main"](
        *map(tvm.runtime.tensor, args), got)
    assert_close(got.numpy(), want, f"{family} {dtype}", dtype=dtype)


def test_one_channel_and_one_key_are_declined_by_the_cuda_schedules():
    """The schedules' `supports` (what the slow test below sees through explain): one channel, one hidden unit,
    one key."""
    from tvm_fusion.schedules.cuda.attention import _supports as attention_supports
    from tvm_fusion.schedules.cuda.squeeze_excite import _supports as se_supports

    assert "a stage of one channel (C = 1, hidden = 1)" in se_supports({}, [(1, 1, 3, 3), (1, 1), (1,), (1, 1), (1,)],
                                                                       TARGET)
    assert "one hidden unit (C = 8, hidden = 1)" in se_supports({}, [(1, 8, 3, 3), (1, 8), (1,), (8, 1), (8,)], TARGET)
    assert "a row of one key" in attention_supports({}, [(2, 3, 4, 8), (2, 3, 8, 1), (2, 3, 1, 8)], TARGET)
    assert se_supports({}, [(1, 8, 3, 3), (2, 8), (2,), (8, 2), (8,)], TARGET) is None


@pytest.mark.slow
def test_one_channel_squeeze_excite_and_one_key_attention_decline_on_cuda_with_reasons(rules):
    """An SE block of one channel (or one hidden unit) and an attention row of one key: the CUDA schedules split
    that axis over the threads, and compute_at drops a loop of extent 1 (the build stopped with an IndexError,
    found by the random graphs' CUDA builds). They decline saying so; the other rules' kernels build (nvcc): the
    SE block's 1x1 convs of one channel, whose CUDA conv schedule lost the loop of its one-element shared
    fetch the same way ("'fuse' requires at least 1 loop(s)") until the fetch kept its unit loops."""
    from tvm_fusion.check.explain import explain
    from tvm_fusion.patterns.attention_test import attention_block
    from tvm_fusion.patterns.se_test import se_block
    from tvm_fusion.testing import GraphBuilder, check_cuda_build

    g = GraphBuilder(0)
    se = g.model([se_block(g, g.input("x", [1, 1, 3, 3]), 1, 1, gate="Sigmoid")], opset=18)
    g = GraphBuilder(1)
    att = g.model([attention_block(g, shape=(2, 3, 4, 8), keys=1, mask=None)], opset=17)
    for model, rule, why in ((se, "squeeze_excite_relu_sigmoid", "a stage of one channel (C = 1, hidden = 1)"),
                             (att, "attention", "a row of one key has no loop left to split")):
        assert not check_cuda_build(model, rules).counts[rule]
        shown = [d.reason for d in explain(model, "cuda", rules=rules).declined() if d.rule == rule]
        assert any(why in r for r in shown), shown
