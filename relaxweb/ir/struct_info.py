"""Annotations (StructInfo): what is known statically about a value.

Every graph-level expression carries one.  A tensor's shape is a tuple of symbolic
expressions (or unknown, with or without a known rank), so ``[batch, 64]`` says the first
dimension is whatever ``batch`` is bound to and the second is exactly 64.
"""

from __future__ import annotations

from dataclasses import dataclass

from .symbolic import PrimExpr, as_expr, format_expr, prove_equal


class StructInfo:
    """Base of annotations.

    Each kind says, for another annotation of its kind, whether the two are equal
    (``_equal``), whether it describes every value the other does (``_covers``), and what
    both satisfy (``_join``); :func:`struct_info_equal`, :func:`is_less_specific` and
    :func:`join` handle the kinds that relate across kinds (``Object``, ``Optional``).
    """

    def symbolic_exprs(self) -> tuple[PrimExpr, ...]:
        """Every symbolic expression of the annotation, in order: a tensor's dims, a shape's
        values, a prim value, a sequence's element's then its length, a tuple's fields', an
        optional's inner one's, a function's parameters' then its result's."""
        return ()

    def _equal(self, other: "StructInfo") -> bool:
        """Equality with an annotation of the same kind (symbolic dims through the prover)."""
        return self == other

    def _covers(self, specific: "StructInfo") -> bool:
        """Whether every value of ``specific`` (of the same kind) is one of this annotation."""
        return struct_info_equal(self, specific)

    def _join(self, other: "StructInfo") -> "StructInfo":
        """The most specific annotation this one and ``other`` (of the same kind, neither
        less specific than the other) both satisfy."""
        return ObjectStructInfo()


@dataclass(frozen=True)
class ObjectStructInfo(StructInfo):
    """Nothing is known (also the annotation of runtime objects such as storages)."""

    def __str__(self) -> str:
        return "Object"


@dataclass(frozen=True)
class TensorStructInfo(StructInfo):
    """A tensor: dtype, and a shape of symbolic dims (or None when only ``ndim`` is known).

    ``ndim`` is -1 when even the rank is unknown.
    """

    shape: tuple[PrimExpr, ...] | None
    dtype: str
    ndim: int = -1

    def __post_init__(self) -> None:
        if self.shape is not None:
            object.__setattr__(self, "shape", tuple(as_expr(d) for d in self.shape))
            object.__setattr__(self, "ndim", len(self.shape))

    def __str__(self) -> str:
        if self.shape is not None:
            dims = ", ".join(format_expr(d) for d in self.shape)
            return f"Tensor(({dims}), {self.dtype})"
        return f"Tensor(ndim={self.ndim}, {self.dtype})"

    def symbolic_exprs(self) -> tuple[PrimExpr, ...]:
        return self.shape or ()

    def _equal(self, other: TensorStructInfo) -> bool:
        return self.dtype == other.dtype and self.ndim == other.ndim and _dims_equal(self.shape, other.shape)

    def _covers(self, specific: TensorStructInfo) -> bool:
        if self.dtype != specific.dtype:
            return False
        if self.ndim == -1:
            return True
        return self.ndim == specific.ndim and (self.shape is None or _dims_equal(self.shape, specific.shape))

    def _join(self, other: TensorStructInfo) -> StructInfo:
        if self.dtype != other.dtype:
            return ObjectStructInfo()
        return TensorStructInfo(None, self.dtype, self.ndim if self.ndim == other.ndim else -1)


@dataclass(frozen=True)
class ShapeStructInfo(StructInfo):
    """A shape value (a tuple of integers), with its symbolic values when known."""

    values: tuple[PrimExpr, ...] | None
    ndim: int = -1

    def __post_init__(self) -> None:
        if self.values is not None:
            object.__setattr__(self, "values", tuple(as_expr(v) for v in self.values))
            object.__setattr__(self, "ndim", len(self.values))

    def __str__(self) -> str:
        if self.values is not None:
            return "Shape([" + ", ".join(format_expr(v) for v in self.values) + "])"
        return f"Shape(ndim={self.ndim})"

    def symbolic_exprs(self) -> tuple[PrimExpr, ...]:
        return self.values or ()

    def _equal(self, other: ShapeStructInfo) -> bool:
        return self.ndim == other.ndim and _dims_equal(self.values, other.values)

    def _covers(self, specific: ShapeStructInfo) -> bool:
        if self.ndim == -1:
            return True
        return self.ndim == specific.ndim and (self.values is None or _dims_equal(self.values, specific.values))

    def _join(self, other: ShapeStructInfo) -> StructInfo:
        return ShapeStructInfo(None, self.ndim if self.ndim == other.ndim else -1)


@dataclass(frozen=True)
class PrimStructInfo(StructInfo):
    """A scalar integer value, symbolic when known (``value``)."""

    dtype: str = "int64"
    value: PrimExpr | None = None

    def __str__(self) -> str:
        return f"Prim({format_expr(self.value)})" if self.value is not None else f"Prim({self.dtype})"

    def symbolic_exprs(self) -> tuple[PrimExpr, ...]:
        return () if self.value is None else (self.value,)

    def _equal(self, other: PrimStructInfo) -> bool:
        if self.dtype != other.dtype or (self.value is None) != (other.value is None):
            return False
        return self.value is None or prove_equal(self.value, other.value)  # type: ignore[arg-type]

    def _covers(self, specific: PrimStructInfo) -> bool:
        if self.dtype != specific.dtype:
            return False
        return self.value is None or (specific.value is not None and prove_equal(self.value, specific.value))

    def _join(self, other: PrimStructInfo) -> StructInfo:
        return PrimStructInfo(self.dtype) if self.dtype == other.dtype else ObjectStructInfo()


@dataclass(frozen=True)
class TupleStructInfo(StructInfo):
    fields: tuple[StructInfo, ...]

    def __str__(self) -> str:
        return "Tuple(" + ", ".join(str(f) for f in self.fields) + ")"

    def symbolic_exprs(self) -> tuple[PrimExpr, ...]:
        return tuple(expr for field in self.fields for expr in field.symbolic_exprs())

    def _equal(self, other: TupleStructInfo) -> bool:
        return len(self.fields) == len(other.fields) and all(
            struct_info_equal(x, y) for x, y in zip(self.fields, other.fields))

    def _covers(self, specific: TupleStructInfo) -> bool:
        return len(self.fields) == len(specific.fields) and all(
            is_less_specific(g, s) for g, s in zip(self.fields, specific.fields))

    def _join(self, other: TupleStructInfo) -> StructInfo:
        if len(self.fields) != len(other.fields):
            return ObjectStructInfo()
        return TupleStructInfo(tuple(join(x, y) for x, y in zip(self.fields, other.fields)))


@dataclass(frozen=True)
class SequenceStructInfo(StructInfo):
    """An ONNX sequence: an ordered list of tensors of one dtype whose shapes may differ.

    ``element`` is what every element satisfies (a ``TensorStructInfo``: its dtype, its rank
    when known, its shape when every element has it); ``length`` is the number of elements
    when known (symbolic: a ``SequenceConstruct`` of two tensors has length 2, an insert into
    a sequence of length ``n`` has ``n + 1``), None when it is known only at run time.
    """

    element: TensorStructInfo
    length: PrimExpr | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.element, TensorStructInfo):
            raise TypeError(f"a sequence's elements are tensors, got {self.element}")
        if self.length is not None:
            object.__setattr__(self, "length", as_expr(self.length))

    def __str__(self) -> str:
        length = f", length={format_expr(self.length)}" if self.length is not None else ""
        return f"Sequence({self.element}{length})"

    def symbolic_exprs(self) -> tuple[PrimExpr, ...]:
        return self.element.symbolic_exprs() + (() if self.length is None else (self.length,))

    def _equal(self, other: SequenceStructInfo) -> bool:
        return struct_info_equal(self.element, other.element) and _lengths_equal(self.length, other.length)

    def _covers(self, specific: SequenceStructInfo) -> bool:
        return is_less_specific(self.element, specific.element) and (
            self.length is None or _lengths_equal(self.length, specific.length))

    def _join(self, other: SequenceStructInfo) -> StructInfo:
        element = join(self.element, other.element)
        if not isinstance(element, TensorStructInfo):
            return ObjectStructInfo()
        length = self.length if self.length is not None and _lengths_equal(self.length, other.length) else None
        return SequenceStructInfo(element, length)


@dataclass(frozen=True)
class OptionalStructInfo(StructInfo):
    """An ONNX optional: a value of ``inner`` (a tensor or a sequence) or none.

    A value of ``inner`` is a value of ``Optional(inner)`` (``is_less_specific``): an optional
    that holds something is that thing, so a loop may carry an optional in and a sequence out.
    """

    inner: StructInfo

    def __str__(self) -> str:
        return f"Optional({self.inner})"

    def symbolic_exprs(self) -> tuple[PrimExpr, ...]:
        return self.inner.symbolic_exprs()

    def _equal(self, other: OptionalStructInfo) -> bool:
        return struct_info_equal(self.inner, other.inner)


@dataclass(frozen=True)
class FuncStructInfo(StructInfo):
    params: tuple[StructInfo, ...]
    ret: StructInfo

    def __str__(self) -> str:
        return "Func([" + ", ".join(str(p) for p in self.params) + f"], {self.ret})"

    def symbolic_exprs(self) -> tuple[PrimExpr, ...]:
        return tuple(expr for info in (*self.params, self.ret) for expr in info.symbolic_exprs())


def struct_info_equal(a: StructInfo, b: StructInfo) -> bool:
    """Equality of annotations, comparing symbolic dims through the prover."""
    return type(a) is type(b) and a._equal(b)


def _lengths_equal(a: PrimExpr | None, b: PrimExpr | None) -> bool:
    return a is b if a is None or b is None else prove_equal(a, b)


def _dims_equal(a: tuple[PrimExpr, ...] | None, b: tuple[PrimExpr, ...] | None) -> bool:
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(prove_equal(x, y) for x, y in zip(a, b))


def is_less_specific(general: StructInfo, specific: StructInfo) -> bool:
    """True when every value described by ``specific`` is also described by ``general``.

    ``Object`` is less specific than everything; ``Tensor(ndim=2)`` than ``Tensor((n, 4))``;
    ``Tensor(ndim=-1)`` than any tensor of the same dtype; equal annotations are each less
    specific than the other.  Symbolic dims compare through the prover.
    """
    if isinstance(general, ObjectStructInfo):
        return True
    if isinstance(general, OptionalStructInfo):
        inner = specific.inner if isinstance(specific, OptionalStructInfo) else specific
        return is_less_specific(general.inner, inner)
    return type(general) is type(specific) and general._covers(specific)


def join(a: StructInfo, b: StructInfo) -> StructInfo:
    """The most specific annotation that both ``a`` and ``b`` satisfy (merging If branches).

    Tensors: the same dtype is kept; the shape is kept when every dim is provably equal,
    otherwise only the rank is (``[n, 4]`` join ``[m, 4]`` is ``Tensor(ndim=2)``, as in Relax:
    a later ``match_cast`` gives the dims names again); different ranks give ``ndim=-1``.
    Different dtypes or kinds give ``Object``.  Sequences join their elements (a join that
    is not a tensor is a tensor of unknown rank; different dtypes give ``Object``) and keep a
    length only when both have it; an optional and a value join to an optional.
    """
    if is_less_specific(a, b):
        return a
    if is_less_specific(b, a):
        return b
    if isinstance(a, OptionalStructInfo) or isinstance(b, OptionalStructInfo):
        inner_a = a.inner if isinstance(a, OptionalStructInfo) else a
        inner_b = b.inner if isinstance(b, OptionalStructInfo) else b
        return OptionalStructInfo(join(inner_a, inner_b))
    if type(a) is not type(b):
        return ObjectStructInfo()
    return a._join(b)
