"""Ops that repeat elements: broadcast_to (ONNX Expand) and tile.

- ``broadcast_to(x, shape)``: ``x`` and ``shape`` broadcast together (a 1 in
  ``shape`` keeps the input's dim).  With a run-time ``shape``, each entry facing a dim of
  ``x`` that is not 1 must be 1 or that dim, checked at run time (that error names the node
  the call comes from).
- ``tile(x, repeats)``: ONNX Tile; ``repeats`` a shape value or a run-time tensor.
"""

from __future__ import annotations


import numpy as np

from ..errors import InputShapeError, UnsupportedModelError
from ..ir.expr import Call, PrimValue, tensor_dtype, tensor_shape
from ..ir.op_registry import DeductionError, node_text, register_op
from ..ir.struct_info import PrimStructInfo, TensorStructInfo
from ..ir.symbolic import (
    IntImm, as_int, simplify,
)
from ..ir.tir import FloatImm, Load, select
from .common import (
    broadcast_shapes, expect_args, load_broadcast, make_program, require_tensor,
)
from .readback import const, element, index, read_back_dims
from .shape_operands import int_list, operand_length, shape_operand, static_or_run_time


# broadcast_to ----------------------------------------------------------------------------------


def deduce_broadcast_to(args, attrs) -> TensorStructInfo:
    expect_args("broadcast_to", args, 2)
    data = require_tensor(args[0], "broadcast_to", 0)
    target = shape_operand(args[1], "broadcast_to", "the target shape")
    if target.values is None or data.shape is None:
        known = data.ndim != -1 and target.ndim != -1
        return TensorStructInfo(None, data.dtype, max(data.ndim, target.ndim) if known else -1)

    return TensorStructInfo(
        broadcast_shapes("broadcast_to", [data.shape, target.values], origins=[(0, 0), (None, 0)]), data.dtype
    )


def legalize_broadcast_to(context, call: Call):
    info = call.struct_info
    data = call.args[0]
    program = make_program("broadcast_to", [data], info.shape, info.dtype,
                           lambda axes, buffers: load_broadcast(buffers[0], axes))
    return context.call_tir(program, (data,))


def broadcast_to_reference(arrays, attrs):
    x, target = arrays[0], int_list(arrays[1])
    rank = max(x.ndim, len(target))
    for position in range(rank - min(x.ndim, len(target)), rank):  # the positions both sides have
        dim, entry = x.shape[position - (rank - x.ndim)], target[position - (rank - len(target))]
        if dim != 1 and entry not in (1, dim):
            raise InputShapeError(f"{_entry_reason(node_text(attrs), position - (rank - len(target)))} is {entry}, "
                                  f"expected {dim}")
    return np.ascontiguousarray(np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(target))))


def _entry_reason(source: str, position: int) -> str:
    """What the run-time check of an Expand target's entry states."""
    return f"{source or 'broadcast_to'}: entry {position} of the target shape (1 or the input's dim)"


def legalize_broadcast_to_run_time(context, call: Call):
    """A run-time target shape: each result extent (the target's entry where the data's dim is
    1, else the data's dim) is computed on the GPU and read back, then the broadcast copy.
    Where the data's dim is not 1, the value read back is the entry when it is neither 1 nor
    that dim, and a check that it equals the dim stops the run with both values."""
    data = call.args[0]
    shape = tensor_shape(data)
    length = operand_length(call, 1)
    rank = max(len(shape), length)

    def extent(position: int):
        def build(buffers):
            offset = position - (rank - len(shape))
            entry = element(buffers[1], position - (rank - length)) if position >= rank - length else index(1)
            if offset < 0:
                return entry
            if as_int(shape[offset]) == 1:
                return entry
            if position < rank - length:  # no entry: the data's dim
                return index(shape[offset])
            agrees = select(entry.eq(const(1)), FloatImm(1, "bool"), entry.eq(index(shape[offset])))
            return select(agrees, index(shape[offset]), entry)
        return build

    source = node_text(call.attrs)
    dims = read_back_dims(context, call.args, [extent(j) for j in range(rank)], "broadcast_to", source or "broadcast_to")
    for position in range(max(rank - length, rank - len(shape)), rank):
        dim = shape[position - (rank - len(shape))]
        if as_int(dim) != 1:
            context.emit_match_cast(PrimValue(dims[position]), PrimStructInfo("int64", dim), "expand_checked",
                                    reason=_entry_reason(source, position - (rank - length)))
    program = make_program("broadcast_to", [data], dims, tensor_dtype(data),
                           lambda axes, buffers: load_broadcast(buffers[0], axes))
    return context.call_tir(program, (data,))


register_op("broadcast_to", deduce=deduce_broadcast_to,
            legalize=static_or_run_time(legalize_broadcast_to, legalize_broadcast_to_run_time),
            reference=broadcast_to_reference, reads_back=True)


# tile ------------------------------------------------------------------------------------------


def deduce_tile(args, attrs) -> TensorStructInfo:
    expect_args("tile", args, 2)
    data = require_tensor(args[0], "tile", 0)
    repeats = shape_operand(args[1], "tile", "the repeats")
    if data.ndim != -1 and repeats.ndim != -1 and data.ndim != repeats.ndim:
        raise DeductionError(f"tile: {repeats.ndim} repeats for a {data.ndim}-d tensor")
    if data.shape is None or repeats.values is None:
        return TensorStructInfo(None, data.dtype, data.ndim if data.ndim != -1 else repeats.ndim)
    return TensorStructInfo(tuple(simplify(d * r) for d, r in zip(data.shape, repeats.values)), data.dtype)


def legalize_tile(context, call: Call):
    info = call.struct_info
    data = call.args[0]

    def body(axes, buffers):
        (source,) = buffers
        return Load(source, tuple(
            IntImm(0) if as_int(dim) == 1 else simplify(axis % dim) for axis, dim in zip(axes, source.shape)
        ))

    program = make_program("tile", [data], info.shape, info.dtype, body)
    return context.call_tir(program, (data,))


def legalize_tile_run_time(context, call: Call):
    """Run-time repeats: each result extent (dim * repeats) is computed on the GPU and read
    back, then the tiling copy."""
    data = call.args[0]
    shape = tensor_shape(data)
    length = operand_length(call, 1)
    if length != len(shape):
        raise UnsupportedModelError(f"tile: {length} repeats for a {len(shape)}-d tensor")

    def extent(position: int):
        return lambda buffers: index(shape[position]) * element(buffers[1], position)

    dims = read_back_dims(context, call.args, [extent(j) for j in range(len(shape))], "tile")

    def body(axes, buffers):
        (source,) = buffers
        if any(as_int(d) == 0 for d in source.shape):  # nothing is ever loaded
            return Load(source, tuple(axes[0] for _ in source.shape))
        return Load(source, tuple(
            IntImm(0) if as_int(dim) == 1 else simplify(axis % dim) for axis, dim in zip(axes, source.shape)
        ))

    program = make_program("tile", [data], dims, tensor_dtype(data), body)
    return context.call_tir(program, (data,))


register_op("tile", deduce=deduce_tile, legalize=static_or_run_time(legalize_tile, legalize_tile_run_time),
            reference=lambda arrays, attrs: np.ascontiguousarray(np.tile(arrays[0], int_list(arrays[1]))), reads_back=True)
