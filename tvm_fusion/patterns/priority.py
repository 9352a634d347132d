"""The priorities of the built-in rules, in one table.

Convention (one, everywhere; see tvm_fusion/rules.py): a HIGHER priority wins an overlap, and equal
priorities keep registration order. A built-in rule's priority is its tier plus its rank within the tier:

    priority(conv2d_bn_relu)        = TIERS["conv2d_bn_<act>"] + ACTIVATION_RANK["relu"]   = 300
    priority(conv2d_silu_add)       = TIERS["conv2d_<act>_add"] + ACTIVATION_RANK["silu"]  = 358
    priority(conv2d_bn)             = TIERS["conv2d_bn"]                                   = 200
    priority(elementwise_chain_4)   = TIERS["elementwise_chain_<n>"] + 4                   = 64

A tier that takes more of the graph sits higher, so the larger match wins (BN + residual add before BN
before a bias before the bare op). Within a tier, an activation that contains another goes first
(hardswish contains hardsigmoid, silu contains sigmoid), and a longer chain before a shorter one. The
families never match the same root, but their tiers are kept apart all the same, so that no two built-in
rules share a priority (`tvm-fusion rules` prints this table under the rules).
"""

from __future__ import annotations

__all__ = ["ACTIVATION_RANK", "TIERS", "convention", "priority"]

#: within an activated tier: activations that contain another first (a fake quantization may hold any other)
ACTIVATION_RANK = {"fake_quant": 10, "hardswish": 9, "silu": 8, "gelu_tanh": 7, "gelu_erf": 6, "hardsigmoid": 5,
                   "relu6": 4, "leaky_relu": 3, "sigmoid": 2, "tanh": 1, "relu": 0}

#: tier -> base priority, highest first; `<act>`: + ACTIVATION_RANK (0-10), `<n>`: + the chain length (3-6)
TIERS = {
    "attention": 600,
    "squeeze_excite_<act>_hardsigmoid": 580,  # above every conv rule, which would take its two 1x1 convs
    "squeeze_excite_<act>_sigmoid": 570,
    # conv -> epilogue -> pool (patterns/conv_pool.py): above every conv rule (which would take its conv), below
    # squeeze-excite (whose GlobalAveragePool of a conv's output is no conv -> pool chain: taken first, it is
    # not tried, and explain lists no decline for it)
    "conv2d_bn_<act>_pool": 550,
    "conv2d_bn_pool": 549,
    "conv2d_<act>_pool": 530,
    "conv2d_pool": 529,
    # pointwise -> depthwise (patterns/pointwise_depthwise.py): above the conv rules, each of which would take
    # one of its two convs, and the depthwise -> pointwise rules (the shapes where either kernel fuses do not
    # meet: a depthwise conv is one or the other's). Both halves have the one <act> (ranks 0, 4, 8, 9): the two
    # tiers 6 apart keep every priority distinct
    "pointwise_bn_<act>_depthwise_bn_<act>": 516,
    "pointwise_<act>_depthwise_<act>": 510,
    # depthwise -> pointwise (patterns/depthwise_pointwise.py): above the conv rules, each of which would take
    # one of its two convs; the pointwise epilogue that takes more first. <act> is the depthwise activation
    # (ranks 0, 4, 8, 9): the two tiers of a pair 2 apart and the pairs 12 apart keep every priority distinct
    "depthwise_bn_<act>_pointwise_bn_add": 500,
    "depthwise_<act>_pointwise_add": 498,
    "depthwise_bn_<act>_pointwise_bn_relu6": 488,
    "depthwise_<act>_pointwise_relu6": 486,
    "depthwise_bn_<act>_pointwise_bn_relu": 476,
    "depthwise_<act>_pointwise_relu": 474,
    "depthwise_bn_<act>_pointwise_bn": 464,
    "depthwise_<act>_pointwise": 462,
    "conv2d_bn_<act>_add": 450,
    "conv2d_bn_add_<act>": 400,
    "conv2d_<act>_add": 350,
    "conv2d_bn_<act>": 300,
    "conv2d_bn_add": 299,
    "conv2d_add_<act>": 250,
    "conv2d_bn": 200,
    "conv2d_bias_<act>": 160,
    "conv2d_add": 155,
    "conv2d_<act>": 140,
    "dense_bn_<act>": 129,
    "dense_bn": 128,
    "dense_scale": 125,
    "dense_bias_<act>": 111,
    "dense_bias": 110,
    "dense_<act>": 99,
    "batch_matmul_<act>": 95,  # below every dense rule: a constant 2-D B is theirs
    "batch_matmul": 93,
    "add_layer_norm": 90,
    "layer_norm": 80,
    "elementwise_chain_<n>": 60,
    "conv2d_bias": 50,
    "add_relu": 45,
    "conv2d": 40,
    "fake_quant": 30,
}


def priority(tier: str, within: str | int | None = None) -> int:
    """TIERS[tier] plus the rank within it: an activation's ACTIVATION_RANK, or a number (a chain's length)."""
    return TIERS[tier] + (ACTIVATION_RANK[within] if isinstance(within, str) else within or 0)


def convention() -> str:
    """The table as `tvm-fusion rules` prints it under the rules."""
    return "\n".join([
        "priority = tier + rank within the tier; a higher priority wins an overlap, equal priorities keep "
        "registration order (tvm_fusion/patterns/priority.py)",
        "tiers: " + ", ".join(f"{t} {p}" for t, p in TIERS.items()),
        "<act> ranks (an activation containing another first): "
        + ", ".join(f"{a} {r}" for a, r in ACTIVATION_RANK.items()) + "; <n>: the chain length",
    ])
