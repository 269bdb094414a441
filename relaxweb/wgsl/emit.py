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

from typing import Callable, Mapping

from ..ir.dtype import DtypeKind, dtype_info
from ..ir.error_sites import STATUS_WORDS
from ..ir.integer_checks import CheckedDivisor, CheckedInteger, checked_operation
from ..ir.scalar_renderer import ScalarRenderer
from ..ir.schedule_fit import is_cheap_branch  # also what a CPU adapter's register matmul needs of its factors
from ..ir.symbolic import FloorDiv, FloorMod, IntImm, PrimExpr, SizeVar, simplify
from ..ir.tir import (
    Binary, BinaryOp, Buffer, Cast, CheckedIndex, Compare, CompareOp, Gather, Load, Reduce, ReduceCombiner,
    ScalarExpr, Select, TensorProgram, UnaryOp, scalar_children, scalar_dtype, scalar_nodes,
)
from .lower_index import TargetIndex, render_wgsl

# The WGSL type of each device dtype (``relaxweb/ir/dtype.py`` says which device dtype a
# tensor dtype has: int64 is int32 on the device, bool uint32 0/1, float16 float32 ...).
WGSL_TYPES = {"float32": "f32", "int32": "i32", "uint32": "u32"}
# Identities of max / min of the device dtypes (an empty range reduces to them, as ONNX
# wants: -inf / +inf for floats).  WGSL has no infinity literal and Tint rejects a constant
# expression that makes one, so the float identities are bit casts of a value the compiler
# cannot fold: the params block's first field, masked to zero.  A float max / min still
# takes its first element as the start (see combine), so a non-empty row never depends on
# them.  Narrower integer dtypes start from their own extremes (reduce_identity).
_RUNTIME_ZERO = "(u32(params.element_count) & 0u)"
LOWEST = {"float32": f"bitcast<f32>(0xff800000u | {_RUNTIME_ZERO})", "int32": "i32(-2147483648)", "uint32": "0u"}
HIGHEST = {"float32": f"bitcast<f32>(0x7f800000u | {_RUNTIME_ZERO})", "int32": "2147483647", "uint32": "4294967295u"}

# The float max / min, by op or combiner (see float_extremum).
_EXTREMA = {BinaryOp.MAXIMUM: "max", BinaryOp.MINIMUM: "min", ReduceCombiner.MAX: "max", ReduceCombiner.MIN: "min"}


def is_nan(value: str, float_type: str = "f32") -> str:
    """Whether a float (or each lane of a float vector) is NaN, from its bit pattern: exponent
    all ones and a non-zero mantissa (WGSL lets compilers assume ``x == x``)."""
    if float_type == "f32":
        return f"((bitcast<u32>({value}) & 0x7fffffffu) > 0x7f800000u)"
    bits = float_type.replace("f32", "u32")
    return f"((bitcast<{bits}>({value}) & {bits}(0x7fffffffu)) > {bits}(0x7f800000u))"


def float_extremum(op: BinaryOp | ReduceCombiner, a: str, b: str, float_type: str = "f32") -> str:
    """The float max / min of ``a`` and ``b`` (names or short expressions: each is written
    three times), NaN when either is NaN, as numpy, onnxruntime and IEEE 754-2019's
    maximum / minimum give.  WGSL leaves ``max`` and ``min`` of a NaN unspecified (Vulkan's
    lavapipe returns the other operand, so relu(NaN) would be 0): every float max / min of the
    backend (elementwise ops, reductions, pools) is written here."""
    plain = f"{_EXTREMA[op]}({a}, {b})"
    return f"select(select({plain}, {b}, {is_nan(b, float_type)}), {a}, {is_nan(a, float_type)})"


# How each op of the scalar IR is written in WGSL, from its operands' WGSL text.  Every op
# has an entry (tests/ir/test_scalar_expr.py checks): an op without one is an error, never a guess.
BINARY_RENDERINGS: dict[BinaryOp, Callable[[str, str], str]] = {
    BinaryOp.ADD: lambda a, b: f"({a} + {b})",
    BinaryOp.SUBTRACT: lambda a, b: f"({a} - {b})",
    BinaryOp.MULTIPLY: lambda a, b: f"({a} * {b})",
    BinaryOp.DIVIDE: lambda a, b: f"({a} / {b})",
    BinaryOp.MAXIMUM: lambda a, b: f"max({a}, {b})",  # integers; floats: float_extremum
    BinaryOp.MINIMUM: lambda a, b: f"min({a}, {b})",
    BinaryOp.POWER: lambda a, b: f"pow({a}, {b})",  # undefined for a negative base (WGSL spec)
    BinaryOp.BITWISE_AND: lambda a, b: f"({a} & {b})",
    BinaryOp.BITWISE_OR: lambda a, b: f"({a} | {b})",
    BinaryOp.BITWISE_XOR: lambda a, b: f"({a} ^ {b})",
    BinaryOp.SHIFT_RIGHT: lambda a, b: f"({a} >> u32({b}))",  # WGSL shifts by a u32
}
UNARY_RENDERINGS: dict[UnaryOp, Callable[[str], str]] = {
    UnaryOp.NEGATIVE: lambda a: f"(-{a})",
    UnaryOp.SIGMOID: lambda a: f"(1.0 / (1.0 + exp(-{a})))",
    UnaryOp.IS_NAN: is_nan,
    UnaryOp.IS_FINITE: lambda a: f"((bitcast<u32>({a}) & 0x7fffffffu) < 0x7f800000u)",  # exponent not all ones
    UnaryOp.UNPACK_HALF: lambda a: f"unpack2x16float({a}).x",
    # WGSL built-ins of the same name
    **{op: (lambda name: lambda a: f"{name}({a})")(op.value) for op in (
        UnaryOp.EXP, UnaryOp.ABSOLUTE, UnaryOp.TANH, UnaryOp.SQRT, UnaryOp.LOG, UnaryOp.FLOOR, UnaryOp.CEIL,
        UnaryOp.ROUND, UnaryOp.SIN, UnaryOp.COS, UnaryOp.TAN, UnaryOp.ASIN, UnaryOp.ACOS, UnaryOp.ATAN, UnaryOp.ASINH,
        UnaryOp.ACOSH, UnaryOp.ATANH,
    )},
}
COMPARE_RENDERINGS: dict[CompareOp, str] = {
    CompareOp.LT: "<", CompareOp.LE: "<=", CompareOp.GT: ">", CompareOp.GE: ">=", CompareOp.EQ: "==", CompareOp.NE: "!=",
}
# accumulator, value -> the accumulator combined with the value
COMBINER_RENDERINGS: dict[ReduceCombiner, Callable[[str, str], str]] = {
    ReduceCombiner.SUM: lambda accumulator, value: f"{accumulator} + {value}",
    ReduceCombiner.PROD: lambda accumulator, value: f"{accumulator} * {value}",
    ReduceCombiner.MAX: lambda accumulator, value: f"max({accumulator}, {value})",
    ReduceCombiner.MIN: lambda accumulator, value: f"min({accumulator}, {value})",
}
def rendering(table: dict, op):
    """The entry of ``op`` in one of the tables above; a missing op is an error."""
    try:
        return table[op]
    except KeyError:
        raise NotImplementedError(f"the WGSL backend has no rendering of {type(op).__name__}.{op.name}") from None

# WGSL's keywords and reserved words (spec, "Keyword and reserved word list"), plus the
# predeclared type names and our own names (the params field, the run status and its
# functions); a model's name that is one of these gets a trailing underscore in the shader.
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
run_status report_error checked_index
checked_add checked_subtract checked_multiply checked_divide checked_negative checked_cast_f32
checked_cast_u32 checked_divisor_i32 checked_divisor_u32
""".split())


def wgsl_name(name: str) -> str:
    """A valid WGSL identifier for a name from the model (never '__'-led, never reserved)."""
    if name.startswith("__"):
        name = "v" + name
    return f"{name}_" if name in RESERVED else name


def part_name(buffer_name: str, part: int) -> str:
    """The binding of part ``part`` of a buffer bound as parts."""
    return f"{wgsl_name(buffer_name)}_part{part}"


def part_load_name(buffer_name: str) -> str:
    """The load function of a buffer bound as parts."""
    return f"load_{wgsl_name(buffer_name)}"


def part_load(buffer_name: str, parts: int, element: str) -> list[str]:
    """The load function of a buffer bound as ``parts`` bindings of ``element``s: element
    ``index`` is in the part its index reaches, counting in the length of part 0, which the
    runtime chose at load (``arrayLength``: the whole tensor on a device that binds it at once,
    the other parts then small placeholders; else every part but the last that long)."""
    def start(part: int) -> str:  # the first index of ``part``
        return "length" if part == 1 else f"{part} * length"

    lines = [f"fn {part_load_name(buffer_name)}(index: i32) -> {element} {{",
             f"  let length = i32(arrayLength(&{part_name(buffer_name, 0)}));  // elements in each part but the last",
             "  if (index < length) {",
             f"    return {part_name(buffer_name, 0)}[index];",
             "  }"]
    for part in range(1, parts - 1):
        lines += [f"  if (index < {start(part + 1)}) {{",
                  f"    return {part_name(buffer_name, part)}[index - {start(part)}];",
                  "  }"]
    return lines + [f"  return {part_name(buffer_name, parts - 1)}[index - {start(parts - 1)}];", "}"]


def status_declarations(binding: int) -> list[str]:
    """The run status (``relaxweb/ir/error_sites.py``) at ``binding`` and the functions that
    report into it, for a shader whose program checks the run's data.  ``report_error``:
    the first error of the run wins (a compare-exchange of word 0, the site, from 0; a weak
    one may fail spuriously, so it is retried while word 0 is still 0), its values follow.
    ``checked_index``: a :class:`~relaxweb.ir.tir.CheckedIndex`, the index wrapped when
    negative and, out of range, reported and clamped so the kernel reads in bounds.  The
    array is runtime-sized, as every buffer binding (the ragged form of a batch reads it at
    base 0, a weight's)."""
    return [
        f"// the run status: {STATUS_WORDS} words, the site of the run's first error (0: none), then its values",
        f"@group(0) @binding({binding}) var<storage, read_write> run_status: array<atomic<u32>>;",
        "",
        "fn report_error(site: i32, value0: i32, value1: i32) {",
        "  while (atomicLoad(&run_status[0]) == 0u) {",
        "    if (atomicCompareExchangeWeak(&run_status[0], 0u, u32(site)).exchanged) {",
        "      atomicStore(&run_status[1], bitcast<u32>(value0));",
        "      atomicStore(&run_status[2], bitcast<u32>(value1));",
        "      return;",
        "    }",
        "  }",
        "}",
        "",
        "fn checked_index(index: i32, extent: i32, site: i32) -> i32 {",
        "  let wrapped = select(index, index + extent, index < 0);",
        "  if (wrapped >= 0 && wrapped < extent) {",
        "    return wrapped;",
        "  }",
        "  report_error(site, index, extent);",
        "  return clamp(wrapped, 0, max(extent - 1, 0));",
        "}",
    ]


# The WGSL functions of the integer checks (``relaxweb/ir/integer_checks.py``), by name: each
# computes the operation in 32 bits and reports ``site`` where the exact result does not fit
# int32 (an add or subtract that changes the sign bit against both operands', a product that
# does not divide back, INT32_MIN / -1 or negated, a float outside [-2^31, 2^31) or NaN, a
# uint32 above 2^31 - 1), or a zero divisor (which then divides as 1).
INTEGER_CHECK_FUNCTIONS: dict[str, list[str]] = {
    "checked_add": ["fn checked_add(a: i32, b: i32, site: i32) -> i32 {", "  let r = a + b;",
                    "  if (((a ^ r) & (b ^ r)) < 0) { report_error(site, 0, 0); }", "  return r;", "}"],
    "checked_subtract": ["fn checked_subtract(a: i32, b: i32, site: i32) -> i32 {", "  let r = a - b;",
                         "  if (((a ^ b) & (a ^ r)) < 0) { report_error(site, 0, 0); }", "  return r;", "}"],
    "checked_multiply": ["fn checked_multiply(a: i32, b: i32, site: i32) -> i32 {", "  let r = a * b;",
                         "  if (a != 0 && (r / a != b || (a == -1 && b == i32(-2147483648)))) { report_error(site, 0, 0); }",
                         "  return r;", "}"],
    "checked_divide": ["fn checked_divide(a: i32, b: i32, site: i32) -> i32 {",
                       "  if (a == i32(-2147483648) && b == -1) { report_error(site, 0, 0); }", "  return a / b;", "}"],
    "checked_negative": ["fn checked_negative(a: i32, site: i32) -> i32 {",
                         "  if (a == i32(-2147483648)) { report_error(site, 0, 0); }", "  return -a;", "}"],
    "checked_cast_f32": ["fn checked_cast_f32(x: f32, site: i32) -> i32 {",
                         "  if (!(x >= -2147483648.0 && x < 2147483648.0)) { report_error(site, 0, 0); }",
                         "  return i32(x);", "}"],
    "checked_cast_u32": ["fn checked_cast_u32(x: u32, site: i32) -> i32 {",
                         "  if (x > 2147483647u) { report_error(site, 0, 0); }", "  return bitcast<i32>(x);", "}"],
    "checked_divisor_i32": ["fn checked_divisor_i32(d: i32, site: i32) -> i32 {",
                            "  if (d == 0) { report_error(site, 0, 0); return 1; }", "  return d;", "}"],
    "checked_divisor_u32": ["fn checked_divisor_u32(d: u32, site: i32) -> u32 {",
                            "  if (d == 0u) { report_error(site, 0, 0); return 1u; }", "  return d;", "}"],
}


def integer_check_declarations(program: TensorProgram) -> list[str]:
    """The functions of :data:`INTEGER_CHECK_FUNCTIONS` ``program``'s integer checks call."""
    used = {name for node in scalar_nodes(program.body) for name in _check_functions(node)}
    return [line for name in INTEGER_CHECK_FUNCTIONS if name in used for line in ["", *INTEGER_CHECK_FUNCTIONS[name]]]


def _check_functions(node: ScalarExpr) -> tuple[str, ...]:
    """The check functions a node's rendering calls."""
    if node.scalar_kind == "checked_divisor":
        return (f"checked_divisor_{'u32' if _is_unsigned(node.dtype) else 'i32'}",)
    if node.scalar_kind != "checked_integer":
        return ()
    name = checked_operation(node.value)
    if name == "cast":
        source = dtype_info(node.value.a.dtype)
        return ("checked_cast_f32",) if source.is_float else ("checked_cast_u32",) if _is_unsigned(source.name) else ()
    return ({"sum": "checked_add", "prod": "checked_multiply"}.get(name, f"checked_{name}"),)


def _is_unsigned(dtype: str) -> bool:
    return dtype_info(dtype).device.kind is DtypeKind.UINT


def storage_type(dtype: str) -> str:
    """The WGSL type of a buffer element of ``dtype`` (its device dtype's)."""
    return WGSL_TYPES[dtype_info(dtype).device.name]


class Emitter(ScalarRenderer):
    """Writes the statements of a shader's main function (``statements``) and turns scalar
    expressions into WGSL; schedules drive it (``schedules.py``).

    The shared part (``relaxweb/ir/scalar_renderer.py``): a subexpression that occurs more
    than once in the body is computed once into a ``let`` and reused within the scope that
    computed it; a scope is opened for each loop body and each branch.  ``known`` may name
    the WGSL value of an expression up front (a schedule's accumulated reduction).

    Index expressions go through the shader's :class:`IndexLowering`, which knows the range
    of each axis in scope: :meth:`unflatten` and :meth:`reduce` declare the axes they set,
    a schedule declares its own (:meth:`declare_axis`).

    ``parts`` names the input buffers bound as several parts (a weight above one binding,
    ``relaxweb/ir/launch.binding_parts``); every element of one is read through its load
    function (:func:`part_load`), so schedules read them like any buffer.
    """

    binary_renderings = BINARY_RENDERINGS
    unary_renderings = UNARY_RENDERINGS
    compare_renderings = COMPARE_RENDERINGS

    def __init__(self, program: TensorProgram, size_vars: set[str], parts: Mapping[str, int] | None = None) -> None:
        super().__init__(program)
        self.size_vars = size_vars
        self.parts = dict(parts or {})  # input buffers bound as several parts (read through part_load)
        self.statements: list[str] = []
        self.accumulators = 0
        self.selections = 0
        self.values = 0
        self.float_type = "f32"  # the WGSL type of a float value (a vector in the vectorized schedule)
        self.cooperative: Callable[[Reduce, str], str] | None = None  # a schedule's top-level reductions

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

    def render_index(self, target: TargetIndex) -> str:
        return render_wgsl(target, self.variable)

    def variable(self, name: str) -> str:
        """A variable of an index expression in the shader: a size variable from the params
        block, an axis or index variable by its name."""
        return f"params.{wgsl_name(name)}" if name in self.size_vars else name

    def offset(self, buffer: Buffer, indices: tuple[PrimExpr, ...]) -> str:
        """The element offset of ``buffer[indices]`` (row-major; a negative constant offset,
        in a branch never taken, reads element 0: ``ScalarRenderer.lowered_offset``)."""
        return _unwrapped(self.render_index(self.lowered_offset(buffer, indices)))

    # -- values: the kinds the base does not render, and WGSL's own forms

    def visit(self, expr: ScalarExpr, indent: str) -> str:
        return self._scalar(expr, indent)

    def _scalar(self, expr: ScalarExpr, indent: str) -> str:
        """The value of ``expr`` by its kind (``visit_<kind>``): the hook
        ``wgsl/schedules._VectorEmitter`` overrides for its loads and constants (new code
        overrides ``visit_<kind>``)."""
        return self.visit_kind(expr, indent)

    def literal(self, value: float, dtype: str) -> str:
        return literal(value, dtype)

    def operation(self, table: Mapping, op, dtype: str) -> Callable[..., str]:
        return rendering(table, op)

    def bind_repeated(self, expr: ScalarExpr, value: str, indent: str) -> str:
        """A ``let`` of the value (a reduction's accumulator and a select's variable are
        names already)."""
        if isinstance(expr, (Reduce, Select)):
            return value
        name = f"v{self.values}"
        self.values += 1
        self.statements.append(f"{indent}let {name} = {value};")
        return name

    def visit_load(self, expr: Load, indent: str) -> str:
        return _from_storage(expr.buffer.dtype, self.element(expr.buffer.name, self.offset(expr.buffer, expr.indices)))

    def visit_gather(self, expr: Gather, indent: str) -> str:
        return _from_storage(expr.buffer.dtype, self.gather(expr, indent))

    def visit_cast(self, expr: Cast, indent: str) -> str:
        return self.cast(expr, indent)

    def visit_checked_index(self, expr: CheckedIndex, indent: str) -> str:
        """A call of the shader's ``checked_index`` (:func:`status_declarations`)."""
        index = self.scalar(expr.index, indent)
        extent, site = _unwrapped(self.index(expr.extent)), _unwrapped(self.index(expr.site))
        return f"checked_index({_unwrapped(index)}, {extent}, {site})"

    def visit_checked_integer(self, expr: CheckedInteger, indent: str) -> str:
        """A call of the check function of its operation (:data:`INTEGER_CHECK_FUNCTIONS`);
        a sum or product checks every step of its loop."""
        operation, site = expr.value, _unwrapped(self.index(expr.site))
        name = checked_operation(operation)
        if name in ("sum", "prod"):
            return self.reduce(operation, indent, site)
        if name == "cast":
            (function,) = _check_functions(expr) or (None,)
            value = self.scalar(operation.a, indent)
            return self.cast(operation, indent) if function is None else f"{function}({_unwrapped(value)}, {site})"
        operands = [_unwrapped(self.scalar(operand, indent)) for operand in scalar_children(operation)]
        return f"checked_{name}({', '.join(operands)}, {site})"

    def visit_checked_divisor(self, expr: CheckedDivisor, indent: str) -> str:
        (function,) = _check_functions(expr)
        return f"{function}({_unwrapped(self.scalar(expr.divisor, indent))}, {_unwrapped(self.index(expr.site))})"

    def visit_compare(self, expr: Compare, indent: str) -> str:
        a, b = self.scalar(expr.a, indent), self.scalar(expr.b, indent)
        return f"({a} {rendering(COMPARE_RENDERINGS, expr.op)} {b})"

    def visit_select(self, expr: Select, indent: str) -> str:
        return self.select(expr, indent)

    def visit_binary(self, expr: Binary, indent: str) -> str:
        """A float max / min propagates NaN (:func:`float_extremum`); the rest by the table."""
        if expr.op in _EXTREMA and dtype_info(scalar_dtype(expr)).is_float:
            a, b = self.scalar(expr.a, indent), self.scalar(expr.b, indent)
            return float_extremum(expr.op, self.named(a, indent), self.named(b, indent), self.float_type)
        return super().visit_binary(expr, indent)

    def visit_reduce(self, expr: Reduce, indent: str) -> str:
        if self.cooperative is not None and len(self.scopes) == 1:
            return self.cooperative(expr, indent)
        return self.reduce(expr, indent)

    def named(self, value: str, indent: str) -> str:
        """``value`` itself when it is a name or a number, else a ``let`` of it (for an
        expression written more than once)."""
        if value.replace("_", "").replace(".", "").isalnum():
            return value
        name = f"v{self.values}"
        self.values += 1
        self.statements.append(f"{indent}let {name} = {value};")
        return name

    def cast(self, expr: Cast, indent: str) -> str:
        """Like numpy's astype, in 32 bits: a dtype narrower than its device dtype keeps its
        low bits (a float truncated toward zero first), float16 rounds to half precision."""
        value = self.scalar(expr.a, indent)
        target = dtype_info(expr.dtype)
        if target.is_integer and target.bytes < target.device_bytes:
            whole = f"i32({value})" if dtype_info(scalar_dtype(expr.a)).is_float else value
            return f"extractBits({_scalar_type(expr.dtype)}({whole}), 0u, {8 * target.bytes}u)"
        if target.is_float and target.bytes < target.device_bytes:  # float16
            return f"unpack2x16float(pack2x16float(vec2<f32>(f32({value}), 0.0))).x"
        return f"{_scalar_type(expr.dtype)}({value})"

    def gather(self, expr: Gather, indent: str) -> str:
        """An indirect load: run-time indices (i32) are clamped into their dimension."""
        terms = []
        stride: PrimExpr = IntImm(1)
        for index, extent in reversed(list(zip(expr.indices, expr.buffer.shape))):
            if isinstance(index, CheckedIndex) and index.extent == extent:  # in range already
                text = _unwrapped(self.scalar(index, indent))
            elif isinstance(index, ScalarExpr):
                value = self.scalar(index, indent)
                text = f"clamp(i32({value}), 0, {self.index(extent - 1)})"
            else:
                text = self.index(index)
            stride_text = self.index(stride)
            terms.append(text if stride_text == "1" else f"{text} * {stride_text}")
            stride = stride * extent
        return self.element(expr.buffer.name, " + ".join(reversed(terms)) or "0")

    def element(self, buffer_name: str, index: str) -> str:
        """The element of an input buffer at ``index`` (i32 WGSL): ``buffer[index]``, or the
        call of its load function when it is bound as parts."""
        if buffer_name in self.parts:
            return f"{part_load_name(buffer_name)}({_unwrapped(index)})"
        return f"{wgsl_name(buffer_name)}[{index}]"

    def reduce(self, expr: Reduce, indent: str, site: str | None = None) -> str:
        """A serial loop over the reduction axis; with an integer check's ``site``, each step
        through the check function of its sum or product."""
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
        if is_float_extremum(expr.combiner, dtype):
            body = self.named(body, indent + "  ")
        self.close_scope()
        if site is None:
            update = combine(expr.combiner, dtype, name, body, f"{axis} == 0")
        else:
            update = f"checked_{'add' if expr.combiner is ReduceCombiner.SUM else 'multiply'}({name}, {body}, {site})"
        self.statements.append(f"{indent}  {name} = {update};")
        self.statements.append(f"{indent}}}")
        return name

    def select(self, expr: Select, indent: str) -> str:
        """WGSL's ``select`` when both branches are cheap (no reduction, a few nodes: a
        convolution's padding test around a load), else an if/else into a variable, so that
        only the chosen branch is evaluated.  Evaluating the branch not chosen is safe: it is
        pure, and a load out of bounds (the inputs of a concat, a padded convolution's input)
        reads some element of the buffer under WebGPU's robust buffer access; a branch in
        every invocation costs more than the load, above all where invocations run in SIMD
        lanes of a CPU (SwiftShader, lavapipe)."""
        if is_cheap_branch(expr.a) and is_cheap_branch(expr.b):
            condition = self.scalar(expr.condition, indent)
            # WGSL's select evaluates both branches: where its condition's bounds do not hold,
            # a branch's load stays inside the buffer (robust buffer access) and is not used
            a, b = (self.branch_value(expr.condition, holds, lambda branch=branch: self.scalar(branch, indent))
                    for branch, holds in ((expr.a, True), (expr.b, False)))
            return f"select({b}, {a}, {condition})"
        name = f"sel{self.selections}"
        self.selections += 1
        condition = self.scalar(expr.condition, indent)
        self.statements.append(f"{indent}var {name}: {_scalar_type(scalar_dtype(expr.a))};")
        self.statements.append(f"{indent}if ({condition}) {{")
        self.open_branch(expr.condition, True)
        a = self.scalar(expr.a, indent + "  ")
        self.close_scope()
        self.statements.append(f"{indent}  {name} = {a};")
        self.statements.append(f"{indent}}} else {{")
        self.open_branch(expr.condition, False)
        b = self.scalar(expr.b, indent + "  ")
        self.close_scope()
        self.statements.append(f"{indent}  {name} = {b};")
        self.statements.append(f"{indent}}}")
        return name


def combine(combiner: ReduceCombiner, dtype: str, accumulator: str, value: str, first: str) -> str:
    """``accumulator`` combined with ``value`` (a name for a float max / min: it is written
    several times); a float max / min takes the value as it is where ``first`` (a WGSL bool)
    holds, so that infinities need no constant, and propagates NaN (float_extremum)."""
    update = rendering(COMBINER_RENDERINGS, combiner)(accumulator, value)
    if is_float_extremum(combiner, dtype):
        update = f"select({float_extremum(combiner, accumulator, value)}, {value}, {first})"
    return update


def is_float_extremum(combiner: ReduceCombiner, dtype: str) -> bool:
    """Whether a reduction is a float max / min (its values are written through float_extremum)."""
    return combiner in (ReduceCombiner.MAX, ReduceCombiner.MIN) and dtype_info(dtype).is_float


def reduce_identity(combiner: ReduceCombiner, dtype: str) -> str:
    """The WGSL start value of a reduction (an empty range reduces to it): 0 for sum, 1 for
    prod, the lowest (highest) value of the dtype for max (min)."""
    if combiner is ReduceCombiner.SUM:
        return literal(0, dtype)
    if combiner is ReduceCombiner.PROD:
        return literal(1, dtype)
    if combiner not in (ReduceCombiner.MAX, ReduceCombiner.MIN):
        raise NotImplementedError(f"the WGSL backend has no identity of ReduceCombiner.{combiner.name}")
    lowest = combiner is ReduceCombiner.MAX
    info = dtype_info(dtype)
    if info.is_integer and info.bytes < info.device_bytes:  # int8, uint16 ...: their own range
        bits = 8 * info.bytes
        if info.kind is DtypeKind.INT:
            return literal(-2 ** (bits - 1) if lowest else 2 ** (bits - 1) - 1, dtype)
        return literal(0 if lowest else 2 ** bits - 1, dtype)
    if info.kind is DtypeKind.BOOL:
        return literal(not lowest, dtype)
    return (LOWEST if lowest else HIGHEST)[info.device.name]


def _from_storage(dtype: str, element: str) -> str:
    """The register value of a loaded buffer element (a bool is stored as u32 0/1)."""
    return f"({element} != 0u)" if dtype_info(dtype).kind is DtypeKind.BOOL else element


def to_storage(dtype: str, value: str) -> str:
    """The buffer element storing a register value (a bool becomes u32 0/1)."""
    return f"select(0u, 1u, {value})" if dtype_info(dtype).kind is DtypeKind.BOOL else value


def _scalar_type(dtype: str) -> str:
    """The WGSL type of a value of ``dtype`` in registers: a bool is a WGSL ``bool`` (a load
    converts, a store selects 0u / 1u), every other dtype its device dtype's type."""
    return "bool" if dtype_info(dtype).kind is DtypeKind.BOOL else storage_type(dtype)


def literal(value: float, dtype: str) -> str:
    """A WGSL constant of ``dtype`` (in its device dtype)."""
    info = dtype_info(dtype)
    if not info.on_gpu:
        raise NotImplementedError(f"dtype {dtype} has no GPU representation")
    if info.kind is DtypeKind.FLOAT:
        text = repr(float(value))
        if text in ("inf", "-inf", "nan"):
            raise ValueError(f"WGSL has no literal for {text}")
        return text if "e" in text or "." in text else text + ".0"
    if info.kind is DtypeKind.INT and info.narrowed_on_device:
        # int64 values are i32 on the device: saturate (e.g. INT64_MAX sentinels)
        value = min(max(int(value), -2**31), 2**31 - 1)
        return f"{value}" if value >= 0 else f"i32({value})"
    if info.kind is DtypeKind.INT:
        return f"{int(value)}" if int(value) >= 0 else f"({int(value)})"
    if info.kind is DtypeKind.UINT:
        return f"{int(value)}u"
    return "true" if value else "false"


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

