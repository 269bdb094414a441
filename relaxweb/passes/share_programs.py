"""share_programs: one tensor program for the call sites whose programs differ only in
integer constants; the constants that differ become size variables the call sites bind.

A real network repeats the same layer at several widths: YOLO's 1x1 convolutions with 64,
128 and 256 channels, the same fused bias + SiLU epilogue after each.  After fusion each is a
program of its own, identical to the others but for the integers baked into its shapes and
index arithmetic, and each becomes its own WGSL shader, compiled at load time.  Shader
compilation is what load time is made of, so this pass merges such programs:

1. Each program's *skeleton* is the program with every non-zero integer literal of its index
   arithmetic (buffer shapes, load indices, index values, reduction extents) replaced by a
   placeholder of the literal's sign.  Programs with the same skeleton (same body, buffers,
   dtypes and schedules) differ only in those literals.
2. In a group of two or more, a literal position with the same value in every member stays a
   literal (a 3x3 kernel's extent stays 3, so the backend still sees it).  Positions whose
   values differ become size variables ``constant0``, ``constant1``...; positions that carry
   the same values in every member share a variable (the channel count used as a shape and
   as a stride is one parameter, so ``(c * n + k) // n`` still simplifies).
3. The group becomes one program, and each call site binds the new variables to its own
   member's values (``size_var_values``): the host module writes them into the call site's
   params block, exactly as it writes a symbolic batch size.

Sharing keeps each member's WebGPU layout.  It runs before schedule_programs, whose WebGPU
rules read constant extents (a 32x32 tile where the rows or the columns are a constant below
64, a workgroup per output for a long constant reduction, a vectorized last dimension that is
a multiple of 4), which a shared program may have turned into variables.  So:

- programs are grouped by skeleton and by the WebGPU schedule the rules give each member
  (``schedule_programs.webgpu_schedule``): programs laid out differently stay apart;
- a group is left apart only when its shared program cannot run that schedule
  (``relaxweb.ir.schedule_fit.webgpu_fits``: a vectorized program whose last dimension becomes
  a variable cannot be shown to be a multiple of 4), not where the rules would prefer another
  one for the shared program (convolutions of 48 and 40 output channels share their 32x32
  tiles, where the shared program, its channel count a variable, would get 64x64 ones);
- the variables each shared program gained are recorded in the module's attrs
  (``relaxweb.ir.shared_sizes.SHARED_SIZES``), and schedule_programs chooses its WebGPU
  schedule on the program as its call sites run it, those variables bound to their values:
  its members' schedule, which every call site gives (sharing of scheduled programs kept
  their schedule in the same way, when schedule_programs ran first).

A group is also left alone when it would need more than :data:`MAX_NEW_VARIABLES`
parameters.  Semantics are unchanged at every call site: each variable holds, there, the
literal it replaced.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ..ir.expr import CallTIR, CallTIRInto, Expr, Function
from ..ir.functor import ExprMutator
from ..ir.module import IRModule
from ..ir.schedule import WebGpuSchedule
from ..ir.schedule_fit import webgpu_fits
from ..ir.shared_sizes import SHARED_SIZES, map_index_exprs, shared_sizes
from ..ir.symbolic import IntImm, PrimExpr, SizeVar, Sub
from ..ir.tir import TensorProgram, index_var_names
from .schedule_programs import webgpu_schedule

MAX_NEW_VARIABLES = 16  # params a shared program may gain (a params block holds 63)
VARIABLE_PREFIX = "constant"

# Placeholders of a literal in a skeleton: not plain names, so no program's variable has them.
_POSITIVE, _NEGATIVE = SizeVar("<positive literal>"), SizeVar("<negative literal>")


def share_programs(module: IRModule) -> IRModule:
    """Merge the tensor programs that differ only in integer literals (see the module doc)."""
    groups: dict[tuple[TensorProgram, WebGpuSchedule], list[tuple[str, list[int]]]] = {}
    for name, program in module.programs.items():
        if isinstance(program, TensorProgram):
            skeleton, literals = _skeleton(program)
            groups.setdefault((skeleton, webgpu_schedule(program)), []).append((name, literals))

    taken = _variable_names(module)
    programs = dict(module.programs)
    redirect: dict[str, tuple[str, tuple[tuple[str, PrimExpr], ...]]] = {}
    introduced = shared_sizes(module.attrs)
    for (_, schedule), members in groups.items():
        if len(members) < 2:
            continue
        shared = _shared_program(module.programs[members[0][0]], [literals for _, literals in members], schedule, taken)
        if shared is None:
            continue
        program, bindings = shared
        programs[program.name] = program
        earlier = [variable for name, _ in members for variable in introduced.pop(name, ())]  # members shared before
        introduced[program.name] = tuple(dict.fromkeys([*earlier, *(variable for variable, _ in bindings[0])]))
        for (name, _), values in zip(members, bindings):
            redirect[name] = (program.name, values)
            if name != program.name:
                del programs[name]
    if not redirect:
        return module
    functions = {name: _Redirect(redirect).visit_function(function) if isinstance(function, Function) else function
                 for name, function in module.functions.items()}
    attrs = {**module.attrs, SHARED_SIZES: introduced}
    return module.replace(functions=functions, programs=programs, attrs=attrs)


def _shared_program(
    first: TensorProgram, member_literals: list[list[int]], schedule: WebGpuSchedule, taken: set[str],
) -> tuple[TensorProgram, list[tuple[tuple[str, PrimExpr], ...]]] | None:
    """The program the group shares and each member's bindings of its new variables, or
    None when sharing does not pay or the shared program cannot run the members' WebGPU
    ``schedule``."""
    columns = list(zip(*member_literals))  # one column per literal position: its value in each member
    variable_of: dict[tuple[int, ...], SizeVar] = {}
    replacements: list[PrimExpr] = []
    for column in columns:
        if len(set(column)) == 1:
            replacements.append(IntImm(column[0]))
            continue
        magnitudes = tuple(abs(value) for value in column)
        if magnitudes not in variable_of:
            variable_of[magnitudes] = SizeVar(_fresh_name(taken | index_var_names(first)))
            taken.add(variable_of[magnitudes].name)
        variable = variable_of[magnitudes]
        replacements.append(variable if column[0] > 0 else Sub(IntImm(0), variable))
    if not variable_of or len(variable_of) > MAX_NEW_VARIABLES:
        return None
    pending = iter(replacements)
    program = _map_literals(first, lambda _value: next(pending))
    if not webgpu_fits(program, schedule):
        return None
    bindings = [tuple((variable.name, IntImm(magnitudes[member])) for magnitudes, variable in variable_of.items())
                for member in range(len(member_literals))]
    return program, bindings


def _skeleton(program: TensorProgram) -> tuple[TensorProgram, list[int]]:
    """The program with its non-zero literals replaced by sign placeholders (and no name),
    and the literals in the order they were replaced."""
    literals: list[int] = []

    def placeholder(value: int) -> PrimExpr:
        literals.append(value)
        return _POSITIVE if value > 0 else _NEGATIVE

    return replace(_map_literals(program, placeholder), name=""), literals


def _map_literals(program: TensorProgram, literal: Callable[[int], PrimExpr]) -> TensorProgram:
    """``program`` with each non-zero integer literal of its index arithmetic replaced by
    ``literal(value)``, in a fixed order (``map_index_exprs``'s, each expression left to
    right), so two programs of one skeleton see their literals in the same positions."""

    def index(expr: PrimExpr) -> PrimExpr:
        if isinstance(expr, IntImm):
            return expr if expr.value == 0 else literal(expr.value)
        if isinstance(expr, SizeVar):
            return expr
        return type(expr)(index(expr.a), index(expr.b))  # type: ignore[attr-defined]

    return map_index_exprs(program, index)


def _variable_names(module: IRModule) -> set[str]:
    """Every size variable name the module's programs use (new variables avoid them)."""
    names: set[str] = set()
    for program in module.programs.values():
        names |= {v.name for v in program.size_vars}
    return names


def _fresh_name(taken: set[str]) -> str:
    number = 0
    while f"{VARIABLE_PREFIX}{number}" in taken:
        number += 1
    return f"{VARIABLE_PREFIX}{number}"


class _Redirect(ExprMutator):
    """Points each call of a merged program at the shared one, binding its new variables."""

    def __init__(self, redirect: dict[str, tuple[str, tuple[tuple[str, PrimExpr], ...]]]) -> None:
        super().__init__()
        self.redirect = redirect

    def visit_call_tir(self, call: CallTIR) -> Expr:
        return self.redirected(super().visit_call_tir(call))

    def visit_call_tir_into(self, call: CallTIRInto) -> Expr:
        return self.redirected(super().visit_call_tir_into(call))

    def redirected(self, call):
        if call.program not in self.redirect:
            return call
        name, values = self.redirect[call.program]
        return replace(call, program=name, size_var_values=(*call.size_var_values, *values))
