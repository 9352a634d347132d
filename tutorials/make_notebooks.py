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


def main() -> None:
    nb = new_notebook(cells=COMPILE_RESNET50, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(nb, HERE / "01_compile_resnet50.ipynb")


if __name__ == "__main__":
    main()
