"""legalize_ops: rewrite every high-level op call into calls of tensor programs.

Each op's legalization (registered with the op, in ``relaxweb/ops/``) builds one or more
tensor programs in compute-definition form; this pass adds them to the module and replaces
the ``Call`` with a ``CallTIR``.  Programs that are identical up to their name are added once
and shared by every call site.  After this pass nothing in ``main`` needs op semantics: it
is all tensor programs, which the WGSL backend compiles.
"""

from __future__ import annotations

from ..errors import UnsupportedModelError
from ..ir.builder import FunctionBuilder
from ..ir.error_sites import ErrorSite, with_error_site
from ..ir.expr import Call, CallLibrary, CallTIR, DataflowVar, Expr, Function, MatchCast, Tuple, Var, VarBinding
from ..ir.functor import ExprMutator, post_order_visit
from ..ir.module import IRModule, ProgramTable
from ..ir.struct_info import OptionalStructInfo, SequenceStructInfo, TensorStructInfo
from ..ir.tir import TensorProgram
from ..ir.analyzer import Analyzer
from ..ir.value_ranges import OVERFLOW_MESSAGE, TensorRanges, with_integer_checks
from ..ops import get_op
from ..ir.op_registry import call_tir_of, node_of, node_text
from .context import PassContext


class _Legalizer(ExprMutator):
    """Replaces each op call by its legalization; the LegalizeContext given to each op's
    legalization (what it emits goes before the binding of the call)."""

    def __init__(self, module: IRModule, function: Function) -> None:
        super().__init__()
        self.table = ProgramTable(module.programs)
        self.programs = self.table.programs
        self.names = FunctionBuilder.avoiding_names_of(function)
        self.source = ""  # where the call being legalized comes from (its ``source``), for its checks
        self.attrs = dict(module.attrs)  # with the error sites added (relaxweb/ir/error_sites.py)
        self.legalizing: Call | None = None  # the call whose legalization runs
        self.overflow_sites: dict[int, int] = {}  # id of a call -> its int64 overflow site
        self.ranges = TensorRanges(Analyzer.from_bounds(PassContext.current().bounds))  # of the tensors so far

    def add_program(self, program) -> str:
        """Add a tensor program or library kernel, reusing an identical one's name."""
        return self.table.add(program)

    def call_tir(self, program: TensorProgram, args: tuple[Expr, ...]) -> CallTIR:
        """Call ``program``, its int64 arithmetic that may leave int32 checked at run time
        (``relaxweb/ir/value_ranges.with_integer_checks``: given the ranges of the sizes and
        of the tensors computed so far), naming the node being legalized."""
        output = TensorStructInfo(program.output.shape, program.output.dtype)
        sizes, buffers = self.ranges.at_call(call_tir_of(program, args, output), program)
        program = with_integer_checks(program, self.overflow_site, sizes, buffers)
        name = self.add_program(program)
        return call_tir_of(self.programs[name], args, output)

    def emit_binding(self, binding) -> None:
        super().emit_binding(binding)
        if isinstance(binding, (VarBinding, MatchCast)):
            self.ranges.note(binding, self.programs)

    def call_library(self, kernel, args: tuple[Expr, ...]) -> CallLibrary:
        name = self.add_program(kernel)
        output = TensorStructInfo(kernel.output.shape, kernel.output.dtype)
        call = call_tir_of(self.programs[name], args, output)
        return CallLibrary(call.program, call.args, call.struct_info, call.size_var_values)

    def error_site(self, call: Call, message: str) -> int:
        """A new site of the module's error sites for a check of ``call``'s data: the node it
        comes from, and ``message`` (its values as ``{0}``, ``{1}`` ...); returns its number."""
        node, op = node_of(call)
        self.attrs, site = with_error_site(self.attrs, ErrorSite(node, op, message))
        return site

    def overflow_site(self) -> int:
        """The error site of an int64 result that does not fit int32, for the call being
        legalized (one per call)."""
        call = self.legalizing
        if id(call) not in self.overflow_sites:
            self.overflow_sites[id(call)] = self.error_site(call, OVERFLOW_MESSAGE)
        return self.overflow_sites[id(call)]

    def fresh_name(self, hint: str) -> str:
        """A name no variable of the function uses (for new symbolic variables)."""
        return self.names.unique_name(hint)

    def _new_var(self, name_hint: str, struct_info) -> Var:
        kind = DataflowVar if self.in_dataflow_block else Var
        return kind(self.names.unique_name(name_hint), struct_info)

    def emit_match_cast(self, value: Expr, struct_info, name_hint: str = "lv", reason: str = "") -> Var:
        var = self._new_var(name_hint, struct_info)
        self.emit_binding(MatchCast(var, value, struct_info, reason))
        return var

    def emit(self, value: Expr, name_hint: str = "lv") -> Var:
        var = self._new_var(name_hint, value.struct_info)
        self.emit_binding(VarBinding(var, value))
        return var

    def visit_call(self, call: Call) -> Expr:
        self.source = node_text(call.attrs)
        self.legalizing = call
        return get_op(call.op).legalize(self, call)


def legalize_ops(module: IRModule) -> IRModule:
    """Replace every op call in every graph function by tensor program calls."""
    _refuse_containers(module)
    missing = sorted({call.op for call in _op_calls(module) if get_op(call.op).legalize is None})
    if missing:
        raise UnsupportedModelError(
            f"no GPU lowering yet for {len(missing)} op(s): {', '.join(missing)} "
            "(the model imports and runs with 'relaxweb run MODEL.onnx --reference')"
        )
    functions = {}
    programs, attrs = dict(module.programs), dict(module.attrs)
    for name, function in module.functions.items():
        if not isinstance(function, Function):
            functions[name] = function
            continue
        legalizer = _Legalizer(module.replace(programs=programs, attrs=attrs), function)
        functions[name] = legalizer.visit_function(function)
        programs, attrs = legalizer.programs, legalizer.attrs
    return module.replace(functions=functions, programs=programs, attrs=attrs)


def _refuse_containers(module: IRModule) -> None:
    """Optional tensor inputs and outputs have no place in a bundle yet (sequences and
    optional sequences do): one error naming them."""
    named = []
    for function in module.functions.values():
        if not isinstance(function, Function):
            continue
        results = function.body.body.fields if isinstance(function.body.body, Tuple) else (function.body.body,)
        inputs = zip(function.input_names or [p.name for p in function.params], function.params)
        outputs = zip(function.output_names or [f"#{i}" for i in range(len(results))], results)
        for kind, values in (("input", inputs), ("output", outputs)):
            named += [f"{kind} '{name}' ({value.struct_info})" for name, value in values
                      if isinstance(value.struct_info, OptionalStructInfo)
                      and not isinstance(value.struct_info.inner, SequenceStructInfo)]
    if named:
        raise UnsupportedModelError(
            f"no GPU lowering yet for optional tensors: {', '.join(named)} "
            "(the model imports and runs with 'relaxweb run MODEL.onnx --reference')")


def _op_calls(module: IRModule) -> list[Call]:
    calls: list[Call] = []

    def note_call(expr: Expr) -> None:
        if isinstance(expr, Call):
            calls.append(expr)

    for function in module.functions.values():
        if isinstance(function, Function):
            post_order_visit(function, note_call)
    return calls
