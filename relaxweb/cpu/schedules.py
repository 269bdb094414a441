"""The loops of each kind of tensor program on the CPU: a kernel's ``$units`` and ``$main``.

A GPU schedule (``relaxweb/ir/schedule.py``) lays a program out on invocations; here the
loops are chosen from the program itself (``relaxweb/ir/pattern.py`` says what it is), so
every schedule kind renders.  The signature is the contract's (docs/bundle-format.md,
"kernels.wasm"): ``$units (params) -> units`` and ``$main (params, first, end, scratch,
b1 .. bN)`` running units ``first <= u < end``; ``bI`` is the address of binding I (an input
bound as parts has one parameter per part: the first holds the whole buffer, the others
are ignored).

Matmul-like programs get a register-blocked micro-kernel (:func:`render_matmul`), float
elementwise programs whose last dimension is a multiple of 4 a loop over f32x4 vectors
(:func:`render_vectorized`).  The element form runs any program: a unit is :data:`ELEMENTS_PER_UNIT` consecutive output
elements (threads split the work coarsely), a loop over the flat output index recovers the
axes by division, reductions are serial loops, and each element is stored in the output's
device dtype.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from ..ir.lower_index import IndexLowering
from ..ir.pattern import MatmulInfo, analyze_matmul
from ..ir.symbolic import IntImm, PrimExpr, SizeVar, as_int, free_vars, product, simplify, substitute
from ..ir.syntax import comment_text
from ..ir.tir import Load, TensorProgram, format_scalar
from .emit import Emitter, Function, VectorEmitter, flat_offset, render_index, store, vector_access_of

ELEMENTS_PER_UNIT = 64
PARAMS = "$params"


def kernel_signature(program: TensorProgram, parts: Mapping[str, int]) -> tuple[str, dict[str, str]]:
    """The params of ``$main`` after ``$params``, and each buffer's address parameter by name."""
    params = ["(param $params i32)", "(param $first i32)", "(param $end i32)", "(param $scratch i32)"]
    addresses: dict[str, str] = {}
    binding = 1
    for buffer in (*program.inputs, program.output):
        for part in range(parts.get(buffer.name, 1)):
            name = f"$b{binding}"
            params.append(f"(param {name} i32)")
            if part == 0:
                addresses.setdefault(buffer.name, name)
            binding += 1
    return " ".join(params), addresses


def load_size_vars(program: TensorProgram, function: Function, indent: str) -> dict[str, str]:
    """Statements loading the size variables from the params block (the i32 fields after
    ``element_count``, in the program's order) into locals ``$s0`` ...; their locals by name."""
    locals_ = {}
    for position, var in enumerate(program.size_vars):
        local = function.named_local(f"s{position}", "i32")
        function.emit(indent, f"(local.set {local} (i32.load offset={4 * (position + 1)} (local.get {PARAMS})))  "
                              f";; {comment_text(var.name)}")
        locals_[var.name] = local
    return locals_


def element_count(program: TensorProgram, variables: Mapping[str, str]) -> str:
    """The number of output elements (i32 WAT) from the size variables' locals."""
    count = product(program.output.shape)
    lowering = IndexLowering()
    return render_index(lowering.lower(simplify(count)), lambda name: f"(local.get {variables[name]})")


def units_function(program: TensorProgram, per_unit: int) -> str:
    """``$units``: the output elements in units of ``per_unit``, rounded up."""
    function = Function()
    variables = load_size_vars(program, function, "  ")
    count = element_count(program, variables)
    function.emit("  ", f"(i32.div_u (i32.add {count} (i32.const {per_unit - 1})) (i32.const {per_unit}))")
    return function.text(f"$units (param {PARAMS} i32) (result i32)")


def comment(program: TensorProgram) -> list[str]:
    """The comment lines above a kernel's ``$main``: what it computes (model text escaped)."""
    axes = ", ".join(axis.name for axis in program.axes)
    return [";; " + comment_text(f"{program.output.name}[{axes}] = {format_scalar(program.body)}")]


def render_element(program: TensorProgram, parts: Mapping[str, int]) -> str:
    """The element form: units of :data:`ELEMENTS_PER_UNIT` output elements, each computed
    on its own (axes from the flat index by division)."""
    signature, addresses = kernel_signature(program, parts)
    function = Function()
    indent = "  "
    variables = load_size_vars(program, function, indent)
    emitter = Emitter(program, function, addresses, variables)
    emit = function.emit
    index, stop = function.named_local("i", "i32"), function.named_local("stop", "i32")
    emit(indent, f"(local.set {index} (i32.mul (local.get $first) (i32.const {ELEMENTS_PER_UNIT})))")
    emit(indent, f"(local.set {stop} (call $min_s_i32 (i32.mul (local.get $end) (i32.const {ELEMENTS_PER_UNIT})) "
                 f"{element_count(program, variables)}))")
    emit(indent, "(block $done")
    emit(indent, f"  (br_if $done (i32.ge_s (local.get {index}) (local.get {stop})))")
    emit(indent, "  (loop $element")
    inner = indent + "    "
    emitter.open_scope()
    unflatten(emitter, program.axes, program.output.shape, index, inner)
    value = emitter.scalar(program.body, inner)
    emit(inner, store(program.output.dtype, emitter.address(program.output.name, f"(local.get {index})"), value))
    emitter.close_scope()
    emit(inner, f"(local.set {index} (i32.add (local.get {index}) (i32.const 1)))")
    emit(inner, f"(br_if $element (i32.lt_s (local.get {index}) (local.get {stop})))))")
    return "\n".join([*comment(program), function.text(f"$main {signature}"), units_function(program, ELEMENTS_PER_UNIT)])


def render_vectorized(program: TensorProgram, parts: Mapping[str, int], access: Mapping[str, str]) -> str:
    """The element form four output elements at a time (consecutive along the last axis,
    whose extent is a multiple of 4): f32x4 loads, arithmetic and math calls, splats of the
    buffers constant along the last axis, one ``v128.store``."""
    signature, addresses = kernel_signature(program, parts)
    function = Function()
    indent = "  "
    variables = load_size_vars(program, function, indent)
    emitter = VectorEmitter(program, function, addresses, variables, access)
    emit = function.emit
    index, stop = function.named_local("i", "i32"), function.named_local("stop", "i32")
    emit(indent, f"(local.set {index} (i32.mul (local.get $first) (i32.const {ELEMENTS_PER_UNIT})))")
    emit(indent, f"(local.set {stop} (call $min_s_i32 (i32.mul (local.get $end) (i32.const {ELEMENTS_PER_UNIT})) "
                 f"{element_count(program, variables)}))")
    emit(indent, "(block $done")
    emit(indent, f"  (br_if $done (i32.ge_s (local.get {index}) (local.get {stop})))")
    emit(indent, "  (loop $vector")
    inner = indent + "    "
    emitter.open_scope()
    unflatten(emitter, program.axes, program.output.shape, index, inner)
    value = emitter.scalar(program.body, inner)
    emit(inner, f"(v128.store {emitter.address(program.output.name, f'(local.get {index})')} {value})")
    emitter.close_scope()
    emit(inner, f"(local.set {index} (i32.add (local.get {index}) (i32.const 4)))")
    emit(inner, f"(br_if $vector (i32.lt_s (local.get {index}) (local.get {stop})))))")
    return "\n".join([*comment(program), function.text(f"$main {signature}"), units_function(program, ELEMENTS_PER_UNIT)])


def unflatten(emitter: Emitter, axes: tuple[SizeVar, ...], extents: tuple[PrimExpr, ...], linear: str,
              indent: str) -> None:
    """Statements setting the axes' locals (``$x0`` ...) from a flat row-major index held in
    the local ``linear`` (>= 0, below the product of the extents: every extent is > 0 where
    it runs, so the divisions are plain unsigned ones), declaring each axis's range."""
    if not axes:
        return
    function = emitter.function
    rest = function.named_local("rest", "i32")
    function.emit(indent, f"(local.set {rest} (local.get {linear}))")
    locals_ = [function.named_local(f"x{position}", "i32") for position in range(len(axes))]
    for position in reversed(range(1, len(axes))):
        extent = simplify(extents[position])
        local = locals_[position]
        if extent in (IntImm(0), IntImm(1)):
            function.emit(indent, f"(local.set {local} (i32.const 0))")
        else:
            divisor = emitter.index(extent)
            function.emit(indent, f"(local.set {local} (i32.rem_u (local.get {rest}) {divisor}))")
            function.emit(indent, f"(local.set {rest} (i32.div_u (local.get {rest}) {divisor}))")
        emitter.declare_axis(axes[position], extent, local)
    function.emit(indent, f"(local.set {locals_[0]} (local.get {rest}))")
    emitter.declare_axis(axes[0], extents[0], locals_[0])


def render_program(program: TensorProgram, parts: Mapping[str, int] | None = None) -> str:
    """The WAT of a tensor program's ``$main`` and ``$units`` (loops chosen from the
    program): the micro-kernel for a matmul-like program, else the element form."""
    parts = dict(parts or {})
    info = analyze_matmul(program)
    if info is not None:
        return render_matmul(program, parts, cheap_columns(info, program))
    access = vector_access_of(program)
    if access is not None:
        return render_vectorized(program, parts, access)
    return render_element(program, parts)


def scratch_bytes(program: TensorProgram) -> int:
    """The scratch bytes a thread needs for the program's kernel."""
    return MATMUL_SCRATCH_BYTES if analyze_matmul(program) is not None else 0


# -- matmul-like programs: a register-blocked micro-kernel -------------------------------------

BLOCK_ROWS = 4  # rows of an output block (one splat of the first factor each)
BLOCK_COLUMNS = 16  # columns of an output block (four f32x4 of the second factor)
MATMUL_SCRATCH_BYTES = 4 * BLOCK_ROWS * BLOCK_COLUMNS  # a block's sums, spilled for the epilogue


def contiguous_columns(info: MatmulInfo, program: TensorProgram) -> bool:
    """Whether the second factor is a plain load whose last index is the only column axis
    (the output's last axis): four consecutive columns are one ``v128.load``."""
    if info.columns != (len(program.axes) - 1,) or not isinstance(info.b, Load):
        return False
    column = program.axes[-1].name
    *others, last = info.b.indices
    if any(column in {v.name for v in free_vars(index)} for index in others):
        return False
    offset = simplify(last - program.axes[-1])
    return column not in {v.name for v in free_vars(offset)}


def column_strides(info: MatmulInfo, program: TensorProgram) -> list[int] | None:
    """For a second factor that is a plain load and a single column axis: how many elements
    past the first column's element each column of a block reads, when these are
    non-negative constants (a transposed weight: its row length); None otherwise."""
    if len(info.columns) != 1 or not isinstance(info.b, Load):
        return None
    column = program.axes[info.columns[0]]
    indices = info.b.indices
    first = flat_offset(info.b.buffer, indices)
    strides = []
    for lane in range(BLOCK_COLUMNS):
        moved = tuple(substitute(index, {column.name: column + lane}) for index in indices)
        distance = as_int(simplify(flat_offset(info.b.buffer, moved) - first))
        if distance is None or distance < 0:
            return None
        strides.append(distance)
    return strides


def cheap_columns(info: MatmulInfo, program: TensorProgram) -> MatmulInfo:
    """``info`` with the factors' roles swapped when only the first is a plain load (a
    convolution's weight next to its padded input): the second factor is evaluated per
    column of a block, four times as often as the first, so it should be the cheap one.
    Not when the rows are fewer than a block's columns (a convolution with few output
    channels): no block would be whole."""
    if isinstance(info.b, Load) or not isinstance(info.a, Load):
        return info
    rows = as_int(simplify(product(program.output.shape[p] for p in info.rows)))
    if rows is not None and rows < BLOCK_COLUMNS:
        return info
    return dataclasses.replace(info, a=info.b, b=info.a, rows=info.columns, columns=info.rows)


def render_matmul(program: TensorProgram, parts: Mapping[str, int], info: MatmulInfo) -> str:
    """A matmul-like program (``relaxweb/ir/pattern.analyze_matmul``) in blocks of
    :data:`BLOCK_ROWS` x :data:`BLOCK_COLUMNS` outputs, one unit each (per batch index).

    A whole block keeps its sums in 16 v128 locals: at each reduction step the first factor
    is evaluated once per row and splatted, the second read as four f32x4 along the columns
    (``v128.load`` where it is a plain load contiguous in the only column axis, else
    evaluated per column and assembled lane by lane), and multiplied in
    (``f32x4.add(f32x4.mul)``: SIMD128 has no fused multiply-add).  The sums are spilled to
    the scratch block, and a loop over the block's elements applies the epilogue (the body
    with the sum replaced by its value) and stores.  A block at the edge of the output
    computes each of its elements on its own, as the element form does."""
    signature, addresses = kernel_signature(program, parts)
    function = Function()
    indent = "  "
    emit = function.emit
    variables = load_size_vars(program, function, indent)
    emitter = Emitter(program, function, addresses, variables)
    shape = program.output.shape
    row_axes = [program.axes[p] for p in info.rows]
    column_axes = [program.axes[p] for p in info.columns]
    batch_axes = [program.axes[p] for p in info.batch]
    row_extents = [shape[p] for p in info.rows]
    column_extents = [shape[p] for p in info.columns]
    batch_extents = [shape[p] for p in info.batch]
    rows, columns = simplify(product(row_extents)), simplify(product(column_extents))
    row_count, column_count = function.named_local("rows", "i32"), function.named_local("columns", "i32")
    emit(indent, f"(local.set {row_count} {emitter.index(rows)})")
    emit(indent, f"(local.set {column_count} {emitter.index(columns)})")
    column_blocks, row_blocks = function.named_local("column_blocks", "i32"), function.named_local("row_blocks", "i32")
    emit(indent, f"(local.set {column_blocks} (i32.div_u (i32.add (local.get {column_count}) "
                 f"(i32.const {BLOCK_COLUMNS - 1})) (i32.const {BLOCK_COLUMNS})))")
    emit(indent, f"(local.set {row_blocks} (i32.div_u (i32.add (local.get {row_count}) "
                 f"(i32.const {BLOCK_ROWS - 1})) (i32.const {BLOCK_ROWS})))")
    unit, row0, column0, full = (function.named_local(name, "i32") for name in ("unit", "row0", "column0", "full"))
    batch = function.named_local("batch", "i32")
    emit(indent, f"(local.set {unit} (local.get $first))")
    emit(indent, "(block $done")
    emit(indent, f"  (br_if $done (i32.ge_u (local.get {unit}) (local.get $end)))")
    emit(indent, "  (loop $block")
    inner = indent + "    "
    per_batch = f"(i32.mul (local.get {row_blocks}) (local.get {column_blocks}))"
    emit(inner, f"(local.set {batch} (i32.div_u (local.get {unit}) {per_batch}))")
    emit(inner, f"(local.set {row0} (i32.mul (i32.div_u (i32.rem_u (local.get {unit}) {per_batch}) "
                f"(local.get {column_blocks})) (i32.const {BLOCK_ROWS})))")
    emit(inner, f"(local.set {column0} (i32.mul (i32.rem_u (local.get {unit}) (local.get {column_blocks})) "
                f"(i32.const {BLOCK_COLUMNS})))")
    emit(inner, f"(local.set {full} (i32.and (i32.le_u (i32.add (local.get {row0}) (i32.const {BLOCK_ROWS})) "
                f"(local.get {row_count})) (i32.le_u (i32.add (local.get {column0}) (i32.const {BLOCK_COLUMNS})) "
                f"(local.get {column_count}))))")
    emitter.open_scope()
    batch_locals = unflatten_into(emitter, batch_extents, f"(local.get {batch})", "xb", inner)
    for axis, extent, local in zip(batch_axes, batch_extents, batch_locals):
        emitter.declare_axis(axis, extent, local)
    emit(inner, f"(if (local.get {full})")
    emit(inner, "  (then")
    _block_sums(emitter, info, program, row_axes, row_extents, column_axes, column_extents, row0, column0, inner + "    ")
    function.lines[-1] += "))"
    _block_outputs(emitter, info, program, row_axes, row_extents, column_axes, column_extents, row0, column0, full,
                   inner)
    emitter.close_scope()
    emit(inner, f"(local.set {unit} (i32.add (local.get {unit}) (i32.const 1)))")
    emit(inner, f"(br_if $block (i32.lt_u (local.get {unit}) (local.get $end)))))")
    units = Function()
    unit_variables = load_size_vars(program, units, "  ")
    count = simplify(product(batch_extents) * ((rows + (BLOCK_ROWS - 1)) // BLOCK_ROWS)
                     * ((columns + (BLOCK_COLUMNS - 1)) // BLOCK_COLUMNS))
    units.emit("  ", render_index(IndexLowering().lower(count), lambda name: f"(local.get {unit_variables[name]})"))
    return "\n".join([*comment(program), function.text(f"$main {signature}"),
                      units.text(f"$units (param {PARAMS} i32) (result i32)")])


def _block_sums(emitter: Emitter, info: MatmulInfo, program: TensorProgram, row_axes, row_extents, column_axes,
                column_extents, row0: str, column0: str, indent: str) -> None:
    """The statements of a whole block's sums, spilled to the scratch block (row-major)."""
    function, emit = emitter.function, emitter.function.emit
    lanes = BLOCK_COLUMNS // 4
    row_locals = [unflatten_into(emitter, row_extents, f"(i32.add (local.get {row0}) (i32.const {r}))", f"xr{r}_", indent)
                  for r in range(BLOCK_ROWS)]
    vector_b = contiguous_columns(info, program)
    strides = None if vector_b else column_strides(info, program)
    column_count = 1 if vector_b or strides is not None else BLOCK_COLUMNS
    column_locals = [unflatten_into(emitter, column_extents, f"(i32.add (local.get {column0}) (i32.const {c}))",
                                    f"xc{c}_", indent) for c in range(column_count)]
    sums = [[function.named_local(f"sum{r}_{q}", "v128") for q in range(lanes)] for r in range(BLOCK_ROWS)]
    for row in sums:
        for local in row:
            emit(indent, f"(local.set {local} (v128.const i32x4 0 0 0 0))")
    # the reduction's loops, outermost first (their extents use no index variable)
    depth = indent
    for number, (axis, extent) in enumerate(zip(info.reduce_axes, info.reduce_extents)):
        local, end = function.named_local(f"k{number}", "i32"), function.named_local(f"k{number}_end", "i32")
        emit(depth, f"(local.set {end} {emitter.index(extent)})")
        emit(depth, f"(local.set {local} (i32.const 0))")
        emit(depth, f"(block $summed{number}")
        emit(depth, f"  (br_if $summed{number} (i32.ge_s (local.get {local}) (local.get {end})))")
        emit(depth, f"  (loop $sum{number}")
        depth += "    "
        emitter.open_scope()
        emitter.declare_axis(axis, extent, local)
    factors_a = []
    for r in range(BLOCK_ROWS):
        emitter.open_scope()
        for axis, extent, local in zip(row_axes, row_extents, row_locals[r]):
            emitter.declare_axis(axis, extent, local)
        factors_a.append(emitter.set_local(f"(f32x4.splat {emitter.scalar(info.a, depth)})", "v128", depth, "factor_a"))
        emitter.close_scope()
    factors_b = []
    if vector_b:
        emitter.open_scope()
        for axis, extent, local in zip(column_axes, column_extents, column_locals[0]):
            emitter.declare_axis(axis, extent, local)
        address = emitter.set_local(emitter.element_address(info.b.buffer, info.b.indices), "i32", depth, "address")
        emitter.close_scope()
        factors_b = [emitter.set_local(f"(v128.load offset={16 * q} {address})", "v128", depth, "factor_b") for q in range(lanes)]
    elif strides is not None:  # one address, each column at a constant distance from the first
        emitter.open_scope()
        for axis, extent, local in zip(column_axes, column_extents, column_locals[0]):
            emitter.declare_axis(axis, extent, local)
        address = emitter.set_local(emitter.element_address(info.b.buffer, info.b.indices), "i32", depth, "address")
        emitter.close_scope()
        values = [f"(f32.load offset={4 * stride} {address})" for stride in strides]
        for q in range(lanes):
            vector = f"(f32x4.splat {values[4 * q]})"
            for lane in range(1, 4):
                vector = f"(f32x4.replace_lane {lane} {vector} {values[4 * q + lane]})"
            factors_b.append(emitter.set_local(vector, "v128", depth, "factor_b"))
    else:
        values = []
        for c in range(BLOCK_COLUMNS):
            emitter.open_scope()
            for axis, extent, local in zip(column_axes, column_extents, column_locals[c]):
                emitter.declare_axis(axis, extent, local)
            values.append(emitter.set_local(emitter.scalar(info.b, depth), "f32", depth, "bc"))
            emitter.close_scope()
        for q in range(lanes):
            vector = f"(f32x4.splat {values[4 * q]})"
            for lane in range(1, 4):
                vector = f"(f32x4.replace_lane {lane} {vector} {values[4 * q + lane]})"
            factors_b.append(emitter.set_local(vector, "v128", depth, "factor_b"))
    for r in range(BLOCK_ROWS):
        for q in range(lanes):
            emit(depth, f"(local.set {sums[r][q]} (f32x4.add (local.get {sums[r][q]}) "
                        f"(f32x4.mul {factors_a[r]} {factors_b[q]})))")
    for number in reversed(range(len(info.reduce_axes))):
        emitter.close_scope()
        depth = depth[:-4]
        local, end = f"$k{number}", f"$k{number}_end"
        emit(depth + "    ", f"(local.set {local} (i32.add (local.get {local}) (i32.const 1)))")
        emit(depth + "    ", f"(br_if $sum{number} (i32.lt_s (local.get {local}) (local.get {end})))))")
    for r in range(BLOCK_ROWS):
        for q in range(lanes):
            emit(indent, f"(v128.store offset={16 * (r * lanes + q)} (local.get $scratch) (local.get {sums[r][q]}))")


def _block_outputs(emitter: Emitter, info: MatmulInfo, program: TensorProgram, row_axes, row_extents, column_axes,
                   column_extents, row0: str, column0: str, full: str, indent: str) -> None:
    """A loop over the block's elements inside the output: the epilogue of the spilled sum
    (a whole block), or the whole body (a block at the edge)."""
    function, emit = emitter.function, emitter.function.emit
    element = function.named_local("element", "i32")
    row, column = function.named_local("row", "i32"), function.named_local("column", "i32")
    emit(indent, f"(local.set {element} (i32.const 0))")
    emit(indent, "(loop $output")
    inner = indent + "  "
    emit(inner, f"(local.set {row} (i32.add (local.get {row0}) "
                f"(i32.div_u (local.get {element}) (i32.const {BLOCK_COLUMNS}))))")
    emit(inner, f"(local.set {column} (i32.add (local.get {column0}) "
                f"(i32.rem_u (local.get {element}) (i32.const {BLOCK_COLUMNS}))))")
    emit(inner, f"(if (i32.and (i32.lt_u (local.get {row}) (local.get $rows)) "
                f"(i32.lt_u (local.get {column}) (local.get $columns)))")
    emit(inner, "  (then")
    body = inner + "    "
    emitter.open_scope()
    for axes, extents, linear, prefix in ((row_axes, row_extents, row, "yr"), (column_axes, column_extents, column, "yc")):
        for axis, extent, local in zip(axes, extents, unflatten_into(emitter, extents, f"(local.get {linear})", prefix, body)):
            emitter.declare_axis(axis, extent, local)
    offset = emitter.index(flat_offset(program.output, tuple(program.axes)))
    address = emitter.set_local(emitter.address(program.output.name, offset), "i32", body, "address")
    emit(body, f"(if (local.get {full})")
    for label, known in (("then", True), ("else", False)):
        emit(body, f"  ({label}")
        emitter.open_scope()
        if known:
            emitter.known(info.reduction, "(f32.load (i32.add (local.get $scratch) (i32.shl (local.get $element) (i32.const 2))))")
        value = emitter.scalar(program.body, body + "    ")
        emitter.close_scope()
        emit(body, f"    {store(program.output.dtype, address, value)})")
    function.lines[-1] += ")))"
    emitter.close_scope()
    emit(inner, f"(local.set {element} (i32.add (local.get {element}) (i32.const 1)))")
    emit(inner, f"(br_if $output (i32.lt_u (local.get {element}) (i32.const {BLOCK_ROWS * BLOCK_COLUMNS}))))")


def unflatten_into(emitter: Emitter, extents, linear: str, prefix: str, indent: str) -> list[str]:
    """Statements setting new locals ``$<prefix>0`` ... to the row-major coordinates of the
    flat index ``linear`` (i32 WAT, >= 0) over ``extents``; the locals, outermost first (the
    caller declares them as axes where it uses them)."""
    function = emitter.function
    locals_ = [function.named_local(f"{prefix}{d}", "i32") for d in range(len(extents))]
    if not extents:
        return locals_
    rest = function.named_local(f"{prefix}rest", "i32")
    function.emit(indent, f"(local.set {rest} {linear})")
    for position in reversed(range(1, len(extents))):
        extent = simplify(extents[position])
        if extent in (IntImm(0), IntImm(1)):
            function.emit(indent, f"(local.set {locals_[position]} (i32.const 0))")
            continue
        divisor = emitter.index(extent)
        function.emit(indent, f"(local.set {locals_[position]} (i32.rem_u (local.get {rest}) {divisor}))")
        function.emit(indent, f"(local.set {rest} (i32.div_u (local.get {rest}) {divisor}))")
    function.emit(indent, f"(local.set {locals_[0]} (local.get {rest}))")
    return locals_
