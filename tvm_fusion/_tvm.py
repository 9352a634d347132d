"""The one module with version-specific Apache TVM imports (tested against apache-tvm 0.27).

Everything else in tvm_fusion imports TVM names from here, so a TVM upgrade touches one file.
"""

from __future__ import annotations

import functools
import gc
import os
import re

#: the cores this process may run on, read once before TVM runs anything: TVM's thread pool pins the calling
#: thread to one core once it has run a kernel on more than one thread (runtime.config_threadpool), after which
#: os.sched_getaffinity(0) says 1, and a host target made then would be planned for one core
HOST_CORES = len(os.sched_getaffinity(0))

# TVM's CPU thread pool halves the core count on x86 (to skip hyper-threads) and reads TVM_NUM_THREADS only
# when it starts: on a 2-vCPU machine it would run every parallel kernel on one thread. Use every core
# this process may run on, unless the user chose otherwise.
os.environ.setdefault("TVM_NUM_THREADS", str(HOST_CORES))

import tvm  # noqa: E402
import tvm_ffi  # noqa: E402
from tvm import relax, te, topi  # noqa: E402,F401  (re-exported)
from tvm.ir import GenericConst  # relax constants in 0.27
from tvm.ir.expr import TensorLoad  # noqa: F401  (a TIR buffer load in 0.27; tirx.BufferLoad makes one)
from tvm.ir.utils import derived_object  # noqa: F401  (a Python subclass of a TVM object: MetaSchedule callbacks)
from tvm.relax import dpl  # noqa: F401
from tvm.relax.backend.cpu_generic import pipeline as cpu_pipeline
from tvm.relax.backend.cuda import pipeline as cuda_pipeline
from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter, _get_convert_map
from tvm.relax.transform import FusionPattern, PatternCheckContext  # noqa: F401
from tvm.runtime import _ffi_api as runtime_ffi
from tvm.s_tir import SBlock, SBlockRealize, Schedule  # noqa: F401
from tvm.sym import Analyzer, detect_linear_equation  # noqa: F401  (tvm.arith before 0.27)
from tvm.s_tir import dlight  # noqa: F401
from tvm.s_tir.analysis import verify_gpu_code  # noqa: F401
from tvm.s_tir.analysis import estimate_tir_flops  # noqa: F401
from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock  # noqa: F401  (tune's builder)
from tvm.support import nvcc  # noqa: F401
from tvm import tirx  # noqa: F401
from tvm.script import tirx as tvmscript  # noqa: F401  (TVMScript's T: `T.prim_func`, `T.macro`; the AMX kernels)

from . import cpu_features, quiet  # noqa: E402

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


def infer_type(expr):
    """The type TVM infers for an expression that is not normalised yet (e.g. a rewrite's result)."""
    bb = relax.BlockBuilder()
    bb._begin_binding_block()  # normalising a nested call needs a block to bind its arguments in
    try:
        return bb.normalize(expr).ty
    finally:
        bb._end_block()


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


#: ONNX ops whose one output is the whole tuple the converter returns (a sequence, an optional)
_TUPLE_VALUED_OPS = frozenset({"Optional", "OptionalGetElement", "SequenceConstruct", "SequenceEmpty", "SequenceErase",
                               "SequenceInsert", "ConcatFromSequence", "SplitToSequence", "SequenceAt"})


class _NamingImporter(ONNXGraphImporter):
    """TVM's ONNX importer, binding each node's (single, tensor) result to a var named after the node,
    so fused groups and error messages trace back to ONNX node names."""

    custom: dict = {}  # op type -> converter(bb, inputs, attrs), for ops of ours the front door writes

    def _check_for_unsupported_ops(self, graph):
        if not any(n.op_type in self.custom for n in graph.node):
            return super()._check_for_unsupported_ops(graph)
        kept = type(graph)()
        kept.node.extend(n for n in graph.node if n.op_type not in self.custom)
        return super()._check_for_unsupported_ops(kept)

    def _convert_operator(self, op_name, inputs, attrs, opset):
        name = attrs.get("tvm_custom", {}).get("name")
        self.current_node = (str(name or ""), str(op_name))  # named by import errors
        if op_name in self.custom:
            sym = self.bb.normalize(self.custom[op_name](self.bb, inputs, attrs))
        else:
            sym = super()._convert_operator(op_name, inputs, attrs, opset)
        if name and isinstance(sym, relax.Call) and isinstance(sym.ty, (relax.TensorType, relax.TupleType)):
            sym = self.bb.emit(sym, name_hint=str(name))
            if var_name(sym) != str(name):  # the name pool gave it another name: record that one
                self.var_nodes[var_name(sym)] = str(name)
        elif name and isinstance(sym, relax.Tuple) and sym.fields and isinstance(sym.fields[0], relax.Var):
            self.var_nodes[var_name(sym.fields[0])] = str(name)  # e.g. BatchNormalization: (y, mean, var)
        elif (name and isinstance(sym, relax.Var) and re.fullmatch(r"lv\d*", var_name(sym))
              and var_name(sym) not in self.var_nodes
              and not any(isinstance(i, relax.Expr) and sym.same_as(i) for i in inputs)):
            # bound by the converter itself under the name pool's "lv" (a Clip's emit_te minimum)
            self.var_nodes[var_name(sym)] = str(name)
        return _first_of_tuple(self.bb, op_name, sym, attrs.get("tvm_custom", {}).get("num_outputs"))


def import_onnx_graph(model, shape_dict, opset, dtype_dict, custom: dict | None = None):
    """Run TVM's ONNX importer (node results bound to vars named after the nodes).

    `dtype_dict`: {input name: dtype}, the model's own input dtypes (a plain string would be a default).
    `custom`: {op type: converter(bb, inputs, attrs)} for ops the importer does not know.
    Returns the module and {var name: node name} for results the importer bound itself."""
    with quiet.tvm_output(drop=quiet.IMPORTER_LINES, stdout=True):  # its prints repeat the exception's text
        importer = _NamingImporter(shape_dict, dtype_dict, keep_params_in_input=False, sanitize=False)
        importer.var_nodes, importer.current_node, importer.custom = {}, None, dict(custom or {})
        try:
            return importer.from_onnx(model.graph, opset), importer.var_nodes
        except Exception as err:
            err.onnx_node = importer.current_node  # (node name, op) being converted, None before the first
            failure = err
        del importer
        _drop_frames(failure)  # they hold the importer's BlockBuilder, which logs when destroyed: here
        gc.collect()
    raise failure


def _first_of_tuple(bb, op_name: str, sym, num_outputs):
    """The first field of a converter's tuple result (BatchNormalization's (y, mean, var), Dropout's (y, mask))
    when the node has one output: what the importer keeps in the main graph, while in an If branch it keeps
    the whole tuple, which the next node then cannot read."""
    if num_outputs != 1 or op_name in _TUPLE_VALUED_OPS:
        return sym
    if isinstance(sym, relax.Tuple) and len(sym.fields) > 1:
        return sym.fields[0]
    if isinstance(sym, relax.Expr) and isinstance(sym.ty, relax.TupleType) and len(sym.ty.fields) > 1:
        return bb.emit(relax.TupleGetItem(sym, 0))
    return sym


def _drop_frames(err: BaseException | None) -> None:
    """Forget the frames of `err`'s traceback and of the exceptions it chains to."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        err.__traceback__ = None
        err = err.__cause__ or err.__context__


def onnx_importer_ops() -> frozenset[str]:
    """The ONNX op types TVM's importer converts (its private convert map), plus the two it handles itself
    (Constant, If)."""
    return frozenset(_get_convert_map()) | {"Constant", "If"}


def device_lowering_passes() -> list:
    """TVM 0.27's default s_tir pipeline (tvm/s_tir/pipeline.py, a closure that cannot be cut) up to
    MergeSharedMemoryAllocations, without its passes for options off by default: a kernel's buffers flat,
    its thread extents and allocations final, as `verify_gpu_code` reads them."""
    s_tir = tvm.s_tir
    return [
        s_tir.transform.CanonicalizeLoop(), s_tir.transform.LowerCrossThreadReduction(),
        s_tir.transform.LowerInitBlock(), s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
        s_tir.transform.ConvertBlocksToOpaque(), s_tir.transform.LiftThreadBinding(),
        s_tir.transform.ManifestSharedMemoryLocalStage(), s_tir.transform.CompactBufferAllocation(),
        s_tir.transform.LowerAutoCopy(), s_tir.transform.UnifyThreadBinding(),
        s_tir.transform.LowerMatchBuffer(), s_tir.transform.StmtSimplify(),
        s_tir.transform.InjectSoftwarePipeline(), s_tir.transform.LowerOpaqueBlock(),
        tirx.transform.FlattenBuffer(), tirx.transform.NarrowDataType(32), s_tir.transform.LoopPartition(),
        tirx.transform.VectorizeLoop(True), s_tir.transform.InjectVirtualThread(),
        s_tir.transform.InjectDoubleBuffer(), tirx.transform.StorageRewrite(), tirx.transform.UnrollLoop(),
        tirx.transform.StmtSimplify(), tirx.transform.RemoveNoOp(), s_tir.transform.ThreadSync("shared"),
        s_tir.transform.MergeSharedMemoryAllocations(),
    ]


def pack_imports_to_bytes(module) -> bytes:
    """The serialized imported modules: the blob export_library links into a library."""
    return runtime_ffi.ModulePackImportsToTensor(module).numpy().tobytes()


@functools.lru_cache(maxsize=1)
def llvm_host_features() -> frozenset[str] | None:
    """The features LLVM detects on this host (cpuid and the OS's saved register state on x86, hwcaps on
    AArch64): what the host really runs, unlike the features its CPU name implies. None when unknown."""
    detect = tvm.get_global_func("tvm.codegen.llvm.GetHostCPUFeatures", allow_missing=True)
    found = frozenset(str(k) for k, v in detect().items() if v) if detect is not None else frozenset()
    return found or None


def target_cpu_features(target) -> frozenset[str]:
    """Every feature an llvm target enables (its mcpu's, then its mattr applied)."""
    return frozenset(str(f) for f in tvm.target.codegen.llvm_get_cpu_features(target))


def llvm_triple(target) -> str:
    """The triple an llvm target compiles for (this host's when it names none)."""
    return str(target.attrs.get("mtriple") or tvm.target.codegen.llvm_get_system_triple())


def llvm_vector_width(target) -> int:
    """LLVM's vector width in bits for the target. On x86-64 TVM answers 512 for every CPU (its own
    default), so there only the features say the truth."""
    return int(tvm.target.codegen.llvm_get_vector_width(target))


def unknown_llvm_cpu(target) -> str | None:
    """The mcpu of an llvm target when LLVM does not know it for the target's triple (TVM only warns)."""
    mcpu = target.attrs.get("mcpu")
    if target.kind.name != "llvm" or not mcpu or tvm.target.codegen.llvm_is_valid_cpu(str(mcpu), llvm_triple(target)):
        return None
    return str(mcpu)


def cpu_target(num_cores: int | None = None, *, cpuinfo: str | None = None, mcpu: str | None = None,
               mtriple: str | None = None, caches: dict[str, int] | None = None):
    """The host CPU as a TVM target: its real mcpu (plain `llvm` is ~7x slower), an `mattr` turning off
    each vector feature the mcpu implies but the host does not expose (AVX-512 hidden by a hypervisor) and
    turning on the AMX features the host has and the mcpu does not imply (`added_features`), and
    its per-core cache sizes in `model` ('l1d=48K,l2=2048K': a CPU name does not tell them, and a VM may
    name a CPU it is not).

    The host's features come from LLVM's host detection, else /proc/cpuinfo, its caches from sysfs; tests
    pass `cpuinfo` text (with `mcpu`, `mtriple` and `caches`) to stand for another machine."""
    spec = {"kind": "llvm", "mcpu": mcpu or tvm.target.codegen.llvm_get_system_cpu(),
            "num-cores": num_cores or HOST_CORES}
    caches = caches if caches is not None or cpuinfo is not None else cpu_features.host_cache_sizes()
    if caches:
        spec["model"] = cpu_features.cache_model(caches)
    if mtriple:
        spec["mtriple"] = mtriple
    arch = cpu_features.arch_of(mtriple)
    if cpuinfo is not None:
        available = cpu_features.features_from_cpuinfo(cpuinfo, arch)
    else:
        available = llvm_host_features() or cpu_features.host_features()
    if available is not None:
        implied = target_cpu_features(tvm.target.Target(spec))
        mattr = [f"-{f}" for f in cpu_features.hidden_features(implied, available, arch)]
        mattr += [f"+{f}" for f in cpu_features.added_features(implied, available, arch)]
        if mattr:
            spec["mattr"] = mattr
    return tvm.target.Target(spec)


#: the tensor intrinsics MetaSchedule's schedule rules may use, per target kind
_TENSOR_INTRINSICS = {"llvm": ("x86", "arm_cpu", "riscv_cpu"), "cuda": ("cuda",)}


def meta_schedule(target_kind: str | None = None):
    """`tvm.s_tir.meta_schedule` (imported on first use: tuning only; needs cloudpickle, and xgboost for the
    default cost model). With `target_kind`, first registers only that kind's tensor intrinsics: MetaSchedule's
    TuneContext imports `tvm.s_tir.tensor_intrin`, which registers every vendor's (CUDA's alone took 58 s of 83
    on this loaded 2-core machine)."""
    import importlib
    import importlib.util
    import sys

    package = "tvm.s_tir.tensor_intrin"
    if target_kind is not None:
        if package not in sys.modules:
            spec = importlib.util.find_spec(package)
            sys.modules[package] = importlib.util.module_from_spec(spec)  # the package, its __init__ not run
        for sub in _TENSOR_INTRINSICS.get(target_kind, ()):
            importlib.import_module(f"{package}.{sub}")  # each kind's once per process
    from tvm.s_tir import meta_schedule as ms

    return ms


def structural_hash(node) -> int:
    return int(tvm_ffi.structural_hash(node))


def called_ops(node) -> frozenset[str]:
    """The names of the ops a TIR statement or expression calls (`exp`, `sinh`, `if_then_else`, ...), without their
    namespace (`tirx.exp`, `prim.if_then_else`): tvm-ffi's structural walk (TVM 0.27's Python has no TIR visitor; `tirx.stmt_functor` was
    removed). Arithmetic, selects, casts, min / max and loads are nodes, not calls."""
    names: set[str] = set()
    tvm_ffi.structural_walk(node, (tvm.ir.expr.Call, lambda call: names.add(str(call.op.name).rsplit(".", 1)[-1])))
    return frozenset(names)


def float_nodes(node) -> int:
    """How many floating-point expression nodes (arithmetic, selects, casts, loads, constants) a TIR statement
    or expression holds: tvm-ffi's structural walk, as `called_ops`."""
    count = [0]

    def visit(expr):
        if prim_dtype(expr).startswith(("float", "bfloat")):
            count[0] += 1

    tvm_ffi.structural_walk(node, (tvm.ir.expr.Expr, visit))
    return count[0]


def has_cuda_device() -> bool:
    """Whether a CUDA device is present (a driver and a GPU)."""
    return bool(tvm.cuda(0).exist)


def cuda_target(arch: str = "sm_90"):
    return tvm.target.Target({"kind": "cuda", "arch": arch})


def prim_dtype(value) -> str:
    """dtype of a TIR PrimExpr (`.ty` in 0.27, `.dtype` before)."""
    return str(value.ty if hasattr(value, "ty") else value.dtype)


#: the global function TVM's CUDA codegen calls to compile kernels at build time when a CUDA driver is present
CUDA_COMPILE_CALLBACK = "tvm_callback_cuda_compile"


class override_global_func:
    """`with override_global_func(name, fn):` registers `fn` as TVM global `name`, and restores the previous
    one (TVM's own nvcc/NVRTC wrapper for the CUDA compile callback) on exit."""

    def __init__(self, name: str, fn):
        self.name, self.fn = name, fn

    def __enter__(self):
        self.previous = tvm_ffi.get_global_func(self.name, allow_missing=True)
        tvm_ffi.register_global_func(self.name, self.fn, override=True)
        return self

    def __exit__(self, *exc):
        if self.previous is not None:
            tvm_ffi.register_global_func(self.name, self.previous, override=True)


def current_cuda_arch(default: str) -> str:
    """The arch of the CUDA target in scope (the codegen compiles inside it), else `default`."""
    target = tvm.target.Target.current(allow_none=True)
    arch = target.attrs.get("arch") if target is not None and target.kind.name == "cuda" else None
    return str(arch) if arch else default


def with_params(func, extra_params: list, body):
    """`func` with `extra_params` appended and a new body (attributes, purity and return type kept)."""
    return relax.Function(list(func.params) + list(extra_params), body, func.ret_ty, func.is_pure, func.attrs)


def call_args_with(call, args: list):
    """`call` with new arguments (same op, attributes and type arguments)."""
    return relax.Call(call.op, args, call.attrs, call.ty_args)


# ---------------------------------------------------------------- CUDA tensor-core intrinsics (wmma)
#: what each half dtype is called in TVM's wmma intrinsic names (`wmma_sync_16x16x16_f16f16f32_trans`)
WMMA_DTYPE_NAMES = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}


def _frames_without_source(context: int = 1) -> list:
    """inspect.stack() without reading source: the frames, files and line numbers (no code context)."""
    import inspect
    import sys

    frame, out = sys._getframe(1), []
    while frame is not None:
        out.append(inspect.FrameInfo(frame, frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name, None,
                                     None))
        frame = frame.f_back
    return out


class _fast_tvmscript:
    """TVMScript's `@T.prim_func` calls inspect.stack(), which resolves every frozen importlib frame by scanning
    sys.modules: importing TVM's ~500 tensor intrinsics took 28 s on a 2-core machine, 5 s with this stack
    (the parser reads the frames and line numbers only; a missing code context means "not in a class")."""

    def __enter__(self):
        import inspect

        self.stack, inspect.stack = inspect.stack, _frames_without_source

    def __exit__(self, *exc):
        import inspect

        inspect.stack = self.stack


@functools.lru_cache(maxsize=None)
def wmma_intrinsics(in_dtype: str, trans_b: bool, out_dtype: str = "float32",
                    scope: str = "shared.dyn") -> dict[str, str]:
    """The names of the wmma m16n16k16 tensor intrinsics {init, load_a, load_b, compute, store} for `in_dtype`
    inputs and `out_dtype` accumulators, read from and stored to `scope`; B is [N, K] with `trans_b`, else
    [K, N]. TVM registers
    the float16 ones; the bfloat16 ones are made here by TVM's own generators (the same descriptions with
    bfloat16 buffers; CUDA's wmma takes __nv_bfloat16 fragments on sm_80+)."""
    with _fast_tvmscript():
        from tvm.s_tir import TensorIntrin
        from tvm.s_tir.tensor_intrin import cuda as intrin

        a, o, sc = WMMA_DTYPE_NAMES[in_dtype], WMMA_DTYPE_NAMES[out_dtype], scope.replace(".", "_")
        t = "_trans" if trans_b else ""
        names = {
            "init": (f"wmma_fill_16x16x16_{o}", lambda: intrin.get_wmma_fill_intrin(16, 16, 16, out_dtype)),
            "load_a": (f"wmma_load_16x16x16_{a}_a_{sc}",
                       lambda: intrin.get_wmma_load_intrin(16, 16, 16, in_dtype, scope, False, False)),
            "load_b": (f"wmma_load_16x16x16_{a}_b{t}_{sc}",
                       lambda: intrin.get_wmma_load_intrin(16, 16, 16, in_dtype, scope, True, trans_b)),
            "compute": (f"wmma_sync_16x16x16_{a}{a}{o}{t}",
                        lambda: intrin.get_wmma_sync_intrin(16, 16, 16, in_dtype, out_dtype, trans_b)),
            "store": (f"wmma_store_16x16x16_{o}_{sc}",
                      lambda: intrin.get_wmma_store_intrin(16, 16, 16, out_dtype, scope)),
        }
        for name, make in names.values():
            if TensorIntrin.get(name, allow_missing=True) is None:
                TensorIntrin.register(name, *make())
    return {role: name for role, (name, _) in names.items()}


#: PassContext config that turns a software pipeline's async stages into cp.async (InjectPTXAsyncCopy)
ASYNC_COPY_CONFIG = "tirx.use_async_copy"


def dlight_matmul_helpers():
    """dlight's matmul analysis: (get_root_block, get_reduction_blocks, get_index_map, auto_inline_producers,
    auto_inline_consumer_chain)."""
    from tvm.s_tir.dlight.analysis import get_root_block
    from tvm.s_tir.dlight.gpu import matmul

    return (get_root_block, matmul.get_reduction_blocks, matmul.get_index_map, matmul.auto_inline_producers,
            matmul.auto_inline_consumer_chain)


def buffer_load(expr):
    """(buffer, indices) of a TIR buffer load (`tvm.ir.TensorLoad` with `.source` in 0.27), else None."""
    if isinstance(expr, tvm.ir.TensorLoad):
        return expr.source, list(expr.indices)
    return None
