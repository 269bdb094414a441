// Two builds of one model side by side (before and after a compiler change): each bundle's
// kernels.wasm in Node's V8 on one thread, as a page that is not cross-origin isolated runs it
// (interruptible kernels), the two loaded in one process and their runs interleaved, so that
// the machine's load moves both alike.
//
// Usage (from the repository root; two bundles of the same model, e.g. `relaxweb build` at two
// commits; relaxed SIMD where the engine compiles it, as the runtime chooses: Node 20 needs
// --experimental-wasm-relaxed-simd):
//
//     node --experimental-wasm-relaxed-simd bench/compare_builds.mjs BEFORE_DIR AFTER_DIR [--runs 7] [--dim height=640 ...]
//
// Inputs as bench/page_thread_deadline.mjs makes them (node_bundle.mjs: an image 224 x 224,
// 128 tokens; `--dim NAME=VALUE` sets a symbolic dim's value). One warm-up run of
// each, then rounds of one timed run of each; prints each one's median, the ratio after /
// before, and the largest difference between their outputs (0 where the change keeps the
// arithmetic).

import { engineHasRelaxedSimd } from "../relaxweb/runtime_js/relaxed_simd.js";
import { DIMS, bundleArgs, inputsOf, interleaved, load } from "./node_bundle.mjs";

for (let at = process.argv.indexOf("--dim"); at >= 0; at = process.argv.indexOf("--dim")) {
  const [name, value] = process.argv.splice(at, 2)[1].split("=");
  Object.assign(DIMS, { [name]: Number(value) });
}
const { folders, runs } = bundleArgs("node [--experimental-wasm-relaxed-simd] bench/compare_builds.mjs BEFORE_DIR AFTER_DIR [--runs N] [--dim NAME=VALUE ...]");
if (folders.length !== 2) {
  console.error("give two bundle folders: the build before and the build after");
  process.exit(2);
}
const relaxed = engineHasRelaxedSimd();
const [before, after] = [await load(folders[0], false, relaxed), await load(folders[1], false, relaxed)];
const inputs = inputsOf(before.manifest);
if (typeof inputs === "string") {
  console.error(`cannot make inputs: ${inputs}`);
  process.exit(2);
}
const { outputs: [first, second], medians: [a, b] } = await interleaved([before.model, after.model], inputs, runs);
let difference = 0;
for (const [name, tensor] of Object.entries(first)) {
  const other = second[name].data;
  tensor.data.forEach((/** @type {number} */ value, /** @type {number} */ i) => {
    difference = Math.max(difference, Math.abs(Number(value) - Number(other[i])));
  });
}
console.log(`before ${a.toFixed(1)} ms, after ${b.toFixed(1)} ms, after / before ${(b / a).toFixed(3)} ` +
  `(medians of ${runs}, ${relaxed ? "relaxed SIMD" : "plain SIMD128"}); max abs difference of the outputs ${difference.toExponential(1)}`);
before.model.dispose();
after.model.dispose();
