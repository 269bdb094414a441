"""A paged KV cache (``passes/page_kv_caches.py``): ``paged_kv_write`` and ``paged_attention``.

A layer's keys (or values) live in a **pool** ``[pages, kv_heads, page_size, head]`` shared
by every sequence; each token of a run carries its position and its sequence's page table
(``relaxweb/library/paged_kv.py`` states the layout and the kernels)::

    pool_k = paged_kv_write(past_k, new_k, page_table, positions)   # past_k's storage, new rows written
    out = paged_attention(q, pool_k, pool_v, page_table, positions, scale=s)

* ``paged_kv_write(pool, new [B, H, S, D], page_table [B, S, M] int32, positions [B, S] int32)``:
  the pool with each token's rows written at its position; it lives in ``pool``'s storage (a
  view op, as ``kv_cache_write`` is), which ``plan_memory`` fills with the in-place library
  kernel.
* ``paged_attention(q [B, Hq, S, D], key_pool, value_pool, page_table, positions, scale=s)``:
  causal attention of each token over positions ``0 .. its position`` of its own sequence.
"""

from __future__ import annotations

import numpy as np

from ..ir.expr import Call, tensor_dtype, tensor_shape
from ..ir.op_registry import DeductionError, register_op
from ..ir.struct_info import TensorStructInfo
from ..ir.symbolic import IntImm, PrimExpr, as_int, format_expr
from ..library.paged_kv import paged_attention_kernel, paged_kv_write_kernel
from .common import DimOf, needs_known_shapes, require_equal, require_float, require_tensor, same_dtype


def _constant_dims(op: str, info: TensorStructInfo, what: str, rank: int) -> tuple[int, ...]:
    if info.shape is None or len(info.shape) != rank or any(as_int(d) is None for d in info.shape):
        raise DeductionError(f"{op}: {what} must have {rank} constant dims, got {info}")
    return tuple(as_int(d) for d in info.shape)


def _tokens(op: str, args, first: int, batch: PrimExpr, length: PrimExpr, pages: int) -> int:
    """Checks the page table ``[batch, length, M]`` and positions ``[batch, length]`` (int32) at
    ``args[first]``, ``args[first + 1]``; returns M."""
    table = require_tensor(args[first], op, first)
    positions = require_tensor(args[first + 1], op, first + 1)
    if table.dtype != "int32" or positions.dtype != "int32":
        raise DeductionError(f"{op}: the page table and the positions must be int32, got {table.dtype} and "
                             f"{positions.dtype}")
    if table.shape is None or len(table.shape) != 3 or positions.shape is None or len(positions.shape) != 2:
        raise DeductionError(f"{op}: the page table must be [batch, length, pages per sequence] and the positions "
                             f"[batch, length], got {table} and {positions}")
    for position, info in ((first, table), (first + 1, positions)):
        require_equal(DimOf(info.shape[0], position, 0), DimOf(batch, 1, 0),
                      f"{op}: {format_expr(info.shape[0])} batch entries, expected {format_expr(batch)}")
        require_equal(DimOf(info.shape[1], position, 1), DimOf(length, 1, 2),
                      f"{op}: {format_expr(info.shape[1])} tokens, expected {format_expr(length)}")
    table_pages = as_int(table.shape[2])
    if table_pages is None or table_pages < 1:
        raise DeductionError(f"{op}: the page table's pages per sequence must be a positive constant, got "
                             f"{format_expr(table.shape[2])}")
    return table_pages


def deduce_paged_kv_write(args, attrs) -> TensorStructInfo:
    if len(args) != 4:
        raise DeductionError(f"paged_kv_write: takes the pool, the new rows, the page table and the positions, "
                             f"got {len(args)} arguments")
    pool, new = (require_tensor(arg, "paged_kv_write", position) for position, arg in enumerate(args[:2]))
    same_dtype("paged_kv_write", [pool, new])
    pages, heads, page_size, head = _constant_dims("paged_kv_write", pool, "the pool", 4)
    if new.shape is None or len(new.shape) != 4:
        raise DeductionError(f"paged_kv_write: the new rows must be [batch, heads, length, head], got {new}")
    for dim, expected in ((1, heads), (3, head)):
        if as_int(new.shape[dim]) != expected:
            raise DeductionError(f"paged_kv_write: dim {dim} of the new rows is {format_expr(new.shape[dim])}, "
                                 f"expected the pool's {expected}")
    _tokens("paged_kv_write", args, 2, new.shape[0], new.shape[2], pages)
    return pool


def reference_paged_kv_write(arrays, attrs):
    pool, new, table, positions = arrays
    kernel = _write_kernel_of(pool.shape, new.shape, table.shape[2], pool.dtype.name)
    out = np.array(pool, copy=True)
    kernel.reference([new, table, positions], out, {})
    return out


def _write_kernel_of(pool_shape, new_shape, table_pages: int, dtype: str):
    pages, heads, page_size, head = (_number(d) for d in pool_shape)
    return paged_kv_write_kernel("paged_kv_write", _dim(new_shape[0]), heads, _dim(new_shape[2]), head, pages,
                                 page_size, _number(table_pages), dtype)


def paged_writer(call: Call):
    """The in-place kernel of a ``paged_kv_write`` call (``plan_memory`` calls it into the pool's storage)."""
    pool, new, table = call.args[:3]
    return _write_kernel_of(tensor_shape(pool), tensor_shape(new), tensor_shape(table)[2], tensor_dtype(pool))


def deduce_paged_attention(args, attrs) -> TensorStructInfo:
    if len(args) != 5:
        raise DeductionError(f"paged_attention: takes q, the key and value pools, the page table and the positions, "
                             f"got {len(args)} arguments")
    infos = [require_tensor(arg, "paged_attention", position) for position, arg in enumerate(args[:3])]
    for position, info in enumerate(infos):
        require_float("paged_attention", info, position)
    dtype = same_dtype("paged_attention", infos)
    if not isinstance(attrs.get("scale", 1.0), float):
        raise DeductionError(f"paged_attention: scale must be a float, got {attrs.get('scale')!r}")
    q, key, value = infos
    if q.shape is None or len(q.shape) != 4 or as_int(q.shape[1]) is None or as_int(q.shape[3]) is None:
        raise DeductionError(f"paged_attention: q must be [batch, heads, length, head] with constant heads and "
                             f"head size, got {q}")
    key_dims = _constant_dims("paged_attention", key, "the key pool", 4)
    value_dims = _constant_dims("paged_attention", value, "the value pool", 4)
    if key_dims[:3] != value_dims[:3] or key_dims[3] != as_int(q.shape[3]):
        raise DeductionError(f"paged_attention: pools {key} and {value} do not hold q's {format_expr(q.shape[3])}-wide "
                             "keys in the same pages")
    if as_int(q.shape[1]) % key_dims[1]:
        raise DeductionError(f"paged_attention: {format_expr(q.shape[1])} query heads do not share {key_dims[1]} key / "
                             "value heads evenly")
    _tokens("paged_attention", args, 3, q.shape[0], q.shape[2], key_dims[0])
    return TensorStructInfo((*q.shape[:3], value_dims[3]), dtype)


def _attention_kernel_of(q_shape, key_shape, value_shape, table_pages, scale: float, dtype: str):
    """The library kernel of a paged attention over these shapes (numbers or constant dims;
    batch and length may be symbolic)."""
    batch, heads, length, head = q_shape
    pages, kv_heads, page_size, _ = (_number(d) for d in key_shape)
    return paged_attention_kernel("paged_attention", _dim(batch), _number(heads), kv_heads, _dim(length), _number(head),
                                  _number(value_shape[3]), pages, page_size, _number(table_pages), scale, dtype)


def _number(dim) -> int:
    return int(dim) if isinstance(dim, (int, np.integer)) else int(as_int(dim))


def _dim(dim) -> PrimExpr:
    return IntImm(int(dim)) if isinstance(dim, (int, np.integer)) else dim


def reference_paged_attention(arrays, attrs):
    q, key, value, table, positions = arrays
    kernel = _attention_kernel_of(q.shape, key.shape, value.shape, table.shape[2], float(attrs.get("scale", 1.0)),
                                  q.dtype.name)
    return kernel.reference([q, key, value, table, positions])


def legalize_paged_attention(context, call: Call):
    q, key, value, table, _ = call.args
    kernel = _attention_kernel_of(tensor_shape(q), tensor_shape(key), tensor_shape(value),
                                  as_int(tensor_shape(table)[2]), float(call.attrs.get("scale", 1.0)), tensor_dtype(q))
    return context.call_library(kernel, tuple(call.args))


def kept_for_plan_memory(context, call: Call) -> Call:
    """The legalization of ``paged_kv_write``: the call itself (``plan_memory`` lowers it)."""
    return call


register_op("paged_kv_write", deduce=deduce_paged_kv_write, reference=reference_paged_kv_write,
            legalize=kept_for_plan_memory, view=True)
register_op("paged_attention", deduce=deduce_paged_attention, reference=reference_paged_attention,
            legalize=needs_known_shapes(legalize_paged_attention))
