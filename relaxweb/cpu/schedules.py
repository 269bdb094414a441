"""The loops of each kind of tensor program on the CPU: a kernel's ``$units`` and ``$main``.

A GPU schedule (``relaxweb/ir/schedule.py``) lays a program out on invocations; here the
loops are chosen from the program itself (``relaxweb/ir/pattern.py`` says what it is), so
every schedule kind renders.  The signature is the contract's (docs/bundle-format.md,
"kernels.wasm"): ``$units (params) -> units`` and ``$main (params, first, end, scratch,
b1 .. bN)`` running units ``first <= u < end``; ``bI`` is the address of binding I (an input
bound as parts has one parameter per part: the first holds the whole buffer, the others
are ignored).

The element form runs any program: a unit is :data:`ELEMENTS_PER_UNIT` consecutive output
elements (threads split the work coarsely), a loop over the flat output index recovers the
axes by division, reductions are serial loops, and each element is stored in the output's
device dtype.
"""

from __future__ import annotations

from typing import Mapping

from ..ir.lower_index import IndexLowering
from ..ir.symbolic import IntImm, PrimExpr, SizeVar, simplify
from ..ir.syntax import comment_text
from ..ir.tir import TensorProgram, format_scalar
from .emit import Emitter, Function, render_index, store

ELEMENTS_PER_UNIT = 64
PARAMS = "$params"


def kernel_signature(program: TensorProgram, parts: Mapping[str, int]) -> tuple[str, dict[str, str]]:
    """The params of ``$main`` after ``$params``, and each buffer's address parameter by name."""
    params = ["(param $params i32)", "(param $first i32)", "(param $end i32)", "(param $scratch i32)"]
    addresses: dict[str, str] = {}
    binding = 1
    for buffer in (*program.inputs, program.output):
        for part in range(parts.get(buffer.name, 1)):
            name = f"$b{binding}"
            params.append(f"(param {name} i32)")
            if part == 0:
                addresses.setdefault(buffer.name, name)
            binding += 1
    return " ".join(params), addresses


def load_size_vars(program: TensorProgram, function: Function, indent: str) -> dict[str, str]:
    """Statements loading the size variables from the params block (the i32 fields after
    ``element_count``, in the program's order) into locals ``$s0`` ...; their locals by name."""
    locals_ = {}
    for position, var in enumerate(program.size_vars):
        local = function.named_local(f"s{position}", "i32")
        function.emit(indent, f"(local.set {local} (i32.load offset={4 * (position + 1)} (local.get {PARAMS})))  "
                              f";; {comment_text(var.name)}")
        locals_[var.name] = local
    return locals_


def element_count(program: TensorProgram, variables: Mapping[str, str]) -> str:
    """The number of output elements (i32 WAT) from the size variables' locals."""
    count: PrimExpr = IntImm(1)
    for extent in program.output.shape:
        count = count * extent
    lowering = IndexLowering()
    return render_index(lowering.lower(simplify(count)), lambda name: f"(local.get {variables[name]})")


def units_function(program: TensorProgram, per_unit: int) -> str:
    """``$units``: the output elements in units of ``per_unit``, rounded up."""
    function = Function()
    variables = load_size_vars(program, function, "  ")
    count = element_count(program, variables)
    function.emit("  ", f"(i32.div_u (i32.add {count} (i32.const {per_unit - 1})) (i32.const {per_unit}))")
    return function.text(f"$units (param {PARAMS} i32) (result i32)")


def comment(program: TensorProgram) -> list[str]:
    """The comment lines above a kernel's ``$main``: what it computes (model text escaped)."""
    axes = ", ".join(axis.name for axis in program.axes)
    return [";; " + comment_text(f"{program.output.name}[{axes}] = {format_scalar(program.body)}")]


def render_element(program: TensorProgram, parts: Mapping[str, int]) -> str:
    """The element form: units of :data:`ELEMENTS_PER_UNIT` output elements, each computed
    on its own (axes from the flat index by division)."""
    signature, addresses = kernel_signature(program, parts)
    function = Function()
    indent = "  "
    variables = load_size_vars(program, function, indent)
    emitter = Emitter(program, function, addresses, variables)
    emit = function.emit
    index, stop = function.named_local("i", "i32"), function.named_local("stop", "i32")
    emit(indent, f"(local.set {index} (i32.mul (local.get $first) (i32.const {ELEMENTS_PER_UNIT})))")
    emit(indent, f"(local.set {stop} (call $min_s_i32 (i32.mul (local.get $end) (i32.const {ELEMENTS_PER_UNIT})) "
                 f"{element_count(program, variables)}))")
    emit(indent, "(block $done")
    emit(indent, f"  (br_if $done (i32.ge_s (local.get {index}) (local.get {stop})))")
    emit(indent, "  (loop $element")
    inner = indent + "    "
    emitter.open_scope()
    unflatten(emitter, program.axes, program.output.shape, index, inner)
    value = emitter.scalar(program.body, inner)
    emit(inner, store(program.output.dtype, emitter.address(program.output.name, f"(local.get {index})"), value))
    emitter.close_scope()
    emit(inner, f"(local.set {index} (i32.add (local.get {index}) (i32.const 1)))")
    emit(inner, f"(br_if $element (i32.lt_s (local.get {index}) (local.get {stop})))))")
    return "\n".join([*comment(program), function.text(f"$main {signature}"), units_function(program, ELEMENTS_PER_UNIT)])


def unflatten(emitter: Emitter, axes: tuple[SizeVar, ...], extents: tuple[PrimExpr, ...], linear: str,
              indent: str) -> None:
    """Statements setting the axes' locals (``$x0`` ...) from a flat row-major index held in
    the local ``linear`` (>= 0, below the product of the extents: every extent is > 0 where
    it runs, so the divisions are plain unsigned ones), declaring each axis's range."""
    if not axes:
        return
    function = emitter.function
    rest = function.named_local("rest", "i32")
    function.emit(indent, f"(local.set {rest} (local.get {linear}))")
    locals_ = [function.named_local(f"x{position}", "i32") for position in range(len(axes))]
    for position in reversed(range(1, len(axes))):
        extent = simplify(extents[position])
        local = locals_[position]
        if extent in (IntImm(0), IntImm(1)):
            function.emit(indent, f"(local.set {local} (i32.const 0))")
        else:
            divisor = emitter.index(extent)
            function.emit(indent, f"(local.set {local} (i32.rem_u (local.get {rest}) {divisor}))")
            function.emit(indent, f"(local.set {rest} (i32.div_u (local.get {rest}) {divisor}))")
        emitter.declare_axis(axes[position], extent, local)
    function.emit(indent, f"(local.set {locals_[0]} (local.get {rest}))")
    emitter.declare_axis(axes[0], extents[0], locals_[0])


def render_program(program: TensorProgram, parts: Mapping[str, int] | None = None) -> str:
    """The WAT of a tensor program's ``$main`` and ``$units`` (loops chosen from the program)."""
    return render_element(program, dict(parts or {}))
