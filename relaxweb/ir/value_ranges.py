"""Ranges of the integer values of tensor programs: which int64 arithmetic provably fits int32.

The device holds an int64 tensor as int32 (``dtype.py``) and kernels compute int64 in 32
bits.  Every int64 ``add``, ``subtract``, ``multiply``, ``divide``, ``negative``, ``sum`` and
``prod`` (and a cast to int64 from a float or a uint32) is therefore checked at run time
(``integer_checks.py``: the run fails naming the ONNX node) unless this module proves the
exact result fits int32.  int32 arithmetic wraps, as onnxruntime's does, and is not checked.

:class:`ProgramRanges` gives an interval holding every value an expression of one program
can take on the device: a load of an int8 buffer lies in ``[-128, 127]``, of an int64 buffer
in int32's range (the runtimes check inputs, and every int64 result is checked or proved to
fit), or in the range its call sites pass (:class:`TensorRanges`: a constant's elements,
what the program that computed the tensor can hold); an index value lies within the
analyzer's bounds of its index expression (the axes in their extents, the size variables
within the user's ``--bound``s, everything below int32's largest value: kernels index in
i32); a checked int64 result lies in int32 (a run where it would not has failed).  Shape and
index arithmetic is thus proved to fit and pays nothing: ``int64(index(i)) + 1`` lies in
``[1, 2^31 - 1]``, and index arithmetic computed as int64 that is at most the element count
of one of the program's buffers fits.  A reduction's range bounds all its partial results
too (every partial sum of ``extent`` terms in ``[l, h]`` lies in ``[min(0, extent * l),
max(0, extent * h)]``), so a sum proved to fit needs no check at any step.  Floats are not
tracked.

:func:`with_integer_checks` wraps what legalization cannot prove; :func:`without_proven_checks`
unwraps what the pass ``prove_integer_checks`` proves later (after fusion, with every call
site's ranges).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Mapping

import numpy as np

from .analyzer import Analyzer
from .dtype import DTYPES, DtypeKind
from .expr import CallLibrary, CallTIR, Constant, Expr, MatchCast, Var, VarBinding
from .integer_checks import CheckedInteger, checked_operation
from .scalar_functor import ScalarFunctor
from .symbolic import IntImm, PrimExpr, SizeVar
from .tir import (
    Binary, BinaryOp, Cast, Compare, FloatImm, Gather, IndexValue, Load, Reduce, ReduceCombiner, ScalarExpr, Select,
    TensorProgram, Unary, UnaryOp, map_scalar,
)

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1


@dataclass(frozen=True)
class ValueRange:
    """``lo <= value <= hi`` (None: unbounded on that side)."""

    lo: int | None
    hi: int | None

    def within(self, lo: int, hi: int) -> bool:
        return self.lo is not None and self.hi is not None and lo <= self.lo and self.hi <= hi

    @property
    def fits_int32(self) -> bool:
        return self.within(INT32_MIN, INT32_MAX)

    def contains(self, value: int) -> bool:
        return (self.lo is None or self.lo <= value) and (self.hi is None or value <= self.hi)

    def union(self, other: ValueRange) -> ValueRange:
        lo = None if self.lo is None or other.lo is None else min(self.lo, other.lo)
        hi = None if self.hi is None or other.hi is None else max(self.hi, other.hi)
        return ValueRange(lo, hi)

    def intersect(self, other: ValueRange) -> ValueRange:
        lo = other.lo if self.lo is None else self.lo if other.lo is None else max(self.lo, other.lo)
        hi = other.hi if self.hi is None else self.hi if other.hi is None else min(self.hi, other.hi)
        return ValueRange(lo, hi)

    @property
    def magnitude(self) -> int | None:
        """The largest ``|value|`` (None: unbounded)."""
        return None if self.lo is None or self.hi is None else max(abs(self.lo), abs(self.hi))


UNBOUNDED = ValueRange(None, None)
INT32_RANGE = ValueRange(INT32_MIN, INT32_MAX)
BOOL_RANGE = ValueRange(0, 1)


def dtype_range(dtype: str) -> ValueRange:
    """What a value of ``dtype`` can be on the device: its own range for the integer dtypes
    the device holds exactly, int32's for int64 (held as int32), unbounded for floats."""
    info = DTYPES.get(dtype)
    if info is None or info.is_float:
        return UNBOUNDED
    if info.kind is DtypeKind.BOOL:
        return BOOL_RANGE
    bits = 8 * min(info.bytes, 4)
    if info.kind is DtypeKind.UINT:
        return ValueRange(0, 2**bits - 1)
    return ValueRange(-2**(bits - 1), 2**(bits - 1) - 1)


#: The int64 operations kernels compute in 32 bits: checked for overflow unless proved to fit.
CHECKED_BINARY_OPS = frozenset({BinaryOp.ADD, BinaryOp.SUBTRACT, BinaryOp.MULTIPLY, BinaryOp.DIVIDE})
CHECKED_COMBINERS = frozenset({ReduceCombiner.SUM, ReduceCombiner.PROD})


SizeRanges = dict[str, tuple[int, "int | None"]]


class TensorRanges:
    """The range of each tensor of a graph function that a tensor program computed (what its
    body can hold, given its call site), read binding by binding in order: the ranges a
    later call site's input buffers get.  A constant argument's range is its smallest and
    largest element; anything else the range of its dtype on the device."""

    def __init__(self, analyzer: Analyzer) -> None:
        self.analyzer = analyzer  # the graph's size variables (the user's bounds)
        self.tensors: dict[Var, ValueRange] = {}

    def at_call(self, call: CallTIR, program: TensorProgram) -> tuple[SizeRanges, dict[str, ValueRange]]:
        """The ranges of ``program``'s size variables and input buffers at ``call``."""
        sizes = {name: (max(self.analyzer.lower_bound(expr) or 0, 0), self.analyzer.upper_bound(expr))
                 for name, expr in call.size_var_values}
        return sizes, {buffer.name: self.tensor_range(arg) for buffer, arg in zip(program.inputs, call.args)}

    def note(self, binding: VarBinding | MatchCast, programs: Mapping[str, object]) -> None:
        """Record the range of the tensor ``binding`` binds (a program's result, an alias)."""
        value = binding.value
        program = programs.get(value.program) if isinstance(value, CallTIR) else None
        if isinstance(program, TensorProgram) and not isinstance(value, CallLibrary):
            sizes, buffers = self.at_call(value, program)
            self.tensors[binding.var] = ProgramRanges(program, sizes, buffers).value_range(program.body)
        elif isinstance(value, Var) and value in self.tensors:
            self.tensors[binding.var] = self.tensors[value]

    def tensor_range(self, arg: Expr) -> ValueRange:
        """What the elements of a program's argument can be on the device."""
        dtype = getattr(arg.struct_info, "dtype", None)
        if isinstance(arg, Constant) and arg.data.size and np.issubdtype(arg.data.dtype, np.integer):
            return ValueRange(int(arg.data.min()), int(arg.data.max()))
        if isinstance(arg, Var) and arg in self.tensors:
            return self.tensors[arg]
        return dtype_range(dtype) if isinstance(dtype, str) else UNBOUNDED


class ProgramRanges:
    """The ranges of one program's values: its size variables in ``size_ranges`` (by default
    ``[0, inf)``), each axis in ``[0, extent - 1]``, the elements of each input buffer in
    ``buffer_ranges`` (by default the range of its dtype on the device).  Index arithmetic computed as int64 values
    (``int64(index(i3)) + int64(index(i0)) * int64(index(seq))``, an exporter's flat index)
    fits when it provably lies at or below the element count of one of the program's buffers:
    kernels address elements with i32 offsets, so no buffer a kernel reads or writes has 2^31
    elements."""

    def __init__(self, program: TensorProgram, size_ranges: Mapping[str, tuple[int, int | None]] | None = None,
                 buffer_ranges: Mapping[str, ValueRange] | None = None) -> None:
        analyzer = Analyzer(dict(size_ranges or {}))
        for axis, extent in zip(program.axes, program.output.shape):
            analyzer = _with_axis(analyzer, axis, extent)
        self.analyzer = analyzer
        self.element_counts = tuple(_element_count(buffer.shape) for buffer in (*program.inputs, program.output))
        self.buffer_ranges = dict(buffer_ranges or {})
        self._ranges = _Ranges(self)

    def value_range(self, expr: ScalarExpr) -> ValueRange:
        """Every value ``expr`` can hold on the device (see the module doc)."""
        return self._ranges.visit(expr)

    def exact_range(self, expr: ScalarExpr) -> ValueRange:
        """Every exact (unwrapped) result of ``expr``'s own operation on the values its
        operands can hold: what must fit int32 for an int64 operation to need no check."""
        return self._ranges.exact(expr)

    def needs_overflow_check(self, expr: ScalarExpr) -> bool:
        """True for an int64 operation computed in 32 bits whose exact result may not fit
        int32 (:func:`is_int64_arithmetic`)."""
        return is_int64_arithmetic(expr) and not self.exact_range(expr).fits_int32

    def needs_zero_divisor_check(self, expr: ScalarExpr) -> bool:
        """True for an integer division whose divisor may be 0 (onnxruntime fails such a run)."""
        info = DTYPES.get(expr.dtype)
        if expr.scalar_kind != "binary" or expr.op is not BinaryOp.DIVIDE or info is None or not info.is_integer:
            return False
        return self.value_range(expr.b).contains(0)


def _element_count(shape: tuple[PrimExpr, ...]) -> PrimExpr:
    count = IntImm(1)
    for dim in shape:
        count = count * dim
    return count


def _with_axis(analyzer: Analyzer, axis: SizeVar, extent: PrimExpr) -> Analyzer:
    """``axis`` in ``[0, extent - 1]``, and below int32's largest value: kernels index in i32."""
    upper = analyzer.upper_bound(extent)
    upper = INT32_MAX if upper is None else min(upper, INT32_MAX)
    analyzer = analyzer.with_range(axis.name, 0, max(upper - 1, 0))
    return analyzer.with_symbolic_upper(axis.name, extent - 1)


def is_int64_arithmetic(expr: ScalarExpr) -> bool:
    """True for the int64 operations kernels compute in 32 bits that can leave int32
    (``integer_checks.checked_operation``): an add, subtract, multiply, divide
    (``INT32_MIN / -1``), negative, sum, prod, and a cast to int64 from a float or a uint32."""
    return expr.dtype == "int64" and checked_operation(expr) is not None


OVERFLOW_MESSAGE = "the int64 result does not fit in the 32 bits the device holds int64 in"


def with_integer_checks(program: TensorProgram, site: Callable[[], int],
                        size_ranges: Mapping[str, tuple[int, int | None]] | None = None,
                        buffer_ranges: Mapping[str, ValueRange] | None = None) -> TensorProgram:
    """``program`` with each int64 operation that may not fit int32 (:class:`ProgramRanges`
    over ``size_ranges`` and ``buffer_ranges`` cannot prove it does) in a
    :class:`CheckedInteger` of ``site()`` (called once, on the first such operation: a
    program that needs none makes no site)."""
    ranges = ProgramRanges(program, size_ranges, buffer_ranges)
    sites: list[int] = []

    def check(node: ScalarExpr) -> ScalarExpr | None:
        if not ranges.needs_overflow_check(node):
            return None
        if not sites:
            sites.append(site())
        return CheckedInteger(sites[0], node)

    body = map_scalar(program.body, check)
    return program if body is program.body else replace(program, body=body)


def without_proven_checks(program: TensorProgram, ranges: ProgramRanges) -> TensorProgram:
    """``program`` without the :class:`CheckedInteger` and :class:`CheckedDivisor` nodes
    ``ranges`` proves never fail."""
    def drop(node: ScalarExpr) -> ScalarExpr | None:
        kind = node.scalar_kind
        if kind == "checked_integer" and ranges.exact_range(node.value).fits_int32:
            return node.value
        if kind == "checked_divisor" and not ranges.value_range(node.divisor).contains(0):
            return node.divisor
        return None

    body = map_scalar(program.body, drop)
    return program if body is program.body else replace(program, body=body)


class _Ranges(ScalarFunctor):
    """The range of each kind (``visit``: held on the device; ``exact``: before narrowing)."""

    def __init__(self, program: ProgramRanges, analyzer: Analyzer | None = None) -> None:
        self.program = program
        self.analyzer = program.analyzer if analyzer is None else analyzer
        self.memo: dict[int, tuple[ScalarExpr, ValueRange]] = {}

    def visit(self, expr: ScalarExpr, *args) -> ValueRange:
        known = self.memo.get(id(expr))
        if known is not None and known[0] is expr:
            return known[1]
        result = self.held(expr, self.exact(expr))
        self.memo[id(expr)] = (expr, result)
        return result

    def exact(self, expr: ScalarExpr) -> ValueRange:
        if expr.dtype == "int64" and expr.scalar_kind in ("binary", "unary"):
            form = _IndexForm(self)
            index = form.visit(expr)
            if index is not None:
                return self.index_range(index, form.analyzer)
        return super().visit(expr)

    def index_range(self, index: PrimExpr, analyzer: Analyzer) -> ValueRange:
        """The range of int64 arithmetic on index values, as the index expression it is."""
        exact = ValueRange(analyzer.lower_bound(index), analyzer.upper_bound(index))
        if exact.fits_int32 or exact.lo is None or exact.lo < INT32_MIN:
            return exact
        if any(analyzer.prove_less_equal(index, count) for count in self.program.element_counts):
            return ValueRange(exact.lo, INT32_MAX)
        return exact

    @staticmethod
    def held(expr: ScalarExpr, exact: ValueRange) -> ValueRange:
        """What the device holds of an exact result: an int64 one is int32 (checked or proved),
        a narrower integer one is its exact range where that fits its device dtype and wraps
        to the whole of it otherwise."""
        if expr.dtype == "int64":
            held = exact.intersect(INT32_RANGE)
            return held if held.lo is None or held.hi is None or held.lo <= held.hi else INT32_RANGE
        device = dtype_range(DTYPES[expr.dtype].compute_dtype) if expr.dtype in DTYPES else UNBOUNDED
        if device is UNBOUNDED:
            return UNBOUNDED
        return exact if exact.within(device.lo, device.hi) else device

    def visit_load(self, expr: Load) -> ValueRange:
        return self.program.buffer_ranges.get(expr.buffer.name, dtype_range(expr.dtype))

    def visit_gather(self, expr: Gather) -> ValueRange:
        return self.program.buffer_ranges.get(expr.buffer.name, dtype_range(expr.dtype))

    def visit_float_imm(self, expr: FloatImm) -> ValueRange:
        if dtype_range(expr.dtype) is UNBOUNDED or expr.value != int(expr.value):
            return UNBOUNDED
        return ValueRange(int(expr.value), int(expr.value))

    def visit_index_value(self, expr: IndexValue) -> ValueRange:
        """Within the analyzer's bounds and int32's (kernels compute indices in i32, and an
        index a kernel evaluates addresses a tensor: it does not wrap)."""
        exact = ValueRange(self.analyzer.lower_bound(expr.value), self.analyzer.upper_bound(expr.value))
        return exact.intersect(INT32_RANGE)

    def visit_cast(self, expr: Cast) -> ValueRange:
        """The operand's values (a float one is unbounded here: floats are not tracked)."""
        return self.visit(expr.a) if dtype_range(expr.dtype) is not UNBOUNDED else UNBOUNDED

    def visit_compare(self, expr: Compare) -> ValueRange:
        return BOOL_RANGE

    def visit_checked_integer(self, expr: ScalarExpr) -> ValueRange:
        return self.visit(expr.value)

    def visit_checked_divisor(self, expr: ScalarExpr) -> ValueRange:
        """The divisor's values, 0 read as 1."""
        divisor = self.visit(expr.divisor)
        return divisor.union(ValueRange(1, 1)) if divisor.contains(0) else divisor

    def visit_checked_index(self, expr: ScalarExpr) -> ValueRange:
        upper = self.analyzer.upper_bound(expr.extent)
        return ValueRange(0, INT32_MAX if upper is None else max(min(upper - 1, INT32_MAX), 0))

    def visit_select(self, expr: Select) -> ValueRange:
        return self.visit(expr.a).union(self.visit(expr.b))

    def visit_unary(self, expr: Unary) -> ValueRange:
        if expr.op is UnaryOp.IS_NAN:
            return BOOL_RANGE
        if expr.op is UnaryOp.NEGATIVE:
            a = self.visit(expr.a)
            return ValueRange(None if a.hi is None else -a.hi, None if a.lo is None else -a.lo)
        return UNBOUNDED

    def visit_binary(self, expr: Binary) -> ValueRange:
        if dtype_range(expr.dtype) is UNBOUNDED:
            return UNBOUNDED
        return BINARY_RANGES.get(expr.op, _whole_dtype)(self.visit(expr.a), self.visit(expr.b), expr.dtype)

    def visit_reduce(self, expr: Reduce) -> ValueRange:
        if dtype_range(expr.dtype) is UNBOUNDED:
            return UNBOUNDED
        inner = _Ranges(self.program, _with_axis(self.analyzer, expr.axis, expr.extent))
        body = inner.visit(expr.body)
        longest = self.analyzer.upper_bound(expr.extent)
        longest = INT32_MAX if longest is None else min(longest, INT32_MAX)  # kernels loop over it in i32
        may_be_empty = not self.analyzer.prove_less_equal(1, expr.extent)
        return REDUCE_RANGES[expr.combiner](body, longest, may_be_empty, expr.dtype)


def _add(a: ValueRange, b: ValueRange, dtype: str) -> ValueRange:
    return ValueRange(None if a.lo is None or b.lo is None else a.lo + b.lo,
                      None if a.hi is None or b.hi is None else a.hi + b.hi)


def _subtract(a: ValueRange, b: ValueRange, dtype: str) -> ValueRange:
    return ValueRange(None if a.lo is None or b.hi is None else a.lo - b.hi,
                      None if a.hi is None or b.lo is None else a.hi - b.lo)


def _multiply(a: ValueRange, b: ValueRange, dtype: str) -> ValueRange:
    if a == ValueRange(0, 0) or b == ValueRange(0, 0):
        return ValueRange(0, 0)
    if None in (a.lo, a.hi, b.lo, b.hi):
        return UNBOUNDED
    products = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]
    return ValueRange(min(products), max(products))


def _divide(a: ValueRange, b: ValueRange, dtype: str) -> ValueRange:
    """Truncating division by a non-zero divisor (a zero one fails the run): ``|a / b| <= |a|``,
    ``a / b`` has the sign of ``a`` where ``b > 0``."""
    size = a.magnitude
    if b.lo is not None and b.lo >= 1:  # a positive divisor keeps the dividend's sign
        return ValueRange(None if a.lo is None else min(a.lo, 0), None if a.hi is None else max(a.hi, 0))
    return UNBOUNDED if size is None else ValueRange(-size, size)


def _extremum(pick) -> callable:
    def extremum(a: ValueRange, b: ValueRange, dtype: str) -> ValueRange:
        lo = None if a.lo is None or b.lo is None else pick(a.lo, b.lo)
        hi = None if a.hi is None or b.hi is None else pick(a.hi, b.hi)
        if pick is max:  # max(a, b) >= either operand's low end
            lo = a.lo if b.lo is None else b.lo if a.lo is None else lo
        else:  # min(a, b) <= either operand's high end
            hi = a.hi if b.hi is None else b.hi if a.hi is None else hi
        return ValueRange(lo, hi)

    return extremum


def _bitwise_and(a: ValueRange, b: ValueRange, dtype: str) -> ValueRange:
    highs = [r.hi for r in (a, b) if r.lo is not None and r.lo >= 0 and r.hi is not None]
    return ValueRange(0, min(highs)) if highs else dtype_range(DTYPES[dtype].compute_dtype)


def _bitwise_or_xor(a: ValueRange, b: ValueRange, dtype: str) -> ValueRange:
    if all(r.lo is not None and r.lo >= 0 and r.hi is not None for r in (a, b)):
        return ValueRange(0, 2 ** max(a.hi, b.hi).bit_length() - 1)
    return dtype_range(DTYPES[dtype].compute_dtype)


def _shift_right(a: ValueRange, b: ValueRange, dtype: str) -> ValueRange:
    return ValueRange(None if a.lo is None else min(a.lo, 0), None if a.hi is None else max(a.hi, 0))


def _whole_dtype(a: ValueRange, b: ValueRange, dtype: str) -> ValueRange:
    return dtype_range(DTYPES[dtype].compute_dtype)


BINARY_RANGES = {
    BinaryOp.ADD: _add, BinaryOp.SUBTRACT: _subtract, BinaryOp.MULTIPLY: _multiply, BinaryOp.DIVIDE: _divide,
    BinaryOp.MAXIMUM: _extremum(max), BinaryOp.MINIMUM: _extremum(min), BinaryOp.BITWISE_AND: _bitwise_and,
    BinaryOp.BITWISE_OR: _bitwise_or_xor, BinaryOp.BITWISE_XOR: _bitwise_or_xor, BinaryOp.SHIFT_RIGHT: _shift_right,
}


def _sum(body: ValueRange, longest: int, may_be_empty: bool, dtype: str) -> ValueRange:
    """Every partial sum of at most ``longest`` terms in ``body`` (0 for none)."""
    return ValueRange(None if body.lo is None else min(0, longest * body.lo),
                      None if body.hi is None else max(0, longest * body.hi))


def _prod(body: ValueRange, longest: int, may_be_empty: bool, dtype: str) -> ValueRange:
    """Every partial product of at most ``longest`` factors in ``body`` (1 for none)."""
    size = body.magnitude
    if size is None:
        return UNBOUNDED
    if size <= 1:
        return ValueRange(0 if body.lo >= 0 else -1, 1)
    if longest * (size.bit_length() - 1) > 64:  # at least 2^65: far outside int32 (and not computed)
        return UNBOUNDED
    largest = size ** longest
    return ValueRange(1 if body.lo >= 1 else 0 if body.lo >= 0 else -largest, largest)


def _extreme(body: ValueRange, longest: int, may_be_empty: bool, dtype: str) -> ValueRange:
    """max / min: a body value, or the dtype's extreme over an empty range."""
    return body.union(dtype_range(DTYPES[dtype].compute_dtype)) if may_be_empty else body


REDUCE_RANGES = {
    ReduceCombiner.SUM: _sum, ReduceCombiner.PROD: _prod, ReduceCombiner.MAX: _extreme, ReduceCombiner.MIN: _extreme,
}


class _IndexForm(ScalarFunctor):
    """Integer arithmetic on index values and integer constants as the index expression it
    computes (None for anything else); a load of a bounded integer (a constant's elements,
    ``[lo, hi]``) is ``lo`` plus a new variable in ``[0, hi - lo]``, which ``analyzer`` knows."""

    def __init__(self, ranges: _Ranges) -> None:
        self.ranges = ranges
        self.analyzer = ranges.analyzer

    def visit_load(self, expr: Load) -> PrimExpr | None:
        known = self.ranges.visit(expr)
        if dtype_range(expr.dtype) is UNBOUNDED or not known.fits_int32 or known.lo > known.hi:
            return None
        name = f"loaded_{len(self.analyzer.ranges)}_"
        self.analyzer = self.analyzer.with_range(name, 0, known.hi - known.lo)
        return SizeVar(name) + known.lo

    visit_gather = visit_load

    def visit_index_value(self, expr: IndexValue) -> PrimExpr | None:
        return expr.value

    def visit_float_imm(self, expr: FloatImm) -> PrimExpr | None:
        return IntImm(int(expr.value)) if dtype_range(expr.dtype) is not UNBOUNDED and expr.value == int(expr.value) else None

    def visit_cast(self, expr: Cast) -> PrimExpr | None:
        return self.visit(expr.a) if expr.a.dtype in ("int32", "int64") else None

    def visit_binary(self, expr: Binary) -> PrimExpr | None:
        operation = _INDEX_OPERATIONS.get(expr.op)
        a = None if operation is None else self.visit(expr.a)
        b = None if a is None else self.visit(expr.b)
        return None if b is None else operation(a, b)

    def visit_unary(self, expr: Unary) -> PrimExpr | None:
        a = self.visit(expr.a) if expr.op is UnaryOp.NEGATIVE else None
        return None if a is None else IntImm(0) - a

    def visit_checked_integer(self, expr: ScalarExpr) -> PrimExpr | None:
        return self.visit(expr.value)

    def visit_default(self, expr: ScalarExpr, *args) -> None:
        return None


_INDEX_OPERATIONS = {BinaryOp.ADD: lambda a, b: a + b, BinaryOp.SUBTRACT: lambda a, b: a - b,
                     BinaryOp.MULTIPLY: lambda a, b: a * b}

