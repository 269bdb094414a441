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

import { bundleArgs, inputsOf, interleaved, load } from "./node_bundle.mjs";

const { folders, runs } = bundleArgs("node bench/page_thread_deadline.mjs BUNDLE_DIR... [--runs N]");

console.log("| bundle | as written (ms) | rewritten (ms) | rewritten / as written |");
console.log("|---|---:|---:|---:|");
for (const folder of folders) {
  const plain = await load(folder, true);
  const inputs = inputsOf(plain.manifest);
  if (typeof inputs === "string") {
    console.log(`| ${basename(folder)} | skipped: ${inputs} | | |`);
    plain.model.dispose();
    continue;
  }
  const { model: rewritten } = await load(folder, false);
  const { medians: [a, b] } = await interleaved([plain.model, rewritten], inputs, runs);
  console.log(`| ${basename(folder)} | ${a.toFixed(1)} | ${b.toFixed(1)} | ${(b / a).toFixed(2)} |`);
  plain.model.dispose();
  rewritten.dispose();
}
