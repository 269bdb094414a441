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
from .host import (
    BufferRef, HostBind, HostCheck, HostDispatch, HostFunction, HostIf, HostInput, HostLoop, HostOutput, HostOutputShape,
    HostRead, HostStorage, ShapeCheck,
)
from .kernel_builders import build_library_kernel
from .module import IRModule
from .printer import GRAPH_BUILTINS, SINFO
from .schedule import Schedule
from .struct_info import (
    FuncStructInfo, ObjectStructInfo, OptionalStructInfo, PrimStructInfo, SequenceStructInfo, ShapeStructInfo,
    StructInfo, TensorStructInfo, TupleStructInfo, struct_info_equal,
)
from .symbolic import Add, FloorDiv, FloorMod, IntImm, Max, Min, Mul, PrimExpr, SizeVar, Sub
from .target_schedules import TARGET_KINDS, TARGET_SCHEDULE_KINDS, TargetSchedules
from .tir import (
    Binary, BinaryOp, Buffer, Cast, Compare, CompareOp, FloatImm, Gather, IndexValue, Load, Reduce, ReduceCombiner,
    ScalarExpr, Select, TensorProgram, Unary, UnaryOp,
)


class ParseError(ValueError):
    """Malformed IR text; the message gives the line and column and shows the line."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None, source_line: str = "") -> None:
        self.message, self.line, self.column = message, line, column
        where = f"line {line}, column {column + 1}: " if line is not None and column is not None else ""
        shown = f"\n    {source_line}\n    {' ' * (column or 0)}^" if source_line else ""
        super().__init__(f"{where}{message}{shown}")


_PRIM_OPERATORS: dict[type, type] = {ast.Add: Add, ast.Sub: Sub, ast.Mult: Mul, ast.FloorDiv: FloorDiv, ast.Mod: FloorMod}
# The operators tir.format_scalar writes with symbols (BINARY_SYMBOLS, COMPARE_OPS).
_SCALAR_OPERATORS = {ast.Add: BinaryOp.ADD, ast.Sub: BinaryOp.SUBTRACT, ast.Mult: BinaryOp.MULTIPLY,
                     ast.Div: BinaryOp.DIVIDE}
_COMPARE_OPERATORS = {ast.Lt: CompareOp.LT, ast.LtE: CompareOp.LE, ast.Gt: CompareOp.GT, ast.GtE: CompareOp.GE,
                      ast.Eq: CompareOp.EQ, ast.NotEq: CompareOp.NE}
# The names the other scalar ops print as (each member of these enums is its name).
_BINARY_NAMES, _UNARY_NAMES = frozenset(BinaryOp), frozenset(UnaryOp)
_COMBINER_NAMES = frozenset(ReduceCombiner)
_FLOAT_WORDS = {"inf": float("inf"), "-inf": float("-inf"), "nan": float("nan")}


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


class _Parser:
    def __init__(self, text: str, constants: Mapping[str, Constant | np.ndarray]) -> None:
        self.lines = text.splitlines()
        self.constant_table = constants
        self.constants: dict[Any, Constant] = {}
        self.scope: dict[str, Var] = {}

    def error(self, node: ast.AST, message: str) -> ParseError:
        line = getattr(node, "lineno", None)
        source = self.lines[line - 1] if line is not None and 0 < line <= len(self.lines) else ""
        return ParseError(message, line, getattr(node, "col_offset", None), source)

    # -- the module ------------------------------------------------------------------------

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

    def decorator(self, definition: ast.FunctionDef, kinds: set[str]) -> tuple[str, dict[str, ast.expr]]:
        """The kind of a definition and its decorator's keyword arguments."""
        if len(definition.decorator_list) != 1:
            raise self.error(definition, f"'{definition.name}' needs exactly one decorator, one of: {', '.join(sorted(kinds))}")
        decorator = definition.decorator_list[0]
        call = decorator if isinstance(decorator, ast.Call) else None
        name_node = call.func if call else decorator
        if not isinstance(name_node, ast.Name) or name_node.id not in kinds:
            raise self.error(decorator, f"unknown decorator; expected one of: {', '.join(sorted(kinds))}")
        if call and call.args:
            raise self.error(call, f"@{name_node.id} takes keyword arguments only")
        keywords = {}
        for keyword in call.keywords if call else []:
            if keyword.arg is None:
                raise self.error(keyword.value, f"@{name_node.id} takes keyword arguments only")
            keywords[keyword.arg] = keyword.value
        return name_node.id, keywords

    def definition_name(self, definition: ast.FunctionDef, keywords: dict[str, ast.expr]) -> str:
        """A definition's name: its ``name=`` (a name that is not an identifier), or the def's."""
        return self.string(keywords["name"]) if "name" in keywords else definition.name

    def check_keywords(self, keywords: dict[str, ast.expr], allowed: set[str], what: str) -> None:
        for key, node in keywords.items():
            if key not in allowed:
                raise self.error(node, f"@{what} has no argument {key!r} (it takes: {', '.join(sorted(allowed))})")

    # -- arguments and literals ------------------------------------------------------------

    def arguments(self, call: ast.Call, positional: list[str], keyword_only: tuple[str, ...] = (),
                  required: tuple[str, ...] = ()) -> dict[str, ast.expr]:
        """The argument nodes of a call by parameter name (``positional`` may also be given
        by keyword); every name in ``required`` must be given."""
        what = _call_name(call)
        if any(isinstance(a, ast.Starred) for a in call.args) or len(call.args) > len(positional):
            raise self.error(call, f"{what}() takes at most {len(positional)} positional argument(s)")
        found = dict(zip(positional, call.args))
        for keyword in call.keywords:
            if keyword.arg is None or keyword.arg not in (*positional, *keyword_only):
                raise self.error(keyword.value, f"{what}() has no argument {keyword.arg or '**'!r}")
            if keyword.arg in found:
                raise self.error(keyword.value, f"{what}() got {keyword.arg!r} twice")
            found[keyword.arg] = keyword.value
        for name in required:
            if name not in found:
                raise self.error(call, f"{what}() needs {name!r}")
        return found

    def string(self, node: ast.expr) -> str:
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            raise self.error(node, "expected a string literal")
        return node.value

    def integer(self, node: ast.expr) -> int:
        value = self.literal(node)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.error(node, "expected an integer")
        return value

    def literal(self, node: ast.expr) -> Any:
        """A Python literal (attribute values, tables): None, bools, numbers, strings,
        lists, tuples, dicts, ``float("inf")`` and ``sym(expr)``."""
        if isinstance(node, ast.Constant) and not isinstance(node.value, (bytes, complex, type(...))):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            value = self.literal(node.operand)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return -value
        if isinstance(node, ast.List):
            return [self.literal(e) for e in node.elts]
        if isinstance(node, ast.Tuple):
            return tuple(self.literal(e) for e in node.elts)
        if isinstance(node, ast.Dict) and None not in node.keys:
            return {self.literal(k): self.literal(v) for k, v in zip(node.keys, node.values)}
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            name = node.func.id
            if name == "float" and len(node.args) == 1 and not node.keywords:
                word = self.string(node.args[0])
                if word not in _FLOAT_WORDS:
                    raise self.error(node, f'expected float("inf"), float("-inf") or float("nan"), got {word!r}')
                return _FLOAT_WORDS[word]
            if name == "sym" and len(node.args) == 1 and not node.keywords:
                return self.prim_expr(node.args[0])
        raise self.error(node, "expected a literal (number, string, None, True/False, list, tuple, dict, "
                               "float(...) or sym(...))")

    # -- size expressions ------------------------------------------------------------------

    def prim_expr(self, node: ast.expr) -> PrimExpr:
        """A symbolic integer expression, built node for node as written."""
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return IntImm(node.value)
        if isinstance(node, ast.Name):
            return SizeVar(node.id)
        if isinstance(node, ast.Subscript) and _is_quoted_size_var(node):
            return SizeVar(node.slice.value)  # type: ignore[attr-defined]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
            value = self.prim_expr(node.operand)
            assert isinstance(value, IntImm)
            return IntImm(-value.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _PRIM_OPERATORS:
            return _PRIM_OPERATORS[type(node.op)](self.prim_expr(node.left), self.prim_expr(node.right))
        if isinstance(node, ast.Call) and _call_name(node) in ("min", "max") and len(node.args) == 2 and not node.keywords:
            kind = Min if _call_name(node) == "min" else Max
            return kind(self.prim_expr(node.args[0]), self.prim_expr(node.args[1]))
        raise self.error(node, "expected a size expression (integers, size variables, + - * // %, min, max)")

    def prim_exprs(self, node: ast.expr) -> tuple[PrimExpr, ...]:
        if not isinstance(node, (ast.Tuple, ast.List)):
            raise self.error(node, "expected a tuple of size expressions")
        return tuple(self.prim_expr(e) for e in node.elts)

    def size_var(self, node: ast.expr) -> SizeVar:
        if isinstance(node, ast.Name):
            return SizeVar(node.id)
        if isinstance(node, ast.Subscript) and _is_quoted_size_var(node):
            return SizeVar(node.slice.value)  # type: ignore[attr-defined]
        raise self.error(node, "expected a size variable")

    def sizes(self, node: ast.expr) -> tuple[tuple[str, PrimExpr], ...]:
        """``{"n": batch}``: a program's size variables bound to the caller's expressions."""
        if not isinstance(node, ast.Dict) or None in node.keys:
            raise self.error(node, 'expected sizes as a dict {"size variable": expression}')
        return tuple((self.string(k), self.prim_expr(v)) for k, v in zip(node.keys, node.values))  # type: ignore[arg-type]

    # -- annotations -----------------------------------------------------------------------

    def struct_info(self, node: ast.expr) -> StructInfo:
        if isinstance(node, ast.Name) and node.id == "Object":
            return ObjectStructInfo()
        name = _call_name(node)
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

    def optional_shape(self, node: ast.expr | None) -> tuple[PrimExpr, ...] | None:
        if node is None or (isinstance(node, ast.Constant) and node.value is None):
            return None
        return self.prim_exprs(node)

    # -- graph functions -------------------------------------------------------------------

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
        kind = _call_name(item.context_expr) if item and isinstance(item.context_expr, ast.Call) else None
        if kind not in ("dataflow", "block") or item.optional_vars or item.context_expr.args or item.context_expr.keywords:  # type: ignore[union-attr]
            raise self.error(statement, "expected 'with dataflow():' or 'with block():'")
        statements = list(statement.body)
        outputs: set[str] | None = None
        if kind == "dataflow":
            outputs = set()
            last = statements[-1]
            if isinstance(last, ast.Expr) and _call_name(last.value) == "output":
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
        if _call_name(statement.value) == "match_cast":
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
        if statement.orelse or _call_name(statement.iter) != "loop":
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
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            raise self.error(node, "expected a variable, a tuple, 'value[index]' or a call")
        name = node.func.id
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
            raise self.error(node, f"{_call_name(node)}() gives a tensor; its annotation must be Tensor(...)")
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

    def constant(self, node: ast.Call) -> Constant:
        """``const("key")`` from the table, or ``const("name", values, "dtype")`` inline."""
        args = self.arguments(node, ["name", "values", "dtype"], required=("name",))
        name = self.string(args["name"])
        if "values" in args:
            if "dtype" not in args:
                raise self.error(node, 'an inline constant needs its dtype: const("name", values, "dtype")')
            data = np.array(self.literal(args["values"]), dtype=self.string(args["dtype"]))
            key: Any = (name, str(data.dtype), data.shape, data.tobytes())
            return self.constants.setdefault(key, Constant(data, name))
        if name not in self.constants:
            if name not in self.constant_table:
                raise self.error(node, f"constant {name!r} is not in the constants table given to the parser")
            given = self.constant_table[name]
            self.constants[name] = given if isinstance(given, Constant) else Constant(np.asarray(given), name)
        return self.constants[name]

    # -- tensor programs and library kernels -----------------------------------------------

    def buffers(self, definition: ast.FunctionDef) -> dict[str, Buffer]:
        """The parameters ``name: Buffer(shape, dtype)`` by identifier, in order."""
        arguments = definition.args
        if arguments.vararg or arguments.kwarg or arguments.kwonlyargs or arguments.posonlyargs or not arguments.args:
            raise self.error(definition, "a program's parameters are its buffers, 'name: Buffer(shape, dtype)'")
        buffers = {}
        for arg in arguments.args:
            annotation = arg.annotation
            if _call_name(annotation) != "Buffer":
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
        name = _name(node) if isinstance(node, ast.Name) else _call_name(node)
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
                or _name(statement.targets[0].value) != output_identifier):
            raise self.error(definition, f"a tensor program's body is one definition '{output_identifier}[axes] = value'")
        axes = tuple(self.size_var(a) for a in _subscript_items(statement.targets[0]))
        body = self.scalar(statement.value, buffers)
        schedule = self.target_schedules(keywords)
        try:
            return TensorProgram(self.definition_name(definition, keywords), tuple(list(buffers.values())[:-1]),
                                 buffers[output_identifier], axes, body, schedule)
        except ValueError as error:
            raise self.error(definition, str(error)) from None

    def library_kernel(self, definition: ast.FunctionDef, keywords: dict[str, ast.expr]) -> Any:
        self.check_keywords(keywords, {"name", "builder", "args"}, "library_kernel")
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
        return kernel

    def scalar(self, node: ast.expr, buffers: dict[str, Buffer]) -> ScalarExpr:
        """A scalar expression of a tensor program (see ``tir.format_scalar`` for the form)."""
        def recurse(child: ast.expr) -> ScalarExpr:
            return self.scalar(child, buffers)

        if isinstance(node, ast.Subscript) and not _is_quoted_size_var(node):
            buffer = self.buffer(node.value, buffers)
            items = _subscript_items(node)
            if any(_is_scalar_node(i) for i in items):
                return Gather(buffer, tuple(recurse(i) if _is_scalar_node(i) else self.prim_expr(i) for i in items))
            return Load(buffer, tuple(self.prim_expr(i) for i in items))
        if isinstance(node, ast.BinOp) and type(node.op) in _SCALAR_OPERATORS:
            return Binary(_SCALAR_OPERATORS[type(node.op)], recurse(node.left), recurse(node.right))
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE_OPERATORS:
            return Compare(_COMPARE_OPERATORS[type(node.ops[0])], recurse(node.left), recurse(node.comparators[0]))
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.keywords:
            raise self.error(node, "expected a scalar expression: a load, a constant like float32(1.0), an op, "
                                   "index(...), select(...) or a reduction")
        name, args = node.func.id, node.args
        if name in _COMBINER_NAMES and len(args) == 1 and isinstance(args[0], ast.GeneratorExp):
            return self.reduction(name, args[0], buffers)
        if name in DTYPES and len(args) == 1:
            if _is_number_node(args[0]):
                return FloatImm(self.literal(args[0]), name)
            try:
                return Cast(name, recurse(args[0]))
            except ValueError as error:
                raise self.error(node, str(error)) from None
        if name == "index" and len(args) == 1:
            return IndexValue(self.prim_expr(args[0]))
        if name == "select" and len(args) == 3:
            return Select(recurse(args[0]), recurse(args[1]), recurse(args[2]))
        if name == "gather" and args:
            items = args[1:]
            return Gather(self.buffer(args[0], buffers),
                          tuple(recurse(i) if _is_scalar_node(i) else self.prim_expr(i) for i in items))
        if name in _BINARY_NAMES and len(args) == 2:
            return Binary(name, recurse(args[0]), recurse(args[1]))
        if name in _UNARY_NAMES and len(args) == 1:
            return Unary(name, recurse(args[0]))
        raise self.error(node, f"unknown scalar function {name}() with {len(args)} argument(s)")

    def reduction(self, combiner: str, generator: ast.GeneratorExp, buffers: dict[str, Buffer]) -> Reduce:
        loop = generator.generators[0] if len(generator.generators) == 1 else None
        if (loop is None or loop.ifs or loop.is_async or _call_name(loop.iter) != "range"
                or len(loop.iter.args) != 1 or loop.iter.keywords):  # type: ignore[attr-defined]
            raise self.error(generator, f"a reduction is {combiner}(value for axis in range(extent))")
        extent = self.prim_expr(loop.iter.args[0])  # type: ignore[attr-defined]
        return Reduce(combiner, self.size_var(loop.target), extent, self.scalar(generator.elt, buffers))

    def buffer(self, node: ast.expr, buffers: dict[str, Buffer]) -> Buffer:
        if not isinstance(node, ast.Name) or node.id not in buffers:
            raise self.error(node, f"unknown buffer; the program's buffers are: {', '.join(buffers)}")
        return buffers[node.id]

    # -- host functions --------------------------------------------------------------------

    def host_function(self, definition: ast.FunctionDef, keywords: dict[str, ast.expr]) -> HostFunction:
        self.check_keywords(keywords, {"name", "read_slots"}, "host_function")
        tables: dict[str, Any] = {"inputs": (), "outputs": (), "symbolic_vars": (), "bounds": (), "weights": (),
                                  "storages": ()}
        checks: list[ShapeCheck] = []
        statements = list(definition.body)
        while statements and isinstance(statements[0], ast.Assign):
            statement = statements.pop(0)
            target = statement.targets[0] if len(statement.targets) == 1 else None
            if not isinstance(target, ast.Name) or target.id not in tables:
                raise self.error(statement, f"a host function's tables are: {', '.join(tables)}")
            if not isinstance(statement.value, ast.List):
                raise self.error(statement.value, f"the {target.id} table is a list")
            tables[target.id] = tuple(self.host_table_entry(target.id, e) for e in statement.value.elts)
        while statements and isinstance(statements[0], ast.Expr) and _call_name(statements[0].value) == "check_input":
            checks.append(self.shape_check(statements.pop(0).value))  # type: ignore[arg-type]
        steps = self.host_steps(statements)
        read_slots = self.integer(keywords["read_slots"]) if "read_slots" in keywords else 0
        return HostFunction(self.definition_name(definition, keywords), tables["inputs"], tables["outputs"],
                            tables["symbolic_vars"], tables["bounds"], tuple(checks), tables["storages"],
                            tables["weights"], steps, read_slots)

    def host_table_entry(self, table: str, node: ast.expr) -> Any:
        if table == "symbolic_vars":
            return self.string(node)
        if table == "bounds":
            entry = self.literal(node)
            if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str)
                    and (entry[1] is None or isinstance(entry[1], int))):
                raise self.error(node, 'a bound is ("variable", upper bound or None)')
            return entry
        if table == "weights":
            if _call_name(node) != "const":
                raise self.error(node, 'a weight is const("key")')
            return self.constant(node)  # type: ignore[arg-type]
        expected = {"inputs": "host_input", "outputs": "host_output", "storages": "host_storage"}[table]
        if _call_name(node) != expected:
            raise self.error(node, f"an entry of the {table} table is {expected}(...)")
        if table == "inputs":
            args = self.arguments(node, ["name", "dtype", "shape"], ("storage",), ("name", "dtype", "shape", "storage"))  # type: ignore[arg-type]
            return HostInput(self.string(args["name"]), self.string(args["dtype"]), self.prim_exprs(args["shape"]),
                             self.integer(args["storage"]))
        if table == "outputs":
            args = self.arguments(node, ["name", "dtype", "shape"], ("storage", "ndim"), ("name", "dtype", "shape", "storage"))  # type: ignore[arg-type]
            shape = self.optional_shape(args["shape"])
            ndim = self.integer(args["ndim"]) if "ndim" in args else (len(shape) if shape is not None else -1)
            return HostOutput(self.string(args["name"]), self.string(args["dtype"]), self.integer(args["storage"]), shape, ndim)
        args = self.arguments(node, ["size", "role"], required=("size", "role"))  # type: ignore[arg-type]
        return HostStorage(self.prim_expr(args["size"]), self.string(args["role"]))

    def check_fields(self, args: dict[str, ast.expr], expected_is_int: bool) -> tuple:
        """expected, variable, code, message of a check (defaults: None, None, 0, "")."""
        expected: Any = None
        if "expected" in args:
            expected = self.integer(args["expected"]) if expected_is_int else self.prim_expr(args["expected"])
        variable = self.string(args["variable"]) if "variable" in args else None
        code = self.integer(args["code"]) if "code" in args else 0
        message = self.string(args["message"]) if "message" in args else ""
        return expected, variable, code, message

    def shape_check(self, call: ast.Call) -> ShapeCheck:
        """``check_input(kind, input=, dim=, expected=, variable=, code=, message=)``; an
        ``ndim`` check's expected value is an int, the others' a size expression."""
        args = self.arguments(call, ["kind"], ("input", "dim", "expected", "variable", "code", "message"),
                              required=("kind", "input"))
        kind = self.string(args["kind"])
        dim = self.integer(args["dim"]) if "dim" in args else -1
        return ShapeCheck(kind, self.integer(args["input"]), dim, *self.check_fields(args, kind == "ndim"))

    def host_steps(self, statements: list[ast.stmt]) -> tuple:
        steps: list = []
        for statement in statements:
            if isinstance(statement, ast.Pass) and len(statements) == 1:
                continue
            if isinstance(statement, ast.If):
                if not statement.orelse:
                    raise self.error(statement, "a host 'if' needs an else branch ('else: pass' when empty)")
                steps.append(HostIf(self.prim_expr(statement.test), self.host_steps(statement.body),
                                    self.host_steps(statement.orelse)))
                continue
            if isinstance(statement, ast.For):
                if statement.orelse or not isinstance(statement.target, ast.Name) or _call_name(statement.iter) != "loop":
                    raise self.error(statement, "a host loop is 'for i in loop(count, note=...):' without an else")
                args = self.arguments(statement.iter, ["count"], ("note",), required=("count",))  # type: ignore[arg-type]
                steps.append(HostLoop(statement.target.id, self.prim_expr(args["count"]), self.host_steps(statement.body),
                                      self.string(args["note"]) if "note" in args else ""))
                continue
            if not isinstance(statement, ast.Expr) or not isinstance(statement.value, ast.Call):
                raise self.error(statement, "expected a host step: dispatch, bind, check, read, output_shape, if or for")
            steps.append(self.host_step(statement.value))
        return tuple(steps)

    def host_step(self, call: ast.Call) -> Any:
        name = _call_name(call)
        if name == "dispatch":
            args = self.arguments(call, ["program", "buffers"], ("sizes", "count", "note"), ("program", "buffers", "count"))
            if not isinstance(args["buffers"], ast.Tuple):
                raise self.error(args["buffers"], "dispatch() takes its buffers as a tuple")
            return HostDispatch(self.string(args["program"]), tuple(self.buffer_ref(b) for b in args["buffers"].elts),
                                self.sizes(args["sizes"]) if "sizes" in args else (), self.prim_expr(args["count"]),
                                self.string(args["note"]) if "note" in args else "")
        if name == "bind":
            args = self.arguments(call, ["variable", "value"], ("note",), ("variable", "value"))
            return HostBind(self.string(args["variable"]), self.prim_expr(args["value"]),
                            self.string(args["note"]) if "note" in args else "")
        if name == "check":
            args = self.arguments(call, ["kind", "value"], ("expected", "variable", "code", "message"), ("kind", "value"))
            return HostCheck(self.string(args["kind"]), self.prim_expr(args["value"]), *self.check_fields(args, False))
        if name == "read":
            args = self.arguments(call, ["variable"], ("storage", "offset", "slot", "note"),
                                  ("variable", "storage", "offset", "slot"))
            return HostRead(self.integer(args["storage"]), self.integer(args["offset"]), self.integer(args["slot"]),
                            self.string(args["variable"]), self.string(args["note"]) if "note" in args else "")
        if name == "output_shape":
            args = self.arguments(call, ["output", "shape"], required=("output", "shape"))
            return HostOutputShape(self.integer(args["output"]), self.prim_exprs(args["shape"]))
        if name == "check_input":
            raise self.error(call, "input checks come before the steps")
        raise self.error(call, "expected a host step: dispatch, bind, check, read, output_shape or if")

    def buffer_ref(self, node: ast.expr) -> BufferRef:
        kind = _call_name(node)
        if kind not in ("storage", "weight") or len(node.args) != 1 or node.keywords:  # type: ignore[attr-defined]
            raise self.error(node, "a dispatch buffer is storage(index) or weight(index)")
        return BufferRef(kind, self.integer(node.args[0]))  # type: ignore[attr-defined]


# -- syntax helpers ----------------------------------------------------------------------------


def _call_name(node: ast.AST | None) -> str | None:
    """``f`` for a call ``f(...)``, else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id
    return None


def _name(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else None


def _subscript_items(node: ast.Subscript) -> list[ast.expr]:
    """The indices of ``x[i, j]`` (none for ``x[()]``)."""
    return list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]


def _is_quoted_size_var(node: ast.Subscript) -> bool:
    """``size_var["name"]``: a size variable whose name is not an identifier."""
    return (_name(node.value) == "size_var" and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str))


def _is_number_node(node: ast.expr) -> bool:
    """A number literal: ``1``, ``-1.5``, ``True``, ``float("inf")``."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (bool, int, float))
    return _call_name(node) == "float"


def _is_scalar_node(node: ast.expr) -> bool:
    """Whether an index of a load is a run-time scalar (an indirect load's) rather than a
    size expression: loads, calls other than min/max of two values, comparisons, and
    arithmetic over those."""
    if isinstance(node, ast.Subscript):
        return not _is_quoted_size_var(node)
    if isinstance(node, ast.Call):
        return not (_call_name(node) in ("min", "max") and len(node.args) == 2)
    if isinstance(node, ast.Compare):
        return True
    if isinstance(node, ast.BinOp):
        return _is_scalar_node(node.left) or _is_scalar_node(node.right)
    if isinstance(node, ast.UnaryOp):
        return _is_scalar_node(node.operand)
    return False


__all__ = ["ParseError", "parse_module"]
