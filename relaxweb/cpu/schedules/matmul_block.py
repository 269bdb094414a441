"""The ``block_matmul`` kind (``BlockMatmulSchedule``) as a tier of a matmul kernel
(``matmul.py``): blocks of ``rows x columns`` outputs, one unit each (per batch index).

A whole block keeps its sums in ``rows x columns / 4`` v128 locals: at each reduction step
the first factor is evaluated once per row and splatted, the second read as f32x4 along the
columns (``v128.load`` where it is a plain load contiguous in the only column axis, one
address and constant offsets where its columns are a constant distance apart, else evaluated
per column and assembled lane by lane), and multiplied in (``relaxed_simd.multiply_add``: fused where
the engine has relaxed SIMD).  The sums are spilled to the scratch, and a loop over the block's
elements applies the epilogue (the body with the sum replaced by its value) and stores.  A
block at the edge of the output computes each of its elements on its own, as the element
form does.
"""

from __future__ import annotations

from typing import Callable

from ...ir.access import flat_offset
from ...ir.matmul_layout import column_strides, contiguous_columns
from ...ir.symbolic import PrimExpr, product, simplify
from ...ir.wasm_schedule import BlockMatmulSchedule
from ..emit import f32x4_of, store
from ..relaxed_simd import multiply_add
from ..wat_builder import add, const, div_u, get, mul, op
from .common import declare_axes, unflatten_into
from .matmul_kernel import MatmulKernel, Tier, UnitSizes


def block_main(kernel: MatmulKernel, schedule: BlockMatmulSchedule) -> None:
    """The block tier's part of ``$main``: units ``$first <= u < $end``, each a block."""
    emitter, body = kernel.emitter, kernel.body
    unit, row0, column0, full, batch = (get(f"${name}") for name in ("unit", "row0", "column0", "full", "batch"))
    with body.block("$done"):
        body.br_if("$done", op("i32.ge_u", unit, get("$end")))
        with body.loop("$block"):
            per_batch = mul(get("$row_blocks"), get("$column_blocks"))
            body.set("$batch", div_u(unit, per_batch))
            body.set("$row0", mul(div_u(op("i32.rem_u", unit, per_batch), get("$column_blocks")), const(schedule.rows)))
            body.set("$column0", mul(op("i32.rem_u", unit, get("$column_blocks")), const(schedule.columns)))
            body.set("$full", op("i32.and", op("i32.le_u", add(row0, const(schedule.rows)), get("$rows")),
                                 op("i32.le_u", add(column0, const(schedule.columns)), get("$columns"))))
            emitter.open_scope()
            declare_axes(emitter, kernel.batch_axes, kernel.batch_extents,
                         unflatten_into(emitter, body, kernel.batch_extents, batch, "xb"))
            with body.if_(full):
                with body.then():
                    _block_sums(kernel, schedule)
            _block_outputs(kernel, schedule)
            emitter.close_scope()
            body.increment("$unit")
            body.br_if("$block", op("i32.lt_u", unit, get("$end")))


def block_units(sizes: UnitSizes, schedule: BlockMatmulSchedule, then: str | None) -> str:
    """A unit per block of every batch index."""
    kernel = sizes.kernel
    blocks: PrimExpr = (product(kernel.batch_extents) * ((kernel.rows + (schedule.rows - 1)) // schedule.rows)
                        * ((kernel.columns + (schedule.columns - 1)) // schedule.columns))
    return sizes.value(simplify(blocks))


def _block_sums(kernel: MatmulKernel, schedule: BlockMatmulSchedule) -> None:
    """The statements of a whole block's sums, spilled to the scratch block (row-major)."""
    emitter, body, info, program = kernel.emitter, kernel.body, kernel.info, kernel.program
    lanes = schedule.columns // 4
    row_locals = [unflatten_into(emitter, body, kernel.row_extents, add(get("$row0"), const(r)), f"xr{r}_")
                  for r in range(schedule.rows)]
    vector_b = contiguous_columns(info, program)
    strides = None if vector_b else column_strides(info, program, schedule.columns)
    column_count = 1 if vector_b or strides is not None else schedule.columns
    column_locals = [unflatten_into(emitter, body, kernel.column_extents, add(get("$column0"), const(c)), f"xc{c}_")
                     for c in range(column_count)]
    sums = [[body.named(f"sum{r}_{q}", "v128") for q in range(lanes)] for r in range(schedule.rows)]
    for row in sums:
        for local in row:
            body.set(local, "(v128.const i32x4 0 0 0 0)")

    def in_columns(c: int, value: Callable[[], str], kind: str, prefix: str) -> str:
        emitter.open_scope()
        declare_axes(emitter, kernel.column_axes, kernel.column_extents, column_locals[c])
        local = emitter.set_local(value(), kind, body.indent, prefix)
        emitter.close_scope()
        return local

    def step() -> None:
        factors_a = []
        for r in range(schedule.rows):
            emitter.open_scope()
            declare_axes(emitter, kernel.row_axes, kernel.row_extents, row_locals[r])
            factors_a.append(emitter.set_local(f"(f32x4.splat {emitter.scalar(info.a, body.indent)})", "v128",
                                               body.indent, "factor_a"))
            emitter.close_scope()
        if vector_b or strides is not None:  # one address: four columns one load, or each a constant distance on
            address = in_columns(0, lambda: emitter.element_address(info.b.buffer, info.b.indices), "i32", "address")
            if vector_b:
                vectors = [f"(v128.load offset={16 * q} {address})" for q in range(lanes)]
            else:
                values = [f"(f32.load offset={4 * stride} {address})" for stride in strides]
                vectors = [f32x4_of(values[4 * q:4 * q + 4]) for q in range(lanes)]
        else:
            values = [in_columns(c, lambda: emitter.scalar(info.b, body.indent), "f32", "bc")
                      for c in range(schedule.columns)]
            vectors = [f32x4_of(values[4 * q:4 * q + 4]) for q in range(lanes)]
        factors_b = [emitter.set_local(vector, "v128", body.indent, "factor_b") for vector in vectors]
        for r in range(schedule.rows):
            for q in range(lanes):
                body.set(sums[r][q], multiply_add(factors_a[r], factors_b[q], get(sums[r][q])))

    _reduction_loops(kernel, 0, step)
    for r in range(schedule.rows):
        for q in range(lanes):
            body.store("v128.store", get("$scratch"), get(sums[r][q]), 16 * (r * lanes + q))


def _reduction_loops(kernel: MatmulKernel, number: int, step: Callable[[], None]) -> None:
    """The reduction's loops from axis ``number`` in (``$k0`` ...: their extents use no index
    variable), each axis declared in its loop; ``step()`` the innermost statements."""
    emitter, body, info = kernel.emitter, kernel.body, kernel.info
    if number == len(info.reduce_axes):
        step()
        return
    axis, extent = info.reduce_axes[number], info.reduce_extents[number]
    local, end = body.named(f"k{number}"), body.named(f"k{number}_end")
    body.set(end, emitter.index(extent))
    body.set(local, const(0))
    with body.block(f"$summed{number}"):
        body.br_if(f"$summed{number}", op("i32.ge_s", get(local), get(end)))
        with body.loop(f"$sum{number}"):
            emitter.open_scope()
            emitter.declare_axis(axis, extent, local)
            _reduction_loops(kernel, number + 1, step)
            emitter.close_scope()
            body.increment(local)
            body.br_if(f"$sum{number}", op("i32.lt_s", get(local), get(end)))


def _block_outputs(kernel: MatmulKernel, schedule: BlockMatmulSchedule) -> None:
    """A loop over the block's elements inside the output: the epilogue of the spilled sum
    (a whole block), or the whole body (a block at the edge)."""
    emitter, body, info, program = kernel.emitter, kernel.body, kernel.info, kernel.program
    element, row, column = body.named("element"), body.named("row"), body.named("column")
    body.set(element, const(0))
    with body.loop("$output"):
        body.set(row, add(get("$row0"), div_u(get(element), const(schedule.columns))))
        body.set(column, add(get("$column0"), op("i32.rem_u", get(element), const(schedule.columns))))
        with body.if_(op("i32.and", op("i32.lt_u", get(row), get("$rows")),
                         op("i32.lt_u", get(column), get("$columns")))):
            with body.then():
                emitter.open_scope()
                for axes, extents, linear, prefix in ((kernel.row_axes, kernel.row_extents, row, "yr"),
                                                      (kernel.column_axes, kernel.column_extents, column, "yc")):
                    declare_axes(emitter, axes, extents, unflatten_into(emitter, body, extents, get(linear), prefix))
                offset = emitter.index(flat_offset(program.output, tuple(program.axes)))
                address = emitter.set_local(emitter.address(program.output.name, offset), "i32", body.indent, "address")
                with body.if_(get("$full")):
                    for construct, known in ((body.then, True), (body.else_, False)):
                        with construct():
                            emitter.open_scope()
                            if known:
                                sum_at = add(get("$scratch"), op("i32.shl", get("$element"), const(2)))
                                emitter.known(info.reduction, f"(f32.load {sum_at})")
                            value = emitter.scalar(program.body, body.indent)
                            emitter.close_scope()
                            body.line(store(program.output.dtype, address, value))
                emitter.close_scope()
        body.increment(element)
        body.br_if("$output", op("i32.lt_u", get(element), const(schedule.rows * schedule.columns)))


BLOCK_TIER = Tier(block_main, block_units)  # type: ignore[arg-type]
