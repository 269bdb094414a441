"""Fused scaled dot-product attention: ``attention(q, k, v, [mask], scale=1.0, causal=False, zero_nan_rows=False)``.

``softmax(q @ k^T * scale + mask, axis=-1) @ v`` for ``q[*batch, Sq, D]``, ``k[*batch, Sk, D]``,
``v[*batch, Sk, Dv]`` (the same batch dims: ``[batch, heads]`` for the usual layout; k and v
may have 1 where q has a dim, or a constant dividing q's constant dim: a key / value head
shared by several query heads, query head ``h`` reading head ``h // (heads / kv_heads)`` as
transformers' ``repeat_kv`` orders them), and an
optional additive float ``mask`` that broadcasts to the scores ``[*batch, Sq, Sk]`` (fewer
dims are aligned from the right; each dim is 1 or the scores' dim).  ``causal`` hides key
``j`` from query ``i`` when ``j > i + Sk - Sq``, as an additive ``-inf`` would.  A row whose
scores are all ``-inf`` is NaN, as the unfused softmax gives; with ``zero_nan_rows`` a row
whose weights are NaN is 0 (``where(isnan(weights), 0, weights)`` before the value product,
as torch exports ``scaled_dot_product_attention``; ``relaxweb/library/attention.py``).

A last argument ``prim(L)`` reads only the first ``L`` keys and values of each head: k and v
are then ``[*batch, R, D]`` buffers of ``R >= L`` rows (a KV cache of capacity ``R`` whose
valid prefix is ``L`` long), read in place, and ``Sk`` is ``L``.

The frontend does not write it: ``passes/fuse_attention.py`` rewrites the subgraph the
exporters write (matmul, scale, mask add, softmax, matmul) into it.

Deduction: the result is ``[*batch, Sq, Dv]``; the batch dims, D and Sk must agree (or are
checked at run time), the mask's dims are 1 or the scores'.

Legalization: one library kernel (``relaxweb/library/attention.py``: tiled over the keys with
the online softmax, so the scores are never stored); D and Dv must be constants.
"""

from __future__ import annotations

import numpy as np

from ..ir.expr import Call, tensor_dtype, tensor_shape
from ..ir.op_registry import DeductionError, register_op
from ..ir.struct_info import PrimStructInfo, TensorStructInfo
from ..ir.symbolic import PrimExpr, as_int, format_expr, prove_less
from ..library.attention import attention_kernel, attention_reference, key_tile, kv_group_size
from .common import DimOf, needs_known_shapes, require_equal, require_float, require_tensor, same_dtype

NAMES = ("q", "k", "v", "mask")


def key_length_of(args) -> PrimExpr | None:
    """``L`` of an attention call's last argument ``prim(L)``, None when it has none."""
    info = args[-1].struct_info if args else None
    return info.value if isinstance(info, PrimStructInfo) else None


def deduce_attention(args, attrs) -> TensorStructInfo:
    key_length = key_length_of(args)
    if key_length is not None:
        args = args[:-1]
    if len(args) not in (3, 4):
        raise DeductionError(f"attention: takes 3 or 4 arguments (q, k, v, [mask]) and a key length, got {len(args)}")
    infos = [require_tensor(arg, "attention", position) for position, arg in enumerate(args)]
    for position, info in enumerate(infos):
        require_float("attention", info, position)
    dtype = same_dtype("attention", infos)
    if (not isinstance(attrs.get("causal", False), bool) or not isinstance(attrs.get("scale", 1.0), float)
            or not isinstance(attrs.get("zero_nan_rows", False), bool)):
        raise DeductionError(f"attention: scale must be a float, causal and zero_nan_rows bools, got {dict(attrs)}")
    q, k, v = infos[:3]
    rank = next((info.ndim for info in infos[:3] if info.ndim != -1), -1)
    if any(info.shape is None for info in infos):
        return TensorStructInfo(None, dtype, rank)
    if len(q.shape) < 2 or not len(q.shape) == len(k.shape) == len(v.shape):
        raise DeductionError(f"attention: q, k and v must have the same rank (2 or more), got {q}, {k}, {v}")
    *batch, query_length, head = q.shape
    if key_length is None:
        key_length = k.shape[-2]
    elif prove_less(k.shape[-2], key_length):
        raise DeductionError(f"attention: {format_expr(key_length)} keys, but k has {format_expr(k.shape[-2])} rows")
    for dim, (a, b) in enumerate(zip(k.shape[:-2], v.shape[:-2])):
        require_equal(DimOf(b, 2, dim), DimOf(a, 1, dim), (
            f"attention: dim {dim} of v is {format_expr(b)}, expected k's {format_expr(a)}"))
    for position, info in ((1, k), (2, v)):
        for dim, (a, b) in enumerate(zip(info.shape[:-2], batch)):
            if kv_group_size(a, b) is None:  # else a key / value head shared by query heads along this dim
                require_equal(DimOf(a, position, dim), DimOf(b, 0, dim), (
                    f"attention: dim {dim} of {NAMES[position]} is {format_expr(a)}, expected 1, "
                    f"{format_expr(b)} or a divisor of it"))
    require_equal(DimOf(k.shape[-1], 1, len(batch) + 1), DimOf(head, 0, len(batch) + 1), (
        f"attention: dim {len(batch) + 1} of k is {format_expr(k.shape[-1])}, expected {format_expr(head)}"))
    require_equal(DimOf(v.shape[-2], 2, len(batch)), DimOf(k.shape[-2], 1, len(batch)), (
        f"attention: dim {len(batch)} of v is {format_expr(v.shape[-2])}, expected {format_expr(k.shape[-2])}"))
    if len(infos) == 4:
        scores = (*batch, query_length, key_length)
        mask = infos[3].shape
        if len(mask) > len(scores):
            raise DeductionError(f"attention: the mask has {len(mask)} dims, the scores {len(scores)}")
        offset = len(scores) - len(mask)
        for dim, extent in enumerate(mask):
            if as_int(extent) != 1:
                require_equal(DimOf(extent, 3, dim), DimOf(scores[offset + dim], 0 if offset + dim < len(scores) - 1 else 1,
                                                           offset + dim),
                              f"attention: dim {dim} of the mask is {format_expr(extent)}, expected 1 or "
                              f"{format_expr(scores[offset + dim])}")
    return TensorStructInfo((*batch, query_length, v.shape[-1]), dtype)


def legalize_attention(context, call: Call):
    key_length = key_length_of(call.args)
    args = call.args[:-1] if key_length is not None else call.args
    q, k, v = args[:3]
    *batch, query_length, head = tensor_shape(q)
    value_head = tensor_shape(v)[-1]
    head, value_head = as_int(head), as_int(value_head)
    if head is None or value_head is None or key_tile(head, value_head) < 1:
        raise DeductionError(f"attention: the head sizes must be constants with a key and a value within 16 KiB, got "
                             f"{format_expr(tensor_shape(q)[-1])} and {format_expr(tensor_shape(v)[-1])}")
    mask_shape = tuple(tensor_shape(args[3])) if len(args) == 4 else None
    kv_batch = tuple(tensor_shape(k)[:-2])
    shared = any(kv_group_size(a, b) != 1 for a, b in zip(kv_batch, batch))
    rows = tensor_shape(k)[-2]
    kernel = attention_kernel("attention", tuple(batch), query_length, rows if key_length is None else key_length, head,
                              value_head, mask_shape, float(call.attrs.get("scale", 1.0)),
                              bool(call.attrs.get("causal", False)), tensor_dtype(q), kv_batch if shared else None,
                              None if key_length is None else rows, bool(call.attrs.get("zero_nan_rows", False)))
    return context.call_library(kernel, tuple(args))


def reference_attention(arrays, attrs):
    tensors = list(arrays)
    if len(tensors) > 3 and np.asarray(tensors[-1]).dtype.kind in "iu":  # prim(L): the first L keys and values
        length = int(tensors.pop())
        tensors[1:3] = [t[..., :length, :] for t in tensors[1:3]]
    return attention_reference(tensors, scale=float(attrs.get("scale", 1.0)), causal=bool(attrs.get("causal", False)),
                               zero_nan_rows=bool(attrs.get("zero_nan_rows", False)))


register_op("attention", deduce=deduce_attention, legalize=needs_known_shapes(legalize_attention),
            reference=reference_attention)
