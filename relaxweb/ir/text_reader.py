"""The reading of IR text that every kind of definition shares: a definition's decorator,
call arguments, literals, size expressions and constants, and the syntax helpers (see
``parser.py``, which reads graph functions and programs, and ``host_parser.py``)."""

from __future__ import annotations

import ast
from typing import Any, Callable, Mapping

import numpy as np

from .expr import Constant, Var
from .symbolic import Add, FloorDiv, FloorMod, IntImm, Max, Min, Mul, PrimExpr, SizeVar, Sub


class ParseError(ValueError):
    """Malformed IR text; the message gives the line and column and shows the line."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None, source_line: str = "") -> None:
        self.message, self.line, self.column = message, line, column
        where = f"line {line}, column {column + 1}: " if line is not None and column is not None else ""
        shown = f"\n    {source_line}\n    {' ' * (column or 0)}^" if source_line else ""
        super().__init__(f"{where}{message}{shown}")


_PRIM_OPERATORS: dict[type, type] = {ast.Add: Add, ast.Sub: Sub, ast.Mult: Mul, ast.FloorDiv: FloorDiv, ast.Mod: FloorMod}
_FLOAT_WORDS = {"inf": float("inf"), "-inf": float("-inf"), "nan": float("nan")}


class TextReader:
    """A reader of one text: the shared kinds of syntax, errors with the line they are on."""

    def __init__(self, text: str, constants: Mapping[str, Constant | np.ndarray]) -> None:
        self.lines = text.splitlines()
        self.constant_table = constants
        self.constants: dict[Any, Constant] = {}
        self.scope: dict[str, Var] = {}

    def error(self, node: ast.AST, message: str) -> ParseError:
        line = getattr(node, "lineno", None)
        source = self.lines[line - 1] if line is not None and 0 < line <= len(self.lines) else ""
        return ParseError(message, line, getattr(node, "col_offset", None), source)

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

    def arguments(self, call: ast.Call, positional: list[str], keyword_only: tuple[str, ...] = (),
                  required: tuple[str, ...] = ()) -> dict[str, ast.expr]:
        """The argument nodes of a call by parameter name (``positional`` may also be given
        by keyword); every name in ``required`` must be given."""
        what = call_name(call)
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
        read = _LITERAL_READERS.get(type(node))
        value = NOT_READ if read is None else read(self, node)
        if value is NOT_READ:
            raise self.error(node, "expected a literal (number, string, None, True/False, list, tuple, dict, "
                                   "float(...) or sym(...))")
        return value

    def literal_constant(self, node: ast.Constant) -> Any:
        return NOT_READ if isinstance(node.value, (bytes, complex, type(...))) else node.value

    def literal_negative(self, node: ast.UnaryOp) -> Any:
        if not isinstance(node.op, ast.USub):
            return NOT_READ
        value = self.literal(node.operand)
        return -value if isinstance(value, (int, float)) and not isinstance(value, bool) else NOT_READ

    def literal_dict(self, node: ast.Dict) -> Any:
        if None in node.keys:
            return NOT_READ
        return {self.literal(k): self.literal(v) for k, v in zip(node.keys, node.values)}  # type: ignore[arg-type]

    def literal_call(self, node: ast.Call) -> Any:
        """``float("inf")`` (and ``"-inf"``, ``"nan"``) or ``sym(expr)``."""
        name = call_name(node)
        if name not in ("float", "sym") or len(node.args) != 1 or node.keywords:
            return NOT_READ
        if name == "sym":
            return self.prim_expr(node.args[0])
        word = self.string(node.args[0])
        if word not in _FLOAT_WORDS:
            raise self.error(node, f'expected float("inf"), float("-inf") or float("nan"), got {word!r}')
        return _FLOAT_WORDS[word]

    def prim_expr(self, node: ast.expr) -> PrimExpr:
        """A symbolic integer expression, built node for node as written."""
        read = _PRIM_EXPR_READERS.get(type(node))
        expr = None if read is None else read(self, node)
        if expr is None:
            raise self.error(node, "expected a size expression (integers, size variables, + - * // %, min, max)")
        return expr

    def prim_constant(self, node: ast.Constant) -> PrimExpr | None:
        value = node.value
        return IntImm(value) if isinstance(value, int) and not isinstance(value, bool) else None

    def prim_negative(self, node: ast.UnaryOp) -> PrimExpr | None:
        """``-4``: a negative constant."""
        if not (isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant)):
            return None
        value = self.prim_expr(node.operand)
        assert isinstance(value, IntImm)
        return IntImm(-value.value)

    def prim_operation(self, node: ast.BinOp) -> PrimExpr | None:
        kind = _PRIM_OPERATORS.get(type(node.op))
        return None if kind is None else kind(self.prim_expr(node.left), self.prim_expr(node.right))

    def prim_min_max(self, node: ast.Call) -> PrimExpr | None:
        name = call_name(node)
        if name not in ("min", "max") or len(node.args) != 2 or node.keywords:
            return None
        return (Min if name == "min" else Max)(self.prim_expr(node.args[0]), self.prim_expr(node.args[1]))

    def prim_exprs(self, node: ast.expr) -> tuple[PrimExpr, ...]:
        if not isinstance(node, (ast.Tuple, ast.List)):
            raise self.error(node, "expected a tuple of size expressions")
        return tuple(self.prim_expr(e) for e in node.elts)

    def size_var(self, node: ast.expr) -> SizeVar:
        var = self.size_var_or_none(node)
        if var is None:
            raise self.error(node, "expected a size variable")
        return var

    def size_var_or_none(self, node: ast.expr) -> SizeVar | None:
        """``n`` or ``size_var["a name"]``; None for anything else."""
        if isinstance(node, ast.Name):
            return SizeVar(node.id)
        if isinstance(node, ast.Subscript) and is_quoted_size_var(node):
            return SizeVar(node.slice.value)  # type: ignore[attr-defined]
        return None

    def sizes(self, node: ast.expr) -> tuple[tuple[str, PrimExpr], ...]:
        """``{"n": batch}``: a program's size variables bound to the caller's expressions."""
        if not isinstance(node, ast.Dict) or None in node.keys:
            raise self.error(node, 'expected sizes as a dict {"size variable": expression}')
        return tuple((self.string(k), self.prim_expr(v)) for k, v in zip(node.keys, node.values))  # type: ignore[arg-type]

    def optional_shape(self, node: ast.expr | None) -> tuple[PrimExpr, ...] | None:
        if node is None or (isinstance(node, ast.Constant) and node.value is None):
            return None
        return self.prim_exprs(node)

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

    def flag(self, node: ast.expr) -> bool:
        if not (isinstance(node, ast.Constant) and isinstance(node.value, bool)):
            raise self.error(node, "expected True or False")
        return node.value


# How each kind of Python syntax node reads as a literal and as a size expression (None or
# NOT_READ: it does not).
NOT_READ = object()
_LITERAL_READERS: dict[type, Callable[[TextReader, Any], Any]] = {
    ast.Constant: TextReader.literal_constant,
    ast.UnaryOp: TextReader.literal_negative,
    ast.List: lambda parser, node: [parser.literal(e) for e in node.elts],
    ast.Tuple: lambda parser, node: tuple(parser.literal(e) for e in node.elts),
    ast.Dict: TextReader.literal_dict,
    ast.Call: TextReader.literal_call,
}
_PRIM_EXPR_READERS: dict[type, Callable[[TextReader, Any], PrimExpr | None]] = {
    ast.Constant: TextReader.prim_constant,
    ast.Name: TextReader.size_var_or_none,
    ast.Subscript: TextReader.size_var_or_none,
    ast.UnaryOp: TextReader.prim_negative,
    ast.BinOp: TextReader.prim_operation,
    ast.Call: TextReader.prim_min_max,
}


# -- syntax helpers ----------------------------------------------------------------------------


def call_name(node: ast.AST | None) -> str | None:
    """``f`` for a call ``f(...)``, else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id
    return None


def name_of_node(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else None


def subscript_items(node: ast.Subscript) -> list[ast.expr]:
    """The indices of ``x[i, j]`` (none for ``x[()]``)."""
    return list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]


def is_quoted_size_var(node: ast.Subscript) -> bool:
    """``size_var["name"]``: a size variable whose name is not an identifier."""
    return (name_of_node(node.value) == "size_var" and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str))


def is_number_node(node: ast.expr) -> bool:
    """A number literal: ``1``, ``-1.5``, ``True``, ``float("inf")``."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (bool, int, float))
    return call_name(node) == "float"


def is_scalar_node(node: ast.expr) -> bool:
    """Whether an index of a load is a run-time scalar (an indirect load's) rather than a
    size expression: loads, calls other than min/max of two values, comparisons, and
    arithmetic over those."""
    if isinstance(node, ast.Subscript):
        return not is_quoted_size_var(node)
    if isinstance(node, ast.Call):
        return not (call_name(node) in ("min", "max") and len(node.args) == 2)
    if isinstance(node, ast.Compare):
        return True
    if isinstance(node, ast.BinOp):
        return is_scalar_node(node.left) or is_scalar_node(node.right)
    if isinstance(node, ast.UnaryOp):
        return is_scalar_node(node.operand)
    return False
