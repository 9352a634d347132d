"""The front door: simplify an exporter's ONNX graph, with its input shapes bound, before TVM's importer.

    Shape/Gather/Concat -> Reshape(const)    Constant -> initializer    Identity(x) -> x

Exporters write shape arithmetic (`Shape -> Gather -> Unsqueeze -> Concat -> Reshape`), weights in
`Constant` nodes and `Identity` of shape values; TVM's importer rejects some of it ("shape_of expects a
tensor input") and TVM's FoldConstant can crash on the rest. With the shapes bound, a simplifier folds it all
to constants. SIMPLIFIERS holds the candidates (benchmarks/simplifiers.py compares them on the zoo corpus);
DEFAULT is the one `import_onnx(simplify=True)` runs (docs/models.md, "Which simplifier", says why).

Node names: a node the simplifier keeps keeps its ONNX name; a node it makes (or leaves unnamed) takes the
name of the original node that produced the same output, so messages and manifests still name the user's
nodes. `record` (stored on the module, written into compile's manifest) says what ran.
"""

from __future__ import annotations

import importlib.metadata
import re
import time

import onnx

from tvm_fusion.errors import FusionError
from tvm_fusion._tvm import relax, tvm, var_name

__all__ = ["DEFAULT", "RECORD_ATTR", "SIMPLIFIERS", "bind_input_shapes", "failure", "front_door",
           "record_of", "run_simplifier", "simplify"]

DEFAULT = "onnxslim"
RECORD_ATTR = "tvm_fusion.simplify"
def _onnxslim(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnxslim

    return onnxslim.slim(model, model_check=False, skip_fusion_patterns=_slim_fusions())


def _slim_fusions() -> list[str]:
    """onnxslim's Fusion* patterns (Conv+BN into Conv, MatMul+Add into Gemm, ...): left to our rules, which
    name what they fuse; its Elimination* patterns (Concat, Reshape, Transpose clean-ups) stay on."""
    try:
        from onnxslim.core.pattern.registry import DEFAULT_FUSION_PATTERNS
    except ImportError:  # a layout change in onnxslim: run its defaults
        return []
    return [name for name in DEFAULT_FUSION_PATTERNS if name.startswith("Fusion")]


def _onnxsim(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnxsim

    out, _ = onnxsim.simplify(model, check_n=0, skip_fuse_bn=True, initializers_as_constants=False)
    return out


def _onnxscript(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnxscript import optimizer

    return optimizer.optimize(model)


#: name -> (PyPI distribution, runner)
SIMPLIFIERS = {"onnxslim": ("onnxslim", _onnxslim), "onnxsim": ("onnxsim", _onnxsim),
               "onnxscript": ("onnxscript", _onnxscript)}


def bind_input_shapes(model: onnx.ModelProto, shapes: dict) -> onnx.ModelProto:
    """Copy of `model` whose graph inputs have the `shapes` ({input name: dims}; a symbolic dim becomes a
    dim_param); stale value_info dropped."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for inp in model.graph.input:
        if inp.name in shapes:
            dims = inp.type.tensor_type.shape.dim
            del dims[:]
            for d in shapes[inp.name]:
                if isinstance(d, int):
                    dims.add().dim_value = int(d)
                else:  # a symbolic dim (frontend.SymDim) stays a named one
                    dims.add().dim_param = d.name
    del model.graph.value_info[:]
    return model


def run_simplifier(name: str, model: onnx.ModelProto) -> onnx.ModelProto:
    if name not in SIMPLIFIERS:
        raise FusionError(f"unknown simplifier {name!r}; use one of {', '.join(SIMPLIFIERS)}")
    return SIMPLIFIERS[name][1](model)


def _all_nodes(graph: onnx.GraphProto):
    """The nodes of `graph` and of every subgraph (If / Loop / Scan bodies), depth first."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _all_nodes(sub)


#: the suffix onnxslim gives a tensor it moves out of an If / Loop body (`x_subg_105_sub_graph2`)
_HOISTED = re.compile(r"_subg_\d+_sub_graph\d+$")


def _keep_names(original: onnx.ModelProto, out: onnx.ModelProto) -> dict[str, str]:
    """Give every node the name of the original node that produced the same output, exactly as the user
    wrote it (an empty or a repeated name too: the importer labels those, e.g. `Relu (node 12)`), in the
    graph and in every branch; a node with no original producer is named `<op>_simplified_<i>`.

    Returns {new node name: original node name} for the nodes whose name changed."""
    producer = {o: n.name for n in _all_nodes(original.graph) for o in n.output if o}
    renamed = {}
    for i, node in enumerate(_all_nodes(out.graph)):
        outputs = [_HOISTED.sub("", o) for o in node.output]  # onnxslim renames what it moves out of a branch
        source = next((producer[o] for o in outputs if o in producer), None)
        name = source if source is not None else f"{node.op_type}_simplified_{i}"
        if name != node.name:
            renamed[name] = source if source is not None else node.name
            node.name = name
    return renamed


def _keep_inputs(original: onnx.ModelProto, out: onnx.ModelProto) -> None:
    """The original graph inputs, in their order, unused ones included (simplifiers drop those): callers
    pass one array per declared input."""
    inits = {t.name for t in original.graph.initializer}
    have = {i.name: i for i in out.graph.input}
    ordered = [have.get(i.name, i) for i in original.graph.input if i.name not in inits]
    names = {i.name for i in ordered}
    rest = [i for i in out.graph.input if i.name not in names]
    del out.graph.input[:]
    out.graph.input.extend(ordered + rest)


def simplify(model: onnx.ModelProto, shapes: dict, tool: str = DEFAULT) -> tuple[onnx.ModelProto, dict]:
    """(simplified model, record). A simplifier that is missing or fails leaves the model as it was,
    and the record says why (the import then goes on with the exporter's graph)."""
    record = {"simplifier": tool, "nodes_before": len(model.graph.node)}
    try:
        record["version"] = importlib.metadata.version(SIMPLIFIERS[tool][0])
    except (KeyError, importlib.metadata.PackageNotFoundError):
        record["skipped"] = f"{tool} is not installed (pip install {tool})"
        return model, record
    start = time.perf_counter()
    bound = bind_input_shapes(model, shapes)
    try:
        out = run_simplifier(tool, bound)
    except Exception as err:  # noqa: BLE001 - any simplifier failure falls back to the exporter's graph
        record["skipped"] = f"{tool} failed: {type(err).__name__}: {_first_line(err)}"
        return bound, record
    outputs = [o.name for o in model.graph.output]
    if [o.name for o in out.graph.output] != outputs:
        record["skipped"] = f"{tool} changed the graph outputs {outputs} to {[o.name for o in out.graph.output]}"
        return bound, record
    _keep_inputs(bound, out)
    record["renamed_nodes"] = len(_keep_names(model, out))
    record["nodes_after"] = len(out.graph.node)
    record["seconds"] = round(time.perf_counter() - start, 3)
    return out, record


def front_door(model: onnx.ModelProto, shapes: dict, on: bool = True) -> tuple[onnx.ModelProto, dict]:
    """What import_onnx runs before TVM's importer: (model to import, record of what ran); `on=False`: the
    model as given (the CLI's --no-simplify)."""
    if not on:
        return model, {"simplifier": "off", "skipped": "--no-simplify"}
    return simplify(model, shapes)


def record_of(mod) -> dict:
    """What the front door did for an imported module (empty for modules import_onnx did not make)."""
    attrs = mod.attrs or {}
    rec = attrs.get(RECORD_ATTR) if hasattr(attrs, "get") else None
    if rec is None:
        return {}
    return {str(k): (v if isinstance(v, (int, float)) else str(v)) for k, v in rec.items()}


#: TVM's type inference names the op by its whole repr: `In ir.Op(span=None, ..., name="relax.nn.conv2d", ...,
#: support_level=10), layout OIHW requires ...`; the message keeps its name
_OP_REPR = re.compile(r'^In ir\.Op\(.*?name="([^"]+)".*?support_level=-?\d+\),?\s*')


def _first_line(err: BaseException) -> str:
    """The reason in a (TVM) exception: its first line that is not a traceback frame."""
    for line in str(err).splitlines():
        line = line.strip()
        if line and not line.startswith(("File ", "Traceback", "File\"", "0:", "1:", "  ")):
            return _OP_REPR.sub(r"in \1: ", line)[:300]
    return type(err).__name__


def failure(where: str, stage: str, err: BaseException, nodes: dict[str, str], record: dict,
            mod=None) -> FusionError:
    """One line naming the ONNX node, its op and the reason, for a failure of TVM's importer or a pass.

    `nodes` maps sanitised node / var names to ONNX node names; for FoldConstant failing on `mod`, the
    first binding on constants whose legalization raises is the node named."""
    node = getattr(err, "onnx_node", None) or (_failing_binding(mod) if mod is not None else None)
    if node:
        name, op = nodes.get(node[0], node[0]), node[1]
        at = f" at node {name!r} ({op})" if name else f" at an {op} node"
    else:
        at = ""
    hint = "" if "nodes_after" in record else f" (simplifier not run: {record.get('skipped')})"
    return FusionError(f"{where}: {stage} failed{at}: {type(err).__name__}: {_first_line(err)}{hint}")


def _failing_binding(mod) -> tuple[str, str] | None:
    """(var name, op) of the first foldable binding in `main` (all its operands constants) whose
    legalization raises, else None."""
    main = mod["main"] if "main" in [gv.name_hint for gv in mod.get_global_vars()] else None
    if main is None:
        return None
    for block in main.body.blocks:
        for binding in block.bindings:
            call = binding.value
            if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)):
                continue
            if any(isinstance(a, relax.Var) for a in call.args):
                continue  # FoldConstant only evaluates calls on constants; LegalizeOps skips the others
            legalize = call.op.get_attr("FLegalize")
            if legalize is None:
                continue
            bb = relax.BlockBuilder(mod)
            try:
                with bb.function("probe", []):
                    legalize(bb, call)
                    bb.emit_func_output(relax.const(0))
            except Exception:  # noqa: BLE001 - this is the binding we are looking for
                return var_name(binding.var), str(call.op.name).replace("relax.", "")
    return None


