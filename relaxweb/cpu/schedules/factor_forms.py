"""The forms in which the matmul kinds evaluate a factor four lanes (four rows or columns) at
once, read from the factor's expression: what ``packing.py`` packs a panel with and how a
packed matmul applies its epilogue.

- :func:`padded_interior`: padding guards around a core that reads along the lanes' axis
  contiguously (a convolution's input): the core as one f32x4 where the guards hold;
- :func:`branched_interior`: selects among such cores by conditions the lanes share (a
  concatenation fused into a 1x1 convolution's input): only the chosen input read;
- :func:`lane_vectors`: any factor whose lane-dependent parts have f32x4 forms (a fused
  GELU): one f32x4 of the whole factor;
- :func:`lane_math`: the math library's calls of a factor, computed four lanes at a time;
- :func:`vector_columns`: a matmul epilogue applied four columns at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ...ir.access import along_columns, depends_on, last_stride, reads
from ...ir.pattern import MatmulInfo
from ...ir.schedule_fit import VECTOR_BINARY_OPS, VECTOR_COMPARE_OPS, VECTOR_UNARY_OPS
from ...ir.scalar_functor import ScalarFunctor
from ...ir.symbolic import PrimExpr, SizeVar, as_int, simplify, substitute
from ...ir.tir import (
    MATH_CALLS, Binary, Compare, CompareOp, FloatImm, IndexValue, Load, Reduce, ScalarExpr, Select, TensorProgram, Unary,
    contains_reduce, scalar_children, scalar_nodes,
)

ORDERINGS = (CompareOp.LT, CompareOp.LE, CompareOp.GT, CompareOp.GE)


def padded_interior(factor: ScalarExpr, axis: SizeVar) -> tuple[list[ScalarExpr], ScalarExpr] | None:
    """A factor made of padding guards around a float32 core that reads along ``axis``
    contiguously (a stride-1 convolution's input, its prologue fused), as ``(guards,
    core)``: ``select(g1, select(g2, ... core, 0), 0)``.  Each guard compares index values
    that move by a constant per step of ``axis`` (true at two positions, true between), the
    core's ops all have f32x4 forms and each of its loads reads ``axis`` as its last index
    times a positive constant plus an offset free of it (``relaxweb.ir.access.last_stride``;
    four positions: one ``v128.load`` at stride 1, two and a shuffle at stride 2 (a stride-2
    convolution's input), four lanes loaded one by one beyond) or not at all (a splat).  None
    for any other factor."""
    guards, core = padding_guards(factor)
    if not all(_moves_by_constant_steps(guard, axis) for guard in guards):
        return None
    if core.dtype != "float32" or not any(isinstance(node, Load) and reads(node, axis) for node in scalar_nodes(core)):
        return None
    return (guards, core) if _VectorCore(axis).visit(core) else None


def padding_guards(factor: ScalarExpr) -> tuple[list[ScalarExpr], ScalarExpr]:
    """The conditions of the zero guards around ``factor``'s core, outermost first, and the
    core: ``select(g1, select(g2, core, 0), 0)`` gives ``([g1, g2], core)``."""
    guards = []
    while isinstance(factor, Select) and isinstance(factor.b, FloatImm) and factor.b.value == 0.0:
        guards.append(factor.condition)
        factor = factor.a
    return guards, factor


def _moves_by_constant_steps(guard: ScalarExpr, axis: SizeVar) -> bool:
    """Whether ``guard`` orders two index values that each move by a constant per step of ``axis``."""
    if not (isinstance(guard, Compare) and guard.op in ORDERINGS and isinstance(guard.a, IndexValue)
            and isinstance(guard.b, IndexValue)):
        return False
    return all(as_int(simplify(substitute(side, {axis.name: axis + 1}) - side)) is not None
               for side in (guard.a.value, guard.b.value))


class _VectorCore(ScalarFunctor):
    """Whether a core is float32 loads (those reading ``axis`` at a constant positive stride in
    their last index), constants and ops with f32x4 forms, and nothing else."""

    def __init__(self, axis: SizeVar) -> None:
        self.axis = axis

    def visit_load(self, node: Load) -> bool:
        return node.dtype == "float32" and (not reads(node, self.axis) or last_stride(node, self.axis) is not None)

    def visit_float_imm(self, node: FloatImm) -> bool:
        return node.dtype == "float32"

    def visit_binary(self, node: Binary) -> bool:
        return (node.dtype == "float32" and node.op in VECTOR_BINARY_OPS
                and self.visit(node.a) and self.visit(node.b))

    def visit_unary(self, node: Unary) -> bool:
        return node.dtype == "float32" and node.op in VECTOR_UNARY_OPS and self.visit(node.a)

    def visit_default(self, node: ScalarExpr) -> bool:
        return False


def branched_interior(factor: ScalarExpr, axis: SizeVar) -> ScalarExpr | None:
    """``factor`` when it chooses among inputs by conditions that ``axis`` does not change,
    each input a core of :func:`padded_interior` without guards: a concat's or a split's
    channel ranges fused into the input of a 1x1 convolution
    (``select(rc < c, A[n, rc, h, w], B[n, rc - c, h, w])``, selects nested for more inputs).
    Four lanes along one row of ``axis`` then take the same branch at every step, and in it
    read four consecutive elements (``packing.pack_branches``).  A vector select would
    evaluate every branch (the others' loads may lie out of bounds), so the lanes took the
    scalar path one element at a time.  None for any other factor (a padded one:
    :func:`padded_interior`)."""
    if not isinstance(factor, Select):
        return None

    def chosen(node: ScalarExpr) -> bool:
        if isinstance(node, Select) and node.dtype == "float32" and node.condition.dtype == "bool":
            if depends_on(node.condition, axis.name):
                return False
            if any(isinstance(n, Load) for n in scalar_nodes(node.condition)):
                return False
            return chosen(node.a) and chosen(node.b)
        interior = padded_interior(node, axis)
        return interior is not None and not interior[0]

    return factor if chosen(factor) else None


def lane_math(expr: ScalarExpr) -> list[tuple[Unary, ScalarExpr]]:
    """The outermost float32 calls of the math library in ``expr`` (a convolution's fused
    SiLU under its padding's selects), each with its argument guarded by the selects above
    it (``select(c, arg, 0)`` under a then-branch): evaluated for four lanes at once, a lane
    whose guard fails computes the function of 0, never read.  A call found under two
    different guards, or whose argument reduces, is left out."""
    guards: dict[Unary, set[ScalarExpr | None]] = {}

    def visit(node: ScalarExpr, guard: Callable[[ScalarExpr], ScalarExpr]) -> None:
        if isinstance(node, Unary) and node.op in MATH_CALLS and node.a.dtype == "float32":
            guards.setdefault(node, set()).add(None if contains_reduce(node.a) else guard(node.a))
            return
        if isinstance(node, Reduce):
            return
        if isinstance(node, Select):
            zero = FloatImm(0.0, node.dtype)
            visit(node.condition, guard)
            visit(node.a, lambda e: guard(Select(node.condition, e, zero) if e.dtype == node.dtype else e))
            visit(node.b, lambda e: guard(Select(node.condition, zero, e) if e.dtype == node.dtype else e))
            return
        for child in scalar_children(node):
            visit(child, guard)

    visit(expr, lambda e: e)
    return [(node, next(iter(found))) for node, found in guards.items() if len(found) == 1 and None not in found]


@dataclass(frozen=True)
class LaneVectors:
    """How ``packing.pack_vectors`` evaluates a factor for four consecutive lanes as one f32x4
    (:func:`lane_vectors`): ``invariants``, its largest parts that no lane axis changes
    (computed once as scalars and splatted: a bias), ``contiguous``, its loads whose four
    lanes are four consecutive elements (one ``v128.load``), and ``gathered``, its other
    loads that the lanes change (four ``f32.load`` into one f32x4)."""

    invariants: tuple[ScalarExpr, ...]
    contiguous: tuple[Load, ...]
    gathered: tuple[Load, ...]


def lane_vectors(factor: ScalarExpr, axes: Sequence[SizeVar], extents: Sequence[PrimExpr]) -> LaneVectors | None:
    """A :class:`LaneVectors` for ``factor`` when every part of it that the lane axes
    (``axes``, of ``extents``) change has an f32x4 form: float32 loads, constants, the ops
    with f32x4 forms (a fused GELU's erf: polynomials, a select on ``|x|``, exp), a
    ``Select`` whose condition compares floats or no lane axis changes.  A vector select
    evaluates both branches, so every load under a select's branch must also be read where
    the factor reads it unconditionally (a padding select's input is not: convolutions keep
    their guarded paths).  None otherwise, and for a bare load the lanes do not read
    contiguously (nothing to compute: the scalar copy is as good)."""
    if factor.dtype != "float32" or not axes or contains_reduce(factor):
        return None
    forms = _LaneForms(axes, extents, _unconditional_loads(factor))
    if not forms.check(factor, False) or (isinstance(factor, Load) and factor not in forms.contiguous):
        return None
    return LaneVectors(tuple(forms.invariants), tuple(forms.contiguous), tuple(forms.gathered))


def _unconditional_loads(factor: ScalarExpr) -> set[ScalarExpr]:
    """The loads ``factor`` reads whatever its selects choose (not under a select's branch)."""
    found: set[ScalarExpr] = set()

    def plain(node: ScalarExpr) -> None:
        if isinstance(node, Load):
            found.add(node)
        elif isinstance(node, Select):
            plain(node.condition)
        else:
            for child in scalar_children(node):
                plain(child)

    plain(factor)
    return found


class _LaneForms(ScalarFunctor):
    """:func:`lane_vectors`'s walk: whether each lane-dependent part has an f32x4 form,
    collecting the invariants and the contiguous and gathered loads in the order met."""

    def __init__(self, axes: Sequence[SizeVar], extents: Sequence[PrimExpr], unconditional: set[ScalarExpr]) -> None:
        self.axes, self.extents, self.unconditional = axes, extents, unconditional
        self.names = {axis.name for axis in axes}
        self.invariants: list[ScalarExpr] = []
        self.contiguous: list[Load] = []
        self.gathered: list[Load] = []
        self.guarded = False  # under a select's branch

    def check(self, node: ScalarExpr, guarded: bool) -> bool:
        """Whether ``node`` has an f32x4 form (``guarded``: it is under a select's branch)."""
        if guarded and any(isinstance(n, Load) and n not in self.unconditional for n in scalar_nodes(node)):
            return False
        if not any(depends_on(node, name) for name in self.names):
            return self.invariant(node)
        outer, self.guarded = self.guarded, guarded
        try:
            return self.visit(node)
        finally:
            self.guarded = outer

    def invariant(self, node: ScalarExpr) -> bool:
        """A part no lane changes: a float constant, or a float or bool value splatted."""
        if isinstance(node, FloatImm) and node.dtype == "float32":
            return True
        if node.dtype not in ("float32", "bool"):
            return False
        if node not in self.invariants:
            self.invariants.append(node)
        return True

    def visit_load(self, node: Load) -> bool:
        if node.buffer.dtype != "float32":
            return False
        found = self.contiguous if along_columns(node, self.axes, self.extents) else self.gathered
        if node not in found:
            found.append(node)
        return True

    def visit_binary(self, node: Binary) -> bool:
        return (node.dtype == "float32" and node.op in VECTOR_BINARY_OPS
                and self.check(node.a, self.guarded) and self.check(node.b, self.guarded))

    def visit_unary(self, node: Unary) -> bool:
        return node.dtype == "float32" and node.op in VECTOR_UNARY_OPS and self.check(node.a, self.guarded)

    def visit_compare(self, node: Compare) -> bool:
        return (node.a.dtype == "float32" and node.op in VECTOR_COMPARE_OPS
                and self.check(node.a, self.guarded) and self.check(node.b, self.guarded))

    def visit_select(self, node: Select) -> bool:
        return (node.dtype == "float32" and self.check(node.condition, self.guarded)
                and self.check(node.a, True) and self.check(node.b, True))

    def visit_default(self, node: ScalarExpr) -> bool:
        return False


def epilogue_nodes(info: MatmulInfo, body: ScalarExpr) -> list[ScalarExpr]:
    """The nodes of an epilogue ``body`` outside its reduction (``info.reduction``, whose
    sums the micro-kernels computed), the reduction node itself included."""
    found, pending = [], [body]
    while pending:
        node = pending.pop()
        found.append(node)
        if node != info.reduction:
            pending.extend(scalar_children(node))
    return found


def vector_columns(info: MatmulInfo, program: TensorProgram) -> int:
    """How many of the last column axes a packed matmul may apply the epilogue to four flat
    columns at a time along (0: none): the longest suffix of the column axes that are the
    output's last axes, in order (four consecutive flat columns within it are four
    consecutive elements: a convolution's output positions [H, W]; not its batch axis, a
    column axis too where the weight does not read it), for a float32 output and an
    epilogue of ops with f32x4 forms (a bias, a residual add, ReLU as a maximum, SiLU's
    sigmoid) whose loads read those axes as the output does (``along_columns``: one
    ``v128.load``) or not at all (a splat).  With K = 64 (a ResNet 1x1 convolution, 64 ->
    256 at 56 x 56) the element-by-element epilogue took 30% of the kernel, and more with
    symbolic sizes (an unflattening by run-time extents for each element)."""
    return _vector_suffix(info.columns, info, program)


def vector_rows(info: MatmulInfo, program: TensorProgram) -> int:
    """:func:`vector_columns` along the rows: how many of the last row axes the epilogue may
    take four flat rows of one column at a time along (a convolution whose output positions
    are the rows and its output channels the columns, the weight the second factor).  Element
    by element, a 3x3 convolution's SiLU (64 -> 64 channels at 40 x 40) took 23% of its time."""
    return _vector_suffix(info.rows, info, program)


def _vector_suffix(positions: tuple[int, ...], info: MatmulInfo, program: TensorProgram) -> int:
    """The longest suffix of the axes at ``positions`` (rows or columns) along which four flat
    indices are four consecutive output elements and the epilogue has an f32x4 form (see
    :func:`vector_columns`)."""
    if program.output.dtype != "float32":
        return 0
    count = 0
    while count < len(positions) and positions[len(positions) - 1 - count] == len(program.axes) - 1 - count:
        count += 1
    if not count:
        return 0
    axes = program.axes[-count:]
    extents = program.output.shape[-count:]
    for node in epilogue_nodes(info, program.body):
        if node == info.reduction:
            continue
        if node.dtype != "float32":
            return 0
        if isinstance(node, Load):
            if any(reads(node, axis) for axis in axes) and not along_columns(node, axes, extents):
                return 0
        elif isinstance(node, Binary):
            if node.op not in VECTOR_BINARY_OPS:
                return 0
        elif isinstance(node, Unary):
            if node.op not in VECTOR_UNARY_OPS:
                return 0
        elif not isinstance(node, FloatImm):
            return 0
    return count
