"""The kernels of a build that run without a schedule, named with the ops and the ONNX nodes they compute.

A PrimFunc that no schedule touched lacks the `tirx.is_scheduled` attribute (`_tvm.SCHEDULED_ATTR`): on llvm
it is compiled as TVM's bare loop nest (one scalar element at a time, one thread; 10-100x slower than a
scheduled kernel). `build.build` records them (`Built.unscheduled`); compile prints them and writes them to
the manifest (`unscheduled`), explain and profile name them.

Which ONNX nodes a kernel computes is read while the module is legalized (`build.legalize_traced`): before
TVM's FuseOps each legalized op is a `call_tir` bound to a variable named after its ONNX node; FuseOps groups
them into functions that FuseTIR turns into one PrimFunc of the same name. A binding inside such a function
is found again in the module before FuseOps by its callee and its arguments' names (`Origins`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tvm_fusion._tvm import SCHEDULED_ATTR, relax, tvm
from tvm_fusion.frontend.importer import onnx_node_names

__all__ = ["Origins", "Unscheduled", "find_unscheduled", "kernel_origins", "legalized_calls", "node_of_vars",
           "users_of"]


@dataclass(frozen=True)
class Unscheduled:
    """A kernel without a schedule: its PrimFunc, the legalized ops it computes (TVM's names: `conv1d`,
    `max`, ...), and the ONNX nodes they came from."""

    function: str
    ops: tuple[str, ...]
    onnx_nodes: tuple[str, ...]

    def __str__(self) -> str:
        nodes = ", ".join(self.onnx_nodes) or "?"
        return f"{self.function} ({', '.join(self.ops)}) <- {nodes}"

    def record(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


#: {PrimFunc name after FuseTIR: (ops, ONNX nodes)}
Origins = dict


def _call_tir_of(expr):
    """(callee name, args) of a `call_tir` expression, else None."""
    if isinstance(expr, relax.Call) and expr.op.same_as(tvm.ir.Op.get("relax.call_tir")):
        return expr.args[0].name_hint, list(expr.args[1].fields) if hasattr(expr.args[1], "fields") else []
    return None


def _arg_key(arg) -> str:
    return arg.name if isinstance(arg, relax.Var) else "const"


def _bindings(func):
    """Every (var, value) binding of a Relax function, nested blocks (If branches) included."""
    found = []

    def visit(expr):
        if isinstance(expr, relax.SeqExpr):
            for block in expr.blocks:
                found.extend((b.var, b.value) for b in block.bindings)

    relax.analysis.post_order_visit(func, visit)
    return found


def users_of(bindings) -> dict:
    """relax Var -> the binding vars that read it."""
    users: dict = {}
    for b in bindings:
        seen = []

        def visit(e, seen=seen):
            if isinstance(e, relax.Var):
                seen.append(e)

        relax.analysis.post_order_visit(b.value, visit)
        for v in seen:
            users.setdefault(v, []).append(b.var)
    return users


def node_of_vars(bindings, users, names: dict[str, str]) -> dict:
    """relax Var -> ONNX node; an unnamed var (e.g. a conv before its bias add) takes its first consumer's."""
    nodes: dict = {}
    for b in reversed(bindings):
        name = b.var.name if hasattr(b.var, "name") else b.var.name_hint
        if name in names:
            nodes[b.var] = names[name]
        else:
            for u in users.get(b.var, []):
                if u in nodes:
                    nodes[b.var] = nodes[u]
                    break
    return nodes


def legalized_calls(mod) -> dict:
    """{(callee, argument names): the ONNX nodes of the variables bound to that call (an unnamed variable:
    its first consumer's node; else its own name)} over `main` of a module whose ops are legalized but not
    fused yet."""
    bindings = _bindings(mod["main"])
    flat = [b for blk in mod["main"].body.blocks for b in blk.bindings]
    node_of = node_of_vars(flat, users_of(flat), onnx_node_names(mod))
    keys: dict = {}
    for var, value in bindings:
        call = _call_tir_of(value)
        if call is not None:
            callee, args = call
            keys.setdefault((callee, tuple(map(_arg_key, args))), []).append(node_of.get(var, var.name))
    return keys


def kernel_origins(fused, calls: dict) -> Origins:
    """{kernel name: (ops, ONNX nodes)} of a module after FuseOps (`fused`), with `calls` from the module before
    it (`legalized_calls`): a fused function's ops are the PrimFuncs its bindings call; a PrimFunc `main` calls
    directly is its own op."""
    names = onnx_node_names(fused)
    origins: dict[str, tuple[list, list]] = {}

    def add(kernel: str, op: str, var_names):
        ops, nodes = origins.setdefault(kernel, ([], []))
        if op not in ops:
            ops.append(op)
        for v in var_names:
            node = names.get(v, v)
            if node not in nodes:
                nodes.append(node)

    for gv, func in fused.functions.items():
        if isinstance(func, relax.Function) and (func.attrs or {}).get("Primitive"):
            for var, value in _bindings(func):
                call = _call_tir_of(value)
                if call is not None:
                    key = (call[0], tuple(map(_arg_key, call[1])))
                    add(gv.name_hint, call[0], calls.get(key, [var.name]))
    for var, value in _bindings(fused["main"]):
        call = _call_tir_of(value)
        if call is not None:
            add(call[0], call[0], [var.name])
    return {k: (tuple(ops), tuple(nodes)) for k, (ops, nodes) in origins.items()}


def find_unscheduled(legal, origins: Origins) -> list[Unscheduled]:
    """The PrimFuncs of a legalized module without a schedule, in the module's order."""
    out = []
    for gv, func in legal.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc) and not (func.attrs or {}).get(SCHEDULED_ATTR):
            ops, nodes = origins.get(gv.name_hint, ((gv.name_hint,), ()))
            out.append(Unscheduled(gv.name_hint, ops, nodes))
    return out
