"""The WGSL rendering of each schedule kind (``relaxweb/ir/schedule.py``): the declarations
after the bindings and the shader's ``main``, written with an :class:`~.emit.Emitter`.

:func:`render_schedule` looks the kind of the schedule it is given (one of the program's
WebGPU schedules: ``TargetSchedules``) up in :data:`RENDERERS` (a kind without a renderer is
an error, never a silent fallback).  Every schedule uses workgroups
of 64 invocations on the runtimes' 2-D grid, and the number of invocations a dispatch needs
is :func:`relaxweb.ir.launch.dispatch_count`, which the host module evaluates.

- ``element``: one invocation per output element; reductions are serial loops.
- ``vectorized``: one invocation per ``width`` consecutive output elements of an elementwise
  or broadcast float program whose last dimension is a multiple of ``width``
  (:func:`relaxweb.ir.launch.vectorizable`): buffers read along the last axis are bound as
  ``array<vecN<f32>>`` and read N elements at a time, buffers constant along it are read once
  and splatted, and the arithmetic is on vectors.
- ``workgroup_reduction``: one workgroup per output element.  Each top-level reduction is
  split across the 64 invocations (each takes every 64th element), then combined by a tree
  in workgroup memory; invocation 0 writes the result.  For long rows: softmax, layer norm
  statistics, means.
- ``tiled_matmul``: one workgroup per ``tile x tile`` block of the (rows x columns) output of
  a matmul-like program (``relaxweb.ir.pattern.analyze_matmul``), per batch index.  Each step
  stages a ``depth``-deep slice of both factors in workgroup memory as vec4 (evaluating each
  factor's expression, so fused prologues are computed once per tile; an invocation stages
  the same row and column of the tile at every step, so it recovers their indices once), and
  each invocation keeps a ``block x block`` set of accumulators in vec4 registers, updated
  with one vec4 load of each factor per 4 rows or columns.  The epilogue (the body around the
  reduction: bias, activation, residual add) and the store are one function,
  ``store_output``, called from a loop over the accumulators, so it is compiled once.
- ``register_matmul``: the same tiles and dispatch size without workgroup memory, for CPU
  adapters (``relaxweb/passes/schedule_programs.py`` says when): each invocation evaluates the first factor at its ``block`` rows
  and the second at its ``block`` columns for every reduction element (rows and columns past
  the last read the last one; their outputs are not stored) and keeps ``block x block``
  accumulators in vec4 registers.  An invocation with no row inside the output returns at
  once, so a product with one row (a matrix-vector product) runs 8 of the 64 invocations of
  a workgroup; each computes its block's 7 other rows from the last one, a copy of it (a
  separate path for the last rows doubled the shader, which SwiftShader pays for in compile
  time).
- ``tiled_matmul_f16``: ``tiled_matmul`` with the staged tiles ``vec4<f16>`` (each factor
  evaluated in f32, then rounded once as it is staged) and each product in f16, added to the
  f32 accumulators (``enable f16;``: a second shader for adapters with ``shader-f16``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from ..ir.launch import VECTOR, matmul_extents, matmul_info, vector_access
from ..ir.pattern import MatmulInfo, top_level_reductions
from ..ir.schedule import (
    VECTOR_WIDTH, WORKGROUP_SIZE, ElementSchedule, HalfTiledMatmulSchedule, RegisterMatmulSchedule,
    TiledMatmulSchedule, VectorizedSchedule, WebGpuSchedule, WorkgroupReductionSchedule,
)
from ..ir.symbolic import SizeVar, product, simplify
from ..ir.tir import FloatImm, Load, Reduce, ScalarExpr, TensorProgram, scalar_dtype, substitute_scalar
from .emit import Emitter, combine, is_float_extremum, literal, reduce_identity, storage_type, to_storage, wgsl_name
from .lower_index import IndexOp


@dataclass(frozen=True)
class ScheduleRendering:
    """What a schedule contributes to a program's shader."""

    lines: list[str]  # the declarations after the bindings, then the ``main`` function
    index_helpers: frozenset[IndexOp]  # the floor-division helpers the index arithmetic calls (lower_index.py)
    element_types: dict[str, str] = field(default_factory=dict)  # buffers bound with another element type than their dtype's
    extensions: tuple[str, ...] = ()  # WGSL extensions the shader enables (``enable f16;``)


def render_schedule(program: TensorProgram, schedule: WebGpuSchedule,
                    parts: Mapping[str, int] | None = None) -> ScheduleRendering:
    """The shader's declarations and ``main`` for the program laid out by ``schedule``;
    ``parts`` names the input buffers bound as several parts (read through their load
    functions, ``emit.part_load``)."""
    renderer = RENDERERS.get(type(schedule))
    if renderer is None:
        raise NotImplementedError(f"{program.name}: the WGSL backend has no renderer for the schedule {schedule}")
    return renderer(program, schedule, dict(parts or {}))


_SIGNATURE = [
    f"@compute @workgroup_size({WORKGROUP_SIZE})",
    "fn main(@builtin(workgroup_id) workgroup: vec3<u32>,",
    "        @builtin(num_workgroups) workgroups: vec3<u32>,",
    "        @builtin(local_invocation_index) local_index: u32) {",
]
# The workgroup's number on the runtimes' 2-D grid (uniform across the workgroup).
_GROUP = "  let group = i32(workgroup.y * workgroups.x + workgroup.x);"


def _emitter(program: TensorProgram, parts: Mapping[str, int]) -> Emitter:
    return Emitter(program, {v.name for v in program.size_vars}, parts)


def _store(program: TensorProgram, emitter: Emitter, value: str, indent: str) -> str:
    output = program.output
    return f"{indent}{wgsl_name(output.name)}[{emitter.output_offset()}] = {to_storage(output.dtype, value)};"


def render_element(program: TensorProgram, schedule: ElementSchedule, parts: Mapping[str, int]) -> ScheduleRendering:
    emitter = _emitter(program, parts)
    lines = ["", *_SIGNATURE, _GROUP,
             f"  let index = group * {WORKGROUP_SIZE} + i32(local_index);",
             "  if (index >= params.element_count) {", "    return;", "  }"]
    lines += emitter.unflatten(program.axes, program.output.shape, "index", "  ")
    value = emitter.scalar(program.body, "  ")
    lines += emitter.statements
    output = program.output
    lines.append(f"  {wgsl_name(output.name)}[index] = {to_storage(output.dtype, value)};")
    return ScheduleRendering(lines + ["}"], frozenset(emitter.index_lowering.helpers))


def render_workgroup_reduction(program: TensorProgram, schedule: WorkgroupReductionSchedule,
                               parts: Mapping[str, int]) -> ScheduleRendering:
    emitter = _emitter(program, parts)
    reductions = list(dict.fromkeys(top_level_reductions(program.body)))
    shared = [f"var<workgroup> partial{i}: array<{storage_type(scalar_dtype(r))}, {WORKGROUP_SIZE}>;"
              for i, r in enumerate(reductions)]
    partial_of = {r: f"partial{i}" for i, r in enumerate(reductions)}

    def cooperative(expr: Reduce, indent: str) -> str:
        partial = partial_of[expr]
        dtype = scalar_dtype(expr.body)
        accumulator = f"{partial}_value"
        axis = expr.axis.name
        first = f"{partial}_first"  # per reduction: two reductions may share an axis name
        extent = emitter.index(simplify(expr.extent))
        out = emitter.statements
        out.append(f"{indent}// {expr.combiner} over {axis} < {extent}, split across the workgroup")
        out.append(f"{indent}var {accumulator}: {storage_type(dtype)} = {reduce_identity(expr.combiner, dtype)};")
        out.append(f"{indent}var {first} = true;")
        out.append(f"{indent}for (var {axis}: i32 = i32(local_index); {axis} < {extent}; {axis} = {axis} + {WORKGROUP_SIZE}) {{")
        emitter.open_scope()
        emitter.declare_axis(expr.axis, expr.extent)
        value = emitter.scalar(expr.body, indent + "  ")
        if is_float_extremum(expr.combiner, dtype):
            value = emitter.named(value, indent + "  ")
        emitter.close_scope()
        out.append(f"{indent}  {accumulator} = {combine(expr.combiner, dtype, accumulator, value, first)};")
        out.append(f"{indent}  {first} = false;")
        out.append(f"{indent}}}")
        if is_float_extremum(expr.combiner, dtype):
            # an invocation with no element takes element 0 (max and min ignore repeats)
            out.append(f"{indent}if ({first} && {extent} > 0) {{")
            out.append(f"{indent}  let {axis} = 0;")
            emitter.open_scope()
            emitter.declare_axis(expr.axis, expr.extent)
            value = emitter.scalar(expr.body, indent + "  ")
            emitter.close_scope()
            out.append(f"{indent}  {accumulator} = {value};")
            out.append(f"{indent}}}")
        out.append(f"{indent}{partial}[local_index] = {accumulator};")
        out.append(f"{indent}workgroupBarrier();")
        stride = WORKGROUP_SIZE // 2
        while stride >= 1:
            out.append(f"{indent}if (local_index < {stride}u) {{")
            merged = combine(expr.combiner, dtype, f"{partial}[local_index]", f"{partial}[local_index + {stride}u]", "false")
            out.append(f"{indent}  {partial}[local_index] = {merged};")
            out.append(f"{indent}}}")
            out.append(f"{indent}workgroupBarrier();")
            stride //= 2
        result = partial.replace("partial", "reduced")
        out.append(f"{indent}let {result} = {partial}[0];")
        return result

    emitter.cooperative = cooperative
    lines = ["", *shared, "", *_SIGNATURE, _GROUP,
             "  // one workgroup per output element",
             f"  if (group >= params.element_count / {WORKGROUP_SIZE}) {{", "    return;", "  }"]
    lines += emitter.unflatten(program.axes, program.output.shape, "group", "  ")
    value = emitter.scalar(program.body, "  ")
    lines += emitter.statements
    lines += ["  if (local_index == 0u) {", _store(program, emitter, value, "    "), "  }", "}"]
    return ScheduleRendering(lines, frozenset(emitter.index_lowering.helpers))


def render_tiled_matmul(program: TensorProgram, schedule: TiledMatmulSchedule,
                        parts: Mapping[str, int]) -> ScheduleRendering:
    emitter = _emitter(program, parts)
    info = matmul_info(program)
    tile, tile_depth, block, threads_per_side = schedule.tile, schedule.depth, schedule.block, schedule.threads_per_side
    axes, shape = program.axes, program.output.shape
    rows, columns, batch = (emitter.index(simplify(e)) for e in matmul_extents(program, info))
    depth = emitter.index(product(info.reduce_extents))
    tile_size = tile * tile_depth
    vectors = block // VECTOR_WIDTH  # vec4 accumulators per row of an invocation's block
    scaled = f" * {vectors}" if vectors > 1 else ""
    half = isinstance(schedule, HalfTiledMatmulSchedule)
    staged_type = "f16" if half else "f32"
    out = emitter.statements

    def stage(staged: str, factor, in_range: str) -> None:
        """Evaluate one factor over a tile_depth x tile slice into workgroup memory.  The tile
        divides the workgroup size, so an invocation stages the same row (column) of the tile
        at every depth: its axes were recovered once, before the steps."""
        out.append(f"    for (var e = i32(local_index); e < {tile_size}; e = e + {WORKGROUP_SIZE}) {{")
        out.append(f"      let depth_index = step + e / {tile};")
        out.append("      var value: f32 = 0.0;")
        out.append(f"      if ({in_range} && depth_index < {depth}) {{")
        emitter.open_scope()
        out.extend(emitter.unflatten(info.reduce_axes, info.reduce_extents, "depth_index", "        "))
        value = emitter.scalar(factor, "        ")
        emitter.close_scope()
        out.append(f"        value = {value};")
        out.append("      }")
        out.append(f"      {staged}[e / {VECTOR_WIDTH}][e % {VECTOR_WIDTH}] = {'f16(value)' if half else 'value'};")
        out.append("    }")

    out.extend(_workgroup_tile(rows, columns, tile))
    out.append(f"  // this invocation's {block} x {block} block of outputs")
    out.append(f"  let block_row = row_start + i32(local_index) / {threads_per_side} * {block};")
    out.append(f"  let block_column = column_start + i32(local_index) % {threads_per_side} * {block};")
    out.append("  let batch_index = group / (row_tiles * column_tiles);")
    out.extend(emitter.unflatten([axes[p] for p in info.batch], [shape[p] for p in info.batch], "batch_index", "  "))
    out.append("  // the row of the first factor and the column of the second this invocation stages")
    out.append(f"  let staged_row = row_start + i32(local_index) % {tile};")
    out.append(f"  let staged_column = column_start + i32(local_index) % {tile};")
    out.extend(emitter.unflatten([axes[p] for p in info.rows], [shape[p] for p in info.rows], "staged_row", "  "))
    out.extend(emitter.unflatten([axes[p] for p in info.columns], [shape[p] for p in info.columns], "staged_column", "  "))
    out.append(f"  let block_row_vector = i32(local_index) / {threads_per_side}{scaled};  // in the staged tiles")
    out.append(f"  let block_column_vector = i32(local_index) % {threads_per_side}{scaled};")
    out.append(f"  var accumulators: array<vec{VECTOR_WIDTH}<f32>, {block * vectors}>;")
    out.append(f"  for (var step = 0; step < {depth}; step = step + {tile_depth}) {{")
    stage("tile_a", info.a, "staged_row < rows")
    stage("tile_b", info.b, "staged_column < columns")
    out.append("    workgroupBarrier();")
    out.append(f"    for (var d = 0; d < {tile_depth}; d = d + 1) {{")
    for v in range(vectors):
        out.append(f"      let a{v} = tile_a[d * {tile // VECTOR_WIDTH} + block_row_vector{f' + {v}' if v else ''}];")
    for v in range(vectors):
        out.append(f"      let b{v} = tile_b[d * {tile // VECTOR_WIDTH} + block_column_vector{f' + {v}' if v else ''}];")
    for r in range(block):
        a = f"a{r // VECTOR_WIDTH}.{_COMPONENTS[r % VECTOR_WIDTH]}"
        for v in range(vectors):
            k = r * vectors + v
            if half:  # the product in f16, the sum in f32
                out.append(f"      accumulators[{k}] = accumulators[{k}] + vec{VECTOR_WIDTH}<f32>({a} * b{v});")
            else:
                out.append(f"      accumulators[{k}] = fma(vec{VECTOR_WIDTH}({a}), b{v}, accumulators[{k}]);")
    out.append("    }")
    out.append("    workgroupBarrier();")
    out.append("  }")
    out.extend(_store_accumulators(block, "  "))
    vector_count = tile_size // VECTOR_WIDTH
    vector_type = f"vec{VECTOR_WIDTH}<{staged_type}>"
    shared = [f"var<workgroup> tile_a: array<{vector_type}, {vector_count}>;  // {tile_depth} x {tile}: the first factor",
              f"var<workgroup> tile_b: array<{vector_type}, {vector_count}>;  // {tile_depth} x {tile}: the second factor"]
    epilogue = _matmul_epilogue(program, info, parts)
    helpers = emitter.index_lowering.helpers | epilogue.index_helpers
    return ScheduleRendering(["", *shared, *epilogue.lines, "", *_SIGNATURE, _GROUP, *out, "}"], frozenset(helpers),
                             extensions=("f16",) if half else ())


_COMPONENTS = "xyzw"


def _workgroup_tile(rows: str, columns: str, tile: int) -> list[str]:
    """Statements of a matmul schedule's ``main``: the output extents, and the first row and
    column of the workgroup's ``tile x tile`` tile (a workgroup past the dispatch returns)."""
    return [f"  let rows = {rows};",
            f"  let columns = {columns};",
            f"  let row_tiles = (rows + {tile - 1}) / {tile};",
            f"  let column_tiles = (columns + {tile - 1}) / {tile};",
            f"  if (group >= params.element_count / {WORKGROUP_SIZE}) {{",
            "    return;",
            "  }",
            "  let tile = group % (row_tiles * column_tiles);",
            f"  let row_start = tile / column_tiles * {tile};",
            f"  let column_start = tile % column_tiles * {tile};"]


def _store_accumulators(block: int, indent: str) -> list[str]:
    """The epilogue and store of an invocation's block, once: a loop over a copy of the
    accumulators (indexed by the loop, so that copy lives in memory, while the accumulators
    themselves are only ever indexed by constants and stay in registers through the steps);
    unrolled per accumulator, a fused epilogue would be compiled block x block times."""
    return [f"{indent}var results = accumulators;",
            f"{indent}for (var k = 0; k < {block * block}; k = k + 1) {{",
            f"{indent}  let vector = results[k / {VECTOR_WIDTH}];",
            f"{indent}  store_output(batch_index, block_row + k / {block}, block_column + k % {block}, "
            f"vector[k % {VECTOR_WIDTH}]);",
            f"{indent}}}"]


def render_register_matmul(program: TensorProgram, schedule: RegisterMatmulSchedule,
                           parts: Mapping[str, int]) -> ScheduleRendering:
    emitter = _emitter(program, parts)
    info = matmul_info(program)
    block, tile, side = schedule.block, schedule.tile, schedule.threads_per_side
    vectors = block // VECTOR_WIDTH  # vec4 accumulators per row of an invocation's block
    axes, shape = program.axes, program.output.shape
    rows, columns, _ = (emitter.index(simplify(e)) for e in matmul_extents(program, info))
    depth = emitter.index(product(info.reduce_extents))
    out = emitter.statements
    out.extend(_workgroup_tile(rows, columns, tile))
    out.append(f"  // this invocation's {block} x {block} block of outputs")
    out.append(f"  let block_row = row_start + i32(local_index) / {side} * {block};")
    out.append(f"  let block_column = column_start + i32(local_index) % {side} * {block};")
    out.append("  let batch_index = group / (row_tiles * column_tiles);")
    out.append("  if (block_row >= rows) {  // no row of the block inside the output")
    out.append("    return;")
    out.append("  }")
    out.extend(emitter.unflatten([axes[p] for p in info.batch], [shape[p] for p in info.batch], "batch_index", "  "))
    # the factors at each of the block's rows (columns), through renamed copies of the row
    # (column) axes; a row past the last reads the last one (its outputs are not stored)
    factors_a, factors_b = [], []
    for kind, positions, factor, first, extent, into in (
            ("row", info.rows, info.a, "block_row", "rows", factors_a),
            ("column", info.columns, info.b, "block_column", "columns", factors_b)):
        group_axes = [axes[p] for p in positions]
        for i in range(block):
            renamed = [SizeVar(f"{axis.name}_{i}") for axis in group_axes]
            out.append(f"  let {kind}{i} = min({first} + {i}, {extent} - 1);")
            out.extend(emitter.unflatten(renamed, [shape[p] for p in positions], f"{kind}{i}", "  "))
            into.append(substitute_scalar(factor, {a.name: r for a, r in zip(group_axes, renamed)}))
    out.append(f"  var accumulators: array<vec{VECTOR_WIDTH}<f32>, {block * vectors}>;")
    out.append(f"  for (var depth_index = 0; depth_index < {depth}; depth_index = depth_index + 1) {{")
    emitter.open_scope()
    out.extend(emitter.unflatten(info.reduce_axes, info.reduce_extents, "depth_index", "    "))
    a = [emitter.named(emitter.scalar(f, "    "), "    ") for f in factors_a]
    b = _column_vectors(emitter, factors_b, "    ")
    for r in range(block):
        for v in range(vectors):
            k = r * vectors + v
            out.append(f"    accumulators[{k}] = fma(vec{VECTOR_WIDTH}({a[r]}), {b[v]}, accumulators[{k}]);")
    emitter.close_scope()
    out.append("  }")
    out.extend(_store_accumulators(block, "  "))
    epilogue = _matmul_epilogue(program, info, parts)
    helpers = emitter.index_lowering.helpers | epilogue.index_helpers
    return ScheduleRendering([*epilogue.lines, "", *_SIGNATURE, _GROUP, *out, "}"], frozenset(helpers))


def _column_vectors(emitter: Emitter, factors: list[ScalarExpr], indent: str) -> list[str]:
    """The second factor at an invocation's columns (one expression each), as vec4s."""
    values = [emitter.named(emitter.scalar(f, indent), indent) for f in factors]
    names = []
    for v in range(len(values) // VECTOR_WIDTH):
        name = f"b_vector{v}"
        emitter.statements.append(f"{indent}let {name} = vec{VECTOR_WIDTH}<f32>({', '.join(values[v * VECTOR_WIDTH:(v + 1) * VECTOR_WIDTH])});")
        names.append(name)
    return names


def _matmul_epilogue(program: TensorProgram, info: MatmulInfo,
                     parts: Mapping[str, int]) -> ScheduleRendering:
    """``store_output``: the output element at (batch index, row, column) of a matmul-like
    program, from its accumulated reduction: the body around the reduction, then the store."""
    emitter = _emitter(program, parts)
    axes, shape = program.axes, program.output.shape
    rows, columns, _ = (emitter.index(simplify(e)) for e in matmul_extents(program, info))
    out = emitter.statements
    out += ["", "fn store_output(batch_index: i32, row: i32, column: i32, accumulator: f32) {",
            f"  if (row >= {rows} || column >= {columns}) {{", "    return;", "  }"]
    out.extend(emitter.unflatten([axes[p] for p in info.batch], [shape[p] for p in info.batch], "batch_index", "  "))
    out.extend(emitter.unflatten([axes[p] for p in info.rows], [shape[p] for p in info.rows], "row", "  "))
    out.extend(emitter.unflatten([axes[p] for p in info.columns], [shape[p] for p in info.columns], "column", "  "))
    emitter.known(info.reduction, "accumulator")
    value = emitter.scalar(program.body, "  ")
    out.append(_store(program, emitter, value, "  "))
    out.append("}")
    return ScheduleRendering(out, frozenset(emitter.index_lowering.helpers))




# -- vectorized ---------------------------------------------------------------------------------


class _VectorEmitter(Emitter):
    """Expressions over ``width`` consecutive output elements at once (``vecN<f32>`` values)."""

    def __init__(self, program: TensorProgram, width: int, access: dict[str, str], parts: Mapping[str, int]) -> None:
        super().__init__(program, {v.name for v in program.size_vars}, parts)
        self.width = width
        self.access = access
        self.float_type = _vector_type(width)

    def _scalar(self, expr: ScalarExpr, indent: str) -> str:
        if isinstance(expr, Load):
            name = expr.buffer.name
            offset = self.offset(expr.buffer, expr.indices)
            if self.access[name] == VECTOR:
                return self.element(name, f"({offset}) / {self.width}")  # the offset is a multiple of the width
            return f"{_vector_type(self.width)}({self.element(name, offset)})"
        if isinstance(expr, FloatImm):
            return f"{_vector_type(self.width)}({literal(expr.value, expr.dtype)})"
        return super()._scalar(expr, indent)


def _vector_type(width: int) -> str:
    return f"vec{width}<f32>"


def render_vectorized(program: TensorProgram, schedule: VectorizedSchedule,
                      parts: Mapping[str, int]) -> ScheduleRendering:
    width = schedule.width
    access = vector_access(program, width)
    if access is None:
        raise ValueError(f"{program.name} is scheduled as {schedule} but does not fit it (relaxweb.ir.launch.vectorizable)")
    emitter = _VectorEmitter(program, width, access, parts)
    axes, shape = list(program.axes), list(program.output.shape)
    vector_axis = SizeVar(f"{axes[-1].name}vec")
    lines = ["", *_SIGNATURE, _GROUP,
             f"  // {width} consecutive output elements per invocation (along {axes[-1].name})",
             f"  let index = group * {WORKGROUP_SIZE} + i32(local_index);",
             "  if (index >= params.element_count) {", "    return;", "  }"]
    lines += emitter.unflatten([*axes[:-1], vector_axis], [*shape[:-1], simplify(shape[-1] // width)], "index", "  ")
    lines.append(f"  let {axes[-1].name} = {vector_axis.name} * {width};")
    emitter.declare_axis(axes[-1], shape[-1])
    value = emitter.scalar(program.body, "  ")
    lines += emitter.statements
    lines.append(f"  {wgsl_name(program.output.name)}[index] = {value};")
    vectors = {name: _vector_type(width) for name, kind in access.items() if kind == VECTOR}
    return ScheduleRendering(lines + ["}"], frozenset(emitter.index_lowering.helpers),
                             {**vectors, program.output.name: _vector_type(width)})


# The renderer of each schedule kind.
RENDERERS: dict[type[WebGpuSchedule], Callable[[TensorProgram, WebGpuSchedule, Mapping[str, int]], ScheduleRendering]] = {
    ElementSchedule: render_element,
    VectorizedSchedule: render_vectorized,
    WorkgroupReductionSchedule: render_workgroup_reduction,
    TiledMatmulSchedule: render_tiled_matmul,
    HalfTiledMatmulSchedule: render_tiled_matmul,
    RegisterMatmulSchedule: render_register_matmul,
}
