"""Loop-level IR: tensor programs in compute-definition form.

A :class:`TensorProgram` defines one output buffer element by element::

    output[i0, i1] = sum(k < 64: A[i0, k] * B[k, i1])

``axes`` are the output's index variables (one per output dimension), ``body`` is a scalar
expression of them that may read input buffers (:class:`Load`) and contain reductions
(:class:`Reduce`).  Buffer shapes are symbolic; the program's *size variables* are the
variables that appear in them, and each call site binds them.  This form is easy to analyse
(elementwise, broadcast, reduction, matmul-like) and to fuse; code generation
(``relaxweb.wgsl``) chooses the loops.

Index expressions are :class:`~relaxweb.ir.symbolic.PrimExpr` over the axes and size
variables; axis variables are ``SizeVar`` whose names do not clash with size variables.
An indirect load (:class:`Gather`) also takes indices computed at run time (scalar
expressions, e.g. a value loaded from an index tensor), clamped into the buffer's extents;
an index from data that must lie in its axis is a :class:`CheckedIndex`, which reports one
that does not as the run's error (``relaxweb/ir/error_sites.py``).

Scalar expressions have a dtype (``expr.dtype``): a load has its buffer's, an
:class:`IndexValue` (an index expression used as a value, e.g. an element count) is
``int32`` like every index in the generated code, a :class:`Compare` is ``bool``.
:class:`Select` evaluates only the branch it picks, so a branch may load out of bounds when
it is not picked (``concat`` reads ``B[i - n]`` only where ``i >= n``).

Ops are enums (:class:`BinaryOp`, :class:`UnaryOp`, :class:`CompareOp`,
:class:`ReduceCombiner`) that print as their names; backends keep one table per enum with
an entry for every member.  Legalizations write expressions with operators and the helpers
below (``maximum``, ``select``, ``exp``, ``cast`` ...): ``select(x.lt(0), -x, x) * 0.5``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from typing import Callable, ClassVar, Mapping

from .dtype import DTYPES, GPU_DTYPES, dtype_info
from .hash_once import hash_once
from .scalar_functor import ScalarFunctor, ScalarMutator, ScalarVisitor, scalar_operands
from .symbolic import PrimExpr, SizeVar, as_expr, format_expr, format_shape, format_size_var, free_vars, substitute
from .syntax import format_keywords, format_number, format_string, is_plain_name, unique_identifier
from .target_schedules import TargetSchedules


class NamedEnum(str, Enum):
    """An enum of names (ops, patterns): each member is its name (``BinaryOp.ADD == "add"``)
    and prints as it (``str``, ``format``), so the printed IR writes ``maximum(a, b)`` and
    parsing a name back is ``BinaryOp("maximum")``."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def of(cls, name: "str | NamedEnum") -> "NamedEnum":
        """The member named ``name``; an unknown name raises a ValueError listing the valid ones."""
        try:
            return cls(name)
        except ValueError:
            raise ValueError(f"unknown {cls.__name__} {name!r}; expected one of {', '.join(cls)}") from None


class BinaryOp(NamedEnum):
    """Operators of :class:`Binary`.  ``power`` is float only and follows WGSL's ``pow``:
    undefined for a negative base (and for 0 to a non-positive power); legalizations handle
    negative bases themselves.  The bitwise ops take integers only (on their 32-bit device
    values: an int64 or int8 value is sign-extended there, so the low bits are exact)."""

    ADD = "add"
    SUBTRACT = "subtract"
    MULTIPLY = "multiply"
    DIVIDE = "divide"  # integers truncate toward zero (WGSL)
    MAXIMUM = "maximum"
    MINIMUM = "minimum"
    POWER = "power"
    BITWISE_AND = "bitwise_and"
    BITWISE_OR = "bitwise_or"
    BITWISE_XOR = "bitwise_xor"
    SHIFT_RIGHT = "shift_right"


#: The binary ops whose operands must be integers.
BITWISE_OPS = frozenset({BinaryOp.BITWISE_AND, BinaryOp.BITWISE_OR, BinaryOp.BITWISE_XOR, BinaryOp.SHIFT_RIGHT})


class UnaryOp(NamedEnum):
    """Functions of :class:`Unary`.  ``is_nan`` and ``is_finite`` (neither NaN nor infinite)
    give a bool and test the bit pattern (WGSL lets compilers assume no NaNs and infinities, so
    ``x != x`` may fold away); ``unpack_half`` takes a
    uint32 and gives the float16 in its low 16 bits as a float32 (WGSL's core
    ``unpack2x16float``: no ``shader-f16`` needed); the rest keep the dtype."""

    EXP = "exp"
    TANH = "tanh"
    NEGATIVE = "negative"
    SIGMOID = "sigmoid"
    IS_NAN = "is_nan"
    IS_FINITE = "is_finite"
    UNPACK_HALF = "unpack_half"
    ABSOLUTE = "abs"  # floats (an integer's is max(x, -x))
    # math functions with the same name and meaning in numpy and WGSL (float operands)
    SQRT = "sqrt"
    LOG = "log"
    FLOOR = "floor"
    CEIL = "ceil"
    ROUND = "round"  # halves to even
    SIN = "sin"
    COS = "cos"
    TAN = "tan"
    ASIN = "asin"
    ACOS = "acos"
    ATAN = "atan"
    ASINH = "asinh"
    ACOSH = "acosh"
    ATANH = "atanh"


class ReduceCombiner(NamedEnum):
    """How a :class:`Reduce` combines: over an empty range sum is 0, prod 1, max the lowest
    and min the highest value of the dtype."""

    SUM = "sum"
    MAX = "max"
    MIN = "min"
    PROD = "prod"


class CompareOp(NamedEnum):
    """Comparisons of :class:`Compare` (the result is a bool)."""

    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    EQ = "eq"
    NE = "ne"


# The infix symbol of each comparison, as the printer writes it.
COMPARE_OPS = {
    CompareOp.LT: "<", CompareOp.LE: "<=", CompareOp.GT: ">", CompareOp.GE: ">=", CompareOp.EQ: "==", CompareOp.NE: "!=",
}

# The unary ops that are exactly a math function of numpy and WGSL (an ONNX op of the same name).
MATH_FUNCTIONS = (
    UnaryOp.SQRT, UnaryOp.LOG, UnaryOp.FLOOR, UnaryOp.CEIL, UnaryOp.ROUND, UnaryOp.SIN, UnaryOp.COS, UnaryOp.TAN,
    UnaryOp.ASIN, UnaryOp.ACOS, UnaryOp.ATAN, UnaryOp.ASINH, UnaryOp.ACOSH, UnaryOp.ATANH,
)
# The functions a CPU computes by a routine of tens of instructions (relaxweb/cpu/math.py), not
# an instruction or two.
MATH_CALLS = (
    UnaryOp.EXP, UnaryOp.TANH, UnaryOp.SIGMOID, UnaryOp.LOG, UnaryOp.SIN, UnaryOp.COS, UnaryOp.TAN, UnaryOp.ASIN,
    UnaryOp.ACOS, UnaryOp.ATAN, UnaryOp.ASINH, UnaryOp.ACOSH, UnaryOp.ATANH,
)


@hash_once
@dataclass(frozen=True)
class Buffer:
    """A tensor seen from inside a tensor program."""

    name: str
    shape: tuple[PrimExpr, ...]
    dtype: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(as_expr(d) for d in self.shape))


class ScalarExpr:
    """Base of scalar (element) expressions.

    Every expression has a ``dtype`` (the dtype of its value).  Arithmetic operators build
    expressions, so a legalization reads like the math it computes::

        (x - mean) / sqrt(variance + 1e-5)      # Binary/Unary nodes
        select(x.lt(0), -x, x)                  # comparisons are methods (lt, le, gt, ge, eq, ne)

    A Python number next to an expression becomes a :class:`FloatImm` of the expression's
    dtype (``x * 2`` is ``multiply(x, FloatImm(2, x.dtype))``); operand order is kept.
    ``==`` is not overloaded: expressions are compared structurally (they are dict keys).
    Each kind names itself (``scalar_kind``): code that handles nodes by kind subclasses the
    functor of ``scalar_functor.py``, which dispatches on it.
    """

    __array_ufunc__ = None  # numpy scalars defer to the reflected operators below

    def __add__(self, other: "ScalarExpr | float") -> "ScalarExpr":
        return Binary(BinaryOp.ADD, self, _operand(other, self))

    def __radd__(self, other: float) -> "ScalarExpr":
        return Binary(BinaryOp.ADD, _operand(other, self), self)

    def __sub__(self, other: "ScalarExpr | float") -> "ScalarExpr":
        return Binary(BinaryOp.SUBTRACT, self, _operand(other, self))

    def __rsub__(self, other: float) -> "ScalarExpr":
        return Binary(BinaryOp.SUBTRACT, _operand(other, self), self)

    def __mul__(self, other: "ScalarExpr | float") -> "ScalarExpr":
        return Binary(BinaryOp.MULTIPLY, self, _operand(other, self))

    def __rmul__(self, other: float) -> "ScalarExpr":
        return Binary(BinaryOp.MULTIPLY, _operand(other, self), self)

    def __truediv__(self, other: "ScalarExpr | float") -> "ScalarExpr":
        return Binary(BinaryOp.DIVIDE, self, _operand(other, self))

    def __rtruediv__(self, other: float) -> "ScalarExpr":
        return Binary(BinaryOp.DIVIDE, _operand(other, self), self)

    def __neg__(self) -> "ScalarExpr":
        return Unary(UnaryOp.NEGATIVE, self)

    def lt(self, other: "ScalarExpr | float") -> "Compare":
        return Compare(CompareOp.LT, self, _operand(other, self))

    def le(self, other: "ScalarExpr | float") -> "Compare":
        return Compare(CompareOp.LE, self, _operand(other, self))

    def gt(self, other: "ScalarExpr | float") -> "Compare":
        return Compare(CompareOp.GT, self, _operand(other, self))

    def ge(self, other: "ScalarExpr | float") -> "Compare":
        return Compare(CompareOp.GE, self, _operand(other, self))

    def eq(self, other: "ScalarExpr | float") -> "Compare":
        return Compare(CompareOp.EQ, self, _operand(other, self))

    def ne(self, other: "ScalarExpr | float") -> "Compare":
        return Compare(CompareOp.NE, self, _operand(other, self))


def _operand(value: "ScalarExpr | float", other: ScalarExpr) -> ScalarExpr:
    """``value`` as an operand next to ``other``: a number becomes a constant of ``other``'s
    dtype (an integer stays an int and prints as ``2``, a float as ``2.0``)."""
    if isinstance(value, ScalarExpr):
        return value
    if isinstance(value, bool):
        pass  # a Python bool next to a number is a mistake more often than a 0 / 1
    elif isinstance(value, numbers.Integral):
        return FloatImm(int(value), other.dtype)
    elif isinstance(value, numbers.Real):
        return FloatImm(float(value), other.dtype)
    raise TypeError(f"cannot combine a scalar expression with {value!r}")


@hash_once
@dataclass(frozen=True)
class Load(ScalarExpr):
    """``buffer[indices]``."""

    scalar_kind: ClassVar[str] = "load"

    buffer: Buffer
    indices: tuple[PrimExpr, ...]

    @property
    def dtype(self) -> str:
        return self.buffer.dtype


@hash_once
@dataclass(frozen=True)
class Gather(ScalarExpr):
    """``buffer[indices]`` where some indices are computed at run time (an indirect load).

    Each index is either an index expression (:class:`~relaxweb.ir.symbolic.PrimExpr` over
    the axes and size variables) or an integer scalar expression, typically a value loaded
    from an index tensor (``Cast("int32", Load(indices, ...))``); the generated code uses it
    as an ``i32``.  A scalar index is clamped into ``[0, extent)`` of its dimension, so the
    load never reads out of bounds (callers wrap negative ONNX indices themselves, e.g.
    ``select(i < 0, i + n, i)``; an index still out of range reads the nearest element).
    """

    scalar_kind: ClassVar[str] = "gather"

    buffer: Buffer
    indices: tuple  # of PrimExpr | ScalarExpr

    def __post_init__(self) -> None:
        object.__setattr__(self, "indices", tuple(
            i if isinstance(i, ScalarExpr) else as_expr(i) for i in self.indices
        ))

    @property
    def dtype(self) -> str:
        return self.buffer.dtype


@hash_once
@dataclass(frozen=True)
class CheckedIndex(ScalarExpr):
    """An index read from data, checked at run time (an ``int32``): ``index`` (an integer
    scalar expression, e.g. a value loaded from an index tensor) counts from the end when
    negative, as in ONNX (``-1`` is the last of ``extent``), and must then lie in
    ``[0, extent)``.  Its value is the index so wrapped.  One still out of range is the run's
    error: the kernel reports ``site`` (a number of the module's table of error sites,
    ``relaxweb/ir/error_sites.py``) with the index as given and the extent, and the value is
    clamped into the extent, so the kernel goes on reading in bounds until the run fails.

    ``site`` is an index expression: an integer literal, which ``share_programs`` turns into
    a size variable where shared programs check different nodes.  The node has an effect, so
    a backend evaluates it only where the program's value needs it (never in a select's
    branch not taken)."""

    scalar_kind: ClassVar[str] = "checked_index"

    site: PrimExpr
    index: ScalarExpr
    extent: PrimExpr

    def __post_init__(self) -> None:
        object.__setattr__(self, "site", as_expr(self.site))
        object.__setattr__(self, "extent", as_expr(self.extent))
        if not dtype_info(self.index.dtype).is_integer:
            raise TypeError(f"CheckedIndex: the index is {self.index.dtype}, not an integer: "
                            f"{format_scalar(self.index)}")

    @property
    def dtype(self) -> str:
        return "int32"


@dataclass(frozen=True)
class FloatImm(ScalarExpr):
    """A constant of ``dtype`` (integer dtypes too: ``FloatImm(0, "int32")``)."""

    scalar_kind: ClassVar[str] = "float_imm"

    value: float
    dtype: str = "float32"


@hash_once
@dataclass(frozen=True)
class Binary(ScalarExpr):
    """``a op b`` (:class:`BinaryOp`; a valid name is taken too); both operands are computed
    in one dtype (the ``power`` op's exponent too, though the graph-level op allows another
    dtype: its legalization brings both to float32).  The result has ``a``'s dtype."""

    scalar_kind: ClassVar[str] = "binary"

    op: BinaryOp
    a: ScalarExpr
    b: ScalarExpr

    def __post_init__(self) -> None:
        object.__setattr__(self, "op", BinaryOp.of(self.op))
        _check_operands(self, self.a, self.b)
        if self.op in BITWISE_OPS and not (self.a.dtype in DTYPES and DTYPES[self.a.dtype].is_integer):
            raise TypeError(f"Binary: {self.op} takes integers, got {self.a.dtype}: {format_scalar(self.a)}")

    @cached_property
    def dtype(self) -> str:
        return self.a.dtype


@hash_once
@dataclass(frozen=True)
class Unary(ScalarExpr):
    """``op(a)`` (:class:`UnaryOp`; a valid name is taken too); ``is_nan`` gives a bool."""

    scalar_kind: ClassVar[str] = "unary"

    op: UnaryOp
    a: ScalarExpr

    def __post_init__(self) -> None:
        object.__setattr__(self, "op", UnaryOp.of(self.op))
        if self.op is UnaryOp.UNPACK_HALF and self.a.dtype != "uint32":
            raise TypeError(f"Unary: unpack_half takes a uint32, got {self.a.dtype}: {format_scalar(self.a)}")

    @cached_property
    def dtype(self) -> str:
        if self.op is UnaryOp.UNPACK_HALF:
            return "float32"
        return "bool" if self.op in (UnaryOp.IS_NAN, UnaryOp.IS_FINITE) else self.a.dtype


@hash_once
@dataclass(frozen=True)
class Reduce(ScalarExpr):
    """``combiner`` (:class:`ReduceCombiner`: sum, prod, max or min) of ``body`` over ``axis``
    in ``[0, extent)``.

    Over an empty range, sum is 0, prod 1, max the lowest and min the highest value of the dtype.
    """

    scalar_kind: ClassVar[str] = "reduce"

    combiner: ReduceCombiner
    axis: SizeVar
    extent: PrimExpr
    body: ScalarExpr

    def __post_init__(self) -> None:
        object.__setattr__(self, "combiner", ReduceCombiner.of(self.combiner))
        object.__setattr__(self, "extent", as_expr(self.extent))  # a Python int too, as Load's indices

    @cached_property
    def dtype(self) -> str:
        return self.body.dtype


@hash_once
@dataclass(frozen=True)
class IndexValue(ScalarExpr):
    """The value of an index expression (over axes and size variables), as an ``int32``."""

    scalar_kind: ClassVar[str] = "index_value"

    value: PrimExpr

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", as_expr(self.value))

    @property
    def dtype(self) -> str:
        return "int32"


@hash_once
@dataclass(frozen=True)
class Cast(ScalarExpr):
    """``a`` converted to ``dtype`` (any dtype the GPU holds: :data:`~relaxweb.ir.dtype.GPU_DTYPES`)."""

    scalar_kind: ClassVar[str] = "cast"

    dtype: str
    a: ScalarExpr

    def __post_init__(self) -> None:
        if not dtype_info(self.dtype).on_gpu:
            raise ValueError(f"cannot cast to {self.dtype}; expected one of {', '.join(GPU_DTYPES)}")


@hash_once
@dataclass(frozen=True)
class Compare(ScalarExpr):
    """``a op b`` as a ``bool`` (:class:`CompareOp`; a valid name is taken too)."""

    scalar_kind: ClassVar[str] = "compare"

    op: CompareOp
    a: ScalarExpr
    b: ScalarExpr

    def __post_init__(self) -> None:
        object.__setattr__(self, "op", CompareOp.of(self.op))
        _check_operands(self, self.a, self.b)

    @property
    def dtype(self) -> str:
        return "bool"


@hash_once
@dataclass(frozen=True)
class Select(ScalarExpr):
    """``a if condition else b``; only the chosen branch is evaluated."""

    scalar_kind: ClassVar[str] = "select"

    condition: ScalarExpr
    a: ScalarExpr
    b: ScalarExpr

    def __post_init__(self) -> None:
        if self.condition.dtype != "bool":
            raise TypeError(f"Select: the condition is {self.condition.dtype}, not bool: {format_scalar(self.condition)}")
        _check_operands(self, self.a, self.b)

    @cached_property
    def dtype(self) -> str:
        return self.a.dtype


def _check_operands(node: ScalarExpr, a: ScalarExpr, b: ScalarExpr) -> None:
    """Both operands of a binary node are computed in one dtype (WGSL has no implicit
    conversions): float16 and float32 may meet (both f32), float32 and int32 may not."""
    if a.dtype != b.dtype and _compute_dtype(a.dtype) != _compute_dtype(b.dtype):
        raise TypeError(f"{type(node).__name__}: operands of different dtypes ({a.dtype} and {b.dtype}): "
                        f"{format_scalar(a)}, {format_scalar(b)}")


def _compute_dtype(dtype: str) -> str:
    """The dtype's compute dtype; a dtype relaxweb does not know (bfloat16 programs run only
    in the interpreter) is its own."""
    return DTYPES[dtype].compute_dtype if dtype in DTYPES and DTYPES[dtype].on_gpu else dtype


# -- building expressions -----------------------------------------------------------------------
#
# Functions for what has no Python operator; a Python number among the operands becomes a
# constant of the other operand's dtype, as with the operators.


def maximum(a: "ScalarExpr | float", b: "ScalarExpr | float") -> ScalarExpr:
    a, b = _operands(a, b)
    return Binary(BinaryOp.MAXIMUM, a, b)


def minimum(a: "ScalarExpr | float", b: "ScalarExpr | float") -> ScalarExpr:
    a, b = _operands(a, b)
    return Binary(BinaryOp.MINIMUM, a, b)


def power(a: ScalarExpr, b: "ScalarExpr | float") -> ScalarExpr:
    """``a ** b`` with WGSL's ``pow`` (undefined for a negative ``a``; see :class:`BinaryOp`)."""
    return Binary(BinaryOp.POWER, a, _operand(b, a))


def bitwise_and(a: "ScalarExpr | int", b: "ScalarExpr | int") -> ScalarExpr:
    a, b = _operands(a, b)
    return Binary(BinaryOp.BITWISE_AND, a, b)


def bitwise_or(a: "ScalarExpr | int", b: "ScalarExpr | int") -> ScalarExpr:
    a, b = _operands(a, b)
    return Binary(BinaryOp.BITWISE_OR, a, b)


def bitwise_xor(a: "ScalarExpr | int", b: "ScalarExpr | int") -> ScalarExpr:
    a, b = _operands(a, b)
    return Binary(BinaryOp.BITWISE_XOR, a, b)


def shift_right(a: "ScalarExpr | int", b: "ScalarExpr | int") -> ScalarExpr:
    """``a >> b`` (``0 <= b < 32``)."""
    a, b = _operands(a, b)
    return Binary(BinaryOp.SHIFT_RIGHT, a, b)


def select(condition: ScalarExpr, a: "ScalarExpr | float", b: "ScalarExpr | float") -> ScalarExpr:
    """``a if condition else b`` (only the chosen branch is evaluated)."""
    a, b = _operands(a, b)
    return Select(condition, a, b)


def cast(dtype: str, a: ScalarExpr) -> ScalarExpr:
    """``a`` as ``dtype``; ``a`` itself when it has that dtype already."""
    return a if a.dtype == dtype else Cast(dtype, a)


def exp(a: ScalarExpr) -> ScalarExpr:
    return Unary(UnaryOp.EXP, a)


def absolute(a: ScalarExpr) -> ScalarExpr:
    """|a| of a float (the sign bit cleared: one instruction where max(a, -a) takes several)."""
    return Unary(UnaryOp.ABSOLUTE, a)


def log(a: ScalarExpr) -> ScalarExpr:
    return Unary(UnaryOp.LOG, a)


def sqrt(a: ScalarExpr) -> ScalarExpr:
    return Unary(UnaryOp.SQRT, a)


def tanh(a: ScalarExpr) -> ScalarExpr:
    return Unary(UnaryOp.TANH, a)


def sigmoid(a: ScalarExpr) -> ScalarExpr:
    return Unary(UnaryOp.SIGMOID, a)


def floor(a: ScalarExpr) -> ScalarExpr:
    return Unary(UnaryOp.FLOOR, a)


def ceil(a: ScalarExpr) -> ScalarExpr:
    return Unary(UnaryOp.CEIL, a)


def round_half_even(a: ScalarExpr) -> ScalarExpr:
    """WGSL's ``round``: halves to even (as numpy)."""
    return Unary(UnaryOp.ROUND, a)


def is_nan(a: ScalarExpr) -> ScalarExpr:
    return Unary(UnaryOp.IS_NAN, a)


def is_finite(a: ScalarExpr) -> ScalarExpr:
    return Unary(UnaryOp.IS_FINITE, a)


def unpack_half(word: ScalarExpr) -> ScalarExpr:
    """The float16 in the low 16 bits of a uint32 ``word``, as a float32."""
    return Unary(UnaryOp.UNPACK_HALF, word)


def _operands(a: "ScalarExpr | float", b: "ScalarExpr | float") -> tuple[ScalarExpr, ScalarExpr]:
    """Two operands, a Python number among them a constant of the other's dtype."""
    if isinstance(a, ScalarExpr):
        return a, _operand(b, a)
    if isinstance(b, ScalarExpr):
        return _operand(a, b), b
    raise TypeError(f"at least one operand must be a scalar expression, got {a!r} and {b!r}")


# The scalar operands of an expression, in order (loads, constants and index values have none).
scalar_children: Callable[[ScalarExpr], tuple[ScalarExpr, ...]] = scalar_operands


def repeated_subexpressions(body: ScalarExpr) -> set[ScalarExpr]:
    """Subexpressions (not constants) that occur more than once in ``body``: the backends
    compute each once (a local), as the cost model counts it."""
    counts: dict[ScalarExpr, int] = {}

    def visit(expr: ScalarExpr) -> None:
        if isinstance(expr, (FloatImm, IndexValue)):
            return
        counts[expr] = counts.get(expr, 0) + 1
        if counts[expr] == 1:
            for child in scalar_children(expr):
                visit(child)

    visit(body)
    return {expr for expr, count in counts.items() if count > 1}


def scalar_nodes(expr: ScalarExpr):
    """Every node of a scalar expression, the expression first (depth first, children in
    order).  From a stack, not nested generators: each node yielded through every generator
    above it made a walk of a deep body (a long fused elementwise chain) quadratic."""
    pending = [expr]
    while pending:
        node = pending.pop()
        yield node
        pending.extend(reversed(scalar_children(node)))


def scalar_dtype(expr: ScalarExpr) -> str:
    """The dtype of a scalar expression's value (``expr.dtype``)."""
    if not isinstance(expr, ScalarExpr):
        raise TypeError(f"not a scalar expression: {expr!r}")
    return expr.dtype


def index_var_names(program: "TensorProgram") -> set[str]:
    """Names of the program's index variables: its axes and every reduction axis."""
    collector = _ReductionAxes()
    collector.visit(program.body)
    return {axis.name for axis in program.axes} | collector.names


class _ReductionAxes(ScalarVisitor):
    """Collects the names of the reduction axes."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_reduce(self, node: Reduce) -> None:
        self.names.add(node.axis.name)
        super().visit_reduce(node)


class _IndexExprs(ScalarVisitor):
    """Collects the index expressions of the nodes, in depth-first order."""

    def __init__(self) -> None:
        self.found: list[PrimExpr] = []

    def visit_load(self, node: Load) -> None:
        self.found.extend(node.indices)

    def visit_gather(self, node: Gather) -> None:
        self.found.extend(i for i in node.indices if not isinstance(i, ScalarExpr))
        super().visit_gather(node)

    def visit_index_value(self, node: IndexValue) -> None:
        self.found.append(node.value)

    def visit_reduce(self, node: Reduce) -> None:
        self.found.append(node.extent)
        super().visit_reduce(node)

    def visit_checked_index(self, node: CheckedIndex) -> None:
        self.found.extend((node.site, node.extent))
        super().visit_checked_index(node)

    def visit_checked_integer(self, node: ScalarExpr) -> None:  # ir/integer_checks.py
        self.found.append(node.site)
        super().visit_checked_integer(node)

    def visit_checked_divisor(self, node: ScalarExpr) -> None:
        self.found.append(node.site)
        super().visit_checked_divisor(node)


def index_exprs(expr: ScalarExpr) -> list[PrimExpr]:
    """Every index expression in a scalar expression (load indices, index values, extents)."""
    collector = _IndexExprs()
    collector.visit(expr)
    return collector.found


@hash_once
@dataclass(frozen=True)
class TensorProgram:
    """``output[axes] = body``: one output tensor computed from ``inputs``.

    ``schedule`` says how code generation lays it out on each target
    (``target_schedules.py``; None until the schedule_programs pass chooses it)."""

    name: str
    inputs: tuple[Buffer, ...]
    output: Buffer
    axes: tuple[SizeVar, ...]
    body: ScalarExpr
    schedule: TargetSchedules | None = None

    def __post_init__(self) -> None:
        if self.schedule is not None and not isinstance(self.schedule, TargetSchedules):
            raise TypeError(f"{self.name}: schedule must be a TargetSchedules (relaxweb/ir/target_schedules.py) or "
                            f"None, got {self.schedule!r}")

    @cached_property
    def size_vars(self) -> tuple[SizeVar, ...]:
        """Size variables of the buffer shapes, in order of first appearance, then those that
        appear only in the body (e.g. the symbolic begin of a slice).  Computed once per
        program (fusion asks at every merge)."""
        found: dict[str, SizeVar] = {}
        for buffer in (*self.inputs, self.output):
            for dim in buffer.shape:
                for var in free_vars(dim):
                    found.setdefault(var.name, var)
        index_names = index_var_names(self)
        for expr in index_exprs(self.body):
            for var in free_vars(expr):
                if var.name not in index_names:
                    found.setdefault(var.name, var)
        return tuple(found.values())


# -- text ------------------------------------------------------------------------------------
#
# The text of a program is Python syntax that ``relaxweb/ir/parser.py`` reads back:
#
#     @tensor_program(webgpu=tiled_matmul(tile=64, depth=16, block=8), webgpu_cpu=..., webgpu_f16=..., wasm=...)
#     def matmul(A: Buffer((n, 64), "float32"), B: Buffer((64, 128), "float32"), out: Buffer((n, 128), "float32")):
#         out[i0_, i1_] = sum((A[i0_, k_] * B[k_, i1_]) for k_ in range(64))
#
# Index expressions are written as ``format_expr`` writes them; scalar values as: loads
# ``A[i, j]`` (an indirect load ``A[int32(B[i]), j]`` has run-time indices among its
# indices), constants ``float32(0.5)`` / ``int32(0)`` (the dtype as a call of a number),
# casts ``int32(x)`` (the dtype as a call of a scalar), ``index(i * n)``, every binary and
# comparison in parentheses, other ops by name (``maximum(a, b)``, ``exp(a)``),
# ``select(c, a, b)``, ``checked_index(site, index, extent)``, ``checked_integer(site, value)``,
# ``checked_divisor(site, divisor)``, and reductions
# ``sum(body for k_ in range(extent))``.

BINARY_SYMBOLS = {BinaryOp.ADD: "+", BinaryOp.SUBTRACT: "-", BinaryOp.MULTIPLY: "*", BinaryOp.DIVIDE: "/"}


def format_scalar(expr: ScalarExpr, buffer_names: Mapping[str, str] | None = None) -> str:
    """The text of a scalar expression (the printer's, also used in WGSL comments).

    ``buffer_names`` maps buffer names to the identifiers the text uses for them (a program's
    parameters, see :func:`format_program`); by default a buffer is written by its name.
    """
    if not isinstance(expr, ScalarExpr):
        raise TypeError(f"not a scalar expression: {expr!r}")
    return _ScalarText(buffer_names or {}).visit(expr)


class _ScalarText(ScalarFunctor):
    """The text of each kind (see the form above); ``buffer_names`` as in :func:`format_scalar`."""

    def __init__(self, buffer_names: Mapping[str, str]) -> None:
        self.buffer_names = buffer_names

    def buffer(self, buffer: Buffer) -> str:
        return self.buffer_names.get(buffer.name, buffer.name)

    def visit_load(self, node: Load) -> str:
        return f"{self.buffer(node.buffer)}[{_format_indices([format_expr(i) for i in node.indices])}]"

    def visit_gather(self, node: Gather) -> str:
        indices = [self.visit(i) if isinstance(i, ScalarExpr) else format_expr(i) for i in node.indices]
        if not any(isinstance(i, ScalarExpr) for i in node.indices):  # would read as a Load
            return f"gather({', '.join([self.buffer(node.buffer), *indices])})"
        return f"{self.buffer(node.buffer)}[{_format_indices(indices)}]"

    def visit_float_imm(self, node: FloatImm) -> str:
        return f"{node.dtype}({format_number(node.value)})"

    def visit_binary(self, node: Binary) -> str:
        if node.op in BINARY_SYMBOLS:
            return f"({self.visit(node.a)} {BINARY_SYMBOLS[node.op]} {self.visit(node.b)})"
        return f"{node.op}({self.visit(node.a)}, {self.visit(node.b)})"

    def visit_unary(self, node: Unary) -> str:
        return f"{node.op}({self.visit(node.a)})"

    def visit_reduce(self, node: Reduce) -> str:
        return (f"{node.combiner}({self.visit(node.body)} for {format_size_var(node.axis.name)} "
                f"in range({format_expr(node.extent)}))")

    def visit_index_value(self, node: IndexValue) -> str:
        return f"index({format_expr(node.value)})"

    def visit_cast(self, node: Cast) -> str:
        return f"{node.dtype}({self.visit(node.a)})"

    def visit_compare(self, node: Compare) -> str:
        return f"({self.visit(node.a)} {COMPARE_OPS[node.op]} {self.visit(node.b)})"

    def visit_select(self, node: Select) -> str:
        return f"select({self.visit(node.condition)}, {self.visit(node.a)}, {self.visit(node.b)})"

    def visit_checked_index(self, node: CheckedIndex) -> str:
        return f"checked_index({format_expr(node.site)}, {self.visit(node.index)}, {format_expr(node.extent)})"

    def visit_checked_integer(self, node: ScalarExpr) -> str:  # ir/integer_checks.py
        return f"checked_integer({format_expr(node.site)}, {self.visit(node.value)})"

    def visit_checked_divisor(self, node: ScalarExpr) -> str:
        return f"checked_divisor({format_expr(node.site)}, {self.visit(node.divisor)})"


def _format_indices(indices: list[str]) -> str:
    """The inside of a subscript: ``i, j``, or ``()`` for a zero-dimensional buffer."""
    return ", ".join(indices) if indices else "()"


def format_buffer(buffer: Buffer, real_name: bool = False) -> str:
    """``Buffer((n, 4), "float32")``: the type of a parameter, which gives the buffer its
    name; ``real_name`` adds ``name=`` for a parameter whose identifier is not the name."""
    name = f", name={format_string(buffer.name)}" if real_name else ""
    return f"Buffer({format_shape(buffer.shape)}, {format_string(buffer.dtype)}{name})"


def format_program(program: TensorProgram) -> str:
    """The program as text: decorator, signature (inputs then the output), compute definition.

    Buffers are parameters named by their names; a name that is not an identifier (or that
    two buffers share) gets an identifier and a ``name=`` with the real one.
    """
    identifiers: dict[str, str] = {}
    params = []
    for buffer in (*program.inputs, program.output):
        identifier = unique_identifier(buffer.name, set(identifiers.values()))
        identifiers.setdefault(buffer.name, identifier)
        params.append(f"{identifier}: {format_buffer(buffer, real_name=identifier != buffer.name)}")
    decorator = "@tensor_program" + format_keywords(
        *format_schedule(program.schedule),
        ("name", format_string(program.name)) if not is_plain_name(program.name) else None,
    )
    output = identifiers[program.output.name]
    axes = _format_indices([format_size_var(axis.name) for axis in program.axes])
    return (
        f"{decorator}\ndef {unique_identifier(program.name, set())}({', '.join(params)}):\n"
        f"    {output}[{axes}] = {format_scalar(program.body, identifiers)}"
    )


def format_schedule(schedule: TargetSchedules | None) -> list[tuple[str, str]]:
    """How a program's schedules are written in its decorator (the one place that knows): a
    keyword per target, each schedule its kind called with its parameters when it has any
    (``webgpu=tiled_matmul(tile=32, depth=16, block=4)``), ``None`` for no second shader;
    none at all before scheduling."""
    if schedule is None:
        return []
    return [(target, str(kind)) for target, kind in schedule.items()]


# -- rewriting scalar expressions ----------------------------------------------------------------


def map_scalar(expr: ScalarExpr, function: Callable[[ScalarExpr], ScalarExpr | None]) -> ScalarExpr:
    """Rebuild ``expr`` bottom-up; ``function(node)`` may return a replacement for a node
    (it sees the node with its children already rebuilt) or None to keep it.  A node whose
    children come back unchanged is kept itself (fusion maps every body several times)."""
    return _MapScalar(function).visit(expr)


class _MapScalar(ScalarMutator):
    """:func:`map_scalar`: every node rebuilt, then offered to ``function``."""

    def __init__(self, function: Callable[[ScalarExpr], ScalarExpr | None]) -> None:
        self.function = function

    def visit(self, expr: ScalarExpr) -> ScalarExpr:
        rebuilt = self.visit_kind(expr)
        replacement = self.function(rebuilt)
        return rebuilt if replacement is None else replacement


def substitute_scalar(expr: ScalarExpr, mapping: Mapping[str, PrimExpr]) -> ScalarExpr:
    """Replace index and size variables by expressions (by name) everywhere in ``expr``:
    load indices, index values, reduction extents; a reduction axis mapped to a ``SizeVar``
    is renamed."""
    return _Substitute(mapping).visit(expr)


class _Substitute(ScalarMutator):
    """:func:`substitute_scalar`: a node is kept when its index expressions do not change."""

    def __init__(self, mapping: Mapping[str, PrimExpr]) -> None:
        self.mapping = mapping

    def visit_load(self, node: Load) -> ScalarExpr:
        return _with_indices(node, tuple(substitute(i, self.mapping) for i in node.indices))

    def visit_gather(self, node: Gather) -> ScalarExpr:
        node = super().visit_gather(node)
        return _with_indices(node, tuple(i if isinstance(i, ScalarExpr) else substitute(i, self.mapping)
                                         for i in node.indices))

    def visit_index_value(self, node: IndexValue) -> ScalarExpr:
        value = substitute(node.value, self.mapping)
        return node if value == node.value else IndexValue(value)

    def visit_checked_index(self, node: CheckedIndex) -> ScalarExpr:
        node = super().visit_checked_index(node)
        site, extent = substitute(node.site, self.mapping), substitute(node.extent, self.mapping)
        return node if site == node.site and extent == node.extent else CheckedIndex(site, node.index, extent)

    def visit_checked_integer(self, node: ScalarExpr) -> ScalarExpr:  # ir/integer_checks.py: (site, operand)
        node = super().visit_checked_integer(node)
        site = substitute(node.site, self.mapping)
        return node if site == node.site else type(node)(site, node.value)

    def visit_checked_divisor(self, node: ScalarExpr) -> ScalarExpr:
        node = super().visit_checked_divisor(node)
        site = substitute(node.site, self.mapping)
        return node if site == node.site else type(node)(site, node.divisor)

    def visit_reduce(self, node: Reduce) -> ScalarExpr:
        node = super().visit_reduce(node)
        axis = self.mapping.get(node.axis.name, node.axis)
        if not isinstance(axis, SizeVar):
            raise ValueError(f"cannot substitute the reduction axis {node.axis.name} by an expression")
        return Reduce(node.combiner, axis, substitute(node.extent, self.mapping), node.body)


def _with_indices(node: "Load | Gather", indices: tuple) -> "Load | Gather":
    """``node`` reading at ``indices``: itself when they are its own (so that the nodes above
    it are kept)."""
    return node if indices == node.indices else type(node)(node.buffer, indices)


def replace_buffers(expr: ScalarExpr, mapping: Mapping[str, Buffer]) -> ScalarExpr:
    """Point loads of the buffers named in ``mapping`` at other buffers."""
    def visit(node: ScalarExpr) -> ScalarExpr | None:
        if isinstance(node, Load) and node.buffer.name in mapping:
            return Load(mapping[node.buffer.name], node.indices)
        if isinstance(node, Gather) and node.buffer.name in mapping:
            return Gather(mapping[node.buffer.name], node.indices)
        return None

    return map_scalar(expr, visit)


def loads_of(expr: ScalarExpr, buffer_name: str) -> list[ScalarExpr]:
    """Every Load and Gather of the named buffer in ``expr``."""
    return [node for node in scalar_nodes(expr) if isinstance(node, (Load, Gather)) and node.buffer.name == buffer_name]


def contains_reduce(expr: ScalarExpr) -> bool:
    if isinstance(expr, Reduce):
        return True
    return any(contains_reduce(child) for child in scalar_children(expr))


def expression_size(expr: ScalarExpr) -> int:
    """The number of nodes of a scalar expression, a shared subexpression counted at each
    use (fusion caps the size of what it builds).  Walked with a stack: the expression may be
    deeper than Python's recursion limit."""
    size, pending = 0, [expr]
    while pending:
        size += 1
        pending.extend(scalar_children(pending.pop()))
    return size


def expression_depth(expr: ScalarExpr) -> int:
    """The number of nodes on the longest path from ``expr`` to a leaf (a load: 1).  Fusion
    caps it: every recursive walk of a body (rewrites, the WGSL emitter, hashing) nests one
    call per level.  Walked with a stack, so any depth can be measured."""
    deepest, pending = 0, [(expr, 1)]
    while pending:
        node, depth = pending.pop()
        deepest = max(deepest, depth)
        pending.extend((child, depth + 1) for child in scalar_children(node))
    return deepest
