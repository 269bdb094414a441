"""compress_weights: constant weights stored as packed float16 / int8 / int4 words.

``relaxweb build --weights float16|int8|int4`` (``PassContext.weights``; float32, the
default, keeps the weights as the model stores them and this pass changes nothing).  It
replaces the float32 constants that hold most of a model's bytes by ``unpack_weights`` calls
(``ops/packed_weights.py``) of uint32 constants, before legalization:

- ``matmul(x, W)`` with a constant second factor ``W[..., K, N]``: ``W`` packed along ``K``
  (the reduction: a group of ``group_size`` consecutive ``k`` shares a scale);
- ``take(table, indices, axis=0)`` of a 2-d constant ``table[V, D]`` (an embedding): the
  table packed along its rows ``D``; the call becomes ``unpack_weights`` of the gathered rows
  of the words and scales (each row decodes alone, so the gather reads packed rows);
- ``conv(x, W)`` with a constant ``W[O, C, *kernel]``: ``W`` seen as ``[O, C * kernel]``,
  packed along the reduction, and reshaped back.

``unpack_weights`` legalizes to an injective program that ``fuse_ops`` inlines into the
matmul, gather or convolution reading it, so the kernel reads the packed words and no float
copy of the weight exists in GPU memory.  Small constants (biases, norms: fewer than
:data:`MIN_ELEMENTS` elements) and other dtypes stay as they are.

Quantization is group-wise along the packing axis (``PassContext.weight_group_size``,
default 32), scales rounded to ``PassContext.weight_scale_dtype`` (float16: packed two per
word; float32), the quantized values computed with the rounded scale:

- int8 is symmetric (``scale = max|w| / 127``, no zero point): a zero point per group would
  cost 1/32 byte per weight (int8 with float16 scales is 1.0625 bytes per weight, 0.266x
  float32; with zero points 0.273x) for an RMS error 0.89x the symmetric one's (N(0, 1)
  weights in groups of 32: 0.0048 against 0.0054), which int8 does not need;
- int4 is asymmetric (the range ``[min(w, 0), max(w, 0)]`` over 16 levels and a 4-bit zero
  point per group, packed like the values): on the same weights its RMS error is 0.83x the
  symmetric one's (0.081 against 0.097) for 1/64 byte per weight (0.578 bytes per weight
  with float16 scales, 0.145x float32).  The zero points are held in the words, after the
  values (``zero_points_in_words``): two buffers per weight like int8, so a matmul that fuses
  a prologue (a norm, a packed embedding's gather) still has room for its weight's decode,
  and no float32 copy of the weight is made (with a third buffer the tiny Llama's first
  q_proj and GPT-2's LM head were decoded into float32 buffers: 154 MB for GPT-2's).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.builder import FunctionBuilder
from ..ir.expr import Call, Constant, DataflowVar, Expr, Function, ShapeExpr, Var, VarBinding
from ..ir.functor import ExprMutator
from ..ir.module import IRModule
from ..ir.op_registry import node_attrs
from ..ops import call_op
from ..ops.packed_weights import FORMAT_BITS, group_count, pack_fields, pack_halves, unpack_weights_reference
from .context import PassContext

#: Constants with fewer elements stay float32 (biases, norms, small projections).
MIN_ELEMENTS = 1024


def compress_weights(module: IRModule) -> IRModule:
    """Replace the constant weights of matmuls, gathers and convolutions by packed ones."""
    context = PassContext.current()
    if context.weights == "float32":
        return module
    packer = _Packer(context.weights, context.weight_group_size, context.weight_scale_dtype)
    functions = {name: _WeightCompressor(f, packer).visit_function(f) if isinstance(f, Function) else f
                 for name, f in module.functions.items()}
    return module.replace(functions=functions)


def dequantized(data: np.ndarray, format: str, axis: int, group_size: int = 32,
                scale_dtype: str = "float16") -> np.ndarray:
    """The float32 values that a bundle built with ``--weights format`` decodes for the weight
    ``data`` packed along ``axis`` (its kernels compute with exactly these): the pass's packing,
    then ``unpack_weights``'s numpy reference.  For measuring quantization error outside the
    GPU (``scripts/measure_quantization.py`` runs models with these weights in onnxruntime)."""
    packed = _Packer(format, group_size, scale_dtype)._pack("weight", np.asarray(data, np.float32), axis)
    return unpack_weights_reference([packed.words.data, *(p.data for p in packed.parameters)], packed.attrs)


@dataclass(frozen=True)
class Packed:
    """A weight's packed constants: ``unpack_weights(words, *parameters, **attrs)`` is its value."""

    words: Constant
    parameters: tuple[Constant, ...]
    attrs: dict


class _Packer:
    """Quantizes and packs constants, each (constant, axis, 2-d view) once."""

    def __init__(self, format: str, group_size: int, scale_dtype: str) -> None:
        self.format, self.group_size, self.scale_dtype = format, group_size, scale_dtype
        self.done: dict[tuple, Packed] = {}

    def pack(self, constant: Constant, data: np.ndarray, axis: int) -> Packed:
        key = (id(constant), data.shape, axis)
        if key not in self.done:
            self.done[key] = self._pack(constant.name, data.astype(np.float32), axis)
        return self.done[key]

    def _pack(self, name: str, data: np.ndarray, axis: int) -> Packed:
        extent = data.shape[axis]
        attrs = {"format": self.format, "axis": axis, "extent": extent}
        bits = FORMAT_BITS[self.format]
        if self.format == "float16":
            return Packed(Constant(pack_halves(data, axis), f"{name}.float16_words"), (), attrs)
        attrs["group_size"] = self.group_size
        groups = _grouped(data, axis, self.group_size)  # [..., groups, group_size, ...] padded with NaN
        low, high = np.nanmin(groups, axis=axis + 1), np.nanmax(groups, axis=axis + 1)
        if self.format == "int8":  # symmetric: the zero point is the middle of the range
            scale = self._rounded_scale(np.maximum(np.abs(low), np.abs(high)) / 127.0)
            zero_point = None
            middle = 2 ** (bits - 1)
            quantized = np.clip(np.rint(groups / _expand(scale, axis)), -127, 127) + middle
        else:  # asymmetric: the range [min, max] (which holds 0) over the 16 levels
            low, high = np.minimum(low, 0.0), np.maximum(high, 0.0)
            scale = self._rounded_scale((high - low) / (2 ** bits - 1))
            zero_point = np.clip(np.rint(-low / scale), 0, 2 ** bits - 1)
            quantized = np.clip(np.rint(groups / _expand(scale, axis)) + _expand(zero_point, axis), 0, 2 ** bits - 1)
        fields = _ungrouped(np.nan_to_num(quantized), axis, extent).astype(np.uint32)
        packed = pack_fields(fields, bits, axis)
        if zero_point is not None:  # in the words, after the values: one buffer fewer to bind
            packed = np.concatenate([packed, pack_fields(zero_point.astype(np.uint32), bits, axis)], axis=axis)
            attrs["zero_points_in_words"] = True
        words = Constant(packed, f"{name}.{self.format}_words")
        if self.scale_dtype == "float16":
            scales = Constant(pack_halves(scale, axis), f"{name}.scales")
        else:
            scales = Constant(np.ascontiguousarray(scale, np.float32), f"{name}.scales")
        return Packed(words, (scales,), attrs)

    def _rounded_scale(self, scale: np.ndarray) -> np.ndarray:
        """The scale as it will be stored (float16 or float32), 1 where it is 0 (a group of
        zeros) so that quantizing by it is defined."""
        scale = scale.astype(self.scale_dtype).astype(np.float32)
        return np.where(scale > 0, scale, np.float32(1.0))


def _grouped(data: np.ndarray, axis: int, group_size: int) -> np.ndarray:
    """``data`` with ``axis`` split into (groups, group_size), the last group padded with NaN."""
    extent = data.shape[axis]
    padding = group_count(extent, group_size) * group_size - extent
    pad = [(0, 0)] * data.ndim
    pad[axis] = (0, padding)
    padded = np.pad(data, pad, constant_values=np.nan)
    return padded.reshape(*data.shape[:axis], -1, group_size, *data.shape[axis + 1:])


def _ungrouped(grouped: np.ndarray, axis: int, extent: int) -> np.ndarray:
    merged = grouped.reshape(*grouped.shape[:axis], -1, *grouped.shape[axis + 2:])
    return merged.take(range(extent), axis=axis)


def _expand(parameter: np.ndarray, axis: int) -> np.ndarray:
    """A per-group parameter broadcast over its group's values (of :func:`_grouped`)."""
    return np.expand_dims(parameter, axis + 1)


def _compressible(expr: Expr, ndim: int | None = None) -> bool:
    data = expr.data if isinstance(expr, Constant) else None
    return (data is not None and data.dtype == np.float32 and data.size >= MIN_ELEMENTS
            and data.ndim >= 2 and (ndim is None or data.ndim == ndim))


class _WeightCompressor(ExprMutator):
    def __init__(self, function: Function, packer: _Packer) -> None:
        super().__init__()
        self.packer = packer
        self.names = FunctionBuilder.avoiding_names_of(function)

    def visit_var_binding(self, binding: VarBinding) -> None:
        value = binding.value
        if isinstance(value, Call):
            rewritten = self._rewrite(value)
            if rewritten is not None:
                value = rewritten
                binding = VarBinding(binding.var, value)
        super().visit_var_binding(binding)

    def _rewrite(self, call: Call) -> Call | None:
        if call.op == "matmul" and _compressible(call.args[1]):
            weight = call.args[1]
            packed = self.packer.pack(weight, weight.data, weight.data.ndim - 2)
            return Call(call.op, (call.args[0], self._bind_unpack(packed, weight.name)), call.attrs, call.struct_info)
        if call.op == "take" and int(call.attrs.get("axis", 0)) in (0, -2) and _compressible(call.args[0], ndim=2):
            table, indices = call.args
            packed = self.packer.pack(table, table.data, 1)
            rows = [self._bind(f"{constant.name}_rows", call_op("take", constant, indices, axis=0,
                                                                            **node_attrs(call)))
                    for constant in (packed.words, *packed.parameters)]
            unpack_attrs = {**packed.attrs, "axis": len(call.struct_info.shape) - 1}
            return call_op("unpack_weights", *rows, **unpack_attrs)
        if call.op == "conv" and _compressible(call.args[1]):
            weight = call.args[1]
            flat = weight.data.reshape(weight.data.shape[0], -1)
            packed = self.packer.pack(weight, flat, 1)
            unpacked = self._bind_unpack(packed, weight.name)
            reshaped = self._bind(f"{weight.name}_kernel", call_op("reshape", unpacked, ShapeExpr(weight.data.shape)))
            return Call(call.op, (call.args[0], reshaped, *call.args[2:]), call.attrs, call.struct_info)
        return None

    def _bind_unpack(self, packed: Packed, name: str) -> Var:
        return self._bind(f"{name}_unpacked", call_op("unpack_weights", packed.words, *packed.parameters, **packed.attrs))

    def _bind(self, hint: str, value: Call) -> Var:
        kind = DataflowVar if self.in_dataflow_block else Var
        var = kind(self.names.unique_name(hint), value.struct_info)
        self.emit_binding(VarBinding(var, value))
        return var
