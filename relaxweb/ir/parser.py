"""Reading the IR text back: ``parse_module(format_module(m), module_constants(m))`` is
structurally equal to ``m``.

The text is Python syntax (see ``printer.py`` for the form), so it is read with Python's
``ast`` module and then interpreted node by node here; nothing in it is ever evaluated as
Python.  Names are resolved the way the printer writes them: variables by their identifier
(the latest definition in the function), programs and constants by quoted strings, size
variables by identifier or ``size_var["name"]``.  Malformed text raises :class:`ParseError`
with its line and column.

Op calls are not deduced again (the IR layer does not know the ops): a call's annotation
is its variable's, or its ``sinfo=``.  Constants come from the table given to
:func:`parse_module` (names to arrays or :class:`~relaxweb.ir.expr.Constant`), or inline.
Library kernels are rebuilt by their registered builders (``kernel_builders.py``).
"""

from __future__ import annotations

import ast
import dataclasses
from typing import Any, Callable, Mapping

import numpy as np

from .dtype import DTYPES
from .expr import (
    AllocStorage, AllocTensor, BindingBlock, Call, CallLibrary, CallTIR, CallTIRInto, Constant, DataflowBlock,
    DataflowVar, Expr, Function, If, Loop, MatchCast, PrimValue, SeqExpr, ShapeExpr, TensorToPrim, Tuple, TupleGetItem,
    Var, VarBinding,
)
from .host_parser import HostFunctionReader
from .kernel_builders import build_library_kernel
from .module import IRModule
from .printer import GRAPH_BUILTINS, SINFO
from .schedule import Schedule
from .struct_info import (
    FuncStructInfo, ObjectStructInfo, OptionalStructInfo, PrimStructInfo, SequenceStructInfo, ShapeStructInfo,
    StructInfo, TensorStructInfo, TupleStructInfo, struct_info_equal,
)
from .symbolic import SizeVar
from .target_schedules import TARGET_KINDS, TARGET_SCHEDULE_KINDS, TargetSchedules
from .integer_checks import CheckedDivisor, CheckedInteger
from .text_reader import (
    ParseError, call_name, is_number_node, is_quoted_size_var, is_scalar_node, name_of_node, subscript_items,
)
from .tir import (
    Binary, BinaryOp, Buffer, Cast, CheckedIndex, Compare, CompareOp, FloatImm, Gather, IndexValue, Load, Reduce,
    ReduceCombiner, ScalarExpr, Select, TensorProgram, Unary, UnaryOp,
)


# The operators tir.format_scalar writes with symbols (BINARY_SYMBOLS, COMPARE_OPS).
_SCALAR_OPERATORS = {ast.Add: BinaryOp.ADD, ast.Sub: BinaryOp.SUBTRACT, ast.Mult: BinaryOp.MULTIPLY,
                     ast.Div: BinaryOp.DIVIDE}
_COMPARE_OPERATORS = {ast.Lt: CompareOp.LT, ast.LtE: CompareOp.LE, ast.Gt: CompareOp.GT, ast.GtE: CompareOp.GE,
                      ast.Eq: CompareOp.EQ, ast.NotEq: CompareOp.NE}
# The names the other scalar ops print as (each member of these enums is its name).
_BINARY_NAMES, _UNARY_NAMES = frozenset(BinaryOp), frozenset(UnaryOp)
_COMBINER_NAMES = frozenset(ReduceCombiner)


def parse_module(text: str, constants: Mapping[str, Constant | np.ndarray] | None = None) -> IRModule:
    """The module that ``text`` (as ``format_module`` prints it) describes.

    ``constants`` maps the keys of ``const("key")`` to arrays or constants
    (``printer.module_constants`` gives a module's).
    """
    try:
        tree = ast.parse(text)
    except SyntaxError as error:
        lines = text.splitlines()
        line = error.lineno or 1
        source = lines[line - 1] if 0 < line <= len(lines) else ""
        raise ParseError(f"not valid IR text: {error.msg}", line, (error.offset or 1) - 1, source) from None
    return _Parser(text, constants or {}).module(tree)


class _Parser(HostFunctionReader):
    """The whole text: the module, graph functions, tensor programs and library kernels (host
    functions: ``HostFunctionReader``)."""

    def module(self, tree: ast.Module) -> IRModule:
        functions: dict[str, Any] = {}
        programs: dict[str, Any] = {}
        attrs: dict[str, Any] = {}
        kinds: dict[str, Callable[[ast.FunctionDef, dict[str, ast.expr]], Any]] = {
            "function": self.graph_function, "host_function": self.host_function,
            "tensor_program": self.tensor_program, "library_kernel": self.library_kernel,
        }
        for statement in tree.body:
            if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                    and isinstance(statement.targets[0], ast.Name) and statement.targets[0].id == "attrs"):
                attrs = self.literal(statement.value)
                if not isinstance(attrs, dict):
                    raise self.error(statement.value, "the module's attrs must be a dict")
                continue
            if not isinstance(statement, ast.FunctionDef):
                raise self.error(statement, "expected a decorated def (@function, @tensor_program, "
                                            "@library_kernel, @host_function) or attrs = {...}")
            kind, keywords = self.decorator(statement, set(kinds))
            item = kinds[kind](statement, keywords)
            table = programs if kind in ("tensor_program", "library_kernel") else functions
            if item.name in table:
                raise self.error(statement, f"{kind} {item.name!r} is defined twice")
            table[item.name] = item
        return IRModule(functions, programs, attrs)

    def struct_info(self, node: ast.expr) -> StructInfo:
        if isinstance(node, ast.Name) and node.id == "Object":
            return ObjectStructInfo()
        name = call_name(node)
        if name == "Tensor":
            args = self.arguments(node, ["shape", "dtype"], ("ndim",), required=("dtype",))  # type: ignore[arg-type]
            shape = self.optional_shape(args.get("shape"))
            ndim = self.integer(args["ndim"]) if "ndim" in args else -1
            if shape is not None and "ndim" in args and ndim != len(shape):
                raise self.error(node, f"Tensor(): ndim={ndim} but the shape has {len(shape)} dims")
            return TensorStructInfo(shape, self.string(args["dtype"]), ndim)
        if name == "Shape":
            args = self.arguments(node, ["values"], ("ndim",))  # type: ignore[arg-type]
            values = self.optional_shape(args.get("values"))
            return ShapeStructInfo(values, self.integer(args["ndim"]) if "ndim" in args else -1)
        if name == "Prim":
            args = self.arguments(node, ["dtype", "value"], required=("dtype",))  # type: ignore[arg-type]
            value = self.prim_expr(args["value"]) if "value" in args else None
            return PrimStructInfo(self.string(args["dtype"]), value)
        if name == "Tuple" and not node.keywords:  # type: ignore[union-attr]
            return TupleStructInfo(tuple(self.struct_info(f) for f in node.args))  # type: ignore[union-attr]
        if name == "Sequence":
            args = self.arguments(node, ["element"], ("length",), required=("element",))  # type: ignore[arg-type]
            element = self.struct_info(args["element"])
            if not isinstance(element, TensorStructInfo):
                raise self.error(node, "Sequence(): its elements are tensors")
            length = self.prim_expr(args["length"]) if "length" in args else None
            return SequenceStructInfo(element, length)
        if name == "Optional":
            args = self.arguments(node, ["inner"], required=("inner",))  # type: ignore[arg-type]
            return OptionalStructInfo(self.struct_info(args["inner"]))
        if name == "Func":
            args = self.arguments(node, ["params", "ret"], required=("params", "ret"))  # type: ignore[arg-type]
            if not isinstance(args["params"], (ast.Tuple, ast.List)):
                raise self.error(args["params"], "expected a tuple of parameter annotations")
            params = tuple(self.struct_info(p) for p in args["params"].elts)
            return FuncStructInfo(params, self.struct_info(args["ret"]))
        raise self.error(node, "expected an annotation: Tensor(...), Shape(...), Prim(...), Tuple(...), Sequence(...), "
                                "Optional(...), Func(...) or Object")

    def graph_function(self, definition: ast.FunctionDef, keywords: dict[str, ast.expr]) -> Function:
        self.check_keywords(keywords, {"name", "inputs", "outputs"}, "function")
        self.scope = {}
        arguments = definition.args
        if arguments.vararg or arguments.kwarg or arguments.kwonlyargs or arguments.posonlyargs or arguments.defaults:
            raise self.error(definition, "a function's parameters are plain 'name: annotation'")
        params = []
        for arg in arguments.args:
            if arg.annotation is None:
                raise self.error(arg, f"parameter '{arg.arg}' needs an annotation")
            params.append(self.define(Var, arg.arg, self.struct_info(arg.annotation)))
        *statements, last = definition.body
        if not isinstance(last, ast.Return) or last.value is None:
            raise self.error(last, "a function ends with 'return value'")
        body = SeqExpr(self.blocks(statements), self.value(last.value))
        if definition.returns is not None:
            declared = self.struct_info(definition.returns)
            if not struct_info_equal(declared, body.body.struct_info):
                raise self.error(definition.returns, "the function's return annotation differs from its result's")
        names = {key: tuple(self.string_list(keywords[key])) for key in ("inputs", "outputs") if key in keywords}
        return Function(self.definition_name(definition, keywords), tuple(params), body,
                        names.get("inputs", ()), names.get("outputs", ()))

    def string_list(self, node: ast.expr) -> list[str]:
        if not isinstance(node, (ast.List, ast.Tuple)):
            raise self.error(node, "expected a list of strings")
        return [self.string(e) for e in node.elts]

    def define(self, kind: type, name: str, info: StructInfo) -> Var:
        var = kind(name, info)
        self.scope[name] = var
        return var

    def blocks(self, statements: list[ast.stmt]) -> tuple[BindingBlock, ...]:
        """Binding blocks: ``with dataflow():`` and ``with block():`` are one block each,
        and each run of bindings between them is a plain block."""
        blocks: list[BindingBlock] = []
        plain: list = []
        index = 0
        while index < len(statements):
            statement = statements[index]
            if isinstance(statement, ast.With):
                if plain:
                    blocks.append(BindingBlock(tuple(plain)))
                    plain = []
                blocks.append(self.with_block(statement))
            else:
                binding, index = self.binding(statements, index, dataflow_outputs=None)
                plain.append(binding)
            index += 1
        if plain:
            blocks.append(BindingBlock(tuple(plain)))
        return tuple(blocks)

    def with_block(self, statement: ast.With) -> BindingBlock:
        item = statement.items[0] if len(statement.items) == 1 else None
        kind = call_name(item.context_expr) if item and isinstance(item.context_expr, ast.Call) else None
        if kind not in ("dataflow", "block") or item.optional_vars or item.context_expr.args or item.context_expr.keywords:  # type: ignore[union-attr]
            raise self.error(statement, "expected 'with dataflow():' or 'with block():'")
        statements = list(statement.body)
        outputs: set[str] | None = None
        if kind == "dataflow":
            outputs = set()
            last = statements[-1]
            if isinstance(last, ast.Expr) and call_name(last.value) == "output":
                outputs = {self.name_of(a) for a in last.value.args}  # type: ignore[attr-defined]
                statements.pop()
        bindings = []
        index = 0
        if len(statements) == 1 and isinstance(statements[0], ast.Pass):
            statements = []
        while index < len(statements):
            binding, index = self.binding(statements, index, outputs)
            bindings.append(binding)
            index += 1
        return (DataflowBlock if kind == "dataflow" else BindingBlock)(tuple(bindings))

    def name_of(self, node: ast.expr) -> str:
        if not isinstance(node, ast.Name):
            raise self.error(node, "expected a variable name")
        return node.id

    def binding(self, statements: list[ast.stmt], index: int, dataflow_outputs: set[str] | None):
        """The binding at ``statements[index]`` (an If or a Loop takes two statements); returns
        it and the index of its last statement.  In a dataflow block (``dataflow_outputs`` given)
        a variable is a dataflow variable unless ``output(...)`` names it."""
        statement = statements[index]
        if not isinstance(statement, ast.AnnAssign) or not isinstance(statement.target, ast.Name):
            raise self.error(statement, "expected a binding 'name: annotation = value'")
        name = statement.target.id
        info = self.struct_info(statement.annotation)
        kind = DataflowVar if dataflow_outputs is not None and name not in dataflow_outputs else Var
        if statement.value is None:
            following = statements[index + 1] if index + 1 < len(statements) else None
            if not isinstance(following, (ast.If, ast.For)):
                raise self.error(statement, f"'{name}: annotation' without a value must be followed by 'if' or 'for'")
            value = self.if_value(following, name) if isinstance(following, ast.If) else self.loop_value(following, name)
            return VarBinding(self.define(kind, name, info), value), index + 1
        if call_name(statement.value) == "match_cast":
            args = self.arguments(statement.value, ["value", "struct_info"], keyword_only=("reason",),
                                  required=("value", "struct_info"))  # type: ignore[arg-type]
            value = self.value(args["value"])
            reason = self.string(args["reason"]) if "reason" in args else ""
            return MatchCast(self.define(kind, name, info), value, self.struct_info(args["struct_info"]), reason), index
        value = self.value(statement.value, info)
        return VarBinding(self.define(kind, name, info), value), index

    def if_value(self, statement: ast.If, name: str) -> If:
        if not statement.orelse:
            raise self.error(statement, f"the If of '{name}' needs an else branch")
        condition = self.value(statement.test)
        return If(condition, self.branch(statement.body, name, statement), self.branch(statement.orelse, name, statement))

    def loop_value(self, statement: ast.For, name: str) -> Loop:
        """``for i, (c0, ...) in loop(count, init=(...), carried=(annotations...)):`` (or
        ``for i in loop(count):``) and its body."""
        if statement.orelse or call_name(statement.iter) != "loop":
            raise self.error(statement, f"the Loop of '{name}' is 'for i in loop(count, ...):' without an else")
        args = self.arguments(statement.iter, ["count"], ("init", "carried"), required=("count",))  # type: ignore[arg-type]
        target = statement.target
        names = []
        if isinstance(target, ast.Tuple) and len(target.elts) == 2 and isinstance(target.elts[1], ast.Tuple):
            target, names = target.elts[0], [self.name_of(e) for e in target.elts[1].elts]
        if not isinstance(target, ast.Name):
            raise self.error(statement.target, "a loop's target is 'i' or 'i, (c0, c1, ...)'")
        infos = [self.struct_info(e) for e in self.elements(args.get("carried"))]
        init = [self.value(e) for e in self.elements(args.get("init"))]
        if not len(names) == len(infos) == len(init):
            raise self.error(statement, f"the Loop of '{name}' names {len(names)} carried variable(s) with "
                                        f"{len(infos)} annotation(s) and {len(init)} initial value(s)")
        carried = tuple(self.define(Var, carried_name, info) for carried_name, info in zip(names, infos))
        body = self.branch(statement.body, name, statement, "the body of the Loop")
        try:
            return Loop(self.prim_expr(args["count"]), SizeVar(target.id), carried, tuple(init), body)
        except ValueError as error:
            raise self.error(statement, str(error)) from None

    def elements(self, node: ast.expr | None) -> list[ast.expr]:
        """The elements of a tuple argument (none when it is not given)."""
        if node is None:
            return []
        if not isinstance(node, ast.Tuple):
            raise self.error(node, "expected a tuple")
        return list(node.elts)

    def branch(self, statements: list[ast.stmt], name: str, where: ast.stmt, what: str = "a branch of the If") -> SeqExpr:
        *bindings, last = statements
        if not (isinstance(last, ast.Assign) and len(last.targets) == 1
                and isinstance(last.targets[0], ast.Name) and last.targets[0].id == name):
            raise self.error(last, f"{what} of '{name}' ends with '{name} = value'")
        return SeqExpr(self.blocks(bindings), self.value(last.value))

    def value(self, node: ast.expr, declared: StructInfo | None = None) -> Expr:
        """A graph-level expression; ``declared`` is the annotation of the variable it is
        bound to, the annotation of a call that gives no ``sinfo=``."""
        if isinstance(node, ast.Name):
            if node.id not in self.scope:
                raise self.error(node, f"undefined variable '{node.id}'")
            return self.scope[node.id]
        if isinstance(node, ast.Tuple):
            return Tuple(tuple(self.value(e) for e in node.elts))
        if isinstance(node, ast.Subscript):
            tuple_value = self.value(node.value)
            return TupleGetItem(tuple_value, self.integer(node.slice))
        if call_name(node) is None:
            raise self.error(node, "expected a variable, a tuple, 'value[index]' or a call")
        return self.value_call(node, declared)  # type: ignore[arg-type]

    def value_call(self, node: ast.Call, declared: StructInfo | None) -> Expr:
        """A call: a constant, a shape or prim value, a call of a program, an allocation,
        ``tensor_to_prim`` or an op, by the name called."""
        name = node.func.id  # type: ignore[attr-defined]
        if name == "const":
            return self.constant(node)
        if name == "shape":
            return ShapeExpr(self.prim_exprs(self.arguments(node, ["values"], required=("values",))["values"]))
        if name == "prim":
            return PrimValue(self.prim_expr(self.arguments(node, ["value"], required=("value",))["value"]))
        if name == "match_cast":
            raise self.error(node, "match_cast is only the value of a binding")
        if name in ("call_tir", "call_library", "call_tir_into"):
            return self.call_program(node, name, declared)
        if name == "alloc_storage":
            args = self.arguments(node, ["size"], (SINFO,), required=("size",))
            return AllocStorage(self.prim_expr(args["size"]), self.call_struct_info(node, args, declared))
        if name == "alloc_tensor":
            args = self.arguments(node, ["storage"], (SINFO,), required=("storage",))
            storage = self.value(args["storage"])
            if not isinstance(storage, Var):
                raise self.error(args["storage"], "alloc_tensor() takes a storage variable")
            return AllocTensor(storage, self.tensor_struct_info(node, args, declared))
        if name == "tensor_to_prim":
            args = self.arguments(node, ["tensor"], (SINFO,), required=("tensor",))
            return TensorToPrim(self.value(args["tensor"]), self.call_struct_info(node, args, declared))
        return self.op_call(node, declared)

    def call_struct_info(self, node: ast.Call, args: dict[str, ast.expr], declared: StructInfo | None) -> StructInfo:
        if SINFO in args:
            return self.struct_info(args[SINFO])
        if declared is None:
            raise self.error(node, f"a call that is not the value of a binding needs its annotation ({SINFO}=...)")
        return declared

    def tensor_struct_info(self, node: ast.Call, args: dict[str, ast.expr], declared: StructInfo | None) -> TensorStructInfo:
        info = self.call_struct_info(node, args, declared)
        if not isinstance(info, TensorStructInfo):
            raise self.error(node, f"{call_name(node)}() gives a tensor; its annotation must be Tensor(...)")
        return info

    def call_program(self, node: ast.Call, name: str, declared: StructInfo | None) -> Expr:
        into = name == "call_tir_into"
        args = self.arguments(node, ["program", "args"], ("out", "sizes", SINFO) if into else ("sizes", SINFO),
                              required=("program", "args", "out") if into else ("program", "args"))
        program = self.string(args["program"])
        if not isinstance(args["args"], ast.Tuple):
            raise self.error(args["args"], f"{name}() takes its arguments as a tuple")
        operands = tuple(self.value(a) for a in args["args"].elts)
        sizes = self.sizes(args["sizes"]) if "sizes" in args else ()
        if into:
            output = self.value(args["out"])
            if not isinstance(output, Var):
                raise self.error(args["out"], "call_tir_into() writes into a variable")
            return CallTIRInto(program, operands, output, sizes, self.call_struct_info(node, args, declared))
        kind = CallLibrary if name == "call_library" else CallTIR
        return kind(program, operands, self.tensor_struct_info(node, args, declared), sizes)

    def op_call(self, node: ast.Call, declared: StructInfo | None) -> Call:
        args = list(node.args)
        op = node.func.id  # type: ignore[attr-defined]
        if op == "call_op":
            if not args:
                raise self.error(node, 'call_op() needs the op name first: call_op("name", ...)')
            op = self.string(args.pop(0))
        elif op in GRAPH_BUILTINS:
            raise self.error(node, f"{op}() is not an op")
        operands = tuple(self.value(a) for a in args)
        attrs: dict[str, Any] = {}
        info_node = None
        for keyword in node.keywords:
            if keyword.arg == SINFO:
                info_node = keyword.value
            elif keyword.arg is not None:
                attrs[keyword.arg] = self.literal(keyword.value)
            else:
                spread = self.literal(keyword.value)
                if not isinstance(spread, dict) or not all(isinstance(k, str) for k in spread):
                    raise self.error(keyword.value, "** takes a dict of attributes with string keys")
                attrs.update(spread)
        info = self.struct_info(info_node) if info_node is not None else declared
        if info is None:
            raise self.error(node, f"a call that is not the value of a binding needs its annotation ({SINFO}=...)")
        return Call(op, operands, attrs, info)

    def buffers(self, definition: ast.FunctionDef) -> dict[str, Buffer]:
        """The parameters ``name: Buffer(shape, dtype)`` by identifier, in order."""
        arguments = definition.args
        if arguments.vararg or arguments.kwarg or arguments.kwonlyargs or arguments.posonlyargs or not arguments.args:
            raise self.error(definition, "a program's parameters are its buffers, 'name: Buffer(shape, dtype)'")
        buffers = {}
        for arg in arguments.args:
            annotation = arg.annotation
            if call_name(annotation) != "Buffer":
                raise self.error(arg, f"parameter '{arg.arg}' must be annotated Buffer(shape, dtype)")
            args = self.arguments(annotation, ["shape", "dtype"], ("name",), required=("shape", "dtype"))  # type: ignore[arg-type]
            name = self.string(args["name"]) if "name" in args else arg.arg
            buffers[arg.arg] = Buffer(name, self.prim_exprs(args["shape"]), self.string(args["dtype"]))
        return buffers

    def target_schedules(self, keywords: dict[str, ast.expr]) -> TargetSchedules | None:
        """A program's schedules from its decorator's keywords, one per target (see
        ``tir.format_schedule``; a target not given keeps its default); None without any."""
        given = {target: self.schedule(keywords[target], target) for target in TARGET_KINDS if target in keywords}
        return TargetSchedules(**given) if given else None

    def schedule(self, node: ast.expr, target: str) -> Schedule | None:
        """A schedule of ``target``: a kind's name, or the kind called with its parameters as
        keywords (integers, booleans, tuples of integers, schedules); ``None`` where the
        target may have none."""
        if isinstance(node, ast.Constant) and node.value is None and TARGET_KINDS[target][1]:
            return None
        kinds = TARGET_SCHEDULE_KINDS[target]
        name = name_of_node(node) if isinstance(node, ast.Name) else call_name(node)
        kind = kinds.get(name or "")
        if kind is None:
            raise self.error(node, f"unknown {target} schedule; expected one of {', '.join(kinds)}")
        if isinstance(node, ast.Name):
            return kind()
        if node.args:  # type: ignore[attr-defined]
            raise self.error(node, "a schedule's parameters are keywords")
        parameters = {k.arg: self.schedule_parameter(k.value, target) for k in node.keywords}  # type: ignore[attr-defined]
        try:
            return kind(**parameters)
        except (TypeError, ValueError) as error:
            raise self.error(node, f"schedule {name}: {error}") from None

    def schedule_parameter(self, node: ast.expr, target: str) -> Any:
        """A schedule's parameter: an integer, a boolean, a tuple of integers, or a schedule
        of the same target (the one a kind falls back to)."""
        if isinstance(node, (ast.Name, ast.Call)):
            return self.schedule(node, target)
        value = self.literal(node)
        if isinstance(value, tuple) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return value
        if not isinstance(value, (int, bool)):
            raise self.error(node, "a schedule's parameter is an integer, a boolean, a tuple of integers or a schedule")
        return value

    def tensor_program(self, definition: ast.FunctionDef, keywords: dict[str, ast.expr]) -> TensorProgram:
        self.check_keywords(keywords, {"name", *TARGET_KINDS}, "tensor_program")
        buffers = self.buffers(definition)
        output_identifier = list(buffers)[-1]
        statement = definition.body[0]
        if (len(definition.body) != 1 or not isinstance(statement, ast.Assign) or len(statement.targets) != 1
                or not isinstance(statement.targets[0], ast.Subscript)
                or name_of_node(statement.targets[0].value) != output_identifier):
            raise self.error(definition, f"a tensor program's body is one definition '{output_identifier}[axes] = value'")
        axes = tuple(self.size_var(a) for a in subscript_items(statement.targets[0]))
        body = self.scalar(statement.value, buffers)
        schedule = self.target_schedules(keywords)
        try:
            return TensorProgram(self.definition_name(definition, keywords), tuple(list(buffers.values())[:-1]),
                                 buffers[output_identifier], axes, body, schedule)
        except ValueError as error:
            raise self.error(definition, str(error)) from None

    def library_kernel(self, definition: ast.FunctionDef, keywords: dict[str, ast.expr]) -> Any:
        self.check_keywords(keywords, {"name", "builder", "args", "targets"}, "library_kernel")
        if "builder" not in keywords or "args" not in keywords:
            raise self.error(definition, '@library_kernel needs builder="..." and args={...}')
        body = definition.body
        if len(body) != 1 or not (isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                                  and body[0].value.value is ...):
            raise self.error(definition, "a library kernel's body is '...' (its builder writes the code)")
        arguments = self.literal(keywords["args"])
        if not isinstance(arguments, dict):
            raise self.error(keywords["args"], "args= is a dict of the builder's arguments")
        try:
            kernel = build_library_kernel(self.string(keywords["builder"]), arguments)
        except (KeyError, TypeError, ValueError) as error:
            raise self.error(keywords["builder"], f"cannot build the library kernel: {error}") from None
        kernel = dataclasses.replace(kernel, name=self.definition_name(definition, keywords))
        written = list(self.buffers(definition).values())
        if written != [*kernel.inputs, kernel.output]:
            raise self.error(definition, "the signature differs from the buffers of the kernel its builder makes: "
                                         f"{[*kernel.inputs, kernel.output]}")
        if "targets" in keywords and tuple(self.literal(keywords["targets"])) != kernel.targets:
            raise self.error(keywords["targets"], f"the targets differ from those of the kernel its builder makes: "
                                                  f"{kernel.targets}")
        return kernel

    def scalar(self, node: ast.expr, buffers: dict[str, Buffer]) -> ScalarExpr:
        """A scalar expression of a tensor program (see ``tir.format_scalar`` for the form)."""
        def recurse(child: ast.expr) -> ScalarExpr:
            return self.scalar(child, buffers)

        if isinstance(node, ast.Subscript) and not is_quoted_size_var(node):
            buffer = self.buffer(node.value, buffers)
            items = subscript_items(node)
            if any(is_scalar_node(i) for i in items):
                return Gather(buffer, tuple(recurse(i) if is_scalar_node(i) else self.prim_expr(i) for i in items))
            return Load(buffer, tuple(self.prim_expr(i) for i in items))
        if isinstance(node, ast.BinOp) and type(node.op) in _SCALAR_OPERATORS:
            return Binary(_SCALAR_OPERATORS[type(node.op)], recurse(node.left), recurse(node.right))
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE_OPERATORS:
            return Compare(_COMPARE_OPERATORS[type(node.ops[0])], recurse(node.left), recurse(node.comparators[0]))
        if call_name(node) is None or node.keywords:  # type: ignore[attr-defined]
            raise self.error(node, "expected a scalar expression: a load, a constant like float32(1.0), an op, "
                                   "index(...), select(...) or a reduction")
        return self.scalar_call(node, buffers)  # type: ignore[arg-type]

    def scalar_call(self, node: ast.Call, buffers: dict[str, Buffer]) -> ScalarExpr:
        """A constant, a cast, an op, ``index(...)``, ``select(...)``, ``gather(...)`` or a
        reduction, by the name called."""
        def recurse(child: ast.expr) -> ScalarExpr:
            return self.scalar(child, buffers)

        name, args = node.func.id, node.args  # type: ignore[attr-defined]
        if name in _COMBINER_NAMES and len(args) == 1 and isinstance(args[0], ast.GeneratorExp):
            return self.reduction(name, args[0], buffers)
        if name in DTYPES and len(args) == 1:
            if is_number_node(args[0]):
                return FloatImm(self.literal(args[0]), name)
            try:
                return Cast(name, recurse(args[0]))
            except ValueError as error:
                raise self.error(node, str(error)) from None
        if name == "index" and len(args) == 1:
            return IndexValue(self.prim_expr(args[0]))
        if name == "select" and len(args) == 3:
            return Select(recurse(args[0]), recurse(args[1]), recurse(args[2]))
        if name == "checked_index" and len(args) == 3:
            return CheckedIndex(self.prim_expr(args[0]), recurse(args[1]), self.prim_expr(args[2]))
        if name == "checked_integer" and len(args) == 2:
            return CheckedInteger(self.prim_expr(args[0]), recurse(args[1]))
        if name == "checked_divisor" and len(args) == 2:
            return CheckedDivisor(self.prim_expr(args[0]), recurse(args[1]))
        if name == "gather" and args:
            items = args[1:]
            return Gather(self.buffer(args[0], buffers),
                          tuple(recurse(i) if is_scalar_node(i) else self.prim_expr(i) for i in items))
        if name in _BINARY_NAMES and len(args) == 2:
            return Binary(name, recurse(args[0]), recurse(args[1]))
        if name in _UNARY_NAMES and len(args) == 1:
            return Unary(name, recurse(args[0]))
        raise self.error(node, f"unknown scalar function {name}() with {len(args)} argument(s)")

    def reduction(self, combiner: str, generator: ast.GeneratorExp, buffers: dict[str, Buffer]) -> Reduce:
        loop = generator.generators[0] if len(generator.generators) == 1 else None
        if (loop is None or loop.ifs or loop.is_async or call_name(loop.iter) != "range"
                or len(loop.iter.args) != 1 or loop.iter.keywords):  # type: ignore[attr-defined]
            raise self.error(generator, f"a reduction is {combiner}(value for axis in range(extent))")
        extent = self.prim_expr(loop.iter.args[0])  # type: ignore[attr-defined]
        return Reduce(combiner, self.size_var(loop.target), extent, self.scalar(generator.elt, buffers))

    def buffer(self, node: ast.expr, buffers: dict[str, Buffer]) -> Buffer:
        if not isinstance(node, ast.Name) or node.id not in buffers:
            raise self.error(node, f"unknown buffer; the program's buffers are: {', '.join(buffers)}")
        return buffers[node.id]


__all__ = ["ParseError", "parse_module"]
