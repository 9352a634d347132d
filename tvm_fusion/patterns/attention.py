"""Scaled dot-product attention as one kernel (BERT, ViT, any encoder as torch.onnx exports it):

    matmul(softmax(matmul(q, kT) [/ c | * c] [+ mask], axis=-1), v)  ==>  attention(q, kT, v[, mask])

The scores, their softmax and the probabilities never go to memory: one launch instead of five (two
matmuls, the scale, the mask add, the softmax). q, kT, v are the runtime tensors the graph computes
(kT already transposed, as exporters write `K.transpose(-2, -1)`); the mask is any tensor that broadcasts
to the scores without changing their shape ((B, 1, 1, T) padding masks, (1, 1, S, T) causal masks), read
with NumPy broadcasting in the kernel. The scale is a scalar constant, carried as matched (divide or
multiply). Declines with the actual values: a mask that would broadcast the scores to another shape or
whose shape is not static, a softmax over another axis, matmuls whose batch dims differ (broadcast
batches), a scale that is not a scalar constant, other dtypes. Half q, kT, v (float16, bfloat16): the
scores, softmax and context are computed in float32 and the output rounded once.
"""

from __future__ import annotations

from tvm_fusion._tvm import dpl
from tvm_fusion.patterns.activations import scalar_constant
from tvm_fusion.patterns.priority import priority
from tvm_fusion.rules import Lowering, Match, Spec, commutative, decline, rule, symbolic_reason
from tvm_fusion.schedules.attention import ATTENTION_FAMILY

SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")  # half: computed in float32, rounded once


def attention_pattern() -> Spec:
    q, kt, v, mask, c = dpl.wildcard(), dpl.wildcard(), dpl.wildcard(), dpl.wildcard(), dpl.is_const()
    qk = dpl.is_op("relax.matmul")(q, kt)
    divide = dpl.is_op("relax.divide")(qk, c)
    multiply = commutative("relax.multiply", qk, c)
    scaled = divide | multiply | qk
    masked = commutative("relax.add", scaled, mask)
    softmax = dpl.is_op("relax.nn.softmax")(masked | scaled)
    root = dpl.is_op("relax.matmul")(softmax, v)
    ann = {"q": q, "kt": kt, "v": v, "qk": qk, "scale": c, "divide": divide, "multiply": multiply,
           "mask": mask, "masked": masked, "softmax": softmax, "root": root}
    return Spec(root, ann, lower_attention)


def _mask_broadcasts(mask_shape, scores) -> bool:
    if mask_shape is None or len(mask_shape) > len(scores):
        return False
    aligned = (1,) * (len(scores) - len(mask_shape)) + tuple(mask_shape)
    return all(m in (1, s) for m, s in zip(aligned, scores))


def attention_checks(m: Match):
    shapes = {name: m.shape(name) for name in ("q", "kt", "v", "qk", "root")}
    symbolic = next((name for name, s in shapes.items() if s is None), None)
    if symbolic:
        return decline(symbolic_reason(f"attention {symbolic}", m[symbolic], m.batch_dims))
    q, kt, v, scores = shapes["q"], shapes["kt"], shapes["v"], shapes["qk"]
    for name in ("q", "kt", "v", "root"):
        if m.dtype(name) not in SUPPORTED_DTYPES:
            return decline(f"attention {name} dtype is {m.dtype(name)}; the compute supports "
                           f"{', '.join(SUPPORTED_DTYPES)}")
    if not (len(q) == len(kt) == len(v) and len(q) in (3, 4)):
        return decline(f"q, kT, v have shapes {q}, {kt}, {v}; expected all rank 3 or all rank 4")
    if not (q[:-2] == kt[:-2] == v[:-2]):
        return decline(f"q, kT, v have batch dims {q[:-2]}, {kt[:-2]}, {v[:-2]}; the compute takes equal batch "
                       "dims (no broadcast between them)")
    axis = int(m.attrs("softmax").axis) % len(scores)
    if axis != len(scores) - 1:
        return decline(f"softmax is over axis {axis}; attention needs the last axis ({len(scores) - 1}), the keys")
    if "divide" in m or "multiply" in m:
        if scalar_constant(m["scale"]) is None:
            return decline(f"the scores' scale has shape {m.shape('scale')}; expected a scalar constant")
    if "masked" in m:
        mask = m.shape("mask")
        if not _mask_broadcasts(mask, scores) or m.shape("masked") != scores:
            return decline(f"mask has shape {mask}; expected a static shape that broadcasts to the scores {scores} "
                           "without changing them (each dim 1 or equal)")
        if m.dtype("mask") != m.dtype("qk"):
            return decline(f"mask dtype is {m.dtype('mask')}; expected {m.dtype('qk')}")
    return None


def _rank4(shape) -> tuple:
    return (1,) * (4 - len(shape)) + tuple(shape)


def lower_attention(m: Match) -> Lowering:
    names = ["q", "kt", "v"] + (["mask"] if "masked" in m else [])
    shapes = [m.shape(name) for name in names]  # the batch may stay symbolic (the checks bound the rest)
    views = {i: _rank4(s) for i, s in enumerate(shapes) if len(s) != 4}
    scale_op = "divide" if "divide" in m else "multiply" if "multiply" in m else None
    out = m.shape("root")
    return Lowering(
        compute=ATTENTION_FAMILY,
        inputs=[m[name] for name in names],
        constants=[],
        attrs=dict(scale=scalar_constant(m["scale"]) if scale_op else None, scale_op=scale_op),
        input_shapes=views,
        out_shape=out if len(out) != 4 else None,
    )


@rule("attention", priority=priority("attention"), check=attention_checks)
def attention():
    """matmul(softmax(matmul(q, kT) [/ c | * c] [+ mask]), v)  ==>  attention(q, kT, v[, mask])"""
    return attention_pattern()
