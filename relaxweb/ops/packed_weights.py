"""Packed weights: a float32 tensor decoded from uint32 words, where the kernel reads it.

``unpack_weights(words, [scales, [zero_points]], format, axis, extent, group_size)`` is the
float32 tensor whose shape is ``words``'s with dim ``axis`` of extent ``extent``.  Along
``axis``, each uint32 word holds consecutive values, the first in its lowest bits:

- ``format="float16"``: 2 float16 values per word; no scales;
- ``format="int8"`` / ``"int4"``: 4 / 8 unsigned fields ``q`` per word, and the value is
  ``(q - zero_point) * scale``, with one scale (and zero point) per group of ``group_size``
  consecutive values along ``axis`` (the last group may be shorter).

``scales`` has ``words``'s shape but for dim ``axis``: one entry per group, as a float tensor,
or, as ``uint32``, float16 scales packed two per word along ``axis`` (the bundle keeps float16
tensors as float32, so packing is what makes them 2 bytes).  ``zero_points`` is absent (the
middle of the range: 8 for int4, 128 for int8, i.e. symmetric quantization), a float tensor
shaped like float scales, or, as ``uint32``, fields of the format's width packed along
``axis`` like the values (one per group).  Words past ``extent`` are padding.

Deduction: ``words`` (and packed parameters) are uint32, their dims along ``axis`` hold the
values (``ceil(extent / per_word)``), the other dims equal.  The result is float32.

Legalization: one injective program (a word load, a shift, a mask, the zero point subtracted,
times the scale; float16 through WGSL's core ``unpack2x16float``): no branch, no reduction,
so ``fuse_ops`` inlines it into the matmul, gather or convolution that reads it and the
dequantized tensor never exists in GPU memory (``passes/compress_weights.py`` writes these
calls; ``frontend/converters/quantization.py`` imports MatMulNBits and GatherBlockQuantized as
them).  The numpy helpers that pack (``pack_fields``, ``pack_halves``) are the encoders the
decoding here inverts.
"""

from __future__ import annotations

import numpy as np

from ..ir.expr import Call
from ..ir.op_registry import DeductionError, register_op
from ..ir.struct_info import TensorStructInfo
from ..ir.symbolic import IntImm, PrimExpr, format_expr, prove_equal
from ..ir.tir import Buffer, Cast, FloatImm, IndexValue, Load, ScalarExpr, bitwise_and, cast, shift_right, unpack_half
from .common import make_program, needs_known_shapes, require_tensor

#: Bits per value of each format.
FORMAT_BITS = {"float16": 16, "int8": 8, "int4": 4}


def per_word(format: str) -> int:
    """Values per uint32 word."""
    return 32 // FORMAT_BITS[format]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def group_count(extent: int, group_size: int) -> int:
    return _ceil_div(extent, group_size)


# -- deduction ----------------------------------------------------------------------------------


def _check_attrs(attrs) -> tuple[str, int, int, int]:
    format = attrs.get("format")
    if format not in FORMAT_BITS:
        raise DeductionError(f"unpack_weights: format must be one of {', '.join(FORMAT_BITS)}, got {format!r}")
    axis, extent, group_size = int(attrs.get("axis", 0)), int(attrs.get("extent", 0)), int(attrs.get("group_size", 0))
    if extent < 1 or (format != "float16" and group_size < 1):
        raise DeductionError(f"unpack_weights: extent {extent} and group_size {group_size} must be >= 1")
    if attrs.get("zero_points_in_words") and format == "float16":
        raise DeductionError("unpack_weights: float16 has no zero points to hold in the words")
    return format, axis, extent, group_size


def zero_points_start(attrs) -> int:
    """The field (along the axis) where zero points held in the words begin: after the words
    of the values."""
    format, _, extent, _ = _check_attrs(attrs)
    return _ceil_div(extent, per_word(format)) * per_word(format)


def deduce_unpack_weights(args, attrs) -> TensorStructInfo:
    format, axis, extent, group_size = _check_attrs(attrs)
    in_words = bool(attrs.get("zero_points_in_words"))
    expected_args = (1,) if format == "float16" else (2,) if in_words else (2, 3)
    if len(args) not in expected_args:
        raise DeductionError(f"unpack_weights: format {format} takes {' or '.join(map(str, expected_args))} argument(s), "
                             f"got {len(args)}")
    words, *parameters = (require_tensor(arg, "unpack_weights", i) for i, arg in enumerate(args))
    if words.dtype != "uint32":
        raise DeductionError(f"unpack_weights: the words must be uint32, got {words.dtype}")
    if not 0 <= axis < max(words.ndim, 1):
        raise DeductionError(f"unpack_weights: axis {axis} is out of range for {words.ndim}-d words")
    if words.shape is None:
        return TensorStructInfo(None, "float32", words.ndim)
    groups = group_count(extent, group_size) if parameters else 0
    extents = {0: _ceil_div(extent, per_word(format)) + (_ceil_div(groups, per_word(format)) if in_words else 0)}
    if parameters:
        scales = parameters[0]
        extents[1] = _ceil_div(groups, 2) if scales.dtype == "uint32" else groups
        if not (scales.dtype == "uint32" or scales.dtype.startswith("float")):
            raise DeductionError(f"unpack_weights: the scales must be float or uint32 (packed float16), got {scales.dtype}")
    if len(parameters) == 2:
        zero_points = parameters[1]
        extents[2] = _ceil_div(groups, per_word(format)) if zero_points.dtype == "uint32" else groups
        if not (zero_points.dtype == "uint32" or zero_points.dtype.startswith("float")):
            raise DeductionError(f"unpack_weights: the zero points must be float or uint32 (packed), got {zero_points.dtype}")
    for position, info in enumerate((words, *parameters)):
        if info.shape is None:
            continue
        if info.ndim != words.ndim:
            raise DeductionError(f"unpack_weights: argument {position} needs {words.ndim} dims like the words, got {info}")
        for dim, (have, other) in enumerate(zip(info.shape, words.shape)):
            want = IntImm(extents[position]) if dim == axis else other
            if not prove_equal(have, want):
                raise DeductionError(f"unpack_weights: dim {dim} of argument {position} is {format_expr(have)}, "
                                     f"expected {format_expr(want)}")
    shape = tuple(IntImm(extent) if dim == axis else d for dim, d in enumerate(words.shape))
    return TensorStructInfo(shape, "float32")


# -- legalization -------------------------------------------------------------------------------


def _field(words: Buffer, axes, axis: int, index: PrimExpr, bits: int) -> ScalarExpr:
    """Field ``index`` (along ``axis``) of ``bits`` bits of the words, as a uint32."""
    count = 32 // bits
    word = Load(words, tuple(index // count if dim == axis else a for dim, a in enumerate(axes)))
    shifted = shift_right(word, Cast("uint32", IndexValue(index % count * bits)))
    return shifted if bits == 16 else bitwise_and(shifted, FloatImm(2 ** bits - 1, "uint32"))


def decode_body(axes, buffers: list[Buffer], attrs) -> ScalarExpr:
    """The value at ``axes`` (the scalar expression a kernel inlines)."""
    format, axis, _, group_size = _check_attrs(attrs)
    bits, position = FORMAT_BITS[format], axes[axis]
    words, *parameters = buffers
    field = _field(words, axes, axis, position, bits)
    if format == "float16":
        return unpack_half(field)
    group = position // group_size

    def parameter(buffer: Buffer, packed_bits: int) -> ScalarExpr:
        if buffer.dtype == "uint32":
            value = _field(buffer, axes, axis, group, packed_bits)
            return unpack_half(value) if packed_bits == 16 else cast("float32", value)
        return cast("float32", Load(buffer, tuple(group if dim == axis else a for dim, a in enumerate(axes))))

    scale = parameter(parameters[0], 16)
    if attrs.get("zero_points_in_words"):
        zero_point = cast("float32", _field(words, axes, axis, zero_points_start(attrs) + group, bits))
    elif len(parameters) == 2:
        zero_point = parameter(parameters[1], bits)
    else:
        zero_point = FloatImm(float(2 ** (bits - 1)))
    return (cast("float32", field) - zero_point) * scale


def legalize_unpack_weights(context, call: Call):
    info = call.struct_info
    program = make_program("unpack_weights", call.args, info.shape, "float32",
                           lambda axes, buffers: decode_body(axes, buffers, call.attrs))
    return context.call_tir(program, call.args)


# -- numpy: packing and the reference -----------------------------------------------------------


def pack_fields(fields: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """Unsigned ``bits``-bit fields packed into uint32 words along ``axis``, the first field in
    the lowest bits (zero padding at the end)."""
    count = 32 // bits
    fields = np.moveaxis(np.asarray(fields).astype(np.uint32), axis, -1)
    padding = (-fields.shape[-1]) % count
    fields = np.concatenate([fields, np.zeros((*fields.shape[:-1], padding), np.uint32)], axis=-1)
    fields = fields.reshape(*fields.shape[:-1], -1, count)
    shifts = (np.arange(count, dtype=np.uint32) * bits).astype(np.uint32)
    words = np.bitwise_or.reduce(fields << shifts, axis=-1).astype(np.uint32)
    return np.ascontiguousarray(np.moveaxis(words, -1, axis))


def pack_halves(values: np.ndarray, axis: int) -> np.ndarray:
    """Float values rounded to float16 and packed two per uint32 word along ``axis``."""
    return pack_fields(np.asarray(values).astype(np.float16).view(np.uint16), 16, axis)


def unpack_fields(words: np.ndarray, bits: int, axis: int, extent: int) -> np.ndarray:
    """The first ``extent`` fields along ``axis`` (the inverse of :func:`pack_fields`)."""
    count = 32 // bits
    moved = np.moveaxis(words.astype(np.uint32), axis, -1)
    shifts = (np.arange(count, dtype=np.uint32) * bits).astype(np.uint32)
    fields = (moved[..., None] >> shifts) & np.uint32(2 ** bits - 1)
    fields = fields.reshape(*moved.shape[:-1], -1)[..., :extent]
    return np.moveaxis(fields, -1, axis)


def unpack_weights_reference(arrays, attrs) -> np.ndarray:
    format, axis, extent, group_size = _check_attrs(attrs)
    bits = FORMAT_BITS[format]
    words, *parameters = arrays
    fields = unpack_fields(words, bits, axis, extent)
    if format == "float16":
        return fields.astype(np.uint16).view(np.float16).astype(np.float32)
    groups = group_count(extent, group_size)

    def per_value(parameter: np.ndarray, packed_bits: int) -> np.ndarray:
        if parameter.dtype == np.uint32:
            parameter = unpack_fields(parameter, packed_bits, axis, groups)
            parameter = parameter.astype(np.uint16).view(np.float16) if packed_bits == 16 else parameter
        return np.repeat(parameter.astype(np.float32), group_size, axis=axis).take(range(extent), axis=axis)

    if attrs.get("zero_points_in_words"):
        start = zero_points_start(attrs)
        parameters = [parameters[0], pack_fields(unpack_fields(words, bits, axis, start + groups).take(
            range(start, start + groups), axis=axis), bits, axis)]
    scale = per_value(parameters[0], 16)
    zero_point = per_value(parameters[1], bits) if len(parameters) == 2 else np.float32(2 ** (bits - 1))
    return ((fields.astype(np.float32) - zero_point) * scale).astype(np.float32)


register_op("unpack_weights", deduce=deduce_unpack_weights, legalize=needs_known_shapes(legalize_unpack_weights),
            reference=unpack_weights_reference)
