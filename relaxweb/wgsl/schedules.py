"""Schedules: how a tensor program's compute definition maps onto GPU invocations.

The schedule_programs pass (``relaxweb/passes/schedule_programs.py``) picks one per program
from its pattern; this module writes the shader's ``main`` for it and says how many
invocations a dispatch needs (:func:`dispatch_count`, which the host module evaluates at
run time from the size variables).  Every schedule uses workgroups of 64 invocations on the
runtimes' 2-D grid, so the bundle format and the runtimes do not depend on the schedule.

- ``element``: one invocation per output element; reductions are serial loops.
- ``vectorized``: one invocation per four consecutive output elements of an elementwise or
  broadcast float program whose last dimension is a multiple of 4 (:func:`vectorizable`):
  buffers read along the last axis are bound as ``array<vec4<f32>>`` and read 16 bytes at a
  time, buffers constant along it are read once and splatted, and the arithmetic is vec4.
- ``workgroup_reduction``: one workgroup per output element.  Each top-level reduction is
  split across the 64 invocations (each takes every 64th element), then combined by a tree
  in workgroup memory; invocation 0 writes the result.  For long rows: softmax, layer norm
  statistics, means.
- ``tiled_matmul``: one workgroup per 32x32 tile of the (rows x columns) output of a
  matmul-like program (``relaxweb.ir.pattern.analyze_matmul``), per batch index.  Each step
  stages a 16-deep slice of both factors in workgroup memory (evaluating each factor's
  expression, so fused prologues are computed once per tile), and each invocation keeps a
  4x4 block of accumulators in registers.  The epilogue (the body around the reduction:
  bias, activation, residual add) is applied to each accumulator on the way out.
"""

from __future__ import annotations

from ..ir.pattern import MatmulInfo, analyze_matmul, top_level_reductions
from ..ir.symbolic import IntImm, PrimExpr, SizeVar, free_vars, product, simplify
from ..ir.tir import Binary, FloatImm, Load, Reduce, ScalarExpr, TensorProgram, Unary, scalar_dtype, scalar_nodes
from .emit import WORKGROUP_SIZE, _Emitter, _literal, _to_storage, _type, combine, reduce_identity, wgsl_name

TILE = 32  # output rows and columns per tiled-matmul workgroup
TILE_DEPTH = 16  # reduction elements staged per step
BLOCK = 4  # rows and columns per invocation (8 x 8 invocations x 4 x 4 = 32 x 32)
THREADS_PER_SIDE = TILE // BLOCK
VECTOR = 4  # output elements per invocation of the vectorized schedule


def dispatch_count(program: TensorProgram) -> PrimExpr:
    """Invocations a dispatch of ``program`` needs, over its size variables."""
    outputs = product(program.output.shape)
    if program.schedule == "vectorized":
        return simplify(outputs // VECTOR)
    if program.schedule == "workgroup_reduction":
        return simplify(outputs * WORKGROUP_SIZE)
    if program.schedule == "tiled_matmul":
        info = _matmul_info(program)
        rows, columns, batch = _matmul_extents(program, info)
        tiles = ((rows + (TILE - 1)) // TILE) * ((columns + (TILE - 1)) // TILE)
        return simplify(batch * tiles * WORKGROUP_SIZE)
    return outputs


def workgroup_storage_bytes(program: TensorProgram) -> int:
    """Bytes of workgroup memory the program's schedule declares (the bundle requires at
    least this ``maxComputeWorkgroupStorageSize``)."""
    if program.schedule == "tiled_matmul":
        return 2 * TILE * TILE_DEPTH * 4
    if program.schedule == "workgroup_reduction":
        return len(set(top_level_reductions(program.body))) * WORKGROUP_SIZE * 4
    return 0


def emit_main(program: TensorProgram, emitter: _Emitter) -> list[str]:
    """The declarations after the bindings and the ``main`` function, for the program's schedule."""
    if program.schedule == "vectorized":
        return _vectorized(program, emitter)
    if program.schedule == "workgroup_reduction":
        return _workgroup_reduction(program, emitter)
    if program.schedule == "tiled_matmul":
        return _tiled_matmul(program, emitter)
    return _element(program, emitter)


_SIGNATURE = [
    f"@compute @workgroup_size({WORKGROUP_SIZE})",
    "fn main(@builtin(workgroup_id) workgroup: vec3<u32>,",
    "        @builtin(num_workgroups) workgroups: vec3<u32>,",
    "        @builtin(local_invocation_index) local_index: u32) {",
]
# The workgroup's number on the runtimes' 2-D grid (uniform across the workgroup).
_GROUP = "  let group = i32(workgroup.y * workgroups.x + workgroup.x);"


def _store(program: TensorProgram, emitter: _Emitter, value: str, indent: str) -> str:
    output = program.output
    return f"{indent}{wgsl_name(output.name)}[{emitter.output_offset()}] = {_to_storage(output.dtype, value)};"


def _element(program: TensorProgram, emitter: _Emitter) -> list[str]:
    lines = ["", *_SIGNATURE, _GROUP,
             f"  let index = group * {WORKGROUP_SIZE} + i32(local_index);",
             "  if (index >= params.element_count) {", "    return;", "  }"]
    lines += emitter.unflatten(program.axes, program.output.shape, "index", "  ")
    value = emitter.scalar(program.body, "  ")
    lines += emitter.statements
    output = program.output
    lines.append(f"  {wgsl_name(output.name)}[index] = {_to_storage(output.dtype, value)};")
    return lines + ["}"]


def _workgroup_reduction(program: TensorProgram, emitter: _Emitter) -> list[str]:
    reductions = list(dict.fromkeys(top_level_reductions(program.body)))
    shared = [f"var<workgroup> partial{i}: array<{_type(scalar_dtype(r))}, {WORKGROUP_SIZE}>;"
              for i, r in enumerate(reductions)]
    partial_of = {r: f"partial{i}" for i, r in enumerate(reductions)}

    def cooperative(expr: Reduce, indent: str) -> str:
        partial = partial_of[expr]
        dtype = scalar_dtype(expr.body)
        accumulator = f"{partial}_value"
        axis = expr.axis.name
        extent = emitter.index(simplify(expr.extent))
        out = emitter.statements
        out.append(f"{indent}// {expr.combiner} over {axis} < {extent}, split across the workgroup")
        out.append(f"{indent}var {accumulator}: {_type(dtype)} = {reduce_identity(expr.combiner, dtype)};")
        out.append(f"{indent}var first_{axis} = true;")
        out.append(f"{indent}for (var {axis}: i32 = i32(local_index); {axis} < {extent}; {axis} = {axis} + {WORKGROUP_SIZE}) {{")
        emitter.open_scope()
        emitter.declare_axis(expr.axis, expr.extent)
        value = emitter.scalar(expr.body, indent + "  ")
        emitter.close_scope()
        out.append(f"{indent}  {accumulator} = {combine(expr.combiner, dtype, accumulator, value, f'first_{axis}')};")
        out.append(f"{indent}  first_{axis} = false;")
        out.append(f"{indent}}}")
        if expr.combiner in ("max", "min") and dtype.startswith("float"):
            # an invocation with no element takes element 0 (max and min ignore repeats)
            out.append(f"{indent}if (first_{axis} && {extent} > 0) {{")
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
    return lines


def _matmul_info(program: TensorProgram) -> MatmulInfo:
    info = analyze_matmul(program)
    if info is None:
        raise ValueError(f"{program.name} is scheduled as a tiled matmul but is not matmul-like")
    return info


def _matmul_extents(program: TensorProgram, info: MatmulInfo) -> tuple[PrimExpr, PrimExpr, PrimExpr]:
    shape = program.output.shape
    return (product(shape[p] for p in info.rows), product(shape[p] for p in info.columns),
            product(shape[p] for p in info.batch))


def _tiled_matmul(program: TensorProgram, emitter: _Emitter) -> list[str]:
    info = _matmul_info(program)
    axes, shape = program.axes, program.output.shape
    rows, columns, batch = (emitter.index(simplify(e)) for e in _matmul_extents(program, info))
    depth = emitter.index(product(info.reduce_extents))
    tile_size = TILE * TILE_DEPTH
    out = emitter.statements

    def stage(tile: str, factor, own_axes, extent: str, start: str) -> None:
        """Evaluate one factor over a TILE_DEPTH x TILE slice into workgroup memory."""
        out.append(f"    for (var e = i32(local_index); e < {tile_size}; e = e + {WORKGROUP_SIZE}) {{")
        out.append(f"      let position = {start} + e % {TILE};")
        out.append(f"      let depth_index = step + e / {TILE};")
        out.append("      var value: f32 = 0.0;")
        out.append(f"      if (position < {extent} && depth_index < {depth}) {{")
        emitter.open_scope()
        out.extend(emitter.unflatten([axes[p] for p in own_axes], [shape[p] for p in own_axes], "position", "        "))
        out.extend(emitter.unflatten(info.reduce_axes, info.reduce_extents, "depth_index", "        "))
        value = emitter.scalar(factor, "        ")
        emitter.close_scope()
        out.append(f"        value = {value};")
        out.append("      }")
        out.append(f"      {tile}[e] = value;")
        out.append("    }")

    out.append(f"  let rows = {rows};")
    out.append(f"  let columns = {columns};")
    out.append(f"  let row_tiles = (rows + {TILE - 1}) / {TILE};")
    out.append(f"  let column_tiles = (columns + {TILE - 1}) / {TILE};")
    out.append(f"  if (group >= params.element_count / {WORKGROUP_SIZE}) {{")
    out.append("    return;")
    out.append("  }")
    out.append("  let tile = group % (row_tiles * column_tiles);")
    out.append(f"  let row_start = tile / column_tiles * {TILE};")
    out.append(f"  let column_start = tile % column_tiles * {TILE};")
    out.append(f"  let thread_row = i32(local_index) / {THREADS_PER_SIDE};")
    out.append(f"  let thread_column = i32(local_index) % {THREADS_PER_SIDE};")
    out.extend(emitter.unflatten([axes[p] for p in info.batch], [shape[p] for p in info.batch],
                                 "group / (row_tiles * column_tiles)", "  "))
    out.append(f"  var accumulators: array<f32, {BLOCK * BLOCK}>;")
    out.append(f"  for (var step = 0; step < {depth}; step = step + {TILE_DEPTH}) {{")
    stage("tile_a", info.a, info.rows, "rows", "row_start")
    stage("tile_b", info.b, info.columns, "columns", "column_start")
    out.append("    workgroupBarrier();")
    out.append(f"    for (var d = 0; d < {TILE_DEPTH}; d = d + 1) {{")
    for r in range(BLOCK):
        out.append(f"      let a{r} = tile_a[d * {TILE} + thread_row + {r * THREADS_PER_SIDE}];")
    for c in range(BLOCK):
        out.append(f"      let b{c} = tile_b[d * {TILE} + thread_column + {c * THREADS_PER_SIDE}];")
    for r in range(BLOCK):
        for c in range(BLOCK):
            out.append(f"      accumulators[{r * BLOCK + c}] = fma(a{r}, b{c}, accumulators[{r * BLOCK + c}]);")
    out.append("    }")
    out.append("    workgroupBarrier();")
    out.append("  }")
    # the epilogue, once per accumulator; unrolled, so that the accumulators are only ever
    # indexed by constants and can stay in registers
    for r in range(BLOCK):
        for c in range(BLOCK):
            out.append(f"  {{  // accumulator {r * BLOCK + c}: row {r}, column {c} of this invocation's block")
            out.append(f"    let row = row_start + thread_row + {r * THREADS_PER_SIDE};")
            out.append(f"    let column = column_start + thread_column + {c * THREADS_PER_SIDE};")
            out.append("    if (row < rows && column < columns) {")
            emitter.open_scope()
            out.extend(emitter.unflatten([axes[p] for p in info.rows], [shape[p] for p in info.rows], "row", "      "))
            out.extend(emitter.unflatten([axes[p] for p in info.columns], [shape[p] for p in info.columns], "column", "      "))
            emitter.known(info.reduction, f"accumulators[{r * BLOCK + c}]")
            value = emitter.scalar(program.body, "      ")
            out.append(_store(program, emitter, value, "      "))
            emitter.close_scope()
            out += ["    }", "  }"]
    shared = [f"var<workgroup> tile_a: array<f32, {tile_size}>;  // {TILE_DEPTH} x {TILE}: the first factor",
              f"var<workgroup> tile_b: array<f32, {tile_size}>;  // {TILE_DEPTH} x {TILE}: the second factor"]
    return ["", *shared, "", *_SIGNATURE, _GROUP, *out, "}"]



# -- vectorized ---------------------------------------------------------------------------------


def vectorizable(program: TensorProgram) -> bool:
    """Whether the ``vectorized`` schedule can run ``program``: float32 elementwise arithmetic
    (loads, constants, binary and unary ops; no selects, casts or comparisons), an output
    whose last dimension is a multiple of 4, and every buffer read either along the last
    axis (at it plus a multiple of 4, from a last dimension that is a multiple of 4) or
    never along it."""
    if program.output.dtype != "float32" or not program.axes:
        return False
    if not _multiple_of_vector(program.output.shape[-1]):
        return False
    return _buffer_kinds(program) is not None


def buffer_types(program: TensorProgram) -> dict[str, str]:
    """WGSL element types of the buffers the vectorized schedule reads 16 bytes at a time."""
    if program.schedule != "vectorized":
        return {}
    kinds = _buffer_kinds(program) or {}
    vectors = {name: "vec4<f32>" for name, kind in kinds.items() if kind == "vector"}
    return {**vectors, program.output.name: "vec4<f32>"}


def _multiple_of_vector(extent: PrimExpr) -> bool:
    return simplify(extent % VECTOR) == IntImm(0)


def _buffer_kinds(program: TensorProgram) -> dict[str, str] | None:
    """Each loaded buffer's kind ("vector" or "splat"), or None when the program does not fit."""
    last = program.axes[-1].name
    kinds: dict[str, str] = {}
    for node in scalar_nodes(program.body):
        if not isinstance(node, (Load, Binary, Unary, FloatImm)):
            return None
        if isinstance(node, Unary) and node.op == "is_nan":
            return None
        if isinstance(node, FloatImm) and node.dtype != "float32":
            return None
        if not isinstance(node, Load):
            continue
        if node.buffer.dtype != "float32":
            return None
        uses_last = [last in {v.name for v in free_vars(i)} for i in node.indices]
        if not any(uses_last):
            kind = "splat"
        else:
            offset = simplify(node.indices[-1] - SizeVar(last))
            if uses_last[:-1] and any(uses_last[:-1]):
                return None
            if last in {v.name for v in free_vars(offset)} or simplify(offset % VECTOR) != IntImm(0):
                return None
            if not _multiple_of_vector(node.buffer.shape[-1]):
                return None
            kind = "vector"
        if kinds.setdefault(node.buffer.name, kind) != kind:
            return None
    return kinds



class _VectorEmitter(_Emitter):
    """Expressions over four consecutive output elements at once (vec4<f32> values)."""

    def __init__(self, program: TensorProgram, kinds: dict[str, str]) -> None:
        super().__init__(program, {v.name for v in program.size_vars})
        self.kinds = kinds

    def _scalar(self, expr: ScalarExpr, indent: str) -> str:
        if isinstance(expr, Load):
            name = wgsl_name(expr.buffer.name)
            offset = self.offset(expr.buffer, expr.indices)
            if self.kinds[expr.buffer.name] == "vector":
                return f"{name}[({offset}) / {VECTOR}]"  # the offset is a multiple of 4
            return f"vec4<f32>({name}[{offset}])"
        if isinstance(expr, FloatImm):
            return f"vec4<f32>({_literal(expr.value, expr.dtype)})"
        return super()._scalar(expr, indent)


def _vectorized(program: TensorProgram, shader_emitter: _Emitter) -> list[str]:
    emitter = _VectorEmitter(program, _buffer_kinds(program) or {})
    emitter.index_lowering = shader_emitter.index_lowering  # the helpers it uses are the shader's
    axes, shape = list(program.axes), list(program.output.shape)
    quad = SizeVar(f"{axes[-1].name}quad")
    lines = ["", *_SIGNATURE, _GROUP,
             f"  // four consecutive output elements per invocation (along {axes[-1].name})",
             f"  let index = group * {WORKGROUP_SIZE} + i32(local_index);",
             "  if (index >= params.element_count) {", "    return;", "  }"]
    lines += emitter.unflatten([*axes[:-1], quad], [*shape[:-1], simplify(shape[-1] // VECTOR)], "index", "  ")
    lines.append(f"  let {axes[-1].name} = {quad.name} * {VECTOR};")
    emitter.declare_axis(axes[-1], shape[-1])
    value = emitter.scalar(program.body, "  ")
    lines += emitter.statements
    lines.append(f"  {wgsl_name(program.output.name)}[index] = {value};")
    return lines + ["}"]
