"""Normalization ops: layer, RMS, group (and instance), batch (inference) and Lp normalization.

Signatures (args, then attributes):

- ``layer_norm(x, scale[, bias], axis, epsilon)``: normalise over the dims from ``axis`` on,
  then ``* scale + bias`` (both broadcast against those trailing dims).
  ``layer_norm_inv_std(x, axis, epsilon)`` is ONNX's ``InvStdDev`` output, shaped like ``x``
  with the normalised dims 1 (its ``Mean`` output is ``mean(..., keepdims=True)``).
- ``rms_norm(x, scale, axis, epsilon)``: root-mean-square normalization (no centering):
  ``x / sqrt(mean(x^2) + epsilon) * scale`` over the dims from ``axis`` on (ONNX's
  RMSNormalization, onnxruntime's SimplifiedLayerNormalization); ``rms_norm_inv_std(x, axis,
  epsilon)`` is its ``1 / sqrt(mean(x^2) + epsilon)``, shaped like ``x`` with the normalised
  dims 1.
- ``group_norm(x, scale, bias, num_groups, epsilon)``: ``x`` is ``[N, C, *spatial]``; the
  statistics are over each group of ``C / num_groups`` channels and the spatial dims;
  ``scale`` and ``bias`` are per channel (``[C]``).  ``num_groups=-1`` is one group per
  channel (instance normalization), whatever ``C`` is.
- ``batch_norm(x, scale, bias, mean, var, epsilon)``: inference, per channel (dim 1) with the
  given statistics (``[C]`` each).
- ``lp_norm(x, axis, p)``: ``x / ||x||_p`` along ``axis`` (``p`` 1 or 2; 0 where the norm is 0).

The variance is the population variance (divided by the count), as ONNX.  Statistics of
float16 inputs are computed in float32 by the references.

Legalization: the statistics in one tensor program each (a reduction), then one
elementwise program.  Everything that needs a square root lowers only when the
tensor-program IR has ``sqrt``; ``lp_norm`` with ``p=1`` always lowers.  (The ONNX frontend
folds a BatchNormalization with constant statistics into a multiply and an add, which
always lower.)
"""

from __future__ import annotations

import numpy as np

from ..ir.expr import Call, tensor_shape
from ..ir.op_registry import DeductionError, register_op
from ..ir.struct_info import TensorStructInfo
from ..ir.symbolic import IntImm, SizeVar, format_expr, product, prove_equal, simplify
from ..ir.tir import Cast, FloatImm, IndexValue, Load, Reduce, ReduceCombiner, maximum, select, sqrt
from .common import (
    broadcast_indices, broadcast_shapes, make_program, needs_known_shapes, normalize_axis, require_float,
    require_tensor, same_dtype,
)



def _compute(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64) if x.dtype == np.float64 else x.astype(np.float32)


def _count(shape, axes, dtype):
    """The number of elements over ``axes``, as a float."""
    return Cast("float32", IndexValue(product(shape[d] for d in axes)))


def _inv_sqrt(value, epsilon: float):
    return 1.0 / sqrt(value + epsilon)


# layer_norm ------------------------------------------------------------------------------------


def _layer_axes(op: str, attrs, ndim: int) -> list[int]:
    axis = normalize_axis(op, int(attrs.get("axis", -1)), ndim)
    return list(range(axis, ndim))


def deduce_layer_norm(args, attrs) -> TensorStructInfo:
    if len(args) not in (2, 3):
        raise DeductionError(f"layer_norm: takes 2 or 3 arguments (x, scale, bias), got {len(args)}")
    return _deduce_scaled_norm("layer_norm", args, attrs)


def _deduce_scaled_norm(op: str, args, attrs) -> TensorStructInfo:
    """x normalised over the dims from ``axis`` on; the other arguments broadcast to those dims."""
    infos = [require_tensor(arg, op, i) for i, arg in enumerate(args)]
    same_dtype(op, infos)
    data = infos[0]
    require_float(op, data)
    if data.ndim == -1:
        return data
    axes = _layer_axes(op, attrs, data.ndim)
    if data.shape is None:
        return data
    normalized = data.shape[axes[0]:]
    for position, info in enumerate(infos[1:], start=1):
        if info.shape is None:
            continue
        if len(info.shape) > len(normalized):
            raise DeductionError(
                f"{op}: argument {position} {info} has more dims than the normalized dims {len(normalized)}"
            )
        result = broadcast_shapes(op, [normalized, info.shape], scope="the normalized dims",
                                  origins=[(0, axes[0]), (position, 0)])
        if len(result) != len(normalized) or not all(prove_equal(a, b) for a, b in zip(result, normalized)):
            raise DeductionError(f"{op}: argument {position} {info} does not broadcast to the normalized dims")
    return data


def _deduce_inv_std(op: str):
    def deduce(args, attrs) -> TensorStructInfo:
        if len(args) != 1:
            raise DeductionError(f"{op}: takes 1 argument, got {len(args)}")
        data = require_tensor(args[0], op, 0)
        require_float(op, data)
        if data.shape is None:
            return data
        axes = _layer_axes(op, attrs, data.ndim)
        return TensorStructInfo(tuple(IntImm(1) if d in axes else dim for d, dim in enumerate(data.shape)), data.dtype)

    return deduce


def _statistics(context, name: str, data, axes: list[int], epsilon: float, dtype: str):
    """Programs for the mean and the inverse standard deviation over ``axes`` (kept as 1)."""
    shape = tensor_shape(data)
    kept = tuple(IntImm(1) if d in axes else dim for d, dim in enumerate(shape))
    reduce_vars = {d: SizeVar(f"r{d}_") for d in axes}

    def over(index_of, body_of):
        index = tuple(reduce_vars.get(d, index_of[d]) for d in range(len(shape)))
        body = body_of(index)
        for d in reversed(axes):
            body = Reduce(ReduceCombiner.SUM, reduce_vars[d], shape[d], body)
        return body

    def kept_index(index):
        return tuple(IntImm(0) if d in axes else index[d] for d in range(len(index)))

    mean_program = make_program(
        f"{name}_mean", [data], kept, dtype,
        lambda out, buffers: over(out, lambda i: Load(buffers[0], i)) / _count(shape, axes, dtype),
    )
    mean = context.emit(context.call_tir(mean_program, (data,)), f"{name}_mean")

    def inv_std_body(out, buffers):
        source, average = buffers

        def square(index):
            centered = Load(source, index) - Load(average, kept_index(index))
            return centered * centered

        variance = over(out, square) / _count(shape, axes, dtype)
        return _inv_sqrt(variance, epsilon)

    inv_std_program = make_program(f"{name}_inv_std", [data, mean], kept, dtype, inv_std_body)
    inv_std = context.emit(context.call_tir(inv_std_program, (data, mean)), f"{name}_inv_std")
    return mean, inv_std, kept_index


def legalize_layer_norm(context, call: Call):
    info = call.struct_info
    data = call.args[0]
    axes = _layer_axes("layer_norm", call.attrs, info.ndim)
    epsilon = float(call.attrs.get("epsilon", 1e-5))
    mean, inv_std, kept_index = _statistics(context, "layer_norm", data, axes, epsilon, info.dtype)
    args = (data, mean, inv_std, *call.args[1:])

    def body(out, buffers):
        source, average, deviation, scale = buffers[:4]
        centered = Load(source, out) - Load(average, kept_index(out))
        value = centered * Load(deviation, kept_index(out)) * Load(scale, broadcast_indices(scale.shape, out))
        if len(buffers) > 4:
            value = value + Load(buffers[4], broadcast_indices(buffers[4].shape, out))
        return value

    program = make_program("layer_norm", args, info.shape, info.dtype, body)
    return context.call_tir(program, args)


def legalize_layer_norm_inv_std(context, call: Call):
    info = call.struct_info
    data = call.args[0]
    axes = _layer_axes("layer_norm_inv_std", call.attrs, len(tensor_shape(data)))
    _, inv_std, _ = _statistics(context, "layer_norm", data, axes, float(call.attrs.get("epsilon", 1e-5)), info.dtype)
    return inv_std


def _layer_statistics(x: np.ndarray, axes: tuple, epsilon: float):
    computed = _compute(x)
    mean = computed.mean(axis=axes, keepdims=True)
    variance = ((computed - mean) ** 2).mean(axis=axes, keepdims=True)
    return computed, mean, 1.0 / np.sqrt(variance + epsilon)


def layer_norm_reference(arrays, attrs):
    x = arrays[0]
    axes = tuple(_layer_axes("layer_norm", attrs, x.ndim))
    computed, mean, inv_std = _layer_statistics(x, axes, float(attrs.get("epsilon", 1e-5)))
    result = (computed - mean) * inv_std * _compute(arrays[1])
    if len(arrays) > 2:
        result = result + _compute(arrays[2])
    return result.astype(x.dtype)


def layer_norm_inv_std_reference(arrays, attrs):
    x = arrays[0]
    axes = tuple(_layer_axes("layer_norm_inv_std", attrs, x.ndim))
    return _layer_statistics(x, axes, float(attrs.get("epsilon", 1e-5)))[2].astype(x.dtype)


register_op("layer_norm", deduce=deduce_layer_norm, legalize=needs_known_shapes(legalize_layer_norm),
            reference=layer_norm_reference)
register_op("layer_norm_inv_std", deduce=_deduce_inv_std("layer_norm_inv_std"), legalize=needs_known_shapes(legalize_layer_norm_inv_std),
            reference=layer_norm_inv_std_reference)


# rms_norm --------------------------------------------------------------------------------------


def deduce_rms_norm(args, attrs) -> TensorStructInfo:
    if len(args) != 2:
        raise DeductionError(f"rms_norm: takes 2 arguments (x, scale), got {len(args)}")
    return _deduce_scaled_norm("rms_norm", args, attrs)


def _rms_inv_std(context, data, axes: list[int], epsilon: float, dtype: str):
    """The program for ``1 / sqrt(mean(x^2) + epsilon)`` over ``axes`` (kept as 1)."""
    shape = tensor_shape(data)
    kept = tuple(IntImm(1) if d in axes else dim for d, dim in enumerate(shape))
    reduce_vars = {d: SizeVar(f"r{d}_") for d in axes}

    def body(out, buffers):
        index = tuple(reduce_vars.get(d, out[d]) for d in range(len(shape)))
        value = Load(buffers[0], index)
        total = value * value
        for d in reversed(axes):
            total = Reduce(ReduceCombiner.SUM, reduce_vars[d], shape[d], total)
        return _inv_sqrt(total / _count(shape, axes, dtype), epsilon)

    program = make_program("rms_norm_inv_std", [data], kept, dtype, body)
    return context.emit(context.call_tir(program, (data,)), "rms_norm_inv_std")


def legalize_rms_norm(context, call: Call):
    info = call.struct_info
    data, scale = call.args
    axes = _layer_axes("rms_norm", call.attrs, info.ndim)
    inv_std = _rms_inv_std(context, data, axes, float(call.attrs.get("epsilon", 1e-5)), info.dtype)

    def body(out, buffers):
        source, deviation, gamma = buffers
        kept = tuple(IntImm(0) if d in axes else out[d] for d in range(len(out)))
        return Load(source, out) * Load(deviation, kept) * Load(gamma, broadcast_indices(gamma.shape, out))

    args = (data, inv_std, scale)
    return context.call_tir(make_program("rms_norm", args, info.shape, info.dtype, body), args)


def legalize_rms_norm_inv_std(context, call: Call):
    data = call.args[0]
    axes = _layer_axes("rms_norm_inv_std", call.attrs, len(tensor_shape(data)))
    return _rms_inv_std(context, data, axes, float(call.attrs.get("epsilon", 1e-5)), call.struct_info.dtype)


def _rms_statistics(x: np.ndarray, attrs, op: str):
    axes = tuple(_layer_axes(op, attrs, x.ndim))
    computed = _compute(x)
    mean_square = (computed * computed).mean(axis=axes, keepdims=True)
    return computed, 1.0 / np.sqrt(mean_square + float(attrs.get("epsilon", 1e-5)))


def rms_norm_reference(arrays, attrs):
    computed, inv_std = _rms_statistics(arrays[0], attrs, "rms_norm")
    return (computed * inv_std * _compute(arrays[1])).astype(arrays[0].dtype)


def rms_norm_inv_std_reference(arrays, attrs):
    return _rms_statistics(arrays[0], attrs, "rms_norm_inv_std")[1].astype(arrays[0].dtype)


register_op("rms_norm", deduce=deduce_rms_norm, legalize=needs_known_shapes(legalize_rms_norm),
            reference=rms_norm_reference)
register_op("rms_norm_inv_std", deduce=_deduce_inv_std("rms_norm_inv_std"),
            legalize=needs_known_shapes(legalize_rms_norm_inv_std), reference=rms_norm_inv_std_reference)


# group_norm ------------------------------------------------------------------------------------


def _per_channel(op: str, infos, channels, names) -> None:
    for info, name in zip(infos, names):
        if info.shape is None:
            continue
        if len(info.shape) != 1 or not prove_equal(info.shape[0], channels):
            raise DeductionError(f"{op}: {name} must be [{format_expr(channels)}] (one per channel), got {info}")


def _channels_input(op: str, data: TensorStructInfo) -> None:
    require_float(op, data)
    if data.ndim != -1 and data.ndim < 2:
        raise DeductionError(f"{op}: needs an input [N, C, ...], got {data}")


def deduce_group_norm(args, attrs) -> TensorStructInfo:
    if len(args) != 3:
        raise DeductionError(f"group_norm: takes 3 arguments (x, scale, bias), got {len(args)}")
    infos = [require_tensor(arg, "group_norm", i) for i, arg in enumerate(args)]
    same_dtype("group_norm", infos)
    data = infos[0]
    _channels_input("group_norm", data)
    groups = int(attrs["num_groups"])
    if groups == 0 or groups < -1:
        raise DeductionError(f"group_norm: num_groups must be >= 1 (or -1: one per channel), got {groups}")
    if data.shape is None:
        return data
    channels = data.shape[1]
    if groups != -1 and not prove_equal(simplify(channels // groups) * groups, channels):
        raise DeductionError(f"group_norm: {format_expr(channels)} channels are not provably divisible into {groups} groups")
    _per_channel("group_norm", infos[1:], channels, ("scale", "bias"))
    return data


def legalize_group_norm(context, call: Call):
    info = call.struct_info
    data, scale, bias = call.args
    shape = info.shape
    dtype = info.dtype
    epsilon = float(call.attrs.get("epsilon", 1e-5))
    groups_attr = int(call.attrs["num_groups"])
    channels = shape[1]
    groups = channels if groups_attr == -1 else IntImm(groups_attr)
    per_group = IntImm(1) if groups_attr == -1 else simplify(channels // groups_attr)
    spatial = list(range(2, len(shape)))
    stats_shape = (shape[0], groups)
    count = Cast("float32", IndexValue(product([per_group, *(shape[d] for d in spatial)])))
    channel_var = SizeVar("rc_")
    spatial_vars = [SizeVar(f"r{d}_") for d in spatial]

    def over(n, g, body_of):
        channel = simplify(g * per_group + channel_var)
        body = body_of((n, channel, *spatial_vars))
        for var, d in reversed(list(zip(spatial_vars, spatial))):
            body = Reduce(ReduceCombiner.SUM, var, shape[d], body)
        return Reduce(ReduceCombiner.SUM, channel_var, per_group, body)

    mean_program = make_program(
        "group_norm_mean", [data], stats_shape, dtype,
        lambda out, buffers: over(out[0], out[1], lambda i: Load(buffers[0], i)) / count,
    )
    mean = context.emit(context.call_tir(mean_program, (data,)), "group_norm_mean")

    def inv_std_body(out, buffers):
        source, average = buffers

        def square(index):
            centered = Load(source, index) - Load(average, (out[0], out[1]))
            return centered * centered

        return _inv_sqrt(over(out[0], out[1], square) / count, epsilon)

    inv_std_program = make_program("group_norm_inv_std", [data, mean], stats_shape, dtype, inv_std_body)
    inv_std = context.emit(context.call_tir(inv_std_program, (data, mean)), "group_norm_inv_std")

    def body(out, buffers):
        source, average, deviation, gamma, beta = buffers
        group = simplify(out[1] // per_group)
        value = (Load(source, out) - Load(average, (out[0], group))) * Load(deviation, (out[0], group))
        return value * Load(gamma, (out[1],)) + Load(beta, (out[1],))

    args = (data, mean, inv_std, scale, bias)
    program = make_program("group_norm", args, shape, dtype, body)
    return context.call_tir(program, args)


def group_norm_reference(arrays, attrs):
    x, scale, bias = arrays
    n, channels = x.shape[:2]
    groups = int(attrs["num_groups"])
    groups = channels if groups == -1 else groups
    grouped = _compute(x).reshape((n, groups, -1))
    mean = grouped.mean(axis=-1, keepdims=True)
    variance = ((grouped - mean) ** 2).mean(axis=-1, keepdims=True)
    normalized = ((grouped - mean) / np.sqrt(variance + float(attrs.get("epsilon", 1e-5)))).reshape(x.shape)
    affine = (1, channels) + (1,) * (x.ndim - 2)
    return (normalized * _compute(scale).reshape(affine) + _compute(bias).reshape(affine)).astype(x.dtype)


register_op("group_norm", deduce=deduce_group_norm, legalize=needs_known_shapes(legalize_group_norm),
            reference=group_norm_reference)


# batch_norm ------------------------------------------------------------------------------------


def deduce_batch_norm(args, attrs) -> TensorStructInfo:
    if len(args) != 5:
        raise DeductionError(f"batch_norm: takes 5 arguments (x, scale, bias, mean, var), got {len(args)}")
    infos = [require_tensor(arg, "batch_norm", i) for i, arg in enumerate(args)]
    same_dtype("batch_norm", infos)
    data = infos[0]
    _channels_input("batch_norm", data)
    if data.shape is not None:
        _per_channel("batch_norm", infos[1:], data.shape[1], ("scale", "bias", "mean", "var"))
    return data


def legalize_batch_norm(context, call: Call):
    info = call.struct_info
    epsilon = float(call.attrs.get("epsilon", 1e-5))

    def body(out, buffers):
        source, scale, bias, mean, var = buffers
        channel = (out[1],)
        centered = Load(source, out) - Load(mean, channel)
        value = centered * _inv_sqrt(Load(var, channel), epsilon)
        return value * Load(scale, channel) + Load(bias, channel)

    program = make_program("batch_norm", call.args, info.shape, info.dtype, body)
    return context.call_tir(program, call.args)


def batch_norm_reference(arrays, attrs):
    x, scale, bias, mean, var = arrays
    affine = (1, -1) + (1,) * (x.ndim - 2)
    epsilon = float(attrs.get("epsilon", 1e-5))
    factor = _compute(scale).reshape(affine) / np.sqrt(_compute(var).reshape(affine) + epsilon)
    return ((_compute(x) - _compute(mean).reshape(affine)) * factor + _compute(bias).reshape(affine)).astype(x.dtype)


register_op("batch_norm", deduce=deduce_batch_norm, legalize=needs_known_shapes(legalize_batch_norm),
            reference=batch_norm_reference)


# lp_norm ---------------------------------------------------------------------------------------


def deduce_lp_norm(args, attrs) -> TensorStructInfo:
    if len(args) != 1:
        raise DeductionError(f"lp_norm: takes 1 argument, got {len(args)}")
    data = require_tensor(args[0], "lp_norm", 0)
    require_float("lp_norm", data)
    if int(attrs.get("p", 2)) not in (1, 2):
        raise DeductionError(f"lp_norm: p must be 1 or 2, got {attrs.get('p')}")
    if data.ndim != -1:
        normalize_axis("lp_norm", int(attrs.get("axis", -1)), data.ndim)
    return data


def legalize_lp_norm(context, call: Call):
    info = call.struct_info
    data = call.args[0]
    dtype = info.dtype
    axis = normalize_axis("lp_norm", int(call.attrs.get("axis", -1)), info.ndim)
    p = int(call.attrs.get("p", 2))
    kept = tuple(IntImm(1) if d == axis else dim for d, dim in enumerate(info.shape))
    var = SizeVar("r_")

    def norm_body(out, buffers):
        index = tuple(var if d == axis else out[d] for d in range(len(out)))
        value = Load(buffers[0], index)
        term = maximum(value, -value) if p == 1 else value * value
        total = Reduce(ReduceCombiner.SUM, var, info.shape[axis], term)
        return total if p == 1 else sqrt(total)

    norm_program = make_program("lp_norm_norm", [data], kept, dtype, norm_body)
    norm = context.emit(context.call_tir(norm_program, (data,)), "lp_norm_norm")

    def body(out, buffers):
        source, total = buffers
        denominator = Load(total, tuple(IntImm(0) if d == axis else out[d] for d in range(len(out))))
        zero = FloatImm(0.0, dtype)
        return select(denominator.eq(zero), zero, Load(source, out) / denominator)

    program = make_program("lp_norm", [data, norm], info.shape, dtype, body)
    return context.call_tir(program, (data, norm))


def lp_norm_reference(arrays, attrs):
    x = arrays[0]
    axis = int(attrs.get("axis", -1))
    computed = _compute(x)
    if int(attrs.get("p", 2)) == 1:
        norm = np.abs(computed).sum(axis=axis, keepdims=True)
    else:
        norm = np.sqrt((computed * computed).sum(axis=axis, keepdims=True))
    with np.errstate(invalid="ignore", divide="ignore"):
        result = np.where(norm == 0, 0, computed / norm)
    return result.astype(x.dtype)


register_op("lp_norm", deduce=deduce_lp_norm, legalize=needs_known_shapes(legalize_lp_norm),
            reference=lp_norm_reference)
