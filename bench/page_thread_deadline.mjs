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

import { basename } from "node:path";

import { inputsOf, load, median } from "./node_bundle.mjs";

const args = process.argv.slice(2);
const runsAt = args.indexOf("--runs");
const runs = runsAt >= 0 ? Number(args.splice(runsAt, 2)[1]) : 5;
if (args.length === 0 || !(runs > 0)) {
  console.error("usage: node bench/page_thread_deadline.mjs BUNDLE_DIR... [--runs N]");
  process.exit(2);
}

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
