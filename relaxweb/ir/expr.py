"""Graph-level IR: functions made of bindings, calls to ops and to tensor programs.

A function body is a sequence of blocks; each block is a list of bindings ``var = value``.
Bindings in a :class:`DataflowBlock` are pure and free of control flow, which is what lets
passes reorder, fuse and plan them freely.  Every expression carries its annotation
(``struct_info``), deduced forward when it is built (see ``relaxweb.ir.op_registry.call_op``).

Variables compare by identity (two ``Var("x")`` are different variables); structural
equality up to renaming is ``relaxweb.ir.structural.structural_equal``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .struct_info import (
    ObjectStructInfo, PrimStructInfo, ShapeStructInfo, StructInfo, TensorStructInfo, TupleStructInfo, join,
)
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
class PrimValue(Expr):
    """An integer value given by a symbolic expression (e.g. a condition ``n % 2``)."""

    value: PrimExpr
    struct_info: StructInfo = field(init=False)

    def __post_init__(self) -> None:
        value = as_expr(self.value)
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "struct_info", PrimStructInfo("int64", value))


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


class CallLibrary(CallTIR):
    """Call a hand-written library kernel of the module (``relaxweb/library``), for what a
    compute definition expresses badly; same conventions as :class:`CallTIR`."""


@dataclass(frozen=True, eq=False)
class TensorToPrim(Expr):
    """The integer held by a one-element integer tensor, as a prim value.

    Its value lives on the GPU: the compiled host reads it back (a resumable step), so a
    ``match_cast`` of the result can bind a symbolic variable to a data-dependent size.
    """

    tensor: Expr
    struct_info: StructInfo = field(default_factory=lambda: PrimStructInfo("int64"))


@dataclass(frozen=True, eq=False)
class TupleGetItem(Expr):
    tuple_value: Expr
    index: int
    struct_info: StructInfo = field(init=False)

    def __post_init__(self) -> None:
        info = self.tuple_value.struct_info
        if not isinstance(info, TupleStructInfo) or not 0 <= self.index < len(info.fields):
            raise ValueError(f"tuple index {self.index} out of range for {info}")
        object.__setattr__(self, "struct_info", info.fields[self.index])


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
    that appear there for the first time are defined by the match.

    ``reason`` is what the check states, in the user's terms, when the cast records a fact
    deduction assumed (``Add node '/fpn/Add': dimension 2 of input 1 ('p5_up')``): a failed
    check at run time reports it with both values.  Empty for other casts."""

    var: Var
    value: Expr
    struct_info: StructInfo
    reason: str = ""


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
class If(Expr):
    """``if condition: true_branch else false_branch``.

    The condition is a prim value (non-zero is true) or a scalar tensor (an ``int32`` or
    ``bool``-like value, non-zero is true).  Each branch is a sequence of blocks ending in a
    value; the annotation is the join of the two branches' (see ``struct_info.join``).
    """

    condition: Expr
    true_branch: SeqExpr
    false_branch: SeqExpr
    struct_info: StructInfo = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "struct_info", join(self.true_branch.body.struct_info, self.false_branch.body.struct_info)
        )


@dataclass(frozen=True, eq=False)
class Loop(Expr):
    """``for iteration in range(count)``: ``body`` runs ``count`` times.

    ``iteration`` is a size variable that holds 0, 1, ... ``count - 1`` inside the body (the
    host counts; a program of the body reads it from its params, like any size variable).
    ``carried`` are the variables through which the body sees the loop-carried values; before
    the first iteration they hold ``init``.  The body's value is a tuple: the carried values
    for the next iteration (with the annotations of ``carried``: shapes do not change from
    one iteration to the next), then the values to stack, one per iteration.  The loop's
    value is a tuple: the carried values after the last iteration, then each stacked value
    with a new leading axis of extent ``count`` (row ``i`` from iteration ``i``).

    Memory planning rewrites a loop into its planned form, which carries and stacks
    nothing: storages hold the carried values and the body writes them (and each stacked
    row) itself, so its value is the empty tuple.
    """

    count: PrimExpr
    iteration: SizeVar
    carried: tuple[Var, ...]
    init: tuple[Expr, ...]
    body: SeqExpr
    struct_info: StructInfo = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "count", as_expr(self.count))
        result = self.body.body.struct_info
        if not isinstance(result, TupleStructInfo) or len(result.fields) < len(self.carried):
            raise ValueError(f"a loop body's value is a tuple of at least {len(self.carried)} fields, got {result}")
        if len(self.init) != len(self.carried):
            raise ValueError(f"a loop has {len(self.carried)} carried variables but {len(self.init)} initial values")
        stacked = []
        for info in result.fields[len(self.carried):]:
            if not isinstance(info, TensorStructInfo):
                raise ValueError(f"a loop stacks tensors, not {info}")
            stacked.append(TensorStructInfo((self.count, *info.shape), info.dtype) if info.shape is not None
                           else TensorStructInfo(None, info.dtype, -1 if info.ndim == -1 else info.ndim + 1))
        fields = (*(var.struct_info for var in self.carried), *stacked)
        object.__setattr__(self, "struct_info", TupleStructInfo(fields))


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
    "AllocStorage", "AllocTensor", "Binding", "BindingBlock", "Call", "CallLibrary", "CallTIR",
    "CallTIRInto", "Constant", "DataflowBlock", "DataflowVar", "Expr", "Function", "If", "Loop", "MatchCast",
    "PrimValue", "SeqExpr", "ShapeExpr", "SizeVar", "TensorToPrim", "Tuple", "TupleGetItem", "Var",
    "VarBinding", "tensor_dtype", "tensor_shape",
]
