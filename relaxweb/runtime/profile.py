"""Per-kernel profiles of a run: time, FLOPs and bytes per kernel, and the table of the top ones.

The Python runtime (``webgpu.Session.profile``) times each dispatch and gives this module
one :class:`DispatchTime` per dispatch; the FLOPs and bytes of a call come from its kernel's
``cost`` trees in the manifest (``relaxweb/ir/cost.py`` wrote them), evaluated with the values
the host module wrote into that call site's params block for that dispatch.  The browser
runtime does the same in ``runtime_js/profile.js`` and gives the same rows.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: How the time of each dispatch was measured.
TIMESTAMPS = "timestamp queries"
SUBMITS = "per-dispatch submits"
WASM_CALLS = "wall clock per kernel call"
_METHOD_NOTES = {
    WASM_CALLS: "kernels.wasm on one CPU thread: each kernel's units and run functions timed by the wall clock",
    TIMESTAMPS: "timed on the GPU: timestamps at the start and end of each dispatch's compute pass",
    SUBMITS: "no timestamp queries: each dispatch submitted alone, wall time until done, submit overhead included",
}
#: Rows a table shows before it sums the rest as "others".
TOP_ROWS = 15


@dataclass(frozen=True)
class DispatchTime:
    """One dispatch: its call site, how long it ran, and the params its host wrote for it."""

    call_site: int
    ms: float
    params: tuple[int, ...]  # the call site's params block as i32 fields


@dataclass(frozen=True)
class KernelRow:
    """A kernel's dispatches in one run, added up.  ``flops`` and ``bytes`` are None when the
    kernel has no cost in the manifest (a library kernel); ``bytes`` is a lower bound."""

    kernel: str
    calls: int
    ms: float
    percent: float
    flops: int | None
    bytes: int | None

    @property
    def gflops_per_s(self) -> float | None:
        return None if self.flops is None or self.ms <= 0 else self.flops / (self.ms * 1e6)

    @property
    def gbytes_per_s(self) -> float | None:
        return None if self.bytes is None or self.ms <= 0 else self.bytes / (self.ms * 1e6)


@dataclass
class Profile:
    """A profiled run: its outputs, how it was timed, and one row per kernel, slowest first."""

    method: str
    dispatches: int
    rows: list[KernelRow]
    outputs: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def total_ms(self) -> float:
        """Time in kernels (the sum of every dispatch's time)."""
        return sum(row.ms for row in self.rows)

    def table(self, top: int = TOP_ROWS) -> str:
        """The rows as a text table: the ``top`` slowest kernels, the rest as one "others" row."""
        shown = self.rows[:top]
        rest = self.rows[top:]
        if rest:
            shown = [*shown, _sum_rows(f"others ({len(rest)} kernels)", rest, self.total_ms)]
        width = max([len("kernel"), *(len(row.kernel) for row in shown)])
        lines = [
            f"profile: {self.dispatches} dispatches of {len(self.rows)} kernels, {self.total_ms:.3f} ms in kernels, "
            f"method: {self.method} ({_METHOD_NOTES.get(self.method, '')})",
            f"{'kernel':<{width}}  {'calls':>6}  {'total ms':>10}  {'%':>6}  {'GFLOP/s':>9}  {'GB/s':>9}",
        ]
        for row in shown:
            lines.append(f"{row.kernel:<{width}}  {row.calls:>6}  {row.ms:>10.3f}  {row.percent:>6.1f}  "
                         f"{_rate(row.gflops_per_s):>9}  {_rate(row.gbytes_per_s):>9}")
        lines.append(f"{'total':<{width}}  {self.dispatches:>6}  {self.total_ms:>10.3f}  {100.0 if self.rows else 0.0:>6.1f}")
        lines.append("GB/s counts each input and output buffer once (a lower bound); - : no cost for this kernel")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _sum_rows(name: str, rows: Sequence[KernelRow], total_ms: float) -> KernelRow:
    ms = sum(row.ms for row in rows)
    return KernelRow(name, sum(row.calls for row in rows), ms, _percent(ms, total_ms),
                     _sum_known([row.flops for row in rows]), _sum_known([row.bytes for row in rows]))


def _sum_known(values: Sequence[int | None]) -> int | None:
    return None if any(value is None for value in values) else sum(values)  # type: ignore[arg-type]


def _percent(ms: float, total_ms: float) -> float:
    return 100.0 * ms / total_ms if total_ms > 0 else 0.0


def params_fields(params_block: bytes, call_site: Mapping[str, Any]) -> tuple[int, ...]:
    """The i32 fields of a call site's params block, read from the whole params buffer."""
    start, size = call_site["params_offset"], call_site["params_size"]
    return struct.unpack_from(f"<{size // 4}i", params_block, start)


def evaluate_tree(tree: Any, values: Mapping[str, int]) -> int | None:
    """The value of a manifest cost tree (validated by the schema) with its names bound by
    ``values``; None where it divides by zero or names an unknown value."""
    if isinstance(tree, str):
        return values.get(tree)
    if not isinstance(tree, list):
        return int(tree)
    a, b = evaluate_tree(tree[1], values), evaluate_tree(tree[2], values)
    if a is None or b is None:
        return None
    operator = tree[0]
    if operator in ("floordiv", "mod") and b == 0:
        return None
    return {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b, "floordiv": lambda: a // b,
            "mod": lambda: a % b, "min": lambda: min(a, b), "max": lambda: max(a, b)}[operator]()


def call_cost(manifest: Mapping[str, Any], dispatch: DispatchTime) -> tuple[int | None, int | None]:
    """FLOPs and bytes of one dispatch, from its kernel's cost trees and its params."""
    kernel = manifest["kernels"][manifest["call_sites"][dispatch.call_site]["kernel"]]
    cost = kernel.get("cost")
    if cost is None:
        return None, None
    values = dict(zip(kernel.get("params", []), dispatch.params))
    return evaluate_tree(cost["flops"], values), evaluate_tree(cost["bytes"], values)


def summarize(manifest: Mapping[str, Any], dispatches: Sequence[DispatchTime], method: str) -> Profile:
    """One row per kernel dispatched, slowest first."""
    by_kernel: dict[int, list[DispatchTime]] = {}
    for dispatch in dispatches:
        by_kernel.setdefault(manifest["call_sites"][dispatch.call_site]["kernel"], []).append(dispatch)
    total_ms = sum(dispatch.ms for dispatch in dispatches)
    rows = []
    for kernel, calls in by_kernel.items():
        costs = [call_cost(manifest, call) for call in calls]
        ms = sum(call.ms for call in calls)
        rows.append(KernelRow(manifest["kernels"][kernel]["name"], len(calls), ms, _percent(ms, total_ms),
                              _sum_known([flops for flops, _ in costs]), _sum_known([moved for _, moved in costs])))
    rows.sort(key=lambda row: (-row.ms, row.kernel))
    return Profile(method, len(dispatches), rows)


class WallClockTimer:
    """How a profiled run on ``kernels.wasm`` times its dispatches: each kernel call by the
    wall clock (``wasm_backend.WasmBackend`` calls :meth:`record` after each)."""

    method = WASM_CALLS

    def __init__(self, manifest: Mapping[str, Any]) -> None:
        self.manifest = manifest
        self._times: list[DispatchTime] = []

    def record(self, call_site: int, ms: float, params: bytes) -> None:
        """One dispatch of ``call_site`` that took ``ms``, with the run's params block."""
        self._times.append(DispatchTime(call_site, ms, params_fields(params, self.manifest["call_sites"][call_site])))

    def times(self) -> list[DispatchTime]:
        return self._times
