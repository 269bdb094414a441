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
uses.  The order of the list is also the order of "how much a program constrains fusion".
"""

from __future__ import annotations

from dataclasses import dataclass

from .symbolic import IntImm, PrimExpr, SizeVar, free_vars, simplify
from .tir import (
    Binary, BinaryOp, FloatImm, Gather, Load, NamedEnum, Reduce, ReduceCombiner, ScalarExpr, Select, TensorProgram,
    contains_reduce, index_exprs, index_var_names, scalar_children, scalar_dtype, scalar_nodes,
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
    reductions = top_level_reductions(program.body)
    if len(set(reductions)) != 1 or _under_select(program.body, reductions[0]):
        return None
    reduction = reductions[0]
    axes, extents, core = [], [], reduction
    while isinstance(core, Reduce):
        if core.combiner is not ReduceCombiner.SUM:
            return None
        axes.append(core.axis)
        extents.append(core.extent)
        core = core.body
    index_names = index_var_names(program)
    if any(var.name in index_names for extent in extents for var in free_vars(extent)):
        return None  # a non-rectangular reduction
    guards = []  # zero guards around the product (a convolution's padding)
    while isinstance(core, Select) and isinstance(core.b, FloatImm) and core.b.value == 0:
        guards.append(core.condition)
        core = core.a
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
