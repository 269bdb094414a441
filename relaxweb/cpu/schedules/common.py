"""What every kernel's functions share: the signature of ``$main``, the size variables read
from the params block, ``$units``, the comment naming the program, and flat indices split
into axes.

The signature is the contract's (docs/bundle-format.md, "kernels.wasm"): ``$units (params)
-> units`` and ``$main (params, first, end, scratch, b1 .. bN)`` running units ``first <= u <
end``; ``bI`` is the address of binding I (an input bound as parts has one parameter per
part: the first holds the whole buffer, the others are ignored); a program that checks the
run's data takes the run status's address last, as its WGSL binds it last.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from ...ir.error_sites import reports_errors
from ...ir.lower_index import IndexLowering
from ...ir.symbolic import IntImm, PrimExpr, SizeVar, as_int, product, simplify
from ...ir.syntax import comment_text
from ...ir.tir import TensorProgram, format_scalar
from ..emit import STATUS_ADDRESS, Emitter, Function, render_index
from ..wat_builder import STEP, Body, const, div_u, get, op

PARAMS = "$params"
UNITS_HEADER = f"$units (param {PARAMS} i32) (result i32)"


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
    if reports_errors(program):
        params.append(f"(param $b{binding} i32)")
        addresses[STATUS_ADDRESS] = f"$b{binding}"
    return " ".join(params), addresses


def load_size_vars(program: TensorProgram, body: Body) -> dict[str, str]:
    """Statements loading the size variables from the params block (the i32 fields after
    ``element_count``, in the program's order) into locals ``$s0`` ...; their locals by name."""
    locals_ = {}
    for position, var in enumerate(program.size_vars):
        local = body.named(f"s{position}")
        body.line(f"{op('local.set', local, f'(i32.load offset={4 * (position + 1)} {get(PARAMS)})')}  "
                  f";; {comment_text(var.name)}")
        locals_[var.name] = local
    return locals_


def size_value(variables: Mapping[str, str]) -> Callable[[PrimExpr], str]:
    """The i32 WAT value of an expression over size variables, from their locals (for
    ``$units``, where no axis is in scope)."""
    lowering = IndexLowering()

    def value(expr: PrimExpr) -> str:
        return render_index(lowering.lower(expr), lambda name: get(variables[name]))

    return value


def element_count(program: TensorProgram, variables: Mapping[str, str]) -> str:
    """The number of output elements (i32 WAT) from the size variables' locals."""
    return size_value(variables)(simplify(product(program.output.shape)))


def units_function(program: TensorProgram, count: Callable[[Callable[[PrimExpr], str]], str]) -> str:
    """``$units``: the size variables loaded, then ``count(value)``, the units as an i32 WAT
    value (``value`` renders an expression over the size variables)."""
    function = Function()
    body = Body(function)
    variables = load_size_vars(program, body)
    body.line(count(size_value(variables)))
    return function.text(UNITS_HEADER)


def units_of_elements(program: TensorProgram, per_unit: int) -> str:
    """``$units`` of units of ``per_unit`` output elements, rounded up."""
    count = simplify(product(program.output.shape))
    return units_function(program, lambda value: div_u(op("i32.add", value(count), const(per_unit - 1)),
                                                       const(per_unit)))


def comment(program: TensorProgram) -> list[str]:
    """The comment lines above a kernel's ``$main``: what it computes (model text escaped)."""
    axes = ", ".join(axis.name for axis in program.axes)
    return [";; " + comment_text(f"{program.output.name}[{axes}] = {format_scalar(program.body)}")]


def kernel_text(program: TensorProgram, main: Function, signature: str, units: str) -> str:
    """The kernel's text: the comment, ``$main``, ``$units``."""
    return "\n".join([*comment(program), main.text(f"$main {signature}"), units])


def unflatten(emitter: Emitter, body: Body, axes: Sequence[SizeVar], extents: Sequence[PrimExpr], linear: str) -> list[str]:
    """Statements setting the axes' locals (``$x0`` ...) from a flat row-major index held in
    the local ``linear`` (>= 0, below the product of the extents: every extent is > 0 where
    it runs, so the divisions are plain unsigned ones), declaring each axis's range; the
    locals, outermost first (:func:`advance` moves them on)."""
    if not axes:
        return []
    rest = body.named("rest")
    body.set(rest, get(linear))
    locals_ = [body.named(f"x{position}") for position in range(len(axes))]
    for position in reversed(range(1, len(axes))):
        extent = simplify(extents[position])
        local = locals_[position]
        if extent in (IntImm(0), IntImm(1)):
            body.set(local, const(0))
        else:
            divisor = emitter.index(extent)
            body.set(local, op("i32.rem_u", get(rest), divisor))
            body.set(rest, div_u(get(rest), divisor))
        emitter.declare_axis(axes[position], extent, local)
    body.set(locals_[0], get(rest))
    emitter.declare_axis(axes[0], extents[0], locals_[0])
    return locals_


def advance(emitter: Emitter, body: Body, extents: Sequence[PrimExpr], locals_: Sequence[str], step: int) -> None:
    """Statements moving the coordinates in ``locals_`` (:func:`unflatten`'s) ``step`` flat
    elements on: the innermost axis of extent above 1 by ``step`` (a multiple of its extent's
    divisors: 1, or 4 along a last axis of a multiple of 4), carried into the axes outside it
    where it reaches its extent (the outermost is never reset: the loop ends first).  A loop
    over flat indices that unflattened each one divided by every extent for every element:
    an upsampling of YOLOv8n took 12 ns an element."""
    order = [p for p in reversed(range(1, len(extents))) if simplify(extents[p]) not in (IntImm(0), IntImm(1))]
    order.append(0)

    def carry(position: int, amount: int) -> None:
        axis = order[position]
        body.increment(locals_[axis], amount)
        if axis == 0:
            return
        with body.if_(op("i32.ge_u", get(locals_[axis]), emitter.index(simplify(extents[axis])))):
            with body.then():
                body.set(locals_[axis], const(0))
                carry(position + 1, 1)

    if locals_:
        carry(0, step)


def unflatten_into(emitter: Emitter, body: Body, extents: Sequence[PrimExpr], linear: str, prefix: str) -> list[str]:
    """Statements setting new locals ``$<prefix>0`` ... to the row-major coordinates of the
    flat index ``linear`` (i32 WAT, >= 0) over ``extents``; the locals, outermost first (the
    caller declares them as axes where it uses them: :func:`declare_axes`)."""
    locals_ = [body.named(f"{prefix}{d}") for d in range(len(extents))]
    if not extents:
        return locals_
    rest = body.named(f"{prefix}rest")
    body.set(rest, linear)
    for position in reversed(range(1, len(extents))):
        extent = simplify(extents[position])
        if extent in (IntImm(0), IntImm(1)):
            body.set(locals_[position], const(0))
            continue
        divisor = emitter.index(extent)
        body.set(locals_[position], op("i32.rem_u", get(rest), divisor))
        body.set(rest, div_u(get(rest), divisor))
    body.set(locals_[0], get(rest))
    return locals_


def declare_axes(emitter: Emitter, axes: Sequence[SizeVar], extents: Sequence[PrimExpr],
                 locals_: Sequence[str]) -> None:
    """Declares each axis of ``axes`` (of ``extents``) held in its local, in the current scope."""
    for axis, extent, local in zip(axes, extents, locals_):
        emitter.declare_axis(axis, extent, local)


def for_each_step(emitter: Emitter, body: Body, axes: Sequence[SizeVar], extents: Sequence[PrimExpr],
                  step: Callable[[], None], unroll: int = 1) -> None:
    """Loops over ``axes`` (reduction axes, outermost first: their extents use no index
    variable), each declared in its loop; ``step()`` writes the innermost statements.  The
    innermost axes of constant extent are written out instead of looped over while the copies
    of ``step()`` stay at most ``unroll`` (a 3x3 window's 9 steps at 9, its channels looped): a
    loop of 3 steps costs about as much as its steps, and on a page that is not isolated each
    iteration spends fuel too."""
    written_out, copies = len(axes), 1
    while written_out > 0 and (count := as_int(simplify(extents[written_out - 1]))) is not None \
            and 0 < count and copies * count <= unroll:
        written_out -= 1
        copies *= count
    _steps(emitter, body, list(zip(axes, extents)), written_out, step)


def _steps(emitter: Emitter, body: Body, axes: list[tuple[SizeVar, PrimExpr]], looped: int,
           step: Callable[[], None]) -> None:
    """:func:`for_each_step`'s statements: the first ``looped`` axes as loops, the rest written out."""
    if not axes:
        step()
        return
    (axis, extent), rest = axes[0], axes[1:]
    if looped == 0:  # written out: the axis's local set to each value in turn
        local = body.local("p", "i32")
        for value in range(as_int(simplify(extent)) or 0):
            body.set(local, const(value))
            emitter.open_scope()
            emitter.declare_axis(axis, extent, local)
            _steps(emitter, body, rest, 0, step)
            emitter.close_scope()
        return
    local, end = body.local("p", "i32"), body.local("p_end", "i32")
    label = local[1:]
    body.set(end, emitter.index(extent))
    body.set(local, const(0))
    with body.block(f"$done_{label}"):
        body.br_if(f"$done_{label}", op("i32.ge_s", get(local), get(end)))
        with body.loop(f"$step_{label}"):
            emitter.open_scope()
            emitter.declare_axis(axis, extent, local)
            _steps(emitter, body, rest, looped - 1, step)
            emitter.close_scope()
            body.increment(local)
            body.br_if(f"$step_{label}", op("i32.lt_s", get(local), get(end)))


def lane_mask(differences: list[tuple[object, str, int, int]], q: int) -> str:
    """A v128 WAT value, all ones in the lanes of group ``q`` (lanes 4q .. 4q + 3) where every
    guard holds: per guard ``(compare op, its a - b at lane 0 splatted, its step per lane, an
    offset)``, ``a - b + step * lane + offset op 0``."""
    mask = None
    for compare, splat, per_lane, offset in differences:
        lanes = " ".join(str(per_lane * n + offset) for n in range(4 * q, 4 * q + 4))
        test = (f"(i32x4.{compare.value}_s (i32x4.add {splat} (v128.const i32x4 {lanes})) "  # type: ignore[attr-defined]
                f"(v128.const i32x4 0 0 0 0))")
        mask = test if mask is None else f"(v128.and {mask} {test})"
    return str(mask)


def all_of(conditions: list[str]) -> str:
    """An i32 WAT value, nonzero where every condition holds (``(i32.const 1)`` for none)."""
    if not conditions:
        return const(1)
    inside = conditions[0]
    for condition in conditions[1:]:
        inside = op("i32.and", inside, condition)
    return inside


__all__ = ["STEP", "PARAMS", "UNITS_HEADER", "kernel_signature", "load_size_vars", "size_value", "element_count",
           "units_function", "units_of_elements", "comment", "kernel_text", "unflatten", "unflatten_into",
           "declare_axes", "for_each_step", "lane_mask", "all_of"]
