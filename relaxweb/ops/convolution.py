"""Convolutions and pooling over the trailing spatial dims of an ``[N, C, *spatial]`` tensor.

Signatures (args, then attributes; one entry per spatial dim unless said otherwise):

- ``conv(x, w[, b], strides, dilations, padding, auto_pad, groups)``: ``w`` is
  ``[O, C / groups, *kernel]``, ``b`` is ``[O]``; float operands, or int32 ones (ONNX
  ConvInteger: exact int32 sums).  ``padding`` has ``2 * S`` entries (all
  begins, then all ends, as ONNX ``pads``); ``auto_pad`` (``NOTSET``, ``VALID``,
  ``SAME_UPPER``, ``SAME_LOWER``) replaces it by the padding computed from the input's
  (symbolic) spatial dims, see :func:`resolve_padding`.
- ``conv_transpose(x, w[, b], strides, dilations, padding, auto_pad, groups,
  output_padding[, output_shape])``: ``w`` is ``[C, O / groups, *kernel]``; output extent
  ``s*(in-1) + output_padding + d*(k-1) + 1 - pad_begin - pad_end`` (``output_shape`` sets
  the padding that reaches it).
- ``max_pool(x, kernel, strides, dilations, padding, auto_pad, ceil_mode)``,
  ``avg_pool(..., count_include_pad)``, ``lp_pool(..., p)``: windows never include padding
  (``max``), count it or not (``avg``), or add nothing for it (``lp``).  ``ceil_mode``
  rounds the window count up, but the last window must start inside the input or its
  begin padding (as ONNX, PyTorch).  ``max_pool_indices(x, ..., storage_order)`` is ONNX
  MaxPool's ``Indices`` output (int64 flat positions; legalized as the maxima, the first
  kernel position holding each, and its flat input position).

Deduction: the spatial extents are ``(in + pad_begin + pad_end - dilation*(k-1) - 1) //
stride + 1`` (``ceil`` with ``ceil_mode``), with symbolic ``in`` (and symbolic padding for
``SAME_*``); channel counts must be provably consistent with ``groups``.

Legalization: one tensor program each, a reduction over (input channels of the group ×)
kernel positions (a max pool's large window in two: along its last dim, then the others);
input positions ``o*stride - pad_begin + k*dilation`` outside the input read nothing (a
``Select``), checked only where they can fall outside.  Transposed
convolution reduces over the kernel positions whose source ``(o + pad_begin -
k*dilation) / stride`` is a whole, in-range input position; where the kernel is the stride
(no padding, dilation or groups), each input position writes its own tile of the output: a
matmul of the channels into ``[N, O, H, kh, W, kw]``, which is the output read row-major.
``lp_pool`` sums ``|x|**p`` over the window and takes the ``1/p``-th power: products for an
integer ``p`` up to 8 (``sqrt`` for 2, nothing for 1), WGSL ``pow`` on non-negative values
otherwise (0 stays 0).
"""

from __future__ import annotations

import itertools

import numpy as np

from ..errors import UnsupportedModelError
from ..ir.expr import Call, tensor_shape
from ..ir.op_registry import DeductionError, register_op
from ..ir.struct_info import TensorStructInfo
from ..ir.symbolic import (
    IntImm, PrimExpr, SizeVar, as_expr, as_int, expr_max, expr_min, format_expr, prove_equal, prove_less_equal, simplify,
)
from ..ir.tir import Cast, FloatImm, IndexValue, Load, Reduce, ReduceCombiner, maximum, power, select, sqrt
from .common import make_program, needs_known_shapes, require_float, require_tensor, same_dtype

# The lowest finite float32: what a max pool window holds where it reads no input.
LOWEST_FLOAT32 = float(np.finfo(np.float32).min)


def _spatial_rank(op: str, attrs) -> int:
    rank = len(attrs["strides"])
    for name in ("dilations",):
        if len(attrs[name]) != rank:
            raise DeductionError(f"{op}: {name} has {len(attrs[name])} entries, strides {rank}")
    for name in ("strides", "dilations"):
        for value in attrs[name]:
            if int(value) < 1:
                raise DeductionError(f"{op}: {name} must be >= 1, got {list(attrs[name])}")
    return rank


def resolve_padding(op: str, attrs, sizes, kernel) -> tuple[list[PrimExpr], list[PrimExpr]]:
    """(begins, ends) of the padding for spatial ``sizes`` (symbolic or constant) and
    ``kernel`` extents, from ``auto_pad``:

    - ``NOTSET``: the explicit ``padding`` (all begins, then all ends);
    - ``VALID``: none;
    - ``SAME_UPPER`` / ``SAME_LOWER``: ``ceil(size / stride)`` windows; the padding they
      need, ``max(0, (out - 1)*stride + dilation*(k-1) + 1 - size)``, is split in two with
      the extra element at the end (upper) or the begin (lower).

    ``conv_transpose`` pads to reach ``output_shape`` (``size * stride`` for ``SAME_*``):
    the total ``stride*(size-1) + output_padding + dilation*(k-1) + 1 - output``, split with
    the extra element at the end for ``SAME_UPPER``, at the begin otherwise (ONNX).
    """
    rank = len(attrs["strides"])
    mode = str(attrs.get("auto_pad", "NOTSET"))
    padding = [as_expr(int(p)) for p in attrs.get("padding") or [0] * (2 * rank)]
    if len(padding) != 2 * rank:
        raise DeductionError(f"{op}: padding needs {2 * rank} entries (begins, then ends), got {len(padding)}")
    if mode not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise DeductionError(f"{op}: unknown auto_pad {mode!r}")
    output_shape = attrs.get("output_shape")
    if op == "conv_transpose" and (output_shape or mode.startswith("SAME")):
        begins, ends = [], []
        for i in range(rank):
            stride, dilation = int(attrs["strides"][i]), int(attrs["dilations"][i])
            extra = int(attrs.get("output_padding", [0] * rank)[i])
            target = as_expr(int(output_shape[i])) if output_shape else as_expr(sizes[i]) * stride
            total = simplify(stride * (as_expr(sizes[i]) - 1) + extra + dilation * (as_expr(kernel[i]) - 1) + 1 - target)
            half = simplify(total // 2)
            if mode == "SAME_UPPER":
                begins.append(half)
                ends.append(simplify(total - half))
            else:
                begins.append(simplify(total - half))
                ends.append(half)
        return begins, ends
    if mode == "NOTSET" or op == "conv_transpose":
        return [simplify(p) for p in padding[:rank]], [simplify(p) for p in padding[rank:]]
    if mode == "VALID":
        return [IntImm(0)] * rank, [IntImm(0)] * rank
    begins, ends = [], []
    for i in range(rank):
        stride, dilation = int(attrs["strides"][i]), int(attrs["dilations"][i])
        size = as_expr(sizes[i])
        out = simplify((size + stride - 1) // stride)
        needed = simplify((out - 1) * stride + dilation * (as_expr(kernel[i]) - 1) + 1 - size)
        if not prove_less_equal(0, needed):
            needed = IntImm(0) if prove_less_equal(needed, 0) else simplify(expr_max(needed, 0))
        half = simplify(needed // 2)
        rest = simplify(needed - half)
        begins.append(half if mode == "SAME_UPPER" else rest)
        ends.append(rest if mode == "SAME_UPPER" else half)
    return begins, ends


def _check_extent(op: str, extent: PrimExpr, dim: int, least: int = 0) -> PrimExpr:
    """A constant spatial extent of the result below ``least`` is refused: a window larger
    than the padded input (onnxruntime refuses a conv with no output position, and a pool
    with a negative extent)."""
    extent = simplify(extent)
    value = as_int(extent)
    if value is not None and value < least:
        raise DeductionError(f"{op}: spatial dim {dim} of the result would be {value} (the window is larger than the padded input)")
    return extent


def conv_output_extent(size, kernel, stride, begin, end, dilation) -> PrimExpr:
    """``(size + begin + end - dilation*(kernel-1) - 1) // stride + 1``."""
    return simplify((as_expr(size) + begin + end - dilation * (as_expr(kernel) - 1) - 1) // stride + 1)


def pool_output_extent(size, kernel, stride, begin, end, dilation, ceil_mode: bool) -> PrimExpr:
    span = simplify(as_expr(size) + begin + end - dilation * (kernel - 1) - 1)
    if not ceil_mode:
        return simplify(span // stride + 1)
    ceiled = simplify((span + stride - 1) // stride + 1)
    # the last window must start inside the input or its begin padding
    limit = simplify((as_expr(size) + begin - 1) // stride + 1)
    if prove_less_equal(ceiled, limit):
        return ceiled
    if prove_less_equal(limit, ceiled) and as_int(ceiled) is not None and as_int(limit) is not None:
        return limit
    return simplify(expr_min(ceiled, limit))


def _result_unknown(data: TensorStructInfo, rank: int, dtype: str) -> TensorStructInfo:
    return TensorStructInfo(None, dtype, data.ndim if data.ndim != -1 else rank + 2)


def _check_data(op: str, data: TensorStructInfo, rank: int) -> None:
    if data.ndim != -1 and data.ndim != rank + 2:
        raise DeductionError(f"{op}: needs a {rank + 2}-d input [N, C, {rank} spatial dims], got {data}")


# conv / conv_transpose -------------------------------------------------------------------------


def _deduce_conv(op: str):
    transposed = op == "conv_transpose"

    def deduce(args, attrs) -> TensorStructInfo:
        if len(args) not in (2, 3):
            raise DeductionError(f"{op}: takes 2 or 3 arguments (data, weight, bias), got {len(args)}")
        infos = [require_tensor(arg, op, i) for i, arg in enumerate(args)]
        dtype = same_dtype(op, infos)
        if not (op == "conv" and dtype == "int32"):  # int32: ConvInteger's exact accumulation
            require_float(op, infos[0])
        rank = _spatial_rank(op, attrs)
        data, weight = infos[0], infos[1]
        _check_data(op, data, rank)
        if weight.ndim != -1 and weight.ndim != rank + 2:
            raise DeductionError(f"{op}: the weight needs {rank + 2} dims, got {weight}")
        groups = int(attrs.get("groups", 1))
        if groups < 1:
            raise DeductionError(f"{op}: groups must be >= 1, got {groups}")
        if transposed and len(attrs.get("output_padding", [0] * rank)) != rank:
            raise DeductionError(f"{op}: output_padding needs {rank} entries")
        if data.shape is None or weight.shape is None:
            return _result_unknown(data, rank, dtype)
        channels = data.shape[1]
        if transposed:
            if not prove_equal(weight.shape[0], channels):
                raise DeductionError(
                    f"{op}: the input has {format_expr(channels)} channels, the weight's dim 0 is {format_expr(weight.shape[0])}"
                )
            out_channels = simplify(weight.shape[1] * groups)
            per_group = simplify(channels // groups)
            if not prove_equal(per_group * groups, channels):
                raise DeductionError(f"{op}: {format_expr(channels)} input channels are not provably divisible by groups={groups}")
        else:
            if not prove_equal(weight.shape[1] * groups, channels):
                raise DeductionError(
                    f"{op}: the input has {format_expr(channels)} channels, the weight expects "
                    f"{format_expr(simplify(weight.shape[1] * groups))} (dim 1 = {format_expr(weight.shape[1])} × groups={groups})"
                )
            out_channels = weight.shape[0]
            if not prove_equal(simplify(out_channels // groups) * groups, out_channels):
                raise DeductionError(f"{op}: {format_expr(out_channels)} output channels are not provably divisible by groups={groups}")
        if len(infos) == 3:
            bias = infos[2]
            if bias.shape is not None and (len(bias.shape) != 1 or not prove_equal(bias.shape[0], out_channels)):
                raise DeductionError(f"{op}: the bias must be [{format_expr(out_channels)}], got {bias}")
        begins, ends = resolve_padding(op, attrs, data.shape[2:], weight.shape[2:])
        extents = []
        for i in range(rank):
            size, kernel = data.shape[2 + i], weight.shape[2 + i]
            stride, dilation = int(attrs["strides"][i]), int(attrs["dilations"][i])
            if transposed:
                extra = int(attrs.get("output_padding", [0] * rank)[i])
                extent = simplify(stride * (size - 1) + extra + dilation * (kernel - 1) + 1 - begins[i] - ends[i])
            else:
                extent = conv_output_extent(size, kernel, stride, begins[i], ends[i], dilation)
            extents.append(_check_extent(op, extent, i, least=0 if transposed else 1))
        return TensorStructInfo((data.shape[0], out_channels, *extents), dtype)

    return deduce


def _guarded(conditions: list, value, otherwise):
    """``value`` where every condition holds (nested selects, outermost first), else ``otherwise``."""
    for condition in reversed(conditions):
        value = select(condition, value, otherwise)
    return value


def _bounds_conditions(position: PrimExpr, size: PrimExpr, lowest: PrimExpr, highest: PrimExpr) -> list:
    """Checks that ``position`` (ranging over [lowest, highest]) lies in [0, size)."""
    conditions = []
    if not prove_less_equal(0, lowest):
        conditions.append(IndexValue(position).ge(IndexValue(IntImm(0))))
    if not prove_less_equal(highest, simplify(size - 1)):
        conditions.append(IndexValue(position).lt(IndexValue(size)))
    return conditions


def legalize_conv(context, call: Call):
    info = call.struct_info
    attrs = call.attrs
    rank = len(attrs["strides"])
    groups = int(attrs.get("groups", 1))
    begins, _ = resolve_padding(call.op, attrs, tensor_shape(call.args[0])[2:], tensor_shape(call.args[1])[2:])
    dtype = info.dtype

    def body(axes, buffers):
        x, w = buffers[0], buffers[1]
        n, oc, outs = axes[0], axes[1], axes[2:]
        ic = SizeVar("rc_")
        ks = [SizeVar(f"rk{i}_") for i in range(rank)]
        per_group = w.shape[1]
        channel = ic if groups == 1 else simplify(oc // simplify(w.shape[0] // groups) * per_group + ic)
        # a window dim of one tap is no reduction (a 1x1 convolution sums over channels alone,
        # which the wasm kernels' packing reads four steps at a time along the weight's rows)
        taps = [as_int(simplify(w.shape[2 + i])) for i in range(rank)]
        window = [IntImm(0) if taps[i] == 1 else ks[i] for i in range(rank)]
        positions, conditions = [], []
        for i in range(rank):
            stride, dilation = int(attrs["strides"][i]), int(attrs["dilations"][i])
            position = simplify(outs[i] * stride - begins[i] + window[i] * dilation)
            lowest = simplify(0 - begins[i])
            highest = simplify((info.shape[2 + i] - 1) * stride - begins[i] + (w.shape[2 + i] - 1) * dilation)
            conditions += _bounds_conditions(position, x.shape[2 + i], lowest, highest)
            positions.append(position)
        product = Load(x, (n, channel, *positions)) * Load(w, (oc, ic, *window))
        expr = _guarded(conditions, product, FloatImm(0.0, dtype))
        for i in reversed(range(rank)):
            if taps[i] != 1:
                expr = Reduce(ReduceCombiner.SUM, ks[i], w.shape[2 + i], expr)
        expr = Reduce(ReduceCombiner.SUM, ic, per_group, expr)
        if len(buffers) == 3:
            expr = expr + Load(buffers[2], (oc,))
        return expr

    program = make_program("conv", call.args, info.shape, dtype, body)
    return context.call_tir(program, call.args)


def legalize_conv_transpose(context, call: Call):
    info = call.struct_info
    attrs = call.attrs
    rank = len(attrs["strides"])
    groups = int(attrs.get("groups", 1))
    begins, _ = resolve_padding(call.op, attrs, tensor_shape(call.args[0])[2:], tensor_shape(call.args[1])[2:])
    dtype = info.dtype
    if _tiles_without_overlap(call, begins):
        return _conv_transpose_as_matmul(context, call)

    def body(axes, buffers):
        x, w = buffers[0], buffers[1]
        n, oc, outs = axes[0], axes[1], axes[2:]
        ic = SizeVar("rc_")
        ks = [SizeVar(f"rk{i}_") for i in range(rank)]
        out_per_group = w.shape[1]
        in_per_group = simplify(x.shape[1] // groups)
        channel = ic if groups == 1 else simplify(oc // out_per_group * in_per_group + ic)
        weight_channel = oc if groups == 1 else simplify(oc % out_per_group)
        positions, conditions = [], []
        for i in range(rank):
            stride, dilation = int(attrs["strides"][i]), int(attrs["dilations"][i])
            shifted = simplify(outs[i] + begins[i] - ks[i] * dilation)
            conditions.append(IndexValue(shifted).ge(IndexValue(IntImm(0))))
            if stride > 1:
                conditions.append(IndexValue(simplify(shifted % stride)).eq(IndexValue(IntImm(0))))
            position = simplify(shifted // stride)
            conditions.append(IndexValue(position).lt(IndexValue(x.shape[2 + i])))
            positions.append(position)
        product = Load(x, (n, channel, *positions)) * Load(w, (channel, weight_channel, *ks))
        expr = _guarded(conditions, product, FloatImm(0.0, dtype))
        for i in reversed(range(rank)):
            expr = Reduce(ReduceCombiner.SUM, ks[i], w.shape[2 + i], expr)
        expr = Reduce(ReduceCombiner.SUM, ic, in_per_group, expr)
        if len(buffers) == 3:
            expr = expr + Load(buffers[2], (oc,))
        return expr

    program = make_program("conv_transpose", call.args, info.shape, dtype, body)
    return context.call_tir(program, call.args)


def _tiles_without_overlap(call: Call, begins) -> bool:
    """Whether each input position of a transposed convolution writes its own tile of the
    output, and nothing else does: one group, kernel == stride, no dilation or padding, an
    output of exactly ``input * stride`` (a DBNet head's, a U-Net's 2x2 up-convolution)."""
    attrs = call.attrs
    x_shape, w_shape = tensor_shape(call.args[0]), tensor_shape(call.args[1])
    rank = len(attrs["strides"])
    return (int(attrs.get("groups", 1)) == 1
            and all(int(d) == 1 for d in attrs["dilations"])
            and all(as_int(b) == 0 for b in begins)
            and all(as_int(w_shape[2 + i]) == int(attrs["strides"][i]) for i in range(rank))
            and all(prove_equal(call.struct_info.shape[2 + i], simplify(x_shape[2 + i] * int(attrs["strides"][i])))
                    for i in range(rank)))


def _conv_transpose_as_matmul(context, call: Call):
    """A transposed convolution whose tiles do not overlap (:func:`_tiles_without_overlap`) as
    a matmul of the input's pixels by the weight's taps into ``[N, O, *kernel, *pixels]``
    (each output element one product of the channels, with no kernel positions to test; the
    pixels, the matmul's rows, last: its sums are stored four rows at a time), then the tiles
    interleaved into the output, ``out[n, o, y, x] = tiles[n, o, y % kh, x % kw, y // kh, x //
    kw]``.  The general form reduces over every kernel position with a divisibility test per
    step, and is no matmul a CPU kernel could block.  With the taps last (``[N, O, H, kh, W,
    kw]``, the output read row-major), PP-OCRv4's 24 -> 24 head layer stored each sum on its
    own: 12.4 ms in V8, 4.5 ms so."""
    x, w = call.args[0], call.args[1]
    info = call.struct_info
    rank = len(call.attrs["strides"])
    x_shape, w_shape = tensor_shape(x), tensor_shape(w)
    kernel = [as_int(w_shape[2 + i]) for i in range(rank)]
    tiled = (x_shape[0], w_shape[1], *w_shape[2:], *x_shape[2:])

    def body(axes, buffers):
        source, weight = buffers[0], buffers[1]
        n, oc, taps, pixels = axes[0], axes[1], axes[2:2 + rank], axes[2 + rank:]
        ic = SizeVar("rc_")
        expr = Reduce(ReduceCombiner.SUM, ic, source.shape[1],
                      Load(source, (n, ic, *pixels)) * Load(weight, (ic, oc, *taps)))
        if len(buffers) == 3:
            expr = expr + Load(buffers[2], (oc,))
        return expr

    def interleave(axes, buffers):
        (tiles,) = buffers
        spatial = axes[2:]
        return Load(tiles, (axes[0], axes[1], *(simplify(y % k) for y, k in zip(spatial, kernel)),
                            *(simplify(y // k) for y, k in zip(spatial, kernel))))

    tiles = context.emit(context.call_tir(make_program("conv_transpose_tiles", call.args, tiled, info.dtype, body),
                                          call.args), "conv_transpose_tiles")
    return context.call_tir(make_program("conv_transpose_interleave", [tiles], info.shape, info.dtype, interleave),
                            (tiles,))


def _compute_dtype(x: np.ndarray):
    if x.dtype == np.int32:
        return np.int64  # wraps back to int32 at the end, as the GPU's i32 sums do
    return np.float64 if x.dtype == np.float64 else np.float32


def _static(values) -> list[int]:
    return [int(as_int(v)) if isinstance(v, PrimExpr) else int(v) for v in values]


def _concrete_padding(op: str, attrs, sizes, kernel) -> tuple[list[int], list[int]]:
    begins, ends = resolve_padding(op, attrs, [int(v) for v in sizes], [int(k) for k in kernel])
    return [int(as_int(b)) for b in begins], [int(as_int(e)) for e in ends]


def conv_reference(arrays, attrs):
    x, w = arrays[0], arrays[1]
    rank = len(attrs["strides"])
    strides, dilations = _static(attrs["strides"]), _static(attrs["dilations"])
    groups = int(attrs.get("groups", 1))
    kernel = w.shape[2:]
    begins, ends = _concrete_padding("conv", attrs, x.shape[2:], kernel)
    compute = _compute_dtype(x)
    # pad (or crop, for negative padding) the input so every window reads inside it
    outs = [
        (x.shape[2 + i] + begins[i] + ends[i] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1
        for i in range(rank)
    ]
    padded = _pad_to_windows(x.astype(compute), begins, outs, kernel, strides, dilations, 0.0)
    n, channels = x.shape[:2]
    out_channels = w.shape[0]
    xg = padded.reshape((n, groups, channels // groups) + padded.shape[2:])
    wg = w.astype(compute).reshape((groups, out_channels // groups) + w.shape[1:])
    result = np.zeros((n, groups, out_channels // groups, *outs), dtype=compute)
    for offsets in itertools.product(*(range(k) for k in kernel)):
        window = xg[(slice(None), slice(None), slice(None)) + _window_slices(offsets, outs, strides, dilations)]
        weights = wg[(slice(None), slice(None), slice(None)) + tuple(offsets)]
        result += np.einsum("ngc...,goc->ngo...", window, weights)
    result = result.reshape((n, out_channels, *outs))
    if len(arrays) == 3:
        result += arrays[2].astype(compute).reshape((1, -1) + (1,) * rank)
    return result.astype(x.dtype)


def _window_slices(offsets, outs, strides, dilations) -> tuple:
    return tuple(
        slice(k * d, k * d + (o - 1) * s + 1, s) if o > 0 else slice(0, 0)
        for k, o, s, d in zip(offsets, outs, strides, dilations)
    )


def _pad_to_windows(x, begins, outs, kernel, strides, dilations, fill):
    """``x`` placed so that position ``o*s + k*d`` of the result is input position
    ``o*s - begin + k*d`` (``fill`` where that is outside the input)."""
    rank = len(begins)
    lengths = [max((o - 1) * s + (k - 1) * d + 1, 0) for o, k, s, d in zip(outs, kernel, strides, dilations)]
    result = np.full(x.shape[:2] + tuple(lengths), fill, dtype=x.dtype)
    target, source = [slice(None)] * 2, [slice(None)] * 2
    for i in range(rank):
        start = max(begins[i], 0)
        source_start = max(-begins[i], 0)
        count = min(lengths[i] - start, x.shape[2 + i] - source_start)
        if count <= 0:
            return result
        target.append(slice(start, start + count))
        source.append(slice(source_start, source_start + count))
    result[tuple(target)] = x[tuple(source)]
    return result


def conv_transpose_reference(arrays, attrs):
    x, w = arrays[0], arrays[1]
    rank = len(attrs["strides"])
    strides, dilations = _static(attrs["strides"]), _static(attrs["dilations"])
    groups = int(attrs.get("groups", 1))
    output_padding = _static(attrs.get("output_padding", [0] * rank))
    kernel = w.shape[2:]
    begins, ends = _concrete_padding("conv_transpose", attrs, x.shape[2:], kernel)
    compute = _compute_dtype(x)
    n, channels = x.shape[:2]
    sizes = x.shape[2:]
    out_per_group = w.shape[1]
    # the full result (no padding removed), then cropped by the begin padding
    full = [s * (i - 1) + d * (k - 1) + 1 + e for i, k, s, d, e in zip(sizes, kernel, strides, dilations, output_padding)]
    outs = [f - b - e for f, b, e in zip(full, begins, ends)]
    buffer = np.zeros((n, groups, out_per_group, *[max(f, 0) for f in full]), dtype=compute)
    xg = x.astype(compute).reshape((n, groups, channels // groups) + tuple(sizes))
    wg = w.astype(compute).reshape((groups, channels // groups, out_per_group) + tuple(kernel))
    for offsets in itertools.product(*(range(k) for k in kernel)):
        contribution = np.einsum("ngc...,gco->ngo...", xg, wg[(slice(None), slice(None), slice(None)) + tuple(offsets)])
        target = tuple(slice(k * d, k * d + (i - 1) * s + 1, s) for k, d, i, s in zip(offsets, dilations, sizes, strides))
        buffer[(slice(None),) * 3 + target] += contribution
    result = np.zeros((n, groups, out_per_group, *outs), dtype=compute)
    target, source = [slice(None)] * 3, [slice(None)] * 3
    empty = False
    for i in range(rank):
        start = max(-begins[i], 0)
        source_start = max(begins[i], 0)
        count = min(outs[i] - start, full[i] - source_start)
        if count <= 0:
            empty = True
            break
        target.append(slice(start, start + count))
        source.append(slice(source_start, source_start + count))
    if not empty:
        result[tuple(target)] = buffer[tuple(source)]
    result = result.reshape((n, groups * out_per_group, *outs))
    if len(arrays) == 3:
        result += arrays[2].astype(compute).reshape((1, -1) + (1,) * rank)
    return result.astype(x.dtype)


register_op("conv", deduce=_deduce_conv("conv"), legalize=needs_known_shapes(legalize_conv), reference=conv_reference)
register_op(
    "conv_transpose", deduce=_deduce_conv("conv_transpose"),
    legalize=needs_known_shapes(legalize_conv_transpose), reference=conv_transpose_reference,
)


# pooling ---------------------------------------------------------------------------------------


def _deduce_pool(op: str):
    def deduce(args, attrs) -> TensorStructInfo:
        if len(args) != 1:
            raise DeductionError(f"{op}: takes 1 argument, got {len(args)}")
        data = require_tensor(args[0], op, 0)
        if op != "max_pool":
            require_float(op, data)
        rank = _spatial_rank(op, attrs)
        kernel = [int(k) for k in attrs["kernel"]]
        if len(kernel) != rank or any(k < 1 for k in kernel):
            raise DeductionError(f"{op}: kernel needs {rank} entries >= 1, got {kernel}")
        _check_data(op, data, rank)
        if data.shape is None:
            return _result_unknown(data, rank, data.dtype)
        begins, ends = resolve_padding(op, attrs, data.shape[2:], kernel)
        ceil_mode = bool(attrs.get("ceil_mode", False))
        extents = []
        for i in range(rank):
            extent = pool_output_extent(
                data.shape[2 + i], kernel[i], int(attrs["strides"][i]), begins[i], ends[i],
                int(attrs["dilations"][i]), ceil_mode,
            )
            extents.append(_check_extent(op, extent, i))
        return TensorStructInfo((*data.shape[:2], *extents), data.dtype)

    return deduce


def _window(attrs, info, x, axes):
    """Per spatial dim: the reduction variable, the input position, and the conditions for
    it being inside the input; plus those for being inside the explicitly padded input."""
    rank = len(attrs["strides"])
    kernel = [int(k) for k in attrs["kernel"]]
    ks, positions, inside, inside_padded = [], [], [], []
    for i in range(rank):
        k, position, axis_inside, axis_inside_padded = _axis_window(attrs, info, x, axes, i)
        ks.append(k)
        positions.append(position)
        inside += axis_inside
        inside_padded += axis_inside_padded
    return ks, kernel, positions, inside, inside_padded


def _axis_window(attrs, info, x, axes, i: int):
    """Spatial dim ``i`` of :func:`_window`: its reduction variable, the input position, the
    conditions for it being inside the input, and those for being inside the padded input
    (the output's extent along it is ``info.shape[2 + i]``, the input's ``x.shape[2 + i]``)."""
    kernel = [int(k) for k in attrs["kernel"]]
    begins, ends = resolve_padding("pool", attrs, x.shape[2:], kernel)
    k = SizeVar(f"rk{i}_")
    stride, dilation = int(attrs["strides"][i]), int(attrs["dilations"][i])
    position = simplify(axes[2 + i] * stride - begins[i] + k * dilation)
    lowest = simplify(0 - begins[i])
    highest = simplify((info.shape[2 + i] - 1) * stride - begins[i] + (kernel[i] - 1) * dilation)
    inside = _bounds_conditions(position, x.shape[2 + i], lowest, highest)
    inside_padded = []
    if not prove_less_equal(highest, simplify(x.shape[2 + i] + ends[i] - 1)):
        inside_padded.append(IndexValue(position).lt(IndexValue(simplify(x.shape[2 + i] + ends[i]))))
    return k, position, inside, inside_padded


def _reduce_window(combiner: ReduceCombiner, ks, kernel, expr):
    for var, extent in reversed(list(zip(ks, kernel))):
        expr = Reduce(combiner, var, IntImm(extent), expr)
    return expr


def _lowest(dtype: str) -> FloatImm:
    """The fill of a max pool's padding: the dtype's lowest value."""
    if dtype.startswith("float"):
        return FloatImm(LOWEST_FLOAT32, dtype)
    return FloatImm(int(np.iinfo(np.dtype(dtype)).min), dtype)


def _separable(kernel: list[int]) -> bool:
    """Whether a max pool's window is worth taking apart (:func:`legalize_max_pool`): its taps
    at least twice those of the two passes, its last dim's and the other dims' (5x5: 25
    against 5 + 5; a 3x3 window stays one program)."""
    last, others = kernel[-1], int(np.prod(kernel[:-1]))
    return len(kernel) >= 2 and last > 1 and others > 1 and last * others >= 2 * (last + others)


def legalize_max_pool(context, call: Call):
    """One program, the maximum over the window; or, where the window is large
    (:func:`_separable`), two: the maxima along the last spatial dim's window for every
    position of the other dims (``max_pool_rows``), then the maxima of those over the other
    dims' window.  The maximum of a window is the maximum of its rows' maxima: YOLOX's
    spatial pyramid (5x5, 9x9 and 13x13 windows, stride 1) took 10 ms of ddddocr's 190 in
    V8, reading 25 to 169 positions per output; apart, 5 + 5 to 13 + 13."""
    info = call.struct_info
    lowest = _lowest(info.dtype)
    kernel = [int(k) for k in call.attrs["kernel"]]
    if not _separable(kernel):
        def body(axes, buffers):
            (x,) = buffers
            ks, kernel, positions, inside, _ = _window(call.attrs, info, x, axes)
            value = _guarded(inside, Load(x, (axes[0], axes[1], *positions)), lowest)
            return _reduce_window(ReduceCombiner.MAX, ks, kernel, value)

        program = make_program("max_pool", call.args, info.shape, info.dtype, body)
        return context.call_tir(program, call.args)

    last = len(kernel) - 1
    data = call.args[0]
    rows_shape = (*tensor_shape(data)[:-1], info.shape[-1])

    def rows_body(axes, buffers):
        (x,) = buffers
        k, position, inside, _ = _axis_window(call.attrs, info, x, axes, last)
        value = _guarded(inside, Load(x, (*axes[:-1], position)), lowest)
        return _reduce_window(ReduceCombiner.MAX, [k], [kernel[last]], value)

    rows = context.emit(context.call_tir(
        make_program("max_pool_rows", [data], rows_shape, info.dtype, rows_body), (data,)), "max_pool_rows")

    def columns_body(axes, buffers):
        (row_maxima,) = buffers
        windows = [_axis_window(call.attrs, info, row_maxima, axes, i) for i in range(last)]
        inside = [condition for window in windows for condition in window[2]]
        value = _guarded(inside, Load(row_maxima, (axes[0], axes[1], *(w[1] for w in windows), axes[-1])), lowest)
        return _reduce_window(ReduceCombiner.MAX, [w[0] for w in windows], kernel[:last], value)

    program = make_program("max_pool", [rows], info.shape, info.dtype, columns_body)
    return context.call_tir(program, (rows,))


def legalize_avg_pool(context, call: Call):
    info = call.struct_info
    dtype = info.dtype
    include_pad = bool(call.attrs.get("count_include_pad", False))

    def body(axes, buffers):
        (x,) = buffers
        ks, kernel, positions, inside, inside_padded = _window(call.attrs, info, x, axes)
        zero = FloatImm(0.0, dtype)
        value = Load(x, (axes[0], axes[1], *positions))
        total = _reduce_window(ReduceCombiner.SUM, ks, kernel, _guarded(inside, value, zero))
        counted = inside_padded if include_pad else inside
        if not counted:
            count = Cast(dtype, IndexValue(IntImm(int(np.prod(kernel)))))
        else:
            count = _reduce_window(ReduceCombiner.SUM, ks, kernel, _guarded(counted, FloatImm(1.0, dtype), zero))
        return total / count

    program = make_program("avg_pool", call.args, info.shape, dtype, body)
    return context.call_tir(program, call.args)


def _lp_power(magnitude, p: float):
    """``magnitude ** p`` of a value >= 0: by products for a small integer ``p``."""
    if p == int(p) and 1 <= p <= 8:
        result = magnitude
        for _ in range(int(p) - 1):
            result = result * magnitude
        return result
    return select(magnitude.gt(0.0), power(magnitude, p), 0.0)  # WGSL's pow(0, p) is undefined


def _lp_root(total, p: float):
    """``total ** (1 / p)`` of a sum >= 0."""
    if p == 1:
        return total
    if p == 2:
        return sqrt(total)
    return select(total.gt(0.0), power(total, 1.0 / p), 0.0)


def legalize_lp_pool(context, call: Call):
    info = call.struct_info
    dtype = info.dtype
    p = float(call.attrs.get("p", 2))
    if p <= 0:
        raise UnsupportedModelError(f"lp_pool: p must be positive, got {p:g}")

    def body(axes, buffers):
        (x,) = buffers
        ks, kernel, positions, inside, _ = _window(call.attrs, info, x, axes)
        value = Load(x, (axes[0], axes[1], *positions))
        term = _lp_power(maximum(value, -value), p)
        total = _reduce_window(ReduceCombiner.SUM, ks, kernel, _guarded(inside, term, FloatImm(0.0, dtype)))
        return _lp_root(total, p)

    program = make_program("lp_pool", call.args, info.shape, dtype, body)
    return context.call_tir(program, call.args)


def pool_reference(kind: str):
    def reference(arrays, attrs):
        x = arrays[0]
        rank = len(attrs["strides"])
        strides, dilations = _static(attrs["strides"]), _static(attrs["dilations"])
        kernel = [int(k) for k in attrs["kernel"]]
        begins, ends = _concrete_padding("pool", attrs, x.shape[2:], kernel)
        ceil_mode = bool(attrs.get("ceil_mode", False))
        outs = [
            int(as_int(pool_output_extent(x.shape[2 + i], kernel[i], strides[i], IntImm(begins[i]), IntImm(ends[i]),
                                          dilations[i], ceil_mode)))
            for i in range(rank)
        ]
        compute = x.dtype if kind in ("max", "argmax") else _compute_dtype(x)
        real = _pad_to_windows(np.ones(x.shape, dtype=bool), begins, outs, kernel, strides, dilations, False)
        values = _pad_to_windows(x.astype(compute), begins, outs, kernel, strides, dilations, 0)
        # positions inside the explicitly padded input (what count_include_pad counts)
        padded_extent = [x.shape[2 + i] + begins[i] + ends[i] for i in range(rank)]
        grids = np.indices(values.shape[2:]) if rank else []
        within = np.ones(values.shape[2:], dtype=bool)
        for i in range(rank):
            within &= grids[i] < padded_extent[i]
        if kind in ("max", "argmax"):
            if np.issubdtype(values.dtype, np.floating):
                lowest = -np.inf
            else:
                lowest = np.iinfo(values.dtype).min
            result = np.full(x.shape[:2] + tuple(outs), lowest, dtype=values.dtype)
        else:
            result = np.zeros(x.shape[:2] + tuple(outs), dtype=compute)
            count = np.zeros(x.shape[:2] + tuple(outs), dtype=compute)
        p = float(attrs.get("p", 2))
        include_pad = bool(attrs.get("count_include_pad", False))
        if kind == "argmax":
            result = np.full(x.shape[:2] + tuple(outs), -1, dtype=np.int64)
            best = np.full(x.shape[:2] + tuple(outs), -np.inf)
            sizes = list(x.shape[2:])
            order = list(range(rank)) if int(attrs.get("storage_order", 0)) == 0 else list(reversed(range(rank)))
            out_grids = np.indices(outs) if rank else []
            channel = np.arange(x.shape[0] * x.shape[1]).reshape(x.shape[:2] + (1,) * rank) * int(np.prod(sizes))
        for offsets in itertools.product(*(range(k) for k in kernel)):
            window = (slice(None), slice(None)) + _window_slices(offsets, outs, strides, dilations)
            chunk, mask = values[window], real[window]
            if kind == "argmax":
                better = mask & (chunk > best)
                best = np.where(better, chunk, best)
                positions = [out_grids[i] * strides[i] - begins[i] + offsets[i] * dilations[i] for i in range(rank)]
                flat = np.zeros(outs, dtype=np.int64)
                for i in order:
                    flat = flat * sizes[i] + positions[i]
                result = np.where(better, channel + flat, result)
            elif kind == "max":
                result = np.maximum(result, np.where(mask, chunk, lowest))
            elif kind == "avg":
                result += np.where(mask, chunk, 0)
                count += within[window[2:]] if include_pad else mask
            else:
                result += np.where(mask, np.abs(chunk) ** p, 0)
        if kind == "argmax":
            return result
        if kind == "avg":
            with np.errstate(invalid="ignore", divide="ignore"):
                result = result / count
        elif kind == "lp":
            result = result ** (1.0 / p)
        return result.astype(x.dtype)

    return reference


register_op("max_pool", deduce=_deduce_pool("max_pool"), legalize=needs_known_shapes(legalize_max_pool),
            reference=pool_reference("max"))
register_op("avg_pool", deduce=_deduce_pool("avg_pool"), legalize=needs_known_shapes(legalize_avg_pool),
            reference=pool_reference("avg"))
register_op("lp_pool", deduce=_deduce_pool("lp_pool"), legalize=needs_known_shapes(legalize_lp_pool),
            reference=pool_reference("lp"))


def deduce_max_pool_indices(args, attrs) -> TensorStructInfo:
    values = _deduce_pool("max_pool")(args, attrs)
    return TensorStructInfo(values.shape, "int64", values.ndim)


# ONNX MaxPool's Indices output: the flat position (over the whole input, row-major, or with
# the spatial dims column-major for storage_order=1) of the first maximum of each window.
def legalize_max_pool_indices(context, call: Call):
    """Three programs: the window maxima (max_pool's program), the first kernel position
    (row-major over the kernel, as the reference scans) holding the maximum, then its flat
    position in the input (spatial dims row-major, or column-major for ``storage_order=1``,
    after the ``n * C + c`` channel offset) as int64."""
    data = call.args[0]
    info = call.struct_info
    dtype = data.struct_info.dtype
    shape = tensor_shape(data)
    rank = len(call.attrs["strides"])
    values = context.emit(legalize_max_pool(context, Call("max_pool", call.args, call.attrs,
                                                          TensorStructInfo(info.shape, dtype))), "max_pool_values")

    def kernel_position(ks, kernel) -> PrimExpr:
        total: PrimExpr = IntImm(0)
        for var, extent in zip(ks, kernel):
            total = total * extent + var
        return simplify(total)

    def first_body(axes, buffers):
        x, maxima = buffers
        ks, kernel, positions, inside, _ = _window(call.attrs, info, x, axes)
        hit = Load(x, (axes[0], axes[1], *positions)).eq(Load(maxima, tuple(axes)))
        count = IndexValue(IntImm(int(np.prod(kernel))))
        return _reduce_window(ReduceCombiner.MIN, ks, kernel, _guarded([*inside, hit], IndexValue(kernel_position(ks, kernel)), count))

    first = context.emit(context.call_tir(
        make_program("max_pool_first", [data, values], info.shape, "int32", first_body), (data, values)),
        "max_pool_first")
    order = list(range(rank)) if int(call.attrs.get("storage_order", 0)) == 0 else list(reversed(range(rank)))

    def index_body(axes, buffers):
        x, chosen = buffers
        ks, kernel, positions, _, _ = _window(call.attrs, info, x, axes)
        flat: PrimExpr = simplify((axes[0] * shape[1] + axes[1]))
        for i in order:
            flat = flat * shape[2 + i] + positions[i]
        hit = IndexValue(kernel_position(ks, kernel)).eq(Load(chosen, tuple(axes)))
        position = select(hit, IndexValue(simplify(flat)), IndexValue(IntImm(0)))
        found = _reduce_window(ReduceCombiner.SUM, ks, kernel, position)
        return Cast("int64", found)

    program = make_program("max_pool_indices", [data, first], info.shape, "int64", index_body)
    return context.call_tir(program, (data, first))


register_op("max_pool_indices", deduce=deduce_max_pool_indices, legalize=needs_known_shapes(legalize_max_pool_indices),
            reference=pool_reference("argmax"))
