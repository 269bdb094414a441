"""prove_integer_checks: drop the run-time integer checks that value ranges prove never fail.

Legalization checks every int64 operation that kernels compute in 32 bits and that can leave
int32 (an add, subtract, multiply, divide, negative, sum, prod, a cast to int64 from a float:
:class:`~relaxweb.ir.tir.CheckedInteger`), and every integer divisor
(:class:`~relaxweb.ir.tir.CheckedDivisor`), each naming its node's error site
(``relaxweb/ir/error_sites.py``).  Most int64 arithmetic in exported models is shape and index
arithmetic (``Range``, flat indices, ``position_ids``) that cannot leave int32; this pass
proves it (``relaxweb/ir/value_ranges.py``) and removes those checks, so such kernels pay
nothing and bind no run status.

The ranges come from the whole function, not one program at a time: the size variables of a
program lie within the ranges of the expressions its call sites bind them to (the user's
``--bound``s); an input buffer's elements lie within the range of the tensor passed (a
constant's smallest and largest element, or what the program that computed the tensor can
hold), so a ``Range`` computed in one kernel and added to in another is proved without
fusion, at every opt level.  A program called from several sites is proved for all of them
(the union of their ranges).  It runs after fuse_ops (a fused body shows its index arithmetic
as such) and before share_programs (the sites are still literals).  Sites no kernel checks any
more leave the module's table (``error_sites.compact_error_sites``), so the manifest lists
only checks that can fail.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import Mapping

from ..ir.analyzer import Analyzer
from ..ir.error_sites import ERROR_SITES, REPORTING_KINDS
from ..ir.expr import CallLibrary, CallTIR, Expr, Function, MatchCast, VarBinding
from ..ir.functor import ExprMutator, ExprVisitor
from ..ir.module import IRModule, ProgramTable
from ..ir.symbolic import IntImm, as_int
from ..ir.tir import ScalarExpr, TensorProgram, map_scalar, scalar_nodes
from ..ir.value_ranges import (
    ProgramRanges, SizeRanges, TensorRanges, ValueRange, without_proven_checks,
)
from .context import PassContext


def prove_integer_checks(module: IRModule) -> IRModule:
    """Drop the integer checks every call site's ranges prove never fail, share the programs
    that became identical again, and keep only the error sites some kernel still checks."""
    ranges = call_site_ranges(module)
    proven = {name: without_proven_checks(program, program_ranges(program, ranges))
              if isinstance(program, TensorProgram) else program for name, program in module.programs.items()}
    if all(proven[name] is program for name, program in module.programs.items()):
        return module
    return _compact_error_sites(_share_identical(module, proven))


def _share_identical(module: IRModule, programs: dict) -> IRModule:
    """The module with ``programs``, those identical up to their name merged (the first keeps
    its name) and their call sites renamed."""
    table = ProgramTable({})
    renamed = {name: table.add(program) for name, program in programs.items()}

    class Renamer(ExprMutator):
        def visit_call_tir(self, call: CallTIR) -> Expr:
            call = super().visit_call_tir(call)
            name = renamed.get(call.program, call.program)
            return call if name == call.program else replace(call, program=name)

    functions = {name: Renamer().visit_function(f) if isinstance(f, Function) else f
                 for name, f in module.functions.items()}
    return module.replace(functions=functions, programs=table.programs)


def _compact_error_sites(module: IRModule) -> IRModule:
    """The module's error sites that a program still checks, numbered again from 1 in their
    order, the programs' site literals with them (no table where none is left)."""
    table = module.attrs.get(ERROR_SITES, ())
    used = sorted({as_int(node.site) for program in module.programs.values() if isinstance(program, TensorProgram)
                   for node in scalar_nodes(program.body) if node.scalar_kind in REPORTING_KINDS})
    if used == list(range(1, len(table) + 1)):
        return module
    number = {old: new for new, old in enumerate(used, start=1)}

    def renumber(node: ScalarExpr) -> ScalarExpr | None:
        if node.scalar_kind not in REPORTING_KINDS:
            return None
        return replace(node, site=IntImm(number[as_int(node.site)]))

    programs = {name: replace(program, body=map_scalar(program.body, renumber)) if isinstance(program, TensorProgram)
                else program for name, program in module.programs.items()}
    kept = type(table)(table[old - 1] for old in used)  # a tuple, or a list as the text form reads it
    attrs = {key: value for key, value in module.attrs.items() if key != ERROR_SITES}
    return module.replace(programs=programs, attrs={**attrs, ERROR_SITES: kept} if kept else attrs)

class _CallSites(ExprVisitor):
    """Each tensor program's call sites (the ranges of its size variables and input buffers
    there, :class:`~relaxweb.ir.value_ranges.TensorRanges`), in the order they run."""

    def __init__(self, module: IRModule, analyzer: Analyzer) -> None:
        self.module = module
        self.ranges = TensorRanges(analyzer)
        self.sites: dict[str, list[tuple[SizeRanges, dict[str, ValueRange]]]] = defaultdict(list)

    def visit_var_binding(self, binding: VarBinding) -> None:
        super().visit_var_binding(binding)
        value = binding.value
        program = self.module.programs.get(value.program) if isinstance(value, CallTIR) else None
        if isinstance(program, TensorProgram) and not isinstance(value, CallLibrary):
            self.sites[value.program].append(self.ranges.at_call(value, program))
        self.ranges.note(binding, self.module.programs)

    def visit_match_cast(self, binding: MatchCast) -> None:
        super().visit_match_cast(binding)
        self.ranges.note(binding, self.module.programs)


def call_site_ranges(module: IRModule) -> dict[str, tuple[SizeRanges, dict[str, ValueRange]]]:
    """Each called tensor program's size variable and input buffer ranges, the union over its
    call sites (a program no graph function calls has none)."""
    collector = _CallSites(module, Analyzer.from_bounds(PassContext.current().bounds))
    for function in module.functions.values():
        if isinstance(function, Function):
            collector.visit_function(function)
    return {name: _union(sites) for name, sites in collector.sites.items()}


def _union(sites: list[tuple[SizeRanges, dict[str, ValueRange]]]) -> tuple[SizeRanges, dict[str, ValueRange]]:
    sizes: SizeRanges = {}
    buffers: dict[str, ValueRange] = {}
    for site_sizes, site_buffers in sites:
        for name, (lo, hi) in site_sizes.items():
            if name in sizes:
                known_lo, known_hi = sizes[name]
                lo, hi = min(lo, known_lo), None if hi is None or known_hi is None else max(hi, known_hi)
            sizes[name] = (lo, hi)
        for name, value in site_buffers.items():
            buffers[name] = buffers[name].union(value) if name in buffers else value
    return sizes, buffers


def program_ranges(program: TensorProgram, ranges: Mapping[str, tuple[SizeRanges, dict[str, ValueRange]]]) -> ProgramRanges:
    """The ranges of ``program``'s values at its call sites."""
    sizes, buffers = ranges.get(program.name, ({}, {}))
    return ProgramRanges(program, sizes, buffers)
