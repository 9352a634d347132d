"""The check stage: is the fused build right, and why did a rule fire or not.

`io` draws and loads inputs and runs onnxruntime (the reference) and a built module; `numerics` is the dtype
tolerance table and the verdict; `reference` measures how far two correct references differ; `verify` checks a
compiled library; `compare` builds unfused / TVM / fused and compares them; `differential` checks each fused group
against its unfused subgraph and bisects rules; `explain` says what each rule did; `half_reference` is the
float16 / bfloat16 baseline; `backend` is the ONNX backend interface (the conformance suite runs through it).
"""
