"""The text form of a module: what ``relaxweb inspect`` and ``--dump-ir`` show, and what
``relaxweb/ir/parser.py`` reads back (``parse_module(format_module(m))`` is structurally
equal to ``m``).

The text is Python syntax (in the style of TVMScript)::

    @function(inputs=["x"], outputs=["y"])
    def main(x: Tensor((n, 4), "float32")) -> Tensor((n, 4), "float32"):
        with dataflow():
            r: Tensor((n, 4), "float32") = relu(x)
            y: Tensor((n, 4), "float32") = add(r, const("bias"))
            output(y)
        return y

Everything that structural equality compares is written out:

- every binding is ``name: annotation = value``; a call's own annotation is added as
  ``sinfo=`` only where it differs from its variable's;
- bindings of a dataflow block are dataflow variables except those that ``output(...)``
  names at its end; an empty plain block, or one right after another, is ``with block():``;
- an ``If`` is a declaration ``y: annotation`` followed by ``if c:`` / ``else:`` branches
  that each end with ``y = value``; a ``Loop`` is a declaration followed by
  ``for i, (c0, c1) in loop(count, init=(x0, x1), carried=(annotation0, annotation1)):``
  (``for i in loop(count):`` when it carries nothing), its body ending with ``y = value``;
- op attributes are Python literals (lists and tuples kept apart, floats exact, symbolic
  values as ``sym(n * 2)``); calls of tensor programs name them by string and give the
  program's size variables as ``sizes={"n": batch}``;
- constants are ``const("name")``, their data in a table (:func:`module_constants`, given
  to the parser), or inline ``const("name", [1.0, 2.0], "float32")`` when small;
- names from the model (variables, constants, inputs, programs) are never code: a name
  that is not an identifier is sanitized (variables, whose names carry no meaning) or
  written as a string literal.

Tensor programs are printed by ``tir.format_program``, size expressions by
``symbolic.format_expr``; library kernels by the builder that made them and its arguments;
host functions as their tables, checks and steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .expr import (
    AllocStorage, AllocTensor, BindingBlock, Call, CallLibrary, CallTIR, CallTIRInto, Constant, DataflowBlock,
    DataflowVar, Expr, Function, If, Loop, MatchCast, PrimValue, SeqExpr, ShapeExpr, TensorToPrim, Tuple, TupleGetItem,
    Var, VarBinding,
)
from .functor import ExprFunctor
from .host_functor import HostStepFunctor
from .host import (
    BufferRef, HostBind, HostCache, HostCheck, HostDispatch, HostFunction, HostIf, HostInput, HostLoop, HostOutput,
    HostOutputShape, HostRead, HostSequence, HostSequenceAppend, HostSequenceClear, HostSequenceInput,
    HostSequencePresence, ShapeCheck,
)
from .struct_info import (
    FuncStructInfo, ObjectStructInfo, OptionalStructInfo, PrimStructInfo, SequenceStructInfo, ShapeStructInfo,
    StructInfo, TensorStructInfo, TupleStructInfo,
)
from .symbolic import PrimExpr, format_expr, format_shape
from .syntax import format_float, format_keywords, format_number, format_string, is_plain_name, unique_identifier
from .tir import TensorProgram, format_buffer, format_program

INDENT = "    "

# Call names of the text itself; an op with one of these names is written call_op("name", ...).
GRAPH_BUILTINS = frozenset({
    "alloc_storage", "alloc_tensor", "call_library", "call_op", "call_tir", "call_tir_into", "const",
    "match_cast", "prim", "shape", "tensor_to_prim",
})
# The keyword of a call's own annotation; an op attribute with this name is written **{...}.
SINFO = "sinfo"
# Constants with at most this many elements are written inline, as literals.
INLINE_CONSTANT_ELEMENTS = 8


# -- annotations and literals ------------------------------------------------------------------


def format_struct_info(info: StructInfo) -> str:
    """An annotation: ``Tensor((n, 4), "float32")``, ``Tensor(ndim=2, dtype="float32")``,
    ``Shape((n, 4))``, ``Prim("int64", n)``, ``Tuple(...)``, ``Object``, ``Func((...), ret)``."""
    text = _STRUCT_INFO_TEXT.get(type(info))
    if text is None:
        raise TypeError(f"cannot print the annotation {info!r}")
    return text(info)


def _format_tensor_info(info: TensorStructInfo) -> str:
    if info.shape is not None:
        return f"Tensor({format_shape(info.shape)}, {format_string(info.dtype)})"
    return f"Tensor(ndim={info.ndim}, dtype={format_string(info.dtype)})"


def _format_shape_info(info: ShapeStructInfo) -> str:
    return f"Shape({format_shape(info.values)})" if info.values is not None else f"Shape(ndim={info.ndim})"


def _format_prim_info(info: PrimStructInfo) -> str:
    value = f", {format_expr(info.value)}" if info.value is not None else ""
    return f"Prim({format_string(info.dtype)}{value})"


def _format_sequence_info(info: SequenceStructInfo) -> str:
    length = f", length={format_expr(info.length)}" if info.length is not None else ""
    return f"Sequence({format_struct_info(info.element)}{length})"


def _format_func_info(info: FuncStructInfo) -> str:
    return f"Func({_format_tuple([format_struct_info(p) for p in info.params])}, {format_struct_info(info.ret)})"


# The text of each annotation kind (the parser's ``struct_info`` reads it back).
_STRUCT_INFO_TEXT: dict[type, Callable[..., str]] = {
    TensorStructInfo: _format_tensor_info,
    ShapeStructInfo: _format_shape_info,
    PrimStructInfo: _format_prim_info,
    TupleStructInfo: lambda info: f"Tuple({', '.join(format_struct_info(f) for f in info.fields)})",
    SequenceStructInfo: _format_sequence_info,
    OptionalStructInfo: lambda info: f"Optional({format_struct_info(info.inner)})",
    FuncStructInfo: _format_func_info,
    ObjectStructInfo: lambda info: "Object",
}


def format_literal(value: object) -> str:
    """An attribute value as a Python literal that the parser reads back to an equal value:
    None, bools, ints, floats (exact), strings, lists, tuples, dicts and symbolic values
    (``sym(n * 2)``)."""
    for kinds, text in _LITERALS:
        if isinstance(value, kinds):
            return text(value)
    raise TypeError(f"cannot print a value of type {type(value).__name__} in the IR text: {value!r}")


# The text of each kind of literal, in order (a bool is an int: numbers come first).
_LITERALS: tuple[tuple[type | tuple[type, ...], Callable[..., str]], ...] = (
    (type(None), lambda value: "None"),
    ((bool, int, float), format_number),
    (str, format_string),
    (PrimExpr, lambda value: f"sym({format_expr(value)})"),
    (list, lambda value: "[" + ", ".join(format_literal(v) for v in value) + "]"),
    (tuple, lambda value: _format_tuple([format_literal(v) for v in value])),
    (dict, lambda value: "{" + ", ".join(f"{format_literal(k)}: {format_literal(v)}" for k, v in value.items()) + "}"),
)


def _format_tuple(items: list[str]) -> str:
    """A tuple of the items' texts (with the comma of a one-element tuple)."""
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


def _format_sizes(values: tuple[tuple[str, PrimExpr], ...]) -> str:
    """A call's binding of the program's size variables: ``{"n": batch}``."""
    return "{" + ", ".join(f"{format_string(name)}: {format_expr(value)}" for name, value in values) + "}"


# -- constants ---------------------------------------------------------------------------------


def is_inline_constant(constant: Constant) -> bool:
    """Small constants are written with their values; the others refer to the table."""
    return 0 < constant.data.size <= INLINE_CONSTANT_ELEMENTS and constant.data.dtype.kind in "biuf"


def _format_inline_data(data: np.ndarray) -> str:
    """Nested lists of the values; float32 and float16 values in their shortest exact form."""
    narrow = data.dtype in (np.float32, np.float16)

    def element(value) -> str:
        if isinstance(value, list):
            return "[" + ", ".join(element(v) for v in value) + "]"
        if isinstance(value, float):
            return str(data.dtype.type(value)) if narrow and np.isfinite(value) else format_float(value)
        return repr(value)

    return element(data.tolist())


class ConstantTable:
    """The keys by which the text refers to constants: a constant's name, or ``name#2``,
    ``name#3``... for other constants with the same name (each constant object has its own
    key, so the parser gives back as many objects as there were).  Small constants are
    written inline unless ``inline`` is False."""

    def __init__(self, inline: bool = True) -> None:
        self.inline = inline
        self.constants: dict[str, Constant] = {}
        self._keys: dict[int, str] = {}

    def key(self, constant: Constant) -> str:
        if id(constant) not in self._keys:
            key, counter = constant.name, 1
            while key in self.constants:
                counter += 1
                key = f"{constant.name}#{counter}"
            self.constants[key] = constant
            self._keys[id(constant)] = key
        return self._keys[id(constant)]

    def format(self, constant: Constant) -> str:
        if self.inline and is_inline_constant(constant):
            data = constant.data
            return f"const({format_string(constant.name)}, {_format_inline_data(data)}, {format_string(str(data.dtype))})"
        return f"const({format_string(self.key(constant))})"


# -- graph functions ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _CallText:
    """A call-like expression before it is written out: the binding it belongs to decides
    whether its own annotation must be added (``sinfo=``, where it differs from the
    variable's)."""

    callee: str
    arguments: list[str]
    struct_info: StructInfo


class _FunctionPrinter(ExprFunctor):
    """Prints one function: names each variable once (unique in the function, so the parser
    can resolve every use) and refers to constants through the module's table.

    The statements (blocks, bindings, ``If``) are appended to ``lines``; an expression's
    visit returns its text, or a :class:`_CallText` that :meth:`value` finishes."""

    def __init__(self, constants: ConstantTable) -> None:
        self.constants = constants
        self.names: dict[int, str] = {}
        self.taken: set[str] = set()
        self.lines: list[str] = []
        self.indent = INDENT

    def name(self, var: Var) -> str:
        if id(var) not in self.names:
            self.names[id(var)] = unique_identifier(var.name, self.taken)
            self.taken.add(self.names[id(var)])
        return self.names[id(var)]

    # -- statements ---------------------------------------------------------------------------

    def visit_function(self, function: Function) -> str:
        params = ", ".join(f"{self.name(p)}: {format_struct_info(p.struct_info)}" for p in function.params)
        decorator = "@function" + format_keywords(
            ("name", format_string(function.name)) if not is_plain_name(function.name) else None,
            ("inputs", format_literal(list(function.input_names))) if function.input_names else None,
            ("outputs", format_literal(list(function.output_names))) if function.output_names else None,
        )
        self.lines = [decorator, f"def {unique_identifier(function.name, set())}({params}) -> "
                                 f"{format_struct_info(function.ret_struct_info)}:"]
        self.blocks(function.body)
        self.lines.append(f"{self.indent}return {self.value(function.body.body)}")
        return "\n".join(self.lines)

    def blocks(self, seq: SeqExpr) -> None:
        previous_plain = False
        for block in seq.blocks:
            nested = isinstance(block, DataflowBlock) or previous_plain or not block.bindings
            if nested:
                self.lines.append(f"{self.indent}with {'dataflow' if isinstance(block, DataflowBlock) else 'block'}():")
                self.indent += INDENT
            self.visit_block(block)
            if nested:
                self.indent = self.indent[: -len(INDENT)]
            previous_plain = not isinstance(block, DataflowBlock)

    def visit_binding_block(self, block: BindingBlock) -> None:
        if not block.bindings:
            self.lines.append(f"{self.indent}pass")
        for binding in block.bindings:
            self.visit_binding(binding)

    def visit_dataflow_block(self, block: DataflowBlock) -> None:
        self.visit_binding_block(block)
        outputs = [self.name(b.var) for b in block.bindings if not isinstance(b.var, DataflowVar)]
        if outputs:
            self.lines.append(f"{self.indent}output({', '.join(outputs)})")

    def _head(self, var: Var) -> str:
        return f"{self.indent}{self.name(var)}: {format_struct_info(var.struct_info)}"

    def visit_var_binding(self, binding: VarBinding) -> None:
        var, value = binding.var, binding.value
        if isinstance(value, Loop):
            self.loop(var, value)
            return
        if not isinstance(value, If):
            self.lines.append(f"{self._head(var)} = {self.value(value, var.struct_info)}")
            return
        self.lines.append(self._head(var))
        self.lines.append(f"{self.indent}if {self.value(value.condition)}:")
        self.branch(value.true_branch, var)
        self.lines.append(f"{self.indent}else:")
        self.branch(value.false_branch, var)

    def visit_match_cast(self, binding: MatchCast) -> None:
        reason = f", reason={format_string(binding.reason)}" if binding.reason else ""
        self.lines.append(f"{self._head(binding.var)} = "
                          f"match_cast({self.value(binding.value)}, {format_struct_info(binding.struct_info)}{reason})")

    def loop(self, var: Var, node: Loop) -> None:
        self.lines.append(self._head(var))
        iteration = format_expr(node.iteration)
        if not is_plain_name(iteration):
            raise ValueError(f"a loop's iteration variable must be an identifier, got {iteration!r}")
        target, arguments = iteration, [format_expr(node.count)]
        if node.carried:
            target += f", {_format_tuple([self.name(c) for c in node.carried])}"
            arguments.append(f"init={_format_tuple([self.value(v) for v in node.init])}")
            arguments.append(f"carried={_format_tuple([format_struct_info(c.struct_info) for c in node.carried])}")
        self.lines.append(f"{self.indent}for {target} in loop({', '.join(arguments)}):")
        self.branch(node.body, var)

    def branch(self, seq: SeqExpr, var: Var) -> None:
        self.indent += INDENT
        self.blocks(seq)
        self.lines.append(f"{self.indent}{self.name(var)} = {self.value(seq.body)}")
        self.indent = self.indent[: -len(INDENT)]

    # -- expressions --------------------------------------------------------------------------

    def value(self, expr: Expr, declared: StructInfo | None = None) -> str:
        """One expression; ``declared`` is the annotation of the variable it is bound to,
        which a call's own annotation is written against (``sinfo=`` when it differs)."""
        text = self.visit_expr(expr)
        if not isinstance(text, _CallText):
            return text
        arguments = list(text.arguments)
        if text.struct_info != declared:
            arguments.append(f"{SINFO}={format_struct_info(text.struct_info)}")
        return f"{text.callee}({', '.join(arguments)})"

    def visit_var(self, var: Var) -> str:
        return self.name(var)

    def visit_constant(self, constant: Constant) -> str:
        return self.constants.format(constant)

    def visit_prim_value(self, value: PrimValue) -> str:
        return f"prim({format_expr(value.value)})"

    def visit_shape_expr(self, shape: ShapeExpr) -> str:
        return f"shape({format_shape(shape.values)})"

    def visit_tuple(self, value: Tuple) -> str:
        return _format_tuple([self.value(f) for f in value.fields])

    def visit_tuple_get_item(self, item: TupleGetItem) -> str:
        return f"{self.value(item.tuple_value)}[{item.index}]"

    def visit_if(self, node: If) -> str:
        raise TypeError("an If is printed as a binding (format_function)")

    def visit_loop(self, node: Loop) -> str:
        raise TypeError("a Loop is printed as a binding (format_function)")

    def visit_call(self, call: Call) -> _CallText:
        plain = is_plain_name(call.op) and call.op not in GRAPH_BUILTINS
        arguments = ([] if plain else [format_string(call.op)]) + [self.value(a) for a in call.args]
        for key, value in call.attrs.items():
            if is_plain_name(key) and key != SINFO:
                arguments.append(f"{key}={format_literal(value)}")
            else:
                arguments.append(f"**{{{format_string(key)}: {format_literal(value)}}}")
        return _CallText(call.op if plain else "call_op", arguments, call.struct_info)

    def _program_arguments(self, call: CallTIR | CallTIRInto) -> list[str]:
        arguments = [format_string(call.program), _format_tuple([self.value(a) for a in call.args])]
        if isinstance(call, CallTIRInto):
            arguments.append(f"out={self.value(call.output)}")
        if call.size_var_values:
            arguments.append(f"sizes={_format_sizes(call.size_var_values)}")
        return arguments

    def visit_call_tir(self, call: CallTIR) -> _CallText:
        return _CallText("call_tir", self._program_arguments(call), call.struct_info)

    def visit_call_library(self, call: CallLibrary) -> _CallText:
        return _CallText("call_library", self._program_arguments(call), call.struct_info)

    def visit_call_tir_into(self, call: CallTIRInto) -> _CallText:
        return _CallText("call_tir_into", self._program_arguments(call), call.struct_info)

    def visit_alloc_storage(self, alloc: AllocStorage) -> _CallText:
        return _CallText("alloc_storage", [format_expr(alloc.size)], alloc.struct_info)

    def visit_alloc_tensor(self, alloc: AllocTensor) -> _CallText:
        return _CallText("alloc_tensor", [self.value(alloc.storage)], alloc.struct_info)

    def visit_tensor_to_prim(self, value: TensorToPrim) -> _CallText:
        return _CallText("tensor_to_prim", [self.value(value.tensor)], value.struct_info)


def format_value(expr: Expr) -> str:
    """One expression as text, for messages: variables and constants by name only, and
    without the expression's own annotation."""
    return _FunctionPrinter(ConstantTable(inline=False)).value(expr, expr.struct_info)


def format_function(function: Function, constants: ConstantTable | None = None) -> str:
    """A graph function as text; ``constants`` is the module's table (a new one by default)."""
    return _FunctionPrinter(constants or ConstantTable()).visit_function(function)


# -- library kernels ---------------------------------------------------------------------------


def format_library_kernel(kernel) -> str:
    """A library kernel by the builder that made it (``relaxweb/ir/kernel_builders.py``) and
    its arguments, and the targets its code exists for; the signature shows its buffers (the
    parser checks them and the targets against the rebuilt kernel).  Its code is rendered
    by the backends from the builder and its arguments."""
    identifiers: set[str] = set()
    params = []
    for buffer in (*kernel.inputs, kernel.output):
        identifier = unique_identifier(buffer.name, identifiers)
        identifiers.add(identifier)
        params.append(f"{identifier}: {format_buffer(buffer, real_name=identifier != buffer.name)}")
    decorator = "@library_kernel" + format_keywords(
        ("builder", format_string(kernel.builder)),
        ("args", format_literal(dict(kernel.builder_args))),
        ("targets", format_literal(kernel.targets)),
        ("name", format_string(kernel.name)) if not is_plain_name(kernel.name) else None,
    )
    return f"{decorator}\ndef {unique_identifier(kernel.name, set())}({', '.join(params)}): ..."


# -- host functions ----------------------------------------------------------------------------


def format_host_function(function: HostFunction, constants: ConstantTable | None = None) -> str:
    """A host function: its tables (inputs, outputs, size variables, bounds, weights,
    storages, and KV caches and sequences when it has any), the input checks in order, then the
    steps, e.g.::

        check_input("ndim", input=0, expected=2, code=1, message="...")
        check_input("bind", input=0, dim=0, variable="n")
        dispatch("add", (storage(0), weight(0), storage(1)), sizes={"n": n}, count=n * 4, note="...")
    """
    constants = constants or ConstantTable()
    decorator = "@host_function" + format_keywords(
        ("name", format_string(function.name)) if not is_plain_name(function.name) else None,
        ("read_slots", str(function.read_slots)) if function.read_slots else None,
    )
    inputs = [_format_host_input(i) for i in function.inputs]
    outputs = [_format_host_output(o) for o in function.outputs]
    storages = [f"host_storage({format_expr(s.size)}, {format_string(s.role)})" for s in function.storages]
    lines = [decorator, f"def {unique_identifier(function.name, set())}():"]
    lines += _format_table("inputs", inputs)
    lines += _format_table("outputs", outputs)
    lines += _format_table("symbolic_vars", [format_string(v) for v in function.symbolic_vars])
    lines += _format_table("bounds", [format_literal(b) for b in function.bounds])
    lines += _format_table("weights", [constants.format(w) for w in function.weights])
    lines += _format_table("storages", storages)
    if function.caches:
        lines += _format_table("caches", [_format_host_cache(c) for c in function.caches])
    if function.sequences:
        lines += _format_table("sequences", [_format_host_sequence(s) for s in function.sequences])
    lines += [f"{INDENT}{_format_shape_check(check)}" for check in function.checks]
    _format_steps(function.steps, INDENT, lines)
    return "\n".join(lines)


def _format_table(name: str, entries: list[str]) -> list[str]:
    """``name = [a, b]`` on one line, or one entry per line when that line would be long."""
    line = f"{INDENT}{name} = [{', '.join(entries)}]"
    if len(line) <= 100:
        return [line]
    return [f"{INDENT}{name} = ["] + [f"{INDENT * 2}{entry}," for entry in entries] + [f"{INDENT}]"]


def _format_host_input(value: HostInput) -> str:
    return (f"host_input({format_string(value.name)}, {format_string(value.dtype)}, {format_shape(value.shape)}, "
            f"storage={value.storage}{_sequence_fields(value)})")


def _format_host_output(output: HostOutput) -> str:
    shape = format_shape(output.shape) if output.shape is not None else "None"
    ndim = "" if output.shape is not None and output.ndim == len(output.shape) else f", ndim={output.ndim}"
    return (f"host_output({format_string(output.name)}, {format_string(output.dtype)}, {shape}, "
            f"storage={output.storage}{ndim}{_sequence_fields(output)})")


def _sequence_fields(value: HostInput | HostOutput) -> str:
    """``, sequence=K`` (and ``, optional=True``) for a sequence input or output, else nothing."""
    if value.sequence is None:
        return ""
    return f", sequence={value.sequence}" + (", optional=True" if value.optional else "")


def _format_host_sequence(sequence: HostSequence) -> str:
    return (f"host_sequence(storage={sequence.storage}, size_var={format_string(sequence.size_var)}, "
            f"dtype={format_string(sequence.dtype)}, ndim={sequence.ndim}, element_bytes={sequence.element_bytes})")


def _format_host_cache(cache: HostCache) -> str:
    return (f"host_cache(input={cache.input}, output={cache.output}, axis={cache.axis}, capacity={cache.capacity}, "
            f"storage={cache.storage})")


def _check_fields(check: ShapeCheck | HostCheck) -> list[str]:
    """The fields of a check other than its kind and value, those that are not their default."""
    fields = []
    if isinstance(check, ShapeCheck):
        fields.append(f"input={check.input}")
        if check.dim != -1:
            fields.append(f"dim={check.dim}")
    if check.expected is not None:
        expected = check.expected
        fields.append(f"expected={repr(expected) if isinstance(expected, int) else format_expr(expected)}")
    if check.variable is not None:
        fields.append(f"variable={format_string(check.variable)}")
    if check.code:
        fields.append(f"code={check.code}")
    if check.message:
        fields.append(f"message={format_string(check.message)}")
    return fields


def _format_shape_check(check: ShapeCheck) -> str:
    return f"check_input({', '.join([format_string(check.kind), *_check_fields(check)])})"


def _format_buffer_ref(ref: BufferRef) -> str:
    return f"{ref.kind}({ref.index})"


def _format_steps(steps: tuple, indent: str, lines: list[str]) -> None:
    """The steps' lines at ``indent`` (``pass`` for none), appended to ``lines``."""
    if not steps:
        lines.append(f"{indent}pass")
    for step in steps:
        lines += _STEP_PRINTER.visit(step, indent)


class _StepPrinter(HostStepFunctor):
    """The lines of each step kind, as the parser reads them back (``Parser.host_steps``)."""

    def visit_dispatch(self, step: HostDispatch, indent: str) -> list[str]:
        buffers = _format_tuple([_format_buffer_ref(b) for b in step.buffers])
        return [f"{indent}dispatch({format_string(step.program)}, {buffers}, sizes={_format_sizes(step.size_var_values)}, "
                f"count={format_expr(step.element_count)}, note={format_string(step.note)})"]

    def visit_bind(self, step: HostBind, indent: str) -> list[str]:
        return [f"{indent}bind({format_string(step.variable)}, {format_expr(step.value)}, note={format_string(step.note)})"]

    def visit_check(self, step: HostCheck, indent: str) -> list[str]:
        arguments = [format_string(step.kind), format_expr(step.value), *_check_fields(step)]
        return [f"{indent}check({', '.join(arguments)})"]

    def visit_if(self, step: HostIf, indent: str) -> list[str]:
        lines = [f"{indent}if {format_expr(step.condition)}:"]
        _format_steps(step.then_steps, indent + INDENT, lines)
        lines.append(f"{indent}else:")
        _format_steps(step.else_steps, indent + INDENT, lines)
        return lines

    def visit_loop(self, step: HostLoop, indent: str) -> list[str]:
        if not is_plain_name(step.variable):
            raise ValueError(f"a host loop's variable must be an identifier, got {step.variable!r}")
        lines = [f"{indent}for {step.variable} in loop({format_expr(step.count)}, note={format_string(step.note)}):"]
        _format_steps(step.steps, indent + INDENT, lines)
        return lines

    def visit_read(self, step: HostRead, indent: str) -> list[str]:
        return [f"{indent}read({format_string(step.variable)}, storage={step.storage}, offset={step.byte_offset}, "
                f"slot={step.slot}, note={format_string(step.note)})"]

    def visit_output_shape(self, step: HostOutputShape, indent: str) -> list[str]:
        return [f"{indent}output_shape({step.output}, {format_shape(step.shape)})"]

    def visit_sequence_input(self, step: HostSequenceInput, indent: str) -> list[str]:
        optional = ", optional=True" if step.optional else ""
        return [f"{indent}sequence_input({step.sequence}, {format_string(step.input)}{optional}, "
                f"ndim_code={step.ndim_code}, ndim_message={format_string(step.ndim_message)}, "
                f"capacity_code={step.capacity_code}, capacity_message={format_string(step.capacity_message)})"]

    def visit_sequence_presence(self, step: HostSequencePresence, indent: str) -> list[str]:
        return [f"{indent}sequence_presence({step.sequence}, {format_string(step.variable)})"]

    def visit_sequence_clear(self, step: HostSequenceClear, indent: str) -> list[str]:
        return [f"{indent}sequence_clear({step.sequence})"]

    def visit_sequence_append(self, step: HostSequenceAppend, indent: str) -> list[str]:
        return [f"{indent}sequence_append({step.sequence}, {format_shape(step.shape)}, code={step.code}, "
                f"message={format_string(step.message)})"]

    def visit_default(self, step, indent: str) -> list[str]:
        raise TypeError(f"cannot print the host step {step!r}")


_STEP_PRINTER = _StepPrinter()


# -- modules -----------------------------------------------------------------------------------


def _print_module(module) -> tuple[str, ConstantTable]:
    constants = ConstantTable()
    parts = [f"attrs = {format_literal(module.attrs)}"] if module.attrs else []
    for program in module.programs.values():
        parts.append(format_program(program) if isinstance(program, TensorProgram) else format_library_kernel(program))
    for function in module.functions.values():
        if isinstance(function, HostFunction):
            parts.append(format_host_function(function, constants))
        else:
            parts.append(format_function(function, constants))
    return "\n\n".join(parts) + "\n", constants


def format_module(module) -> str:
    """The module as text: its attributes, programs, library kernels and functions."""
    return _print_module(module)[0]


def module_constants(module) -> dict[str, Constant]:
    """The constants the text of ``module`` refers to by key (``const("key")``), for
    ``parse_module(format_module(module), constants=module_constants(module))``."""
    return _print_module(module)[1].constants


__all__ = [
    "ConstantTable", "format_function", "format_host_function", "format_library_kernel", "format_literal",
    "format_module", "format_struct_info", "format_value", "module_constants",
]
