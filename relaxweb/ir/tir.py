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
"""

from __future__ import annotations

from dataclasses import dataclass

from .symbolic import PrimExpr, SizeVar, as_expr, format_expr, free_vars


@dataclass(frozen=True)
class Buffer:
    """A tensor seen from inside a tensor program."""

    name: str
    shape: tuple[PrimExpr, ...]
    dtype: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(as_expr(d) for d in self.shape))


class ScalarExpr:
    """Base of scalar (element) expressions."""


@dataclass(frozen=True)
class Load(ScalarExpr):
    """``buffer[indices]``."""

    buffer: Buffer
    indices: tuple[PrimExpr, ...]


@dataclass(frozen=True)
class FloatImm(ScalarExpr):
    value: float
    dtype: str = "float32"


@dataclass(frozen=True)
class Binary(ScalarExpr):
    """``op`` is one of add, subtract, multiply, divide, maximum, minimum."""

    op: str
    a: ScalarExpr
    b: ScalarExpr


@dataclass(frozen=True)
class Unary(ScalarExpr):
    """``op`` is one of exp, tanh, negative, sigmoid."""

    op: str
    a: ScalarExpr


@dataclass(frozen=True)
class Reduce(ScalarExpr):
    """``combiner`` (sum or max) of ``body`` over ``axis`` in ``[0, extent)``."""

    combiner: str
    axis: SizeVar
    extent: PrimExpr
    body: ScalarExpr


BINARY_OPS = ("add", "subtract", "multiply", "divide", "maximum", "minimum")
UNARY_OPS = ("exp", "tanh", "negative", "sigmoid")
REDUCE_COMBINERS = ("sum", "max")


@dataclass(frozen=True)
class TensorProgram:
    """``output[axes] = body``: one output tensor computed from ``inputs``."""

    name: str
    inputs: tuple[Buffer, ...]
    output: Buffer
    axes: tuple[SizeVar, ...]
    body: ScalarExpr

    @property
    def size_vars(self) -> list[SizeVar]:
        """Size variables of the buffer shapes, in order of first appearance."""
        found: dict[str, SizeVar] = {}
        for buffer in (*self.inputs, self.output):
            for dim in buffer.shape:
                for var in free_vars(dim):
                    found.setdefault(var.name, var)
        return list(found.values())


def format_scalar(expr: ScalarExpr) -> str:
    """Readable text of a scalar expression, used by the printer and in WGSL comments."""
    if isinstance(expr, Load):
        return f"{expr.buffer.name}[{', '.join(format_expr(i) for i in expr.indices)}]"
    if isinstance(expr, FloatImm):
        return repr(expr.value)
    if isinstance(expr, Binary):
        symbols = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/"}
        if expr.op in symbols:
            return f"({format_scalar(expr.a)} {symbols[expr.op]} {format_scalar(expr.b)})"
        return f"{expr.op}({format_scalar(expr.a)}, {format_scalar(expr.b)})"
    if isinstance(expr, Unary):
        return f"{expr.op}({format_scalar(expr.a)})"
    if isinstance(expr, Reduce):
        return f"{expr.combiner}({expr.axis.name} < {format_expr(expr.extent)}: {format_scalar(expr.body)})"
    raise TypeError(f"not a scalar expression: {expr!r}")


def format_program(program: TensorProgram) -> str:
    """The program as text: signature, then the compute definition."""
    def buffer_text(buffer: Buffer) -> str:
        dims = ", ".join(format_expr(d) for d in buffer.shape)
        return f"{buffer.name}: Buffer(({dims}), {buffer.dtype})"

    params = ", ".join(buffer_text(b) for b in (*program.inputs, program.output))
    axes = ", ".join(a.name for a in program.axes)
    return (
        f"@tensor_program\ndef {program.name}({params}):\n"
        f"    {program.output.name}[{axes}] = {format_scalar(program.body)}"
    )
