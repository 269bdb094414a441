"""onnxruntime's attention contrib ops (domain ``com.microsoft``): Attention,
MultiHeadAttention, GroupQueryAttention and RotaryEmbedding.

Each is written as relaxweb ops — projections and head layouts (matmul, strided_slice,
reshape, transpose), the key/value cache (concat), ``softmax(q @ k^T * scale + mask +
attention_bias) @ v``, and ``rotary_embedding`` — so fusion merges the layout changes into
the matmuls as it does for unfused exports.  The numeric reference is onnxruntime's CPU
kernels:

- The mask is an additive bias on the scores: ``mask_filter_value`` (default -10000) where a
  key is masked by the mask input; where ``unidirectional`` (causal) forbids a key, the
  bias is the lowest finite value of the scores' dtype instead (onnxruntime sets float32's,
  replacing the mask value; float16 scores get float16's, which a cast of float32's would
  turn into -inf).
  Mask formats: ``[B]`` (each row's end position: right padding), ``[2B]`` (end positions,
  then start positions: left padding), ``[B, T]`` and ``[B, S, T]`` (raw: 0 masks a key).
- Query position ``s`` is position ``past + s`` of the keys (``past`` the length of the
  past state), so a causal query sees keys ``0 .. past + s``.

What is refused, with the node named: buffer sharing (``past_present_share_buffer``,
``past_sequence_length``), beam-search ``cache_indirection``, the ``qk`` outputs,
Attention's ``do_rotary`` and the 4-D Megatron mask (onnxruntime's CPU kernels refuse it
too), the ``[3B + 2]`` mask format, and GroupQueryAttention's quantized caches, sliding
window cache, ``query_seqlens``, ``head_sink`` / ``smooth_softmax``, per-head Q/K norms and
``softcap`` together with ``attention_bias``.
"""

from __future__ import annotations

import math

import numpy as np

from ...ir.expr import Constant, Expr, PrimValue, ShapeExpr, tensor_shape
from ...ir.symbolic import IntImm, PrimExpr, as_int, prove_equal, simplify
from ...ops import call_op, strided_slice
from .contrib import MICROSOFT, dtype_of, label, optional_input, require_rank, scalar_constant, wanted_output
from .registry import NodeConversionError, converter

DEFAULT_MASK_FILTER_VALUE = -10000.0


def _refuse(node, what: str):
    raise NodeConversionError(f"{node.domain}.{node.op_type} node '{node.name}': {what} is not supported")


def _constant_dim(node, expr: Expr, axis: int, what: str) -> int:
    value = as_int(tensor_shape(expr)[axis])
    if value is None:
        raise NodeConversionError(f"{node.op_type} node '{node.name}': {what} must be a constant dimension, got {expr.struct_info}")
    return value


class Heads:
    """Building blocks shared by the attention converters, bound to one node."""

    def __init__(self, context, node):
        self.context = context
        self.node = node

    def emit(self, call, name: str):
        return self.context.builder.emit(call, name)

    def slice_last(self, x: Expr, begin: int, end: int, name: str) -> Expr:
        axis = len(tensor_shape(x)) - 1
        return self.emit(strided_slice(x, [axis], [IntImm(begin)], [IntImm(end)]), name)

    def split_heads(self, x: Expr, heads: int, name: str) -> Expr:
        """``[B, S, heads * H]`` -> ``[B, heads, S, H]``."""
        batch, seq, hidden = tensor_shape(x)
        width = as_int(hidden)
        if width is None or width % heads:
            raise NodeConversionError(
                f"{self.node.op_type} node '{self.node.name}': hidden size {hidden} is not a multiple of {heads} heads"
            )
        split = self.emit(call_op("reshape", x, ShapeExpr((batch, seq, IntImm(heads), IntImm(width // heads)))), f"{name}_heads")
        return self.emit(call_op("transpose", split, axes=[0, 2, 1, 3]), f"{name}_bnsh")

    def merge_heads(self, x: Expr) -> Expr:
        """``[B, N, S, H]`` -> ``[B, S, N * H]`` (unbound)."""
        batch, heads, seq, size = tensor_shape(x)
        moved = self.emit(call_op("transpose", x, axes=[0, 2, 1, 3]), "attention_bsnh")
        return call_op("reshape", moved, ShapeExpr((batch, seq, simplify(heads * size))))

    def scalar(self, value: float, like: Expr, what: str) -> Constant:
        return scalar_constant(self.context, value, like, f"{label(self.node)}_{what}")

    def lowest(self, like: Expr, what: str) -> Constant:
        """The lowest finite value of ``like``'s dtype, the bias of a key no query may see."""
        return self.scalar(float(np.finfo(np.dtype(dtype_of(like))).min), like, what)

    def int_range(self, start: PrimExpr, length: PrimExpr, name: str) -> Expr:
        """``[start, start + length)`` as an int32 vector."""
        return self.emit(call_op("arange", PrimValue(start), PrimValue(simplify(start + length)), PrimValue(IntImm(1)),
                                 dtype="int32"), name)

    def mask_bias(self, mask: Expr | None, batch, seq, total, past, causal: bool, filter_value: float, like: Expr,
                  window: int = -1) -> Expr | None:
        """The additive bias on the scores ``[B or 1, 1, S or 1, T]`` (None when nothing is masked)."""
        allowed = None
        if mask is not None:
            allowed = self.allowed_keys(mask, batch, seq, total)
        zero, masked = self.scalar(0.0, like, "mask_zero"), self.scalar(filter_value, like, "mask_filter_value")
        bias = None if allowed is None else self.emit(call_op("where", allowed, zero, masked), "mask_bias")
        if not causal:
            return bias
        keys = self.int_range(IntImm(0), total, "key_positions")
        queries = self.emit(call_op("reshape", self.int_range(past, seq, "query_positions"), ShapeExpr((seq, IntImm(1)))),
                            "query_column")
        visible = self.emit(call_op("less_equal", keys, queries), "causal_visible")
        if window > 0:  # local attention: only the last `window` keys up to the query's own
            start = self.emit(call_op("subtract", queries, self.int_scalar(window)), "window_start")
            recent = self.emit(call_op("greater", keys, start), "window_visible")
            visible = self.emit(call_op("logical_and", visible, recent), "local_visible")
        lowest = self.lowest(like, "causal_lowest")
        return self.emit(call_op("where", visible, zero if bias is None else bias, lowest), "causal_bias")

    def assume_shape(self, x: Expr, dims: tuple, name: str) -> Expr:
        """``x`` with the shape ``dims`` (its dims of extent 1 kept): as it is where that is
        provable, else through a ``match_cast``, which checks it at run time.  (A mask
        ``[batch, total_length]`` names its length with a variable of its own.)"""
        shape = tensor_shape(x)
        wanted = tuple(IntImm(1) if as_int(have) == 1 else want for have, want in zip(shape, dims))
        if len(shape) == len(dims) and all(prove_equal(a, b) for a, b in zip(shape, wanted)):
            return x
        if len(shape) != len(dims):
            raise NodeConversionError(
                f"{self.node.op_type} node '{self.node.name}': {name} {x.struct_info} must have {len(dims)} dims"
            )
        for dim, (have, want) in enumerate(zip(shape, wanted)):  # each dim checked on its own, named in the error
            if not prove_equal(have, want):
                x = self.context.builder.check_dim(
                    x, dim, want, f"{self.node.op_type} node '{label(self.node)}': dimension {dim} of {name}")
        return x

    def int_scalar(self, value: int) -> Constant:
        return self.context.constant(np.array(value, dtype=np.int32).reshape(()), f"{label(self.node)}_{value}")

    def int_scalar_of(self, value: PrimExpr) -> Expr:
        """A symbolic integer as an int32 vector of one entry."""
        return self.int_range(value, IntImm(1), "length")

    def allowed_keys(self, mask: Expr, batch, seq, total) -> Expr:
        """A bool tensor ``[B, 1, 1 or S, T]``: which keys each query may see."""
        node = self.node
        shape = tensor_shape(mask)
        if len(shape) == 1:
            if prove_equal(shape[0], simplify(batch * 2)):
                ends = self.emit(strided_slice(mask, [0], [IntImm(0)], [batch]), "mask_ends")
                starts = self.emit(strided_slice(mask, [0], [batch], [simplify(batch * 2)]), "mask_starts")
            else:  # [batch_size] (checked at run time where not provable; [2 * batch_size] needs a provable length)
                ends, starts = self.assume_shape(mask, (batch,), "mask_index"), None
            keys = self.int_range(IntImm(0), total, "key_positions")
            ends = self.emit(call_op("reshape", self.as_int32(ends), ShapeExpr((batch, IntImm(1)))), "mask_end_column")
            ends = self.assume_shape(ends, (batch, IntImm(1)), "mask_end_column")
            allowed = self.emit(call_op("less", keys, ends), "before_end")
            if starts is not None:
                starts = self.emit(call_op("reshape", self.as_int32(starts), ShapeExpr((batch, IntImm(1)))), "mask_start_column")
                starts = self.assume_shape(starts, (batch, IntImm(1)), "mask_start_column")
                after = self.emit(call_op("greater_equal", keys, starts), "after_start")
                allowed = self.emit(call_op("logical_and", allowed, after), "inside_mask")
            return self.emit(call_op("reshape", allowed, ShapeExpr((batch, IntImm(1), IntImm(1), total))), "allowed_keys")
        if len(shape) in (2, 3):
            zero = self.context.constant(np.zeros((), dtype=np.dtype(dtype_of(mask))), f"{label(node)}_mask_zero")
            allowed = self.emit(call_op("greater", mask, zero), "mask_allowed")
            rows = () if len(shape) == 2 else (seq,)
            allowed = self.assume_shape(allowed, (batch, *rows, total), "mask_index")
            return self.emit(call_op("reshape", allowed, ShapeExpr((batch, IntImm(1), *(rows or (IntImm(1),)), total))),
                             "allowed_keys")
        _refuse(node, f"a {len(shape)}-d mask")

    def as_int32(self, x: Expr) -> Expr:
        return x if dtype_of(x) == "int32" else self.emit(call_op("cast", x, dtype="int32"), "mask_int32")

    def attend(self, q: Expr, k: Expr, v: Expr, scale: float, bias: Expr | None, extra: Expr | None) -> Expr:
        """``softmax(q @ k^T * scale + bias + extra) @ v`` over ``[B, N, S, H]`` tensors."""
        keys_t = self.emit(call_op("transpose", k, axes=[0, 1, 3, 2]), "keys_t")
        scores = self.emit(call_op("matmul", q, keys_t), "scores")
        scores = self.emit(call_op("multiply", scores, self.scalar(scale, scores, "scale")), "scaled_scores")
        if extra is not None:
            require_rank(self.node, extra, "attention_bias", (4,))
            extra = self.assume_shape(extra, tuple(tensor_shape(scores)), "attention_bias")
        for term, name in ((bias, "masked_scores"), (extra, "biased_scores")):
            if term is not None:
                scores = self.emit(call_op("add", scores, term), name)
        probs = self.emit(call_op("softmax", scores, axes=[3]), "attention_probs")
        return self.emit(call_op("matmul", probs, v), "attention_context")


def _scale(attrs, head_size: int) -> float:
    scale = float(attrs.get("scale", 0.0))
    return scale if scale != 0.0 else 1.0 / math.sqrt(head_size)


# Attention -------------------------------------------------------------------------------------


@converter("Attention", domain=MICROSOFT)
def convert_attention(context, node, inputs):
    """(input, weights, bias?, mask_index?, past?, attention_bias?, past_sequence_length?) ->
    output, present?: self-attention with the Q/K/V projections merged in ``weights``."""
    x, weights = inputs[:2]
    bias, mask, past = optional_input(inputs, 2), optional_input(inputs, 3), optional_input(inputs, 4)
    extra, past_length = optional_input(inputs, 5), optional_input(inputs, 6)
    attrs = context.attributes(node)
    heads = int(attrs["num_heads"])
    if attrs.get("do_rotary", 0):
        _refuse(node, "do_rotary")
    if attrs.get("past_present_share_buffer", 0) or past_length is not None:
        _refuse(node, "past_present_share_buffer (a shared past/present buffer)")
    require_rank(node, x, "input", (3,))
    width = _constant_dim(node, weights, 1, "the weights' second dim")
    sizes = [int(s) for s in attrs.get("qkv_hidden_sizes", [])] or [width // 3] * 3
    if len(sizes) != 3 or sum(sizes) != width or any(s % heads for s in sizes):
        raise NodeConversionError(
            f"Attention node '{node.name}': qkv_hidden_sizes {sizes} must be three multiples of num_heads {heads} "
            f"adding up to the weights' second dim {width}"
        )
    h = Heads(context, node)
    projected = h.emit(call_op("matmul", x, weights), "qkv")
    if bias is not None:
        projected = h.emit(call_op("add", projected, bias), "qkv_biased")
    bounds = [0, sizes[0], sizes[0] + sizes[1], width]
    q, k, v = (h.split_heads(h.slice_last(projected, bounds[i], bounds[i + 1], name), heads, name)
               for i, name in enumerate(("query", "key", "value")))
    batch, seq = tensor_shape(x)[:2]
    past_seq: PrimExpr = IntImm(0)
    if past is not None:
        require_rank(node, past, "past", (5,))
        past_seq = tensor_shape(past)[3]
        past_shape = ShapeExpr(tuple(tensor_shape(past)[1:]))
        past_k = h.emit(call_op("reshape", h.emit(strided_slice(past, [0], [IntImm(0)], [IntImm(1)]), "past_key5"), past_shape), "past_key")
        past_v = h.emit(call_op("reshape", h.emit(strided_slice(past, [0], [IntImm(1)], [IntImm(2)]), "past_value5"), past_shape), "past_value")
        k = h.emit(call_op("concat", past_k, k, axis=2), "key_all")
        v = h.emit(call_op("concat", past_v, v, axis=2), "value_all")
    total = tensor_shape(k)[2]
    filter_value = float(attrs.get("mask_filter_value", DEFAULT_MASK_FILTER_VALUE))
    mask_bias = h.mask_bias(mask, batch, seq, total, past_seq, bool(attrs.get("unidirectional", 0)), filter_value, x)
    context_heads = h.attend(q, k, v, _scale(attrs, sizes[0] // heads), mask_bias, extra)
    results = [h.merge_heads(context_heads)]
    if wanted_output(node, 1):
        if sizes[0] != sizes[2] or sizes[1] != sizes[2]:
            _refuse(node, "the present output with different Q/K/V hidden sizes")
        stacked = ShapeExpr((IntImm(1), *tensor_shape(k)))
        pair = [h.emit(call_op("reshape", t, stacked), f"present_{n}") for t, n in ((k, "key"), (v, "value"))]
        results.append(call_op("concat", *pair, axis=0))
    return results


# MultiHeadAttention ----------------------------------------------------------------------------


@converter("MultiHeadAttention", domain=MICROSOFT)
def convert_multi_head_attention(context, node, inputs):
    """(query, key?, value?, bias?, key_padding_mask?, attention_bias?, past_key?, past_value?,
    past_sequence_length?, cache_indirection?) -> output, present_key?, present_value?, qk?.

    Layouts: query ``[B, S, D]`` with key/value ``[B, L, D]`` / ``[B, L, Dv]`` (their past
    states concatenated before them), or key/value already in heads ``[B, N, L, H]`` (cross
    attention's cache), or packed K/V ``[B, L, N, 2, H]``, or packed Q/K/V ``[B, S, N, 3, H]``.
    ``bias`` (Q, K, V biases, each ``[N * H]``) is added to the projected query, key and value
    (not to keys and values given in heads)."""
    query, key, value = inputs[0], optional_input(inputs, 1), optional_input(inputs, 2)
    bias, mask, extra = optional_input(inputs, 3), optional_input(inputs, 4), optional_input(inputs, 5)
    past_key, past_value = optional_input(inputs, 6), optional_input(inputs, 7)
    if optional_input(inputs, 8) is not None:
        _refuse(node, "past_sequence_length (a shared past/present buffer)")
    if optional_input(inputs, 9) is not None:
        _refuse(node, "cache_indirection (beam search)")
    if wanted_output(node, 3):
        _refuse(node, "the qk output")
    attrs = context.attributes(node)
    heads = int(attrs["num_heads"])
    h = Heads(context, node)
    query_rank = require_rank(node, query, "query", (3, 5))
    batch, seq = tensor_shape(query)[:2]

    def biased(x: Expr, part: int, name: str) -> Expr:
        """x in ``[B, S, N, H]`` plus its part of ``bias``, then in ``[B, N, S, H]``."""
        if bias is not None:
            size = _constant_dim(node, x, 3, "the head size")
            offset = part * heads * size
            piece = h.slice_last(bias, offset, offset + heads * size, f"{name}_bias")
            piece = h.emit(call_op("reshape", piece, ShapeExpr((IntImm(heads), IntImm(size)))), f"{name}_bias_heads")
            x = h.emit(call_op("add", x, piece), f"{name}_biased")
        return h.emit(call_op("transpose", x, axes=[0, 2, 1, 3]), f"{name}_bnsh")

    def packed_part(x: Expr, index: int, name: str) -> Expr:
        """Entry ``index`` of the packed dim 3 of ``[B, L, N, k, H]``: ``[B, L, N, H]``."""
        b, length, n, _, size = tensor_shape(x)
        part = h.emit(strided_slice(x, [3], [IntImm(index)], [IntImm(index + 1)]), f"{name}_packed")
        return h.emit(call_op("reshape", part, ShapeExpr((b, length, n, size))), name)

    def in_heads(x: Expr, name: str) -> Expr:
        b, length, hidden = tensor_shape(x)
        width = _constant_dim(node, x, 2, f"the {name}'s hidden size")
        if width % heads:
            raise NodeConversionError(f"MultiHeadAttention node '{node.name}': {name} hidden size {width} is not a multiple of {heads} heads")
        return h.emit(call_op("reshape", x, ShapeExpr((b, length, IntImm(heads), IntImm(width // heads)))), f"{name}_heads")

    if query_rank == 5:
        if key is not None or value is not None:
            _refuse(node, "packed Q/K/V with separate key or value inputs")
        q, k, v = (biased(packed_part(query, i, n), i, n) for i, n in enumerate(("query", "key", "value")))
    else:
        q = biased(in_heads(query, "query"), 0, "query")
        if key is None:
            raise NodeConversionError(f"MultiHeadAttention node '{node.name}': a 3-d query needs a key input")
        key_rank = require_rank(node, key, "key", (3, 4, 5))
        if key_rank == 5:
            if value is not None:
                _refuse(node, "packed K/V with a separate value input")
            k, v = (biased(packed_part(key, i, n), i + 1, n) for i, n in ((0, "key"), (1, "value")))
        elif key_rank == 4:  # already in heads [B, N, L, H]: used as they are
            if value is None or value.struct_info.ndim != 4:
                raise NodeConversionError(f"MultiHeadAttention node '{node.name}': a key in heads needs a value in heads")
            k, v = key, value
        else:
            if value is None:
                raise NodeConversionError(f"MultiHeadAttention node '{node.name}': a 3-d key needs a value input")
            k, v = biased(in_heads(key, "key"), 1, "key"), biased(in_heads(value, "value"), 2, "value")
    past_seq: PrimExpr = IntImm(0)
    if past_key is not None or past_value is not None:
        if past_key is None or past_value is None:
            raise NodeConversionError(f"MultiHeadAttention node '{node.name}': past_key and past_value go together")
        past_seq = tensor_shape(past_key)[2]
        k = h.emit(call_op("concat", past_key, k, axis=2), "key_all")
        v = h.emit(call_op("concat", past_value, v, axis=2), "value_all")
    total = tensor_shape(k)[2]
    filter_value = float(attrs.get("mask_filter_value", DEFAULT_MASK_FILTER_VALUE))
    mask_bias = h.mask_bias(mask, batch, seq, total, past_seq, bool(attrs.get("unidirectional", 0)), filter_value, query)
    head_size = as_int(tensor_shape(q)[3])
    context_heads = h.attend(q, k, v, _scale(attrs, head_size), mask_bias, extra)
    results = [h.merge_heads(context_heads)]
    for position, state in ((1, k), (2, v)):
        if wanted_output(node, position):
            results.append(state)
        elif any(wanted_output(node, later) for later in range(position + 1, 3)):
            results.append(None)
    return results


# RotaryEmbedding -------------------------------------------------------------------------------


def gathered_cache(h: Heads, cache: Expr, position_ids: Expr | None, batch, seq, offset: PrimExpr | None, name: str) -> Expr:
    """The rows of a ``[max_position, R / 2]`` cos or sin cache for each token: ``[B or 1, S, R / 2]``.

    ``position_ids`` is ``[B, S]`` (each token's position), or ``[1]`` (the first token's
    position; the others follow), or absent with ``offset`` (a compile-time first position)."""
    if position_ids is not None and len(tensor_shape(position_ids)) == 2:
        return h.emit(call_op("take", cache, position_ids, axis=0), name)
    if position_ids is not None:
        start = h.emit(call_op("cast", position_ids, dtype="int32"), f"{name}_start") if dtype_of(position_ids) != "int32" else position_ids
        positions = h.emit(call_op("add", h.int_range(IntImm(0), seq, f"{name}_steps"), start), f"{name}_positions")
    else:
        positions = h.int_range(offset, seq, f"{name}_positions")
    rows = h.emit(call_op("take", cache, positions, axis=0), name)
    return h.emit(call_op("reshape", rows, ShapeExpr((IntImm(1), *tensor_shape(rows)))), f"{name}_rows")


def rotate(h: Heads, x: Expr, cos: Expr, sin: Expr, interleaved: bool, heads_axis: int) -> Expr:
    """``x`` in ``[B, S, N, H]`` (``heads_axis`` 2) or ``[B, N, S, H]`` (1) rotated by the
    gathered ``[B or 1, S, R / 2]`` caches (unbound)."""
    b, s, half = tensor_shape(cos)
    shape = (b, s, IntImm(1), half) if heads_axis == 2 else (b, IntImm(1), s, half)
    cos, sin = (h.emit(call_op("reshape", c, ShapeExpr(shape)), n) for c, n in ((cos, "cos_rows"), (sin, "sin_rows")))
    return call_op("rotary_embedding", x, cos, sin, interleaved=interleaved)


@converter("RotaryEmbedding", domain=MICROSOFT)
def convert_rotary_embedding(context, node, inputs):
    """(input, position_ids, cos_cache, sin_cache) -> output: ``input`` is ``[B, S, N * H]``
    (``num_heads`` given, or ``H`` twice the cache width) or ``[B, N, S, H]``; the first
    ``rotary_embedding_dim`` entries of each head (by default the cache's) are rotated."""
    x, position_ids, cos_cache, sin_cache = inputs[:4]
    attrs = context.attributes(node)
    if attrs.get("is_packed_batching", 0):
        _refuse(node, "is_packed_batching")
    if float(attrs.get("scale", 1.0)) != 1.0:
        _refuse(node, "a scale other than 1")
    h = Heads(context, node)
    rank = require_rank(node, x, "input", (3, 4))
    half = _constant_dim(node, cos_cache, 1, "the cos cache's second dim")
    rotary_dim = int(attrs.get("rotary_embedding_dim", 0)) or 2 * half
    if rotary_dim != 2 * half:
        raise NodeConversionError(
            f"RotaryEmbedding node '{node.name}': rotary_embedding_dim {rotary_dim} is not twice the cache width {half}"
        )
    interleaved = bool(attrs.get("interleaved", 0))
    if rank == 4:
        batch, _, seq, _ = tensor_shape(x)
        cos, sin = (gathered_cache(h, c, position_ids, batch, seq, None, n) for c, n in ((cos_cache, "cos"), (sin_cache, "sin")))
        return rotate(h, x, cos, sin, interleaved, heads_axis=1)
    batch, seq, hidden = tensor_shape(x)
    width = _constant_dim(node, x, 2, "the hidden size")
    heads = int(attrs.get("num_heads", 0)) or width // (2 * half)
    if width % heads:
        raise NodeConversionError(f"RotaryEmbedding node '{node.name}': hidden size {width} is not a multiple of {heads} heads")
    split = h.emit(call_op("reshape", x, ShapeExpr((batch, seq, IntImm(heads), IntImm(width // heads)))), "rotary_heads")
    cos, sin = (gathered_cache(h, c, position_ids, batch, seq, None, n) for c, n in ((cos_cache, "cos"), (sin_cache, "sin")))
    turned = h.emit(rotate(h, split, cos, sin, interleaved, heads_axis=2), "rotated")
    return call_op("reshape", turned, ShapeExpr((batch, seq, hidden)))


# GroupQueryAttention ---------------------------------------------------------------------------

GQA_REFUSED_INPUTS = {9: "position_ids", 11: "head_sink", 12: "k_scale", 13: "v_scale", 14: "q_norm_weight",
                      15: "k_norm_weight", 16: "query_seqlens"}


@converter("GroupQueryAttention", domain=MICROSOFT)
def convert_group_query_attention(context, node, inputs):
    """(query, key?, value?, past_key?, past_value?, seqlens_k, total_sequence_length, cos_cache?,
    sin_cache?, position_ids?, attention_bias?, ...) -> output, present_key, present_value.

    ``num_heads`` query heads share ``kv_num_heads`` key/value heads.  Batch entry ``b`` holds
    ``seqlens_k[b] + 1`` tokens after this step; its new tokens are at positions
    ``past_b .. past_b + S - 1`` with ``past_b = seqlens_k[b] + 1 - S`` (0 on the first prompt,
    where ``total_sequence_length`` is ``S``), and are written into the present cache there,
    after the first ``past_b`` rows of the past cache: ``ragged_concat`` (``ops/kv_cache.py``),
    which ``place_kv_caches`` turns into a cache written in place as it does a concat; ragged
    batches are right too.  The attention is written as transformers writes it (keys and values
    repeated per query head, ``softmax(q @ k^T * scale + mask) @ v``), which ``fuse_attention``
    makes one kernel reading the present keys and values.  Causal (``causal=1``, the default) with an
    optional ``local_window_size``; ``do_rotary`` rotates the new queries and keys at their
    positions (the caches give ``cos`` and ``sin``); ``softcap`` > 0 caps the scaled scores at
    ``softcap * tanh(scores / softcap)`` before the mask (Gemma 2)."""
    attrs = context.attributes(node)
    for position, what in GQA_REFUSED_INPUTS.items():
        if optional_input(inputs, position) is not None:
            _refuse(node, f"the {what} input")
    for name, default in (("smooth_softmax", 0), ("qk_output", 0), ("sliding_window_cache", 0)):
        if attrs.get(name, default) not in (default, None):
            _refuse(node, f"{name}={attrs[name]}")
    for name in ("k_quant_type", "v_quant_type"):
        value = attrs.get(name, b"NONE")
        if (value.decode() if isinstance(value, bytes) else str(value)) != "NONE":
            _refuse(node, f"{name} (a quantized cache)")
    if wanted_output(node, 3):
        _refuse(node, "the output_qk output")
    query, key, value = inputs[0], optional_input(inputs, 1), optional_input(inputs, 2)
    past_key, past_value = optional_input(inputs, 3), optional_input(inputs, 4)
    seqlens, total_length = inputs[5], inputs[6]
    cos_cache, sin_cache, extra = optional_input(inputs, 7), optional_input(inputs, 8), optional_input(inputs, 10)
    heads, kv_heads = int(attrs["num_heads"]), int(attrs["kv_num_heads"])
    if heads % kv_heads:
        raise NodeConversionError(f"GroupQueryAttention node '{node.name}': num_heads {heads} is not a multiple of kv_num_heads {kv_heads}")
    causal = bool(attrs.get("causal", 1))
    window = int(attrs.get("local_window_size", -1))
    softcap = float(attrs.get("softcap", 0.0))
    if softcap > 0 and extra is not None:
        _refuse(node, "softcap with an attention_bias input")
    h = Heads(context, node)
    require_rank(node, query, "query", (3,))
    batch, seq, width = tensor_shape(query)
    width = _constant_dim(node, query, 2, "the query's hidden size")
    if key is None:  # packed: query holds Q, K and V
        head_size = width // (heads + 2 * kv_heads)
        q_width, kv_width = heads * head_size, kv_heads * head_size
        query, key, value = (h.slice_last(query, begin, end, name) for begin, end, name in (
            (0, q_width, "query"), (q_width, q_width + kv_width, "key"), (q_width + kv_width, width, "value")))
    else:
        head_size = width // heads
    emit = h.emit

    def bsnh(x: Expr, count: int, name: str) -> Expr:
        return emit(call_op("reshape", x, ShapeExpr((batch, seq, IntImm(count), IntImm(head_size)))), f"{name}_heads")

    q, k, v = bsnh(query, heads, "query"), bsnh(key, kv_heads, "key"), bsnh(value, kv_heads, "value")
    # each entry's past length: seqlens_k + 1 - S, or 0 on the first prompt (total_sequence_length == S)
    seq_value = h.int_range(seq, IntImm(1), "sequence_length")
    if seqlens.struct_info.ndim != 1:  # onnxruntime reads batch_size values whatever the shape ([B, 1] from a ReduceSum)
        seqlens = emit(call_op("reshape", seqlens, ShapeExpr((IntImm(-1),))), "seqlens_flat")
    totals = emit(call_op("add", h.as_int32(seqlens), h.int_scalar(1)), "entry_totals")
    totals = h.assume_shape(totals, (batch,), "seqlens_k")
    first = emit(call_op("equal", emit(call_op("reshape", h.as_int32(total_length), ShapeExpr((IntImm(1),))), "total_length"),
                         seq_value), "first_prompt")
    past_lengths = emit(call_op("where", first, h.int_scalar(0), emit(call_op("subtract", totals, seq_value), "entry_past")),
                        "past_lengths")
    past_column = emit(call_op("reshape", past_lengths, ShapeExpr((batch, IntImm(1)))), "past_column")
    positions = emit(call_op("add", past_column, h.int_range(IntImm(0), seq, "steps")), "token_positions")  # [B, S]
    if attrs.get("do_rotary", 0):
        if cos_cache is None or sin_cache is None:
            raise NodeConversionError(f"GroupQueryAttention node '{node.name}': do_rotary needs cos_cache and sin_cache")
        cos, sin = (gathered_cache(h, c, positions, batch, seq, None, n) for c, n in ((cos_cache, "cos"), (sin_cache, "sin")))
        interleaved = bool(attrs.get("rotary_interleaved", 0))
        q = emit(rotate(h, q, cos, sin, interleaved, heads_axis=2), "query_rotated")
        k = emit(rotate(h, k, cos, sin, interleaved, heads_axis=2), "key_rotated")
    q, k, v = (emit(call_op("transpose", t, axes=[0, 2, 1, 3]), f"{n}_bnsh") for t, n in ((q, "query"), (k, "key"), (v, "value")))
    past_seq: PrimExpr = IntImm(0)
    present_k, present_v = k, v
    if past_key is not None and past_value is not None:  # entry b's new rows at row past_b (ops/kv_cache.py)
        past_seq = tensor_shape(past_key)[2]
        present_k = emit(call_op("ragged_concat", past_key, k, past_lengths, axis=2), "present_key")
        present_v = emit(call_op("ragged_concat", past_value, v, past_lengths, axis=2), "present_value")
    total = simplify(past_seq + seq)
    # visible keys: j < the entry's total, and j <= the query's position (causal), within the window
    keys = h.int_range(IntImm(0), total, "key_positions")
    totals_column = emit(call_op("reshape", totals, ShapeExpr((batch, IntImm(1), IntImm(1)))), "total_column")
    visible = emit(call_op("less", keys, totals_column), "filled_keys")  # [B, 1, T]
    query_positions = emit(call_op("reshape", positions, ShapeExpr((batch, seq, IntImm(1)))), "query_positions")
    if causal:
        visible = emit(call_op("logical_and", visible, emit(call_op("less_equal", keys, query_positions), "causal")), "visible")
    if window > 0:
        start = emit(call_op("subtract", query_positions, h.int_scalar(window)), "window_start")
        visible = emit(call_op("logical_and", visible, emit(call_op("greater", keys, start), "recent")), "visible_window")
    bias = emit(call_op("where", visible, h.scalar(0.0, query, "zero"), h.lowest(query, "lowest")), "mask_bias")
    rows = tensor_shape(bias)[1]  # S, or 1 when no key depends on the query (not causal, no window)
    bias = emit(call_op("reshape", bias, ShapeExpr((batch, IntImm(1), rows, total))), "mask_bias_heads")
    if extra is not None:  # one additive mask: the attention bias plus the visibility bias
        require_rank(node, extra, "attention_bias", (4,))
        extra = h.assume_shape(extra, (batch, IntImm(heads), seq, total), "attention_bias")
        bias = emit(call_op("add", bias, extra), "attention_mask_bias")
    keys_all, values_all = (repeat_kv(h, t, heads // kv_heads, n) for t, n in ((present_k, "key"), (present_v, "value")))
    keys_t = emit(call_op("transpose", keys_all, axes=[0, 1, 3, 2]), "keys_t")
    scores = emit(call_op("matmul", q, keys_t), "scores")
    scores = emit(call_op("multiply", scores, h.scalar(_scale(attrs, head_size), scores, "scale")), "scaled_scores")
    if softcap > 0:  # Gemma's logit soft-capping: softcap * tanh(scores / softcap), before the mask
        cap = h.scalar(softcap, scores, "softcap")
        capped = emit(call_op("tanh", emit(call_op("divide", scores, cap), "scores_over_cap")), "capped_scores")
        scores = emit(call_op("multiply", capped, cap), "softcapped_scores")
    scores = emit(call_op("add", scores, bias), "masked_scores")
    probs = emit(call_op("softmax", scores, axes=[3]), "attention_probs")
    context_heads = emit(call_op("matmul", probs, values_all), "attention_context")
    return [h.merge_heads(context_heads), present_k, present_v]


def repeat_kv(h: Heads, x: Expr, group: int, name: str) -> Expr:
    """``[B, kv, T, H]`` -> ``[B, kv * group, T, H]``, each key / value head repeated for the
    ``group`` query heads that read it, as transformers' ``repeat_kv`` writes it (which
    ``fuse_attention`` sees through: the fused attention reads ``x`` itself)."""
    if group == 1:
        return x
    batch, kv_heads, total, size = tensor_shape(x)
    split = h.emit(call_op("reshape", x, ShapeExpr((batch, kv_heads, IntImm(1), total, size))), f"{name}_split")
    repeated = h.emit(call_op("broadcast_to", split, ShapeExpr((batch, kv_heads, IntImm(group), total, size))),
                      f"{name}_repeated")
    return h.emit(call_op("reshape", repeated, ShapeExpr((batch, simplify(kv_heads * group), total, size))), f"{name}_heads")
