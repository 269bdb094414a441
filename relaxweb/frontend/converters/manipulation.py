"""ONNX data movement and shape ops: Reshape, Flatten, Transpose, Squeeze, Unsqueeze, Concat,
Split, Slice, Expand, Tile, Pad, Trilu; the shape producers Shape and Size; the creators
Range, ConstantOfShape and Constant.

Shape operands (a Reshape target, Slice starts, Pad pads, the repeats of Tile...) are taken
as compile-time values when they are: constants, or shape values computed from ``Shape``
(``shape_values.py`` folds that arithmetic), so ``Reshape(x, Concat(Shape(x)[0], [-1]))``
gets the symbolic shape ``[batch, ...]``.  An operand computed at run time (a tensor input
of the graph, the result of a GPU op) is passed to the op as a tensor: the result's shape is
then data-dependent (only its rank is deduced) and the model runs in the interpreter but has
no GPU lowering for that op.

``Shape`` gives a shape value (a ``ShapeExpr`` of the input's symbolic dims, or a constant
when they are all known) and ``Size`` a prim value: never a GPU tensor.  A tensor whose
shape is unknown (only its rank is) first gets fresh dims through a ``match_cast``.
"""

from __future__ import annotations

import numpy as np
import onnx

from ...ir.expr import Constant, Expr, PrimValue, ShapeExpr, TupleGetItem
from ...ir.struct_info import TensorStructInfo
from ...ir.symbolic import (
    IntImm, PrimExpr, SizeVar, as_int, expr_max, expr_min, free_vars, product, prove_equal, prove_less, simplify,
)
from ...ops import call_op, strided_slice
from ...ops.common import normalize_axis
from ...ops.slicing import BIG
from .registry import NodeConversionError, converter, tensor_to_array
from .shape_values import (
    Ratio, compile_time_ints, constant_ints, make_constant, make_value, materialize, shape_values, value_dtype,
)

INT64_MAX = 2**63 - 1


def node_name(node: onnx.NodeProto) -> str:
    return node.name or (node.output[0] if node.output else node.op_type)


def fail(node: onnx.NodeProto, message: str) -> NodeConversionError:
    return NodeConversionError(f"{node.op_type} node '{node.name}': {message}")


def used_size_vars(context) -> set[str]:
    names = getattr(context, "size_var_names", None)
    if names is None:
        names = set()
        for param in context.builder.params:
            info = param.struct_info
            if isinstance(info, TensorStructInfo) and info.shape is not None:
                for dim in info.shape:
                    names.update(v.name for v in free_vars(dim))
        context.size_var_names = names
    return names


def fresh_size_var(context, hint: str) -> SizeVar:
    """A size variable whose name no other size variable of the function uses."""
    import re

    base = re.sub(r"[^0-9A-Za-z_]", "_", hint) or "d"
    if not base[0].isalpha():
        base = "d" + base
    base = base.rstrip("_") or "d"
    names = used_size_vars(context)
    name, counter = base, 1
    while name in names:
        name = f"{base}_{counter}"
        counter += 1
    names.add(name)
    return SizeVar(name)


def known_dims(context, node: onnx.NodeProto, expr: Expr, position: int = 0) -> tuple[Expr, tuple[PrimExpr, ...]]:
    """The tensor and its symbolic dims.  A tensor of unknown shape (known rank) is first
    matched against fresh size variables (a ``match_cast``), which later nodes reading the
    same ONNX value also see."""
    info = expr.struct_info
    if not isinstance(info, TensorStructInfo):
        raise fail(node, f"input {position} must be a tensor, got {info}")
    if info.shape is not None:
        return expr, info.shape
    if info.ndim == -1:
        raise fail(node, f"input {position} has an unknown rank; relaxweb needs at least the rank here")
    name = node.input[position] if position < len(node.input) else "value"
    dims = tuple(fresh_size_var(context, f"{name}_dim{d}") for d in range(info.ndim))
    cast = context.builder.emit_match_cast(expr, TensorStructInfo(dims, info.dtype), f"{name}_cast")
    scope = getattr(context, "scope", None)
    if scope is not None and scope.get(name) is expr:
        scope[name] = cast
    return cast, dims


def _rank(node: onnx.NodeProto, expr: Expr, position: int = 0) -> int:
    info = expr.struct_info
    if not isinstance(info, TensorStructInfo) or info.ndim == -1:
        raise fail(node, f"input {position} has an unknown rank; relaxweb needs at least the rank here")
    return info.ndim


def _axes_operand(context, node: onnx.NodeProto, inputs: list, position: int = 1):
    """Axes given as an attribute (older opsets) or as an input: a list of ints, None when
    absent, or the run-time tensor."""
    if len(inputs) > position and inputs[position] is not None:
        values = constant_ints(inputs[position])
        if values is not None:
            return values
        if compile_time_ints(inputs[position]) is not None:
            raise fail(node, "the axes must be constants")
        return inputs[position]
    axes = context.attributes(node).get("axes")
    return None if axes is None else [int(a) for a in axes]


def _normalize_axes(node: onnx.NodeProto, axes: list[int], rank: int) -> list[int]:
    normalized = []
    for axis in axes:
        if not -rank <= axis < rank:
            raise fail(node, f"axis {axis} is out of range for rank {rank}")
        normalized.append(axis + rank if axis < 0 else axis)
    if len(set(normalized)) != len(normalized):
        raise fail(node, f"axes {axes} repeat an axis")
    return normalized


def _reshape(data: Expr, dims) -> Expr:
    return call_op("reshape", data, ShapeExpr(tuple(dims)))


# Reshape, Flatten, Squeeze, Unsqueeze, Transpose -------------------------------------------------


@converter("Reshape")
def convert_reshape(context, node, inputs):
    """ONNX's 0 copies the input dim (unless allowzero); the reshape op infers -1.  The
    target may be symbolic (a shape computation) or a run-time tensor."""
    data, target = inputs[0], inputs[1]
    allowzero = bool(context.attributes(node).get("allowzero", 0))
    values = compile_time_ints(target)
    if values is None:
        if isinstance(target, Constant):
            raise fail(node, f"the target shape must be an integer tensor, got {target.data.dtype}")
        return call_op("dynamic_reshape", data, target, copy_zeros=not allowzero)
    dims = []
    for position, value in enumerate(values):
        if as_int(value) == 0 and not allowzero:
            data, input_shape = known_dims(context, node, data)
            if position >= len(input_shape):
                raise fail(node, f"target dim {position} is 0 (copy the input's), but the input has only "
                                 f"{len(input_shape)} dims")
            dims.append(input_shape[position])
        else:
            dims.append(simplify(value))
    if allowzero:  # a -1 beside dims that are 0 at run time: inferred as onnxruntime does, not refused
        return call_op("reshape", data, ShapeExpr(tuple(dims)), allowzero=True)
    return _reshape(data, dims)


@converter("Flatten")
def convert_flatten(context, node, inputs):
    data, dims = known_dims(context, node, inputs[0])
    axis = int(context.attributes(node).get("axis", 1))
    if not -len(dims) <= axis <= len(dims):
        raise fail(node, f"axis {axis} is out of range for rank {len(dims)}")
    axis = axis + len(dims) if axis < 0 else axis
    return _reshape(data, (product(dims[:axis]), product(dims[axis:])))


def _unknown_shape(expr: Expr) -> bool:
    info = expr.struct_info
    return isinstance(info, TensorStructInfo) and info.shape is None


def _axes_tensor(context, node, axes: list[int]) -> Constant:
    return make_constant(context, np.array(axes, dtype=np.int64), node_name(node) + "_axes")


@converter("Squeeze")
def convert_squeeze(context, node, inputs):
    """A reshape; with run-time axes, or an input whose dims are unknown (only the rank is
    needed: no fresh size variables), the data-dependent ``squeeze``."""
    axes = _axes_operand(context, node, inputs)
    if isinstance(axes, Expr):
        return call_op("squeeze", inputs[0], axes)
    if _unknown_shape(inputs[0]):
        return call_op("squeeze", inputs[0], *([] if axes is None else [_axes_tensor(context, node, axes)]))
    data, dims = known_dims(context, node, inputs[0])
    if axes is None:
        axes = [d for d, dim in enumerate(dims) if as_int(dim) == 1]
    axes = _normalize_axes(node, axes, len(dims))
    for axis in axes:
        if as_int(dims[axis]) is not None and as_int(dims[axis]) != 1:
            raise fail(node, f"dimension {axis} is {dims[axis]}, not 1: it cannot be squeezed")
        if as_int(dims[axis]) is None:  # symbolic ((n + 320) // 512 in Silero VAD): 1 for valid inputs, checked
            data = context.builder.check_dim(
                data, axis, IntImm(1), f"Squeeze node '{node_name(node)}': dimension {axis} of input 0 ('{node.input[0]}')")
    return _reshape(data, [dim for d, dim in enumerate(dims) if d not in axes])


@converter("Unsqueeze")
def convert_unsqueeze(context, node, inputs):
    axes = _axes_operand(context, node, inputs)
    if axes is None:
        raise fail(node, "no axes given")
    if isinstance(axes, Expr):
        return call_op("expand_dims", inputs[0], axes)
    if _unknown_shape(inputs[0]):
        return call_op("expand_dims", inputs[0], _axes_tensor(context, node, axes))
    data, dims = known_dims(context, node, inputs[0])
    rank = len(dims) + len(axes)
    axes = _normalize_axes(node, axes, rank)
    rest = iter(dims)
    return _reshape(data, [IntImm(1) if d in axes else next(rest) for d in range(rank)])


@converter("Transpose")
def convert_transpose(context, node, inputs):
    rank = _rank(node, inputs[0])
    permutation = list(context.attributes(node).get("perm", range(rank - 1, -1, -1)))
    return call_op("transpose", inputs[0], axes=[int(p) for p in permutation])


# Concat, Split, Slice ----------------------------------------------------------------------------


@converter("Concat")
def convert_concat(context, node, inputs):
    tensors = [i for i in inputs if i is not None]
    return call_op("concat", *tensors, axis=int(context.attributes(node)["axis"]))


@converter("Split")
def convert_split(context, node, inputs):
    attrs = context.attributes(node)
    data = inputs[0]
    axis = int(attrs.get("axis", 0))
    if data.struct_info.ndim >= 0:
        axis = normalize_axis("split", axis, data.struct_info.ndim)
    count = len(node.output)
    sizes = inputs[1] if len(inputs) > 1 and inputs[1] is not None else None
    if sizes is None and "split" in attrs:
        sizes = make_constant(context, np.array(attrs["split"], dtype=np.int64), node_name(node) + "_split")
    if sizes is not None:
        values = constant_ints(sizes)
        symbolic = compile_time_ints(sizes)
        if values is None and symbolic is not None:  # symbolic sizes: one slice per part
            if len(symbolic) != count:
                raise fail(node, f"{len(symbolic)} split sizes for {count} outputs")
            starts = [sum(symbolic[:i], IntImm(0)) for i in range(count)]
            return [strided_slice(data, [axis], [simplify(start)], [simplify(start + size)])
                    for start, size in zip(starts, symbolic)]
        if values is None:
            return _split_outputs(context, node, call_op("split", data, materialize(context, sizes), axis=axis, count=count))
        if len(values) != count:
            raise fail(node, f"{len(values)} split sizes for {count} outputs")
        if any(v < 0 for v in values):
            raise fail(node, f"negative split sizes {values}")
        _, dims = known_dims(context, node, data)
        total = as_int(dims[axis if axis >= 0 else axis + len(dims)])
        if total is not None and sum(values) != total:
            raise fail(node, f"the split sizes {values} do not add up to the dimension ({total})")
        indices = list(np.cumsum(values)[:-1].tolist())
        return _split_outputs(context, node, call_op("split", data, indices=indices, axis=axis))
    parts = int(attrs.get("num_outputs", count))
    data, dims = known_dims(context, node, data)
    axis = axis if axis >= 0 else axis + len(dims)
    dim = dims[axis]
    total = as_int(dim)
    if total is not None and total % parts:  # opset 18: the last part is smaller
        chunk = -(-total // parts)
        indices = [min(chunk * i, total) for i in range(1, parts)]
        return _split_outputs(context, node, call_op("split", data, indices=indices, axis=axis))
    chunk = simplify(dim // parts)
    if total is None and not prove_equal(chunk * parts, dim):  # equal parts, not provably: slices
        chunk = simplify((dim + parts - 1) // parts)
        return [strided_slice(data, [axis], [simplify(chunk * i)], [simplify(chunk * (i + 1)) if i < parts - 1 else dim])
                for i in range(parts)]
    return _split_outputs(context, node, call_op("split", data, sections=parts, axis=axis))


def _split_outputs(context, node, call) -> list[Expr]:
    whole = context.builder.emit(call, node_name(node) + "_parts")
    return [TupleGetItem(whole, index) for index in range(len(call.struct_info.fields))]


def _slice_position(value: PrimExpr, dim: PrimExpr) -> PrimExpr:
    """A symbolic start or end that is provably negative counts from the end."""
    if as_int(value) is None and prove_less(value, 0):
        return simplify(value + dim)
    return value


@converter("Slice")
def convert_slice(context, node, inputs):
    """A ``strided_slice`` when the starts and ends are known at compile time (possibly
    symbolic) and the axes and steps are constants, else a ``dynamic_slice``.  As in Relax
    (``assume_inbound``), a constant bound on a symbolic dim is taken to lie within it, except
    the "to the end" values exporters write (``INT_MAX`` and beyond).  A bound computed from
    the shapes (``Where(n > 3, Min(n, 4), Max(n, 2))``) or a sentinel such as 1000000000 is
    not assumed: the extent keeps its exact clamping (``min(1000000000, n)``)."""
    data = inputs[0]
    if context.opset < 10:
        attrs = context.attributes(node)
        starts = [IntImm(int(v)) for v in attrs["starts"]]
        ends = [IntImm(int(v)) for v in attrs["ends"]]
        axes = [int(a) for a in attrs.get("axes", range(len(starts)))]
        steps = [1] * len(starts)
        operands = None
    else:
        starts, ends = compile_time_ints(inputs[1]), compile_time_ints(inputs[2])
        axes_input = inputs[3] if len(inputs) > 3 else None
        steps_input = inputs[4] if len(inputs) > 4 else None
        axes = constant_ints(axes_input) if axes_input is not None else None
        steps = constant_ints(steps_input) if steps_input is not None else None
        operands = (axes_input, steps_input)
    if starts is None or ends is None or (operands and (
            (operands[0] is not None and axes is None) or (operands[1] is not None and steps is None))):
        return _dynamic_slice(context, node, inputs)
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise fail(node, "starts, ends, axes and steps need the same length")
    if 0 in steps:
        raise fail(node, "a step is 0")
    info = data.struct_info
    if isinstance(info, TensorStructInfo) and info.shape is not None:
        rank = len(info.shape)
        axes = _normalize_axes(node, axes, rank)
        starts = [_slice_position(s, info.shape[a]) for s, a in zip(starts, axes)]
        ends = [_slice_position(e, info.shape[a]) for e, a in zip(ends, axes)]
        starts = [_in_range(s, info.shape[a], step, is_end=False) for s, a, step in zip(starts, axes, steps)]
        ends = [_in_range(e, info.shape[a], step, is_end=True) for e, a, step in zip(ends, axes, steps)]
    return strided_slice(data, axes, starts, ends, steps)


# A constant Slice bound this large is an exporter's "to the end" (tf2onnx and jax2tf write
# 1000000000), not a position the model means: it is clamped exactly, never assumed in range.
SENTINEL = 2**20


def _in_range(value: PrimExpr, dim: PrimExpr, step: int, is_end: bool) -> PrimExpr:
    """A bound computed from the shapes, or a sentinel constant, clamped exactly as ONNX
    Slice clamps it (other constants are left to ``assume_inbound``)."""
    constant = as_int(value)
    if constant is not None and not SENTINEL <= abs(constant) < BIG:  # BIG and beyond: the op's "to the end"
        return value
    low, high = (IntImm(0), dim) if step > 0 else (IntImm(-1 if is_end else 0), simplify(dim - 1))
    return simplify(expr_min(expr_max(value, low), high))


def _dynamic_slice(context, node, inputs):
    data = inputs[0]
    starts, ends = (materialize(context, i) for i in inputs[1:3])
    length = starts.struct_info.shape[0] if isinstance(starts.struct_info, TensorStructInfo) and \
        starts.struct_info.shape is not None and starts.struct_info.ndim == 1 else None
    if as_int(length) is None:
        raise fail(node, "the starts must be a 1-D tensor of known length")
    count = int(as_int(length))
    axes = inputs[3] if len(inputs) > 3 and inputs[3] is not None else \
        make_constant(context, np.arange(count, dtype=np.int64), node_name(node) + "_axes")
    steps = inputs[4] if len(inputs) > 4 and inputs[4] is not None else \
        make_constant(context, np.ones(count, dtype=np.int64), node_name(node) + "_steps")
    return call_op("dynamic_slice", data, starts, ends, materialize(context, axes), materialize(context, steps))


# Expand, Tile, Pad, Trilu ------------------------------------------------------------------------


def _shape_operand(context, values_or_tensor) -> Expr:
    values = compile_time_ints(values_or_tensor)
    if values is None:
        return values_or_tensor
    return ShapeExpr(tuple(values))


@converter("Expand")
def convert_expand(context, node, inputs):
    target = _shape_operand(context, inputs[1])
    if isinstance(target.struct_info, TensorStructInfo):  # from data: its entries checked at run time
        return call_op("broadcast_to", inputs[0], target)
    return call_op("broadcast_to", inputs[0], target)


@converter("Tile")
def convert_tile(context, node, inputs):
    return call_op("tile", inputs[0], _shape_operand(context, inputs[1]))


def _decode(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@converter("Pad")
def convert_pad(context, node, inputs):
    attrs = context.attributes(node)
    data = inputs[0]
    info = data.struct_info
    dtype = info.dtype if isinstance(info, TensorStructInfo) else "float32"
    mode = _decode(attrs.get("mode", "constant"))
    if context.opset < 11:
        pads: Expr = ShapeExpr(tuple(int(p) for p in attrs.get("pads", attrs.get("paddings", []))))
        value: Expr | None = make_constant(context, np.array(attrs.get("value", 0.0), dtype=dtype), node_name(node) + "_value")
        axes = None
    else:
        pads = _shape_operand(context, inputs[1])
        value = inputs[2] if len(inputs) > 2 else None
        axes = inputs[3] if len(inputs) > 3 else None
    if value is None:
        value = make_constant(context, np.zeros((), dtype=dtype), node_name(node) + "_value")
    elif isinstance(value, Constant):
        value = make_constant(context, value.data.reshape(-1)[:1].reshape(()).astype(dtype), value.name)
    else:
        value = materialize(context, value)
    args = [data, pads, value]
    if axes is not None:
        args.append(_shape_operand(context, axes))
    return call_op("pad", *args, mode=mode)


@converter("Trilu")
def convert_trilu(context, node, inputs):
    upper = bool(context.attributes(node).get("upper", 1))
    k = inputs[1] if len(inputs) > 1 and inputs[1] is not None else None
    values = compile_time_ints(k) if k is not None else [IntImm(0)]
    if values is not None:
        if len(values) != 1:
            raise fail(node, "k must be a single value")
        k = PrimValue(values[0])
    return call_op("trilu", inputs[0], k, upper=upper)


# Shape, Size ---------------------------------------------------------------------------------------


@converter("Shape")
def convert_shape(context, node, inputs):
    """A shape value (symbolic when the dims are), clipped by ``start`` / ``end`` (opset 15)."""
    _, dims = known_dims(context, node, inputs[0])
    attrs = context.attributes(node)
    start, end = int(attrs.get("start", 0)), attrs.get("end")
    selected = dims[slice(start, None if end is None else int(end))]
    return make_value(context, selected, False, "int64", node.output[0])


@converter("Size")
def convert_size(context, node, inputs):
    _, dims = known_dims(context, node, inputs[0])
    return make_value(context, [product(dims)], True, "int64", node.output[0])


# Range, ConstantOfShape, Constant --------------------------------------------------------------------


@converter("Range")
def convert_range(context, node, inputs):
    """Symbolic bounds (prim values) give ``arange`` a symbolic length (``Range(0, seq, 1)`` is
    ``[seq]``); run-time scalar tensors give a data-dependent length."""
    dtype = value_dtype(inputs[0])
    args = []
    for value in inputs:
        entries = shape_values(value)
        if entries is not None and len(entries.values) == 1 and not isinstance(entries.values[0], Ratio):
            args.append(PrimValue(entries.values[0]))
        else:
            args.append(materialize(context, value))
    return call_op("arange", *args, dtype=dtype)


@converter("ConstantOfShape")
def convert_constant_of_shape(context, node, inputs):
    attrs = context.attributes(node)
    fill = tensor_to_array(attrs["value"]).reshape(-1) if "value" in attrs else np.zeros(1, np.float32)
    value = fill[0].item() if fill.size else 0
    return call_op("full", _shape_operand(context, inputs[0]), value=value, dtype=str(fill.dtype))


@converter("Constant")
def convert_constant(context, node, inputs):
    """A Constant node is a weight like an initializer: value, sparse_value, value_float(s),
    value_int(s) (strings are not supported)."""
    attrs = context.attributes(node)
    if "value" in attrs:
        data = tensor_to_array(attrs["value"])
    elif "sparse_value" in attrs:
        data = _dense(attrs["sparse_value"])
    elif "value_float" in attrs:
        data = np.array(attrs["value_float"], dtype=np.float32)
    elif "value_floats" in attrs:
        data = np.array(attrs["value_floats"], dtype=np.float32)
    elif "value_int" in attrs:
        data = np.array(attrs["value_int"], dtype=np.int64)
    elif "value_ints" in attrs:
        data = np.array(attrs["value_ints"], dtype=np.int64)
    else:
        raise fail(node, "only value, sparse_value, value_float(s) and value_int(s) are supported "
                         "(string constants are not)")
    if data.dtype.kind in "OSU":
        raise fail(node, "string constants are not supported")
    return make_constant(context, data, node.output[0])


def _dense(sparse: onnx.SparseTensorProto) -> np.ndarray:
    values = tensor_to_array(sparse.values)
    indices = tensor_to_array(sparse.indices).astype(np.int64)
    dense = np.zeros(tuple(sparse.dims), dtype=values.dtype)
    if indices.ndim == 1:
        dense.reshape(-1)[indices] = values
    else:
        dense[tuple(indices.T)] = values
    return dense
