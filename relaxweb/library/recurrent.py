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
from .wat import IndexText, index_helpers, indent, kernel_text, loop, params_field

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
                         lambda arrays: recurrence_reference(arrays, **options), summary,
                         wasm_source=_wasm_source(name, inputs, output, steps, batch, hidden, options),
                         wasm_scratch_bytes=16 * len(GATES[cell]))


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


# -- WebAssembly ---------------------------------------------------------------------------------

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


def _wasm_source(name: str, inputs, output, steps, batch, hidden, options: dict) -> str:
    """The kernel's WAT: one unit per (direction, batch) pair, through every step as the WGSL
    does (the same output rows, scratch rows and order of operations).  A step computes the
    gates of 4 hidden units at a time: f32x4 accumulators (one per gate) start from the
    projected input and add ``h[k] * R[direction, k, gate columns]`` for every k (4
    consecutive columns of a row of R: one vector load); then the 4 units' cell updates are
    scalar, reading the gates back from scratch (4 words per gate)."""
    cell, optional, clip = options["cell"], options["optional"], options["clip"]
    directions = directions_of(options["direction"])
    gate_names = GATES[cell]
    layout = ParamsLayout(tuple(v.name for v in buffer_size_vars((*inputs, output))))
    index = IndexText(lambda var: params_field(layout, var))
    bindings = [buffer.name for buffer in inputs] + ["out"]

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

    def limit(value: str) -> str:
        if clip is None:
            return value
        return f"(f32.max (f32.min {value} {_wat_float(clip)}) {_wat_float(-clip)})"  # NaN stays NaN

    def activation(k: int, value: str) -> str:
        return f"(call $main_activation_{k} (local.get $direction) {value})"

    def out(element: str) -> str:
        return f"(f32.load {at('out', element)})"

    def projected_word(g: int) -> str:
        """Gate g's projected input of units unit0 .. unit0 + 3 (past hidden: ignored lanes)."""
        return f"(v128.load {at('projected', plus(get('x'), gate_offset(g), get('unit0')))})"

    def gates_of(names: list[tuple[str, int, bool]], source: str, epilogue: list[str]) -> list[str]:
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
                f"(local.set $k_end (i32.add (local.get $k) (i32.shl (local.get $hidden) (i32.const 2))))",
                *loop("dot", "(i32.ge_u (local.get $k) (local.get $k_end))", [
                    "(local.set $h (f32x4.splat (f32.load (local.get $k))))",
                    *(f"(local.set {v} (f32x4.add (local.get {v}) (f32x4.mul (local.get $h) (v128.load "
                      f"(i32.add (local.get $column) (i32.shl {gate_offset(g)} (i32.const 2)))))))"
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

    previous_h = out(plus(get("previous"), get("unit")))

    def projected_at(g: int) -> str:
        return f"(f32.load {at('projected', plus(get('x'), gate_offset(g), get('unit')))})"

    if cell == "rnn":
        step = gates_of([("a", 0, True)], "(local.get $source)", [
            f"(f32.store {at('out', plus(get('current'), get('unit')))} {activation(0, limit(get('g0')))})"])
    elif cell == "lstm":
        peepholes = "peepholes" in optional

        def peephole(j: int) -> str:  # peepholes[direction, j * hidden + unit]: i, o, f
            start = "(i32.mul (local.get $direction) (i32.mul (i32.const 3) (local.get $hidden)))"
            return f"(f32.load {at('peepholes', plus(start, gate_offset(j), get('unit')))})"

        epilogue = [f"(local.set $c_previous {out(plus(get('final_c'), get('unit')))})"]
        if peepholes:
            epilogue += [f"(local.set $g0 (f32.add (local.get $g0) (f32.mul {peephole(0)} (local.get $c_previous))))",
                         f"(local.set $g2 (f32.add (local.get $g2) (f32.mul {peephole(2)} (local.get $c_previous))))"]
        epilogue.append(f"(local.set $i {activation(0, limit(get('g0')))})")
        forget = "(f32.sub (f32.const 1) (local.get $i))" if options["input_forget"] else activation(0, limit(get("g2")))
        epilogue += [f"(local.set $f {forget})",
                     f"(local.set $c (f32.add (f32.mul (local.get $f) (local.get $c_previous)) "
                     f"(f32.mul (local.get $i) {activation(1, limit(get('g3')))})))"]
        if peepholes:
            epilogue.append(f"(local.set $g1 (f32.add (local.get $g1) (f32.mul {peephole(1)} (local.get $c))))")
        epilogue += [f"(f32.store {at('out', plus(get('final_c'), get('unit')))} (local.get $c))",
                     f"(f32.store {at('out', plus(get('current'), get('unit')))} "
                     f"(f32.mul {activation(0, limit(get('g1')))} {activation(2, get('c'))}))"]
        step = gates_of([(n, g, True) for g, n in enumerate(gate_names)], "(local.get $source)", epilogue)
    else:
        blend = (f"(f32.store {at('out', plus(get('current'), get('unit')))} (f32.add (f32.mul (f32.sub (f32.const 1) "
                 f"(local.get $z)) (local.get $candidate)) (f32.mul (local.get $z) {previous_h})))")
        update = [f"(local.set $z {activation(0, limit(get('g0')))})", f"(local.set $r {activation(0, limit(get('g1')))})"]
        if options["linear_before_reset"]:
            recurrent_bias = (f"(f32.load {at('bias', plus('(i32.mul (local.get $direction) (i32.mul (i32.const 6) (local.get $hidden)))', gate_offset(5), get('unit')))})"
                              if "bias" in optional else "(f32.const 0)")
            step = gates_of([("z", 0, True), ("r", 1, True), ("rh", 2, False)], "(local.get $source)", [
                *update,
                f"(local.set $candidate {activation(1, limit(f'(f32.add {projected_at(2)} (f32.mul (local.get $r) (f32.add (local.get $g2) {recurrent_bias})))'))})",
                blend])
        else:  # the reset gate applies to h before its linear map: r * h of every unit first (scratch rows)
            step = [
                *gates_of([("z", 0, True), ("r", 1, True)], "(local.get $source)", [
                    *update,
                    f"(f32.store {at('out', plus(get('scratch_z'), get('unit')))} (local.get $z))",
                    f"(f32.store {at('out', plus(get('scratch_rh'), get('unit')))} (f32.mul (local.get $r) {previous_h}))"]),
                f"(local.set $source {at('out', get('scratch_rh'))})",
                *gates_of([("h", 2, True)], "(local.get $source)", [
                    f"(local.set $z {out(plus(get('scratch_z'), get('unit')))})",
                    f"(local.set $candidate {activation(1, limit(get('g0')))})",
                    blend]),
            ]

    def initial(name: str) -> str:
        """The address of the initial state ``name`` of this (direction, b)."""
        if options["batch_major_states"]:
            return at(name, f"(i32.mul (i32.add (i32.mul (local.get $b) (i32.const {directions})) (local.get $direction)) (local.get $hidden))")
        return at(name, get("state"))

    row_bytes = "(i32.shl (local.get $hidden) (i32.const 2))"
    states = [("final_h", "initial_h")] + ([("final_c", "initial_c")] if cell == "lstm" else [])
    reverse = {"forward": "(i32.const 0)", "reverse": "(i32.const 1)",
               "bidirectional": "(i32.eq (local.get $direction) (i32.const 1))"}[options["direction"]]
    extra_rows = {"lstm": ["(local.set $final_c (i32.add (local.get $final_h) (local.get $row_stride)))"]}.get(cell, [])
    if cell == "gru" and not options["linear_before_reset"]:
        extra_rows = [";; scratch rows: the update gate, and r * h (read across units by the candidate's dot product)",
                      "(local.set $scratch_z (i32.add (local.get $final_h) (local.get $row_stride)))",
                      "(local.set $scratch_rh (i32.add (local.get $scratch_z) (local.get $row_stride)))"]
    length = ("(call $main_max (i32.const 0) (call $main_min (i32.load " + at("sequence_lens", get("b"))
              + ") (local.get $steps)))") if "sequence_lens" in optional else "(local.get $steps)"
    body = [
        f"(local.set $steps {index(steps)})",
        f"(local.set $batch {index(batch)})",
        f"(local.set $hidden {index(hidden)})",
        f"(local.set $gates (i32.mul (i32.const {len(gate_names)}) (local.get $hidden)))",
        ";; out[row, direction, b, unit] is at row * row_stride + state + unit",
        f"(local.set $row_stride (i32.mul (i32.mul (i32.const {directions}) (local.get $batch)) (local.get $hidden)))",
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
            *(f"(memory.copy {at('out', get(row))} {initial(name)} {row_bytes})" if name in optional else
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
                f"(i32.const {directions})) (local.get $direction)) (local.get $gates)))",
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
    int_locals = ["steps", "batch", "hidden", "gates", "row_stride", "group", "direction", "b", "reverse", "state",
                  "final_h", "final_c", "scratch_z", "scratch_rh", "length", "t", "step", "previous", "current", "x",
                  "source", "unit0", "unit", "lane", "column", "k", "k_end"]
    float_locals = ["g0", "g1", "g2", "g3", "c_previous", "i", "f", "c", "z", "r", "candidate"]
    vector_locals = ["h", "a0", "a1", "a2", "a3"]
    units = [f"(i32.mul (i32.const {directions}) {index(batch)})"]
    title = (f"library kernel: {name} ({options['direction']} {cell.upper()} recurrence, one unit per "
             "(direction, batch) through every step)")
    text = "\n".join([*units, *body])
    return kernel_text(title, bindings, units,
                       [*((n, "i32") for n in int_locals), *((n, "f32") for n in float_locals),
                        *((n, "v128") for n in vector_locals)],
                       body, [*index_helpers(text),
                              *_wat_activation_functions(cell, options["activations"], directions)])


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
