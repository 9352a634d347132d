"""The CPU schedules of what the fused build leaves to TVM's default lowering, as one dlight pass in order.

The kernels no rule took and TVM leaves unscheduled: copies and elementwise maps vectorized (`injective.py`),
transposed convolutions (`conv_transpose.py`), softmax / log_softmax rows (`softmax.py`), 2-D max / average pools
(`pooling.py`), reductions that run in vectors (`reduction.py`), means over trailing axes (`plane_sum.py`); then
every other kernel: parallel outer loops, a vector (or chains) of outputs, reductions in TVM's order
(`fallback.py`). The build's pipeline takes this pass for an llvm target (build.pipeline.LEFTOVER_SCHEDULES).
"""

from tvm_fusion._tvm import dlight
from tvm_fusion.schedules.llvm.conv_transpose import LeftoverConvTranspose
from tvm_fusion.schedules.llvm.fallback import LeftoverFallback
from tvm_fusion.schedules.llvm.injective import LeftoverInjective
from tvm_fusion.schedules.llvm.plane_sum import LeftoverPlaneSum
from tvm_fusion.schedules.llvm.pooling import LeftoverPool
from tvm_fusion.schedules.llvm.reduction import LeftoverReduction
from tvm_fusion.schedules.llvm.softmax import LeftoverSoftmax

__all__ = ["leftover_schedule"]


def leftover_schedule():
    """A fresh dlight pass with the CPU's leftover rules, first match wins."""
    return dlight.ApplyDefaultSchedule(LeftoverInjective(), LeftoverConvTranspose(), LeftoverSoftmax(), LeftoverPool(),
                                     LeftoverReduction(), LeftoverPlaneSum(), LeftoverFallback())
