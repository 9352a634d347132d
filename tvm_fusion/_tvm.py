"""The one module with version-specific Apache TVM imports (tested against apache-tvm 0.27).

Everything else in tvm_fusion imports TVM names from here, so a TVM upgrade touches one file.
"""

from __future__ import annotations

import os

# TVM's CPU thread pool halves the core count on x86 (to skip hyper-threads) and reads TVM_NUM_THREADS only
# when it starts: on a 2-vCPU machine it would run every parallel kernel on one thread. Use every core
# this process may run on, unless the user chose otherwise.
os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))

import tvm  # noqa: E402
import tvm_ffi  # noqa: E402
from tvm import relax, te, topi  # noqa: E402,F401  (re-exported)
from tvm.ir import GenericConst  # relax constants in 0.27
from tvm.relax import dpl  # noqa: F401
from tvm.relax.backend.cpu_generic import pipeline as cpu_pipeline
from tvm.relax.backend.cuda import pipeline as cuda_pipeline
from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter
from tvm.relax.transform import FusionPattern, PatternCheckContext  # noqa: F401
from tvm.runtime import _ffi_api as runtime_ffi
from tvm.s_tir import Schedule  # noqa: F401
from tvm.s_tir import dlight  # noqa: F401
from tvm.s_tir.analysis import verify_gpu_code  # noqa: F401
from tvm.support import nvcc  # noqa: F401
from tvm import tirx  # noqa: F401

TVM_VERSION = tvm.__version__

#: the TVM backend pipeline module for each target kind we build for
BACKEND_PIPELINES = {"cuda": cuda_pipeline, "llvm": cpu_pipeline}

#: attribute that stops dlight / MetaSchedule from rescheduling a PrimFunc
SCHEDULED_ATTR = "tirx.is_scheduled"
#: op_pattern value for "opaque": FuseOps leaves such a PrimFunc alone
OPAQUE = 8


def tensor_type(shape, dtype: str) -> relax.TensorType:
    return relax.TensorType(shape, dtype)


def expr_type(expr):
    return expr.ty


def is_constant(expr) -> bool:
    return isinstance(expr, GenericConst)


def constant_value(expr):
    """numpy value of a relax constant."""
    return expr.value.numpy()


def make_constant(array):
    return relax.const(array)


def var_name(var) -> str:
    return var.name if hasattr(var, "name") else var.name_hint


def structural_equal(a, b) -> bool:
    return bool(tvm_ffi.structural_equal(a, b))


class _NamingImporter(ONNXGraphImporter):
    """TVM's ONNX importer, binding each node's (single, tensor) result to a var named after the node,
    so fused groups and error messages trace back to ONNX node names."""

    def _convert_operator(self, op_name, inputs, attrs, opset):
        name = attrs.get("tvm_custom", {}).get("name")
        self.current_node = (str(name or ""), str(op_name))  # named by import errors
        sym = super()._convert_operator(op_name, inputs, attrs, opset)
        if not name:
            return sym
        if isinstance(sym, relax.Call) and isinstance(sym.ty, (relax.TensorType, relax.TupleType)):
            sym = self.bb.emit(sym, name_hint=str(name))
        elif isinstance(sym, relax.Tuple) and sym.fields and isinstance(sym.fields[0], relax.Var):
            self.var_nodes[var_name(sym.fields[0])] = str(name)  # e.g. BatchNormalization: (y, mean, var)
        return sym


def import_onnx_graph(model, shape_dict, opset):
    """Run TVM's ONNX importer (node results bound to vars named after the nodes).

    Returns the module and {var name: node name} for results the importer bound itself."""
    importer = _NamingImporter(shape_dict, "float32", keep_params_in_input=False, sanitize=False)
    importer.var_nodes, importer.current_node = {}, None
    try:
        return importer.from_onnx(model.graph, opset), importer.var_nodes
    except Exception as err:
        err.onnx_node = importer.current_node  # (node name, op) being converted, None before the first
        raise


def pack_imports_to_bytes(module) -> bytes:
    """The serialized imported modules: the blob export_library links into a library."""
    return runtime_ffi.ModulePackImportsToTensor(module).numpy().tobytes()


def cpu_target(num_cores: int | None = None):
    """The host CPU as a TVM target, with the real mcpu (plain `llvm` is ~7x slower)."""
    import os

    cores = num_cores or len(os.sched_getaffinity(0))
    return tvm.target.Target(
        {"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu(), "num-cores": cores}
    )


def cuda_target(arch: str = "sm_90"):
    return tvm.target.Target({"kind": "cuda", "arch": arch})


def prim_dtype(value) -> str:
    """dtype of a TIR PrimExpr (`.ty` in 0.27, `.dtype` before)."""
    return str(value.ty if hasattr(value, "ty") else value.dtype)
