"""CUDA graphs: main's kernels captured once and replayed as one graph launch per inference.

    main(x, w...) = k1(x); k2; ...; kN   ==>   x' = copy(x); run_or_capture(graph(x', w...) = k1..kN)

TVM's `RewriteCUDAGraph` (on under the PassContext config `relax.backend.use_cuda_graph`) lifts the kernels
whose arguments are all static (weights, constants, memory StaticPlanBlockMemory planned ahead) into a
function that `vm.builtin.cuda_graph.run_or_capture` captures on the first call (cudaStreamBeginCapture ...
cudaGraphInstantiate) and replays on the next (cudaGraphLaunch). A kernel that reads main's input, or writes
main's output, is not static: `static_inputs` first copies each input into a buffer of its own (one small
copy kernel), so everything after it can be captured. Only for static shapes: a symbolic shape (or a
target other than CUDA) gets no graph. `launches` counts the GPU launches per inference with and without
the graph from the lowered module.
"""

from __future__ import annotations

from tvm_fusion._tvm import relax, te, tvm
from tvm_fusion import _tvm

__all__ = ["CONFIG", "applies", "launches", "lowered", "pass_config", "static_inputs"]

CONFIG = "relax.backend.use_cuda_graph"
RUN_OR_CAPTURE = "vm.builtin.cuda_graph.run_or_capture"


def applies(mod, target) -> str | None:
    """None when CUDA graphs apply to `mod` for `target`, else why not."""
    if target.kind.name != "cuda":
        return f"target kind {target.kind.name}: CUDA graphs are for cuda"

    for p in _inputs(mod["main"]):
        shape = getattr(_tvm.expr_type(p), "shape", None)
        if shape is None or not all(isinstance(d, tvm.tirx.IntImm) for d in shape):
            return f"input {_tvm.var_name(p)} has a symbolic shape; a graph needs static shapes"
    return None


def pass_config(enabled: bool) -> dict:
    return {CONFIG: bool(enabled)}


def _inputs(main) -> list:
    n = int(main.attrs["num_input"]) if main.attrs and "num_input" in main.attrs else len(main.params)
    return list(main.params[:n])


def _copy_func(ty, target):
    """A scheduled PrimFunc out = in (elementwise), for main's input `ty`."""
    src = te.placeholder([int(d) for d in ty.shape], str(ty.dtype), name="src")
    # max(x, x) == x for every x (NaN too), and is no plain load: RewriteDataflowReshape would make a bare copy a
    # view of the input again
    out = te.compute(src.shape, lambda *i: te.max(src(*i), src(*i)), name="copy")
    func = te.create_prim_func([src, out]).without_attr("global_symbol")
    mod = tvm.IRModule({"copy_input": func})
    with target:
        mod = tvm.s_tir.dlight.ApplyDefaultSchedule(tvm.s_tir.dlight.gpu.Fallback())(mod)
    return mod["copy_input"].with_attr("op_pattern", 8).with_attr("tirx.is_scheduled", True)


def static_inputs(mod, target):
    """main's inputs copied first into buffers of their own (kernel `copy_input`), so the kernels after the
    copy read static memory and TVM can capture them in a graph."""
    main = mod["main"]
    bb = relax.BlockBuilder(tvm.IRModule(dict(mod.functions), attrs=mod.attrs))
    copies, remap = [], {}
    for i, p in enumerate(_inputs(main)):
        ty = _tvm.expr_type(p)
        gv = bb.add_func(_copy_func(ty, target), "copy_input" if i == 0 else f"copy_input_{i}")
        var = relax.DataflowVar(f"{_tvm.var_name(p)}_static", ty)
        copies.append(relax.VarBinding(var, bb.normalize(relax.call_tir(gv, [p], ty))))
        remap[p] = var
    out = bb.get()

    @relax.expr_functor.mutator
    class _Use(relax.PyExprMutator):
        def visit_var_(self, var):
            return remap.get(var, var)

    body = _Use(out).visit_expr(main.body)
    first = body.blocks[0]
    if not isinstance(first, relax.DataflowBlock):
        return mod  # no dataflow block to put the copies in: no graph either
    body = relax.SeqExpr([relax.DataflowBlock(copies + list(first.bindings)), *body.blocks[1:]], body.body)
    out[out.get_global_var("main")] = _tvm.with_params(main, [], body)
    return relax.transform.Normalize()(out)


def lowered(mod, target, lower_passes: list, enabled: bool):
    """`mod` after the lower passes tvm.compile runs (without code generation), graphs on or off."""
    with target, tvm.transform.PassContext(opt_level=3, config=pass_config(enabled)):
        return tvm.transform.Sequential(lower_passes)(mod)


def launches(low, kernels_of) -> dict:
    """GPU launches per inference of a lowered module: {"without_graph": all kernel launches, "with_graph":
    those outside a graph + one per graph, "graphs": graphs launched, "captured": kernels inside graphs}.
    `kernels_of(primfunc name)` -> how many kernels that PrimFunc launches."""
    prim = {gv for gv, f in low.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    builtin = tvm.ir.Op.get("relax.call_builtin_with_ctx")
    per_function = {}
    graph_calls = {}

    for gv, func in low.functions.items():
        if not isinstance(func, relax.Function):
            continue
        count, graphs = 0, []

        def visit(expr):
            nonlocal count
            if not isinstance(expr, relax.Call):
                return
            if isinstance(expr.op, relax.GlobalVar) and expr.op in prim:
                count += kernels_of(expr.op.name_hint)
            elif expr.op.same_as(builtin) and getattr(expr.args[0], "global_symbol", "") == RUN_OR_CAPTURE:
                graphs.append(expr.args[1].fields[0])  # call_builtin_with_ctx(run_or_capture, (capture, args, i))

        relax.analysis.post_order_visit(func.body, visit)
        per_function[gv.name_hint] = count
        graph_calls[gv.name_hint] = graphs
    captured = sum(per_function[g.name_hint] for g in graph_calls.get("main", []))
    outside = per_function.get("main", 0)
    graphs = len(graph_calls.get("main", []))
    return {"without_graph": outside + captured, "with_graph": outside + graphs, "graphs": graphs,
            "captured": captured}
