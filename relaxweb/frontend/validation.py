"""check_model: refuse a malformed ONNX model with one clear error before converting it.

A model file comes from strangers.  What the converters assume of a well-formed model is
checked here once, for the whole graph and its subgraphs, so that a damaged or hostile file
gives one ``RelaxwebError`` naming what is wrong instead of an ``IndexError`` deep in a
converter:

- the opset of the standard domain is one ONNX defines (1 .. the installed onnx's newest);
- every node of the standard domain has as many inputs and outputs as its schema allows,
  its required inputs and attributes, no attribute ONNX does not define, each of its type,
  and inputs of the dtypes its type constraints allow (``check_input_types``, at conversion);
- every graph input is a tensor of a known element type whose fixed dims are below ``MAX_DIM``
  (a bundle's inputs and outputs also have at most 8 dims: ``wasm/emit.py``);
- every tensor (initializers, Constant values, attribute tensors) has a known data type,
  dims in range, and exactly as many bytes of data as its dims say.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper

from ..errors import RelaxwebError, UnsupportedModelError
from .converters.registry import STANDARD_DOMAINS, nodes_with_subgraphs

#: Tensors stored in a model have at most this many dims.
MAX_STORED_RANK = 16
#: Fixed dims must be below this (2^31): WebGPU buffers and the kernels' i32 indices hold no more.
MAX_DIM = 2**31


def check_model(model: onnx.ModelProto, source: str) -> None:
    """Raise a RelaxwebError naming the first way ``model`` is malformed (its opset, inputs,
    tensors, names), or return."""
    opset = _standard_opset(model, source)
    graph = model.graph
    for value in graph.input:
        _check_input(value, source)
    for tensor in _tensors(graph):
        check_tensor(tensor, f"{source}: tensor '{tensor.name}'")
    for node in nodes_with_subgraphs(graph.node):
        if not all(isinstance(text, str) for text in (node.op_type, node.domain, node.name, *node.input, *node.output)):
            raise RelaxwebError(f"{source}: a node's op type, domain or names are not valid UTF-8 text")


def check_nodes(model: onnx.ModelProto, source: str) -> None:
    """Each node of the standard domain against its ONNX schema (after the unsupported ops
    are listed: those are named together, before any other complaint about their nodes)."""
    opset = _standard_opset(model, source)
    newest = onnx.defs.onnx_opset_version()
    for node in nodes_with_subgraphs(model.graph.node):
        if node.domain not in STANDARD_DOMAINS:
            continue
        try:
            schema = onnx.defs.get_schema(node.op_type, min(opset, newest), "")
        except onnx.defs.SchemaError:
            continue  # an op ONNX does not define at this opset: the unsupported-op listing names it
        _check_node_against(schema, node, opset, source)


def _check_node_against(schema, node: onnx.NodeProto, opset: int, source: str) -> None:
    """Input and output counts, required inputs given, required attributes present."""
    name = f"{source}: node '{node.name or node.op_type}' ({node.op_type})"
    inputs, outputs = len(node.input), len(node.output)
    if not schema.min_input <= inputs <= schema.max_input or not schema.min_output <= outputs <= schema.max_output:
        raise RelaxwebError(
            f"{name} has {inputs} inputs and {outputs} outputs; at opset {opset} ONNX allows "
            f"{_range(schema.min_input, schema.max_input)} inputs and {_range(schema.min_output, schema.max_output)} outputs"
        )
    single = onnx.defs.OpSchema.FormalParameterOption.Single
    for position, input_name in enumerate(node.input):
        formal = schema.inputs[min(position, len(schema.inputs) - 1)] if schema.inputs else None
        if input_name == "" and formal is not None and formal.option == single:
            raise RelaxwebError(f"{name}: input {position} ({formal.name}) is required but the node leaves it empty")
    given = {attribute.name for attribute in node.attribute}
    missing = [key for key, attribute in schema.attributes.items() if attribute.required and key not in given]
    if missing:
        raise RelaxwebError(f"{name} lacks the required attribute{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    for attribute in node.attribute:
        declared = schema.attributes.get(attribute.name)
        if declared is None:
            raise RelaxwebError(f"{name} has the attribute {attribute.name!r}, which ONNX does not define for {node.op_type}")
        if int(attribute.type) != int(declared.type.value):
            raise RelaxwebError(
                f"{name}: attribute {attribute.name} is {onnx.AttributeProto.AttributeType.Name(attribute.type)}; "
                f"ONNX declares it {declared.type.name}"
            )


#: numpy dtype names -> the names ONNX type constraints use (``tensor(float)``)
_ONNX_TYPE_NAMES = {
    "float32": "float", "float64": "double", "float16": "float16", "bfloat16": "bfloat16", "bool": "bool",
    "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
    "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
}


def check_input_types(node: onnx.NodeProto, dtypes: list[str | None], opset: int, label: str) -> None:
    """Refuse a node of the standard domain whose input dtypes break its schema's type
    constraints (a float ``starts`` for Slice, a Where of int and float branches); ``dtypes``
    has the dtype of each tensor input, None where it is absent or not a tensor."""
    if node.domain not in STANDARD_DOMAINS:
        return
    try:
        schema = onnx.defs.get_schema(node.op_type, min(opset, onnx.defs.onnx_opset_version()), "")
    except onnx.defs.SchemaError:
        return
    if not schema.inputs:
        return
    constraints = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    chosen: dict[str, tuple[int, str]] = {}
    for position, dtype in enumerate(dtypes):
        if dtype is None or dtype not in _ONNX_TYPE_NAMES:
            continue
        formal = schema.inputs[min(position, len(schema.inputs) - 1)]
        type_name = f"tensor({_ONNX_TYPE_NAMES[dtype]})"
        allowed = constraints.get(formal.type_str, {formal.type_str})
        if type_name not in allowed:
            shown = ", ".join(sorted(t[7:-1] for t in allowed if t.startswith("tensor(")))
            raise RelaxwebError(f"{label}: input {position} ('{node.input[position]}') is {dtype}; ONNX allows {shown} there")
        heterogeneous = formal.option == onnx.defs.OpSchema.FormalParameterOption.Variadic and not formal.is_homogeneous
        if formal.type_str in constraints and not heterogeneous:
            first = chosen.setdefault(formal.type_str, (position, type_name))
            if first[1] != type_name:
                raise RelaxwebError(
                    f"{label}: input {position} ('{node.input[position]}') is {dtype} but input {first[0]} is "
                    f"{first[1][7:-1]}; ONNX requires them to have the same type"
                )


def check_tensor(tensor: onnx.TensorProto, what: str) -> np.ndarray:
    """The values of a TensorProto, or a RelaxwebError saying why it has none (``what``
    names it)."""
    if tensor.data_type not in helper.get_all_tensor_dtypes():
        raise UnsupportedModelError(f"{what} has data type {tensor.data_type}, which ONNX does not define")
    dims = list(tensor.dims)
    if len(dims) > MAX_STORED_RANK or any(d < 0 or d >= MAX_DIM for d in dims):
        raise RelaxwebError(f"{what} has dims {dims}; each must be 0 .. {MAX_DIM - 1}")
    if tensor.HasField("data_location") and tensor.data_location == onnx.TensorProto.EXTERNAL:
        return None  # type: ignore[return-value]  # read (and checked) by load_onnx
    try:
        values = onnx.numpy_helper.to_array(tensor)
    except (ValueError, TypeError, KeyError, AssertionError) as error:
        raise RelaxwebError(f"{what}: its data does not match its dims {dims} ({error})") from None
    if values.size != math.prod(dims):
        raise RelaxwebError(f"{what}: its data holds {values.size} values, its dims {dims} say {math.prod(dims)}")
    return values


def _standard_opset(model: onnx.ModelProto, source: str) -> int:
    newest = onnx.defs.onnx_opset_version()
    for entry in model.opset_import:
        if entry.domain in STANDARD_DOMAINS:
            if not 1 <= entry.version <= newest:
                raise UnsupportedModelError(
                    f"{source}: opset {entry.version} of the ONNX domain is not one ONNX defines "
                    f"(this installation knows 1 .. {newest})"
                )
            return entry.version
    return 1


def _check_input(value: onnx.ValueInfoProto, source: str) -> None:
    if not value.type.HasField("tensor_type"):
        return  # the converters say which input kinds they take
    tensor_type = value.type.tensor_type
    if tensor_type.elem_type not in helper.get_all_tensor_dtypes():
        raise UnsupportedModelError(
            f"{source}: input '{value.name}' has element type {tensor_type.elem_type}, which ONNX does not define"
        )
    dims = tensor_type.shape.dim
    for position, dim in enumerate(dims):
        if dim.HasField("dim_value") and dim.dim_value >= MAX_DIM:
            raise UnsupportedModelError(
                f"{source}: input '{value.name}' dimension {position} is {dim.dim_value}; "
                f"relaxweb supports dims below {MAX_DIM}"
            )


def _tensors(graph: onnx.GraphProto):
    yield from graph.initializer
    for node in nodes_with_subgraphs(graph.node):
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors


def _range(low: int, high: int) -> str:
    if high >= 2**30:
        return f"{low} or more"
    return str(low) if low == high else f"{low} .. {high}"
