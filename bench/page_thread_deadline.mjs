// What the deadline costs on a page that is not cross-origin isolated: a bundle's kernels.wasm
// rewritten to spend fuel as it loops (relaxweb/runtime_js/interruptible_kernels.js, what the
// wasm backend runs on the page's thread) against the same bytes as written, in Node (V8, one
// thread, like a plain page), in one process, the two loaded side by side and their runs
// interleaved.
//
// Usage (from the repository root; bundles built by bench/run.py or `relaxweb build`):
//
//     node bench/page_thread_deadline.mjs BUNDLE_DIR... [--runs 5]
//
// Each input's symbolic dims take 1 (batch), 224 (height, width), 128 (sequence) or 0 (past),
// a sum of them the sum;
// int64 inputs hold small token ids (an attention mask ones, token types zeros). One warm-up
// run per model, then rounds of one timed run of each; the table gives each one's median and
// the ratio rewritten / as written. A bundle whose inputs these do not fit is skipped, saying why.

import { readFileSync } from "node:fs";
import { basename, join } from "node:path";

import { Host } from "../relaxweb/runtime_js/host.js";
import { HostSession } from "../relaxweb/runtime_js/host_session.js";
import { RemoteHost } from "../relaxweb/runtime_js/remote_host.js";
import { WasmModel } from "../relaxweb/runtime_js/wasm_model.js";

const args = process.argv.slice(2);
const runsAt = args.indexOf("--runs");
const runs = runsAt >= 0 ? Number(args.splice(runsAt, 2)[1]) : 5;
if (args.length === 0 || !(runs > 0)) {
  console.error("usage: node bench/page_thread_deadline.mjs BUNDLE_DIR... [--runs N]");
  process.exit(2);
}

const DIMS = { batch: 1, batch_size: 1, height: 224, width: 224, sequence: 128, sequence_length: 128, past_sequence_length: 0 };

/**
 * The bundle's model on the wasm backend; `asWritten` loads its kernels.wasm without the
 * rewrite (WebAssembly.compile is given the original bytes: the rewrite's extra import is
 * then simply unused).
 * @param {string} folder @param {boolean} asWritten
 */
async function load(folder, asWritten) {
  const manifest = JSON.parse(readFileSync(join(folder, "manifest.json"), "utf8"));
  const kernels = readFileSync(join(folder, manifest.wasm.file));
  const host = new RemoteHost(null, 60_000, new HostSession(await Host.instantiate(readFileSync(join(folder, "host.wasm")), manifest)));
  const shards = manifest.shards.map((/** @type {any} */ s) => new Uint8Array(readFileSync(join(folder, s.file))));
  const compile = WebAssembly.compile;
  if (asWritten) WebAssembly.compile = () => compile(kernels);
  try {
    return { manifest, model: await WasmModel.create(manifest, host, kernels, shards, await host.configure(undefined)) };
  } finally {
    WebAssembly.compile = compile;
  }
}

/** Inputs for the manifest's inputs, or a string saying why none. @param {any} manifest */
function inputsOf(manifest) {
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

console.log("| bundle | as written (ms) | rewritten (ms) | rewritten / as written |");
console.log("|---|---:|---:|---:|");
for (const folder of args) {
  const plain = await load(folder, true);
  const inputs = inputsOf(plain.manifest);
  if (typeof inputs === "string") {
    console.log(`| ${basename(folder)} | skipped: ${inputs} | | |`);
    plain.model.dispose();
    continue;
  }
  const { model: rewritten } = await load(folder, false);
  const times = { plain: /** @type {number[]} */ ([]), rewritten: /** @type {number[]} */ ([]) };
  await plain.model.run(inputs);
  await rewritten.run(inputs);
  for (let round = 0; round < runs; round++) {
    for (const [name, model] of /** @type {const} */ ([["plain", plain.model], ["rewritten", rewritten]])) {
      const started = performance.now();
      await model.run(inputs);
      times[name].push(performance.now() - started);
    }
  }
  const [a, b] = [median(times.plain), median(times.rewritten)];
  console.log(`| ${basename(folder)} | ${a.toFixed(1)} | ${b.toFixed(1)} | ${(b / a).toFixed(2)} |`);
  plain.model.dispose();
  rewritten.dispose();
}
