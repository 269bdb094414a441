"""Which programs a schedule kind fits, beyond the layouts of ``launch.py``: what the
schedule_programs pass chooses by, and what the backends may then rely on.

- WebAssembly SIMD has f32x4 forms of the float ops of :data:`VECTOR_BINARY_OPS`,
  :data:`VECTOR_UNARY_OPS` and :data:`VECTOR_COMPARE_OPS` (the renderings of
  ``relaxweb/cpu/emit.py`` cover exactly these: ``tests/cpu``); the wasm vectorized and
  window kinds need every float op of a program to have one (:func:`wasm_vectorizable`,
  :func:`wasm_window`).
- A WebGPU schedule needs of a program what :func:`webgpu_fits` checks: the vectorized
  kind a last dimension that is a multiple of its width, the matmul kinds a matmul-like
  program (what a program whose literals became size variables may no longer show).
- A WebGPU register matmul (a CPU adapter's shader) evaluates each factor once per row or
  column of its block, so it pays only where the factors evaluate without branching
  (:func:`branch_free`), and its shader grows with the factors' text
  (:func:`register_shader_bytes`).
- A select whose branches are cheap (:func:`is_cheap_branch`) is evaluated without a
  branch by the WGSL backend (WGSL's ``select``); the same test says which factors do not
  branch.
"""

from __future__ import annotations

from .access import flat_offset
from .launch import vectorizable
from .lower_index import with_axis
from .pattern import MatmulInfo, Pattern, WindowInfo, analyze_window, program_pattern
from .schedule import MATMUL_SCHEDULES, VectorizedSchedule, WebGpuSchedule
from .symbolic import Analyzer, IntImm, PrimExpr, SizeVar, product
from .error_sites import REPORTING_KINDS
from .tir import (
    MATH_CALLS, Binary, BinaryOp, Buffer, CompareOp, Gather, IndexValue, Load, Reduce, ScalarExpr, Select,
    TensorProgram, Unary, UnaryOp, format_scalar, index_exprs, map_scalar, scalar_nodes,
)

VECTOR_BINARY_OPS = frozenset({BinaryOp.ADD, BinaryOp.SUBTRACT, BinaryOp.MULTIPLY, BinaryOp.DIVIDE, BinaryOp.MAXIMUM,
                               BinaryOp.MINIMUM, BinaryOp.POWER})
VECTOR_UNARY_OPS = frozenset({UnaryOp.NEGATIVE, UnaryOp.ABSOLUTE, UnaryOp.SQRT, UnaryOp.FLOOR, UnaryOp.CEIL,
                              UnaryOp.ROUND, *MATH_CALLS})
VECTOR_COMPARE_OPS = frozenset(CompareOp)
"""The float ops the WebAssembly backend computes four lanes at a time (f32x4)."""


def has_vector_forms(expr: ScalarExpr, floats_only: bool = False) -> bool:
    """Whether every binary and unary op of ``expr`` (with ``floats_only``: every float32
    one) has an f32x4 form."""
    for node in scalar_nodes(expr):
        if floats_only and node.dtype != "float32":
            continue
        if isinstance(node, Binary) and node.op not in VECTOR_BINARY_OPS:
            return False
        if isinstance(node, Unary) and node.op not in VECTOR_UNARY_OPS:
            return False
    return True


def webgpu_fits(program: TensorProgram, schedule: WebGpuSchedule) -> bool:
    """Whether the WGSL backend can lay ``program`` out by ``schedule``: the conditions a kind
    needs that constant extents may meet and size variables may not be shown to (a vectorized
    last dimension a multiple of the width, a matmul-like program); the other kinds run any
    program.  share_programs keeps a group apart whose shared program would not fit its
    members' schedule."""
    if isinstance(schedule, VectorizedSchedule):
        return vectorizable(program, schedule.width)
    if isinstance(schedule, MATMUL_SCHEDULES):
        return program_pattern(program) is Pattern.MATMUL
    return True


def wasm_vectorizable(program: TensorProgram) -> bool:
    """Whether the wasm vectorized kind runs ``program``: a float32 elementwise or broadcast
    program whose last dimension is a multiple of 4 (``launch.vectorizable`` for wasm: reads
    along the last axis at any offset, selects whose condition is the same for the four
    lanes), every float op with an f32x4 form."""
    return vectorizable(program, 4, wasm=True) and has_vector_forms(program.body, floats_only=True)


def wasm_window(program: TensorProgram) -> WindowInfo | None:
    """The program's sliding-window split (``pattern.analyze_window``) when the wasm window
    kind runs it: every float op with an f32x4 form.  None otherwise."""
    info = analyze_window(program)
    if info is None or not has_vector_forms(program.body, floats_only=True):
        return None
    return info


CHEAP_BRANCH_NODES = 32  # the most nodes a select's branch may have to be evaluated unconditionally
CHEAP_BRANCH_LOADS = 4  # ... and the most buffer reads (a concatenation of up to 4 inputs)


def is_cheap_branch(expr: ScalarExpr) -> bool:
    """Few nodes, few reads, no reduction and no error check: cheaper to evaluate than to
    branch around (a select with two such branches is WGSL's ``select``, no branch)."""
    nodes = loads = 0
    for node in scalar_nodes(expr):
        nodes += 1
        loads += isinstance(node, (Load, Gather))
        if isinstance(node, Reduce) or nodes > CHEAP_BRANCH_NODES or loads > CHEAP_BRANCH_LOADS:
            return False
        if node.scalar_kind in REPORTING_KINDS:  # an error check reports only where it is evaluated for real
            return False
    return True


def branch_free(factor: ScalarExpr) -> bool:
    """No reduction, and every select with cheap branches (:func:`is_cheap_branch`, WGSL's
    ``select``): a branch per block row or column of every invocation is what staging saves."""
    for node in scalar_nodes(factor):
        if isinstance(node, Reduce):
            return False
        if isinstance(node, Select) and not (is_cheap_branch(node.a) and is_cheap_branch(node.b)):
            return False
    return True


PARAMS_PREFIX = len("params.")
"""What a shader writes before each size variable it reads (from the kernel's params block)."""


def factor_characters(program: TensorProgram, info: MatmulInfo, block: int) -> int:
    """The characters of factor text a register matmul of ``block x block`` outputs per
    invocation writes per reduction step: each factor written as the IR text writes it
    (``tir.format_scalar``) but for what the shader indexes (each load at its row-major
    element offset, simplified with the ranges of the axes, as the backends lower it) and
    reads (each size variable from the params block), once per row or column of the block.
    What else the shader writes hardly depends on the factors, so its size grows with this
    (:func:`register_shader_bytes`)."""
    analyzer = Analyzer()
    for axis, extent in (*zip(program.axes, program.output.shape), *zip(info.reduce_axes, info.reduce_extents)):
        analyzer = with_axis(analyzer, axis.name, extent)
    size_vars = {v.name for v in program.size_vars}
    return block * sum(len(format_scalar(flat)) + PARAMS_PREFIX * _size_var_reads(flat, size_vars)
                       for flat in (_at_offsets(info.a, analyzer), _at_offsets(info.b, analyzer)))


REGISTER_SHADER_BASE_BYTES = 6_150
BYTES_PER_FACTOR_CHARACTER = 1.25
"""A register matmul's WGSL is about ``REGISTER_SHADER_BASE_BYTES + BYTES_PER_FACTOR_CHARACTER
* factor_characters`` bytes (WGSL's operators and literals are about the IR text's; the base
is the bindings, the params block, the tile arithmetic and the epilogue).  Fitted on the
shaders of the 1,210 kernels that may get one in the 41-case test corpus, the 65 real models
and the ONNX node models (3 to 382 KB, rendered by ``relaxweb/wgsl``): from 20 KB up within
-7% and +4% of the rendered size; below, where what the factors do not set weighs more,
within -24% and +89%."""


def register_shader_bytes(program: TensorProgram, info: MatmulInfo, block: int) -> int:
    """An estimate of the bytes of the program's register matmul shader (see above)."""
    return REGISTER_SHADER_BASE_BYTES + round(BYTES_PER_FACTOR_CHARACTER * factor_characters(program, info, block))


def _at_offsets(factor: ScalarExpr, analyzer: Analyzer) -> ScalarExpr:
    """``factor`` with each load (and gather at index expressions) reading its buffer, flat, at
    the row-major element offset of its indices; offsets and index values simplified by
    ``analyzer``."""
    def flat(expr: ScalarExpr) -> ScalarExpr | None:
        if isinstance(expr, (Load, Gather)) and not any(isinstance(i, ScalarExpr) for i in expr.indices):
            buffer = Buffer(expr.buffer.name, (product(expr.buffer.shape),), expr.buffer.dtype)
            return Load(buffer, (analyzer.simplify(flat_offset(expr.buffer, expr.indices)),))
        if isinstance(expr, IndexValue):
            return IndexValue(analyzer.simplify(expr.value))
        return None

    return map_scalar(factor, flat)


def _size_var_reads(expr: ScalarExpr, size_vars: set[str]) -> int:
    """How many times the index expressions of ``expr`` read a size variable of ``size_vars``."""
    def reads(index: PrimExpr) -> int:
        if isinstance(index, SizeVar):
            return index.name in size_vars
        if isinstance(index, IntImm):
            return 0
        return reads(index.a) + reads(index.b)  # type: ignore[attr-defined]

    return sum(reads(index) for index in index_exprs(expr))
