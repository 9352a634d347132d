"""tvm_fusion: pattern-based operator fusion for Apache TVM (Relax graph IR, TE computes).

    mod = tvm_fusion.import_onnx("model.onnx")
    fused = tvm_fusion.fuse(mod, target="llvm")          # module + per-rule counts
    built = tvm_fusion.build(mod, target="cuda", mode="fused")
    report = tvm_fusion.compare("model.onnx", target="llvm")
"""
