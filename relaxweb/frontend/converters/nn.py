"""ONNX Softmax, LogSoftmax, Hardmax (both their pre-13 'flatten from axis' form and the
per-axis form), Dropout (inference), DepthToSpace and SpaceToDepth."""

from __future__ import annotations

import numpy as np

from ...ir.expr import Call, Constant, ShapeExpr, tensor_shape
from ...ir.symbolic import IntImm, format_expr, prove_equal, simplify
from ...ops import call_op
from .registry import NodeConversionError, converter
from .shape_values import materialize

NORMALIZERS = {"Softmax": "softmax", "LogSoftmax": "log_softmax", "Hardmax": "hardmax"}


def text_attr(attrs, name: str, default: str) -> str:
    value = attrs.get(name, default)
    return value.decode() if isinstance(value, bytes) else str(value)


@converter(*NORMALIZERS)
def convert_normalizer(context, node, inputs):
    rank = len(tensor_shape(inputs[0]))
    attrs = context.attributes(node)
    default_axis = -1 if context.opset >= 13 else 1
    axis = int(attrs.get("axis", default_axis))
    if not -rank <= axis < max(rank, 1):
        raise NodeConversionError(f"{node.op_type} node '{node.name}': axis {axis} is out of range for a {rank}-d tensor")
    if axis < 0:
        axis += rank
    axes = [axis] if context.opset >= 13 else list(range(axis, rank))
    if not axes:  # a 0-d tensor: one element per group
        axes = []
    return call_op(NORMALIZERS[node.op_type], inputs[0], axes=axes)


# Dropout ---------------------------------------------------------------------------------------


def _constant_scalar(value):
    if value is None:
        return None
    if isinstance(value, Constant):
        return np.asarray(value.data).reshape(-1)[0]
    return "runtime"


@converter("Dropout")
def convert_dropout(context, node, inputs):
    """Inference: the output is the input and the mask (if asked for) is all true.

    Training mode (the ``training_mode`` input true, or ``is_test=0`` before opset 7) drops
    elements at random: unsupported, unless the ratio is a constant 0.
    """
    attrs = context.attributes(node)
    data = inputs[0]
    training = _constant_scalar(inputs[2] if len(inputs) > 2 else None)
    if context.opset < 7 and not attrs.get("is_test", 0):
        training = True
    ratio = _constant_scalar(inputs[1] if len(inputs) > 1 else None)
    if ratio is None:
        ratio = attrs.get("ratio", 0.5)
    if training is not None and not (isinstance(training, (np.generic, bool, int)) and not bool(training)):
        if not (isinstance(ratio, (np.generic, float, int)) and float(ratio) == 0.0):
            how = "given at run time" if training == "runtime" else "true"
            raise NodeConversionError(
                f"Dropout node '{node.name}': training mode ({how}) drops elements at random; only inference "
                "(training_mode absent or a constant false, or a constant ratio of 0) is supported"
            )
    results = [call_op("identity", data)]
    if len(node.output) > 1 and node.output[1]:
        results.append(call_op("dropout_mask", data))
    return results


# DepthToSpace / SpaceToDepth -------------------------------------------------------------------


def _block_split(node, channels, block: int):
    channels_out = simplify(channels // (block * block))
    if not prove_equal(channels_out * block * block, channels):
        raise NodeConversionError(
            f"{node.op_type} node '{node.name}': {format_expr(channels)} channels are not provably a multiple of "
            f"blocksize^2 = {block * block}"
        )
    return channels_out


@converter("DepthToSpace")
def convert_depth_to_space(context, node, inputs):
    """[N, C, H, W] -> [N, C/b², H*b, W*b] as reshape, transpose, reshape (DCR or CRD order)."""
    data = inputs[0]
    attrs = context.attributes(node)
    block = int(attrs["blocksize"])
    mode = text_attr(attrs, "mode", "DCR")
    shape = tensor_shape(data)
    if len(shape) != 4:
        raise NodeConversionError(f"DepthToSpace node '{node.name}': needs a 4-d input, got {data.struct_info}")
    n, c, h, w = shape
    c_out = _block_split(node, c, block)
    if mode == "DCR":
        split = (n, IntImm(block), IntImm(block), c_out, h, w)
        permutation = [0, 3, 4, 1, 5, 2]
    elif mode == "CRD":
        split = (n, c_out, IntImm(block), IntImm(block), h, w)
        permutation = [0, 1, 4, 2, 5, 3]
    else:
        raise NodeConversionError(f"DepthToSpace node '{node.name}': unknown mode {mode!r}")
    reshaped = context.builder.emit(call_op("reshape", data, ShapeExpr(split)), "depth_to_space_split")
    moved = context.builder.emit(call_op("transpose", reshaped, axes=permutation), "depth_to_space_move")
    return call_op("reshape", moved, ShapeExpr((n, c_out, simplify(h * block), simplify(w * block))))


@converter("SpaceToDepth")
def convert_space_to_depth(context, node, inputs):
    """[N, C, H, W] -> [N, C*b², H/b, W/b] (H and W must be provably multiples of b), in
    DCR (the default) or CRD order."""
    data = inputs[0]
    attrs = context.attributes(node)
    block = int(attrs["blocksize"])
    shape = tensor_shape(data)
    if len(shape) != 4:
        raise NodeConversionError(f"SpaceToDepth node '{node.name}': needs a 4-d input, got {data.struct_info}")
    n, c, h, w = shape
    parts = []
    for name, dim in (("height", h), ("width", w)):
        part = simplify(dim // block)
        if not prove_equal(part * block, dim):
            raise NodeConversionError(
                f"SpaceToDepth node '{node.name}': the {name} {format_expr(dim)} is not provably a multiple of "
                f"blocksize {block}"
            )
        parts.append(part)
    mode = text_attr(attrs, "mode", "DCR")
    permutations = {"DCR": [0, 3, 5, 1, 2, 4], "CRD": [0, 1, 3, 5, 2, 4]}
    if mode not in permutations:
        raise NodeConversionError(f"SpaceToDepth node '{node.name}': unknown mode {mode!r}")
    split = (n, c, parts[0], IntImm(block), parts[1], IntImm(block))
    reshaped = context.builder.emit(call_op("reshape", data, ShapeExpr(split)), "space_to_depth_split")
    moved = context.builder.emit(call_op("transpose", reshaped, axes=permutations[mode]), "space_to_depth_move")
    return call_op("reshape", moved, ShapeExpr((n, simplify(c * block * block), parts[0], parts[1])))


# Resize / Upsample -----------------------------------------------------------------------------


def _optional_input(inputs, index):
    """An optional input: None when absent or an empty constant (ONNX's "not given")."""
    if index >= len(inputs) or inputs[index] is None:
        return None
    value = inputs[index]
    if isinstance(value, Constant) and value.data.size == 0:
        return None
    return value


def _shape_value(context, value):
    """The shape value (symbolic sizes from shape arithmetic) a sizes input holds: the
    ``ShapeExpr`` itself, or the one a ``shape_to_tensor`` binding made a tensor of."""
    if isinstance(value, ShapeExpr):
        return value
    for binding in reversed(context.builder.bindings):
        if binding.var is value:
            call = binding.value
            if isinstance(call, Call) and call.op == "shape_to_tensor" and isinstance(call.args[0], ShapeExpr):
                return call.args[0]
            return None
    return None


def _expand(values, axes, rank, fill):
    full = list(fill)
    for axis, value in zip(axes, values):
        full[axis] = value
    return full


@converter("Resize", "Upsample")
def convert_resize(context, node, inputs):
    """Scales, sizes and roi that are constants (or sizes from shape arithmetic) make the
    output shape known, symbolically; given at run time, only the rank is known."""
    data = inputs[0]
    attrs = context.attributes(node)
    shape = tensor_shape(data)
    rank = len(shape)
    mode = text_attr(attrs, "mode", "nearest")
    if mode == "bilinear" or mode == "trilinear":  # Upsample-7 spellings
        mode = "linear"
    options = {"mode": mode}
    if node.op_type == "Upsample" or context.opset < 11:
        # Upsample and Resize-10: asymmetric coordinates, nearest takes the floor
        options.update(coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        resize = _resize_by_scales(context, node, attrs, inputs, rank)
    else:
        options.update(
            coordinate_transformation_mode=text_attr(attrs, "coordinate_transformation_mode", "half_pixel"),
            nearest_mode=text_attr(attrs, "nearest_mode", "round_prefer_floor"),
            cubic_coeff_a=float(attrs.get("cubic_coeff_a", -0.75)),
            exclude_outside=bool(attrs.get("exclude_outside", 0)),
            extrapolation_value=float(attrs.get("extrapolation_value", 0.0)),
            antialias=bool(attrs.get("antialias", 0)),
            keep_aspect_ratio_policy=text_attr(attrs, "keep_aspect_ratio_policy", "stretch"),
        )
        resize = _resize_by_inputs(context, node, attrs, inputs, shape, options["coordinate_transformation_mode"])
    axes, roi, scales, inputs_names, extra_args = resize
    return call_op("resize", data, *extra_args, axes=axes, roi=roi, scales=scales, inputs=inputs_names, **options)


def _constant_values(value) -> list[float] | None:
    """The values of a constant input, flattened; None for a value known only at run time."""
    return [float(v) for v in value.data.reshape(-1)] if isinstance(value, Constant) else None


def _resize_by_scales(context, node, attrs, inputs, rank: int):
    """Upsample and Resize-10: the scales of every axis, an attribute (Upsample before
    opset 9) or the second input; no roi.  Returns axes, roi, scales, the names of the run-time
    inputs and those inputs."""
    scales = attrs.get("scales") if node.op_type == "Upsample" and context.opset < 9 else None
    # a compile-time shape value is only ever a tensor here: scales are floats
    scales_input = None if scales is not None else materialize(context, _optional_input(inputs, 1), "resize_input")
    inputs_names, extra_args = [], []
    if scales_input is not None:
        scales = _constant_values(scales_input)
        if scales is None:
            inputs_names, extra_args = ["scales"], [scales_input]
    if scales is None and not inputs_names:
        raise NodeConversionError(f"{node.op_type} node '{node.name}': needs scales")
    return list(range(rank)), None, scales, inputs_names, extra_args


def _resize_by_inputs(context, node, attrs, inputs, shape, coordinate_transformation_mode: str):
    """Resize-11 and later: roi, scales or sizes inputs over ``axes``; constant ones (and sizes
    from shape arithmetic) are attributes, the others run-time inputs.  Returns axes, roi,
    scales, the names of the run-time inputs and those inputs."""
    rank = len(shape)
    axes = [int(a) + rank if int(a) < 0 else int(a) for a in attrs.get("axes", range(rank))]
    roi_input, scales_input, sizes_input = (_optional_input(inputs, i) for i in (1, 2, 3))
    # roi and scales are floats: a compile-time shape value there is only ever a tensor
    roi_input, scales_input = (materialize(context, value, "resize_input") for value in (roi_input, scales_input))
    inputs_names, extra_args = [], []
    roi = scales = None
    if roi_input is not None and coordinate_transformation_mode == "tf_crop_and_resize":
        values = _constant_values(roi_input)
        if values is not None:
            roi = _expand(values[: len(axes)], axes, rank, [0.0] * rank) + _expand(
                values[len(axes):], axes, rank, [1.0] * rank
            )
        else:
            inputs_names.append("roi")
            extra_args.append(roi_input)
    if scales_input is not None and sizes_input is not None:
        raise NodeConversionError(f"Resize node '{node.name}': give scales or sizes, not both")
    if scales_input is not None:
        values = _constant_values(scales_input)
        if values is not None:
            scales = _expand(values, axes, rank, [1.0] * rank)
        else:
            inputs_names.append("scales")
            extra_args.append(scales_input)
    elif sizes_input is not None:
        if isinstance(sizes_input, Constant):
            sizes = [int(v) for v in sizes_input.data.reshape(-1)]
        else:
            known = _shape_value(context, sizes_input)
            sizes = None if known is None else list(known.values)
        if sizes is None:
            inputs_names.append("sizes")
            extra_args.append(sizes_input)
        else:
            if len(sizes) != len(axes):
                raise NodeConversionError(f"Resize node '{node.name}': sizes has {len(sizes)} entries for {len(axes)} axes")
            inputs_names.append("output_shape")
            extra_args.append(ShapeExpr(tuple(_expand(sizes, axes, rank, shape))))
    else:
        raise NodeConversionError(f"Resize node '{node.name}': needs scales or sizes")
    return axes, roi, scales, inputs_names, extra_args
