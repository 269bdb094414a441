"""ONNX If: subgraphs converted to the IR's ``If``.

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
"""

from __future__ import annotations

import dataclasses

import onnx

from ...errors import RelaxwebError, UnsupportedModelError
from ...ir.expr import Constant, Expr, PrimValue, ShapeExpr, Tuple, TupleGetItem
from ...ir.struct_info import TensorStructInfo
from ...ir.symbolic import as_int
from ...ops import call_op
from .manipulation import fail, fresh_size_var, node_name, used_size_vars
from .node import convert_node, format_unsupported
from .registry import CONVERTERS, converter, converter_key, tensor_to_array
from .shape_values import make_constant, materialize


def _subgraph_nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _subgraph_nodes(attribute.g)
            for subgraph in attribute.graphs:
                yield from _subgraph_nodes(subgraph)


def check_supported(node: onnx.NodeProto, graphs: list[onnx.GraphProto]) -> None:
    """One error listing every unsupported op type of the branches (nested ones included)."""
    unsupported: dict[str, list[str]] = {}
    for graph in graphs:
        for index, inner in enumerate(_subgraph_nodes(graph)):
            key = converter_key(inner.domain, inner.op_type)
            if key in CONVERTERS:
                continue
            unsupported.setdefault(key, []).append(inner.name or f"#{index} (unnamed)")
    if unsupported:
        raise UnsupportedModelError(f"If node '{node.name}': in its branches, " + format_unsupported(unsupported))


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
    if context.builder.dataflow:
        raise fail(node, "an If cannot go in a dataflow block (import the model with from_onnx)")
    count = len(node.output)

    def branch(graph: onnx.GraphProto):
        def build(builder) -> Expr:
            child = _child_context(context, builder)
            results = []
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
            for value in values:
                value = materialize(child, value, f"{graph.name or 'branch'}_out")
                if not any(binding.var is value for binding in builder.bindings):
                    # a branch ends with a value computed inside it (the host needs one)
                    value = builder.emit(call_op("identity", value), f"{graph.name or 'branch'}_out")
                results.append(value)
            if len(results) != count:
                raise fail(node, f"a branch has {len(results)} outputs, the node {count}")
            return results[0] if count == 1 else Tuple(tuple(results))
        return build

    chosen = context.builder.emit_if(condition, branch(then_graph), branch(else_graph), node_name(node))
    outputs = [chosen] if count == 1 else [
        context.builder.emit(TupleGetItem(chosen, index), f"{node_name(node)}_{index}") for index in range(count)
    ]
    return [_name_dims(context, node, value, node.output[index]) for index, value in enumerate(outputs)]


def _name_dims(context, node, value, name: str):
    """A tensor whose shape the branches disagree on, matched against fresh size variables."""
    info = value.struct_info
    if not isinstance(info, TensorStructInfo) or info.shape is not None or info.ndim == -1:
        return value
    dims = tuple(fresh_size_var(context, f"{name or node_name(node)}_dim{d}") for d in range(info.ndim))
    return context.builder.emit_match_cast(value, TensorStructInfo(dims, info.dtype), f"{name or 'if'}_cast")
