"""The recurrences of LSTM, GRU and RNN: one persistent kernel per layer, with its numpy
reference.

A recurrence is not a compute definition (each step reads the hidden state the step before
it wrote), so ``relaxweb/ops/recurrent.py`` legalizes an LSTM, GRU or RNN into ordinary
tensor programs around this kernel:

    projected = X W^T + biases          # a tiled matmul for every step at once: [T, B, D, G*H]
    recurrence = R transposed           # [D, H, G*H]: invocation u reads column u, coalesced
    state = call_library(recurrence_kernel, (projected, recurrence, ...))   # [T + k, D, B, H]
    Y, Y_h, Y_c = slices of state

(``T`` steps, ``B`` batch, ``D`` directions, ``H`` hidden units, ``G`` gates: 4 for an LSTM
(i, o, f, c), 3 for a GRU (z, r, h), 1 for an RNN.)  One workgroup of 64 invocations runs one
(direction, batch) pair through all its steps: invocation ``j`` owns hidden units ``j, j +
64, ...`` and computes their gates from the previous hidden state (a dot product of length
H per gate), then a ``storageBarrier`` makes the new state visible to the whole workgroup
before the next step.  The sequence length is a run-time value (a size variable of the
params block), so one kernel serves every length.

The output ``state`` holds, for each (direction, batch): rows ``0 .. T-1`` the hidden state
after each step (``Y``; zero past the sequence's length), row ``T`` the final hidden state
(``Y_h``; it holds the initial state until the last step), then for an LSTM row ``T + 1``
the cell state (``Y_c``, updated in place: each invocation only ever reads and writes its
own units), and for a GRU without ``linear_before_reset`` two scratch rows (the update gate
and ``r * h``, which the candidate state's dot product reads across units).

``sequence_lens`` (optional) gives each batch entry its own length (clamped into
``[0, T]``): a forward direction runs steps ``0 .. len-1``, a reverse one ``len-1 .. 0``, and
the final states are those of the last step run (the initial state when ``len`` is 0).

The backends render the kernel from its :class:`RecurrencePlan`: its WGSL
(``relaxweb/wgsl/library/recurrent.py``) and its WebAssembly
(``relaxweb/cpu/library/recurrent.py``), which runs each (direction, batch) pair as one unit
through every step in the same order, the gates of 4 hidden units at a time in f32x4 sums.

Activations are ``(name, alpha, beta)`` triples, the names as ONNX's RNN operators spell
them in lower case (:data:`ACTIVATIONS`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.kernel_builders import library_kernel_builder
from ..ir.library_kernel import WASM, WEBGPU, LibraryKernel
from ..ir.symbolic import PrimExpr, format_expr, simplify
from ..ir.tir import Buffer

WORKGROUP = 64

#: Gates per cell kind, in ONNX's order of the rows of W, R and B.
GATES = {"lstm": ("i", "o", "f", "c"), "gru": ("z", "r", "h"), "rnn": ("i",)}
#: Activation functions per direction: LSTM f, g, h; GRU f, g; RNN f.
ACTIVATION_COUNT = {"lstm": 3, "gru": 2, "rnn": 1}
#: The optional inputs of the kernel, in binding order.
OPTIONAL_INPUTS = ("bias", "sequence_lens", "initial_h", "initial_c", "peepholes")


def _softplus(x, alpha, beta):
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


#: name -> numpy function of (x, alpha, beta); each backend has the same table of its own
#: (``WGSL_ACTIVATIONS``, ``WAT_ACTIVATIONS``).  Parameters follow onnxruntime: LeakyRelu,
#: ThresholdedRelu, Elu take alpha; Affine, ScaledTanh, HardSigmoid alpha and beta (the
#: activation attribute lists are consumed in order by the functions that take them; see
#: ``relaxweb/ops/recurrent.py``).
ACTIVATIONS = {
    "relu": lambda x, a, b: np.where(x > 0, x, 0),
    "tanh": lambda x, a, b: np.tanh(x),
    "sigmoid": lambda x, a, b: 1 / (1 + np.exp(-x)),
    "affine": lambda x, a, b: a * x + b,
    "leakyrelu": lambda x, a, b: np.where(x >= 0, x, a * x),
    "thresholdedrelu": lambda x, a, b: np.where(x > a, x, 0),
    "scaledtanh": lambda x, a, b: a * np.tanh(b * x),
    "hardsigmoid": lambda x, a, b: np.where(a * x + b > 0, np.minimum(a * x + b, 1), 0),
    "elu": lambda x, a, b: np.where(x >= 0, x, a * (np.exp(x) - 1)),
    "softsign": lambda x, a, b: x / (1 + np.abs(x)),
    "softplus": _softplus,
}


#: The activations that map NaN to 0, as onnxruntime's recurrent kernels do (``NaN > 0`` is
#: false); every other one gives NaN for NaN, which the backends make explicit (WGSL's max,
#: min and clamp of a NaN are unspecified).
NAN_TO_ZERO = {"relu", "hardsigmoid", "thresholdedrelu"}


def activate(activation: tuple, x: np.ndarray) -> np.ndarray:
    """One activation ``(name, alpha, beta)`` applied with numpy, in x's dtype."""
    name, alpha, beta = activation
    with np.errstate(over="ignore"):
        return ACTIVATIONS[name](x, np.float32(alpha), np.float32(beta)).astype(x.dtype)


def state_rows(cell: str, linear_before_reset: bool) -> int:
    """Rows of the kernel's output after the ``T`` rows of ``Y``: the final hidden state, the
    cell state (LSTM), the two scratch rows of a GRU that resets before its linear map."""
    if cell == "lstm":
        return 2
    if cell == "gru" and not linear_before_reset:
        return 3
    return 1


def directions_of(direction: str) -> int:
    return 2 if direction == "bidirectional" else 1


@dataclass(frozen=True)
class RecurrencePlan:
    """What one recurrence kernel computes, from its builder's arguments (normalized): the
    builder makes the kernel from it and the backends render it (:func:`recurrence_plan` of
    ``kernel.arguments``)."""

    name: str
    cell: str  # lstm, gru or rnn
    steps: PrimExpr  # T
    batch: PrimExpr  # B
    hidden: PrimExpr  # H
    direction: str  # forward, reverse or bidirectional
    activations: tuple[tuple[str, float, float], ...]  # each direction's functions, forward first
    clip: float | None
    input_forget: bool
    linear_before_reset: bool
    batch_major_states: bool
    optional: tuple[str, ...]  # the optional inputs present, in the order of OPTIONAL_INPUTS
    inputs: tuple[Buffer, ...]
    output: Buffer

    @property
    def directions(self) -> int:
        return directions_of(self.direction)

    @property
    def gates(self) -> tuple[str, ...]:
        """The cell's gates, in ONNX's order."""
        return GATES[self.cell]

    @property
    def options(self) -> dict:
        """The options of :func:`recurrence_reference`."""
        return dict(cell=self.cell, direction=self.direction, activations=self.activations, clip=self.clip,
                    input_forget=self.input_forget, linear_before_reset=self.linear_before_reset,
                    batch_major_states=self.batch_major_states, optional=self.optional)


def recurrence_plan(
    name: str, cell: str, steps: PrimExpr, batch: PrimExpr, hidden: PrimExpr, direction: str,
    activations: tuple, clip: float | None = None, input_forget: bool = False,
    linear_before_reset: bool = False, batch_major_states: bool = False, optional: tuple = (), dtype: str = "float32",
) -> RecurrencePlan:
    """The plan of :func:`recurrence_kernel` with these arguments; ValueError for an unknown
    cell, activation or optional input, or the wrong number of activations."""
    if cell not in GATES:
        raise ValueError(f"unknown recurrent cell {cell!r} (expected one of {', '.join(GATES)})")
    directions = directions_of(direction)
    if len(activations) != directions * ACTIVATION_COUNT[cell]:
        raise ValueError(f"{cell}: needs {directions * ACTIVATION_COUNT[cell]} activations, got {len(activations)}")
    unknown = [a[0] for a in activations if a[0] not in ACTIVATIONS] + [o for o in optional if o not in OPTIONAL_INPUTS]
    if unknown:
        raise ValueError(f"{cell}: unknown activations or optional inputs {unknown}")
    activations = tuple((str(a[0]), float(a[1]), float(a[2])) for a in activations)
    optional = tuple(o for o in OPTIONAL_INPUTS if o in optional)
    gates = len(GATES[cell]) * hidden
    states = (batch, directions, hidden) if batch_major_states else (directions, batch, hidden)
    shapes = {
        "bias": (directions, 2 * gates), "sequence_lens": (batch,), "initial_h": states, "initial_c": states,
        "peepholes": (directions, 3 * hidden),
    }
    inputs = (Buffer("projected", (steps, batch, directions, gates), dtype),
              Buffer("recurrence", (directions, hidden, gates), dtype),
              *(Buffer(o, shapes[o], "int32" if o == "sequence_lens" else dtype) for o in optional))
    output = Buffer("out", (simplify(steps + state_rows(cell, linear_before_reset)), directions, batch, hidden), dtype)
    return RecurrencePlan(name, cell, steps, batch, hidden, direction, activations, clip, input_forget,
                          linear_before_reset, batch_major_states, optional, inputs, output)


@library_kernel_builder("recurrence")
def recurrence_kernel(
    name: str, cell: str, steps: PrimExpr, batch: PrimExpr, hidden: PrimExpr, direction: str,
    activations: tuple, clip: float | None = None, input_forget: bool = False,
    linear_before_reset: bool = False, batch_major_states: bool = False, optional: tuple = (), dtype: str = "float32",
) -> LibraryKernel:
    """The recurrence of one LSTM / GRU / RNN layer (see the module doc).

    Inputs: ``projected[T, B, D, G*H]`` (X W^T plus the biases that add to it),
    ``recurrence[D, H, G*H]`` (R transposed), then the ``optional`` ones present, in the
    order of :data:`OPTIONAL_INPUTS`: ``bias[D, 2*G*H]`` (the ONNX B, read only by a GRU
    with ``linear_before_reset`` for Rbh), ``sequence_lens[B]`` (int32), ``initial_h`` and
    ``initial_c`` (``[D, B, H]``, or ``[B, D, H]`` with ``batch_major_states``),
    ``peepholes[D, 3*H]``.  ``activations``: ``(name, alpha, beta)`` for each direction's
    functions, forward first.
    """
    plan = recurrence_plan(name, cell, steps, batch, hidden, direction, activations, clip, input_forget,
                           linear_before_reset, batch_major_states, optional, dtype)
    options = plan.options
    summary = f"{direction} {cell.upper()} recurrence over {format_expr(steps)} steps"
    return LibraryKernel(name, plan.inputs, plan.output, simplify(plan.directions * batch * WORKGROUP),
                         lambda arrays: recurrence_reference(arrays, **options), summary, targets=(WEBGPU, WASM))


# -- numpy reference ------------------------------------------------------------------------------


def recurrence_reference(arrays: list[np.ndarray], *, cell: str, direction: str, activations: tuple,
                         clip: float | None, input_forget: bool, linear_before_reset: bool,
                         batch_major_states: bool, optional: tuple) -> np.ndarray:
    """The kernel's output, computed step by step with numpy (the same layout and rules)."""
    projected, recurrence = arrays[0], arrays[1]
    given = dict(zip(optional, arrays[2:]))
    steps, batch, directions, gate_count = projected.shape
    hidden = recurrence.shape[1]
    dtype = projected.dtype
    out = np.zeros((steps + state_rows(cell, linear_before_reset), directions, batch, hidden), dtype)
    lengths = np.clip(given.get("sequence_lens", np.full(batch, steps)), 0, steps)
    count = ACTIVATION_COUNT[cell]

    def limit(x):
        return x if clip is None else np.clip(x, -np.float32(clip), np.float32(clip))

    for d in range(directions):
        f, g, h = [activations[d * count + k] for k in range(count)] + [None] * (3 - count)
        weights = recurrence[d]  # [H, G*H]
        for b in range(batch):
            def initial(name):
                if name not in given:
                    return np.zeros(hidden, dtype)
                return given[name][b, d] if batch_major_states else given[name][d, b]
            state, cell_state = initial("initial_h"), initial("initial_c")
            reverse = direction == "reverse" or (direction == "bidirectional" and d == 1)
            order = range(lengths[b] - 1, -1, -1) if reverse else range(lengths[b])
            for t in order:
                x = projected[t, b, d].reshape(-1, hidden)
                if cell == "rnn":
                    state = activate(f, limit(x[0] + state @ weights))
                elif cell == "lstm":
                    gi, go, gf, gc = x + (state @ weights).reshape(-1, hidden)
                    if "peepholes" in given:
                        p = given["peepholes"][d].reshape(3, hidden)
                        gi, gf = gi + p[0] * cell_state, gf + p[2] * cell_state
                    i = activate(f, limit(gi))
                    forget = 1 - i if input_forget else activate(f, limit(gf))
                    cell_state = forget * cell_state + i * activate(g, limit(gc))
                    if "peepholes" in given:
                        go = go + p[1] * cell_state
                    state = activate(f, limit(go)) * activate(h, cell_state)
                else:
                    recurrent = (state @ weights).reshape(3, hidden)
                    z, r = activate(f, limit(x[0] + recurrent[0])), activate(f, limit(x[1] + recurrent[1]))
                    if linear_before_reset:
                        bias = given["bias"][d, 5 * hidden:] if "bias" in given else 0
                        candidate = activate(g, limit(x[2] + r * (recurrent[2] + bias)))
                    else:
                        candidate = activate(g, limit(x[2] + (r * state) @ weights[:, 2 * hidden:]))
                    state = (1 - z) * candidate + z * state
                out[t, d, b] = state
            out[steps, d, b] = state
            if cell == "lstm":
                out[steps + 1, d, b] = cell_state
    return out
