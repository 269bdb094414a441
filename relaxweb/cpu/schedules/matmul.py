"""A matmul-like program's kernel (``relaxweb.ir.pattern.analyze_matmul``): its schedule's
run-time tiers, each rendered by its kind's module (:data:`TIERS`).

A matmul kind may fall back at run time to another (``relaxweb/ir/wasm_schedule.py``):
``matrix_vector`` to its ``otherwise``, ``packed_matmul`` to its ``beyond``; the kernel holds
every tier of the chain, outermost first.  ``$main`` sets up what the tiers share (the row,
column and reduction counts, the unit), then each tier but the last tests its condition,
runs its units and returns; the last runs unconditionally.  ``$units`` makes the same tests
and counts the units of the tier that runs.  The factors are oriented as the schedule says
(``swap_factors``: the second factor gives the rows, ``relaxweb.ir.matmul_layout.cheap_columns``).
"""

from __future__ import annotations

from typing import Callable, Mapping

from ...ir.matmul_layout import oriented
from ...ir.pattern import MatmulInfo, analyze_matmul
from ...ir.symbolic import PrimExpr
from ...ir.tir import TensorProgram
from ...ir.wasm_schedule import BlockMatmulSchedule, MatrixVectorSchedule, PackedMatmulSchedule, WasmSchedule
from ..emit import Emitter, Function
from ..wat_builder import Body, ceil_div_u, get
from .common import kernel_signature, kernel_text, load_size_vars, units_function
from .matmul_block import BLOCK_TIER
from .matmul_kernel import MatmulKernel, Tier, UnitSizes
from .matmul_packed import PACKED_TIER, PREPACKED, PrepackedFactor, prepack_main, prepacked_factor
from .matvec import MATRIX_VECTOR_TIER

TIERS: dict[type[WasmSchedule], Tier] = {
    MatrixVectorSchedule: MATRIX_VECTOR_TIER,
    PackedMatmulSchedule: PACKED_TIER,
    BlockMatmulSchedule: BLOCK_TIER,
}
"""How each matmul kind renders as a tier of a kernel."""


def tiers(schedule: WasmSchedule) -> list[WasmSchedule]:
    """The schedule's tiers, outermost first: it and those it falls back to."""
    chain = [schedule]
    while (fallback := chain[-1].fallback) is not None:
        chain.append(fallback)
    return chain


def render_matmul(program: TensorProgram, schedule: WasmSchedule, parts: Mapping[str, int]) -> str:
    """``$main`` and ``$units`` of a matmul kernel whose outermost tier is ``schedule`` (see
    the module doc)."""
    found = analyze_matmul(program)
    if found is None:
        raise ValueError(f"{program.name} is scheduled as {schedule.kind} but is not matmul-like "
                         f"(relaxweb.ir.pattern.analyze_matmul)")
    chain = tiers(schedule)
    info = oriented(found, schedule.swap_factors)  # type: ignore[attr-defined]
    packed = next((tier for tier in chain if isinstance(tier, PackedMatmulSchedule)), None)
    prepacked = None if packed is None else prepacked_factor(program, info, packed, parts)
    signature, addresses = kernel_signature(program, parts)
    if prepacked is not None:
        signature += f" (param {PREPACKED} i32)"
    kernel = _kernel(program, info, addresses, prepacked)
    _prelude(kernel, chain[-1])
    for tier in chain:
        TIERS[type(tier)].main(kernel, tier)

    def count(value: Callable[[PrimExpr], str]) -> str:
        sizes, text = UnitSizes(kernel, value), None
        for tier in reversed(chain):
            text = TIERS[type(tier)].units(sizes, tier, text)
        assert text is not None
        return text

    text = kernel_text(program, kernel.body.function, signature, units_function(program, count))
    if prepacked is None:
        return text
    assert packed is not None
    packer = _kernel(program, info, addresses, prepacked)
    _prelude(packer, chain[-1])
    prepack_main(packer, packed)
    return text + "\n" + packer.body.function.text(f"$main_pack {signature} (result i32)")


def prepacked_factor_of(program: TensorProgram, schedule: WasmSchedule,
                        parts: Mapping[str, int]) -> PrepackedFactor | None:
    """The second factor that ``program``'s kernel under ``schedule`` can read prepacked
    (``$kK_pack``; ``matmul_packed.PrepackedFactor``), or None (not a matmul kernel with a
    packed tier, or a factor it cannot hold prepacked)."""
    if not isinstance(schedule, (MatrixVectorSchedule, PackedMatmulSchedule, BlockMatmulSchedule)):
        return None
    packed = next((tier for tier in tiers(schedule) if isinstance(tier, PackedMatmulSchedule)), None)
    found = analyze_matmul(program)
    if packed is None or found is None:
        return None
    return prepacked_factor(program, oriented(found, schedule.swap_factors), packed, parts)


def _kernel(program: TensorProgram, info: MatmulInfo, addresses: Mapping[str, str],
            prepacked: PrepackedFactor | None) -> MatmulKernel:
    """A new function's :class:`MatmulKernel` (its size variables loaded)."""
    function = Function()
    body = Body(function)
    variables = load_size_vars(program, body)
    emitter = Emitter(program, function, dict(addresses), variables)
    shape = program.output.shape
    return MatmulKernel(program, info, emitter, body,
                        tuple(program.axes[p] for p in info.rows), tuple(shape[p] for p in info.rows),
                        tuple(program.axes[p] for p in info.columns), tuple(shape[p] for p in info.columns),
                        tuple(program.axes[p] for p in info.batch), tuple(shape[p] for p in info.batch), prepacked)


def _prelude(kernel: MatmulKernel, blocks: WasmSchedule) -> None:
    """What the tiers share: the row, column and reduction counts, the unit; and the block
    counts of the last tier (a block matmul)."""
    emitter, body = kernel.emitter, kernel.body
    assert isinstance(blocks, BlockMatmulSchedule)
    row_count, column_count = body.named("rows"), body.named("columns")
    body.set(row_count, emitter.index(kernel.rows))
    body.set(column_count, emitter.index(kernel.columns))
    column_blocks, row_blocks = body.named("column_blocks"), body.named("row_blocks")
    body.set(column_blocks, ceil_div_u(get(column_count), blocks.columns))
    body.set(row_blocks, ceil_div_u(get(row_count), blocks.rows))
    unit = body.named("unit")
    for name in ("row0", "column0", "full", "batch"):
        body.named(name)
    depth = body.named("depth")
    body.set(depth, emitter.index(kernel.depth))
    body.set(unit, get("$first"))
