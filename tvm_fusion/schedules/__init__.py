"""Built-in TE computes (this package) and their schedules per target (`cuda/`, `llvm/`).

`load()` imports them in a fixed order; registration happens in those imports, once.
"""

import importlib

from tvm_fusion._tvm import tirx

MODULES = (
    "tvm_fusion.schedules.llvm.fast_math",
    "tvm_fusion.schedules.conv2d",
    "tvm_fusion.schedules.conv3d",
    "tvm_fusion.schedules.dense",
    "tvm_fusion.schedules.elementwise",
    "tvm_fusion.schedules.layer_norm",
    "tvm_fusion.schedules.llvm.conv2d",
    "tvm_fusion.schedules.llvm.dense",
    "tvm_fusion.schedules.cuda.conv2d",
    "tvm_fusion.schedules.llvm.conv3d",
    "tvm_fusion.schedules.cuda.conv3d",
    "tvm_fusion.schedules.cuda.dense",
    "tvm_fusion.schedules.llvm.elementwise",
    "tvm_fusion.schedules.cuda.elementwise",
    "tvm_fusion.schedules.llvm.layer_norm",
    "tvm_fusion.schedules.cuda.layer_norm",
    "tvm_fusion.schedules.squeeze_excite",
    "tvm_fusion.schedules.llvm.squeeze_excite",
    "tvm_fusion.schedules.cuda.squeeze_excite",
    "tvm_fusion.schedules.attention",
    "tvm_fusion.schedules.batch_matmul",
    "tvm_fusion.schedules.llvm.batch_matmul",
    "tvm_fusion.schedules.cuda.batch_matmul",
    "tvm_fusion.schedules.llvm.attention",
    "tvm_fusion.schedules.cuda.attention",
)


def dims(shape) -> list:
    """A TE shape as ints, except a symbolic dim (a symbolic batch: the outermost), which stays a PrimExpr."""
    return [int(d) if isinstance(d, (int, tirx.IntImm)) else d for d in shape]


def load() -> None:
    for name in MODULES:
        importlib.import_module(name)
