"""How a tensor program's loads walk their buffers: flat offsets, the index variables a value
depends on, the stride of a load along an axis.

The facts the schedules are chosen and laid out by (``relaxweb/ir/matmul_layout.py``, the
WebAssembly renderers of ``relaxweb/cpu/schedules/``): whether four consecutive positions of
an axis read four consecutive elements (one vector load), by how much an address moves per
step.  Offsets are index expressions, compared with ``relaxweb.ir.symbolic.simplify``.
"""

from __future__ import annotations

from typing import Sequence

from .symbolic import IntImm, PrimExpr, SizeVar, as_int, free_vars, simplify, substitute
from .tir import Buffer, Load, ScalarExpr, index_exprs


def flat_offset(buffer: Buffer, indices: tuple[PrimExpr, ...]) -> PrimExpr:
    """The element offset of ``buffer[indices]`` (row-major), as an index expression."""
    flat: PrimExpr = IntImm(0)
    stride: PrimExpr = IntImm(1)
    for index, extent in reversed(list(zip(indices, buffer.shape))):
        flat = flat + index * stride
        stride = stride * extent
    return flat


def depends_on(expr: ScalarExpr, name: str) -> bool:
    """Whether ``expr``'s value depends on the index variable ``name``."""
    return any(name in {v.name for v in free_vars(index)} for index in index_exprs(expr))


def reads(load: Load, axis: SizeVar) -> bool:
    """Whether ``load``'s indices use ``axis``."""
    return any(axis.name in {v.name for v in free_vars(index)} for index in load.indices)


def moved(load: Load, axis: SizeVar) -> PrimExpr:
    """How many elements ``load`` moves per step of ``axis`` (an index expression)."""
    shifted = tuple(substitute(index, {axis.name: axis + 1}) for index in load.indices)
    return simplify(flat_offset(load.buffer, shifted) - flat_offset(load.buffer, load.indices))


def along_columns(load: Load, axes: Sequence[SizeVar], extents: Sequence[PrimExpr]) -> bool:
    """Whether ``load`` reads the flat index over ``axes`` (row-major, of ``extents``)
    contiguously: one more of axis ``j`` moves it by the product of the later extents, by
    a distance free of the axes (four consecutive flat indices: one vector load)."""
    base = flat_offset(load.buffer, load.indices)
    names = {axis.name for axis in axes}
    stride: PrimExpr = IntImm(1)
    for axis, extent in reversed(list(zip(axes, extents))):
        shifted = tuple(substitute(index, {axis.name: axis + 1}) for index in load.indices)
        distance = simplify(flat_offset(load.buffer, shifted) - base)
        if names & {v.name for v in free_vars(distance)} or simplify(distance - stride) != IntImm(0):
            return False
        stride = simplify(stride * extent)
    return True


def last_stride(load: Load, axis: SizeVar) -> int | None:
    """``s`` when ``load`` reads ``axis`` as ``s * axis`` plus an offset free of it in its
    last index (``s`` a positive constant: a convolution's stride) and in no other; None
    otherwise."""
    *others, last = load.indices
    if any(axis.name in {v.name for v in free_vars(index)} for index in others):
        return None
    stride = as_int(simplify(substitute(last, {axis.name: axis + 1}) - last))
    if stride is None or stride < 1:
        return None
    if axis.name in {v.name for v in free_vars(simplify(last - stride * axis))}:
        return None
    return stride
