"""A tensor program's schedule on each target a bundle serves.

One compiled program runs on every target of the bundle, laid out for each by a schedule of
that target's kinds (``schedule.py``, ``wasm_schedule.py``):

- ``webgpu``: the kernel's shader (``file`` in the manifest); its dispatch size is what the
  host module launches (``relaxweb/ir/launch.dispatch_count``), whichever shader runs;
- ``webgpu_cpu``: a second shader for adapters that run workgroups on a CPU (SwiftShader,
  lavapipe: ``cpu_file``), or None where they run ``webgpu``'s;
- ``webgpu_f16``: a second shader for adapters with WebGPU's ``shader-f16`` (``f16_file``),
  or None where they run ``webgpu``'s;
- ``wasm``: the kernel's functions in ``kernels.wasm``.

A second shader keeps the kernel's dispatch size, bindings and params block, so a runtime
may compile either.  The schedule_programs pass chooses all four; the backends and the
bundle writer render what they are given.  Before that a program has none
(``TensorProgram.schedule`` is None): :func:`schedules_of` gives it :data:`UNSCHEDULED`,
every target's element kind (one output element at a time) and no second shader, so that a
program built by hand runs anywhere.

Text form, in a program's decorator (``tir.format_program``): nothing before scheduling,
after it all four targets, ``None`` for a missing second shader::

    @tensor_program(webgpu=tiled_matmul(tile=64, depth=16, block=8), webgpu_cpu=register_matmul(block=8),
                    webgpu_f16=tiled_matmul_f16(tile=64, depth=16, block=8), wasm=packed_matmul(...))
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from .schedule import WEBGPU_SCHEDULE_KINDS, ElementSchedule, Schedule, WebGpuSchedule
from .wasm_schedule import WASM_SCHEDULE_KINDS, WasmElementSchedule, WasmSchedule


@dataclass(frozen=True)
class TargetSchedules:
    """The schedule of each target (see the module doc)."""

    webgpu: WebGpuSchedule = ElementSchedule()
    webgpu_cpu: WebGpuSchedule | None = None
    webgpu_f16: WebGpuSchedule | None = None
    wasm: WasmSchedule = WasmElementSchedule()

    def __post_init__(self) -> None:
        for target in fields(self):
            schedule, base, optional = getattr(self, target.name), *TARGET_KINDS[target.name]
            if not (isinstance(schedule, base) or (optional and schedule is None)):
                expected = f"a {base.__name__}" + (" or None" if optional else "")
                raise TypeError(f"the {target.name} schedule must be {expected}, got {schedule!r}")

    def items(self) -> list[tuple[str, Schedule | None]]:
        """(target, schedule) in order: the text form's keywords."""
        return [(target.name, getattr(self, target.name)) for target in fields(self)]


TARGET_KINDS: dict[str, tuple[type[Schedule], bool]] = {
    "webgpu": (WebGpuSchedule, False),
    "webgpu_cpu": (WebGpuSchedule, True),
    "webgpu_f16": (WebGpuSchedule, True),
    "wasm": (WasmSchedule, False),
}
"""Each target's base kind, and whether it may be None (no second shader)."""

TARGET_SCHEDULE_KINDS: dict[str, dict[str, type[Schedule]]] = {
    "webgpu": WEBGPU_SCHEDULE_KINDS, "webgpu_cpu": WEBGPU_SCHEDULE_KINDS, "webgpu_f16": WEBGPU_SCHEDULE_KINDS,
    "wasm": WASM_SCHEDULE_KINDS,
}
"""The kinds a target's schedule may be, by name (what the text form's calls name)."""

UNSCHEDULED = TargetSchedules()
"""What a program no pass has scheduled runs (see the module doc)."""


def schedules_of(program) -> TargetSchedules:
    """A tensor program's schedules: its own, or :data:`UNSCHEDULED` where it has none yet."""
    return UNSCHEDULED if program.schedule is None else program.schedule
