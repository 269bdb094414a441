"""Pre-quantized weights as onnxruntime writes them: com.microsoft MatMulNBits and
GatherBlockQuantized (``onnxruntime.quantization.matmul_nbits_quantizer``), imported as the
``unpack_weights`` op (``relaxweb/ops/packed_weights.py``) that ``passes/compress_weights.py``
writes too, so the GPU kernels read the packed words.

Their uint8 blobs (or ONNX int4 / uint4 tensors) are repacked into uint32 words at import,
values unchanged:

- MatMulNBits ``B[N, blocks, blob]`` holds column ``n``'s ``K`` values in blocks of
  ``block_size`` (4 bits: two per byte, the first in the low nibble), ``scales[N, blocks]``
  (or flat), ``zero_points`` packed like ``B`` (or float, like the scales; absent: the middle
  of the range, 8 or 128); ``Y = A @ W (+ bias)`` with ``W[k, n] = (q - zero_point) * scale``.
  ``W`` is repacked along ``K`` (``[ceil(K / per_word), N]`` words), as the matmul reads it.
- GatherBlockQuantized ``data[V, D]`` quantized in blocks along its last axis, gathered along
  axis 0: the rows are repacked (an int4 value ``q`` stored as the field ``q + 8``, so that
  the implicit zero point 8 gives ``q * scale``; an int4 zero point ``z`` as ``z + 8``), and
  the call is ``unpack_weights`` of the gathered rows of words, scales and zero points.
  Without zero points, onnxruntime's kernels decode uint8 data as MatMulNBits does (zero
  point 8 for 4 bits, 128 for 8: ``unpack_weights``' implicit one), uint4 data with 0 and
  int4 data with 0.  The data may be a reshape of a constant (the model builder's tied
  embeddings read the LM head's MatMulNBits words): a constant all the same.

What they allow beyond that is refused with the node's name and the reason: MatMulNBits'
``g_idx`` (act-order column permutation), bits other than 4 and 8, weights computed at run
time; GatherBlockQuantized on another axis or of another rank.
"""

from __future__ import annotations

import numpy as np

from ...ir.expr import Call, Constant, Expr, Var, VarBinding, tensor_dtype, tensor_shape
from ...ir.symbolic import as_int
from ...ops import call_op
from ...ops.packed_weights import group_count, pack_fields, pack_halves, unpack_fields
from .contrib import MICROSOFT
from .manipulation import fail
from .registry import converter


def _input(inputs: list[Expr | None], position: int) -> Expr | None:
    return inputs[position] if position < len(inputs) else None


#: Ops that only give their input another shape, the elements in the same order.
SHAPE_ONLY_OPS = ("reshape", "squeeze", "expand_dims", "flatten")


def _constant(node, expr: Expr | None, what: str, context=None) -> np.ndarray | None:
    """``expr``'s value: a constant, or (with ``context``) a constant given another shape by
    shape-only ops the importer did not fold (a large one)."""
    if expr is None:
        return None
    source = _through_shape_ops(context, expr) if context is not None else expr
    if not isinstance(source, Constant):
        raise fail(node, f"{what} must be a constant (an initializer); computed quantized weights are not supported")
    shape = tuple(as_int(d) for d in tensor_shape(expr))
    return source.data if source is expr else source.data.reshape(shape)


def _through_shape_ops(context, expr: Expr) -> Expr:
    """The constant that ``expr`` is a reshape (or squeeze, ...) of, or ``expr`` itself;
    only where ``expr``'s shape is known."""
    if not isinstance(expr, Var) or any(as_int(d) is None for d in tensor_shape(expr)):
        return expr
    definitions = {binding.var: binding.value for binding in context.builder.bindings if isinstance(binding, VarBinding)}
    source = expr
    while isinstance(source, Var):
        value = definitions.get(source)
        if not (isinstance(value, Call) and value.op in SHAPE_ONLY_OPS):
            return expr
        source = value.args[0]
    return source if isinstance(source, Constant) else expr


def _byte_fields(data: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The first ``count`` ``bits``-bit fields of each row of uint8 ``data[rows, bytes]``
    (4 bits: the low nibble first)."""
    if bits == 8:
        return data.astype(np.uint32)[:, :count]
    padded = np.pad(data, ((0, 0), (0, (-data.shape[1]) % 4)))
    words = np.ascontiguousarray(padded).view("<u4")
    return unpack_fields(words, 4, 1, count)


def _scales(scales: np.ndarray, axis: int) -> np.ndarray:
    """float16 scales packed two per word (the bundle keeps float16 tensors as float32);
    float32 ones as they are."""
    if scales.dtype == np.float16:
        return pack_halves(scales, axis)
    return np.ascontiguousarray(scales.astype(np.float32))


def _zero_points(zero_points: np.ndarray | None, fields, bits: int, axis: int) -> np.ndarray | None:
    """Float zero points as they are, integer ones (``fields``: the unpacked values) packed."""
    if zero_points is None:
        return None
    if zero_points.dtype.kind == "f":
        return np.ascontiguousarray(zero_points.astype(np.float32))
    return pack_fields(fields, bits, axis)


@converter("MatMulNBits", domain=MICROSOFT)
def convert_matmul_nbits(context, node, inputs):
    attrs = context.attributes(node)
    k, n, bits, block_size = int(attrs["K"]), int(attrs["N"]), int(attrs.get("bits", 4)), int(attrs["block_size"])
    if bits not in (4, 8):
        raise fail(node, f"bits {bits} is not supported (4 or 8)")
    if _input(inputs, 4) is not None:
        raise fail(node, "g_idx (a permutation of K for act-order quantization) is not supported")
    a = inputs[0]
    weight = _constant(node, inputs[1], "B")
    scales = _constant(node, inputs[2], "the scales")
    zero_points = _constant(node, _input(inputs, 3), "the zero points")
    blocks = group_count(k, block_size)
    if weight.dtype != np.uint8 or weight.size != n * blocks * (block_size * bits // 8):
        raise fail(node, f"B must be uint8 [N, blocks, block_size * bits / 8] = [{n}, {blocks}, "
                   f"{block_size * bits // 8}], got {weight.dtype} {list(weight.shape)}")
    fields = _byte_fields(weight.reshape(n, -1), bits, k)  # [N, K]
    words = pack_fields(fields.T, bits, 0)  # [ceil(K / per_word), N]
    scales = scales.reshape(n, blocks)
    parameters = [_scales(scales.T, 0)]
    if zero_points is not None:
        zero_fields = None
        if zero_points.dtype.kind != "f":
            zero_fields = _byte_fields(zero_points.reshape(n, -1), bits, blocks).T  # [blocks, N]
        parameters.append(_zero_points(zero_points.reshape(n, blocks).T if zero_points.dtype.kind == "f" else zero_points,
                                       zero_fields, bits, 0))
    name = node.name or node.output[0]
    constants = [context.constant(words, f"{name}.words"),
                 *(context.constant(p, f"{name}.{what}") for p, what in zip(parameters, ("scales", "zero_points")))]
    unpacked = context.builder.emit(call_op("unpack_weights", *constants, format=f"int{bits}", axis=0, extent=k,
                                            group_size=block_size), f"{name}_weight")
    if tensor_dtype(a) != "float32":
        unpacked = context.builder.emit(call_op("cast", unpacked, dtype=tensor_dtype(a)), f"{name}_weight_cast")
    product = call_op("matmul", a, unpacked)
    bias = _input(inputs, 5)
    if bias is None:
        return product
    return call_op("add", context.builder.emit(product, f"{name}_product"), bias)


@converter("GatherBlockQuantized", domain=MICROSOFT)
def convert_gather_block_quantized(context, node, inputs):
    attrs = context.attributes(node)
    data = _constant(node, inputs[0], "the data", context)
    indices, scales = inputs[1], _constant(node, inputs[2], "the scales")
    zero_points = _constant(node, _input(inputs, 3), "the zero points")
    block_size, bits = int(attrs.get("block_size", 128)), int(attrs.get("bits", 4))
    if data.ndim != 2 or int(attrs.get("gather_axis", 0)) % 2 != 0 or int(attrs.get("quantize_axis", 1)) % 2 != 1:
        raise fail(node, "only a 2-d table gathered along axis 0 and quantized along axis 1 is supported "
                   f"(data {list(data.shape)}, gather_axis {attrs.get('gather_axis', 0)}, "
                   f"quantize_axis {attrs.get('quantize_axis', 1)})")
    if str(data.dtype) in ("int4", "uint4"):
        bits, signed = 4, str(data.dtype) == "int4"
        fields, extent = data.astype(np.int32), data.shape[1]
    elif data.dtype == np.uint8 and bits in (4, 8):
        signed, extent = False, data.shape[1] * 8 // bits
        fields = _byte_fields(data, bits, extent).astype(np.int32)
    else:
        raise fail(node, f"data of dtype {data.dtype} with bits {bits} is not supported (int4, uint4, or uint8 with bits 4 or 8)")
    groups = group_count(extent, block_size)
    if signed:  # two's complement -> offset binary: (q + 8 - (z + 8)) * scale, z 0 by default
        fields = fields + 2 ** (bits - 1)
        if zero_points is not None and str(zero_points.dtype) != "int4":
            raise fail(node, f"the zero points of int4 data must be int4, got {zero_points.dtype}")
        zero_points = None if zero_points is None else zero_points.astype(np.int32) + 2 ** (bits - 1)
    elif zero_points is None and str(data.dtype) == "uint4":
        zero_points = np.zeros((data.shape[0], groups), np.uint8)  # uint4's default zero point is 0
    # (uint8 data without zero points: unpack_weights' implicit 8 or 128, as onnxruntime's kernel)
    parameters = [_scales(scales.reshape(data.shape[0], groups), 1)]
    if zero_points is not None:
        zero_fields = None
        if zero_points.dtype.kind != "f":
            zero_fields = (zero_points.astype(np.uint32) if str(zero_points.dtype) in ("uint4", "int32") or bits == 8
                           else _byte_fields(zero_points.reshape(data.shape[0], -1), bits, groups))
        parameters.append(_zero_points(zero_points, zero_fields, bits, 1))
    name = node.name or node.output[0]
    rows = []
    for constant, what in zip((pack_fields(fields.astype(np.uint32), bits, 1), *parameters), ("words", "scales", "zero_points")):
        rows.append(context.builder.emit(call_op("take", context.constant(constant, f"{name}.{what}"), indices, axis=0),
                                         f"{name}_{what}_rows"))
    unpacked = call_op("unpack_weights", *rows, format=f"int{bits}", axis=len(tensor_shape(indices)), extent=extent,
                       group_size=block_size)
    if scales.dtype == np.float32:
        return unpacked
    return call_op("cast", context.builder.emit(unpacked, f"{name}_rows"), dtype=str(scales.dtype))
