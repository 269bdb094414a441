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

Activations are ``(name, alpha, beta)`` triples, the names as ONNX's RNN operators spell
them in lower case (:data:`ACTIVATIONS`).
"""

from __future__ import annotations

import numpy as np

from ..ir.kernel_builders import library_kernel_builder
from ..ir.library_kernel import LibraryKernel, buffer_size_vars
from ..ir.params_block import ParamsLayout
from ..ir.symbolic import Analyzer, PrimExpr, format_expr, simplify
from ..ir.tir import Buffer
from ..wgsl.emit import is_nan, literal, storage_type, wgsl_name
from ..wgsl.lower_index import helper_declarations, helpers_used, lower_index, render_wgsl
from ..wgsl.shader import params_declaration

WORKGROUP = 64

#: Gates per cell kind, in ONNX's order of the rows of W, R and B.
GATES = {"lstm": ("i", "o", "f", "c"), "gru": ("z", "r", "h"), "rnn": ("i",)}
#: Activation functions per direction: LSTM f, g, h; GRU f, g; RNN f.
ACTIVATION_COUNT = {"lstm": 3, "gru": 2, "rnn": 1}
#: The optional inputs of the kernel, in binding order.
OPTIONAL_INPUTS = ("bias", "sequence_lens", "initial_h", "initial_c", "peepholes")


def _softplus(x, alpha, beta):
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


#: name -> (numpy function of (x, alpha, beta), WGSL expression of x, alpha and beta).
#: Parameters follow onnxruntime: LeakyRelu, ThresholdedRelu, Elu take alpha; Affine,
#: ScaledTanh, HardSigmoid alpha and beta (the activation attribute lists are consumed in
#: order by the functions that take them; see ``relaxweb/ops/recurrent.py``).
ACTIVATIONS = {
    "relu": (lambda x, a, b: np.where(x > 0, x, 0), "select(0.0, x, x > 0.0)"),
    "tanh": (lambda x, a, b: np.tanh(x), "tanh(clamp(x, -15.0, 15.0))"),
    "sigmoid": (lambda x, a, b: 1 / (1 + np.exp(-x)), "1.0 / (1.0 + exp(-x))"),
    "affine": (lambda x, a, b: a * x + b, "alpha * x + beta"),
    "leakyrelu": (lambda x, a, b: np.where(x >= 0, x, a * x), "select(alpha * x, x, x >= 0.0)"),
    "thresholdedrelu": (lambda x, a, b: np.where(x > a, x, 0), "select(0.0, x, x > alpha)"),
    "scaledtanh": (lambda x, a, b: a * np.tanh(b * x), "alpha * tanh(clamp(beta * x, -15.0, 15.0))"),
    "hardsigmoid": (lambda x, a, b: np.where(a * x + b > 0, np.minimum(a * x + b, 1), 0),
                    "select(0.0, min(alpha * x + beta, 1.0), alpha * x + beta > 0.0)"),
    "elu": (lambda x, a, b: np.where(x >= 0, x, a * (np.exp(x) - 1)), "select(alpha * (exp(x) - 1.0), x, x >= 0.0)"),
    "softsign": (lambda x, a, b: x / (1 + np.abs(x)), "x / (1.0 + abs(x))"),
    "softplus": (_softplus, "max(x, 0.0) + log(1.0 + exp(-abs(x)))"),
}


#: The activations that map NaN to 0, as onnxruntime's recurrent kernels do (``NaN > 0`` is
#: false); every other one gives NaN for NaN, which the kernel makes explicit (WGSL's max,
#: min and clamp of a NaN are unspecified).
NAN_TO_ZERO = {"relu", "hardsigmoid", "thresholdedrelu"}


def activate(activation: tuple, x: np.ndarray) -> np.ndarray:
    """One activation ``(name, alpha, beta)`` applied with numpy, in x's dtype."""
    name, alpha, beta = activation
    with np.errstate(over="ignore"):
        return ACTIVATIONS[name][0](x, np.float32(alpha), np.float32(beta)).astype(x.dtype)


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
    options = dict(cell=cell, direction=direction, activations=activations, clip=clip, input_forget=input_forget,
                   linear_before_reset=linear_before_reset, batch_major_states=batch_major_states, optional=optional)
    source = _source(name, inputs, output, steps, batch, hidden, options)
    summary = f"{direction} {cell.upper()} recurrence over {format_expr(steps)} steps"
    return LibraryKernel(name, inputs, output, simplify(directions * batch * WORKGROUP), source,
                         lambda arrays: recurrence_reference(arrays, **options), summary)


# -- WGSL ---------------------------------------------------------------------------------------


def _source(name: str, inputs, output, steps, batch, hidden, options: dict) -> str:
    cell, optional = options["cell"], options["optional"]
    directions = directions_of(options["direction"])
    size_vars = [v.name for v in buffer_size_vars((*inputs, output))]
    sizes = {key: lower_index(simplify(value), Analyzer()) for key, value in
             (("steps", steps), ("batch", batch), ("hidden", hidden))}
    helpers = set().union(*(helpers_used(target) for target in sizes.values()))
    value_type = storage_type(output.dtype)
    lines = [f"// library kernel: {name} ({options['direction']} {cell.upper()} recurrence, one workgroup per "
             "(direction, batch) through every step)", "", *params_declaration(ParamsLayout(tuple(size_vars)))]
    for binding, buffer in enumerate(inputs, start=1):
        lines.append(f"@group(0) @binding({binding}) var<storage, read> {buffer.name}: array<{storage_type(buffer.dtype)}>;")
    lines.append(f"@group(0) @binding({len(inputs) + 1}) var<storage, read_write> out: array<{value_type}>;")
    lines += helper_declarations(helpers)
    lines += _activation_functions(cell, options["activations"], directions)
    lines += [
        "",
        "@compute @workgroup_size(64)",
        "fn main(@builtin(workgroup_id) workgroup: vec3<u32>,",
        "        @builtin(num_workgroups) workgroups: vec3<u32>,",
        "        @builtin(local_invocation_index) local: u32) {",
        *(f"  let {key} = {render_wgsl(target, lambda n: f'params.{wgsl_name(n)}')};" for key, target in sizes.items()),
        "  let group = i32(workgroup.y * workgroups.x + workgroup.x);",
        f"  if (group >= {directions} * batch) {{",
        "    return;",
        "  }",
        "  let direction = group / batch;",
        "  let b = group % batch;",
        f"  let reverse = {_reverse(options['direction'])};",
        "  let first_unit = i32(local);",
        "  // out[row, direction, b, unit] is at row * row_stride + state + unit",
        f"  let row_stride = {directions} * batch * hidden;",
        "  let state = (direction * batch + b) * hidden;",
        f"  let gates = {len(GATES[cell])} * hidden;",
        "  let final_h = steps * row_stride + state;",
        *_extra_rows(cell, options["linear_before_reset"]),
        ("  let length = clamp(sequence_lens[b], 0, steps);" if "sequence_lens" in optional else "  let length = steps;"),
        "  // the initial state, and zeros past the sequence's end",
        "  for (var unit = first_unit; unit < hidden; unit = unit + 64) {",
        f"    out[final_h + unit] = {_initial('initial_h', optional, options['batch_major_states'], directions)};",
        *([f"    out[final_c + unit] = {_initial('initial_c', optional, options['batch_major_states'], directions)};"]
          if cell == "lstm" else []),
        "    for (var t = length; t < steps; t = t + 1) {",
        "      out[t * row_stride + state + unit] = 0.0;",
        "    }",
        "  }",
        "  storageBarrier();",
        "  for (var step = 0; step < length; step = step + 1) {",
        "    let t = select(step, length - 1 - step, reverse);",
        "    // the previous hidden state: the initial one (in the final row) on the first step",
        "    let previous = select(final_h, select(t - 1, t + 1, reverse) * row_stride + state, step > 0);",
        "    let current = t * row_stride + state;",
        "    let x = ((t * batch + b) * " f"{directions} + direction) * gates;",
        *_step(cell, options),
        "    storageBarrier();",
        "  }",
        "  if (length > 0) {",
        "    let last = select(length - 1, 0, reverse) * row_stride + state;",
        "    for (var unit = first_unit; unit < hidden; unit = unit + 64) {",
        "      out[final_h + unit] = out[last + unit];",
        "    }",
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def _extra_rows(cell: str, linear_before_reset: bool) -> list[str]:
    """The rows after the final hidden state: an LSTM's cell state, a GRU's scratch rows."""
    if cell == "lstm":
        return ["  let final_c = final_h + row_stride;"]
    if cell == "gru" and not linear_before_reset:
        return ["  // scratch: the update gate, and r * h (read across units by the candidate's dot product)",
                "  let scratch_z = final_h + row_stride;", "  let scratch_rh = final_h + 2 * row_stride;"]
    return []


def _reverse(direction: str) -> str:
    return {"forward": "false", "reverse": "true", "bidirectional": "direction == 1"}[direction]


def _initial(name: str, optional: tuple, batch_major: bool, directions: int) -> str:
    if name not in optional:
        return "0.0"
    index = f"(b * {directions} + direction) * hidden + unit" if batch_major else "state + unit"
    return f"{name}[{index}]"


def _activation_functions(cell: str, activations: tuple, directions: int) -> list[str]:
    """``fn activation_k(direction, x)``: the k-th function of the cell (LSTM f, g, h; GRU f,
    g; RNN f) of that direction."""
    count = ACTIVATION_COUNT[cell]
    lines = []
    for k in range(count):
        lines += ["", f"fn activation_{k}(direction: i32, x: f32) -> f32 {{"]
        for d in range(directions):
            name, alpha, beta = activations[d * count + k]
            expression = (ACTIVATIONS[name][1].replace("alpha", literal(alpha, "float32"))
                          .replace("beta", literal(beta, "float32")))
            if name not in NAN_TO_ZERO:  # WGSL's max / min / clamp of a NaN are unspecified
                expression = f"select({expression}, x, {is_nan('x')})"
            if d + 1 < directions:
                lines += [f"  if (direction == {d}) {{", f"    return {expression};", "  }"]
            else:
                lines.append(f"  return {expression};")
        lines.append("}")
    return lines


def _clip(value: str, clip: float | None) -> str:
    if clip is None:
        return value
    bound = literal(clip, "float32")
    return f"select(clamp({value}, -{bound}, {bound}), {value}, {is_nan(value)})"  # NaN stays NaN


#: Terms of the recurrent dot product per loop iteration.  llvmpipe (Mesa's software Vulkan,
#: which CI runs on) ends any shader loop after 65535 iterations in all of an invocation, so
#: the loop over k, entered once per unit and step, is unrolled: an invocation's iterations
#: are ``T * ceil(H / 64) * ceil(H / 32)``, 65535 at H = 512 and T = 511 (any length on GPUs).
DOT_UNROLL = 32


def _dot(names: list[str], source: str, gate_offsets: list[str]) -> list[str]:
    """Accumulate ``names[g] += source[k] * recurrence[direction, k, offset_g + unit]`` over
    ``k < hidden`` (``source`` names ``k`` as ``{k}``), DOT_UNROLL terms per iteration.  A
    loop that a driver ended early (llvmpipe's cap above) leaves ``k`` short of ``hidden``:
    the sums of that unit and step are then NaN.  Past the cap, later steps can still come
    out stale rather than NaN (measured at H = 1024, T = 160 on llvmpipe): only the first
    cut is guarded."""

    def terms(k: str, indent: str) -> list[str]:
        index = k.replace(" + 0", "")
        lines = [f"{indent}{{"]
        lines.append(f"{indent}  let h = {source.format(k=index)};")
        lines.append(f"{indent}  let column = (direction * hidden + {index}) * gates + unit;")
        lines += [f"{indent}  {name} = {name} + h * recurrence[column{'' if offset == '0' else ' + ' + offset}];"
                  for name, offset in zip(names, gate_offsets)]
        lines.append(f"{indent}}}")
        return lines

    lines = ["      var k = 0;", f"      for (; k + {DOT_UNROLL} <= hidden; k = k + {DOT_UNROLL}) {{"]
    for j in range(DOT_UNROLL):
        lines += terms(f"k + {j}", "        ")
    lines += ["      }", "      for (; k < hidden; k = k + 1) {", *terms("k", "        "), "      }",
              "      if (k != hidden) {  // the driver ended a loop early: NaN, not a wrong value",
              *(f"        {name} = bitcast<f32>(0x7fc00000u | (local & 0u));" for name in names), "      }"]
    return lines


def _step(cell: str, options: dict) -> list[str]:
    """The body of one step: each invocation's units, from ``previous`` to ``current``."""
    clip, optional = options["clip"], options["optional"]
    units = "    for (var unit = first_unit; unit < hidden; unit = unit + 64) {"
    if cell == "rnn":
        return [units, "      var a = projected[x + unit];", *_dot(["a"], "out[previous + {k}]", ["0"]),
                f"      out[current + unit] = activation_0(direction, {_clip('a', clip)});", "    }"]
    if cell == "lstm":
        peepholes = "peepholes" in optional
        lines = [units, "      var gi = projected[x + unit];", "      var go = projected[x + hidden + unit];",
                 "      var gf = projected[x + 2 * hidden + unit];", "      var gc = projected[x + 3 * hidden + unit];",
                 *_dot(["gi", "go", "gf", "gc"], "out[previous + {k}]", ["0", "hidden", "2 * hidden", "3 * hidden"]),
                 "      let c_previous = out[final_c + unit];"]
        if peepholes:
            lines += ["      let p = direction * 3 * hidden + unit;",
                      "      gi = gi + peepholes[p] * c_previous;", "      gf = gf + peepholes[p + 2 * hidden] * c_previous;"]
        lines.append(f"      let i = activation_0(direction, {_clip('gi', clip)});")
        forget = "1.0 - i" if options["input_forget"] else f"activation_0(direction, {_clip('gf', clip)})"
        lines += [f"      let f = {forget};",
                  f"      let c = f * c_previous + i * activation_1(direction, {_clip('gc', clip)});"]
        if peepholes:
            lines.append("      go = go + peepholes[p + hidden] * c;")
        return lines + [f"      let o = activation_0(direction, {_clip('go', clip)});",
                        "      out[final_c + unit] = c;",
                        "      out[current + unit] = o * activation_2(direction, c);", "    }"]
    # GRU
    head = [units, "      var gz = projected[x + unit];", "      var gr = projected[x + hidden + unit];"]
    candidate_input = "      var gh = projected[x + 2 * hidden + unit];"
    update = [f"      let z = activation_0(direction, {_clip('gz', clip)});",
              f"      let r = activation_0(direction, {_clip('gr', clip)});"]
    if options["linear_before_reset"]:
        recurrent_bias = "bias[direction * 6 * hidden + 5 * hidden + unit]" if "bias" in optional else "0.0"
        return [*head, candidate_input, "      var rh = 0.0;",
                *_dot(["gz", "gr", "rh"], "out[previous + {k}]", ["0", "hidden", "2 * hidden"]), *update,
                f"      let candidate = activation_1(direction, {_clip(f'gh + r * (rh + {recurrent_bias})', clip)});",
                "      out[current + unit] = (1.0 - z) * candidate + z * out[previous + unit];", "    }"]
    # the reset gate applies to h before its linear map: r * h of every unit first (scratch rows)
    return [*head, *_dot(["gz", "gr"], "out[previous + {k}]", ["0", "hidden"]), *update,
            "      out[scratch_z + unit] = z;",
            "      out[scratch_rh + unit] = r * out[previous + unit];", "    }",
            "    storageBarrier();",
            units, candidate_input, *_dot(["gh"], "out[scratch_rh + {k}]", ["2 * hidden"]),
            "      let z = out[scratch_z + unit];",
            f"      let candidate = activation_1(direction, {_clip('gh', clip)});",
            "      out[current + unit] = (1.0 - z) * candidate + z * out[previous + unit];", "    }"]


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
