"""Packing a matmul factor into a panel: the factor evaluated once per element at every
reduction step of a run of consecutive lanes (rows of the first factor, columns of the
second), stored where the micro-kernels read it (:class:`PackLayout`).

:func:`pack` packs lane by lane, each lane's axes recovered from its flat index; before that
loop, four lanes at a time where the factor has a four-lane form (``factor_forms.py``):
padding guards around a contiguous core (:meth:`Packer.interior`), selects the four lanes
share (:meth:`Packer.branches`), an f32x4 form of the whole factor (:meth:`Packer.vectors`),
or its math calls at least (:meth:`Packer.groups`); a factor that reads along the innermost
reduction axis contiguously (``emit.vector_reduction``: a fused GELU or layer norm of a
matmul's input) is evaluated four steps at a time instead (:meth:`Packer.vector_steps`).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from ...ir.access import depends_on, last_stride, reads
from ...ir.pattern import MatmulInfo
from ...ir.symbolic import PrimExpr, SizeVar, as_int, free_vars, simplify, substitute
from ...ir.tir import Load, Reduce, ReduceCombiner, ScalarExpr, Select, Unary, scalar_nodes
from ..emit import VECTOR_UNARY_RENDERINGS, Emitter, f32x4_of, vector_reduction
from ..wat_builder import Body, add, const, get, op
from .common import all_of, declare_axes, for_each_step, lane_mask, unflatten_into
from .factor_forms import LaneVectors, branched_interior, lane_math, lane_vectors, padded_interior


@dataclass(frozen=True)
class PackLayout:
    """Where :func:`pack` writes lane ``l`` of reduction step ``k`` of a panel at ``base``.

    Interleaved (``strip`` None): at ``base + 4 * (k * lanes + l)``, a step's lanes side by
    side (the second factor's [K x panel_columns] panel: one micro-kernel reads all of them).
    In strips (``strip``: an i32 WAT value, the bytes of one strip, ``16 * depth``): lanes
    ``4s .. 4s + 3`` form strip ``s``, ``[K x 4]`` at ``base + s * strip``, so lane ``l`` of
    step ``k`` at ``base + (l // 4) * strip + 16 * k + 4 * (l % 4)``: the micro-kernel of
    those four rows reads 16 contiguous bytes a step (interleaved, it read 16 of every
    ``4 * lanes``, which a deep reduction does not keep in L1).  Four lanes from a multiple
    of 4 are 16 contiguous bytes of a step in both."""

    lanes: int
    strip: str | None = None

    @property
    def step(self) -> int:
        """The bytes between a lane's consecutive reduction steps."""
        return 16 if self.strip is not None else 4 * self.lanes

    def lane_address(self, base: str, lane: str) -> str:
        """The i32 WAT address of step 0 of lane ``lane`` (an i32 WAT value)."""
        if self.strip is None:
            return f"(i32.add {base} (i32.shl {lane} (i32.const 2)))"
        return (f"(i32.add {base} (i32.add (i32.mul (i32.shr_u {lane} (i32.const 2)) {self.strip}) "
                f"(i32.shl (i32.and {lane} (i32.const 3)) (i32.const 2))))")


def pack(emitter: Emitter, body: Body, info: MatmulInfo, factor: ScalarExpr, axes: Sequence[SizeVar],
         extents: Sequence[PrimExpr], first: str, count: str, lanes: int, base: str, strip: str | None = None,
         unroll: int = 1) -> None:
    """Statements writing ``factor`` at every reduction step for the ``lanes`` consecutive
    flat indices from ``first`` over ``axes`` that are below ``count`` (the others' lanes are
    left as they are: only sums that are never stored read them), each element evaluated
    once, where :class:`PackLayout` ``(lanes, strip)`` says (see the module doc).  The loops
    over reduction axes of constant extent are written out while the copies of a step stay at
    most ``unroll`` (``common.for_each_step``)."""
    lane, position, address = (body.local(name, "i32") for name in ("lane", "position", "address"))
    packer = Packer(emitter, body, info, factor, tuple(axes), tuple(extents), first, count, PackLayout(lanes, strip),
                    base, lane, address, unroll)
    packer.run(position)


@dataclass(frozen=True)
class Packer:
    """One run of :func:`pack`: its factor, lanes, panel and locals (``lane``: the next lane
    to pack, ``address``: where its current step goes)."""

    emitter: Emitter
    body: Body
    info: MatmulInfo
    factor: ScalarExpr
    axes: tuple[SizeVar, ...]
    extents: tuple[PrimExpr, ...]
    first: str
    count: str
    layout: PackLayout
    base: str
    lane: str
    address: str
    unroll: int = 1

    @property
    def label(self) -> str:
        return self.lane[1:]

    def run(self, position: str) -> None:
        emitter, body, info, factor, label = self.emitter, self.body, self.info, self.factor, self.label
        body.set(self.lane, const(0))
        step_axis, step_extent = info.reduce_axes[-1], info.reduce_extents[-1]
        invariants = vector_reduction(Reduce(ReduceCombiner.SUM, step_axis, step_extent, factor))
        hoisted = lane_math(factor)
        # four reduction steps at a time need four steps (a 1x1 convolution's kernel width has one)
        short = as_int(simplify(step_extent)) is not None and as_int(simplify(step_extent)) < 4
        lanes_first = (invariants is None or short) and self.axes
        interior = padded_interior(factor, self.axes[-1]) if lanes_first else None
        branches = branched_interior(factor, self.axes[-1]) if lanes_first else None
        if interior is not None:
            self.interior(*interior)
        elif branches is not None:
            self.branches()
        elif invariants is None and (vectors := lane_vectors(factor, self.axes, self.extents)) is not None:
            self.vectors(vectors)
        elif invariants is None and hoisted:
            self.groups(hoisted)
        with body.block(f"$packed_{label}"):
            with body.loop(f"$pack_{label}"):
                body.br_if(f"$packed_{label}", op("i32.ge_u", get(self.lane), const(self.layout.lanes)))
                body.set(position, add(self.first, get(self.lane)))
                body.br_if(f"$packed_{label}", op("i32.ge_u", get(position), self.count))
                emitter.open_scope()
                declare_axes(emitter, self.axes, self.extents,
                             unflatten_into(emitter, body, self.extents, get(position), f"{label}_"))
                body.set(self.address, self.layout.lane_address(self.base, get(self.lane)))
                if invariants is None or interior is not None:
                    self.each_step(self.store_step)
                else:
                    for_each_step(emitter, body, info.reduce_axes[:-1], info.reduce_extents[:-1],
                                  lambda: self.vector_steps(invariants, step_axis, step_extent), self.unroll)
                emitter.close_scope()
                body.increment(self.lane)
                body.br(f"$pack_{label}")

    # -- statements shared by the forms

    def each_step(self, step: Callable[[], None]) -> None:
        """``step()`` in the loops over every reduction step (those of constant extent written
        out up to the packer's ``unroll`` copies)."""
        for_each_step(self.emitter, self.body, self.info.reduce_axes, self.info.reduce_extents, step, self.unroll)

    def store_step(self) -> None:
        """The factor at this step for the lane in scope, stored; the address advanced."""
        self.body.store("f32.store", get(self.address), self.emitter.scalar(self.factor, self.body.indent))
        self.advance()

    def advance(self, steps: int = 1) -> None:
        self.body.increment(self.address, steps * self.layout.step)

    def lanes_at(self, n: int) -> str:
        """The flat index of lane ``lane + n`` (i32 WAT)."""
        return add(add(self.first, get(self.lane)), const(n))

    def declare_lane(self, locals_: Sequence[str]) -> None:
        """Opens a scope with the axes held in ``locals_`` declared (the caller closes it)."""
        self.emitter.open_scope()
        declare_axes(self.emitter, self.axes, self.extents, locals_)

    @contextmanager
    def four_lanes(self, done: str, loop: str) -> Iterator[None]:
        """A loop over groups of four lanes from ``lane`` while four remain in the panel and
        below ``count``, ``address`` at the group's first lane; ``lane`` left at the first
        lane not packed."""
        body, label = self.body, self.label
        with body.block(f"${done}_{label}"):
            with body.loop(f"${loop}_{label}"):
                body.br_if(f"${done}_{label}", op("i32.gt_u", add(get(self.lane), const(4)), const(self.layout.lanes)))
                body.br_if(f"${done}_{label}", op("i32.gt_u", self.lanes_at(4), self.count))
                yield
                body.increment(self.lane, 4)
                body.br(f"${loop}_{label}")

    def lane_values(self, in_lane: Callable[[int], None], expr: ScalarExpr, prefix: str) -> str:
        """An f32x4 of ``expr`` evaluated in each of four lanes (``in_lane(n)`` opens lane
        ``n``'s scope), each value in a local named from ``prefix``."""
        values = []
        for n in range(4):
            in_lane(n)
            values.append(self.emitter.set_local(self.emitter.scalar(expr, self.body.indent), "f32", self.body.indent,
                                                 prefix))
            self.emitter.close_scope()
        return f32x4_of(values)

    # -- the forms

    def groups(self, hoisted: list[tuple[Unary, ScalarExpr]]) -> None:
        """Four lanes at a time: at each step, the guarded arguments of the ``hoisted`` math
        calls (``factor_forms.lane_math``) lane by lane, each call once as f32x4, then the
        factor lane by lane with the calls' lanes known, stored as one f32x4."""
        emitter, body = self.emitter, self.body
        with self.four_lanes("grouped", "group"):
            lane_axes = [unflatten_into(emitter, body, self.extents, self.lanes_at(n), f"{self.label}_{n}_")
                         for n in range(4)]
            body.set(self.address, self.layout.lane_address(self.base, get(self.lane)))

            def in_lane(n: int) -> None:
                self.declare_lane(lane_axes[n])

            def step() -> None:
                results = []
                for node, argument in hoisted:
                    vector = self.lane_values(in_lane, argument, "arg")
                    results.append(emitter.set_local(VECTOR_UNARY_RENDERINGS[node.op](vector), "v128", body.indent,
                                                     "math"))
                values = []
                for n in range(4):
                    in_lane(n)
                    for (node, _), result in zip(hoisted, results):
                        emitter.known(node, f"(f32x4.extract_lane {n} {result})")
                    values.append(emitter.set_local(emitter.scalar(self.factor, body.indent), "f32", body.indent,
                                                    "lane"))
                    emitter.close_scope()
                body.store("v128.store", get(self.address), f32x4_of(values))
                self.advance()

            self.each_step(step)

    def vectors(self, vectors: LaneVectors) -> None:
        """Four lanes at a time, for a factor of ``factor_forms.lane_vectors``: at each step
        its lane-changing loads are read (one ``v128.load`` where the four lanes are
        contiguous, else lane by lane into one f32x4), its lane invariants computed once and
        splatted, the whole factor evaluated once as f32x4 (``Emitter.vector_value``) and
        stored with one ``v128.store``."""
        emitter, body = self.emitter, self.body
        lane_count = 4 if vectors.gathered else 1  # contiguous loads and invariants need lane 0's axes only
        with self.four_lanes("vectored", "vectors"):
            lane_axes = [unflatten_into(emitter, body, self.extents, self.lanes_at(n), f"{self.label}_{n}_")
                         for n in range(lane_count)]
            body.set(self.address, self.layout.lane_address(self.base, get(self.lane)))

            def in_lane(n: int) -> None:
                self.declare_lane(lane_axes[n])

            def step() -> None:
                splats = {}
                for node in vectors.gathered:
                    values = []
                    for n in range(4):
                        in_lane(n)
                        values.append(emitter.scalar(node, body.indent))
                        emitter.close_scope()
                    splats[node] = emitter.set_local(f32x4_of(values), "v128", body.indent, "lanes")
                in_lane(0)
                for node in vectors.invariants:
                    value = emitter.scalar(node, body.indent)
                    if node.dtype == "bool":  # a lane mask: all ones where true
                        splats[node] = emitter.set_local(f"(i32x4.splat (i32.sub (i32.const 0) {value}))", "v128",
                                                         body.indent, "mask")
                    else:
                        splats[node] = emitter.set_local(f"(f32x4.splat {value})", "v128", body.indent, "splat")
                vector = emitter.vector_value(self.factor, splats, {}, body.indent)
                emitter.close_scope()
                body.store("v128.store", get(self.address), vector)
                self.advance()

            body.comment(f"four lanes as one f32x4 a step ({len(vectors.gathered)} loads lane by lane, "
                         f"{len(vectors.contiguous)} contiguous, {len(vectors.invariants)} lane invariants)")
            self.each_step(step)

    def branches(self) -> None:
        """Four lanes at a time, for a factor of ``factor_forms.branched_interior``: at each
        step the selects' conditions are evaluated once (lane 0's), as ``if`` statements,
        and only the chosen input is read and stored with one ``v128.store``.  Four lanes on
        one row of the innermost axis read it as one f32x4 (its loads ``v128.load``).  Four
        lanes across a row's end read it lane by lane into one f32x4 where no lane axis
        changes the conditions (a concat's channel ranges), else are packed one by one."""
        emitter, body, label = self.emitter, self.body, self.label
        last_axis, last_extent = self.axes[-1], simplify(self.extents[-1])
        conditions = [node.condition for node in scalar_nodes(self.factor) if isinstance(node, Select)]
        shared = not any(depends_on(condition, axis.name) for condition in conditions for axis in self.axes)
        with self.four_lanes("branched", "branch"):
            body.set(self.address, self.layout.lane_address(self.base, get(self.lane)))
            firsts = unflatten_into(emitter, body, self.extents, add(self.first, get(self.lane)), f"{label}_b")
            self.declare_lane(firsts)
            one_row = emitter.index(last_extent)
            emitter.close_scope()
            lane_axes: list[list[str]] = []

            def in_lane(n: int) -> None:
                self.declare_lane(firsts if n == 0 and not lane_axes else lane_axes[n])

            def chosen(node: ScalarExpr) -> None:
                if isinstance(node, Select):
                    with body.if_(emitter.scalar(node.condition, body.indent)):
                        for branch, construct in ((node.a, body.then), (node.b, body.else_)):
                            with construct():
                                emitter.open_scope()  # what a branch computes is not known in the other
                                chosen(branch)
                                emitter.close_scope()
                    return
                if lane_axes:  # across a row's end: the chosen input lane by lane
                    body.store("v128.store", get(self.address), self.lane_values(in_lane, node, "lane"))
                    return
                splats = {}
                for load in scalar_nodes(node):
                    if isinstance(load, Load) and not reads(load, last_axis) and load not in splats:
                        splats[load] = emitter.set_local(f"(f32x4.splat {emitter.scalar(load, body.indent)})", "v128",
                                                         body.indent, "splat")
                body.store("v128.store", get(self.address), emitter.vector_value(node, splats, {}, body.indent))

            def step() -> None:
                in_lane(0)
                chosen(self.factor)
                emitter.close_scope()
                self.advance()

            body.comment("four lanes on one row: each step reads only the input its selects choose, as one f32x4")
            with body.if_(op("i32.le_u", add(get(firsts[-1]), const(4)), one_row)):
                with body.then():
                    self.each_step(step)
                with body.else_():
                    if shared:  # across a row's end: the conditions still hold for all four lanes
                        lane_axes.extend(unflatten_into(emitter, body, self.extents, self.lanes_at(n),
                                                        f"{label}_{n}_") for n in range(4))
                        self.each_step(step)
                    else:  # four lanes across a row's end: each on its own
                        self.four_lanes_apart()

    def interior(self, guards: list[ScalarExpr], core: ScalarExpr) -> None:
        """Four lanes at a time, for a factor of ``factor_forms.padded_interior``.  Four lanes
        on one row of the innermost axis read four consecutive elements (every ``s``-th at
        stride ``s``: :func:`strided_lanes`): at each step, where the guards hold at the
        first and the last lane (hence at all four) the core is evaluated once as f32x4 (its
        loads ``v128.load``, its math calls once) and stored with one ``v128.store``;
        elsewhere (a border) too, and-ed with the lanes where the guards that move with the
        lane hold (``common.lane_mask``), where those that do not hold (else zeros).  Where
        the guards hold over the whole window (:func:`window_inside`, one branch per four
        lanes) the steps check no guard at all.  Four lanes across a row's end are packed one by one."""
        emitter, body, label = self.emitter, self.body, self.label
        last_axis, last_extent = self.axes[-1], simplify(self.extents[-1])
        with self.four_lanes("interior", "quad"):
            body.set(self.address, self.layout.lane_address(self.base, get(self.lane)))
            firsts = unflatten_into(emitter, body, self.extents, add(self.first, get(self.lane)), f"{label}_q")
            lasts = [firsts[-1]] + [body.named(f"{label}_q_last{n}") for n in range(1, 4)]
            for n in range(1, 4):
                body.set(lasts[n], add(get(firsts[-1]), const(n)))
            self.declare_lane(firsts)
            one_row = emitter.index(last_extent)
            emitter.close_scope()

            def in_lane(n: int) -> None:
                self.declare_lane([*firsts[:-1], lasts[n]])

            def core_vector() -> str:
                """The core as f32x4 (lane 0's axes in scope): a load the lanes do not move
                splatted, a strided one (:func:`strided_lanes`) gathered, the others one
                ``v128.load``."""
                splats = {}
                for node in scalar_nodes(core):
                    if not isinstance(node, Load) or node in splats:
                        continue
                    if not reads(node, last_axis):
                        splats[node] = emitter.set_local(f"(f32x4.splat {emitter.scalar(node, body.indent)})", "v128",
                                                         body.indent, "splat")
                    elif (stride := last_stride(node, last_axis)) != 1:
                        splats[node] = strided_lanes(emitter, body, node, stride)
                return emitter.vector_value(core, splats, {}, body.indent)

            def vector_step() -> None:
                in_lane(0)
                body.store("v128.store", get(self.address), core_vector())
                emitter.close_scope()
                self.advance()

            # each guard's a - b and its step from one lane to the next (a constant: padded_interior)
            differences = [(guard, simplify(guard.a.value - guard.b.value)) for guard in guards]
            per_lane = {guard: as_int(simplify(substitute(difference, {last_axis.name: last_axis + 1}) - difference))
                        for guard, difference in differences}
            moving = [(guard, difference) for guard, difference in differences if per_lane[guard]]
            fixed = [guard for guard in guards if not per_lane[guard]]

            def masked_step() -> None:
                """A border step: where the guards that do not move with the lane hold, the
                core as f32x4 and-ed with the lanes where the others hold (all-zero lanes
                read nothing: a masked lane's load is then within three lanes of one inside,
                in the memory's slack around the buffers at worst), else zeros."""
                zero = "(v128.const i32x4 0 0 0 0)"
                in_lane(0)
                held = all_of([emitter.scalar(guard, body.indent) for guard in fixed])
                emitter.close_scope()
                with body.if_(held):
                    with body.then():
                        in_lane(0)
                        splats = [(guard.op, emitter.set_local(f"(i32x4.splat {emitter.index(difference)})", "v128",
                                                               body.indent, "difference"), per_lane[guard], 0)
                                  for guard, difference in moving]
                        mask = emitter.set_local(lane_mask(splats, 0), "v128", body.indent, "lanes_inside")
                        with body.if_(f"(v128.any_true {mask})"):
                            with body.then():
                                body.store("v128.store", get(self.address), f"(v128.and {core_vector()} {mask})")
                            with body.else_():
                                body.store("v128.store", get(self.address), zero)
                        emitter.close_scope()
                    with body.else_():
                        body.store("v128.store", get(self.address), zero)

            def guarded_step() -> None:
                conditions = []
                for n in (0, 3):
                    in_lane(n)
                    conditions += [emitter.scalar(guard, body.indent) for guard in guards]
                    emitter.close_scope()
                with body.if_(all_of(conditions)):
                    with body.then():
                        in_lane(0)
                        vector = core_vector()
                        emitter.close_scope()
                        body.store("v128.store", get(self.address), vector)
                    with body.else_():
                        if moving:
                            masked_step()
                        else:
                            for n in range(4):
                                in_lane(n)
                                body.store("f32.store", get(self.address), emitter.scalar(self.factor, body.indent),
                                           4 * n)
                                emitter.close_scope()
                self.advance()

            with body.if_(op("i32.le_u", add(get(firsts[-1]), const(4)), one_row)):
                with body.then():
                    window = window_inside(emitter, body, self.info, guards, in_lane)
                    if not guards:
                        self.each_step(vector_step)
                    elif window is not None:  # the whole window inside: no guard at any step
                        with body.if_(window):
                            with body.then():
                                self.each_step(vector_step)
                            with body.else_():
                                self.each_step(guarded_step)
                    else:
                        self.each_step(guarded_step)
                with body.else_():  # four lanes across a row's end: each on its own
                    self.four_lanes_apart()

    def four_lanes_apart(self) -> None:
        """The four lanes from ``lane`` packed each on its own (their positions cross a row's
        end, so no vector form holds for them): each lane's axes recovered, the factor
        evaluated at every reduction step and stored at the lane's place in the panel."""
        emitter, body, label = self.emitter, self.body, self.label
        quad, position = body.local("quad", "i32"), body.local("position", "i32")
        body.set(quad, const(0))
        with body.loop(f"$split_{label}"):
            body.set(position, add(add(self.first, get(self.lane)), get(quad)))
            body.set(self.address, self.layout.lane_address(self.base, add(get(self.lane), get(quad))))
            self.declare_lane(unflatten_into(emitter, body, self.extents, get(position), f"{label}_s"))
            self.each_step(self.store_step)
            emitter.close_scope()
            body.increment(quad)
            body.br_if(f"$split_{label}", op("i32.lt_u", get(quad), const(4)))

    def vector_steps(self, invariants: list[ScalarExpr], axis: SizeVar, extent: PrimExpr) -> None:
        """The innermost reduction axis's steps: four at a time (one f32x4 of the factor, its
        lanes stored ``layout.step`` bytes apart) while four remain, then one at a time; the
        parts of the factor that do not depend on the axis computed once."""
        emitter, body = self.emitter, self.body
        splats = {}
        for invariant in invariants:
            value = emitter.scalar(invariant, body.indent)
            splats[invariant] = emitter.set_local(f"(f32x4.splat {value})", "v128", body.indent, "splat")
        local, end = body.local("q", "i32"), body.local("q_end", "i32")
        label = local[1:]
        body.set(end, emitter.index(extent))
        body.set(local, const(0))
        with body.block(f"$vectors_{label}"):
            with body.loop(f"$vector_{label}"):
                body.br_if(f"$vectors_{label}", op("i32.gt_s", add(get(local), const(4)), get(end)))
                emitter.open_scope()
                emitter.declare_axis(axis, extent, local)
                vector = emitter.set_local(emitter.vector_value(self.factor, splats, {}, body.indent), "v128",
                                           body.indent, "vector")
                emitter.close_scope()
                for position in range(4):
                    body.line(f"(v128.store32_lane offset={self.layout.step * position} {position} "
                              f"{get(self.address)} {vector})")
                self.advance(4)
                body.increment(local, 4)
                body.br(f"$vector_{label}")
        with body.block(f"$steps_{label}"):
            with body.loop(f"$step_{label}"):
                body.br_if(f"$steps_{label}", op("i32.ge_s", get(local), get(end)))
                emitter.open_scope()
                emitter.declare_axis(axis, extent, local)
                self.store_step()
                emitter.close_scope()
                body.increment(local)
                body.br(f"$step_{label}")


def strided_lanes(emitter: Emitter, body: Body, load: Load, stride: int) -> str:
    """A v128 local holding ``load`` at four consecutive positions of an axis it reads with
    ``stride`` (``relaxweb.ir.access.last_stride``; lane 0's axes in scope): elements ``e, e +
    s, e + 2s, e + 3s`` of the buffer.  Stride 2: two ``v128.load`` of ``e .. e + 3`` and ``e
    + 3 .. e + 6`` (no byte beyond the last element read) and one shuffle of lanes 0, 2 of
    the first and 1, 3 of the second; other strides: four ``f32.load`` into one f32x4."""
    address = emitter.set_local(emitter.element_address(load.buffer, load.indices), "i32", body.indent, "strided")
    if stride == 2:
        low, high = f"(v128.load {address})", f"(v128.load offset=12 {address})"
        vector = f"(i8x16.shuffle 0 1 2 3 8 9 10 11 20 21 22 23 28 29 30 31 {low} {high})"
    else:
        vector = f"(f32x4.splat (f32.load {address}))"
        for n in range(1, 4):
            vector = f"(f32x4.replace_lane {n} {vector} (f32.load offset={4 * stride * n} {address}))"
    return emitter.set_local(vector, "v128", body.indent, "strided")


def window_inside(emitter: Emitter, body: Body, info: MatmulInfo, guards: list[ScalarExpr],
                  in_lane: Callable[[int], None]) -> str | None:
    """An i32 WAT value, nonzero when every guard holds at every reduction step for the four
    lanes (``in_lane(n)`` opens a scope with lane ``n``'s axes): each guard moves by a
    constant per step of each reduction axis it reads, so it holds over the whole window
    when it holds at its corners (each such axis at 0 and at its extent - 1, lanes 0 and 3).
    None when a guard is not of that form or there are none."""
    conditions = []
    for guard in guards:
        names = {v.name for side in (guard.a.value, guard.b.value) for v in free_vars(side)}
        moving = [(axis, extent) for axis, extent in zip(info.reduce_axes, info.reduce_extents) if axis.name in names]
        for axis, _ in moving:
            for side in (guard.a.value, guard.b.value):
                if as_int(simplify(substitute(side, {axis.name: axis + 1}) - side)) is None:
                    return None
        corners: list[tuple] = [()]
        for axis, extent in moving:
            corners = [(*corner, (axis, extent, end)) for corner in corners for end in (False, True)]
        for n in (0, 3):
            for corner in corners:
                in_lane(n)
                for axis, extent, end in corner:
                    local = body.local("corner", "i32")
                    body.set(local, emitter.index(simplify(extent - 1)) if end else const(0))
                    emitter.declare_axis(axis, extent, local)
                conditions.append(emitter.scalar(guard, body.indent))
                emitter.close_scope()
    if not conditions:
        return None
    inside = conditions[0]
    for condition in conditions[1:]:
        inside = op("i32.and", inside, condition)
    return inside
