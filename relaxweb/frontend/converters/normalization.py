"""ONNX LayerNormalization, RMSNormalization, BatchNormalization, InstanceNormalization,
GroupNormalization and LpNormalization."""

from __future__ import annotations

import numpy as np

from ...ir.expr import Constant, ShapeExpr, tensor_shape
from ...ir.symbolic import IntImm, as_int
from ...ops import call_op
from .registry import NodeConversionError, converter


def _scalar(context, value: float, dtype: str, name: str) -> Constant:
    return context.constant(np.array(value, dtype=dtype).reshape(()), name)


@converter("LayerNormalization")
def convert_layer_norm(context, node, inputs):
    """Y, and the optional Mean and InvStdDev outputs (shaped like X with the normalized
    dims 1)."""
    data, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    attrs = context.attributes(node)
    axis = int(attrs.get("axis", -1))
    epsilon = float(attrs.get("epsilon", 1e-5))
    rank = len(tensor_shape(data))
    if not -rank <= axis < rank:
        raise NodeConversionError(f"LayerNormalization node '{node.name}': axis {axis} is out of range for a {rank}-d input")
    args = (data, scale) if bias is None else (data, scale, bias)
    results = [call_op("layer_norm", *args, axis=axis, epsilon=epsilon)]
    wanted = [index for index, name in enumerate(node.output) if name and index > 0]
    if wanted:
        axes = list(range(axis % rank, rank))
        results.append(call_op("mean", data, axes=axes, keepdims=True))
        if 2 in wanted:
            results.append(call_op("layer_norm_inv_std", data, axis=axis, epsilon=epsilon))
    return results


@converter("BatchNormalization")
def convert_batch_norm(context, node, inputs):
    """Inference: with constant statistics (the usual exported model) folded at import into
    ``x * a + b`` per channel; otherwise the batch_norm op.  ``training_mode=1`` normalizes
    with the batch's statistics and also returns the updated running mean and variance."""
    data, scale, bias, mean, var = inputs[:5]
    attrs = context.attributes(node)
    epsilon = float(attrs.get("epsilon", 1e-5))
    momentum = float(attrs.get("momentum", 0.9))
    if len(tensor_shape(data)) < 2:
        raise NodeConversionError(f"BatchNormalization node '{node.name}': needs an input [N, C, ...], got {data.struct_info}")
    if context.opset < 9 and not attrs.get("spatial", 1):
        raise NodeConversionError(f"BatchNormalization node '{node.name}': spatial=0 is not supported")
    training = bool(attrs.get("training_mode", 0))
    if context.opset < 7 and not attrs.get("is_test", 0):
        training = True
    dtype = data.struct_info.dtype
    if training:
        return _batch_norm_training(context, node, data, scale, bias, mean, var, epsilon, momentum, dtype)
    if all(isinstance(v, Constant) for v in (scale, bias, mean, var)):
        compute = np.float64
        factor = scale.data.astype(compute) / np.sqrt(var.data.astype(compute) + epsilon)
        shift = bias.data.astype(compute) - mean.data.astype(compute) * factor
        shape = tuple(int(v) for v in [factor.shape[0]] + [1] * (len(tensor_shape(data)) - 2))
        label = node.name or node.output[0]
        factor_constant = context.constant(factor.astype(dtype).reshape(shape), f"{label}_scale")
        shift_constant = context.constant(shift.astype(dtype).reshape(shape), f"{label}_shift")
        scaled = context.builder.emit(call_op("multiply", data, factor_constant), "batch_norm_scaled")
        return call_op("add", scaled, shift_constant)
    return call_op("batch_norm", data, scale, bias, mean, var, epsilon=epsilon)


def _batch_norm_training(context, node, data, scale, bias, mean, var, epsilon, momentum, dtype):
    rank = len(tensor_shape(data))
    axes = [0] + list(range(2, rank))
    channels = tensor_shape(data)[1]
    emit = context.builder.emit
    batch_mean = emit(call_op("mean", data, axes=axes, keepdims=True), "batch_mean")
    centered = emit(call_op("subtract", data, batch_mean), "batch_centered")
    squared = emit(call_op("multiply", centered, centered), "batch_squared")
    batch_var = emit(call_op("mean", squared, axes=axes, keepdims=False), "batch_var")
    flat_mean = emit(call_op("reshape", batch_mean, ShapeExpr((channels,))), "batch_mean_flat")
    results = [call_op("batch_norm", data, scale, bias, flat_mean, batch_var, epsilon=epsilon)]
    keep = _scalar(context, momentum, dtype, f"{node.name or node.output[0]}_momentum")
    take = _scalar(context, 1.0 - momentum, dtype, f"{node.name or node.output[0]}_one_minus_momentum")
    for running, batch in ((mean, flat_mean), (var, batch_var)):
        kept = emit(call_op("multiply", running, keep), "running_kept")
        taken = emit(call_op("multiply", batch, take), "running_taken")
        results.append(call_op("add", kept, taken))
    return results


@converter("InstanceNormalization")
def convert_instance_norm(context, node, inputs):
    data, scale, bias = inputs[:3]
    attrs = context.attributes(node)
    if len(tensor_shape(data)) < 2:
        raise NodeConversionError(f"InstanceNormalization node '{node.name}': needs an input [N, C, ...]")
    return call_op("group_norm", data, scale, bias, num_groups=-1, epsilon=float(attrs.get("epsilon", 1e-5)))


@converter("GroupNormalization")
def convert_group_norm(context, node, inputs):
    """Opset 21 takes one scale and bias per channel; opset 18 one per group, repeated here
    over the group's channels."""
    data, scale, bias = inputs[:3]
    attrs = context.attributes(node)
    groups = int(attrs["num_groups"])
    shape = tensor_shape(data)
    if len(shape) < 2:
        raise NodeConversionError(f"GroupNormalization node '{node.name}': needs an input [N, C, ...]")
    channels = as_int(shape[1])
    if context.opset < 21 and channels != groups:
        if channels is None:
            raise NodeConversionError(
                f"GroupNormalization node '{node.name}': per-group scale and bias (opset < 21) need a constant channel count"
            )
        scale, bias = (_repeat_per_channel(context, node, v, channels // groups) for v in (scale, bias))
    return call_op("group_norm", data, scale, bias, num_groups=groups, epsilon=float(attrs.get("epsilon", 1e-5)))


def _repeat_per_channel(context, node, value, repeats: int):
    if isinstance(value, Constant):
        return context.constant(np.repeat(value.data, repeats), f"{value.name}_per_channel")
    groups = tensor_shape(value)[0]
    column = context.builder.emit(call_op("reshape", value, ShapeExpr((groups, IntImm(1)))), "group_column")
    ones = context.constant(np.ones((1, repeats), dtype=value.struct_info.dtype), f"{node.name or node.output[0]}_ones")
    spread = context.builder.emit(call_op("multiply", column, ones), "group_spread")
    return context.builder.emit(call_op("reshape", spread, ShapeExpr((groups * repeats,))), "per_channel")


@converter("LpNormalization")
def convert_lp_norm(context, node, inputs):
    attrs = context.attributes(node)
    p = int(attrs.get("p", 2))
    if p not in (1, 2):
        raise NodeConversionError(f"LpNormalization node '{node.name}': p must be 1 or 2, got {p}")
    return call_op("lp_norm", inputs[0], axis=int(attrs.get("axis", -1)), p=p)


@converter("RMSNormalization")
def convert_rms_norm(context, node, inputs):
    """Opset 23: ``X / sqrt(mean(X^2 over the dims from axis on) + epsilon) * scale``;
    ``stash_type`` picks the statistics' precision, always float32 (float64 for float64) here."""
    attrs = context.attributes(node)
    return call_op("rms_norm", inputs[0], inputs[1], axis=int(attrs.get("axis", -1)), epsilon=float(attrs.get("epsilon", 1e-5)))
