"""The op registry: for each graph-level op, its deduction, legalization and semantics.

The mechanism lives with the IR (the builder deduces through it, the interpreter evaluates
through it); the ops themselves live in ``relaxweb/ops``, which registers each one once, in
the file of its family (``elementwise.py``, ``linear_algebra.py`` …), with three functions
side by side:

- ``deduce(args, attrs) -> StructInfo``: the output annotation, computed forward from the
  arguments' annotations when the call is built (:func:`call_op`).
- ``legalize(context, call) -> Expr``: the call rewritten into tensor programs
  (:class:`~relaxweb.ir.expr.CallTIR`), used by ``passes/legalize_ops.py``.  ``None`` for an
  op that imports and runs in the interpreter but has no GPU lowering yet: building a
  bundle with it stops with one error listing every such op.
- ``reference(arrays, attrs) -> ndarray``: numpy semantics, used by the interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np

from ..errors import RelaxwebError
from .expr import Call, CallTIR, Expr, Var
from .library_kernel import LibraryKernel
from .struct_info import StructInfo
from .symbolic import SizeVar
from .tir import TensorProgram


class DeductionError(RelaxwebError):
    """A call whose arguments cannot go together (e.g. shapes that do not broadcast)."""


class LegalizeContext(Protocol):
    """What a legalization may do besides returning its result."""

    def call_tir(self, program: TensorProgram, args: tuple[Expr, ...]) -> CallTIR:
        """Add ``program`` to the module and return a call of it on ``args``."""

    def call_library(self, kernel: LibraryKernel, args: tuple[Expr, ...]) -> CallTIR:
        """Add a library kernel (``relaxweb/library``) and return a call_library of it."""

    def fresh_name(self, hint: str) -> str:
        """A name unused in the function, for a new symbolic variable."""

    def emit_match_cast(self, value: Expr, struct_info: StructInfo, name_hint: str = "lv") -> Var:
        """Bind ``value`` cast to ``struct_info`` (checked at run time)."""

    def emit(self, value: Expr, name_hint: str = "lv") -> Var:
        """Bind an intermediate value before the one being legalized."""


@dataclass(frozen=True)
class OpDefinition:
    name: str
    deduce: Callable[[tuple[Expr, ...], dict[str, Any]], StructInfo]
    legalize: Callable[[LegalizeContext, Call], Expr] | None
    reference: Callable[[list[np.ndarray], dict[str, Any]], np.ndarray]


OPS: dict[str, OpDefinition] = {}


def register_op(name: str, *, deduce, reference, legalize=None) -> OpDefinition:
    if name in OPS:
        raise ValueError(f"op {name} registered twice")
    OPS[name] = OpDefinition(name, deduce, legalize, reference)
    return OPS[name]


def get_op(name: str) -> OpDefinition:
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"no op named {name!r} is registered (importing relaxweb.ops registers the built-in ops)") from None


def call_op(name: str, *args: Expr, **attrs: Any) -> Call:
    """Build a call of a registered op, deducing its annotation from the arguments."""
    definition = get_op(name)
    return Call(name, tuple(args), dict(attrs), definition.deduce(tuple(args), dict(attrs)))


def call_tir_of(program: TensorProgram, args: tuple[Expr, ...], struct_info) -> CallTIR:
    """A CallTIR binding each program size variable to the same-named caller variable."""
    return CallTIR(
        program.name, tuple(args), struct_info,
        tuple((var.name, SizeVar(var.name)) for var in program.size_vars),
    )
