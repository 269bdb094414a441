"""Reading a host function's text back (``format_host_function`` in ``printer.py`` writes
it): its tables, its input checks and its steps."""

from __future__ import annotations

import ast
from typing import Any, Callable

from .host import (
    BufferRef, HostBind, HostCache, HostCheck, HostDispatch, HostFunction, HostIf, HostInput, HostLoop, HostOutput,
    HostOutputShape, HostRead, HostSequence, HostSequenceAppend, HostSequenceClear, HostSequenceInput,
    HostSequencePresence, HostStorage, ShapeCheck,
)
from .text_reader import TextReader, call_name


class HostFunctionReader(TextReader):
    """The host-function part of the IR text's reader."""

    def host_function(self, definition: ast.FunctionDef, keywords: dict[str, ast.expr]) -> HostFunction:
        self.check_keywords(keywords, {"name", "read_slots"}, "host_function")
        tables: dict[str, Any] = {"inputs": (), "outputs": (), "symbolic_vars": (), "bounds": (), "weights": (),
                                  "storages": (), "caches": (), "sequences": ()}
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
        while statements and isinstance(statements[0], ast.Expr) and call_name(statements[0].value) == "check_input":
            checks.append(self.shape_check(statements.pop(0).value))  # type: ignore[arg-type]
        steps = self.host_steps(statements)
        read_slots = self.integer(keywords["read_slots"]) if "read_slots" in keywords else 0
        return HostFunction(self.definition_name(definition, keywords), tables["inputs"], tables["outputs"],
                            tables["symbolic_vars"], tables["bounds"], tuple(checks), tables["storages"],
                            tables["weights"], steps, read_slots, sequences=tables["sequences"], caches=tables["caches"])

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
            if call_name(node) != "const":
                raise self.error(node, 'a weight is const("key")')
            return self.constant(node)  # type: ignore[arg-type]
        expected = {"inputs": "host_input", "outputs": "host_output", "storages": "host_storage",
                    "caches": "host_cache", "sequences": "host_sequence"}[table]
        if call_name(node) != expected:
            raise self.error(node, f"an entry of the {table} table is {expected}(...)")
        if table == "inputs":
            args = self.arguments(node, ["name", "dtype", "shape"], ("storage", "sequence", "optional"),  # type: ignore[arg-type]
                                  ("name", "dtype", "shape", "storage"))
            return HostInput(self.string(args["name"]), self.string(args["dtype"]), self.prim_exprs(args["shape"]),
                             self.integer(args["storage"]), *self.sequence_fields(args))
        if table == "outputs":
            args = self.arguments(node, ["name", "dtype", "shape"], ("storage", "ndim", "sequence", "optional"),  # type: ignore[arg-type]
                                  ("name", "dtype", "shape", "storage"))
            shape = self.optional_shape(args["shape"])
            ndim = self.integer(args["ndim"]) if "ndim" in args else (len(shape) if shape is not None else -1)
            return HostOutput(self.string(args["name"]), self.string(args["dtype"]), self.integer(args["storage"]), shape, ndim,
                              *self.sequence_fields(args))
        if table == "sequences":
            args = self.arguments(node, [], ("storage", "size_var", "dtype", "ndim", "element_bytes"),  # type: ignore[arg-type]
                                  required=("storage", "size_var", "dtype", "ndim", "element_bytes"))
            return HostSequence(self.integer(args["storage"]), self.string(args["size_var"]), self.string(args["dtype"]),
                                self.integer(args["ndim"]), self.integer(args["element_bytes"]))
        if table == "caches":
            fields = ("input", "output", "axis", "capacity", "storage")
            args = self.arguments(node, [], fields, required=fields)  # type: ignore[arg-type]
            return HostCache(*(self.integer(args[field]) for field in fields))
        args = self.arguments(node, ["size", "role"], required=("size", "role"))  # type: ignore[arg-type]
        return HostStorage(self.prim_expr(args["size"]), self.string(args["role"]))

    def sequence_fields(self, args: dict[str, ast.expr]) -> tuple[int | None, bool]:
        """``sequence`` and ``optional`` of a host input or output (defaults: None, False)."""
        sequence = self.integer(args["sequence"]) if "sequence" in args else None
        return sequence, self.flag(args["optional"]) if "optional" in args else False

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
        if len(statements) == 1 and isinstance(statements[0], ast.Pass):
            return ()
        steps = []
        for statement in statements:
            read = _HOST_STATEMENT_READERS.get(type(statement))
            if read is None:
                raise self.error(statement, "expected a host step: dispatch, bind, check, read, output_shape, a sequence step, if or for")
            steps.append(read(self, statement))
        return tuple(steps)

    def host_if(self, statement: ast.If) -> HostIf:
        if not statement.orelse:
            raise self.error(statement, "a host 'if' needs an else branch ('else: pass' when empty)")
        return HostIf(self.prim_expr(statement.test), self.host_steps(statement.body), self.host_steps(statement.orelse))

    def host_loop(self, statement: ast.For) -> HostLoop:
        if statement.orelse or not isinstance(statement.target, ast.Name) or call_name(statement.iter) != "loop":
            raise self.error(statement, "a host loop is 'for i in loop(count, note=...):' without an else")
        args = self.arguments(statement.iter, ["count"], ("note",), required=("count",))  # type: ignore[arg-type]
        return HostLoop(statement.target.id, self.prim_expr(args["count"]), self.host_steps(statement.body),
                        self.string(args["note"]) if "note" in args else "")

    def host_call(self, statement: ast.Expr) -> Any:
        if not isinstance(statement.value, ast.Call):
            raise self.error(statement, "expected a host step: dispatch, bind, check, read, output_shape, a sequence step, if or for")
        return self.host_step(statement.value)

    def host_step(self, call: ast.Call) -> Any:
        name = call_name(call)
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
        if name in _SEQUENCE_STEPS:
            return _SEQUENCE_STEPS[name](self, call)
        if name == "check_input":
            raise self.error(call, "input checks come before the steps")
        raise self.error(call, "expected a host step: dispatch, bind, check, read, output_shape or a sequence step")

    def sequence_input(self, call: ast.Call) -> HostSequenceInput:
        fields = ("ndim_code", "ndim_message", "capacity_code", "capacity_message")
        args = self.arguments(call, ["sequence", "input"], ("optional", *fields), ("sequence", "input", *fields))
        return HostSequenceInput(self.integer(args["sequence"]), self.string(args["input"]),
                                 self.flag(args["optional"]) if "optional" in args else False,
                                 self.integer(args["ndim_code"]), self.string(args["ndim_message"]),
                                 self.integer(args["capacity_code"]), self.string(args["capacity_message"]))

    def sequence_presence(self, call: ast.Call) -> HostSequencePresence:
        args = self.arguments(call, ["sequence", "variable"], required=("sequence", "variable"))
        return HostSequencePresence(self.integer(args["sequence"]), self.string(args["variable"]))

    def sequence_clear(self, call: ast.Call) -> HostSequenceClear:
        args = self.arguments(call, ["sequence"], required=("sequence",))
        return HostSequenceClear(self.integer(args["sequence"]))

    def sequence_append(self, call: ast.Call) -> HostSequenceAppend:
        args = self.arguments(call, ["sequence", "shape"], ("code", "message"), ("sequence", "shape", "code", "message"))
        return HostSequenceAppend(self.integer(args["sequence"]), self.prim_exprs(args["shape"]),
                                  self.integer(args["code"]), self.string(args["message"]))

    def buffer_ref(self, node: ast.expr) -> BufferRef:
        kind = call_name(node)
        if kind not in ("storage", "weight") or len(node.args) != 1 or node.keywords:  # type: ignore[attr-defined]
            raise self.error(node, "a dispatch buffer is storage(index) or weight(index)")
        return BufferRef(kind, self.integer(node.args[0]))  # type: ignore[attr-defined]


# How each kind of Python syntax node reads as a literal, a size expression (None or
# NOT_READ: it does not) and a host statement.


_SEQUENCE_STEPS: dict[str, Callable[[HostFunctionReader, ast.Call], Any]] = {
    "sequence_input": HostFunctionReader.sequence_input,
    "sequence_presence": HostFunctionReader.sequence_presence,
    "sequence_clear": HostFunctionReader.sequence_clear,
    "sequence_append": HostFunctionReader.sequence_append,
}
_HOST_STATEMENT_READERS: dict[type, Callable[[HostFunctionReader, Any], Any]] = {
    ast.If: HostFunctionReader.host_if,
    ast.For: HostFunctionReader.host_loop,
    ast.Expr: HostFunctionReader.host_call,
}
