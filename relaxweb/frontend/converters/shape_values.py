"""Folding nodes whose inputs are known at compile time: constants and shape values.

Exporters compute shapes with small subgraphs (``Shape -> Gather -> Unsqueeze -> Concat ->
Reshape``).  relaxweb keeps those computations out of the GPU program: before a node is
converted, :func:`fold_node` tries to evaluate it at compile time.

- All inputs constant: the node is evaluated with ONNX's reference implementation
  (``onnx.reference``) and becomes a constant.
- Inputs that are shape values (a ``ShapeExpr`` of symbolic dims, from ``Shape``) or prim
  values (``PrimValue``, a symbolic integer), mixed with small integer constants: the node
  is evaluated symbolically (see ``SYMBOLIC_FOLDERS``), so ``Gather(Shape(x), 0)`` is the
  ``PrimValue`` ``batch`` and a ``Reshape`` fed by a ``Concat`` of such values gets a
  symbolic target shape.

A folded value is never bound in the graph: the importer keeps it in its table of values,
and the converters that consume shapes read it from there.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
from onnx import helper

from ...ir.expr import Constant, Expr, PrimValue, ShapeExpr

# op type -> function(context, node, inputs) -> Expr | None, for symbolic shape arithmetic
SYMBOLIC_FOLDERS: dict[str, Callable] = {}

# Ops never folded even when their inputs are constant (their outputs are large or random).
NOT_FOLDED = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}

# Constant folding is limited to small results, so weights are not duplicated.
FOLD_LIMIT_ELEMENTS = 1 << 16


def is_compile_time(expr: Expr | None) -> bool:
    return expr is None or isinstance(expr, (Constant, ShapeExpr, PrimValue))


def fold_node(context, node: onnx.NodeProto, inputs: list[Expr | None]) -> list[Expr] | None:
    """The node's outputs evaluated at compile time, or None when it must be converted."""
    if node.op_type in NOT_FOLDED or not all(is_compile_time(i) for i in inputs):
        return None
    if any(isinstance(i, (ShapeExpr, PrimValue)) for i in inputs):
        folder = SYMBOLIC_FOLDERS.get(node.op_type)
        result = folder(context, node, inputs) if folder else None
        if result is None:
            return None
        return result if isinstance(result, list) else [result]
    if not inputs and node.op_type != "Constant":
        return None
    return _fold_constants(context, node, inputs)


def _fold_constants(context, node: onnx.NodeProto, inputs: list[Expr | None]) -> list[Expr] | None:
    if node.op_type == "If" or any(a.type == onnx.AttributeProto.GRAPH for a in node.attribute):
        return None
    if any(i is not None and i.data.size > FOLD_LIMIT_ELEMENTS for i in inputs):  # type: ignore[union-attr]
        return None
    from onnx.reference import ReferenceEvaluator

    names = [f"input{i}" if value is not None else "" for i, value in enumerate(inputs)]
    outputs = [f"output{i}" for i in range(len(node.output))]
    single = helper.make_node(node.op_type, names, outputs, domain=node.domain)
    single.attribute.extend(node.attribute)
    graph_inputs = [
        helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.data.dtype), value.data.shape)
        for name, value in zip(names, inputs) if value is not None
    ]
    graph = helper.make_graph([single], "fold", graph_inputs,
                              [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", context.opset)])
    try:
        results = ReferenceEvaluator(model).run(
            None, {name: value.data for name, value in zip(names, inputs) if value is not None}
        )
    except Exception:  # the reference cannot fold it: convert the node normally
        return None
    folded = []
    for name, value in zip(node.output, results):
        array = np.asarray(value)
        if array.size > FOLD_LIMIT_ELEMENTS:
            return None
        folded.append(context.constant(array, name or node.name))
    return folded
