"""A decoder's KV cache in one buffer: ``kv_cache_write`` and ``kv_cache_view``.

``passes/place_kv_caches.py`` writes them where a model's output is ``concat(past, new)`` of
its input ``past`` along a symbolic past length (``present = concat(past_key_values.0.key,
key, axis=2)``): the cache is ``past`` stored with ``capacity`` rows along that axis, so a
decode step writes only its new rows and reads the rest in place.

* ``kv_cache_write(past, new, axis=a, capacity=C)``: the cache ``[..., C, ...]`` whose first
  ``p + s`` rows along ``a`` are ``concat(past [.., p, ..], new [.., s, ..])``; the rows past
  them are unspecified (zeros in the reference).  It lives in ``past``'s storage (a *view*
  op: no storage of its own); ``plan_memory`` lowers it to the in-place library kernel of
  ``relaxweb/library/kv_cache.py``, which writes ``new`` at row ``p``.
* ``kv_cache_view(cache, prim(L), axis=a)``: the first ``L`` rows of the cache along ``a``
  (``present``), in the cache's storage and layout (rows ``C`` apart): a view, read by the
  runtimes as such; ``attention`` reads the cache itself with ``prim(L)``.

Both stay calls through legalization; they exist only on the way to a bundle whose
manifest lists the caches (``docs/bundle-format.md``).
"""

from __future__ import annotations

import numpy as np

from ..ir.expr import Call
from ..ir.library_kernel import LibraryKernel
from ..ir.op_registry import DeductionError, register_op
from ..ir.struct_info import PrimStructInfo, TensorStructInfo
from ..ir.symbolic import IntImm, format_expr, prove_less
from ..library.kv_cache import kv_cache_write_kernel
from .common import DimOf, require_equal, require_tensor, same_dtype


def _axis(attrs, rank: int, op: str) -> int:
    axis = attrs.get("axis")
    if not isinstance(axis, int) or not 0 <= axis < rank:
        raise DeductionError(f"{op}: axis must be a dimension of the cache (0 .. {rank - 1}), got {axis!r}")
    return axis


def deduce_kv_cache_write(args, attrs) -> TensorStructInfo:
    if len(args) != 2:
        raise DeductionError(f"kv_cache_write: takes the past and the new rows, got {len(args)} arguments")
    past, new = (require_tensor(arg, "kv_cache_write", position) for position, arg in enumerate(args))
    dtype = same_dtype("kv_cache_write", [past, new])
    if past.shape is None or new.shape is None or len(past.shape) != len(new.shape):
        raise DeductionError(f"kv_cache_write: past and new must have known shapes of one rank, got {past} and {new}")
    axis = _axis(attrs, len(past.shape), "kv_cache_write")
    capacity = attrs.get("capacity")
    if not isinstance(capacity, int) or capacity < 1:
        raise DeductionError(f"kv_cache_write: capacity must be a positive integer, got {capacity!r}")
    for dim, (a, b) in enumerate(zip(past.shape, new.shape)):
        if dim != axis:
            require_equal(DimOf(b, 1, dim), DimOf(a, 0, dim),
                          f"kv_cache_write: dim {dim} of new is {format_expr(b)}, expected past's {format_expr(a)}")
    if prove_less(IntImm(capacity), past.shape[axis] + new.shape[axis]):
        raise DeductionError(f"kv_cache_write: {format_expr(past.shape[axis] + new.shape[axis])} rows do not fit "
                             f"a capacity of {capacity}")
    return TensorStructInfo((*past.shape[:axis], IntImm(capacity), *past.shape[axis + 1:]), dtype)


def reference_kv_cache_write(arrays, attrs):
    past, new = arrays
    axis, capacity = attrs["axis"], attrs["capacity"]
    rows = past.shape[axis] + new.shape[axis]
    if rows > capacity:
        raise DeductionError(f"kv_cache_write: {rows} rows do not fit a capacity of {capacity}")
    cache = np.zeros((*past.shape[:axis], capacity, *past.shape[axis + 1:]), past.dtype)
    cache[(slice(None),) * axis + (slice(0, rows),)] = np.concatenate([past, new], axis=axis)
    return cache


def deduce_kv_cache_view(args, attrs) -> TensorStructInfo:
    if len(args) != 2 or not isinstance(args[1].struct_info, PrimStructInfo) or args[1].struct_info.value is None:
        raise DeductionError("kv_cache_view: takes the cache and prim(length)")
    cache = require_tensor(args[0], "kv_cache_view", 0)
    if cache.shape is None:
        raise DeductionError(f"kv_cache_view: the cache must have a known shape, got {cache}")
    axis = _axis(attrs, len(cache.shape), "kv_cache_view")
    length = args[1].struct_info.value
    if prove_less(cache.shape[axis], length):
        raise DeductionError(f"kv_cache_view: {format_expr(length)} rows of a cache of {format_expr(cache.shape[axis])}")
    return TensorStructInfo((*cache.shape[:axis], length, *cache.shape[axis + 1:]), cache.dtype)


def reference_kv_cache_view(arrays, attrs):
    cache, length = arrays
    return np.ascontiguousarray(cache[(slice(None),) * attrs["axis"] + (slice(0, int(length)),)])


#: The size variable of the row where a cache write starts (the past length), bound at the call site.
CACHE_OFFSET = "offset_"


def cache_writer(new: TensorStructInfo, axis: int, capacity: int) -> LibraryKernel:
    """The in-place kernel that writes ``new`` at row ``offset_`` along ``axis`` of a cache of
    ``capacity`` rows (``plan_memory`` calls it into the cache's storage)."""
    shape = new.shape
    return kv_cache_write_kernel("kv_cache_write", tuple(shape[:axis]), shape[axis], tuple(shape[axis + 1:]), capacity,
                                 new.dtype, CACHE_OFFSET)


def kept_for_plan_memory(context, call: Call) -> Call:
    """The legalization of the cache ops: the call itself (``plan_memory`` lowers it)."""
    return call


register_op("kv_cache_write", deduce=deduce_kv_cache_write, reference=reference_kv_cache_write,
            legalize=kept_for_plan_memory, view=True)
register_op("kv_cache_view", deduce=deduce_kv_cache_view, reference=reference_kv_cache_view,
            legalize=kept_for_plan_memory, view=True)
