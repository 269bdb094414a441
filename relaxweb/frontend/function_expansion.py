"""ONNX ops defined as functions, replaced by their function bodies before conversion.

Many ONNX ops are specified as a function: a small graph of other ops (``Attention``,
``RotaryEmbedding``, ``CenterCropPad``, ``SoftmaxCrossEntropyLoss``, the window functions,
``SwiGLU`` ...), some of them "context-dependent" (the body depends on the node's attributes
and its inputs' element types).  A node of such an op that has no converter of its own is
replaced by the body that onnx's schema gives for the model's opset, its values renamed into
the node's namespace, so relaxweb supports every op whose body it supports.  An op with a
converter keeps it (a converter may do better than the generic body).

A node is expanded only when everything in its body is supported (after expanding the body's
own function ops): otherwise it stays, and the unsupported-op listing names the op the model
wrote, not an op of its body.  Expanded nodes are named ``<node>/<op type>_<index>`` so that
an error in a body op still names the model's node.
"""

from __future__ import annotations

import onnx
from onnx import helper

from .converters import CONVERTERS
from .converters.registry import STANDARD_DOMAINS, converter_key, nodes_with_subgraphs

#: Bodies may use other function ops (Attention's uses Softmax, whose converter exists, but
#: a body op without one is expanded in turn); deeper nesting than this is not in the spec.
MAX_DEPTH = 4


def expand_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every function op that has no converter replaced by its body (the
    model itself, unchanged, when there is none)."""
    opsets = _opsets(model)
    if not any(_needs_expansion(node) and _schema(node, opsets) is not None for node in nodes_with_subgraphs(model.graph.node)):
        return model
    expanded = onnx.ModelProto()
    expanded.CopyFrom(model)
    types = _value_types(expanded)
    _expand_graph(expanded.graph, opsets, types)
    return expanded


def is_expandable(node: onnx.NodeProto, opsets: dict[str, int]) -> bool:
    """Whether the node's op has a body for the model's opset (the op coverage table counts
    such an op as supported when its body is)."""
    return _schema(node, opsets) is not None


def _opsets(model: onnx.ModelProto) -> dict[str, int]:
    return {("" if entry.domain in STANDARD_DOMAINS else entry.domain): entry.version for entry in model.opset_import}


def _needs_expansion(node: onnx.NodeProto) -> bool:
    return converter_key(node.domain, node.op_type) not in CONVERTERS


def _schema(node: onnx.NodeProto, opsets: dict[str, int]):
    """The op's schema at the model's opset, when it defines the op as a function."""
    domain = "" if node.domain in STANDARD_DOMAINS else node.domain
    if domain not in opsets:
        return None
    try:
        schema = onnx.defs.get_schema(node.op_type, opsets[domain], domain)
    except onnx.defs.SchemaError:
        return None
    return schema if (schema.has_function or schema.has_context_dependent_function) else None


def _function_body(node: onnx.NodeProto, opsets: dict[str, int], types: dict[str, onnx.TypeProto]):
    """The FunctionProto of the node's op for the model's opset, or None (no body for that
    opset, or a context-dependent body whose input types are not known)."""
    schema = _schema(node, opsets)
    if schema is None:
        return None
    domain = "" if node.domain in STANDARD_DOMAINS else node.domain
    opset = opsets[domain]
    function = onnx.FunctionProto()
    plain = [v for v in schema.function_opset_versions if v <= opset]
    contextual = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    if plain and (not contextual or max(plain) >= max(contextual)):
        function.ParseFromString(schema.get_function_with_opset_version(max(plain)))
        return function
    if not contextual:
        return None
    input_types = []
    for name in node.input:
        if name and name not in types:
            return None
        input_types.append(types[name] if name else onnx.TypeProto())
    try:
        text = schema.get_context_dependent_function_with_opset_version(
            max(contextual), node.SerializeToString(), [t.SerializeToString() for t in input_types])
    except Exception:  # noqa: BLE001 - onnx refuses types it cannot build a body for
        return None
    if not text:
        return None
    function.ParseFromString(text)
    return function


def _expand_graph(graph: onnx.GraphProto, opsets: dict[str, int], types: dict[str, onnx.TypeProto]) -> None:
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        for attribute in node.attribute:
            for subgraph in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                _expand_graph(subgraph, opsets, types)
        nodes.extend(_expand_node(node, opsets, types, 0))
    del graph.node[:]
    graph.node.extend(nodes)


def _expand_node(node: onnx.NodeProto, opsets, types, depth: int) -> list[onnx.NodeProto]:
    """[node] itself, or its body's nodes (each expanded in turn) when all of them are supported."""
    if not _needs_expansion(node) or depth >= MAX_DEPTH:
        return [node]
    function = _function_body(node, opsets, types)
    if function is None:
        return [node]
    body: list[onnx.NodeProto] = []
    for inner in _instantiate(node, function, _schema(node, opsets)):
        body.extend(_expand_node(inner, opsets, types, depth + 1))
    if any(_needs_expansion(inner) for inner in nodes_with_subgraphs(body)):
        return [node]
    return body


def _instantiate(node: onnx.NodeProto, function: onnx.FunctionProto, schema) -> list[onnx.NodeProto]:
    """The function's nodes with its formal inputs and outputs renamed to the node's, its
    internal values prefixed with the node's first output (unique in the graph), and its
    attribute references replaced by the node's attributes (or the defaults of the schema
    and the function)."""
    prefix = f"{next((o for o in node.output if o), node.name)}/{node.op_type}/"
    renames = {formal: (node.input[i] if i < len(node.input) else "") for i, formal in enumerate(function.input)}
    renames.update({formal: node.output[i] for i, formal in enumerate(function.output)
                    if i < len(node.output) and node.output[i]})
    given = {attribute.name: attribute for attribute in node.attribute}
    defaults = {name: attribute.default_value for name, attribute in schema.attributes.items()
                if attribute.default_value.type != onnx.AttributeProto.UNDEFINED}
    defaults.update({attribute.name: attribute for attribute in function.attribute_proto})

    def rename(name: str) -> str:
        if not name:
            return ""
        return renames.get(name, prefix + name)

    label = node.name or node.op_type
    return [_renamed(inner, rename, given, defaults, f"{label}/{inner.op_type}_{index}")
            for index, inner in enumerate(function.node)]


def _renamed(node: onnx.NodeProto, rename, given, defaults, name: str | None) -> onnx.NodeProto:
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    if name is not None:
        copy.name = name
    copy.input[:] = [rename(value) for value in node.input]
    copy.output[:] = [rename(value) for value in node.output]
    del copy.attribute[:]
    for attribute in node.attribute:
        if attribute.ref_attr_name:
            source = given.get(attribute.ref_attr_name) or defaults.get(attribute.ref_attr_name)
            if source is None:
                continue  # an optional attribute the node leaves out
            resolved = onnx.AttributeProto()
            resolved.CopyFrom(source)
            resolved.name = attribute.name
            copy.attribute.append(resolved)
            continue
        resolved = onnx.AttributeProto()
        resolved.CopyFrom(attribute)
        if resolved.HasField("g"):
            _rename_graph(resolved.g, rename, given, defaults)
        for subgraph in resolved.graphs:
            _rename_graph(subgraph, rename, given, defaults)
        copy.attribute.append(resolved)
    return copy


def _rename_graph(graph: onnx.GraphProto, rename, given, defaults) -> None:
    """A subgraph of a body node: its outer-scope references and its own values renamed alike."""
    nodes = [_renamed(inner, rename, given, defaults, None) for inner in graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
    for value in list(graph.input) + list(graph.output):
        value.name = rename(value.name)


def _value_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Each value's type as onnx's shape inference gives it (context-dependent bodies need
    their inputs' element types); empty where inference fails."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - inference is a best effort here
        inferred = model
    types = {value.name: value.type for value in
             list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output)}
    for tensor in inferred.graph.initializer:
        types.setdefault(tensor.name, helper.make_tensor_type_proto(tensor.data_type, list(tensor.dims)))
    return types
