"""Writes the tutorial notebooks from the cell lists below (run it after editing; the tests execute them).

    python tutorials/make_notebooks.py [NAME.ipynb ...]      (default: all of them)
"""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).parent

COMPILE_RESNET50 = [
    new_markdown_cell("""# Compile ResNet-50 into a fused CUDA library

This tutorial takes the ResNet-50 that ships inside the `onnx` wheel, gives it seeded random weights
(realistic scales, calibrated BatchNorm statistics), and

1. imports it into TVM's **Relax** graph IR (Relay was removed from Apache TVM in v0.20),
2. fuses `conv2d -> batch_norm -> [add] -> relu` chains with tvm_fusion's pattern table,
3. builds a CUDA library (compiled with nvcc into a fatbin: no compiler needed where it is loaded),
4. looks at the fused groups and the generated CUDA of a `conv2d_bn_relu` kernel,
5. compares the fused build against the unfused build and onnxruntime on the CPU.

No GPU is needed to run it: CUDA code is generated and compiled here; numerics run on the CPU (`llvm`)."""),
    new_code_cell("""import json
import tempfile
from pathlib import Path

import tvm_fusion as tf

model_path = tf.example_path("resnet50", seed=0)  # generated once, then cached
print(model_path)"""),
    new_markdown_cell("## 1-2. Import and fuse\n`fuse` returns the rewritten module and per-rule counts."),
    new_code_cell("""mod = tf.import_onnx(model_path)
fused = tf.fuse(mod, target="llvm")
print({rule: n for rule, n in fused.counts.items() if n})
for group in fused.groups[:4]:
    print(group.rule, group.function, group.onnx_nodes, group.attrs)"""),
    new_markdown_cell("Every `conv2d` of ResNet-50 (53 of them) landed in a rule:"),
    new_code_cell("""assert sum(n for rule, n in fused.counts.items() if rule.startswith("conv2d")) == 53
print(fused.mod["main"].script()[:1200])"""),
    new_markdown_cell("## 3. Build and export the CUDA library (default arch sm_90)"),
    new_code_cell("""out = Path(tempfile.mkdtemp()) / "resnet50_fused.so"
result = tf.compile(model_path, out, target="cuda", arch="sm_90")
print(result)
manifest = json.loads(result.manifest_path.read_text())
print(manifest["builds"])
print(json.dumps(manifest["groups"][0], indent=1))"""),
    new_markdown_cell("""## 4. The generated CUDA of a conv2d_bn_relu kernel
The kernel is named after the rule, so it traces back to the rule and (via the manifest) to the ONNX nodes."""),
    new_code_cell("""import re

from tvm_fusion.build.cuda_compiler import cuda_source

built = tf.build(mod, target="cuda", mode="fused")
source = cuda_source(built.executable)
definition = re.search(r'extern "C" __global__ void[^;{]*\\bconv2d_bn_relu_kernel\\([^;{]*\\{', source)
print(source[definition.start():definition.start() + 3000])"""),
    new_markdown_cell("""## 5. Compare fused, unfused, TVM's default fusion and onnxruntime on the CPU
`compare` runs all builds on the same seeded inputs, reports the error of fused against the unfused build
and against onnxruntime (from the tolerance table keyed by dtype), kernel counts and median latencies."""),
    new_code_cell("""report = tf.compare(model_path, target="llvm", repeat=3)
print(report)
assert report.ok"""),
]


RULE_WITH_A_BUG = '''%%writefile my_rules.py
"""conv2d(stride 2) -> batch_norm -> relu  ==>  conv2d_bn_relu(x, W', b')   (a kernel for stride 2)"""
import numpy as np

from tvm_fusion import decline, rule
from tvm_fusion.patterns.conv_epilogue import conv_checks, conv_epilogue


def stride_two(match):
    strides = tuple(int(v) for v in match.attrs("conv").strides)
    if strides != (2, 2):
        return decline(f"strides are {strides}; this rule is for (2, 2)")
    return conv_checks(match)


def lower(match):
    low = conv_epilogue(bn=True, activation="relu").lower(match)
    low.constants[1] = np.zeros_like(low.constants[1])  # BUG: "ResNet convs have no bias", but the folded
    return low                                          # bias b' = b * s + t carries the BatchNorm shift


@rule("conv2d_bn_relu_s2", priority=1000, check=stride_two)
def conv2d_bn_relu_s2():
    """conv2d(stride 2) -> batch_norm -> relu  ==>  conv2d_bn_relu(x, W', b')"""
    spec = conv_epilogue(bn=True, activation="relu")
    return type(spec)(spec.pattern, spec.annotations, lower)'''

FIND_A_WRONG_RULE = [
    new_markdown_cell("""# Find the rule that broke a model

You wrote a fusion rule, the model's outputs are off, and the model has 54 fused groups. Which one?

1. write a rule file (with a realistic bug) and load it next to the built-in table,
2. see the whole-model `compare` fail, as it must (exit status 1 on the command line),
3. `check_groups` (`tvm-fusion compare --per-group`): every fused group runs alone on the *true* values of
   its inputs, taken from the unfused build, and is compared with its own original ops; the error of
   one group cannot leak into the next, so the first group over tolerance is the culprit,
4. `bisect` (`--bisect`): disable the blamed rule, rebuild, check the whole model again.

Everything runs on the CPU (`llvm`)."""),
    new_markdown_cell("A rule for stride-2 convolutions, written into `my_rules.py` (see `patterns/README.md`):"),
    new_code_cell(RULE_WITH_A_BUG),
    new_code_cell("""import tvm_fusion as tf

model_path = tf.example_path("resnet50", seed=0)
rules = tf.rules(["my_rules.py"])  # the built-in table plus the new rule
print(rules["conv2d_bn_relu_s2"].doc)"""),
    new_markdown_cell("## 1. The new rule fires, and the model is wrong"),
    new_code_cell("""fused = tf.fuse(tf.import_onnx(model_path), target="llvm", rules=rules)
print({rule: n for rule, n in fused.counts.items() if n})

report = tf.compare(model_path, target="llvm", rules=rules, modes=("unfused", "fused"), repeat=1)
print(report)
assert not report.ok"""),
    new_markdown_cell("""## 2. Which group? The per-group check
Each row is one fused group in execution order: its rule, the ONNX nodes it replaced, and its error
against its own unfused ops on the same (true) inputs."""),
    new_code_cell("""groups = tf.check_groups(model_path, target="llvm", rules=rules)
print(groups)
print()
print(groups.first_failure())
assert {g.rule for g in groups.failing} == {"conv2d_bn_relu_s2"}"""),
    new_markdown_cell("""Only the new rule's groups fail. The built-in groups after them pass, because each one is fed the
true values of its inputs, not the wrong values the broken groups produced.

## 3. Bisect: disable the blamed rule, rebuild, check again"""),
    new_code_cell("""result = tf.bisect(model_path, target="llvm", rules=rules)
print(result.verdict)
assert result.culprits == ["conv2d_bn_relu_s2"]"""),
    new_markdown_cell("""The same from the command line:

```bash
tvm-fusion compare --example resnet50 --rules my_rules.py --per-group   # exit 1, names the group
tvm-fusion compare --example resnet50 --rules my_rules.py --bisect      # exit 1, names the rule
tvm-fusion compare --example resnet50 --rules my_rules.py --disable conv2d_bn_relu_s2   # passes
```

The fix is to delete the line marked BUG: `low.constants[1]` is the folded bias `b' = b * s + t`."""),
]

WHY_FUSION_IS_EXACT = [
    new_markdown_cell("""# Why fusion is exact: folding BatchNorm into a convolution

The method starts here. At inference, BatchNorm is an affine map per channel with *fixed* statistics, so
`Conv -> BatchNorm -> ReLU` is one convolution with new weights followed by ReLU:

    BN(conv(x, W) + b) = gamma * (conv(x, W) + b - mu) / sigma + beta       sigma = sqrt(var + eps)
                       = conv(x, W') + b'      W' = gamma / sigma * W,   b' = gamma / sigma * (b - mu) + beta

1. check it with numpy (float64): the two sides agree to rounding;
2. see it fail in training mode, where mu and var are the batch's own statistics;
3. find W' and b' among the constants of the kernel tvm_fusion built;
4. count the bytes and launches the fusion removed."""),
    new_code_cell("""import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

rng = np.random.default_rng(0)
x = rng.standard_normal((2, 3, 8, 8))             # a batch of 2, 3 channels, 8x8
W = rng.standard_normal((4, 3, 3, 3)) * 0.3       # 4 output channels, 3x3 kernels
b = rng.standard_normal(4) * 0.1
gamma, beta = rng.uniform(0.5, 1.5, 4), rng.normal(0, 0.1, 4)
mu, var, eps = rng.normal(0, 0.5, 4), rng.uniform(0.5, 2.0, 4), 1e-5


def conv(x, W, b):
    \"\"\"2-D convolution, stride 1, padding 1 (NCHW input, OIHW weights).\"\"\"
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = sliding_window_view(xp, W.shape[2:], axis=(2, 3))  # N, C, H, W, kh, kw
    return np.einsum("nchwij,ocij->nohw", windows, W) + b[None, :, None, None]


def bn(y, mean, variance):
    c = lambda v: v[None, :, None, None]  # noqa: E731 - per channel
    return c(gamma) * (y - c(mean)) / np.sqrt(c(variance) + eps) + c(beta)


def relu(y):
    return np.maximum(y, 0)


three_ops = relu(bn(conv(x, W, b), mu, var))"""),
    new_markdown_cell("## 1. Fold by hand: one convolution, the same numbers"),
    new_code_cell("""s = gamma / np.sqrt(var + eps)
W_folded = W * s[:, None, None, None]
b_folded = s * (b - mu) + beta
one_op = relu(conv(x, W_folded, b_folded))
error = np.abs(one_op - three_ops).max()
print(f"max |fused - three ops| = {error:.2e}   (float64 rounding)")
assert error < 1e-12"""),
    new_markdown_cell("""## 2. Training mode: the identity does not hold
In training mode BatchNorm normalises with the statistics of the batch it sees. They depend on the input,
so no fixed W', b' can stand for them: the same image gives other outputs in another batch."""),
    new_code_cell("""y = conv(x, W, b)
training = relu(bn(y, y.mean(axis=(0, 2, 3)), y.var(axis=(0, 2, 3))))
print(f"folded (running statistics) vs training mode (batch statistics): {np.abs(one_op - training).max():.3f}")
y0 = conv(x[:1], W, b)  # the first image alone: a batch of one
alone = relu(bn(y0, y0.mean(axis=(0, 2, 3)), y0.var(axis=(0, 2, 3))))
print(f"first image, in a batch of 2 vs alone: {np.abs(alone - training[:1]).max():.3f}")
assert np.abs(one_op - training).max() > 0.1"""),
    new_markdown_cell("""tvm_fusion's BatchNorm rules check for this: a `BatchNormalization` in training mode is declined with
the reason "batch_norm is in training mode", and `explain` shows it.

## 3. The same W', b' inside the kernel tvm_fusion built
The model as ONNX, in float32, fused for the CPU:"""),
    new_code_cell("""import onnx
from onnx import TensorProto, helper, numpy_helper

import tvm_fusion as tf
from tvm_fusion._tvm import constant_value, is_constant, relax

inits = [numpy_helper.from_array(v.astype(np.float32), name) for v, name in
         [(W, "W"), (b, "b"), (gamma, "gamma"), (beta, "beta"), (mu, "mean"), (var, "var")]]
nodes = [helper.make_node("Conv", ["x", "W", "b"], ["y"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("BatchNormalization", ["y", "gamma", "beta", "mean", "var"], ["z"], name="bn",
                          epsilon=eps),
         helper.make_node("Relu", ["z"], ["out"], name="relu")]
graph = helper.make_graph(nodes, "conv_bn_relu",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 4, 8, 8])], inits)
onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "conv_bn_relu.onnx")

fused = tf.fuse(tf.import_onnx("conv_bn_relu.onnx"), target="llvm")
print(fused.groups)
print(fused.mod["main"].script())"""),
    new_markdown_cell("""The fused kernel is one `call_tir` whose constant operands are the folded weights and bias. On the
CPU, W' was also packed once at compile time into the layout the kernel reads: `[O'/B, C, KH, KW, B]`,
blocks of B output channels innermost (B from the target's vector width, so it differs between an AVX2 and
an AVX-512 machine; with AVX2 the taps come first, `[O'/B, KH, KW, C, B]`) and the channels padded with
zeros to the kernel's tile. Undo the packing to compare:"""),
    new_code_cell("""from tvm_fusion.build.builder import resolve_target
from tvm_fusion.schedules.llvm.conv2d import packs_taps_first

constants = []


def collect(expr):
    if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.call_tir":
        constants.extend(constant_value(a) for a in expr.args[1].fields if is_constant(a))


relax.analysis.post_order_visit(fused.mod["main"], collect)
W_kernel, b_kernel = constants
print("W' shape in the kernel", W_kernel.shape, " b' shape", b_kernel.shape)
if W_kernel.ndim == 5:  # packed: [O'/B, C, KH, KW, B] -> [O', C, KH, KW], then the zero padding dropped
    if packs_taps_first(resolve_target("llvm")):  # [O'/B, KH, KW, C, B] -> [O'/B, C, KH, KW, B]
        W_kernel = W_kernel.transpose(0, 3, 1, 2, 4)
    blocks, cin, kh, kw, B = W_kernel.shape
    W_kernel = W_kernel.transpose(0, 4, 1, 2, 3).reshape(blocks * B, cin, kh, kw)
    assert not W_kernel[len(W_folded):].any(), "the padding channels hold zeros"
    W_kernel = W_kernel[:len(W_folded)]
print(f"max |W' kernel - W' by hand| = {np.abs(W_kernel - W_folded).max():.1e}")
print(f"max |b' kernel - b' by hand| = {np.abs(b_kernel.reshape(-1) - b_folded).max():.1e}   (float32)")
assert np.allclose(W_kernel, W_folded, atol=1e-6) and np.allclose(b_kernel.reshape(-1), b_folded, atol=1e-6)"""),
    new_markdown_cell("""## 4. What the fusion removed
`profile` builds the model unfused (one kernel per op) and fused, times every kernel and models the
memory traffic: each intermediate that no longer goes to memory saves one write and one read."""),
    new_code_cell("""report = tf.profile("conv_bn_relu.onnx", repeat=3)
group = report.groups[0]
for t in group.intermediates:
    print(f"intermediate {t['name']:10s} {t['shape']} {t['dtype']}: {t['bytes']} bytes")
print(f"{group.rule}: {group.before_launches} kernels -> {group.after_launches}, "
      f"{group.bytes_saved} bytes of traffic saved")
print(report.summary())
assert group.launches_removed == group.before_launches - 1
assert group.bytes_saved == 2 * sum(t["bytes"] for t in group.intermediates)"""),
]

CHAIN_MODEL = """import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(0)
inits = [numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32), "W"),
         numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np.float32), "B"),
         numpy_helper.from_array(np.array(0.5, np.float32), "half"),
         numpy_helper.from_array(np.array(0.25, np.float32), "quarter")]
layers = [("Conv", ["x", "W", "B"], "c"), ("Relu", ["c"], "r"), ("Abs", ["r"], "a"), ("Sin", ["a"], "s"),
          ("Cos", ["s"], "k"), ("Mul", ["k", "half"], "m"), ("Add", ["m", "quarter"], "p"), ("Tanh", ["p"], "y")]
nodes = [helper.make_node(op, ins, [out], name=op.lower(), **({"pads": [1, 1, 1, 1]} if op == "Conv" else {}))
         for op, ins, out in layers]
shape = [1, 8, 32, 32]
graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "chain.onnx")"""

CHAIN_RULE = '''%%writefile chain_rules.py
"""abs -> sin -> cos  ==>  abs_sin_cos(x)   (one pass over the tensor instead of three)"""
from tvm_fusion import Lowering, Spec, register_compute, register_schedule, rule
from tvm_fusion._tvm import dpl, topi
from tvm_fusion.schedules.llvm.elementwise import schedule_elementwise_llvm


@register_compute("abs_sin_cos")
def abs_sin_cos_compute(x, **_):
    return topi.cos(topi.sin(topi.abs(x)))


register_schedule("abs_sin_cos", target="llvm")(schedule_elementwise_llvm)  # inline, fuse loops, vectorize


@rule("abs_sin_cos", priority=70, targets=("llvm",))
def abs_sin_cos():
    """abs -> sin -> cos  ==>  abs_sin_cos(x)"""
    x = dpl.wildcard()
    a = dpl.is_op("relax.abs")(x)
    s = dpl.is_op("relax.sin")(a)
    c = dpl.is_op("relax.cos")(s)
    return Spec(c, {"x": x, "abs": a, "sin": s, "root": c},
                lambda m: Lowering(compute="abs_sin_cos", inputs=[m["x"]], constants=[]))'''

PROFILE_THEN_FUSE = [
    new_markdown_cell("""# Profile, then fuse

The way of working: profile the model first; see where the time and the memory traffic go and which
chains of small elementwise ops run unfused; write a rule for one; see it fire in `explain`; profile
again to see what data locality bought.

The model: `Conv -> Relu -> Abs -> Sin -> Cos -> Mul -> Add -> Tanh`. The built-in table fuses
`conv2d_bias_relu` and `elementwise_chain_3` (Mul, Add, Tanh), but no rule covers Abs, Sin and Cos."""),
    new_code_cell(CHAIN_MODEL),
    new_markdown_cell("## 1. Profile"),
    new_code_cell("""from IPython.display import HTML, SVG, display

import tvm_fusion as tf
from tvm_fusion.profile.html import graph_svg, time_chart_svg

before = tf.profile("chain.onnx", repeat=5)
print(before)"""),
    new_markdown_cell("""The graph as the HTML report draws it: each fused group one box coloured by its rule; the candidate
chain outlined in red (hover for the reasons)."""),
    new_code_cell("""svg, why = graph_svg(before)
display(SVG(svg) if svg else why)"""),
    new_markdown_cell("## 2. The candidate list names the chain"),
    new_code_cell("""chain = next(c for c in before.candidates if c.kind == "elementwise chain")
print(chain.onnx_nodes, chain.ops)
print("\\n".join(chain.reasons))
print(f"estimated saving: {chain.bytes_saved} bytes, {chain.launches_saved} launches")
assert chain.onnx_nodes == ["abs", "sin", "cos"]"""),
    new_markdown_cell("""## 3. A rule for it
A pattern, a TE compute and a schedule (the built-in elementwise CPU schedule: inline every stage,
fuse the loops, vectorize). See `patterns/README.md` for the rest of the rule API."""),
    new_code_cell(CHAIN_RULE),
    new_code_cell("""rules = tf.rules(["chain_rules.py"])  # the built-in table plus the new rule
print(tf.explain("chain.onnx", rules=rules))"""),
    new_markdown_cell("## 4. Profile again"),
    new_code_cell("""after = tf.profile("chain.onnx", rules=rules, repeat=5)
print(after)
new = next(g for g in after.groups if g.rule == "abs_sin_cos")
print(f"abs_sin_cos: {new.before_launches} kernels -> 1, {new.bytes_saved} bytes saved; "
      f"{new.before_s * 1e3:.3f} ms -> {new.after_s * 1e3:.3f} ms")
print("before:", before.summary())
print("after: ", after.summary())
assert not [c for c in after.candidates if c.kind == "elementwise chain"]
assert after.bytes_saved > before.bytes_saved"""),
    new_code_cell("""display(HTML(time_chart_svg(after)))"""),
    new_markdown_cell("""The fused build still matches onnxruntime, and the report is one page:

```bash
tvm-fusion compare chain.onnx --rules chain_rules.py
tvm-fusion profile chain.onnx --rules chain_rules.py --html report.html
```"""),
    new_code_cell("""report = tf.compare("chain.onnx", rules=rules, modes=("unfused", "fused"), repeat=1)
assert report.ok
after.write_html("report.html")
print("fused is within tolerance; wrote report.html")"""),
]

NOTEBOOKS = {"00_why_fusion_is_exact.ipynb": WHY_FUSION_IS_EXACT, "01_compile_resnet50.ipynb": COMPILE_RESNET50,
             "02_find_a_wrong_rule.ipynb": FIND_A_WRONG_RULE, "03_profile_then_fuse.ipynb": PROFILE_THEN_FUSE}
#: written with their outputs (tables, pictures): a reader of the repository sees the results without running
WITH_OUTPUTS = tuple(NOTEBOOKS)


def main(names=()) -> None:
    """Write the notebooks `names` (default: all); those in WITH_OUTPUTS are executed first."""
    import tempfile

    from nbclient import NotebookClient

    for name in names or NOTEBOOKS:
        nb = new_notebook(cells=NOTEBOOKS[name], metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
        if name in WITH_OUTPUTS:
            with tempfile.TemporaryDirectory() as tmp:
                NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": tmp}}).execute()
        nbformat.write(nb, HERE / name)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
