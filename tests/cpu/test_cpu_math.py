"""The math functions of kernels.wasm (relaxweb/cpu/math.py) run through wasmtime on ~3e5 points
each, against numpy in float64: dense samples of each function's domain, magnitudes from the
denormals to the largest float, and the special values.  Both forms are checked: the vector
form by a kernel over an array (v128 loads), the scalar form by a kernel calling it per element.

Errors are in ulps of the exact result (the spacing of float32 at its magnitude; denormal results
have the denormal spacing); a result that is not finite in float32 must be the same inf or a NaN.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import wasmtime

from relaxweb.cpu.math import MATH_FUNCTIONS, UNARY
from relaxweb.cpu.module import KernelFunctions, assemble_kernels_module, wat_to_wasm
from tests.wasm_kernels import run_wasm_kernel

F32 = np.float32
TINY = float(np.finfo(np.float32).tiny)  # smallest normal
DENORMAL = float(np.finfo(np.float32).smallest_subnormal)
HUGE = float(np.finfo(np.float32).max)
INF, NAN = float("inf"), float("nan")
TRIG_RANGE = 39000.0  # sin, cos, tan: the range math.py guarantees


def _kernel(function: str, arity: int, vector: bool) -> str:
    """``$main``: unit ``u`` computes ``function`` on element ``u`` of the inputs (the vector form:
    elements 4u .. 4u + 3) into the output; ``$units``: element_count / lanes, rounded up."""
    lanes, load, store = (4, "v128.load", "v128.store") if vector else (1, "f32.load", "f32.store")
    if function.startswith("unpack_half") and not vector:
        load = "i32.load"
    buffers = " ".join(f"(param $b{i} i32)" for i in range(1, arity + 2))
    arguments = " ".join(f"({load} (i32.add (local.get $b{i}) (local.get $at)))" for i in range(1, arity + 1))
    return f"""
(func $main (param $params i32) (param $first i32) (param $end i32) (param $scratch i32) {buffers}
  (local $u i32) (local $at i32)
  (local.set $u (local.get $first))
  (block $done (loop $next
    (br_if $done (i32.ge_u (local.get $u) (local.get $end)))
    (local.set $at (i32.mul (local.get $u) (i32.const {4 * lanes})))
    ({store} (i32.add (local.get $b{arity + 1}) (local.get $at)) (call ${function} {arguments}))
    (local.set $u (i32.add (local.get $u) (i32.const 1)))
    (br $next))))
(func $units (param $params i32) (result i32)
  (i32.div_u (i32.add (i32.load (local.get $params)) (i32.const {lanes - 1})) (i32.const {lanes})))
"""


_MODULES: dict[tuple[str, int], bytes] = {}


def evaluate(name: str, *args: np.ndarray, vector: bool = True) -> np.ndarray:
    """``NAME_f32x4`` (or ``NAME_f32``) of ``kernels.wasm`` on float32 (or int32) arrays."""
    count = len(args[0])
    padded = [np.concatenate([a, np.zeros((-count) % 4, a.dtype)]) for a in args]
    key = (name, len(args))
    if key not in _MODULES:
        kernels = [KernelFunctions(0, f"{name} f32x4", _kernel(f"{name}_f32x4", len(args), True)),
                   KernelFunctions(1, f"{name} f32", _kernel(f"{name}_f32", len(args), False))]
        _MODULES[key] = wat_to_wasm(assemble_kernels_module(kernels, name, MATH_FUNCTIONS))
    output = np.zeros(len(padded[0]), np.float32)
    result = run_wasm_kernel(_MODULES[key], 0 if vector else 1, padded, output, [len(padded[0])])
    return result[:count]


def ulp_errors(got: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """|got - exact| in ulps of float32 at |exact|; inf where a non-finite result differs."""
    with np.errstate(over="ignore"):  # beyond float32's range: inf, compared as such
        exact32 = exact.astype(np.float32)
    finite = np.isfinite(exact32)
    spacing = np.spacing(np.abs(exact32[finite])).astype(np.float64)
    errors = np.zeros(len(got))
    errors[finite] = np.abs(got[finite].astype(np.float64) - exact[finite]) / spacing
    same = (got[~finite] == exact32[~finite]) | (np.isnan(got[~finite]) & np.isnan(exact32[~finite]))
    errors[~finite] = np.where(same, 0.0, np.inf)
    return errors


def _samples(low: float, high: float, count: int = 200_000) -> np.ndarray:
    """Dense points of [low, high] and of its part in [-10, 10] (where sin and cos turn), and
    magnitudes 2^-149 .. high on a log scale of both signs (those inside the interval), as
    float32."""
    dense = np.concatenate([np.linspace(low, high, count), np.linspace(max(low, -10.0), min(high, 10.0), 100_000)])
    magnitudes = np.geomspace(DENORMAL, max(abs(low), abs(high)), 50_000)
    logscale = np.concatenate([magnitudes, -magnitudes])
    logscale = logscale[(logscale >= low) & (logscale <= high)]
    return np.concatenate([dense, logscale]).astype(np.float32)


SPECIALS = np.array([0.0, -0.0, INF, -INF, NAN, DENORMAL, -DENORMAL, TINY, -TINY, HUGE, -HUGE,
                     1.0, -1.0, 0.5, -0.5, 2.0, 1e-30, -1e-30], np.float32)

# name, float64 reference, sampled interval, ulp bound (relative everywhere, zero crossings of
# sin / cos / tan included: the four-part reduction keeps them accurate up to TRIG_RANGE)
UNARY_CASES = [
    ("exp", np.exp, (-104.0, 89.0), 2),
    ("log", np.log, (0.0, HUGE), 2),
    ("tanh", np.tanh, (-20.0, 20.0), 2),
    ("sigmoid", lambda x: 1 / (1 + np.exp(-x)), (-110.0, 100.0), 3),  # one division: 2.40 ulp measured
    ("sin", np.sin, (-TRIG_RANGE, TRIG_RANGE), 4),
    ("cos", np.cos, (-TRIG_RANGE, TRIG_RANGE), 4),
    ("tan", np.tan, (-TRIG_RANGE, TRIG_RANGE), 4),
    ("asin", np.arcsin, (-1.0, 1.0), 4),
    ("acos", np.arccos, (-1.0, 1.0), 4),
    ("atan", np.arctan, (-1e4, 1e4), 4),
    ("asinh", np.arcsinh, (-1e4, 1e4), 4),
    ("acosh", np.arccosh, (1.0, 1e4), 4),
    ("atanh", np.arctanh, (-1.0, 1.0), 4),
    ("erf", np.vectorize(math.erf, otypes=[np.float64]), (-5.0, 5.0), 2),
]


def _check(name, got, x, exact, ulps):
    errors = ulp_errors(got, exact)
    bad = errors > ulps
    if bad.any():
        worst = np.argmax(np.where(bad, errors, -1))
        raise AssertionError(f"{name}: {bad.sum()} of {len(x)} points beyond {ulps} ulp; worst at x = "
                             f"{x[worst]!r}: {got[worst]!r}, exact {exact[worst]!r} ({errors[worst]:.2f} ulp)")


@pytest.mark.parametrize("name, reference, interval, ulps", UNARY_CASES, ids=[c[0] for c in UNARY_CASES])
def test_unary_accuracy(name, reference, interval, ulps):
    low, high = interval
    specials = SPECIALS[~np.isfinite(SPECIALS) | ((SPECIALS >= low) & (SPECIALS <= high))]
    x = np.concatenate([_samples(low, high), specials])
    with np.errstate(all="ignore"):
        exact = reference(x.astype(np.float64))
    for vector in (True, False):
        got = evaluate(name, x, vector=vector)
        _check(f"{name} ({'f32x4' if vector else 'f32'})", got, x, exact, ulps)


def test_trig_beyond_range():
    """Beyond |x| = 39000 sin and cos lose accuracy (the reduction by pi/2 runs out of bits) but
    stay within [-1, 1], and tan stays finite, up to the largest float."""
    magnitudes = np.geomspace(TRIG_RANGE, HUGE, 100_000).astype(np.float32)
    x = np.concatenate([magnitudes, -magnitudes])
    for name in ("sin", "cos"):
        got = evaluate(name, x)
        assert np.all(np.abs(got) <= 1.0), name
    assert np.all(np.isfinite(evaluate("tan", x)))


def _at(function, value: float) -> float:
    """``function`` in float64 at the float32 nearest ``value`` (the point the kernel sees)."""
    return float(function(np.float64(np.float32(value))))


def test_special_values():
    """The values the brief names, exactly: overflow and underflow thresholds, log's poles,
    saturation, the ends of asin / acos / atanh."""
    expected = {
        "exp": [(88.72283, _at(np.exp, 88.72283)), (88.7229, INF), (-87.33654, _at(np.exp, -87.33654)),
                (-103.9721, _at(np.exp, -103.9721)), (-104.0, 0.0), (INF, INF), (-INF, 0.0), (NAN, NAN), (-0.0, 1.0)],
        "log": [(0.0, -INF), (-0.0, -INF), (-1.0, NAN), (-INF, NAN), (INF, INF), (NAN, NAN), (1.0, 0.0),
                (DENORMAL, _at(np.log, DENORMAL)), (HUGE, _at(np.log, HUGE))],
        "tanh": [(-0.0, -0.0), (10.0, 1.0), (-10.0, -1.0), (INF, 1.0), (-INF, -1.0), (NAN, NAN), (1e-30, 1e-30)],
        "sigmoid": [(0.0, 0.5), (20.0, 1.0 / (1.0 + np.exp(-20.0))), (INF, 1.0), (-INF, 0.0), (NAN, NAN),
                    (-100.0, np.exp(-100.0))],
        "sin": [(-0.0, -0.0), (INF, NAN), (-INF, NAN), (NAN, NAN), (DENORMAL, DENORMAL)],
        "cos": [(0.0, 1.0), (INF, NAN), (NAN, NAN)],
        "tan": [(-0.0, -0.0), (INF, NAN), (NAN, NAN)],
        "asin": [(1.0, np.pi / 2), (-1.0, -np.pi / 2), (1.0000001, NAN), (-2.0, NAN), (-0.0, -0.0), (NAN, NAN)],
        "acos": [(1.0, 0.0), (-1.0, np.pi), (0.0, np.pi / 2), (1.0000001, NAN), (-2.0, NAN), (NAN, NAN)],
        "atan": [(INF, np.pi / 2), (-INF, -np.pi / 2), (-0.0, -0.0), (HUGE, np.pi / 2), (NAN, NAN)],
        "asinh": [(HUGE, _at(np.arcsinh, HUGE)), (-INF, -INF), (-0.0, -0.0), (NAN, NAN)],
        "acosh": [(1.0, 0.0), (0.9999999, NAN), (HUGE, _at(np.arccosh, HUGE)), (INF, INF), (NAN, NAN)],
        "atanh": [(1.0, INF), (-1.0, -INF), (1.0000001, NAN), (-0.0, -0.0), (NAN, NAN)],
        "erf": [(-0.0, -0.0), (4.0, 1.0), (-HUGE, -1.0), (INF, 1.0), (-INF, -1.0), (NAN, NAN),
                (DENORMAL, _at(math.erf, DENORMAL))],
    }
    for name, pairs in expected.items():
        x = np.array([p[0] for p in pairs], np.float32)
        exact = np.array([p[1] for p in pairs], np.float64)
        for vector in (True, False):
            got = evaluate(name, x, vector=vector)
            assert np.array_equal(np.signbit(got[exact == 0]), np.signbit(exact[exact == 0])), (name, x, got)
            _check(name, got, x, exact, 2)


def test_pow_accuracy():
    """pow within 8 ulp (measured: 0.5) for positive x over magnitudes 2^-149 .. 3e38 and
    exponents up to +-100, integer exponents included; the special cases of WGSL's pow."""
    rng = np.random.default_rng(0)
    x = np.exp(rng.uniform(np.log(DENORMAL), np.log(HUGE), 200_000)).astype(np.float32)
    y = rng.uniform(-100.0, 100.0, 200_000).astype(np.float32)
    y[::2] = np.round(y[::2] / 10)  # integer exponents -10 .. 10
    x[:50_000] = rng.uniform(0.0, 4.0, 50_000)
    specials = [(0.0, 2.0, 0.0), (0.0, -1.0, INF), (0.0, 0.0, 1.0), (2.0, 0.0, 1.0), (NAN, 0.0, 1.0),
                (1.0, NAN, 1.0), (1.0, INF, 1.0), (INF, 2.0, INF), (INF, -2.0, 0.0), (-2.0, 0.5, NAN),
                (2.0, 128.0, INF), (2.0, -149.0, 2.0 ** -149), (2.0, -150.5, 0.0), (3.0, 3.0, 27.0),
                (10.0, -3.0, 1e-3), (NAN, 1.0, NAN), (2.0, NAN, NAN)]
    x = np.concatenate([x, np.array([s[0] for s in specials], np.float32)])
    y = np.concatenate([y, np.array([s[1] for s in specials], np.float32)])
    with np.errstate(all="ignore"):
        exact = np.power(x.astype(np.float64), y.astype(np.float64))
    exact[-len(specials):] = [s[2] for s in specials]
    for vector in (True, False):
        got = evaluate("pow", x, y, vector=vector)
        _check(f"pow ({'f32x4' if vector else 'f32'})", got, x, exact, 8)


def test_unpack_half_every_half():
    """All 65536 halves (with garbage in the high 16 bits) against numpy's float16, bit for bit
    (NaNs: any NaN)."""
    halves = np.arange(65536, dtype=np.uint32)
    words = (halves | (np.uint32(0xABCD) << np.uint32(16))).astype(np.uint32).view(np.int32)
    expected = halves.astype(np.uint16).view(np.float16).astype(np.float32)
    for vector in (True, False):
        got = evaluate("unpack_half", words, vector=vector)
        nan = np.isnan(expected)
        assert np.array_equal(np.isnan(got), nan)
        assert np.array_equal(got[~nan].view(np.uint32), expected[~nan].view(np.uint32))


_CONTROL = re.compile(r"\((?:loop|block|if|br|br_if|br_table|return)\b")


def test_vector_forms_have_no_branches():
    """Every ``_f32x4`` form (and the helpers) is straight-line code: no loop, block or branch."""
    for name, text in MATH_FUNCTIONS.items():
        assert not _CONTROL.search(text), name


def test_signatures():
    """The names and scalar signatures other parts call; the whole dict assembles as one module."""
    module = wasmtime.Module(wasmtime.Engine(), wat_to_wasm(
        "(module\n" + "\n".join(MATH_FUNCTIONS.values()) + "\n"
        + "\n".join(f'(export "{name}" (func ${name}))' for name in MATH_FUNCTIONS if name.endswith("_f32")) + ")"))
    types = {export.name: ([str(t) for t in export.type.params], [str(t) for t in export.type.results])
             for export in module.exports}
    expected = {f"{name}_f32": (["f32"], ["f32"]) for name in UNARY}
    expected["pow_f32"] = (["f32", "f32"], ["f32"])
    expected["unpack_half_f32"] = (["i32"], ["f32"])
    assert types == expected
    for name in expected:
        assert f"{name}x4" in MATH_FUNCTIONS
