// The web demo: load a bundle, show its inputs with their symbolic shapes and the bounds of
// its symbolic sizes, run it on random inputs at sizes the user picks, and plot the latency
// against one symbolic size; a decoder bundle with a tokenizer also generates text, streamed
// into the page with its tokens/s (and a link to the chat page, chat.html). The bundle comes
// from `bundle/` next to this page (where `relaxweb serve DIR` puts it); `?bundle=URL` or the
// URL field picks another one.

import { load } from "./runtime/relaxweb.js";
import { backendText, button, element, field, whyNoGeneration } from "./page_common.js";

const PREVIEW_VALUES = 8;
/** Values a sweep tries by default: powers of two up to the bound (or up to this without one). */
const DEFAULT_SWEEP_LIMIT = 64;

/**
 * @typedef {import("./runtime/relaxweb.js").Model} Model  (runtime/ is served next to this page)
 * @typedef {{data: any, shape: number[]}} Tensor
 */

/** @param {unknown} error */
function showError(error) {
  element("error").textContent = error instanceof Error ? error.message : String(error ?? "");
}

/**
 * Fill a table: one row per entry, a header row first.
 * @param {string} id
 * @param {string[]} header
 * @param {(string|Node)[][]} rows
 */
function fillTable(id, header, rows) {
  const table = /** @type {HTMLTableElement} */ (element(id));
  table.replaceChildren();
  const headerRow = table.insertRow();
  for (const title of header) {
    const cell = document.createElement("th");
    cell.textContent = title;
    headerRow.append(cell);
  }
  for (const row of rows) {
    const tableRow = table.insertRow();
    for (const content of row) tableRow.insertCell().append(content);
  }
}

/** @param {(number|string)[]} shape */
const formatShape = (shape) => `[${shape.join(", ")}]`;

/**
 * Evaluate a symbolic shape entry ("n", "n * 4", "(s + 1) // 2", "max(a, b)") for given
 * var values. Supports integers, names, + - * / // %, parentheses, min() and max().
 * @param {number|string} expression
 * @param {Record<string, number>} values
 * @returns {number}
 */
function evaluateDimension(expression, values) {
  if (typeof expression === "number") return expression;
  const tokens = expression.match(/\d+|[A-Za-z_][A-Za-z_0-9]*|\/\/|[-+*/%(),]/g) ?? [];
  let position = 0;
  const peek = () => tokens[position];
  const take = () => tokens[position++];
  const expect = (/** @type {string} */ token) => {
    if (take() !== token) throw new Error(`cannot evaluate the dimension '${expression}'`);
  };
  /** @returns {number} */
  const sum = () => {
    let value = product();
    while (peek() === "+" || peek() === "-") value = take() === "+" ? value + product() : value - product();
    return value;
  };
  /** @returns {number} */
  const product = () => {
    let value = unary();
    while (["*", "/", "//", "%"].includes(peek())) {
      const operator = take();
      const right = unary();
      if (operator === "*") value *= right;
      else if (operator === "%") value = ((value % right) + right) % right;
      else value = Math.floor(value / right);
    }
    return value;
  };
  /** @returns {number} */
  const unary = () => (peek() === "-" ? (take(), -unary()) : atom());
  /** @returns {number} */
  const atom = () => {
    const token = take();
    if (token === "(") {
      const value = sum();
      expect(")");
      return value;
    }
    if (/^\d+$/.test(token)) return Number(token);
    if (token === "min" || token === "max") {
      expect("(");
      const args = [sum()];
      while (peek() === ",") args.push((take(), sum()));
      expect(")");
      return Math[token](...args);
    }
    if (token in values) return values[token];
    throw new Error(`cannot evaluate the dimension '${expression}': unknown name '${token}'`);
  };
  const value = sum();
  if (position !== tokens.length) throw new Error(`cannot evaluate the dimension '${expression}'`);
  return value;
}

/**
 * Random data of a dtype: floats in [-1, 1), integers in [0, 10) (a small range, so that
 * token ids and indices stay valid), bools 0/1. float16 is IEEE half bits (a Uint16Array).
 * @param {string} dtype
 * @param {number} length
 */
function randomData(dtype, length) {
  const float = () => Math.random() * 2 - 1;
  const small = () => Math.floor(Math.random() * 10);
  switch (dtype) {
    case "float32": return Float32Array.from({ length }, float);
    case "float64": return Float64Array.from({ length }, float);
    case "float16": return Uint16Array.from({ length }, () => 0x3c00 ^ (Math.random() < 0.5 ? 0x8000 : 0)); // ±1.0
    case "int64": return BigInt64Array.from({ length }, () => BigInt(small()));
    case "int32": return Int32Array.from({ length }, small);
    case "int16": return Int16Array.from({ length }, small);
    case "int8": return Int8Array.from({ length }, small);
    case "uint32": return Uint32Array.from({ length }, small);
    case "uint16": return Uint16Array.from({ length }, small);
    case "uint8": return Uint8Array.from({ length }, small);
    case "bool": return Uint8Array.from({ length }, () => (Math.random() < 0.5 ? 1 : 0));
    default: throw new Error(`the demo cannot make random ${dtype} data`);
  }
}

/**
 * Random inputs for the given values of the symbolic sizes.
 * @param {Model} model
 * @param {Record<string, number>} values
 * @returns {Record<string, Tensor>}
 */
function makeInputs(model, values) {
  /** @type {Record<string, Tensor>} */
  const inputs = {};
  for (const spec of model.inputs) {
    const shape = spec.shape.map((d) => evaluateDimension(d, values));
    inputs[spec.name] = { data: randomData(spec.dtype, shape.reduce((a, b) => a * b, 1)), shape };
  }
  return inputs;
}

/** One loaded bundle: the model and the number fields of its symbolic sizes. */
class Session {
  /**
   * @param {Model} model
   * @param {Record<string, HTMLInputElement>} varFields
   */
  constructor(model, varFields) {
    this.model = model;
    this.varFields = varFields;
  }

  /** @returns {Record<string, number>} the values in the fields */
  values() {
    /** @type {Record<string, number>} */
    const values = {};
    for (const [name, input] of Object.entries(this.varFields)) {
      const value = Number(input.value);
      if (!Number.isInteger(value) || value < 0) throw new Error(`the size ${name} must be a whole number, not '${input.value}'`);
      values[name] = value;
    }
    return values;
  }
}

/**
 * Number fields for the symbolic sizes (id `var-NAME`): default 1, at most the bound.
 * @param {Model} model
 * @returns {Record<string, HTMLInputElement>}
 */
function showVars(model) {
  /** @type {Record<string, HTMLInputElement>} */
  const fields = {};
  const rows = model.symbolicVars.map(({ name, bound }) => {
    const input = document.createElement("input");
    input.type = "number";
    input.id = `var-${name}`;
    input.min = "0";
    input.value = "1";
    if (bound !== null) input.max = String(bound);
    fields[name] = input;
    return [name, bound === null ? "none" : String(bound), input];
  });
  fillTable("vars", ["name", "bound", "value"], rows);
  return fields;
}

/**
 * The inputs and outputs of the model: name, dtype, symbolic shape (with the bounds of the
 * sizes it uses).
 * @param {Model} model
 */
function showSpecs(model) {
  const bounds = Object.fromEntries(model.symbolicVars.map((v) => [v.name, v.bound]));
  /** @param {(number|string)[]} shape */
  const boundsOf = (shape) => {
    const names = new Set(shape.flatMap((d) => (typeof d === "string" ? d.match(/[A-Za-z_][A-Za-z_0-9]*/g) ?? [] : [])));
    return [...names].filter((n) => n in bounds).map((n) => `${n} ≤ ${bounds[n] ?? "∞"}`).join(", ");
  };
  const row = (/** @type {{name: string, dtype: string, shape: (number|string)[]}} */ t) =>
    [t.name, t.dtype, formatShape(t.shape), boundsOf(t.shape)];
  fillTable("inputs", ["name", "dtype", "shape", "bounds"], model.inputs.map(row));
  fillTable("output-specs", ["name", "dtype", "shape", "bounds"], model.outputs.map(row));
}

/**
 * Show the outputs: shape and first values.
 * @param {Record<string, Tensor>} outputs
 */
function showOutputs(outputs) {
  const container = element("outputs");
  container.replaceChildren();
  for (const [name, { data, shape }] of Object.entries(outputs)) {
    const title = document.createElement("div");
    const nameElement = document.createElement("strong");
    const shapeElement = document.createElement("code");
    nameElement.textContent = name;
    shapeElement.textContent = formatShape(shape);
    title.append(nameElement, " shape ", shapeElement);
    const preview = document.createElement("pre");
    const count = Math.min(data.length, PREVIEW_VALUES);
    const format = (/** @type {number|bigint} */ v) => (typeof v === "bigint" ? String(v) : Number(v).toPrecision(5));
    const first = Array.from({ length: count }, (_, i) => format(data[i]));
    preview.textContent = first.join("  ") + (data.length > PREVIEW_VALUES ? "  …" : "") || "(no values)";
    container.append(title, preview);
  }
}

/**
 * Run the model once on random inputs shaped by the chosen sizes.
 * @param {Session} session
 */
async function runOnce(session) {
  const inputs = makeInputs(session.model, session.values());
  const start = performance.now();
  const outputs = await session.model.run(inputs);
  element("time").textContent = `run took ${(performance.now() - start).toFixed(1)} ms`;
  showOutputs(outputs);
}

// Latency sweep ----------------------------------------------------------------------------

/**
 * The default values of a sweep over a size: 1, 2, 4, … up to its bound (and the bound).
 * @param {number|null} bound
 * @returns {number[]}
 */
function defaultSweepValues(bound) {
  const limit = bound ?? DEFAULT_SWEEP_LIMIT;
  const values = [];
  for (let v = 1; v <= limit; v *= 2) values.push(v);
  if (values[values.length - 1] !== limit && limit > 0) values.push(limit);
  return values;
}

/** @param {number[]} values */
function median(values) {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = sorted.length >> 1;
  return sorted.length % 2 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2;
}

/**
 * The sweep controls for a model: one option per symbolic size.
 * @param {Model} model
 */
function showSweepControls(model) {
  const select = /** @type {HTMLSelectElement} */ (element("sweep-var"));
  select.replaceChildren(...model.symbolicVars.map(({ name }) => new Option(name, name)));
  const update = () => {
    const chosen = model.symbolicVars.find((v) => v.name === select.value);
    field("sweep-values").value = chosen ? defaultSweepValues(chosen.bound).join(", ") : "";
  };
  select.onchange = update;
  update();
  element("chart").replaceChildren();
  element("sweep-status").textContent = model.symbolicVars.length ? "" : "this model has no symbolic sizes";
}

/**
 * Run the model at each value of the chosen size (the others as in their fields) and plot the
 * median latency, point by point.
 * @param {Session} session
 */
async function sweep(session) {
  const name = /** @type {HTMLSelectElement} */ (element("sweep-var")).value;
  if (!name) throw new Error("this model has no symbolic size to sweep");
  const values = field("sweep-values").value.split(/[\s,]+/).filter(Boolean).map(Number);
  if (values.length === 0 || values.some((v) => !Number.isInteger(v) || v < 0)) {
    throw new Error("the sweep values must be whole numbers separated by commas");
  }
  const repeats = Math.max(1, Math.floor(Number(field("sweep-repeats").value) || 1));
  /** @type {{x: number, ms: number}[]} */
  const points = [];
  for (const value of values) {
    element("sweep-status").textContent = `${name} = ${value}…`;
    const inputs = makeInputs(session.model, { ...session.values(), [name]: value });
    await session.model.run(inputs); // warm-up: pipelines, buffer growth
    const times = [];
    for (let r = 0; r < repeats; r++) {
      const start = performance.now();
      await session.model.run(inputs);
      times.push(performance.now() - start);
    }
    points.push({ x: value, ms: median(times) });
    drawChart(element("chart"), points, name);
  }
  element("sweep-status").textContent = `done: ${points.length} values, ${repeats} runs each`;
}

const SVG = "http://www.w3.org/2000/svg";

/**
 * An SVG element with attributes (and text).
 * @param {string} tag
 * @param {Record<string, string|number>} attributes
 * @param {string} [text]
 */
function svgElement(tag, attributes, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

/**
 * Plot median latency (ms) against the swept size: an inline SVG with axes, a line and one
 * circle per point (its <title> gives the numbers), replacing the container's content.
 * @param {HTMLElement} container
 * @param {{x: number, ms: number}[]} points
 * @param {string} name the swept size
 */
function drawChart(container, points, name) {
  const width = 560, height = 300, left = 60, right = 20, top = 20, bottom = 45;
  const xs = points.map((p) => p.x), ys = points.map((p) => p.ms);
  const [xMin, xMax] = [Math.min(...xs), Math.max(...xs)];
  const yMax = Math.max(...ys) * 1.1 || 1;
  const sx = (/** @type {number} */ x) => left + (xMax === xMin ? 0.5 : (x - xMin) / (xMax - xMin)) * (width - left - right);
  const sy = (/** @type {number} */ y) => height - bottom - (y / yMax) * (height - top - bottom);
  const svg = svgElement("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": `median latency against ${name}` });
  const axis = { stroke: "#888", "stroke-width": 1 };
  svg.append(
    svgElement("line", { x1: left, y1: height - bottom, x2: width - right, y2: height - bottom, ...axis }),
    svgElement("line", { x1: left, y1: top, x2: left, y2: height - bottom, ...axis }),
    svgElement("text", { x: (left + width - right) / 2, y: height - 8, "text-anchor": "middle", "font-size": 13 }, name),
    svgElement("text", { x: 14, y: (top + height - bottom) / 2, "text-anchor": "middle", "font-size": 13,
      transform: `rotate(-90 14 ${(top + height - bottom) / 2})` }, "median ms"),
  );
  for (const fraction of [0, 0.5, 1]) { // y ticks
    const y = yMax * fraction;
    svg.append(svgElement("text", { x: left - 6, y: sy(y) + 4, "text-anchor": "end", "font-size": 11 }, y.toFixed(y < 10 ? 2 : 0)));
  }
  for (const x of new Set(xs)) { // x ticks at the swept values
    svg.append(svgElement("text", { x: sx(x), y: height - bottom + 16, "text-anchor": "middle", "font-size": 11 }, String(x)));
  }
  const sorted = [...points].sort((a, b) => a.x - b.x);
  svg.append(svgElement("polyline", { points: sorted.map((p) => `${sx(p.x)},${sy(p.ms)}`).join(" "),
    fill: "none", stroke: "#1565c0", "stroke-width": 2 }));
  for (const p of points) {
    const circle = svgElement("circle", { cx: sx(p.x), cy: sy(p.ms), r: 4, fill: "#1565c0", class: "point",
      "data-x": p.x, "data-ms": p.ms.toFixed(3) });
    circle.append(svgElement("title", {}, `${name} = ${p.x}: ${p.ms.toFixed(2)} ms`));
    svg.append(circle);
  }
  container.replaceChildren(svg);
}

// Loading ----------------------------------------------------------------------------------

/** @type {Session|null} the loaded bundle */
let current = null;

/**
 * Load a bundle (replacing the current one) and show it.
 * @param {string} bundleUrl
 */
async function loadBundle(bundleUrl) {
  generation?.abort();
  current?.model.dispose();
  current = null;
  element("generate-section").hidden = element("chat-link").hidden = true;
  for (const id of ["run", "sweep", "load"]) button(id).disabled = true;
  for (const id of ["inputs", "output-specs", "vars", "outputs", "chart"]) element(id).replaceChildren();
  showError("");
  const progress = /** @type {HTMLProgressElement} */ (element("progress"));
  progress.value = 0;
  element("progress-text").textContent = "Loading…";
  let bytes = { loaded: 0, total: 0 };
  try {
    const model = await load(new URL(bundleUrl, location.href), {
      cache: /** @type {HTMLInputElement} */ (element("cache-weights")).checked,
      onProgress: ({ loaded, total }) => {
        bytes = { loaded, total };
        progress.max = Math.max(total, 1);
        progress.value = loaded;
        element("progress-text").textContent = `Loading weights: ${loaded} / ${total} bytes`;
      },
    });
    progress.value = progress.max;
    element("progress-text").textContent = `Loaded: ${bytes.loaded} / ${bytes.total} bytes of weights.`;
    element("device").textContent = backendText(model);
    showSpecs(model);
    current = new Session(model, showVars(model));
    showSweepControls(model);
    showGenerateControls(model);
    button("run").disabled = false;
    button("sweep").disabled = model.symbolicVars.length === 0;
  } catch (error) {
    element("progress-text").textContent = "Loading failed.";
    throw error;
  } finally {
    button("load").disabled = false;
  }
}

/**
 * Show the "Generate text" section when the bundle has a tokenizer and is a decoder.
 * @param {Model} model
 */
function showGenerateControls(model) {
  const generates = whyNoGeneration(model) === "";
  const chatLink = /** @type {HTMLAnchorElement} */ (element("chat-link"));
  chatLink.hidden = !generates;
  chatLink.href = `chat.html?${new URLSearchParams({ bundle: field("bundle-url").value.trim() })}`;
  element("generate-section").hidden = !generates;
  element("generated").textContent = "";
  element("generate-status").textContent = "";
}

/** @type {AbortController|null} the generation in progress, stopped by the Stop button */
let generation = null;

/**
 * Generate text after the prompt, streaming tokens into the page with the tokens/s so far.
 * @param {Session} session
 */
async function generateText(session) {
  const number = (/** @type {string} */ id) => Number(field(id).value);
  const status = element("generate-status");
  const output = element("generated");
  output.textContent = "";
  status.textContent = "prefill…";
  generation = new AbortController();
  button("generate").disabled = true;
  button("stop").disabled = false;
  /** @type {number[]} when each token arrived */
  const arrivals = [];
  try {
    const result = await session.model.generate(field("prompt").value, {
      maxNewTokens: number("max-tokens"), temperature: number("temperature"), topK: number("top-k"), seed: number("seed"),
      signal: generation.signal,
      onToken: (_token, text) => {
        arrivals.push(performance.now());
        output.textContent = text;
        const seconds = (arrivals[arrivals.length - 1] - arrivals[0]) / 1e3;
        const speed = seconds > 0 ? `${((arrivals.length - 1) / seconds).toFixed(1)} tokens/s` : "";
        status.textContent = `${arrivals.length} tokens ${speed}`;
      },
    });
    output.textContent = result.text;
    status.textContent = `${result.tokens.length} tokens, stopped by ${result.stopped}: prefill ` +
      `${result.prefillMs.toFixed(0)} ms, ${result.tokensPerSecond.toFixed(1)} tokens/s`;
  } finally {
    generation = null;
    button("generate").disabled = false;
    button("stop").disabled = true;
  }
}

/**
 * Make a button run `work` on the current session, disabled meanwhile; errors are shown.
 * @param {string} id
 * @param {(session: Session) => Promise<void>} work
 */
function onClick(id, work) {
  button(id).addEventListener("click", async () => {
    const session = current;
    if (!session) return;
    button("run").disabled = button("sweep").disabled = true;
    showError("");
    try {
      await work(session);
    } catch (error) {
      showError(error);
    } finally {
      if (current === session) { // not replaced by a load meanwhile
        button("run").disabled = false;
        button("sweep").disabled = session.model.symbolicVars.length === 0;
      }
    }
  });
}

function main() {
  const urlField = field("bundle-url");
  urlField.value = new URLSearchParams(location.search).get("bundle") ?? "bundle/";
  element("bundle-form").addEventListener("submit", (event) => {
    event.preventDefault();
    loadBundle(urlField.value.trim()).catch(showError);
  });
  onClick("run", runOnce);
  onClick("sweep", sweep);
  onClick("generate", generateText);
  button("stop").addEventListener("click", () => generation?.abort());
  loadBundle(urlField.value).catch(showError);
}

main();
