"""Rotary positional embedding (RoPE): ``rotary_embedding(x, cos, sin, interleaved=False)``.

``x`` is ``[..., H]`` (the last dim one head); ``cos`` and ``sin`` are ``[..., R / 2]``, the
cosines and sines of each rotated pair at each position, already gathered by position and
broadcast against ``x``'s leading dims (``[B, S, 1, R / 2]`` for ``x`` in ``[B, S, N, H]``).
The first ``R`` entries of the head are rotated pairwise and the rest pass through:

- ``interleaved=False`` (the pairs are the two halves, ``x[j]`` and ``x[j + R / 2]``):
  ``out[j] = x[j] * cos[j] - x[j + R/2] * sin[j]`` and
  ``out[j + R/2] = x[j + R/2] * cos[j] + x[j] * sin[j]``;
- ``interleaved=True`` (the pairs are neighbours, ``x[2j]`` and ``x[2j + 1]``): the same with
  ``x[2j]`` and ``x[2j + 1]``.

This is onnxruntime's RotaryEmbedding (and GroupQueryAttention's ``do_rotary``) and ONNX's
RotaryEmbedding; the frontend gathers the caches by position ids.

Deduction: ``x``'s annotation; ``cos`` and ``sin`` must have the same annotation, a last dim
with ``2 * cos.shape[-1] <= H``, and leading dims that broadcast to ``x``'s.

Legalization: one elementwise program; the partner of each entry and its cos/sin entry are
index arithmetic (``(j + R/2) % R``, ``j % (R/2)``), so every load stays in range and the
pass-through entries need no branch of their own beyond a select.
"""

from __future__ import annotations

import numpy as np

from ..ir.expr import Call
from ..ir.op_registry import DeductionError, register_op
from ..ir.struct_info import TensorStructInfo
from ..ir.symbolic import as_int, format_expr, prove_equal, prove_less_equal, simplify
from ..ir.tir import IndexValue, Load, select
from .common import (
    broadcast_indices, broadcast_shapes, expect_args, make_program, needs_known_shapes, require_float,
    require_tensor, same_dtype,
)


def deduce_rotary_embedding(args, attrs) -> TensorStructInfo:
    expect_args("rotary_embedding", args, 3)
    x, cos, sin = (require_tensor(arg, "rotary_embedding", i) for i, arg in enumerate(args))
    same_dtype("rotary_embedding", [x, cos, sin])
    require_float("rotary_embedding", x)
    if x.shape is None or cos.shape is None or sin.shape is None:
        return x
    if len(cos.shape) != len(sin.shape) or not all(prove_equal(a, b) for a, b in zip(cos.shape, sin.shape)):
        raise DeductionError(f"rotary_embedding: cos {cos} and sin {sin} must have the same shape")
    if not x.shape or not cos.shape:
        raise DeductionError("rotary_embedding: x and cos need at least one dim (the head, the rotated pairs)")
    head, half = x.shape[-1], cos.shape[-1]
    if as_int(half) is None or not prove_less_equal(simplify(half * 2), head):
        raise DeductionError(
            f"rotary_embedding: cos has {format_expr(half)} pairs, which must be a constant with "
            f"2 * pairs <= the head size {format_expr(head)}"
        )
    leading = broadcast_shapes("rotary_embedding", [x.shape[:-1], cos.shape[:-1]], scope="the leading dims")
    if len(leading) != len(x.shape) - 1 or not all(prove_equal(a, b) for a, b in zip(leading, x.shape[:-1])):
        raise DeductionError(f"rotary_embedding: cos {cos} does not broadcast to the leading dims of x {x}")
    return x


def legalize_rotary_embedding(context, call: Call):
    info = call.struct_info
    interleaved = bool(call.attrs.get("interleaved", False))

    def body(axes, buffers):
        source, cos, sin = buffers
        head = source.shape[-1]
        half = cos.shape[-1]
        rotated = simplify(half * 2)
        j = axes[-1]
        if interleaved:
            pair = (j // 2) % half
            partner = (j + 1 - (j % 2) * 2) % head
            first = IndexValue(j % 2).eq(0)
        else:
            pair = j % half
            partner = (j + half) % rotated
            first = IndexValue(j).lt(IndexValue(half))
        leading = broadcast_indices(cos.shape[:-1], axes[:-1])
        c = Load(cos, (*leading, simplify(pair)))
        s = Load(sin, (*leading, simplify(pair)))
        value = Load(source, axes)
        other = Load(source, (*axes[:-1], simplify(partner)))
        turned = select(first, value * c - other * s, value * c + other * s)
        return select(IndexValue(j).lt(IndexValue(rotated)), turned, value)

    return context.call_tir(make_program("rotary_embedding", call.args, info.shape, info.dtype, body), call.args)


def rotary_embedding_reference(arrays, attrs):
    x, cos, sin = arrays
    compute = np.float64 if x.dtype == np.float64 else np.float32
    half = cos.shape[-1]
    values = x.astype(compute)
    rotated, passed = values[..., : 2 * half], values[..., 2 * half:]
    cos, sin = cos.astype(compute), sin.astype(compute)
    if attrs.get("interleaved", False):
        first, second = rotated[..., 0::2], rotated[..., 1::2]
        turned = np.stack([first * cos - second * sin, second * cos + first * sin], axis=-1)
        turned = turned.reshape(turned.shape[:-2] + (2 * half,))
    else:
        first, second = rotated[..., :half], rotated[..., half:]
        turned = np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
    return np.concatenate([turned, passed], axis=-1).astype(x.dtype)


register_op("rotary_embedding", deduce=deduce_rotary_embedding, legalize=needs_known_shapes(legalize_rotary_embedding),
            reference=rotary_embedding_reference)
