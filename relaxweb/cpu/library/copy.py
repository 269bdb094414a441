"""The WebAssembly of the library's copy kernels: a loop's row writer (``write_row``), a
sequence's element writer (``sequence_write``) and a KV cache's row writer
(``kv_cache_write``).  Each is ``out[i // block * stride + base + i % block] = value[i]``,
copied a contiguous run at a time (:func:`scatter_copy_wat`)."""

from __future__ import annotations

from ...ir.library_kernel import LibraryKernel
from ..emit import element_shift
from ...ir.params_block import ParamsLayout
from ...library.kv_cache import kv_cache_blocks, kv_cache_entry_blocks, kv_cache_write_title
from ...library.loop import write_row_title
from ...library.sequence import sequence_write_title
from .wat import IndexText, LibraryWat, element, index_helpers, kernel_text, loop, params_field

#: Elements per unit of the copy kernels' WebAssembly: threads split whole 4 KiB runs.
COPY_UNIT = 1024


def scatter_copy_wat(title: str, count: str, block: str, stride: str, base: str,
                     bindings: tuple[str, ...] = ("value", "out"), shift: int = 2) -> str:
    """The WAT of ``out[i // block * stride + base + i % block] = value[i]`` for the ``count``
    values of ``value`` (WAT i32 expressions of the params block; ``base`` may read
    ``$i``, ``$block`` and the inputs ``bindings`` name between ``value`` and ``out``; ``block``
    > 0 when ``count`` is): each unit copies up to :data:`COPY_UNIT` values, a contiguous run
    per block at a time (``memory.copy``: the elements are ``1 << shift`` bytes of any dtype)."""
    units = [f"(i32.div_u (i32.add {count} (i32.const {COPY_UNIT - 1})) (i32.const {COPY_UNIT}))"]
    body = [
        f"(local.set $i (i32.mul (local.get $first) (i32.const {COPY_UNIT})))",
        f"(local.set $stop (call $main_min (i32.mul (local.get $end) (i32.const {COPY_UNIT})) {count}))",
        f"(local.set $block {block})",
        *loop("copy", "(i32.ge_s (local.get $i) (local.get $stop))", [
            ";; the values i .. i + run - 1 lie in one block: one run of the output",
            "(local.set $within (i32.rem_u (local.get $i) (local.get $block)))",
            "(local.set $run (call $main_min (i32.sub (local.get $stop) (local.get $i))"
            " (i32.sub (local.get $block) (local.get $within))))",
            "(memory.copy",
            f"  {element('out', f'(i32.add (i32.add (i32.mul (i32.div_u (local.get $i) (local.get $block)) {stride}) {base}) (local.get $within))', shift)}",
            f"  {element('value', '(local.get $i)', shift)}",
            f"  (i32.shl (local.get $run) (i32.const {shift})))",
            "(local.set $i (i32.add (local.get $i) (local.get $run)))",
        ]),
    ]
    return kernel_text(title, bindings, units, [(name, "i32") for name in ("i", "stop", "block", "within", "run")],
                       body, index_helpers("\n".join(body)))


def _layout(kernel: LibraryKernel) -> ParamsLayout:
    return ParamsLayout(tuple(var.name for var in kernel.size_vars))


def render_write_row(kernel: LibraryKernel) -> LibraryWat:
    """The value to row ``row``: one block of ``element_count`` values at ``row * element_count``."""
    layout = _layout(kernel)
    count = params_field(layout, "element_count")
    base = f"(i32.mul {params_field(layout, kernel.arguments['row'])} {count})"
    return LibraryWat(scatter_copy_wat(write_row_title(kernel), count, count, "(i32.const 0)", base,
                                       shift=element_shift(kernel.output.dtype)))


def render_sequence_write(kernel: LibraryKernel) -> LibraryWat:
    """The element's values to the arena from ``offset`` on: one block."""
    layout = _layout(kernel)
    values = params_field(layout, "element_count")
    return LibraryWat(scatter_copy_wat(sequence_write_title(kernel), values, values, "(i32.const 0)",
                                       params_field(layout, "offset"), shift=element_shift(kernel.output.dtype)))


def render_kv_cache_write(kernel: LibraryKernel) -> LibraryWat:
    """Block o of the value (``length`` rows) to rows ``[offset, offset + length)`` of block o
    of the cache (``capacity`` rows)."""
    layout = _layout(kernel)
    index = IndexText(lambda var: params_field(layout, var))
    row, block = kv_cache_blocks(kernel)
    row_size = index(row)
    start = params_field(layout, kernel.arguments["offset"])
    bindings = ("value", "out")
    if kernel.arguments.get("ragged"):  # block i / block belongs to entry i / block / entry_blocks
        entry = f"(i32.div_u (i32.div_u (local.get $i) (local.get $block)) {index(kv_cache_entry_blocks(kernel))})"
        start = f"(call $main_min (call $main_max (i32.load {element('lengths', entry)}) (i32.const 0)) {start})"
        bindings = ("value", "lengths", "out")
    return LibraryWat(scatter_copy_wat(kv_cache_write_title(kernel), params_field(layout, "element_count"), index(block),
                                       f"(i32.mul (i32.const {kernel.arguments['capacity']}) {row_size})",
                                       f"(i32.mul {start} {row_size})", bindings, element_shift(kernel.output.dtype)))
