"""The ``matrix_vector`` kind (``MatrixVectorSchedule``) as the first tier of a matmul kernel
(``matmul.py``): where the rows are at most ``max_rows`` and the reduction at most
``max_depth`` steps (a decoder's step), units of at most ``columns`` columns (per batch
index; the blocks of a row as even as multiples of 4 allow, so threads get even shares).

Such a matmul gains nothing from panels: its time is the second factor's bytes, read once.
Streamed (the second factor read in place, contiguous along the only column axis): the first
factor is packed once per unit ([K x max_rows], its prologue evaluated once per element),
then for each row the block's sums (in the scratch) take ``steps`` rows of the second factor
at a time, each read in order along its columns (:func:`_streamed_unit`).  Under wasmtime on
one thread, a 768 x 3072 float32 weight: about 10 GB/s this way, 4-6 GB/s with the sums in
registers and the weight read down its columns, 1.5 GB/s on the packed path; the GPT-2
decode step's kernels took 120, 106 and 95 ms with blocks of 128, 256 and 512 columns (the
longer runs of each weight row stream better, and the prologue is packed for fewer units).
One row at a time: up to 8 rows this is still faster than the packed path's micro-kernels of
4 rows (768 x 3072, 8 rows: 4.0 against 4.5 ms, the block's weight reread from the cache for
each row).  With ``dot_products`` (each column contiguous along the reduction): each row of
the first factor packed, each column's sum a dot product of two runs (:func:`_dot_unit`).
"""

from __future__ import annotations

from ...ir.access import flat_offset
from ...ir.matmul_layout import direct_columns
from ...ir.symbolic import IntImm, substitute
from ...ir.wasm_schedule import MatrixVectorSchedule
from ..emit import store
from ..wat_builder import Body, add, call, const, div_u, get, mul, op, sub
from .common import declare_axes, unflatten_into
from .matmul_kernel import MatmulKernel, Tier, UnitSizes
from .packing import pack


def matrix_vector_main(kernel: MatmulKernel, schedule: MatrixVectorSchedule) -> None:
    """The tier's part of ``$main``: where its condition holds, units ``$first <= u < $end``
    of column blocks, then return.  Reads the locals ``$rows``, ``$columns``, ``$depth`` and
    ``$unit`` that the kernel set."""
    emitter, body = kernel.emitter, kernel.body
    unit, blocks, batch, column0, width, block_width = (
        body.named(name) for name in ("unit", "mv_blocks", "mv_batch", "mv_column0", "mv_width", "mv_block_width"))
    with body.if_(_condition(schedule, get("$rows"), get("$depth"))):
        with body.then():
            body.set(blocks, div_u(add(get("$columns"), const(schedule.columns - 1)), const(schedule.columns)))
            with body.block("$matvec_done"):
                body.br_if("$matvec_done", op("i32.ge_u", get(unit), get("$end")))
                with body.loop("$matvec_unit"):
                    body.set(batch, div_u(get(unit), get(blocks)))
                    # ceil(columns / blocks) <= columns of a block, a multiple of 4: rounded up, the
                    # widths still leave each block's first column inside (blocks - 1 blocks hold
                    # fewer than the columns)
                    body.comment("the blocks' width: the columns shared evenly, rounded up to a multiple of 4")
                    body.set(block_width, op("i32.and", add(div_u(add(get("$columns"), sub(get(blocks), const(1))),
                                                                  get(blocks)), const(3)), const(-4)))
                    body.set(column0, mul(op("i32.rem_u", get(unit), get(blocks)), get(block_width)))
                    body.set(width, call("$min_u32", sub(get("$columns"), get(column0)), get(block_width)))
                    emitter.open_scope()
                    declare_axes(emitter, kernel.batch_axes, kernel.batch_extents,
                                 unflatten_into(emitter, body, kernel.batch_extents, get(batch), "xm"))
                    unit_statements = _dot_unit if schedule.dot_products else _streamed_unit
                    unit_statements(kernel, schedule, column0, width)
                    emitter.close_scope()
                    body.increment(unit)
                    body.br_if("$matvec_unit", op("i32.lt_u", get(unit), get("$end")))
            body.line("(return)")


def matrix_vector_units(sizes: UnitSizes, schedule: MatrixVectorSchedule, then: str | None) -> str:
    """Per batch index, a unit per ``columns`` columns (rounded up) where the tier runs; the
    tier after (``then``) elsewhere."""
    units = mul(sizes.batch, div_u(add(sizes.columns, const(schedule.columns - 1)), const(schedule.columns)))
    return f"(select {units} {then} {_condition(schedule, sizes.rows, sizes.depth)})"


def _condition(schedule: MatrixVectorSchedule, rows: str, depth: str) -> str:
    """An i32 WAT value, nonzero where the tier runs: at most ``max_rows`` rows and
    ``max_depth`` reduction steps (``rows``, ``depth``: i32 WAT values)."""
    return op("i32.and", op("i32.le_u", rows, const(schedule.max_rows)),
              op("i32.le_u", depth, const(schedule.max_depth)))


def _sums_bytes(schedule: MatrixVectorSchedule) -> int:
    """The scratch's first bytes: a unit's sums, one f32 per column."""
    return 4 * schedule.columns


def _streamed_unit(kernel: MatmulKernel, schedule: MatrixVectorSchedule, column0: str, width: str) -> None:
    """One unit (the batch axes in scope): the ``width`` columns from ``column0``, every row.
    The first factor packed for all rows (lane ``r`` of step ``k`` at ``scratch + sums + 4 *
    (k * max_rows + r)``); per row, the sums (:func:`_streamed_sums`) then the epilogue of
    each, stored."""
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
    body.set(step, op("i32.shl", emitter.index(direct_columns(info, program)), const(2)))
    emitter.close_scope()
    row = body.named("mv_row")
    body.set(row, const(0))
    with body.block("$matvec_rows_done"):
        body.br_if("$matvec_rows_done", op("i32.ge_u", get(row), get("$rows")))
        with body.loop("$matvec_row"):
            _streamed_sums(body, schedule, row, weight, step, width)
            _outputs(kernel, row, column0, width)
            body.increment(row)
            body.br_if("$matvec_row", op("i32.lt_u", get(row), get("$rows")))


def _dot_unit(kernel: MatmulKernel, schedule: MatrixVectorSchedule, column0: str, width: str) -> None:
    """One unit when the second factor's columns are contiguous along the reduction
    (``matmul_layout.dot_columns``): per row, the row of the first factor packed contiguously
    (``scratch + sums``, its prologue evaluated once per element), then each column's sum a
    dot product of the two runs (:func:`_dot_sums`) into the scratch's sums, then the
    epilogue of each."""
    emitter, body, info = kernel.emitter, kernel.body, kernel.info
    panel = add(get("$scratch"), const(_sums_bytes(schedule)))
    row = body.named("mv_row")
    body.set(row, const(0))
    with body.block("$dot_rows_done"):
        body.br_if("$dot_rows_done", op("i32.ge_u", get(row), get("$rows")))
        with body.loop("$dot_row"):
            body.comment("this row of the first factor, contiguous along the reduction")
            pack(emitter, body, info, info.a, kernel.row_axes, kernel.row_extents, get(row), get("$rows"), 1, panel)
            _dot_sums(kernel, schedule, column0, width)
            _outputs(kernel, row, column0, width)
            body.increment(row)
            body.br_if("$dot_row", op("i32.lt_u", get(row), get("$rows")))


def _dot_sums(kernel: MatmulKernel, schedule: MatrixVectorSchedule, column0: str, width: str) -> None:
    """The dot products of the packed row with the unit's ``width`` columns, into the
    scratch's sums: ``dot_columns`` columns at a time (one f32x4 sum each, four reduction
    steps per load, the packed row's load shared), then the rest one at a time; the steps
    past the last whole four added one by one, each sum's lanes added at the end."""
    emitter, body, info = kernel.emitter, kernel.body, kernel.info
    column, column_end, k, vector_depth, a = (body.named(name) for name in (
        "dot_column", "dot_column_end", "dot_k", "dot_vector_depth", "dot_a"))
    first_step = {axis.name: IntImm(0) for axis in info.reduce_axes}
    body.set(column, get(column0))
    body.set(column_end, add(get(column0), get(width)))
    body.set(vector_depth, op("i32.and", get("$depth"), const(-4)))
    for count, label in ((schedule.dot_columns, "dot_group"), (1, "dot_single")):
        addresses = [body.named(f"dot_b{c}") for c in range(count)]
        sums = [body.named(f"dot_sum{c}", "v128") for c in range(count)]
        tails = [body.named(f"dot_tail{c}", "f32") for c in range(count)]
        body.comment(f"{count} column{'s' if count > 1 else ''} at a time")
        with body.block(f"${label}_done"):
            with body.loop(f"${label}"):
                body.br_if(f"${label}_done", op("i32.gt_u", add(get(column), const(count)), get(column_end)))
                for c, address in enumerate(addresses):
                    emitter.open_scope()
                    linear = add(get(column), const(c)) if c else get(column)
                    declare_axes(emitter, kernel.column_axes, kernel.column_extents,
                                 unflatten_into(emitter, body, kernel.column_extents, linear, f"xq{c}_"))
                    indices = tuple(substitute(index, first_step) for index in info.b.indices)
                    body.set(address, emitter.element_address(info.b.buffer, indices))
                    emitter.close_scope()
                for total in sums:
                    body.set(total, "(v128.const i32x4 0 0 0 0)")
                for tail in tails:
                    body.set(tail, "(f32.const 0)")
                body.set(a, add(get("$scratch"), const(_sums_bytes(schedule))))
                body.set(k, const(0))
                with body.block(f"${label}_vectors_done"):
                    body.br_if(f"${label}_vectors_done", op("i32.ge_u", get(k), get(vector_depth)))
                    with body.loop(f"${label}_vectors"):
                        body.set("$dot_row_vector", f"(v128.load {get(a)})")
                        body.named("dot_row_vector", "v128")
                        for total, address in zip(sums, addresses):
                            body.set(total, f"(f32x4.add {get(total)} (f32x4.mul {get('$dot_row_vector')} "
                                            f"(v128.load {get(address)})))")
                            body.increment(address, 16)
                        body.increment(a, 16)
                        body.increment(k, 4)
                        body.br_if(f"${label}_vectors", op("i32.lt_u", get(k), get(vector_depth)))
                with body.block(f"${label}_steps_done"):
                    body.br_if(f"${label}_steps_done", op("i32.ge_u", get(k), get("$depth")))
                    with body.loop(f"${label}_steps"):
                        for tail, address in zip(tails, addresses):
                            product = f"(f32.mul (f32.load {get(a)}) (f32.load {get(address)}))"
                            body.set(tail, f"(f32.add {get(tail)} {product})")
                            body.increment(address, 4)
                        body.increment(a, 4)
                        body.increment(k)
                        body.br_if(f"${label}_steps", op("i32.lt_u", get(k), get("$depth")))
                for c, (total, tail) in enumerate(zip(sums, tails)):
                    lanes = [f"(f32x4.extract_lane {lane} {get(total)})" for lane in range(4)]
                    sum_at = add(get("$scratch"), op("i32.shl", sub(get(column), get(column0)), const(2)))
                    body.store("f32.store", sum_at, f"(f32.add (f32.add (f32.add {lanes[0]} {lanes[1]}) "
                                                    f"(f32.add {lanes[2]} {lanes[3]})) {get(tail)})", 4 * c)
                body.increment(column, count)
                body.br(f"${label}")


def _streamed_sums(body: Body, schedule: MatrixVectorSchedule, row: str, weight: str, step: str, width: str) -> None:
    """The sums of row ``row`` over the unit's ``width`` columns, into the scratch (one f32
    per column from ``$scratch``).  ``steps`` reduction steps at a time while as many remain
    (one splat of the packed first factor per step, the second factor's rows read in order,
    four columns per f32x4, a sum loaded and stored once per four products), then one step
    at a time; columns beyond the last whole f32x4 are summed one by one (a ``v128.load``
    past a row's end could leave the buffer)."""
    k, a, w, sum_, vector_end, end = (body.named(name) for name in ("mv_k", "mv_a", "mv_w", "mv_sum", "mv_vector_end",
                                                                      "mv_end"))
    body.set(vector_end, add(get("$scratch"), op("i32.shl", op("i32.shr_u", get(width), const(2)), const(4))))
    body.set(end, add(get("$scratch"), op("i32.shl", get(width), const(2))))
    body.comment("the sums start at 0 (whole f32x4: the lanes past the width are never stored)")
    body.set(sum_, get("$scratch"))
    with body.block("$mv_zeroed"):
        body.br_if("$mv_zeroed", op("i32.ge_u", get(sum_), get(end)))
        with body.loop("$mv_zero"):
            body.store("v128.store", get(sum_), "(v128.const i32x4 0 0 0 0)")
            body.increment(sum_, 16)
            body.br_if("$mv_zero", op("i32.lt_u", get(sum_), get(end)))
    body.set(a, add(get("$scratch"), add(const(_sums_bytes(schedule)), op("i32.shl", get(row), const(2)))))
    body.set(w, get(weight))
    body.set(k, const(0))
    for steps, label in ((schedule.steps, "mv_steps"), (1, "mv_step")):
        factors = [body.named(f"mv_a{s}", "v128") for s in range(steps)]
        rows = [body.named(f"mv_w{s}") for s in range(steps)]
        body.comment(f"{steps} reduction step{'s' if steps > 1 else ''} at a time")
        with body.block(f"${label}_done"):
            with body.loop(f"${label}"):
                body.br_if(f"${label}_done", op("i32.gt_u", add(get(k), const(steps)), get("$depth")))
                for s, factor in enumerate(factors):
                    body.set(factor, f"(v128.load32_splat offset={4 * schedule.max_rows * s} {get(a)})")
                body.set(rows[0], get(w))
                for s in range(1, steps):
                    body.set(rows[s], add(get(rows[s - 1]), get(step)))
                body.set(sum_, get("$scratch"))
                with body.block(f"${label}_vectors_done"):
                    body.br_if(f"${label}_vectors_done", op("i32.ge_u", get(sum_), get(vector_end)))
                    with body.loop(f"${label}_vectors"):
                        vector = f"(v128.load {get(sum_)})"
                        for factor, source in zip(factors, rows):
                            vector = f"(f32x4.add {vector} (f32x4.mul {get(factor)} (v128.load {get(source)})))"
                        body.store("v128.store", get(sum_), vector)
                        for source in rows:
                            body.increment(source, 16)
                        body.increment(sum_, 16)
                        body.br_if(f"${label}_vectors", op("i32.lt_u", get(sum_), get(vector_end)))
                body.comment("the columns past the last whole f32x4, one by one")
                with body.block(f"${label}_columns_done"):
                    body.br_if(f"${label}_columns_done", op("i32.ge_u", get(sum_), get(end)))
                    with body.loop(f"${label}_columns"):
                        value = f"(f32.load {get(sum_)})"
                        for factor, source in zip(factors, rows):
                            value = (f"(f32.add {value} (f32.mul (f32x4.extract_lane 0 {get(factor)}) "
                                     f"(f32.load {get(source)})))")
                        body.store("f32.store", get(sum_), value)
                        for source in rows:
                            body.increment(source, 4)
                        body.increment(sum_, 4)
                        body.br_if(f"${label}_columns", op("i32.lt_u", get(sum_), get(end)))
                body.increment(a, 4 * schedule.max_rows * steps)
                body.increment(w, mul(get(step), const(steps)) if steps > 1 else get(step))
                body.increment(k, steps)
                body.br(f"${label}")


def _outputs(kernel: MatmulKernel, row: str, column0: str, width: str) -> None:
    """A loop over the unit's ``width`` columns of row ``row`` (its axes recovered once):
    the epilogue of each sum in the scratch, stored."""
    emitter, body, info, program = kernel.emitter, kernel.body, kernel.info, kernel.program
    column, column_end = body.named("mv_column"), body.named("mv_column_end")
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
            sum_at = add(get("$scratch"), op("i32.shl", sub(get(column), get(column0)), const(2)))
            emitter.known(info.reduction, f"(f32.load {sum_at})")
            body.line(store(program.output.dtype, address, emitter.scalar(program.body, body.indent)))
            emitter.close_scope()
            body.increment(column)
            body.br_if("$mv_output", op("i32.lt_u", get(column), get(column_end)))
    emitter.close_scope()


MATRIX_VECTOR_TIER = Tier(matrix_vector_main, matrix_vector_units)  # type: ignore[arg-type]
