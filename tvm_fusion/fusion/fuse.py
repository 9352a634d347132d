"""The fuse stage: normalize BatchNorm, match the rule table, lower each match to a scheduled PrimFunc.

    batch_norm(x)[0]            ==>  x * s + t                      (inference only; s, t per channel)
    FuseOpsByPattern(rules)     ==>  private functions {"Composite": rule name}     (`match`)
    composite call              ==>  call_tir(<rule name PrimFunc>, inputs + folded constants)   (`lower`;
                                     constants packed into the target schedule's tile layout)
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

import numpy as np

from tvm_fusion import _tvm, registry
from tvm_fusion import patterns as builtin_patterns
from tvm_fusion._tvm import dpl, relax, te, tirx, tvm
from tvm_fusion.errors import FusionError, InternalError, LoweringError
from tvm_fusion.frontend.importer import onnx_node_names
from tvm_fusion.rules import (Decline, Lowering, Match, Rule, RuleSet, batch_shape, declared_batch_dims, dim_name,
                              shape_text, symbolic_reason, undeclared_dims)
from tvm_fusion.fusion.chain_layout import ChainPlan, plan_chains
from tvm_fusion.hardware import cpu_facts
from tvm_fusion.schedules.activations import fast_math_allowed
from tvm_fusion.schedules.conv2d import CONV_FAMILY
from tvm_fusion.schedules.conv2d_blocked import BLOCKED_CONV, BLOCKED_DEPTHWISE, blocked_shape

__all__ = ["Decision", "FuseResult", "Group", "Matched", "fuse", "lower", "match", "normalize_batch_norm", "unchanged"]

#: PrimFunc attribute of a kernel with a symbolic batch: its largest stage's elements per unit of the batch
ELEMENTS_PER_BATCH_ATTR = "tvm_fusion.elements_per_batch"


@dataclass
class Decision:
    """One rule's verdict on one candidate: accepted, or declined with a reason."""

    rule: str
    root: str  # relax var name of the candidate's root
    onnx_node: str
    reason: str | None  # None: accepted by the check


@dataclass
class Group:
    """One fused group in the output: the rule, the PrimFunc it became, the ONNX nodes it replaced."""

    rule: str
    function: str
    onnx_nodes: list[str]
    compute: str
    attrs: dict
    kernel: str = ""  # what its schedule says it runs on, where it says (CUDA: tensor cores, or CUDA cores and why)
    views: int = 0  # reshapes the lowering put around its call (a conv1d's [N, C, 1, W]): no kernel, no op of the model


@dataclass
class FuseResult:
    mod: tvm.IRModule
    counts: dict[str, int]
    groups: list[Group]
    decisions: list[Decision] = field(default_factory=list)
    matched: "Matched | None" = field(default=None, repr=False)  # before lowering: to lower for another target
    #: {PrimFunc name: the plain compute its hand schedule was applied to} (what tune.py hands MetaSchedule)
    plain: dict = field(default_factory=dict, repr=False)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


# ---------------------------------------------------------------- batch_norm(x)[0] -> x * s + t
def _inference_bn(call) -> bool:
    return (isinstance(call, relax.Call) and getattr(call.op, "name", "") == "relax.nn.batch_norm"
            and not bool(call.attrs.training) and all(_tvm.is_constant(a) for a in call.args[1:5])
            and _affine_axis(call) is not None)


def _affine_axis(bn) -> int | None:
    """The BatchNorm's axis when its size there is static (the batch alone may be symbolic), else None."""
    shape = batch_shape(bn.args[0])
    if not shape:
        return None
    axis = int(bn.attrs.axis) % len(shape)
    return axis if isinstance(shape[axis], int) else None


@relax.expr_functor.mutator
class _BatchNormToAffine(relax.PyExprMutator):
    def __init__(self, mod, var2val, names: dict):
        super().__init__(mod)
        self.var2val = var2val
        self.names = names  # relax var name -> ONNX node; the new scale var is added to it

    def visit_var_binding_(self, binding):
        value = binding.value
        bn = value.tuple_value if isinstance(value, relax.TupleGetItem) else None
        while isinstance(bn, relax.Var):  # through aliases
            bn = self.var2val.get(bn)
        if bn is None or value.index != 0 or not _inference_bn(bn):
            return super().visit_var_binding_(binding)
        x = self.visit_expr(bn.args[0])
        shape = batch_shape(bn.args[0])
        gamma, beta, mean, var = (_tvm.constant_value(a).astype(np.float64) for a in bn.args[1:5])
        axis = _affine_axis(bn)
        s = gamma / np.sqrt(var + float(bn.attrs.epsilon))
        t = beta - mean * s
        bshape = [1] * len(shape)
        bshape[axis] = shape[axis]
        dtype = str(_tvm.expr_type(bn.args[0]).dtype)
        name = _tvm.var_name(binding.var)  # named after the BatchNormalization node by the importer
        scale = _tvm.make_constant(s.reshape(bshape).astype(dtype))
        scaled = self.builder_.emit(relax.op.multiply(x, scale), name_hint=f"{name}_scale")
        if name in self.names:
            self.names[_tvm.var_name(scaled)] = self.names[name]
        affine = relax.op.add(scaled, _tvm.make_constant(t.reshape(bshape).astype(dtype)))
        # a graph output leaves a dataflow block through emit_output; outside one (the importer builds no
        # dataflow block when the graph has an If) every binding is a plain emit
        in_dataflow = self.builder_.current_block_is_dataflow()
        is_output = in_dataflow and not isinstance(binding.var, relax.DataflowVar)
        emit = self.builder_.emit_output if is_output else self.builder_.emit
        self.set_var_remap(binding.var, emit(affine, name_hint=name))


def normalize_batch_norm(mod: tvm.IRModule, names: dict | None = None) -> tvm.IRModule:
    """Inference batch_norm(x, gamma, beta, mean, var)[0]  ==>  x * s + t,
    s = gamma / sqrt(var + eps), t = beta - mean * s, shaped to broadcast along the BN axis.
    The result keeps the BatchNorm node's name, so matches and messages still name it."""
    out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function) and "Composite" not in (func.attrs or {}):
            mutator = _BatchNormToAffine(out, relax.analysis.get_var2val(func), {} if names is None else names)
            out[gv] = mutator.visit_expr(func)
    return relax.transform.DeadCodeElimination()(out)


# ---------------------------------------------------------------- matching
class _Trace:
    def __init__(self, names: dict[str, str]):
        self.names = names
        self.decisions: dict[tuple[str, str], Decision] = {}
        self.errors: list[str] = []  # bad input: a user's rule file that raised, a FusionError
        self.internal: list[tuple[str, Exception]] = []  # a built-in rule that raised, and what it raised
        self.members: dict = {}  # relax Var -> ONNX nodes of the accepted match it belongs to
        self.outside: dict = {}  # relax Var -> who reads it outside its dataflow block (_readers_outside_blocks)

    def record(self, rule: str, root: str, reason: str | None) -> None:
        self.decisions[(rule, root)] = Decision(rule, root, self.names.get(root, root), reason)


def _label(var, names: dict[str, str]) -> str:
    """The ONNX node a var came from; a var leaving the dataflow block unnamed is the graph's output."""
    name = _tvm.var_name(var)
    if name in names:
        return names[name]
    return name if isinstance(var, relax.DataflowVar) else f"the graph output {name}"


def _leak(ctx, names: dict[str, str], outside: dict) -> str | None:
    """An intermediate of the match that something outside the match also reads: a binding of its dataflow
    block (`ctx.var_usages`), or, for a var that leaves the block, a reader after it (`outside`, see
    _readers_outside_blocks: an If branch, a later block, the function's result)."""
    matched = set(ctx.matched_bindings.keys())
    root_var = ctx.value_to_bound_var.get(ctx.matched_expr)
    label = lambda v: _label(v, names)  # noqa: E731
    for var in matched:
        if root_var is not None and var.same_as(root_var):
            continue
        users = [u for u in ctx.var_usages.get(var, []) if u not in matched]
        if users:
            all_users = list(ctx.var_usages.get(var, []))
            return (f"intermediate {label(var)} has {len(all_users)} consumers "
                    f"({', '.join(label(u) for u in all_users)}); fusing would hide it from "
                    f"{', '.join(label(u) for u in users)}")
        if not isinstance(var, relax.DataflowVar):  # read after its dataflow block
            readers = [what for user, what in outside.get(var, []) if user not in matched]
            name = names.get(_tvm.var_name(var), _tvm.var_name(var))
            if not readers:
                return (f"the match spans two dataflow blocks (intermediate {name} is read after the block that "
                        "computes it, past an If); a fused call cannot take values from two blocks")
            return (f"intermediate {name} is also read by {', '.join(dict.fromkeys(readers))}; fusing would hide "
                    "it from them")
    return None


def _readers_outside_blocks(mod: tvm.IRModule, names: dict[str, str]) -> dict:
    """relax Var -> [(reading var, how messages name it)] for every binding that reads it (an If reads what its
    branches read: tensors of the enclosing graph; the importer builds no dataflow block around it), and
    the function's result (a graph output, reading var None)."""
    readers: dict = {}
    for func in mod.functions.values():
        if not isinstance(func, relax.Function) or "Composite" in (func.attrs or {}) \
                or not isinstance(func.body, relax.SeqExpr):
            continue
        for block in func.body.blocks:
            for b in block.bindings:
                what = (f"the If {names.get(_tvm.var_name(b.var), _tvm.var_name(b.var))}"
                        if isinstance(b.value, relax.If) else _label(b.var, names))
                for v in relax.analysis.free_vars(b.value):
                    readers.setdefault(v, []).append((b.var, what))
        for v in relax.analysis.free_vars(func.body.body):
            readers.setdefault(v, []).append((None, "the graph's output"))
    return readers


def _undeclared(ctx, batch_dims: frozenset[str], names: dict[str, str]) -> str | None:
    """A value of the match (an intermediate, or an input of one of its ops) whose shape has a symbolic dim
    the model's inputs do not declare: computed inside the graph (Range's length), it is bound by a match_cast
    that FuseOpsByPattern may order after the fused call, which then cannot be shape-lowered."""
    for var, value in ctx.matched_bindings.items():
        for expr in [var, *getattr(value, "args", [])]:
            if isinstance(expr, relax.Expr) and undeclared_dims(expr, batch_dims):
                what = _label(expr, names) if isinstance(expr, relax.Var) else "an operand"
                return symbolic_reason(what, expr, batch_dims)
    return None


def _lowering_shapes(lowering: Lowering) -> list[tuple]:
    return [lowering.shape_of_input(i) for i in range(len(lowering.inputs))] + \
        [tuple(c.shape) for c in lowering.constants]


def _kernel_key(rule: str, lowering: Lowering) -> tuple:
    """What makes two groups' PrimFuncs the same: rule, compute, attributes, and each input's and constant's
    shape and dtype, inputs and constants apart (a chain of `x + c` and one of `x + y` with equal shapes and
    recipes compute alike but take their operands in another order). Constant values are not: they are the
    kernel's arguments. The target is one per lowering (tests/test_kernel_identity.py)."""
    inputs = [(lowering.shape_of_input(i), str(_tvm.expr_type(e).dtype)) for i, e in enumerate(lowering.inputs)]
    consts = [(tuple(c.shape), str(c.dtype)) for c in lowering.constants]
    return rule, lowering.compute, repr(inputs), repr(consts), repr(sorted(lowering.attrs.items()))


def _is_builtin(rule: Rule) -> bool:
    """Whether `rule` is one of tvm_fusion's own (defined in the built-in patterns package)."""
    return os.path.dirname(os.path.abspath(rule.source)) == os.path.dirname(os.path.abspath(builtin_patterns.__file__))


def _make_check(rule: Rule, trace: _Trace, target, batch_dims: frozenset[str]):
    def check(ctx) -> bool:
        root = ctx.value_to_bound_var.get(ctx.matched_expr)
        root_name = _tvm.var_name(root) if root is not None else "?"
        try:
            match = Match(rule.name, dict(ctx.annotated_expr.items()), dict(ctx.matched_bindings.items()),
                          batch_dims)
            leak = _leak(ctx, trace.names, trace.outside)
            undeclared = _undeclared(ctx, batch_dims, trace.names)
            if undeclared is not None:
                reason = leak or undeclared
            else:  # the rule's own check too: a subgraph of another family is no near miss, even one that leaks
                own = rule.run_check(match)
                other_family = isinstance(own, Decline) and own.other_family
                reason = own if own is not None and (leak is None or other_family) else leak
            if reason is None:
                lowering = rule.spec.lower(match)
                sched = registry.get_schedule(lowering.compute, target.kind.name)
                if sched is None:
                    reason = Decline(f"no {target.kind.name} schedule is registered for {rule.name}")
                else:
                    why = sched.why_not(lowering.attrs, _lowering_shapes(lowering), target)
                    reason = Decline(why) if why else None
        except FusionError as err:
            trace.errors.append(str(err))
            return False
        except Exception as err:  # a broken rule must not surface as a TVM traceback
            # a rule file the user gave is bad input (exit 2); a built-in rule that raises is our bug (exit 3)
            raised = f"{rule.source}: rule {rule.name!r} raised {type(err).__name__}: {err}"
            if _is_builtin(rule):
                trace.internal.append((raised, err))
            else:
                trace.errors.append(raised)
            return False
        if not (isinstance(reason, Decline) and reason.other_family):  # another family's subgraph: no near miss
            trace.record(rule.name, root_name, None if reason is None else str(reason))
        if reason is None:  # the ONNX nodes of the match, findable from any of its vars
            variables = list(ctx.matched_bindings.keys())
            nodes = sorted({trace.names[n] for n in map(_tvm.var_name, variables) if n in trace.names})
            for v in variables:  # the composite function reuses these Var objects, except its output
                trace.members[v] = nodes
            # a one-op match has no other var: its constant operands (the same objects) find it instead
            for arg in getattr(ctx.matched_expr, "args", []):
                if _tvm.is_constant(arg):
                    trace.members[arg] = nodes
        return reason is None

    return check


# ---------------------------------------------------------------- lowering composites
class _KernelDims:
    """A symbolic (Relax, int64) dim as an int32 variable of the kernel, as every static dim is, so each buffer
    access keeps one index dtype (the schedules' layout transforms refuse a mix); translated back to the
    Relax variable for the call's output type. The VM binds it from the tensor's shape at every call. Only
    the batch dims the model's inputs declare are taken (the checks declined every other, see _undeclared)."""

    def __init__(self, batch_dims: frozenset[str] | None = None):
        self.vars: dict[str, tuple] = {}  # name -> (kernel var, relax var)
        self.batch_dims = batch_dims

    def kernel(self, shape) -> list:
        for d in shape:
            if not isinstance(d, int) and self.batch_dims is not None and dim_name(d) not in self.batch_dims:
                raise LoweringError(f"internal error: a kernel input dim {d} is not a batch dim the model's inputs "
                                    f"declare ({', '.join(sorted(self.batch_dims)) or 'none'})")
        return [d if isinstance(d, int) else self.vars.setdefault(dim_name(d), (tirx.Var(dim_name(d), "int32"), d))[0]
                for d in shape]

    def relax(self, shape) -> list:
        relax_of = {name: rv for name, (_, rv) in self.vars.items()}
        out = []
        for d in shape:
            if isinstance(d, tirx.IntImm):
                out.append(int(d))
            elif isinstance(d, tirx.Var) and dim_name(d) in relax_of:
                out.append(relax_of[dim_name(d)])
            else:
                raise LoweringError(f"internal error: a kernel output dim {d} is not one of its input dims")
        return out


def _elements_per_batch(out) -> int:
    """The most elements any stage of a kernel with a symbolic batch holds per unit of the batch (its int32
    indexing overflows past MAX_ELEMENTS / this): stages, inputs and output, from the TE graph."""
    seen, stack, most = set(), [out], 1
    while stack:
        t = stack.pop()
        if t.op.name in seen:
            continue
        seen.add(t.op.name)
        if not all(isinstance(d, tirx.IntImm) for d in t.shape):  # the weights do not grow with the batch
            most = max(most, int(np.prod([int(d) for d in t.shape if isinstance(d, tirx.IntImm)], dtype=np.int64)))
        stack.extend(t.op.input_tensors if hasattr(t.op, "input_tensors") else [])
    return most


def _scheduled(lowering: Lowering, target, any_target: bool) -> tuple[Lowering, bool]:
    """(the lowering with its constants in the layout the target's schedule reads, whether it is scheduled):
    with `any_target`, a group this target's schedule cannot take keeps its constants and plain compute."""
    sched = registry.get_schedule(lowering.compute, target.kind.name)
    shapes = _lowering_shapes(lowering)
    if any_target and (sched is None or sched.why_not(lowering.attrs, shapes, target)):
        return lowering, False
    return dataclasses.replace(lowering, constants=sched.packed(lowering.constants, lowering.attrs, shapes, target)), True


def _build_primfunc(lowering: Lowering, target, scheduled: bool = True, batch_dims: frozenset[str] | None = None):
    """(scheduled PrimFunc, the Relax type of its output, what the schedule says the kernel runs on or "",
    the plain compute the schedule was applied to); `scheduled=False`: (the plain compute, the type, "", None)."""
    compute = registry.get_compute(lowering.compute, target.kind.name)
    dims = _KernelDims(batch_dims)
    tensors = [te.placeholder(dims.kernel(lowering.shape_of_input(i)), str(_tvm.expr_type(e).dtype), name=f"in{i}")
               for i, e in enumerate(lowering.inputs)]
    consts = [te.placeholder(c.shape, str(c.dtype), name=f"c{i}") for i, c in enumerate(lowering.constants)]
    # the calling convention of every compute: (first input, *constants, *other inputs)
    args = [tensors[0], *consts, *tensors[1:]]
    # a target's compute may pad to its tile (llvm conv2d) and take its math: it names `target` to get it
    options = registry.compute_options(compute, fast_math=fast_math_allowed(t.dtype for t in args), target=target)
    out = compute(*args, **lowering.attrs, **options)
    func = te.create_prim_func([*tensors, *consts, out])
    func = func.without_attr("global_symbol").with_attr("op_pattern", _tvm.OPAQUE)
    if dims.vars:
        func = func.with_attr(ELEMENTS_PER_BATCH_ATTR, _elements_per_batch(out))
    out_ty = _tvm.tensor_type(dims.relax(out.shape), str(out.dtype))
    if not scheduled:
        return func, out_ty, "", None  # matched for another target: the plain compute, left to TVM's default schedules
    sched = registry.get_schedule(lowering.compute, target.kind.name)
    sch = _tvm.Schedule(tvm.IRModule({"main": func}))
    with target:
        engine = sched.apply(sch, lowering.attrs, target)
    return sch.mod["main"].with_attr(_tvm.SCHEDULED_ATTR, True), out_ty, engine or "", func


def _type_mismatch(rule: str, nodes: list[str], composite_call, shape, dtype, block: int = 0) -> str | None:
    """The lowered group must have exactly the type of the composite call it replaces (`block`: in NCHW[block]c):
    a rule whose kernel (after its out_shape view) has another shape or dtype is a bug, never a silently
    different output."""
    want_shape, want_dtype = batch_shape(composite_call), str(_tvm.expr_type(composite_call).dtype)
    if block and want_shape is not None:
        want_shape = blocked_shape(want_shape, block)
    dim = lambda d: int(d) if isinstance(d, (int, tirx.IntImm)) else dim_name(d)  # noqa: E731  (N compares by name)
    got_shape, got_dtype = tuple(map(dim, shape)), str(dtype)
    if want_shape is not None and (got_shape, got_dtype) == (tuple(map(dim, want_shape)), want_dtype):
        return None
    return (f"internal error: rule {rule} (ONNX nodes {', '.join(nodes) or '?'}) lowers to a kernel of shape "
            f"{shape_text(got_shape)} {got_dtype}; the subgraph it replaces has shape "
            f"{shape_text(composite_call)} {want_dtype}")


def _caller_dims(params, args) -> dict[str, object]:
    """{symbolic dim name in the composite function (FuseOpsByPattern gives each function its own N): the
    caller's dim}, matched through the shapes of the function's parameters and the call's arguments."""
    outer: dict[str, object] = {}
    for p, a in zip(params, args):
        inner_shape, outer_shape = (getattr(_tvm.expr_type(x), "shape", None) for x in (p, a))
        if inner_shape is None or outer_shape is None:
            continue
        for d, o in zip(inner_shape, outer_shape):
            if isinstance(d, tirx.Var):
                outer.setdefault(dim_name(d), o)
    return outer


def _shape_in_caller(shape, outer: dict) -> tuple:
    """A view's shape (a Lowering's input or output view) in the caller's dims (`_caller_dims`)."""
    return tuple(outer.get(dim_name(d), d) if isinstance(d, tirx.Var) else d for d in shape)


def _in_caller(out_ty, params, args):
    """`out_ty` (in the composite function's symbolic dims) in the caller's dims."""
    if not any(isinstance(d, tirx.Var) for d in out_ty.shape):
        return out_ty
    return _tvm.tensor_type(list(_shape_in_caller(out_ty.shape, _caller_dims(params, args))), str(out_ty.dtype))


@relax.expr_functor.mutator
class _LowerComposites(relax.PyExprMutator):
    def __init__(self, mod, rules: RuleSet, target, members, any_target: bool = False,
                 batch_dims: frozenset[str] | None = None, blocked_layout: bool = True):
        super().__init__(mod)
        self.batch_dims = batch_dims
        self.any_target = any_target
        self.mod_ = mod
        self.rules = rules
        self.target = target
        self.members = members
        self.cache: dict = {}
        self.groups: list[Group] = []
        self.plain: dict[str, tirx.PrimFunc] = {}  # PrimFunc name -> the plain compute its hand schedule took
        self.errors: list[str] = []
        self.blocked_layout = blocked_layout
        self.composites: dict = {}  # composite call -> _composite(call), found while planning
        self.plan = ChainPlan({})

    def _composite(self, call):
        """(rule, composite function, its var2val, the match's Lowering) of a composite call; None otherwise."""
        if not isinstance(call.op, tvm.ir.GlobalVar):
            return None
        func = self.mod_[call.op]
        comp = (func.attrs or {}).get("Composite") if isinstance(func, relax.Function) else None
        if comp is None:
            return None
        rule = self.rules[str(comp)]
        spec = rule.spec
        var2val = relax.analysis.get_var2val(func)
        body = func.body.body if isinstance(func.body, relax.SeqExpr) else func.body
        matched = spec.pattern.extract_matched_expr(body, var2val)
        if matched is None:
            raise FusionError(f"rule {rule.name}: composite function no longer matches its pattern")
        exprs = {n: matched[p] for n, p in spec.annotations.items() if p in matched}
        return rule, func, var2val, spec.lower(Match(rule.name, exprs, var2val, self.batch_dims))

    def _plan(self, func) -> ChainPlan:
        """The blocked-layout chains of `func`'s conv groups (chain_layout.py)."""
        if not self.blocked_layout or self.any_target:
            return ChainPlan({})
        lowered = {}
        for block in func.body.blocks:
            for binding in block.bindings:
                call = binding.value
                found = self._composite(call) if isinstance(call, relax.Call) else None
                if found is None or found[3].compute != CONV_FAMILY:
                    continue
                self.composites[call] = found
                params = {p: a for p, a in zip(found[1].params, call.args)}
                lowering = found[3]
                lowered[call] = (dataclasses.replace(lowering, inputs=[params.get(e, e) for e in lowering.inputs]),
                                 batch_shape(call))
        return plan_chains(func, lowered, self.target)

    def visit_call_(self, call):
        original = call
        found = self.composites.get(original) or self._composite(call)
        if found is None:
            return super().visit_call_(call)
        rule, func, var2val, lowering = found
        # the operands as lowered (a blocked tensor no longer has the composite function's parameter type)
        args = [self.visit_expr(a) for a in call.args]
        out_blocked = self.plan.out_blocked(original)
        if out_blocked is not None:
            compute = BLOCKED_CONV if lowering.attrs.get("groups", 1) == 1 else BLOCKED_DEPTHWISE
            lowering = dataclasses.replace(lowering, compute=compute,
                                           attrs={**lowering.attrs, "out_blocked": out_blocked})
        lowering, scheduled = _scheduled(lowering, self.target, self.any_target)
        params = {p: a for p, a in zip(func.params, args)}
        outer = _caller_dims(func.params, args)
        inputs = [params.get(e, e) for e in lowering.inputs]
        if out_blocked is not None:  # the kernel's operands are the call's (some of them blocked)
            lowering = dataclasses.replace(lowering, inputs=inputs)
        inputs = [relax.op.reshape(e, _shape_in_caller(lowering.input_shapes[i], outer))
                  if i in lowering.input_shapes else e for i, e in enumerate(inputs)]
        # one PrimFunc per rule (named after it), operand types and attributes, even where rules share a compute
        key = _kernel_key(rule.name, lowering)
        if key not in self.cache:
            prim, out_ty, engine, plain = _build_primfunc(lowering, self.target, scheduled, self.batch_dims)
            gv = self.builder_.add_func(prim, rule.name)
            if plain is not None:
                self.plain[gv.name_hint] = plain
            self.cache[key] = (gv, out_ty, engine)
        gv, out_ty, engine = self.cache[key]
        out_ty = _in_caller(out_ty, func.params, args)
        consts = [_tvm.make_constant(c) for c in lowering.constants]
        nodes = sorted({m for v in var2val for m in self.members.get(v, [])})
        if not nodes:
            nodes = sorted({m for value in var2val.values() for a in getattr(value, "args", [])
                            for m in self.members.get(a, [])})
        block = cpu_facts(self.target).float32_lanes if out_blocked else 0
        mismatch = _type_mismatch(rule.name, nodes, original, lowering.out_shape or out_ty.shape, out_ty.dtype, block)
        if mismatch:  # raised by run(): an exception raised here would cross TVM's FFI as a RuntimeError
            self.errors.append(mismatch)
            return original
        self.groups.append(Group(rule.name, gv.name_hint, nodes, lowering.compute, dict(lowering.attrs), engine,
                                 len(lowering.input_shapes) + bool(lowering.out_shape)))
        call = relax.call_tir(gv, [*inputs, *consts], out_ty)
        return relax.op.reshape(call, _shape_in_caller(lowering.out_shape, outer)) if lowering.out_shape else call

    def run(self):
        for gv, func in self.mod_.functions.items():
            if isinstance(func, relax.Function) and "Composite" not in (func.attrs or {}):
                self.plan = self._plan(func)
                self.builder_.update_func(gv, self.visit_expr(func))
        if self.errors:
            raise LoweringError(self.errors[0])
        return self.builder_.get()


@dataclass
class Matched:
    """The module after matching: each accepted match is a call of a private {"Composite": rule} function
    holding the original ops; `members` maps the matched vars to the ONNX nodes of their match."""

    mod: tvm.IRModule
    rules: RuleSet
    members: dict
    decisions: list[Decision]
    batch_dims: frozenset[str] | None = None  # the symbolic dims the inputs declare (rules.declared_batch_dims)


def needed_ops(pattern, memo: dict | None = None) -> frozenset[str]:
    """The ops every match of a dpl `pattern` calls (of alternatives, those all of them call); a pattern
    needing an op the module never calls cannot match, and FuseOpsByPattern's pass per pattern costs more
    than linear time in the function's size (an unrolled LSTM has thousands of bindings)."""
    memo = {} if memo is None else memo
    if pattern in memo:
        return memo[pattern]
    out: frozenset[str] = frozenset()
    if isinstance(pattern, dpl.CallPattern):
        op = pattern.op.expr if isinstance(pattern.op, dpl.ExprPattern) else None
        out = frozenset([str(op.name)] if isinstance(op, tvm.ir.Op) else [])
        out = out.union(*(needed_ops(a, memo) for a in (pattern.args or [])))
    elif isinstance(pattern, dpl.OrPattern):
        out = needed_ops(pattern.left, memo) & needed_ops(pattern.right, memo)
    elif isinstance(pattern, dpl.AndPattern):
        out = needed_ops(pattern.left, memo) | needed_ops(pattern.right, memo)
    elif isinstance(pattern, dpl.TuplePattern):
        out = frozenset().union(*(needed_ops(f, memo) for f in pattern.fields))
    elif isinstance(pattern, dpl.TupleGetItemPattern):
        out = needed_ops(pattern.tuple, memo)
    elif isinstance(pattern, (dpl.DataTypePattern, dpl.ShapePattern, dpl.TypePattern, dpl.AttrPattern)):
        out = needed_ops(pattern.pattern, memo)
    memo[pattern] = out
    return out


def _module_ops(mod: tvm.IRModule) -> frozenset[str]:
    """The ops the Relax functions FuseOpsByPattern visits call."""
    names: set[str] = set()
    visit = lambda e: isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and names.add(str(e.op.name))  # noqa: E731
    for func in mod.functions.values():
        if isinstance(func, relax.Function) and "Composite" not in (func.attrs or {}):
            relax.analysis.post_order_visit(func, visit)
    return frozenset(names)


def match(mod: tvm.IRModule, target, rules: RuleSet) -> Matched:
    """Normalize BatchNorm and group every accepted match into a composite function (nothing lowered yet)."""
    names = onnx_node_names(mod)
    active = rules.for_target(target.kind.name)
    trace = _Trace(names)
    batch_dims = frozenset().union(*(declared_batch_dims(f) for f in mod.functions.values()
                                     if isinstance(f, relax.Function) and "Composite" not in (f.attrs or {})))
    mod = normalize_batch_norm(mod, names)
    trace.outside = _readers_outside_blocks(mod, names)
    present, memo = _module_ops(mod), {}
    patterns = [
        _tvm.FusionPattern(r.name, pattern, annotations, _make_check(r, trace, target, batch_dims))
        for r in active.ordered() for pattern, annotations in r.spec.patterns()
        if needed_ops(pattern, memo) <= present
    ]
    matched = relax.transform.FuseOpsByPattern(patterns, bind_constants=True, annotate_codegen=False)(mod)
    if trace.internal:
        message, err = trace.internal[0]
        raise InternalError(message) from err
    if trace.errors:
        raise FusionError(trace.errors[0])
    return Matched(matched, active, trace.members, list(trace.decisions.values()), batch_dims)


def lower(matched: Matched, target, *, any_target: bool = False, blocked_layout: bool = True
          ) -> tuple[tvm.IRModule, list[Group]]:
    """Replace each composite call by a call_tir of its rule's scheduled PrimFunc. `any_target`: the matches
    were made for another target, so a group this target's schedule cannot take keeps its plain compute.
    `blocked_layout`: conv chains pass their activations in NCHW[x]c (chain_layout.py)."""
    out, groups, _ = _lower(matched, target, any_target, blocked_layout)
    return out, groups


def _lower(matched: Matched, target, any_target: bool = False, blocked_layout: bool = True):
    """(module, groups, {PrimFunc name: its plain compute} of the hand-scheduled PrimFuncs)."""
    lowering = _LowerComposites(matched.mod, matched.rules, target, matched.members, any_target, matched.batch_dims,
                                blocked_layout)
    out = lowering.run()
    out = relax.transform.DeadCodeElimination()(relax.transform.CanonicalizeBindings()(out))
    return out, lowering.groups, {name: f for name, f in lowering.plain.items() if name in {gv.name_hint for gv in out.get_global_vars()}}


def fuse(mod: tvm.IRModule, target, rules: RuleSet, *, blocked_layout: bool = True) -> FuseResult:
    """Run the fuse stage for `target` with `rules`; returns the module, per-rule counts and groups.
    `blocked_layout`: conv chains pass their activations in NCHW[x]c where chain_layout.py finds it pays."""
    matched = match(mod, target, rules)
    out, groups, plain = _lower(matched, target, blocked_layout=blocked_layout)
    counts = {r.name: 0 for r in matched.rules.ordered()}
    for g in groups:
        counts[g.rule] += 1
    return FuseResult(out, counts, groups, matched.decisions, matched, plain)


def unchanged(result: FuseResult, mod: tvm.IRModule) -> bool:
    """Whether fuse() left `mod` as it was: no rule fired and no BatchNorm was rewritten, so its module is
    structurally equal to `mod` up to the binding canonicalization and dead-code elimination it ends with
    (which change no value). A fused build of an unchanged module computes what the unfused build does."""
    if result.total:
        return False
    plain = relax.transform.DeadCodeElimination()(relax.transform.CanonicalizeBindings()(mod))
    return _tvm.structural_equal(result.mod, plain)
