"""The ``window`` kind (``WindowSchedule``): a sliding-window reduction (a depthwise or grouped
convolution, a pool, with its fused epilogue: ``relaxweb.ir.schedule_fit.wasm_window``), one
unit per output row (every axis but the last), so threads split rows.

Along a row, ``lanes`` output positions per iteration in f32x4 sums, then four at a time;
the last four end at the row's end (they may overlap the ones before: those are computed
again, to the same values), and a row shorter than four runs the element form.  A unit's
first row's axes come from its number by division, the next rows' by counting.  Where every
guard holds over the whole window of the iteration's lanes (checked at the window's corners;
the guards that do not read the row's axis once per row) the steps run without any test:
the core's loads ``v128.load`` along the row (two loads and a shuffle at stride 2, lane by
lane beyond), its other loads one ``v128.load32_splat`` shared by the sums (the weight),
every address advanced by a constant per step of the innermost reduction axis.  Elsewhere
(a padded border) each guard is checked at the outermost reduction loop whose axes it reads
(a padded row skips its whole kernel row).  The guards along the row (``masked_borders``,
where they read no reduction axis but the innermost) become one mask per lane group and
innermost step, computed once for the iteration: the innermost steps then run unrolled,
each sum's core and-ed with its mask; otherwise they are tested at every step at the first
and last lane: the vector step where they hold, the lanes one by one where not.  The
epilogue (bias, relu, hard-swish, a residual add) runs on the vector sums.
"""

from __future__ import annotations

from typing import Mapping

from ...ir.access import depends_on, flat_offset, moved
from ...ir.pattern import WindowInfo
from ...ir.schedule_fit import wasm_window
from ...ir.symbolic import IntImm, PrimExpr, SizeVar, as_int, free_vars, product, simplify, substitute
from ...ir.tir import (
    Binary, FloatImm, Load, Reduce, ReduceCombiner, ScalarExpr, TensorProgram, Unary, index_var_names,
    repeated_subexpressions, scalar_children, scalar_nodes,
)
from ...ir.wasm_schedule import WindowSchedule
from ..emit import (
    BINARY_RENDERINGS, UNARY_RENDERINGS, VECTOR_BINARY_RENDERINGS, VECTOR_COMBINER_RENDERINGS, VECTOR_UNARY_RENDERINGS,
    Emitter, Function, literal, reduce_identity, rendering, store,
)
from ..wat_builder import Body, add, call, const, get, op, sub
from .common import (
    all_of, declare_axes, kernel_signature, kernel_text, lane_mask, load_size_vars, unflatten_into, units_function,
)


def render_window(program: TensorProgram, schedule: WindowSchedule, parts: Mapping[str, int]) -> str:
    """``$main`` and ``$units`` of the window kind (see the module doc)."""
    info = wasm_window(program)
    if info is None:
        raise ValueError(f"{program.name} is scheduled as {schedule.kind} but does not fit it "
                         f"(relaxweb.ir.schedule_fit.wasm_window)")
    signature, addresses = kernel_signature(program, parts)
    function = Function()
    body = Body(function)
    variables = load_size_vars(program, body)
    emitter = Emitter(program, function, addresses, variables)
    shape = program.output.shape
    lane_axis, width = program.axes[-1], simplify(shape[-1])
    row_axes, row_extents = program.axes[:-1], [simplify(extent) for extent in shape[:-1]]
    width_local, row, x = (body.named(name) for name in ("width", "row", "x"))
    zero = body.named("zero")  # 0: wasm's locals start at 0 and this one is never set
    body.set(width_local, emitter.index(width))
    lasts = []
    for number, extent in enumerate(info.reduce_extents):
        last = body.named(f"k{number}_last")
        body.set(last, emitter.index(simplify(extent - 1)))
        lasts.append(last)
    window = _Window(emitter, body, schedule, info, program, lane_axis, width, zero, lasts)
    body.set(row, get("$first"))
    with body.block("$done"):
        body.br_if("$done", op("i32.ge_u", get(row), get("$end")))
        row_locals = unflatten_into(emitter, body, row_extents, get(row), "y")
        with body.loop("$row"):
            emitter.open_scope()
            declare_axes(emitter, row_axes, row_extents, row_locals)
            body.set(x, const(0))
            if isinstance(width, IntImm) and width.value >= 4:
                window.row(x, width_local)
            else:  # fewer than four positions at run time: each on its own
                with body.if_(op("i32.ge_s", get(width_local), const(4))):
                    with body.then():
                        window.row(x, width_local)
                    with body.else_():
                        _single_positions(emitter, body, program, lane_axis, width, x, width_local)
            emitter.close_scope()
            _next_row(emitter, body, row_locals, row_extents)
            body.increment(row)
            body.br_if("$row", op("i32.lt_u", get(row), get("$end")))
    units = units_function(program, lambda value: value(simplify(product(row_extents))))
    return kernel_text(program, function, signature, units)


def _single_positions(emitter: Emitter, body: Body, program: TensorProgram, lane_axis: SizeVar, width: PrimExpr,
                      x: str, width_local: str) -> None:
    """A row's positions one by one (the element form), for a row shorter than four."""
    with body.block("$single_done"):
        body.br_if("$single_done", op("i32.ge_s", get(x), get(width_local)))
        with body.loop("$single"):
            emitter.open_scope()
            emitter.declare_axis(lane_axis, width, x)
            offset = emitter.index(flat_offset(program.output, tuple(program.axes)))
            body.line(store(program.output.dtype, emitter.address(program.output.name, offset),
                            emitter.scalar(program.body, body.indent)))
            emitter.close_scope()
            body.increment(x)
            body.br_if("$single", op("i32.lt_s", get(x), get(width_local)))


def _next_row(emitter: Emitter, body: Body, row_locals: list[str], row_extents: list[PrimExpr]) -> None:
    """The next row's axes: the last one up by one, carried into the ones before (no division)."""
    if not row_locals:
        return
    *outer, local = row_locals
    body.increment(local)
    if not outer:
        return
    with body.if_(op("i32.eq", get(local), emitter.index(row_extents[len(outer)]))):
        with body.then():
            body.set(local, const(0))
            _next_row(emitter, body, outer, row_extents)


def _core_loads(info: WindowInfo) -> list[Load]:
    """The distinct loads of the window's core, in order."""
    return list(dict.fromkeys(node for node in scalar_nodes(info.core) if isinstance(node, Load)))


def _epilogue_loads(expr: ScalarExpr, reduction: Reduce) -> list[Load]:
    """The loads of ``expr`` outside ``reduction``."""
    if expr == reduction:
        return []
    if isinstance(expr, Load):
        return [expr]
    return [load for child in scalar_children(expr) for load in _epilogue_loads(child, reduction)]


class _Window:
    """The statements of :func:`render_window`'s iterations over one row (see the module doc)."""

    def __init__(self, emitter: Emitter, body: Body, schedule: WindowSchedule, info: WindowInfo,
                 program: TensorProgram, lane_axis: SizeVar, width: PrimExpr, zero: str, lasts: list[str]) -> None:
        self.emitter, self.body, self.schedule, self.info, self.program = emitter, body, schedule, info, program
        self.lane_axis, self.width, self.zero, self.lasts = lane_axis, width, zero, lasts
        self.strides = dict(info.strides)
        self.loads = _core_loads(info)
        self.along = [g for g in info.guards if depends_on(g, lane_axis.name)]  # guards read per lane
        self.fixed = [g for g in info.guards if not depends_on(g, lane_axis.name)]  # the same for a whole row
        self.row_inside = body.named("row_inside")
        self.epilogue_splats: dict[ScalarExpr, str] = {}
        self.repeated_core = repeated_subexpressions(info.core)
        # a sum starts at 0, a max (min) pool at -inf (inf); a lane outside the padding's
        # guards adds that start (``pattern._neutral``: a skipped step)
        if info.combiner is ReduceCombiner.SUM:
            self.start, self.skipped = "(v128.const i32x4 0 0 0 0)", "(f32.const 0)"
        else:
            self.skipped = reduce_identity(info.combiner, "float32")
            self.start = f"(f32x4.splat {self.skipped})"
        self.combine = VECTOR_COMBINER_RENDERINGS[info.combiner]
        self.lane_masks = self.mask_differences() if schedule.masked_borders else None

    def row(self, x: str, width: str) -> None:
        """A row of at least four positions: ``lanes`` at a time, then four at a time."""
        body, lanes = self.body, self.schedule.lanes
        self.emitter.open_scope()
        self.row_start()
        wide_fits = f"{add(get(x), const(lanes))} {get(width)}"
        with body.block("$wide_done"):
            body.br_if("$wide_done", f"(i32.gt_s {wide_fits})")
            with body.loop("$wide"):
                self.iteration(x, lanes)
                body.increment(x, lanes)
                body.br_if("$wide", f"(i32.le_s {wide_fits})")
        with body.block("$narrow_done"):
            body.br_if("$narrow_done", op("i32.ge_s", get(x), get(width)))
            with body.loop("$narrow"):
                body.set(x, call("$min_s_i32", get(x), sub(get(width), const(4))))
                self.iteration(x, 4)
                body.increment(x, 4)
                body.br_if("$narrow", op("i32.lt_s", get(x), get(width)))
        self.emitter.close_scope()

    def row_start(self) -> None:
        """Once per row: whether the guards that do not read the row's axis hold over the
        whole window, and the splats of the epilogue's loads that do not read it (a bias)."""
        emitter, indent = self.emitter, self.body.indent
        self.body.set(self.row_inside, self.corners(self.fixed, []))
        self.epilogue_splats = {}
        for node in _epilogue_loads(self.program.body, self.info.reduction):
            if not depends_on(node, self.lane_axis.name) and node not in self.epilogue_splats:
                value = emitter.scalar(node, indent)
                self.epilogue_splats[node] = emitter.set_local(f"(f32x4.splat {value})", "v128", indent, "splat")

    def corners(self, guards: list[ScalarExpr], lanes: list[str]) -> str:
        """An i32 WAT value, nonzero when each guard holds at every corner of the window: each
        reduction axis it reads at 0 and at its extent - 1, and the row's axis (where it reads
        it) at each local of ``lanes`` (the first and the last lane).  A guard moves by a
        constant per step of each (``analyze_window``), so it then holds over the whole box."""
        emitter, info = self.emitter, self.info
        conditions = []
        for guard in guards:
            reads = [n for n, axis in enumerate(info.reduce_axes) if depends_on(guard, axis.name)]
            corners: list[list[tuple[int, bool]]] = [[]]
            for n in reads:
                corners = [[*corner, (n, end)] for corner in corners for end in (False, True)]
            for lane in (lanes if depends_on(guard, self.lane_axis.name) else [None]):
                for corner in corners:
                    emitter.open_scope()
                    if lane is not None:
                        emitter.declare_axis(self.lane_axis, self.width, lane)
                    for n, end in corner:
                        emitter.declare_axis(info.reduce_axes[n], info.reduce_extents[n],
                                             self.lasts[n] if end else self.zero)
                    conditions.append(emitter.scalar(guard, self.body.indent))
                    emitter.close_scope()
        return all_of(conditions)

    def iteration(self, x: str, lanes: int) -> None:
        """The statements computing and storing the outputs at positions ``x`` ..
        ``x + lanes - 1`` of the row (all inside it)."""
        emitter, body, info = self.emitter, self.body, self.info
        lane_locals = [x] + [body.named(f"x{n}") for n in range(1, lanes)]
        for n in range(1, lanes):
            body.set(lane_locals[n], add(get(x), const(n)))
        sums = [body.named(f"sum{q}", "v128") for q in range(lanes // 4)]
        for local in sums:
            body.set(local, self.start)
        emitter.open_scope()
        emitter.declare_axis(self.lane_axis, self.width, x)
        emitter.open_scope()  # each load's address at the first lane and the first step
        for axis, extent in zip(info.reduce_axes, info.reduce_extents):
            emitter.declare_axis(axis, extent, self.zero)
        bases = {}
        for number, load in enumerate(self.loads):
            bases[load] = body.named(f"base{number}")
            body.set(bases[load], emitter.element_address(load.buffer, load.indices))
        emitter.close_scope()
        inside = self.corners(self.along, [x, lane_locals[-1]])
        if info.guards:
            with body.if_(op("i32.and", get(self.row_inside), inside)):
                with body.then():
                    self.steps(bases, lane_locals, sums, False)
                with body.else_():
                    self.border_steps(bases, lane_locals, sums)
        else:
            self.steps(bases, lane_locals, sums, False)
        output = emitter.address(self.program.output.name,
                                 emitter.index(flat_offset(self.program.output, tuple(self.program.axes))))
        address = emitter.set_local(output, "i32", body.indent, "address")
        for q, local in enumerate(sums):
            splats = {**self.epilogue_splats, info.reduction: get(local)}
            if q:  # the epilogue's loads along the row at this sum's four positions
                emitter.open_scope()
                emitter.declare_axis(self.lane_axis, self.width, lane_locals[4 * q])
            value = emitter.vector_value(self.program.body, splats, {}, body.indent)
            if q:
                emitter.close_scope()
            body.store("v128.store", address, value, 16 * q)
        emitter.close_scope()

    def mask_differences(self) -> list[tuple[object, PrimExpr, int, int]] | None:
        """Per guard along the row, ``(compare op, a - b, its step per lane, its step per
        innermost reduction step)`` for a guard ``a op b`` of index values (``a - b op 0``),
        where each guard reads no reduction axis but the innermost and moves by constants;
        else None (the borders test each step)."""
        info = self.info
        if not self.along or not info.reduce_axes:
            return None
        innermost = info.reduce_axes[-1]
        outer = [axis.name for axis in info.reduce_axes[:-1]]
        found = []
        for guard in self.along:
            if any(depends_on(guard, name) for name in outer):
                return None
            difference = simplify(guard.a.value - guard.b.value)
            per_lane = as_int(simplify(substitute(difference, {self.lane_axis.name: self.lane_axis + 1}) - difference))
            per_step = as_int(simplify(substitute(difference, {innermost.name: innermost + 1}) - difference))
            if per_lane is None or per_step is None:
                return None
            found.append((guard.op, difference, per_lane, per_step))
        return found

    def border_steps(self, bases: Mapping[Load, str], lane_locals: list[str], sums: list[str]) -> None:
        """An iteration where a guard fails somewhere in its window: the innermost steps
        masked (see the module doc) where they can be written out, else tested at each step."""
        info, body = self.info, self.body
        extent = simplify(info.reduce_extents[-1])
        steps = {load: as_int(moved(load, info.reduce_axes[-1])) for load in self.loads}
        fits = self.lane_masks is not None and all(step is not None and step >= 0 for step in steps.values())
        known = as_int(extent)
        stride = max(self.strides.values())

        def masked(count: int) -> None:
            # a masked lane's load lies within the lanes' and the window's reach of one inside
            if 4 * stride * (len(lane_locals) + count) + 16 > self.schedule.overreach:
                self.steps(bases, lane_locals, sums, True)
                return
            masks = self.step_masks(count, lane_locals[0], len(sums))
            self.steps(bases, lane_locals, sums, True, (count, steps, masks))

        def choose(widths: tuple[int, ...]) -> None:
            if not widths:
                self.steps(bases, lane_locals, sums, True)
                return
            with body.if_(op("i32.eq", self.emitter.index(extent), const(widths[0]))):
                with body.then():
                    masked(widths[0])
                with body.else_():
                    choose(widths[1:])

        if not fits:
            self.steps(bases, lane_locals, sums, True)
        elif known is not None:
            if known <= self.schedule.unroll:
                masked(known)
            else:
                self.steps(bases, lane_locals, sums, True)
        else:
            choose(self.schedule.unrolled_widths)

    def step_masks(self, count: int, first_lane: str, groups: int) -> list[list[str]]:
        """Per innermost step (``count``) and group of four lanes, a v128 local whose lanes are
        all ones where every guard along the row holds at that lane and step: each guard's
        ``a - b`` at the first lane and step, splatted once, plus its constant steps."""
        emitter, body, info = self.emitter, self.body, self.info
        emitter.open_scope()
        emitter.declare_axis(self.lane_axis, self.width, first_lane)
        for axis, extent in zip(info.reduce_axes, info.reduce_extents):
            emitter.declare_axis(axis, extent, self.zero)
        splats = []
        for compare, difference, per_lane, per_step in self.lane_masks or []:
            value = emitter.set_local(emitter.index(difference), "i32", body.indent, "difference")
            splats.append((compare, emitter.set_local(f"(i32x4.splat {value})", "v128", body.indent, "differences"),
                           per_lane, per_step))
        emitter.close_scope()
        return [[emitter.set_local(lane_mask([(compare, splat, per_lane, per_step * step)
                                                for compare, splat, per_lane, per_step in splats], q),
                                   "v128", body.indent, "mask")
                 for q in range(groups)]
                for step in range(count)]

    def steps(self, bases: Mapping[Load, str], lane_locals: list[str], sums: list[str], guarded: bool,
              masked: tuple[int, Mapping[Load, int], list[list[str]]] | None = None) -> None:
        """The reduction's loops adding the core at every step into ``sums``, from the loads'
        addresses at the first step (``bases``); ``guarded``: each guard checked (see the
        module doc), else none; ``masked``: the innermost axis's extent, each load's step
        along it and the masks of :meth:`step_masks`, its steps written out and masked (the
        guards along the row then not tested)."""
        levels: dict[int, list[ScalarExpr]] = {}
        if guarded:
            for guard in self.fixed:
                reads = [n for n, axis in enumerate(self.info.reduce_axes) if depends_on(guard, axis.name)]
                levels.setdefault(max(reads, default=-1), []).append(guard)
        body = self.body
        with body.block("$window"):
            for guard in levels.get(-1, []):
                body.br_if("$window", op("i32.eqz", self.emitter.scalar(guard, body.indent)))
            self.level(0, dict(bases), lane_locals, sums, guarded, levels, masked)

    def level(self, number: int, addresses: dict[Load, str], lane_locals: list[str], sums: list[str], guarded: bool,
              levels: Mapping[int, list[ScalarExpr]],
              masked: tuple[int, Mapping[Load, int], list[list[str]]] | None = None) -> None:
        """The loop over reduction axis ``number`` and the ones inside it (``addresses``: each
        load's address at the current step of the outer axes and the first of the rest).
        An address moves by a step free of index variables (a constant, a row's length) by
        one add per step, else it is computed at each step.  Unguarded, the innermost axis
        is unrolled where each address moves by a constant (one ``offset=`` per step): at
        a constant extent up to the schedule's ``unroll``, else for the extents of its
        ``unrolled_widths`` (3x3, 5x5, 7x7 kernels), chosen at run time."""
        emitter, body, info = self.emitter, self.body, self.info
        if masked is not None and number == len(info.reduce_axes) - 1:
            count, steps, masks = masked
            self.unrolled(count, addresses, steps, sums, masks)
            return
        if number == len(info.reduce_axes):
            if guarded and self.along:
                self.guarded_step(lane_locals, sums, addresses)
            else:
                self.vector_step(sums, addresses, {})
            return
        axis, extent = info.reduce_axes[number], simplify(info.reduce_extents[number])
        emitter.open_scope()
        if extent == IntImm(1):
            emitter.declare_axis(axis, extent, self.zero)
            for guard in levels.get(number, []):
                body.br_if("$window", op("i32.eqz", emitter.scalar(guard, body.indent)))
            self.level(number + 1, addresses, lane_locals, sums, guarded, levels, masked)
            emitter.close_scope()
            return
        names = index_var_names(self.program)
        steps = {load: moved(load, axis) for load in self.loads}
        # lists in the loads' order (not sets: the kernel text must not depend on hashing)
        moving = [load for load in self.loads if steps[load] != IntImm(0)]
        computed = [load for load in moving if any(var.name in names for var in free_vars(steps[load]))]
        innermost = number == len(info.reduce_axes) - 1
        constant_steps = {load: as_int(step) for load, step in steps.items()}
        offsets_fit = all(v is not None and v >= 0 for v in constant_steps.values())  # offset= immediates
        known = as_int(extent)

        def loop() -> None:
            self.loop(number, addresses, moving, computed, steps, lane_locals, sums, guarded, levels, masked)

        if not (innermost and not guarded and not computed and offsets_fit):
            loop()
        elif known is not None and known <= self.schedule.unroll:
            self.unrolled(known, addresses, constant_steps, sums)
        elif known is None:
            self.unrolled_by_width(self.schedule.unrolled_widths, extent, addresses, constant_steps, sums, loop)
        else:
            loop()
        emitter.close_scope()

    def unrolled_by_width(self, widths: tuple[int, ...], extent: PrimExpr, addresses: Mapping[Load, str],
                          steps: Mapping[Load, int], sums: list[str], loop) -> None:
        """The innermost axis unrolled where its run-time extent is one of ``widths``, else ``loop()``."""
        if not widths:
            loop()
            return
        body = self.body
        with body.if_(op("i32.eq", self.emitter.index(extent), const(widths[0]))):
            with body.then():
                self.unrolled(widths[0], addresses, steps, sums)
            with body.else_():
                self.unrolled_by_width(widths[1:], extent, addresses, steps, sums, loop)

    def loop(self, number: int, addresses: dict[Load, str], moving, computed, steps, lane_locals: list[str],
             sums: list[str], guarded: bool, levels: Mapping[int, list[ScalarExpr]],
             masked: tuple[int, Mapping[Load, int], list[list[str]]] | None = None) -> None:
        """:meth:`level`'s loop over reduction axis ``number`` (in the scope it opened)."""
        emitter, body, info = self.emitter, self.body, self.info
        axis, extent = info.reduce_axes[number], info.reduce_extents[number]
        inner = dict(addresses)
        for load in moving:
            inner[load] = body.local("at", "i32")
            if load not in computed:
                body.set(inner[load], get(addresses[load]))
        local, end, left = body.local("k", "i32"), body.local("k_end", "i32"), body.local("k_left", "i32")
        label = local[1:]
        body.set(end, emitter.index(extent))
        body.set(local, const(0))
        with body.block(f"$done_{label}"):
            body.br_if(f"$done_{label}", op("i32.ge_s", get(local), get(end)))
            body.set(left, get(end))  # the steps, counted down (Body.count_down)
            with body.loop(f"$step_{label}"):
                with body.block(f"$next_{label}"):
                    emitter.declare_axis(axis, extent, local)
                    if computed:  # at this step and the first of the axes inside
                        emitter.open_scope()
                        for inner_axis, inner_extent in zip(info.reduce_axes[number + 1:],
                                                            info.reduce_extents[number + 1:]):
                            emitter.declare_axis(inner_axis, inner_extent, self.zero)
                        for load in self.loads:
                            if load in computed:
                                body.set(inner[load], emitter.element_address(load.buffer, load.indices))
                        emitter.close_scope()
                    for guard in levels.get(number, []):
                        body.br_if(f"$next_{label}", op("i32.eqz", emitter.scalar(guard, body.indent)))
                    self.level(number + 1, inner, lane_locals, sums, guarded, levels, masked)
                for load in moving:  # advanced also where a guard skipped the step
                    if load not in computed:
                        body.increment(inner[load], emitter.index(simplify(steps[load] * 4)))
                body.increment(local)
                body.count_down(left, f"$step_{label}")

    def unrolled(self, count: int, addresses: Mapping[Load, str], steps: Mapping[Load, int], sums: list[str],
                 masks: list[list[str]] | None = None) -> None:
        """``count`` steps of the innermost axis, each load at a constant offset from its
        address, each step's sums masked by ``masks[step]`` where given."""
        for step in range(count):
            self.vector_step(sums, addresses, {load: 4 * steps[load] * step for load in self.loads},
                             masks[step] if masks else None)

    def vector_step(self, sums: list[str], addresses: Mapping[Load, str], offsets: Mapping[Load, int],
                    masks: list[str] | None = None) -> None:
        """Each sum plus the core at its four positions: loads along the row from their
        addresses (plus ``offsets`` bytes), the rest (the weight) once for all sums; with
        ``masks`` (one per sum), the lanes outside a mask add the reduction's skipped value."""
        shared: dict[ScalarExpr, str] = {}
        for q, local in enumerate(sums):
            value = self.core_vector(self.info.core, q, addresses, offsets, shared, {})
            if masks is not None:
                value = self.masked(value, masks[q])
            self.body.set(local, self.combine(get(local), value))

    def masked(self, value: str, mask: str) -> str:
        """``value`` where ``mask``'s lanes are set, else the reduction's skipped value (0 for
        a sum: the and drops whatever a masked lane's load read, NaN included)."""
        if self.info.combiner is ReduceCombiner.SUM:
            return f"(v128.and {value} {mask})"
        return f"(v128.bitselect {value} (f32x4.splat {self.skipped}) {mask})"

    def core_vector(self, expr: ScalarExpr, q: int, addresses: Mapping[Load, str], offsets: Mapping[Load, int],
                    shared: dict, memo: dict) -> str:
        """The f32x4 value of the core at the positions of sum ``q`` (lanes 4q .. 4q + 3)."""
        lane_free = not depends_on(expr, self.lane_axis.name)
        cache = shared if lane_free else memo
        if expr in cache:
            return cache[expr]
        if isinstance(expr, Load):
            text = self.core_load(expr, q, get(addresses[expr]), offsets.get(expr, 0))
        elif isinstance(expr, FloatImm):
            text = f"(f32x4.splat {literal(expr.value, expr.dtype)})"
        elif isinstance(expr, Binary):
            a = self.core_vector(expr.a, q, addresses, offsets, shared, memo)
            b = self.core_vector(expr.b, q, addresses, offsets, shared, memo)
            text = VECTOR_BINARY_RENDERINGS[expr.op](a, b)
        elif isinstance(expr, Unary):
            text = VECTOR_UNARY_RENDERINGS[expr.op](self.core_vector(expr.a, q, addresses, offsets, shared, memo))
        else:
            raise TypeError(f"{self.program.name}: cannot vectorize {type(expr).__name__} along a row")
        if (lane_free and not isinstance(expr, FloatImm)) or expr in self.repeated_core:  # once for all sums
            text = self.emitter.set_local(text, "v128", self.body.indent, "core")
        cache[expr] = text
        return text

    def core_load(self, load: Load, q: int, address: str, at: int) -> str:
        """A core load at the four positions of sum ``q`` (``at``: bytes past ``address``)."""
        stride = self.strides.get(load)
        if stride is None:  # the same element for every lane: the weight
            return f"(v128.load32_splat offset={at} {address})"
        if stride == 1:
            return f"(v128.load offset={at + 16 * q} {address})"
        if stride == 2:  # elements 0, 2 of the first four and 4, 6 (lanes 1, 3) of the four from 3
            return (f"(i8x16.shuffle 0 1 2 3 8 9 10 11 20 21 22 23 28 29 30 31 "
                    f"(v128.load offset={at + 32 * q} {address}) (v128.load offset={at + 32 * q + 12} {address}))")
        text = f"(f32x4.splat (f32.load offset={at + 16 * stride * q} {address}))"
        for n in range(1, 4):
            text = f"(f32x4.replace_lane {n} {text} (f32.load offset={at + 4 * stride * (4 * q + n)} {address}))"
        return text

    def core_scalar(self, expr: ScalarExpr, lane: int, addresses: Mapping[Load, str], memo: dict) -> str:
        """The f32 value of the core at lane ``lane``, its loads from their addresses."""
        if expr in memo:
            return memo[expr]
        if isinstance(expr, Load):
            text = f"(f32.load offset={4 * self.strides.get(expr, 0) * lane} {get(addresses[expr])})"
        elif isinstance(expr, FloatImm):
            text = literal(expr.value, expr.dtype)
        elif isinstance(expr, Binary):
            a, b = (self.core_scalar(side, lane, addresses, memo) for side in (expr.a, expr.b))
            text = rendering(BINARY_RENDERINGS, expr.op, "f")(a, b)
        else:
            assert isinstance(expr, Unary)
            text = rendering(UNARY_RENDERINGS, expr.op, "f")(self.core_scalar(expr.a, lane, addresses, memo))
        if expr in self.repeated_core:
            text = self.emitter.set_local(text, "f32", self.body.indent, "lane_value")
        memo[expr] = text
        return text

    def holds(self, lane: str) -> str:
        """An i32 WAT value, nonzero where every guard along the row holds at ``lane``."""
        emitter = self.emitter
        emitter.open_scope()
        emitter.declare_axis(self.lane_axis, self.width, lane)
        conditions = [emitter.scalar(guard, self.body.indent) for guard in self.along]
        emitter.close_scope()
        return all_of(conditions)

    def guarded_step(self, lane_locals: list[str], sums: list[str], addresses: Mapping[Load, str]) -> None:
        """A step at a border.  Where the guards along the row hold at the first and the last
        lane: the vector step.  Where they hold at one of them: the vector step with the
        lanes where a guard fails masked to 0 (their loads read a few elements before or
        past the row, at most the schedule's ``overreach`` bytes from a lane that is inside:
        within the linear memory, whose first 64 KiB are no buffer and which has 64 KiB of
        slack after the last one; the values are dropped, so garbage and NaN do no harm).
        Elsewhere each lane's core where its guards hold (its loads at their lane's offset
        from the addresses), else 0."""
        body, emitter = self.body, self.emitter
        first = emitter.set_local(self.holds(lane_locals[0]), "i32", body.indent, "holds")
        last = emitter.set_local(self.holds(lane_locals[-1]), "i32", body.indent, "holds")
        reach = 4 * max(self.strides.values()) * len(lane_locals) + 16
        with body.if_(op("i32.and", first, last)):
            with body.then():
                self.vector_step(sums, addresses, {})
            with body.else_():
                if reach <= self.schedule.overreach:
                    with body.if_(op("i32.or", first, last)):
                        with body.then():
                            self.masked_step(sums, addresses)
                        with body.else_():
                            self.lane_by_lane_step(lane_locals, sums, addresses)
                else:
                    self.lane_by_lane_step(lane_locals, sums, addresses)

    def lane_by_lane_step(self, lane_locals: list[str], sums: list[str], addresses: Mapping[Load, str]) -> None:
        """Each lane's core where its guards hold, else the reduction's skipped value."""
        body = self.body
        for q, local in enumerate(sums):
            values = []
            for n in range(4 * q, 4 * q + 4):
                value = body.local("lane_value", "f32")
                body.set(value, self.skipped)
                with body.if_(self.holds(lane_locals[n])):
                    with body.then():
                        body.set(value, self.core_scalar(self.info.core, n, addresses, {}))
                values.append(get(value))
            vector = f"(f32x4.splat {values[0]})"
            for n in range(1, 4):
                vector = f"(f32x4.replace_lane {n} {vector} {values[n]})"
            body.set(local, self.combine(get(local), vector))

    def masked_step(self, sums: list[str], addresses: Mapping[Load, str]) -> None:
        """Each sum plus the core at its four positions, and-ed with the lanes where every
        guard along the row holds: a guard ``a op b`` is ``a - b op 0``, and ``a - b`` moves
        by a constant per lane (an i32x4 compare of its four values)."""
        emitter, body = self.emitter, self.body
        differences = []
        for guard in self.along:
            difference = simplify(guard.a.value - guard.b.value)
            per_lane = as_int(simplify(substitute(difference, {self.lane_axis.name: self.lane_axis + 1}) - difference))
            value = emitter.set_local(emitter.index(difference), "i32", body.indent, "difference")
            differences.append((guard.op, emitter.set_local(f"(i32x4.splat {value})", "v128", body.indent,
                                                            "differences"), per_lane, 0))
        shared: dict[ScalarExpr, str] = {}
        for q, local in enumerate(sums):
            value = self.core_vector(self.info.core, q, addresses, {}, shared, {})
            body.set(local, self.combine(get(local), self.masked(value, lane_mask(differences, q))))
