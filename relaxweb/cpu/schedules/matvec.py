"""The ``matrix_vector`` kind (``MatrixVectorSchedule``) as the first tier of a matmul kernel
(``matmul.py``): where the rows are at most ``max_rows`` and the reduction at most
``max_depth`` steps (a decoder's step).  A unit is four columns of one batch index; a call
takes its range of units as one run of columns per batch index, in blocks of at most
``columns`` columns, or ``columns x max_rows`` where there is one row (its sums may take
the place of every row's), the blocks as even as multiples of 4 allow.  One thread takes
all the units, so a block is as wide as that allows; threads take even shares of them.

Such a matmul gains nothing from packing per call: its time is the second factor's bytes,
read once.  Where the call site's weight is prepacked (``matmul_packed.PrepackedFactor``:
its panels written once at load), a block reads the panels (:func:`_panel_block`): each
panel's ``K x 8`` floats lie in order, so the whole weight is one stream.  GPT-2's decode
step in V8 read its weights at 25-32 GB/s so, against 15-17 streamed; the model took 0.77x
its time at 1 row (128 past tokens), 0.77x at 4 rows and 0.82x at 8 (interleaved runs, its
language-model head prepacked too).  Otherwise:

Streamed (the second factor read in place, contiguous along the only column axis): the first
factor is packed once per block ([K x max_rows], its prologue evaluated once per element),
then the block's sums of every row (in the scratch, ``columns`` floats per row) take
``steps`` rows of the second factor at a time, each read in order along its columns
(:func:`_streamed_block`).  Under wasmtime on one thread, a 768 x 3072 float32 weight: about
10 GB/s this way, 4-6 GB/s with the sums in registers and the weight read down its columns,
1.5 GB/s on the packed path; the GPT-2 decode step's kernels took 120, 106 and 95 ms with
blocks of 128, 256 and 512 columns (the longer runs of each weight row stream better, and
the prologue is packed for fewer units).

The blocks were units of 512 columns; they are now as wide as the call's range allows.  In
V8 (Node, one thread), a loop of the streamed form's shape over 755 MB of weights read
10.6, 12.9, 14.6 and 16.6 GB/s with runs of 1.5, 2, 4 and 12 KB of each row; the GPT-2
decode step took 0.80x its time (48.8 against 60.8 ms, 15 interleaved runs, the same
outputs bit for bit), one 768 x 3072 weight 0.77x at one row and 0.99x at 4 and 8 rows
(those keep blocks of ``columns``: their sums stay in L1).

Several rows (a decoder stepping several sequences at once, continuous batching) share each
load of the second factor: the rows are taken in groups (all ``max_rows`` at a time, then
halves: 7 rows as 4, 2 and 1), and each f32x4 of the weight is multiplied into every row of
the group before the next is loaded, so the weight is streamed once for all the rows.  A
row's sums add their products in the same order whatever the group and the number of rows,
so each row's outputs are bit for bit those it gets alone (sequences generated together
give the tokens each gives alone; ``tests/cpu/test_wasm_schedules.py`` checks it).

Measured under wasmtime on one thread (medians of interleaved runs on a shared machine):

- Before, one row at a time, each row read the block's weight again (from L2 or memory:
  512 columns x 576 steps are 1.2 MB): 768 x 3072, 8 rows took 3.6-4.1 ms, about the
  packed path's micro-kernels of 4 rows (3.7-4.0 ms), against 0.9-1.1 ms for 1 row.  Now
  1.3-1.5 ms at 8 rows, 1 row unchanged.
- SmolLM-135M's decode step (hidden 576, 539 MB of float32 weights), its kernels' time in
  two sessions: 136-144 ms at 1 row and 330-352 ms at 8 rows (2.4x) before; 120-132 and
  172-190 ms (1.44x) now, the logits bit for bit the same.  At 8 rows the weight matmuls
  went from 114-121 to 39-42 ms (gate and lm_head), 69 to 31-33 (down), 59-62 to 26-29
  (up) and 22-23 to 13-14 (output projection); the q / k / v projections (written as
  [heads, tokens, 64]: the packed path) stay at 35-39.
- The group: rows in groups of 2, then 4, then all 8 gave 224, 194 and 181 ms at 8 rows
  (with 4 steps a pass, one session).  With all the rows in the loop that loads the
  weight, the arithmetic of every row overlaps the weight's loads from memory; with groups
  of 2 the first group waits on memory and the next three compute from L1 while memory
  idles.
- The splats: held in locals, 8 rows x 4 steps of them did not fit the 16 registers, and
  Cranelift reloaded and re-stored the spilled ones every iteration; loaded where used (a
  broadcast load from L1 per product, besides the steps' weight f32x4 and a sum in
  registers) they ran as fast or faster.  8 steps a pass instead of 4 (each sum loaded and
  stored once per 8 products): 173-176 ms against 180-183 at 8 rows, 121-124 against 131
  at 1 (15 runs each, both orders).
- Where the distance between the weight's rows is a constant (any weight of constant
  shape), the steps' rows are read from one pointer at constant offsets (with 8 pointers
  advanced per f32x4, Cranelift kept some of them on the stack).

With ``dot_products`` (each column contiguous along the reduction): every row of the first
factor packed contiguously, each sum a dot product of two runs (:func:`_dot_block`), the
columns ``dot_columns`` at a time and for them the rows ``dot_rows`` at a time, each load
of a column shared by the group's rows (the columns are then read from L1 by the other
groups).  768 x 3072 transposed, 8 rows: 2.6-2.8 ms before, 2.2-2.4 now (1 row: 1.0-1.3 ms
both); groups of 1, 2 or 4 rows are within 10% (4 the best): the first group waits on
memory while the others compute from L1, and
all 8 rows in one loop need 8 sums per column, more than the registers hold at 2 columns
or more (1 column at a time was slower still).
"""

from __future__ import annotations

from ...ir.access import flat_offset
from ...ir.matmul_layout import direct_columns
from ...ir.symbolic import IntImm, as_int, simplify, substitute
from ...ir.wasm_schedule import MatrixVectorSchedule
from ..emit import store
from ..relaxed_simd import multiply_add
from ..wat_builder import Body, add, call, const, div_u, get, mul, op, sub
from .common import declare_axes, unflatten_into
from .matmul_kernel import MatmulKernel, Tier, UnitSizes
from .matmul_packed import PREPACKED, PREPACKED_HEADER_BYTES, prepacked_ready
from .packing import pack


def matrix_vector_main(kernel: MatmulKernel, schedule: MatrixVectorSchedule) -> None:
    """The tier's part of ``$main``: where its condition holds, units ``$first <= u < $end``
    (per batch index, one per four columns), then return.  The units of one batch index in
    the range are one run of columns, taken in blocks of at most ``columns`` columns
    (``columns x max_rows`` for one row), as even as multiples of 4 allow.  Reads the
    locals ``$rows``, ``$columns``, ``$depth`` and ``$unit`` that the kernel set."""
    emitter, body = kernel.emitter, kernel.body
    unit, groups, batch, group, count, piece_end, blocks, block_cap, block_groups, column0, width = (
        body.named(name) for name in ("unit", "mv_groups", "mv_batch", "mv_group", "mv_count", "mv_piece_end",
                                      "mv_blocks", "mv_block_cap", "mv_block_groups", "mv_column0", "mv_width"))
    with body.if_(_condition(schedule, get("$rows"), get("$depth"))):
        with body.then():
            ready = None if kernel.prepacked is None else prepacked_ready(body)
            body.set(groups, op("i32.shr_u", add(get("$columns"), const(3)), const(2)))
            body.comment("the most groups of four columns a block takes: one row's sums may fill the sums of all rows")
            one_row, any_rows = const(schedule.columns * schedule.max_rows // 4), const(schedule.columns // 4)
            body.set(block_cap, f"(select {one_row} {any_rows} {op('i32.eq', get('$rows'), const(1))})")
            with body.block("$matvec_done"):
                body.br_if("$matvec_done", op("i32.ge_u", get(unit), get("$end")))
                with body.loop("$matvec_piece"):
                    body.comment("this batch index's units in the range: a run of columns, in even blocks")
                    body.set(batch, div_u(get(unit), get(groups)))
                    body.set(group, op("i32.rem_u", get(unit), get(groups)))
                    body.set(count, call("$min_u32", sub(get("$end"), get(unit)), sub(get(groups), get(group))))
                    body.set(piece_end, add(get(group), get(count)))
                    body.increment(unit, get(count))
                    body.set(blocks, div_u(add(get(count), sub(get(block_cap), const(1))), get(block_cap)))
                    body.set(block_groups, div_u(add(get(count), sub(get(blocks), const(1))), get(blocks)))
                    emitter.open_scope()
                    declare_axes(emitter, kernel.batch_axes, kernel.batch_extents,
                                 unflatten_into(emitter, body, kernel.batch_extents, get(batch), "xm"))
                    with body.loop("$matvec_block"):
                        body.set(column0, op("i32.shl", get(group), const(2)))
                        body.set(width, call("$min_u32", sub(get("$columns"), get(column0)), op(
                            "i32.shl", call("$min_u32", get(block_groups), sub(get(piece_end), get(group))), const(2))))
                        block_statements = _dot_block if schedule.dot_products else _streamed_block
                        if ready is None:
                            block_statements(kernel, schedule, column0, width)
                        else:
                            with body.if_(get(ready)):
                                with body.then():
                                    _panel_block(kernel, schedule, column0, width)
                                with body.else_():
                                    block_statements(kernel, schedule, column0, width)
                        body.increment(group, get(block_groups))
                        body.br_if("$matvec_block", op("i32.lt_u", get(group), get(piece_end)))
                    emitter.close_scope()
                    body.br_if("$matvec_piece", op("i32.lt_u", get(unit), get("$end")))
            body.line("(return)")


def matrix_vector_units(sizes: UnitSizes, schedule: MatrixVectorSchedule, then: str | None) -> str:
    """Per batch index, a unit per four columns (rounded up) where the tier runs; the tier
    after (``then``) elsewhere."""
    units = mul(sizes.batch, op("i32.shr_u", add(sizes.columns, const(3)), const(2)))
    return f"(select {units} {then} {_condition(schedule, sizes.rows, sizes.depth)})"


def _condition(schedule: MatrixVectorSchedule, rows: str, depth: str) -> str:
    """An i32 WAT value, nonzero where the tier runs: at most ``max_rows`` rows and
    ``max_depth`` reduction steps (``rows``, ``depth``: i32 WAT values)."""
    return op("i32.and", op("i32.le_u", rows, const(schedule.max_rows)),
              op("i32.le_u", depth, const(schedule.max_depth)))


def _sums_bytes(schedule: MatrixVectorSchedule) -> int:
    """The scratch's first bytes: a block's sums, one f32 per column of each row (row ``r``'s
    from ``scratch + r * 4 * columns``)."""
    return 4 * schedule.columns * schedule.max_rows


def _row_groups(group: int) -> tuple[int, ...]:
    """The sizes of the groups a block's rows are taken in: ``group`` rows while as many
    remain, then halves down to 1 (7 rows in groups of 4: 4, 2, 1)."""
    sizes = [group]
    while sizes[-1] > 1:
        sizes.append(sizes[-1] // 2)
    return tuple(sizes)


def _streamed_block(kernel: MatmulKernel, schedule: MatrixVectorSchedule, column0: str, width: str) -> None:
    """One block (the batch axes in scope): the ``width`` columns from ``column0``, every row.
    The first factor packed for all rows (lane ``r`` of step ``k`` at ``scratch + sums + 4 *
    (k * max_rows + r)``); the sums of every row (:func:`_streamed_sums`), then per row the
    epilogue of each, stored."""
    emitter, body, info, program = kernel.emitter, kernel.body, kernel.info, kernel.program
    panel = add(get("$scratch"), const(_sums_bytes(schedule)))
    pack(emitter, body, info, info.a, kernel.row_axes, kernel.row_extents, const(0), get("$rows"), schedule.max_rows,
         panel)
    # the second factor at reduction step 0, column ``column0``; the bytes between two steps
    weight, step = body.named("mv_weight"), body.named("mv_step")
    emitter.open_scope()
    declare_axes(emitter, kernel.column_axes, kernel.column_extents,
                 unflatten_into(emitter, body, kernel.column_extents, get(column0), "xw"))
    first_step = tuple(substitute(index, {info.reduce_axes[0].name: IntImm(0)}) for index in info.b.indices)
    body.set(weight, emitter.element_address(info.b.buffer, first_step))
    step_bytes = direct_columns(info, program) * 4
    body.set(step, emitter.index(step_bytes))
    emitter.close_scope()
    _streamed_sums(body, schedule, weight, step, as_int(simplify(step_bytes)), width)
    _each_row_outputs(kernel, schedule, column0, width, "$matvec_row")


def _each_row_outputs(kernel: MatmulKernel, schedule: MatrixVectorSchedule, column0: str, width: str,
                      label: str) -> None:
    """A loop over the rows: the epilogue of each of a row's sums (:func:`_outputs`)."""
    body = kernel.body
    row = body.named("mv_row")
    body.comment("each row's outputs: the epilogue of its sums")
    body.set(row, const(0))
    with body.block(f"{label}s_done"):
        body.br_if(f"{label}s_done", op("i32.ge_u", get(row), get("$rows")))
        with body.loop(label):
            _outputs(kernel, _row_sums(schedule, get(row)), row, column0, width)
            body.increment(row)
            body.br_if(label, op("i32.lt_u", get(row), get("$rows")))


def _offset(offset: int) -> str:
    """A load's or store's ``offset=`` immediate (nothing at 0), with its leading space."""
    return f" offset={offset}" if offset else ""


def _row_sums(schedule: MatrixVectorSchedule, row: str) -> str:
    """The i32 WAT address of the sums of row ``row`` (an i32 WAT value) in the scratch."""
    return add(get("$scratch"), mul(row, const(4 * schedule.columns)))


def _dot_block(kernel: MatmulKernel, schedule: MatrixVectorSchedule, column0: str, width: str) -> None:
    """One block when the second factor's columns are contiguous along the reduction
    (``matmul_layout.dot_columns``): each row of the first factor packed contiguously (row
    ``r`` at ``scratch + sums + r * 4 * max_depth``, its prologue evaluated once per
    element), then each sum a dot product of two runs (:func:`_dot_sums`), then per row the
    epilogue of each."""
    _pack_each_row(kernel, schedule)
    _dot_sums(kernel, schedule, column0, width)
    _each_row_outputs(kernel, schedule, column0, width, "$dot_row")


def _pack_each_row(kernel: MatmulKernel, schedule: MatrixVectorSchedule) -> None:
    """Each row of the first factor packed contiguously along the reduction (row ``r`` at
    ``scratch + sums + r * 4 * max_depth``), its prologue evaluated once per element."""
    emitter, body, info = kernel.emitter, kernel.body, kernel.info
    panel = add(get("$scratch"), const(_sums_bytes(schedule)))
    row = body.named("mv_row")
    body.set(row, const(0))
    with body.block("$rows_packed"):
        body.br_if("$rows_packed", op("i32.ge_u", get(row), get("$rows")))
        with body.loop("$pack_row"):
            body.comment("this row of the first factor, contiguous along the reduction")
            pack(emitter, body, info, info.a, kernel.row_axes, kernel.row_extents, get(row), get("$rows"), 1,
                 add(panel, mul(get(row), const(4 * schedule.max_depth))))
            body.increment(row)
            body.br_if("$pack_row", op("i32.lt_u", get(row), get("$rows")))


def _panel_block(kernel: MatmulKernel, schedule: MatrixVectorSchedule, column0: str, width: str) -> None:
    """One block where the call site's panels of the second factor are prepacked
    (``matmul_packed.PrepackedFactor``): each row of the first factor packed contiguously
    (as for dot products: a row's 3 KB at 768 steps stay in L1 beside the panel streaming
    through; packed as for the streamed form, 32 bytes a step, GPT-2's decode step read its
    weights at 12-13 GB/s), the sums of every row from the panels (:func:`_panel_sums`),
    then per row the epilogue of each."""
    _pack_each_row(kernel, schedule)
    _panel_sums(kernel.body, schedule, kernel.prepacked.panel_columns, column0, width)
    _each_row_outputs(kernel, schedule, column0, width, "$panel_row")


def _panel_sums(body: Body, schedule: MatrixVectorSchedule, panel_columns: int, column0: str, width: str) -> None:
    """The sums of every row over the block's ``width`` columns, into the scratch (as
    :func:`_streamed_sums` leaves them), read from the prepacked panels: a panel's columns
    at a time where the block holds the whole panel, else four (a block's run of units may
    start or end in the middle of a panel), and for those columns the rows in groups
    (:func:`_panel_rows`).  A panel's ``K x panel_columns`` floats are contiguous, so the
    second factor is read as one stream in the order it lies (rows of it, as the streamed
    form reads it, are a stream each: GPT-2's decode step read its weights at about 17 GB/s
    so, where one stream reads 29-33 of the 36 GB/s that a plain sum of a buffer reaches in
    V8); the row groups after the first read the panel from the cache."""
    column, column_end, panel_bytes, panel = (body.named(name) for name in (
        "panel_column", "panel_column_end", "panel_bytes", "panel_at"))
    body.set(column, get(column0))
    body.comment("whole f32x4 of sums: the lanes past the width are never stored")
    body.set(column_end, add(get(column0), op("i32.and", add(get(width), const(3)), const(-4))))
    body.set(panel_bytes, mul(get("$depth"), const(4 * panel_columns)))
    with body.block("$panel_columns_done"):
        body.br_if("$panel_columns_done", op("i32.ge_u", get(column), get(column_end)))
        with body.loop("$panel_columns"):
            body.comment("the panel holding this column, at its lane")
            body.set(panel, add(add(get(PREPACKED), const(PREPACKED_HEADER_BYTES)), add(
                mul(div_u(get(column), const(panel_columns)), get(panel_bytes)),
                op("i32.shl", op("i32.rem_u", get(column), const(panel_columns)), const(2)))))
            whole = op("i32.and", op("i32.eqz", op("i32.rem_u", get(column), const(panel_columns))),
                       op("i32.le_u", add(get(column), const(panel_columns)), get(column_end)))
            with body.if_(whole):
                with body.then():
                    _panel_rows(body, schedule, panel_columns, panel_columns // 4, column, column0, panel)
                    body.increment(column, panel_columns)
                with body.else_():
                    _panel_rows(body, schedule, panel_columns, 1, column, column0, panel)
                    body.increment(column, 4)
            body.br_if("$panel_columns", op("i32.lt_u", get(column), get(column_end)))


PANEL_ROWS = 4
"""The most rows that share each load of a panel in :func:`_panel_rows` (with a panel's two
f32x4 of columns, 8 sums in registers, as the packed tier's micro-kernel holds)."""


def _panel_rows(body: Body, schedule: MatrixVectorSchedule, panel_columns: int, quads: int, column: str,
                column0: str, panel: str) -> None:
    """The sums of every row over ``quads`` f32x4 of columns from the panel at ``panel``
    (steps ``4 * panel_columns`` bytes apart), stored: the rows in groups (``PANEL_ROWS``
    while as many remain, then halves), each f32x4 of the panel loaded once for the group's
    rows and multiplied into each with the row's packed first factor splatted.  A sum adds
    its products step after step, as the streamed form's and the packed tier's do: a row's
    outputs are the same bits whatever the other rows, the quads and the panel's alignment,
    and those of the weight read in place (but for the columns past the last whole f32x4,
    which the streamed form takes one by one).  That order keeps a sum's multiply-adds in a chain; a
    row alone is bound by memory all the same (a loop of this shape over a weight in memory
    read 29 GB/s in V8, against 32 with two partial sums per f32x4), and a group of 4 rows
    reading from L1 runs at 42 GFLOP/s."""
    row = body.named("mv_row")
    body.set(row, const(0))
    for group in _row_groups(PANEL_ROWS):
        _panel_group(body, schedule, panel_columns, quads, group, column, column0, panel, row)


def _panel_group(body: Body, schedule: MatrixVectorSchedule, panel_columns: int, quads: int, group: int,
                 column: str, column0: str, panel: str, row: str) -> None:
    """A loop over groups of ``group`` rows from ``row`` while as many remain (see
    :func:`_panel_rows`)."""
    label = f"$panel_rows{group}x{quads}"
    factors, weight, count = (body.named(name) for name in ("panel_factors", "panel_weight", "panel_count"))
    factor = body.named("panel_factor", "v128")
    values = [body.named(f"panel_value{q}", "v128") for q in range(quads)]
    sums = [[body.named(f"panel_sum{g}_{q}", "v128") for q in range(quads)] for g in range(group)]
    row_bytes = 4 * schedule.max_depth  # between two rows' packed first factors
    body.comment(f"{group} row{'s' if group > 1 else ''} at a time")
    with body.block(f"{label}_done"):
        with body.loop(label):
            body.br_if(f"{label}_done", op("i32.gt_u", add(get(row), const(group)), get("$rows")))
            body.set(factors, add(add(get("$scratch"), const(_sums_bytes(schedule))), mul(get(row), const(row_bytes))))
            body.set(weight, get(panel))
            for total in (total for line in sums for total in line):
                body.set(total, "(v128.const i32x4 0 0 0 0)")
            body.set(count, get("$depth"))
            with body.block(f"{label}_steps_done"):
                body.br_if(f"{label}_steps_done", op("i32.eqz", get(count)))
                with body.loop(f"{label}_steps"):
                    for q, value in enumerate(values):
                        body.set(value, f"(v128.load{_offset(16 * q)} {get(weight)})")
                    for g in range(group):
                        body.set(factor, f"(v128.load32_splat{_offset(row_bytes * g)} {get(factors)})")
                        for q, value in enumerate(values):
                            body.set(sums[g][q], multiply_add(get(factor), get(value), get(sums[g][q])))
                    body.increment(factors, 4)
                    body.increment(weight, 4 * panel_columns)
                    body.count_down(count, f"{label}_steps")
            for g in range(group):
                sums_at = add(_row_sums(schedule, add(get(row), const(g)) if g else get(row)),
                              op("i32.shl", sub(get(column), get(column0)), const(2)))
                for q in range(quads):
                    body.store("v128.store", sums_at, get(sums[g][q]), 16 * q)
            body.increment(row, group)
            body.br(label)


def _column_bytes(kernel: MatmulKernel) -> int | None:
    """The bytes between two consecutive columns of the second factor where that is a
    constant (one column axis: a [classes, features] weight's features), else None."""
    info = kernel.info
    if len(kernel.column_axes) != 1:
        return None
    axis = kernel.column_axes[0]
    moved = tuple(substitute(index, {axis.name: axis + 1}) for index in info.b.indices)
    distance = as_int(simplify(flat_offset(info.b.buffer, moved) - flat_offset(info.b.buffer, info.b.indices)))
    return None if distance is None else 4 * distance


def _dot_sums(kernel: MatmulKernel, schedule: MatrixVectorSchedule, column0: str, width: str) -> None:
    """The dot products of the packed rows with the block's ``width`` columns, into the
    scratch's sums: ``dot_columns`` columns at a time, then the rest one at a time; for
    those columns, the rows in groups (:func:`_dot_group`: ``dot_rows`` rows while as many
    remain, then halves).  The columns are read from one pointer where they are a constant
    distance apart (:func:`_column_bytes`), else each from its own."""
    emitter, body, info = kernel.emitter, kernel.body, kernel.info
    column, column_end, row = (body.named(name) for name in ("dot_column", "dot_column_end", "mv_row"))
    vector_bytes, bytes_ = body.named("dot_vector_bytes"), body.named("dot_bytes")
    first_step = {axis.name: IntImm(0) for axis in info.reduce_axes}
    column_bytes = _column_bytes(kernel)
    body.set(column, get(column0))
    body.set(column_end, add(get(column0), get(width)))
    body.comment("the bytes of a row's whole f32x4 of reduction steps, and of all its steps")
    body.set(vector_bytes, op("i32.shl", op("i32.and", get("$depth"), const(-4)), const(2)))
    body.set(bytes_, op("i32.shl", get("$depth"), const(2)))
    for count, label in ((schedule.dot_columns, "dot_group"), (1, "dot_single")):
        starts = [body.named(f"dot_b{c}") for c in range(count if column_bytes is None else 1)]
        body.comment(f"{count} column{'s' if count > 1 else ''} at a time")
        with body.block(f"${label}_done"):
            with body.loop(f"${label}"):
                body.br_if(f"${label}_done", op("i32.gt_u", add(get(column), const(count)), get(column_end)))
                body.comment("the columns' first step" if len(starts) > 1 else "the first column's first step")
                for c, start in enumerate(starts):
                    emitter.open_scope()
                    linear = add(get(column), const(c)) if c else get(column)
                    declare_axes(emitter, kernel.column_axes, kernel.column_extents,
                                 unflatten_into(emitter, body, kernel.column_extents, linear, f"xq{c}_"))
                    indices = tuple(substitute(index, first_step) for index in info.b.indices)
                    body.set(start, emitter.element_address(info.b.buffer, indices))
                    emitter.close_scope()
                body.set(row, const(0))
                for group in _row_groups(schedule.dot_rows):
                    _dot_group(body, schedule, label, starts, count, column_bytes, group, column, column0, row,
                               vector_bytes, bytes_)
                body.increment(column, count)
                body.br(f"${label}")


def _dot_group(body: Body, schedule: MatrixVectorSchedule, label: str, starts: list[str], count: int,
               column_bytes: int | None, group: int, column: str, column0: str, row: str, vector_bytes: str,
               bytes_: str) -> None:
    """A loop over groups of ``group`` rows from ``row`` while as many remain: the dot
    products of each with the ``count`` columns whose first steps are at ``starts`` (one
    local per column, or the first where they are ``column_bytes`` apart), stored as its
    sums.  One f32x4 sum per row and column, four reduction steps per load (each load of a
    column shared by the group's rows, each load of a row by the columns), the steps past
    the last whole four added one by one, each sum's lanes added at the end: a sum's order
    is the same whatever the group, so a row's results do not depend on the other rows."""
    label = f"{label}_rows{group}"
    row_bytes = 4 * schedule.max_depth  # between two packed rows
    sources = [body.named(f"dot_w{c}") for c in range(len(starts))]
    a, vector_end, end = body.named("dot_a"), body.named("dot_vector_end"), body.named("dot_end")
    left = body.named("dot_left")
    sums = [[body.named(f"dot_sum{g}_{c}", "v128") for c in range(count)] for g in range(group)]
    tails = [[body.named(f"dot_tail{g}_{c}", "f32") for c in range(count)] for g in range(group)]
    columns = {kind: [body.named(f"dot_w{letter}{c}", kind) for c in range(count)]
               for kind, letter in (("v128", "v"), ("f32", "s"))}
    factors = {kind: body.named(f"dot_a{letter}", kind) for kind, letter in (("v128", "v"), ("f32", "s"))}

    def column_value(kind: str, c: int) -> str:
        if len(sources) > 1:
            return f"({kind}.load {get(sources[c])})"
        return f"({kind}.load{_offset(c * (column_bytes or 0))} {get(sources[0])})"

    body.comment(f"{group} row{'s' if group > 1 else ''} at a time")
    with body.block(f"${label}_done"):
        with body.loop(f"${label}"):
            body.br_if(f"${label}_done", op("i32.gt_u", add(get(row), const(group)), get("$rows")))
            for source, start in zip(sources, starts):
                body.set(source, get(start))
            body.set(a, add(get("$scratch"), add(const(_sums_bytes(schedule)), mul(get(row), const(row_bytes)))))
            body.set(vector_end, add(get(a), get(vector_bytes)))
            body.set(end, add(get(a), get(bytes_)))
            for total in (s for line in sums for s in line):
                body.set(total, "(v128.const i32x4 0 0 0 0)")
            for tail in (t for line in tails for t in line):
                body.set(tail, "(f32.const 0)")
            for kind, size, last, loop in (("v128", 16, vector_end, "vectors"), ("f32", 4, end, "steps")):
                if kind == "v128":
                    body.comment("four reduction steps at a time: each column's f32x4 into every row of the group")
                else:
                    body.comment("the steps past the last whole four, one by one")
                with body.block(f"${label}_{loop}_done"):
                    body.br_if(f"${label}_{loop}_done", op("i32.ge_u", get(a), get(last)))
                    body.set(left, _steps_to(get(a), get(last), size))
                    with body.loop(f"${label}_{loop}"):
                        for c, value in enumerate(columns[kind]):
                            body.set(value, column_value(kind, c))
                        for g in range(group):
                            body.set(factors[kind], f"({kind}.load{_offset(row_bytes * g)} {get(a)})")
                            for total, value in zip(sums[g] if kind == "v128" else tails[g], columns[kind]):
                                if kind == "v128":
                                    body.set(total, multiply_add(get(factors[kind]), get(value), get(total)))
                                else:
                                    body.set(total, f"(f32.add {get(total)} (f32.mul {get(factors[kind])} {get(value)}))")
                        for source in sources:
                            body.increment(source, size)
                        body.increment(a, size)
                        body.count_down(left, f"${label}_{loop}")
            body.comment("each sum's lanes added, then its steps past the last four; stored")
            for g in range(group):
                row_at = add(_row_sums(schedule, add(get(row), const(g)) if g else get(row)),
                             op("i32.shl", sub(get(column), get(column0)), const(2)))
                for c, (total, tail) in enumerate(zip(sums[g], tails[g])):
                    lanes = [f"(f32x4.extract_lane {lane} {get(total)})" for lane in range(4)]
                    body.store("f32.store", row_at, f"(f32.add (f32.add (f32.add {lanes[0]} {lanes[1]}) "
                                                    f"(f32.add {lanes[2]} {lanes[3]})) {get(tail)})", 4 * c)
            body.increment(row, group)
            body.br(f"${label}")


def _streamed_sums(body: Body, schedule: MatrixVectorSchedule, weight: str, step: str, step_bytes: int | None,
                   width: str) -> None:
    """The sums of every row over the block's ``width`` columns, into the scratch (one f32
    per column, row ``r``'s from ``scratch + r * 4 * columns``).  ``steps`` reduction steps
    at a time while as many remain, then one step at a time; at each, the rows in groups
    (:func:`_streamed_group`), the first of which reads the steps' rows of the second factor
    (``steps`` x ``width`` floats) from memory, the others from the L1 cache.  ``step``:
    the local holding the bytes between two steps of the second factor; ``step_bytes``
    that distance where it is a constant (the steps' rows are then read from one pointer,
    at constant offsets)."""
    k, a, w = (body.named(name) for name in ("mv_k", "mv_a", "mv_w"))
    vector_bytes, bytes_, row, sum_, end = (body.named(name) for name in (
        "mv_vector_bytes", "mv_bytes", "mv_row", "mv_sum", "mv_end"))
    body.set(vector_bytes, op("i32.shl", op("i32.shr_u", get(width), const(2)), const(4)))
    body.set(bytes_, op("i32.shl", get(width), const(2)))
    body.comment("every row's sums start at 0 (whole f32x4: the lanes past the width are never stored)")
    body.set(row, const(0))
    with body.block("$mv_zeroed"):
        body.br_if("$mv_zeroed", op("i32.ge_u", get(row), get("$rows")))
        with body.loop("$mv_zero_row"):
            body.set(sum_, _row_sums(schedule, get(row)))
            body.set(end, add(get(sum_), get(bytes_)))
            with body.loop("$mv_zero"):
                body.store("v128.store", get(sum_), "(v128.const i32x4 0 0 0 0)")
                body.increment(sum_, 16)
                body.br_if("$mv_zero", op("i32.lt_u", get(sum_), get(end)))
            body.increment(row)
            body.br_if("$mv_zero_row", op("i32.lt_u", get(row), get("$rows")))
    body.set(a, add(get("$scratch"), const(_sums_bytes(schedule))))
    body.set(w, get(weight))
    body.set(k, const(0))
    for steps, label in ((schedule.steps, "mv_steps"), (1, "mv_step")):
        # each step's row of the second factor: from one pointer where the distance is constant
        rows = [body.named(f"mv_w{s}") for s in range(1, steps)] if step_bytes is None else []
        body.comment(f"{steps} reduction step{'s' if steps > 1 else ''} at a time, for every row")
        with body.block(f"${label}_done"):
            with body.loop(f"${label}"):
                body.br_if(f"${label}_done", op("i32.gt_u", add(get(k), const(steps)), get("$depth")))
                if rows:
                    body.comment("the steps' rows of the second factor")
                for s, start in enumerate(rows):
                    body.set(start, add(get(rows[s - 1]) if s else get(w), get(step)))
                starts = [get(w), *(get(start) for start in rows)]
                body.set(row, const(0))
                for group in _row_groups(schedule.max_rows):
                    _streamed_group(body, schedule, label, starts, steps, step_bytes, group, a, row, vector_bytes,
                                    bytes_)
                body.increment(a, 4 * schedule.max_rows * steps)
                body.increment(w, mul(get(step), const(steps)) if steps > 1 else get(step))
                body.increment(k, steps)
                body.br(f"${label}")


def _streamed_group(body: Body, schedule: MatrixVectorSchedule, label: str, starts: list[str], steps: int,
                    step_bytes: int | None, group: int, a: str, row: str, vector_bytes: str, bytes_: str) -> None:
    """A loop over groups of ``group`` rows from ``row`` while as many remain: their sums
    take ``steps`` steps whose rows of the second factor start at ``starts`` (i32 WAT
    values: one per step, or the first where the steps are ``step_bytes`` apart).  The
    second factor is read in order, four columns per f32x4, each f32x4 loaded once for the
    group's rows; a row's sum is loaded and stored once per four columns and the steps;
    each product's factor splatted from the packed first factor where it is used (from
    L1: held in locals, 8 rows x 4 steps of them did not fit the registers), each step a
    multiply-add (``relaxed_simd.multiply_add``: fused where the engine has relaxed SIMD; in
    V8 8 rows of a 768 x 3072 weight took 0.87x their time, one row 0.98x).  Then the
    columns beyond the last whole f32x4 one by one (a ``v128.load`` past a row's end could
    leave the buffer).  Each sum adds its products step by step, whatever the group, so a
    row's results do not depend on the other rows."""
    label = f"{label}_rows{group}"
    sum_, vector_end, end, factors = (body.named(name) for name in ("mv_sum", "mv_vector_end", "mv_end", "mv_factors"))
    count = body.named("mv_count")
    sources = [body.named(f"mv_source{s}") for s in range(len(starts))]
    vectors = [body.named(f"mv_wv{s}", "v128") for s in range(steps)]
    scalars = [body.named(f"mv_ws{s}", "f32") for s in range(steps)]
    rows_bytes = 4 * schedule.columns  # between two rows' sums
    accumulator = body.named("mv_accumulator", "v128")

    def weight(kind: str, s: int) -> str:
        """Step ``s``'s value of the second factor at the sources (``kind``: v128 or f32)."""
        if len(sources) > 1:
            return f"({kind}.load {get(sources[s])})"
        return f"({kind}.load{_offset(s * (step_bytes or 0))} {get(sources[0])})"

    def factor(kind: str, g: int, s: int) -> str:
        """Row ``g``'s packed first factor at step ``s``, splatted (v128) or as an f32."""
        load = "v128.load32_splat" if kind == "v128" else "f32.load"
        return f"({load}{_offset(4 * (schedule.max_rows * s + g))} {get(factors)})"

    body.comment(f"{group} row{'s' if group > 1 else ''} at a time")
    with body.block(f"${label}_done"):
        with body.loop(f"${label}"):
            body.br_if(f"${label}_done", op("i32.gt_u", add(get(row), const(group)), get("$rows")))
            body.set(factors, add(get(a), op("i32.shl", get(row), const(2))))
            for source, start in zip(sources, starts):
                body.set(source, start)
            body.set(sum_, _row_sums(schedule, get(row)))
            body.set(vector_end, add(get(sum_), get(vector_bytes)))
            body.set(end, add(get(sum_), get(bytes_)))
            for kind, size, values, last, loop in (("v128", 16, vectors, vector_end, "vectors"),
                                                   ("f32", 4, scalars, end, "columns")):
                if kind == "v128":
                    body.comment("four columns at a time: each f32x4 of the second factor into every row of the group")
                else:
                    body.comment("the columns past the last whole f32x4, one by one")
                lanes = "f32x4" if kind == "v128" else "f32"
                with body.block(f"${label}_{loop}_done"):
                    body.br_if(f"${label}_{loop}_done", op("i32.ge_u", get(sum_), get(last)))
                    body.set(count, _steps_to(get(sum_), get(last), size))
                    with body.loop(f"${label}_{loop}"):
                        for s, value in enumerate(values):
                            body.set(value, weight(kind, s))
                        for g in range(group):
                            total = f"({kind}.load{_offset(rows_bytes * g)} {get(sum_)})"
                            if kind == "v128":
                                body.set(accumulator, total)
                                for s, value in enumerate(values):
                                    body.set(accumulator, multiply_add(factor(kind, g, s), get(value), get(accumulator)))
                                total = get(accumulator)
                            else:
                                for s, value in enumerate(values):
                                    total = f"({lanes}.add {total} ({lanes}.mul {factor(kind, g, s)} {get(value)}))"
                            body.store(f"{kind}.store", get(sum_), total, rows_bytes * g)
                        for source in sources:
                            body.increment(source, size)
                        body.increment(sum_, size)
                        body.count_down(count, f"${label}_{loop}")
            body.increment(row, group)
            body.br(f"${label}")


def _steps_to(address: str, last: str, size: int) -> str:
    """The iterations of a loop that advances ``address`` by ``size`` bytes while it is below
    ``last`` (at least one: the loop is entered with ``address < last``), as the count a
    counted loop takes down to zero (``Body.count_down``)."""
    return op("i32.shr_u", add(sub(last, address), const(size - 1)), const(size.bit_length() - 1))


def _outputs(kernel: MatmulKernel, sums: str, row: str, column0: str, width: str) -> None:
    """A loop over the block's ``width`` columns of row ``row`` (its axes recovered once):
    the epilogue of each sum (from ``sums``: an i32 WAT address, one f32 per column),
    stored."""
    emitter, body, info, program = kernel.emitter, kernel.body, kernel.info, kernel.program
    column, column_end, row_sums = body.named("mv_column"), body.named("mv_column_end"), body.named("mv_row_sums")
    body.set(row_sums, sums)
    body.set(column, get(column0))
    body.set(column_end, add(get(column0), get(width)))
    emitter.open_scope()
    declare_axes(emitter, kernel.row_axes, kernel.row_extents,
                 unflatten_into(emitter, body, kernel.row_extents, get(row), "yv"))
    with body.block("$mv_outputs_done"):
        body.br_if("$mv_outputs_done", op("i32.ge_u", get(column), get(column_end)))
        with body.loop("$mv_output"):
            emitter.open_scope()
            declare_axes(emitter, kernel.column_axes, kernel.column_extents,
                         unflatten_into(emitter, body, kernel.column_extents, get(column), "yw"))
            offset = emitter.index(flat_offset(program.output, tuple(program.axes)))
            address = emitter.set_local(emitter.address(program.output.name, offset), "i32", body.indent, "address")
            sum_at = add(get(row_sums), op("i32.shl", sub(get(column), get(column0)), const(2)))
            emitter.known(info.reduction, f"(f32.load {sum_at})")
            body.line(store(program.output.dtype, address, emitter.scalar(program.body, body.indent)))
            emitter.close_scope()
            body.increment(column)
            body.br_if("$mv_output", op("i32.lt_u", get(column), get(column_end)))
    emitter.close_scope()


MATRIX_VECTOR_TIER = Tier(matrix_vector_main, matrix_vector_units)  # type: ignore[arg-type]
