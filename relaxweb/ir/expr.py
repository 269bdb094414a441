"""Graph-level IR: functions made of bindings, calls to ops and to tensor programs.

A function body is a sequence of blocks; each block is a list of bindings ``var = value``.
Bindings in a :class:`DataflowBlock` are pure and free of control flow, which is what lets
passes reorder, fuse and plan them freely.  Every expression carries its annotation
(``struct_info``), deduced forward when it is built (see ``relaxweb.ops.registry.call_op``).

Variables compare by identity (two ``Var("x")`` are different variables); structural
equality up to renaming is ``relaxweb.ir.structural.structural_equal``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .struct_info import ObjectStructInfo, ShapeStructInfo, StructInfo, TensorStructInfo, TupleStructInfo
from .symbolic import PrimExpr, SizeVar, as_expr


class Expr:
    """Base of graph-level expressions. Every expression has ``struct_info``."""

    struct_info: StructInfo


@dataclass(frozen=True, eq=False)
class Var(Expr):
    """A variable: a function parameter or the left side of a binding."""

    name: str
    struct_info: StructInfo

    def __repr__(self) -> str:
        return f"%{self.name}"


@dataclass(frozen=True, eq=False)
class DataflowVar(Var):
    """A variable local to a dataflow block; it must not be used outside it."""


@dataclass(frozen=True, eq=False)
class Constant(Expr):
    """A tensor constant (an ONNX initializer, a folded value): becomes a weight buffer."""

    data: np.ndarray
    name: str
    struct_info: StructInfo = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "struct_info", TensorStructInfo(tuple(int(d) for d in self.data.shape), str(self.data.dtype))
        )


@dataclass(frozen=True, eq=False)
class ShapeExpr(Expr):
    """A shape value built from symbolic expressions, e.g. the target shape of a reshape."""

    values: tuple[PrimExpr, ...]
    struct_info: StructInfo = field(init=False)

    def __post_init__(self) -> None:
        values = tuple(as_expr(v) for v in self.values)
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "struct_info", ShapeStructInfo(values))


@dataclass(frozen=True, eq=False)
class Tuple(Expr):
    fields: tuple[Expr, ...]
    struct_info: StructInfo = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "struct_info", TupleStructInfo(tuple(f.struct_info for f in self.fields)))


@dataclass(frozen=True, eq=False)
class Call(Expr):
    """A call of a high-level op (``add``, ``matmul``…) by name, with attributes.

    Build calls with ``relaxweb.ops.call_op`` so that the annotation is deduced.
    """

    op: str
    args: tuple[Expr, ...]
    attrs: dict[str, Any]
    struct_info: StructInfo


@dataclass(frozen=True, eq=False)
class CallTIR(Expr):
    """Call a tensor program of the module: it reads ``args`` and returns a new tensor.

    ``struct_info`` is the output tensor's annotation.  The program's own size variables are
    bound from the caller's expressions by ``size_var_values`` (program var name -> value).
    """

    program: str
    args: tuple[Expr, ...]
    struct_info: TensorStructInfo
    size_var_values: tuple[tuple[str, PrimExpr], ...]


@dataclass(frozen=True, eq=False)
class AllocStorage(Expr):
    """A block of device memory of ``size`` bytes (introduced by memory planning)."""

    size: PrimExpr
    struct_info: StructInfo = field(default_factory=ObjectStructInfo)


@dataclass(frozen=True, eq=False)
class AllocTensor(Expr):
    """A tensor placed at offset 0 of a storage (introduced by memory planning)."""

    storage: Var
    struct_info: TensorStructInfo


@dataclass(frozen=True, eq=False)
class CallTIRInto(Expr):
    """Run a tensor program writing into an already allocated ``output`` (destination passing)."""

    program: str
    args: tuple[Expr, ...]
    output: Var
    size_var_values: tuple[tuple[str, PrimExpr], ...]
    struct_info: StructInfo = field(default_factory=lambda: TupleStructInfo(()))


@dataclass(frozen=True, eq=False)
class VarBinding:
    var: Var
    value: Expr


@dataclass(frozen=True, eq=False)
class MatchCast:
    """Bind ``var`` to ``value`` after checking it matches ``struct_info``; symbolic vars
    that appear there for the first time are defined by the match."""

    var: Var
    value: Expr
    struct_info: StructInfo


Binding = VarBinding | MatchCast


@dataclass(frozen=True, eq=False)
class BindingBlock:
    bindings: tuple[Binding, ...]


@dataclass(frozen=True, eq=False)
class DataflowBlock(BindingBlock):
    """A block of pure bindings with no control flow."""


@dataclass(frozen=True, eq=False)
class SeqExpr:
    blocks: tuple[BindingBlock, ...]
    body: Expr


@dataclass(frozen=True, eq=False)
class Function:
    """A graph-level function.

    ``input_names`` and ``output_names`` are the user-facing names (ONNX names) of the
    parameters and of the fields of the result; variable names are sanitized copies.
    """

    name: str
    params: tuple[Var, ...]
    body: SeqExpr
    input_names: tuple[str, ...] = ()
    output_names: tuple[str, ...] = ()

    @property
    def ret_struct_info(self) -> StructInfo:
        return self.body.body.struct_info

    def bindings(self) -> list[Binding]:
        return [binding for block in self.body.blocks for binding in block.bindings]


def tensor_shape(expr: Expr) -> tuple[PrimExpr, ...]:
    """The symbolic shape of a tensor-valued expression (error if unknown)."""
    info = expr.struct_info
    if not isinstance(info, TensorStructInfo) or info.shape is None:
        raise ValueError(f"expected a tensor with a known shape, got {info}")
    return info.shape


def tensor_dtype(expr: Expr) -> str:
    info = expr.struct_info
    if not isinstance(info, TensorStructInfo):
        raise ValueError(f"expected a tensor, got {info}")
    return info.dtype


__all__ = [
    "AllocStorage", "AllocTensor", "Binding", "BindingBlock", "Call", "CallTIR", "CallTIRInto",
    "Constant", "DataflowBlock", "DataflowVar", "Expr", "Function", "MatchCast", "SeqExpr",
    "ShapeExpr", "SizeVar", "Tuple", "Var", "VarBinding", "tensor_dtype", "tensor_shape",
]
