"""The expression emitter of the WebAssembly backend: scalar expressions, index arithmetic,
loads and stores of a tensor program, written into a kernel's ``$main`` as WAT.

Each kind of loop nest (``schedules.py``) drives an :class:`Emitter`: it sets up the loops
and asks the emitter for the value of the body.  Values are WAT folded instructions
(``(f32.add (local.get $v0) (f32.const 1))``); statements are lines of the function body.
Index arithmetic is i32, lowered from the IR's floor division and modulo by
``relaxweb/ir/lower_index.py`` and rendered here; size variables are loaded from the params
block into locals, so one kernel serves every shape.  Locals are named by the emitter
(``$s0`` for the first size variable, ``$x0`` for the first output axis, ...): names from the
model never appear in code, only in comments (``relaxweb.ir.syntax.comment_text``).

Semantics are the WGSL backend's (docs/bundle-format.md, "kernels.wasm"): integer division
never traps (``a / 0 == a``, ``INT_MIN / -1 == INT_MIN``, ``a % 0 == 0``), float to integer
conversions saturate, float max / min propagate NaN (wasm's ``f32.max`` / ``f32.min`` do),
a ``Select`` whose branches load is an ``if``, and a ``Gather`` clamps its run-time indices
-- except for int64, which is held and computed exactly, as i64 (``relaxweb/ir/dtype.py``):
where the GPU checks that an int64 result fits 32 bits, kernels.wasm only computes it.
Every op of the scalar IR has an entry in the tables below: a missing one is an error naming
it, never a guess.
"""

from __future__ import annotations

import math
import re
from typing import Callable, Mapping, Sequence

import numpy as np

from ..ir.dtype import DtypeKind, dtype_info
from ..ir.access import depends_on
from ..ir.error_sites import REPORTING_KINDS
from ..ir.integer_checks import CheckedDivisor, CheckedInteger, checked_operation
from ..ir.launch import LANES, VECTOR
from ..ir.lower_index import Constant, IndexOp, Operation, TargetIndex, Variable
from ..ir.scalar_functor import ScalarFunctor
from ..ir.scalar_renderer import ScalarRenderer
from ..ir.symbolic import IntImm, PrimExpr, SizeVar, free_vars, simplify, substitute
from ..ir.tir import (
    MATH_CALLS, Binary, BinaryOp, Buffer, Cast, CheckedIndex, Compare, CompareOp, FloatImm, Gather, Load, Reduce,
    ReduceCombiner, ScalarExpr, Select, TensorProgram, Unary, UnaryOp, contains_reduce, scalar_children, scalar_nodes,
)

# The key of the run status's address among an emitter's buffers (not a buffer's name: those
# are identifiers), for a kernel whose program checks the run's data (relaxweb/ir/error_sites.py).
STATUS_ADDRESS = "<run status>"

# A value's class decides its instructions: "f" a float (f32), "s" a signed integer, "u" an
# unsigned integer or a bool (both i32 in wasm; a bool is 0 or 1), "l" an int64 (i64: wasm
# computes int64 exactly, ``relaxweb/ir/dtype.py``).
FLOAT, SIGNED, UNSIGNED, LONG = "f", "s", "u", "l"
#: The wasm value type of each class.
CLASS_TYPES = {FLOAT: "f32", SIGNED: "i32", UNSIGNED: "i32", LONG: "i64"}


def value_class(dtype: str) -> str:
    """The class of a value of ``dtype`` in registers (its wasm dtype's; a bool is unsigned)."""
    info = dtype_info(dtype)
    if info.is_float:
        return FLOAT
    if info.wasm_dtype == "int64":
        return LONG
    return SIGNED if info.kind is DtypeKind.INT else UNSIGNED


def wasm_type(dtype: str) -> str:
    """The wasm value type of ``dtype`` in registers and in buffers: f32, i32 or i64."""
    return CLASS_TYPES[value_class(dtype)]


def element_shift(dtype: str) -> int:
    """log2 of the bytes an element of ``dtype`` takes in kernels.wasm's memory (2, or 3 for int64)."""
    return dtype_info(dtype).wasm_bytes.bit_length() - 1


def joined_class(a: str, b: str) -> str:
    """The class two integer operands of one op are computed in: an int64 with an i32 integer
    is computed in i64 (the IR lets int32 and int64 meet: both are int32 on the GPU); any
    other pair is of one class."""
    return LONG if LONG in (a, b) and {a, b} <= {LONG, SIGNED} else a


def coerce(value: str, source: str, target: str) -> str:
    """``value`` of class ``source`` as one of class ``target`` where the two are an int64 and
    an i32 integer: sign-extended, or wrapped to its low 32 bits (numpy's astype)."""
    if source == target:
        return value
    if target == LONG and source in (SIGNED, UNSIGNED):
        return f"(i64.extend_i32_{'s' if source == SIGNED else 'u'} {value})"
    if source == LONG and target in (SIGNED, UNSIGNED):
        return f"(i32.wrap_i64 {value})"
    return value


def _op(instruction: str) -> Callable[..., str]:
    """An instruction applied to its operands' text, folded: ``(f32.add a b)``."""
    return lambda *operands: f"({instruction} {' '.join(operands)})"


def _call(function: str) -> Callable[..., str]:
    return lambda *operands: f"(call ${function} {' '.join(operands)})"


def _per_class(f: str | None, s: str | None, u: str | None = None,
               long: str | None = None) -> dict[str, Callable[..., str]]:
    """One rendering per value class from instruction names (``call $x`` for a function):
    ``f`` for floats, ``s`` for signed integers, ``u`` for unsigned ones and bools (``s``'s
    when not given), ``long`` for int64; None where the op takes no such values."""
    table = {}
    for cls, name in ((FLOAT, f), (SIGNED, s), (UNSIGNED, s if u is None else u), (LONG, long)):
        if name is not None:
            table[cls] = _call(name[6:]) if name.startswith("call $") else _op(name)
    return table


# How each op of the scalar IR is written in WAT, by value class, from its operands' text.
# tests/cpu/test_cpu_kernels.py checks that every member of each enum has an entry.
BINARY_RENDERINGS: dict[BinaryOp, dict[str, Callable[[str, str], str]]] = {
    BinaryOp.ADD: _per_class("f32.add", "i32.add", long="i64.add"),
    BinaryOp.SUBTRACT: _per_class("f32.sub", "i32.sub", long="i64.sub"),
    BinaryOp.MULTIPLY: _per_class("f32.mul", "i32.mul", long="i64.mul"),
    # never traps (helpers.py)
    BinaryOp.DIVIDE: _per_class("f32.div", "call $div_s_i32", "call $div_u32", long="call $div_s_i64"),
    # f32.max propagates NaN
    BinaryOp.MAXIMUM: _per_class("f32.max", "call $max_s_i32", "call $max_u32", long="call $max_s_i64"),
    BinaryOp.MINIMUM: _per_class("f32.min", "call $min_s_i32", "call $min_u32", long="call $min_s_i64"),
    BinaryOp.POWER: _per_class("call $pow_f32", None, None),
    BinaryOp.BITWISE_AND: _per_class(None, "i32.and", long="i64.and"),
    BinaryOp.BITWISE_OR: _per_class(None, "i32.or", long="i64.or"),
    BinaryOp.BITWISE_XOR: _per_class(None, "i32.xor", long="i64.xor"),
    # the amount modulo 32 (64 for an int64), as WGSL
    BinaryOp.SHIFT_RIGHT: _per_class(None, "i32.shr_s", "i32.shr_u", long="i64.shr_s"),
}
UNARY_RENDERINGS: dict[UnaryOp, dict[str, Callable[[str], str]]] = {
    UnaryOp.NEGATIVE: {FLOAT: _op("f32.neg"), SIGNED: lambda a: f"(i32.sub (i32.const 0) {a})",
                       LONG: lambda a: f"(i64.sub (i64.const 0) {a})"},
    # a NaN's exponent is all ones and its mantissa not zero (whatever the sign)
    UnaryOp.IS_NAN: {FLOAT: lambda a: f"(i32.gt_u (i32.and (i32.reinterpret_f32 {a}) (i32.const 0x7fffffff)) "
                                      f"(i32.const 0x7f800000))"},
    # neither NaN nor infinite: the exponent is not all ones
    UnaryOp.IS_FINITE: {FLOAT: lambda a: f"(i32.lt_u (i32.and (i32.reinterpret_f32 {a}) (i32.const 0x7fffffff)) "
                                         f"(i32.const 0x7f800000))"},
    UnaryOp.UNPACK_HALF: {UNSIGNED: _call("unpack_half_f32")},
    UnaryOp.ABSOLUTE: _per_class("f32.abs", None, None),
    UnaryOp.SQRT: _per_class("f32.sqrt", None, None),
    UnaryOp.FLOOR: _per_class("f32.floor", None, None),
    UnaryOp.CEIL: _per_class("f32.ceil", None, None),
    UnaryOp.ROUND: _per_class("f32.nearest", None, None),  # halves to even
    # the math library's functions (relaxweb/cpu/math.py)
    **{op: _per_class(f"call ${op.value}_f32", None, None) for op in MATH_CALLS},
}
COMPARE_RENDERINGS: dict[CompareOp, dict[str, Callable[[str, str], str]]] = {
    CompareOp.LT: _per_class("f32.lt", "i32.lt_s", "i32.lt_u", long="i64.lt_s"),
    CompareOp.LE: _per_class("f32.le", "i32.le_s", "i32.le_u", long="i64.le_s"),
    CompareOp.GT: _per_class("f32.gt", "i32.gt_s", "i32.gt_u", long="i64.gt_s"),
    CompareOp.GE: _per_class("f32.ge", "i32.ge_s", "i32.ge_u", long="i64.ge_s"),
    CompareOp.EQ: _per_class("f32.eq", "i32.eq", long="i64.eq"),
    CompareOp.NE: _per_class("f32.ne", "i32.ne", long="i64.ne"),
}
# accumulator, value -> the accumulator combined with the value
COMBINER_RENDERINGS: dict[ReduceCombiner, dict[str, Callable[[str, str], str]]] = {
    ReduceCombiner.SUM: BINARY_RENDERINGS[BinaryOp.ADD],
    ReduceCombiner.PROD: BINARY_RENDERINGS[BinaryOp.MULTIPLY],
    ReduceCombiner.MAX: BINARY_RENDERINGS[BinaryOp.MAXIMUM],
    ReduceCombiner.MIN: BINARY_RENDERINGS[BinaryOp.MINIMUM],
}


_SPLATTED_CONSTANT = re.compile(r"\(f32x4\.splat \(f32\.const (\S+)\)\)")


def _vector_extremum(exact: str, pseudo: str) -> Callable[[str, str], str]:
    """f32x4.min (max), or its pseudo form where one operand is a constant neither zero nor
    NaN: there the two agree in every lane (``pmin(x, c)`` is ``c < x ? c : x``, a NaN ``x``
    kept; the signs of zeros matter only against a zero), and the pseudo form is one
    instruction on x86, where min and max take several (V8 lowers their NaN and -0 rules)."""
    def render(a: str, b: str) -> str:
        for value, constant in ((a, b), (b, a)):
            match = _SPLATTED_CONSTANT.fullmatch(constant)
            if match and float(match.group(1)) != 0 and not math.isnan(float(match.group(1))):
                return f"({pseudo} {value} {constant})"
        return f"({exact} {a} {b})"
    return render


# The f32x4 forms of the float ops, for the vectorized loops (four consecutive output
# elements at once): a program whose ops all have one may be vectorized.
VECTOR_BINARY_RENDERINGS: dict[BinaryOp, Callable[[str, str], str]] = {
    BinaryOp.ADD: _op("f32x4.add"),
    BinaryOp.SUBTRACT: _op("f32x4.sub"),
    BinaryOp.MULTIPLY: _op("f32x4.mul"),
    BinaryOp.DIVIDE: _op("f32x4.div"),
    BinaryOp.MAXIMUM: _vector_extremum("f32x4.max", "f32x4.pmax"),  # propagates NaN, as f32.max
    BinaryOp.MINIMUM: _vector_extremum("f32x4.min", "f32x4.pmin"),
    BinaryOp.POWER: _call("pow_f32x4"),
}
VECTOR_UNARY_RENDERINGS: dict[UnaryOp, Callable[[str], str]] = {
    UnaryOp.NEGATIVE: _op("f32x4.neg"),
    UnaryOp.ABSOLUTE: _op("f32x4.abs"),
    UnaryOp.SQRT: _op("f32x4.sqrt"),
    UnaryOp.FLOOR: _op("f32x4.floor"),
    UnaryOp.CEIL: _op("f32x4.ceil"),
    UnaryOp.ROUND: _op("f32x4.nearest"),
    **{op: _call(f"{op.value}_f32x4") for op in MATH_CALLS},
}
# f32x4 comparisons: each lane all ones where it holds, all zeros where not (a NaN
# operand gives false, as the f32 comparisons above), the mask a vector select takes.
VECTOR_COMPARE_RENDERINGS: dict[CompareOp, Callable[[str, str], str]] = {
    CompareOp.LT: _op("f32x4.lt"),
    CompareOp.LE: _op("f32x4.le"),
    CompareOp.GT: _op("f32x4.gt"),
    CompareOp.GE: _op("f32x4.ge"),
    CompareOp.EQ: _op("f32x4.eq"),
    CompareOp.NE: _op("f32x4.ne"),
}


def vector_select(mask: str, a: str, b: str) -> str:
    """The f32x4 ``Select``: lane by lane ``a`` where ``mask`` is all ones, else ``b``
    (both branches evaluated: only for branches that may be, see their callers)."""
    return f"(v128.bitselect {a} {b} {mask})"


# The IR's index operations (relaxweb/ir/lower_index.py); a truncating division by a
# positive constant is an instruction (its numerator is >= 0: unsigned), and so is one by a
# local (its divisor is >= 0 too: one of 0 is taken as 1, which gives the helper's results),
# any other a helper.
INDEX_RENDERINGS: dict[IndexOp, Callable[[str, str], str]] = {
    IndexOp.ADD: _op("i32.add"),
    IndexOp.SUBTRACT: _op("i32.sub"),
    IndexOp.MULTIPLY: _op("i32.mul"),
    IndexOp.TRUNCATING_DIVIDE: _call("div_s_i32"),
    IndexOp.TRUNCATING_REMAINDER: _call("rem_s_i32"),
    IndexOp.FLOOR_DIVIDE: _call("floor_div_i32"),
    IndexOp.FLOOR_MODULO: _call("floor_mod_i32"),
    IndexOp.MINIMUM: _call("min_s_i32"),
    IndexOp.MAXIMUM: _call("max_s_i32"),
}
_CONSTANT_DIVISIONS = {IndexOp.TRUNCATING_DIVIDE: "i32.div_u", IndexOp.TRUNCATING_REMAINDER: "i32.rem_u"}


def rendering(table: dict, op, cls: str | None = None):
    """The entry of ``op`` (for values of class ``cls``) in one of the tables above; a
    missing one is an error naming it."""
    entry = table.get(op)
    if entry is not None and cls is not None:
        entry = entry.get(cls)
    if entry is None:
        kind = {FLOAT: " on floats", SIGNED: " on signed integers", UNSIGNED: " on unsigned integers or bools",
                LONG: " on int64"}
        raise NotImplementedError(
            f"the WebAssembly backend has no rendering of {type(op).__name__}.{op.name}{kind.get(cls, '')}")
    return entry




# The i64 instruction of each operation a CheckedInteger checks (all but divide and cast).
CHECKED_I64: dict[str, Callable[..., str]] = {
    "add": _op("i64.add"), "subtract": _op("i64.sub"), "multiply": _op("i64.mul"),
    "negative": lambda a: f"(i64.sub (i64.const 0) {a})",
}


def _fit_i32(exact: str, check: tuple[str, str]) -> str:
    """The i32 of an exact i64 result, reported at the check's site where it does not fit."""
    return f"(call $fit_i32 {exact} {' '.join(check)})"


def literal(value: float, dtype: str) -> str:
    """A WAT constant of ``dtype`` (in its wasm dtype: an int64 constant is an exact i64)."""
    info = dtype_info(dtype)
    if not info.on_gpu:
        raise NotImplementedError(f"dtype {dtype} has no device representation")
    if info.is_float:
        return f"(f32.const {np.float32(value)})"  # the shortest text that reads back as this f32
    if info.kind is DtypeKind.BOOL:
        return f"(i32.const {int(bool(value))})"
    value = int(value)
    if value_class(dtype) == LONG:
        return f"(i64.const {min(max(value, -2**63), 2**63 - 1)})"
    if info.kind is DtypeKind.INT and info.narrowed_on_device:
        value = min(max(value, -2**31), 2**31 - 1)
    return f"(i32.const {value})"


def reduce_identity(combiner: ReduceCombiner, dtype: str) -> str:
    """The start value of a reduction (an empty range reduces to it): 0 for sum, 1 for prod,
    the lowest (highest) value of the dtype for max (min)."""
    if combiner is ReduceCombiner.SUM:
        return literal(0, dtype)
    if combiner is ReduceCombiner.PROD:
        return literal(1, dtype)
    if combiner not in (ReduceCombiner.MAX, ReduceCombiner.MIN):
        raise NotImplementedError(f"the WebAssembly backend has no identity of ReduceCombiner.{combiner.name}")
    lowest = combiner is ReduceCombiner.MAX
    info = dtype_info(dtype)
    if info.is_float:
        return f"(f32.const {'-inf' if lowest else 'inf'})"
    if info.kind is DtypeKind.BOOL:
        return literal(not lowest, dtype)
    bits = 8 * min(info.bytes, info.wasm_bytes)
    if info.kind is DtypeKind.INT:
        return literal(-2 ** (bits - 1) if lowest else 2 ** (bits - 1) - 1, dtype)
    return literal(0 if lowest else 2 ** bits - 1, dtype)


def render_index(target: TargetIndex, variable: Callable[[str], str],
                 operation: Callable[[Operation], str | None] | None = None) -> str:
    """WAT of a lowered index expression (i32); ``variable`` gives a variable's value, and
    ``operation`` (where given) an operation's value when it has one already (else None)."""
    if isinstance(target, Constant):
        return f"(i32.const {target.value})"
    if isinstance(target, Variable):
        return variable(target.name)
    assert isinstance(target, Operation)
    known = operation(target) if operation is not None else None
    if known is not None:
        return known
    a, b = render_index(target.a, variable, operation), render_index(target.b, variable, operation)
    if target.op in _CONSTANT_DIVISIONS and isinstance(target.b, Constant) and target.b.value > 0:
        return f"({_CONSTANT_DIVISIONS[target.op]} {a} {b})"
    if target.op in _CONSTANT_DIVISIONS and _is_local(b):  # a divisor of 0 as 1: the helper's a / 0 == a, a % 0 == 0
        return f"({_CONSTANT_DIVISIONS[target.op]} {a} (select {b} (i32.const 1) {b}))"
    return INDEX_RENDERINGS[target.op](a, b)


def _is_local(value: str) -> bool:
    """Whether the WAT value is a ``local.get`` (cheap to read twice)."""
    return value.startswith("(local.get ") and value.count("(") == 1


def index_variables(target: TargetIndex) -> set[str]:
    """The names of the variables a lowered index expression reads."""
    if isinstance(target, Variable):
        return {target.name}
    if isinstance(target, Operation):
        return index_variables(target.a) | index_variables(target.b)
    return set()


class Function:
    """A function's locals and body lines, built by a schedule and its emitter."""

    def __init__(self) -> None:
        self.locals: dict[str, str] = {}  # name (with $) -> wasm type
        self.lines: list[str] = []
        self._counts: dict[str, int] = {}

    def local(self, prefix: str, wasm_type: str) -> str:
        """A new local ``$prefixN``."""
        number = self._counts.get(prefix, 0)
        self._counts[prefix] = number + 1
        name = f"${prefix}{number}"
        self.locals[name] = wasm_type
        return name

    def named_local(self, name: str, wasm_type: str) -> str:
        """The local ``$name`` (declared once)."""
        self.locals.setdefault(f"${name}", wasm_type)
        return f"${name}"

    def emit(self, indent: str, line: str) -> None:
        self.lines.append(indent + line)

    def text(self, header: str, indent: str = "  ") -> str:
        """``(func ...)``: the header (name, params, result), the locals, the body."""
        declarations = [f"{indent}(local {name} {kind})" for name, kind in self.locals.items()]
        return "\n".join([f"(func {header}", *declarations, *self.lines]) + ")"


class Emitter(ScalarRenderer):
    """Turns a tensor program's scalar expressions into WAT within one :class:`Function`.

    The shared part (``relaxweb/ir/scalar_renderer.py``): a subexpression that occurs more
    than once in the body is computed once into a local and reused within the scope that
    computed it; a scope is opened for each loop body and each branch.  Index expressions go
    through an :class:`IndexLowering`, which knows the range of each axis in scope (declared
    by :meth:`declare_axis`).  ``buffers`` gives each buffer's address (a WAT value: the
    local holding it); ``variables`` each size variable's and axis's local, by IR name.
    """

    binary_renderings = BINARY_RENDERINGS
    unary_renderings = UNARY_RENDERINGS
    compare_renderings = COMPARE_RENDERINGS

    def __init__(self, program: TensorProgram, function: Function, buffers: Mapping[str, str],
                 variables: Mapping[str, str]) -> None:
        super().__init__(program)
        self.function = function
        self.buffers = dict(buffers)
        self.variables: list[dict[str, str]] = [dict(variables)]
        # index operations on size variables only (a shape's (height + pad) // stride), computed
        # once where the size variables are loaded (the lines so far), not in every loop
        self.size_operations: dict[str, str] = {}
        self.size_line = len(function.lines)
        self.buffer_dtypes = {buffer.name: buffer.dtype for buffer in (*program.inputs, program.output)}
        self._classes: dict[ScalarExpr, str] = {}

    # -- scopes, axes and variables

    def open_scope(self) -> None:
        super().open_scope()
        self.variables.append(dict(self.variables[-1]))

    def close_scope(self) -> None:
        super().close_scope()
        self.variables.pop()

    def declare_axis(self, axis: SizeVar, extent: PrimExpr, local: str) -> None:
        """``axis`` (held in ``local``) lies in ``[0, extent - 1]`` in the current scope."""
        self.variables[-1][axis.name] = local
        super().declare_axis(axis, extent)

    def variable(self, name: str) -> str:
        local = self.variables[-1].get(name)
        if local is None:
            raise ValueError(f"{self.program.name}: the index variable {name} is not in scope")
        return f"(local.get {local})"

    def render_index(self, target: TargetIndex) -> str:
        return render_index(target, self.variable, self.size_operation)

    def size_operation(self, target: Operation) -> str | None:
        """The local holding ``target`` when it reads size variables only (computed once at
        the start: the index helpers never trap); None otherwise."""
        if not index_variables(target) <= set(self.variables[0]):
            return None
        text = render_index(target, self.variable)
        if text not in self.size_operations:
            local = self.function.local("size", "i32")
            self.function.lines.insert(self.size_line, f"  (local.set {local} {text})")
            self.size_line += 1
            self.size_operations[text] = f"(local.get {local})"
        return self.size_operations[text]

    def address(self, buffer_name: str, offset: str) -> str:
        """The byte address of the element at ``offset`` (i32 WAT) of a buffer (4 bytes an
        element, 8 for an int64 one)."""
        base = f"(local.get {self.buffers[buffer_name]})"
        if offset == "(i32.const 0)":
            return base
        return f"(i32.add {base} (i32.shl {offset} (i32.const {element_shift(self.buffer_dtypes[buffer_name])})))"

    def element_address(self, buffer: Buffer, indices: tuple[PrimExpr, ...]) -> str:
        """The address of ``buffer[indices]`` (a negative constant offset, in a branch never
        taken, reads element 0: ``ScalarRenderer.lowered_offset``)."""
        return self.address(buffer.name, self.render_index(self.lowered_offset(buffer, indices)))

    # -- values

    def value_type(self, expr: ScalarExpr) -> str:
        """The wasm type of ``expr``'s value here (a vector emitter's are v128)."""
        return CLASS_TYPES[self.class_of(expr)]

    def class_of(self, expr: ScalarExpr) -> str:
        """The class ``expr``'s value is computed in: its dtype's, except that an integer op
        with an int64 operand is computed in i64 (:func:`joined_class`), and so is a
        reduction of such a body."""
        known = self._classes.get(expr)
        if known is not None:
            return known
        if isinstance(expr, (Binary, Select)):
            cls = joined_class(self.class_of(expr.a), self.class_of(expr.b))
        elif isinstance(expr, Unary) and expr.op is UnaryOp.NEGATIVE:
            cls = self.class_of(expr.a)
        elif isinstance(expr, Reduce):
            cls = self.class_of(expr.body)
        elif isinstance(expr, CheckedInteger):
            cls = self.class_of(expr.value)
        elif isinstance(expr, CheckedDivisor):
            cls = self.class_of(expr.divisor)
        else:
            cls = value_class(expr.dtype)
        self._classes[expr] = cls
        return cls

    def class_operation(self, table: Mapping, op, cls: str) -> Callable[..., str]:
        """The rendering of ``op`` in ``table`` for operands of class ``cls``."""
        return rendering(table, op, cls)

    def operand(self, expr: ScalarExpr, cls: str, indent: str) -> str:
        """The value of ``expr`` as one of class ``cls`` (:func:`coerce`)."""
        return coerce(self.scalar(expr, indent), self.class_of(expr), cls)

    def visit_binary(self, expr: Binary, indent: str) -> str:
        cls = self.class_of(expr)
        a, b = self.operand(expr.a, cls, indent), self.operand(expr.b, cls, indent)
        return self.class_operation(self.binary_renderings, expr.op, cls)(a, b)

    def visit_unary(self, expr: Unary, indent: str) -> str:
        return self.class_operation(self.unary_renderings, expr.op, self.class_of(expr.a))(self.scalar(expr.a, indent))

    def visit_compare(self, expr: Compare, indent: str) -> str:
        cls = joined_class(self.class_of(expr.a), self.class_of(expr.b))
        a, b = self.operand(expr.a, cls, indent), self.operand(expr.b, cls, indent)
        return self.class_operation(self.compare_renderings, expr.op, cls)(a, b)

    def stored(self, buffer: Buffer, expr: ScalarExpr, value: str) -> str:
        """``value`` (of ``expr``) as an element of ``buffer`` takes it."""
        return coerce(value, self.class_of(expr), value_class(buffer.dtype))

    def set_local(self, value: str, kind: str, indent: str, prefix: str = "v") -> str:
        """``value`` computed into a new local; returns the local's value."""
        local = self.function.local(prefix, kind)
        self.function.emit(indent, f"(local.set {local} {value})")
        return f"(local.get {local})"

    def bind_repeated(self, expr: ScalarExpr, value: str, indent: str) -> str:
        """A local holding the value (a local's value is one already)."""
        return value if value.startswith("(local.get") else self.set_local(value, self.value_type(expr), indent)

    def literal(self, value: float, dtype: str) -> str:
        return literal(value, dtype)

    def operation(self, table: Mapping, op, dtype: str) -> Callable[..., str]:
        return rendering(table, op, value_class(dtype))

    def visit_load(self, expr: Load, indent: str) -> str:
        return load(expr.buffer.dtype, self.element_address(expr.buffer, expr.indices))

    def visit_gather(self, expr: Gather, indent: str) -> str:
        return load(expr.buffer.dtype, self.gather_address(expr, indent))

    def visit_cast(self, expr: Cast, indent: str) -> str:
        return cast(expr.dtype, expr.a.dtype, self.scalar(expr.a, indent), self.class_of(expr.a))

    def visit_checked_index(self, expr: CheckedIndex, indent: str) -> str:
        """A call of ``$checked_index_i32`` (``_i64`` for an int64 index) with the run status's
        address (the kernel's last parameter: ``schedules/common.kernel_signature``)."""
        index = self.scalar(expr.index, indent)
        suffix = "i64" if self.class_of(expr.index) == LONG else "i32"
        status = f"(local.get {self.buffers[STATUS_ADDRESS]})"
        return f"(call $checked_index_{suffix} {index} {self.index(expr.extent)} {self.index(expr.site)} {status})"

    def visit_checked_integer(self, expr: CheckedInteger, indent: str) -> str:
        """The operation in i64 through ``$fit_i32`` (a division through ``$checked_div_i32``,
        a cast through ``$checked_cast_*``); a sum or product checks every step.  An operation
        computed in i64 (an int64 one) is exact here: it is only computed."""
        operation, check = expr.value, (self.index(expr.site), f"(local.get {self.buffers[STATUS_ADDRESS]})")
        name = checked_operation(operation)
        if self.class_of(operation) == LONG:
            return self.visit(operation, indent)
        if name in ("sum", "prod"):
            return self.reduce(operation, indent, check)
        if name == "cast":
            source = value_class(operation.a.dtype)
            value = self.scalar(operation.a, indent)
            function = {FLOAT: "$checked_cast_f32", UNSIGNED: "$checked_cast_u32"}.get(source)
            return self.visit_cast(operation, indent) if function is None else f"(call {function} {value} {' '.join(check)})"
        operands = [self.scalar(operand, indent) for operand in scalar_children(operation)]
        if name == "divide":
            return f"(call $checked_div_i32 {' '.join(operands)} {' '.join(check)})"
        return _fit_i32(CHECKED_I64[name](*(f"(i64.extend_i32_s {a})" for a in operands)), check)

    def visit_checked_divisor(self, expr: CheckedDivisor, indent: str) -> str:
        status = f"(local.get {self.buffers[STATUS_ADDRESS]})"
        suffix = "i64" if self.class_of(expr.divisor) == LONG else "i32"
        return f"(call $checked_divisor_{suffix} {self.scalar(expr.divisor, indent)} {self.index(expr.site)} {status})"

    def visit_select(self, expr: Select, indent: str) -> str:
        return self.select(expr, indent)

    def visit_reduce(self, expr: Reduce, indent: str) -> str:
        return self.reduce(expr, indent)

    def gather_address(self, expr: Gather, indent: str) -> str:
        """The address of an indirect load: run-time indices (i32) are clamped into their
        dimension (as on the GPU)."""
        terms: list[str] = []
        constant_part: PrimExpr = IntImm(0)
        stride: PrimExpr = IntImm(1)
        for index, extent in reversed(list(zip(expr.indices, expr.buffer.shape))):
            if isinstance(index, ScalarExpr):
                value = self.scalar(index, indent)
                in_range = isinstance(index, CheckedIndex) and index.extent == extent  # clamped already
                clamp = "$clamp_index_i64" if self.class_of(index) == LONG else "$clamp_index_i32"
                clamped = value if in_range else f"(call {clamp} {value} {self.index(extent)})"
                stride_value = simplify(stride)
                terms.append(clamped if stride_value == IntImm(1) else f"(i32.mul {clamped} {self.index(stride_value)})")
            else:
                constant_part = constant_part + index * stride
            stride = stride * extent
        offset = self.index(constant_part)
        for term in terms:
            offset = term if offset == "(i32.const 0)" else f"(i32.add {offset} {term})"
        return self.address(expr.buffer.name, offset)

    def reduce(self, expr: Reduce, indent: str, check: tuple[str, str] | None = None) -> str:
        """A serial loop accumulating the body over the reduction axis; for a float body that
        reads along the axis contiguously (:func:`vector_reduction`), first a loop of four
        steps at a time into f32x4 partial results (the parts of the body that do not depend
        on the axis computed once, before it), then the remaining steps one by one.  With an
        integer check (its site and the status), each step is computed in i64 and checked."""
        dtype = expr.body.dtype
        cls = self.class_of(expr)
        kind = CLASS_TYPES[cls]
        accumulator = self.function.local("acc", kind)
        axis = self.function.local("r", "i32")
        end = self.function.local("end", "i32")
        number = axis[2:]
        emit = self.function.emit
        emit(indent, f"(local.set {accumulator} {coerce(reduce_identity(expr.combiner, dtype), value_class(dtype), cls)})")
        emit(indent, f"(local.set {end} {self.index(expr.extent)})")
        emit(indent, f"(local.set {axis} (i32.const 0))")
        emit(indent, f"(block $reduced{number}")
        emit(indent, f"  (br_if $reduced{number} (i32.ge_s (local.get {axis}) (local.get {end})))")
        self.open_scope()  # values computed from here on exist only where the range is not empty
        invariants = vector_reduction(expr)
        if invariants is not None:
            self.vector_steps(expr, invariants, accumulator, axis, end, number, indent + "  ")
        else:
            for invariant in invariant_reductions(expr.body, expr.axis.name):  # once, not at every step
                self.scalar(invariant, indent + "  ")
        emit(indent, f"  (loop $reduce{number}")
        inner = indent + "    "
        self.open_scope()
        self.declare_axis(expr.axis, expr.extent, axis)
        body = self.scalar(expr.body, inner)
        self.close_scope()
        self.close_scope()
        combined = rendering(COMBINER_RENDERINGS, expr.combiner, cls)(f"(local.get {accumulator})", body)
        if check is not None and cls != LONG:
            step = CHECKED_I64["add" if expr.combiner is ReduceCombiner.SUM else "multiply"]
            combined = _fit_i32(step(f"(i64.extend_i32_s (local.get {accumulator}))", f"(i64.extend_i32_s {body})"), check)
        emit(inner, f"(local.set {accumulator} {combined})")
        emit(inner, f"(local.set {axis} (i32.add (local.get {axis}) (i32.const 1)))")
        emit(inner, f"(br_if $reduce{number} (i32.lt_s (local.get {axis}) (local.get {end})))))")
        return f"(local.get {accumulator})"

    def vector_steps(self, expr: Reduce, invariants: list[ScalarExpr], accumulator: str, axis: str, end: str,
                     number: str, indent: str) -> None:
        """The reduction's steps four at a time, while four remain, into ``accumulator``
        (its lanes combined at the end); leaves ``axis`` at the first step not taken."""
        emit = self.function.emit
        splats = {}
        for invariant in invariants:  # computed once, as scalars (the steps one by one reuse them)
            value = self.scalar(invariant, indent)
            if not value.startswith("(local.get"):
                value = self.set_local(value, "f32", indent)
                self.known(invariant, value)
            splats[invariant] = self.set_local(f"(f32x4.splat {value})", "v128", indent, "splat")
        vector = self.function.local("accv", "v128")
        combine = VECTOR_COMBINER_RENDERINGS[expr.combiner]
        emit(indent, f"(local.set {vector} (f32x4.splat {reduce_identity(expr.combiner, expr.body.dtype)}))")
        four_more = f"(i32.add (local.get {axis}) (i32.const 4))"
        emit(indent, f"(block $vectors{number}")
        emit(indent, f"  (br_if $vectors{number} (i32.gt_s {four_more} (local.get {end})))")
        emit(indent, f"  (loop $vector{number}")
        inner = indent + "    "
        self.open_scope()
        self.declare_axis(expr.axis, expr.extent, axis)
        body = self.vector_value(expr.body, splats, {}, inner)
        self.close_scope()
        emit(inner, f"(local.set {vector} {combine(f'(local.get {vector})', body)})")
        emit(inner, f"(local.set {axis} {four_more})")
        emit(inner, f"(br_if $vector{number} (i32.le_s {four_more} (local.get {end})))))")
        lanes = [f"(f32x4.extract_lane {lane} (local.get {vector}))" for lane in range(4)]
        scalar = rendering(COMBINER_RENDERINGS, expr.combiner, FLOAT)
        emit(indent, f"(local.set {accumulator} {scalar(scalar(lanes[0], lanes[1]), scalar(lanes[2], lanes[3]))})")
        emit(indent, f"(br_if $reduced{number} (i32.ge_s (local.get {axis}) (local.get {end})))")

    def vector_value(self, expr: ScalarExpr, splats: Mapping[ScalarExpr, str], memo: dict, indent: str) -> str:
        """The f32x4 value of a reduction body at four consecutive steps (the axis's local
        holds the first): loads along the axis are ``v128.load``, invariants their splats
        (``splats`` maps any subexpression to a v128 value already computed: also the lanes
        of a packed factor, ``schedules._pack_vectors``).  Comparisons of floats are lane
        masks and a ``Select`` is a ``v128.bitselect`` of both branches.  ``memo`` holds the
        values computed so far (a repeated subexpression's in a local)."""
        return _ReductionLanes(self, splats, memo, indent).value(expr)

    def select(self, expr: Select, indent: str) -> str:
        """wasm's ``select`` when both branches are cheap and read no memory (it evaluates
        both), else an ``if`` into a local, so that only the chosen branch is evaluated (a
        branch may load out of bounds where it is not chosen: a concat, a padded
        convolution's input)."""
        cls = self.class_of(expr)
        kind = CLASS_TYPES[cls]
        if is_branch_free(expr.a) and is_branch_free(expr.b):
            condition = self.scalar(expr.condition, indent)
            # wasm's select evaluates both branches: free of loads and traps, each computes
            # anything harmlessly where its condition's bounds do not hold
            a, b = (self.branch_value(expr.condition, holds, lambda branch=branch: self.operand(branch, cls, indent))
                    for branch, holds in ((expr.a, True), (expr.b, False)))
            return f"(select {a} {b} {condition})"
        return self.branch_into_local(expr, self.scalar(expr.condition, indent), kind, indent)

    def branch_into_local(self, expr: Select, condition: str, kind: str, indent: str) -> str:
        """An ``if`` on ``condition`` that sets a new local of type ``kind`` to the chosen
        branch's value (each branch in its scope, with the bounds it puts on the axes)."""
        cls = self.class_of(expr)
        result = self.function.local("sel", kind)
        emit = self.function.emit
        emit(indent, f"(if {condition}")
        for branch, label in ((expr.a, "then"), (expr.b, "else")):
            emit(indent, f"  ({label}")
            self.open_branch(expr.condition, label == "then")
            value = self.operand(branch, cls, indent + "    ")
            self.close_scope()
            emit(indent, f"    (local.set {result} {value}))")
        self.function.lines[-1] += ")"
        return f"(local.get {result})"


class _ReductionLanes(ScalarFunctor):
    """:meth:`Emitter.vector_value`: the f32x4 value of each node of a reduction body."""

    def __init__(self, emitter: Emitter, splats: Mapping[ScalarExpr, str], memo: dict, indent: str) -> None:
        self.emitter, self.splats, self.memo, self.indent = emitter, splats, memo, indent

    def value(self, expr: ScalarExpr) -> str:
        if expr in self.splats:
            return self.splats[expr]
        if expr in self.memo:
            return self.memo[expr]
        text = self.visit(expr)
        if expr in self.emitter.repeated:
            text = self.emitter.set_local(text, "v128", self.indent)
        self.memo[expr] = text
        return text

    def visit_load(self, expr: Load) -> str:
        return f"(v128.load {self.emitter.element_address(expr.buffer, expr.indices)})"

    def visit_float_imm(self, expr: FloatImm) -> str:
        return f"(f32x4.splat {literal(expr.value, expr.dtype)})"

    def visit_binary(self, expr: Binary) -> str:
        a, b = self.value(expr.a), self.value(expr.b)
        return rendering(VECTOR_BINARY_RENDERINGS, expr.op)(a, b)

    def visit_unary(self, expr: Unary) -> str:
        return rendering(VECTOR_UNARY_RENDERINGS, expr.op)(self.value(expr.a))

    def visit_compare(self, expr: Compare) -> str:
        if expr.a.dtype != "float32":
            return self.visit_default(expr)
        a, b = self.value(expr.a), self.value(expr.b)
        return rendering(VECTOR_COMPARE_RENDERINGS, expr.op)(a, b)

    def visit_select(self, expr: Select) -> str:  # callers check that both branches may be evaluated
        return vector_select(self.value(expr.condition), self.value(expr.a), self.value(expr.b))

    def visit_default(self, expr: ScalarExpr) -> str:
        raise TypeError(f"{self.emitter.program.name}: cannot vectorize {type(expr).__name__} along a reduction")


def f32x4_of(values: Sequence[str]) -> str:
    """An f32x4 of four f32 values."""
    vector = f"(f32x4.splat {values[0]})"
    for n in range(1, 4):
        vector = f"(f32x4.replace_lane {n} {vector} {values[n]})"
    return vector


class VectorEmitter(Emitter):
    """An emitter of four consecutive output elements along the last axis at once, for a
    float32 elementwise or broadcast program (``relaxweb/ir/launch.vector_access``: loads,
    constants, binary and unary ops).  ``access`` says how each buffer is read: four
    consecutive elements (``v128.load``), one element for all four lanes (a splat), or each
    lane's own element (four ``f32.load``s into the lanes).  The last axis's local holds the
    first of the four."""

    binary_renderings = VECTOR_BINARY_RENDERINGS
    unary_renderings = VECTOR_UNARY_RENDERINGS

    def __init__(self, program: TensorProgram, function: Function, buffers: Mapping[str, str],
                 variables: Mapping[str, str], access: Mapping[str, str]) -> None:
        super().__init__(program, function, buffers, variables)
        self.access = dict(access)

    def value_type(self, expr: ScalarExpr) -> str:
        return "v128"

    def operation(self, table: Mapping, op, dtype: str) -> Callable[..., str]:
        return rendering(table, op)

    def class_operation(self, table: Mapping, op, cls: str) -> Callable[..., str]:
        return rendering(table, op)

    def visit_load(self, expr: Load, indent: str) -> str:
        access = self.access[expr.buffer.name]
        if access == LANES:  # each lane's element: the last axis's local plus the lane
            last = self.program.axes[-1]
            lanes = [tuple(simplify(substitute(i, {last.name: last + lane})) for i in expr.indices) for lane in range(4)]
            return f32x4_of([f"(f32.load {self.element_address(expr.buffer, indices)})" for indices in lanes])
        address = self.element_address(expr.buffer, expr.indices)
        if access == VECTOR:
            return f"(v128.load {address})"
        return f"(f32x4.splat (f32.load {address}))"

    def visit_float_imm(self, expr: FloatImm, indent: str) -> str:
        return f"(f32x4.splat {literal(expr.value, expr.dtype)})"

    def visit_select(self, expr: Select, indent: str) -> str:
        """The chosen branch's four lanes: the condition is the same for all four
        (``launch.lane_invariant``), computed once as a scalar."""
        return self.branch_into_local(expr, self.lane_condition(expr.condition, indent), "v128", indent)

    def lane_condition(self, condition: ScalarExpr, indent: str) -> str:
        """A condition over index values only, rendered by the scalar :class:`Emitter` on this
        emitter's state (the same function, scopes, axes in scope and locals): an ``i32``."""
        scalar = object.__new__(Emitter)
        scalar.__dict__ = self.__dict__  # the same attributes, not a copy: what it changes, this sees
        return scalar.scalar(condition, indent)

    def cannot_vectorize(self, expr: ScalarExpr, indent: str) -> str:
        raise TypeError(f"{self.program.name}: cannot vectorize {type(expr).__name__}")

    visit_gather = visit_index_value = visit_cast = visit_compare = visit_reduce = cannot_vectorize


def invariant_reductions(body: ScalarExpr, axis: str) -> list[ScalarExpr]:
    """The largest parts of a reduction's body that do not depend on its axis and contain a
    reduction of their own (a fused softmax's row max inside its sum), outside any Select
    branch (those run only where chosen): computed once before the loop, not at every step."""
    found: list[ScalarExpr] = []

    def visit(node: ScalarExpr) -> None:
        if isinstance(node, Select):
            return
        if not depends_on(node, axis) and contains_reduce(node):
            if node not in found:
                found.append(node)
            return
        for child in scalar_children(node):
            visit(child)

    visit(body)
    return found


VECTOR_COMBINER_RENDERINGS: dict[ReduceCombiner, Callable[[str, str], str]] = {
    ReduceCombiner.SUM: _op("f32x4.add"),
    ReduceCombiner.PROD: _op("f32x4.mul"),
    ReduceCombiner.MAX: _op("f32x4.max"),
    ReduceCombiner.MIN: _op("f32x4.min"),
}


def vector_reduction(expr: Reduce) -> list[ScalarExpr] | None:
    """The parts of a reduction's body that do not depend on its axis (computed once and
    splatted), when the rest can run four steps at a time: a float32 body whose nodes that
    depend on the axis are constants, ops with f32x4 forms, and float32 loads that read along
    the axis contiguously (it appears in their last index only, plus something that does not
    depend on it).  None otherwise."""
    axis = expr.axis.name
    if expr.body.dtype != "float32" or expr.combiner not in VECTOR_COMBINER_RENDERINGS:
        return None
    invariants: list[ScalarExpr] = []

    def visit(node: ScalarExpr) -> bool:
        if not depends_on(node, axis):
            if node.dtype != "float32":
                return False
            if not isinstance(node, FloatImm) and node not in invariants:
                invariants.append(node)
            return True
        if isinstance(node, Load):
            *others, last = node.indices
            offset = simplify(last - expr.axis)
            return (node.buffer.dtype == "float32" and axis not in {v.name for v in free_vars(offset)}
                    and not any(axis in {v.name for v in free_vars(index)} for index in others))
        if isinstance(node, Binary) and node.op in VECTOR_BINARY_RENDERINGS:
            return visit(node.a) and visit(node.b)
        if isinstance(node, Unary) and node.op in VECTOR_UNARY_RENDERINGS:
            return visit(node.a)
        return False

    return invariants if visit(expr.body) else None


BRANCH_FREE_NODES = 16  # the most nodes a select's branch may have to be evaluated unconditionally


def is_branch_free(expr: ScalarExpr) -> bool:
    """Few nodes, no memory read, no reduction and no error check: evaluated whether chosen or
    not (wasm's ``select``).  Index values may divide: the index helpers never trap."""
    nodes = 0
    for node in scalar_nodes(expr):
        nodes += 1
        if isinstance(node, (Load, Gather, Reduce)) or nodes > BRANCH_FREE_NODES or node.scalar_kind in REPORTING_KINDS:
            return False
    return True


def load(dtype: str, address: str) -> str:
    """The register value of a buffer element of ``dtype`` (a bool is stored as u32 0 / 1, an
    int64 as i64)."""
    if dtype_info(dtype).kind is DtypeKind.BOOL:
        return f"(i32.ne (i32.load {address}) (i32.const 0))"
    return f"({wasm_type(dtype)}.load {address})"


def store(dtype: str, address: str, value: str) -> str:
    """The statement storing a register value into a buffer element of ``dtype``."""
    return f"({wasm_type(dtype)}.store {address} {value})"


def cast(target: str, source: str, value: str, source_class: str | None = None) -> str:
    """``value`` (of ``source``, computed in ``source_class``: by default its dtype's)
    converted to ``target`` as the WGSL backend converts (like numpy's astype, in 32 bits, or
    64 for int64): float to integer saturates toward zero, an integer narrower than its value
    keeps its low bits (sign-extended for signed ones), float16 rounds to half precision, a
    bool is ``value != 0``."""
    to, frm = dtype_info(target), value_class(source) if source_class is None else source_class
    if to.kind is DtypeKind.BOOL:
        if dtype_info(source).kind is DtypeKind.BOOL:
            return value
        kind = CLASS_TYPES[frm]
        return f"({kind}.ne {value} ({kind}.const 0))"
    if to.is_float:
        if frm != FLOAT:
            value = f"(f32.convert_{CLASS_TYPES[frm]}_{'u' if frm == UNSIGNED else 's'} {value})"
        return f"(call $round_half_f32 {value})" if to.bytes < to.device_bytes else value
    if value_class(target) == LONG:
        return f"(i64.trunc_sat_f32_s {value})" if frm == FLOAT else coerce(value, frm, LONG)
    if frm == LONG:
        value, frm = f"(i32.wrap_i64 {value})", SIGNED
    narrow = to.bytes < to.device_bytes
    if frm == FLOAT:
        signed = to.kind is DtypeKind.INT or narrow  # a narrow unsigned target keeps the low bits of an i32
        value = f"(i32.trunc_sat_f32_{'s' if signed else 'u'} {value})"
    if not narrow:
        return value
    if to.kind is DtypeKind.INT:
        return f"(i32.extend{8 * to.bytes}_s {value})"
    return f"(i32.and {value} (i32.const {2 ** (8 * to.bytes) - 1}))"


