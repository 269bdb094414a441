"""Index ``//`` and ``%`` floor on the GPU as in the IR (``relaxweb/wgsl/lower_index.py``).

- The lowering: which divisions keep WGSL's truncating ``/`` and ``%`` (numerator provably
  >= 0, divisor > 0, with the axes' ranges where the emitter declares them) and which call
  the floor helpers, and that a shader declares exactly the helpers it calls.
- The helpers on wgpu against Python's floor division for negative numerators and divisors,
  and the issue's example ``out[i] = A[(i - n) // 2 + n]``.
- A differential property test: random small tensor programs (index arithmetic with
  ``//``, ``%``, ``min``, ``max`` and negative offsets, loads kept in bounds by a floor
  modulo, a Select or a clamping Gather, selects, casts, index values, reductions) give
  exactly the interpreter's output on wgpu, and on kernels.wasm (wasmtime).  The examples
  are fixed (derandomized) and the tests count how many divide a negative numerator, or by a
  negative divisor, at run time, and how many have a Select whose condition bounds an axis
  in its branches (``IndexLowering.assume``), so that they cannot silently stop covering
  them.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from relaxweb.ir.interpreter import run_program
from relaxweb.ir.symbolic import (
    Add, Analyzer, FloorDiv, FloorMod, IntImm, Max, Min, Mul, PrimExpr, SizeVar, Sub, evaluate, simplify,
)
from relaxweb.ir.tir import (
    Binary, Buffer, Cast, Compare, FloatImm, Gather, IndexValue, Load, Reduce, ScalarExpr, Select, TensorProgram,
    format_program, scalar_children,
)
from relaxweb.ir.schedule import ElementSchedule, VectorizedSchedule, WebGpuSchedule, WorkgroupReductionSchedule
from relaxweb.ir.target_schedules import TargetSchedules
from relaxweb.wgsl import emit_wgsl
from relaxweb.ir.lower_index import bounds_from_relation
from relaxweb.wgsl.lower_index import (
    IndexLowering, IndexOp, Operation, helpers_used, lower_index, render_wgsl, with_axis,
)
from tests.fixtures.melspectrogram import MEL_KERNEL, melspectrogram_model
from tests.cpu.test_cpu_kernels import run_on_wasm
from tests.gpu_kernels import run_kernel_on_gpu
import relaxweb

n, m = SizeVar("n"), SizeVar("m")
i, j, k = SizeVar("i"), SizeVar("j"), SizeVar("k")


def wgsl(expr: PrimExpr, analyzer: Analyzer | None = None) -> str:
    return render_wgsl(lower_index(expr, analyzer or Analyzer()), lambda name: name)


def axes_analyzer(**extents: PrimExpr | int) -> Analyzer:
    """An analyzer knowing ``0 <= axis <= extent - 1`` for each axis named."""
    analyzer = Analyzer()
    for name, extent in extents.items():
        analyzer = with_axis(analyzer, name, IntImm(extent) if isinstance(extent, int) else extent)
    return analyzer


# The lowering ---------------------------------------------------------------------------------


def test_non_negative_numerators_and_positive_divisors_keep_truncating_operators() -> None:
    assert wgsl(FloorDiv(i, IntImm(4))) == "(i / 4)"
    assert wgsl(FloorMod(i + 3, IntImm(4))) == "((i + 3) % 4)"
    assert wgsl(FloorDiv(i * n + j, n)) == "(((i * n) + j) / n)"  # a size variable divides: never 0
    assert wgsl(FloorDiv(n, m + 1)) == "(n / (m + 1))"
    assert wgsl(Min(FloorDiv(i, IntImm(2)), Max(j, IntImm(-1)))) == "min((i / 2), max(j, (-1)))"


def test_possibly_negative_numerators_and_negative_divisors_call_the_floor_helpers() -> None:
    assert wgsl(FloorDiv(i - n, IntImm(2))) == "floor_div_i32((i - n), 2)"
    assert wgsl(FloorMod(i - 1, IntImm(3))) == "floor_mod_i32((i - 1), 3)"
    assert wgsl(FloorDiv(i, IntImm(-2))) == "floor_div_i32(i, (-2))"
    assert wgsl(FloorMod(i, IntImm(-2))) == "floor_mod_i32(i, (-2))"
    assert wgsl(FloorDiv(i, n - 4)) == "floor_div_i32(i, (n - 4))"  # the divisor may be negative
    # each division is decided on its own numerator
    assert wgsl(FloorDiv(FloorMod(i - 2, IntImm(5)), IntImm(2))) == "(floor_mod_i32((i - 2), 5) / 2)"


def test_axis_ranges_prove_numerators_non_negative() -> None:
    """``9 - i`` is >= 0 for an axis of extent 10 and ``n - 1 - i`` for one of extent n;
    without the ranges neither is known."""
    assert wgsl(FloorDiv(9 - i, IntImm(2))) == "floor_div_i32((9 - i), 2)"
    assert wgsl(FloorDiv(9 - i, IntImm(2)), axes_analyzer(i=10)) == "((9 - i) / 2)"
    assert wgsl(FloorMod(n - 1 - i, IntImm(4)), axes_analyzer(i=n)) == "(((n - 1) - i) % 4)"
    assert wgsl(FloorMod(n - i, IntImm(4)), axes_analyzer(i=n + 1)) == "((n - i) % 4)"
    assert wgsl(FloorMod(n - 2 - i, IntImm(4)), axes_analyzer(i=n)) == "floor_mod_i32(((n - 2) - i), 4)"


def test_an_inner_declaration_of_an_axis_holds_until_its_scope_is_left() -> None:
    lowering = IndexLowering()
    lowering.declare_axis(k, IntImm(4))
    inside_four = FloorDiv(3 - k, IntImm(2))
    assert helpers_used(lowering.lower(inside_four)) == set()
    lowering.enter()
    lowering.declare_axis(k, IntImm(8))  # a loop over the same name, shadowing the outer one
    assert helpers_used(lowering.lower(inside_four)) == {IndexOp.FLOOR_DIVIDE}
    lowering.leave()
    assert lowering.lower(inside_four) == Operation(IndexOp.TRUNCATING_DIVIDE, lowering.lower(3 - k), lowering.lower(IntImm(2)))
    assert lowering.helpers == {IndexOp.FLOOR_DIVIDE}


def test_a_branch_bounds_the_axes_its_condition_compares() -> None:
    """Past a concatenation's first piece (``i >= n``) ``i - n`` is >= 0 and divides with the
    truncating operators; in a piece of n elements from n, ``(i - n) // (m + n)`` is 0; the bound
    holds until the branch's scope is left, and not for an axis declared again inside it."""
    lowering = IndexLowering()
    lowering.declare_axis(i, 2 * n + m)
    past = FloorMod(i - n, m)
    assert helpers_used(lowering.lower(past)) == {IndexOp.FLOOR_MODULO}
    lowering.enter()
    lowering.assume(bounds_from_relation(n, i, lowering.axes()))  # the else branch of i < n
    assert helpers_used(lowering.lower(past)) == set()
    lowering.enter()
    lowering.assume(bounds_from_relation(i + 1, 2 * n, lowering.axes()))  # then, the then branch of i < 2n
    assert lowering.lower(FloorDiv(i - n, m + n)) == lowering.lower(IntImm(0))
    lowering.declare_axis(i, 3 * n)  # a loop over the same name: the bounds were the outer i's
    assert helpers_used(lowering.lower(past)) == {IndexOp.FLOOR_MODULO}
    lowering.leave()
    lowering.leave()
    assert helpers_used(lowering.lower(FloorMod(i - n, m))) == {IndexOp.FLOOR_MODULO}


def test_bounds_of_a_relation_are_on_an_axis_that_is_one_side() -> None:
    """``i + 1 <= n`` bounds i from above by ``n - 1``, ``3 <= j - 2`` bounds j from below by
    5, ``i <= j`` bounds both; ``2 * i <= n``, ``i + j <= n`` and ``i <= i + n`` bound nothing."""
    def found(smaller, larger):
        return {(b.axis, str(b.bound), b.lower) for b in bounds_from_relation(smaller, larger, {"i", "j"})}

    assert found(i + 1, n) == {("i", str(simplify(n - 1)), False)}
    assert found(IntImm(3), j - 2) == {("j", "5", True)}
    assert found(i, j) == {("i", "j", False), ("j", "i", True)}
    assert found(2 * i, n) == found(i + j, n) == found(i, i + n) == set()


def program(body: ScalarExpr, *inputs: Buffer, shape=(n,), axes=(i,), dtype: str = "int32",
            schedule: WebGpuSchedule = ElementSchedule()):
    """A program whose WebGPU shader is laid out by ``schedule``."""
    return TensorProgram("p", tuple(inputs), Buffer("out", shape, dtype), axes, body, TargetSchedules(webgpu=schedule))


def test_shaders_declare_exactly_the_helpers_they_call() -> None:
    a = Buffer("A", (2 * n,), "int32")
    plain = emit_wgsl(program(Load(a, (i + n,)), a)).source
    assert "floor_" not in plain
    division = emit_wgsl(program(Load(a, ((i - n) // 2 + n,)), a)).source
    assert "A[floor_div_i32((i - params.n), 2) + params.n]" in division
    assert division.count("fn floor_div_i32(a: i32, b: i32) -> i32 {") == 1 and "floor_mod_i32" not in division
    both = emit_wgsl(program(Binary("add", IndexValue((i - n) // 3), IndexValue((i - n) % m)))).source
    assert "fn floor_div_i32" in both and "fn floor_mod_i32" in both
    # the canonical form already keeps a constant offset's numerator >= 0: (i - 5) // 3 == (i + 1) // 3 - 2
    shifted = emit_wgsl(program(Binary("add", IndexValue((i - 5) // 3), IndexValue((i - 5) % 3)))).source
    assert "out[index] = ((((i + 1) / 3) - 2) + ((i + 1) % 3));" in shifted


def test_the_emitter_declares_output_and_reduction_axes() -> None:
    """An output axis of extent 8 and a reduction axis of extent n make ``7 - i`` and
    ``n - 1 - k`` provably >= 0: the shader divides them with plain ``/`` and ``%``; the
    workgroup reduction's strided loop and the vectorized schedule's axes as well."""
    a = Buffer("A", (8, n), "float32")
    body = Reduce("sum", k, n, Load(a, ((7 - i) // 2, (n - 1 - k) // 3)))
    for schedule in (ElementSchedule(), WorkgroupReductionSchedule()):
        source = emit_wgsl(program(body, a, shape=(8,), dtype="float32", schedule=schedule)).source
        assert "floor_" not in source, schedule
        # (the canonical form under the ranges: 7 - i is -i + 7, (n - 1 - k) // 3 is (n - k + 2) // 3 - 1)
        assert "A[(((((i * (-1)) + 7) / 2) * params.n) + (((params.n - k) + 2) / 3)) - 1]" in source, schedule
    b = Buffer("B", (n, 8), "float32")
    vectorized = program(Load(b, ((n - 1 - i) // 2, j)), b, shape=(n, 8), axes=(i, j), dtype="float32",
                         schedule=VectorizedSchedule())
    assert "floor_" not in emit_wgsl(vectorized).source
    negative = program(Load(b, ((i - 1) % n, j)), b, shape=(n, 8), axes=(i, j), dtype="float32", schedule=VectorizedSchedule())
    assert "fn floor_mod_i32" in emit_wgsl(negative).source  # the vectorized emitter's helpers are declared


def test_the_floor_helpers_do_not_branch(tmp_path) -> None:
    """WGSL's ``&&`` and ``||`` short-circuit: each is a branch.  A matmul factor calls the
    floor helpers in every reduction step, once per block row in the CPU adapter's shader: a
    melspectrogram's mel kernel (``tests/fixtures/melspectrogram.py``) calls them about 130
    times there, and SwiftShader, whose compile time grows much faster than the branches of a
    loop body, compiled it for minutes until Chromium lost its GPU process.  The helpers
    select without a branch, so the loop body stays one block."""
    bundle = relaxweb.build(melspectrogram_model(), tmp_path / "mel", bounds={"samples": 4000}).path
    for suffix in (".wgsl", ".cpu.wgsl"):
        source = (bundle / "kernels" / f"{MEL_KERNEL}{suffix}").read_text()
        loop = source[source.index("@compute"):]  # the reduction loop and its staging
        assert loop.count("floor_mod_i32(") + loop.count("floor_div_i32(") >= 10, suffix
        for helper in ("floor_div_i32", "floor_mod_i32"):
            start = source.index(f"fn {helper}(")
            body = source[start:source.index("\n}", start)]
            assert not any(branch in body for branch in ("&&", "||", "if ")), (suffix, body)


def test_an_inner_axis_of_extent_zero_is_never_divided_by(device) -> None:
    """An output with no elements (``[3, 0]``, ONNX's ``tril_zero``) still has a shader: its
    inner axis is not recovered by ``% 0`` (which the lowering's simplification refuses)."""
    a = Buffer("A", (IntImm(3), IntImm(0)), "float32")
    empty = program(Load(a, (i, j)), a, shape=(IntImm(3), IntImm(0)), axes=(i, j), dtype="float32")
    source = emit_wgsl(empty).source
    assert "let j = 0;" in [line.strip() for line in source.splitlines()]
    device.create_shader_module(code=source)


# On wgpu ----------------------------------------------------------------------------------------


def test_the_issue_example_gives_the_interpreters_answer_on_wgpu(device) -> None:
    """``out[i] = A[(i - n) // 2 + n]`` with n = 4: WGSL's truncating / gave [2, 3, 3, 4]."""
    a = Buffer("A", (2 * n,), "int32")
    example = program(Load(a, ((i - n) // 2 + n,)), a)
    data = np.arange(8, dtype=np.int32)
    assert run_program(example, [data], {"n": 4}).tolist() == [2, 2, 3, 3]
    assert run_kernel_on_gpu(device, example, [data], {"n": 4}).tolist() == [2, 2, 3, 3]


def test_floor_helpers_match_python_for_every_sign(device) -> None:
    """Every numerator in [-12, 12] by every odd divisor in [-7, 7] (``2 * j - 7``, an
    axis-dependent divisor the analyzer cannot bound), and by constants -3 and 3."""
    numerators, divisors = np.arange(-12, 13), np.arange(-7, 8, 2)
    expected = {
        "quotient": numerators[:, None] // divisors[None, :], "remainder": numerators[:, None] % divisors[None, :],
    }
    shape = (IntImm(25), IntImm(8))
    for what, kind in (("quotient", FloorDiv), ("remainder", FloorMod)):
        lowered = program(IndexValue(kind(i - 12, 2 * j - 7)), shape=shape, axes=(i, j))
        assert "floor_" in emit_wgsl(lowered).source
        np.testing.assert_array_equal(run_kernel_on_gpu(device, lowered, [], {}), expected[what], err_msg=what)
    for divisor in (-3, 3):
        body = Binary("add", Binary("multiply", IndexValue(FloorDiv(i - 12, IntImm(divisor))), FloatImm(100, "int32")),
                      IndexValue(FloorMod(i - 12, IntImm(divisor))))
        constant = program(body, shape=(IntImm(25),))
        np.testing.assert_array_equal(run_kernel_on_gpu(device, constant, [], {}),
                                      numerators // divisor * 100 + numerators % divisor, err_msg=f"by {divisor}")


# Differential property test -------------------------------------------------------------------

SIZE_VARS = (n, m)
DIMS = (n, 2 * m, IntImm(3), n + 1, IntImm(5), m, IntImm(2), IntImm(1))  # the simplest (drawn most) first
# constants of both signs, size variables, and symbolic divisors of either sign (never 0
# for the sizes drawn, 1 to 4: a divisor is never 0 in the IR)
# (the canonical form divides by positive constants only: a // -c is (-a) // c)
DIVISORS = (*(IntImm(c) for c in (2, 3, -2, 4, 5, -1, 1, -3, -5)), n, m, n + 2, 2 * n - 5, m - 5, 0 - n, 1 - 2 * m)
CONSTANTS = st.integers(-6, 6).map(IntImm)


@st.composite
def index_expressions(draw, variables: tuple[SizeVar, ...], depth: int = 3) -> PrimExpr:
    """An unsimplified index expression of the variables in scope, the size variables and
    small constants, with + - * (by a constant) // % (by a divisor in DIVISORS) min max.
    (Composite strategies drawn recursively: building a ``st.recursive`` per program is slow.)"""
    kinds = ["division", "variable", "arithmetic", "division", "constant", "scaled"] if depth else ["variable", "constant"]
    kind = draw(st.sampled_from(kinds))
    if kind == "variable":
        return draw(st.sampled_from(variables + SIZE_VARS))
    if kind == "constant":
        return draw(CONSTANTS)
    a = draw(index_expressions(variables, depth - 1))
    if kind == "division":  # twice as often as the others: divisions are what is tested
        if draw(st.sampled_from([True, True, False])):  # minus a variable: the canonical form cannot shift it >= 0
            a = Sub(a, draw(st.sampled_from(variables + SIZE_VARS)))
        return draw(st.sampled_from([FloorDiv, FloorMod]))(a, draw(st.sampled_from(DIVISORS)))
    if kind == "arithmetic":
        return draw(st.sampled_from([Add, Sub, Min, Max]))(a, draw(index_expressions(variables, depth - 1)))
    return Mul(a, IntImm(draw(st.integers(-3, 3))))


@st.composite
def loads(draw, inputs: tuple[Buffer, ...], variables: tuple[SizeVar, ...]) -> ScalarExpr:
    """A load of an input at random indices kept in bounds: each index taken floor-modulo
    its dim, or the load guarded by a Select on the indices being in bounds, or a Gather
    (which clamps), or two loads as a concatenation picks its pieces (past a split of an
    axis, the axis minus the split, floor-modulo the dims); as an int32 value."""
    buffer = draw(st.sampled_from(inputs))
    indices = [draw(index_expressions(variables)) for _ in buffer.shape]
    kind = draw(st.sampled_from(["modulo", "select", "gather", "pieces"]))
    if kind == "modulo":
        value: ScalarExpr = Load(buffer, tuple(FloorMod(index, dim) for index, dim in zip(indices, buffer.shape)))
    elif kind == "pieces":
        axis, split = draw(st.sampled_from(variables)), draw(st.sampled_from([IntImm(1), IntImm(3), *SIZE_VARS]))
        past = [draw(st.sampled_from([axis - split, (axis - split) * 2 + index, index - axis + split]))
                for index in indices]
        value = Select(Compare("lt", IndexValue(axis), IndexValue(split)),
                       Load(buffer, tuple(FloorMod(index, dim) for index, dim in zip(indices, buffer.shape))),
                       Load(buffer, tuple(FloorMod(index, dim) for index, dim in zip(past, buffer.shape))))
    elif kind == "gather":
        value = Gather(buffer, tuple(IndexValue(index) for index in indices))
    else:
        value = Load(buffer, tuple(indices))
        outside = FloatImm(-100, buffer.dtype)
        for index, dim in zip(indices, buffer.shape):
            value = Select(Compare("lt", IndexValue(index), IndexValue(dim)), value, outside)
            value = Select(Compare("ge", IndexValue(index), IndexValue(IntImm(0))), value, outside)
    return value if buffer.dtype == "int32" else Cast("int32", value)


@st.composite
def values(draw, inputs: tuple[Buffer, ...], variables: tuple[SizeVar, ...], depth: int = 2) -> ScalarExpr:
    """An int32 scalar expression: loads, index values and constants under add, subtract,
    maximum, minimum, multiplication by a small constant, selects on comparisons, and casts
    through float32 (halving there truncates toward zero, as in numpy)."""
    kinds = ["load", "index", "constant", "binary", "scaled", "select", "cast", "halved"] if depth else [
        "load", "index", "constant"]
    kind = draw(st.sampled_from(kinds))
    if kind == "load":
        return draw(loads(inputs, variables))
    if kind == "index":
        return IndexValue(draw(index_expressions(variables)))
    if kind == "constant":
        return FloatImm(draw(st.integers(-9, 9)), "int32")
    operand = values(inputs, variables, depth - 1)
    if kind == "binary":
        return Binary(draw(st.sampled_from(["add", "subtract", "maximum", "minimum"])), draw(operand), draw(operand))
    if kind == "scaled":
        return Binary("multiply", draw(operand), FloatImm(draw(st.integers(-3, 3)), "int32"))
    if kind == "select":
        condition = Compare(draw(st.sampled_from(["lt", "le", "eq", "ne", "gt", "ge"])), draw(operand), draw(operand))
        return Select(condition, draw(operand), draw(operand))
    if kind == "cast":
        return Cast("int32", Cast("float32", draw(operand)))
    return Cast("int32", Binary("multiply", Cast("float32", draw(operand)), FloatImm(0.5)))


@st.composite
def cases(draw) -> tuple[TensorProgram, list[np.ndarray], dict[str, int]]:
    """A random program with 1-2 inputs and an output of rank 1-2 (int32 or float32), maybe
    a sum over ``k`` (run by one invocation or a workgroup), with its inputs and sizes."""
    size_values = {"n": draw(st.integers(1, 4)), "m": draw(st.integers(1, 4))}
    axes = (i, j)[:draw(st.integers(1, 2))]
    shape = tuple(draw(st.sampled_from(DIMS)) for _ in axes)
    inputs = tuple(
        Buffer(name, tuple(draw(st.sampled_from(DIMS)) for _ in range(draw(st.integers(1, 2)))),
               draw(st.sampled_from(["int32", "float32"])))
        for name in ("A", "B")[:draw(st.integers(1, 2))]
    )
    schedule: WebGpuSchedule = ElementSchedule()
    if draw(st.booleans()):
        body: ScalarExpr = Reduce("sum", k, draw(st.sampled_from([IntImm(1), IntImm(3), n, m])),
                                  draw(values(inputs, axes + (k,))))
        if draw(st.booleans()):
            body = Binary("add", body, draw(values(inputs, axes)))
        schedule = draw(st.sampled_from([ElementSchedule(), WorkgroupReductionSchedule()]))
    else:
        body = draw(values(inputs, axes))
    dtype = draw(st.sampled_from(["int32", "float32"]))
    if dtype == "float32":
        body = Cast("float32", body)
    generated = TensorProgram("random", inputs, Buffer("out", shape, dtype), axes, body, TargetSchedules(webgpu=schedule))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    arrays = [rng.integers(-20, 21, [int(evaluate(d, size_values)) for d in b.shape]).astype(b.dtype) for b in inputs]
    return generated, arrays, size_values


def floor_operand_signs(program: TensorProgram, size_values: dict[str, int]) -> set[str]:
    """Which signs the operands of the floor divisions and modulos the emitter lowers take
    at run time: {"negative numerator", "negative divisor"} or part of it.  Each index
    expression is taken in its canonical form under the axes' ranges (as the emitter
    simplifies it) and evaluated over the index grids, where the program evaluates it for
    every element (not in a Select's branches)."""
    shape = tuple(int(evaluate(d, size_values)) for d in program.output.shape)
    environment = {**size_values, **{axis.name: grid for axis, grid in zip(program.axes, np.indices(shape))}}
    analyzer = axes_analyzer(**dict(zip((axis.name for axis in program.axes), program.output.shape)))
    found: set[str] = set()

    def divisions(expr: PrimExpr):
        if isinstance(expr, (FloorDiv, FloorMod)):
            yield expr
        if not isinstance(expr, (IntImm, SizeVar)):
            yield from divisions(expr.a)
            yield from divisions(expr.b)

    def visit(node: ScalarExpr, environment: dict, analyzer: Analyzer) -> None:
        if isinstance(node, Select):
            visit(node.condition, environment, analyzer)
            return
        if isinstance(node, Reduce):
            extent = int(evaluate(node.extent, environment))
            inner = {name: value[np.newaxis] if isinstance(value, np.ndarray) else value
                     for name, value in environment.items()}
            inner[node.axis.name] = np.arange(extent).reshape((extent,) + (1,) * len(shape))
            visit(node.body, inner, with_axis(analyzer, node.axis.name, node.extent))
            return
        indices = node.indices if isinstance(node, (Load, Gather)) else (node.value,) if isinstance(node, IndexValue) else ()
        for index in indices:
            if isinstance(index, PrimExpr):
                for division in divisions(analyzer.simplify(index)):
                    if np.any(np.asarray(evaluate(division.a, environment)) < 0):
                        found.add("negative numerator")
                    if np.any(np.asarray(evaluate(division.b, environment)) < 0):
                        found.add("negative divisor")
        for child in scalar_children(node):
            visit(child, environment, analyzer)

    visit(program.body, environment, analyzer)
    return found


DIFFERENTIAL_EXAMPLES = 200


def differential(run, counted) -> Counter[str]:
    """Runs ``DIFFERENTIAL_EXAMPLES`` random programs (fixed examples) with ``run(program,
    arrays, size_values)`` against the interpreter, exactly; the coverage counts, with
    ``counted(program)``'s labels."""
    coverage: Counter[str] = Counter()

    @settings(max_examples=DIFFERENTIAL_EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(cases())
    def agree(case) -> None:
        generated, arrays, size_values = case
        note(f"{format_program(generated)}\nsizes {size_values}")
        expected = run_program(generated, arrays, size_values)
        np.testing.assert_array_equal(run(generated, arrays, size_values), expected)
        coverage["programs"] += 1
        coverage.update(floor_operand_signs(generated, size_values))
        coverage.update(counted(generated))

    agree()
    print(dict(coverage))
    assert coverage["programs"] >= DIFFERENTIAL_EXAMPLES
    assert coverage["negative numerator"] >= DIFFERENTIAL_EXAMPLES // 10, coverage
    assert coverage["negative divisor"] >= DIFFERENTIAL_EXAMPLES // 20, coverage
    return coverage


def test_random_programs_agree_between_the_interpreter_and_wgpu(device) -> None:
    coverage = differential(
        lambda program, arrays, sizes: run_kernel_on_gpu(device, program, arrays, sizes),
        lambda program: {"workgroup reduction"} if program.schedule.webgpu == WorkgroupReductionSchedule() else ())
    # (hypothesis 6.155 gives 46 negative numerators, 26 negative divisors and 34 workgroup reductions)
    assert coverage["workgroup reduction"] >= DIFFERENTIAL_EXAMPLES // 10, coverage


def bounds_an_axis(program: TensorProgram) -> bool:
    """Whether a Select of the program compares two index values one of which is an axis, or
    an axis plus a constant (its branches then lower their indices knowing a bound on it)."""
    axes = {axis.name for axis in program.axes}

    def visit(node: ScalarExpr) -> bool:
        if isinstance(node, Select) and isinstance(node.condition, Compare) and all(
                isinstance(side, IndexValue) for side in (node.condition.a, node.condition.b)):
            if bounds_from_relation(node.condition.a.value, node.condition.b.value, axes):
                return True
        return any(visit(child) for child in scalar_children(node))

    return visit(program.body)


def test_random_programs_agree_between_the_interpreter_and_kernels_wasm() -> None:
    coverage = differential(run_on_wasm, lambda program: {"branch bounds"} if bounds_an_axis(program) else ())
    # (hypothesis 6.155 gives 29 programs with a Select that bounds an axis)
    assert coverage["branch bounds"] >= DIFFERENTIAL_EXAMPLES // 10, coverage
