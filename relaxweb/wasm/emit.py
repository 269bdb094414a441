"""emit_host_wat: the host function -> WebAssembly text (and binary via wasmtime).

The host module holds all shape arithmetic, in i64: the input checks that bind the symbolic
variables (each failure returns its own error code), the storage sizes, output shapes, the
params block of every call site and the command list.  The text comes from the jinja2
template ``templates/host.wat.j2``; this file computes the memory layout and turns symbolic
expressions into WAT.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import jinja2
import wasmtime

from ..ir.host import HostFunction, ShapeCheck
from ..ir.symbolic import (
    Add, FloorDiv, FloorMod, IntImm, Max, Min, Mul, PrimExpr, SizeVar, Sub, format_expr,
)

MAX_RANK = 8
PARAMS_SLOT = 256  # minUniformBufferOffsetAlignment's WebGPU default
MAX_WORKGROUPS = 65535  # maxComputeWorkgroupsPerDimension's WebGPU default

_TEMPLATES = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    undefined=jinja2.StrictUndefined,
)


@dataclass(frozen=True)
class CallSiteParams:
    """What the host writes for one call site: params fields and the dispatch size."""

    values: tuple[PrimExpr, ...]  # one i32 per params field, in order
    element_count: PrimExpr
    note: str


@dataclass(frozen=True)
class HostLayout:
    input_shapes: int
    var_bounds: int
    var_values: int
    storage_sizes: int
    output_shapes: int
    error_info: int
    commands: int
    params: int
    end: int


def plan_layout(function: HostFunction, call_site_count: int) -> HostLayout:
    address = 64
    regions = {}
    for name, size in (
        ("input_shapes", len(function.inputs) * (1 + MAX_RANK) * 8),
        ("var_bounds", len(function.symbolic_vars) * 8),
        ("var_values", len(function.symbolic_vars) * 8),
        ("storage_sizes", len(function.storages) * 8),
        ("output_shapes", len(function.outputs) * (1 + MAX_RANK) * 8),
        ("error_info", 3 * 8),
        ("commands", 4 + call_site_count * 20),
    ):
        regions[name] = address
        address += (size + 15) // 16 * 16
    address = (address + PARAMS_SLOT - 1) // PARAMS_SLOT * PARAMS_SLOT
    regions["params"] = address
    return HostLayout(**regions, end=address + call_site_count * PARAMS_SLOT)


class _WatExpressions:
    def __init__(self, var_address: dict[str, int]) -> None:
        self.var_address = var_address

    def __call__(self, expr: PrimExpr) -> str:
        if isinstance(expr, IntImm):
            return f"(i64.const {expr.value})"
        if isinstance(expr, SizeVar):
            return f"(i64.load (i32.const {self.var_address[expr.name]}))"
        operator = {Add: "i64.add", Sub: "i64.sub", Mul: "i64.mul"}.get(type(expr))
        if operator:
            return f"({operator} {self(expr.a)} {self(expr.b)})"
        helper = {FloorDiv: "$floordiv", FloorMod: "$floormod", Min: "$min", Max: "$max"}[type(expr)]
        return f"(call {helper} {self(expr.a)} {self(expr.b)})"


def emit_host_wat(function: HostFunction, call_sites: list[CallSiteParams], workgroup_size: int, source: str) -> str:
    if any(len(i.shape) > MAX_RANK for i in function.inputs) or any(len(o.shape) > MAX_RANK for o in function.outputs):
        raise NotImplementedError(f"inputs and outputs of more than {MAX_RANK} dims are not supported")
    layout = plan_layout(function, len(call_sites))
    var_address = {name: layout.var_values + 8 * i for i, name in enumerate(function.symbolic_vars)}
    bound_address = {name: layout.var_bounds + 8 * i for i, name in enumerate(function.symbolic_vars)}
    wat = _WatExpressions(var_address)

    variables = []
    for name in function.symbolic_vars:
        bound = function.bound_of(name)
        raw = struct.pack("<q", -1 if bound is None else bound)
        variables.append({
            "name": name, "bound_address": bound_address[name], "value_address": var_address[name],
            "bound_bytes": "".join(f"\\{b:02x}" for b in raw),
        })
    from ..ir.host import used_vars

    storage_var_names = used_vars([s.size for s in function.storages])
    storages = [
        {"role": s.role, "text": format_expr(s.size), "address": layout.storage_sizes + 8 * i, "wat": wat(s.size)}
        for i, s in enumerate(function.storages)
    ]
    outputs = []
    for index, output in enumerate(function.outputs):
        base = layout.output_shapes + index * (1 + MAX_RANK) * 8
        stores = [f"(i64.store (i32.const {base}) (i64.const {len(output.shape)}))"]
        stores += [f"(i64.store (i32.const {base + 8 * (d + 1)}) {wat(dim)})" for d, dim in enumerate(output.shape)]
        outputs.append({"name": output.name, "text": ", ".join(format_expr(d) for d in output.shape), "stores": stores})
    sites = []
    for index, site in enumerate(call_sites):
        base = layout.params + index * PARAMS_SLOT
        stores = [f"(i32.store (i32.const {base + 4 * f}) (i32.wrap_i64 {wat(value)}))" for f, value in enumerate(site.values)]
        sites.append({
            "note": site.note, "stores": stores, "count_wat": wat(site.element_count),
            "command_address": layout.commands + 4 + 20 * index,
        })
    checks = [_check(check, function, layout, var_address, bound_address, wat) for check in function.checks]
    return _TEMPLATES.get_template("host.wat.j2").render(
        source=source,
        pages=max(1, -(-layout.end // 65536)),
        layout=layout,
        inputs=function.inputs,
        max_rank=MAX_RANK,
        variables=variables,
        storage_variables=[v for v in variables if v["name"] in storage_var_names],
        storage_count=len(function.storages),
        storages=storages,
        outputs=outputs,
        call_sites=sites,
        checks=checks,
        params_bytes=len(call_sites) * PARAMS_SLOT,
        workgroup_size=workgroup_size,
        max_workgroups=MAX_WORKGROUPS,
    )


def _check(check: ShapeCheck, function: HostFunction, layout: HostLayout, var_address, bound_address, wat) -> dict:
    name = function.inputs[check.input].name
    base = layout.input_shapes + check.input * (1 + MAX_RANK) * 8
    dim = f"(i64.load (i32.const {base + 8 * (check.dim + 1)}))"
    fail = "(then (return (call $fail (i32.const {code}) {value} {expected})))"
    if check.kind == "ndim":
        ndim = f"(i64.load (i32.const {base}))"
        return {
            "comment": f"check {check.code}: input '{name}' has {check.expected} dimensions",
            "wat": f"    (if (i64.ne {ndim} (i64.const {check.expected}))\n      "
            + fail.format(code=check.code, value=ndim, expected=f"(i64.const {check.expected})") + ")",
        }
    if check.kind == "bind":
        return {
            "comment": f"input '{name}' dimension {check.dim} defines {check.variable}",
            "wat": f"    (i64.store (i32.const {var_address[check.variable]}) {dim})",
        }
    if check.kind == "bound":
        value = f"(i64.load (i32.const {var_address[check.variable]}))"
        bound = f"(i64.load (i32.const {bound_address[check.variable]}))"
        return {
            "comment": f"check {check.code}: {check.variable} <= its bound (when it has one)",
            "wat": f"    (if (i32.and (i64.ge_s {bound} (i64.const 0)) (i64.gt_s {value} {bound}))\n      "
            + fail.format(code=check.code, value=value, expected=bound) + ")",
        }
    expected = wat(check.expected if isinstance(check.expected, PrimExpr) else IntImm(int(check.expected)))
    return {
        "comment": f"check {check.code}: input '{name}' dimension {check.dim} == {format_expr(check.expected) if isinstance(check.expected, PrimExpr) else check.expected}",
        "wat": f"    (if (i64.ne {dim} {expected})\n      " + fail.format(code=check.code, value=dim, expected=expected) + ")",
    }


def assemble(wat_text: str) -> bytes:
    """WAT -> validated wasm bytes."""
    binary = wasmtime.wat2wasm(wat_text)
    wasmtime.Module.validate(wasmtime.Engine(), binary)
    return bytes(binary)
