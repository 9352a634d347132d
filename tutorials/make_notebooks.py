"""Writes the tutorial notebooks from the cell lists below (run it after editing; the tests execute them)."""

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

from tvm_fusion.export import cuda_source

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

NOTEBOOKS = {"01_compile_resnet50.ipynb": COMPILE_RESNET50, "02_find_a_wrong_rule.ipynb": FIND_A_WRONG_RULE}


def main() -> None:
    for name, cells in NOTEBOOKS.items():
        nb = new_notebook(cells=cells, metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
        nbformat.write(nb, HERE / name)


if __name__ == "__main__":
    main()
