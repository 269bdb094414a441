"""ONNX If, Loop and Scan: subgraphs converted to the IR's ``If`` and ``Loop``.

The branches are ONNX graphs without inputs that may read any value of the enclosing scopes
by name (outer-scope references); the importer's table of values in scope is ``context.scope``
(set by ``convert_node``).  Each branch is converted node by node into its own builder with a
copy of that table, so a branch sees the outer values and its own, and nothing it defines
leaks out.

The condition is a one-element bool tensor in ONNX.  When it folds at compile time (a
constant, or a shape comparison that the prover decides) only the branch taken is converted,
inline.  A symbolic prim value (``n == 4`` on shape values) gives an ``If`` decided in the
host without reading anything back; a tensor gives an ``If`` on a value read from the GPU.
An ``If`` cannot go in a dataflow block: the importer builds a function that contains one
without dataflow blocks.  Outputs whose shapes differ between the branches join to a rank
(``Tensor(ndim=k)``); they are matched against fresh size variables so that later ops have
a shape to work with.

A ``Loop`` or ``Scan`` body is converted the same way, once, into the body of an IR
``Loop`` (``relaxweb/ir/expr.py``), whose iteration is a size variable: ONNX's iteration
number is that variable as a shape value, so ``Slice(x, i, i + 1)`` in a body is a
symbolic slice (its extent 1, its start the iteration's, read by the kernel from its
params).  The number of iterations must be known to the host before the loop: a ``Loop``'s
trip count and its initial condition are constants, shape values, or tensors read back
from the GPU at the top level of the graph (the condition, 0 or 1, multiplies the count),
and its body must pass the condition through unchanged (a condition the body computes
decides after each iteration whether to go on: not supported).  A ``Scan`` runs over the
extent of its scan inputs' axis (symbolic: one build serves every length); each
iteration's slices are ``strided_slice`` s at the iteration (``count - 1 - i`` in reverse)
and its outputs are stacked along axis 0, then reversed and moved to their axes as the
attributes ask.  Carried values keep their dtypes and shapes from one iteration to the
next (they live in fixed storages): a next value whose dims cannot be proved equal to the
carried ones is checked at run time (a ``match_cast``), one whose dtype or rank changes is
an error naming the value.  Opset 8's
Scan (a batch axis first, optional sequence lengths) is supported for a batch of 1
without sequence lengths.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx

from ...errors import RelaxwebError, UnsupportedModelError
from ...ir.builder import FunctionBuilder
from ...ir.expr import Constant, Expr, MatchCast, PrimValue, ShapeExpr, TensorToPrim, TupleGetItem
from ...ir.struct_info import (
    OptionalStructInfo, PrimStructInfo, SequenceStructInfo, TensorStructInfo, is_less_specific,
)
from ...ir.symbolic import IntImm, PrimExpr, as_int, format_expr, free_vars, prove_equal, simplify
from ...ops import call_op, strided_slice
from .manipulation import fail, fresh_size_var, node_name, used_size_vars
from .node import convert_node, format_unsupported
from .registry import CONVERTERS, converter, converter_key, nodes_with_subgraphs, tensor_to_array
from .shape_values import make_constant, materialize


def check_supported(node: onnx.NodeProto, graphs: list[onnx.GraphProto]) -> None:
    """One error listing every unsupported op type of the branches (nested ones included)."""
    unsupported: dict[str, list[str]] = {}
    for graph in graphs:
        for index, inner in enumerate(nodes_with_subgraphs(graph.node)):
            key = converter_key(inner.domain, inner.op_type)
            if key in CONVERTERS:
                continue
            unsupported.setdefault(key, []).append(inner.name or f"#{index} (unnamed)")
    if unsupported:
        where = "branches" if node.op_type == "If" else "body"
        raise UnsupportedModelError(f"{node.op_type} node '{node.name}': in its {where}, " + format_unsupported(unsupported))


def convert_graph(context, graph: onnx.GraphProto, outer: dict[str, Expr]) -> list[Expr]:
    """Convert a subgraph's nodes into ``context.builder``; its outputs' values."""
    values = dict(outer)
    for initializer in graph.initializer:
        values[initializer.name] = make_constant(context, tensor_to_array(initializer), initializer.name)
    for index, node in enumerate(graph.node):
        convert_node(context, node, index, values, set())
    results = []
    for output in graph.output:
        if output.name not in values:
            raise UnsupportedModelError(f"subgraph '{graph.name}': output '{output.name}' is not produced by any node")
        results.append(values[output.name])
    return results


def _child_context(context, builder):
    child = dataclasses.replace(context, builder=builder)
    child.size_var_names = used_size_vars(context)  # one namespace of size variables
    return child


def _constant_truth(condition: Expr) -> bool | None:
    if isinstance(condition, Constant):
        return bool(condition.data.reshape(-1)[0]) if condition.data.size == 1 else None
    values = condition.values if isinstance(condition, ShapeExpr) else \
        (condition.value,) if isinstance(condition, PrimValue) else None
    if values is None or len(values) != 1 or as_int(values[0]) is None:
        return None
    return as_int(values[0]) != 0


@converter("If")
def convert_if(context, node, inputs):
    attrs = context.attributes(node)
    then_graph, else_graph = attrs["then_branch"], attrs["else_branch"]
    check_supported(node, [then_graph, else_graph])
    outer = dict(getattr(context, "scope", None) or {})
    condition = inputs[0]
    truth = _constant_truth(condition)
    if truth is not None:  # decided at compile time: only the branch taken, inline
        return convert_graph(context, then_graph if truth else else_graph, outer)
    if isinstance(condition, ShapeExpr):
        if len(condition.values) != 1:
            raise fail(node, "the condition must hold one value")
        condition = PrimValue(condition.values[0])
    elif isinstance(condition.struct_info, TensorStructInfo) and condition.struct_info.dtype != "int32":
        # the host reads a tensor condition back as an int32
        condition = context.builder.emit(call_op("cast", condition, dtype="int32"), f"{node_name(node)}_condition")
    if isinstance(condition, PrimValue) and _ranks_differ(context, then_graph, else_graph, outer):
        # a shape predicate whose branches give results of different ranks (torch's squeeze(dim)
        # of a dynamic dim: If(dim == 1, Squeeze, Identity)): the graph after it needs one rank,
        # so the then-branch is taken, and that the predicate holds is checked at run time
        context.builder.emit_match_cast(condition, PrimStructInfo("int64", IntImm(1)), f"{node_name(node)}_holds",
                                        reason=f"If node '{node.name}': its condition {format_expr(condition.value)}")
        return convert_graph(context, then_graph, outer)
    if context.builder.dataflow:
        raise fail(node, "an If cannot go in a dataflow block (import the model with from_onnx)")
    for graph in (then_graph, else_graph):
        if len(graph.output) != len(node.output):
            raise fail(node, f"branch '{graph.name}' has {len(graph.output)} outputs, the node {len(node.output)}")
    if len(node.output) > 1:
        # the host's If has one tensor result: one If per output, each branch pruned to the
        # nodes that output needs (work both outputs need runs in each)
        return [_single_if(context, node, condition, then_graph, else_graph, outer, index)
                for index in range(len(node.output))]
    return _single_if(context, node, condition, then_graph, else_graph, outer, 0)


def _ranks_differ(context, then_graph: onnx.GraphProto, else_graph: onnx.GraphProto, outer: dict) -> bool:
    """Whether the branches' results differ in rank (each branch converted into a scratch
    builder; a branch that does not convert decides nothing here)."""
    ranks = []
    for graph in (then_graph, else_graph):
        child = _child_context(context, FunctionBuilder("branch_probe", dataflow=False))
        try:
            values = convert_graph(child, graph, outer)
        except RelaxwebError:
            return False
        ranks.append([getattr(value.struct_info, "ndim", -1) for value in values])
    return any(a != b and -1 not in (a, b) for a, b in zip(*ranks))


def _pruned(graph: onnx.GraphProto, index: int) -> onnx.GraphProto:
    """The graph with only its output ``index`` and the nodes that output depends on."""
    needed, kept = {graph.output[index].name}, []
    for inner in reversed(graph.node):
        if needed & set(inner.output):
            kept.append(inner)
            needed |= {name for name in inner.input if name} | _subgraph_reads(inner)
    pruned = onnx.GraphProto()
    pruned.CopyFrom(graph)
    del pruned.node[:]
    pruned.node.extend(reversed(kept))
    del pruned.output[:]
    pruned.output.append(graph.output[index])
    return pruned


def _subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Every name the node's subgraphs read (outer-scope references included)."""
    inner_nodes = list(nodes_with_subgraphs([node]))[1:]
    return {name for inner in inner_nodes for name in inner.input if name}


def _single_if(context, node, condition, then_graph, else_graph, outer, index: int):
    """An If of the node's output ``index`` (its branches pruned to it when there are more)."""
    if len(node.output) > 1:
        then_graph, else_graph = _pruned(then_graph, index), _pruned(else_graph, index)

    def branch(graph: onnx.GraphProto):
        def build(builder) -> Expr:
            child = _child_context(context, builder)
            try:
                values = convert_graph(child, graph, outer)
            except UnsupportedModelError:
                raise
            except RelaxwebError as error:  # a shape deduction failed inside the branch
                # a branch may hold only for the inputs that take it (shapes the condition
                # tests at run time); relaxweb deduces every branch for all inputs
                raise UnsupportedModelError(
                    f"If node '{node.name}': branch '{graph.name}' has shapes relaxweb cannot prove "
                    f"for every input that reaches the If: {error}") from error
            if len(values) != 1:
                raise fail(node, f"branch '{graph.name}' has {len(values)} outputs, the node {len(node.output)}")
            value = materialize(child, values[0], f"{graph.name or 'branch'}_out")
            if not any(binding.var is value for binding in builder.bindings):
                # a branch ends with a value computed inside it (the host needs one); a
                # sequence or optional has no identity op: an alias
                copy = call_op("identity", value) if isinstance(value.struct_info, TensorStructInfo) else value
                value = builder.emit(copy, f"{graph.name or 'branch'}_out")
            return value
        return build

    chosen = context.builder.emit_if(condition, branch(then_graph), branch(else_graph), node_name(node))
    return _name_dims(context, node, chosen, node.output[index])


def _name_dims(context, node, value, name: str):
    """A tensor whose shape the branches disagree on, matched against fresh size variables."""
    info = value.struct_info
    if not isinstance(info, TensorStructInfo) or info.shape is not None or info.ndim == -1:
        return value
    dims = tuple(fresh_size_var(context, f"{name or node_name(node)}_dim{d}") for d in range(info.ndim))
    return context.builder.emit_match_cast(value, TensorStructInfo(dims, info.dtype), f"{name or 'if'}_cast")


# Loop and Scan ---------------------------------------------------------------------------------


def _host_value(context, node, value: Expr, what: str) -> PrimExpr:
    """A loop's trip count or condition as a value the host knows: a constant, a shape
    value, or a one-element tensor read back from the GPU into a fresh size variable."""
    if isinstance(value, Constant):
        if value.data.size != 1:
            raise fail(node, f"the {what} must hold one value, got shape {value.data.shape}")
        return IntImm(int(value.data.reshape(-1)[0]))
    if isinstance(value, PrimValue):
        return value.value
    if isinstance(value, ShapeExpr):
        if len(value.values) != 1:
            raise fail(node, f"the {what} must hold one value")
        return value.values[0]
    name = node_name(node)
    if not (isinstance(value.struct_info, TensorStructInfo) and value.struct_info.dtype == "int32"):
        value = context.builder.emit(call_op("cast", value, dtype="int32"), f"{name}_{what.replace(' ', '_')}")
    read = context.builder.emit(TensorToPrim(value), f"{name}_{what.replace(' ', '_')}_value")
    variable = fresh_size_var(context, f"{name}_{what.replace(' ', '_')}")
    context.builder.emit_match_cast(read, PrimStructInfo("int64", variable), f"{name}_{what.replace(' ', '_')}")
    return variable


def _loop_context(context, node):
    if context.builder.dataflow:
        raise fail(node, f"a {node.op_type} cannot go in a dataflow block (import the model with from_onnx)")
    return dict(getattr(context, "scope", None) or {})


def _keep_carried_shapes(node, builder, names: list[str], carried, next_values, stacked):
    """Each next value of a loop-carried value with the annotation of its carried variable:
    proved at build time, or, where the dims cannot be proved equal (a slice at the
    iteration, clamped to an extent the iteration might pass), checked at run time by a
    ``match_cast``, as Relax does; a stacked value of the same shape as such a next value
    (the same value, or an identity of it) is cast to the carried shape too.  A dtype or
    rank that changes is an error naming the value."""
    casts, assumed = {}, []  # assumed: (a next value's shape, the carried shape it is checked against)
    for name, var, value in zip(names, carried, next_values):
        want, got = var.struct_info, value.struct_info
        if is_less_specific(want, got):
            continue
        if not (isinstance(want, TensorStructInfo) and isinstance(got, TensorStructInfo) and want.shape is not None
                and want.dtype == got.dtype and want.ndim == got.ndim) or _differ(want.shape, got.shape):
            raise UnsupportedModelError(
                f"{node.op_type} node '{node.name}': the loop-carried value '{name}' is {want} before an iteration "
                f"and {got} after it; relaxweb supports loops whose carried values keep their dtypes and shapes")
        casts[value] = builder.emit_match_cast(value, want, f"{node_name(node)}_{name}_next")
        if got.shape is not None:
            assumed.append((got.shape, want.shape))
    stacked = [casts.get(v, v) for v in stacked]
    for position, value in enumerate(stacked):
        info = value.struct_info
        if value in casts.values() or not isinstance(info, TensorStructInfo) or info.shape is None:
            continue
        for got, want in assumed:
            if len(got) == len(info.shape) and all(prove_equal(a, b) for a, b in zip(got, info.shape)):
                target = TensorStructInfo(want, info.dtype)
                stacked[position] = builder.emit_match_cast(value, target, f"{node_name(node)}_stacked_{position}")
                break
    return [casts.get(v, v) for v in next_values], stacked


def _differ(shape, other) -> bool:
    """Two shapes with a dim that is a different constant in each: a check that always fails."""
    return other is not None and any(
        as_int(a) is not None and as_int(b) is not None and as_int(a) != as_int(b) for a, b in zip(shape, other))


def _check_stacked(node, names: list[str], iteration, builder, results) -> None:
    """A stacked value's shape is the same at every iteration: no size variable of the body in it."""
    local = {iteration.name} | {
        v.name for binding in builder.bindings if isinstance(binding, MatchCast)
        for v in _annotation_vars(binding.struct_info)}
    for name, value in zip(names, results):
        info = value.struct_info
        if not isinstance(info, TensorStructInfo) or info.shape is None or {v.name for v in _annotation_vars(info)} & local:
            raise UnsupportedModelError(
                f"{node.op_type} node '{node.name}': the scan output '{name}' is {info}, a shape that changes "
                "from one iteration to the next or is not known; relaxweb stacks values of one shape")


def _annotation_vars(info) -> set:
    if isinstance(info, TensorStructInfo) and info.shape is not None:
        return {v for d in info.shape for v in free_vars(d)}
    if isinstance(info, PrimStructInfo) and info.value is not None:
        return set(free_vars(info.value))
    return set()


def _loop_outputs(loop: Expr, count: int) -> list[Expr]:
    return [TupleGetItem(loop, index) for index in range(count)]


def _carried_init(context, value: Expr, name: str) -> Expr:
    """A carried sequence grows or shrinks from one iteration to the next, and its elements
    differ: it is carried as a sequence of tensors of its dtype (length, rank and dims
    unknown: exporters declare an empty sequence's element rank loosely), the initial value
    cast to that annotation (an optional sequence likewise)."""
    info = value.struct_info
    inner = info.inner if isinstance(info, OptionalStructInfo) else info
    if not isinstance(inner, SequenceStructInfo) or (inner.length is None and inner.element.ndim == -1):
        return value
    wide = SequenceStructInfo(TensorStructInfo(None, inner.element.dtype, -1))
    return context.builder.emit_match_cast(value, OptionalStructInfo(wide) if inner is not info else wide,
                                           f"{name}_carried")


@converter("Loop")
def convert_loop(context, node, inputs):
    body = context.attributes(node)["body"]
    check_supported(node, [body])
    outer = _loop_context(context, node)
    trip_count, condition = inputs[0], inputs[1] if len(inputs) > 1 else None
    if trip_count is None:
        raise fail(node, "a Loop without a trip count runs until its condition is false, which the body decides: "
                         "not supported (relaxweb needs the number of iterations before the loop)")
    count = _host_value(context, node, trip_count, "trip count")
    if condition is not None:
        count = simplify(count * _host_value(context, node, condition, "condition"))
    carried_count = len(inputs) - 2
    iteration = fresh_size_var(context, f"{node_name(node)}_iteration")
    names = [value.name for value in body.input[2:]]
    init = [(name, _carried_init(context, materialize(context, value, f"{name}_init"), name))
            for name, value in zip(names, inputs[2:])]

    def build(builder, carried):
        child = _child_context(context, builder)
        values = dict(outer)
        values[body.input[0].name] = PrimValue(iteration)
        # the body runs only while the condition is true
        values[body.input[1].name] = make_constant(child, np.array(True), f"{node_name(node)}_condition_true")
        values.update(zip(names, carried))
        results = convert_graph(child, body, values)
        condition_out = results[0]
        if not (isinstance(condition_out, Constant) and bool(condition_out.data.reshape(-1)[0])):
            raise fail(node, "the body computes the loop condition (a data-dependent number of iterations): "
                             "not supported; relaxweb runs loops whose body passes the condition through")
        outputs = [materialize(child, value, f"{graph_output.name or 'loop'}_out")
                   for value, graph_output in zip(results[1:], body.output[1:])]
        next_values, stacked = _keep_carried_shapes(node, builder, names, carried, outputs[:carried_count],
                                                    outputs[carried_count:])
        _check_stacked(node, [o.name for o in body.output[1 + carried_count:]], iteration, builder, stacked)
        return next_values, stacked

    loop = context.builder.emit_loop(count, iteration, init, build, node_name(node))
    return _loop_outputs(loop, len(node.output))


@converter("Scan")
def convert_scan(context, node, inputs):
    attrs = context.attributes(node)
    body = attrs["body"]
    check_supported(node, [body])
    outer = _loop_context(context, node)
    if context.opset < 9:
        return _convert_batched_scan(context, node, inputs, attrs, body, outer)
    return _scan(context, node, list(inputs), attrs, body, outer, attrs.get("scan_input_directions"))


def _convert_batched_scan(context, node, inputs, attrs, body, outer):
    """Opset 8: a batch axis first on every input and output, and optional sequence lengths."""
    if inputs[0] is not None:
        raise fail(node, "sequence_lens is not supported (opset 8 Scan): every sequence must run to the end")
    values = inputs[1:]
    for value in values:
        shape = value.struct_info.shape if isinstance(value.struct_info, TensorStructInfo) else None
        if shape is None or as_int(shape[0]) != 1:
            raise fail(node, "an opset 8 Scan is supported for a batch of 1 only")
    unbatched = [call_op("reshape", value, ShapeExpr(value.struct_info.shape[1:])) for value in values]
    unbatched = [context.builder.emit(value, f"{node_name(node)}_unbatched") for value in unbatched]
    attrs = dict(attrs, scan_input_axes=None, scan_output_axes=None)
    batched = []
    for result in _scan(context, node, unbatched, attrs, body, outer, attrs.get("directions")):
        result = context.builder.emit(result, f"{node_name(node)}_unbatched_out")
        batched.append(call_op("reshape", result, ShapeExpr((IntImm(1), *result.struct_info.shape))))
    return batched


def _scan(context, node, inputs, attrs, body, outer, input_directions):
    scan_count = int(attrs["num_scan_inputs"])
    state_count = len(inputs) - scan_count
    states, xs = inputs[:state_count], [materialize(context, x, "scan_input") for x in inputs[state_count:]]
    ranks = []
    for position, x in enumerate(xs):
        info = x.struct_info
        if not isinstance(info, TensorStructInfo) or info.shape is None:
            raise fail(node, f"scan input {position} needs a known shape, got {info}")
        ranks.append(len(info.shape))
    input_axes = [int(a) + r if int(a) < 0 else int(a) for a, r in zip(attrs.get("scan_input_axes") or [0] * scan_count, ranks)]
    input_directions = [int(d) for d in (input_directions or [0] * scan_count)]
    count = xs[0].struct_info.shape[input_axes[0]]
    for position, (x, axis) in enumerate(zip(xs, input_axes)):
        if not prove_equal(x.struct_info.shape[axis], count):
            raise fail(node, f"scan input {position} has {format_expr(x.struct_info.shape[axis])} steps, input 0 has "
                             f"{format_expr(count)}")
    iteration = fresh_size_var(context, f"{node_name(node)}_iteration")
    names = [value.name for value in body.input[:state_count]]
    init = [(name, materialize(context, value, f"{name}_init")) for name, value in zip(names, states)]

    def build(builder, carried):
        child = _child_context(context, builder)
        values = dict(outer)
        values.update(zip(names, carried))
        for position, (x, axis, reverse) in enumerate(zip(xs, input_axes, input_directions)):
            # (one step: the iteration is 0, which the slice's clamping cannot know)
            step = IntImm(0) if as_int(count) == 1 else simplify(count - 1 - iteration) if reverse else iteration
            piece = builder.emit(strided_slice(x, [axis], [step], [simplify(step + 1)]), f"{body.input[state_count + position].name}_slice")
            dims = tuple(d for a, d in enumerate(x.struct_info.shape) if a != axis)
            values[body.input[state_count + position].name] = builder.emit(
                call_op("reshape", piece, ShapeExpr(dims)), body.input[state_count + position].name)
        results = convert_graph(child, body, values)
        outputs = [materialize(child, value, f"{graph_output.name or 'scan'}_out")
                   for value, graph_output in zip(results, body.output)]
        next_values, stacked = _keep_carried_shapes(node, builder, names, carried, outputs[:state_count],
                                                    outputs[state_count:])
        _check_stacked(node, [o.name for o in body.output[state_count:]], iteration, builder, stacked)
        return next_values, stacked

    loop = context.builder.emit_loop(count, iteration, init, build, node_name(node))
    outputs = _loop_outputs(loop, len(body.output))
    output_axes = attrs.get("scan_output_axes") or [0] * (len(outputs) - state_count)
    output_directions = attrs.get("scan_output_directions") or [0] * (len(outputs) - state_count)
    for position, (axis, reverse) in enumerate(zip(output_axes, output_directions)):
        index = state_count + position
        stacked = context.builder.emit(outputs[index], f"{node_name(node)}_scan_{position}")
        rank = len(stacked.struct_info.shape)
        if int(reverse):
            stacked = context.builder.emit(strided_slice(stacked, [0], [simplify(count - 1)], [-(2**63)], [-1]),
                                           f"{node_name(node)}_scan_{position}_reversed")
        axis = int(axis) + rank if int(axis) < 0 else int(axis)
        if axis != 0:
            permutation = [*range(1, axis + 1), 0, *range(axis + 1, rank)]
            stacked = call_op("transpose", stacked, axes=permutation)
        outputs[index] = stacked
    return outputs
