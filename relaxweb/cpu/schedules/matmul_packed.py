"""The ``packed_matmul`` kind (``PackedMatmulSchedule``) as a tier of a matmul kernel
(``matmul.py``): while the reduction has at most ``max_depth`` steps, units of ``$group``
panels of ``panel_rows`` rows (per batch index, :func:`panel_group`), for every column or,
splitting a weight's columns (``split_columns``), a slice of them.

A unit packs the first factor once, panel after panel ([K x panel_rows] each, in strips of
four rows: ``packing.PackLayout``); for each block of ``panel_columns`` columns it packs the
second (copied a step at a time where it is contiguous along the columns:
``matmul_layout.direct_columns``; gathered where its columns are a constant distance apart:
``gathered_columns``; else element by element), and for each panel micro-kernels of
``micro_rows`` rows sum the block into the scratch's sums, ``chunk`` steps at a time, and
loops over the block's elements apply the epilogue (four columns at a time where it has an
f32x4 form: ``factor_forms.vector_columns``).  The scratch holds the first factor's panels
(``panel_bytes``), then the second's panel, then the sums.

A call runs its consecutive units together where they share a factor: the row groups of one
batch index while their panels fit ``panel_bytes`` (the second factor packed once for all of
them), the column slices of one row group (the rows packed once).  The units stay as many as
the threads need; one thread, which calls every unit at once, packs each factor the fewest
times (BERT-base took 0.77x its time in V8: its GELU down-projection packed the weight for
each of 4 row groups, its layer-normed projections the rows for each of 8 column slices).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from ...ir.access import flat_offset, reads
from ...ir.matmul_layout import direct_columns, flat_columns, gathered_columns, gathered_stride
from ...ir.pattern import MatmulInfo
from ...ir.symbolic import IntImm, SizeVar, free_vars, product, simplify, substitute
from ...ir.tir import Load, TensorProgram
from ...ir.wasm_schedule import PackedMatmulSchedule
from ..emit import store
from ..relaxed_simd import multiply_add
from ..wat_builder import Body, add, call, const, div_u, get, mul, op, sub
from .common import declare_axes, unflatten_into
from .factor_forms import epilogue_nodes, vector_columns, vector_rows
from .matmul_kernel import MatmulKernel, Tier, UnitSizes
from .packing import pack


PREPACKED = "$prepacked"
"""The parameter of a kernel with a :class:`PrepackedFactor`, after the buffers' (the
contract's): the address of the call site's prepacked panels (0: none, pack per call)."""
PREPACKED_HEADER_BYTES = 16
"""A prepacked region's header: i32 0 nonzero once the panels are written (``prepack_main``),
i32 1 the region's bytes (written by the runtime when it lays the region out); the panels after."""


@dataclass(frozen=True)
class PrepackedFactor:
    """A packed matmul's second factor that a call site binding a weight to it may hold
    prepacked: input ``buffer`` read at the output's columns and the reduction's steps alone,
    each of its indices one of those axes or 0 (``kinds``: per dimension ``"column"``,
    ``"step"`` or ``"one"``).  Its panels are then the same for every row, batch index and
    run: a region of the memory holds them all, ``[ceil(N / panel_columns)][K][panel_columns]``
    floats after a header, written once (``kK_pack``, when the runtime loads the bundle) and
    read in place by the kernel's packed tier, instead of packing
    the factor again for every group of row panels of every call.  BERT-base's projections
    copied every weight's column blocks per call (32 bytes of each of its rows, the rows 3-12
    KB apart); read prepacked, the model took 0.94 of its time in V8.  ResNet-50's 3x3
    convolutions, whose weights are gathered four steps at a time, did not move."""

    buffer: str
    kinds: tuple[str, ...]
    panel_columns: int
    #: the packed tier's deepest reduction: a deeper weight is never read from panels
    max_depth: int
    #: the size variables the panels depend on (the factor's shape, the columns' and the
    #: reduction's extents): each must be a constant at a call site for it to pack at load
    size_vars: frozenset[str]

    def region_bytes(self, shape: Sequence[int]) -> int | None:
        """The bytes of a region holding the panels of a weight of ``shape`` (None where it
        does not fit the reading, a dimension indexed by 0 larger than 1, or its reduction
        is deeper than the packed tier runs)."""
        if len(shape) != len(self.kinds) or any(kind == "one" and size != 1 for kind, size in zip(self.kinds, shape)):
            return None
        depth = math.prod(size for kind, size in zip(self.kinds, shape) if kind == "step")
        columns = math.prod(size for kind, size in zip(self.kinds, shape) if kind == "column")
        if depth > self.max_depth:
            return None
        blocks = -(-columns // self.panel_columns)
        return PREPACKED_HEADER_BYTES + 4 * blocks * self.panel_columns * depth


def prepacked_factor(program: TensorProgram, info: MatmulInfo, schedule: PackedMatmulSchedule,
                     parts: Mapping[str, int]) -> PrepackedFactor | None:
    """The second factor of ``info`` (as ``schedule`` orients it) as a
    :class:`PrepackedFactor`, or None where it is not a float32 input of one part read at
    the column and reduction axes alone, each once."""
    b = info.b
    inputs = {buffer.name for buffer in program.inputs}
    if not isinstance(b, Load) or b.buffer.dtype != "float32" or b.buffer.name not in inputs:
        return None
    columns = {program.axes[position].name for position in info.columns}
    steps = {axis.name for axis in info.reduce_axes}
    kinds, seen = [], []
    for index in b.indices:
        if isinstance(index, SizeVar) and index.name in columns | steps:
            kinds.append("column" if index.name in columns else "step")
            seen.append(index.name)
        elif simplify(index) == IntImm(0):
            kinds.append("one")
        else:
            return None
    if sorted(seen) != sorted(columns | steps):
        return None
    extents = (*b.buffer.shape, *(program.output.shape[position] for position in info.columns), *info.reduce_extents)
    size_vars = frozenset(var.name for extent in extents for var in free_vars(extent))
    return PrepackedFactor(b.buffer.name, tuple(kinds), schedule.panel_columns, schedule.max_depth, size_vars)


def prepacked_block(depth: str) -> str:
    """The address of the prepacked panel of the block at ``$column0`` (a multiple of
    ``panel_columns``: the block's index times its ``depth * 4 * panel_columns`` bytes)."""
    return add(get(PREPACKED), add(const(PREPACKED_HEADER_BYTES), mul(get("$column0"), op("i32.shl", depth, const(2)))))


def prepacked_ready(body: Body) -> str:
    """Statements setting a local nonzero where the call site's prepacked panels of the
    second factor are written (:func:`prepack_main`); the local."""
    ready = body.named("prepacked_ready")
    body.comment("the call site's prepacked panels of the second factor, where written (prepack_main)")
    body.set(ready, const(0))
    with body.if_(get(PREPACKED)):
        with body.then():
            body.set(ready, op("i32.load", get(PREPACKED)))
    return ready


def prepack_main(kernel: MatmulKernel, schedule: PackedMatmulSchedule) -> None:
    """The body of ``$main_pack`` (exported as ``kK_pack``, the kernel's signature, returning
    i32), which the runtime calls once at load per call site with a region (``$prepacked``),
    on a params block whose size variables that the panels depend on are the call site's
    (the others 1): every block of the second factor packed into its panel
    (:func:`pack_second_factor`), then the header's flag set, and 1; 0 (nothing written)
    where there is no region, the reduction is deeper than the packed tier runs, or the
    region is too small."""
    body = kernel.body
    region = get(PREPACKED)
    blocks = div_u(add(get("$columns"), const(schedule.panel_columns - 1)), const(schedule.panel_columns))
    needed = add(const(PREPACKED_HEADER_BYTES), mul(mul(blocks, const(4 * schedule.panel_columns)), get("$depth")))
    body.comment("not without a region, nor deeper than the packed tier runs, nor beyond the region's bytes")
    with body.if_(op("i32.eqz", region)):
        with body.then():
            body.line("(return (i32.const 0))")
    with body.if_(op("i32.or", op("i32.eqz", packed_condition(schedule, get("$depth"))),
                     op("i32.gt_u", needed, f"(i32.load offset=4 {region})"))):
        with body.then():
            body.line("(return (i32.const 0))")
    body.set("$column0", const(0))
    with body.block("$prepacked"):
        body.br_if("$prepacked", op("i32.eqz", get("$columns")))
        with body.loop("$prepack"):
            pack_second_factor(kernel, schedule, prepacked_block(get("$depth")))
            body.increment("$column0", schedule.panel_columns)
            body.br_if("$prepack", op("i32.lt_u", get("$column0"), get("$columns")))
    body.store("i32.store", region, const(1))
    body.line("(i32.const 1)")


def packed_main(kernel: MatmulKernel, schedule: PackedMatmulSchedule) -> None:
    """The packed tier's part of ``$main``: where ``$depth <= max_depth``, units ``$first <=
    u < $end`` of ``$group`` panels (and a column slice), then return."""
    emitter, body = kernel.emitter, kernel.body
    unit, rows, columns, depth = get("$unit"), get("$rows"), get("$columns"), get("$depth")
    with body.if_(packed_condition(schedule, depth)):
        with body.then():
            group = body.named("group")
            split = schedule.split_columns
            batch_count = emitter.index(kernel.batch)
            if split:  # few rows of a weight's columns: units split the columns (:func:`split_slices`)
                slices, slice_columns = body.named("slices"), body.named("slice_columns")
                body.set(group, split_group(schedule, rows, depth, batch_count))
                body.set(slices, split_slices(schedule, rows, columns, get(group), batch_count))
                body.set(slice_columns, slice_width(schedule, columns, get(slices)))
            else:
                body.set(group, panel_group(schedule, rows, depth))
            taken, panels = body.named("taken"), body.named("unit_panels")
            with body.block("$packed_done"):
                body.br_if("$packed_done", op("i32.ge_u", unit, get("$end")))
                with body.loop("$panel"):
                    group_rows = mul(get(group), const(schedule.panel_rows))
                    row_groups = div_u(add(rows, sub(group_rows, const(1))), group_rows)
                    left = sub(get("$end"), unit)  # the call's units from this one on
                    span = None
                    body.set(panels, get(group))
                    if split:  # unit = (batch, row group, column slice), slices innermost
                        per_batch = mul(row_groups, get(slices))
                        first_column, stop = body.named("first_column"), body.named("column_stop")
                        body.comment("the call's next slices of this row group at once: the rows packed once for them")
                        body.set(taken, call("$min_u32", left, sub(get(slices), op("i32.rem_u", unit, get(slices)))))
                        body.set("$batch", div_u(unit, per_batch))
                        body.set("$row0", mul(div_u(op("i32.rem_u", unit, per_batch), get(slices)), group_rows))
                        body.set(first_column, mul(op("i32.rem_u", unit, get(slices)), get(slice_columns)))
                        body.set(stop, call("$min_u32", add(get(first_column), mul(get(taken), get(slice_columns))),
                                            columns))
                        span = (get(first_column), get(stop))
                    else:
                        body.comment("the call's next row groups of this batch index at once, while their panels fit "
                                     "the scratch: the second factor packed once for them")
                        fits = _panels_in(schedule, schedule.panel_bytes, depth)
                        body.set(taken, call("$max_u32", call("$min_u32", call("$min_u32", left, sub(
                            row_groups, op("i32.rem_u", unit, row_groups))), div_u(fits, get(group))), const(1)))
                        body.set(panels, mul(get(taken), get(group)))
                        body.set("$batch", div_u(unit, row_groups))
                        body.set("$row0", mul(op("i32.rem_u", unit, row_groups), group_rows))
                    emitter.open_scope()
                    declare_axes(emitter, kernel.batch_axes, kernel.batch_extents,
                                 unflatten_into(emitter, body, kernel.batch_extents, get("$batch"), "xb"))
                    _packed_unit(kernel, schedule, span, get(panels))
                    emitter.close_scope()
                    body.increment("$unit", get(taken))
                    body.br_if("$panel", op("i32.lt_u", unit, get("$end")))
            body.line("(return)")


def packed_units(sizes: UnitSizes, schedule: PackedMatmulSchedule, then: str | None) -> str:
    """Per batch index, a unit per group of panels (times the column slices); the tier after
    (``then``) beyond ``max_depth``."""
    group = panel_group(schedule, sizes.rows, sizes.depth)
    if schedule.split_columns:
        group = split_group(schedule, sizes.rows, sizes.depth, sizes.batch)
    group_rows = mul(group, const(schedule.panel_rows))
    row_groups = div_u(add(sizes.rows, sub(group_rows, const(1))), group_rows)
    panels = mul(sizes.batch, row_groups)
    if schedule.split_columns:
        panels = mul(panels, split_slices(schedule, sizes.rows, sizes.columns, group, sizes.batch))
    return f"(select {panels} {then} {packed_condition(schedule, sizes.depth)})"


def packed_condition(schedule: PackedMatmulSchedule, depth: str) -> str:
    """An i32 WAT value, nonzero where the tier runs once reached (a matrix-vector tier before
    it tests the rows): at most ``max_depth`` reduction steps."""
    return op("i32.le_u", depth, const(schedule.max_depth))


def _panels_in(schedule: PackedMatmulSchedule, budget: int, depth: str) -> str:
    """The i32 WAT count of first-factor panels of ``depth`` steps that ``budget`` bytes hold."""
    return div_u(const(budget), mul(call("$max_u32", depth, const(1)), const(4 * schedule.panel_rows)))


def _panels(schedule: PackedMatmulSchedule, rows: str) -> str:
    return div_u(add(rows, const(schedule.panel_rows - 1)), const(schedule.panel_rows))


def panel_group(schedule: PackedMatmulSchedule, rows: str, depth: str) -> str:
    """The i32 WAT count of row panels of one unit, from the row count and reduction depth
    (WAT values, evaluated several times): enough that the units number about
    ``units_wanted`` per batch index, as many as ``panel_bytes`` holds, at least one.
    ``$main`` and ``$units`` compute it alike (``PackedMatmulSchedule.panel_group``)."""
    wanted = div_u(add(_panels(schedule, rows), const(schedule.units_wanted - 1)), const(schedule.units_wanted))
    return call("$max_u32", call("$min_u32", wanted, _panels_in(schedule, schedule.panel_bytes, depth)), const(1))


def _few_panels(schedule: PackedMatmulSchedule, rows: str, batches: str) -> str:
    """Nonzero where the panels of all batch indices number fewer than ``units_wanted``."""
    return op("i32.lt_u", mul(_panels(schedule, rows), batches), const(schedule.units_wanted))


def split_group(schedule: PackedMatmulSchedule, rows: str, depth: str, batches: str) -> str:
    """The i32 WAT count of row panels of one unit of a packed matmul splitting columns (WAT
    values, evaluated several times): all of the rows when they are few (fewer panels per
    batch index than ``units_wanted``) and fit ``split_panel_bytes``, else :func:`panel_group`'s
    choice (then the columns are not split)."""
    fits = _panels_in(schedule, schedule.split_panel_bytes, depth)
    return (f"(select {call('$max_u32', call('$min_u32', _panels(schedule, rows), fits), const(1))} "
            f"{panel_group(schedule, rows, depth)} {_few_panels(schedule, rows, batches)})")


def split_slices(schedule: PackedMatmulSchedule, rows: str, columns: str, group: str, batches: str) -> str:
    """The i32 WAT count of column slices per row group (:func:`split_group`): where the
    panels of all batch indices number fewer than ``units_wanted``, enough for that many
    units in all, at most one per block of ``panel_columns`` columns; else one."""
    group_rows = mul(group, const(schedule.panel_rows))
    row_groups = div_u(add(rows, sub(group_rows, const(1))), group_rows)
    units = call("$max_u32", mul(row_groups, batches), const(1))
    wanted = f"(i32.div_u (i32.add {units} (i32.const {schedule.units_wanted - 1})) {units})"
    blocks = div_u(add(columns, const(schedule.panel_columns - 1)), const(schedule.panel_columns))
    return (f"(select {call('$max_u32', call('$min_u32', wanted, blocks), const(1))} (i32.const 1) "
            f"{_few_panels(schedule, rows, batches)})")


def slice_width(schedule: PackedMatmulSchedule, columns: str, slices: str) -> str:
    """The columns of one slice (WAT): the blocks of ``panel_columns`` shared out, so a slice
    starts on a block."""
    blocks = div_u(add(columns, const(schedule.panel_columns - 1)), const(schedule.panel_columns))
    return mul(div_u(add(blocks, sub(slices, const(1))), slices), const(schedule.panel_columns))


def _packed_unit(kernel: MatmulKernel, schedule: PackedMatmulSchedule, span: tuple[str, str] | None,
                 panels: str) -> None:
    """One unit, or several consecutive ones of the call taken together: ``panels`` (a WAT
    value) panels of ``panel_rows`` rows from ``$row0`` (the batch axes in scope), every
    column or those of ``span`` (WAT values: the first column, a multiple of
    ``panel_columns``, and the end).  The first factor is packed once, panel after panel
    (``$depth * 4 * panel_rows`` bytes apart); for each block of ``panel_columns`` columns
    the second is packed once, and for each panel micro-kernels sum the block into the
    scratch's sums and loops over the block's elements apply the epilogue.  With one panel
    per unit a convolution's weight, packed element by element, was packed again for every
    32 output positions."""
    emitter, body, info, program = kernel.emitter, kernel.body, kernel.info, kernel.program
    rows, columns = get("$rows"), get("$columns")
    panel_b = add(get("$scratch"), const(schedule.panel_bytes))
    sums_base = add(get("$scratch"), const(schedule.panel_bytes + schedule.panel_b_bytes))
    strip_bytes = op("i32.shl", get("$depth"), const((4 * schedule.micro_rows).bit_length() - 1))
    panel_row0, panel_a = body.named("panel_row0"), body.named("panel_a")
    group_end = body.named("group_end")
    panel_bytes = mul(get("$depth"), const(4 * schedule.panel_rows))
    body.set(group_end, call("$min_u32", add(get("$row0"), mul(panels, const(schedule.panel_rows))), rows))

    def each_panel(label: str, panel: Callable[[], None]) -> None:
        body.set(panel_row0, get("$row0"))
        body.set(panel_a, get("$scratch"))
        with body.loop(f"${label}"):
            panel()
            body.increment(panel_row0, schedule.panel_rows)
            body.increment(panel_a, panel_bytes)
            body.br_if(f"${label}", op("i32.lt_u", get(panel_row0), get(group_end)))

    each_panel("pack_panels", lambda: pack(emitter, body, info, info.a, kernel.row_axes, kernel.row_extents,
                                           get(panel_row0), rows, schedule.panel_rows, get(panel_a), strip=strip_bytes,
                                           unroll=schedule.unroll_steps))
    column_start, column_stop = span if span is not None else (const(0), columns)
    body.set("$column0", column_start)
    column0 = get("$column0")
    ready = None
    if kernel.prepacked is not None:
        ready = prepacked_ready(body)
        block_panel = body.named("b_panel")

    with body.block("$no_columns"):
        body.br_if("$no_columns", op("i32.ge_u", column0, column_stop))
        with body.loop("$columns"):
            if ready is None:
                pack_second_factor(kernel, schedule, panel_b)
            else:
                with body.if_(get(ready)):
                    with body.then():
                        body.set(block_panel, prepacked_block(get("$depth")))
                    with body.else_():
                        body.set(block_panel, panel_b)
                        pack_second_factor(kernel, schedule, get(block_panel))
                panel_b = get(block_panel)

            def run_panel() -> None:
                _micro_kernels(body, schedule, panel_row0, panel_a, panel_b, strip_bytes)
                _panel_outputs(kernel, schedule, panel_row0, sums_base)

            each_panel("panels", run_panel)
            body.increment("$column0", schedule.panel_columns)
            body.br_if("$columns", op("i32.lt_u", column0, column_stop))


def pack_second_factor(kernel: MatmulKernel, schedule: PackedMatmulSchedule, panel: str) -> None:
    """Statements packing the second factor's block of ``panel_columns`` columns from
    ``$column0`` (every reduction step) into ``panel`` (an i32 WAT address): a whole block
    copied by rows of f32x4 where the factor is contiguous along the columns, gathered four
    steps at a time where its columns are a constant or a size variable apart, else (and at
    the edge) packed element by element."""
    emitter, body, info, program = kernel.emitter, kernel.body, kernel.info, kernel.program
    columns, column0 = get("$columns"), get("$column0")
    distance = direct_columns(info, program)
    strides = None if distance is not None else gathered_columns(info, program, schedule.beyond.columns,
                                                                 schedule.panel_columns)
    stride = None if distance is not None or strides is not None else gathered_stride(info, program)
    b_address, b_step = body.named("b_address"), body.named("b_step")

    def pack_columns() -> None:
        pack(emitter, body, info, info.b, kernel.column_axes, kernel.column_extents, column0, columns,
             schedule.panel_columns, panel, unroll=schedule.unroll_steps)

    if distance is None and strides is None and stride is None:
        pack_columns()
        return
    whole = op("i32.le_u", add(column0, const(schedule.panel_columns)), columns)
    if distance is not None:  # a whole block is copied by rows of f32x4, one at the edge packed
        flat = flat_columns(info, program)
        if simplify(flat - simplify(product(kernel.column_extents))) != IntImm(0):  # nor across its end
            flat_value = emitter.index(flat)
            whole = op("i32.and", whole, op("i32.le_u", add(op("i32.rem_u", column0, flat_value),
                                                            const(schedule.panel_columns)), flat_value))
    with body.if_(whole):
        with body.then():
            _set_block_start(kernel, b_address)
            if distance is not None:
                body.set(b_step, op("i32.shl", emitter.index(distance), const(2)))
                _copy_columns(body, schedule, b_address, b_step, panel)
            elif strides is not None:  # a whole block gathered a step at a time
                _gather_columns(body, schedule, b_address, strides, panel)
            else:  # the same, its columns a size variable apart
                body.set(b_step, op("i32.shl", emitter.index(stride), const(2)))
                _gather_strided_columns(body, schedule, b_address, b_step, panel)
        with body.else_():
            pack_columns()


def _set_block_start(kernel: MatmulKernel, address: str) -> None:
    """``address`` := the address of the second factor at reduction step 0 and column
    ``$column0`` (the first column of a block that is copied or gathered into the panel)."""
    emitter, body, info = kernel.emitter, kernel.body, kernel.info
    emitter.open_scope()
    declare_axes(emitter, kernel.column_axes, kernel.column_extents,
                 unflatten_into(emitter, body, kernel.column_extents, get("$column0"), "xd"))
    first_step = tuple(substitute(index, {axis.name: IntImm(0) for axis in info.reduce_axes})
                       for index in info.b.indices)
    body.set(address, emitter.element_address(info.b.buffer, first_step))
    emitter.close_scope()


def _gather_columns(body: Body, schedule: PackedMatmulSchedule, source: str, strides: list[int], panel: str) -> None:
    """Statements packing a block of ``panel_columns`` columns of a second factor of
    ``gathered_columns`` into the panel: per reduction step one f32 of each column
    (``strides``: its distance in elements from the first column's), assembled into
    ``panel_columns / 4`` f32x4 and stored; ``source`` (the first column's step 0) moves by
    one element a step.  Element by element (``packing.pack``) each took the reduction's
    nested loops and the index arithmetic: a 3x3 convolution's weight of 512 x 4608 packed
    at about 1.6 ns an element."""
    _gather_panel(body, schedule, source, [[(get(source), 4 * strides[4 * q + lane]) for lane in range(4)]
                                           for q in range(schedule.panel_columns // 4)], panel)


def _gather_strided_columns(body: Body, schedule: PackedMatmulSchedule, source: str, stride: str,
                            panel: str) -> None:
    """:func:`_gather_columns` where the columns are ``stride`` bytes apart (a local: a size
    variable's multiple, so not an offset of the loads): each f32x4 of four columns is
    gathered from a local of its own (the first column's step, moved along with ``source``)
    and the three others' distances, computed once.  Element by element, ResNet-50's 3x3
    convolutions (one program for every channel count) packed their weight at about 1.6 ns
    an element."""
    farther = [body.named(f"gather_stride{lane}") for lane in (2, 3)]
    body.set(farther[0], op("i32.shl", get(stride), const(1)))
    body.set(farther[1], add(get(farther[0]), get(stride)))
    distances = [get(stride), *(get(local) for local in farther)]
    quads = [source] + [body.named(f"gather_quad{q}") for q in range(1, schedule.panel_columns // 4)]
    for q, local in enumerate(quads[1:], start=1):
        body.set(local, add(get(source), mul(get(stride), const(4 * q))))
    _gather_panel(body, schedule, quads, [[(get(local), 0)] + [(add(get(local), distance), 0) for distance in distances]
                                          for local in quads], panel)


def _gather_panel(body: Body, schedule: PackedMatmulSchedule, sources: str | list[str],
                  lanes: list[list[tuple[str, int]]], panel: str) -> None:
    """The panel filled from a second factor gathered a step at a time (``lanes``: per f32x4 of
    a step, each lane's address and offset; the sources advance one element a step): four
    steps at a time while four remain, then lane by lane (:func:`_fill_panel`)."""
    _fill_panel(body, schedule, sources, const(4), [_lanes_loaded(quad) for quad in lanes], panel,
                ("gathered", "gather"), four_steps=lanes)


def _lanes_loaded(lanes: list[tuple[str, int]]) -> str:
    """The f32x4 whose lane ``i`` is the f32 at ``lanes[i]`` (an i32 WAT address and a
    constant offset in bytes)."""
    (address, offset), *rest = lanes
    vector = f"(v128.load32_splat{f' offset={offset}' if offset else ''} {address})"
    for lane, (address, offset) in enumerate(rest, start=1):
        vector = f"(v128.load32_lane{f' offset={offset}' if offset else ''} {lane} {address} {vector})"
    return vector


def _copy_columns(body: Body, schedule: PackedMatmulSchedule, source: str, stride: str, panel: str) -> None:
    """Statements copying a block of ``panel_columns`` columns of a second factor that is
    contiguous along them (``direct_columns``) into the panel, ``panel_columns / 4`` f32x4
    per reduction step, from ``source`` (the first step's address, moved by ``stride`` bytes
    per step).  Read in place, every micro-kernel would step a whole row of the factor
    (12 KB for 3072 columns) per reduction step: new pages, the same cache sets; copied once
    per unit, they read 32 contiguous bytes a step (128 x 768 @ 768 x 3072: 8.6 -> 14
    GFLOP/s)."""
    vectors = [f"(v128.load offset={16 * q} {get(source)})" for q in range(schedule.panel_columns // 4)]
    _fill_panel(body, schedule, source, get(stride), vectors, panel, ("copied", "copy"))


def _fill_panel(body: Body, schedule: PackedMatmulSchedule, source: str | list[str], source_step: str,
                vectors: list[str], panel: str, labels: tuple[str, str],
                four_steps: list[list[tuple[str, int]]] | None = None) -> None:
    """The loop over the reduction steps that stores ``vectors`` (read from local
    ``source``, or from several) into the panel, one step of ``panel_columns`` floats at a
    time, each source advanced by ``source_step`` bytes a step.  With ``four_steps`` (per
    f32x4 of the step, the address and offset of each of its four lanes at the step, each
    column's steps contiguous), the steps go four at a time first while four remain
    (:func:`_four_steps_transposed`), then one at a time."""
    done, loop = labels
    target, step = body.named("copy_target"), body.named("copy_step")
    body.set(target, panel)
    body.set(step, get("$depth"))
    if four_steps is not None:
        _four_steps_transposed(body, schedule, [source] if isinstance(source, str) else source, four_steps, target,
                               step)
    with body.block(f"${done}"):
        body.br_if(f"${done}", op("i32.eqz", get(step)))
        with body.loop(f"${loop}"):
            for q, vector in enumerate(vectors):
                body.store("v128.store", get(target), vector, 16 * q)
            for local in [source] if isinstance(source, str) else source:
                body.increment(local, source_step)
            body.increment(target, 4 * schedule.panel_columns)
            body.set(step, sub(get(step), const(1)))
            body.br_if(f"${loop}", get(step))


INTERLEAVE = {  # i8x16.shuffle lanes: the low or high 32-bit halves of two f32x4 interleaved, or their 64-bit halves
    "low32": "0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23", "high32": "8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31",
    "low64": "0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23", "high64": "8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31",
}


def _four_steps_transposed(body: Body, schedule: PackedMatmulSchedule, sources: list[str],
                           lanes: list[list[tuple[str, int]]], target: str, step: str) -> None:
    """While at least four steps remain (local ``step``): for each f32x4 of the panel's step,
    four steps of each of its four columns read as one f32x4 each (a column's steps are
    contiguous), transposed in registers (four shuffles to interleave the 32-bit lanes, four
    to pair the 64-bit halves) into the four steps' f32x4 and stored; ``sources`` advance 16
    bytes, ``target`` four steps of the panel.  Lane by lane, packing ResNet-50's second
    factors (its convolutions' weights [O, C, kh, kw], each output channel a column) took
    about 8% of its time in V8; four steps at a time saves 2-3% of it."""
    rows = [body.named(f"column_steps{lane}", "v128") for lane in range(4)]
    pairs = [body.named(f"lane_pairs{k}", "v128") for k in range(4)]
    step_bytes = 4 * schedule.panel_columns

    def shuffle(kind: str, first: str, second: str) -> str:
        return f"(i8x16.shuffle {INTERLEAVE[kind]} {get(first)} {get(second)})"

    body.comment("four steps at a time: each column's four steps loaded at once, transposed to the panel's four steps")
    with body.block("$transposed_done"):
        body.br_if("$transposed_done", op("i32.lt_u", get(step), const(4)))
        with body.loop("$transposed"):
            for q, quad in enumerate(lanes):
                for lane, (address, offset) in enumerate(quad):
                    body.set(rows[lane], f"(v128.load{f' offset={offset}' if offset else ''} {address})")
                body.set(pairs[0], shuffle("low32", rows[0], rows[1]))  # columns 0 and 1 at steps 0 and 1
                body.set(pairs[1], shuffle("high32", rows[0], rows[1]))  # the same columns at steps 2 and 3
                body.set(pairs[2], shuffle("low32", rows[2], rows[3]))
                body.set(pairs[3], shuffle("high32", rows[2], rows[3]))
                for k, (kind, low, high) in enumerate([("low64", 0, 2), ("high64", 0, 2), ("low64", 1, 3),
                                                       ("high64", 1, 3)]):
                    body.store("v128.store", get(target), shuffle(kind, pairs[low], pairs[high]),
                               k * step_bytes + 16 * q)
            for local in sources:
                body.increment(local, 16)
            body.increment(target, 4 * step_bytes)
            body.set(step, sub(get(step), const(4)))
            body.br_if("$transposed", op("i32.ge_u", get(step), const(4)))


def _micro_kernels(body: Body, schedule: PackedMatmulSchedule, row0: str, panel_a: str, panel_b: str,
                   strip_bytes: str) -> None:
    """The sums of the column block for the panel's rows (from local ``row0``), ``micro_rows``
    at a time (while any is in the output): per step one ``v128.load32_splat`` per row from
    the first factor's panel at local ``panel_a``, ``panel_columns / 4`` f32x4 of the second
    factor's panel at ``panel_b``, the products added into f32x4 sums (``multiply_add``) stored to the
    scratch's sums (row-major).

    The reduction runs in chunks of ``chunk`` steps, every strip of the panel for one chunk
    before the next (the sums reloaded from the scratch after the first): a chunk of the
    second factor's panel (``32 * chunk`` bytes) stays in the L1 cache for the panel's
    strips, which read ``16 * chunk`` bytes each.  Over the whole reduction at once, every
    strip streamed both panels (``48 * depth`` bytes: 96 KB at K = 2048, a 1x1 convolution
    of 2048 channels) from L2: ResNet-50's 1x1 convolutions of 1024 and 2048 channels ran
    at half the speed of those of 64."""
    lanes = schedule.panel_columns // 4
    micro, a, b, step = (body.named(name) for name in ("micro", "a_address", "b", "step"))
    chunk0, address = body.named("chunk0"), body.named("sums_address")
    sums = [[body.named(f"psum{r}_{q}", "v128") for q in range(lanes)] for r in range(schedule.micro_rows)]
    factors_a = [body.named(f"pa{r}", "v128") for r in range(schedule.micro_rows)]
    factors_b = [body.named(f"pb{q}", "v128") for q in range(lanes)]
    body.set(chunk0, const(0))
    body.comment(f"chunks of {schedule.chunk} reduction steps (at least one: a zero depth stores zero sums)")
    with body.loop("$chunk"):
        body.set(micro, const(0))
        with body.block("$micro_done"):
            with body.loop("$micro"):
                body.br_if("$micro_done", op("i32.ge_u", add(get(row0), get(micro)), get("$rows")))
                body.set(address, add(get("$scratch"), add(const(schedule.panel_bytes + schedule.panel_b_bytes),
                                                           op("i32.shl", get(micro),
                                                              const((4 * schedule.panel_columns).bit_length() - 1)))))
                with body.if_(get(chunk0)):
                    with body.then():
                        for r in range(schedule.micro_rows):
                            for q in range(lanes):
                                body.set(sums[r][q], f"(v128.load offset={16 * (r * lanes + q)} {get(address)})")
                    with body.else_():
                        for row in sums:
                            for local in row:
                                body.set(local, "(v128.const i32x4 0 0 0 0)")
                body.comment(f"the strip of rows micro .. micro + {schedule.micro_rows - 1}: "
                             f"{4 * schedule.micro_rows} contiguous bytes a step")
                body.set(a, add(add(get(panel_a), mul(div_u(get(micro), const(schedule.micro_rows)), strip_bytes)),
                                op("i32.shl", get(chunk0), const((4 * schedule.micro_rows).bit_length() - 1))))
                body.set(b, add(panel_b, op("i32.shl", get(chunk0),
                                            const((4 * schedule.panel_columns).bit_length() - 1))))
                body.set(step, call("$min_u32", sub(get("$depth"), get(chunk0)), const(schedule.chunk)))
                with body.block("$summed"):
                    body.br_if("$summed", op("i32.eqz", get(step)))
                    with body.loop("$sum"):
                        for r, local in enumerate(factors_a):
                            body.set(local, f"(v128.load32_splat offset={4 * r} {get(a)})")
                        for q, local in enumerate(factors_b):
                            body.set(local, f"(v128.load offset={16 * q} {get(b)})")
                        for r in range(schedule.micro_rows):
                            for q in range(lanes):
                                body.set(sums[r][q], multiply_add(get(factors_a[r]), get(factors_b[q]),
                                                                  get(sums[r][q])))
                        body.increment(a, 4 * schedule.micro_rows)
                        body.increment(b, 4 * schedule.panel_columns)
                        body.count_down(step, "$sum")
                for r in range(schedule.micro_rows):
                    for q in range(lanes):
                        body.store("v128.store", get(address), get(sums[r][q]), 16 * (r * lanes + q))
                body.increment(micro, schedule.micro_rows)
                body.br_if("$micro", op("i32.lt_u", get(micro), const(schedule.panel_rows)))
        body.increment(chunk0, schedule.chunk)
        body.br_if("$chunk", op("i32.lt_u", get(chunk0), get("$depth")))


def _enter_output_column(kernel: MatmulKernel, column: str, prefix: str) -> str:
    """Opens a scope with the column axes of local ``column`` declared (the caller closes
    it) and returns the local holding the output element's address there."""
    emitter, body, program = kernel.emitter, kernel.body, kernel.program
    emitter.open_scope()
    declare_axes(emitter, kernel.column_axes, kernel.column_extents,
                 unflatten_into(emitter, body, kernel.column_extents, get(column), prefix))
    return _output_address(kernel)


def _output_address(kernel: MatmulKernel) -> str:
    """The local holding the output element's address at the axes declared now."""
    emitter, program = kernel.emitter, kernel.program
    offset = emitter.index(flat_offset(program.output, tuple(program.axes)))
    return emitter.set_local(emitter.address(program.output.name, offset), "i32", kernel.body.indent, "address")


def _panel_outputs(kernel: MatmulKernel, schedule: PackedMatmulSchedule, row0: str, sums_base: str) -> None:
    """Loops over the panel's rows and the column block's columns that are inside the output
    (a row's axes recovered once for its columns): the epilogue of each spilled sum, stored
    (four columns at a time where ``vector_columns`` allows, then one by one; or where
    ``vector_rows`` allows instead, four rows of each column at a time while four remain).

    Where the block is whole (``panel_columns`` columns inside the output, within one index
    of the column axes the epilogue does not take four at a time along), its quads' column axes are
    recovered once for all the panel's rows and the epilogue's loads that read no column
    axis (a bias) once per row (:func:`_whole_block_outputs`): at K = 16 (MobileNetV3's
    1x1 convolution of 16 -> 64 channels at 112 x 112) the epilogue, dividing for each
    quad, took 60% of the kernel."""
    emitter, body, info, program = kernel.emitter, kernel.body, kernel.info, kernel.program
    row, row_end = body.named("row"), body.named("row_end")
    column, column_end = body.named("column"), body.named("column_end")
    sum_address = body.named("sum_address")
    column0 = get("$column0")
    row_bytes = 4 * schedule.panel_columns
    body.set(row, get(row0))
    body.set(row_end, call("$min_u32", add(get(row0), const(schedule.panel_rows)), get("$rows")))
    body.set(column_end, call("$min_u32", add(column0, const(schedule.panel_columns)), get("$columns")))
    body.set(sum_address, sums_base)
    sum_at = add(get(sum_address), op("i32.shl", sub(get(column), column0), const(2)))
    suffix = vector_columns(info, program)
    row_suffix = 0 if suffix else vector_rows(info, program)

    def one_row() -> None:
        emitter.open_scope()
        declare_axes(emitter, kernel.row_axes, kernel.row_extents,
                     unflatten_into(emitter, body, kernel.row_extents, get(row), "yr"))
        body.set(column, column0)
        with body.loop("$output_column"):
            def one_column() -> None:
                address = _enter_output_column(kernel, column, "yc")
                emitter.known(info.reduction, f"(f32.load {sum_at})")
                body.line(store(program.output.dtype, address, emitter.scalar(program.body, body.indent)))
                emitter.close_scope()
                body.increment(column)

            if suffix:  # four columns at once while four remain (within a row of the suffix), then one by one
                quad = op("i32.le_u", add(get(column), const(4)), get(column_end))
                if suffix < len(kernel.column_axes):  # an outer column axis (a batch): four within one index of it
                    span = emitter.index(simplify(product(kernel.column_extents[-suffix:])))
                    quad = op("i32.and", quad, op("i32.le_u", add(op("i32.rem_u", get(column), span), const(4)), span))
                with body.if_(quad):
                    with body.then():
                        _four_columns(kernel, column, sum_at, suffix)
                    with body.else_():
                        one_column()
            else:
                one_column()
            body.br_if("$output_column", op("i32.lt_u", get(column), get(column_end)))
        emitter.close_scope()
        body.increment(sum_address, row_bytes)
        body.increment(row)

    def each_row() -> None:
        with body.loop("$output_row"):
            if row_suffix:  # four rows of each column at once while four remain (within one index of the outer row axes)
                quad = op("i32.le_u", add(get(row), const(4)), get(row_end))
                if row_suffix < len(kernel.row_axes):
                    span = emitter.index(simplify(product(kernel.row_extents[-row_suffix:])))
                    quad = op("i32.and", quad, op("i32.le_u", add(op("i32.rem_u", get(row), span), const(4)), span))
                with body.if_(quad):
                    with body.then():
                        _four_rows(kernel, schedule, row, column, column_end, sum_at, row_suffix)
                        body.increment(sum_address, 4 * row_bytes)
                        body.increment(row, 4)
                    with body.else_():
                        one_row()
            else:
                one_row()
            body.br_if("$output_row", op("i32.lt_u", get(row), get(row_end)))

    if suffix and schedule.panel_columns % 4 == 0:
        whole = op("i32.eq", sub(get(column_end), column0), const(schedule.panel_columns))
        if suffix < len(kernel.column_axes):  # and within one index of the outer column axes (a batch)
            span = emitter.index(simplify(product(kernel.column_extents[-suffix:])))
            whole = op("i32.and", whole, op("i32.le_u", add(op("i32.rem_u", column0, span),
                                                            const(schedule.panel_columns)), span))
        with body.if_(whole):
            with body.then():
                _whole_block_outputs(kernel, schedule, row, row_end, sum_address, suffix)
            with body.else_():
                each_row()
    else:
        each_row()


def _whole_block_outputs(kernel: MatmulKernel, schedule: PackedMatmulSchedule, row: str, row_end: str,
                         sum_address: str, suffix: int) -> None:
    """The epilogue of a whole column block (see :func:`_panel_outputs`) within one index of
    the column axes before the last ``suffix``: each quad's column axes unflattened once,
    then per row its splats and one ``v128.store`` per quad."""
    emitter, body, info, program = kernel.emitter, kernel.body, kernel.info, kernel.program
    quads = schedule.panel_columns // 4
    quad_axes = []
    for q in range(quads):
        start = add(get("$column0"), const(4 * q)) if q else get("$column0")
        quad_axes.append(unflatten_into(emitter, body, kernel.column_extents, start, f"yb{q}_"))
    with body.loop("$output_whole_row"):
        emitter.open_scope()
        declare_axes(emitter, kernel.row_axes, kernel.row_extents,
                     unflatten_into(emitter, body, kernel.row_extents, get(row), "yr"))
        splats = _epilogue_splats(kernel, kernel.column_axes, {})
        for q in range(quads):
            emitter.open_scope()
            declare_axes(emitter, kernel.column_axes, kernel.column_extents, quad_axes[q])
            address = _output_address(kernel)
            _store_four(kernel, address, f"(v128.load offset={16 * q} {get(sum_address)})",
                        kernel.column_axes[-suffix:], splats)
            emitter.close_scope()
        emitter.close_scope()
        body.increment(sum_address, 4 * schedule.panel_columns)
        body.increment(row)
        body.br_if("$output_whole_row", op("i32.lt_u", get(row), get(row_end)))


def _four_rows(kernel: MatmulKernel, schedule: PackedMatmulSchedule, row: str, column: str, column_end: str,
               sum_at: str, suffix: int) -> None:
    """The epilogue of rows ``row .. row + 3`` of every column of the block, four rows' sums of
    a column as one f32x4 (read a lane at a time: the sums are row-major), stored with one
    ``v128.store`` (the epilogue's loads along the last ``suffix`` row axes one ``v128.load``,
    the others splatted)."""
    emitter, body = kernel.emitter, kernel.body
    emitter.open_scope()
    declare_axes(emitter, kernel.row_axes, kernel.row_extents,
                 unflatten_into(emitter, body, kernel.row_extents, get(row), "yv"))
    lane_axes = kernel.row_axes[-suffix:]
    body.set(column, get("$column0"))
    with body.loop("$output_quad_column"):
        address = _enter_output_column(kernel, column, "yw")
        sums = f"(v128.load32_splat {sum_at})"
        for lane in range(1, 4):
            sums = f"(v128.load32_lane offset={4 * schedule.panel_columns * lane} {lane} {sum_at} {sums})"
        _store_four(kernel, address, emitter.set_local(sums, "v128", body.indent, "sums"), lane_axes)
        emitter.close_scope()
        body.increment(column)
        body.br_if("$output_quad_column", op("i32.lt_u", get(column), get(column_end)))
    emitter.close_scope()


def _four_columns(kernel: MatmulKernel, column: str, sum_at: str, suffix: int) -> None:
    """The epilogue of four consecutive columns' sums as one f32x4, stored with one
    ``v128.store`` (its loads along the last ``suffix`` column axes one ``v128.load``, the
    others splatted)."""
    emitter, body = kernel.emitter, kernel.body
    address = _enter_output_column(kernel, column, "yq")
    _store_four(kernel, address, f"(v128.load {sum_at})", kernel.column_axes[-suffix:])
    emitter.close_scope()
    body.increment(column, 4)


def _store_four(kernel: MatmulKernel, address: str, sums: str, lane_axes: tuple, splatted: dict | None = None) -> None:
    """The epilogue of four outputs from their sums (``sums``, an f32x4 value), stored at
    ``address`` with one ``v128.store``: its loads along ``lane_axes`` one ``v128.load`` each,
    the others splatted (``splatted``: those splats already in locals)."""
    emitter, body, info, program = kernel.emitter, kernel.body, kernel.info, kernel.program
    splats = _epilogue_splats(kernel, lane_axes, {**(splatted or {}), info.reduction: sums})
    body.store("v128.store", address, emitter.vector_value(program.body, splats, {}, body.indent))


def _epilogue_splats(kernel: MatmulKernel, axes: tuple, splats: dict) -> dict:
    """``splats`` with each epilogue load that reads none of ``axes`` (and is not there yet)
    splatted into a v128 local at the axes declared now."""
    emitter, body, program = kernel.emitter, kernel.body, kernel.program
    for node in epilogue_nodes(kernel.info, program.body):
        if isinstance(node, Load) and not any(reads(node, axis) for axis in axes) and node not in splats:
            splats[node] = emitter.set_local(f"(f32x4.splat {emitter.scalar(node, body.indent)})", "v128",
                                             body.indent, "splat")
    return splats


PACKED_TIER = Tier(packed_main, packed_units)  # type: ignore[arg-type]
