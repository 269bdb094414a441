// What relaxed SIMD gives on whole models: a bundle's kernels.wasm with its multiply-adds fused
// (relaxweb/cpu/relaxed_simd.py) against the same lowered to plain SIMD128, in Node's V8 on one
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
import { bundleArgs, inputsOf, interleaved, load } from "./node_bundle.mjs";

const { folders, runs } = bundleArgs("node --experimental-wasm-relaxed-simd bench/relaxed_simd.mjs BUNDLE_DIR... [--runs N]");
if (!engineHasRelaxedSimd()) {
  console.error("this Node does not compile relaxed SIMD: run it with --experimental-wasm-relaxed-simd (Node 20)");
  process.exit(2);
}

console.log("| bundle | plain SIMD128 (ms) | relaxed SIMD (ms) | relaxed / plain | max abs difference of the outputs |");
console.log("|---|---:|---:|---:|---:|");
for (const folder of folders) {
  const plain = await load(folder, false);
  const inputs = inputsOf(plain.manifest);
  if (typeof inputs === "string" || !plain.manifest.wasm.relaxed_madd_sites) {
    console.log(`| ${basename(folder)} | skipped: ${typeof inputs === "string" ? inputs : "no relaxed multiply-adds"} | | | |`);
    plain.model.dispose();
    continue;
  }
  const { model: relaxed } = await load(folder, false, true);
  const { outputs: [plainOutputs, relaxedOutputs], medians: [a, b] } = await interleaved([plain.model, relaxed], inputs, runs);
  let difference = 0;
  for (const [name, tensor] of Object.entries(plainOutputs)) {
    const other = relaxedOutputs[name].data;
    tensor.data.forEach((/** @type {number} */ value, /** @type {number} */ i) => { difference = Math.max(difference, Math.abs(value - other[i])); });
  }
  console.log(`| ${basename(folder)} | ${a.toFixed(1)} | ${b.toFixed(1)} | ${(b / a).toFixed(2)} | ${difference.toExponential(1)} |`);
  plain.model.dispose();
  relaxed.dispose();
}
