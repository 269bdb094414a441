"""Recurrent layers: LSTM, GRU and RNN, as ONNX defines them.

Signatures (args, then attributes)::

    lstm(X, W, R, [bias], [sequence_lens], [initial_h], [initial_c], [peepholes], ...)
    gru(X, W, R, [bias], [sequence_lens], [initial_h], ...)
    rnn(X, W, R, [bias], [sequence_lens], [initial_h], ...)

``optional`` lists the optional arguments given, in that order (ONNX's ``B``, ``sequence_lens``,
``initial_h``, ``initial_c``, ``P``).  Attributes: ``direction`` (``"forward"``,
``"reverse"``, ``"bidirectional"``: D = 1 or 2 directions), ``hidden_size`` (H, an int),
``layout`` (0: time major ``X[T, B, I]``, ``Y[T, D, B, H]``, states ``[D, B, H]``; 1: batch
major ``X[B, T, I]``, ``Y[B, T, D, H]``, states ``[B, D, H]``), ``activations`` (``(name,
alpha, beta)`` for each function of each direction, forward first: LSTM f, g, h; GRU f, g;
RNN f; see :func:`resolve_activations`), ``clip`` (None, or the bound of the gates'
pre-activations), and for an LSTM ``input_forget`` (f = 1 - i), for a GRU
``linear_before_reset``.  The result is a tuple: ``(Y, Y_h, Y_c)`` for an LSTM, ``(Y, Y_h)``
otherwise.  Gates, in the order of the rows of W, R and the two halves of ``bias`` (Wb then
Rb): LSTM i, o, f, c; GRU z, r, h.  ``peepholes`` is ``[D, 3H]``: i, o, f.

With ``sequence_lens``, batch entry b runs its first ``sequence_lens[b]`` steps (a reverse
direction runs them backwards, from step ``len - 1``); ``Y`` is 0 past them and the final
states are those of the last step run.  Values outside ``[0, T]`` are clamped (onnxruntime
rejects them; the GPU cannot, without reading them back).

Deduction: T, B and I come from X; W, R, the bias, the states, the lengths and the
peepholes must have the shapes these give (provably); T may be symbolic, so one build
serves every sequence length.

Legalization (``relaxweb/library/recurrent.py`` has the picture): the input projection of
every step at once (a matmul-like program with the biases that add to it), R transposed, one
persistent library kernel for the recurrence, and a slice of its output for each result.
"""

from __future__ import annotations

import numpy as np

from ..ir.expr import Call, Tuple, tensor_dtype, tensor_shape
from ..ir.op_registry import DeductionError, register_op
from ..ir.struct_info import TensorStructInfo, TupleStructInfo
from ..ir.symbolic import IntImm, SizeVar, format_expr, simplify
from ..ir.tir import FloatImm, IndexValue, Load, Reduce, ReduceCombiner, select
from ..library.recurrent import (
    ACTIVATION_COUNT, ACTIVATIONS, GATES, OPTIONAL_INPUTS, activate, directions_of, recurrence_kernel,
)
from .common import DimOf, make_program, needs_known_shapes, require_equal, require_float, require_tensor, same_dtype

DIRECTIONS = ("forward", "reverse", "bidirectional")
# Which activations take alpha and beta, and their defaults (as onnxruntime has them).
TAKES_ALPHA_BETA = {"affine": (True, True), "leakyrelu": (True, False), "thresholdedrelu": (True, False),
                    "scaledtanh": (True, True), "hardsigmoid": (True, True), "elu": (True, False)}
ALPHA_BETA_DEFAULTS = {"leakyrelu": (0.01, 0.0), "hardsigmoid": (0.2, 0.5), "elu": (1.0, 0.0)}
DEFAULT_ACTIVATIONS = {"lstm": ("sigmoid", "tanh", "tanh"), "gru": ("sigmoid", "tanh"), "rnn": ("tanh",)}


def resolve_activations(cell: str, direction: str, names, alphas, betas) -> list[tuple[str, float, float]]:
    """``(name, alpha, beta)`` for each activation function of each direction, from ONNX's
    ``activations``, ``activation_alpha`` and ``activation_beta`` attributes.

    The names are case-insensitive; absent, each direction has the cell's defaults; one
    direction's list for a bidirectional layer serves both.  Alpha and beta values are
    consumed in order by the functions that take them, a function past the end of a list
    taking its default (onnxruntime's reading of the spec: LeakyRelu 0.01, HardSigmoid 0.2
    and 0.5, Elu 1.0, every other 0).
    """
    count, directions = ACTIVATION_COUNT[cell], directions_of(direction)
    names = [str(n).lower() for n in names] if names else list(DEFAULT_ACTIVATIONS[cell])
    if len(names) == count and directions == 2:
        names = names * 2
    if len(names) != count * directions:
        raise DeductionError(f"{cell}: needs {count} activation(s) per direction ({count * directions} in all), "
                             f"got {len(names)}: {names}")
    unknown = sorted({n for n in names if n not in ACTIVATIONS})
    if unknown:
        raise DeductionError(f"{cell}: unknown activation(s) {', '.join(unknown)} (known: {', '.join(ACTIVATIONS)})")
    alphas, betas = list(alphas or ()), list(betas or ())
    resolved = []
    for name in names:
        takes_alpha, takes_beta = TAKES_ALPHA_BETA.get(name, (False, False))
        alpha, beta = ALPHA_BETA_DEFAULTS.get(name, (0.0, 0.0))
        if takes_alpha and alphas:
            alpha = alphas.pop(0)
        if takes_beta and betas:
            beta = betas.pop(0)
        resolved.append((name, float(alpha), float(beta)))
    return resolved


# deduction ----------------------------------------------------------------------------------------


def _arguments(cell: str, args, attrs) -> dict:
    """The arguments by name (X, W, R and the optional ones given)."""
    optional = list(attrs.get("optional", ()))
    allowed = OPTIONAL_INPUTS if cell == "lstm" else OPTIONAL_INPUTS[:3]
    if optional != [name for name in allowed if name in optional]:
        raise DeductionError(f"{cell}: optional= must list some of {list(allowed)} in that order, got {optional}")
    names = ["X", "W", "R", *optional]
    if len(args) != len(names):
        raise DeductionError(f"{cell}: takes {len(names)} argument(s) ({', '.join(names)}), got {len(args)}")
    return dict(zip(names, args))


def _check_attrs(cell: str, attrs) -> tuple[int, int]:
    direction = attrs.get("direction", "forward")
    if direction not in DIRECTIONS:
        raise DeductionError(f"{cell}: direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}")
    if attrs.get("layout", 0) not in (0, 1):
        raise DeductionError(f"{cell}: layout must be 0 or 1, got {attrs.get('layout')!r}")
    hidden = attrs.get("hidden_size")
    if not isinstance(hidden, int) or hidden <= 0:
        raise DeductionError(f"{cell}: hidden_size must be a positive int, got {hidden!r}")
    count = ACTIVATION_COUNT[cell] * directions_of(direction)
    if len(attrs.get("activations", ())) != count:
        raise DeductionError(f"{cell}: needs {count} (name, alpha, beta) activations, got {attrs.get('activations')!r}")
    return directions_of(direction), hidden


def deduce_recurrent(cell: str):
    def deduce(args, attrs) -> TupleStructInfo:
        directions, hidden = _check_attrs(cell, attrs)
        given = _arguments(cell, args, attrs)
        infos = {name: require_tensor(value, cell, position) for position, (name, value) in enumerate(given.items())}
        require_float(cell, infos["X"])
        floats = [info for name, info in infos.items() if name != "sequence_lens"]
        dtype = same_dtype(cell, floats)
        if "sequence_lens" in infos and infos["sequence_lens"].dtype != "int32":
            raise DeductionError(f"{cell}: sequence_lens must be int32, got {infos['sequence_lens'].dtype}")
        layout = attrs.get("layout", 0)
        count = 3 if cell == "lstm" else 2
        x = infos["X"]
        if x.shape is None or any(info.shape is None for info in infos.values()):
            ranks = (4, 3, 3)[:count]
            return TupleStructInfo(tuple(TensorStructInfo(None, dtype, rank) for rank in ranks))
        if len(x.shape) != 3:
            raise DeductionError(f"{cell}: X must have 3 dims, got {x}")
        steps, batch, inputs = (x.shape[1], x.shape[0], x.shape[2]) if layout else x.shape
        gates = len(GATES[cell]) * hidden
        states = (batch, directions, hidden) if layout else (directions, batch, hidden)
        expected = {
            "W": (directions, gates, inputs), "R": (directions, gates, hidden), "bias": (directions, 2 * gates),
            "sequence_lens": (batch,), "initial_h": states, "initial_c": states, "peepholes": (directions, 3 * hidden),
        }
        for position, (name, info) in enumerate(infos.items()):
            if name == "X":
                continue
            want = tuple(simplify(d) for d in expected[name])
            message = (f"{cell}: {name} must have shape ({', '.join(format_expr(d) for d in want)}), got "
                       f"({', '.join(format_expr(d) for d in info.shape)})")
            if len(info.shape) != len(want):
                raise DeductionError(message)
            for dim, (have, needed) in enumerate(zip(info.shape, want)):
                # a state's batch named apart from X's (Silero's [2, 0, 128]) is checked at run time
                require_equal(DimOf(have, position, dim), DimOf(needed, None, dim), message)
        y = (batch, steps, directions, hidden) if layout else (steps, directions, batch, hidden)
        return TupleStructInfo((TensorStructInfo(y, dtype), *(TensorStructInfo(states, dtype) for _ in range(count - 1))))
    return deduce


# legalization --------------------------------------------------------------------------------------


def legalize_recurrent(cell: str):
    def legalize(context, call: Call):
        given = _arguments(cell, call.args, call.attrs)
        attrs = call.attrs
        layout, direction, hidden = attrs.get("layout", 0), attrs.get("direction", "forward"), attrs["hidden_size"]
        linear_before_reset = bool(attrs.get("linear_before_reset", False))
        x = given["X"]
        steps, batch, _ = (tensor_shape(x)[i] for i in ((1, 0, 2) if layout else (0, 1, 2)))
        dtype = tensor_dtype(x)
        projected = context.emit(context.call_tir(
            _projection(cell, given, layout, hidden, linear_before_reset), _projection_args(given)), f"{cell}_projected")
        transposed = make_program(f"{cell}_recurrent_weights", [given["R"]], _transposed_shape(given["R"]), dtype,
                                  lambda axes, buffers: Load(buffers[0], (axes[0], axes[2], axes[1])))
        recurrence = context.emit(context.call_tir(transposed, (given["R"],)), f"{cell}_recurrent_weights")
        optional = [name for name in OPTIONAL_INPUTS if name in given
                    and (name != "bias" or (cell == "gru" and linear_before_reset))]
        kernel = recurrence_kernel(
            f"{cell}_recurrence", cell, steps, batch, IntImm(hidden), direction,
            tuple(tuple(a) for a in attrs["activations"]), attrs.get("clip"), bool(attrs.get("input_forget", False)),
            linear_before_reset, bool(layout), tuple(optional), dtype)
        state = context.emit(context.call_library(kernel, (projected, recurrence, *(given[n] for n in optional))),
                             f"{cell}_state")
        results = [context.emit(context.call_tir(_sequence(cell, state, steps, layout), (state,)), f"{cell}_y")]
        for row, name in ((steps, "y_h"), (steps + 1, "y_c"))[:(2 if cell == "lstm" else 1)]:
            results.append(context.emit(context.call_tir(_final(cell, name, state, row, layout), (state,)), f"{cell}_{name}"))
        return Tuple(tuple(results))
    return needs_known_shapes(legalize)


def _projection_args(given: dict) -> tuple:
    return (given["X"], given["W"], *((given["bias"],) if "bias" in given else ()))


def _projection(cell: str, given: dict, layout: int, hidden: int, linear_before_reset: bool):
    """``projected[t, b, d, g] = sum_k X[t, b, k] * W[d, g, k] + Wb[d, g] + Rb[d, g]``: the
    input's part of every gate at every step, with the biases that add to it (all of them but
    a GRU's Rbh under ``linear_before_reset``, which the reset gate multiplies)."""
    x, w = given["X"], given["W"]
    steps, batch, inputs = (tensor_shape(x)[i] for i in ((1, 0, 2) if layout else (0, 1, 2)))
    directions, gates, _ = tensor_shape(w)
    k = SizeVar("k_")

    def body(axes, buffers):
        t, b, d, g = axes
        row = (b, t, k) if layout else (t, b, k)
        value = Reduce(ReduceCombiner.SUM, k, inputs, Load(buffers[0], row) * Load(buffers[1], (d, g, k)))
        if len(buffers) == 3:
            bias = buffers[2]
            recurrent = Load(bias, (d, gates + g))
            if cell == "gru" and linear_before_reset:
                recurrent = select(IndexValue(g).lt(IndexValue(IntImm(2 * hidden))), recurrent, FloatImm(0.0, bias.dtype))
            value = value + Load(bias, (d, g)) + recurrent
        return value

    return make_program(f"{cell}_input_projection", _projection_args(given), (steps, batch, directions, gates),
                        tensor_dtype(x), body)


def _transposed_shape(r):
    directions, gates, hidden = tensor_shape(r)
    return (directions, hidden, gates)


def _sequence(cell: str, state, steps, layout: int):
    """``Y``: the kernel's rows 0 .. T-1, ``[T, D, B, H]`` or ``[B, T, D, H]``."""
    _, directions, batch, hidden = tensor_shape(state)
    shape = (batch, steps, directions, hidden) if layout else (steps, directions, batch, hidden)

    def body(axes, buffers):
        b, t, d, h = axes if layout else (axes[2], axes[0], axes[1], axes[3])
        return Load(buffers[0], (t, d, b, h))

    return make_program(f"{cell}_sequence", [state], shape, tensor_dtype(state), body)


def _final(cell: str, name: str, state, row, layout: int):
    """A final state: the kernel's row ``row``, ``[D, B, H]`` or ``[B, D, H]``."""
    _, directions, batch, hidden = tensor_shape(state)
    shape = (batch, directions, hidden) if layout else (directions, batch, hidden)

    def body(axes, buffers):
        b, d, h = axes if layout else (axes[1], axes[0], axes[2])
        return Load(buffers[0], (row, d, b, h))

    return make_program(f"{cell}_{name}", [state], shape, tensor_dtype(state), body)


# reference ------------------------------------------------------------------------------------------


def recurrent_reference(cell: str):
    """The ONNX operator, step by step with numpy (float32 arithmetic for float16 inputs)."""
    def reference(arrays, attrs):
        given = dict(zip(["X", "W", "R", *attrs.get("optional", ())], arrays))
        dtype = given["X"].dtype
        compute = np.float64 if dtype == np.float64 else np.float32
        given = {name: value if name == "sequence_lens" else value.astype(compute) for name, value in given.items()}
        layout, hidden = attrs.get("layout", 0), attrs["hidden_size"]
        direction = attrs.get("direction", "forward")
        x = given["X"].transpose(1, 0, 2) if layout else given["X"]  # [T, B, I]
        steps, batch, _ = x.shape
        directions, count = directions_of(direction), ACTIVATION_COUNT[cell]
        activations = [tuple(a) for a in attrs["activations"]]
        clip = attrs.get("clip")

        def limit(value):
            return value if clip is None else np.clip(value, -clip, clip)

        def initial(name):
            if name not in given:
                return np.zeros((directions, batch, hidden), compute)
            return given[name].transpose(1, 0, 2) if layout else given[name]

        h0, c0 = initial("initial_h"), initial("initial_c")
        lengths = given.get("sequence_lens", np.full(batch, steps))
        y = np.zeros((steps, directions, batch, hidden), compute)
        y_h, y_c = np.zeros((directions, batch, hidden), compute), np.zeros((directions, batch, hidden), compute)
        for d in range(directions):
            w, r = given["W"][d], given["R"][d]
            bias = given["bias"][d] if "bias" in given else np.zeros(2 * len(GATES[cell]) * hidden, compute)
            wb, rb = np.split(bias, 2)
            f, g, h = [activations[d * count + k] for k in range(count)] + [None] * (3 - count)
            reverse = direction == "reverse" or (direction == "bidirectional" and d == 1)
            for b in range(batch):
                state, cell_state = h0[d, b], c0[d, b]
                length = int(np.clip(lengths[b], 0, steps))
                for t in (range(length - 1, -1, -1) if reverse else range(length)):
                    if cell == "rnn":
                        state = activate(f, limit(x[t, b] @ w.T + state @ r.T + wb + rb))
                    elif cell == "lstm":
                        gi, go, gf, gc = np.split(x[t, b] @ w.T + state @ r.T + wb + rb, 4)
                        if "peepholes" in given:
                            pi, po, pf = np.split(given["peepholes"][d], 3)
                            gi, gf = gi + pi * cell_state, gf + pf * cell_state
                        i = activate(f, limit(gi))
                        forget = 1 - i if attrs.get("input_forget") else activate(f, limit(gf))
                        cell_state = forget * cell_state + i * activate(g, limit(gc))
                        if "peepholes" in given:
                            go = go + po * cell_state
                        state = activate(f, limit(go)) * activate(h, cell_state)
                    else:
                        wz, wr, wh = np.split(w, 3)
                        rz, rr, rh = np.split(r, 3)
                        (wbz, wbr, wbh), (rbz, rbr, rbh) = np.split(wb, 3), np.split(rb, 3)
                        z = activate(f, limit(x[t, b] @ wz.T + state @ rz.T + wbz + rbz))
                        reset = activate(f, limit(x[t, b] @ wr.T + state @ rr.T + wbr + rbr))
                        if attrs.get("linear_before_reset"):
                            candidate = activate(g, limit(x[t, b] @ wh.T + reset * (state @ rh.T + rbh) + wbh))
                        else:
                            candidate = activate(g, limit(x[t, b] @ wh.T + (reset * state) @ rh.T + rbh + wbh))
                        state = (1 - z) * candidate + z * state
                    y[t, d, b] = state
                y_h[d, b], y_c[d, b] = state, cell_state
        if layout:
            y, y_h, y_c = y.transpose(2, 0, 1, 3), y_h.transpose(1, 0, 2), y_c.transpose(1, 0, 2)
        results = (y, y_h, y_c) if cell == "lstm" else (y, y_h)
        return tuple(result.astype(dtype) for result in results)
    return reference


for _cell in GATES:
    register_op(_cell, deduce=deduce_recurrent(_cell), legalize=legalize_recurrent(_cell),
                reference=recurrent_reference(_cell))
