"""The build stage: a (fused) Relax module in, an executable out.

`builder` resolves the target and builds one of three ways (`build`); `pipeline` is the Relax pass list per
target, `unscheduled` finds kernels no schedule took, `tune` tunes with MetaSchedule, `cuda_graph` captures a
CUDA build's calls in a graph, `cuda_compiler` compiles CUDA C (nvcc or NVRTC), and `mixed_precision` converts a
model to float16 / bfloat16 before it is fused. `tvm_fusion.build` is callable as `build`.
"""

from tvm_fusion.build.builder import (TARGET_FORMS, Built, build, check_arch, count_kernel_calls, default_cpu_target,
                                      default_rules, legalize, legalize_traced, parse_target, resolve_target)

__all__ = ["Built", "build", "legalize", "legalize_traced", "resolve_target", "parse_target", "default_cpu_target",
           "TARGET_FORMS", "check_arch", "count_kernel_calls", "default_rules"]
