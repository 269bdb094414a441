"""Shape operands of the data movement ops (a reshape target, the repeats of a tile, pads...):
shape values (``ShapeExpr``, possibly symbolic) known at compile time, or 1-D integer tensors
computed at run time, whose result shapes are then data-dependent (only the rank is deduced)
and whose legalizations read the extents back (``relaxweb/ops/readback.py``)."""

from __future__ import annotations

import functools

import numpy as np

from ..errors import UnsupportedModelError
from ..ir.expr import Call, Expr
from ..ir.op_registry import DeductionError
from ..ir.struct_info import ShapeStructInfo, TensorStructInfo
from ..ir.symbolic import (
    as_int,
)
from .common import (
    UnknownShapeError, needs_known_shapes,
)


def shape_values(expr: Expr, op: str, what: str) -> ShapeStructInfo:
    info = expr.struct_info
    if not isinstance(info, ShapeStructInfo):
        raise DeductionError(f"{op}: {what} must be a known shape value, got {info}")
    return info


def shape_operand(expr: Expr, op: str, what: str) -> ShapeStructInfo:
    """A shape operand: a shape value, or a run-time 1-D integer tensor, seen as a shape
    value whose entries are unknown (its length is known when the tensor's shape is)."""
    info = expr.struct_info
    if isinstance(info, ShapeStructInfo):
        return info
    if isinstance(info, TensorStructInfo):
        if not (info.dtype.startswith("int") or info.dtype.startswith("uint")):
            raise DeductionError(f"{op}: {what} must be an integer tensor, got {info.dtype}")
        if info.ndim not in (-1, 1):
            raise DeductionError(f"{op}: {what} must be a 1-D tensor, got {info.ndim} dims")
        length = as_int(info.shape[0]) if info.shape is not None else None
        return ShapeStructInfo(None, length if length is not None else -1)
    raise DeductionError(f"{op}: {what} must be a shape value or a 1-D integer tensor, got {info}")


def int_list(array) -> list[int]:
    """The entries of a shape operand's value (a shape value or an integer tensor)."""
    return [int(v) for v in np.asarray(array).reshape(-1)]


def needs_known_data_shape(legalize):
    """Wrap a legalization whose result shape is data-dependent (read back): the arguments'
    shapes must be known, the result's is not."""
    @functools.wraps(legalize)
    def wrapper(context, call: Call):
        for position, arg in enumerate(call.args):
            info = arg.struct_info
            if isinstance(info, TensorStructInfo) and info.shape is None:
                raise UnknownShapeError(
                    f"{call.op}: argument {position} has an unknown shape ({info}); legalization needs a "
                    "known shape: add a match_cast that gives its dims names"
                )
        return legalize(context, call)

    return wrapper


def operand_length(call: Call, position: int) -> int | None:
    """The length of a run-time 1-D integer tensor operand, or None for a shape value."""
    info = call.args[position].struct_info
    if not isinstance(info, TensorStructInfo):
        return None
    length = as_int(info.shape[0]) if info.shape is not None and len(info.shape) == 1 else None
    if length is None:
        raise UnsupportedModelError(f"{call.op}: the run-time operand needs a 1-D tensor of known length")
    return int(length)


def static_or_run_time(static, run_time):
    """A legalization that takes ``static`` for a shape-value operand and ``run_time`` for a
    run-time tensor (argument 1); it reads as ``static`` (its name and module)."""
    @functools.wraps(static)
    def legalize(context, call: Call):
        if isinstance(call.args[1].struct_info, TensorStructInfo):
            return needs_known_data_shape(run_time)(context, call)
        return needs_known_shapes(static)(context, call)

    return legalize
