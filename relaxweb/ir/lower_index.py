"""The IR's index arithmetic in a target's integer operations (shared by the backends).

Index expressions (:class:`~relaxweb.ir.symbolic.PrimExpr`) divide with *floor* semantics:
``//`` rounds toward negative infinity and ``%`` takes the divisor's sign, as in Python
(``-3 // 2 == -2``, ``-3 % 2 == 1``).  The targets' i32 division (WGSL's ``/`` and ``%``,
WebAssembly's ``i32.div_s`` and ``i32.rem_s``) *truncates* toward zero (``-3 / 2 == -1``,
``-3 % 2 == -1``).  The two agree when the numerator is >= 0 and the divisor > 0, the common
case (an axis, a linear offset, a size), and differ elsewhere (``(i - n) // 2``, a division
by a negative constant).

:func:`lower_index` is the step between the two: it turns an index expression into a tree
of the target's operations (:class:`IndexOp`), choosing for each division and modulo the
truncating operator where an :class:`~relaxweb.ir.symbolic.Analyzer` proves the numerator
non-negative and the divisor positive, and a floor helper function (``FLOOR_DIVIDE``,
``FLOOR_MODULO``, which each backend defines) elsewhere.  The analyzer knows the range of each
axis where the emitter introduces it (:func:`with_axis`): an output axis or a reduction
axis lies in ``[0, extent - 1]``.  Every other variable of an index expression is a size
variable or a linear index of the emitter, so >= 0: the analyzer's default.

A divisor is never 0 where the IR evaluates it, so a divisor proved >= 0 counts as
positive.  Each backend renders the tree (``relaxweb/wgsl/lower_index.py``,
``relaxweb/cpu/emit.py``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterator

from .prim_expr import free_vars
from .symbolic import Add, Analyzer, FloorDiv, FloorMod, IntImm, Max, Min, Mul, PrimExpr, SizeVar, Sub, as_int, simplify


class IndexOp(enum.Enum):
    """An i32 operation of the target; the value is its WGSL operator or function name."""

    ADD = "+"
    SUBTRACT = "-"
    MULTIPLY = "*"
    TRUNCATING_DIVIDE = "/"  # rounds toward zero
    TRUNCATING_REMAINDER = "%"  # takes the numerator's sign
    FLOOR_DIVIDE = "floor_div_i32"  # a helper function: rounds toward negative infinity
    FLOOR_MODULO = "floor_mod_i32"  # a helper function: takes the divisor's sign
    MINIMUM = "min"
    MAXIMUM = "max"


INFIX_OPS = (IndexOp.ADD, IndexOp.SUBTRACT, IndexOp.MULTIPLY, IndexOp.TRUNCATING_DIVIDE, IndexOp.TRUNCATING_REMAINDER)
FLOOR_OPS = (IndexOp.FLOOR_DIVIDE, IndexOp.FLOOR_MODULO)


class TargetIndex:
    """Base of lowered index expressions: i32 values in the target's operations."""


@dataclass(frozen=True)
class Constant(TargetIndex):
    value: int


@dataclass(frozen=True)
class Variable(TargetIndex):
    """An axis, a size variable or an emitter's index variable, by its IR name."""

    name: str


@dataclass(frozen=True)
class Operation(TargetIndex):
    op: IndexOp
    a: TargetIndex
    b: TargetIndex


_ARITHMETIC = {Add: IndexOp.ADD, Sub: IndexOp.SUBTRACT, Mul: IndexOp.MULTIPLY, Min: IndexOp.MINIMUM, Max: IndexOp.MAXIMUM}


def lower_index(expr: PrimExpr, analyzer: Analyzer) -> TargetIndex:
    """``expr`` in the target's operations, dividing with truncation only where it agrees
    with floor division under ``analyzer``'s ranges (:func:`truncation_agrees`)."""
    if isinstance(expr, IntImm):
        return Constant(expr.value)
    if isinstance(expr, SizeVar):
        return Variable(expr.name)
    a, b = lower_index(expr.a, analyzer), lower_index(expr.b, analyzer)  # type: ignore[attr-defined]
    if isinstance(expr, (FloorDiv, FloorMod)):
        truncating = truncation_agrees(expr.a, expr.b, analyzer)
        if isinstance(expr, FloorDiv):
            op = IndexOp.TRUNCATING_DIVIDE if truncating else IndexOp.FLOOR_DIVIDE
        else:
            op = IndexOp.TRUNCATING_REMAINDER if truncating else IndexOp.FLOOR_MODULO
        return Operation(op, a, b)
    try:
        return Operation(_ARITHMETIC[type(expr)], a, b)
    except KeyError:
        raise TypeError(f"not an index expression: {expr!r}") from None


def truncation_agrees(numerator: PrimExpr, divisor: PrimExpr, analyzer: Analyzer) -> bool:
    """Whether truncating division (and remainder) give the floor ones' results: the
    numerator provably >= 0 and the divisor provably > 0 (>= 0 for a symbolic divisor,
    which is never 0 where it is evaluated)."""
    constant = as_int(divisor)
    positive = constant > 0 if constant is not None else analyzer.prove_nonnegative(divisor)
    return positive and analyzer.prove_nonnegative(numerator)


def with_axis(analyzer: Analyzer, axis: str, extent: PrimExpr) -> Analyzer:
    """``analyzer`` also knowing ``0 <= axis <= extent - 1``: numerically when the extent
    has a constant bound, symbolically (``axis <= n - 1``) when it is not a constant.  An
    axis of an empty extent takes no value; its range is kept non-empty as ``[0, 0]``."""
    upper = analyzer.upper_bound(extent)
    if upper is not None:
        analyzer = analyzer.with_range(axis, 0, max(upper - 1, 0))
    if as_int(extent) is None:
        analyzer = analyzer.with_symbolic_upper(axis, extent - 1)
    return analyzer


@dataclass(frozen=True)
class AxisBound:
    """A bound an axis keeps within a branch: ``axis >= bound`` (``lower``) or ``axis <=
    bound``, the bound an expression of size variables and other axes."""

    axis: str
    bound: PrimExpr
    lower: bool


def bounds_from_relation(smaller: PrimExpr, larger: PrimExpr, axes: set[str]) -> list[AxisBound]:
    """The bounds ``smaller <= larger`` puts on an axis (by name) that is one side, or one
    side plus a constant, and not in the other (``i + 1 <= n`` bounds ``i`` by ``n - 1``
    from above, ``n <= i`` by ``n`` from below).  Other relations (a padded window's ``2 * h
    + k - 1 >= 0``) give none: looking into them cost more compile time than they save."""
    result = []
    for side, other, lower in ((larger, smaller, True), (smaller, larger, False)):
        found = _axis_plus_constant(side, axes)
        if found is not None and all(variable.name != found[0] for variable in free_vars(other)):
            name, offset = found  # name + offset >= other, or <= other
            result.append(AxisBound(name, simplify(other - offset), lower))
    return result


def _axis_plus_constant(expr: PrimExpr, axes: set[str]) -> tuple[str, int] | None:
    """(the axis, c) where ``expr`` is an axis in ``axes`` plus or minus a constant c (as the
    canonical form writes it: ``i + 3``, ``i - 2``)."""
    axis, offset = expr, 0
    if isinstance(expr, (Add, Sub)) and as_int(expr.b) is not None:
        axis, offset = expr.a, as_int(expr.b) * (1 if isinstance(expr, Add) else -1)
    if isinstance(axis, SizeVar) and axis.name in axes:
        return axis.name, offset
    return None


class IndexLowering:
    """The index lowering of one shader, for its emitter: the axes in scope with their
    extents, the bounds a branch puts on them, and the helper functions the lowered
    expressions call.

    The emitter opens a scope (:meth:`enter`) where WGSL does (a loop body, a branch) and
    declares each axis where its value is set (:meth:`declare_axis`); a declaration
    replaces an outer one of the same name (a shadowing loop variable) until the scope is
    left.  In a branch of a Select the emitter adds the bounds its condition puts on the
    axes (:meth:`assume`): ``i - n`` is >= 0 past the first piece of a concatenation, so it
    divides with the plain truncating division, and ``(i - n) // n`` is 0 in the next piece.
    """

    def __init__(self) -> None:
        self._scopes: list[dict[str, PrimExpr]] = [{}]
        self._bounds: list[tuple[AxisBound, ...]] = [()]
        self._analyzers: list[Analyzer | None] = [None]  # built on first use, per scope
        self._built: dict[tuple, Analyzer] = {}  # by the axes and bounds in scope: scopes alike share one
        self.helpers: set[IndexOp] = set()

    def enter(self) -> None:
        self._scopes.append(dict(self._scopes[-1]))
        self._bounds.append(self._bounds[-1])
        self._analyzers.append(self._analyzers[-1])

    def leave(self) -> None:
        self._scopes.pop()
        self._bounds.pop()
        self._analyzers.pop()

    def axes(self) -> set[str]:
        """The names of the axes in scope."""
        return set(self._scopes[-1])

    def declare_axis(self, axis: SizeVar, extent: PrimExpr) -> None:
        """``axis`` lies in ``[0, extent - 1]`` from here to the end of the scope (a branch's
        bounds on an axis of that name no longer hold)."""
        scope = self._scopes[-1]
        scope.pop(axis.name, None)  # declared again: last, after the axes its extent may use
        scope[axis.name] = extent
        self._bounds[-1] = tuple(bound for bound in self._bounds[-1] if bound.axis != axis.name
                                 and all(variable.name != axis.name for variable in free_vars(bound.bound)))
        self._analyzers[-1] = None

    def assume(self, bounds: list[AxisBound]) -> None:
        """The axes keep within ``bounds`` to the end of the scope (a Select's branch)."""
        known = self._scopes[-1]
        kept = tuple(bound for bound in bounds if bound.axis in known)
        if kept:
            self._bounds[-1] = (*self._bounds[-1], *kept)
            self._analyzers[-1] = None

    def analyzer(self) -> Analyzer:
        """An analyzer knowing the range of every axis in scope, and the branches' bounds."""
        if self._analyzers[-1] is None:
            self._analyzers[-1] = self._build(tuple(self._scopes[-1].items()), self._bounds[-1])
        return self._analyzers[-1]

    def _build(self, axes: tuple, bounds: tuple[AxisBound, ...]) -> Analyzer:
        """The analyzer of ``axes`` (name, extent) and ``bounds``: the one of the same axes
        and all bounds but the last, knowing the last too (so a branch costs one bound)."""
        key = (axes, bounds)
        if key not in self._built:
            if bounds:
                analyzer = _with_bound(self._build(axes, bounds[:-1]), bounds[-1])
            else:
                analyzer = Analyzer()
                for name, extent in axes:  # in order: an extent may use an outer axis
                    analyzer = with_axis(analyzer, name, extent)
            self._built[key] = analyzer
        return self._built[key]

    def lower(self, expr: PrimExpr) -> TargetIndex:
        """``expr`` simplified and lowered with the ranges in scope; its helpers are recorded.

        Simplifying under the ranges keeps the numerators they prove >= 0 (without them the
        canonical form may pull a constant out: ``(7 - i) // 2`` becomes ``(1 - i) // 2 + 3``,
        negative for ``i >= 2``) and folds what they decide (``i // 8`` is 0 for ``i < 8``).
        """
        analyzer = self.analyzer()
        target = lower_index(analyzer.simplify(expr), analyzer)
        self.helpers |= helpers_used(target)
        return target


def _with_bound(analyzer: Analyzer, bound: AxisBound) -> Analyzer:
    """``analyzer`` also knowing ``bound``: a constant one narrows the axis's range (an upper
    one is its symbolic upper bound too, for the proofs that substitute it: ``(n * i + j) //
    (4 * n)`` is 0 for ``i <= 3``, ``j <= n - 1``); another becomes its symbolic bound.  A
    symbolic upper bound replaces the extent's ``i <= n - 1``: where the branch runs, both
    hold.  A branch that never runs (its bound outside the range) learns nothing."""
    constant = as_int(bound.bound)
    if constant is not None:
        lo, hi = analyzer.range_of(bound.axis)
        if bound.lower:
            return analyzer.with_range(bound.axis, max(lo, constant), hi) if hi is None or constant <= hi else analyzer
        if constant < lo:
            return analyzer
        return analyzer.with_range(bound.axis, lo, constant).with_symbolic_upper(bound.axis, bound.bound)
    if bound.lower:
        return analyzer.with_symbolic_lower(bound.axis, bound.bound)
    return analyzer.with_symbolic_upper(bound.axis, bound.bound)


def operations(target: TargetIndex) -> Iterator[IndexOp]:
    """Every operation of a lowered expression."""
    if isinstance(target, Operation):
        yield target.op
        yield from operations(target.a)
        yield from operations(target.b)


def helpers_used(target: TargetIndex) -> set[IndexOp]:
    """The helper functions a lowered expression calls (a subset of :data:`FLOOR_OPS`)."""
    return {op for op in operations(target) if op in FLOOR_OPS}
