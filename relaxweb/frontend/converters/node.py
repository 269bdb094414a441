"""Converting one ONNX node, for the main graph (``frontend/onnx.py``) and for the branches
of an ``If`` (``control_flow.py``): fold it at compile time when its inputs allow, else call
the converter registered for its op type; then record its results in the table of values
in scope.  A result whose extents only the data gives (a Range of values computed at run
time, a Reshape to a computed target) is matched against fresh size variables, so that the
ops after it have shapes to deduce from.

A converter runs with the builder checking assumptions (``ir/builder.py``): an extent its
ops need equal but the analyzer cannot prove becomes a run-time check whose error names the
node and the input (``Add node '/fpn/Add': dimension 2 of input 1 ('p5_up') is 4, expected
3 ...``).  What no input can satisfy is still refused here, with the node named."""

from __future__ import annotations

import onnx

from ...errors import RelaxwebError, shown
from ...ir.expr import Constant, Expr, PrimValue, ShapeExpr, Var
from ...ir.struct_info import TensorStructInfo
from ...ir.op_registry import DeductionError, converting_node
from ...ops import call_op
from .manipulation import fresh_size_var
from .registry import CONVERTERS, STANDARD_DOMAINS, ConversionContext, converter_key
from .shape_values import converter_inputs, fold_node
from ..validation import check_input_types


def node_label(node: onnx.NodeProto, index: int) -> str:
    return node.name or f"#{index} (unnamed)"


def input_labels(node: onnx.NodeProto, inputs: list[Expr | None]) -> dict[Expr, str]:
    """Each input value of a node, as an error names it: ``input 1 ('p5_up')``."""
    labels: dict[Expr, str] = {}
    for position, (name, value) in enumerate(zip(node.input, inputs)):
        if value is not None:
            labels.setdefault(value, f"input {position} ('{name}')")
    return labels


def format_unsupported(unsupported: dict[str, list[str]]) -> str:
    parts = [f"{shown(op)} (nodes: {', '.join(map(shown, names))})" for op, names in sorted(unsupported.items())]
    return f"the model uses {len(unsupported)} unsupported op type(s): " + "; ".join(parts)


def convert_node(context: ConversionContext, node: onnx.NodeProto, index: int, values: dict[str, Expr], graph_outputs: set[str]) -> None:
    inputs: list[Expr | None] = []
    for name in node.input:
        if not name:
            inputs.append(None)
        elif name in values:
            inputs.append(values[name])
        else:
            raise RelaxwebError(f"{node.op_type} node '{node_label(node, index)}': input '{name}' is not defined before it")
    context.scope = values  # the values in scope, for subgraphs' outer-scope references (If)
    try:
        # the folders know the standard domain's ops only
        result = fold_node(context, node, inputs) if node.domain in STANDARD_DOMAINS else None
        if result is None:  # shape values become tensors, except where the converter takes them
            check_input_types(node, [_tensor_dtype(value) for value in inputs], context.opset,
                              f"{node.op_type} node '{node_label(node, index)}'")
            inputs = converter_inputs(context, node, inputs)
            with context.builder.checking_assumptions(f"{node.op_type} node '{node_label(node, index)}'",
                                                      input_labels(node, inputs)), \
                    converting_node(node_label(node, index), node.op_type):
                result = CONVERTERS[converter_key(node.domain, node.op_type)](context, node, inputs)
    except DeductionError as error:
        outputs = ", ".join(repr(name) for name in node.output if name)
        raise RelaxwebError(f"{node.op_type} node '{node_label(node, index)}' (binding {outputs}): {error}") from None
    results = result if isinstance(result, list) else [result]
    for name, value in zip(node.output, results):
        if not name:
            continue
        if isinstance(value, (ShapeExpr, PrimValue)):  # compile-time shape values stay unbound
            values[name] = value
            continue
        if isinstance(value, (Constant, Var)):
            if name not in graph_outputs:
                values[name] = value  # an alias: nothing to compute
                continue
            # a tensor output gets a binding of its own; a sequence or optional one an alias
            value = call_op("identity", value) if isinstance(value.struct_info, TensorStructInfo) else value
        data_dependent = _data_dependent(value.struct_info)
        bound = context.builder.emit(value, name, output=name in graph_outputs and not data_dependent)
        values[name] = _name_extents(context, bound, name, name in graph_outputs) if data_dependent else bound


def _tensor_dtype(value: Expr | None) -> str | None:
    info = getattr(value, "struct_info", None)
    return info.dtype if isinstance(info, TensorStructInfo) else None


def _data_dependent(info) -> bool:
    """A tensor whose rank is known but not its extents (a Range of values read at run time,
    a NonZero ...)."""
    return isinstance(info, TensorStructInfo) and info.shape is None and info.ndim >= 0


def _name_extents(context: ConversionContext, value: Var, name: str, output: bool) -> Var:
    """``value`` cast to fresh size variables, one per dim (Relax's match_cast after a
    data-dependent op): later ops deduce their shapes from them, and the host binds them to
    the extents the op's legalization computes (read back from the GPU) when it runs."""
    dims = tuple(fresh_size_var(context, f"{name}_dim{d}") for d in range(value.struct_info.ndim))
    return context.builder.emit_match_cast(value, TensorStructInfo(dims, value.struct_info.dtype), name, output=output)
