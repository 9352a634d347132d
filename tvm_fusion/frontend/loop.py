"""ONNX `Loop` with a trip count fixed at compile time, unrolled before TVM's importer (which has no Loop).

    Loop(M, cond, v0...) body(i, c, v...) -> (c', v'..., s...)   ==>   body copies 0..M-1, each reading the one
    before: carried values v chained, scan outputs s stacked along a new axis 0 (Unsqueeze + Concat)

Taken: M a constant (an initializer or a Constant node's output, after the simplifier folded what the bound
input shapes fix), the loop's condition absent or a constant true, and the body's condition passed through
(`Identity(c)`, or `c` itself) or a constant true. Every other Loop is a FusionError naming the node: its
number of iterations is decided at run time. The body's own names (its inputs, values, initializers, and
those of the bodies inside it) are renamed per copy, `loop/it2/name`, nodes likewise; the tensors of enclosing
graphs that the body reads keep theirs.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tvm_fusion.errors import FusionError
from tvm_fusion.frontend.recurrent import (_graphs, _taken_names)  # every graph of a model (bodies included); every name in it

__all__ = ["unroll_loops", "MAX_ITERATIONS"]

#: iterations unrolled at most (each copies the body; an LSTM's decomposition unrolls a few hundred steps)
MAX_ITERATIONS = 1024


def unroll_loops(model: onnx.ModelProto, where: str) -> onnx.ModelProto:
    """`model` with every Loop (in any graph, bodies first) unrolled; the same object when it has none."""
    if not any(n.op_type == "Loop" for g in _graphs(model.graph) for n in g.node):
        return model
    model = onnx.ModelProto.FromString(model.SerializeToString())
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=1)
    constants = {t.name: numpy_helper.to_array(t) for g in _graphs(model.graph) for t in g.initializer}
    constants.update({n.output[0]: numpy_helper.to_array(a.t) for g in _graphs(model.graph) for n in g.node
                      if n.op_type == "Constant" for a in n.attribute if a.name == "value"})
    taken = _taken_names(model)
    _unroll_graph(model.graph, _Context(where, opset, constants, taken))
    return model


class _Context:
    def __init__(self, where: str, opset: int, constants: dict, taken: set[str]):
        self.where, self.opset, self.constants, self.taken = where, opset, constants, taken

    def fresh(self, name: str) -> str:
        base, i = name, 1
        while name in self.taken:
            name, i = f"{base}_{i}", i + 1
        self.taken.add(name)
        return name


def _defined(graph: onnx.GraphProto) -> set[str]:
    """The names a body defines, its inner bodies' included."""
    out: set[str] = set()
    for g in _graphs(graph):
        out.update(v.name for v in g.input)
        out.update(t.name for t in g.initializer)
        out.update(o for n in g.node for o in n.output if o)
    return out


def _unroll_graph(graph: onnx.GraphProto, ctx: _Context) -> None:
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        for a in node.attribute:
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                _unroll_graph(g, ctx)
        if node.op_type == "Loop" and node.domain in ("", "ai.onnx"):
            nodes += _unrolled(node, graph, ctx)
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)


def _trip_count(node: onnx.NodeProto, ctx: _Context) -> int:
    here = f"{ctx.where}: Loop node {node.name!r}"
    fixed = "TVM's ONNX importer has no Loop, so only a loop with a fixed number of iterations is unrolled"
    m = node.input[0] if node.input else ""
    cond = node.input[1] if len(node.input) > 1 else ""
    if not m or m not in ctx.constants:
        raise FusionError(f"{here} runs a number of iterations {'computed at run time' if m else 'without a bound'} "
                          f"(trip count {m or 'absent'!r}); {fixed}: give it a constant trip count (or fix the "
                          "input shapes it is computed from with --shape)")
    if cond and not (cond in ctx.constants and bool(ctx.constants[cond])):
        raise FusionError(f"{here} starts on a condition computed at run time ({cond!r}); {fixed}: export it with "
                          "no condition input or a constant true")
    body = next(a.g for a in node.attribute if a.name == "body")
    out = body.output[0].name
    producer = next((n for n in body.node if out in n.output), None)
    passed = out == body.input[1].name or (producer is not None and producer.op_type == "Identity"
                                           and producer.input[0] == body.input[1].name)
    constant = out in ctx.constants and bool(ctx.constants[out])
    if not (passed or constant):
        raise FusionError(f"{here} stops on a condition its body computes ({out!r}); {fixed}: export it as a "
                          "loop over a constant trip count whose body passes the condition through")
    count = int(ctx.constants[m])
    if not 0 < count <= MAX_ITERATIONS:
        raise FusionError(f"{here} runs {count} iterations; it is unrolled for 1 to {MAX_ITERATIONS}")
    return count


def _unrolled(node: onnx.NodeProto, graph: onnx.GraphProto, ctx: _Context) -> list[onnx.NodeProto]:
    count = _trip_count(node, ctx)
    body = next(a.g for a in node.attribute if a.name == "body")
    carried_n = len(node.input) - 2
    carried = list(node.input[2:])
    scans: list[list[str]] = [[] for _ in range(len(body.output) - 1 - carried_n)]
    nodes: list[onnx.NodeProto] = []
    local = _defined(body)
    for k in range(count):
        names = {n: ctx.fresh(f"{node.name}/it{k}/{n}") for n in sorted(local)}
        copy = onnx.GraphProto.FromString(body.SerializeToString())
        _rename(copy, names, node.name, k, ctx)
        graph.initializer.extend([numpy_helper.from_array(np.array(k, np.int64), copy.input[0].name),
                                  numpy_helper.from_array(np.array(True), copy.input[1].name), *copy.initializer])
        for v, given in zip(copy.input[2:], carried):
            nodes.append(helper.make_node("Identity", [given], [v.name], name=ctx.fresh(f"{node.name}/it{k}/in")))
        nodes += list(copy.node)
        outs = [v.name for v in copy.output]
        carried = outs[1:1 + carried_n]
        for j, s in enumerate(outs[1 + carried_n:]):
            scans[j].append(s)
    for final, name in zip(carried, node.output[:carried_n]):
        if name:
            nodes.append(helper.make_node("Identity", [final], [name], name=ctx.fresh(f"{node.name}/out")))
    for values, name in zip(scans, node.output[carried_n:]):
        if name:
            nodes += _stacked(values, name, node.name, graph, ctx)
    return nodes


def _rename(g: onnx.GraphProto, names: dict[str, str], loop: str, k: int, ctx: _Context) -> None:
    """Rename, in `g` and its bodies, every name of `names` (what the loop's body defines) and every node."""
    for sub in _graphs(g):
        for v in list(sub.input) + list(sub.output) + list(sub.value_info):
            v.name = names.get(v.name, v.name)
        for t in sub.initializer:
            t.name = names.get(t.name, t.name)
        for n in sub.node:
            n.input[:] = [names.get(x, x) for x in n.input]
            n.output[:] = [names.get(x, x) for x in n.output]
            n.name = ctx.fresh(f"{loop}/it{k}/{n.name or n.op_type}")


def _stacked(values: list[str], name: str, loop: str, graph: onnx.GraphProto, ctx: _Context) -> list[onnx.NodeProto]:
    """Nodes writing `name` = the scan values stacked along a new axis 0."""
    nodes, rows = [], []
    axes = ctx.fresh(f"{loop}/scan_axes")
    if ctx.opset >= 13:
        graph.initializer.append(numpy_helper.from_array(np.array([0], np.int64), axes))
    for v in values:
        row = name if len(values) == 1 else ctx.fresh(f"{v}/row")
        kw = {} if ctx.opset >= 13 else {"axes": [0]}
        nodes.append(helper.make_node("Unsqueeze", [v, axes] if ctx.opset >= 13 else [v], [row],
                                      name=ctx.fresh(f"{loop}/scan"), **kw))
        rows.append(row)
    if len(values) > 1:
        nodes.append(helper.make_node("Concat", rows, [name], name=ctx.fresh(f"{loop}/scan"), axis=0))
    return nodes
