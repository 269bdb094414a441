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

An op registered with ``checks_data=True`` checks a run's data (an index within its axis),
and one with ``reads_back=True`` reads sizes back from it: a call of either built while the
frontend converts a node (:func:`converting_node`) carries the attribute :data:`NODE_ATTR`,
``(node name, op type)``. The reference names that node when it refuses the data, the
legalization writes it into the error sites of the kernels that check
(``relaxweb/ir/error_sites.py``), and the host's checks of what is read back say it
(:func:`node_text`: ``Range node 'r'``).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol

import numpy as np

from ..errors import RelaxwebError
from .expr import Call, CallTIR, Expr, Var
from .library_kernel import LibraryKernel
from .struct_info import StructInfo
from .symbolic import PrimExpr, SizeVar
from .tir import TensorProgram


class DeductionError(RelaxwebError):
    """A call whose arguments cannot go together (e.g. shapes that do not broadcast)."""


class AssumptionError(DeductionError):
    """Deduction needs ``actual == expected``, which the analyzer can neither prove nor refute.

    ``(h + 31) // 32 * 2`` against ``(h + 15) // 16`` holds whenever ``h`` is a multiple of
    32, which is what such a model is made for.  The fact is about dimension ``dim`` of
    argument ``argument``, or, when ``dim`` is None, about ``quantity`` computed from it (a
    reshape's element count).  Raised from a ``deduce`` function; while a builder is
    checking assumptions (:func:`checking_assumptions`), :func:`call_op` hands it to the
    builder, which makes the fact a run-time check (a ``match_cast``) and deduces again:
    with the argument cast for a dimension, or with ``checked_attrs`` added to the call's
    attributes for a quantity (the op then takes the fact as given, visibly in the IR).
    Without a builder checking assumptions it is a deduction error like any other.
    """

    def __init__(self, message: str, *, argument: int, dim: int | None, actual: PrimExpr, expected: PrimExpr,
                 quantity: str = "", checked_attrs: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.argument = argument
        self.dim = dim
        self.actual = actual
        self.expected = expected
        self.quantity = quantity or f"dimension {dim}"
        self.checked_attrs = dict(checked_attrs or {})


class LegalizeContext(Protocol):
    """What a legalization may do besides returning its result."""

    def call_tir(self, program: TensorProgram, args: tuple[Expr, ...]) -> CallTIR:
        """Add ``program`` to the module and return a call of it on ``args``."""

    def call_library(self, kernel: LibraryKernel, args: tuple[Expr, ...]) -> CallTIR:
        """Add a library kernel (``relaxweb/library``) and return a call_library of it."""

    def fresh_name(self, hint: str) -> str:
        """A name unused in the function, for a new symbolic variable."""

    def error_site(self, call: Call, message: str) -> int:
        """A new error site (``relaxweb/ir/error_sites.py``) for a check of ``call``'s data,
        naming the node it comes from; ``message`` shows the reported values as ``{0}``,
        ``{1}`` ...  Returns the site's number, which the checking node holds."""

    def emit_match_cast(self, value: Expr, struct_info: StructInfo, name_hint: str = "lv", reason: str = "") -> Var:
        """Bind ``value`` cast to ``struct_info`` (checked at run time; a failed check with a
        ``reason`` reports it, with both values)."""

    def emit(self, value: Expr, name_hint: str = "lv") -> Var:
        """Bind an intermediate value before the one being legalized."""

    #: Where the call being legalized comes from (its ``source``: ``Range node 'r'``), or "".
    source: str


@dataclass(frozen=True)
class OpDefinition:
    name: str
    deduce: Callable[[tuple[Expr, ...], dict[str, Any]], StructInfo]
    legalize: Callable[[LegalizeContext, Call], Expr] | None
    reference: Callable[[list[np.ndarray], dict[str, Any]], np.ndarray]
    #: The result lives in the storage of the first argument (a KV cache and its views): the
    #: call stays through legalization, memory planning gives it no storage of its own.
    view: bool = False
    #: The legalization may read sizes back from the data (``ops/readback.py``): its calls carry
    #: the node they come from (NODE_ATTR), which the run-time checks of what is read back name.
    reads_back: bool = False
    #: Its kernels check the run's data: its calls carry the node they come from (NODE_ATTR);
    #: a function of the call's arguments and attributes where only some calls do (integer
    #: arithmetic, whose kernels check int64 overflow and zero divisors).
    checks_data: bool | Callable[[tuple[Expr, ...], dict[str, Any]], bool] = False

    def checks_data_of(self, args: tuple[Expr, ...], attrs: dict[str, Any]) -> bool:
        """Whether a call of this op with ``args`` and ``attrs`` checks the run's data."""
        return bool(self.checks_data(args, attrs) if callable(self.checks_data) else self.checks_data)


OPS: dict[str, OpDefinition] = {}

#: The attribute naming the model's node a call of a ``checks_data`` op comes from:
#: ``(node name, op type)``.
NODE_ATTR = "node"

def register_op(name: str, *, deduce, reference, legalize=None, view: bool = False,
                reads_back: bool = False,
                checks_data: bool | Callable[[tuple[Expr, ...], dict[str, Any]], bool] = False) -> OpDefinition:
    if name in OPS:
        raise ValueError(f"op {name} registered twice")
    OPS[name] = OpDefinition(name, deduce, legalize, reference, view, reads_back, checks_data)
    return OPS[name]


def node_named(attrs: dict[str, Any], op: str) -> tuple[str, str]:
    """The ``(node name, op type)`` a call of a ``checks_data`` op (its ``attrs``) comes from;
    a call built outside the frontend (a test, a pass) names no node: ``("", op)``."""
    node = attrs.get(NODE_ATTR)
    return (str(node[0]), str(node[1])) if isinstance(node, (tuple, list)) and len(node) == 2 else ("", op)


def node_attrs(call: Call) -> dict[str, Any]:
    """The attribute naming the node ``call`` comes from, for a pass that rewrites it into
    calls of its own (``{}`` when it names none)."""
    return {NODE_ATTR: call.attrs[NODE_ATTR]} if NODE_ATTR in call.attrs else {}


def node_of(call: Call) -> tuple[str, str]:
    """:func:`node_named` of a call."""
    return node_named(call.attrs, call.op)


def node_text(attrs: dict[str, Any]) -> str:
    """How an error names the node a call (its ``attrs``) comes from: ``Range node 'r'``;
    "" for a call that names none."""
    name, op_type = node_named(attrs, "")
    return f"{op_type} node '{name}'" if op_type else ""


def is_view(expr: Expr) -> bool:
    """Whether ``expr`` is a call of an op whose result lives in its first argument's storage."""
    return isinstance(expr, Call) and expr.op in OPS and OPS[expr.op].view


def get_op(name: str) -> OpDefinition:
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"no op named {name!r} is registered (importing relaxweb.ops registers the built-in ops)") from None


# How a builder answers an AssumptionError: (error, args, attrs) -> the args and attrs to
# deduce again with, after binding the run-time check.
AssumptionHandler = Callable[[AssumptionError, tuple[Expr, ...], dict[str, Any]], tuple[tuple[Expr, ...], dict[str, Any]]]

# The handlers of the builders checking assumptions now, innermost last.
_ASSUMPTION_HANDLERS: list[AssumptionHandler] = []

# Deduction is retried at most this many times per call (each retry checks one more fact).
MAX_ASSUMPTIONS_PER_CALL = 32

# The model's nodes being converted now, innermost last: (node name, op type).
_NODES: list[tuple[str, str]] = []


@contextmanager
def converting_node(name: str, op_type: str) -> Iterator[None]:
    """Within the block, :func:`call_op` gives each call of a ``checks_data`` or
    ``reads_back`` op the node it comes from (:data:`NODE_ATTR`), unless the call names one
    already."""
    _NODES.append((name, op_type))
    try:
        yield
    finally:
        _NODES.pop()


@contextmanager
def checking_assumptions(handler: AssumptionHandler) -> Iterator[None]:
    """Within the block, :func:`call_op` answers an :class:`AssumptionError` with ``handler``
    (see ``FunctionBuilder.checking_assumptions``) instead of raising it."""
    _ASSUMPTION_HANDLERS.append(handler)
    try:
        yield
    finally:
        _ASSUMPTION_HANDLERS.pop()


def call_op(name: str, *args: Expr, **attrs: Any) -> Call:
    """Build a call of a registered op, deducing its annotation from the arguments.

    A fact the analyzer cannot prove (an :class:`AssumptionError`) goes to the innermost
    builder checking assumptions, which binds a run-time check of it; deduction then runs
    again on what the builder returns, until it succeeds or fails for good."""
    definition = get_op(name)
    args, attrs = tuple(args), dict(attrs)
    if _NODES and NODE_ATTR not in attrs and (definition.reads_back or definition.checks_data_of(args, attrs)):
        attrs[NODE_ATTR] = _NODES[-1]
    for _ in range(MAX_ASSUMPTIONS_PER_CALL):
        try:
            return Call(name, args, attrs, definition.deduce(args, dict(attrs)))
        except AssumptionError as needed:
            if not _ASSUMPTION_HANDLERS:
                raise
            args, attrs = _ASSUMPTION_HANDLERS[-1](needed, args, attrs)
    raise DeductionError(f"{name}: still needs facts it cannot prove after {MAX_ASSUMPTIONS_PER_CALL} run-time checks")


def call_tir_of(program: TensorProgram, args: tuple[Expr, ...], struct_info) -> CallTIR:
    """A CallTIR binding each program size variable to the same-named caller variable."""
    return CallTIR(
        program.name, tuple(args), struct_info,
        tuple((var.name, SizeVar(var.name)) for var in program.size_vars),
    )
