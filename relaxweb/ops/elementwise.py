"""Elementwise ops: binary arithmetic with broadcasting, and unary math and activations.

Each output element depends only on the input elements at the same (broadcast) index, so
each legalizes (where the scalar IR can express it) to one tensor program whose body is the
scalar operation.

Binary ops: ``add``, ``subtract``, ``multiply``, ``divide`` (integers truncate toward zero,
as in C and ONNX), ``maximum``, ``minimum``, ``power`` (the result has the base's dtype; the
exponent may have another), ``mod`` (``fmod=False``: the sign of the divisor, as Python;
``fmod=True``: the sign of the dividend, as C's ``fmod``), ``left_shift``, ``right_shift``
(integers; a shift past the bit width gives 0), ``bitwise_and``, ``bitwise_or``,
``bitwise_xor`` (integers), and ``prelu(x, slope)``; ``bitwise_not(x)`` (integers) is unary.

Unary ops keep the annotation of their argument.  Some take float attributes: ``leaky_relu``
/ ``elu`` / ``celu`` / ``thresholded_relu`` (``alpha``), ``selu`` (``alpha``, ``gamma``),
``hard_sigmoid`` (``alpha``, ``beta``), ``shrink`` (``lambd``, ``bias``).  ``gelu`` is the
exact form (with erf), ``gelu_tanh`` its tanh approximation.

Deduction: binary ops broadcast (``broadcast_shapes``: 1 takes the other side, otherwise the
dims must be provably equal); with an operand of unknown shape the result's shape is unknown
and its rank the larger of the two (unknown if either rank is).

Legalization uses the scalar nodes of ``ir/tir.py`` (Binary, Unary with the WGSL math
functions, Compare, Select).  ``erf`` (and exact ``gelu``) use a float32 approximation:
``x * P(x^2)`` (Taylor, 8 terms: the ninth is under 2e-8 there) for ``|x| < 0.75`` and
``1 - erfc`` with the Numerical Recipes Chebyshev fit of ``erfc`` (relative error 1.2e-7)
above; max abs error 1.3e-7 in float32 arithmetic (on a GPU, WGSL's ``exp`` precision adds a
little).  A float's ``abs`` is ``Unary`` abs (an integer's ``max(x, -x)``).  ``power`` with a
constant exponent that is a small integer (|n| <= 8) multiplies (``x*x*x``), 0.5 is ``sqrt``; otherwise
it uses WGSL ``pow`` on ``|a|`` and puts the sign back for integer exponents; a negative base
with a non-integer exponent gives WGSL's undefined ``pow`` result (numpy: NaN), and integer
tensors go through float32 (exact up to 2^24).  ``mod`` is ``a - b * floor(a / b)`` (or
``trunc`` for fmod) on floats, computed in float32 (not exact for huge quotients; float16 and
float64 too, which the device holds as float32); on integers the remainder of WGSL's
truncating division, moved into the divisor's sign for the floor mod (a zero divisor is the run's error,
as numpy).  ``softplus`` is ``max(x, 0) + log(1 + exp(-|x|))``, ``mish``
``x * tanh(softplus(x))``.  Ops without a body register no legalization: they import and run in
the interpreter, and building lists them as having no GPU lowering.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..errors import RunCheckError, UnsupportedModelError, run_error_message
from ..ir.dtype import DtypeInfo, DtypeKind, dtype_info
from ..ir.expr import Call, Constant, tensor_dtype
from ..ir.integer_checks import CheckedDivisor
from ..ir.op_registry import DeductionError, node_named, register_op
from ..ir.struct_info import TensorStructInfo
from ..ir.symbolic import IntImm, SizeVar
from ..ir.tir import (
    MATH_FUNCTIONS, Cast, FloatImm, IndexValue, Reduce, ReduceCombiner, ScalarExpr, Unary, absolute, bitwise_and,
    bitwise_or, bitwise_xor, cast, ceil, exp, floor, is_nan, log, maximum, minimum, power, round_half_even, select,
    sigmoid, sqrt, tanh,
)
from .common import (
    broadcast_shapes, expect_args, integer_arithmetic, load_broadcast, make_program, needs_known_shapes, require_float,
    require_tensor, same_dtype, unknown_rank_join,
)


def _is_integer(dtype) -> bool:
    return np.issubdtype(np.dtype(dtype), np.integer)


def require_numeric(op: str, info: TensorStructInfo, position: int = 0) -> None:
    if info.dtype == "bool":
        raise DeductionError(f"{op}: argument {position} must be a numeric tensor, got bool")


def require_integer(op: str, info: TensorStructInfo, position: int = 0) -> None:
    if not _is_integer(info.dtype):
        raise DeductionError(f"{op}: argument {position} must be an integer tensor, got {info.dtype}")


def broadcast_info(op: str, infos: list[TensorStructInfo], dtype: str) -> TensorStructInfo:
    """The annotation of a broadcast result of ``dtype`` (shape unknown if any input's is)."""
    if any(info.shape is None for info in infos):
        return TensorStructInfo(None, dtype, unknown_rank_join([info.ndim for info in infos]))
    return TensorStructInfo(broadcast_shapes(op, [info.shape for info in infos]), dtype)


# Binary ops -----------------------------------------------------------------------------------


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if _is_integer(a.dtype):
        # Integer division truncates toward zero (C, ONNX); exact for all of int64.
        quotient = np.floor_divide(a, b)
        remainder = np.remainder(a, b)
        adjust = (remainder != 0) & ((a < 0) ^ (b < 0))
        return quotient + adjust.astype(quotient.dtype)
    return np.divide(a, b)


def _shift(direction: str):
    """As ONNX: a shift by a negative amount or by the bit width or more gives 0 (-1 for a
    right shift of a negative signed value); a left shift of a signed value wraps."""
    def shift(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a, b = np.broadcast_arrays(a, b)
        bits = np.iinfo(a.dtype).bits
        valid = (b >= 0) & (b < bits)
        unsigned = np.dtype(f"u{a.dtype.itemsize}")
        amount = np.where(valid, b, 0).astype(unsigned)
        if direction == "left":
            shifted = np.left_shift(a.astype(unsigned), amount)  # wraps, as C on unsigned values
            return np.where(valid, shifted, 0).astype(a.dtype)
        shifted = np.right_shift(a, amount.astype(a.dtype))
        overflow = np.where(a < 0, -1, 0) if np.issubdtype(a.dtype, np.signedinteger) else 0
        return np.where(valid, shifted, overflow).astype(a.dtype)

    return shift


BINARY_REFERENCE: dict[str, Callable] = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": _divide,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "power": np.power,
    "mod": None,  # depends on the fmod attribute (below)
    "left_shift": _shift("left"),
    "right_shift": _shift("right"),
    "prelu": lambda x, slope: np.where(x < 0, x * slope, x),
    "bitwise_and": np.bitwise_and,
    "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor,
}

#: The integer ops that fail on a zero divisor (onnxruntime refuses the run), and how they say it.
ZERO_DIVISOR_MESSAGES = {"divide": "integer division by zero", "mod": "integer modulo by zero"}


# Scalar bodies, for the ops the scalar IR can express.
BINARY_BODIES: dict[str, Callable[[ScalarExpr, ScalarExpr, str], ScalarExpr]] = {
    "add": lambda a, b, dtype: a + b,
    "subtract": lambda a, b, dtype: a - b,
    "multiply": lambda a, b, dtype: a * b,
    "divide": lambda a, b, dtype: a / b,
    "maximum": lambda a, b, dtype: maximum(a, b),
    "minimum": lambda a, b, dtype: minimum(a, b),
    "prelu": lambda x, slope, dtype: select(x.lt(0), x * slope, x),
    "bitwise_and": lambda a, b, dtype: bitwise_and(a, b),
    "bitwise_or": lambda a, b, dtype: bitwise_or(a, b),
    "bitwise_xor": lambda a, b, dtype: bitwise_xor(a, b),
}

# Binary ops on the bits of integers.
BITWISE = ("bitwise_and", "bitwise_or", "bitwise_xor")


def _deduce_binary(name: str):
    def deduce(args, attrs) -> TensorStructInfo:
        expect_args(name, args, 2)
        a, b = (require_tensor(arg, name, i) for i, arg in enumerate(args))
        if name == "power":
            require_numeric(name, a, 0)
            require_numeric(name, b, 1)
            dtype = a.dtype  # the exponent may have another dtype
        else:
            dtype = same_dtype(name, [a, b])
        if name in ("left_shift", "right_shift"):
            require_integer(name, a, 0)
        if name in BITWISE:
            require_integer(name, a, 0)
        return broadcast_info(name, [a, b], dtype)

    return deduce


def _trunc(q: ScalarExpr) -> ScalarExpr:
    return select(q.lt(0), ceil(q), floor(q))


def _divisor_check(context, call: Call) -> Callable[[ScalarExpr], ScalarExpr]:
    """How a divide or mod legalization reads its divisor: an integer one checked at run time
    (:class:`~relaxweb.ir.integer_checks.CheckedDivisor`: a zero is the run's error, as in
    onnxruntime), with one error site for the call; a float one as it is."""
    if call.op not in ZERO_DIVISOR_MESSAGES or not dtype_info(call.struct_info.dtype).is_integer:
        return lambda divisor: divisor
    site = context.error_site(call, ZERO_DIVISOR_MESSAGES[call.op])
    return lambda divisor: CheckedDivisor(site, divisor)


def _legalize_mod(context, call: Call):
    info = call.struct_info
    entry = dtype_info(info.dtype)
    if not entry.on_gpu:
        raise UnsupportedModelError(f"mod: no GPU lowering for {info.dtype} tensors (no GPU representation)")
    body = _float_mod_body if entry.is_float else _integer_mod_body
    fmod = bool(call.attrs.get("fmod"))
    divisor = _divisor_check(context, call)
    program = make_program("mod", call.args, info.shape, info.dtype,
                           lambda axes, buffers: body(load_broadcast(buffers[0], axes),
                                                      divisor(load_broadcast(buffers[1], axes)), fmod, entry))
    return context.call_tir(program, call.args)


def _float_mod_body(a: ScalarExpr, b: ScalarExpr, fmod: bool, entry: DtypeInfo) -> ScalarExpr:
    """``a - b * floor(a / b)`` (``trunc`` for fmod), in float32 (float16 and float64 are
    float32 on the device, and the interpreter computes as the device does)."""
    a, b = cast("float32", a), cast("float32", b)
    rounding = _trunc if fmod else floor
    general = a - b * rounding(a / b)
    # a finite dividend and an infinite divisor (where the formula gives NaN): a, or for the
    # floor mod with opposite signs the divisor (as numpy / Python)
    largest = 3.4028234663852886e38
    pick = a if fmod else select(a.ge(0.0).eq(b.gt(0.0)), a, b)
    return cast(entry.name, select(_abs(b).gt(largest), select(_abs(a).le(largest), pick, general), general))


def _integer_mod_body(a: ScalarExpr, b: ScalarExpr, fmod: bool, entry: DtypeInfo) -> ScalarExpr:
    """The remainder of the division truncated toward zero, moved into the divisor's sign
    for the floor mod of signed integers (``b`` is a checked divisor: a zero one is the run's
    error).  Exact: computed in the 32-bit integers every integer dtype but int64 has on the
    device, where its values fit, and an int64 in int64 (exact in kernels.wasm); the quotient
    is cast, which truncates a float quotient in the interpreter as WGSL's integer ``/`` does.
    A divisor of -1 divides as 1 (the remainder is 0 either way, and ``INT_MIN / -1`` would
    leave the dtype)."""
    work = "int64" if entry.name == "int64" else "int32" if entry.kind is DtypeKind.INT else "uint32"
    a, b = cast(work, a), cast(work, b)
    if work != "uint32":
        b = select(b.eq(-1), _imm(1, work), b)
    remainder = a - b * Cast(work, a / b)
    if not fmod and work != "uint32":
        opposite = select(remainder.ne(0), remainder.lt(0).ne(b.lt(0)), _imm(0, "bool"))
        remainder = select(opposite, remainder + b, remainder)
    return cast(entry.name, remainder)


def _constant_exponent(expr) -> float | None:
    """The exponent's value when it is a constant with one value everywhere."""
    if not isinstance(expr, Constant) or expr.data.size == 0:
        return None
    data = np.asarray(expr.data, dtype=np.float64).reshape(-1)
    return float(data[0]) if np.all(data == data[0]) else None


def _integer_power(x: ScalarExpr, n: int, dtype: str) -> ScalarExpr:
    """``x ** n`` by multiplications (``n`` a small integer; 0 gives 1, as ONNX)."""
    if n == 0:
        return FloatImm(1, "int32" if dtype == "int64" else dtype)  # int64 lives as i32 on the device
    result = x
    for _ in range(abs(n) - 1):
        result = result * x
    return 1 / result if n < 0 else result


def _float_power(a: ScalarExpr, b: ScalarExpr, constant: float | None) -> ScalarExpr:
    """``a ** b`` in float32 with WGSL ``pow``, which is undefined for a negative base: it
    runs on ``|a|`` and the sign comes back for odd integer exponents."""
    magnitude = power(_abs(a), b)
    if constant is None:  # x ** 0 is 1 (ONNX), where WGSL's pow(0, 0) is undefined
        magnitude = select(b.eq(0.0), 1.0, magnitude)
    negative = a.lt(0.0)
    if constant is not None:
        if constant != math.floor(constant):
            return power(a, b)  # a negative base gives NaN (numpy) / undefined (WGSL)
        if constant % 2 == 0:
            return magnitude
        return select(negative, -magnitude, magnitude)
    half = b * 0.5
    odd = floor(half).ne(half)
    signed = select(odd, -magnitude, magnitude)
    integer = floor(b).eq(b)
    return select(negative, select(integer, signed, power(a, b)), magnitude)


def _legalize_power(context, call: Call):
    info = call.struct_info
    dtype = info.dtype
    if dtype not in ("float32", "int32", "int64"):  # int64 lives as i32 on the device
        raise UnsupportedModelError(f"power: no GPU lowering for {dtype} tensors yet")
    constant = _constant_exponent(call.args[1])
    if constant is not None and constant == int(constant) and abs(constant) <= 8 and (dtype == "float32" or constant >= 0):
        def body(axes, buffers):
            return _integer_power(load_broadcast(buffers[0], axes), int(constant), dtype)

        program = make_program("power", call.args[:1], info.shape, dtype, body)
        return context.call_tir(program, call.args[:1])
    if constant == 0.5 and dtype == "float32":
        program = make_program("power", call.args[:1], info.shape, dtype,
                               lambda axes, buffers: sqrt(load_broadcast(buffers[0], axes)))
        return context.call_tir(program, call.args[:1])

    def body(axes, buffers):
        a = cast("float32", load_broadcast(buffers[0], axes))
        b = cast("float32", load_broadcast(buffers[1], axes))
        result = _float_power(a, b, constant)
        return result if dtype == "float32" else Cast("int32", round_half_even(result))

    return context.call_tir(make_program("power", call.args, info.shape, dtype, body), call.args)


SHIFT_BITS = {"int64": 64, "int32": 32, "uint32": 32, "int16": 16, "uint16": 16, "int8": 8, "uint8": 8}


def _legalize_shift(direction: str):
    """Shifts without a shift operator in the scalar IR: ``2 ** b`` is a product over the bit
    width (``select(t < b, 2, 1)``), a left shift multiplies by it (wrapping, then narrowed to
    the dtype's bits by the cast), a right shift divides (floor division for negative signed
    values).  32-bit arithmetic (int32 / uint32): int64 tensors are i32 on the device, so a
    left shift keeps the low 32 bits of the result."""
    name = f"{direction}_shift"

    def legalize(context, call: Call):
        info = call.struct_info
        dtype = info.dtype
        if dtype not in SHIFT_BITS:
            raise UnsupportedModelError(f"{name}: no GPU lowering for {dtype} tensors (only 8, 16, 32-bit integers and int64)")
        bits = SHIFT_BITS[dtype]
        work = "uint32" if dtype.startswith("uint") else "int32"

        def body(axes, buffers):
            a, b = load_broadcast(buffers[0], axes), load_broadcast(buffers[1], axes)
            a = cast(work, a)
            amount = Cast("int32", b)
            t = SizeVar("t_")
            two_to_the = Reduce(ReduceCombiner.PROD, t, IntImm(bits), select(IndexValue(t).lt(amount), _imm(2, work), 1))
            false = _imm(0, "bool")
            valid = select(amount.ge(0), amount.lt(bits), false)
            if direction == "left":
                return Cast(dtype, select(valid, a * two_to_the, 0))
            negative = a.lt(0) if work == "int32" else false
            overflow = select(negative, _imm(-1, work), 0) if work == "int32" else _imm(0, work)
            quotient = Cast(work, a / two_to_the)
            if work == "int32":  # floor division: one less where a negative value does not divide
                inexact = (quotient * two_to_the).ne(a)
                quotient = select(select(negative, inexact, false), quotient - 1, quotient)
                if bits >= 32:  # 2 ** 31 wraps to -2 ** 31 in int32: a >> 31 (or more) is the sign
                    quotient = select(amount.ge(31), overflow, quotient)
            return Cast(dtype, select(valid, quotient, overflow))

        return context.call_tir(make_program(name, call.args, info.shape, dtype, body), call.args)

    return legalize


def _on_gpu(name: str, legalize):
    """``legalize`` for the dtypes the GPU holds (uint64 has no GPU form: a clear error)."""
    def checked(context, call: Call):
        if not dtype_info(call.struct_info.dtype).on_gpu:
            raise UnsupportedModelError(f"{name}: no GPU lowering for {call.struct_info.dtype} tensors "
                                        "(no GPU representation)")
        return legalize(context, call)

    return checked


SPECIAL_BINARY = {"mod": _legalize_mod, "power": _legalize_power,
                  "left_shift": _legalize_shift("left"), "right_shift": _legalize_shift("right")}


def _legalize_binary(name: str):
    if name in SPECIAL_BINARY:
        return SPECIAL_BINARY[name]
    if name in BITWISE:
        return _on_gpu(name, _legalize_body(name))
    return _legalize_body(name)


def _legalize_body(name: str):
    scalar = BINARY_BODIES[name]

    def legalize(context, call: Call):
        info = call.struct_info
        divisor = _divisor_check(context, call)
        program = make_program(
            name, call.args, info.shape, info.dtype,
            lambda axes, buffers: scalar(load_broadcast(buffers[0], axes), divisor(load_broadcast(buffers[1], axes)),
                                         info.dtype),
        )
        return context.call_tir(program, call.args)

    return legalize


def _reference_binary(name: str):
    def reference(arrays, attrs):
        a, b = np.asarray(arrays[0]), np.asarray(arrays[1])
        if name in ZERO_DIVISOR_MESSAGES and _is_integer(a.dtype) and np.any(np.broadcast_arrays(a, b)[1] == 0):
            raise RunCheckError(run_error_message(*node_named(attrs, name), ZERO_DIVISOR_MESSAGES[name], ()))
        with np.errstate(all="ignore"):
            if name == "mod":
                result = np.fmod(a, b) if attrs.get("fmod") else np.mod(a, b)
            elif name == "power" and _is_integer(a.dtype) and _is_integer(b.dtype):
                # numpy refuses negative integer exponents; compute them in float64
                result = np.power(a.astype(np.float64), b) if np.any(b < 0) else np.power(a, b)
            else:
                result = BINARY_REFERENCE[name](a, b)
        return np.asarray(result).astype(a.dtype)

    return reference


for _name in BINARY_REFERENCE:
    register_op(
        _name,
        deduce=_deduce_binary(_name),
        legalize=needs_known_shapes(_legalize_binary(_name)) if _name in BINARY_BODIES or _name in SPECIAL_BINARY else None,
        reference=_reference_binary(_name),
        checks_data=integer_arithmetic,
    )


# Unary ops ------------------------------------------------------------------------------------


def _imm(value: float, dtype: str) -> FloatImm:
    return FloatImm(value, dtype)


def _abs(x: ScalarExpr) -> ScalarExpr:
    return absolute(x) if dtype_info(x.dtype).is_float else maximum(x, -x)


def _sign_rest(x: ScalarExpr, dtype: str) -> ScalarExpr:
    """sign(x) where x is neither positive nor negative: 0, or NaN for a NaN (as numpy and
    onnxruntime)."""
    zero = _imm(0, dtype)
    return select(is_nan(x), x, zero) if dtype_info(dtype).is_float else zero


def _gelu_tanh_body(x: ScalarExpr) -> ScalarExpr:
    cube = x * x * x
    inner = math.sqrt(2 / math.pi) * (x + 0.044715 * cube)
    return 0.5 * x * (1.0 + tanh(inner))


def _elu_body(x: ScalarExpr, alpha: float) -> ScalarExpr:
    negative = alpha * (exp(x) - 1.0)
    return select(x.lt(0.0), negative, x)


def _shrink_body(x: ScalarExpr, lambd: float, bias: float) -> ScalarExpr:
    """ONNX Shrink: ``x + bias`` below ``-lambd``, ``x - bias`` above ``lambd``, 0 between."""
    return select(x.lt(-lambd), x + bias, select(x.gt(lambd), x - bias, 0.0))


def _hard_sigmoid_body(x: ScalarExpr, alpha: float, beta: float) -> ScalarExpr:
    linear = alpha * x + beta
    return maximum(0.0, minimum(1.0, linear))


# erf: Taylor series below ERF_CUT, 1 - erfc (Numerical Recipes' erfcc) above.
ERF_CUT = 0.75
ERF_TAYLOR = tuple(2 / math.sqrt(math.pi) * (-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(8))
ERFC_CHEBYSHEV = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398,
                  1.48851587, -0.82215223, 0.17087277)


def _horner(coefficients, t: ScalarExpr, dtype: str) -> ScalarExpr:
    result: ScalarExpr = _imm(coefficients[-1], dtype)
    for c in coefficients[-2::-1]:
        result = result * t + c
    return result


def _erf_body(x: ScalarExpr, dtype: str) -> ScalarExpr:
    """erf in float32 arithmetic, max abs error 1.3e-7 (see the module docstring)."""
    magnitude = _abs(x)
    small = x * _horner(ERF_TAYLOR, x * x, dtype)
    z = minimum(magnitude, 10.0)  # erfc(10) is 2e-45: no overflow in z*z
    t = 1.0 / (1.0 + 0.5 * z)
    exponent = -(z * z) + _horner(ERFC_CHEBYSHEV, t, dtype)
    large = 1.0 - t * exp(exponent)
    sign = select(x.lt(0.0), _imm(-1.0, dtype), 1.0)
    return select(magnitude.lt(ERF_CUT), small, sign * large)


def _softplus_body(x: ScalarExpr) -> ScalarExpr:
    """log(1 + exp(x)) without overflow: max(x, 0) + log(1 + exp(-|x|))."""
    tail = log(1.0 + exp(-_abs(x)))
    return maximum(x, 0.0) + tail


SELU_ALPHA, SELU_GAMMA = 1.67326319217681884765625, 1.05070102214813232421875

# name -> scalar body (x, attrs, dtype) -> ScalarExpr, for the ops the scalar IR can express
UNARY_BODIES: dict[str, Callable[[ScalarExpr, dict, str], ScalarExpr]] = {
    "relu": lambda x, attrs, dtype: maximum(x, 0.0),
    "sigmoid": lambda x, attrs, dtype: sigmoid(x),
    "tanh": lambda x, attrs, dtype: tanh(x),
    "exp": lambda x, attrs, dtype: exp(x),
    "negative": lambda x, attrs, dtype: -x,
    "identity": lambda x, attrs, dtype: x,
    "abs": lambda x, attrs, dtype: _abs(x),
    "reciprocal": lambda x, attrs, dtype: 1.0 / x,
    "sign": lambda x, attrs, dtype: select(x.gt(0), _imm(1, dtype), select(x.lt(0), _imm(-1, dtype), _sign_rest(x, dtype))),
    "sinh": lambda x, attrs, dtype: 0.5 * (exp(x) - exp(-x)),
    "cosh": lambda x, attrs, dtype: 0.5 * (exp(x) + exp(-x)),
    "softsign": lambda x, attrs, dtype: x / (1.0 + _abs(x)),
    "leaky_relu": lambda x, attrs, dtype: select(x.lt(0.0), attrs.get("alpha", 0.01) * x, x),
    "elu": lambda x, attrs, dtype: _elu_body(x, attrs.get("alpha", 1.0)),
    "selu": lambda x, attrs, dtype: attrs.get("gamma", SELU_GAMMA) * _elu_body(x, attrs.get("alpha", SELU_ALPHA)),
    "celu": lambda x, attrs, dtype: maximum(0.0, x) + minimum(
        0.0, attrs.get("alpha", 1.0) * (exp(x / attrs.get("alpha", 1.0)) - 1.0)),
    "thresholded_relu": lambda x, attrs, dtype: select(x.gt(attrs.get("alpha", 1.0)), x, 0.0),
    "hard_sigmoid": lambda x, attrs, dtype: _hard_sigmoid_body(x, attrs.get("alpha", 0.2), attrs.get("beta", 0.5)),
    "hard_swish": lambda x, attrs, dtype: x * _hard_sigmoid_body(x, 1 / 6, 0.5),
    "shrink": lambda x, attrs, dtype: _shrink_body(x, attrs.get("lambd", 0.5), attrs.get("bias", 0.0)),
    "gelu_tanh": lambda x, attrs, dtype: _gelu_tanh_body(x),
    "erf": lambda x, attrs, dtype: _erf_body(x, dtype),
    "gelu": lambda x, attrs, dtype: 0.5 * x * (1.0 + _erf_body(x * (1 / math.sqrt(2)), dtype)),
    "softplus": lambda x, attrs, dtype: _softplus_body(x),
    "mish": lambda x, attrs, dtype: x * tanh(_softplus_body(x)),
    # WGSL built-ins (float only; see tir.MATH_FUNCTIONS)
    **{function.value: (lambda function: lambda x, attrs, dtype: Unary(function, x))(function) for function in MATH_FUNCTIONS},
}

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(np.zeros((), x.dtype), x)


def _selu(x, attrs):
    alpha, gamma = attrs.get("alpha", SELU_ALPHA), attrs.get("gamma", SELU_GAMMA)
    return np.where(x > 0, gamma * x, gamma * alpha * (np.exp(x) - 1))


# name -> numpy semantics (x, attrs) -> array (cast back to x's dtype by the caller)
UNARY_REFERENCE: dict[str, Callable[[np.ndarray, dict], np.ndarray]] = {
    "relu": lambda x, attrs: np.maximum(x, 0),
    "sigmoid": lambda x, attrs: 1 / (1 + np.exp(-x)),
    "tanh": lambda x, attrs: np.tanh(x),
    "exp": lambda x, attrs: np.exp(x),
    "negative": lambda x, attrs: np.negative(x),
    "identity": lambda x, attrs: x.copy(),
    "abs": lambda x, attrs: np.abs(x),
    "reciprocal": lambda x, attrs: np.reciprocal(x),
    "sign": lambda x, attrs: np.sign(x),
    "sqrt": lambda x, attrs: np.sqrt(x),
    "log": lambda x, attrs: np.log(x),
    "floor": lambda x, attrs: np.floor(x),
    "ceil": lambda x, attrs: np.ceil(x),
    "round": lambda x, attrs: np.round(x),  # halves to even, as ONNX
    "erf": lambda x, attrs: _erf(x),
    "sin": lambda x, attrs: np.sin(x),
    "cos": lambda x, attrs: np.cos(x),
    "tan": lambda x, attrs: np.tan(x),
    "asin": lambda x, attrs: np.arcsin(x),
    "acos": lambda x, attrs: np.arccos(x),
    "atan": lambda x, attrs: np.arctan(x),
    "sinh": lambda x, attrs: np.sinh(x),
    "cosh": lambda x, attrs: np.cosh(x),
    "asinh": lambda x, attrs: np.arcsinh(x),
    "acosh": lambda x, attrs: np.arccosh(x),
    "atanh": lambda x, attrs: np.arctanh(x),
    "softplus": lambda x, attrs: _softplus(x),
    "softsign": lambda x, attrs: x / (1 + np.abs(x)),
    "mish": lambda x, attrs: x * np.tanh(_softplus(x)),
    "gelu": lambda x, attrs: 0.5 * x * (1 + _erf(x.astype(np.float64) / np.sqrt(2))),
    "gelu_tanh": lambda x, attrs: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))),
    "leaky_relu": lambda x, attrs: np.where(x < 0, x * attrs.get("alpha", 0.01), x),
    "elu": lambda x, attrs: np.where(x < 0, attrs.get("alpha", 1.0) * (np.exp(x) - 1), x),
    "selu": _selu,
    "celu": lambda x, attrs: np.maximum(0, x) + np.minimum(
        0, attrs.get("alpha", 1.0) * (np.exp(x / attrs.get("alpha", 1.0)) - 1)),
    "thresholded_relu": lambda x, attrs: np.where(x > attrs.get("alpha", 1.0), x, 0),
    "hard_sigmoid": lambda x, attrs: np.clip(attrs.get("alpha", 0.2) * x + attrs.get("beta", 0.5), 0, 1),
    "hard_swish": lambda x, attrs: x * np.clip(x / 6 + 0.5, 0, 1),
    "shrink": lambda x, attrs: np.where(x < -attrs.get("lambd", 0.5), x + attrs.get("bias", 0.0),
                                        np.where(x > attrs.get("lambd", 0.5), x - attrs.get("bias", 0.0), 0)),
}

# Ops that take any numeric tensor (also integers); the others need a float tensor.
NUMERIC = {"negative", "identity", "abs", "sign"}
FLOAT_ONLY = set(UNARY_REFERENCE) - NUMERIC


def _deduce_unary(name: str):
    def deduce(args, attrs) -> TensorStructInfo:
        expect_args(name, args, 1)
        info = require_tensor(args[0], name, 0)
        if name in FLOAT_ONLY:
            require_float(name, info)
        return info

    return deduce


def _legalize_unary(name: str):
    scalar = UNARY_BODIES[name]

    def legalize(context, call: Call):
        info = call.struct_info
        dtype = tensor_dtype(call.args[0])
        program = make_program(
            name, call.args, info.shape, dtype,
            lambda axes, buffers: scalar(load_broadcast(buffers[0], axes), call.attrs, dtype),
        )
        return context.call_tir(program, call.args)

    return legalize


def _reference_unary(name: str):
    function = UNARY_REFERENCE[name]

    def reference(arrays, attrs):
        x = np.asarray(arrays[0])
        with np.errstate(all="ignore"):
            return np.asarray(function(x, attrs)).astype(x.dtype)

    return reference


for _name in UNARY_REFERENCE:
    register_op(
        _name,
        deduce=_deduce_unary(_name),
        legalize=needs_known_shapes(_legalize_unary(_name)) if _name in UNARY_BODIES else None,
        reference=_reference_unary(_name),
        checks_data=integer_arithmetic,
    )


# bitwise_not ----------------------------------------------------------------------------------


def _deduce_bitwise_not(args, attrs) -> TensorStructInfo:
    expect_args("bitwise_not", args, 1)
    info = require_tensor(args[0], "bitwise_not", 0)
    require_integer("bitwise_not", info)
    return info


def _legalize_bitwise_not(context, call: Call):
    """``~x`` as arithmetic: ``-x - 1`` for signed integers (two's complement, exact on the
    sign-extended device values), ``(2**bits - 1) - x`` for unsigned ones (whose narrow
    dtypes live zero-extended in a u32)."""
    info = call.struct_info
    entry = dtype_info(info.dtype)

    def body(axes, buffers):
        x = load_broadcast(buffers[0], axes)
        if entry.kind is DtypeKind.INT:
            return -x - 1
        return _imm(2 ** (8 * entry.bytes) - 1, info.dtype) - x

    return context.call_tir(make_program("bitwise_not", call.args, info.shape, info.dtype, body), call.args)


register_op("bitwise_not", deduce=_deduce_bitwise_not,
            legalize=needs_known_shapes(_on_gpu("bitwise_not", _legalize_bitwise_not)),
            reference=lambda arrays, attrs: np.invert(np.asarray(arrays[0])))
