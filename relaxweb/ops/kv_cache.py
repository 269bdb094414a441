"""A decoder's KV cache in one buffer: ``kv_cache_write`` and ``kv_cache_view``; and
``ragged_concat``, the cache update of onnxruntime's GroupQueryAttention.

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

* ``ragged_concat(past, new, lengths, axis=a)``: ``concat(past, new, axis=a)`` in which batch
  entry ``b`` (axis 0) keeps only its first ``L_b = clamp(lengths[b], 0, p)`` past rows, its
  ``s`` new rows following them at row ``L_b``; the rows from ``L_b + s`` on are unspecified
  (past's where it has them, else zeros, in the reference and the legalization).  With every
  ``lengths[b] == p`` it is the concat.  The GroupQueryAttention converter writes it (each
  entry's past length comes from ``seqlens_k``); ``place_kv_caches`` makes it a cache as it
  does a concat, passing ``lengths`` to ``kv_cache_write``, whose third argument it is there:
  its in-place kernel then writes entry ``b``'s new rows at row ``L_b``.
"""

from __future__ import annotations

import numpy as np

from ..ir.expr import Call, tensor_shape
from ..ir.library_kernel import LibraryKernel
from ..ir.op_registry import DeductionError, register_op
from ..ir.struct_info import PrimStructInfo, TensorStructInfo
from ..ir.symbolic import IntImm, format_expr, prove_less, simplify
from ..ir.tir import Gather, IndexValue, Load, cast, maximum, minimum, select
from ..library.kv_cache import kv_cache_write_kernel
from .common import DimOf, make_program, needs_known_shapes, require_equal, require_tensor, same_dtype


def _axis(attrs, rank: int, op: str) -> int:
    axis = attrs.get("axis")
    if not isinstance(axis, int) or not 0 <= axis < rank:
        raise DeductionError(f"{op}: axis must be a dimension of the cache (0 .. {rank - 1}), got {axis!r}")
    return axis


def deduce_kv_cache_write(args, attrs) -> TensorStructInfo:
    if len(args) not in (2, 3):
        raise DeductionError(f"kv_cache_write: takes the past, the new rows and optionally each entry's past length, "
                             f"got {len(args)} arguments")
    past, new = (require_tensor(arg, "kv_cache_write", position) for position, arg in enumerate(args[:2]))
    dtype = same_dtype("kv_cache_write", [past, new])
    if past.shape is None or new.shape is None or len(past.shape) != len(new.shape):
        raise DeductionError(f"kv_cache_write: past and new must have known shapes of one rank, got {past} and {new}")
    axis = _axis(attrs, len(past.shape), "kv_cache_write")
    if len(args) == 3:
        _check_lengths("kv_cache_write", args[2], past, axis)
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
    past, new = arrays[:2]
    axis, capacity = attrs["axis"], attrs["capacity"]
    rows = past.shape[axis] + new.shape[axis]
    if rows > capacity:
        raise DeductionError(f"kv_cache_write: {rows} rows do not fit a capacity of {capacity}")
    cache = np.zeros((*past.shape[:axis], capacity, *past.shape[axis + 1:]), past.dtype)
    rows_written = (np.concatenate([past, new], axis=axis) if len(arrays) == 2
                    else reference_ragged_concat(arrays, {"axis": axis}))
    cache[(slice(None),) * axis + (slice(0, rows),)] = rows_written
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


def cache_writer(new: TensorStructInfo, axis: int, capacity: int, ragged: bool = False) -> LibraryKernel:
    """The in-place kernel that writes ``new`` at row ``offset_`` along ``axis`` of a cache of
    ``capacity`` rows (``plan_memory`` calls it into the cache's storage); ``ragged``: at row
    ``clamp(lengths[b], 0, offset_)`` of batch entry ``b``, ``lengths`` its second input."""
    shape = new.shape
    return kv_cache_write_kernel("kv_cache_write", tuple(shape[:axis]), shape[axis], tuple(shape[axis + 1:]), capacity,
                                 new.dtype, CACHE_OFFSET, ragged)


def kept_for_plan_memory(context, call: Call) -> Call:
    """The legalization of the cache ops: the call itself (``plan_memory`` lowers it)."""
    return call


# ragged_concat ---------------------------------------------------------------------------------


def _check_lengths(op: str, lengths, past: TensorStructInfo, axis: int) -> None:
    """``lengths``: one integer per batch entry (axis 0 of ``past``), which is not the cache axis."""
    info = require_tensor(lengths, op, 2)
    if axis == 0:
        raise DeductionError(f"{op}: the rows of each batch entry (axis 0) go along another axis, got axis 0")
    if not info.dtype.startswith(("int", "uint")) or info.ndim not in (1, -1):
        raise DeductionError(f"{op}: the past lengths must be a 1-d integer tensor, got {info}")
    if info.shape is not None:
        require_equal(DimOf(info.shape[0], 2, 0), DimOf(past.shape[0], 0, 0),
                      f"{op}: {format_expr(info.shape[0])} past lengths for {format_expr(past.shape[0])} entries")


def deduce_ragged_concat(args, attrs) -> TensorStructInfo:
    if len(args) != 3:
        raise DeductionError(f"ragged_concat: takes the past, the new rows and each entry's past length, "
                             f"got {len(args)} arguments")
    past, new = (require_tensor(arg, "ragged_concat", position) for position, arg in enumerate(args[:2]))
    dtype = same_dtype("ragged_concat", [past, new])
    if past.shape is None or new.shape is None or len(past.shape) != len(new.shape):
        raise DeductionError(f"ragged_concat: past and new must have known shapes of one rank, got {past} and {new}")
    axis = _axis(attrs, len(past.shape), "ragged_concat")
    _check_lengths("ragged_concat", args[2], past, axis)
    for dim, (a, b) in enumerate(zip(past.shape, new.shape)):
        if dim != axis:
            require_equal(DimOf(b, 1, dim), DimOf(a, 0, dim),
                          f"ragged_concat: dim {dim} of new is {format_expr(b)}, expected past's {format_expr(a)}")
    rows = simplify(past.shape[axis] + new.shape[axis])
    return TensorStructInfo((*past.shape[:axis], rows, *past.shape[axis + 1:]), dtype)


def reference_ragged_concat(arrays, attrs):
    past, new, lengths = arrays
    axis = attrs["axis"]
    p, s = past.shape[axis], new.shape[axis]
    out = np.zeros((*past.shape[:axis], p + s, *past.shape[axis + 1:]), past.dtype)
    out[(slice(None),) * axis + (slice(0, p),)] = past
    for entry, length in enumerate(np.asarray(lengths).reshape(-1)):
        start = int(min(max(int(length), 0), p))
        out[(entry, *(slice(None),) * (axis - 1), slice(start, start + s))] = new[entry]
        out[(entry, *(slice(None),) * (axis - 1), slice(max(start + s, p), p + s))] = 0
    return out


def legalize_ragged_concat(context, call: Call):
    """One program: row ``j`` of entry ``b`` is past's below ``L_b``, then new's, then past's
    (below ``p``) or zero; only the chosen load is evaluated."""
    info, axis = call.struct_info, call.attrs["axis"]
    past_rows, new_rows = tensor_shape(call.args[0])[axis], tensor_shape(call.args[1])[axis]

    def body(axes, buffers):
        past, new, lengths = buffers
        row = IndexValue(axes[axis])
        start = minimum(maximum(cast("int32", Load(lengths, (axes[0],))), 0), IndexValue(past_rows))
        from_past = Load(past, tuple(axes))
        from_new = Gather(new, (*axes[:axis], row - start, *axes[axis + 1:]))
        tail = select(row.lt(IndexValue(past_rows)), from_past, 0)
        return select(row.lt(start), from_past, select(row.lt(start + IndexValue(new_rows)), from_new, tail))

    return context.call_tir(make_program("ragged_concat", call.args, info.shape, info.dtype, body), call.args)


register_op("ragged_concat", deduce=deduce_ragged_concat, reference=reference_ragged_concat,
            legalize=needs_known_shapes(legalize_ragged_concat))
register_op("kv_cache_write", deduce=deduce_kv_cache_write, reference=reference_kv_cache_write,
            legalize=kept_for_plan_memory, view=True)
register_op("kv_cache_view", deduce=deduce_kv_cache_view, reference=reference_kv_cache_view,
            legalize=kept_for_plan_memory, view=True)
