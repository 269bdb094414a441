"""Image ops: ``resize`` (ONNX Resize, and Upsample through it).

``resize(x, *extra, mode, coordinate_transformation_mode, nearest_mode, cubic_coeff_a,
exclude_outside, extrapolation_value, antialias, keep_aspect_ratio_policy, axes, roi, scales,
inputs)``:

- ``mode``: ``nearest``, ``linear`` (bilinear, trilinear …: one axis at a time) or ``cubic``;
  ``antialias`` widens the linear and cubic filters when downsampling.
- ``scales`` (floats, one per dim of ``x``: the frontend expands ONNX's ``axes`` with 1.0)
  or an output shape (below); ``axes`` lists the resized dims (what
  ``keep_aspect_ratio_policy`` looks at).  ``roi`` (``2 * rank`` floats) is for
  ``tf_crop_and_resize``.
- ``inputs`` names the extra arguments: ``"output_shape"``, a shape value with one
  (symbolic) extent per dim (ONNX ``sizes`` known at compile time, constants or shape
  arithmetic); or ``"roi"``, ``"scales"``, ``"sizes"``: tensors known only at run time (ONNX's
  layout, one entry per axis of ``axes``), which leave the result's shape unknown (its rank is
  known).  Run-time ``sizes`` (stretch policy) lower by reading them back; run-time
  ``scales`` do not (the coordinate mapping needs each scale as a compile-time fraction).

Output extents: ``floor(in * scale)`` with ``scale`` taken as the exact fraction it stands for
(``0.6`` is 3/5), so a symbolic ``in`` gives ``in * 3 // 5``; or the output shape as given.

Semantics (the numpy reference) follow ONNX's reference implementation: each output
coordinate is mapped back to the input (the coordinate transformation mode), then the
neighbours are combined with the mode's coefficients, the input edge repeated.

Legalization: ``nearest`` and ``linear`` (no antialias) with every coordinate
transformation mode but ``tf_crop_and_resize``, as one tensor program; the source
coordinate ``x = N / D`` is kept exact in index arithmetic (``N // D`` and the like), the
linear weights are ``(N - D * floor(x)) / D`` in floating point.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np

from ..errors import UnsupportedModelError
from ..ir.expr import Call, ShapeExpr, tensor_shape
from ..ir.op_registry import DeductionError, register_op
from ..ir.struct_info import ShapeStructInfo, TensorStructInfo
from ..ir.symbolic import (
    IntImm, PrimExpr, as_expr, as_int, expr_max, expr_min, prove_equal, simplify,
)
from ..ir.tir import FloatImm, IndexValue, Load, cast
from .common import make_program, needs_known_shapes, require_tensor
from .readback import element, read_back_dims

MODES = ("nearest", "linear", "cubic")
COORDINATE_MODES = (
    "half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
    "tf_half_pixel_for_nn", "tf_crop_and_resize",
)
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def scale_fraction(scale: float) -> Fraction:
    """The fraction a float scale stands for: exact when it is one with a small denominator
    (2.0, 0.5, 1.5), else the simplest fraction that rounds to the same float32 (0.6 -> 3/5)."""
    exact = Fraction(float(scale))
    simple = exact.limit_denominator(1000)
    if simple == exact or np.float32(float(simple)) == np.float32(scale):
        return simple
    return exact


def _check_attrs(attrs) -> None:
    if attrs.get("mode", "nearest") not in MODES:
        raise DeductionError(f"resize: unknown mode {attrs.get('mode')!r} (expected one of {', '.join(MODES)})")
    if attrs.get("coordinate_transformation_mode", "half_pixel") not in COORDINATE_MODES:
        raise DeductionError(f"resize: unknown coordinate_transformation_mode {attrs.get('coordinate_transformation_mode')!r}")
    if attrs.get("nearest_mode", "round_prefer_floor") not in NEAREST_MODES:
        raise DeductionError(f"resize: unknown nearest_mode {attrs.get('nearest_mode')!r}")
    if attrs.get("keep_aspect_ratio_policy", "stretch") not in ("stretch", "not_larger", "not_smaller"):
        raise DeductionError(f"resize: unknown keep_aspect_ratio_policy {attrs.get('keep_aspect_ratio_policy')!r}")


def output_plan(shape, attrs):
    """(scales as Fractions or None per dim, output extents) when statically known, else None.

    ``scales[d]`` is None when the scale of dim ``d`` is ``out / in`` (given by ``sizes``).
    """
    rank = len(shape)
    axes = list(attrs.get("axes") or range(rank))
    if attrs.get("scales") is not None:
        fractions = [scale_fraction(s) for s in attrs["scales"]]
        if len(fractions) != rank:
            raise DeductionError(f"resize: scales has {len(fractions)} entries for a {rank}-d input")
        for d, f in enumerate(fractions):
            if f <= 0:
                raise DeductionError(f"resize: scale {float(f)} of dim {d} must be positive")
        extents = [simplify(as_expr(dim) * f.numerator // f.denominator) for dim, f in zip(shape, fractions)]
        return fractions, extents
    if attrs.get("sizes") is None:
        return None
    sizes = [simplify(as_expr(s)) for s in attrs["sizes"]]
    if len(sizes) != rank:
        raise DeductionError(f"resize: sizes has {len(sizes)} entries for a {rank}-d input")
    policy = attrs.get("keep_aspect_ratio_policy", "stretch")
    if policy == "stretch":
        return [None] * rank, sizes
    constants = [as_int(shape[d]) for d in axes] + [as_int(sizes[d]) for d in axes]
    if any(c is None for c in constants):
        return None  # a policy on symbolic dims: known at run time only
    ratios = [Fraction(int(as_int(sizes[d])), int(as_int(shape[d]))) for d in axes]
    scale = min(ratios) if policy == "not_larger" else max(ratios)
    fractions = [scale if d in axes else Fraction(1) for d in range(rank)]
    extents = [
        IntImm(int(float(scale) * int(as_int(shape[d])) + 0.5)) if d in axes else as_expr(shape[d]) for d in range(rank)
    ]
    return fractions, extents


def _static_attrs(args, attrs):
    """The attributes with ``sizes`` (symbolic) from an ``output_shape`` argument; None when
    the output shape depends on values known only at run time."""
    names = list(attrs.get("inputs") or [])
    if len(args) != 1 + len(names):
        raise DeductionError(f"resize: takes the input and {len(names)} more argument(s) {names}, got {len(args)}")
    values = dict(attrs)
    for name, arg in zip(names, args[1:]):
        if name == "output_shape":
            info = arg.struct_info
            if not isinstance(info, ShapeStructInfo):
                raise DeductionError(f"resize: the output shape must be a shape value, got {info}")
            if info.values is None:
                return None
            values["sizes"], values["scales"] = list(info.values), None
        elif name in ("scales", "sizes"):
            require_tensor(arg, "resize", 1 + names.index(name))
            return None
        elif name == "roi":
            require_tensor(arg, "resize", 1 + names.index(name))
        else:
            raise DeductionError(f"resize: unknown argument kind {name!r}")
    return values


def deduce_resize(args, attrs) -> TensorStructInfo:
    if not args:
        raise DeductionError("resize: needs the input tensor")
    data = require_tensor(args[0], "resize", 0)
    _check_attrs(attrs)
    if attrs.get("mode", "nearest") != "nearest" and not data.dtype.startswith("float"):
        raise DeductionError(f"resize: {attrs.get('mode')} interpolation needs a float tensor, got {data.dtype}")
    static = _static_attrs(args, attrs)
    if static is None or data.shape is None:
        return TensorStructInfo(None, data.dtype, data.ndim)
    if static.get("sizes") is not None and len(static["sizes"]) != data.ndim:
        raise DeductionError(f"resize: the output shape has {len(static['sizes'])} entries for a {data.ndim}-d input")
    plan = output_plan(data.shape, static)
    if plan is None:
        return TensorStructInfo(None, data.dtype, data.ndim)
    return TensorStructInfo(tuple(plan[1]), data.dtype)


# numpy reference (after onnx.reference.ops.op_resize) ------------------------------------------


def _nearest_coefficients(mode: str):
    def coefficients(ratio: float, scale: float) -> np.ndarray:
        if float(ratio).is_integer():
            return np.array([0.0, 1.0])
        if mode == "round_prefer_floor":
            return np.array([ratio <= 0.5, ratio > 0.5], dtype=np.float64)
        if mode == "round_prefer_ceil":
            return np.array([ratio < 0.5, ratio >= 0.5], dtype=np.float64)
        if mode == "floor":
            return np.array([1.0, 0.0])
        return np.array([0.0, 1.0])

    return coefficients


def _linear_coefficients(antialias: bool):
    def coefficients(ratio: float, scale: float) -> np.ndarray:
        if not antialias:
            return np.array([1 - ratio, ratio])
        scale = min(scale, 1.0)
        start = int(np.floor(-1 / scale) + 1)
        footprint = 2 - 2 * start
        args = (np.arange(start, start + footprint) - ratio) * scale
        values = np.clip(1 - np.abs(args), 0, 1)
        return values / values.sum()

    return coefficients


def _cubic_coefficients(a: float, antialias: bool):
    def kernel(x: float) -> float:
        x = abs(x)
        if x <= 1:
            return (a + 2) * x**3 - (a + 3) * x**2 + 1
        if x < 2:
            return a * x**3 - 5 * a * x**2 + 8 * a * x - 4 * a
        return 0.0

    def coefficients(ratio: float, scale: float) -> np.ndarray:
        if not antialias:
            return np.array([kernel(ratio + 1), kernel(ratio), kernel(1 - ratio), kernel(2 - ratio)])
        scale = min(scale, 1.0)
        start = int(np.floor(-2 / scale) + 1)
        values = np.array([kernel(scale * (i - ratio)) for i in range(start, 2 - start)])
        return values / values.sum()

    return coefficients


def _exact_coordinates(mode: str, out_size: int, scale: Fraction, in_size: int) -> list[Fraction]:
    """Input coordinates of the output positions, as exact fractions (every mode but
    tf_crop_and_resize), so ties (x.5 for the rounding modes) are decided exactly."""
    width = scale * in_size  # the output width before rounding down
    half = Fraction(1, 2)
    coordinates = []
    for y in range(out_size):
        if mode == "align_corners":
            x = Fraction(0) if width == 1 else y * Fraction(in_size - 1) / (width - 1)
        elif mode == "asymmetric":
            x = y / scale
        elif mode == "tf_half_pixel_for_nn":
            x = (y + half) / scale
        elif mode == "pytorch_half_pixel":
            x = -half if width == 1 else (y + half) / scale - half
        elif mode == "half_pixel":
            x = (y + half) / scale - half
        else:  # half_pixel_symmetric
            x = Fraction(in_size, 2) * (1 - out_size / width) + (y + half) / scale - half
        coordinates.append(x)
    return coordinates


def _source_coordinates(mode, y, scale, in_size, out_size, roi):
    """Input coordinates of output positions ``y`` (and which lie outside, for crop and resize)."""
    out_float = scale * in_size
    outside = None
    if mode == "align_corners":
        x = np.zeros(out_size) if out_float == 1 else y * (in_size - 1) / (out_float - 1)
    elif mode == "asymmetric":
        x = y / scale
    elif mode == "tf_half_pixel_for_nn":
        x = (y + 0.5) / scale
    elif mode == "tf_crop_and_resize":
        start, end = roi
        if out_float == 1:
            x = np.full(out_size, (end - start) * (in_size - 1) / 2)
        else:
            x = y * (end - start) * (in_size - 1) / (out_float - 1)
        x = x + start * (in_size - 1)
        outside = (x < 0) | (x > in_size - 1)
    elif mode == "pytorch_half_pixel":
        x = np.full(out_size, -0.5) if out_float == 1 else (y + 0.5) / scale - 0.5
    elif mode == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    else:  # half_pixel_symmetric
        offset = in_size / 2 * (1 - out_size / out_float)
        x = offset + (y + 0.5) / scale - 0.5
    return x, outside


def _resize_axis(data, axis, scale: Fraction, out_size, coefficients, attrs, roi):
    in_size = data.shape[axis]
    if out_size == 0:
        shape = list(data.shape)
        shape[axis] = 0
        return np.empty(shape, dtype=data.dtype)
    mode = attrs.get("coordinate_transformation_mode", "half_pixel")
    outside = None
    if mode == "tf_crop_and_resize":
        y = np.arange(out_size, dtype=np.float64)
        x, outside = _source_coordinates(mode, y, float(scale), in_size, out_size, roi)
        floor = np.floor(x).astype(np.int64)
        fraction = x - floor
    else:
        exact = _exact_coordinates(mode, out_size, scale, in_size)
        floor = np.array([math.floor(x) for x in exact], dtype=np.int64)
        fraction = np.array([float(x - math.floor(x)) for x in exact])
    ratios = np.where(fraction == 0, 1.0, fraction)
    weights = np.stack([np.asarray(coefficients(float(r), float(scale)), dtype=np.float64) for r in ratios])
    taps = weights.shape[1]
    pad = int(np.ceil(taps / 2))
    base = floor + pad
    if taps % 2 == 0:
        offset = np.where(fraction == 0, -(taps // 2), -(taps // 2) + 1)
    else:
        offset = np.where(fraction <= 0.5, -((taps - 1) // 2), -((taps - 1) // 2) + 1)
    neighbours = (base + offset)[:, None] + np.arange(taps)[None, :] - pad
    if attrs.get("exclude_outside", False):
        weights = np.where((neighbours < 0) | (neighbours >= in_size), 0.0, weights)
        total = weights.sum(axis=-1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    gathered = np.take(data, np.clip(neighbours, 0, in_size - 1), axis=axis)
    shape = (1,) * axis + weights.shape + (1,) * (data.ndim - axis - 1)
    result = (gathered * weights.reshape(shape)).sum(axis=axis + 1)
    if outside is not None and outside.any():
        mask = outside.reshape((1,) * axis + (out_size,) + (1,) * (data.ndim - axis - 1))
        result = np.where(mask, float(attrs.get("extrapolation_value", 0.0)), result)
    return result


def _runtime_attrs(arrays, attrs, shape):
    """The attributes with the runtime tensors' values filled in (and ``sizes`` as ints)."""
    values = dict(attrs)
    rank = len(shape)
    axes = list(attrs.get("axes") or range(rank))
    for name, array in zip(attrs.get("inputs") or [], arrays[1:]):
        array = np.asarray(array).reshape(-1)
        if name == "output_shape":
            values["sizes"], values["scales"] = [int(v) for v in array], None
            continue
        if array.size == 0:
            continue
        if name == "scales":
            full = [1.0] * rank
            for a, v in zip(axes, array):
                full[a] = float(v)
            values["scales"], values["sizes"] = full, None
        elif name == "sizes":
            full = list(shape)
            for a, v in zip(axes, array):
                full[a] = int(v)
            values["sizes"], values["scales"] = full, None
        else:
            full = [0.0] * rank + [1.0] * rank
            for i, a in enumerate(axes):
                full[a], full[rank + a] = float(array[i]), float(array[len(axes) + i])
            values["roi"] = full
    return values


def resize_reference(arrays, attrs):
    x = arrays[0]
    attrs = _runtime_attrs(arrays, attrs, x.shape)
    rank = x.ndim
    axes = list(attrs.get("axes") or range(rank))
    plan = output_plan(x.shape, attrs)
    if plan is None:
        raise ValueError("resize: neither scales nor sizes is given")
    fractions, extents = plan
    outs = [int(as_int(e)) for e in extents]
    # exact fractions (as the legalization computes coordinates, and like onnxruntime's float32
    # arithmetic where ONNX's reference, in float64 with the float32 scale, lands just off a tie)
    scales = [f if f is not None else Fraction(outs[d], x.shape[d]) for d, f in enumerate(fractions)]
    mode = attrs.get("mode", "nearest")
    if mode == "nearest":
        coefficients = _nearest_coefficients(attrs.get("nearest_mode", "round_prefer_floor"))
    elif mode == "linear":
        coefficients = _linear_coefficients(bool(attrs.get("antialias", False)))
    else:
        coefficients = _cubic_coefficients(float(attrs.get("cubic_coeff_a", -0.75)), bool(attrs.get("antialias", False)))
    roi = attrs.get("roi")
    result = x.astype(np.float64)
    for axis in axes:
        axis_roi = None if roi is None else (float(roi[axis]), float(roi[axis + rank]))
        identity = scales[axis] == 1 and outs[axis] == result.shape[axis] and (
            axis_roi is None or (math.isclose(axis_roi[0], 0.0) and math.isclose(axis_roi[1], 1.0))
        )
        if identity:
            continue
        result = _resize_axis(result, axis, scales[axis], outs[axis], coefficients, attrs, axis_roi)
    if np.issubdtype(x.dtype, np.integer):
        info = np.iinfo(x.dtype)
        result = np.clip(np.rint(result), info.min, info.max)
    return np.ascontiguousarray(result.astype(x.dtype))


# legalization ----------------------------------------------------------------------------------


def _source_fraction(mode: str, y: PrimExpr, in_size: PrimExpr, out_size: PrimExpr, scale: Fraction | None):
    """The source coordinate ``N / D`` of output index ``y`` (``D > 0``), and a factor (0 or
    1, or None) by which the resulting index and weight are multiplied.

    As ONNX, the "output width" in align_corners and pytorch_half_pixel is ``in * scale``
    (not rounded down) when a scale is given.
    """
    if scale is not None:
        p, q = scale.numerator, scale.denominator  # x * p / q is the output coordinate
        width_numerator, width_denominator = simplify(in_size * p), q  # in * scale = p * in / q
    else:
        p, q = out_size, in_size
        width_numerator, width_denominator = simplify(as_expr(out_size)), 1
    # the output width minus one, times width_denominator (0 when the width is 1)
    width_less_one = simplify(width_numerator - width_denominator)
    if mode == "asymmetric":
        return y * q, as_expr(p), None
    if mode == "tf_half_pixel_for_nn":
        return (2 * y + 1) * q, 2 * as_expr(p), None
    if mode in ("half_pixel", "pytorch_half_pixel"):
        factor = None
        if mode == "pytorch_half_pixel":  # x = -0.5 where the width is 1: reads index 0, like x = 0
            constant = as_int(width_less_one)
            if constant is not None and constant <= 0:
                return IntImm(0), IntImm(1), None
            if constant is None:
                factor = simplify(expr_min(expr_max(width_less_one, 0), 1))
        return (2 * y + 1) * q - p, 2 * as_expr(p), factor
    if mode == "half_pixel_symmetric":
        if scale is None:
            return (2 * y + 1) * q - p, 2 * as_expr(p), None
        return in_size * p - out_size * q + (2 * y + 1) * q - p, 2 * as_expr(p), None
    if mode == "align_corners":
        constant = as_int(width_less_one)
        if constant is not None and constant <= 0:
            return IntImm(0), IntImm(1), None
        denominator = width_less_one if constant is not None else expr_max(width_less_one, 1)
        return y * expr_max(in_size - 1, 0) * width_denominator, denominator, None
    raise UnsupportedModelError(f"resize: no GPU lowering for coordinate_transformation_mode={mode}")


def ceil_divide(numerator: PrimExpr, denominator: PrimExpr) -> PrimExpr:
    """``ceil(numerator / denominator)`` for a positive denominator (index ``//`` floors)."""
    return simplify((numerator + denominator - 1) // denominator)


def _clamp(index: PrimExpr, size: PrimExpr) -> PrimExpr:
    return simplify(expr_max(expr_min(index, size - 1), 0))


def legalize_resize(context, call: Call):
    attrs = call.attrs
    info = call.struct_info
    mode = attrs.get("mode", "nearest")
    coordinate_mode = attrs.get("coordinate_transformation_mode", "half_pixel")
    if mode == "cubic" or attrs.get("antialias", False) or coordinate_mode == "tf_crop_and_resize":
        what = "cubic" if mode == "cubic" else ("antialias" if attrs.get("antialias", False) else coordinate_mode)
        raise UnsupportedModelError(f"resize: no GPU lowering for {what} yet (nearest and linear resizes lower)")
    attrs = _static_attrs(call.args, attrs)
    if attrs is None:
        raise UnsupportedModelError("resize: scales or sizes known only at run time cannot be lowered")
    data = call.args[0]
    shape = tensor_shape(data)
    fractions, extents = output_plan(shape, attrs)
    nearest_mode = attrs.get("nearest_mode", "round_prefer_floor")
    # asymmetric coordinates rounded down never leave the input: an output index y is below the
    # output extent, floor(in * p / q) with a scale p / q (or `out` with sizes, the scale out /
    # in), so y * q / p < in and its floor is at most in - 1; the clamp would cost each element of
    # a nearest upsample (YOLO's) two calls of min and max on the CPU
    clamped = not (mode == "nearest" and nearest_mode == "floor" and coordinate_mode == "asymmetric")
    # dims resized by 1 to the same extent are copied (as the reference skips them)
    resized = [
        d for d in range(len(shape))
        if not (prove_equal(extents[d], shape[d]) and (fractions[d] is None or fractions[d] == 1))
    ]

    def body(axes, buffers):
        (source,) = buffers
        per_axis = {}
        for d in resized:
            numerator, denominator, factor = _source_fraction(coordinate_mode, axes[d], shape[d], extents[d], fractions[d])
            numerator, denominator = simplify(numerator), simplify(denominator)
            if mode == "nearest":
                if nearest_mode == "floor":
                    index = simplify(numerator // denominator)
                elif nearest_mode == "ceil":
                    index = ceil_divide(numerator, denominator)
                elif nearest_mode == "round_prefer_floor":  # ceil(x - 1/2)
                    index = ceil_divide(2 * numerator - denominator, 2 * denominator)
                else:  # round_prefer_ceil: floor(x + 1/2)
                    index = simplify((2 * numerator + denominator) // (2 * denominator))
                if factor is not None:
                    index = index * factor
                per_axis[d] = [(_clamp(index, shape[d]) if clamped else index, None)]
            else:
                low = simplify(numerator // denominator)
                weight = (cast("float32", IndexValue(simplify(numerator % denominator)))
                          / cast("float32", IndexValue(denominator)))
                if factor is not None:
                    low = simplify(low * factor)
                    weight = weight * cast("float32", IndexValue(factor))
                per_axis[d] = [
                    (_clamp(low, shape[d]), FloatImm(1.0, info.dtype) - weight),
                    (_clamp(low + 1, shape[d]), weight),
                ]
        total = None
        choices = [per_axis[d] for d in resized]
        for picks in itertools.product(*choices):
            index = list(axes)
            term_weight = None
            for d, (position, weight) in zip(resized, picks):
                index[d] = position
                if weight is not None:
                    term_weight = weight if term_weight is None else term_weight * weight
            term = Load(source, tuple(index))
            if term_weight is not None:
                term = term_weight * term
            total = term if total is None else total + term
        return total

    program = make_program("resize", [data], info.shape, info.dtype, body)
    return context.call_tir(program, (data,))


def legalize_resize_run_time_sizes(context, call: Call):
    """``sizes`` given as a run-time tensor (``stretch`` policy): the sizes are read back
    (``relaxweb/ops/readback.py``: a fresh size variable per resized axis), then the
    resize lowers as with a symbolic output shape.  Run-time ``scales`` have no lowering: the
    coordinate mapping keeps each scale as an exact compile-time fraction."""
    attrs = call.attrs
    data = call.args[0]
    if data.struct_info.shape is None:
        raise UnsupportedModelError("resize: the input's shape must be known (a match_cast names its dims)")
    shape = tensor_shape(data)
    rank = len(shape)
    axes = [a + rank if a < 0 else a for a in (attrs.get("axes") or range(rank))]
    sizes = None
    for name, arg in zip(attrs.get("inputs") or [], call.args[1:]):
        info = arg.struct_info
        if not isinstance(info, TensorStructInfo):
            continue
        length = as_int(info.shape[0]) if info.shape is not None and len(info.shape) == 1 else None
        if length == 0:  # an empty operand stands for none
            continue
        if name == "scales":
            raise UnsupportedModelError("resize: scales known only at run time cannot be lowered (sizes can)")
        if name == "sizes":
            if length != len(axes):
                raise UnsupportedModelError(f"resize: the sizes need a 1-D tensor of {len(axes)} entries")
            sizes = arg
    if sizes is None:
        raise UnsupportedModelError("resize: scales or sizes known only at run time cannot be lowered")
    if attrs.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise UnsupportedModelError("resize: run-time sizes lower only with the stretch policy")
    read = read_back_dims(context, (sizes,), [lambda buffers, j=j: element(buffers[0], j) for j in range(len(axes))],
                          "resize")
    dims = [read[axes.index(d)] if d in axes else shape[d] for d in range(rank)]
    static = {key: value for key, value in attrs.items() if key not in ("axes", "scales", "sizes", "roi")}
    static["inputs"] = ["output_shape"]
    target = ShapeExpr(tuple(dims))
    lowered = Call("resize", (data, target), static, TensorStructInfo(tuple(dims), call.struct_info.dtype))
    return legalize_resize(context, lowered)


def _legalize_resize_any(context, call: Call):
    names = call.attrs.get("inputs") or []
    if any(name in ("scales", "sizes") for name in names):
        return legalize_resize_run_time_sizes(context, call)
    return needs_known_shapes(legalize_resize)(context, call)


register_op("resize", deduce=deduce_resize, legalize=_legalize_resize_any, reference=resize_reference, reads_back=True)
