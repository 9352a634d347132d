"""The deploy stage: an executable out as a library others load.

`compile` is the whole path (import, fuse, build, verify, export) and writes the library's manifest; `export`
writes the shared library (`cuda_binary`: the CUDA module inside it; `thread_pool.c` is linked into every
library); `bundle` packs a library with the TVM runtime alone (`bundle_run.py` runs it there). The runtime that
loads a library is `tvm_fusion.runtime`, which imports nothing of the compiler.
"""
