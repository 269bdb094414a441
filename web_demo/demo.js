// The web demo: load a bundle, show its inputs and symbolic sizes, run it on random inputs.
// The bundle comes from `bundle/` next to this page; `?bundle=URL` picks another one.

import { load } from "./runtime/relaxweb.js";

const PREVIEW_VALUES = 8;

/** @param {string} id */
const element = (id) => /** @type {HTMLElement} */ (document.getElementById(id));

/** @param {unknown} error */
function showError(error) {
  element("error").textContent = error instanceof Error ? error.message : String(error);
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
 * Random data of a dtype: floats in [-1, 1), integers in [0, 10).
 * @param {string} dtype
 * @param {number} length
 */
function randomData(dtype, length) {
  if (dtype === "float32") return Float32Array.from({ length }, () => Math.random() * 2 - 1);
  if (dtype === "int32") return Int32Array.from({ length }, () => Math.floor(Math.random() * 10));
  if (dtype === "uint32") return Uint32Array.from({ length }, () => Math.floor(Math.random() * 10));
  throw new Error(`the demo cannot make random ${dtype} data`);
}

/**
 * @typedef {import("./runtime/relaxweb.js").Model} Model  (runtime/ is served next to this page)
 */

/**
 * Number inputs for the symbolic vars: default 1, at most the bound.
 * @param {Model} model
 * @returns {Record<string, HTMLInputElement>}
 */
function showVars(model) {
  /** @type {Record<string, HTMLInputElement>} */
  const fields = {};
  const rows = model.symbolicVars.map(({ name, bound }) => {
    const field = document.createElement("input");
    field.type = "number";
    field.id = `var-${name}`;
    field.min = "0";
    field.value = "1";
    if (bound !== null) field.max = String(bound);
    fields[name] = field;
    return [name, bound === null ? "none" : String(bound), field];
  });
  fillTable("vars", ["name", "bound", "value"], rows);
  return fields;
}

/**
 * Show the outputs: shape and first values.
 * @param {Record<string, {data: ArrayLike<number>, shape: number[]}>} outputs
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
    const first = Array.from({ length: count }, (_, i) => Number(data[i]).toPrecision(5));
    preview.textContent = first.join("  ") + (data.length > PREVIEW_VALUES ? "  …" : "");
    container.append(title, preview);
  }
}

/**
 * Run the model once on random inputs shaped by the chosen var values.
 * @param {Model} model
 * @param {Record<string, HTMLInputElement>} varFields
 */
async function runOnce(model, varFields) {
  /** @type {Record<string, number>} */
  const values = {};
  for (const [name, field] of Object.entries(varFields)) values[name] = Number(field.value);
  /** @type {Record<string, {data: Float32Array|Int32Array|Uint32Array, shape: number[]}>} */
  const inputs = {};
  for (const spec of model.inputs) {
    const shape = spec.shape.map((d) => evaluateDimension(d, values));
    inputs[spec.name] = { data: randomData(spec.dtype, shape.reduce((a, b) => a * b, 1)), shape };
  }
  const start = performance.now();
  const outputs = await model.run(inputs);
  element("time").textContent = `run took ${(performance.now() - start).toFixed(1)} ms`;
  showOutputs(outputs);
}

async function main() {
  const bundleUrl = new URLSearchParams(location.search).get("bundle") ?? "bundle/";
  element("bundle-url").textContent = bundleUrl;
  const progress = /** @type {HTMLProgressElement} */ (element("progress"));
  const model = await load(new URL(bundleUrl, location.href), {
    onProgress: ({ loaded, total }) => {
      progress.max = Math.max(total, 1);
      progress.value = loaded;
      element("progress-text").textContent = `Loading weights: ${loaded} / ${total} bytes`;
    },
  });
  progress.value = progress.max;
  element("progress-text").textContent = "Loaded.";
  const adapterInfo = /** @type {any} */ (model.device).adapterInfo;
  if (adapterInfo) element("device").textContent = `· GPU: ${adapterInfo.vendor} ${adapterInfo.architecture}`.trim();

  const spec = (/** @type {{name: string, dtype: string, shape: (number|string)[]}} */ t) =>
    [t.name, t.dtype, formatShape(t.shape)];
  fillTable("inputs", ["name", "dtype", "shape"], model.inputs.map(spec));
  fillTable("output-specs", ["name", "dtype", "shape"], model.outputs.map(spec));
  const varFields = showVars(model);

  const button = /** @type {HTMLButtonElement} */ (element("run"));
  button.disabled = false;
  button.addEventListener("click", async () => {
    button.disabled = true;
    showError("");
    try {
      await runOnce(model, varFields);
    } catch (error) {
      showError(error);
    } finally {
      button.disabled = false;
    }
  });
}

main().catch((error) => {
  element("progress-text").textContent = "Loading failed.";
  showError(error);
});
