"""Sequences and optionals: ONNX's ``sequence_type`` and ``optional_type`` values.

A sequence is an ordered list of tensors of one dtype whose shapes may differ from one
element to the next (``SequenceStructInfo``: the elements' common annotation and the
length, symbolic when known); an optional is a value or none (``OptionalStructInfo``).  In
the interpreter a sequence is a Python list of arrays and an optional is its value itself,
or ``None`` when empty: an optional that holds a value *is* that value, which is why a
loop may carry an optional sequence in and a sequence out (``is_less_specific``).

On the GPU a sequence is an arena storage plus a table in the host module
(``relaxweb/ir/host.py`` ``HostSequence``): ``sequence_empty``, ``sequence_construct``,
``sequence_insert`` at the end and ``optional_has_element`` / ``optional_get_element`` of a
sequence stay op calls through legalization (``host_lowered``) and ``lower_shapes_to_host``
turns them into table steps and copies into the arena.  The others have no GPU lowering yet (``legalize=None``):
a model with them imports and runs in the interpreter (``relaxweb run MODEL.onnx
--reference``) and ``relaxweb build`` refuses it with the list of such ops.

Positions (``SequenceInsert``, ``SequenceAt``, ``SequenceErase``) are int tensor arguments
and may be negative (counted from the end), as in ONNX.
"""

from __future__ import annotations

import numpy as np

from ..errors import RelaxwebError, UnsupportedModelError
from ..ir.expr import Expr
from ..ir.op_registry import DeductionError, register_op
from ..ir.struct_info import OptionalStructInfo, PrimStructInfo, SequenceStructInfo, StructInfo, TensorStructInfo, join
from ..ir.symbolic import IntImm, as_int, simplify
from ..library.sequence import sequence_write_kernel
from .common import normalize_axis, require_tensor, same_dtype

__all__ = ["host_lowered", "sequence_write_kernel"]


def _sequence(expr: Expr, op: str, position: int = 0) -> SequenceStructInfo:
    info = expr.struct_info
    if isinstance(info, OptionalStructInfo) and isinstance(info.inner, SequenceStructInfo):
        raise DeductionError(f"{op}: argument {position} is {info}; take its element first (OptionalGetElement)")
    if not isinstance(info, SequenceStructInfo):
        raise DeductionError(f"{op}: argument {position} must be a sequence, got {info}")
    return info


def _element_join(op: str, element: TensorStructInfo, tensor: TensorStructInfo) -> TensorStructInfo:
    """The annotation every element satisfies after ``tensor`` joins ``element``'s sequence."""
    joined = join(element, tensor)
    if not isinstance(joined, TensorStructInfo):
        raise DeductionError(f"{op}: a {tensor.dtype} tensor cannot join a sequence of {element.dtype} tensors")
    return joined


def _position_arg(op: str, args, index: int) -> None:
    if len(args) > index:
        info = require_tensor(args[index], op, index)
        if info.dtype not in ("int32", "int64") or info.ndim not in (0, 1, -1):
            raise DeductionError(f"{op}: the position must be an int32 or int64 scalar, got {info}")


def _index(op: str, position, length: int, inserting: bool = False) -> int:
    """An ONNX position (negative from the end) as a list index, checked."""
    value = int(np.asarray(position).reshape(-1)[0])
    top = length if inserting else length - 1
    if not -length <= value <= top:
        raise RelaxwebError(f"{op}: position {value} is out of range for a sequence of {length}")
    return value + length if value < 0 else value


def host_lowered(context, call):
    """The legalization of the ops the host lowers: the call itself, kept for
    ``lower_shapes_to_host``; an insert at a given position and the element of an optional
    tensor are not lowered yet."""
    if call.op == "optional_has_element" and not call.attrs.get("prim"):
        raise UnsupportedModelError("optional_has_element: no GPU lowering yet for optional tensors")
    if call.op == "optional_get_element" and not isinstance(call.struct_info, SequenceStructInfo):
        raise UnsupportedModelError("optional_get_element: no GPU lowering yet for optional tensors")
    if call.op == "sequence_insert" and len(call.args) > 2:
        raise UnsupportedModelError("sequence_insert: no GPU lowering yet for an insert at a given position "
                            "(only at the end, without the position input)")
    return call


# SequenceEmpty, SequenceConstruct, SequenceInsert ---------------------------------------------


def deduce_sequence_empty(args, attrs) -> SequenceStructInfo:
    return SequenceStructInfo(TensorStructInfo(None, str(attrs.get("dtype", "float32")), -1), IntImm(0))


def sequence_empty_reference(arrays, attrs) -> list:
    return []


def deduce_sequence_construct(args, attrs) -> SequenceStructInfo:
    if not args:
        raise DeductionError("sequence_construct: needs at least one tensor")
    infos = [require_tensor(arg, "sequence_construct", i) for i, arg in enumerate(args)]
    same_dtype("sequence_construct", infos)
    element = infos[0]
    for info in infos[1:]:
        element = _element_join("sequence_construct", element, info)
    return SequenceStructInfo(element, IntImm(len(infos)))


def sequence_construct_reference(arrays, attrs) -> list:
    return [np.asarray(a) for a in arrays]


def deduce_sequence_insert(args, attrs) -> SequenceStructInfo:
    if len(args) not in (2, 3):
        raise DeductionError(f"sequence_insert: takes a sequence, a tensor and an optional position, got {len(args)}")
    sequence = _sequence(args[0], "sequence_insert")
    tensor = require_tensor(args[1], "sequence_insert", 1)
    _position_arg("sequence_insert", args, 2)
    if tensor.dtype != sequence.element.dtype:
        raise DeductionError(f"sequence_insert: a {tensor.dtype} tensor cannot join a sequence of "
                             f"{sequence.element.dtype} tensors")
    empty = sequence.length is not None and as_int(sequence.length) == 0
    element = tensor if empty else _element_join("sequence_insert", sequence.element, tensor)
    length = simplify(sequence.length + 1) if sequence.length is not None else None
    return SequenceStructInfo(element, length)


def sequence_insert_reference(arrays, attrs) -> list:
    sequence, tensor = list(arrays[0]), np.asarray(arrays[1])
    position = _index("sequence_insert", arrays[2], len(sequence), inserting=True) if len(arrays) > 2 \
        else len(sequence)
    sequence.insert(position, tensor)
    return sequence


register_op("sequence_empty", deduce=deduce_sequence_empty, legalize=host_lowered, reference=sequence_empty_reference)
register_op("sequence_construct", deduce=deduce_sequence_construct, legalize=host_lowered,
            reference=sequence_construct_reference)
register_op("sequence_insert", deduce=deduce_sequence_insert, legalize=host_lowered, reference=sequence_insert_reference)


# SequenceAt, SequenceLength, SequenceErase ----------------------------------------------------


def deduce_sequence_at(args, attrs) -> TensorStructInfo:
    if len(args) != 2:
        raise DeductionError(f"sequence_at: takes a sequence and a position, got {len(args)} arguments")
    sequence = _sequence(args[0], "sequence_at")
    _position_arg("sequence_at", args, 1)
    return sequence.element


def sequence_at_reference(arrays, attrs) -> np.ndarray:
    sequence = arrays[0]
    return np.asarray(sequence[_index("sequence_at", arrays[1], len(sequence))])


def deduce_sequence_length(args, attrs) -> TensorStructInfo:
    if len(args) != 1:
        raise DeductionError(f"sequence_length: takes one sequence, got {len(args)} arguments")
    _sequence(args[0], "sequence_length")
    return TensorStructInfo((), "int64")


def sequence_length_reference(arrays, attrs) -> np.ndarray:
    return np.array(len(arrays[0]), dtype=np.int64)


def deduce_sequence_erase(args, attrs) -> SequenceStructInfo:
    if len(args) not in (1, 2):
        raise DeductionError(f"sequence_erase: takes a sequence and an optional position, got {len(args)}")
    sequence = _sequence(args[0], "sequence_erase")
    _position_arg("sequence_erase", args, 1)
    length = simplify(sequence.length - 1) if sequence.length is not None else None
    return SequenceStructInfo(sequence.element, length)


def sequence_erase_reference(arrays, attrs) -> list:
    sequence = list(arrays[0])
    position = _index("sequence_erase", arrays[1] if len(arrays) > 1 else -1, len(sequence))
    del sequence[position]
    return sequence


register_op("sequence_at", deduce=deduce_sequence_at, legalize=None, reference=sequence_at_reference)
register_op("sequence_length", deduce=deduce_sequence_length, legalize=None, reference=sequence_length_reference)
register_op("sequence_erase", deduce=deduce_sequence_erase, legalize=None, reference=sequence_erase_reference)


# ConcatFromSequence, SplitToSequence ----------------------------------------------------------


def deduce_concat_from_sequence(args, attrs) -> TensorStructInfo:
    if len(args) != 1:
        raise DeductionError(f"concat_from_sequence: takes one sequence, got {len(args)} arguments")
    sequence = _sequence(args[0], "concat_from_sequence")
    element = sequence.element
    new_axis = bool(attrs.get("new_axis", 0))
    ndim = element.ndim + 1 if new_axis and element.ndim != -1 else element.ndim
    if ndim == -1:
        return TensorStructInfo(None, element.dtype, -1)
    axis = normalize_axis("concat_from_sequence", int(attrs["axis"]), ndim)
    if element.shape is None or sequence.length is None:
        return TensorStructInfo(None, element.dtype, ndim)
    # every element has the element's shape: the result's follows from the length
    shape = list(element.shape)
    if new_axis:
        shape.insert(axis, sequence.length)
    else:
        shape[axis] = simplify(shape[axis] * sequence.length)
    return TensorStructInfo(tuple(shape), element.dtype)


def concat_from_sequence_reference(arrays, attrs) -> np.ndarray:
    sequence = [np.asarray(a) for a in arrays[0]]
    if not sequence:
        raise RelaxwebError("concat_from_sequence: the sequence is empty")
    if attrs.get("new_axis", 0):
        return np.stack(sequence, axis=int(attrs["axis"]))
    return np.concatenate(sequence, axis=int(attrs["axis"]))


def deduce_split_to_sequence(args, attrs) -> SequenceStructInfo:
    if len(args) not in (1, 2):
        raise DeductionError(f"split_to_sequence: takes a tensor and optional split sizes, got {len(args)}")
    data = require_tensor(args[0], "split_to_sequence", 0)
    if len(args) == 2:
        require_tensor(args[1], "split_to_sequence", 1)
        return SequenceStructInfo(TensorStructInfo(None, data.dtype, data.ndim))
    if data.ndim == -1:
        return SequenceStructInfo(TensorStructInfo(None, data.dtype, -1))
    axis = normalize_axis("split_to_sequence", int(attrs.get("axis", 0)), data.ndim)
    keepdims = bool(attrs.get("keepdims", 1))
    if data.shape is None:
        return SequenceStructInfo(TensorStructInfo(None, data.dtype, data.ndim if keepdims else data.ndim - 1))
    shape = list(data.shape)
    if keepdims:
        shape[axis] = IntImm(1)
    else:
        del shape[axis]
    return SequenceStructInfo(TensorStructInfo(tuple(shape), data.dtype), data.shape[axis])


def split_to_sequence_reference(arrays, attrs) -> list:
    data = np.asarray(arrays[0])
    axis = int(attrs.get("axis", 0))
    extent = data.shape[axis]
    if len(arrays) < 2:
        parts = np.split(data, extent, axis=axis)
        return parts if attrs.get("keepdims", 1) else [np.squeeze(p, axis=axis) for p in parts]
    split = np.asarray(arrays[1]).astype(np.int64)
    if split.ndim == 0:  # chunks of that size, the last one smaller
        size = int(split)
        if size <= 0:
            raise RelaxwebError(f"split_to_sequence: the split size must be positive, got {size}")
        boundaries = list(range(size, extent, size))
    else:
        if int(split.sum()) != extent:
            raise RelaxwebError(f"split_to_sequence: the split sizes {split.tolist()} do not add up to {extent}")
        boundaries = np.cumsum(split)[:-1].tolist()
    return np.split(data, boundaries, axis=axis)


register_op("concat_from_sequence", deduce=deduce_concat_from_sequence, legalize=None,
            reference=concat_from_sequence_reference)
register_op("split_to_sequence", deduce=deduce_split_to_sequence, legalize=None, reference=split_to_sequence_reference)


# Optional, OptionalHasElement, OptionalGetElement ---------------------------------------------


def deduce_optional(args, attrs) -> OptionalStructInfo:
    if len(args) != 1:
        raise DeductionError(f"optional: wraps one value, got {len(args)} arguments")
    info = args[0].struct_info
    if not isinstance(info, (TensorStructInfo, SequenceStructInfo)):
        raise DeductionError(f"optional: holds a tensor or a sequence, got {info}")
    return OptionalStructInfo(info)


def optional_reference(arrays, attrs):
    return arrays[0]


def deduce_optional_none(args, attrs) -> OptionalStructInfo:
    """An empty optional of a tensor (``of="tensor"``) or a sequence (``of="sequence"``) of ``dtype``."""
    if args:
        raise DeductionError("optional_none: takes no arguments")
    tensor = TensorStructInfo(None, str(attrs["dtype"]), -1)
    of = attrs.get("of", "tensor")
    if of not in ("tensor", "sequence"):
        raise DeductionError(f"optional_none: of={of!r}, expected 'tensor' or 'sequence'")
    return OptionalStructInfo(SequenceStructInfo(tensor) if of == "sequence" else tensor)


def optional_none_reference(arrays, attrs):
    return None


def deduce_optional_has_element(args, attrs) -> TensorStructInfo | PrimStructInfo:
    """A bool tensor, or with ``prim=1`` (an optional sequence, whose presence the host
    knows) a prim value 0 or 1, which the host can branch on without reading the GPU."""
    if len(args) != 1:
        raise DeductionError(f"optional_has_element: takes one value, got {len(args)} arguments")
    return PrimStructInfo("int64") if attrs.get("prim") else TensorStructInfo((), "bool")


def optional_has_element_reference(arrays, attrs):
    return int(arrays[0] is not None) if attrs.get("prim") else np.array(arrays[0] is not None)


def deduce_optional_get_element(args, attrs) -> StructInfo:
    if len(args) != 1:
        raise DeductionError(f"optional_get_element: takes one value, got {len(args)} arguments")
    info = args[0].struct_info
    return info.inner if isinstance(info, OptionalStructInfo) else info


def optional_get_element_reference(arrays, attrs):
    if arrays[0] is None:
        raise RelaxwebError("optional_get_element: the optional is empty")
    return arrays[0]


register_op("optional", deduce=deduce_optional, legalize=None, reference=optional_reference)
register_op("optional_none", deduce=deduce_optional_none, legalize=None, reference=optional_none_reference)
register_op("optional_has_element", deduce=deduce_optional_has_element, legalize=host_lowered,
            reference=optional_has_element_reference)
register_op("optional_get_element", deduce=deduce_optional_get_element, legalize=host_lowered,
            reference=optional_get_element_reference)
