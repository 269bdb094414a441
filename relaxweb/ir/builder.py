"""Building graph functions binding by binding.

Each emitted value already carries its deduced annotation (ops deduce when the call is
built, see ``relaxweb.ops.call_op``), so the builder only names and records bindings.

**Facts checked at run time.**  Where deduction needs two extents equal that the analyzer
can neither prove nor refute (``(h + 31) // 32 * 2`` against ``(h + 15) // 16``: equal when
``h`` is a multiple of 32), the op raises an ``AssumptionError``.  Calls built inside
``with builder.checking_assumptions(where):`` answer it as Relax does with ``match_cast``:
the builder binds a cast of the argument to its annotation with that extent replaced by
what it must equal (for a quantity such as an element count, a cast of the quantity as a
prim value), and deduction runs again from the cast.  The host module checks the cast on
every run and stops with its ``reason`` (the ONNX node, the argument, both values) when it
fails; a check the bounds prove costs nothing (``passes/lower_shapes_to_host.py``).
"""

from __future__ import annotations

import functools
import re
from contextlib import AbstractContextManager
from typing import Any, Callable, Mapping

from .expr import (
    BindingBlock, Constant, DataflowBlock, DataflowVar, Expr, Function, If, Loop, MatchCast, PrimValue, SeqExpr,
    Tuple, Var, VarBinding,
)
from .op_registry import AssumptionError, DeductionError, call_op, checking_assumptions
from .struct_info import PrimStructInfo, StructInfo, TensorStructInfo
from .symbolic import PrimExpr, SizeVar


class FunctionBuilder:
    """Collects the parameters and bindings of one function.

    With ``dataflow=True`` (the default, what importers produce) all bindings go into one
    dataflow block.  Functions with control flow use ``dataflow=False``: bindings go into a
    plain block, and :meth:`emit_if` builds each branch (:meth:`emit_loop` a loop's body)
    with a child builder.
    """

    def __init__(self, name: str, dataflow: bool = True) -> None:
        self.name = name
        self.dataflow = dataflow
        self.params: list[Var] = []
        self.input_names: list[str] = []
        self.bindings: list[VarBinding | MatchCast] = []
        self._used_names: set[str] = set()
        self._next_number: dict[str, int] = {}  # base -> the first number unique_name has not tried
        self._checked: dict[tuple[Expr, int, PrimExpr], Var] = {}  # (value, dim, extent) -> its checked cast
        self._checked_facts: set[tuple[PrimExpr, PrimExpr]] = set()  # (actual, expected) quantities checked

    @classmethod
    def avoiding_names_of(cls, function: Function) -> FunctionBuilder:
        """A builder whose :meth:`unique_name` gives names that no parameter or binding of
        ``function`` has: the namer of the variables a pass adds to it."""
        names = cls(function.name)
        for var in (*function.params, *(binding.var for binding in function.bindings())):
            names.unique_name(var.name)
        return names

    def unique_name(self, hint: str) -> str:
        """A readable, unique name derived from ``hint`` (ONNX names may hold any character)."""
        base = re.sub(r"[^0-9A-Za-z_]", "_", hint) or "v"
        if base[0].isdigit():
            base = "v" + base
        # numbered from where the last search for this base stopped: the names below it
        # were taken then and still are, so a thousand "lv" take linear time, not quadratic
        name, counter = base, self._next_number.get(base, 1)
        while name in self._used_names:
            name = f"{base}_{counter}"
            counter += 1
        self._next_number[base] = counter
        self._used_names.add(name)
        return name

    def add_param(self, name: str, struct_info: StructInfo) -> Var:
        var = Var(self.unique_name(name), struct_info)
        self.params.append(var)
        self.input_names.append(name)
        return var

    def emit(self, value: Expr, name_hint: str = "lv", output: bool = False) -> Var:
        """Bind ``value`` to a new variable; ``output`` vars may be used after the block."""
        kind = Var if output or not self.dataflow else DataflowVar
        var = kind(self.unique_name(name_hint), value.struct_info)
        self.bindings.append(VarBinding(var, value))
        return var

    def emit_op(self, op: str, *args: Expr, name_hint: str = "lv", output: bool = False, **attrs) -> Var:
        """Build and bind a call of a registered op, checking at run time what deduction
        assumes; a deduction error names the binding."""
        try:
            with self.checking_assumptions(f"binding '{name_hint}'"):
                call = call_op(op, *args, **attrs)
        except DeductionError as error:
            raise DeductionError(f"binding '{name_hint}': {error}") from None
        return self.emit(call, name_hint, output)

    def emit_match_cast(self, value: Expr, struct_info: StructInfo, name_hint: str = "lv", output: bool = False,
                        reason: str = "") -> Var:
        kind = Var if output or not self.dataflow else DataflowVar
        var = kind(self.unique_name(name_hint), struct_info)
        self.bindings.append(MatchCast(var, value, struct_info, reason))
        return var

    # -- facts checked at run time ---------------------------------------------------------

    def checking_assumptions(self, where: str, labels: Mapping[Expr, str] | None = None) -> AbstractContextManager:
        """A ``with`` block in which each call built turns what deduction assumes into a
        run-time check bound in this builder (see the module docstring).  ``where`` names the
        source of the calls for the user (``Add node '/fpn/Add'``); ``labels`` names an
        argument by what it is there (``input 1 ('p5_up')``), else it is ``argument i``."""
        handler = functools.partial(self._check_assumption, where, dict(labels or {}))
        return checking_assumptions(handler)

    def _check_assumption(self, where: str, labels: dict[Expr, str], needed: AssumptionError,
                          args: tuple[Expr, ...], attrs: dict[str, Any]) -> tuple[tuple[Expr, ...], dict[str, Any]]:
        argument = args[needed.argument]
        label = labels.get(argument, f"argument {needed.argument}")
        reason = f"{where}: {needed.quantity} of {label}"
        if needed.dim is None:  # a quantity computed from the argument: checked as a prim value
            fact = (needed.actual, needed.expected)
            if fact not in self._checked_facts:  # the same fact checked earlier fails there first
                self._checked_facts.add(fact)
                self.emit_match_cast(PrimValue(needed.actual), PrimStructInfo("int64", needed.expected), "checked",
                                     reason=reason)
            return args, {**attrs, **needed.checked_attrs}
        checked = self.check_dim(argument, needed.dim, needed.expected, reason)
        labels[checked] = label  # a further check of the same argument names it the same way
        return args[:needed.argument] + (checked,) + args[needed.argument + 1:], attrs

    def check_dim(self, value: Expr, dim: int, extent: PrimExpr, reason: str) -> Var:
        """``value`` cast to its annotation with dimension ``dim`` replaced by ``extent``,
        checked at run time (``reason`` says what, for the error).  The same check of the same
        value is bound once."""
        if not isinstance(value, (Var, Constant)):
            value = self.emit(value, "checked_value")
        key = (value, dim, extent)
        if key not in self._checked:
            info = value.struct_info
            assert isinstance(info, TensorStructInfo) and info.shape is not None
            shape = info.shape[:dim] + (extent,) + info.shape[dim + 1:]
            name = value.name.removesuffix("_checked") if value in self._checked.values() else value.name
            self._checked[key] = self.emit_match_cast(
                value, TensorStructInfo(shape, info.dtype), f"{name}_checked", reason=reason
            )
        return self._checked[key]

    def emit_if(self, condition: Expr, then_branch: Callable[[FunctionBuilder], Expr],
                else_branch: Callable[[FunctionBuilder], Expr], name_hint: str = "lv") -> Var:
        """Bind ``if condition: then_branch(b) else: else_branch(b)``; each callback emits
        the branch's bindings into the builder it gets and returns the branch's value."""
        if self.dataflow:
            raise ValueError("If cannot go in a dataflow block: build the function with dataflow=False")
        branches = []
        for build in (then_branch, else_branch):
            child = FunctionBuilder(self.name, dataflow=False)
            child._used_names = self._used_names
            result = build(child)
            branches.append(SeqExpr((BindingBlock(tuple(child.bindings)),), result))
        return self.emit(If(condition, *branches), name_hint)

    def emit_loop(self, count: PrimExpr, iteration: SizeVar, init: list[tuple[str, Expr]],
                  body: Callable[[FunctionBuilder, list[Var]], tuple[list[Expr], list[Expr]]],
                  name_hint: str = "loop") -> Var:
        """Bind ``for iteration in range(count)`` (a :class:`~relaxweb.ir.expr.Loop`): ``init``
        names each carried value and gives its initial value; ``body(b, carried)`` emits the
        body's bindings into the builder it gets, reading the carried variables, and returns
        the carried values for the next iteration and the values to stack."""
        if self.dataflow:
            raise ValueError("a Loop cannot go in a dataflow block: build the function with dataflow=False")
        carried = [Var(self.unique_name(name), value.struct_info) for name, value in init]
        child = FunctionBuilder(self.name, dataflow=False)
        child._used_names = self._used_names
        next_values, stacked = body(child, carried)
        seq = SeqExpr((BindingBlock(tuple(child.bindings)),), Tuple((*next_values, *stacked)))
        return self.emit(Loop(count, iteration, tuple(carried), tuple(value for _, value in init), seq), name_hint)

    def finish(self, outputs: list[Expr], output_names: list[str]) -> Function:
        """The function returning ``outputs`` (a tuple when there are several)."""
        body: Expr = outputs[0] if len(outputs) == 1 else Tuple(tuple(outputs))
        block = DataflowBlock if self.dataflow else BindingBlock
        return Function(
            self.name,
            tuple(self.params),
            SeqExpr((block(tuple(self.bindings)),), body),
            tuple(self.input_names),
            tuple(output_names),
        )
