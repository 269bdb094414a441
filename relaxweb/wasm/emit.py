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

from ..errors import UnsupportedModelError, shown
from ..ir.host import (
    SEQUENCE_CAPACITY, HostBind, HostCheck, HostDispatch, HostFunction, HostIf, HostLoop, HostOutputShape, HostRead,
    HostSequenceAppend, HostSequenceClear, HostSequenceInput, HostSequencePresence, ShapeCheck,
)
from ..ir.host_functor import HostStepFunctor
from ..ir.params_block import FIELD_BYTES, PARAMS_SLOT
from ..ir.syntax import comment_text
from ..ir.symbolic import (
    Add, FloorDiv, FloorMod, IntImm, Max, Min, Mul, PrimExpr, SizeVar, Sub, format_expr, free_var_names, product,
)

MAX_RANK = 8
# a sequence's table (docs/bundle-format.md "Sequences"): its length, then per element [ndim, d0, ..., d7]
SEQUENCE_ENTRY_BYTES = (1 + MAX_RANK) * 8
SEQUENCE_TABLE_BYTES = (8 + SEQUENCE_CAPACITY * SEQUENCE_ENTRY_BYTES + 15) // 16 * 16
LARGEST_CONSTANT = 2**62  # sizes, offsets and their products stay far from i64 overflow
MAX_WORKGROUPS = 65535  # maxComputeWorkgroupsPerDimension's WebGPU default
# Command record opcodes (docs/bundle-format.md)
OPCODE_DISPATCH, OPCODE_READ, OPCODE_RESUME = 1, 2, 3

_TEMPLATES = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    undefined=jinja2.StrictUndefined,
)
# text from the model (names, notes) reaches the WAT only through this filter, inside comments
_TEMPLATES.filters["comment"] = comment_text


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
    read_values: int
    commands: int
    sequences: int
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
        ("read_values", function.read_slots * 8),
        ("commands", 4 + (call_site_count + 1) * 20),
        ("sequences", len(function.sequences) * SEQUENCE_TABLE_BYTES),
    ):
        regions[name] = address
        address += (size + 15) // 16 * 16
    address = (address + PARAMS_SLOT - 1) // PARAMS_SLOT * PARAMS_SLOT
    regions["params"] = address
    return HostLayout(**regions, end=address + max(1, call_site_count) * PARAMS_SLOT)


class _WatExpressions:
    def __init__(self, var_address: dict[str, int]) -> None:
        self.var_address = var_address

    def __call__(self, expr: PrimExpr) -> str:
        if isinstance(expr, IntImm):
            if not -LARGEST_CONSTANT <= expr.value <= LARGEST_CONSTANT:
                raise UnsupportedModelError(
                    f"a shape computation of this model reaches {expr.value}, beyond the sizes relaxweb handles (2^62)"
                )
            return f"(i64.const {expr.value})"
        if isinstance(expr, SizeVar):
            return f"(i64.load (i32.const {self.var_address[expr.name]}))"
        operator = {Add: "i64.add", Sub: "i64.sub", Mul: "i64.mul"}.get(type(expr))
        if operator:
            return f"({operator} {self(expr.a)} {self(expr.b)})"
        helper = {FloorDiv: "$floordiv", FloorMod: "$floormod", Min: "$min", Max: "$max"}[type(expr)]
        return f"(call {helper} {self(expr.a)} {self(expr.b)})"


class _StepEmitter(HostStepFunctor):
    """Host steps -> WAT statements, one stage function per run of steps between reads;
    ``visit(step, indent)`` gives a step's lines (reads and loops end stages: :meth:`stages`).

    A loop has a stage of its own, which runs one iteration and ends its command list with a
    resume record (the runtime submits and resumes at once), and on the resume after the
    last iteration goes on with the steps after the loop; the stage before it starts the
    count at 0 and runs it."""

    def __init__(self, function: HostFunction, call_sites: list[CallSiteParams], layout: HostLayout,
                 var_address: dict[str, int], bound_address: dict[str, int]) -> None:
        self.function = function
        self.call_sites = call_sites
        self.layout = layout
        self.var_address = var_address
        self.bound_address = bound_address
        self.wat = _WatExpressions(var_address)
        self.site_of = {id(step): index for index, step in enumerate(function.dispatches)}

    def stages(self) -> list[dict]:
        stages: list[dict] = [{"title": "", "lines": []}]
        for step in self.function.steps:
            if isinstance(step, HostRead):
                stages[-1]["lines"] += [
                    f";; read back: {comment_text(step.note)}",
                    f"(call $command (i32.const {OPCODE_READ}) (i32.const {step.storage}) (i32.const {step.byte_offset}) "
                    f"(i32.const {step.slot}) (i32.const 0))",
                ]
                stages.append({"title": f": after reading {step.variable} ({step.note})", "lines": [
                    f"(i64.store (i32.const {self.var_address[step.variable]}) "
                    f"(i64.load (i32.const {self.layout.read_values + 8 * step.slot})))  ;; {comment_text(step.variable)}",
                ]})
            elif isinstance(step, HostLoop):
                stages.append(self.loop_stage(step, stages[-1], len(stages)))
            else:
                stages[-1]["lines"] += self.visit(step, "")
        return stages

    def loop_stage(self, loop: HostLoop, before: dict, index: int) -> dict:
        """The stage of a loop (stage ``index``); ``before``, the stage before it, enters it."""
        counter = f"(i64.load (i32.const {self.var_address[loop.variable]}))"
        before["lines"] += [
            ";; " + comment_text(f"{loop.note}: {loop.variable} from 0 while < {format_expr(loop.count)}, one stage per iteration"),
            f"(i64.store (i32.const {self.var_address[loop.variable]}) (i64.const 0))",
            f"(global.set $stage (i32.const {index + 1}))",
            f"(return (call $stage{index}))",
        ]
        body = [line for step in loop.steps for line in self.visit(step, "    ")]
        return {"title": f": {loop.note}, one iteration per resume", "lines": [
            f"(if (i64.lt_s {counter} {self.wat(loop.count)})",
            "  (then",
            *body,
            f"    (i64.store (i32.const {self.var_address[loop.variable]}) (i64.add {counter} (i64.const 1)))",
            f"    (call $command (i32.const {OPCODE_RESUME}) (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0))",
            f"    (global.set $stage (i32.const {index}))",
            "    (call $compute_storage_sizes)",
            "    (return (i32.const 0))))",
            ";; " + comment_text(f"{loop.note} done"),
        ]}

    def fail_if(self, condition: str, code: int, value: str, expected: str, indent: str) -> list[str]:
        return [f"{indent}(if {condition}", f"{indent}  (then (return (call $fail (i32.const {code}) {value} {expected}))))"]

    def visit_dispatch(self, step: HostDispatch, indent: str) -> list[str]:
        index = self.site_of[id(step)]
        site = self.call_sites[index]
        base = self.layout.params + index * PARAMS_SLOT
        lines = [f"{indent};; call site {index}: {comment_text(site.note)}"]
        lines += [f"{indent}(i32.store (i32.const {base + FIELD_BYTES * f}) (i32.wrap_i64 {self.wat(value)}))"
                  for f, value in enumerate(site.values)]
        lines.append(f"{indent}(call $dispatch (i32.const {index}) {self.wat(site.element_count)})")
        return lines

    def visit_bind(self, step: HostBind, indent: str) -> list[str]:
        return [f"{indent}(i64.store (i32.const {self.var_address[step.variable]}) {self.wat(step.value)})  ;; "
                + comment_text(f"{step.variable} = {format_expr(step.value)}: {step.note}")]

    def visit_check(self, step: HostCheck, indent: str) -> list[str]:
        value = self.wat(step.value)
        if step.kind == "equal":
            expected = self.wat(step.expected)  # type: ignore[arg-type]
            return [f"{indent};; " + comment_text(f"check {step.code}: {format_expr(step.value)} == {format_expr(step.expected)}")] + \
                self.fail_if(f"(i64.ne {value} {expected})", step.code, value, expected, indent)
        if step.kind == "bound":
            bound = f"(i64.load (i32.const {self.bound_address[step.variable]}))"
            return [f"{indent};; " + comment_text(f"check {step.code}: {step.variable} <= its bound (when it has one)")] + \
                self.fail_if(f"(i32.and (i64.ge_s {bound} (i64.const 0)) (i64.gt_s {value} {bound}))", step.code, value, bound, indent)
        return [f"{indent};; " + comment_text(f"check {step.code}: {format_expr(step.value)} >= 0")] + \
            self.fail_if(f"(i64.lt_s {value} (i64.const 0))", step.code, value, "(i64.const 0)", indent)

    def visit_if(self, step: HostIf, indent: str) -> list[str]:
        lines = [f"{indent};; " + comment_text(f"if {format_expr(step.condition)} != 0"),
                 f"{indent}(if (i64.ne {self.wat(step.condition)} (i64.const 0))", f"{indent}  (then"]
        for inner in step.then_steps:
            lines += self.visit(inner, indent + "    ")
        lines += [f"{indent}  )", f"{indent}  (else"]
        for inner in step.else_steps:
            lines += self.visit(inner, indent + "    ")
        return lines + [f"{indent}  ))"]

    def visit_output_shape(self, step: HostOutputShape, indent: str) -> list[str]:
        base = self.layout.output_shapes + step.output * (1 + MAX_RANK) * 8
        output = self.function.outputs[step.output]
        lines = [f"{indent};; " + comment_text(f"output '{output.name}': [{', '.join(format_expr(d) for d in step.shape)}]"),
                 f"{indent}(i64.store (i32.const {base}) (i64.const {len(step.shape)}))"]
        return lines + [f"{indent}(i64.store (i32.const {base + 8 * (d + 1)}) {self.wat(dim)})" for d, dim in enumerate(step.shape)]

    def visit_default(self, step, indent: str) -> list[str]:
        raise ValueError(f"cannot emit {type(step).__name__} here (reads and loops only at the top level)")

    # -- the table steps of a sequence (its length at ``table``, its entries after it)

    def sequence_table(self, step) -> tuple[int, str]:
        """The address of a sequence's table, and its length (WAT)."""
        table = self.layout.sequences + step.sequence * SEQUENCE_TABLE_BYTES
        return table, f"(i64.load (i32.const {table}))"

    def sequence_entry(self, table: int, index: str) -> str:
        """The address of entry ``index`` (i64 WAT) of the table at ``table``."""
        return f"(i32.add (i32.const {table + 8}) (i32.mul (i32.wrap_i64 {index}) (i32.const {SEQUENCE_ENTRY_BYTES})))"

    def arena_size(self, step) -> tuple[str, str]:
        """A sequence's arena size (its host variable's WAT value) and the start of its store."""
        size_var = self.function.sequences[step.sequence].size_var
        return f"(i64.load (i32.const {self.var_address[size_var]}))", f"(i64.store (i32.const {self.var_address[size_var]})"

    def visit_sequence_presence(self, step: HostSequencePresence, indent: str) -> list[str]:
        _, length = self.sequence_table(step)
        return [f"{indent};; {comment_text(step.variable)}: does optional sequence {step.sequence} hold one",
                f"{indent}(i64.store (i32.const {self.var_address[step.variable]}) "
                f"(i64.extend_i32_u (i64.ge_s {length} (i64.const 0))))"]

    def visit_sequence_clear(self, step: HostSequenceClear, indent: str) -> list[str]:
        table, _ = self.sequence_table(step)
        _, set_size = self.arena_size(step)
        return [f"{indent};; sequence {step.sequence}: empty", f"{indent}(i64.store (i32.const {table}) (i64.const 0))",
                f"{indent}{set_size} (i64.const 0))"]

    def visit_sequence_append(self, step: HostSequenceAppend, indent: str) -> list[str]:
        sequence = self.function.sequences[step.sequence]
        table, length = self.sequence_table(step)
        size, set_size = self.arena_size(step)
        entry = self.sequence_entry(table, length)
        values = [self.wat(dim) for dim in step.shape]
        count = self.wat(product(step.shape)) if step.shape else "(i64.const 1)"
        lines = [";; " + comment_text(f"sequence {step.sequence}: append an element of shape "
                                      f"[{', '.join(format_expr(d) for d in step.shape)}]")]
        lines += self.fail_if(f"(i64.ge_s {length} (i64.const {SEQUENCE_CAPACITY}))", step.code,
                              f"(i64.add {length} (i64.const 1))", f"(i64.const {SEQUENCE_CAPACITY})", "")
        lines.append(f"(i64.store {entry} (i64.const {len(step.shape)}))")
        lines += [f"(i64.store offset={8 * (d + 1)} {entry} {value})" for d, value in enumerate(values)]
        lines.append(f"{set_size} (i64.add {size} (i64.mul {count} (i64.const {sequence.element_bytes}))))")
        lines.append(f"(i64.store (i32.const {table}) (i64.add {length} (i64.const 1)))")
        return [indent + line for line in lines]

    def visit_sequence_input(self, step: HostSequenceInput, indent: str) -> list[str]:
        """A sequence input: the runtime wrote the table; check it, and sum the arena's size."""
        sequence = self.function.sequences[step.sequence]
        table, length = self.sequence_table(step)
        size, set_size = self.arena_size(step)
        element = "(i64.extend_i32_u (global.get $element))"
        entry = self.sequence_entry(table, element)
        ndim = f"(i64.load {entry})"
        count = "(i64.const 1)"
        for d in range(MAX_RANK if sequence.ndim < 0 else sequence.ndim):
            dim = f"(i64.load offset={8 * (d + 1)} {entry})"
            if sequence.ndim < 0:  # an element of any rank: the dims past its ndim count 1
                dim = f"(select {dim} (i64.const 1) (i64.gt_s {ndim} (i64.const {d})))"
            count = f"(i64.mul {count} {dim})"
        lines = [";; " + comment_text(f"sequence {step.sequence}: input '{step.input}' (the runtime wrote its table)")]
        # length -1: an optional sequence input that is none (its loop below runs no time)
        outside = f"(i64.lt_s {length} (i64.const -1))" if step.optional else f"(i64.lt_s {length} (i64.const 0))"
        lines += self.fail_if(f"(i32.or {outside} (i64.gt_s {length} (i64.const {SEQUENCE_CAPACITY})))", step.capacity_code,
                              length, f"(i64.const {SEQUENCE_CAPACITY})", "")
        lines += [f"{set_size} (i64.const 0))", "(global.set $element (i32.const 0))", "(block $elements_done",
                  "  (loop $next_element",
                  f"    (br_if $elements_done (i64.ge_s {element} {length}))"]
        wrong_rank = f"(i64.ne {ndim} (i64.const {sequence.ndim}))" if sequence.ndim >= 0 else \
            f"(i64.gt_u {ndim} (i64.const {MAX_RANK}))"
        rank = sequence.ndim if sequence.ndim >= 0 else MAX_RANK
        lines += self.fail_if(wrong_rank, step.ndim_code, element, f"(i64.const {rank})", "    ")
        lines += [f"    {set_size} (i64.add {size} (i64.mul {count} (i64.const {sequence.element_bytes}))))",
                  "    (global.set $element (i32.add (global.get $element) (i32.const 1)))",
                  "    (br $next_element)))"]
        return [indent + line for line in lines]


def emit_host_wat(function: HostFunction, call_sites: list[CallSiteParams], workgroup_size: int, source: str) -> str:
    for kind, tensors in (("input", function.inputs), ("output", function.outputs)):
        for tensor in tensors:
            rank = len(tensor.shape) if tensor.shape is not None else tensor.ndim
            if rank > MAX_RANK:
                raise UnsupportedModelError(
                    f"{kind} '{shown(tensor.name)}' has {rank} dimensions; a bundle's inputs and outputs have at most {MAX_RANK}"
                )
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
    storage_var_names = free_var_names([s.size for s in function.storages])
    storages = [
        {"role": s.role, "text": format_expr(s.size), "address": layout.storage_sizes + 8 * i, "wat": wat(s.size)}
        for i, s in enumerate(function.storages)
    ]
    checks = [_check(check, function, layout, var_address, bound_address, wat) for check in function.checks]
    stages = _StepEmitter(function, call_sites, layout, var_address, bound_address).stages()
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
        checks=checks,
        stages=stages,
        read_slots=function.read_slots,
        params_bytes=len(call_sites) * PARAMS_SLOT,
        workgroup_size=workgroup_size,
        max_workgroups=MAX_WORKGROUPS,
        opcode_dispatch=OPCODE_DISPATCH,
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
