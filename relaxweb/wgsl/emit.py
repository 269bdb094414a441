"""The expression emitter of the WGSL backend: scalar expressions, index arithmetic, loads
and stores of a tensor program, written into a shader's ``main`` as WGSL statements.

Each schedule's renderer (``schedules.py``) drives an :class:`Emitter`: it lays out the
invocations and asks the emitter for the value of the body (or of parts of it); ``shader.py``
puts the bindings and the rendered ``main`` together.  Index arithmetic is i32 (WGSL has no
64-bit integers; shape arithmetic stays on the host), lowered from the IR's floor division
and modulo by ``lower_index.py``; size variables are read from the uniform params block, so
one shader serves every shape.
"""

from __future__ import annotations

from typing import Callable

from ..ir.symbolic import FloorDiv, FloorMod, IntImm, PrimExpr, SizeVar, simplify
from ..ir.tir import (
    COMPARE_OPS, Binary, Buffer, Cast, Compare, FloatImm, Gather, IndexValue, Load, Reduce, ScalarExpr, Select,
    TensorProgram, Unary, scalar_children, scalar_dtype,
)
from .lower_index import Constant, IndexLowering, render_wgsl

# Storage types of buffer elements. WGSL has no 64-bit integers: int64 tensors live on the
# device as i32 (the runtimes check the range at the boundary) and bool tensors as u32 0/1.
# The device dtype of each tensor dtype (relaxweb/bundle.py DEVICE_DTYPES): float16 and
# float64 are f32, narrow ints and int64 are i32 / u32, bool is u32 0/1.
WGSL_TYPES = {
    "float32": "f32", "float16": "f32", "float64": "f32",
    "int32": "i32", "int16": "i32", "int8": "i32", "int64": "i32",
    "uint32": "u32", "uint16": "u32", "uint8": "u32", "bool": "u32",
}
# Types of values in registers: a bool is a WGSL bool (a load converts, a store selects 0u/1u).
SCALAR_TYPES = {**WGSL_TYPES, "bool": "bool"}
# Identities of max / min (an empty range reduces to them, as ONNX wants: -inf / +inf for
# floats).  WGSL has no infinity literal and Tint rejects a constant expression that makes
# one, so the float identities are bit casts of a value the compiler cannot fold: the
# params block's first field, masked to zero.  A float max / min still takes its first
# element as the start (see combine), so a non-empty row never depends on them.
_RUNTIME_ZERO = "(u32(params.element_count) & 0u)"
LOWEST = {"float32": f"bitcast<f32>(0xff800000u | {_RUNTIME_ZERO})", "int32": "i32(-2147483648)",
          "int64": "i32(-2147483648)", "uint32": "0u"}
HIGHEST = {"float32": f"bitcast<f32>(0x7f800000u | {_RUNTIME_ZERO})", "int32": "2147483647",
           "int64": "2147483647", "uint32": "4294967295u"}

# WGSL's keywords and reserved words (spec, "Keyword and reserved word list"), plus the
# predeclared type names and our own field name; a model's size variable with one of these
# names gets a trailing underscore in the shader.
RESERVED = set("""
alias break case const const_assert continue continuing default diagnostic discard else
enable false fn for if let loop override requires return struct switch true var while
NULL Self abstract active alignas alignof as asm asm_fragment async attribute auto await
become binding_array cast catch class co_await co_return co_yield coherent column_major
common compile compile_fragment concept const_cast consteval constexpr constinit crate
debugger decltype delete demote demote_to_helper do dynamic_cast enum explicit export
extends extern external fallthrough filter final finally friend from fxgroup get goto
groupshared highp impl implements import inline instanceof interface layout lowp macro
macro_rules match mediump meta mod module move mut mutable namespace new nil noexcept
noinline nointerpolation noperspective null nullptr of operator package packoffset
partition pass patch pixelfragment precise precision premerge priv protected pub public
readonly ref regardless register reinterpret_cast require resource restrict self set
shared sizeof smooth snorm static static_assert static_cast std subroutine super target
template this thread_local throw trait try type typedef typeid typename typeof union
unless unorm unsafe unsized use using varying virtual volatile wgsl where with writeonly
yield
array atomic bool f16 f32 i32 u32 mat2x2 mat2x3 mat2x4 mat3x2 mat3x3 mat3x4 mat4x2 mat4x3
mat4x4 ptr sampler sampler_comparison vec2 vec3 vec4 element_count
""".split())


def wgsl_name(name: str) -> str:
    """A valid WGSL identifier for a name from the model (never '__'-led, never reserved)."""
    if name.startswith("__"):
        name = "v" + name
    return f"{name}_" if name in RESERVED else name


def storage_type(dtype: str) -> str:
    try:
        return WGSL_TYPES[dtype]
    except KeyError:
        raise NotImplementedError(f"dtype {dtype} has no WGSL type in relaxweb yet") from None


class Emitter:
    """Writes the statements of a shader's main function (``statements``) and turns scalar
    expressions into WGSL; schedules drive it (``schedules.py``).

    A subexpression that occurs more than once in the body (fusion inlines a producer at
    every load of it) is computed once into a ``let`` and reused within the scope that
    computed it; a scope is opened for each loop body and each branch.  ``known`` may name
    the WGSL value of an expression up front (a schedule's accumulated reduction).

    Index expressions go through the shader's :class:`IndexLowering`, which knows the range
    of each axis in scope: :meth:`unflatten` and :meth:`reduce` declare the axes they set,
    a schedule declares its own (:meth:`declare_axis`).
    """

    def __init__(self, program: TensorProgram, size_vars: set[str]) -> None:
        self.program = program
        self.size_vars = size_vars
        self.statements: list[str] = []
        self.accumulators = 0
        self.selections = 0
        self.values = 0
        self.repeated = _repeated_subexpressions(program.body)
        self.scopes: list[dict[ScalarExpr, str]] = [{}]
        self.cooperative: Callable[[Reduce, str], str] | None = None  # a schedule's top-level reductions
        self.index_lowering = IndexLowering()

    def open_scope(self) -> None:
        self.scopes.append({})
        self.index_lowering.enter()

    def close_scope(self) -> None:
        self.scopes.pop()
        self.index_lowering.leave()

    def declare_axis(self, axis: SizeVar, extent: PrimExpr) -> None:
        """``axis`` lies in ``[0, extent - 1]`` in the current scope (for the index lowering)."""
        self.index_lowering.declare_axis(axis, extent)

    def known(self, expr: ScalarExpr, value: str) -> None:
        self.scopes[-1][expr] = value

    def lookup(self, expr: ScalarExpr) -> str | None:
        for scope in reversed(self.scopes):
            if expr in scope:
                return scope[expr]
        return None

    def unflatten(self, axes, extents, linear: str, indent: str) -> list[str]:
        """Statements recovering ``axes`` (row-major over ``extents``) from a linear index
        (>= 0, below the product of the extents), declaring each axis's range."""
        axes, extents = list(axes), list(extents)
        if not axes:
            return []
        rest = SizeVar(f"rest_{axes[0].name}")  # >= 0, as every variable the lowering does not know
        lines = [f"{indent}var {rest.name} = {linear};"]
        for axis, extent in reversed(list(zip(axes[1:], extents[1:]))):
            extent = simplify(extent)
            self.declare_axis(axis, extent)
            if extent in (IntImm(0), IntImm(1)):  # (an extent of 0 has no element: never reached)
                lines.append(f"{indent}let {axis.name} = 0;")
                continue
            lines.append(f"{indent}let {axis.name} = {_unwrapped(self.index(FloorMod(rest, extent)))};")
            lines.append(f"{indent}{rest.name} = {_unwrapped(self.index(FloorDiv(rest, extent)))};")
        self.declare_axis(axes[0], extents[0])
        lines.append(f"{indent}let {axes[0].name} = {rest.name};")
        return lines

    def output_offset(self) -> str:
        """The output element's offset, from the output axes."""
        return self.offset(self.program.output, tuple(self.program.axes))

    def index(self, expr: PrimExpr) -> str:
        """An i32 WGSL expression of axes and size variables: simplified with the ranges of
        the axes in scope, the IR's floor division and modulo lowered
        (``relaxweb/wgsl/lower_index.py``)."""
        return render_wgsl(self.index_lowering.lower(expr), self.variable)

    def variable(self, name: str) -> str:
        """A variable of an index expression in the shader: a size variable from the params
        block, an axis or index variable by its name."""
        return f"params.{wgsl_name(name)}" if name in self.size_vars else name

    def offset(self, buffer: Buffer, indices: tuple[PrimExpr, ...]) -> str:
        """The element offset of ``buffer[indices]`` (row-major).

        A load is in bounds wherever it is evaluated, so an offset that is a negative
        constant belongs to a Select branch never taken (``A[(i - 3) // 4]`` is ``A[-1]``
        for an axis of extent 2); WGSL rejects a negative constant index when the shader is
        created, so such a load reads element 0 instead."""
        flat: PrimExpr = IntImm(0)
        stride: PrimExpr = IntImm(1)
        for index, extent in reversed(list(zip(indices, buffer.shape))):
            flat = flat + index * stride
            stride = stride * extent
        target = self.index_lowering.lower(flat)
        if isinstance(target, Constant) and target.value < 0:
            target = Constant(0)
        return _unwrapped(render_wgsl(target, self.variable))

    def scalar(self, expr: ScalarExpr, indent: str) -> str:
        known = self.lookup(expr)
        if known is not None:
            return known
        text = self._scalar(expr, indent)
        if expr in self.repeated and not isinstance(expr, (Reduce, Select)):
            name = f"v{self.values}"
            self.values += 1
            self.statements.append(f"{indent}let {name} = {text};")
            text = name
        self.known(expr, text)
        return text

    def _scalar(self, expr: ScalarExpr, indent: str) -> str:
        if isinstance(expr, Load):
            return _from_storage(expr.buffer.dtype, f"{wgsl_name(expr.buffer.name)}[{self.offset(expr.buffer, expr.indices)}]")
        if isinstance(expr, Gather):
            return _from_storage(expr.buffer.dtype, self.gather(expr, indent))
        if isinstance(expr, FloatImm):
            return literal(expr.value, expr.dtype)
        if isinstance(expr, IndexValue):
            return self.index(expr.value)
        if isinstance(expr, Cast):
            # Like numpy's astype: narrow ints keep their low bits (floats truncated toward
            # zero first), float16 rounds to half precision; the value stays in 32 bits.
            value = self.scalar(expr.a, indent)
            bits = {"int8": 8, "int16": 16, "uint8": 8, "uint16": 16}.get(expr.dtype)
            if bits is not None:
                whole = f"i32({value})" if scalar_dtype(expr.a).startswith("float") else value
                return f"extractBits({_scalar_type(expr.dtype)}({whole}), 0u, {bits}u)"
            if expr.dtype == "float16":
                return f"unpack2x16float(pack2x16float(vec2<f32>(f32({value}), 0.0))).x"
            return f"{_scalar_type(expr.dtype)}({value})"
        if isinstance(expr, Compare):
            a, b = self.scalar(expr.a, indent), self.scalar(expr.b, indent)
            return f"({a} {COMPARE_OPS[expr.op]} {b})"
        if isinstance(expr, Select):
            return self.select(expr, indent)
        if isinstance(expr, Binary):
            a, b = self.scalar(expr.a, indent), self.scalar(expr.b, indent)
            infix = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/"}
            if expr.op in infix:
                return f"({a} {infix[expr.op]} {b})"
            if expr.op == "power":
                return f"pow({a}, {b})"  # undefined for a negative base (WGSL spec)
            return f"{'max' if expr.op == 'maximum' else 'min'}({a}, {b})"
        if isinstance(expr, Unary):
            a = self.scalar(expr.a, indent)
            if expr.op == "negative":
                return f"(-{a})"
            if expr.op == "sigmoid":
                return f"(1.0 / (1.0 + exp(-{a})))"
            if expr.op == "is_nan":  # exponent all ones and a non-zero mantissa
                return f"((bitcast<u32>({a}) & 0x7fffffffu) > 0x7f800000u)"
            return f"{expr.op}({a})"
        if isinstance(expr, Reduce):
            if self.cooperative is not None and len(self.scopes) == 1:
                return self.cooperative(expr, indent)
            return self.reduce(expr, indent)
        raise TypeError(f"cannot emit {type(expr).__name__}")

    def gather(self, expr: Gather, indent: str) -> str:
        """An indirect load: run-time indices (i32) are clamped into their dimension."""
        terms = []
        stride: PrimExpr = IntImm(1)
        for index, extent in reversed(list(zip(expr.indices, expr.buffer.shape))):
            if isinstance(index, ScalarExpr):
                value = self.scalar(index, indent)
                text = f"clamp(i32({value}), 0, {self.index(extent - 1)})"
            else:
                text = self.index(index)
            stride_text = self.index(stride)
            terms.append(text if stride_text == "1" else f"{text} * {stride_text}")
            stride = stride * extent
        return f"{wgsl_name(expr.buffer.name)}[{' + '.join(reversed(terms)) or '0'}]"

    def reduce(self, expr: Reduce, indent: str) -> str:
        name = f"acc{self.accumulators}"
        self.accumulators += 1
        dtype = scalar_dtype(expr.body)
        initial = reduce_identity(expr.combiner, dtype)
        axis = expr.axis.name
        self.statements.append(f"{indent}var {name}: {storage_type(dtype)} = {initial};")
        self.statements.append(
            f"{indent}for (var {axis}: i32 = 0; {axis} < {self.index(expr.extent)}; {axis} = {axis} + 1) {{"
        )
        self.open_scope()
        self.declare_axis(expr.axis, expr.extent)
        body = self.scalar(expr.body, indent + "  ")
        self.close_scope()
        self.statements.append(f"{indent}  {name} = {combine(expr.combiner, dtype, name, body, f'{axis} == 0')};")
        self.statements.append(f"{indent}}}")
        return name

    def select(self, expr: Select, indent: str) -> str:
        """An if/else into a variable, so that only the chosen branch is evaluated (a branch
        may load out of bounds where it is not chosen, e.g. the inputs of a concat)."""
        name = f"sel{self.selections}"
        self.selections += 1
        condition = self.scalar(expr.condition, indent)
        self.statements.append(f"{indent}var {name}: {_scalar_type(scalar_dtype(expr.a))};")
        self.statements.append(f"{indent}if ({condition}) {{")
        self.open_scope()
        a = self.scalar(expr.a, indent + "  ")
        self.close_scope()
        self.statements.append(f"{indent}  {name} = {a};")
        self.statements.append(f"{indent}}} else {{")
        self.open_scope()
        b = self.scalar(expr.b, indent + "  ")
        self.close_scope()
        self.statements.append(f"{indent}  {name} = {b};")
        self.statements.append(f"{indent}}}")
        return name


def combine(combiner: str, dtype: str, accumulator: str, value: str, first: str) -> str:
    """``accumulator`` combined with ``value``; a float max / min takes the value as it is
    where ``first`` (a WGSL bool) holds, so that infinities need no constant."""
    if combiner in ("sum", "prod"):
        return f"{accumulator} {'+' if combiner == 'sum' else '*'} {value}"
    update = f"{combiner}({accumulator}, {value})"
    if dtype.startswith("float"):
        update = f"select({update}, {value}, {first})"
    return update


def reduce_identity(combiner: str, dtype: str) -> str:
    """The WGSL start value of a reduction (an empty range reduces to it)."""
    if combiner in ("sum", "prod"):
        return literal(0 if combiner == "sum" else 1, dtype)
    return (LOWEST if combiner == "max" else HIGHEST).get(dtype, literal(0, dtype))


def _repeated_subexpressions(body: ScalarExpr) -> set[ScalarExpr]:
    """Subexpressions (not constants) that occur more than once in ``body``."""
    counts: dict[ScalarExpr, int] = {}

    def visit(expr: ScalarExpr) -> None:
        if isinstance(expr, (FloatImm, IndexValue)):
            return
        counts[expr] = counts.get(expr, 0) + 1
        if counts[expr] == 1:
            for child in scalar_children(expr):
                visit(child)

    visit(body)
    return {expr for expr, count in counts.items() if count > 1}


def _from_storage(dtype: str, element: str) -> str:
    """The register value of a loaded buffer element (a bool is stored as u32 0/1)."""
    return f"({element} != 0u)" if dtype == "bool" else element


def to_storage(dtype: str, value: str) -> str:
    """The buffer element storing a register value (a bool becomes u32 0/1)."""
    return f"select(0u, 1u, {value})" if dtype == "bool" else value


def _scalar_type(dtype: str) -> str:
    try:
        return SCALAR_TYPES[dtype]
    except KeyError:
        raise NotImplementedError(f"dtype {dtype} has no WGSL type in relaxweb yet") from None


def literal(value: float, dtype: str) -> str:
    """A WGSL constant of ``dtype``."""
    if dtype in ("float32", "float16", "float64"):  # all f32 on the device
        text = repr(float(value))
        if text in ("inf", "-inf", "nan"):
            raise ValueError(f"WGSL has no literal for {text}")
        return text if "e" in text or "." in text else text + ".0"
    if dtype == "int64":  # int64 values are i32 on the device: saturate (e.g. INT64_MAX sentinels)
        value = min(max(int(value), -2**31), 2**31 - 1)
        return f"{value}" if value >= 0 else f"i32({value})"
    if dtype in ("int32", "int16", "int8"):
        return f"{int(value)}" if int(value) >= 0 else f"({int(value)})"
    if dtype in ("uint32", "uint16", "uint8"):
        return f"{int(value)}u"
    if dtype == "bool":
        return "true" if value else "false"
    raise NotImplementedError(f"dtype {dtype} has no WGSL type in relaxweb yet")


def _unwrapped(text: str) -> str:
    """The text without the parentheses around all of it, if any."""
    return text[1:-1] if _is_wrapped(text) else text


def _is_wrapped(text: str) -> bool:
    """True when the whole text is one parenthesised group."""
    if not (text.startswith("(") and text.endswith(")")):
        return False
    depth = 0
    for position, char in enumerate(text):
        depth += char == "("
        depth -= char == ")"
        if depth == 0 and position < len(text) - 1:
            return False
    return True

