"""The fusion stage: a Relax module in, the same module with fused groups (one TE compute each) out.

`loader` gathers the rule set (the built-in tables of `tvm_fusion.patterns`, installed plugins, rule files);
`fuse` matches the rules and rewrites the matched groups; `trace` records every decision for `explain`.
The rule API (`tvm_fusion.rules`) and the compute / schedule registry (`tvm_fusion.registry`) sit below every
stage; the kernels (`tvm_fusion.schedules`) too, since the frontend's recurrence kernel uses them.
"""
