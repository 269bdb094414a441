"""Annotations (StructInfo): what is known statically about a value.

Every graph-level expression carries one.  A tensor's shape is a tuple of symbolic
expressions (or unknown, with or without a known rank), so ``[batch, 64]`` says the first
dimension is whatever ``batch`` is bound to and the second is exactly 64.
"""

from __future__ import annotations

from dataclasses import dataclass

from .symbolic import PrimExpr, as_expr, format_expr, prove_equal


class StructInfo:
    """Base of annotations."""


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


@dataclass(frozen=True)
class PrimStructInfo(StructInfo):
    """A scalar integer value, symbolic when known (``value``)."""

    dtype: str = "int64"
    value: PrimExpr | None = None

    def __str__(self) -> str:
        return f"Prim({format_expr(self.value)})" if self.value is not None else f"Prim({self.dtype})"


@dataclass(frozen=True)
class TupleStructInfo(StructInfo):
    fields: tuple[StructInfo, ...]

    def __str__(self) -> str:
        return "Tuple(" + ", ".join(str(f) for f in self.fields) + ")"


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


@dataclass(frozen=True)
class OptionalStructInfo(StructInfo):
    """An ONNX optional: a value of ``inner`` (a tensor or a sequence) or none.

    A value of ``inner`` is a value of ``Optional(inner)`` (``is_less_specific``): an optional
    that holds something is that thing, so a loop may carry an optional in and a sequence out.
    """

    inner: StructInfo

    def __str__(self) -> str:
        return f"Optional({self.inner})"


@dataclass(frozen=True)
class FuncStructInfo(StructInfo):
    params: tuple[StructInfo, ...]
    ret: StructInfo

    def __str__(self) -> str:
        return "Func([" + ", ".join(str(p) for p in self.params) + f"], {self.ret})"


def struct_info_equal(a: StructInfo, b: StructInfo) -> bool:
    """Equality of annotations, comparing symbolic dims through the prover."""
    if type(a) is not type(b):
        return False
    if isinstance(a, TensorStructInfo):
        assert isinstance(b, TensorStructInfo)
        return a.dtype == b.dtype and a.ndim == b.ndim and _dims_equal(a.shape, b.shape)
    if isinstance(a, ShapeStructInfo):
        assert isinstance(b, ShapeStructInfo)
        return a.ndim == b.ndim and _dims_equal(a.values, b.values)
    if isinstance(a, TupleStructInfo):
        assert isinstance(b, TupleStructInfo)
        return len(a.fields) == len(b.fields) and all(
            struct_info_equal(x, y) for x, y in zip(a.fields, b.fields)
        )
    if isinstance(a, PrimStructInfo):
        assert isinstance(b, PrimStructInfo)
        if a.dtype != b.dtype or (a.value is None) != (b.value is None):
            return False
        return a.value is None or prove_equal(a.value, b.value)  # type: ignore[arg-type]
    if isinstance(a, SequenceStructInfo):
        assert isinstance(b, SequenceStructInfo)
        return struct_info_equal(a.element, b.element) and _lengths_equal(a.length, b.length)
    if isinstance(a, OptionalStructInfo):
        assert isinstance(b, OptionalStructInfo)
        return struct_info_equal(a.inner, b.inner)
    return a == b


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
    if type(general) is not type(specific):
        return False
    if isinstance(general, TensorStructInfo):
        assert isinstance(specific, TensorStructInfo)
        if general.dtype != specific.dtype:
            return False
        if general.ndim == -1:
            return True
        if general.ndim != specific.ndim:
            return False
        return general.shape is None or _dims_equal(general.shape, specific.shape)
    if isinstance(general, ShapeStructInfo):
        assert isinstance(specific, ShapeStructInfo)
        if general.ndim == -1:
            return True
        if general.ndim != specific.ndim:
            return False
        return general.values is None or _dims_equal(general.values, specific.values)
    if isinstance(general, PrimStructInfo):
        assert isinstance(specific, PrimStructInfo)
        if general.dtype != specific.dtype:
            return False
        return general.value is None or (specific.value is not None and prove_equal(general.value, specific.value))
    if isinstance(general, TupleStructInfo):
        assert isinstance(specific, TupleStructInfo)
        return len(general.fields) == len(specific.fields) and all(
            is_less_specific(g, s) for g, s in zip(general.fields, specific.fields)
        )
    if isinstance(general, SequenceStructInfo):
        assert isinstance(specific, SequenceStructInfo)
        return is_less_specific(general.element, specific.element) and (
            general.length is None or _lengths_equal(general.length, specific.length))
    return struct_info_equal(general, specific)


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
    if isinstance(a, TensorStructInfo):
        assert isinstance(b, TensorStructInfo)
        if a.dtype != b.dtype:
            return ObjectStructInfo()
        return TensorStructInfo(None, a.dtype, a.ndim if a.ndim == b.ndim else -1)
    if isinstance(a, ShapeStructInfo):
        assert isinstance(b, ShapeStructInfo)
        return ShapeStructInfo(None, a.ndim if a.ndim == b.ndim else -1)
    if isinstance(a, PrimStructInfo):
        assert isinstance(b, PrimStructInfo)
        return PrimStructInfo(a.dtype) if a.dtype == b.dtype else ObjectStructInfo()
    if isinstance(a, TupleStructInfo):
        assert isinstance(b, TupleStructInfo)
        if len(a.fields) != len(b.fields):
            return ObjectStructInfo()
        return TupleStructInfo(tuple(join(x, y) for x, y in zip(a.fields, b.fields)))
    if isinstance(a, SequenceStructInfo):
        assert isinstance(b, SequenceStructInfo)
        element = join(a.element, b.element)
        if not isinstance(element, TensorStructInfo):
            return ObjectStructInfo()
        length = a.length if a.length is not None and _lengths_equal(a.length, b.length) else None
        return SequenceStructInfo(element, length)
    return ObjectStructInfo()
