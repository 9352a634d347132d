"""Where convs pass their activations in the blocked channel layout NCHW[B]c (B: the target's float32 lanes;
AVX-512 targets, `BLOCKED_ISAS`). Plain convs (groups 1) and depthwise convs (one output channel per input
channel) take it; grouped convs do not.

A conv group in NCHW writes each output pixel's channels to as many planes; in NCHW[B]c it writes them as
whole vectors, one cache line per pixel on AVX-512, in the order it computes them, and the next conv reads
its input channels B at a time from one line (`schedules/conv2d_blocked.py`). A tensor is held blocked when
the conv group that writes it and every group that reads it (as its input or its residual) can take the
layout (`blockable`); a group reading an NCHW tensor converts while it reads (the pad stage or the reduction
itself), a group whose output has another reader writes NCHW (its `unblock` stage). A set of groups joined
by blocked tensors is a chain; a chain whose NCHW outputs (unblocks, each a pass over its output) number
more than `MAX_UNBLOCK_SHARE` of its groups is left in NCHW. That share is a judgement, not a measurement:
it keeps ResNet-50's one chain (1 end of 52) and drops VGG19's chains of three convs between its conv -> pool
groups (1 end of 3), whose 3x3 512 on 28x28 ran 1.05x the NCHW kernel's time blocked.

Measured (one thread, an AVX-512 Xeon; docs/cpu_conv_kernels.md): alone, after an 8 MiB write as inside a
model, ResNet-50's 1x1 convs 0.81-0.99x the NCHW kernel's time, its 3x3 0.93-1.04x (`benchmarks/blocked_convs.py`);
the whole model chained 55.3 against 60.5 ms (`benchmarks/cpu_speed.py --models resnet50 --modes fused,nchw`).
MobileNetV2's depthwise convs on 14x14 and 7x7 blocked 0.51-0.63x the NCHW kernel's time hot, 0.81-0.86x
evicted; the whole model (38 of 52 convs in two chains) 4.81-5.02 against 5.24-5.48 ms.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm_fusion import _tvm
from tvm_fusion._tvm import relax
from tvm_fusion.hardware import cpu_facts
from tvm_fusion.rules import Lowering, batch_shape
from tvm_fusion.schedules.conv2d import CONV_FAMILY
from tvm_fusion.schedules.llvm.conv2d_blocked import output_size, tile_of

__all__ = ["ChainPlan", "MAX_UNBLOCK_SHARE", "blockable", "plan_chains"]

#: a chain is kept when its groups writing NCHW (its ends) are at most this share of its groups
MAX_UNBLOCK_SHARE = 0.25
#: the vector ISAs whose targets chain convs. The blocked kernel builds and is tested for AVX2 too (8 lanes),
#: but there ResNet-50 ran 1.12x slower chained (97.4 -> 109 ms, one thread, `x86-64-v3` on the AVX-512 Xeon):
#: its 14x14 and 7x7 rows get tiles of one block of 7 pixels, and AVX2 does not chunk reductions (3x3 256 on
#: 14x14 1.25x, 1x1 1024 -> 256 1.22x the NCHW kernel alone)
BLOCKED_ISAS = ("avx512",)


@dataclass(frozen=True)
class ChainPlan:
    """{composite call: whether its output is written blocked} for each conv group of a chain."""

    members: dict

    def out_blocked(self, call) -> bool | None:
        """True / False for a chain's group (its output blocked or NCHW), None for any other call."""
        return self.members.get(call)


def blockable(lowering: Lowering, out_shape, target) -> str | None:
    """Why a lowered conv group cannot run blocked (None: it can)."""
    if target.kind.name != "llvm":
        return f"the blocked layout is scheduled for llvm targets, not {target.kind.name}"
    facts = cpu_facts(target)
    if facts.isa not in BLOCKED_ISAS:
        return f"the blocked layout is scheduled for {', '.join(BLOCKED_ISAS)}, not {facts.isa}"
    if lowering.compute != CONV_FAMILY or lowering.input_shapes or lowering.out_shape is not None:
        return "not a plain conv2d group"
    attrs = lowering.attrs
    groups = attrs.get("groups", 1)
    w = lowering.constants[0]
    if groups != 1 and not (groups == int(w.shape[0]) and int(w.shape[1]) == 1):
        return "a grouped conv (the blocked convs take groups 1 or depthwise, one output channel per input channel)"
    shapes = [batch_shape(e) for e in lowering.inputs] + [out_shape]
    if any(s is None or len(s) != 4 or not all(isinstance(d, int) for d in s) for s in shapes):
        return "a symbolic or unknown shape"
    dtypes = {str(_tvm.expr_type(e).dtype) for e in lowering.inputs} | {str(c.dtype) for c in lowering.constants}
    if dtypes != {"float32"}:
        return f"dtypes {sorted(dtypes)}; the blocked conv takes float32"
    if len(lowering.inputs) == 2 and shapes[1] != out_shape:
        return "a residual broadcast to the output"
    block = facts.float32_lanes
    if shapes[0][1] % block or int(w.shape[0]) % block:
        return f"channels {shapes[0][1]} -> {int(w.shape[0])} are not whole blocks of {block}"
    tile_blocks = 1 if groups != 1 else int(w.shape[0]) // block  # a depthwise tile is one block
    if tile_of(tile_blocks, output_size(shapes[0], w.shape, attrs)[1], facts) is None:
        return "no tile of the output row"
    return None


def _composite_calls(func, lowered: dict) -> dict:
    """{binding var: call} of `func`'s top-level bindings whose call has a lowering in `lowered`."""
    out = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            if isinstance(binding, relax.VarBinding) and binding.value in lowered:
                out[binding.var] = binding.value
    return out


def _uses(func) -> dict:
    """{var: [the call or expression that reads it]} over `func`'s bindings and its result."""
    uses: dict = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            for v in relax.analysis.free_vars(binding.value):
                uses.setdefault(v, []).append(binding.value)
    for v in relax.analysis.free_vars(func.body.body):
        uses.setdefault(v, []).append(None)  # the function's result
    return uses


def plan_chains(func, lowered: dict, target) -> ChainPlan:
    """The chains of `func` (a Relax function): `lowered` is {composite call: (its Lowering in the call's
    variables, its output shape)} of every conv group; see the module docstring."""
    calls = _composite_calls(func, lowered)
    producer = {call: var for var, call in calls.items()}
    uses = _uses(func)
    chain = {call for call in calls.values() if blockable(*lowered[call], target) is None}
    while True:
        blocked = {var for var, call in calls.items()
                   if call in chain and uses.get(var) and all(u in chain for u in uses[var])}
        # chains: groups joined by the blocked tensors between them
        index = {call: i for i, call in enumerate(chain)}
        parent = list(range(len(index)))

        def root(i: int) -> int:
            while parent[i] != i:
                i = parent[i]
            return i

        for var in blocked:
            for reader in uses[var]:
                parent[root(index[calls[var]])] = root(index[reader])
        members: dict = {}
        for call, i in index.items():
            members.setdefault(root(i), []).append(call)
        dropped = set()
        for group in members.values():
            ends = sum(producer[call] not in blocked for call in group)
            if len(group) < 2 or ends > MAX_UNBLOCK_SHARE * len(group):
                dropped.update(group)
        if not dropped:
            return ChainPlan({call: producer[call] in blocked for call in chain})
        chain -= dropped
