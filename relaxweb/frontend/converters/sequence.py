"""ONNX sequence and optional ops: SequenceEmpty, SequenceConstruct, SequenceInsert,
SequenceAt, SequenceLength, SequenceErase, ConcatFromSequence, SplitToSequence, Optional,
OptionalHasElement and OptionalGetElement.

Each is one op of ``relaxweb/ops/sequence.py`` (deduction and numpy semantics; no GPU
lowering yet, so these models run in the interpreter and ``relaxweb build`` refuses them
with the list of such ops).  Sequence and optional graph inputs get their annotations in
``frontend/onnx.py`` (``container_struct_info``); a loop may carry them
(``converters/control_flow.py``).
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from ...ops import call_op
from ...ir.expr import PrimValue
from ...ir.struct_info import OptionalStructInfo, PrimStructInfo, SequenceStructInfo
from .manipulation import fail, fresh_size_var, node_name
from .registry import converter


def _dtype(onnx_type: int) -> str:
    return str(np.dtype(helper.tensor_dtype_to_np_dtype(onnx_type)))


@converter("SequenceEmpty")
def convert_sequence_empty(context, node, inputs):
    dtype = context.attributes(node).get("dtype", 1)  # float by default
    return call_op("sequence_empty", dtype=_dtype(int(dtype)))


@converter("SequenceConstruct")
def convert_sequence_construct(context, node, inputs):
    return call_op("sequence_construct", *inputs)


@converter("SequenceInsert")
def convert_sequence_insert(context, node, inputs):
    return call_op("sequence_insert", *(value for value in inputs if value is not None))


@converter("SequenceAt")
def convert_sequence_at(context, node, inputs):
    return call_op("sequence_at", *inputs)


@converter("SequenceLength")
def convert_sequence_length(context, node, inputs):
    return call_op("sequence_length", *inputs)


@converter("SequenceErase")
def convert_sequence_erase(context, node, inputs):
    return call_op("sequence_erase", *(value for value in inputs if value is not None))


@converter("ConcatFromSequence")
def convert_concat_from_sequence(context, node, inputs):
    attrs = context.attributes(node)
    return call_op("concat_from_sequence", inputs[0], axis=int(attrs["axis"]), new_axis=int(attrs.get("new_axis", 0)))


@converter("SplitToSequence")
def convert_split_to_sequence(context, node, inputs):
    attrs = context.attributes(node)
    return call_op("split_to_sequence", *(value for value in inputs if value is not None),
                   axis=int(attrs.get("axis", 0)), keepdims=int(attrs.get("keepdims", 1)))


@converter("Optional")
def convert_optional(context, node, inputs):
    if inputs and inputs[0] is not None:
        return call_op("optional", inputs[0])
    kind = context.attributes(node).get("type")
    if kind is None:
        raise fail(node, "an Optional without an input needs its 'type' attribute")
    if kind.HasField("sequence_type") and kind.sequence_type.elem_type.HasField("tensor_type"):
        return call_op("optional_none", of="sequence", dtype=_dtype(kind.sequence_type.elem_type.tensor_type.elem_type))
    if kind.HasField("tensor_type"):
        return call_op("optional_none", of="tensor", dtype=_dtype(kind.tensor_type.elem_type))
    raise fail(node, f"an empty optional of {kind.WhichOneof('value')}: relaxweb supports tensors and sequences "
                     "of tensors")


@converter("OptionalHasElement")
def convert_optional_has_element(context, node, inputs):
    if not inputs or inputs[0] is None:  # no input at all: an empty optional
        return context.constant(np.array(False), f"{node.output[0]}_empty")
    info = inputs[0].struct_info
    if isinstance(info, SequenceStructInfo) or (
            isinstance(info, OptionalStructInfo) and isinstance(info.inner, SequenceStructInfo)):
        # whether an optional sequence holds one is known to the host (its table): a shape
        # value, so that an If on it is decided in the host, even inside a loop
        name = node_name(node)
        has = context.builder.emit(call_op("optional_has_element", inputs[0], prim=1), f"{name}_value")
        variable = fresh_size_var(context, name)
        context.builder.emit_match_cast(has, PrimStructInfo("int64", variable), name)
        return PrimValue(variable)
    return call_op("optional_has_element", inputs[0])


@converter("OptionalGetElement")
def convert_optional_get_element(context, node, inputs):
    return call_op("optional_get_element", inputs[0])
