"""Folding nodes whose inputs are known at compile time: constants and shape values.

Exporters compute shapes with small subgraphs (``Shape -> Gather -> Unsqueeze -> Concat ->
Reshape``).  relaxweb keeps those computations out of the GPU program: before a node is
converted, :func:`fold_node` tries to evaluate it at compile time.

- All inputs constant: the node is evaluated with ONNX's reference implementation
  (``onnx.reference``) and becomes a constant.
- Inputs that are shape values (a ``ShapeExpr`` of symbolic dims, from ``Shape``) or prim
  values (``PrimValue``, a symbolic integer), mixed with small integer constants: the node
  is evaluated symbolically (see ``SYMBOLIC_FOLDERS``), so ``Gather(Shape(x), 0)`` is the
  ``PrimValue`` ``batch`` and a ``Reshape`` fed by a ``Concat`` of such values gets a
  symbolic target shape.  Nothing is deduced from ONNX's own shape inference (``value_info``):
  shapes flow forward from the inputs' annotations.

A folded value is never bound in the graph: the importer keeps it in its table of values,
and the converters that consume shapes read it from there.

**The compile-time value domain.**  A shape value is a 1-D vector, a prim value a scalar;
their entries are symbolic integers.  Each also has an ONNX dtype (int64 unless a ``Cast``
said otherwise, kept in a side table, :func:`value_dtype`): integers, ``bool`` (entries 0 or
1) or floats (``Cast(Shape(x)[1], float)`` is still ``seq``).  A float entry may be a
:class:`Ratio` of a symbolic integer and a positive constant, so the shape arithmetic
exporters do in float stays exact: ``Floor(Div(Cast(H, float), 32.0))`` is ``H // 32``,
``Ceil`` of it ``(H + 31) // 32``, a ``Cast`` back to int64 truncates (``H // 32`` for
``H >= 0``).  (Float32 computes such quotients exactly enough for any realistic size: a
quotient ``H / c`` is at least ``1 / c`` from the next integer, its rounding error
``H / c * 2**-24``.)  A ratio's denominators are kept in a side table next to its numerators
(:func:`shape_values` reads them back); nothing takes it for an integer
(:func:`compile_time_ints` refuses it) and :func:`materialize` divides on the GPU.  A
result whose entries are all constants is a ``Constant``.  Comparisons stay symbolic when
they cannot be decided (``n == 4`` is ``1 - min(1, max(n - 4, 4 - n))``), so an ``If`` on
them is decided in the host.  A folder returns None for what it cannot represent exactly
(a non-integral quotient, a vector of symbolic length such as ``Range(0, seq)``): the node
is then converted normally, and its shape-value inputs become tensors (:func:`materialize`).

**Shape values where a tensor is needed.**  :func:`converter_inputs` (called by the importer
before each converter) turns every ``ShapeExpr`` / ``PrimValue`` input into a tensor with
:func:`materialize`, except at the input positions listed in :data:`SHAPE_OPERANDS` (a
Reshape target, Slice starts...), where the converter takes the compile-time value itself.
``materialize(context, expr)`` gives a ``Constant`` when every entry is known, else binds
``shape_to_tensor(expr)`` (a tensor program writing the symbolic values); tensors pass
through unchanged, so converters may call it on any input.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Sequence, Union

import numpy as np
import onnx
from onnx import helper

from ...ir.expr import Constant, Expr, PrimValue, ShapeExpr
from ...ir.op_registry import DeductionError
from ...ir.struct_info import TensorStructInfo
from ...ir.symbolic import (
    IntImm, PrimExpr, as_int, expr_max, expr_min, prove_equal, prove_less, prove_less_equal, prove_nonnegative,
    simplify,
)
from ...ops import call_op
from ...ops.creation import arange_length
from .registry import tensor_to_array

# op type -> function(context, node, inputs) -> Expr | list[Expr] | None, for symbolic shape arithmetic
SYMBOLIC_FOLDERS: dict[str, Callable] = {}

# Ops never folded even when their inputs are constant (their outputs are large or random).
NOT_FOLDED = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}

# Constant folding is limited to small results, so weights are not duplicated.
FOLD_LIMIT_ELEMENTS = 1 << 16

# Constants with at most this many entries (0-d or 1-d) take part in symbolic folding, and a
# folded shape value has at most this many entries.
SHAPE_VALUE_LIMIT = 64

# op type -> input positions where the converter takes a compile-time value (Constant,
# ShapeExpr or PrimValue) as is; other shape-value inputs are materialized as tensors.
SHAPE_OPERANDS: dict[str, frozenset[int]] = {
    "Reshape": frozenset({1}),
    "Expand": frozenset({1}),
    "Tile": frozenset({1}),
    "ConstantOfShape": frozenset({0}),
    "Range": frozenset({0, 1, 2}),
    "Slice": frozenset({1, 2, 3, 4}),
    "Pad": frozenset({1, 3}),
    "Split": frozenset({1}),
    "Squeeze": frozenset({1}),
    "Unsqueeze": frozenset({1}),
    "Gather": frozenset({1}),
    "Trilu": frozenset({1}),
    "If": frozenset({0}),
    "Loop": frozenset({0, 1}),
    "Resize": frozenset({1, 2, 3}),
    "Upsample": frozenset({1}),
    "OneHot": frozenset({1}),
}

# The ONNX dtype of shape values that are not int64 (the IR's ShapeExpr / PrimValue carry none).
_DTYPES: "weakref.WeakKeyDictionary[Expr, str]" = weakref.WeakKeyDictionary()


def value_dtype(expr: Expr) -> str:
    """The ONNX dtype of a compile-time value (int64 for shape values unless cast)."""
    if isinstance(expr, Constant):
        return str(expr.data.dtype)
    if isinstance(expr.struct_info, TensorStructInfo):
        return expr.struct_info.dtype
    return _DTYPES.get(expr, "int64")


def with_dtype(expr: Expr, dtype: str) -> Expr:
    """Record the dtype of a ShapeExpr / PrimValue (int64 is the default)."""
    if isinstance(expr, (ShapeExpr, PrimValue)) and dtype != "int64":
        _DTYPES[expr] = dtype
    return expr


@dataclass(frozen=True)
class Ratio:
    """A float entry that is not known to be an integer: ``numerator / denominator``."""

    numerator: PrimExpr
    denominator: int  # > 1


Entry = Union[PrimExpr, Ratio]

# The largest denominator of a float constant taken exactly (0.5, 0.25, 0.125 ...).
DENOMINATOR_LIMIT = 1 << 16


def fraction(entry: Entry) -> tuple[PrimExpr, int]:
    """An entry as (numerator, denominator)."""
    return (entry.numerator, entry.denominator) if isinstance(entry, Ratio) else (entry, 1)


def ratio(numerator: PrimExpr, denominator: int) -> Entry:
    """``numerator / denominator`` (a positive int) as an entry: an integer when it provably
    is one, else a :class:`Ratio` in lowest terms for its constant factors."""
    numerator = simplify(numerator)
    constant = as_int(numerator)
    if constant is not None:
        common = math.gcd(constant, denominator)
        numerator, denominator = IntImm(constant // common), denominator // common
    if denominator == 1:
        return numerator
    quotient = simplify(numerator // denominator)
    if prove_equal(quotient * denominator, numerator):
        return quotient
    return Ratio(numerator, denominator)


@dataclass(frozen=True)
class ShapeValues:
    """A compile-time value: symbolic entries, a scalar or a 1-D vector, and an ONNX dtype.
    Only float values hold :class:`Ratio` entries."""

    values: tuple[Entry, ...]
    scalar: bool
    dtype: str


# The denominators of the float shape values that hold ratios (their numerators are the values).
_DENOMINATORS: "weakref.WeakKeyDictionary[Expr, tuple[int, ...]]" = weakref.WeakKeyDictionary()


def shape_values(expr: Expr | None) -> ShapeValues | None:
    """The entries of a shape value, a prim value or a small 0-d / 1-d constant (integers,
    bools, or floats that are exact small fractions: 32.0, 0.5); None for anything else."""
    if isinstance(expr, (ShapeExpr, PrimValue)):
        numerators = tuple(expr.values) if isinstance(expr, ShapeExpr) else (expr.value,)
        denominators = _DENOMINATORS.get(expr, (1,) * len(numerators))
        entries = tuple(ratio(n, d) for n, d in zip(numerators, denominators))
        return ShapeValues(entries, isinstance(expr, PrimValue), value_dtype(expr))
    if isinstance(expr, Constant):
        data = expr.data
        if data.ndim > 1 or data.size > SHAPE_VALUE_LIMIT:
            return None
        if data.dtype.kind == "f":
            if not np.all(np.isfinite(data)):
                return None
            fractions = [Fraction(float(v)) for v in data.reshape(-1)]
            if any(f.denominator > DENOMINATOR_LIMIT for f in fractions):
                return None
            entries = tuple(ratio(IntImm(f.numerator), f.denominator) for f in fractions)
            return ShapeValues(entries, data.ndim == 0, str(data.dtype))
        if data.dtype.kind not in "iub":
            return None
        return ShapeValues(tuple(IntImm(int(v)) for v in data.reshape(-1)), data.ndim == 0, str(data.dtype))
    return None


def compile_time_ints(expr: Expr | None) -> list[PrimExpr] | None:
    """The entries of an integer operand known at compile time (a Constant of any size, a
    shape value or a prim value), or None for a run-time tensor or a value with ratios."""
    if isinstance(expr, Constant):
        if expr.data.ndim > 1 or expr.data.dtype.kind not in "iu":
            return None
        return [IntImm(int(v)) for v in expr.data.reshape(-1)]
    if expr in _DENOMINATORS:
        return None
    if isinstance(expr, ShapeExpr):
        return list(expr.values)
    if isinstance(expr, PrimValue):
        return [expr.value]
    return None


def constant_ints(expr: Expr | None) -> list[int] | None:
    """The entries of an operand when they are all known constants, else None."""
    values = compile_time_ints(expr)
    if values is None or any(as_int(v) is None for v in values):
        return None
    return [int(as_int(v)) for v in values]  # type: ignore[arg-type]


def make_constant(context, data: np.ndarray, name: str) -> Constant:
    """``context.constant`` keeping the array's shape (``np.ascontiguousarray`` turns a 0-d
    array into a 1-d one)."""
    data = np.asarray(data)
    constant = context.constant(data, name)
    if constant.data.shape != data.shape:
        constant = Constant(np.array(data, order="C"), name)
    return constant


def make_value(context, values: Sequence[Entry], scalar: bool, dtype: str, name: str) -> Expr:
    """A ``Constant`` when every entry is a known constant, else a ``ShapeExpr`` (or a
    ``PrimValue`` for a scalar) recording ``dtype`` (and the denominators of its ratios)."""
    pairs = [fraction(ratio(*fraction(v))) for v in values]
    numerators = [n for n, _ in pairs]
    denominators = tuple(d for _, d in pairs)
    constants = [as_int(n) for n in numerators]
    if all(c is not None for c in constants):
        array = np.array([c / d if d != 1 else c for c, d in zip(constants, denominators)], dtype=np.dtype(dtype))
        return make_constant(context, array.reshape(()) if scalar else array, name)
    value = with_dtype(PrimValue(numerators[0]) if scalar else ShapeExpr(tuple(numerators)), dtype)
    if any(d != 1 for d in denominators):
        _DENOMINATORS[value] = denominators
    return value


def _result(context, node: onnx.NodeProto, value: ShapeValues, index: int = 0) -> Expr:
    name = (node.output[index] if index < len(node.output) else "") or node.name or node.op_type
    return make_value(context, value.values, value.scalar, value.dtype, name)


# Shape values where a tensor is needed ---------------------------------------------------------

_MATERIALIZED: "weakref.WeakKeyDictionary[Expr, tuple]" = weakref.WeakKeyDictionary()


def tensor_of(context, expr: Expr, name: str = "shape") -> Expr:
    """A ShapeExpr / PrimValue as a tensor expression, unbound: a ``Constant`` when every
    entry is known, else a ``shape_to_tensor`` call (of the numerators, divided by the
    denominators when the value holds ratios).  Other expressions are returned as is."""
    if not isinstance(expr, (ShapeExpr, PrimValue)):
        return expr
    values = list(expr.values) if isinstance(expr, ShapeExpr) else [expr.value]
    dtype = value_dtype(expr)
    constants = [as_int(v) for v in values]
    if all(c is not None for c in constants):
        array = np.array(constants, dtype=np.dtype(dtype))
        return make_constant(context, array.reshape(()) if isinstance(expr, PrimValue) else array, name)
    if expr not in _DENOMINATORS:
        return call_op("shape_to_tensor", expr, dtype=dtype)
    plain = type(expr)(expr.values if isinstance(expr, ShapeExpr) else expr.value)
    numerators = context.builder.emit(call_op("shape_to_tensor", plain, dtype=dtype), f"{name}_numerators")
    denominators = np.array(_DENOMINATORS[expr], dtype=np.dtype(dtype))
    return call_op("divide", numerators, make_constant(
        context, denominators.reshape(()) if isinstance(expr, PrimValue) else denominators, f"{name}_denominators"))


def materialize(context, expr: Expr, name_hint: str = "shape") -> Expr:
    """The tensor holding a compile-time value, for an op that needs a tensor.

    A ``ShapeExpr`` becomes a 1-D tensor and a ``PrimValue`` a 0-d tensor, of the value's
    ONNX dtype (:func:`value_dtype`, int64 by default): a ``Constant`` when every entry is a
    known constant, otherwise a binding of ``shape_to_tensor(expr)`` in the current builder
    (a tensor program writing the symbolic values, so no read-back is involved).  The same
    value materialized twice in one builder is bound once.  Anything else (tensors,
    constants) is returned unchanged.
    """
    if not isinstance(expr, (ShapeExpr, PrimValue)):
        return expr
    cached = _MATERIALIZED.get(expr)
    if cached is not None and cached[0] is context.builder:
        return cached[1]
    tensor = tensor_of(context, expr, name_hint)
    if isinstance(tensor, Constant):
        return tensor
    var = context.builder.emit(tensor, name_hint)
    _MATERIALIZED[expr] = (context.builder, var)
    return var


def converter_inputs(context, node: onnx.NodeProto, inputs: list[Expr | None]) -> list[Expr | None]:
    """The inputs a converter receives: shape values materialized as tensors, except at the
    positions where the converter takes compile-time values (:data:`SHAPE_OPERANDS`)."""
    keep = SHAPE_OPERANDS.get(node.op_type, frozenset())
    return [
        value if position in keep else materialize(context, value, (node.input[position] or "shape"))
        for position, value in enumerate(inputs)
    ]


def is_compile_time(expr: Expr | None) -> bool:
    return expr is None or isinstance(expr, (Constant, ShapeExpr, PrimValue))


def fold_node(context, node: onnx.NodeProto, inputs: list[Expr | None]) -> list[Expr] | None:
    """The node's outputs evaluated at compile time, or None when it must be converted."""
    if node.op_type in NOT_FOLDED or not all(is_compile_time(i) for i in inputs):
        return None
    if any(isinstance(i, (ShapeExpr, PrimValue)) for i in inputs):
        folder = SYMBOLIC_FOLDERS.get(node.op_type)
        result = folder(context, node, inputs) if folder else None
        if result is None:
            return None
        return result if isinstance(result, list) else [result]
    if not inputs and node.op_type != "Constant":
        return None
    return _fold_constants(context, node, inputs)


def _fold_constants(context, node: onnx.NodeProto, inputs: list[Expr | None]) -> list[Expr] | None:
    if node.op_type == "If" or any(a.type == onnx.AttributeProto.GRAPH for a in node.attribute):
        return None
    if any(i is not None and i.data.size > FOLD_LIMIT_ELEMENTS for i in inputs):  # type: ignore[union-attr]
        return None
    from onnx.reference import ReferenceEvaluator

    names = [f"input{i}" if value is not None else "" for i, value in enumerate(inputs)]
    outputs = [f"output{i}" for i in range(len(node.output))]
    single = helper.make_node(node.op_type, names, outputs, domain=node.domain)
    single.attribute.extend(node.attribute)
    graph_inputs = [
        helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.data.dtype), value.data.shape)
        for name, value in zip(names, inputs) if value is not None
    ]
    graph = helper.make_graph([single], "fold", graph_inputs,
                              [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", context.opset)])
    try:
        results = ReferenceEvaluator(model).run(
            None, {name: value.data for name, value in zip(names, inputs) if value is not None}
        )
    except Exception:  # the reference cannot fold it: convert the node normally
        return None
    folded = []
    for name, value in zip(node.output, results):
        if value is None or isinstance(value, (list, tuple)):  # an optional or a sequence: no constant
            return None
        array = np.asarray(value)
        if array.size > FOLD_LIMIT_ELEMENTS:
            return None
        folded.append(make_constant(context, array, name or node.name))
    return folded


# Symbolic folders ------------------------------------------------------------------------------


def folder(*op_types: str):
    """Register a symbolic folder for the named op types."""
    def register(function: Callable) -> Callable:
        for op_type in op_types:
            SYMBOLIC_FOLDERS[op_type] = function
        return function

    return register


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _axes(node: onnx.NodeProto, inputs: list[Expr | None], position: int) -> list[int] | None | bool:
    """Constant axes from the input at ``position`` or the ``axes`` attribute; None when absent,
    False when given but not constant."""
    if len(inputs) > position and inputs[position] is not None:
        axes = constant_ints(inputs[position])
        return False if axes is None else axes
    axes = _attrs(node).get("axes")
    return None if axes is None else [int(a) for a in axes]


def _is_float(dtype: str) -> bool:
    return dtype.startswith("float") or dtype == "bfloat16"


def _broadcast(operands: list[ShapeValues]) -> tuple[list[tuple[PrimExpr, ...]], bool] | None:
    """Rows of entries, one per result entry (numpy broadcasting of scalars and 1-D values)."""
    lengths = {len(o.values) for o in operands if not o.scalar and len(o.values) != 1}
    if len(lengths) > 1:
        return None
    scalar = all(o.scalar for o in operands)
    count = lengths.pop() if lengths else 1
    if count > SHAPE_VALUE_LIMIT:
        return None
    columns = [o.values * count if len(o.values) == 1 else o.values for o in operands]
    return list(zip(*columns)), scalar


def _elementwise(function: Callable, result_dtype: str | None = None):
    """A folder applying ``function(dtype, attrs, *entries) -> Entry | None`` entry by entry."""
    def fold(context, node, inputs):
        operands = [shape_values(i) for i in inputs if i is not None]
        if not operands or any(o is None for o in operands):
            return None
        broadcast = _broadcast(operands)  # type: ignore[arg-type]
        if broadcast is None:
            return None
        rows, scalar = broadcast
        dtype = operands[0].dtype  # type: ignore[union-attr]
        attrs = _attrs(node)
        values = []
        for row in rows:
            value = function(dtype, attrs, *row)
            if value is None:
                return None
            values.append(value)
        return _result(context, node, ShapeValues(tuple(values), scalar, result_dtype or dtype))

    return fold


# Arithmetic on entries: integers, or (for floats) ratios, computed exactly over a common
# denominator (``a / 32 + 1`` is ``(a + 32) / 32``).


def _over_common_denominator(combine: Callable[[PrimExpr, PrimExpr], PrimExpr]):
    """``combine`` (a sum, a min...) of two entries' numerators over their common denominator."""
    def apply(a: Entry, b: Entry) -> Entry:
        (an, ad), (bn, bd) = fraction(a), fraction(b)
        common = math.lcm(ad, bd)
        return ratio(combine(an * (common // ad), bn * (common // bd)), common)

    return apply


_add = _over_common_denominator(lambda a, b: a + b)
_sub = _over_common_denominator(lambda a, b: a - b)
_max = _over_common_denominator(expr_max)
_min = _over_common_denominator(expr_min)


def _mul(a: Entry, b: Entry) -> Entry:
    (an, ad), (bn, bd) = fraction(a), fraction(b)
    return ratio(an * bn, ad * bd)


def _trunc_div(a: int, b: int) -> int:
    quotient = abs(a) // abs(b)
    return quotient if (a >= 0) == (b > 0) else -quotient


def _divide(dtype, attrs, a, b):
    if _is_float(dtype):
        return _float_divide(a, b)
    ca, cb = as_int(a), as_int(b)
    if cb == 0:
        return None
    if ca is not None and cb is not None:
        return IntImm(_trunc_div(ca, cb))
    if not prove_nonnegative(a):  # floor and truncation agree only for a >= 0 (and b > 0)
        return None
    if cb is not None:
        return a // cb if cb > 0 else simplify(0 - a // (-cb))
    return a // b if prove_less(0, b) else None


def _float_divide(a: Entry, b: Entry) -> Entry | None:
    """``a / b`` exactly: a ratio when ``b`` is a constant; by a symbolic ``b``, only a quotient
    that is provably an integer."""
    (an, ad), (bn, bd) = fraction(a), fraction(b)
    divisor = as_int(bn)
    if divisor == 0:
        return None
    if divisor is not None:
        sign = 1 if divisor > 0 else -1
        return ratio(an * bd * sign, ad * abs(divisor))
    if ad != 1 or bd != 1:
        return None
    quotient = simplify(an // bn)
    return quotient if prove_less(0, bn) and prove_equal(quotient * bn, an) else None


def _modulo(dtype, attrs, a, b):
    if _is_float(dtype):
        return None
    ca, cb = as_int(a), as_int(b)
    if cb == 0:
        return None
    fmod = int(attrs.get("fmod", 0))
    if ca is not None and cb is not None:
        return IntImm(int(math.fmod(ca, cb)) if fmod else ca % cb)
    if cb is not None and cb > 0 and (not fmod or prove_nonnegative(a)):
        return a % cb
    return None


def _floor(entry: Entry) -> PrimExpr:
    numerator, denominator = fraction(entry)
    return simplify(numerator // denominator)


def _ceil(entry: Entry) -> PrimExpr:
    numerator, denominator = fraction(entry)
    return simplify((numerator + denominator - 1) // denominator)


def _round(entry: Entry) -> PrimExpr | None:
    """Round half to even, as ONNX: exact for an odd denominator (no value is a half)."""
    numerator, denominator = fraction(entry)
    if denominator % 2 == 0:
        return None
    return simplify((numerator * 2 + denominator) // (denominator * 2))


def _truncate(entry: Entry) -> PrimExpr | None:
    """Towards zero, as a Cast from float to an integer type."""
    numerator, denominator = fraction(entry)
    if denominator == 1 or prove_nonnegative(numerator):
        return simplify(numerator // denominator)
    if prove_less_equal(numerator, 0):
        return simplify(0 - (0 - numerator) // denominator)
    return None


def _equal(a, b) -> PrimExpr:
    if prove_equal(a, b):
        return IntImm(1)
    if prove_less(a, b) or prove_less(b, a):
        return IntImm(0)
    return 1 - expr_min(1, expr_max(a - b, b - a))


def _less(a, b) -> PrimExpr:
    if prove_less(a, b):
        return IntImm(1)
    if prove_less_equal(b, a):
        return IntImm(0)
    return expr_min(1, expr_max(0, b - a))


def _compared(test: Callable[[PrimExpr, PrimExpr], PrimExpr]):
    """``test`` of two entries (a comparison), on their numerators over a common denominator."""
    def apply(dtype, attrs, a: Entry, b: Entry) -> PrimExpr:
        (an, ad), (bn, bd) = fraction(a), fraction(b)
        return test(an * bd, bn * ad)

    return apply


def _truth(a: Entry) -> PrimExpr:
    """0 or 1: whether ``a`` is non-zero."""
    a = fraction(a)[0]
    constant = as_int(a)
    if constant is not None:
        return IntImm(int(constant != 0))
    if prove_less_equal(1, a):
        return IntImm(1)
    magnitude = a if prove_nonnegative(a) else expr_max(a, 0 - a)
    return expr_min(1, magnitude)


def _abs(a: Entry) -> Entry:
    numerator, denominator = fraction(a)
    if prove_nonnegative(numerator):
        return a
    if prove_less_equal(numerator, 0):
        return ratio(0 - numerator, denominator)
    return ratio(expr_max(numerator, 0 - numerator), denominator)


def _variadic(combine: Callable):
    return lambda dtype, attrs, *row: _fold_row(combine, row)


def _fold_row(combine, row):
    result = row[0]
    for value in row[1:]:
        result = combine(result, value)
    return result


def _float_only(function: Callable[[Entry], PrimExpr | None]):
    """Floor, Ceil, Round: float inputs only (ONNX has no integer versions)."""
    return lambda dtype, attrs, a: function(a) if _is_float(dtype) else None


for _op, _function in {
    "Add": lambda d, at, a, b: _add(a, b),
    "Sub": lambda d, at, a, b: _sub(a, b),
    "Mul": lambda d, at, a, b: _mul(a, b),
    "Div": _divide,
    "Mod": _modulo,
    "Neg": lambda d, at, a: _sub(IntImm(0), a),
    "Abs": lambda d, at, a: _abs(a),
    "Max": _variadic(_max),
    "Min": _variadic(_min),
    "Sum": _variadic(_add),
    "Floor": _float_only(_floor),
    "Ceil": _float_only(_ceil),
    "Round": _float_only(_round),
}.items():
    SYMBOLIC_FOLDERS[_op] = _elementwise(_function)

for _op, _function in {
    "Equal": _compared(_equal),
    "Less": _compared(_less),
    "Greater": _compared(lambda a, b: _less(b, a)),
    "LessOrEqual": _compared(lambda a, b: 1 - _less(b, a)),
    "GreaterOrEqual": _compared(lambda a, b: 1 - _less(a, b)),
    "Not": lambda d, at, a: 1 - _truth(a),
    "And": lambda d, at, a, b: _truth(a) * _truth(b),
    "Or": lambda d, at, a, b: expr_max(_truth(a), _truth(b)),
    "Xor": lambda d, at, a, b: _equal(_truth(a), 1 - _truth(b)),
}.items():
    SYMBOLIC_FOLDERS[_op] = _elementwise(_function, "bool")


def _cast_to(context, node, value: ShapeValues, dtype: str) -> Expr | None:
    if dtype == "bool":
        entries: tuple = tuple(_truth(v) for v in value.values)
    elif dtype.startswith("float") or dtype == "bfloat16":
        entries = value.values
    elif dtype.startswith(("int", "uint")):
        entries = tuple(_truncate(v) for v in value.values)
        if any(e is None for e in entries):
            return None
    else:
        return None
    return _result(context, node, ShapeValues(entries, value.scalar, dtype))


@folder("Cast")
def fold_cast(context, node, inputs):
    value = shape_values(inputs[0])
    if value is None:
        return None
    return _cast_to(context, node, value, str(np.dtype(helper.tensor_dtype_to_np_dtype(_attrs(node)["to"]))))


@folder("CastLike")
def fold_cast_like(context, node, inputs):
    value = shape_values(inputs[0])
    if value is None or inputs[1] is None:
        return None
    return _cast_to(context, node, value, value_dtype(inputs[1]))


@folder("Where")
def fold_where(context, node, inputs):
    operands = [shape_values(i) for i in inputs]
    if any(o is None for o in operands):
        return None
    broadcast = _broadcast(operands)  # type: ignore[arg-type]
    if broadcast is None:
        return None
    rows, scalar = broadcast
    values = []
    for condition, a, b in rows:
        truth = _truth(condition)
        constant = as_int(truth)
        values.append(a if constant == 1 else b if constant == 0 else _add(_mul(truth, a), _mul(1 - truth, b)))
    return _result(context, node, ShapeValues(tuple(values), scalar, operands[1].dtype))  # type: ignore[union-attr]


@folder("Identity")
def fold_identity(context, node, inputs):
    return inputs[0]


@folder("Shape")
def fold_shape(context, node, inputs):
    value = shape_values(inputs[0])
    if value is None:
        return None
    dims = [] if value.scalar else [len(value.values)]
    attrs = _attrs(node)
    start, end = int(attrs.get("start", 0)), attrs.get("end")
    dims = dims[slice(start, None if end is None else int(end))]
    return make_constant(context, np.array(dims, dtype=np.int64), node.output[0])


@folder("Size")
def fold_size(context, node, inputs):
    value = shape_values(inputs[0])
    if value is None:
        return None
    return make_constant(context, np.array(len(value.values), dtype=np.int64), node.output[0])


@folder("Gather")
def fold_gather(context, node, inputs):
    data, indices = shape_values(inputs[0]), shape_values(inputs[1])
    if data is None or indices is None or data.scalar or int(_attrs(node).get("axis", 0)) not in (0, -1):
        return None
    picked = []
    for index in indices.values:
        position = as_int(index)
        if position is None:
            return None
        if not -len(data.values) <= position < len(data.values):
            raise DeductionError(f"gather: index {position} is out of range for {len(data.values)} values")
        picked.append(data.values[position])
    return _result(context, node, ShapeValues(tuple(picked), indices.scalar, data.dtype))


@folder("Unsqueeze")
def fold_unsqueeze(context, node, inputs):
    value = shape_values(inputs[0])
    axes = _axes(node, inputs, 1)
    if value is None or not value.scalar or axes not in ([0], [-1]):
        return None
    return _result(context, node, ShapeValues(value.values, False, value.dtype))


@folder("Squeeze")
def fold_squeeze(context, node, inputs):
    value = shape_values(inputs[0])
    axes = _axes(node, inputs, 1)
    if value is None or axes is False:
        return None
    if value.scalar:
        return inputs[0] if not axes else None
    if len(value.values) != 1 or axes not in (None, [0], [-1]):
        return None
    return _result(context, node, ShapeValues(value.values, True, value.dtype))


@folder("Concat")
def fold_concat(context, node, inputs):
    operands = [shape_values(i) for i in inputs if i is not None]
    if not operands or any(o is None or o.scalar for o in operands):
        return None
    if int(_attrs(node).get("axis", 0)) not in (0, -1):
        return None
    values = tuple(v for o in operands for v in o.values)  # type: ignore[union-attr]
    if len(values) > SHAPE_VALUE_LIMIT:
        return None
    return _result(context, node, ShapeValues(values, False, operands[0].dtype))  # type: ignore[union-attr]


@folder("Slice")
def fold_slice(context, node, inputs):
    value = shape_values(inputs[0])
    if value is None or value.scalar:
        return None
    if len(inputs) > 1:  # opset 10 and later: starts, ends, axes, steps are inputs
        starts, ends = constant_ints(inputs[1]), constant_ints(inputs[2]) if len(inputs) > 2 else None
        axes = constant_ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else [0]
        steps = constant_ints(inputs[4]) if len(inputs) > 4 and inputs[4] is not None else [1]
    else:
        attrs = _attrs(node)
        starts, ends = attrs.get("starts"), attrs.get("ends")
        axes, steps = attrs.get("axes", [0]), [1]
    if starts is None or ends is None or axes is None or steps is None:
        return None
    if len(starts) != 1 or len(ends) != 1 or list(axes) not in ([0], [-1]) or len(steps) != 1 or steps[0] == 0:
        return None
    positions = range(*slice(int(starts[0]), int(ends[0]), int(steps[0])).indices(len(value.values)))
    return _result(context, node, ShapeValues(tuple(value.values[p] for p in positions), False, value.dtype))


@folder("Reshape")
def fold_reshape(context, node, inputs):
    value, target = shape_values(inputs[0]), constant_ints(inputs[1])
    if value is None or target is None or len(target) > 1:
        return None
    count = len(value.values)
    if not target:
        return _result(context, node, ShapeValues(value.values, True, value.dtype)) if count == 1 else None
    wanted = target[0]
    if wanted == 0 and not _attrs(node).get("allowzero", 0):
        wanted = 1 if value.scalar else count
    if wanted not in (-1, count):
        return None
    return _result(context, node, ShapeValues(value.values, False, value.dtype))


@folder("Expand")
def fold_expand(context, node, inputs):
    value, target = shape_values(inputs[0]), constant_ints(inputs[1])
    if value is None or target is None or len(target) > 1:
        return None
    if not target:
        return inputs[0]
    count, wanted = len(value.values), target[0]
    if count == 1:
        length = wanted
    elif wanted in (1, count):
        length = count
    else:
        return None
    if length > SHAPE_VALUE_LIMIT or length < 0:
        return None
    values = value.values * length if count == 1 else value.values
    return _result(context, node, ShapeValues(values, False, value.dtype))


@folder("ConstantOfShape")
def fold_constant_of_shape(context, node, inputs):
    shape = constant_ints(inputs[0])
    if shape is None or any(d < 0 for d in shape) or math.prod(shape) > FOLD_LIMIT_ELEMENTS:
        return None

    attrs = _attrs(node)
    fill = tensor_to_array(attrs["value"]).reshape(-1) if "value" in attrs else np.zeros(1, np.float32)
    return make_constant(context, np.full(shape, fill[0], dtype=fill.dtype), node.output[0])


@folder("Range")
def fold_range(context, node, inputs):
    operands = [shape_values(i) for i in inputs]
    if any(o is None or len(o.values) != 1 for o in operands):
        return None
    start, limit, delta = (o.values[0] for o in operands)  # type: ignore[union-attr]
    if any(isinstance(v, Ratio) for v in (start, limit, delta)):
        return None
    step = as_int(delta)
    if step is None or step == 0:
        return None
    count = as_int(arange_length(start, limit, step))
    if count is None or count > SHAPE_VALUE_LIMIT:
        return None  # a tensor of symbolic length: the converter emits arange
    values = tuple(simplify(start + i * step) for i in range(count))
    return _result(context, node, ShapeValues(values, False, operands[0].dtype))  # type: ignore[union-attr]


def _reduce(combine: Callable):
    def fold(context, node, inputs):
        value = shape_values(inputs[0])
        axes = _axes(node, inputs, 1)
        attrs = _attrs(node)
        if value is None or axes is False or not value.values:
            return None
        if value.scalar:
            return inputs[0] if not axes else None
        if axes == [] and attrs.get("noop_with_empty_axes", 0):
            return inputs[0]
        if axes not in (None, [], [0], [-1]):
            return None
        result = _fold_row(combine, value.values)
        keepdims = bool(attrs.get("keepdims", 1))
        return _result(context, node, ShapeValues((result,), not keepdims, value.dtype))

    return fold


SYMBOLIC_FOLDERS["ReduceProd"] = _reduce(_mul)
SYMBOLIC_FOLDERS["ReduceSum"] = _reduce(_add)
SYMBOLIC_FOLDERS["ReduceMax"] = _reduce(_max)
SYMBOLIC_FOLDERS["ReduceMin"] = _reduce(_min)
