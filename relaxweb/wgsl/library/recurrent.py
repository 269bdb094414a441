"""The WGSL of the LSTM / GRU / RNN recurrence kernel (``relaxweb/library/recurrent.py``).

One workgroup of 64 invocations runs one (direction, batch) pair through all its steps:
invocation ``j`` owns hidden units ``j, j + 64, ...`` and computes their gates from the
previous hidden state (a dot product of length H per gate), then a ``storageBarrier`` makes
the new state visible to the whole workgroup before the next step.
"""

from __future__ import annotations

from ...ir.library_kernel import LibraryKernel, buffer_size_vars
from ...ir.params_block import ParamsLayout
from ...ir.symbolic import Analyzer, simplify
from ...library.recurrent import ACTIVATION_COUNT, GATES, NAN_TO_ZERO, RecurrencePlan, recurrence_plan
from ..emit import is_nan, literal, storage_type, wgsl_name
from ..lower_index import helper_declarations, helpers_used, lower_index, render_wgsl
from ..shader import params_declaration

#: name -> WGSL expression of ``x``, ``alpha`` and ``beta`` (the activations of
#: ``relaxweb/library/recurrent.py``, as its numpy functions compute them).
WGSL_ACTIVATIONS = {
    "relu": "select(0.0, x, x > 0.0)",
    "tanh": "tanh(clamp(x, -15.0, 15.0))",
    "sigmoid": "1.0 / (1.0 + exp(-x))",
    "affine": "alpha * x + beta",
    "leakyrelu": "select(alpha * x, x, x >= 0.0)",
    "thresholdedrelu": "select(0.0, x, x > alpha)",
    "scaledtanh": "alpha * tanh(clamp(beta * x, -15.0, 15.0))",
    "hardsigmoid": "select(0.0, min(alpha * x + beta, 1.0), alpha * x + beta > 0.0)",
    "elu": "select(alpha * (exp(x) - 1.0), x, x >= 0.0)",
    "softsign": "x / (1.0 + abs(x))",
    "softplus": "max(x, 0.0) + log(1.0 + exp(-abs(x)))",
}


def render_recurrence(kernel: LibraryKernel, target: str) -> str:
    """The recurrence kernel's WGSL (it has one form: ``target`` is webgpu)."""
    return _source(recurrence_plan(**kernel.arguments))


def _source(plan: RecurrencePlan) -> str:
    cell, optional, directions = plan.cell, plan.optional, plan.directions
    size_vars = [v.name for v in buffer_size_vars((*plan.inputs, plan.output))]
    sizes = {key: lower_index(simplify(value), Analyzer()) for key, value in
             (("steps", plan.steps), ("batch", plan.batch), ("hidden", plan.hidden))}
    helpers = set().union(*(helpers_used(target) for target in sizes.values()))
    value_type = storage_type(plan.output.dtype)
    lines = [f"// library kernel: {plan.name} ({plan.direction} {cell.upper()} recurrence, one workgroup per "
             "(direction, batch) through every step)", "", *params_declaration(ParamsLayout(tuple(size_vars)))]
    for binding, buffer in enumerate(plan.inputs, start=1):
        lines.append(f"@group(0) @binding({binding}) var<storage, read> {buffer.name}: array<{storage_type(buffer.dtype)}>;")
    lines.append(f"@group(0) @binding({len(plan.inputs) + 1}) var<storage, read_write> out: array<{value_type}>;")
    lines += helper_declarations(helpers)
    lines += _activation_functions(cell, plan.activations, directions)
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
        f"  let reverse = {_reverse(plan.direction)};",
        "  let first_unit = i32(local);",
        "  // out[row, direction, b, unit] is at row * row_stride + state + unit",
        f"  let row_stride = {directions} * batch * hidden;",
        "  let state = (direction * batch + b) * hidden;",
        f"  let gates = {len(GATES[cell])} * hidden;",
        "  let final_h = steps * row_stride + state;",
        *_extra_rows(cell, plan.linear_before_reset),
        ("  let length = clamp(sequence_lens[b], 0, steps);" if "sequence_lens" in optional else "  let length = steps;"),
        "  // the initial state, and zeros past the sequence's end",
        "  for (var unit = first_unit; unit < hidden; unit = unit + 64) {",
        f"    out[final_h + unit] = {_initial('initial_h', optional, plan.batch_major_states, directions)};",
        *([f"    out[final_c + unit] = {_initial('initial_c', optional, plan.batch_major_states, directions)};"]
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
        *_step(plan),
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
            expression = (WGSL_ACTIVATIONS[name].replace("alpha", literal(alpha, "float32"))
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


def _step(plan: RecurrencePlan) -> list[str]:
    """The body of one step: each invocation's units, from ``previous`` to ``current``."""
    cell, clip, optional = plan.cell, plan.clip, plan.optional
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
        forget = "1.0 - i" if plan.input_forget else f"activation_0(direction, {_clip('gf', clip)})"
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
    if plan.linear_before_reset:
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


