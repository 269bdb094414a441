"""emit_wgsl: one WGSL compute shader per tensor program.

A shader is the params block, the bindings, and what the program's schedule renders
(``schedules.py``): the declarations it needs and ``main``.  Binding layout (the bundle's
contract, see docs/bundle-format.md): binding 0 is the uniform params block
(``relaxweb/ir/params_block.py``: the invocation count, then the program's size variables),
then the program's inputs (read-only storage),
then its output (read-write storage), then, where the program checks the run's data, the
run status (read-write storage: ``relaxweb/ir/error_sites.py``); an input bound as several parts (a weight above one
binding: ``relaxweb/ir/launch.binding_parts``) takes one binding per part, in order, and is
read through its load function (``emit.part_load``).  Workgroups are always 64 invocations on a 2-D grid,
so that more than 65535 workgroups fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ..ir.error_sites import reports_errors
from ..ir.launch import workgroup_storage_bytes
from ..ir.params_block import ELEMENT_COUNT, ParamsLayout
from ..ir.schedule import ElementSchedule, WebGpuSchedule
from ..ir.syntax import comment_text
from ..ir.target_schedules import schedules_of
from ..ir.tir import TensorProgram, format_scalar, index_var_names
from .emit import integer_check_declarations, part_load, part_name, status_declarations, storage_type, wgsl_name
from .lower_index import helper_declarations
from .schedules import render_schedule


@dataclass(frozen=True)
class ShaderInfo:
    """What the bundle writer needs to know about an emitted shader."""

    source: str
    params: ParamsLayout  # the params block at binding 0
    bindings: tuple[str, ...]  # WebGPU buffer binding types, binding 0 first
    workgroup_storage_bytes: int = 0  # var<workgroup> memory the schedule uses

    @property
    def params_fields(self) -> tuple[str, ...]:
        """The i32 fields of the params block the host writes, in order (element_count first)."""
        return self.params.fields

    @property
    def params_size(self) -> int:
        """Bytes of the params block (a multiple of 16)."""
        return self.params.size


def params_declaration(params: ParamsLayout) -> list[str]:
    """The WGSL struct of the params block and its uniform binding (binding 0), as every
    kernel declares it, generated or hand-written (``relaxweb/library``)."""
    return [
        "struct Params {",
        f"  {ELEMENT_COUNT}: i32,",
        *(f"  {wgsl_name(name)}: i32," for name in (*params.size_vars, *params.padding)),
        "}",
        "",
        "@group(0) @binding(0) var<uniform> params: Params;",
    ]


def emit_wgsl(program: TensorProgram, parts: Mapping[str, int] | None = None,
              schedule: WebGpuSchedule | None = None) -> ShaderInfo:
    """The WGSL compute shader of a tensor program laid out by ``schedule``, by default its
    WebGPU schedule (a second shader's is one of its others: ``TargetSchedules``); ``parts``
    gives the inputs bound as several parts their number of parts (2 or more)."""
    schedule = schedules_of(program).webgpu if schedule is None else schedule
    parts = dict(parts or {})
    unknown = set(parts) - {b.name for b in program.inputs}
    if unknown or any(count < 2 for count in parts.values()):
        raise ValueError(f"{program.name}: only inputs are bound as 2 or more parts, got {parts}")
    size_vars = [v.name for v in program.size_vars]
    clashes = set(size_vars) & index_var_names(program)
    if clashes:
        raise ValueError(f"{program.name}: size variables {sorted(clashes)} share names with index variables")
    params = ParamsLayout(tuple(size_vars))
    schedule_note = "" if schedule == ElementSchedule() else f" (schedule: {schedule})"
    rendering = render_schedule(program, schedule, parts)
    lines = [
        *(f"enable {extension};" for extension in rendering.extensions),  # directives come first
        "// " + comment_text(f"tensor program: {program.name}{schedule_note}"),
        "// " + comment_text(f"{program.output.name}[{', '.join(a.name for a in program.axes)}] = {format_scalar(program.body)}"),
        "",
        *params_declaration(params),
    ]
    element_types = rendering.element_types  # a schedule may read some buffers as vectors
    binding, load_functions = 1, []
    for buffer in program.inputs:
        element = element_types.get(buffer.name, storage_type(buffer.dtype))
        if buffer.name not in parts:
            lines.append(f"@group(0) @binding({binding}) var<storage, read> {wgsl_name(buffer.name)}: array<{element}>;")
            binding += 1
            continue
        for part in range(parts[buffer.name]):
            name = part_name(buffer.name, part)
            lines.append(f"@group(0) @binding({binding}) var<storage, read> {name}: array<{element}>;")
            binding += 1
        load_functions += ["", *part_load(buffer.name, parts[buffer.name], element)]
    output = program.output
    element = element_types.get(output.name, storage_type(output.dtype))
    lines.append(f"@group(0) @binding({binding}) var<storage, read_write> {wgsl_name(output.name)}: array<{element}>;")
    status = ("storage",) if reports_errors(program) else ()
    if status:
        lines += status_declarations(binding + 1) + integer_check_declarations(program)
    lines += load_functions
    lines += helper_declarations(rendering.index_helpers)
    lines += rendering.lines
    bindings = ("uniform", *("read-only-storage" for _ in range(binding - 1)), "storage", *status)
    return ShaderInfo("\n".join(lines) + "\n", params, bindings, workgroup_storage_bytes(program, schedule))
