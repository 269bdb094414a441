// What the Node benchmarks of the wasm backend share (page_thread_deadline.mjs,
// relaxed_simd.mjs): a bundle's model loaded on the wasm backend as a page that is not
// cross-origin isolated loads it (one thread, kernels rewritten to be interruptible), inputs
// for its symbolic dims, the command line, and the interleaved timed runs.

import { readFileSync } from "node:fs";
import { join } from "node:path";

import { lowerRelaxedSimd } from "../relaxweb/runtime_js/relaxed_simd.js";
import { PageHost } from "../relaxweb/runtime_js/page_host.js";
import { WasmModel } from "../relaxweb/runtime_js/wasm_model.js";

/** Each symbolic dim's value: 1 (batch), 224 (height, width), 128 (sequence) or 0 (past); a sum of them the sum. */
export const DIMS = { batch: 1, batch_size: 1, height: 224, width: 224, sequence: 128, sequence_length: 128, past_sequence_length: 0 };

/**
 * The bundle's model on the wasm backend; `asWritten` loads its kernels.wasm without the
 * rewrite (WebAssembly.compile is given the original bytes, lowered to plain SIMD128 unless
 * `relaxedSimd`: the rewrite's extra import is then simply unused); `relaxedSimd`: whether its
 * multiply-adds run with relaxed SIMD (default not).
 * @param {string} folder @param {boolean} asWritten @param {boolean} [relaxedSimd]
 */
export async function load(folder, asWritten, relaxedSimd = false) {
  const manifest = JSON.parse(readFileSync(join(folder, "manifest.json"), "utf8"));
  const sites = manifest.wasm.relaxed_madd_sites;
  const bytes = readFileSync(join(folder, manifest.wasm.file));
  // what WebAssembly.compile gets as written; the model is given the file's bytes (it lowers them itself)
  const kernels = sites && !relaxedSimd ? lowerRelaxedSimd(bytes, sites) : bytes;
  const host = await PageHost.instantiate(readFileSync(join(folder, "host.wasm")), manifest, 60_000);
  const shards = manifest.shards.map((/** @type {any} */ s) => new Uint8Array(readFileSync(join(folder, s.file))));
  const compile = WebAssembly.compile;
  if (asWritten) WebAssembly.compile = () => compile(kernels);
  try {
    return { manifest, model: await WasmModel.create(manifest, host, bytes, shards, { ...(await host.configure(undefined)), relaxedSimd }) };
  } finally {
    WebAssembly.compile = compile;
  }
}

/** Inputs for the manifest's inputs, or a string saying why none. @param {any} manifest */
export function inputsOf(manifest) {
  /** @type {Record<string, any>} */
  const inputs = {};
  for (const spec of manifest.inputs) {
    const dim = (/** @type {any} */ d) => (typeof d === "number" ? d
      : d.split(" + ").reduce((/** @type {any} */ sum, /** @type {string} */ part) => sum + DIMS[part], 0)); // "past + sequence"
    const shape = spec.shape.map(dim);
    if (shape.some((/** @type {any} */ d) => Number.isNaN(d) || d === undefined)) return `input ${spec.name} has dims ${JSON.stringify(spec.shape)}`;
    const count = shape.reduce((a, b) => a * b, 1);
    const value = (/** @type {number} */ i) => (spec.name === "attention_mask" ? 1 : spec.name === "token_type_ids" ? 0 : (i * 7) % 100);
    const data = spec.dtype.startsWith("int") ? Int32Array.from({ length: count }, (_, i) => value(i))
      : Float32Array.from({ length: count }, (_, i) => Math.sin(i));
    inputs[spec.name] = { data, shape };
  }
  return inputs;
}

const median = (/** @type {number[]} */ times) => [...times].sort((a, b) => a - b)[times.length >> 1];

/**
 * The bundle folders and `--runs N` (default 5) of a script's command line; exits with `usage`
 * when there are none.
 * @param {string} usage @returns {{folders: string[], runs: number}}
 */
export function bundleArgs(usage) {
  const folders = process.argv.slice(2);
  const runsAt = folders.indexOf("--runs");
  const runs = runsAt >= 0 ? Number(folders.splice(runsAt, 2)[1]) : 5;
  if (folders.length === 0 || !(runs > 0)) {
    console.error(`usage: ${usage}`);
    process.exit(2);
  }
  return { folders, runs };
}

/**
 * Each model run once on `inputs` (its outputs kept: a warm-up), then `runs` rounds of one
 * timed run of each in turn; each model's outputs and median ms, in order.
 * @param {any[]} models @param {any} inputs @param {number} runs
 * @returns {Promise<{outputs: any[], medians: number[]}>}
 */
export async function interleaved(models, inputs, runs) {
  const outputs = [];
  for (const model of models) outputs.push(await model.run(inputs));
  const times = models.map(() => /** @type {number[]} */ ([]));
  for (let round = 0; round < runs; round++) {
    for (const [i, model] of models.entries()) {
      const started = performance.now();
      await model.run(inputs);
      times[i].push(performance.now() - started);
    }
  }
  return { outputs, medians: times.map(median) };
}
