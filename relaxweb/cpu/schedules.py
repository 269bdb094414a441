"""The loops of each kind of tensor program on the CPU: a kernel's ``$units`` and ``$main``.

A GPU schedule (``relaxweb/ir/schedule.py``) lays a program out on invocations; here the
loops are chosen from the program itself (``relaxweb/ir/pattern.py`` says what it is), so
every schedule kind renders.  The signature is the contract's (docs/bundle-format.md,
"kernels.wasm"): ``$units (params) -> units`` and ``$main (params, first, end, scratch,
b1 .. bN)`` running units ``first <= u < end``; ``bI`` is the address of binding I (an input
bound as parts has one parameter per part: the first holds the whole buffer, the others
are ignored).

Matmul-like programs get packed panels and register-blocked micro-kernels (:func:`render_matmul`),
reductions that slide along the output's last axis (a depthwise or grouped convolution) f32x4
sums of consecutive output positions per row (:func:`render_window`), float elementwise
programs whose last dimension is a multiple of 4 a loop over f32x4 vectors
(:func:`render_vectorized`).  The element form runs any program: a unit is :data:`ELEMENTS_PER_UNIT` consecutive output
elements (threads split the work coarsely), a loop over the flat output index recovers the
axes by division, reductions are serial loops, and each element is stored in the output's
device dtype.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

from ..ir.lower_index import IndexLowering
from ..ir.pattern import MatmulInfo, WindowInfo, analyze_matmul, analyze_window
from ..ir.symbolic import IntImm, PrimExpr, SizeVar, as_int, free_vars, product, simplify, substitute
from ..ir.syntax import comment_text
from ..ir.tir import (
    Binary, Compare, CompareOp, FloatImm, IndexValue, Load, Reduce, ReduceCombiner, ScalarExpr, Select, TensorProgram,
    Unary, UnaryOp, contains_reduce, format_scalar, index_var_names, repeated_subexpressions, scalar_children,
    scalar_nodes,
)
from .emit import (
    BINARY_RENDERINGS, UNARY_RENDERINGS, VECTOR_BINARY_RENDERINGS, VECTOR_COMBINER_RENDERINGS, VECTOR_COMPARE_RENDERINGS,
    VECTOR_UNARY_RENDERINGS, Emitter, Function,
    VectorEmitter, depends_on, flat_offset, literal, reduce_identity, render_index, rendering, store, vector_access_of,
    vector_reduction,
)

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
    def make_emitter(function: Function, addresses: Mapping[str, str], variables: Mapping[str, str]) -> Emitter:
        return Emitter(program, function, addresses, variables)

    def store_element(emitter: Emitter, index: str, value: str) -> str:
        return store(program.output.dtype, emitter.address(program.output.name, f"(local.get {index})"), value)

    return _render_output_loop(program, parts, make_emitter, store_element, step=1, label="$element")


def render_vectorized(program: TensorProgram, parts: Mapping[str, int], access: Mapping[str, str]) -> str:
    """The element form four output elements at a time (consecutive along the last axis,
    whose extent is a multiple of 4): f32x4 loads, arithmetic and math calls, splats of the
    buffers constant along the last axis, one ``v128.store``."""
    def make_emitter(function: Function, addresses: Mapping[str, str], variables: Mapping[str, str]) -> Emitter:
        return VectorEmitter(program, function, addresses, variables, access)

    def store_vector(emitter: Emitter, index: str, value: str) -> str:
        return f"(v128.store {emitter.address(program.output.name, f'(local.get {index})')} {value})"

    return _render_output_loop(program, parts, make_emitter, store_vector, step=4, label="$vector")


def _render_output_loop(program: TensorProgram, parts: Mapping[str, int],
                        make_emitter: Callable[[Function, Mapping[str, str], Mapping[str, str]], Emitter],
                        store_value: Callable[[Emitter, str, str], str], *, step: int, label: str) -> str:
    """``$main`` and ``$units`` of a loop over the flat output index, ``step`` elements per
    iteration, in units of :data:`ELEMENTS_PER_UNIT`: each iteration recovers the axes, asks
    the emitter for the body's value and stores it (``store_value(emitter, index local, value)``)."""
    signature, addresses = kernel_signature(program, parts)
    function = Function()
    indent = "  "
    variables = load_size_vars(program, function, indent)
    emitter = make_emitter(function, addresses, variables)
    emit = function.emit
    index, stop = function.named_local("i", "i32"), function.named_local("stop", "i32")
    emit(indent, f"(local.set {index} (i32.mul (local.get $first) (i32.const {ELEMENTS_PER_UNIT})))")
    emit(indent, f"(local.set {stop} (call $min_s_i32 (i32.mul (local.get $end) (i32.const {ELEMENTS_PER_UNIT})) "
                 f"{element_count(program, variables)}))")
    emit(indent, "(block $done")
    emit(indent, f"  (br_if $done (i32.ge_s (local.get {index}) (local.get {stop})))")
    emit(indent, f"  (loop {label}")
    inner = indent + "    "
    emitter.open_scope()
    unflatten(emitter, program.axes, program.output.shape, index, inner)
    value = emitter.scalar(program.body, inner)
    emit(inner, store_value(emitter, index, value))
    emitter.close_scope()
    emit(inner, f"(local.set {index} (i32.add (local.get {index}) (i32.const {step})))")
    emit(inner, f"(br_if {label} (i32.lt_s (local.get {index}) (local.get {stop})))))")
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
    program): the micro-kernel for a matmul-like program, the window form for a sliding
    window (a depthwise convolution), the vectorized loop for a float elementwise one, else
    the element form."""
    parts = dict(parts or {})
    info = analyze_matmul(program)
    if info is not None:
        return render_matmul(program, parts, cheap_columns(info, program))
    window = window_form(program)
    if window is not None:
        return render_window(program, parts, window)
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
BLOCK_SCRATCH_BYTES = 4 * BLOCK_ROWS * BLOCK_COLUMNS  # a block's sums, spilled for the epilogue

# The packed path (:func:`_packed_unit`): a unit is a group of panels of PANEL_ROWS rows of
# the output (:func:`panel_group`), for every column.  Its first factor is evaluated once per
# element into [K x PANEL_ROWS] panels, the second copied or packed once per unit and
# PANEL_COLUMNS columns into a [K x PANEL_COLUMNS] panel; micro-kernels of MICRO_ROWS x
# PANEL_COLUMNS sums (8 f32x4 locals: they stay in registers) run from the panels.  Up to
# PANEL_DEPTH reduction steps; a deeper reduction runs the block path.
PANEL_ROWS = 32
MICRO_ROWS = 4
PANEL_COLUMNS = 8
PANEL_DEPTH = 4608  # 512 channels x 3 x 3
# The micro-kernels run the reduction PANEL_CHUNK steps at a time over all of a panel's
# strips (:func:`_micro_kernels`): 8 KB of the second factor's panel and 4 KB of a strip.
PANEL_CHUNK = 256
# A unit holds up to PANEL_A_BYTES of first-factor panels (:func:`panel_group`): one at
# PANEL_DEPTH, 14 at K = 576 (a 3x3 convolution of 64 channels), so that the second factor
# (a convolution's weight, packed element by element) is packed once per unit for all of
# them, while the units stay at least UNITS_WANTED for the threads to split.
PANEL_A_BYTES = 1 << 20
UNITS_WANTED = 8
PANEL_B_BYTES = 4 * PANEL_COLUMNS * PANEL_DEPTH
PANEL_SUMS_BYTES = 4 * PANEL_ROWS * PANEL_COLUMNS
MATMUL_SCRATCH_BYTES = max(BLOCK_SCRATCH_BYTES, PANEL_A_BYTES + PANEL_B_BYTES + PANEL_SUMS_BYTES)


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
    channels): no block would be whole.

    Both plain loads, swapped where the packed path would pack the second factor element by
    element in every unit (neither :func:`direct_columns` nor :func:`gathered_columns`) and
    would gather it swapped: a strided 1x1 convolution (ResNet's downsampling), whose input
    as the first factor is packed once in all and whose weight is gathered a step at a time
    (1x1 of 1024 -> 2048 channels at stride 2 from 14 x 14: 16.0 -> 9.8 ms in Chromium)."""
    if isinstance(info.a, Load) and isinstance(info.b, Load):
        swapped = dataclasses.replace(info, a=info.b, b=info.a, rows=info.columns, columns=info.rows)
        if (direct_columns(info, program) is None and gathered_columns(info, program) is None
                and gathered_columns(swapped, program) is not None):
            return swapped  # a strided 1x1 convolution: its input the rows, its weight gathered
    if isinstance(info.b, Load) or not isinstance(info.a, Load):
        return info
    rows = as_int(simplify(product(program.output.shape[p] for p in info.rows)))
    if rows is not None and rows < BLOCK_COLUMNS:
        return info
    return dataclasses.replace(info, a=info.b, b=info.a, rows=info.columns, columns=info.rows)


def panel_group(rows: str, depth: str) -> str:
    """The i32 WAT count of row panels of one packed unit, from the row count and reduction
    depth (WAT values, evaluated several times): enough that the units number about
    :data:`UNITS_WANTED` per batch index, as many as :data:`PANEL_A_BYTES` holds, at least
    one.  ``$main`` and ``$units`` compute it alike."""
    panels = f"(i32.div_u (i32.add {rows} (i32.const {PANEL_ROWS - 1})) (i32.const {PANEL_ROWS}))"
    wanted = f"(i32.div_u (i32.add {panels} (i32.const {UNITS_WANTED - 1})) (i32.const {UNITS_WANTED}))"
    fits = f"(i32.div_u (i32.const {PANEL_A_BYTES}) (i32.mul (call $max_u32 {depth} (i32.const 1)) (i32.const {4 * PANEL_ROWS})))"
    return f"(call $max_u32 (call $min_u32 {wanted} {fits}) (i32.const 1))"


# With few rows of a weight's columns (:func:`weight_columns`), a unit holds up to
# SPLIT_A_BYTES of first-factor panels and a slice of the columns (:func:`split_slices`).
SPLIT_A_BYTES = 1 << 19


def weight_columns(info: MatmulInfo, program: TensorProgram) -> bool:
    """Whether the packed path's units may split the columns (:func:`split_slices`): the
    second factor is a weight (a plain load of a buffer of constant shape, read in place
    by :func:`direct_columns`, indexed by no batch axis; its columns may be several axes:
    a transformer's projection written as [batch, heads, tokens, 64]) and the first a
    plain load (packing it once per slice costs a copy, no math: a prologue such as
    BERT's GELU would be evaluated once per slice).  Split by rows only, a 128-row
    transformer matmul had 4 units, each copying all of the weight (9.4 MB at 768 x 3072)
    for its 32 rows."""
    if not isinstance(info.a, Load) or direct_columns(info, program) is None:
        return False
    if any(as_int(simplify(d)) is None for d in info.b.buffer.shape):
        return False
    batch = {program.axes[p].name for p in info.batch}
    return not any(batch & {v.name for v in free_vars(index)} for index in info.b.indices)


def split_group(rows: str, depth: str, batches: str) -> str:
    """The i32 WAT count of row panels of one unit of the column-split packed path (WAT
    values, evaluated several times): all of the rows when they are few (fewer panels per
    batch index than :data:`UNITS_WANTED`) and fit :data:`SPLIT_A_BYTES`, else
    :func:`panel_group`'s choice (then the columns are not split)."""
    panels = f"(i32.div_u (i32.add {rows} (i32.const {PANEL_ROWS - 1})) (i32.const {PANEL_ROWS}))"
    fits = f"(i32.div_u (i32.const {SPLIT_A_BYTES}) (i32.mul (call $max_u32 {depth} (i32.const 1)) (i32.const {4 * PANEL_ROWS})))"
    few = f"(i32.lt_u (i32.mul {panels} {batches}) (i32.const {UNITS_WANTED}))"
    return (f"(select (call $max_u32 (call $min_u32 {panels} {fits}) (i32.const 1)) {panel_group(rows, depth)} "
            f"{few})")


def split_slices(rows: str, columns: str, group: str, batches: str) -> str:
    """The i32 WAT count of column slices per row group (:func:`split_group`): where the
    panels of all batch indices number fewer than :data:`UNITS_WANTED`, enough for that
    many units in all, at most one per block of :data:`PANEL_COLUMNS` columns; else one
    (the units as :func:`panel_group` makes them)."""
    panels = f"(i32.div_u (i32.add {rows} (i32.const {PANEL_ROWS - 1})) (i32.const {PANEL_ROWS}))"
    few = f"(i32.lt_u (i32.mul {panels} {batches}) (i32.const {UNITS_WANTED}))"
    row_groups = (f"(i32.div_u (i32.add {rows} (i32.sub (i32.mul {group} (i32.const {PANEL_ROWS})) (i32.const 1))) "
                  f"(i32.mul {group} (i32.const {PANEL_ROWS})))")
    units = f"(call $max_u32 (i32.mul {row_groups} {batches}) (i32.const 1))"
    wanted = f"(i32.div_u (i32.add {units} (i32.const {UNITS_WANTED - 1})) {units})"
    blocks = f"(i32.div_u (i32.add {columns} (i32.const {PANEL_COLUMNS - 1})) (i32.const {PANEL_COLUMNS}))"
    return f"(select (call $max_u32 (call $min_u32 {wanted} {blocks}) (i32.const 1)) (i32.const 1) {few})"


def slice_width(columns: str, slices: str) -> str:
    """The columns of one slice (WAT): the blocks of :data:`PANEL_COLUMNS` shared out, so
    a slice starts on a block."""
    blocks = f"(i32.div_u (i32.add {columns} (i32.const {PANEL_COLUMNS - 1})) (i32.const {PANEL_COLUMNS}))"
    return f"(i32.mul (i32.div_u (i32.add {blocks} (i32.sub {slices} (i32.const 1))) {slices}) (i32.const {PANEL_COLUMNS}))"


def render_matmul(program: TensorProgram, parts: Mapping[str, int], info: MatmulInfo) -> str:
    """A matmul-like program (``relaxweb/ir/pattern.analyze_matmul``).  When the reduction
    has at most :data:`PANEL_DEPTH` steps (the kernel checks at run time: its extents may be
    size variables), the packed path (:func:`_packed_unit`) in units of ``$group`` panels of
    :data:`PANEL_ROWS` rows (per batch index; :func:`panel_group`); the number of units
    (``$units``) follows the same choices.

    Before both, with at most :data:`MATVEC_ROWS` rows and a second factor read in place (a
    decoder's step), the matrix-vector form (:func:`_matvec`), also chosen at run time.

    Beyond, in blocks of :data:`BLOCK_ROWS` x :data:`BLOCK_COLUMNS` outputs, one unit each.

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
    depth = function.named_local("depth", "i32")
    emit(indent, f"(local.set {depth} {emitter.index(simplify(product(info.reduce_extents)))})")
    emit(indent, f"(local.set {unit} (local.get $first))")
    matvec = matvec_applies(info, program)
    if matvec:  # few rows (a decoder's step): the matrix-vector form, which returns
        _matvec(emitter, info, program, batch_axes, batch_extents, row_axes, row_extents, column_axes, column_extents,
                indent)
    emit(indent, f"(if (i32.le_u (local.get {depth}) (i32.const {PANEL_DEPTH}))")
    emit(indent, "  (then")
    group = function.named_local("group", "i32")
    split = weight_columns(info, program)
    batch_count = emitter.index(simplify(product(batch_extents)))
    if split:  # few rows of a weight's columns: units split the columns (:func:`split_slices`)
        slices, slice_columns = function.named_local("slices", "i32"), function.named_local("slice_columns", "i32")
        emit(indent, f"    (local.set {group} {split_group(f'(local.get {row_count})', f'(local.get {depth})', batch_count)})")
        emit(indent, f"    (local.set {slices} {split_slices(f'(local.get {row_count})', f'(local.get {column_count})', f'(local.get {group})', batch_count)})")
        emit(indent, f"    (local.set {slice_columns} {slice_width(f'(local.get {column_count})', f'(local.get {slices})')})")
    else:
        emit(indent, f"    (local.set {group} {panel_group(f'(local.get {row_count})', f'(local.get {depth})')})")
    emit(indent, "    (block $packed_done")
    emit(indent, f"      (br_if $packed_done (i32.ge_u (local.get {unit}) (local.get $end)))")
    emit(indent, "      (loop $panel")
    panel_indent = indent + "        "
    group_rows = f"(i32.mul (local.get {group}) (i32.const {PANEL_ROWS}))"
    row_groups = f"(i32.div_u (i32.add (local.get {row_count}) (i32.sub {group_rows} (i32.const 1))) {group_rows})"
    span = None
    if split:  # unit = (batch, row group, column slice), slices innermost
        per_batch = f"(i32.mul {row_groups} (local.get {slices}))"
        first_column, stop = function.named_local("first_column", "i32"), function.named_local("column_stop", "i32")
        emit(panel_indent, f"(local.set {batch} (i32.div_u (local.get {unit}) {per_batch}))")
        emit(panel_indent, f"(local.set {row0} (i32.mul (i32.div_u (i32.rem_u (local.get {unit}) {per_batch}) "
                           f"(local.get {slices})) {group_rows}))")
        emit(panel_indent, f"(local.set {first_column} (i32.mul (i32.rem_u (local.get {unit}) (local.get {slices})) "
                           f"(local.get {slice_columns})))")
        emit(panel_indent, f"(local.set {stop} (call $min_u32 (i32.add (local.get {first_column}) "
                           f"(local.get {slice_columns})) (local.get {column_count})))")
        span = (f"(local.get {first_column})", f"(local.get {stop})")
    else:
        emit(panel_indent, f"(local.set {batch} (i32.div_u (local.get {unit}) {row_groups}))")
        emit(panel_indent, f"(local.set {row0} (i32.mul (i32.rem_u (local.get {unit}) {row_groups}) {group_rows}))")
    emitter.open_scope()
    batch_locals = unflatten_into(emitter, batch_extents, f"(local.get {batch})", "xb", panel_indent)
    for axis, extent, local in zip(batch_axes, batch_extents, batch_locals):
        emitter.declare_axis(axis, extent, local)
    _packed_unit(emitter, info, program, row_axes, row_extents, column_axes, column_extents, row0, column0, panel_indent,
                 span)
    emitter.close_scope()
    emit(panel_indent, f"(local.set {unit} (i32.add (local.get {unit}) (i32.const 1)))")
    emit(panel_indent, f"(br_if $panel (i32.lt_u (local.get {unit}) (local.get $end)))))")
    emit(indent, "    (return)))")
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
    blocks = simplify(product(batch_extents) * ((rows + (BLOCK_ROWS - 1)) // BLOCK_ROWS)
                      * ((columns + (BLOCK_COLUMNS - 1)) // BLOCK_COLUMNS))
    lowering = IndexLowering()

    def value(expr: PrimExpr) -> str:
        return render_index(lowering.lower(expr), lambda name: f"(local.get {unit_variables[name]})")

    unit_group = panel_group(value(rows), value(simplify(product(info.reduce_extents))))
    if split:
        unit_group = split_group(value(rows), value(simplify(product(info.reduce_extents))),
                                 value(simplify(product(batch_extents))))
    row_groups = (f"(i32.div_u (i32.add {value(rows)} (i32.sub (i32.mul {unit_group} (i32.const {PANEL_ROWS})) "
                  f"(i32.const 1))) (i32.mul {unit_group} (i32.const {PANEL_ROWS})))")
    panels = f"(i32.mul {value(simplify(product(batch_extents)))} {row_groups})"
    if split:
        panels = (f"(i32.mul {panels} "
                  f"{split_slices(value(rows), value(columns), unit_group, value(simplify(product(batch_extents))))})")
    count = (f"(select {panels} {value(blocks)} (i32.le_u {value(simplify(product(info.reduce_extents)))} "
             f"(i32.const {PANEL_DEPTH})))")
    if matvec:
        count = (f"(select {matvec_units(value(simplify(product(batch_extents))), value(columns))} {count} "
                 f"{matvec_condition(value(rows), value(simplify(product(info.reduce_extents))))})")
    units.emit("  ", count)
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



# -- the packed path ---------------------------------------------------------------------------


def _for_each_step(emitter: Emitter, axes, extents, indent: str, step: Callable[[str], None]) -> None:
    """Loops over ``axes`` (reduction axes, outermost first: their extents use no index
    variable), each declared in its loop; ``step(indent)`` emits the innermost statements."""
    function, emit = emitter.function, emitter.function.emit
    loops, depth = [], indent
    for axis, extent in zip(axes, extents):
        local, end = function.local("p", "i32"), function.local("p_end", "i32")
        label = local[1:]
        emit(depth, f"(local.set {end} {emitter.index(extent)})")
        emit(depth, f"(local.set {local} (i32.const 0))")
        emit(depth, f"(block $done_{label}")
        emit(depth, f"  (br_if $done_{label} (i32.ge_s (local.get {local}) (local.get {end})))")
        emit(depth, f"  (loop $step_{label}")
        depth += "    "
        emitter.open_scope()
        emitter.declare_axis(axis, extent, local)
        loops.append((local, end, label))
    step(depth)
    for local, end, label in reversed(loops):
        emitter.close_scope()
        emit(depth, f"(local.set {local} (i32.add (local.get {local}) (i32.const 1)))")
        emit(depth, f"(br_if $step_{label} (i32.lt_s (local.get {local}) (local.get {end})))))")
        depth = depth[:-4]


@dataclasses.dataclass(frozen=True)
class PackLayout:
    """Where :func:`_pack` writes lane ``l`` of reduction step ``k`` of a panel at ``base``.

    Interleaved (``strip`` None): at ``base + 4 * (k * lanes + l)``, a step's lanes side by
    side (the second factor's [K x PANEL_COLUMNS] panel: one micro-kernel reads all of them).
    In strips (``strip``: an i32 WAT value, the bytes of one strip, ``16 * depth``): lanes
    ``4s .. 4s + 3`` form strip ``s``, ``[K x 4]`` at ``base + s * strip``, so lane ``l`` of
    step ``k`` at ``base + (l // 4) * strip + 16 * k + 4 * (l % 4)``: the micro-kernel of
    those four rows reads 16 contiguous bytes a step (interleaved, it read 16 of every
    ``4 * lanes``, which a deep reduction does not keep in L1).  Four lanes from a multiple
    of 4 are 16 contiguous bytes of a step in both."""

    lanes: int
    strip: str | None = None

    @property
    def step(self) -> int:
        """The bytes between a lane's consecutive reduction steps."""
        return 16 if self.strip is not None else 4 * self.lanes

    def lane_address(self, base: str, lane: str) -> str:
        """The i32 WAT address of step 0 of lane ``lane`` (an i32 WAT value)."""
        if self.strip is None:
            return f"(i32.add {base} (i32.shl {lane} (i32.const 2)))"
        return (f"(i32.add {base} (i32.add (i32.mul (i32.shr_u {lane} (i32.const 2)) {self.strip}) "
                f"(i32.shl (i32.and {lane} (i32.const 3)) (i32.const 2))))")


def _pack(emitter: Emitter, info: MatmulInfo, factor: ScalarExpr, axes, extents, first: str, count: str, lanes: int,
          base: str, indent: str, strip: str | None = None) -> None:
    """Statements writing ``factor`` at every reduction step for the ``lanes`` consecutive
    flat indices from ``first`` over ``axes`` that are below ``count`` (the others' lanes are
    left as they are: only sums that are never stored read them), each element evaluated
    once: lane ``l`` of step ``k`` where :class:`PackLayout` ``(lanes, strip)`` says
    (``base + 4 * (k * lanes + l)`` without ``strip``).  A factor that reads
    along the innermost reduction axis contiguously (``relaxweb/cpu/emit.vector_reduction``:
    a fused GELU or layer norm of a matmul's input) is evaluated four steps at a time."""
    function, emit = emitter.function, emitter.function.emit
    layout = PackLayout(lanes, strip)
    lane, position, address = (function.local(name, "i32") for name in ("lane", "position", "address"))
    label = lane[1:]
    emit(indent, f"(local.set {lane} (i32.const 0))")
    step_axis, step_extent = info.reduce_axes[-1], info.reduce_extents[-1]
    invariants = vector_reduction(Reduce(ReduceCombiner.SUM, step_axis, step_extent, factor))
    hoisted = lane_math(factor)
    # four reduction steps at a time need four steps (a 1x1 convolution's kernel width has one)
    short = as_int(simplify(step_extent)) is not None and as_int(simplify(step_extent)) < 4
    interior = padded_interior(factor, axes[-1]) if (invariants is None or short) and axes else None
    branches = branched_interior(factor, axes[-1]) if (invariants is None or short) and axes else None
    if interior is not None:
        _pack_interior(emitter, info, factor, interior, axes, extents, first, count, layout, base, lane, address, indent)
    elif branches is not None:
        _pack_branches(emitter, info, branches, axes, extents, first, count, layout, base, lane, address, indent)
    elif invariants is None and (vectors := lane_vectors(factor, axes, extents)) is not None:
        _pack_vectors(emitter, info, factor, vectors, axes, extents, first, count, layout, base, lane, address, indent)
    elif invariants is None and hoisted:
        _pack_groups(emitter, info, factor, hoisted, axes, extents, first, count, layout, base, lane, address, indent)
    emit(indent, f"(block $packed_{label}")
    emit(indent, f"  (loop $pack_{label}")
    inner = indent + "    "
    emit(inner, f"(br_if $packed_{label} (i32.ge_u (local.get {lane}) (i32.const {lanes})))")
    emit(inner, f"(local.set {position} (i32.add {first} (local.get {lane})))")
    emit(inner, f"(br_if $packed_{label} (i32.ge_u (local.get {position}) {count}))")
    emitter.open_scope()
    for axis, extent, local in zip(axes, extents, unflatten_into(emitter, extents, f"(local.get {position})",
                                                               f"{label}_", inner)):
        emitter.declare_axis(axis, extent, local)
    emit(inner, f"(local.set {address} {layout.lane_address(base, f'(local.get {lane})')})")

    def step(depth: str) -> None:
        emit(depth, f"(f32.store (local.get {address}) {emitter.scalar(factor, depth)})")
        emit(depth, f"(local.set {address} (i32.add (local.get {address}) (i32.const {layout.step})))")

    if invariants is None or interior is not None:
        _for_each_step(emitter, info.reduce_axes, info.reduce_extents, inner, step)
    else:
        _for_each_step(emitter, info.reduce_axes[:-1], info.reduce_extents[:-1], inner,
                       lambda depth: _vector_steps(emitter, factor, invariants, step_axis, step_extent, address, layout, step,
                                                   depth))
    emitter.close_scope()
    emit(inner, f"(local.set {lane} (i32.add (local.get {lane}) (i32.const 1)))")
    emit(inner, f"(br $pack_{label})))")


# the math library's functions (relaxweb/cpu/math.py), which take tens of instructions a value
LIBRARY_MATH = (UnaryOp.EXP, UnaryOp.TANH, UnaryOp.SIGMOID, UnaryOp.LOG, UnaryOp.SIN, UnaryOp.COS, UnaryOp.TAN,
                UnaryOp.ASIN, UnaryOp.ACOS, UnaryOp.ATAN, UnaryOp.ASINH, UnaryOp.ACOSH, UnaryOp.ATANH)


def lane_math(expr: ScalarExpr) -> list[tuple[Unary, ScalarExpr]]:
    """The outermost float32 calls of the math library in ``expr`` (a convolution's fused
    SiLU under its padding's selects), each with its argument guarded by the selects above
    it (``select(c, arg, 0)`` under a then-branch): evaluated for four lanes at once, a lane
    whose guard fails computes the function of 0, never read.  A call found under two
    different guards, or whose argument reduces, is left out."""
    guards: dict[Unary, set[ScalarExpr]] = {}

    def visit(node: ScalarExpr, guard: Callable[[ScalarExpr], ScalarExpr]) -> None:
        if isinstance(node, Unary) and node.op in LIBRARY_MATH and node.a.dtype == "float32":
            guards.setdefault(node, set()).add(None if contains_reduce(node.a) else guard(node.a))
            return
        if isinstance(node, Reduce):
            return
        if isinstance(node, Select):
            zero = FloatImm(0.0, node.dtype)
            visit(node.condition, guard)
            visit(node.a, lambda e: guard(Select(node.condition, e, zero) if e.dtype == node.dtype else e))
            visit(node.b, lambda e: guard(Select(node.condition, zero, e) if e.dtype == node.dtype else e))
            return
        for child in scalar_children(node):
            visit(child, guard)

    visit(expr, lambda e: e)
    return [(node, next(iter(found))) for node, found in guards.items() if len(found) == 1 and None not in found]


def _four_lanes_loop(emitter: Emitter, labels: tuple[str, str], axes, extents, first: str, count: str,
                     layout: PackLayout, base: str, lane: str, address: str, lane_count: int,
                     indent: str) -> tuple[str, Callable[[int], None]]:
    """Opens a packer's loop over groups of four lanes from local ``lane`` (left while four
    lanes remain in the panel and below ``count``): the first ``lane_count`` lanes' axes
    recovered, ``address`` set to the group's first lane.  Returns the loop body's indent
    and ``in_lane(n)``, which opens a scope with lane ``n``'s axes declared."""
    emit = emitter.function.emit
    label = lane[1:]
    done, loop = labels
    emit(indent, f"(block ${done}_{label}")
    emit(indent, f"  (loop ${loop}_{label}")
    inner = indent + "    "
    emit(inner, f"(br_if ${done}_{label} (i32.gt_u (i32.add (local.get {lane}) (i32.const 4)) (i32.const {layout.lanes})))")
    emit(inner, f"(br_if ${done}_{label} (i32.gt_u (i32.add (i32.add {first} (local.get {lane})) (i32.const 4)) {count}))")
    lane_axes = [unflatten_into(emitter, extents, f"(i32.add (i32.add {first} (local.get {lane})) (i32.const {n}))",
                                f"{label}_{n}_", inner) for n in range(lane_count)]
    emit(inner, f"(local.set {address} {layout.lane_address(base, f'(local.get {lane})')})")

    def in_lane(n: int) -> None:
        emitter.open_scope()
        for axis, extent, local in zip(axes, extents, lane_axes[n]):
            emitter.declare_axis(axis, extent, local)

    return inner, in_lane


def _lanes_vector(emitter: Emitter, in_lane: Callable[[int], None], expr: ScalarExpr, indent: str,
                  prefix: str) -> str:
    """An f32x4 of ``expr`` evaluated in each of four lanes (``in_lane(n)`` opens lane ``n``'s
    scope), each value in a local named from ``prefix``."""
    values = []
    for n in range(4):
        in_lane(n)
        values.append(emitter.set_local(emitter.scalar(expr, indent), "f32", indent, prefix))
        emitter.close_scope()
    vector = f"(f32x4.splat {values[0]})"
    for n in range(1, 4):
        vector = f"(f32x4.replace_lane {n} {vector} {values[n]})"
    return vector


def _pack_groups(emitter: Emitter, info: MatmulInfo, factor: ScalarExpr, hoisted, axes, extents, first: str,
                 count: str, layout: PackLayout, base: str, lane: str, address: str, indent: str) -> None:
    """:func:`_pack` four lanes at a time while four lanes remain below ``count``: at each
    step, the guarded arguments of the ``hoisted`` math calls (:func:`lane_math`) lane by
    lane, each call once as f32x4, then the factor lane by lane with the calls' lanes known,
    stored as one f32x4.  Leaves ``lane`` at the first lane not packed."""
    emit = emitter.function.emit
    label = lane[1:]
    inner, in_lane = _four_lanes_loop(emitter, ("grouped", "group"), axes, extents, first, count, layout, base, lane,
                                      address, 4, indent)

    def step(depth: str) -> None:
        results = []
        for node, argument in hoisted:
            vector = _lanes_vector(emitter, in_lane, argument, depth, "arg")
            results.append(emitter.set_local(VECTOR_UNARY_RENDERINGS[node.op](vector), "v128", depth, "math"))
        values = []
        for n in range(4):
            in_lane(n)
            for (node, _), result in zip(hoisted, results):
                emitter.known(node, f"(f32x4.extract_lane {n} {result})")
            values.append(emitter.set_local(emitter.scalar(factor, depth), "f32", depth, "lane"))
            emitter.close_scope()
        vector = f"(f32x4.splat {values[0]})"
        for n in range(1, 4):
            vector = f"(f32x4.replace_lane {n} {vector} {values[n]})"
        emit(depth, f"(v128.store (local.get {address}) {vector})")
        emit(depth, f"(local.set {address} (i32.add (local.get {address}) (i32.const {layout.step})))")

    _for_each_step(emitter, info.reduce_axes, info.reduce_extents, inner, step)
    emit(inner, f"(local.set {lane} (i32.add (local.get {lane}) (i32.const 4)))")
    emit(inner, f"(br $group_{label})))")


@dataclasses.dataclass(frozen=True)
class LaneVectors:
    """How :func:`_pack_vectors` evaluates a factor for four consecutive lanes as one f32x4
    (:func:`lane_vectors`): ``invariants``, its largest parts that no lane axis changes
    (computed once as scalars and splatted: a bias), ``contiguous``, its loads whose four
    lanes are four consecutive elements (one ``v128.load``), and ``gathered``, its other
    loads that the lanes change (four ``f32.load`` into one f32x4)."""

    invariants: tuple[ScalarExpr, ...]
    contiguous: tuple[Load, ...]
    gathered: tuple[Load, ...]


def lane_vectors(factor: ScalarExpr, axes, extents) -> LaneVectors | None:
    """A :class:`LaneVectors` for ``factor`` when every part of it that the lane axes
    (``axes``, of ``extents``) change has an f32x4 form: float32 loads, constants, the ops of
    ``VECTOR_*_RENDERINGS`` (a fused GELU's erf: polynomials, a select on ``|x|``, exp), a
    ``Select`` whose condition compares floats or no lane axis changes.  A vector select
    evaluates both branches, so every load under a select's branch must also be read where
    the factor reads it unconditionally (a padding select's input is not: convolutions keep
    their guarded paths).  None otherwise, and for a bare load the lanes do not read
    contiguously (nothing to compute: the scalar copy is as good)."""
    if factor.dtype != "float32" or not axes or contains_reduce(factor):
        return None
    names = {axis.name for axis in axes}
    unconditional: set[ScalarExpr] = set()

    def plain(node: ScalarExpr) -> None:  # the loads read whatever the selects choose
        if isinstance(node, Load):
            unconditional.add(node)
        elif isinstance(node, Select):
            plain(node.condition)
        else:
            for child in scalar_children(node):
                plain(child)

    plain(factor)
    invariants: list[ScalarExpr] = []
    contiguous: list[Load] = []
    gathered: list[Load] = []

    def visit(node: ScalarExpr, guarded: bool) -> bool:
        if guarded and any(isinstance(n, Load) and n not in unconditional for n in scalar_nodes(node)):
            return False
        if not any(depends_on(node, name) for name in names):
            if isinstance(node, FloatImm) and node.dtype == "float32":
                return True
            if node.dtype not in ("float32", "bool"):
                return False
            if node not in invariants:
                invariants.append(node)
            return True
        if isinstance(node, Load):
            if node.buffer.dtype != "float32":
                return False
            found = contiguous if along_columns(node, axes, extents) else gathered
            if node not in found:
                found.append(node)
            return True
        if isinstance(node, Binary) and node.dtype == "float32" and node.op in VECTOR_BINARY_RENDERINGS:
            return visit(node.a, guarded) and visit(node.b, guarded)
        if isinstance(node, Unary) and node.dtype == "float32" and node.op in VECTOR_UNARY_RENDERINGS:
            return visit(node.a, guarded)
        if isinstance(node, Compare) and node.a.dtype == "float32" and node.op in VECTOR_COMPARE_RENDERINGS:
            return visit(node.a, guarded) and visit(node.b, guarded)
        if isinstance(node, Select) and node.dtype == "float32":
            return visit(node.condition, guarded) and visit(node.a, True) and visit(node.b, True)
        return False

    if not visit(factor, False) or (isinstance(factor, Load) and factor not in contiguous):
        return None
    return LaneVectors(tuple(invariants), tuple(contiguous), tuple(gathered))


def _pack_vectors(emitter: Emitter, info: MatmulInfo, factor: ScalarExpr, vectors: LaneVectors, axes, extents,
                  first: str, count: str, layout: PackLayout, base: str, lane: str, address: str, indent: str) -> None:
    """:func:`_pack` four lanes at a time while four lanes remain below ``count``, for a
    factor of :func:`lane_vectors`: at each step its lane-changing loads are read (one
    ``v128.load`` where the four lanes are contiguous, else lane by lane into one f32x4),
    its lane invariants computed once and splatted, the whole factor evaluated once as f32x4
    (``Emitter.vector_value``) and stored with one ``v128.store``.  Leaves ``lane`` at the
    first lane not packed."""
    emit = emitter.function.emit
    label = lane[1:]
    lane_count = 4 if vectors.gathered else 1  # contiguous loads and invariants need lane 0's axes only
    inner, in_lane = _four_lanes_loop(emitter, ("vectored", "vectors"), axes, extents, first, count, layout, base,
                                      lane, address, lane_count, indent)

    def step(depth: str) -> None:
        splats = {}
        for node in vectors.gathered:
            values = []
            for n in range(4):
                in_lane(n)
                values.append(emitter.scalar(node, depth))
                emitter.close_scope()
            vector = f"(f32x4.splat {values[0]})"
            for n in range(1, 4):
                vector = f"(f32x4.replace_lane {n} {vector} {values[n]})"
            splats[node] = emitter.set_local(vector, "v128", depth, "lanes")
        in_lane(0)
        for node in vectors.invariants:
            value = emitter.scalar(node, depth)
            if node.dtype == "bool":  # a lane mask: all ones where true
                splats[node] = emitter.set_local(f"(i32x4.splat (i32.sub (i32.const 0) {value}))", "v128", depth, "mask")
            else:
                splats[node] = emitter.set_local(f"(f32x4.splat {value})", "v128", depth, "splat")
        vector = emitter.vector_value(factor, splats, {}, depth)
        emitter.close_scope()
        emit(depth, f"(v128.store (local.get {address}) {vector})")
        emit(depth, f"(local.set {address} (i32.add (local.get {address}) (i32.const {layout.step})))")

    emit(inner, f";; four lanes as one f32x4 a step ({len(vectors.gathered)} loads lane by lane, "
                f"{len(vectors.contiguous)} contiguous, {len(vectors.invariants)} lane invariants)")
    _for_each_step(emitter, info.reduce_axes, info.reduce_extents, inner, step)
    emit(inner, f"(local.set {lane} (i32.add (local.get {lane}) (i32.const 4)))")
    emit(inner, f"(br $vectors_{label})))")


def branched_interior(factor: ScalarExpr, axis: SizeVar) -> ScalarExpr | None:
    """``factor`` when it chooses among inputs by conditions that ``axis`` does not change,
    each input a core of :func:`padded_interior` without guards: a concat's or a split's
    channel ranges fused into the input of a 1x1 convolution
    (``select(rc < c, A[n, rc, h, w], B[n, rc - c, h, w])``, selects nested for more inputs).
    Four lanes along one row of ``axis`` then take the same branch at every step, and in it
    read four consecutive elements: :func:`_pack_branches`.  A vector select would evaluate
    every branch (the others' loads may lie out of bounds), so the lanes took the scalar path
    one element at a time.  None for any other factor (a padded one: :func:`padded_interior`)."""
    if not isinstance(factor, Select):
        return None

    def chosen(node: ScalarExpr) -> bool:
        if isinstance(node, Select) and node.dtype == "float32" and node.condition.dtype == "bool":
            if depends_on(node.condition, axis.name):
                return False
            if any(isinstance(n, Load) for n in scalar_nodes(node.condition)):
                return False
            return chosen(node.a) and chosen(node.b)
        interior = padded_interior(node, axis)
        return interior is not None and not interior[0]

    return factor if chosen(factor) else None


def _pack_branches(emitter: Emitter, info: MatmulInfo, factor: ScalarExpr, axes, extents, first: str, count: str,
                   layout: PackLayout, base: str, lane: str, address: str, indent: str) -> None:
    """:func:`_pack` four lanes at a time while four lanes remain below ``count``, for a
    factor of :func:`branched_interior`: at each step the selects' conditions are evaluated
    once (lane 0's), as ``if`` statements, and only the chosen input is read and stored with
    one ``v128.store``.  Four lanes on one row of the innermost axis read it as one f32x4
    (its loads ``v128.load``).  Four lanes across a row's end read it lane by lane into one
    f32x4 where no lane axis changes the conditions (a concat's channel ranges), else are
    packed one by one (the scalar factor).  Leaves ``lane`` at the first lane not packed."""
    function, emit = emitter.function, emitter.function.emit
    label, lanes = lane[1:], layout.lanes
    last_axis, last_extent = axes[-1], simplify(extents[-1])
    conditions = [node.condition for node in scalar_nodes(factor) if isinstance(node, Select)]
    shared = not any(depends_on(condition, axis.name) for condition in conditions for axis in axes)
    emit(indent, f"(block $branched_{label}")
    emit(indent, f"  (loop $branch_{label}")
    inner = indent + "    "
    emit(inner, f"(br_if $branched_{label} (i32.gt_u (i32.add (local.get {lane}) (i32.const 4)) (i32.const {lanes})))")
    emit(inner, f"(br_if $branched_{label} (i32.gt_u (i32.add (i32.add {first} (local.get {lane})) (i32.const 4)) {count}))")
    emit(inner, f"(local.set {address} {layout.lane_address(base, f'(local.get {lane})')})")
    firsts = unflatten_into(emitter, extents, f"(i32.add {first} (local.get {lane}))", f"{label}_b", inner)
    emitter.open_scope()
    for axis, extent, local in zip(axes, extents, firsts):
        emitter.declare_axis(axis, extent, local)
    one_row = emitter.index(last_extent)
    emitter.close_scope()
    lane_axes: list[list[str]] = []

    def in_lane(n: int) -> None:
        emitter.open_scope()
        for axis, extent, local in zip(axes, extents, firsts if n == 0 and not lane_axes else lane_axes[n]):
            emitter.declare_axis(axis, extent, local)

    def chosen(node: ScalarExpr, depth: str) -> None:
        if isinstance(node, Select):
            emit(depth, f"(if {emitter.scalar(node.condition, depth)}")
            for branch, name in ((node.a, "then"), (node.b, "else")):
                emit(depth, f"  ({name}")
                emitter.open_scope()  # what a branch computes is not known in the other
                chosen(branch, depth + "    ")
                emitter.close_scope()
                function.lines[-1] += ")"
            function.lines[-1] += ")"
            return
        if lane_axes:  # across a row's end: the chosen input lane by lane
            vector = _lanes_vector(emitter, in_lane, node, depth, "lane")
            emit(depth, f"(v128.store (local.get {address}) {vector})")
            return
        splats = {}
        for load in scalar_nodes(node):
            if isinstance(load, Load) and not reads(load, last_axis) and load not in splats:
                splats[load] = emitter.set_local(f"(f32x4.splat {emitter.scalar(load, depth)})", "v128", depth, "splat")
        emit(depth, f"(v128.store (local.get {address}) {emitter.vector_value(node, splats, {}, depth)})")

    def step(depth: str) -> None:
        in_lane(0)
        chosen(factor, depth)
        emitter.close_scope()
        emit(depth, f"(local.set {address} (i32.add (local.get {address}) (i32.const {layout.step})))")

    emit(inner, ";; four lanes on one row: each step reads only the input its selects choose, as one f32x4")
    emit(inner, f"(if (i32.le_u (i32.add (local.get {firsts[-1]}) (i32.const 4)) {one_row})")
    emit(inner, "  (then")
    _for_each_step(emitter, info.reduce_axes, info.reduce_extents, inner + "    ", step)
    function.lines[-1] += ")"
    emit(inner, "  (else")
    body = inner + "    "
    if shared:  # across a row's end: the conditions still hold for all four lanes
        lane_axes.extend(unflatten_into(emitter, extents, f"(i32.add (i32.add {first} (local.get {lane})) (i32.const {n}))",
                                        f"{label}_{n}_", body) for n in range(4))
        _for_each_step(emitter, info.reduce_axes, info.reduce_extents, body, step)
        function.lines[-1] += "))"
    else:  # four lanes across a row's end: each on its own
        _pack_four_lanes_apart(emitter, info, factor, axes, extents, first, lane, address, layout, base, label, body)
        function.lines[-1] += ")"
    emit(inner, f"(local.set {lane} (i32.add (local.get {lane}) (i32.const 4)))")
    emit(inner, f"(br $branch_{label})))")


def _vector_steps(emitter: Emitter, factor: ScalarExpr, invariants: list[ScalarExpr], axis: SizeVar, extent: PrimExpr,
                  address: str, layout: PackLayout, step: Callable[[str], None], indent: str) -> None:
    """The innermost reduction axis's steps of :func:`_pack`: four at a time (one f32x4 of
    the factor, its lanes stored ``layout.step`` bytes apart) while four remain, then ``step``
    one at a time; the parts of the factor that do not depend on the axis computed once."""
    function, emit = emitter.function, emitter.function.emit
    splats = {}
    for invariant in invariants:
        value = emitter.scalar(invariant, indent)
        splats[invariant] = emitter.set_local(f"(f32x4.splat {value})", "v128", indent, "splat")
    local, end = function.local("q", "i32"), function.local("q_end", "i32")
    label = local[1:]
    emit(indent, f"(local.set {end} {emitter.index(extent)})")
    emit(indent, f"(local.set {local} (i32.const 0))")
    emit(indent, f"(block $vectors_{label}")
    emit(indent, f"  (loop $vector_{label}")
    inner = indent + "    "
    emit(inner, f"(br_if $vectors_{label} (i32.gt_s (i32.add (local.get {local}) (i32.const 4)) (local.get {end})))")
    emitter.open_scope()
    emitter.declare_axis(axis, extent, local)
    vector = emitter.set_local(emitter.vector_value(factor, splats, {}, inner), "v128", inner, "vector")
    emitter.close_scope()
    for position in range(4):
        emit(inner, f"(v128.store32_lane offset={layout.step * position} {position} (local.get {address}) {vector})")
    emit(inner, f"(local.set {address} (i32.add (local.get {address}) (i32.const {4 * layout.step})))")
    emit(inner, f"(local.set {local} (i32.add (local.get {local}) (i32.const 4)))")
    emit(inner, f"(br $vector_{label})))")
    emit(indent, f"(block $steps_{label}")
    emit(indent, f"  (loop $step_{label}")
    emit(inner, f"(br_if $steps_{label} (i32.ge_s (local.get {local}) (local.get {end})))")
    emitter.open_scope()
    emitter.declare_axis(axis, extent, local)
    step(inner)
    emitter.close_scope()
    emit(inner, f"(local.set {local} (i32.add (local.get {local}) (i32.const 1)))")
    emit(inner, f"(br $step_{label})))")


def flat_columns(info: MatmulInfo, program: TensorProgram) -> PrimExpr | None:
    """How many consecutive flat columns (the column axes flattened, outermost first) the
    second factor reads at consecutive elements: the product of the extents of the longest
    suffix of the column axes along which it does (a stride-1 unpadded convolution's output
    positions [H, W], read from an input of the same row length: a 1x1 convolution's; not
    its batch axis, a column axis too).  Flat columns ``c`` and ``c + 1`` are consecutive
    elements unless ``c + 1`` is a multiple of it.  None where a plain load does not read
    even the last column axis contiguously."""
    if not isinstance(info.b, Load):
        return None
    base = flat_offset(info.b.buffer, info.b.indices)
    inner = IntImm(1)
    for p in reversed(info.columns):
        axis = program.axes[p]
        moved = tuple(substitute(index, {axis.name: axis + 1}) for index in info.b.indices)
        if simplify(flat_offset(info.b.buffer, moved) - base - inner) != IntImm(0):
            break
        inner = simplify(inner * program.output.shape[p])
    else:
        return inner
    return None if inner == IntImm(1) else inner


def direct_columns(info: MatmulInfo, program: TensorProgram) -> PrimExpr | None:
    """The distance in elements between consecutive reduction steps of the second factor,
    when the packed path can read it in place: a float32 plain load whose consecutive flat
    columns are consecutive elements (:func:`flat_columns`), one reduction axis of an extent
    other than 1 (a 1x1 convolution's kernel axes have extent 1: they read index 0), and a
    distance made of size variables only."""
    if not isinstance(info.b, Load) or info.b.buffer.dtype != "float32" or flat_columns(info, program) is None:
        return None
    steps = [axis for axis, extent in zip(info.reduce_axes, info.reduce_extents) if as_int(simplify(extent)) != 1]
    if len(steps) != 1:
        return None
    axis = steps[0]
    moved = tuple(substitute(index, {axis.name: axis + 1}) for index in info.b.indices)
    distance = simplify(flat_offset(info.b.buffer, moved) - flat_offset(info.b.buffer, info.b.indices))
    if {v.name for v in free_vars(distance)} & {v.name for v in (*program.axes, *info.reduce_axes)}:
        return None
    return distance


# the bytes of one strip of MICRO_ROWS rows of a first-factor panel ([K x MICRO_ROWS], PackLayout)
STRIP_BYTES = f"(i32.shl (local.get $depth) (i32.const {(4 * MICRO_ROWS).bit_length() - 1}))"


def _packed_unit(emitter: Emitter, info: MatmulInfo, program: TensorProgram, row_axes, row_extents, column_axes,
                 column_extents, row0: str, column0: str, indent: str, span: tuple[str, str] | None = None) -> None:
    """One unit of the packed path: ``$group`` panels of :data:`PANEL_ROWS` rows from
    ``row0`` (the batch axes in scope; :func:`panel_group`), every column.  The first factor
    is packed once, panel after panel ([K x PANEL_ROWS] each, ``$depth * 4 * PANEL_ROWS``
    bytes apart); for each block of :data:`PANEL_COLUMNS` columns the second is packed once
    (copied: a full block of :func:`direct_columns`), and for each panel micro-kernels of
    :data:`MICRO_ROWS` rows sum the block into the scratch's sums and loops over the
    block's elements apply the epilogue.  With one panel per unit a convolution's weight,
    packed element by element, was packed again for every 32 output positions.

    ``span`` (WAT values: the first column, a multiple of :data:`PANEL_COLUMNS`, and the
    end) limits the unit to those columns (:func:`weight_columns`); every column without."""
    function, emit = emitter.function, emitter.function.emit
    rows, columns = "(local.get $rows)", "(local.get $columns)"
    panel_b = f"(i32.add (local.get $scratch) (i32.const {PANEL_A_BYTES}))"
    sums_base = f"(i32.add (local.get $scratch) (i32.const {PANEL_A_BYTES + PANEL_B_BYTES}))"
    panel_row0, panel_a = function.named_local("panel_row0", "i32"), function.named_local("panel_a", "i32")
    group_end = function.named_local("group_end", "i32")
    panel_bytes = f"(i32.mul (local.get $depth) (i32.const {4 * PANEL_ROWS}))"
    emit(indent, f"(local.set {group_end} (call $min_u32 (i32.add (local.get {row0}) (i32.mul (local.get $group) "
                 f"(i32.const {PANEL_ROWS}))) {rows}))")

    def each_panel(body_indent: str, label: str, body: Callable[[str], None]) -> None:
        emit(body_indent, f"(local.set {panel_row0} (local.get {row0}))")
        emit(body_indent, f"(local.set {panel_a} (local.get $scratch))")
        emit(body_indent, f"(loop ${label}")
        body(body_indent + "  ")
        emit(body_indent, f"  (local.set {panel_row0} (i32.add (local.get {panel_row0}) (i32.const {PANEL_ROWS})))")
        emit(body_indent, f"  (local.set {panel_a} (i32.add (local.get {panel_a}) {panel_bytes}))")
        emit(body_indent, f"  (br_if ${label} (i32.lt_u (local.get {panel_row0}) (local.get {group_end}))))")

    each_panel(indent, "pack_panels", lambda at: _pack(emitter, info, info.a, row_axes, row_extents,
                                                        f"(local.get {panel_row0})", rows, PANEL_ROWS,
                                                        f"(local.get {panel_a})", at, strip=STRIP_BYTES))
    distance = direct_columns(info, program)
    strides = None if distance is not None else gathered_columns(info, program)
    b_address, b_step = function.named_local("b_address", "i32"), function.named_local("b_step", "i32")
    column_start, column_stop = span if span is not None else ("(i32.const 0)", columns)
    emit(indent, f"(local.set {column0} {column_start})")
    emit(indent, "(block $no_columns")
    emit(indent, f"  (br_if $no_columns (i32.ge_u (local.get {column0}) {column_stop}))")
    emit(indent, "  (loop $columns")
    inner = indent + "    "
    pack_indent = inner
    if distance is not None:  # a whole block is copied by rows of f32x4, one at the edge packed
        span = flat_columns(info, program)
        whole = f"(i32.le_u (i32.add (local.get {column0}) (i32.const {PANEL_COLUMNS})) {columns})"
        if simplify(span - simplify(product(column_extents))) != IntImm(0):  # nor across the flat span's end
            span_value = emitter.index(span)
            whole = (f"(i32.and {whole} (i32.le_u (i32.add (i32.rem_u (local.get {column0}) {span_value}) "
                     f"(i32.const {PANEL_COLUMNS})) {span_value}))")
        emit(inner, f"(if {whole}")
        emit(inner, "  (then")
        _set_block_start(emitter, info, column_axes, column_extents, column0, b_address, inner + "    ")
        emit(inner, f"    (local.set {b_step} (i32.shl {emitter.index(distance)} (i32.const 2)))")
        _copy_columns(function, b_address, b_step, panel_b, inner + "    ")
        function.lines[-1] += ")"
        emit(inner, "  (else")
        pack_indent = inner + "    "
    elif strides is not None:  # a whole block gathered a step at a time, one at the edge packed
        emit(inner, f"(if (i32.le_u (i32.add (local.get {column0}) (i32.const {PANEL_COLUMNS})) {columns})")
        emit(inner, "  (then")
        _set_block_start(emitter, info, column_axes, column_extents, column0, b_address, inner + "    ")
        _gather_columns(function, b_address, strides, panel_b, inner + "    ")
        function.lines[-1] += ")"
        emit(inner, "  (else")
        pack_indent = inner + "    "
    _pack(emitter, info, info.b, column_axes, column_extents, f"(local.get {column0})", columns, PANEL_COLUMNS,
          panel_b, pack_indent)
    if distance is not None or strides is not None:
        function.lines[-1] += "))"

    def run_panel(at: str) -> None:
        _micro_kernels(function, panel_row0, panel_a, panel_b, at)
        _panel_outputs(emitter, info, program, row_axes, row_extents, column_axes, column_extents, panel_row0, column0,
                       sums_base, at)

    each_panel(inner, "panels", run_panel)
    emit(inner, f"(local.set {column0} (i32.add (local.get {column0}) (i32.const {PANEL_COLUMNS})))")
    emit(inner, f"(br_if $columns (i32.lt_u (local.get {column0}) {column_stop}))))")


def gathered_columns(info: MatmulInfo, program: TensorProgram) -> list[int] | None:
    """For a second factor that :func:`_packed_unit` can gather a reduction step at a time:
    a float32 plain load, one column axis, each of a block's :data:`PANEL_COLUMNS` columns a
    constant number of elements past the first (:func:`column_strides`: a convolution's
    weight ``[O, C, kh, kw]``, a transposed weight), and the reduction axes flattened
    (outermost first) contiguous in it, one element per step.  Those distances; None
    otherwise."""
    strides = column_strides(info, program)
    if strides is None or info.b.buffer.dtype != "float32" or len(strides) < PANEL_COLUMNS:
        return None
    base = flat_offset(info.b.buffer, info.b.indices)
    inner = IntImm(1)
    for axis, extent in reversed(list(zip(info.reduce_axes, info.reduce_extents))):
        moved = tuple(substitute(index, {axis.name: axis + 1}) for index in info.b.indices)
        if simplify(flat_offset(info.b.buffer, moved) - base - inner) != IntImm(0):
            return None
        inner = simplify(inner * extent)
    return strides[:PANEL_COLUMNS]


def _set_block_start(emitter: Emitter, info: MatmulInfo, column_axes, column_extents, column0: str, address: str,
                     indent: str) -> None:
    """``address`` := the address of the second factor at reduction step 0 and column
    ``column0`` (the first column of a block that is copied or gathered into the panel)."""
    emitter.open_scope()
    for axis, extent, local in zip(column_axes, column_extents, unflatten_into(
            emitter, column_extents, f"(local.get {column0})", "xd", indent)):
        emitter.declare_axis(axis, extent, local)
    first_step = tuple(substitute(index, {axis.name: IntImm(0) for axis in info.reduce_axes})
                       for index in info.b.indices)
    emitter.function.emit(indent, f"(local.set {address} {emitter.element_address(info.b.buffer, first_step)})")
    emitter.close_scope()


def _gather_columns(function: Function, source: str, strides: list[int], panel: str, indent: str) -> None:
    """Statements packing a block of :data:`PANEL_COLUMNS` columns of a second factor of
    :func:`gathered_columns` into the panel: per reduction step one f32 of each column
    (``strides``: its distance in elements from the first column's), assembled into
    ``PANEL_COLUMNS / 4`` f32x4 and stored; ``source`` (the first column's step 0) moves by
    one element a step.  Element by element (:func:`_pack`) each took the reduction's
    nested loops and the index arithmetic: a 3x3 convolution's weight of 512 x 4608 packed
    at about 1.6 ns an element."""
    vectors = []
    for q in range(PANEL_COLUMNS // 4):
        vector = f"(v128.load32_splat offset={4 * strides[4 * q]} (local.get {source}))"
        for lane in range(1, 4):
            vector = f"(v128.load32_lane offset={4 * strides[4 * q + lane]} {lane} (local.get {source}) {vector})"
        vectors.append(vector)
    _fill_panel(function, source, "(i32.const 4)", vectors, panel, ("gathered", "gather"), indent)


def _copy_columns(function: Function, source: str, stride: str, panel: str, indent: str) -> None:
    """Statements copying a block of :data:`PANEL_COLUMNS` columns of a second factor that
    is contiguous along them (:func:`direct_columns`) into the panel, ``PANEL_COLUMNS / 4``
    f32x4 per reduction step, from ``source`` (the first step's address, moved by
    ``stride`` bytes per step).  Read in place, every micro-kernel would step a whole row
    of the factor (12 KB for 3072 columns) per reduction step: new pages, the same cache
    sets; copied once per unit, they read 32 contiguous bytes a step (128 x 768 @ 768 x
    3072: 8.6 -> 14 GFLOP/s)."""
    vectors = [f"(v128.load offset={16 * q} (local.get {source}))" for q in range(PANEL_COLUMNS // 4)]
    _fill_panel(function, source, f"(local.get {stride})", vectors, panel, ("copied", "copy"), indent)


def _fill_panel(function: Function, source: str, source_step: str, vectors: list[str], panel: str,
                labels: tuple[str, str], indent: str) -> None:
    """The loop over the reduction steps that stores ``vectors`` (``PANEL_COLUMNS / 4``
    f32x4 read from local ``source``) into the panel, one step of :data:`PANEL_COLUMNS`
    floats at a time, ``source`` advanced by ``source_step`` bytes a step."""
    emit = function.emit
    done, loop = labels
    target, step = function.named_local("copy_target", "i32"), function.named_local("copy_step", "i32")
    emit(indent, f"(local.set {target} {panel})")
    emit(indent, f"(local.set {step} (local.get $depth))")
    emit(indent, f"(block ${done}")
    emit(indent, f"  (br_if ${done} (i32.eqz (local.get {step})))")
    emit(indent, f"  (loop ${loop}")
    body = indent + "    "
    for q, vector in enumerate(vectors):
        emit(body, f"(v128.store offset={16 * q} (local.get {target}) {vector})")
    emit(body, f"(local.set {source} (i32.add (local.get {source}) {source_step}))")
    emit(body, f"(local.set {target} (i32.add (local.get {target}) (i32.const {4 * PANEL_COLUMNS})))")
    emit(body, f"(local.set {step} (i32.sub (local.get {step}) (i32.const 1)))")
    emit(body, f"(br_if ${loop} (local.get {step}))))")


def _micro_kernels(function: Function, row0: str, panel_a: str, panel_b: str, indent: str) -> None:
    """The sums of the column block for the panel's rows (from local ``row0``), :data:`MICRO_ROWS`
    at a time (while any is in the output): per step one ``v128.load32_splat`` per row from
    the first factor's panel at local ``panel_a``, ``PANEL_COLUMNS / 4`` f32x4 of the second
    factor's panel at ``panel_b``, the products added into f32x4 sums stored to the
    scratch's sums (row-major).

    The reduction runs in chunks of :data:`PANEL_CHUNK` steps, every strip of the panel for
    one chunk before the next (the sums reloaded from the scratch after the first): a
    chunk of the second factor's panel (``32 * PANEL_CHUNK`` bytes) stays in the L1 cache
    for the panel's strips, which read ``16 * PANEL_CHUNK`` bytes each.  Over the whole
    reduction at once, every strip streamed both panels (``48 * depth`` bytes: 96 KB at
    K = 2048, a 1x1 convolution of 2048 channels) from L2: ResNet-50's 1x1 convolutions
    of 1024 and 2048 channels ran at half the speed of those of 64."""
    emit = function.emit
    lanes = PANEL_COLUMNS // 4
    micro, a, b, step = (function.named_local(name, "i32") for name in ("micro", "a_address", "b", "step"))
    chunk0, address = function.named_local("chunk0", "i32"), function.named_local("sums_address", "i32")
    sums = [[function.named_local(f"psum{r}_{q}", "v128") for q in range(lanes)] for r in range(MICRO_ROWS)]
    factors_a = [function.named_local(f"pa{r}", "v128") for r in range(MICRO_ROWS)]
    factors_b = [function.named_local(f"pb{q}", "v128") for q in range(lanes)]
    emit(indent, f"(local.set {chunk0} (i32.const 0))")
    emit(indent, f";; chunks of {PANEL_CHUNK} reduction steps (at least one: a zero depth stores zero sums)")
    emit(indent, "(loop $chunk")
    chunk_indent = indent + "  "
    emit(chunk_indent, f"(local.set {micro} (i32.const 0))")
    emit(chunk_indent, "(block $micro_done")
    emit(chunk_indent, "  (loop $micro")
    inner = chunk_indent + "    "
    emit(inner, f"(br_if $micro_done (i32.ge_u (i32.add (local.get {row0}) (local.get {micro})) (local.get $rows)))")
    emit(inner, f"(local.set {address} (i32.add (local.get $scratch) (i32.add (i32.const {PANEL_A_BYTES + PANEL_B_BYTES}) "
                f"(i32.shl (local.get {micro}) (i32.const {(4 * PANEL_COLUMNS).bit_length() - 1})))))")
    emit(inner, f"(if (local.get {chunk0})")
    emit(inner, "  (then")
    for r in range(MICRO_ROWS):
        for q in range(lanes):
            emit(inner, f"    (local.set {sums[r][q]} (v128.load offset={16 * (r * lanes + q)} (local.get {address})))")
    function.lines[-1] += ")"
    emit(inner, "  (else")
    for row in sums:
        for local in row:
            emit(inner, f"    (local.set {local} (v128.const i32x4 0 0 0 0))")
    function.lines[-1] += "))"
    emit(inner, f";; the strip of rows micro .. micro + {MICRO_ROWS - 1}: {4 * MICRO_ROWS} contiguous bytes a step")
    emit(inner, f"(local.set {a} (i32.add (i32.add (local.get {panel_a}) (i32.mul (i32.div_u (local.get {micro}) "
                f"(i32.const {MICRO_ROWS})) {STRIP_BYTES})) (i32.shl (local.get {chunk0}) (i32.const "
                f"{(4 * MICRO_ROWS).bit_length() - 1}))))")
    emit(inner, f"(local.set {b} (i32.add {panel_b} (i32.shl (local.get {chunk0}) (i32.const "
                f"{(4 * PANEL_COLUMNS).bit_length() - 1}))))")
    emit(inner, f"(local.set {step} (call $min_u32 (i32.sub (local.get $depth) (local.get {chunk0})) "
                f"(i32.const {PANEL_CHUNK})))")
    emit(inner, "(block $summed")
    emit(inner, f"  (br_if $summed (i32.eqz (local.get {step})))")
    emit(inner, "  (loop $sum")
    body = inner + "    "
    for r, local in enumerate(factors_a):
        emit(body, f"(local.set {local} (v128.load32_splat offset={4 * r} (local.get {a})))")
    for q, local in enumerate(factors_b):
        emit(body, f"(local.set {local} (v128.load offset={16 * q} (local.get {b})))")
    for r in range(MICRO_ROWS):
        for q in range(lanes):
            emit(body, f"(local.set {sums[r][q]} (f32x4.add (local.get {sums[r][q]}) "
                       f"(f32x4.mul (local.get {factors_a[r]}) (local.get {factors_b[q]}))))")
    emit(body, f"(local.set {a} (i32.add (local.get {a}) (i32.const {4 * MICRO_ROWS})))")
    emit(body, f"(local.set {b} (i32.add (local.get {b}) (i32.const {4 * PANEL_COLUMNS})))")
    emit(body, f"(local.set {step} (i32.sub (local.get {step}) (i32.const 1)))")
    emit(body, f"(br_if $sum (local.get {step}))))")
    for r in range(MICRO_ROWS):
        for q in range(lanes):
            emit(inner, f"(v128.store offset={16 * (r * lanes + q)} (local.get {address}) (local.get {sums[r][q]}))")
    emit(inner, f"(local.set {micro} (i32.add (local.get {micro}) (i32.const {MICRO_ROWS})))")
    emit(inner, f"(br_if $micro (i32.lt_u (local.get {micro}) (i32.const {PANEL_ROWS})))))")
    emit(chunk_indent, f"(local.set {chunk0} (i32.add (local.get {chunk0}) (i32.const {PANEL_CHUNK})))")
    emit(chunk_indent, f"(br_if $chunk (i32.lt_u (local.get {chunk0}) (local.get $depth))))")


def _enter_output_column(emitter: Emitter, program: TensorProgram, column_axes, column_extents, column: str,
                         prefix: str, indent: str) -> str:
    """Opens a scope with the column axes of local ``column`` declared (the caller closes
    it) and returns the local holding the output element's address there."""
    emitter.open_scope()
    for axis, extent, local in zip(column_axes, column_extents,
                                   unflatten_into(emitter, column_extents, f"(local.get {column})", prefix, indent)):
        emitter.declare_axis(axis, extent, local)
    offset = emitter.index(flat_offset(program.output, tuple(program.axes)))
    return emitter.set_local(emitter.address(program.output.name, offset), "i32", indent, "address")

def _panel_outputs(emitter: Emitter, info: MatmulInfo, program: TensorProgram, row_axes, row_extents, column_axes,
                   column_extents, row0: str, column0: str, sums_base: str, indent: str) -> None:
    """Loops over the panel's rows and the column block's columns that are inside the output
    (a row's axes recovered once for its columns): the epilogue of each spilled sum, stored."""
    function, emit = emitter.function, emitter.function.emit
    row, row_end = function.named_local("row", "i32"), function.named_local("row_end", "i32")
    column, column_end = function.named_local("column", "i32"), function.named_local("column_end", "i32")
    sum_address = function.named_local("sum_address", "i32")
    emit(indent, f"(local.set {row} (local.get {row0}))")
    emit(indent, f"(local.set {row_end} (call $min_u32 (i32.add (local.get {row0}) (i32.const {PANEL_ROWS})) "
                 f"(local.get $rows)))")
    emit(indent, f"(local.set {column_end} (call $min_u32 (i32.add (local.get {column0}) (i32.const {PANEL_COLUMNS})) "
                 f"(local.get $columns)))")
    emit(indent, f"(local.set {sum_address} {sums_base})")
    emit(indent, "(loop $output_row")
    inner = indent + "  "
    emitter.open_scope()
    for axis, extent, local in zip(row_axes, row_extents, unflatten_into(emitter, row_extents, f"(local.get {row})", "yr", inner)):
        emitter.declare_axis(axis, extent, local)
    emit(inner, f"(local.set {column} (local.get {column0}))")
    emit(inner, "(loop $output_column")
    body = inner + "  "
    sum_at = f"(i32.add (local.get {sum_address}) (i32.shl (i32.sub (local.get {column}) (local.get {column0})) (i32.const 2)))"
    suffix = vector_columns(info, program)
    if suffix:  # four columns at once while four remain (within a row of the suffix), then one by one
        quad = f"(i32.le_u (i32.add (local.get {column}) (i32.const 4)) (local.get {column_end}))"
        if suffix < len(column_axes):  # an outer column axis (a batch): four within one index of it
            span = emitter.index(simplify(product(column_extents[-suffix:])))
            quad = (f"(i32.and {quad} (i32.le_u (i32.add (i32.rem_u (local.get {column}) {span}) (i32.const 4)) "
                    f"{span}))")
        emit(body, f"(if {quad}")
        emit(body, "  (then")
        quad = body + "    "
        address = _enter_output_column(emitter, program, column_axes, column_extents, column, "yq", quad)
        splats = {info.reduction: f"(v128.load {sum_at})"}
        for node in epilogue_nodes(info, program.body):
            if isinstance(node, Load) and not any(reads(node, axis) for axis in column_axes[-suffix:]) \
                    and node not in splats:
                splats[node] = emitter.set_local(f"(f32x4.splat {emitter.scalar(node, quad)})", "v128", quad, "splat")
        emit(quad, f"(v128.store {address} {emitter.vector_value(program.body, splats, {}, quad)})")
        emitter.close_scope()
        emit(quad, f"(local.set {column} (i32.add (local.get {column}) (i32.const 4))))")
        emit(body, "  (else")
        body = body + "    "
    address = _enter_output_column(emitter, program, column_axes, column_extents, column, "yc", body)
    emitter.known(info.reduction, f"(f32.load {sum_at})")
    emit(body, store(program.output.dtype, address, emitter.scalar(program.body, body)))
    emitter.close_scope()
    emit(body, f"(local.set {column} (i32.add (local.get {column}) (i32.const 1)))")
    if suffix:
        function.lines[-1] += "))"
        body = inner + "  "
    emit(body, f"(br_if $output_column (i32.lt_u (local.get {column}) (local.get {column_end}))))")
    emitter.close_scope()
    emit(inner, f"(local.set {sum_address} (i32.add (local.get {sum_address}) (i32.const {4 * PANEL_COLUMNS})))")
    emit(inner, f"(local.set {row} (i32.add (local.get {row}) (i32.const 1)))")
    emit(inner, f"(br_if $output_row (i32.lt_u (local.get {row}) (local.get {row_end}))))")


def epilogue_nodes(info: MatmulInfo, body: ScalarExpr) -> list[ScalarExpr]:
    """The nodes of an epilogue ``body`` outside its reduction (``info.reduction``, whose
    sums the micro-kernels computed), the reduction node itself included."""
    found, pending = [], [body]
    while pending:
        node = pending.pop()
        found.append(node)
        if node != info.reduction:
            pending.extend(scalar_children(node))
    return found


def vector_columns(info: MatmulInfo, program: TensorProgram) -> int:
    """How many of the last column axes :func:`_panel_outputs` may apply the epilogue to
    four flat columns at a time along (0: none): the longest suffix of the column axes that
    are the output's last axes, in order (four consecutive flat columns within it are four
    consecutive elements: a convolution's output positions [H, W]; not its batch axis, a
    column axis too where the weight does not read it), for a float32 output and an
    epilogue of f32x4-able ops (``VECTOR_*_RENDERINGS``: a bias, a residual add, ReLU as a
    maximum, SiLU's sigmoid) whose loads read those axes as the output does
    (:func:`along_columns`: one ``v128.load``) or not at all (a splat).  With K = 64 (a
    ResNet 1x1 convolution, 64 -> 256 at 56 x 56) the element-by-element epilogue took 30%
    of the kernel, and more with symbolic sizes (an unflattening by run-time extents for
    each element)."""
    if program.output.dtype != "float32":
        return 0
    count = 0
    while (count < len(info.columns)
           and info.columns[len(info.columns) - 1 - count] == len(program.axes) - 1 - count):
        count += 1
    if not count:
        return 0
    axes = program.axes[-count:]
    extents = program.output.shape[-count:]
    for node in epilogue_nodes(info, program.body):
        if node == info.reduction:
            continue
        if node.dtype != "float32":
            return 0
        if isinstance(node, Load):
            if any(reads(node, axis) for axis in axes) and not along_columns(node, axes, extents):
                return 0
        elif isinstance(node, Binary):
            if node.op not in VECTOR_BINARY_RENDERINGS:
                return 0
        elif isinstance(node, Unary):
            if node.op not in VECTOR_UNARY_RENDERINGS:
                return 0
        elif not isinstance(node, FloatImm):
            return 0
    return count


def vector_epilogue(info: MatmulInfo, program: TensorProgram) -> bool:
    """Whether :func:`_panel_outputs` applies the epilogue four columns at a time
    (:func:`vector_columns`)."""
    return vector_columns(info, program) > 0


# -- the packed path: a convolution's input four output positions at a time -------------------

ORDERINGS = (CompareOp.LT, CompareOp.LE, CompareOp.GT, CompareOp.GE)


def padded_interior(factor: ScalarExpr, axis: SizeVar) -> tuple[list[ScalarExpr], ScalarExpr] | None:
    """A factor made of padding guards around a float32 core that reads along ``axis``
    contiguously (a stride-1 convolution's input, its prologue fused), as ``(guards,
    core)``: ``select(g1, select(g2, ... core, 0), 0)``.  Each guard compares index values
    that move by a constant per step of ``axis`` (true at two positions, true between), the
    core's ops all have f32x4 forms and each of its loads reads ``axis`` as its last index
    times a positive constant plus an offset free of it (:func:`last_stride`; four positions:
    one ``v128.load`` at stride 1, two and a shuffle at stride 2 (a stride-2 convolution's
    input), four lanes loaded one by one beyond) or not at all (a splat).  None for any other
    factor."""
    guards = []
    while isinstance(factor, Select) and isinstance(factor.b, FloatImm) and factor.b.value == 0.0:
        guards.append(factor.condition)
        factor = factor.a
    for guard in guards:
        if not (isinstance(guard, Compare) and guard.op in ORDERINGS and isinstance(guard.a, IndexValue)
                and isinstance(guard.b, IndexValue)):
            return None
        for side in (guard.a.value, guard.b.value):
            if as_int(simplify(substitute(side, {axis.name: axis + 1}) - side)) is None:
                return None
    if factor.dtype != "float32" or not any(isinstance(node, Load) and reads(node, axis) for node in scalar_nodes(factor)):
        return None
    for node in scalar_nodes(factor):
        if node.dtype != "float32":
            return None
        if isinstance(node, Load) and reads(node, axis) and last_stride(node, axis) is None:
            return None
        if isinstance(node, Binary) and node.op not in VECTOR_BINARY_RENDERINGS:
            return None
        if isinstance(node, Unary) and node.op not in VECTOR_UNARY_RENDERINGS:
            return None
        if not isinstance(node, (Load, FloatImm, Binary, Unary)):
            return None
    return guards, factor


def reads(load: Load, axis: SizeVar) -> bool:
    """Whether ``load``'s indices use ``axis``."""
    return any(axis.name in {v.name for v in free_vars(index)} for index in load.indices)


def along_columns(load: Load, axes, extents) -> bool:
    """Whether ``load`` reads the flat index over ``axes`` (row-major, of ``extents``)
    contiguously: one more of axis ``j`` moves it by the product of the later extents, by
    a distance free of the axes (four consecutive flat indices: one ``v128.load``)."""
    base = flat_offset(load.buffer, load.indices)
    names = {axis.name for axis in axes}
    stride = IntImm(1)
    for axis, extent in reversed(list(zip(axes, extents))):
        moved = tuple(substitute(index, {axis.name: axis + 1}) for index in load.indices)
        distance = simplify(flat_offset(load.buffer, moved) - base)
        if names & {v.name for v in free_vars(distance)} or simplify(distance - stride) != IntImm(0):
            return False
        stride = simplify(stride * extent)
    return True


def last_stride(load: Load, axis: SizeVar) -> int | None:
    """``s`` when ``load`` reads ``axis`` as ``s * axis`` plus an offset free of it in its
    last index (``s`` a positive constant: a convolution's stride) and in no other; None
    otherwise."""
    *others, last = load.indices
    if any(axis.name in {v.name for v in free_vars(index)} for index in others):
        return None
    stride = as_int(simplify(substitute(last, {axis.name: axis + 1}) - last))
    if stride is None or stride < 1:
        return None
    if axis.name in {v.name for v in free_vars(simplify(last - stride * axis))}:
        return None
    return stride


def strided_lanes(emitter: Emitter, load: Load, stride: int, indent: str) -> str:
    """A v128 local holding ``load`` at four consecutive positions of an axis it reads with
    ``stride`` (:func:`last_stride`; lane 0's axes in scope): elements ``e, e + s, e + 2s,
    e + 3s`` of the buffer.  Stride 2: two ``v128.load`` of ``e .. e + 3`` and ``e + 3 ..
    e + 6`` (no byte beyond the last element read) and one shuffle of lanes 0, 2 of the
    first and 1, 3 of the second; other strides: four ``f32.load`` into one f32x4."""
    address = emitter.set_local(emitter.element_address(load.buffer, load.indices), "i32", indent, "strided")
    if stride == 2:
        low, high = f"(v128.load {address})", f"(v128.load offset=12 {address})"
        vector = f"(i8x16.shuffle 0 1 2 3 8 9 10 11 20 21 22 23 28 29 30 31 {low} {high})"
    else:
        vector = f"(f32x4.splat (f32.load {address}))"
        for n in range(1, 4):
            vector = f"(f32x4.replace_lane {n} {vector} (f32.load offset={4 * stride * n} {address}))"
    return emitter.set_local(vector, "v128", indent, "strided")


def _pack_interior(emitter: Emitter, info: MatmulInfo, factor: ScalarExpr, interior, axes, extents, first: str,
                   count: str, layout: PackLayout, base: str, lane: str, address: str, indent: str) -> None:
    """:func:`_pack` four lanes at a time while four lanes remain below ``count``, for a
    factor of :func:`padded_interior`.  Four lanes on one row of the innermost axis read
    four consecutive elements (every ``s``-th at stride ``s``: :func:`strided_lanes`): at each step, where the guards hold at the first and the last
    lane (hence at all four) the core is evaluated once as f32x4 (its loads ``v128.load``,
    its math calls once) and stored with one ``v128.store``; elsewhere (a border) the factor
    lane by lane.  Where the guards hold over the whole window (:func:`window_inside`, one
    branch per four lanes) the steps check no guard at all.  Four lanes across a row's end
    are packed one by one.  Leaves ``lane`` at the first lane not packed."""
    function, emit = emitter.function, emitter.function.emit
    guards, core = interior
    label, lanes = lane[1:], layout.lanes
    last_axis, last_extent = axes[-1], simplify(extents[-1])
    emit(indent, f"(block $interior_{label}")
    emit(indent, f"  (loop $quad_{label}")
    inner = indent + "    "
    emit(inner, f"(br_if $interior_{label} (i32.gt_u (i32.add (local.get {lane}) (i32.const 4)) (i32.const {lanes})))")
    emit(inner, f"(br_if $interior_{label} (i32.gt_u (i32.add (i32.add {first} (local.get {lane})) (i32.const 4)) {count}))")
    emit(inner, f"(local.set {address} {layout.lane_address(base, f'(local.get {lane})')})")
    firsts = unflatten_into(emitter, extents, f"(i32.add {first} (local.get {lane}))", f"{label}_q", inner)
    lasts = [firsts[-1]] + [function.named_local(f"{label}_q_last{n}", "i32") for n in range(1, 4)]
    for n in range(1, 4):
        emit(inner, f"(local.set {lasts[n]} (i32.add (local.get {firsts[-1]}) (i32.const {n})))")
    emitter.open_scope()
    for axis, extent, local in zip(axes, extents, firsts):
        emitter.declare_axis(axis, extent, local)
    one_row = emitter.index(last_extent)
    emitter.close_scope()
    emit(inner, f"(if (i32.le_u (i32.add (local.get {firsts[-1]}) (i32.const 4)) {one_row})")
    emit(inner, "  (then")

    def in_lane(n: int) -> None:
        emitter.open_scope()
        for axis, extent, local in zip(axes, extents, [*firsts[:-1], lasts[n]]):
            emitter.declare_axis(axis, extent, local)

    def core_splats(depth: str) -> dict:
        """The v128 values of the core's loads that are not one ``v128.load`` of four
        positions (lane 0's axes in scope): a load the lanes do not move splatted, a strided
        one (:func:`strided_lanes`) gathered."""
        splats = {}
        for node in scalar_nodes(core):
            if not isinstance(node, Load) or node in splats:
                continue
            if not reads(node, last_axis):
                splats[node] = emitter.set_local(f"(f32x4.splat {emitter.scalar(node, depth)})", "v128", depth, "splat")
            elif (stride := last_stride(node, last_axis)) != 1:
                splats[node] = strided_lanes(emitter, node, stride, depth)
        return splats

    def vector_step(depth: str) -> None:
        in_lane(0)
        splats = core_splats(depth)
        emit(depth, f"(v128.store (local.get {address}) {emitter.vector_value(core, splats, {}, depth)})")
        emitter.close_scope()
        emit(depth, f"(local.set {address} (i32.add (local.get {address}) (i32.const {layout.step})))")

    def step(depth: str) -> None:
        conditions = []
        for n in (0, 3):
            in_lane(n)
            conditions += [emitter.scalar(guard, depth) for guard in guards]
            emitter.close_scope()
        inside = "(i32.const 1)"
        for condition in conditions:
            inside = condition if inside == "(i32.const 1)" else f"(i32.and {inside} {condition})"
        emit(depth, f"(if {inside}")
        emit(depth, "  (then")
        in_lane(0)
        splats = core_splats(depth + "    ")
        vector = emitter.vector_value(core, splats, {}, depth + "    ")
        emitter.close_scope()
        emit(depth, f"    (v128.store (local.get {address}) {vector}))")
        emit(depth, "  (else")
        for n in range(4):
            in_lane(n)
            emit(depth, f"    (f32.store offset={4 * n} (local.get {address}) {emitter.scalar(factor, depth + '    ')})")
            emitter.close_scope()
        function.lines[-1] += "))"
        emit(depth, f"(local.set {address} (i32.add (local.get {address}) (i32.const {layout.step})))")

    window = window_inside(emitter, info, guards, in_lane, inner + "    ")
    if not guards:
        _for_each_step(emitter, info.reduce_axes, info.reduce_extents, inner + "    ", vector_step)
    elif window is not None:  # the whole window inside: no guard at any step
        emit(inner, f"    (if {window}")
        emit(inner, "      (then")
        _for_each_step(emitter, info.reduce_axes, info.reduce_extents, inner + "        ", vector_step)
        function.lines[-1] += ")"
        emit(inner, "      (else")
        _for_each_step(emitter, info.reduce_axes, info.reduce_extents, inner + "        ", step)
        function.lines[-1] += "))"
    else:
        _for_each_step(emitter, info.reduce_axes, info.reduce_extents, inner + "    ", step)
    function.lines[-1] += ")"
    emit(inner, "  (else")
    # four lanes across a row's end: each on its own
    body = inner + "    "
    _pack_four_lanes_apart(emitter, info, factor, axes, extents, first, lane, address, layout, base, label, body)
    function.lines[-1] += ")"
    emit(inner, f"(local.set {lane} (i32.add (local.get {lane}) (i32.const 4)))")
    emit(inner, f"(br $quad_{label})))")


def _pack_four_lanes_apart(emitter: Emitter, info: MatmulInfo, factor: ScalarExpr, axes, extents, first: str,
                           lane: str, address: str, layout: PackLayout, base: str, label: str, indent: str) -> None:
    """The four lanes from ``lane`` packed each on its own (their positions cross a row's end,
    so no vector form holds for them): each lane's axes recovered, the factor evaluated at
    every reduction step and stored at the lane's place in the panel."""
    function, emit = emitter.function, emitter.function.emit
    quad, position = function.local("quad", "i32"), function.local("position", "i32")
    emit(indent, f"(local.set {quad} (i32.const 0))")
    emit(indent, f"(loop $split_{label}")
    emit(indent, f"  (local.set {position} (i32.add (i32.add {first} (local.get {lane})) (local.get {quad})))")
    emit(indent, f"  (local.set {address} "
                 f"{layout.lane_address(base, f'(i32.add (local.get {lane}) (local.get {quad}))')})")
    emitter.open_scope()
    for axis, extent, local in zip(axes, extents, unflatten_into(emitter, extents, f"(local.get {position})",
                                                               f"{label}_s", indent + "  ")):
        emitter.declare_axis(axis, extent, local)

    def single(depth: str) -> None:
        emit(depth, f"(f32.store (local.get {address}) {emitter.scalar(factor, depth)})")
        emit(depth, f"(local.set {address} (i32.add (local.get {address}) (i32.const {layout.step})))")

    _for_each_step(emitter, info.reduce_axes, info.reduce_extents, indent + "  ", single)
    emitter.close_scope()
    emit(indent, f"  (local.set {quad} (i32.add (local.get {quad}) (i32.const 1)))")
    emit(indent, f"  (br_if $split_{label} (i32.lt_u (local.get {quad}) (i32.const 4)))))")


def window_inside(emitter: Emitter, info: MatmulInfo, guards: list[ScalarExpr], in_lane: Callable[[int], None],
                  indent: str) -> str | None:
    """An i32 WAT value, nonzero when every guard holds at every reduction step for the four
    lanes (``in_lane(n)`` opens a scope with lane ``n``'s axes): each guard moves by a
    constant per step of each reduction axis it reads, so it holds over the whole window
    when it holds at its corners (each such axis at 0 and at its extent - 1, lanes 0 and 3).
    None when a guard is not of that form or there are none."""
    function = emitter.function
    conditions = []
    for guard in guards:
        names = {v.name for side in (guard.a.value, guard.b.value) for v in free_vars(side)}
        moving = [(axis, extent) for axis, extent in zip(info.reduce_axes, info.reduce_extents) if axis.name in names]
        for axis, _ in moving:
            for side in (guard.a.value, guard.b.value):
                if as_int(simplify(substitute(side, {axis.name: axis + 1}) - side)) is None:
                    return None
        corners = [()]
        for axis, extent in moving:
            corners = [(*corner, (axis, extent, end)) for corner in corners for end in (False, True)]
        for n in (0, 3):
            for corner in corners:
                in_lane(n)
                for axis, extent, end in corner:
                    local = function.local("corner", "i32")
                    value = emitter.index(simplify(extent - 1)) if end else "(i32.const 0)"
                    function.emit(indent, f"(local.set {local} {value})")
                    emitter.declare_axis(axis, extent, local)
                conditions.append(emitter.scalar(guard, indent))
                emitter.close_scope()
    if not conditions:
        return None
    inside = conditions[0]
    for condition in conditions[1:]:
        inside = f"(i32.and {inside} {condition})"
    return inside


# -- the matrix-vector path: few rows, the weight streamed in order ------------------------------

# A matmul with at most MATVEC_ROWS rows (a decoder's step: one token) gains nothing from
# panels of PANEL_ROWS rows: its time is the second factor's bytes, read once.  A unit is a
# block of at most MATVEC_COLUMNS columns (per batch index; the blocks of a row as even as
# multiples of 4 allow, so threads get even shares): the first factor is packed once per
# unit ([K x MATVEC_ROWS], its prologue evaluated once per element), then for each row the
# block's sums (in the scratch) take MATVEC_STEPS rows of the second factor at a time, each
# read in order along its columns.  Under wasmtime on one thread, a 768 x 3072 float32
# weight: about 10 GB/s this way, 4-6 GB/s with the sums in registers and the weight read
# down its columns, 1.5 GB/s on the packed path; the GPT-2 decode step's kernels took 120,
# 106 and 95 ms with blocks of 128, 256 and 512 columns (the longer runs of each weight row
# stream better, and the prologue is packed for fewer units).  One row at a time: up to 8
# rows this is still faster than the packed path's micro-kernels of 4 rows (768 x 3072,
# 8 rows: 4.0 against 4.5 ms, the block's weight reread from the cache for each row).
MATVEC_ROWS = 8
MATVEC_COLUMNS = 512
MATVEC_STEPS = 4
MATVEC_SUMS_BYTES = 4 * MATVEC_COLUMNS
# the deepest reduction whose packed first factor fits the matmul scratch after the sums
MATVEC_DEPTH = (MATMUL_SCRATCH_BYTES - MATVEC_SUMS_BYTES) // (4 * MATVEC_ROWS) // 4 * 4


def matvec_applies(info: MatmulInfo, program: TensorProgram) -> bool:
    """Whether the matrix-vector form exists for the program: a second factor the packed
    path reads in place (:func:`direct_columns`: a float32 plain load contiguous along the
    only column axis, one reduction axis: :func:`streamed_columns`), or one contiguous
    along the reduction (:func:`dot_columns`: dot products).  Whether it runs is decided
    at run time (:func:`matvec_condition`)."""
    return streamed_columns(info, program) or dot_columns(info)


def streamed_columns(info: MatmulInfo, program: TensorProgram) -> bool:
    """Whether the matrix-vector form streams the second factor's rows in order: one
    reduction axis and the output's last axis the only column axis, read in place
    (:func:`direct_columns`; not its several column or reduction axes of a 1x1
    convolution: the form reads one of each)."""
    if len(info.reduce_axes) != 1 or not contiguous_columns(info, program):
        return False
    return direct_columns(info, program) is not None


def dot_columns(info: MatmulInfo) -> bool:
    """Whether each column of the second factor is a float32 plain load contiguous along the
    reduction steps, the reduction axes flattened in order (a ``Gemm`` with ``transB``, a
    1x1 convolution's weight [O, C, 1, 1], a classifier's [classes, features]): a
    column's products are then a dot product of two contiguous runs (:func:`_dot_unit`)."""
    b = info.b
    if not isinstance(b, Load) or b.buffer.dtype != "float32":
        return False
    offset = flat_offset(b.buffer, b.indices)
    stride: PrimExpr = IntImm(1)
    for axis, extent in reversed(tuple(zip(info.reduce_axes, info.reduce_extents))):
        moved = flat_offset(b.buffer, tuple(substitute(index, {axis.name: axis + 1}) for index in b.indices))
        if as_int(simplify(moved - offset - stride)) != 0:
            return False
        stride = stride * extent
    return True


def matvec_condition(rows: str, depth: str) -> str:
    """An i32 WAT value, nonzero where the matrix-vector form runs: at most
    :data:`MATVEC_ROWS` rows and :data:`MATVEC_DEPTH` reduction steps (``rows``, ``depth``:
    i32 WAT values)."""
    return (f"(i32.and (i32.le_u {rows} (i32.const {MATVEC_ROWS})) "
            f"(i32.le_u {depth} (i32.const {MATVEC_DEPTH})))")


def matvec_units(batch: str, columns: str) -> str:
    """The matrix-vector form's units (i32 WAT): per batch index, a unit per
    :data:`MATVEC_COLUMNS` columns (rounded up)."""
    return (f"(i32.mul {batch} (i32.div_u (i32.add {columns} (i32.const {MATVEC_COLUMNS - 1})) "
            f"(i32.const {MATVEC_COLUMNS})))")


def _matvec(emitter: Emitter, info: MatmulInfo, program: TensorProgram, batch_axes, batch_extents, row_axes,
            row_extents, column_axes, column_extents, indent: str) -> None:
    """The statements of the matrix-vector form in :func:`render_matmul`'s ``$main``: when
    :func:`matvec_condition` holds, units ``$first <= u < $end`` (:func:`matvec_units`) and
    return; otherwise nothing, and the other forms run.  Reads the locals ``$rows``,
    ``$columns``, ``$depth`` and ``$unit`` that ``render_matmul`` set."""
    function, emit = emitter.function, emitter.function.emit
    unit, blocks, batch, column0, width, block_width = (
        function.named_local(name, "i32") for name in ("unit", "mv_blocks", "mv_batch", "mv_column0", "mv_width",
                                                       "mv_block_width"))
    emit(indent, f"(if {matvec_condition('(local.get $rows)', '(local.get $depth)')}")
    emit(indent, "  (then")
    inner = indent + "    "
    emit(inner, f"(local.set {blocks} (i32.div_u (i32.add (local.get $columns) (i32.const {MATVEC_COLUMNS - 1})) "
                f"(i32.const {MATVEC_COLUMNS})))")
    emit(inner, "(block $matvec_done")
    emit(inner, f"  (br_if $matvec_done (i32.ge_u (local.get {unit}) (local.get $end)))")
    emit(inner, "  (loop $matvec_unit")
    body = inner + "    "
    emit(body, f"(local.set {batch} (i32.div_u (local.get {unit}) (local.get {blocks})))")
    # ceil(columns / blocks) <= MATVEC_COLUMNS, a multiple of 4: rounded up, the widths still
    # leave each block's first column inside (blocks - 1 blocks hold fewer than the columns)
    emit(body, ";; the blocks' width: the columns shared evenly, rounded up to a multiple of 4")
    emit(body, f"(local.set {block_width} (i32.and (i32.add (i32.div_u (i32.add (local.get $columns) "
               f"(i32.sub (local.get {blocks}) (i32.const 1))) (local.get {blocks})) (i32.const 3)) (i32.const -4)))")
    emit(body, f"(local.set {column0} (i32.mul (i32.rem_u (local.get {unit}) (local.get {blocks})) "
               f"(local.get {block_width})))")
    emit(body, f"(local.set {width} (call $min_u32 (i32.sub (local.get $columns) (local.get {column0})) "
               f"(local.get {block_width})))")
    emitter.open_scope()
    for axis, extent, local in zip(batch_axes, batch_extents,
                                   unflatten_into(emitter, batch_extents, f"(local.get {batch})", "xm", body)):
        emitter.declare_axis(axis, extent, local)
    unit_statements = _matvec_unit if streamed_columns(info, program) else _dot_unit
    unit_statements(emitter, info, program, row_axes, row_extents, column_axes, column_extents, column0, width, body)
    emitter.close_scope()
    emit(body, f"(local.set {unit} (i32.add (local.get {unit}) (i32.const 1)))")
    emit(body, f"(br_if $matvec_unit (i32.lt_u (local.get {unit}) (local.get $end)))))")
    emit(indent, "    (return)))")


def _matvec_unit(emitter: Emitter, info: MatmulInfo, program: TensorProgram, row_axes, row_extents, column_axes,
                 column_extents, column0: str, width: str, indent: str) -> None:
    """One unit of the matrix-vector form (the batch axes in scope): the ``width`` columns
    from ``column0``, every row.  The first factor packed for all rows (lane ``r`` of step
    ``k`` at ``scratch + MATVEC_SUMS_BYTES + 4 * (k * MATVEC_ROWS + r)``); per row, the sums
    (:func:`_matvec_sums`) then the epilogue of each, stored."""
    function, emit = emitter.function, emitter.function.emit
    panel = f"(i32.add (local.get $scratch) (i32.const {MATVEC_SUMS_BYTES}))"
    _pack(emitter, info, info.a, row_axes, row_extents, "(i32.const 0)", "(local.get $rows)", MATVEC_ROWS, panel,
          indent)
    # the second factor at reduction step 0, column ``column0``; the bytes between two steps
    weight, step = function.named_local("mv_weight", "i32"), function.named_local("mv_step", "i32")
    emitter.open_scope()
    for axis, extent, local in zip(column_axes, column_extents,
                                   unflatten_into(emitter, column_extents, f"(local.get {column0})", "xw", indent)):
        emitter.declare_axis(axis, extent, local)
    first_step = tuple(substitute(index, {info.reduce_axes[0].name: IntImm(0)}) for index in info.b.indices)
    emit(indent, f"(local.set {weight} {emitter.element_address(info.b.buffer, first_step)})")
    emit(indent, f"(local.set {step} (i32.shl {emitter.index(direct_columns(info, program))} (i32.const 2)))")
    emitter.close_scope()
    row = function.named_local("mv_row", "i32")
    emit(indent, f"(local.set {row} (i32.const 0))")
    emit(indent, "(block $matvec_rows_done")
    emit(indent, f"  (br_if $matvec_rows_done (i32.ge_u (local.get {row}) (local.get $rows)))")
    emit(indent, "  (loop $matvec_row")
    inner = indent + "    "
    _matvec_sums(function, row, weight, step, width, inner)
    _matvec_outputs(emitter, info, program, row_axes, row_extents, column_axes, column_extents, row, column0, width,
                    inner)
    emit(inner, f"(local.set {row} (i32.add (local.get {row}) (i32.const 1)))")
    emit(inner, f"(br_if $matvec_row (i32.lt_u (local.get {row}) (local.get $rows)))))")


def _dot_unit(emitter: Emitter, info: MatmulInfo, program: TensorProgram, row_axes, row_extents, column_axes,
              column_extents, column0: str, width: str, indent: str) -> None:
    """One unit of the matrix-vector form when the second factor's columns are contiguous
    along the reduction (:func:`dot_columns`): per row, the row of the first factor packed
    contiguously (``scratch + MATVEC_SUMS_BYTES``, its prologue evaluated once per element),
    then each column's sum a dot product of the two runs (:func:`_dot_sums`) into the
    scratch's sums, then the epilogue of each (:func:`_matvec_outputs`)."""
    function, emit = emitter.function, emitter.function.emit
    panel = f"(i32.add (local.get $scratch) (i32.const {MATVEC_SUMS_BYTES}))"
    row = function.named_local("mv_row", "i32")
    emit(indent, f"(local.set {row} (i32.const 0))")
    emit(indent, "(block $dot_rows_done")
    emit(indent, f"  (br_if $dot_rows_done (i32.ge_u (local.get {row}) (local.get $rows)))")
    emit(indent, "  (loop $dot_row")
    inner = indent + "    "
    emit(inner, ";; this row of the first factor, contiguous along the reduction")
    _pack(emitter, info, info.a, row_axes, row_extents, f"(local.get {row})", "(local.get $rows)", 1, panel, inner)
    _dot_sums(emitter, info, column_axes, column_extents, column0, width, inner)
    _matvec_outputs(emitter, info, program, row_axes, row_extents, column_axes, column_extents, row, column0, width,
                    inner)
    emit(inner, f"(local.set {row} (i32.add (local.get {row}) (i32.const 1)))")
    emit(inner, f"(br_if $dot_row (i32.lt_u (local.get {row}) (local.get $rows)))))")


DOT_COLUMNS = 4  # columns whose dot products share each load of the packed row


def _dot_sums(emitter: Emitter, info: MatmulInfo, column_axes, column_extents, column0: str, width: str,
              indent: str) -> None:
    """The dot products of the packed row with the unit's ``width`` columns, into the
    scratch's sums: :data:`DOT_COLUMNS` columns at a time (one f32x4 sum each, four
    reduction steps per load, the packed row's load shared), then the rest one at a time;
    the steps past the last whole four added one by one, each sum's lanes added at the end."""
    function, emit = emitter.function, emitter.function.emit
    column, column_end, k, vector_depth, a = (function.named_local(name, "i32") for name in (
        "dot_column", "dot_column_end", "dot_k", "dot_vector_depth", "dot_a"))
    first_step = {axis.name: IntImm(0) for axis in info.reduce_axes}
    emit(indent, f"(local.set {column} (local.get {column0}))")
    emit(indent, f"(local.set {column_end} (i32.add (local.get {column0}) (local.get {width})))")
    emit(indent, f"(local.set {vector_depth} (i32.and (local.get $depth) (i32.const -4)))")
    for count, label in ((DOT_COLUMNS, "dot_group"), (1, "dot_single")):
        addresses = [function.named_local(f"dot_b{c}", "i32") for c in range(count)]
        sums = [function.named_local(f"dot_sum{c}", "v128") for c in range(count)]
        tails = [function.named_local(f"dot_tail{c}", "f32") for c in range(count)]
        emit(indent, f";; {count} column{'s' if count > 1 else ''} at a time")
        emit(indent, f"(block ${label}_done")
        emit(indent, f"  (loop ${label}")
        body = indent + "    "
        emit(body, f"(br_if ${label}_done (i32.gt_u (i32.add (local.get {column}) (i32.const {count})) "
                   f"(local.get {column_end})))")
        for c, address in enumerate(addresses):
            emitter.open_scope()
            linear = f"(i32.add (local.get {column}) (i32.const {c}))" if c else f"(local.get {column})"
            for axis, extent, local in zip(column_axes, column_extents,
                                           unflatten_into(emitter, column_extents, linear, f"xq{c}_", body)):
                emitter.declare_axis(axis, extent, local)
            indices = tuple(substitute(index, first_step) for index in info.b.indices)
            emit(body, f"(local.set {address} {emitter.element_address(info.b.buffer, indices)})")
            emitter.close_scope()
        for total in sums:
            emit(body, f"(local.set {total} (v128.const i32x4 0 0 0 0))")
        for tail in tails:
            emit(body, f"(local.set {tail} (f32.const 0))")
        emit(body, f"(local.set {a} (i32.add (local.get $scratch) (i32.const {MATVEC_SUMS_BYTES})))")
        emit(body, f"(local.set {k} (i32.const 0))")
        emit(body, f"(block ${label}_vectors_done")
        emit(body, f"  (br_if ${label}_vectors_done (i32.ge_u (local.get {k}) (local.get {vector_depth})))")
        emit(body, f"  (loop ${label}_vectors")
        step = body + "    "
        emit(step, f"(local.set $dot_row_vector (v128.load (local.get {a})))")
        function.named_local("dot_row_vector", "v128")
        for total, address in zip(sums, addresses):
            emit(step, f"(local.set {total} (f32x4.add (local.get {total}) (f32x4.mul (local.get $dot_row_vector) "
                       f"(v128.load (local.get {address})))))")
            emit(step, f"(local.set {address} (i32.add (local.get {address}) (i32.const 16)))")
        emit(step, f"(local.set {a} (i32.add (local.get {a}) (i32.const 16)))")
        emit(step, f"(local.set {k} (i32.add (local.get {k}) (i32.const 4)))")
        emit(step, f"(br_if ${label}_vectors (i32.lt_u (local.get {k}) (local.get {vector_depth})))))")
        emit(body, f"(block ${label}_steps_done")
        emit(body, f"  (br_if ${label}_steps_done (i32.ge_u (local.get {k}) (local.get $depth)))")
        emit(body, f"  (loop ${label}_steps")
        for tail, address in zip(tails, addresses):
            emit(step, f"(local.set {tail} (f32.add (local.get {tail}) (f32.mul (f32.load (local.get {a})) "
                       f"(f32.load (local.get {address})))))")
            emit(step, f"(local.set {address} (i32.add (local.get {address}) (i32.const 4)))")
        emit(step, f"(local.set {a} (i32.add (local.get {a}) (i32.const 4)))")
        emit(step, f"(local.set {k} (i32.add (local.get {k}) (i32.const 1)))")
        emit(step, f"(br_if ${label}_steps (i32.lt_u (local.get {k}) (local.get $depth)))))")
        for c, (total, tail) in enumerate(zip(sums, tails)):
            lanes = [f"(f32x4.extract_lane {lane} (local.get {total}))" for lane in range(4)]
            emit(body, f"(f32.store offset={4 * c} (i32.add (local.get $scratch) (i32.shl (i32.sub (local.get {column}) "
                       f"(local.get {column0})) (i32.const 2)))")
            emit(body, f"  (f32.add (f32.add (f32.add {lanes[0]} {lanes[1]}) (f32.add {lanes[2]} {lanes[3]})) "
                       f"(local.get {tail})))")
        emit(body, f"(local.set {column} (i32.add (local.get {column}) (i32.const {count})))")
        emit(body, f"(br ${label})))")


def _matvec_sums(function: Function, row: str, weight: str, step: str, width: str, indent: str) -> None:
    """The sums of row ``row`` over the unit's ``width`` columns, into the scratch (one f32
    per column from ``$scratch``).  :data:`MATVEC_STEPS` reduction steps at a time while as
    many remain (one splat of the packed first factor per step, the second factor's rows read
    in order, four columns per f32x4, a sum loaded and stored once per four products), then
    one step at a time; columns beyond the last whole f32x4 are summed one by one (a
    ``v128.load`` past a row's end could leave the buffer)."""
    emit = function.emit
    names = ("mv_k", "mv_a", "mv_w", "mv_sum", "mv_vector_end", "mv_end")
    k, a, w, sum_, vector_end, end = (function.named_local(name, "i32") for name in names)
    emit(indent, f"(local.set {vector_end} (i32.add (local.get $scratch) (i32.shl (i32.shr_u (local.get {width}) "
                 f"(i32.const 2)) (i32.const 4))))")
    emit(indent, f"(local.set {end} (i32.add (local.get $scratch) (i32.shl (local.get {width}) (i32.const 2))))")
    emit(indent, ";; the sums start at 0 (whole f32x4: the lanes past the width are never stored)")
    emit(indent, f"(local.set {sum_} (local.get $scratch))")
    emit(indent, "(block $mv_zeroed")
    emit(indent, f"  (br_if $mv_zeroed (i32.ge_u (local.get {sum_}) (local.get {end})))")
    emit(indent, "  (loop $mv_zero")
    emit(indent, f"    (v128.store (local.get {sum_}) (v128.const i32x4 0 0 0 0))")
    emit(indent, f"    (local.set {sum_} (i32.add (local.get {sum_}) (i32.const 16)))")
    emit(indent, f"    (br_if $mv_zero (i32.lt_u (local.get {sum_}) (local.get {end})))))")
    emit(indent, f"(local.set {a} (i32.add (local.get $scratch) (i32.add (i32.const {MATVEC_SUMS_BYTES}) "
                 f"(i32.shl (local.get {row}) (i32.const 2)))))")
    emit(indent, f"(local.set {w} (local.get {weight}))")
    emit(indent, f"(local.set {k} (i32.const 0))")
    for steps, label in ((MATVEC_STEPS, "mv_steps"), (1, "mv_step")):
        factors = [function.named_local(f"mv_a{s}", "v128") for s in range(steps)]
        rows = [function.named_local(f"mv_w{s}", "i32") for s in range(steps)]
        emit(indent, f";; {steps} reduction step{'s' if steps > 1 else ''} at a time")
        emit(indent, f"(block ${label}_done")
        emit(indent, f"  (loop ${label}")
        inner = indent + "    "
        emit(inner, f"(br_if ${label}_done (i32.gt_u (i32.add (local.get {k}) (i32.const {steps})) (local.get $depth)))")
        for s, factor in enumerate(factors):
            emit(inner, f"(local.set {factor} (v128.load32_splat offset={4 * MATVEC_ROWS * s} (local.get {a})))")
        emit(inner, f"(local.set {rows[0]} (local.get {w}))")
        for s in range(1, steps):
            emit(inner, f"(local.set {rows[s]} (i32.add (local.get {rows[s - 1]}) (local.get {step})))")
        emit(inner, f"(local.set {sum_} (local.get $scratch))")
        emit(inner, f"(block ${label}_vectors_done")
        emit(inner, f"  (br_if ${label}_vectors_done (i32.ge_u (local.get {sum_}) (local.get {vector_end})))")
        emit(inner, f"  (loop ${label}_vectors")
        vector = "(v128.load (local.get {}))".format(sum_)
        for factor, source in zip(factors, rows):
            vector = f"(f32x4.add {vector} (f32x4.mul (local.get {factor}) (v128.load (local.get {source}))))"
        emit(inner, f"    (v128.store (local.get {sum_}) {vector})")
        for source in rows:
            emit(inner, f"    (local.set {source} (i32.add (local.get {source}) (i32.const 16)))")
        emit(inner, f"    (local.set {sum_} (i32.add (local.get {sum_}) (i32.const 16)))")
        emit(inner, f"    (br_if ${label}_vectors (i32.lt_u (local.get {sum_}) (local.get {vector_end})))))")
        emit(inner, f";; the columns past the last whole f32x4, one by one")
        emit(inner, f"(block ${label}_columns_done")
        emit(inner, f"  (br_if ${label}_columns_done (i32.ge_u (local.get {sum_}) (local.get {end})))")
        emit(inner, f"  (loop ${label}_columns")
        value = "(f32.load (local.get {}))".format(sum_)
        for s, source in enumerate(rows):
            value = (f"(f32.add {value} (f32.mul (f32x4.extract_lane 0 (local.get {factors[s]})) "
                     f"(f32.load (local.get {source}))))")
        emit(inner, f"    (f32.store (local.get {sum_}) {value})")
        for source in rows:
            emit(inner, f"    (local.set {source} (i32.add (local.get {source}) (i32.const 4)))")
        emit(inner, f"    (local.set {sum_} (i32.add (local.get {sum_}) (i32.const 4)))")
        emit(inner, f"    (br_if ${label}_columns (i32.lt_u (local.get {sum_}) (local.get {end})))))")
        emit(inner, f"(local.set {a} (i32.add (local.get {a}) (i32.const {4 * MATVEC_ROWS * steps})))")
        emit(inner, f"(local.set {w} (i32.add (local.get {w}) (i32.mul (local.get {step}) (i32.const {steps}))))"
             if steps > 1 else f"(local.set {w} (i32.add (local.get {w}) (local.get {step})))")
        emit(inner, f"(local.set {k} (i32.add (local.get {k}) (i32.const {steps})))")
        emit(inner, f"(br ${label})))")


def _matvec_outputs(emitter: Emitter, info: MatmulInfo, program: TensorProgram, row_axes, row_extents, column_axes,
                    column_extents, row: str, column0: str, width: str, indent: str) -> None:
    """A loop over the unit's ``width`` columns of row ``row`` (its axes recovered once):
    the epilogue of each sum in the scratch, stored."""
    function, emit = emitter.function, emitter.function.emit
    column, column_end = function.named_local("mv_column", "i32"), function.named_local("mv_column_end", "i32")
    emit(indent, f"(local.set {column} (local.get {column0}))")
    emit(indent, f"(local.set {column_end} (i32.add (local.get {column0}) (local.get {width})))")
    emitter.open_scope()
    for axis, extent, local in zip(row_axes, row_extents,
                                   unflatten_into(emitter, row_extents, f"(local.get {row})", "yv", indent)):
        emitter.declare_axis(axis, extent, local)
    emit(indent, "(block $mv_outputs_done")
    emit(indent, f"  (br_if $mv_outputs_done (i32.ge_u (local.get {column}) (local.get {column_end})))")
    emit(indent, "  (loop $mv_output")
    body = indent + "    "
    emitter.open_scope()
    for axis, extent, local in zip(column_axes, column_extents,
                                   unflatten_into(emitter, column_extents, f"(local.get {column})", "yw", body)):
        emitter.declare_axis(axis, extent, local)
    offset = emitter.index(flat_offset(program.output, tuple(program.axes)))
    address = emitter.set_local(emitter.address(program.output.name, offset), "i32", body, "address")
    emitter.known(info.reduction, f"(f32.load (i32.add (local.get $scratch) "
                                  f"(i32.shl (i32.sub (local.get {column}) (local.get {column0})) (i32.const 2))))")
    emit(body, store(program.output.dtype, address, emitter.scalar(program.body, body)))
    emitter.close_scope()
    emit(body, f"(local.set {column} (i32.add (local.get {column}) (i32.const 1)))")
    emit(body, f"(br_if $mv_output (i32.lt_u (local.get {column}) (local.get {column_end})))))")
    emitter.close_scope()


# -- sliding windows: a depthwise convolution, four output positions at a time ----------------

WINDOW_LANES = 8  # output positions of the main loop's iterations (two f32x4 sums: two chains of adds)
WINDOW_UNROLL = 8  # the longest innermost reduction of a constant extent unrolled
WINDOW_UNROLLED = (3, 5, 7)  # the run-time extents of the innermost reduction unrolled (kernel widths)
WINDOW_OVERREACH = 1024  # the most bytes a masked lane's load may lie from one inside the row (of 64 KiB of slack)


def window_form(program: TensorProgram) -> WindowInfo | None:
    """The program's sliding-window split (``relaxweb/ir/pattern.analyze_window``) when
    :func:`render_window` can run it: every float op of the body has an f32x4 form.  None
    otherwise."""
    info = analyze_window(program)
    if info is None:
        return None
    for node in scalar_nodes(program.body):
        if isinstance(node, Binary) and node.dtype == "float32" and node.op not in VECTOR_BINARY_RENDERINGS:
            return None
        if isinstance(node, Unary) and node.dtype == "float32" and node.op not in VECTOR_UNARY_RENDERINGS:
            return None
    return info


def _core_loads(info: WindowInfo) -> list[Load]:
    """The distinct loads of the window's core, in order."""
    return list(dict.fromkeys(node for node in scalar_nodes(info.core) if isinstance(node, Load)))


def render_window(program: TensorProgram, parts: Mapping[str, int], info: WindowInfo) -> str:
    """A sliding-window reduction (:func:`window_form`: a depthwise convolution and its fused
    epilogue), one unit per output row (every axis but the last), so threads split rows.

    Along a row, :data:`WINDOW_LANES` output positions per iteration in f32x4 sums, then
    four at a time; the last four end at the row's end (they may overlap the ones before:
    those are computed again, to the same values), and a row shorter than four runs the
    element form.  A unit's first row's axes come from its number by division, the next
    rows' by counting.  Where every guard holds over the whole window of the iteration's lanes
    (checked at the window's corners; the guards that do not read the row's axis once per
    row) the steps run without any test: the core's loads ``v128.load`` along the row (two
    loads and a shuffle at stride 2, lane by lane beyond), its other loads one
    ``v128.load32_splat`` shared by the sums (the weight), every address advanced by a
    constant per step of the innermost reduction axis.  Elsewhere (a padded border) each
    guard is checked at the outermost reduction loop whose axes it reads (a padded row
    skips its whole kernel row), and the guards along the row at the first and last lane:
    the vector step where they hold, the lanes one by one where not.  The epilogue
    (bias, relu, hard-swish, a residual add) runs on the vector sums."""
    signature, addresses = kernel_signature(program, parts)
    function = Function()
    indent = "  "
    emit = function.emit
    variables = load_size_vars(program, function, indent)
    emitter = Emitter(program, function, addresses, variables)
    shape = program.output.shape
    lane_axis, width = program.axes[-1], simplify(shape[-1])
    row_axes, row_extents = program.axes[:-1], [simplify(extent) for extent in shape[:-1]]
    width_local, row, x = (function.named_local(name, "i32") for name in ("width", "row", "x"))
    zero = function.named_local("zero", "i32")  # 0: wasm's locals start at 0 and this one is never set
    emit(indent, f"(local.set {width_local} {emitter.index(width)})")
    lasts = []
    for number, extent in enumerate(info.reduce_extents):
        last = function.named_local(f"k{number}_last", "i32")
        emit(indent, f"(local.set {last} {emitter.index(simplify(extent - 1))})")
        lasts.append(last)
    window = _Window(emitter, info, program, lane_axis, width, zero, lasts)
    emit(indent, f"(local.set {row} (local.get $first))")
    emit(indent, "(block $done")
    emit(indent, f"  (br_if $done (i32.ge_u (local.get {row}) (local.get $end)))")
    row_locals = unflatten_into(emitter, row_extents, f"(local.get {row})", "y", indent + "  ")
    emit(indent, "  (loop $row")
    inner = indent + "    "
    emitter.open_scope()
    for axis, extent, local in zip(row_axes, row_extents, row_locals):
        emitter.declare_axis(axis, extent, local)
    emit(inner, f"(local.set {x} (i32.const 0))")
    short = not (isinstance(width, IntImm) and width.value >= 4)
    if short:
        emit(inner, f"(if (i32.ge_s (local.get {width_local}) (i32.const 4))")
        emit(inner, "  (then")
    body = inner + "    " if short else inner
    emitter.open_scope()
    window.row_start(body)
    emit(body, "(block $wide_done")
    wide_fits = f"(i32.add (local.get {x}) (i32.const {WINDOW_LANES})) (local.get {width_local})"
    emit(body, f"  (br_if $wide_done (i32.gt_s {wide_fits}))")
    emit(body, "  (loop $wide")
    window.iteration(x, WINDOW_LANES, body + "    ")
    emit(body, f"    (local.set {x} (i32.add (local.get {x}) (i32.const {WINDOW_LANES})))")
    emit(body, f"    (br_if $wide (i32.le_s {wide_fits}))))")
    emit(body, "(block $narrow_done")
    emit(body, f"  (br_if $narrow_done (i32.ge_s (local.get {x}) (local.get {width_local})))")
    emit(body, "  (loop $narrow")
    emit(body, f"    (local.set {x} (call $min_s_i32 (local.get {x}) "
               f"(i32.sub (local.get {width_local}) (i32.const 4))))")
    window.iteration(x, 4, body + "    ")
    emit(body, f"    (local.set {x} (i32.add (local.get {x}) (i32.const 4)))")
    emit(body, f"    (br_if $narrow (i32.lt_s (local.get {x}) (local.get {width_local})))))")
    emitter.close_scope()
    if short:  # fewer than four positions: each on its own
        function.lines[-1] += ")"
        emit(inner, "  (else")
        emit(inner, "    (block $single_done")
        emit(inner, f"      (br_if $single_done (i32.ge_s (local.get {x}) (local.get {width_local})))")
        emit(inner, "      (loop $single")
        single = inner + "        "
        emitter.open_scope()
        emitter.declare_axis(lane_axis, width, x)
        offset = emitter.index(flat_offset(program.output, tuple(program.axes)))
        emit(single, store(program.output.dtype, emitter.address(program.output.name, offset),
                           emitter.scalar(program.body, single)))
        emitter.close_scope()
        emit(single, f"(local.set {x} (i32.add (local.get {x}) (i32.const 1)))")
        emit(single, f"(br_if $single (i32.lt_s (local.get {x}) (local.get {width_local})))))))")
    emitter.close_scope()
    # the next row's axes: the last one up by one, carried into the ones before (no division)
    depth = inner
    for position in reversed(range(len(row_locals))):
        local = row_locals[position]
        emit(depth, f"(local.set {local} (i32.add (local.get {local}) (i32.const 1)))")
        if position == 0:
            break
        emit(depth, f"(if (i32.eq (local.get {local}) {emitter.index(row_extents[position])})")
        emit(depth, f"  (then (local.set {local} (i32.const 0))")
        depth += "    "
    function.lines[-1] += ")" * (2 * max(len(row_locals) - 1, 0))
    emit(inner, f"(local.set {row} (i32.add (local.get {row}) (i32.const 1)))")
    emit(inner, f"(br_if $row (i32.lt_u (local.get {row}) (local.get $end)))))")
    units = Function()
    unit_variables = load_size_vars(program, units, "  ")
    lowering = IndexLowering()
    rows = render_index(lowering.lower(simplify(product(row_extents))), lambda name: f"(local.get {unit_variables[name]})")
    units.emit("  ", rows)
    return "\n".join([*comment(program), function.text(f"$main {signature}"),
                      units.text(f"$units (param {PARAMS} i32) (result i32)")])


class _Window:
    """The statements of :func:`render_window`'s iterations over one row (see there)."""

    def __init__(self, emitter: Emitter, info: WindowInfo, program: TensorProgram, lane_axis: SizeVar,
                 width: PrimExpr, zero: str, lasts: list[str]) -> None:
        self.emitter, self.info, self.program = emitter, info, program
        self.function = emitter.function
        self.lane_axis, self.width, self.zero, self.lasts = lane_axis, width, zero, lasts
        self.strides = dict(info.strides)
        self.loads = _core_loads(info)
        self.along = [g for g in info.guards if depends_on(g, lane_axis.name)]  # guards read per lane
        self.fixed = [g for g in info.guards if not depends_on(g, lane_axis.name)]  # the same for a whole row
        self.row_inside = self.function.named_local("row_inside", "i32")
        self.epilogue_splats: dict[ScalarExpr, str] = {}
        self.repeated_core = repeated_subexpressions(info.core)
        # a sum starts at 0 (as before: the same kernel text), a max (min) pool at -inf (inf);
        # a lane outside the padding's guards adds that start (``_neutral``: a skipped step)
        if info.combiner is ReduceCombiner.SUM:
            self.start, self.skipped = "(v128.const i32x4 0 0 0 0)", "(f32.const 0)"
        else:
            self.skipped = reduce_identity(info.combiner, "float32")
            self.start = f"(f32x4.splat {self.skipped})"
        self.combine = VECTOR_COMBINER_RENDERINGS[info.combiner]

    def row_start(self, indent: str) -> None:
        """Once per row: whether the guards that do not read the row's axis hold over the
        whole window, and the splats of the epilogue's loads that do not read it (a bias)."""
        emitter = self.emitter
        self.function.emit(indent, f"(local.set {self.row_inside} {self.corners(self.fixed, [], indent)})")
        self.epilogue_splats = {}
        for node in _epilogue_loads(self.program.body, self.info.reduction):
            if not depends_on(node, self.lane_axis.name) and node not in self.epilogue_splats:
                value = emitter.scalar(node, indent)
                self.epilogue_splats[node] = emitter.set_local(f"(f32x4.splat {value})", "v128", indent, "splat")

    def corners(self, guards: list[ScalarExpr], lanes: list[str], indent: str) -> str:
        """An i32 WAT value, nonzero when each guard holds at every corner of the window: each
        reduction axis it reads at 0 and at its extent - 1, and the row's axis (where it reads
        it) at each local of ``lanes`` (the first and the last lane).  A guard moves by a
        constant per step of each (``analyze_window``), so it then holds over the whole box."""
        emitter, info = self.emitter, self.info
        conditions = []
        for guard in guards:
            reads = [n for n, axis in enumerate(info.reduce_axes) if depends_on(guard, axis.name)]
            corners: list[list[tuple[int, bool]]] = [[]]
            for n in reads:
                corners = [[*corner, (n, end)] for corner in corners for end in (False, True)]
            for lane in (lanes if depends_on(guard, self.lane_axis.name) else [None]):
                for corner in corners:
                    emitter.open_scope()
                    if lane is not None:
                        emitter.declare_axis(self.lane_axis, self.width, lane)
                    for n, end in corner:
                        emitter.declare_axis(info.reduce_axes[n], info.reduce_extents[n],
                                             self.lasts[n] if end else self.zero)
                    conditions.append(emitter.scalar(guard, indent))
                    emitter.close_scope()
        if not conditions:
            return "(i32.const 1)"
        inside = conditions[0]
        for condition in conditions[1:]:
            inside = f"(i32.and {inside} {condition})"
        return inside

    def iteration(self, x: str, lanes: int, indent: str) -> None:
        """The statements computing and storing the outputs at positions ``x`` ..
        ``x + lanes - 1`` of the row (all inside it)."""
        emitter, function, emit, info = self.emitter, self.function, self.function.emit, self.info
        lane_locals = [x] + [function.named_local(f"x{n}", "i32") for n in range(1, lanes)]
        for n in range(1, lanes):
            emit(indent, f"(local.set {lane_locals[n]} (i32.add (local.get {x}) (i32.const {n})))")
        sums = [function.named_local(f"sum{q}", "v128") for q in range(lanes // 4)]
        for local in sums:
            emit(indent, f"(local.set {local} {self.start})")
        emitter.open_scope()
        emitter.declare_axis(self.lane_axis, self.width, x)
        emitter.open_scope()  # each load's address at the first lane and the first step
        for axis, extent in zip(info.reduce_axes, info.reduce_extents):
            emitter.declare_axis(axis, extent, self.zero)
        bases = {}
        for number, load in enumerate(self.loads):
            bases[load] = function.named_local(f"base{number}", "i32")
            emit(indent, f"(local.set {bases[load]} {emitter.element_address(load.buffer, load.indices)})")
        emitter.close_scope()
        inside = self.corners(self.along, [x, lane_locals[-1]], indent)
        if info.guards:
            emit(indent, f"(if (i32.and (local.get {self.row_inside}) {inside})")
            emit(indent, "  (then")
            self.steps(bases, lane_locals, sums, False, indent + "    ")
            function.lines[-1] += ")"
            emit(indent, "  (else")
            self.steps(bases, lane_locals, sums, True, indent + "    ")
            function.lines[-1] += "))"
        else:
            self.steps(bases, lane_locals, sums, False, indent)
        output = emitter.address(self.program.output.name,
                                 emitter.index(flat_offset(self.program.output, tuple(self.program.axes))))
        address = emitter.set_local(output, "i32", indent, "address")
        for q, local in enumerate(sums):
            splats = {**self.epilogue_splats, info.reduction: f"(local.get {local})"}
            if q:  # the epilogue's loads along the row at this sum's four positions
                emitter.open_scope()
                emitter.declare_axis(self.lane_axis, self.width, lane_locals[4 * q])
            value = emitter.vector_value(self.program.body, splats, {}, indent)
            if q:
                emitter.close_scope()
            emit(indent, f"(v128.store offset={16 * q} {address} {value})")
        emitter.close_scope()

    def steps(self, bases: Mapping[Load, str], lane_locals: list[str], sums: list[str], guarded: bool,
              indent: str) -> None:
        """The reduction's loops adding the core at every step into ``sums``, from the loads'
        addresses at the first step (``bases``); ``guarded``: each guard checked (see
        :func:`render_window`), else none."""
        levels: dict[int, list[ScalarExpr]] = {}
        if guarded:
            for guard in self.fixed:
                reads = [n for n, axis in enumerate(self.info.reduce_axes) if depends_on(guard, axis.name)]
                levels.setdefault(max(reads, default=-1), []).append(guard)
        emit = self.function.emit
        emit(indent, "(block $window")
        for guard in levels.get(-1, []):
            emit(indent + "  ", f"(br_if $window (i32.eqz {self.emitter.scalar(guard, indent + '  ')}))")
        self.level(0, dict(bases), lane_locals, sums, guarded, levels, indent + "  ")
        self.function.lines[-1] += ")"

    def step_of(self, load: Load, axis: SizeVar) -> PrimExpr:
        """How many elements ``load`` moves per step of the reduction axis ``axis``."""
        moved = tuple(substitute(index, {axis.name: axis + 1}) for index in load.indices)
        return simplify(flat_offset(load.buffer, moved) - flat_offset(load.buffer, load.indices))

    def level(self, number: int, addresses: dict[Load, str], lane_locals: list[str], sums: list[str], guarded: bool,
              levels: Mapping[int, list[ScalarExpr]], indent: str) -> None:
        """The loop over reduction axis ``number`` and the ones inside it (``addresses``: each
        load's address at the current step of the outer axes and the first of the rest).
        An address moves by a step free of index variables (a constant, a row's length) by
        one add per step, else it is computed at each step.  Unguarded, the innermost axis
        is unrolled where each address moves by a constant (one ``offset=`` per step): at
        a constant extent up to :data:`WINDOW_UNROLL`, else for the extents of
        :data:`WINDOW_UNROLLED` (3x3, 5x5, 7x7 kernels), chosen at run time."""
        emitter, function, emit, info = self.emitter, self.function, self.function.emit, self.info
        if number == len(info.reduce_axes):
            if guarded and self.along:
                self.guarded_step(lane_locals, sums, addresses, indent)
            else:
                self.vector_step(sums, addresses, {}, indent)
            return
        axis, extent = info.reduce_axes[number], simplify(info.reduce_extents[number])
        emitter.open_scope()
        if extent == IntImm(1):
            emitter.declare_axis(axis, extent, self.zero)
            for guard in levels.get(number, []):
                emit(indent, f"(br_if $window (i32.eqz {emitter.scalar(guard, indent)}))")
            self.level(number + 1, addresses, lane_locals, sums, guarded, levels, indent)
            emitter.close_scope()
            return
        names = index_var_names(self.program)
        steps = {load: self.step_of(load, axis) for load in self.loads}
        # lists in the loads' order (not sets: the kernel text must not depend on hashing)
        moving = [load for load in self.loads if steps[load] != IntImm(0)]
        computed = [load for load in moving if any(var.name in names for var in free_vars(steps[load]))]
        innermost = number == len(info.reduce_axes) - 1
        constant_steps = {load: as_int(step) for load, step in steps.items()}
        offsets_fit = all(v is not None and v >= 0 for v in constant_steps.values())  # offset= immediates
        if innermost and not guarded and not computed and offsets_fit:
            known = as_int(extent)
            if known is not None and known <= WINDOW_UNROLL:
                self.unrolled(known, addresses, constant_steps, sums, indent)
                emitter.close_scope()
                return
            if known is None:
                for count in WINDOW_UNROLLED:
                    emit(indent, f"(if (i32.eq {emitter.index(extent)} (i32.const {count}))")
                    emit(indent, "  (then")
                    self.unrolled(count, addresses, constant_steps, sums, indent + "    ")
                    function.lines[-1] += ")"
                    emit(indent, "  (else")
                    indent += "    "
                self.loop(number, addresses, moving, computed, steps, lane_locals, sums, guarded, levels, indent)
                for _ in WINDOW_UNROLLED:
                    indent = indent[:-4]
                    function.lines[-1] += "))"
                emitter.close_scope()
                return
        self.loop(number, addresses, moving, computed, steps, lane_locals, sums, guarded, levels, indent)
        emitter.close_scope()

    def loop(self, number: int, addresses: dict[Load, str], moving, computed, steps, lane_locals: list[str],
             sums: list[str], guarded: bool, levels: Mapping[int, list[ScalarExpr]], indent: str) -> None:
        """:meth:`level`'s loop over reduction axis ``number`` (in the scope it opened)."""
        emitter, function, emit, info = self.emitter, self.function, self.function.emit, self.info
        axis, extent = info.reduce_axes[number], info.reduce_extents[number]
        inner = dict(addresses)
        for load in moving:
            inner[load] = function.local("at", "i32")
            if load not in computed:
                emit(indent, f"(local.set {inner[load]} (local.get {addresses[load]}))")
        local, end = function.local("k", "i32"), function.local("k_end", "i32")
        label = local[1:]
        emit(indent, f"(local.set {end} {emitter.index(extent)})")
        emit(indent, f"(local.set {local} (i32.const 0))")
        emit(indent, f"(block $done_{label}")
        emit(indent, f"  (br_if $done_{label} (i32.ge_s (local.get {local}) (local.get {end})))")
        emit(indent, f"  (loop $step_{label}")
        emit(indent, f"    (block $next_{label}")
        depth = indent + "      "
        emitter.declare_axis(axis, extent, local)
        if computed:  # at this step and the first of the axes inside
            emitter.open_scope()
            for inner_axis, inner_extent in zip(info.reduce_axes[number + 1:], info.reduce_extents[number + 1:]):
                emitter.declare_axis(inner_axis, inner_extent, self.zero)
            for load in self.loads:
                if load in computed:
                    emit(depth, f"(local.set {inner[load]} {emitter.element_address(load.buffer, load.indices)})")
            emitter.close_scope()
        for guard in levels.get(number, []):
            emit(depth, f"(br_if $next_{label} (i32.eqz {emitter.scalar(guard, depth)}))")
        self.level(number + 1, inner, lane_locals, sums, guarded, levels, depth)
        function.lines[-1] += ")"
        for load in moving:  # advanced also where a guard skipped the step
            if load not in computed:
                step = emitter.index(simplify(steps[load] * 4))
                emit(indent, f"    (local.set {inner[load]} (i32.add (local.get {inner[load]}) {step}))")
        emit(indent, f"    (local.set {local} (i32.add (local.get {local}) (i32.const 1)))")
        emit(indent, f"    (br_if $step_{label} (i32.lt_s (local.get {local}) (local.get {end})))))")

    def unrolled(self, count: int, addresses: Mapping[Load, str], steps: Mapping[Load, int], sums: list[str],
                 indent: str) -> None:
        """``count`` steps of the innermost axis, each load at a constant offset from its address."""
        for step in range(count):
            self.vector_step(sums, addresses, {load: 4 * steps[load] * step for load in self.loads}, indent)

    def vector_step(self, sums: list[str], addresses: Mapping[Load, str], offsets: Mapping[Load, int],
                    indent: str) -> None:
        """Each sum plus the core at its four positions: loads along the row from their
        addresses (plus ``offsets`` bytes), the rest (the weight) once for all sums."""
        shared: dict[ScalarExpr, str] = {}
        for q, local in enumerate(sums):
            value = self.core_vector(self.info.core, q, addresses, offsets, shared, {}, indent)
            self.function.emit(indent, f"(local.set {local} {self.combine(f'(local.get {local})', value)})")

    def core_vector(self, expr: ScalarExpr, q: int, addresses: Mapping[Load, str], offsets: Mapping[Load, int],
                    shared: dict, memo: dict, indent: str) -> str:
        """The f32x4 value of the core at the positions of sum ``q`` (lanes 4q .. 4q + 3)."""
        lane_free = not depends_on(expr, self.lane_axis.name)
        cache = shared if lane_free else memo
        if expr in cache:
            return cache[expr]
        if isinstance(expr, Load):
            address, at = f"(local.get {addresses[expr]})", offsets.get(expr, 0)
            stride = self.strides.get(expr)
            if stride is None:
                text = f"(v128.load32_splat offset={at} {address})"
            elif stride == 1:
                text = f"(v128.load offset={at + 16 * q} {address})"
            elif stride == 2:  # elements 0, 2 of the first four and 4, 6 (lanes 1, 3) of the four from 3
                text = (f"(i8x16.shuffle 0 1 2 3 8 9 10 11 20 21 22 23 28 29 30 31 "
                        f"(v128.load offset={at + 32 * q} {address}) (v128.load offset={at + 32 * q + 12} {address}))")
            else:
                text = f"(f32x4.splat (f32.load offset={at + 16 * stride * q} {address}))"
                for n in range(1, 4):
                    text = f"(f32x4.replace_lane {n} {text} (f32.load offset={at + 4 * stride * (4 * q + n)} {address}))"
        elif isinstance(expr, FloatImm):
            text = f"(f32x4.splat {literal(expr.value, expr.dtype)})"
        elif isinstance(expr, Binary):
            a = self.core_vector(expr.a, q, addresses, offsets, shared, memo, indent)
            b = self.core_vector(expr.b, q, addresses, offsets, shared, memo, indent)
            text = VECTOR_BINARY_RENDERINGS[expr.op](a, b)
        elif isinstance(expr, Unary):
            text = VECTOR_UNARY_RENDERINGS[expr.op](self.core_vector(expr.a, q, addresses, offsets, shared, memo, indent))
        else:
            raise TypeError(f"{self.program.name}: cannot vectorize {type(expr).__name__} along a row")
        if (lane_free and not isinstance(expr, FloatImm)) or expr in self.repeated_core:  # once for all sums
            text = self.emitter.set_local(text, "v128", indent, "core")
        cache[expr] = text
        return text

    def core_scalar(self, expr: ScalarExpr, lane: int, addresses: Mapping[Load, str], memo: dict, indent: str) -> str:
        """The f32 value of the core at lane ``lane``, its loads from their addresses."""
        if expr in memo:
            return memo[expr]
        if isinstance(expr, Load):
            text = f"(f32.load offset={4 * self.strides.get(expr, 0) * lane} (local.get {addresses[expr]}))"
        elif isinstance(expr, FloatImm):
            text = literal(expr.value, expr.dtype)
        elif isinstance(expr, Binary):
            a, b = (self.core_scalar(side, lane, addresses, memo, indent) for side in (expr.a, expr.b))
            text = rendering(BINARY_RENDERINGS, expr.op, "f")(a, b)
        else:
            assert isinstance(expr, Unary)
            text = rendering(UNARY_RENDERINGS, expr.op, "f")(self.core_scalar(expr.a, lane, addresses, memo, indent))
        if expr in self.repeated_core:
            text = self.emitter.set_local(text, "f32", indent, "lane_value")
        memo[expr] = text
        return text

    def guarded_step(self, lane_locals: list[str], sums: list[str], addresses: Mapping[Load, str], indent: str) -> None:
        """A step at a border.  Where the guards along the row hold at the first and the last
        lane: the vector step.  Where they hold at one of them: the vector step with the
        lanes where a guard fails masked to 0 (their loads read a few elements before or
        past the row, at most :data:`WINDOW_OVERREACH` bytes from a lane that is inside:
        within the linear memory, whose first 64 KiB are no buffer and which has 64 KiB of
        slack after the last one; the values are dropped, so garbage and NaN do no harm).
        Elsewhere each lane's core where its guards hold (its loads at their lane's offset
        from the addresses), else 0."""
        emitter, function, emit = self.emitter, self.function, self.function.emit

        def holds(lane: str) -> str:
            emitter.open_scope()
            emitter.declare_axis(self.lane_axis, self.width, lane)
            conditions = [emitter.scalar(guard, indent) for guard in self.along]
            emitter.close_scope()
            inside = conditions[0]
            for condition in conditions[1:]:
                inside = f"(i32.and {inside} {condition})"
            return inside

        first, last = (emitter.set_local(holds(lane), "i32", indent, "holds")
                       for lane in (lane_locals[0], lane_locals[-1]))
        emit(indent, f"(if (i32.and {first} {last})")
        emit(indent, "  (then")
        self.vector_step(sums, addresses, {}, indent + "    ")
        function.lines[-1] += ")"
        emit(indent, "  (else")
        depth = indent + "    "
        reach = 4 * max(self.strides.values()) * len(lane_locals) + 16
        if reach <= WINDOW_OVERREACH:
            emit(depth, f"(if (i32.or {first} {last})")
            emit(depth, "  (then")
            self.masked_step(sums, addresses, depth + "    ")
            function.lines[-1] += ")"
            emit(depth, "  (else")
            depth += "    "
        for q, local in enumerate(sums):
            values = []
            for n in range(4 * q, 4 * q + 4):
                value = function.local("lane_value", "f32")
                emit(depth, f"(local.set {value} {self.skipped})")
                emit(depth, f"(if {holds(lane_locals[n])}")
                emit(depth, "  (then")
                core = self.core_scalar(self.info.core, n, addresses, {}, depth + "    ")
                emit(depth, f"    (local.set {value} {core})))")
                values.append(f"(local.get {value})")
            vector = f"(f32x4.splat {values[0]})"
            for n in range(1, 4):
                vector = f"(f32x4.replace_lane {n} {vector} {values[n]})"
            emit(depth, f"(local.set {local} {self.combine(f'(local.get {local})', vector)})")
        if reach <= WINDOW_OVERREACH:
            function.lines[-1] += "))"
        function.lines[-1] += "))"

    def masked_step(self, sums: list[str], addresses: Mapping[Load, str], indent: str) -> None:
        """Each sum plus the core at its four positions, and-ed with the lanes where every
        guard along the row holds: a guard ``a op b`` is ``a - b op 0``, and ``a - b`` moves
        by a constant per lane (an i32x4 compare of its four values)."""
        emitter, emit = self.emitter, self.function.emit
        differences = []
        for guard in self.along:
            difference = simplify(guard.a.value - guard.b.value)
            per_lane = as_int(simplify(substitute(difference, {self.lane_axis.name: self.lane_axis + 1}) - difference))
            value = emitter.set_local(emitter.index(difference), "i32", indent, "difference")
            differences.append((guard.op, emitter.set_local(f"(i32x4.splat {value})", "v128", indent, "differences"),
                                per_lane))
        shared: dict[ScalarExpr, str] = {}
        for q, local in enumerate(sums):
            mask = None
            for op, splat, per_lane in differences:
                lanes = " ".join(str(per_lane * n) for n in range(4 * q, 4 * q + 4))
                test = (f"(i32x4.{op.value}_s (i32x4.add {splat} (v128.const i32x4 {lanes})) "
                        f"(v128.const i32x4 0 0 0 0))")
                mask = test if mask is None else f"(v128.and {mask} {test})"
            value = self.core_vector(self.info.core, q, addresses, {}, shared, {}, indent)
            if self.info.combiner is ReduceCombiner.SUM:
                masked = f"(v128.and {value} {mask})"
            else:  # the masked lanes the identity (-inf for a max)
                masked = f"(v128.bitselect {value} (f32x4.splat {self.skipped}) {mask})"
            emit(indent, f"(local.set {local} {self.combine(f'(local.get {local})', masked)})")


def _epilogue_loads(expr: ScalarExpr, reduction: Reduce) -> list[Load]:
    """The loads of ``expr`` outside ``reduction``."""
    if expr == reduction:
        return []
    if isinstance(expr, Load):
        return [expr]
    return [load for child in scalar_children(expr) for load in _epilogue_loads(child, reduction)]
