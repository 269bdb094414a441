"""Ops that fill part of a tensor with a constant: pad and trilu.

- ``pad(x, pads, value[, axes], mode="constant")``: ONNX Pad; ``pads`` holds the begin pads
  of each padded axis then the end pads (negative pads crop), ``value`` is a scalar tensor
  (the fill of constant mode), ``axes`` a shape value of constant axes (all axes without it);
  modes ``constant``, ``edge``, ``reflect`` and ``wrap``.  ``pads`` may be a run-time tensor.
- ``trilu(x, k, upper=True)``: ONNX Trilu on the last two dims; ``k`` is a prim value
  (possibly symbolic) or a one-element integer tensor.
"""

from __future__ import annotations


import numpy as np

from ..errors import UnsupportedModelError
from ..ir.expr import Call, tensor_dtype, tensor_shape
from ..ir.op_registry import DeductionError, register_op
from ..ir.struct_info import PrimStructInfo, TensorStructInfo
from ..ir.symbolic import (
    IntImm, as_int, expr_max, expr_min, prove_less_equal, simplify,
)
from ..ir.tir import Cast, FloatImm, Gather, IndexValue, Load, maximum, minimum, select
from .common import (
    expect_args, make_program, needs_known_shapes,
    normalize_axes, require_tensor,
)
from .readback import both, const, element, index, int32, read_back_dims
from .shape_operands import int_list, needs_known_data_shape, operand_length, shape_operand


# pad -------------------------------------------------------------------------------------------

PAD_MODES = ("constant", "edge", "reflect", "wrap")


def _pad_axes(args, ndim: int) -> list[int] | None:
    """The padded axes (normalized when the rank is known), or None when run-time."""
    if len(args) < 4:
        return list(range(ndim)) if ndim != -1 else None
    axes = shape_operand(args[3], "pad", "the axes")
    if axes.values is None or any(as_int(a) is None for a in axes.values):
        return None
    values = [as_int(a) for a in axes.values]
    return normalize_axes("pad", values, ndim) if ndim != -1 else values


def deduce_pad(args, attrs) -> TensorStructInfo:
    if len(args) not in (3, 4):
        raise DeductionError(f"pad: takes 3 or 4 argument(s), got {len(args)}")
    data = require_tensor(args[0], "pad", 0)
    pads = shape_operand(args[1], "pad", "the pads")
    value = require_tensor(args[2], "pad", 2)
    mode = attrs.get("mode", "constant")
    if mode not in PAD_MODES:
        raise DeductionError(f"pad: unknown mode {mode!r}; expected one of {', '.join(PAD_MODES)}")
    if value.dtype != data.dtype:
        raise DeductionError(f"pad: the value is {value.dtype}, the tensor {data.dtype}")
    axes = _pad_axes(args, data.ndim)
    if axes is not None and pads.ndim not in (-1, 2 * len(axes)):
        raise DeductionError(f"pad: {pads.ndim} pads for {len(axes)} padded axes (expected {2 * len(axes)})")
    if data.shape is None or pads.values is None or axes is None:
        return TensorStructInfo(None, data.dtype, data.ndim)
    shape = list(data.shape)
    for position, axis in enumerate(axes):
        shape[axis] = simplify(shape[axis] + pads.values[position] + pads.values[position + len(axes)])
        if as_int(shape[axis]) is not None and as_int(shape[axis]) < 0:
            raise DeductionError(f"pad: dimension {axis} would have {as_int(shape[axis])} elements")
    return TensorStructInfo(tuple(shape), data.dtype)


def legalize_pad(context, call: Call):
    """Negative pads crop first (as onnxruntime does), then the positive pads are filled
    per mode from the cropped range: each padded axis reads ``low + f(q)`` where ``q`` is the
    position in the cropped range and ``f`` maps it inside (edge: clamp; reflect:
    ``(d-1) - |(d-1) - |q||``, for pads shorter than the dim; wrap: ``q % d``, floor modulo,
    for pads of any length)."""
    data, pads_expr, value = call.args[0], call.args[1], call.args[2]
    info = call.struct_info
    mode = call.attrs.get("mode", "constant")
    shape = tensor_shape(data)
    axes = _pad_axes(call.args, len(shape))
    pads = pads_expr.struct_info.values
    plan = {}  # axis -> (first source index, cropped extent, begin pad, end pad)
    for position, axis in enumerate(axes):
        begin, end = pads[position], pads[position + len(axes)]
        low = simplify(expr_max(simplify(0 - begin), 0))
        extent = simplify(shape[axis] - low - expr_max(simplify(0 - end), 0))
        plan[axis] = (low, extent, simplify(expr_max(begin, 0)), simplify(expr_max(end, 0)))
    tensors = [data, value] if mode == "constant" else [data]

    def body(out_axes, buffers):
        source = buffers[0]
        fill = Load(buffers[1], (IntImm(0),) * len(buffers[1].shape)) if mode == "constant" else None
        inner = {axis: simplify(out_axes[axis] - begin) for axis, (_, _, begin, _) in plan.items()}

        def load(mapped):
            return Load(source, tuple(
                simplify(plan[d][0] + mapped[d]) if d in mapped else out_axes[d] for d in range(len(shape))
            ))

        if mode == "edge":
            return load({axis: expr_min(expr_max(q, 0), simplify(plan[axis][1] - 1)) for axis, q in inner.items()})
        if mode == "reflect":
            def reflect(q, extent):
                if as_int(extent) == 1:
                    return IntImm(0)
                magnitude = expr_max(q, simplify(0 - q))
                last = simplify(extent - 1)
                return simplify(last - expr_max(simplify(last - magnitude), simplify(magnitude - last)))
            return load({axis: reflect(q, plan[axis][1]) for axis, q in inner.items()})
        if mode == "wrap":
            def wrap(q, extent, begin, end):
                if prove_less_equal(begin, 0) and prove_less_equal(end, 0):  # every position inside
                    return q
                if as_int(extent) == 0:
                    raise UnsupportedModelError("pad: wrap mode cannot pad an axis cropped to no element")
                return simplify(q % extent)  # floor modulo: positions before the start are negative
            return load({axis: wrap(q, *plan[axis][1:]) for axis, q in inner.items()})
        # constant: the fill where a padded axis's position is before or after the cropped range
        expr = load(inner)
        for axis, q in inner.items():
            _, extent, begin, end = plan[axis]
            if not prove_less_equal(end, 0):  # some positions lie past the end
                expr = select(IndexValue(q).lt(IndexValue(extent)), expr, fill)
            if not prove_less_equal(begin, 0):  # some lie before the start
                expr = select(IndexValue(q).ge(IndexValue(0)), expr, fill)
        return expr

    program = make_program("pad", tensors, info.shape, info.dtype, body)
    return context.call_tir(program, tuple(tensors))


def pad_reference(arrays, attrs):
    x, pads, value = arrays[0], int_list(arrays[1]), np.asarray(arrays[2])
    axes = int_list(arrays[3]) if len(arrays) > 3 else list(range(x.ndim))
    axes = [a + x.ndim if a < 0 else a for a in axes]
    begin, end = [0] * x.ndim, [0] * x.ndim
    for position, axis in enumerate(axes):
        begin[axis], end[axis] = pads[position], pads[position + len(axes)]
    x = x[tuple(slice(max(-b, 0), x.shape[d] - max(-e, 0)) for d, (b, e) in enumerate(zip(begin, end)))]
    widths = [(max(b, 0), max(e, 0)) for b, e in zip(begin, end)]
    mode = attrs.get("mode", "constant")
    if mode == "constant":
        fill = value.reshape(-1)[0] if value.size else 0
        return np.pad(x, widths, mode="constant", constant_values=fill)
    return np.pad(x, widths, mode=mode)


def legalize_pad_run_time(context, call: Call):
    """Run-time pads (``constant`` and ``edge`` modes; the axes constant): each padded
    extent ``dim + begin + end`` is read back, and each padded axis reads ``i - begin``
    (computed in the kernel from the pads): the fill outside the input (constant), or the
    position clamped into the cropped range (edge)."""
    data, pads, value = call.args[0], call.args[1], call.args[2]
    mode = call.attrs.get("mode", "constant")
    if mode not in ("constant", "edge"):
        raise UnsupportedModelError(f"pad: run-time pads have no GPU lowering in {mode} mode (constant and edge only)")
    shape = tensor_shape(data)
    axes = _pad_axes(call.args, len(shape))
    if axes is None:
        raise UnsupportedModelError("pad: run-time axes have no GPU lowering (make them constants)")
    count = len(axes)
    if operand_length(call, 1) != 2 * count:
        raise UnsupportedModelError(f"pad: the pads need a 1-D tensor of {2 * count} entries")
    tensors = (data, pads, value)
    padded = read_back_dims(context, (pads,), [
        (lambda buffers, p=p, axis=axis: index(shape[axis]) + (element(buffers[0], p) + element(buffers[0], p + count)))
        for p, axis in enumerate(axes)
    ], "pad")
    out_shape = list(shape)
    for axis, extent in zip(axes, padded):
        out_shape[axis] = extent

    def body(out_axes, buffers):
        source, pad_buffer, fill_buffer = buffers
        positions: list = list(out_axes)
        inside = None
        for p, axis in enumerate(axes):
            begin, end = element(pad_buffer, p), element(pad_buffer, p + count)
            q = IndexValue(out_axes[axis]) - begin
            if mode == "edge":  # clamp into the cropped range [max(-begin, 0), dim - 1 - max(-end, 0)]
                low = maximum(-begin, const(0))
                high = index(shape[axis] - 1) - maximum(-end, const(0))
                q = minimum(maximum(q, low), high)
            else:
                here = both(q.ge(const(0)), q.lt(index(shape[axis])))
                inside = here if inside is None else both(inside, here)
            positions[axis] = q
        loaded = Gather(source, tuple(positions))
        if inside is None:
            return loaded
        if any(as_int(d) == 0 for d in fill_buffer.shape):
            fill = FloatImm(0, source.dtype)
        else:
            fill = Load(fill_buffer, tuple(IntImm(0) for _ in fill_buffer.shape))
        return select(inside, loaded, fill)

    program = make_program("pad", tensors, tuple(out_shape), tensor_dtype(data), body)
    return context.call_tir(program, tensors)


def _legalize_pad_any(context, call: Call):
    if isinstance(call.args[1].struct_info, TensorStructInfo):
        return needs_known_data_shape(legalize_pad_run_time)(context, call)
    return needs_known_shapes(legalize_pad)(context, call)


register_op("pad", deduce=deduce_pad, legalize=_legalize_pad_any, reference=pad_reference, reads_back=True)


# trilu -----------------------------------------------------------------------------------------


def deduce_trilu(args, attrs) -> TensorStructInfo:
    expect_args("trilu", args, 2)
    data = require_tensor(args[0], "trilu", 0)
    if data.ndim != -1 and data.ndim < 2:
        raise DeductionError(f"trilu: needs at least 2 dims, got {data.ndim}")
    k = args[1].struct_info
    if isinstance(k, TensorStructInfo):
        if not k.dtype.startswith("int"):
            raise DeductionError(f"trilu: k must be an integer, got {k.dtype}")
    elif not isinstance(k, PrimStructInfo):
        raise DeductionError(f"trilu: k must be a prim value or a scalar tensor, got {k}")
    return data


def legalize_trilu(context, call: Call):
    data, k = call.args
    info = call.struct_info
    tensors = [data] + ([k] if isinstance(k.struct_info, TensorStructInfo) else [])

    def body(axes, buffers):
        row, column = axes[-2], axes[-1]
        if len(buffers) > 1:
            offset = int32(Load(buffers[1], (IntImm(0),) * len(buffers[1].shape)))
        else:
            offset = IndexValue(k.struct_info.value)
        above = IndexValue(simplify(column - row))
        keep = above.ge(offset) if call.attrs.get("upper", True) else above.le(offset)
        return select(keep, Load(buffers[0], axes), 0)

    program = make_program("trilu", tensors, info.shape, info.dtype, body)
    return context.call_tir(program, tuple(tensors))


def trilu_reference(arrays, attrs):
    x, k = arrays[0], int(np.asarray(arrays[1]).reshape(-1)[0])
    return np.triu(x, k) if attrs.get("upper", True) else np.tril(x, k)


register_op("trilu", deduce=deduce_trilu, legalize=needs_known_shapes(legalize_trilu), reference=trilu_reference)
