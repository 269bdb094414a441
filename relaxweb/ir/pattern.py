"""Pattern analysis: what kind of computation a tensor program is, read from its body.

Fusion and scheduling decide from these patterns, never from an op's name:

    elementwise   every load reads its buffer at exactly the output's axes
    broadcast     every load reads at a subsequence of the output's axes (or at 0 for a
                  dimension of extent 1): a bias add, ``x - mean[row]``
    injective     no reductions; each output element reads a few elements at computed
                  indices (transpose, reshape, slice, concat, gather ...)
    reduction     the body reduces (sum, max, ... over one or more axes), perhaps with an
                  elementwise epilogue
    matmul        a reduction whose core is a sum of a product of two factors, where the
                  output axes split into rows (used by the first factor only), columns (used
                  by the second only) and batch axes: matmul, batched matmul, a convolution
                  without groups (an implicit GEMM over its input channels and kernel taps)
    opaque        a hand-written library kernel: never fused

:func:`analyze_matmul` also returns the split (:class:`MatmulInfo`), which the tiled schedule
uses.  :func:`analyze_window` finds, among the other reductions, those that slide along the
output's last axis (a depthwise convolution: :class:`WindowInfo`), which the WebAssembly
backend runs four output positions at a time.  The order of the list is also the order of
"how much a program constrains fusion".
"""

from __future__ import annotations

from dataclasses import dataclass

from .symbolic import IntImm, PrimExpr, SizeVar, as_int, free_vars, simplify, substitute
from .tir import (
    Binary, BinaryOp, Compare, CompareOp, FloatImm, Gather, IndexValue, Load, NamedEnum, Reduce, ReduceCombiner,
    ScalarExpr, Select, TensorProgram, Unary, contains_reduce, index_exprs, index_var_names, scalar_children,
    scalar_dtype, scalar_nodes,
)


class Pattern(NamedEnum):
    """The kind of computation a program is (see the module doc), in this order."""

    ELEMENTWISE = "elementwise"
    BROADCAST = "broadcast"
    INJECTIVE = "injective"
    REDUCTION = "reduction"
    MATMUL = "matmul"
    OPAQUE = "opaque"


def program_pattern(program) -> Pattern:
    """The pattern of a tensor program (a library kernel is opaque)."""
    if not isinstance(program, TensorProgram):
        return Pattern.OPAQUE
    if contains_reduce(program.body):
        return Pattern.MATMUL if analyze_matmul(program) is not None else Pattern.REDUCTION
    loads = _loads(program.body)
    if any(isinstance(load, Gather) for load in loads):
        return Pattern.INJECTIVE
    axes = [axis.name for axis in program.axes]
    if all(_is_identity(load, program) for load in loads):
        return Pattern.ELEMENTWISE
    if all(_is_broadcast(load, axes) for load in loads):
        return Pattern.BROADCAST
    return Pattern.INJECTIVE


@dataclass(frozen=True)
class MatmulInfo:
    """The matmul-like split of a program ``out[axes] = epilogue(sum(k...: a * b))``.

    ``reduction`` is the outermost sum as it appears in the body (the epilogue is the body
    with it replaced by the accumulated value); ``reduce_axes`` and ``reduce_extents`` are
    the nested sums' axes, outermost first.  ``rows``, ``columns`` and ``batch`` are
    positions in ``program.axes``: ``a`` reads no column axis, ``b`` no row axis.
    """

    reduction: Reduce
    reduce_axes: tuple[SizeVar, ...]
    reduce_extents: tuple[PrimExpr, ...]
    a: ScalarExpr
    b: ScalarExpr
    rows: tuple[int, ...]
    columns: tuple[int, ...]
    batch: tuple[int, ...]


def analyze_matmul(program: TensorProgram) -> MatmulInfo | None:
    """The matmul-like split of a program, or None when it is not one (see the module doc)."""
    split = _guarded_sum(program)
    if split is None:
        return None
    reduction, axes, extents, guards, core = split
    if not (isinstance(core, Binary) and core.op is BinaryOp.MULTIPLY):
        return None
    a, b = core.a, core.b
    if scalar_dtype(a) != "float32" or scalar_dtype(b) != "float32" or contains_reduce(a) or contains_reduce(b):
        return None
    output_axes = [axis.name for axis in program.axes]
    uses_a, uses_b = _axis_uses(a, output_axes), _axis_uses(b, output_axes)
    rows = [p for p, name in enumerate(output_axes) if name in uses_a and name not in uses_b]
    columns = [p for p, name in enumerate(output_axes) if name in uses_b and name not in uses_a]
    if not rows or not columns:
        return None
    if columns[-1] < rows[-1]:  # keep the output's last axis among the columns (coalesced stores)
        a, b, rows, columns, uses_a, uses_b = b, a, columns, rows, uses_b, uses_a
    for guard in reversed(guards):  # a zero guard moves onto the factor it depends on
        uses_guard = _axis_uses(guard, output_axes)
        if not uses_guard & {output_axes[p] for p in columns}:
            a = Select(guard, a, FloatImm(0.0, "float32"))
        elif not uses_guard & {output_axes[p] for p in rows}:
            b = Select(guard, b, FloatImm(0.0, "float32"))
        else:
            return None
    batch = [p for p in range(len(output_axes)) if p not in rows and p not in columns]
    return MatmulInfo(reduction, tuple(axes), tuple(extents), a, b, tuple(rows), tuple(columns), tuple(batch))


def _guarded_sum(program: TensorProgram, extremes: bool = False):
    """The program's one top-level reduction (it may occur several times, never under a
    Select) when it is nested rectangular sums: ``(reduction, axes, extents, guards, core)``
    with the sums' axes and extents outermost first, the zero guards around the summed value
    (a convolution's padding: ``select(g, core, 0)``), outermost first, and the value inside
    them.  None otherwise.  ``extremes``: also nested maxima (minima) whose guards select
    a constant no float exceeds (the lowest float or -inf; for minima the highest or inf)
    where they fail (a max pool's padding), which :func:`_neutral` says a border may skip."""
    reductions = top_level_reductions(program.body)
    if len(set(reductions)) != 1 or _under_select(program.body, reductions[0]):
        return None
    reduction = reductions[0]
    combiner = reduction.combiner
    if combiner is not ReduceCombiner.SUM and not (extremes and combiner in (ReduceCombiner.MAX, ReduceCombiner.MIN)):
        return None
    axes, extents, core = [], [], reduction
    while isinstance(core, Reduce):
        if core.combiner is not combiner:
            return None
        axes.append(core.axis)
        extents.append(core.extent)
        core = core.body
    index_names = index_var_names(program)
    if any(var.name in index_names for extent in extents for var in free_vars(extent)):
        return None  # a non-rectangular reduction
    guards = []
    while isinstance(core, Select) and isinstance(core.b, FloatImm) and _neutral(combiner, core.b.value):
        guards.append(core.condition)
        core = core.a
    return reduction, axes, extents, guards, core


# the largest finite float32
FLOAT32_MAX = 3.4028234663852886e+38


def _neutral(combiner: ReduceCombiner, value: float) -> bool:
    """Whether a step whose value is ``value`` may be skipped by a reduction of ``combiner``:
    0 for a sum; for a maximum, the lowest float32 or -inf (the max of it and any other float
    is that float, unless every other is -inf: skipped, the window of all -inf reduces to
    -inf, as onnxruntime's MaxPool, which ignores its padding); for a minimum, the highest."""
    if combiner is ReduceCombiner.SUM:
        return value == 0
    if combiner is ReduceCombiner.MAX:
        return value <= -FLOAT32_MAX
    return combiner is ReduceCombiner.MIN and value >= FLOAT32_MAX


def top_level_reductions(expr: ScalarExpr) -> list[Reduce]:
    """The reductions of ``expr`` that are not inside another reduction, in order."""
    if isinstance(expr, Reduce):
        return [expr]
    return [r for child in scalar_children(expr) for r in top_level_reductions(child)]


def _under_select(expr: ScalarExpr, target: ScalarExpr) -> bool:
    """True when ``target`` occurs inside a branch or condition of a Select in ``expr``."""
    if isinstance(expr, Select):
        return any(_occurs(child, target) for child in scalar_children(expr))
    return any(_under_select(child, target) for child in scalar_children(expr))


def _occurs(expr: ScalarExpr, target: ScalarExpr) -> bool:
    return any(node == target for node in scalar_nodes(expr))


def _axis_uses(expr: ScalarExpr, names: list[str]) -> set[str]:
    used = {var.name for index in index_exprs(expr) for var in free_vars(index)}
    return used & set(names)


def _loads(expr: ScalarExpr) -> list[ScalarExpr]:
    return [node for node in scalar_nodes(expr) if isinstance(node, (Load, Gather))]


def _is_identity(load: Load, program: TensorProgram) -> bool:
    if len(load.indices) != len(program.axes):
        return False
    if any(not (isinstance(i, SizeVar) and i.name == a.name) for i, a in zip(load.indices, program.axes)):
        return False
    return all(simplify(d - e) == IntImm(0) for d, e in zip(load.buffer.shape, program.output.shape))


def _is_broadcast(load: Load, axes: list[str]) -> bool:
    positions = []
    for index, extent in zip(load.indices, load.buffer.shape):
        if isinstance(index, IntImm) and index.value == 0 and simplify(extent) == IntImm(1):
            continue
        if not isinstance(index, SizeVar) or index.name not in axes:
            return False
        positions.append(axes.index(index.name))
    return positions == sorted(set(positions))


# -- sliding windows along the output's last axis ------------------------------------------------

_ORDERINGS = (CompareOp.LT, CompareOp.LE, CompareOp.GT, CompareOp.GE)


@dataclass(frozen=True)
class WindowInfo:
    """The split of a reduction ``out[..., x] = epilogue(sum(k...: select(g1, ... core, 0)))``
    that slides along the output's last axis ``x`` (a depthwise or grouped convolution,
    which :func:`analyze_matmul` refuses: its input and weight share the channel axis).

    ``reduction`` is the outermost sum as it appears in the body; ``reduce_axes`` and
    ``reduce_extents`` its nested sums' axes, outermost first; ``guards`` the zero guards
    around the ``core`` (a padded input's bounds tests), outermost first.  Every load of
    the core that reads ``x`` reads it only in its last index, as ``stride * x`` plus a
    part free of ``x`` (``strides`` gives each such load's stride, >= 1); the others read
    one element for the whole row.  Each guard compares index values that move by a
    constant per step of ``x`` and of each reduction axis, so it holds over a box of
    steps and lanes when it holds at the box's corners.  ``combiner``: SUM, or MAX (MIN) for
    a max (min) pool, whose guards select a value that the reduction may skip (``_neutral``).
    """

    reduction: Reduce
    reduce_axes: tuple[SizeVar, ...]
    reduce_extents: tuple[PrimExpr, ...]
    guards: tuple[ScalarExpr, ...]
    core: ScalarExpr
    strides: tuple[tuple[Load, int], ...]
    combiner: ReduceCombiner = ReduceCombiner.SUM  # MAX, MIN: a max (min) pool, its guards' fill skipped


def analyze_window(program: TensorProgram) -> WindowInfo | None:
    """The sliding-window split of a float32 program (:class:`WindowInfo`), or None: one
    distinct top-level reduction (it may occur more than once: a hard-swish reads it twice),
    nested sums over extents free of index variables, zero guards of the form above, a core
    of float32 loads, constants, unary and binary ops that reads ``x`` in at least one load,
    and an epilogue (the body around the reduction) of the same kinds of nodes whose loads
    read ``x`` contiguously (``x`` plus a part free of it, in the last index) or not at all.
    The output's last extent must not be a constant below 4 (no four lanes to run)."""
    if not program.axes or program.output.dtype != "float32" or not contains_reduce(program.body):
        return None
    lane = program.axes[-1]
    width = simplify(program.output.shape[-1])
    if isinstance(width, IntImm) and width.value < 4:
        return None
    split = _guarded_sum(program, extremes=True)
    if split is None:
        return None
    reduction, axes, extents, guards, core = split
    moving = [lane, *axes]
    if not all(_moves_by_constants(guard, moving) for guard in guards):
        return None
    strides = _core_strides(core, lane)
    if not strides:
        return None
    for node in _epilogue_nodes(program.body, reduction):
        if not _is_window_node(node) or (_is_lane_load(node, lane) and _lane_stride(node, lane) != 1):
            return None
    return WindowInfo(reduction, tuple(axes), tuple(extents), tuple(guards), core, tuple(strides), reduction.combiner)


def _moves_by_constants(guard: ScalarExpr, moving: list[SizeVar]) -> bool:
    """Whether ``guard`` orders two index values that each move by a constant per step of
    every axis in ``moving``."""
    if not (isinstance(guard, Compare) and guard.op in _ORDERINGS and isinstance(guard.a, IndexValue)
            and isinstance(guard.b, IndexValue)):
        return False
    return all(_step(side, axis) is not None for side in (guard.a.value, guard.b.value) for axis in moving)


def _is_window_node(node: ScalarExpr) -> bool:
    """A float32 load, constant, unary or binary op: what a window's core and epilogue hold."""
    return node.dtype == "float32" and isinstance(node, (Load, FloatImm, Binary, Unary))


def _is_lane_load(node: ScalarExpr, lane: SizeVar) -> bool:
    return isinstance(node, Load) and _reads(node, lane)


def _core_strides(core: ScalarExpr, lane: SizeVar) -> list[tuple[Load, int]] | None:
    """Each distinct load of the core that reads ``lane``, with its stride (>= 1); None when
    the core holds another kind of node or a load reads the lane otherwise."""
    strides: list[tuple[Load, int]] = []
    for node in scalar_nodes(core):
        if not _is_window_node(node):
            return None
        if _is_lane_load(node, lane):
            stride = _lane_stride(node, lane)
            if stride is None or stride < 1:
                return None
            if node not in dict(strides):
                strides.append((node, stride))
    return strides


def _epilogue_nodes(expr: ScalarExpr, reduction: Reduce):
    """The nodes of ``expr`` outside ``reduction``."""
    if expr == reduction:
        return
    yield expr
    for child in scalar_children(expr):
        yield from _epilogue_nodes(child, reduction)


def _step(expr: PrimExpr, axis: SizeVar) -> int | None:
    """How much ``expr`` moves per step of ``axis``, when that is a constant."""
    return as_int(simplify(substitute(expr, {axis.name: axis + 1}) - expr))


def _reads(load: Load, axis: SizeVar) -> bool:
    return any(axis.name in {v.name for v in free_vars(index)} for index in load.indices)


def _lane_stride(load: Load, axis: SizeVar) -> int | None:
    """The constant stride at which ``load`` reads ``axis`` in its last index (and nowhere
    else), the rest of that index free of it; None otherwise."""
    *others, last = load.indices
    if any(axis.name in {v.name for v in free_vars(index)} for index in others):
        return None
    stride = _step(last, axis)
    if stride is None or axis.name in {v.name for v in free_vars(simplify(last - axis * stride))}:
        return None
    return stride
