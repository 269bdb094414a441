"""The WGSL of the library's copy kernels: a loop's row writer (``write_row``), a sequence's
element writer (``sequence_write``) and a KV cache's row writer (``kv_cache_write``).  Each
copies its ``value`` into part of ``out`` and keeps the rest, one invocation per value."""

from __future__ import annotations

from ...ir.library_kernel import LibraryKernel
from ...ir.params_block import ParamsLayout
from ...ir.symbolic import Analyzer
from ...ir.syntax import comment_text
from ...library.kv_cache import kv_cache_blocks, kv_cache_entry_blocks, kv_cache_write_title
from ...library.loop import write_row_title
from ...library.sequence import sequence_write_title
from ..emit import storage_type, wgsl_name
from ..lower_index import helper_declarations, helpers_used, lower_index, render_wgsl
from ..shader import params_declaration


def scatter_copy_source(title: str, dtype: str, size_vars: tuple[str, ...], target: str,
                        declarations: tuple[str, ...] = (), lets: tuple[str, ...] = (),
                        int_inputs: tuple[str, ...] = ()) -> str:
    """The WGSL of ``out[target] = value[index]`` for each of the ``element_count`` values of
    ``value``, the rest of ``out`` kept; ``target`` is a WGSL expression of ``index`` and the
    params fields ``size_vars``, after the statements ``lets`` (with the module-scope
    ``declarations`` they need, e.g. index helpers); ``int_inputs`` name i32 inputs bound
    after ``value`` (a ragged KV cache write's lengths)."""
    element = storage_type(dtype)
    return "\n".join([
        "// " + comment_text(title),
        "",
        *params_declaration(ParamsLayout(size_vars)),
        f"@group(0) @binding(1) var<storage, read> value: array<{element}>;",
        *(f"@group(0) @binding({2 + k}) var<storage, read> {name}: array<i32>;" for k, name in enumerate(int_inputs)),
        f"@group(0) @binding({2 + len(int_inputs)}) var<storage, read_write> out: array<{element}>;",
        *declarations,
        "",
        "@compute @workgroup_size(64)",
        "fn main(@builtin(workgroup_id) workgroup: vec3<u32>,",
        "        @builtin(num_workgroups) workgroups: vec3<u32>,",
        "        @builtin(local_invocation_index) local: u32) {",
        "  let group = i32(workgroup.y * workgroups.x + workgroup.x);",
        "  let index = group * 64 + i32(local);",
        "  if (index >= params.element_count) {",
        "    return;",
        "  }",
        *lets,
        f"  out[{target}] = value[index];",
        "}",
    ]) + "\n"


def _size_vars(kernel: LibraryKernel) -> tuple[str, ...]:
    return tuple(var.name for var in kernel.size_vars)


def render_write_row(kernel: LibraryKernel, target: str) -> str:
    """``out[row * element_count + index] = value[index]``."""
    row = kernel.arguments["row"]
    return scatter_copy_source(write_row_title(kernel), kernel.output.dtype, _size_vars(kernel),
                               f"params.{wgsl_name(row)} * params.element_count + index")


def render_sequence_write(kernel: LibraryKernel, target: str) -> str:
    """``out[offset + index] = value[index]``."""
    return scatter_copy_source(sequence_write_title(kernel), kernel.output.dtype, _size_vars(kernel),
                               "params.offset + index")


def render_kv_cache_write(kernel: LibraryKernel, target: str) -> str:
    """Block ``index / block`` of the value to rows ``[offset, offset + length)`` of its block
    of the cache (ragged: from ``clamp(lengths[b], 0, offset)``, ``b`` the block's batch entry)."""
    offset, capacity, ragged = kernel.arguments["offset"], kernel.arguments["capacity"], kernel.arguments.get("ragged")
    row_size, block = kv_cache_blocks(kernel)
    analyzer = Analyzer()
    lowered = {"row_size": lower_index(row_size, analyzer), "block": lower_index(block, analyzer)}
    if ragged:
        lowered["entry_blocks"] = lower_index(kv_cache_entry_blocks(kernel), analyzer)
    helpers = set().union(*(helpers_used(index) for index in lowered.values()))

    def variable(var: str) -> str:
        return f"params.{wgsl_name(var)}"

    lets = [*(f"  let {key} = {render_wgsl(index, variable)};" for key, index in lowered.items())]
    if ragged:
        lets += ["  // block o of the value goes to rows [start, start + length) of block o of the cache, start",
                 "  // its batch entry's past length (at most offset)",
                 f"  let start = clamp(lengths[index / block / entry_blocks], 0, {variable(offset)});"]
    else:
        lets.append(f"  // block o of the value goes to rows [{offset}, {offset} + length) of block o of the cache")
    start = "start" if ragged else variable(offset)
    return scatter_copy_source(kv_cache_write_title(kernel), kernel.output.dtype, _size_vars(kernel),
                               f"(index / block * {capacity} + {start}) * row_size + index % block",
                               tuple(helper_declarations(helpers)), tuple(lets), ("lengths",) if ragged else ())
