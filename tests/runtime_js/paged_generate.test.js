// Node tests of continuous batching over a paged KV cache (relaxweb/runtime_js/paged_generate.js
// through generate.js's generate and generateMany), on the wasm backend's path (CpuSampler):
//
// - on a stand-in model (no bundle): a paged "decoder" whose run writes each token into its
//   sequence's pages and whose logits pick the next token from a hash of everything its page
//   table reaches (so a wrong page, position or row changes the tokens), kept pools fed back as
//   views that go stale, as a bundle's do: concurrent calls join steps and give each prompt's
//   tokens alone; the queue, the refusal, aborts (signal, onToken returning false), an onToken
//   that throws, a failed run, and the checks of generateMany's arguments;
// - on the tiny Llama built with --kv-pages (tests/e2e/test_paged_generation.py's bundle, from
//   the model scripts/tiny_llama.py trained into .cache/tiny-llama/) loaded as a WasmModel:
//   8 concurrent generate calls and generateMany give each prompt's tokens alone.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import { Host } from "../../relaxweb/runtime_js/host.js";
import { HostSession } from "../../relaxweb/runtime_js/host_session.js";
import { PageHost } from "../../relaxweb/runtime_js/page_host.js";
import { WasmModel } from "../../relaxweb/runtime_js/wasm_model.js";
import { generate, generateMany, generationStats, schedulerOf } from "../../relaxweb/runtime_js/generate.js";
import { validateManifest } from "../../relaxweb/runtime_js/manifest.js";

const REPO_ROOT = fileURLToPath(new URL("../../", import.meta.url));

// -- a stand-in paged decoder ------------------------------------------------------------------

const VOCAB = 50;
const PAGE_SIZE = 4;

/**
 * The next token after `history` (every token of a sequence so far, in order): a hash of it.
 * @param {number[]} history @returns {number}
 */
function nextToken(history) {
  let hash = 17;
  for (const [position, token] of history.entries()) hash = (Math.imul(hash, 31) + token * (position + 3)) >>> 0;
  return hash % VOCAB;
}

/** Each prompt's tokens generated alone by the stand-in. @param {number[]} prompt @param {number} count */
function alone(prompt, count) {
  const history = [...prompt];
  const tokens = [];
  while (tokens.length < count) {
    const token = nextToken(history);
    tokens.push(token);
    history.push(token);
  }
  return tokens;
}

/**
 * A model with a paged KV cache, as generate.js sees one (a WasmModel's run, kept outputs with
 * deviceData and dispose): `pages` pages of PAGE_SIZE positions, `budget` tokens per run.
 */
class PagedStandIn {
  /** @param {{pages?: number, pagesPerSequence?: number, budget?: number}} [sizes] */
  constructor({ pages = 24, pagesPerSequence = 8, budget = 16 } = {}) {
    this.backend = "wasm";
    this.tokenizer = null;
    this.disposed = false;
    this.manifest = {
      inputs: [
        { name: "input_ids", dtype: "int64", shape: ["batch", "tokens"] },
        { name: "position_ids", dtype: "int64", shape: ["batch", "tokens"] },
        { name: "past_key_values.0.key", dtype: "float32", shape: [pages, 1, PAGE_SIZE, 1] },
        { name: "kv_page_table", dtype: "int32", shape: ["batch", "tokens", pagesPerSequence] },
      ],
      outputs: [
        { name: "logits", dtype: "float32", shape: ["batch", "tokens", VOCAB] },
        { name: "present.0.key", dtype: "float32", shape: [pages, 1, PAGE_SIZE, 1] },
      ],
      symbolic_vars: [{ name: "batch", bound: 1 }, { name: "tokens", bound: budget }],
      kv_pool: { pages, page_size: PAGE_SIZE, pages_per_sequence: pagesPerSequence, capacity: pagesPerSequence * PAGE_SIZE, page_table: 3 },
    };
    this.symbolicVars = this.manifest.symbolic_vars;
    this.pool = new Float32Array(pages * PAGE_SIZE).fill(NaN);
    this.runs = 0;
    /** @type {number[]} the tokens of each run */
    this.runSizes = [];
    /** @type {Error|null} the next run fails with it */
    this.failNext = null;
    /** @type {Error|null} reading the next run's logits fails with it (a sampling failure) */
    this.failLogitsNext = null;
  }

  /** @param {Record<string, any>} feeds @param {{keepOnGpu: string[]}} options */
  async run(feeds, { keepOnGpu }) {
    await new Promise((resolve) => setTimeout(resolve, 1)); // a run takes time: other calls come in meanwhile
    if (this.disposed) throw new Error("the model was disposed");
    assert.deepEqual(keepOnGpu, ["logits", "present.0.key"]);
    const past = feeds["past_key_values.0.key"];
    if (past.view) {
      if (past.run !== this.runs || past.disposed) throw new Error("a view of a KV cache that a later run has written");
    } else {
      assert.equal(past.data.length, this.pool.length);
      this.pool.set(past.data);
    }
    this.runs += 1;
    if (this.failNext) {
      const error = this.failNext;
      this.failNext = null;
      throw error;
    }
    const ids = Array.from(feeds.input_ids.data, Number);
    const positions = Array.from(feeds.position_ids.data, Number);
    const table = feeds.kv_page_table.data;
    const width = feeds.kv_page_table.shape[2];
    assert.deepEqual(feeds.kv_page_table.shape, [1, ids.length, width]);
    assert.ok(ids.length <= this.symbolicVars[1].bound);
    this.runSizes.push(ids.length);
    const slot = (/** @type {number} */ row, /** @type {number} */ position) =>
      table[row * width + Math.floor(position / PAGE_SIZE)] * PAGE_SIZE + (position % PAGE_SIZE);
    ids.forEach((token, row) => { this.pool[slot(row, positions[row])] = token; });
    const logits = new Float32Array(ids.length * VOCAB);
    ids.forEach((_, row) => {
      const history = [...Array(positions[row] + 1).keys()].map((position) => this.pool[slot(row, position)]);
      logits[row * VOCAB + nextToken(history)] = 1;
    });
    const logitsError = this.failLogitsNext;
    this.failLogitsNext = null;
    return {
      logits: { deviceData: () => { if (logitsError) throw logitsError; return logits; }, dispose() {} },
      "present.0.key": { view: true, run: this.runs, disposed: false, dispose() { this.disposed = true; } },
    };
  }
}

const GREEDY = { temperature: 0, stopTokens: [] };
const PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11, 12, 13], [14], [15, 16, 17, 18, 19, 20, 21], [22, 23],
  [24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41], [42, 43, 44, 45], [46, 47, 48, 49, 1, 2]];
const NEW_TOKENS = [9, 3, 12, 6, 1, 10, 7, 4];

test("8 concurrent generate calls join the same steps and give each prompt's tokens alone", async () => {
  const model = new PagedStandIn();
  assert.equal(generationStats(model), null);
  /** @type {number[]} */
  const live = [];
  const generations = await Promise.all(PROMPTS.map((prompt, index) => generate(model, prompt, {
    ...GREEDY, maxNewTokens: NEW_TOKENS[index], onToken: () => { live.push(/** @type {any} */ (generationStats(model)).live); },
  })));
  assert.deepEqual(generations.map((g) => g.tokens), PROMPTS.map((prompt, index) => alone(prompt, NEW_TOKENS[index])));
  assert.ok(generations.every((g) => g.stopped === "length"));
  assert.ok(Math.max(...live) >= 6, `live sequences: ${live}`);
  const stats = /** @type {any} */ (generationStats(model));
  assert.ok(stats.decodeTokensPerSecond > 0 && stats.tokensPerSecond > 0);
  assert.deepEqual({ ...stats, tokensPerSecond: 0, decodeTokensPerSecond: 0, decodeTokens: 0, decodeSeconds: 0 }, {
    live: 0, queued: 0, pagesInUse: 0, pages: 24, pageSize: PAGE_SIZE, positionsLive: 0,
    tokensGenerated: NEW_TOKENS.reduce((a, b) => a + b), steps: model.runSizes.length, tokensPerSecond: 0, decodeTokensPerSecond: 0, decodeTokens: 0, decodeSeconds: 0,
  });
  const promptTokens = PROMPTS.reduce((sum, prompt) => sum + prompt.length, 0);
  assert.equal(model.runSizes.reduce((a, b) => a + b), promptTokens + NEW_TOKENS.reduce((a, b) => a + b) - PROMPTS.length);
  assert.ok(model.runSizes.length < promptTokens / 16 + Math.max(...NEW_TOKENS) + 2, `runs: ${model.runSizes}`);
  // a later call starts a new loop on the same pools
  assert.deepEqual((await generate(model, PROMPTS[1], { ...GREEDY, maxNewTokens: 5 })).tokens, alone(PROMPTS[1], 5));
});

test("generateMany: one generation per prompt, each with its seed and its onTokens callback", async () => {
  const model = new PagedStandIn();
  /** @type {number[][]} */
  const streamed = PROMPTS.map(() => []);
  const generations = await generateMany(model, PROMPTS, {
    ...GREEDY, maxNewTokens: 6, onTokens: streamed.map((tokens) => (/** @type {number} */ token) => { tokens.push(token); }),
  });
  const expected = PROMPTS.map((prompt) => alone(prompt, 6));
  assert.deepEqual(generations.map((g) => g.tokens), expected);
  assert.deepEqual(streamed, expected);
  assert.deepEqual(generations.map((g) => g.text), expected.map((tokens) => String.fromCharCode(...tokens)));
  // sampled: prompt i draws from seed i unless told, as generate with that seed does
  const sampled = { temperature: 0.7, maxNewTokens: 5, stopTokens: [] };
  const many = await generateMany(model, PROMPTS.slice(0, 3), { ...sampled, seeds: [7, null, 9] });
  const each = [];
  for (const [index, seed] of [7, 1, 9].entries()) each.push((await generate(model, PROMPTS[index], { ...sampled, seed })).tokens);
  assert.deepEqual(many.map((g) => g.tokens), each);
  await assert.rejects(generateMany(model, PROMPTS, { seeds: [1, 2] }),
    { message: "8 prompts need as many seeds and onTokens callbacks, got 2 and 8" });
  await assert.rejects(generateMany(model, []), { message: "prompts must be a non-empty list of prompts (texts or lists of token ids)" });
  await assert.rejects(generate(model, Array(33).fill(1)), { message: "the prompt has 33 tokens; this bundle's bounds allow sequences of at most 32" });
});

test("a request whose pages are taken waits for them, or is refused with waitForPages: false", async () => {
  const model = new PagedStandIn({ pages: 8, pagesPerSequence: 4 });
  // 6 prompt tokens and 7 new: 12 positions, 3 pages each; two fit in 8 pages, the third waits
  const prompts = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12], [13, 14, 15, 16, 17, 18]];
  /** @type {number[]} */
  const queued = [];
  const running = generateMany(model, prompts, {
    ...GREEDY, maxNewTokens: 7, onTokens: [() => { queued.push(/** @type {any} */ (generationStats(model)).queued); }, null, null],
  });
  await new Promise((resolve) => setTimeout(resolve, 0));
  assert.equal(/** @type {any} */ (generationStats(model)).queued, 1);
  await assert.rejects(generate(model, [1, 2], { ...GREEDY, maxNewTokens: 2, waitForPages: false }), {
    message: "the KV cache's pages are taken: this sequence needs 1 of 8, 0 are not promised to the 2 live sequences " +
      "and 1 waiting requests (waitForPages: true queues it until they are)",
  });
  const generations = await running;
  assert.deepEqual(generations.map((g) => g.tokens), prompts.map((prompt) => alone(prompt, 7)));
  assert.ok(queued.every((count) => count === 1), `queued: ${queued}`);
  // a call's prompts are all taken or none: the refused one's earlier prompts leave the queue
  await assert.rejects(generateMany(model, prompts, { ...GREEDY, maxNewTokens: 7, waitForPages: false }), /pages are taken: this sequence needs 3 of 8, 2 are not promised to the 0 live sequences and 2 waiting requests/);
  assert.deepEqual({ ...generationStats(model), tokensPerSecond: 0 }, { ...generationStats(model), queued: 0, live: 0, pagesInUse: 0, tokensPerSecond: 0 });
  // with the pool free, a call that fits is admitted whole
  assert.equal((await generateMany(model, prompts.slice(0, 2), { ...GREEDY, maxNewTokens: 7, waitForPages: false })).length, 2);
  // a sequence that could not fit in the whole pool is refused, whatever waitForPages says
  await assert.rejects(generate(new PagedStandIn({ pages: 2, pagesPerSequence: 4 }), [1], { maxNewTokens: 12 }), {
    message: "a sequence of 1 prompt tokens and up to 12 new ones needs 3 pages of 4 positions, but the pool has 2 " +
      "(build with a larger --kv-pages, or ask for fewer tokens)",
  });
});

test("aborting one sequence (its signal, or onToken returning false) frees its pages and leaves the others' tokens", async () => {
  const model = new PagedStandIn();
  const controller = new AbortController();
  let count = 0;
  const others = PROMPTS.slice(2).map((prompt) => generate(model, prompt, { ...GREEDY, maxNewTokens: 10 }));
  const aborted = generate(model, PROMPTS[0], {
    ...GREEDY, maxNewTokens: 10, signal: controller.signal, onToken: () => { if (++count === 3) controller.abort(); },
  });
  const stoppedByCallback = generate(model, PROMPTS[1], { ...GREEDY, maxNewTokens: 10, onToken: (_, text) => text.length < 2 });
  const [first, second, ...rest] = await Promise.all([aborted, stoppedByCallback, ...others]);
  assert.equal(first.stopped, "aborted");
  assert.deepEqual(first.tokens, alone(PROMPTS[0], 3));
  assert.equal(second.stopped, "aborted");
  assert.deepEqual(second.tokens, alone(PROMPTS[1], 2));
  assert.deepEqual(rest.map((g) => g.tokens), PROMPTS.slice(2).map((prompt) => alone(prompt, 10)));
  assert.equal(/** @type {any} */ (generationStats(model)).pagesInUse, 0);
  // aborted while queued, or before it is asked: no tokens, no pages
  const early = new AbortController();
  early.abort();
  assert.deepEqual(await generate(model, PROMPTS[0], { signal: early.signal }), { tokens: [], text: "", stopped: "aborted", tokensPerSecond: 0, prefillMs: 0 });
  const small = new PagedStandIn({ pages: 4, pagesPerSequence: 4 });
  const waiting = new AbortController();
  const holder = generate(small, [1, 2, 3, 4, 5, 6, 7, 8], { ...GREEDY, maxNewTokens: 6 });
  const queued = generate(small, [1, 2], { ...GREEDY, maxNewTokens: 6, signal: waiting.signal });
  await new Promise((resolve) => setTimeout(resolve, 0));
  assert.equal(/** @type {any} */ (generationStats(small)).queued, 1);
  waiting.abort();
  assert.equal((await queued).stopped, "aborted");
  assert.equal(/** @type {any} */ (generationStats(small)).queued, 0);
  assert.deepEqual((await holder).tokens, alone([1, 2, 3, 4, 5, 6, 7, 8], 6));
});

test("an onToken that throws rejects its own generation; a failed run or pick rejects every live one, and later calls run", async () => {
  const model = new PagedStandIn();
  const results = await Promise.allSettled(PROMPTS.slice(0, 3).map((prompt, index) => generate(model, prompt, {
    ...GREEDY, maxNewTokens: 5, onToken: index === 1 ? () => { throw new Error("the callback's own error"); } : undefined,
  })));
  assert.deepEqual(results.map((r) => (r.status === "fulfilled" ? r.value.tokens : r.reason.message)),
    [alone(PROMPTS[0], 5), "the callback's own error", alone(PROMPTS[2], 5)]);
  const failing = Promise.allSettled(PROMPTS.slice(0, 3).map((prompt) => generate(model, prompt, { ...GREEDY, maxNewTokens: 5 })));
  model.failNext = new Error("the run failed");
  assert.deepEqual((await failing).map((r) => r.status === "rejected" && r.reason.message), Array(3).fill("the run failed"));
  assert.equal(/** @type {any} */ (generationStats(model)).pagesInUse, 0);
  // so does a failure to pick the tokens (the run went well): no sequence stays live, holding pages
  const failingPicks = Promise.allSettled(PROMPTS.slice(0, 3).map((prompt) => generate(model, prompt, { ...GREEDY, maxNewTokens: 5 })));
  model.failLogitsNext = new Error("the picks failed");
  assert.deepEqual((await failingPicks).map((r) => r.status === "rejected" && r.reason.message), Array(3).fill("the picks failed"));
  assert.deepEqual([generationStats(model)?.live, generationStats(model)?.pagesInUse], [0, 0]);
  // later calls give the right tokens (the failed run's pools were lost: the next step started from zeros)
  assert.deepEqual((await generate(model, PROMPTS[3], { ...GREEDY, maxNewTokens: 4 })).tokens, alone(PROMPTS[3], 4));
  const disposing = generate(model, PROMPTS[3], { ...GREEDY, maxNewTokens: 4 });
  model.disposed = true;
  await assert.rejects(disposing, { message: "the model was disposed during generate" });
});

// -- the tiny Llama with a paged KV cache, on the wasm backend ---------------------------------------

/** @type {string[]} */
const folders = [];
/** @type {{prompts: number[][], newTokens: number[], alone: number[][]}|null} */
let reference = null;
let llamaFolder = "";
const TINY_LLAMA = join(REPO_ROOT, ".cache", "tiny-llama", "model.onnx");

before(() => {
  if (!existsSync(TINY_LLAMA)) return; // trained by tests/e2e/test_tiny_llama.py (python3 scripts/tiny_llama.py)
  llamaFolder = mkdtempSync(join(tmpdir(), "relaxweb-paged-"));
  folders.push(llamaFolder);
  // the bundle of test_paged_generation.py, and each prompt's tokens alone from the Python runtime (wasm)
  const script = `
import json
import relaxweb
from tests.e2e.test_tiny_llama import BOUNDS
from tests.e2e.test_paged_generation import PAGES, PAGE_SIZE, PROMPT_LENGTHS, NEW_TOKENS
bundle = relaxweb.build(${JSON.stringify(TINY_LLAMA)}, ${JSON.stringify(join(llamaFolder, "bundle"))}, bounds=BOUNDS,
                        kv_pages=PAGES, kv_page_size=PAGE_SIZE)
reference = json.loads(open(${JSON.stringify(join(REPO_ROOT, ".cache", "tiny-llama", "reference.json"))}).read())
ids = [256, *reference["prompt"].encode("utf-8"), *reference["continuation_ids"]]  # tiny_llama.encode
prompts = [ids[(7 * i) % 16:(7 * i) % 16 + n] for i, n in enumerate(PROMPT_LENGTHS)]  # its prompts fixture
new_tokens = list(NEW_TOKENS)
session = relaxweb.load(bundle.path, backend="wasm")
alone = [session.generate(p, max_new_tokens=n, temperature=0, stop_tokens=[]).tokens for p, n in zip(prompts, new_tokens)]
print(json.dumps({"prompts": prompts, "newTokens": new_tokens, "alone": alone}))
`;
  const output = execFileSync("python3", ["-c", script], { cwd: REPO_ROOT, encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] });
  reference = JSON.parse(output.trim().split("\n").at(-1) ?? "null");
});

after(() => {
  for (const folder of folders) rmSync(folder, { recursive: true, force: true });
});

/**
 * A WasmModel of a bundle folder, as load() makes it (the host module in the page: Node has no Worker).
 * @param {string} folder @returns {Promise<WasmModel>}
 */
async function loadWasmModel(folder) {
  const manifest = JSON.parse(readFileSync(join(folder, "manifest.json"), "utf8"));
  validateManifest(manifest);
  const host = new PageHost(new HostSession(await Host.instantiate(readFileSync(join(folder, "host.wasm")), manifest)), 10_000);
  const configured = await host.configure(undefined);
  const shards = manifest.shards.map((/** @type {any} */ s) => new Uint8Array(readFileSync(join(folder, s.file))));
  return WasmModel.create(manifest, host, readFileSync(join(folder, "kernels.wasm")), shards, configured);
}

test("the tiny Llama with a paged KV cache on wasm: concurrent generate calls and generateMany give each prompt's tokens alone",
  { skip: existsSync(TINY_LLAMA) ? false : "no trained tiny Llama in .cache/tiny-llama (python3 scripts/tiny_llama.py)" }, async () => {
    const { prompts, newTokens, alone: expected } = /** @type {any} */ (reference);
    assert.deepEqual(expected.map((/** @type {number[]} */ tokens) => tokens.length), newTokens);
    const model = await loadWasmModel(join(llamaFolder, "bundle"));
    try {
      const together = await Promise.all(prompts.map((/** @type {number[]} */ prompt, /** @type {number} */ index) =>
        model.generate(prompt, { ...GREEDY, maxNewTokens: newTokens[index] })));
      assert.deepEqual(together.map((g) => g.tokens), expected);
      const many = await model.generateMany(prompts, { ...GREEDY, maxNewTokens: 4 });
      assert.deepEqual(many.map((g) => g.tokens), expected.map((/** @type {number[]} */ tokens) => tokens.slice(0, 4)));
      const stats = model.generationStats;
      assert.equal(stats.pagesInUse, 0);
      assert.ok(stats.steps < newTokens.reduce((/** @type {number} */ a, /** @type {number} */ b) => a + b, 0));
    } finally {
      model.dispose();
    }
  });

test("the policy's knobs: a step reads at most prefillChunk prompt tokens; admission takes the shortest prompt first", async () => {
  const model = new PagedStandIn({ pages: 8, pagesPerSequence: 4 });
  await generate(model, [1], { ...GREEDY, maxNewTokens: 1 }); // makes the scheduler
  const scheduler = /** @type {any} */ (schedulerOf(model));
  scheduler.prefillChunk = 2;
  model.runSizes.length = 0;
  assert.deepEqual((await generate(model, [1, 2, 3, 4, 5], { ...GREEDY, maxNewTokens: 2 })).tokens, alone([1, 2, 3, 4, 5], 2));
  assert.deepEqual(model.runSizes, [2, 2, 1, 1]);
  scheduler.prefillChunk = null;
  // two long sequences fill 6 of the 8 pages; the third long one (3 pages) waits, and behind it
  // a short one (2 pages): by arrival it waits behind the third, the shortest first it goes first
  const prompts = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12], [13, 14, 15, 16, 17, 18], [19, 20]];
  for (const [admission, order] of [["arrival", [0, 1, 2, 3]], ["shortest", [3, 0, 1, 2]]]) {
    scheduler.admission = admission;
    /** @type {number[]} */
    const firsts = [];
    const onTokens = prompts.map((_, index) => () => { if (!firsts.includes(index)) firsts.push(index); });
    const generations = await generateMany(model, prompts, { ...GREEDY, maxNewTokens: 7, onTokens });
    assert.deepEqual(generations.map((g) => g.tokens), prompts.map((prompt) => alone(prompt, 7)));
    assert.deepEqual(firsts, order, admission);
  }
});
