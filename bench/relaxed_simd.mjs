// What relaxed SIMD gives on whole models: a bundle's kernels-relaxed.wasm (fused
// multiply-adds, relaxweb/cpu/relaxed_simd.py) against its kernels.wasm, in Node's V8 on one
// thread as a page that is not cross-origin isolated runs them (both rewritten to be
// interruptible), in one process, the two loaded side by side and their runs interleaved.
//
// Usage (from the repository root; bundles built by bench/run.py or `relaxweb build`; Node 20
// compiles relaxed SIMD only behind its flag, Chromium and Node 22 without one):
//
//     node --experimental-wasm-relaxed-simd bench/relaxed_simd.mjs BUNDLE_DIR... [--runs 5]
//
// Inputs as bench/page_thread_deadline.mjs makes them (node_bundle.mjs). One warm-up run per
// model, then rounds of one timed run of each; the table gives each one's median, the ratio
// relaxed / plain, and the largest difference between their outputs.

import { basename } from "node:path";

import { engineHasRelaxedSimd } from "../relaxweb/runtime_js/relaxed_simd.js";
import { inputsOf, load, median } from "./node_bundle.mjs";

const args = process.argv.slice(2);
const runsAt = args.indexOf("--runs");
const runs = runsAt >= 0 ? Number(args.splice(runsAt, 2)[1]) : 5;
if (args.length === 0 || !(runs > 0)) {
  console.error("usage: node --experimental-wasm-relaxed-simd bench/relaxed_simd.mjs BUNDLE_DIR... [--runs N]");
  process.exit(2);
}
if (!engineHasRelaxedSimd()) {
  console.error("this Node does not compile relaxed SIMD: run it with --experimental-wasm-relaxed-simd (Node 20)");
  process.exit(2);
}

console.log("| bundle | kernels.wasm (ms) | kernels-relaxed.wasm (ms) | relaxed / plain | max abs difference of the outputs |");
console.log("|---|---:|---:|---:|---:|");
for (const folder of args) {
  const plain = await load(folder, false);
  const inputs = inputsOf(plain.manifest);
  const relaxedFile = plain.manifest.wasm.relaxed_file;
  if (typeof inputs === "string" || !relaxedFile) {
    console.log(`| ${basename(folder)} | skipped: ${typeof inputs === "string" ? inputs : "no kernels-relaxed.wasm"} | | | |`);
    plain.model.dispose();
    continue;
  }
  const { model: relaxed } = await load(folder, false, relaxedFile);
  const models = /** @type {const} */ ([["plain", plain.model], ["relaxed", relaxed]]);
  const times = { plain: /** @type {number[]} */ ([]), relaxed: /** @type {number[]} */ ([]) };
  /** @type {Record<string, any>} */
  const outputs = {};
  for (const [name, model] of models) outputs[name] = await model.run(inputs);
  for (let round = 0; round < runs; round++) {
    for (const [name, model] of models) {
      const started = performance.now();
      await model.run(inputs);
      times[name].push(performance.now() - started);
    }
  }
  let difference = 0;
  for (const [name, tensor] of Object.entries(outputs.plain)) {
    const other = outputs.relaxed[name].data;
    tensor.data.forEach((/** @type {number} */ value, /** @type {number} */ i) => { difference = Math.max(difference, Math.abs(value - other[i])); });
  }
  const [a, b] = [median(times.plain), median(times.relaxed)];
  console.log(`| ${basename(folder)} | ${a.toFixed(1)} | ${b.toFixed(1)} | ${(b / a).toFixed(2)} | ${difference.toExponential(1)} |`);
  plain.model.dispose();
  relaxed.dispose();
}
