"""How a matmul-like program's factors lie in memory (``relaxweb.ir.pattern.MatmulInfo``):
what the WebAssembly matmul schedules (``wasm_schedule.py``) are chosen by and read their
second factor by.

The second factor (``info.b``) is evaluated per column of a block, so the layouts of a plain
load of it decide how a kernel reads it: four consecutive columns as one vector
(:func:`contiguous_columns`), a block of columns a constant distance apart
(:func:`column_strides`, :func:`gathered_columns`; a size variable apart:
:func:`gathered_stride`), a block copied in place a reduction step
at a time (:func:`direct_columns`), each column a contiguous run along the reduction
(:func:`dot_columns`).  :func:`cheap_columns` says when the factors should swap roles, and
:func:`split_columns` when a packed matmul's units may split the columns.
"""

from __future__ import annotations

import dataclasses

from .access import flat_offset
from .pattern import MatmulInfo
from .symbolic import IntImm, PrimExpr, as_int, free_vars, product, simplify, substitute
from .tir import Binary, BinaryOp, FloatImm, Load, ScalarExpr, TensorProgram


def swapped(info: MatmulInfo) -> MatmulInfo:
    """``info`` with the factors' roles swapped: the second factor gives the rows."""
    return dataclasses.replace(info, a=info.b, b=info.a, rows=info.columns, columns=info.rows)


def oriented(info: MatmulInfo, swap_factors: bool) -> MatmulInfo:
    """``info`` as a schedule with ``swap_factors`` reads it."""
    return swapped(info) if swap_factors else info


def contiguous_columns(info: MatmulInfo, program: TensorProgram) -> bool:
    """Whether the second factor is a plain load whose last index is the only column axis
    (the output's last axis): four consecutive columns are one vector load."""
    if info.columns != (len(program.axes) - 1,) or not isinstance(info.b, Load):
        return False
    column = program.axes[-1].name
    *others, last = info.b.indices
    if any(column in {v.name for v in free_vars(index)} for index in others):
        return False
    offset = simplify(last - program.axes[-1])
    return column not in {v.name for v in free_vars(offset)}


def column_strides(info: MatmulInfo, program: TensorProgram, lanes: int) -> list[int] | None:
    """For a second factor that is a plain load and a single column axis: how many elements
    past the first column's element each of ``lanes`` consecutive columns reads, when these
    are non-negative constants (a transposed weight: its row length); None otherwise."""
    if len(info.columns) != 1 or not isinstance(info.b, Load):
        return None
    column = program.axes[info.columns[0]]
    indices = info.b.indices
    first = flat_offset(info.b.buffer, indices)
    strides = []
    for lane in range(lanes):
        moved = tuple(substitute(index, {column.name: column + lane}) for index in indices)
        distance = as_int(simplify(flat_offset(info.b.buffer, moved) - first))
        if distance is None or distance < 0:
            return None
        strides.append(distance)
    return strides


def gathered_columns(info: MatmulInfo, program: TensorProgram, lanes: int, panel_columns: int) -> list[int] | None:
    """For a second factor a packed matmul can gather a reduction step at a time: a float32
    plain load, one column axis, each of ``lanes`` consecutive columns a constant number of
    elements past the first (:func:`column_strides`: a convolution's weight
    ``[O, C, kh, kw]``, a transposed weight), and the reduction axes flattened (outermost
    first) contiguous in it, one element per step.  The distances of a block of
    ``panel_columns`` columns; None otherwise."""
    strides = column_strides(info, program, lanes)
    if strides is None or info.b.buffer.dtype != "float32" or len(strides) < panel_columns:
        return None
    return strides[:panel_columns] if _steps_flattened(info) else None


def gathered_stride(info: MatmulInfo, program: TensorProgram) -> PrimExpr | None:
    """For a second factor a packed matmul can gather a reduction step at a time whose
    columns are a distance apart that is a size variable, not a constant (a convolution's
    weight ``[O, C, kh, kw]`` in a program that ``share_programs`` gave its channel counts as
    size variables): a float32 plain load, one column axis, each column that distance
    (made of size variables only) past the one before, and the reduction axes flattened
    contiguous in it, one element per step.  The distance in elements; None otherwise."""
    if len(info.columns) != 1 or not isinstance(info.b, Load) or info.b.buffer.dtype != "float32":
        return None
    column = program.axes[info.columns[0]]
    base = flat_offset(info.b.buffer, info.b.indices)

    def past(lanes: int) -> PrimExpr:
        moved = tuple(substitute(index, {column.name: column + lanes}) for index in info.b.indices)
        return simplify(flat_offset(info.b.buffer, moved) - base)

    stride = past(1)
    axes = {v.name for v in (*program.axes, *info.reduce_axes)}
    if {v.name for v in free_vars(stride)} & axes or simplify(past(2) - stride * 2) != IntImm(0):
        return None
    return stride if _steps_flattened(info) else None


def _steps_flattened(info: MatmulInfo) -> bool:
    """Whether the second factor reads the reduction axes flattened (outermost first) as
    consecutive elements, one a step."""
    base = flat_offset(info.b.buffer, info.b.indices)
    inner: PrimExpr = IntImm(1)
    for axis, extent in reversed(list(zip(info.reduce_axes, info.reduce_extents))):
        moved = tuple(substitute(index, {axis.name: axis + 1}) for index in info.b.indices)
        if simplify(flat_offset(info.b.buffer, moved) - base - inner) != IntImm(0):
            return False
        inner = simplify(inner * extent)
    return True


def flat_columns(info: MatmulInfo, program: TensorProgram) -> PrimExpr | None:
    """How many consecutive flat columns (the column axes flattened, outermost first) the
    second factor reads at consecutive elements: the product of the extents of the longest
    suffix of the column axes along which it does (a stride-1 unpadded convolution's output
    positions [H, W], read from an input of the same row length: a 1x1 convolution's; not
    its batch axis, a column axis too).  Flat columns ``c`` and ``c + 1`` are consecutive
    elements unless ``c + 1`` is a multiple of it.  None where a plain load does not read
    even the last column axis contiguously."""
    if not isinstance(info.b, Load):
        return None
    base = flat_offset(info.b.buffer, info.b.indices)
    inner: PrimExpr = IntImm(1)
    for p in reversed(info.columns):
        axis = program.axes[p]
        moved = tuple(substitute(index, {axis.name: axis + 1}) for index in info.b.indices)
        if simplify(flat_offset(info.b.buffer, moved) - base - inner) != IntImm(0):
            break
        inner = simplify(inner * program.output.shape[p])
    else:
        return inner
    return None if inner == IntImm(1) else inner


def direct_columns(info: MatmulInfo, program: TensorProgram) -> PrimExpr | None:
    """The distance in elements between consecutive reduction steps of the second factor,
    when a packed matmul can read it in place: a float32 plain load whose consecutive flat
    columns are consecutive elements (:func:`flat_columns`), one reduction axis of an extent
    other than 1 (a 1x1 convolution's kernel axes have extent 1: they read index 0), and a
    distance made of size variables only."""
    if not isinstance(info.b, Load) or info.b.buffer.dtype != "float32" or flat_columns(info, program) is None:
        return None
    steps = [axis for axis, extent in zip(info.reduce_axes, info.reduce_extents) if as_int(simplify(extent)) != 1]
    if len(steps) != 1:
        return None
    axis = steps[0]
    moved = tuple(substitute(index, {axis.name: axis + 1}) for index in info.b.indices)
    distance = simplify(flat_offset(info.b.buffer, moved) - flat_offset(info.b.buffer, info.b.indices))
    if {v.name for v in free_vars(distance)} & {v.name for v in (*program.axes, *info.reduce_axes)}:
        return None
    return distance


def dot_columns(info: MatmulInfo) -> bool:
    """Whether each column of the second factor is a float32 plain load contiguous along the
    reduction steps, the reduction axes flattened in order (a ``Gemm`` with ``transB``, a
    1x1 convolution's weight [O, C, 1, 1], a classifier's [classes, features]): a column's
    products are then a dot product of two contiguous runs."""
    b = info.b
    if not isinstance(b, Load) or b.buffer.dtype != "float32":
        return False
    offset = flat_offset(b.buffer, b.indices)
    stride: PrimExpr = IntImm(1)
    for axis, extent in reversed(tuple(zip(info.reduce_axes, info.reduce_extents))):
        moved = flat_offset(b.buffer, tuple(substitute(index, {axis.name: axis + 1}) for index in b.indices))
        if as_int(simplify(moved - offset - stride)) != 0:
            return False
        stride = stride * extent
    return True


def streamed_columns(info: MatmulInfo, program: TensorProgram) -> bool:
    """Whether a matrix-vector kernel can stream the second factor's rows in order: one
    reduction axis and the output's last axis the only column axis, read in place
    (:func:`direct_columns`; not the several column or reduction axes of a 1x1
    convolution: the form reads one of each)."""
    if len(info.reduce_axes) != 1 or not contiguous_columns(info, program):
        return False
    return direct_columns(info, program) is not None


def split_columns(info: MatmulInfo) -> bool:
    """Whether a packed matmul's units may split the columns where the rows are few: the first
    factor costs about a copy to pack (:func:`cheap_to_pack`), since each thread packs it once
    for its slices (a prologue such as BERT's GELU would be evaluated again by each).
    Split by rows only, a 128-row transformer matmul had 4 units, each copying all of the
    weight (9.4 MB at 768 x 3072) for its 32 rows; a convolution of few output channels or
    few positions (MobileNetV3's 1x1 convolutions at 7 x 7 to 112 x 112: 1 to 3 units, 59% of
    its time) ran on one thread of two.  Consecutive slices that one call runs (one thread)
    pack the rows once (``cpu/schedules/matmul_packed.packed_main``), so one thread loses
    nothing to the split (in V8, with it against without: MobileNetV3 1.00-1.02x, ResNet-50
    1.00-1.07x by the order of the builds, YOLOv8n at 640 x 640 0.89x)."""
    return cheap_to_pack(info.a)


#: The most additions, subtractions, multiplications, maxima and minima of loads a first
#: factor may take per element and still be :func:`cheap_to_pack` (a layer norm's
#: ``(x - mean) * rstd * gamma + beta`` takes 4).
CHEAP_PACK_OPERATIONS = 6
_CHEAP_OPS = frozenset({BinaryOp.ADD, BinaryOp.SUBTRACT, BinaryOp.MULTIPLY, BinaryOp.MAXIMUM, BinaryOp.MINIMUM})


def cheap_to_pack(expr: ScalarExpr) -> bool:
    """Whether packing ``expr`` (a matmul's first factor) costs about a copy: a plain load, or
    at most :data:`CHEAP_PACK_OPERATIONS` float additions, subtractions, multiplications,
    maxima and minima of loads and constants (no division, no function, no select)."""
    operations = 0

    def cheap(node: ScalarExpr) -> bool:
        nonlocal operations
        if isinstance(node, (Load, FloatImm)):
            return True
        if isinstance(node, Binary) and node.op in _CHEAP_OPS:
            operations += 1
            return operations <= CHEAP_PACK_OPERATIONS and cheap(node.a) and cheap(node.b)
        return False

    return cheap(expr)


def cheap_columns(info: MatmulInfo, program: TensorProgram, block_columns: int, panel_columns: int) -> bool:
    """Whether the factors should swap roles (:func:`swapped`): when only the first is a
    plain load (a convolution's weight next to its padded input), since the second factor
    is evaluated per column of a block, ``block_columns`` times as often as the first per
    row, so it should be the cheap one.  Not when the rows are fewer than a block's columns
    (a convolution with few output channels): no block would be whole.

    Both plain loads, swapped where a packed matmul would pack the second factor element by
    element in every unit (neither :func:`direct_columns` nor :func:`gathered_columns`, of
    ``panel_columns`` columns checked over ``block_columns``, nor :func:`gathered_stride`)
    and would gather it swapped (its columns a constant or a size variable apart): a
    strided 1x1 convolution (ResNet's downsampling), whose input as the first factor is
    packed once in all and whose weight is gathered a step at a time (1x1 of 1024 -> 2048
    channels at stride 2 from 14 x 14: 16.0 -> 9.8 ms in Chromium)."""
    if isinstance(info.a, Load) and isinstance(info.b, Load):
        def gathered(oriented_info: MatmulInfo) -> bool:
            return (gathered_columns(oriented_info, program, block_columns, panel_columns) is not None
                    or gathered_stride(oriented_info, program) is not None)

        if direct_columns(info, program) is None and not gathered(info) and gathered(swapped(info)):
            return True  # a strided 1x1 convolution: its input the rows, its weight gathered
    if isinstance(info.b, Load) or not isinstance(info.a, Load):
        return False
    rows = as_int(simplify(product(program.output.shape[p] for p in info.rows)))
    return rows is None or rows >= block_columns
