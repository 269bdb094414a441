"""ONNX model -> IRModule.

The graph's inputs become parameters of ``main`` whose shapes use symbolic variables named
after the ONNX ``dim_param`` strings (see :class:`InputDims`); initializers become constants
(weights); each node goes through the converter registered for its op type
(``converters/``), which builds op calls whose annotations are deduced forward.  Before
converting anything, every node is checked so that a model with unsupported ops gets one
error listing all of them.  The graph's output annotations are not read: exporters write
impossible ones, and every shape is deduced from the inputs.

**Input annotations are hints.**  Exporters write dims as ``dim_value`` -1, ``?``, nothing,
``unk__214``, ``p2o.DynamicDimension.0``, ``batch_size*2`` or ``batch size``.  A dim is a
known extent only when its ``dim_value`` is 0 or more; anything else is a size variable.
(A ``dim_value`` of 0 stays 0, as onnxruntime takes it: it refuses any other size there, so
no model it runs means "unknown" by it, and ONNX's node cases declare empty inputs so.)
A ``dim_param`` names it (sanitized into an identifier for the IR, unique: ``batch size``
and ``batch_size`` are two variables; the model's spelling is kept in the module's
``size_var_names`` attribute, which messages, ``relaxweb inspect``, the manifest and
``--bound`` use); ``?`` and missing names give each dim its own variable.

A name given to several dims is one variable, as ONNX means it: an input that breaks it is
refused with an error naming both inputs (``input 'attention_mask': dimension 0 is 3,
expected 2 (batch; batch from input 'input_ids' dimension 0)``).  It is trusted because
graphs relate such dims in ways no check would see: BERT exports gather the rows of the
flattened ``attention_mask`` at indices computed from ``input_ids``' shape, so with two
variables an inconsistent pair of inputs would read out of range instead of stopping.  Where
trusting a name makes the graph impossible (deduction refuses it: ``n`` against ``n + 1``),
the annotation was wrong, and :func:`from_onnx` imports again with every occurrence its own
variable: the graph's own run-time checks then relate them where it needs them equal.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
from google.protobuf import json_format, text_format
from google.protobuf.message import DecodeError
from onnx import helper
from onnx.external_data_helper import ExternalDataInfo

from ..errors import RelaxwebError, UnsupportedModelError, path_kind
from ..ir.builder import FunctionBuilder
from ..ir.expr import Constant, Expr, MatchCast, PrimValue, SeqExpr, ShapeExpr, Var, VarBinding
from ..ir.functor import ExprVisitor
from ..ir.module import IRModule
from ..ir.struct_info import OptionalStructInfo, SequenceStructInfo, StructInfo, TensorStructInfo
from ..ir.symbolic import PrimExpr, SizeVar, free_vars
from ..ops import call_op
from .converters import CONVERTERS, ConversionContext
from .converters.node import convert_node, format_unsupported, node_label
from .converters.registry import STANDARD_DOMAINS, converter_key, nodes_with_subgraphs, tensor_to_array
from .converters.shape_values import tensor_of
from .dim_expression import dim_expression
from .function_expansion import expand_functions
from .validation import check_model, check_nodes


def load_onnx(path: str | Path) -> onnx.ModelProto:
    """Read a model file, turning every way it can be unreadable into a RelaxwebError.

    Weights stored as external data (``model.onnx.data``, written by ``onnx.save(...,
    save_as_external_data=True)`` or by exporters for large models) are read from files
    named relative to the model's folder.
    """
    path = Path(path)
    kind = path_kind(path)
    if kind is None:
        raise RelaxwebError(f"{path}: no such file")
    if kind == "folder":
        raise RelaxwebError(f"{path}: is a directory, expected an .onnx file")
    if kind == "other":  # /dev/zero or a FIFO would be read for ever
        raise RelaxwebError(f"{path}: not a regular file (a device, FIFO or socket), expected an .onnx file")
    try:  # onnx picks the format by the suffix: .json and .txt files are parsed as text
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, json_format.Error, text_format.Error, ValueError, RuntimeError, OSError) as error:
        raise RelaxwebError(f"{path}: not a readable ONNX model ({type(error).__name__}: {error})") from None
    if not model.graph.node and not model.graph.output:
        raise RelaxwebError(f"{path}: not an ONNX model (the file holds no graph)")
    _load_external_data(model, path)
    return model


def _graph_tensors(graph: onnx.GraphProto):
    """Every TensorProto of a graph: initializers and node attributes, subgraphs included."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                yield from _graph_tensors(attribute.g)
            for subgraph in attribute.graphs:
                yield from _graph_tensors(subgraph)


def _load_external_data(model: onnx.ModelProto, path: Path) -> None:
    """Read the external data of every tensor, with one clear error for a missing file."""
    external = [t for t in _graph_tensors(model.graph)
                if t.HasField("data_location") and t.data_location == onnx.TensorProto.EXTERNAL]
    if not external:
        return
    folder = path.parent
    for tensor in external:
        try:
            info = ExternalDataInfo(tensor)
        except (ValueError, TypeError) as error:
            raise RelaxwebError(f"{path}: tensor '{tensor.name}' has unreadable external data information ({error})") from None
        if (info.offset or 0) < 0 or (info.length is not None and info.length < 0):
            raise RelaxwebError(f"{path}: tensor '{tensor.name}' has a negative external data offset or length")
        location = info.location
        if not location:
            raise RelaxwebError(f"{path}: tensor '{tensor.name}' is stored as external data but names no file")
        data_file = folder / location
        if Path(location).is_absolute() or ".." in Path(location).parts:
            raise RelaxwebError(
                f"{path}: tensor '{tensor.name}' names the external data file '{location}', which is "
                "not inside the model's folder; external data must be next to the model"
            )
        if not data_file.is_file():
            raise RelaxwebError(
                f"{path}: the external data file '{location}' (weights of '{tensor.name}') is missing; "
                f"it must be next to the model, at {data_file}"
            )
    try:
        onnx.load_external_data_for_model(model, str(folder))
    except (OSError, ValueError, onnx.checker.ValidationError) as error:
        raise RelaxwebError(f"{path}: cannot read its external data: {error}") from None


def default_opset(model: onnx.ModelProto) -> int:
    for entry in model.opset_import:
        if entry.domain in STANDARD_DOMAINS:
            return entry.version
    return 1


def find_unsupported(model: onnx.ModelProto) -> dict[str, list[str]]:
    """Unsupported op types (named ``domain.OpType`` when not of the standard domain) -> node
    names, subgraphs (If branches) included."""
    unsupported: dict[str, list[str]] = defaultdict(list)
    for index, node in enumerate(nodes_with_subgraphs(model.graph.node)):
        key = converter_key(node.domain, node.op_type)
        if key not in CONVERTERS:
            unsupported[key].append(node_label(node, index))
    return dict(unsupported)


def op_coverage(model: onnx.ModelProto) -> list[tuple[str, int, bool]]:
    """(op type, node count, supported) for every op type the model uses, subgraphs included.

    Op types of a non-standard domain are named ``domain.OpType`` (``com.microsoft.Attention``).
    Sorted: unsupported first, then by name.
    """
    counts: dict[str, int] = defaultdict(int)
    unsupported = find_unsupported(expand_functions(model))  # an op with a supported ONNX function body is supported
    for node in nodes_with_subgraphs(model.graph.node):
        counts[converter_key(node.domain, node.op_type)] += 1
    supported = {key: key not in unsupported for key in counts}
    return sorted(((op, counts[op], supported[op]) for op in counts), key=lambda e: (e[2], e[0]))


def _struct_info_vars(info: StructInfo, found: dict[str, None]) -> None:
    """Notes the symbolic variables of an annotation, in order of first appearance."""
    for expr in info.symbolic_exprs():
        for var in free_vars(expr):
            found.setdefault(var.name, None)


def symbolic_vars(function) -> list[str]:
    """The distinct symbolic variables of a graph function, in order of first appearance:
    over the parameters' annotations, then every binding's (``match_cast`` included, and the
    bindings inside ``If`` branches), then the result's."""
    collector = _SymbolicVarCollector()
    for param in function.params:
        _struct_info_vars(param.struct_info, collector.found)
    collector.visit_seq_expr(function.body)
    return list(collector.found)


class _SymbolicVarCollector(ExprVisitor):
    """Notes the symbolic variables of each annotation: a binding's before those inside its
    value (an If's branches), a sequence's result after its bindings."""

    def __init__(self) -> None:
        self.found: dict[str, None] = {}

    def visit_var_binding(self, binding: VarBinding) -> None:
        _struct_info_vars(binding.var.struct_info, self.found)
        super().visit_var_binding(binding)

    def visit_match_cast(self, binding: MatchCast) -> None:
        _struct_info_vars(binding.struct_info, self.found)
        _struct_info_vars(binding.var.struct_info, self.found)
        super().visit_match_cast(binding)

    def visit_seq_expr(self, seq: SeqExpr) -> None:
        super().visit_seq_expr(seq)
        _struct_info_vars(seq.body.struct_info, self.found)


def symbolic_name(text: str) -> str:
    """A size variable name for an ONNX dim_param: letters, digits and inner underscores.

    Names never start with a digit or an underscore, nor end with an underscore, which is
    kept for the index variables of tensor programs (``i0_``, ``k_``).
    """
    name = re.sub(r"[^0-9A-Za-z_]", "_", text)
    if not name or not name[0].isalpha():
        name = "d" + name
    if name.endswith("_"):
        name += "d"
    return name


# dim_param values that name nothing (as exporters write an unknown dim): each such dim is
# its own variable.
UNNAMED = {"", "?"}


class InputDims:
    """The size variables of the graph inputs' dims (see the module docstring).

    A name the model gives several dims is one variable, or, with ``separate``, a variable
    per occurrence (``batch``, then ``batch_2`` ...).  ``model_names`` maps each variable
    whose IR name differs from the model's spelling to that spelling.
    """

    def __init__(self, separate: bool = False) -> None:
        self.separate = separate
        self.used: set[str] = set()
        self.named: dict[str, str] = {}  # the model's name -> its variable (without ``separate``)
        self.occurrences: dict[str, int] = defaultdict(int)  # the model's name -> how many dims it names
        self.model_names: dict[str, str] = {}

    def fresh(self, text: str) -> str:
        base = symbolic_name(text)
        name, counter = base, 1
        while name in self.used:
            counter += 1
            name = f"{base}_{counter}"
        self.used.add(name)
        return name

    def dim(self, value: onnx.ValueInfoProto, position: int, dim) -> PrimExpr | int:
        if dim.HasField("dim_value") and dim.dim_value >= 0:
            return int(dim.dim_value)
        text = dim.dim_param.strip() if dim.HasField("dim_param") else ""
        if text in UNNAMED:
            return SizeVar(self.fresh(f"{value.name}_dim{position}"))
        expression = None if self.separate or text in self.named else dim_expression(text, self.named)
        if expression is not None:  # ``past_sequence_length + sequence_length``: see dim_expression.py
            return expression
        self.occurrences[text] += 1
        if text in self.named and not self.separate:
            return SizeVar(self.named[text])
        name = self.variable(text)
        self.named.setdefault(text, name)
        return SizeVar(name)

    def variable(self, text: str) -> str:
        """A new size variable for the model's dim name ``text`` (its spelling kept when it differs)."""
        name = self.fresh(text)
        if name != text:
            self.model_names[name] = text
        return name

    def declare(self, inputs: list[onnx.ValueInfoProto]) -> None:
        """Give each dim name its variable now, in input order, so that a dim written as an
        expression of names (:mod:`.dim_expression`: ``past_sequence_length + sequence_length``)
        may come before the inputs that name them.  A text is an expression when every name in
        it is some dim's whole name; otherwise (``batch-size`` alone) it is a name."""
        if self.separate:
            return
        texts = [dim.dim_param.strip() for value in inputs if value.type.HasField("tensor_type")
                 for dim in value.type.tensor_type.shape.dim if dim.HasField("dim_param") and not dim.HasField("dim_value")]
        texts = [text for text in dict.fromkeys(texts) if text not in UNNAMED]
        alone = {text: text for text in texts if text.isidentifier()}
        for text in texts:
            if text in alone or dim_expression(text, alone) is None:
                self.named[text] = self.variable(text)

    def struct_info(self, value: onnx.ValueInfoProto) -> StructInfo:
        if value.type.HasField("sequence_type") or value.type.HasField("optional_type"):
            return container_struct_info(value.name, value.type)
        tensor_type = value.type.tensor_type
        if not value.type.HasField("tensor_type"):
            raise UnsupportedModelError(f"input '{value.name}': only tensor, sequence and optional inputs are supported")
        dtype = str(np.dtype(helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)))
        if not tensor_type.HasField("shape"):
            raise UnsupportedModelError(f"input '{value.name}': its rank is unknown; relaxweb needs at least the rank")
        dims = [self.dim(value, position, dim) for position, dim in enumerate(tensor_type.shape.dim)]
        return TensorStructInfo(tuple(dims), dtype)

    def shared(self) -> bool:
        """Whether some name is given to several dims."""
        return any(count > 1 for count in self.occurrences.values())


def container_struct_info(name: str, type_proto: onnx.TypeProto) -> StructInfo:
    """A sequence or optional input's annotation: a sequence's elements may differ in shape
    from one another, so only their dtype and rank are kept (no size variable is bound by
    them), and its length is known at run time."""
    if type_proto.HasField("optional_type"):
        return OptionalStructInfo(container_struct_info(name, type_proto.optional_type.elem_type))
    if type_proto.HasField("sequence_type"):
        element = type_proto.sequence_type.elem_type
        if not element.HasField("tensor_type"):
            raise UnsupportedModelError(f"input '{name}': a sequence of {element.WhichOneof('value')}; "
                                        "relaxweb supports sequences of tensors")
        return SequenceStructInfo(container_struct_info(name, element))  # type: ignore[arg-type]
    if type_proto.HasField("tensor_type"):
        tensor_type = type_proto.tensor_type
        dtype = str(np.dtype(helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)))
        return TensorStructInfo(None, dtype, len(tensor_type.shape.dim) if tensor_type.HasField("shape") else -1)
    raise UnsupportedModelError(f"input '{name}': a {type_proto.WhichOneof('value')}; "
                                "relaxweb supports tensor, sequence and optional values")


def input_struct_info(value: onnx.ValueInfoProto) -> StructInfo:
    """The annotation of one graph input on its own (its dims' names are its own)."""
    return InputDims().struct_info(value)


def from_onnx(model: onnx.ModelProto, source: str = "model.onnx") -> IRModule:
    """Import an ONNX model as an IRModule whose ``main`` is the graph.

    Its weights must be in it: external data is read by :func:`load_onnx` (next to the model
    file); a model in memory that still refers to external data is an error.  A name the
    model gives several input dims is one variable, unless deduction then refuses the graph:
    it is imported again with a variable per occurrence (see the module docstring)."""
    dims = InputDims()
    try:
        return _import(model, source, dims)
    except UnsupportedModelError:
        raise
    except RelaxwebError as refused:
        if not dims.shared():
            raise
        try:
            return _import(model, source, InputDims(separate=True))
        except RelaxwebError:
            raise refused from None


def _import(model: onnx.ModelProto, source: str, dims: InputDims) -> IRModule:
    for tensor in _graph_tensors(model.graph):
        if tensor.HasField("data_location") and tensor.data_location == onnx.TensorProto.EXTERNAL:
            raise RelaxwebError(
                f"{source}: tensor '{tensor.name}' is stored as external data, which is read only "
                "next to a model file; pass the model's path, or load it with onnx.load(path), "
                "which reads its external data"
            )
    check_model(model, source)
    model = expand_functions(model)
    unsupported = find_unsupported(model)
    if unsupported:
        raise UnsupportedModelError(format_unsupported(unsupported))
    check_nodes(model, source)
    graph = model.graph
    # Control flow (If, Loop, Scan, and DynamicQuantizeLSTM's loop over steps) cannot go in a
    # dataflow block: a graph with it is built without them.
    builder = FunctionBuilder("main", dataflow=not any(
        node.op_type in ("If", "Loop", "Scan", "DynamicQuantizeLSTM") for node in graph.node))
    context = ConversionContext(builder, default_opset(model))
    values: dict[str, Expr] = {}
    for initializer in graph.initializer:
        values[initializer.name] = context.constant(tensor_to_array(initializer), initializer.name)
    dims.declare([value for value in graph.input if value.name not in values])
    for value in graph.input:
        if value.name not in values:
            values[value.name] = builder.add_param(value.name, dims.struct_info(value))
    output_names = [o.name for o in graph.output]
    for index, node in enumerate(graph.node):
        convert_node(context, node, index, values, set(output_names))
    outputs = []
    for name in output_names:
        if name not in values:
            raise RelaxwebError(f"graph output '{name}' is not produced by any node")
        value = values[name]
        if isinstance(value, (ShapeExpr, PrimValue)):  # a shape value as an output: a tensor
            value = tensor_of(context, value, name)
            value = value if isinstance(value, Constant) else builder.emit(value, name, output=True)
        if not isinstance(value, Var) or value in builder.params:
            value = builder.emit(call_op("identity", value), name, output=True)
        outputs.append(value)
    function = builder.finish(outputs, output_names)
    attrs = {"source": source, "opset": context.opset}
    used = set(symbolic_vars(function))
    model_names = {name: text for name, text in dims.model_names.items() if name in used}
    if model_names:
        attrs["size_var_names"] = model_names
    return IRModule({"main": function}, attrs=attrs)


def import_onnx_file(path: str | Path) -> IRModule:
    return from_onnx(load_onnx(path), Path(path).name)
