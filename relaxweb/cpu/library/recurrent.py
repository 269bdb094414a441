"""The WebAssembly of the LSTM / GRU / RNN recurrence kernel (``relaxweb/library/recurrent.py``),
for kernels.wasm.

One unit per (direction, batch) pair, through every step as the WGSL does (the same output
rows, scratch rows and order of operations).  A step computes the gates of 4 hidden units at
a time: f32x4 accumulators (one per gate) start from the projected input and add ``h[k] *
R[direction, k, gate columns]`` for every k (4 consecutive columns of a row of R: one vector
load); then the 4 units' cell updates are scalar, reading the gates back from scratch (4
words per gate: the kernel's scratch bytes).
"""

from __future__ import annotations

import numpy as np

from ...ir.library_kernel import LibraryKernel, buffer_size_vars
from ...ir.params_block import ParamsLayout
from ...ir.symbolic import as_int
from ...library.recurrent import ACTIVATION_COUNT, GATES, NAN_TO_ZERO, RecurrencePlan, recurrence_plan
from .wat import IndexText, LibraryWat, index_helpers, kernel_text, loop, params_field


#: name -> WAT of the activation of the f32 ``$x`` with constants ``alpha`` and ``beta``, as
#: the WGSL computes it (math functions from relaxweb/cpu/math.py).
WAT_ACTIVATIONS = {
    "relu": "(select (local.get $x) (f32.const 0) (f32.gt (local.get $x) (f32.const 0)))",
    "tanh": "(call $tanh_f32 (local.get $x))",
    "sigmoid": "(call $sigmoid_f32 (local.get $x))",
    "affine": "(f32.add (f32.mul alpha (local.get $x)) beta)",
    "leakyrelu": "(select (local.get $x) (f32.mul alpha (local.get $x)) (f32.ge (local.get $x) (f32.const 0)))",
    "thresholdedrelu": "(select (local.get $x) (f32.const 0) (f32.gt (local.get $x) alpha))",
    "scaledtanh": "(f32.mul alpha (call $tanh_f32 (f32.mul beta (local.get $x))))",
    "hardsigmoid": ("(select (f32.min (f32.add (f32.mul alpha (local.get $x)) beta) (f32.const 1)) (f32.const 0) "
                    "(f32.gt (f32.add (f32.mul alpha (local.get $x)) beta) (f32.const 0)))"),
    "elu": ("(select (local.get $x) (f32.mul alpha (f32.sub (call $exp_f32 (local.get $x)) (f32.const 1))) "
            "(f32.ge (local.get $x) (f32.const 0)))"),
    "softsign": "(f32.div (local.get $x) (f32.add (f32.const 1) (f32.abs (local.get $x))))",
    "softplus": ("(f32.add (f32.max (local.get $x) (f32.const 0)) "
                 "(call $log_f32 (f32.add (f32.const 1) (call $exp_f32 (f32.neg (f32.abs (local.get $x)))))))"),
}


def _wat_float(value: float) -> str:
    return f"(f32.const {float(np.float32(value))!r})"


def _wat_activation_functions(cell: str, activations: tuple, directions: int) -> list[str]:
    """``$main_activation_k (direction, x)``: the k-th function of the cell of that direction;
    NaN stays NaN except where the WGSL maps it to 0 (:data:`NAN_TO_ZERO`)."""
    count = ACTIVATION_COUNT[cell]
    lines = []
    for k in range(count):
        lines.append(f"(func $main_activation_{k} (param $direction i32) (param $x f32) (result f32)")
        for d in range(directions):
            name, alpha, beta = activations[d * count + k]
            expression = WAT_ACTIVATIONS[name].replace("alpha", _wat_float(alpha)).replace("beta", _wat_float(beta))
            if name not in NAN_TO_ZERO:
                expression = f"(select (local.get $x) {expression} (f32.ne (local.get $x) (local.get $x)))"
            if d + 1 < directions:
                lines.append(f"  (if (i32.eq (local.get $direction) (i32.const {d})) (then (return {expression})))")
            else:
                lines.append(f"  {expression})")
    return lines


def render_recurrence(kernel: LibraryKernel) -> LibraryWat:
    """The recurrence kernel's WAT; its scratch holds a word of 4 units per gate."""
    plan = recurrence_plan(**kernel.arguments)
    return LibraryWat(RecurrenceWat(plan).render(), 16 * len(GATES[plan.cell]))


# -- addresses and values of the kernel's locals, as WAT expressions


def at(buffer: str, element: str) -> str:
    return f"(i32.add (local.get ${buffer}) (i32.shl {element} (i32.const 2)))"


def get(name: str) -> str:
    return f"(local.get ${name})"


def plus(*terms: str) -> str:
    result = terms[0]
    for term in terms[1:]:
        result = f"(i32.add {result} {term})"
    return result


def gate_offset(g: int) -> str:
    return "(i32.const 0)" if g == 0 else f"(i32.mul (i32.const {g}) (local.get $hidden))"


def activation(k: int, value: str) -> str:
    return f"(call $main_activation_{k} (local.get $direction) {value})"


def out(element: str) -> str:
    return f"(f32.load {at('out', element)})"


def projected_word(g: int) -> str:
    """Gate g's projected input of units unit0 .. unit0 + 3 (past hidden: ignored lanes)."""
    return f"(v128.load {at('projected', plus(get('x'), gate_offset(g), get('unit0')))})"


def projected_at(g: int) -> str:
    return f"(f32.load {at('projected', plus(get('x'), gate_offset(g), get('unit')))})"


class RecurrenceWat:
    """The WAT of one recurrence kernel, a method per piece: the gates of a step
    (:meth:`gates_of`), each cell's step, and the loop over the (direction, batch) units and
    their steps (:meth:`body`)."""

    def __init__(self, plan: RecurrencePlan) -> None:
        self.plan = plan
        self.cell, self.optional, self.clip = plan.cell, plan.optional, plan.clip
        self.directions = plan.directions
        self.gate_names = GATES[self.cell]
        layout = ParamsLayout(tuple(v.name for v in buffer_size_vars((*plan.inputs, plan.output))))
        self.index = IndexText(lambda var: params_field(layout, var))
        self.bindings = [buffer.name for buffer in plan.inputs] + ["out"]

    def limit(self, value: str) -> str:
        """``value`` clipped to the cell's clip, when it has one."""
        if self.clip is None:
            return value
        return f"(f32.max (f32.min {value} {_wat_float(self.clip)}) {_wat_float(-self.clip)})"  # NaN stays NaN

    def column_word(self, g: int) -> str:
        """R[direction, k, g * hidden + unit0 ..] (a constant offset from ``$column`` when hidden is)."""
        if as_int(self.plan.hidden) is not None:
            return f"(v128.load offset={4 * g * as_int(self.plan.hidden)} (local.get $column))"
        return f"(v128.load (i32.add (local.get $column) (i32.shl {gate_offset(g)} (i32.const 2))))"

    def gates_of(self, names: list[tuple[str, int, bool]], source: str, epilogue: list[str]) -> list[str]:
        """For every hidden unit, the gates ``names`` ((local, gate column, starts from the
        projected input)) as sums over k of ``source[k] * R[direction, k, column + unit]``,
        then ``epilogue`` (scalar, for ``$unit``, the gates in ``$g0`` ...)."""
        vectors = [f"$a{i}" for i in range(len(names))]
        lines = [
            "(local.set $unit0 (i32.const 0))",
            *loop("units", "(i32.ge_s (local.get $unit0) (local.get $hidden))", [
                *(f"(local.set {v} {projected_word(g) if projected else '(v128.const i32x4 0 0 0 0)'})"
                  for v, (_, g, projected) in zip(vectors, names)),
                ";; R[direction, k, column + unit0 ..] for k = 0, 1, ...: rows of R are `gates` apart",
                f"(local.set $column {at('recurrence', plus('(i32.mul (i32.mul (local.get $direction) (local.get $hidden)) (local.get $gates))', get('unit0')))})",
                f"(local.set $k {source})",
                "(local.set $k_end (i32.add (local.get $k) (i32.shl (local.get $hidden) (i32.const 2))))",
                *loop("dot", "(i32.ge_u (local.get $k) (local.get $k_end))", [
                    "(local.set $h (f32x4.splat (f32.load (local.get $k))))",
                    *(f"(local.set {v} (f32x4.add (local.get {v}) (f32x4.mul (local.get $h) {self.column_word(g)})))"
                      for v, (_, g, _) in zip(vectors, names)),
                    "(local.set $column (i32.add (local.get $column) (i32.shl (local.get $gates) (i32.const 2))))",
                    "(local.set $k (i32.add (local.get $k) (i32.const 4)))",
                ]),
                *(f"(v128.store offset={16 * i} (local.get $scratch) (local.get {v}))" for i, v in enumerate(vectors)),
                ";; the cell updates of units unit0 .. unit0 + 3 (those below hidden)",
                "(local.set $lane (i32.const 0))",
                *loop("lanes", "(i32.or (i32.ge_u (local.get $lane) (i32.const 4)) "
                      "(i32.ge_s (i32.add (local.get $unit0) (local.get $lane)) (local.get $hidden)))", [
                    "(local.set $unit (i32.add (local.get $unit0) (local.get $lane)))",
                    *(f"(local.set $g{i} (f32.load offset={16 * i} (i32.add (local.get $scratch) "
                      "(i32.shl (local.get $lane) (i32.const 2)))))" for i in range(len(names))),
                    *epilogue,
                    "(local.set $lane (i32.add (local.get $lane) (i32.const 1)))",
                ]),
                "(local.set $unit0 (i32.add (local.get $unit0) (i32.const 4)))",
            ]),
        ]
        return lines

    def rnn_step(self) -> list[str]:
        """An RNN's step: h = f(x + h R)."""
        return self.gates_of([("a", 0, True)], "(local.get $source)", [
            f"(f32.store {at('out', plus(get('current'), get('unit')))} {activation(0, self.limit(get('g0')))})"])

    def lstm_step(self) -> list[str]:
        """An LSTM's step: its four gates, the cell state (peepholes, input-forget coupling), h."""
        peepholes = "peepholes" in self.optional

        def peephole(j: int) -> str:  # peepholes[direction, j * hidden + unit]: i, o, f
            start = "(i32.mul (local.get $direction) (i32.mul (i32.const 3) (local.get $hidden)))"
            return f"(f32.load {at('peepholes', plus(start, gate_offset(j), get('unit')))})"

        epilogue = [f"(local.set $c_previous {out(plus(get('final_c'), get('unit')))})"]
        if peepholes:
            epilogue += [f"(local.set $g0 (f32.add (local.get $g0) (f32.mul {peephole(0)} (local.get $c_previous))))",
                         f"(local.set $g2 (f32.add (local.get $g2) (f32.mul {peephole(2)} (local.get $c_previous))))"]
        epilogue.append(f"(local.set $i {activation(0, self.limit(get('g0')))})")
        forget = "(f32.sub (f32.const 1) (local.get $i))" if self.plan.input_forget else activation(0, self.limit(get("g2")))
        epilogue += [f"(local.set $f {forget})",
                     f"(local.set $c (f32.add (f32.mul (local.get $f) (local.get $c_previous)) "
                     f"(f32.mul (local.get $i) {activation(1, self.limit(get('g3')))})))"]
        if peepholes:
            epilogue.append(f"(local.set $g1 (f32.add (local.get $g1) (f32.mul {peephole(1)} (local.get $c))))")
        epilogue += [f"(f32.store {at('out', plus(get('final_c'), get('unit')))} (local.get $c))",
                     f"(f32.store {at('out', plus(get('current'), get('unit')))} "
                     f"(f32.mul {activation(0, self.limit(get('g1')))} {activation(2, get('c'))}))"]
        return self.gates_of([(n, g, True) for g, n in enumerate(self.gate_names)], "(local.get $source)", epilogue)

    def gru_step(self) -> list[str]:
        """A GRU's step: the update and reset gates, then the candidate state (reset before or after the linear map)."""
        previous_h = out(plus(get("previous"), get("unit")))
        blend = (f"(f32.store {at('out', plus(get('current'), get('unit')))} (f32.add (f32.mul (f32.sub (f32.const 1) "
                 f"(local.get $z)) (local.get $candidate)) (f32.mul (local.get $z) {previous_h})))")
        update = [f"(local.set $z {activation(0, self.limit(get('g0')))})", f"(local.set $r {activation(0, self.limit(get('g1')))})"]
        if self.plan.linear_before_reset:
            recurrent_bias = (f"(f32.load {at('bias', plus('(i32.mul (local.get $direction) (i32.mul (i32.const 6) (local.get $hidden)))', gate_offset(5), get('unit')))})"
                              if "bias" in self.optional else "(f32.const 0)")
            return self.gates_of([("z", 0, True), ("r", 1, True), ("rh", 2, False)], "(local.get $source)", [
                *update,
                f"(local.set $candidate {activation(1, self.limit(f'(f32.add {projected_at(2)} (f32.mul (local.get $r) (f32.add (local.get $g2) {recurrent_bias})))'))})",
                blend])
        # the reset gate applies to h before its linear map: r * h of every unit first (scratch rows)
        return [
            *self.gates_of([("z", 0, True), ("r", 1, True)], "(local.get $source)", [
                *update,
                f"(f32.store {at('out', plus(get('scratch_z'), get('unit')))} (local.get $z))",
                f"(f32.store {at('out', plus(get('scratch_rh'), get('unit')))} (f32.mul (local.get $r) {previous_h}))"]),
            f"(local.set $source {at('out', get('scratch_rh'))})",
            *self.gates_of([("h", 2, True)], "(local.get $source)", [
                f"(local.set $z {out(plus(get('scratch_z'), get('unit')))})",
                f"(local.set $candidate {activation(1, self.limit(get('g0')))})",
                blend]),
        ]

    def step(self) -> list[str]:
        """One step of every hidden unit, from ``$previous`` (``$source`` its address) to ``$current``."""
        return {"rnn": self.rnn_step, "lstm": self.lstm_step, "gru": self.gru_step}[self.cell]()

    def initial(self, name: str) -> str:
        """The address of the initial state ``name`` of this (direction, b)."""
        if self.plan.batch_major_states:
            return at(name, f"(i32.mul (i32.add (i32.mul (local.get $b) (i32.const {self.directions})) (local.get $direction)) (local.get $hidden))")
        return at(name, get("state"))

    def body(self) -> list[str]:
        """``$main``'s body: every (direction, batch) unit of ``$first .. $end`` through its steps."""
        step = self.step()
        row_bytes = "(i32.shl (local.get $hidden) (i32.const 2))"
        states = [("final_h", "initial_h")] + ([("final_c", "initial_c")] if self.cell == "lstm" else [])
        reverse = {"forward": "(i32.const 0)", "reverse": "(i32.const 1)",
                   "bidirectional": "(i32.eq (local.get $direction) (i32.const 1))"}[self.plan.direction]
        extra_rows = {"lstm": ["(local.set $final_c (i32.add (local.get $final_h) (local.get $row_stride)))"]}.get(self.cell, [])
        if self.cell == "gru" and not self.plan.linear_before_reset:
            extra_rows = [";; scratch rows: the update gate, and r * h (read across units by the candidate's dot product)",
                          "(local.set $scratch_z (i32.add (local.get $final_h) (local.get $row_stride)))",
                          "(local.set $scratch_rh (i32.add (local.get $scratch_z) (local.get $row_stride)))"]
        length = ("(call $main_max (i32.const 0) (call $main_min (i32.load " + at("sequence_lens", get("b"))
                  + ") (local.get $steps)))") if "sequence_lens" in self.optional else "(local.get $steps)"
        return [
            f"(local.set $steps {self.index(self.plan.steps)})",
            f"(local.set $batch {self.index(self.plan.batch)})",
            f"(local.set $hidden {self.index(self.plan.hidden)})",
            f"(local.set $gates (i32.mul (i32.const {len(self.gate_names)}) (local.get $hidden)))",
            ";; out[row, direction, b, unit] is at row * row_stride + state + unit",
            f"(local.set $row_stride (i32.mul (i32.mul (i32.const {self.directions}) (local.get $batch)) (local.get $hidden)))",
            "(local.set $group (local.get $first))",
            *loop("group", "(i32.ge_s (local.get $group) (local.get $end))", [
                "(local.set $direction (i32.div_u (local.get $group) (local.get $batch)))",
                "(local.set $b (i32.rem_u (local.get $group) (local.get $batch)))",
                f"(local.set $reverse {reverse})",
                "(local.set $state (i32.mul (i32.add (i32.mul (local.get $direction) (local.get $batch)) (local.get $b)) "
                "(local.get $hidden)))",
                "(local.set $final_h (i32.add (i32.mul (local.get $steps) (local.get $row_stride)) (local.get $state)))",
                *extra_rows,
                f"(local.set $length {length})",
                ";; the initial state, and zeros past the sequence's end",
                *(f"(memory.copy {at('out', get(row))} {self.initial(name)} {row_bytes})" if name in self.optional else
                  f"(memory.fill {at('out', get(row))} (i32.const 0) {row_bytes})" for row, name in states),
                "(local.set $t (local.get $length))",
                *loop("zeros", "(i32.ge_s (local.get $t) (local.get $steps))", [
                    f"(memory.fill {at('out', plus('(i32.mul (local.get $t) (local.get $row_stride))', get('state')))} "
                    f"(i32.const 0) {row_bytes})",
                    "(local.set $t (i32.add (local.get $t) (i32.const 1)))",
                ]),
                "(local.set $step (i32.const 0))",
                *loop("steps", "(i32.ge_s (local.get $step) (local.get $length))", [
                    "(local.set $t (select (i32.sub (i32.sub (local.get $length) (i32.const 1)) (local.get $step)) "
                    "(local.get $step) (local.get $reverse)))",
                    ";; the previous hidden state: the initial one (in the final row) on the first step",
                    "(local.set $previous (select (i32.add (i32.mul (select (i32.add (local.get $t) (i32.const 1)) "
                    "(i32.sub (local.get $t) (i32.const 1)) (local.get $reverse)) (local.get $row_stride)) (local.get $state)) "
                    "(local.get $final_h) (i32.gt_s (local.get $step) (i32.const 0))))",
                    "(local.set $current (i32.add (i32.mul (local.get $t) (local.get $row_stride)) (local.get $state)))",
                    f"(local.set $x (i32.mul (i32.add (i32.mul (i32.add (i32.mul (local.get $t) (local.get $batch)) (local.get $b)) "
                    f"(i32.const {self.directions})) (local.get $direction)) (local.get $gates)))",
                    f"(local.set $source {at('out', get('previous'))})",
                    *step,
                    "(local.set $step (i32.add (local.get $step) (i32.const 1)))",
                ]),
                "(if (i32.gt_s (local.get $length) (i32.const 0))",
                "  (then (memory.copy " + at("out", get("final_h")) + " "
                + at("out", plus("(i32.mul (select (i32.const 0) (i32.sub (local.get $length) (i32.const 1)) (local.get $reverse)) "
                                 "(local.get $row_stride))", get("state"))) + f" {row_bytes})))",
                "(local.set $group (i32.add (local.get $group) (i32.const 1)))",
            ]),
        ]

    def render(self) -> str:
        """The kernel's WAT."""
        body = self.body()
        int_locals = ["steps", "batch", "hidden", "gates", "row_stride", "group", "direction", "b", "reverse", "state",
                      "final_h", "final_c", "scratch_z", "scratch_rh", "length", "t", "step", "previous", "current", "x",
                      "source", "unit0", "unit", "lane", "column", "k", "k_end"]
        float_locals = ["g0", "g1", "g2", "g3", "c_previous", "i", "f", "c", "z", "r", "candidate"]
        vector_locals = ["h", "a0", "a1", "a2", "a3"]
        units = [f"(i32.mul (i32.const {self.directions}) {self.index(self.plan.batch)})"]
        title = (f"library kernel: {self.plan.name} ({self.plan.direction} {self.cell.upper()} recurrence, one unit per "
                 "(direction, batch) through every step)")
        text = "\n".join([*units, *body])
        return kernel_text(title, self.bindings, units,
                           [*((n, "i32") for n in int_locals), *((n, "f32") for n in float_locals),
                            *((n, "v128") for n in vector_locals)],
                           body, [*index_helpers(text),
                                  *_wat_activation_functions(self.cell, self.plan.activations, self.directions)])
