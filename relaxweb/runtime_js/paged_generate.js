// Many generations at once on one model: continuous batching over a paged KV cache (the twin of
// relaxweb/runtime/paged_generate.py).
//
// A bundle built with `--kv-pages` (the manifest's `kv_pool`) holds each layer's keys and values
// in a pool of pages that every sequence shares. A run takes the new tokens of every live
// sequence packed into `input_ids [1, T]`, each with its position (`position_ids`) and its
// sequence's page table (`kv_page_table [1, T, M]`), and gives each token's logits. So one run
// advances all sequences: each decoding one takes one token; one still reading its prompt takes
// a chunk of it (the prompt is cut into chunks that fill the run's token budget, the bound of
// `input_ids`' second dimension, after the decoding tokens).
//
// PagedScheduler (one per model) keeps the state:
//
// - pages: each sequence owns a list of pages, taken from the free list as it grows and given
//   back when it ends; a request is admitted only when the pages it could need at worst
//   (ceil(min(prompt + maxNewTokens - 1, capacity) / pageSize)) are not promised to the live
//   sequences, so a live sequence never runs out;
// - the queue: requests wait there, in arrival order, until their pages are free (or are
//   refused at once with `waitForPages: false`);
// - steps: `step()` admits what fits, runs the model once over the packed tokens, picks each
//   sequence's next token with its own sampler (on WebGPU all picks of a step are one submit
//   and one map), and retires the sequences that stop (a stop token, maxNewTokens, the
//   capacity, `onToken` returning false or its AbortSignal aborting: "aborted").
//
// JavaScript has one thread: `drive()` starts one async loop that runs steps while a sequence
// is live or queued, so concurrent `generate` calls on a model join the same steps; each call
// awaits its own requests' `finished` promise, which settles when its sequence ends (a failed
// step ends every live sequence with the step's error). `onToken` callbacks run inside the step.
//
// The policy is greedy (advance every live sequence every step, admit by arrival while pages
// last, decode tokens before prompt chunks); `planStep` is where another policy plugs in
// (docs/design.md, "Continuous batching").

import { TYPED_ARRAY_OF_DTYPE } from "./host.js";

/** The page table input's name (passes/page_kv_caches.py's PAGE_TABLE_INPUT). */
export const PAGE_TABLE = "kv_page_table";
/** How generate rejects when its model is disposed before it settles. */
export const DISPOSED_DURING_GENERATE = "the model was disposed during generate";
/** A step's tokens when the bundle does not bound `input_ids`' second dimension (paged_generate.py's). */
const DEFAULT_BUDGET = 64;

/**
 * What the scheduler holds now: `live` sequences, `queued` requests, `pagesInUse` of `pages`
 * (of `pageSize` positions each) against the positions the live sequences hold
 * (`positionsLive`), and the tokens made (`tokensGenerated`) per second of the `steps` so far.
 * @typedef {{live: number, queued: number, pagesInUse: number, pages: number, pageSize: number,
 *   positionsLive: number, tokensGenerated: number, steps: number, tokensPerSecond: number,
 *   decodeTokens: number, decodeSeconds: number, decodeTokensPerSecond: number}} SchedulerStats
 * @typedef {{temperature: number, topK: number, topP: number, repetitionPenalty: number}} Sampling
 * @typedef {{close(): void}} Sampler  a request's token sampler (generate.js's SAMPLERS)
 * @typedef {[Request, number[]]} PlannedFeed  a sequence and its tokens in the next run
 */

/** The manifest's `kv_pool`: pages per pool, positions per page, a page table's entries, the longest sequence. */
export class PoolLayout {
  /** @param {{pages: number, page_size: number, pages_per_sequence: number, capacity: number}} entry */
  constructor(entry) {
    this.pages = entry.pages;
    this.pageSize = entry.page_size;
    this.pagesPerSequence = entry.pages_per_sequence;
    this.capacity = entry.capacity;
  }

  /** The pages that hold `positions` positions. @param {number} positions @returns {number} */
  pagesFor(positions) {
    return Math.ceil(positions / this.pageSize);
  }
}

/**
 * The bundle's paged KV cache layout, null when its caches are not paged.
 * @param {any} manifest @returns {PoolLayout|null}
 */
export function poolLayout(manifest) {
  return manifest.kv_pool ? new PoolLayout(manifest.kv_pool) : null;
}

/** One generation: what was asked, and its state as the scheduler advances it. */
export class Request {
  /**
   * @param {{prompt: number[], maxNewTokens: number, sampling: Sampling, uniform: () => number, stops: Set<number>,
   *   onToken?: ((token: number, textSoFar: string) => unknown)|null, stream: {push(token: number): string, finish(): string},
   *   signal?: AbortSignal|null}} asked
   */
  constructor({ prompt, maxNewTokens, sampling, uniform, stops, onToken = null, stream, signal = null }) {
    this.prompt = prompt;
    this.maxNewTokens = maxNewTokens;
    this.sampling = sampling;
    this.uniform = uniform;
    this.stops = stops;
    this.onToken = onToken;
    this.stream = stream;
    this.signal = signal;
    /** @type {Sampler|null} made at its first pick */
    this.sampler = null;
    /** @type {number[]} its pages, in the order of its positions */
    this.pages = [];
    /** The pages admitting it promised it (its worst case). */
    this.reserved = 0;
    /** Positions written into its pages. */
    this.cached = 0;
    /** @type {number[]} */
    this.tokens = [];
    this.text = "";
    /** @type {"eos"|"length"|"aborted"|null} */
    this.stopped = null;
    /** @type {unknown} the error that ended it (its onToken's, or the failed step's) */
    this.error = null;
    this.failed = false;
    this.submittedAt = 0;
    this.firstTokenAt = 0;
    this.finishedAt = 0;
    /** @type {() => void} */
    this.settle = () => {};
    /** Resolves when it has ended, however (`stopped` or `error` says how). @type {Promise<void>} */
    this.finished = new Promise((resolve) => { this.settle = resolve; });
    /** @type {(() => void)|null} its signal's listener, while it is queued or live */
    this.abortListener = null;
  }

  get done() {
    return this.stopped !== null || this.failed;
  }

  get prefilled() {
    return this.cached >= this.prompt.length;
  }

  /** The tokens not yet in its cache: the rest of its prompt, else its last token. @returns {number[]} */
  nextFeed() {
    return this.prefilled ? this.tokens.slice(-1) : this.prompt.slice(this.cached);
  }
}

/**
 * An integer tensor of `dtype` holding `values`.
 * @param {string} dtype @param {number[]} values @param {number[]} shape
 */
function integerTensor(dtype, values, shape) {
  const data = dtype === "int64" ? BigInt64Array.from(values, BigInt) : /** @type {any} */ (TYPED_ARRAY_OF_DTYPE)[dtype].from(values);
  return { data, shape };
}

/** The pages, live sequences and queue of one model's paged KV cache (see the module doc). */
export class PagedScheduler {
  /**
   * @param {any} model the Model or WasmModel
   * @param {PoolLayout} layout
   * @param {{cache: [string, string][]}} signature the decoder signature (generate.js): (past, present) pairs
   * @param {(request: Request) => Promise<Sampler>} makeSampler a request's sampler, made at its first pick
   * @param {(logits: any, picks: [Sampler, number, number][]) => Promise<number[]>} sampleBatch each pick's token
   *   (sampler, row of the logits, uniform), all in one go
   */
  constructor(model, layout, signature, makeSampler, sampleBatch) {
    this.model = model;
    this.layout = layout;
    this.signature = signature;
    this.makeSampler = makeSampler;
    this.sampleBatch = sampleBatch;
    /** @type {Record<string, any>} */
    const inputs = Object.fromEntries(model.manifest.inputs.map((/** @type {any} */ entry) => [entry.name, entry]));
    this.inputs = inputs;
    // the token budget of a step: the bound in effect of input_ids' second dimension
    const tokensDim = inputs.input_ids.shape[1];
    const bound = typeof tokensDim === "number" ? tokensDim
      : model.symbolicVars.find((/** @type {any} */ v) => v.name === tokensDim)?.bound;
    this.budget = bound || DEFAULT_BUDGET;
    // the policy's knobs, as paged_generate.py's: the prompt tokens a step reads at most (null:
    // the budget left after the decoding tokens), and the order queued requests are admitted in
    // ("arrival", or "shortest" prompt first)
    /** @type {number | null} */
    this.prefillChunk = null;
    /** @type {"arrival" | "shortest"} */
    this.admission = "arrival";
    /** @type {number[]} */
    this.freePages = [...Array(layout.pages).keys()];
    this.reserved = 0;
    /** @type {Request[]} */
    this.live = [];
    /** @type {Request[]} */
    this.queue = [];
    /** @type {Record<string, any>|null} the presents the last step kept (views of the pools) */
    this.pools = null;
    /** @type {Promise<void>|null} the loop of steps, while it runs */
    this.driving = null;
    this.stepping = false;
    this.steps = 0;
    this.tokensGenerated = 0;
    this.busyMs = 0;
    this.decodeTokens = 0; // tokens made, and the time taken, by the steps that read no prompt chunk
    this.decodeMs = 0;
  }

  // -- requests -------------------------------------------------------------------------

  /**
   * Queue `request` (admitted at the next step its pages allow); with `waitForPages` false, an
   * Error now when it could not be admitted at once. A request whose signal has already aborted
   * ends at once ("aborted"). Call `drive()` after submitting.
   * @param {Request} request @param {boolean} [waitForPages] @returns {Request}
   */
  submit(request, waitForPages = true) {
    const { layout } = this;
    const need = layout.pagesFor(Math.min(request.prompt.length + request.maxNewTokens - 1, layout.capacity));
    if (need > layout.pages) {
      throw new Error(`a sequence of ${request.prompt.length} prompt tokens and up to ${request.maxNewTokens} new ones ` +
        `needs ${need} pages of ${layout.pageSize} positions, but the pool has ${layout.pages} (build with a larger ` +
        "--kv-pages, or ask for fewer tokens)");
    }
    request.reserved = need;
    request.submittedAt = performance.now();
    if (request.signal?.aborted) {
      request.stopped = "aborted";
      this.finish(request);
      return request;
    }
    // admitted at the next step only if every request ahead of it fits too (admission is in order)
    const promised = this.reserved + this.queue.reduce((sum, queued) => sum + queued.reserved, 0);
    if (!waitForPages && promised + need > layout.pages) {
      throw new Error(`the KV cache's pages are taken: this sequence needs ${need} of ${layout.pages}, ` +
        `${Math.max(layout.pages - promised, 0)} are not promised to the ${this.live.length} live sequences and ` +
        `${this.queue.length} waiting requests (waitForPages: true queues it until they are)`);
    }
    if (request.signal) {
      request.abortListener = () => this.abort(request);
      request.signal.addEventListener("abort", request.abortListener, { once: true });
    }
    this.queue.push(request);
    return request;
  }

  /**
   * Take requests not yet admitted out of the queue (a call whose later request was refused).
   * @param {Request[]} requests
   */
  cancel(requests) {
    for (const request of requests) {
      const index = this.queue.indexOf(request);
      if (index < 0) continue;
      this.queue.splice(index, 1);
      request.stopped = "aborted";
      this.finish(request);
    }
  }

  /**
   * A request's signal aborted: out of the queue at once, out of the live set at once between
   * steps, else at the end of the step that runs now (its tokens are in that run).
   * @param {Request} request
   */
  abort(request) {
    if (request.done) return;
    const queued = this.queue.indexOf(request);
    if (queued >= 0) {
      this.queue.splice(queued, 1);
      request.stopped = "aborted";
      this.finish(request);
    } else if (!this.stepping && this.live.includes(request)) {
      request.stopped = "aborted";
      this.retire(request);
    }
  }

  /**
   * The loop of steps, started unless it runs: steps while a sequence is live or queued. Its
   * first step waits for a microtask, so that the requests submitted in the same synchronous
   * turn (calls made together) join it. It never rejects: a step's error ends the sequences it ran.
   * @returns {Promise<void>}
   */
  drive() {
    this.driving ??= this.loop();
    return this.driving;
  }

  /** @returns {Promise<void>} */
  async loop() {
    try {
      await Promise.resolve();
      while (this.live.length > 0 || this.queue.length > 0) {
        try {
          await this.step();
        } catch {
          // the step's error ended every sequence it ran (failAll); the queued ones go on
        }
      }
    } finally {
      this.driving = null; // before any later submit can see it: no turn between the loop's end and this
    }
  }

  /**
   * Resolve when every request has ended, running the loop of steps meanwhile.
   * @param {Request[]} requests @returns {Promise<void>}
   */
  async wait(requests) {
    this.drive();
    await Promise.all(requests.map((request) => request.finished));
  }

  /** @returns {SchedulerStats} */
  stats() {
    const { layout } = this;
    return {
      live: this.live.length,
      queued: this.queue.length,
      pagesInUse: layout.pages - this.freePages.length,
      pages: layout.pages,
      pageSize: layout.pageSize,
      positionsLive: this.live.reduce((sum, request) => sum + request.cached, 0),
      tokensGenerated: this.tokensGenerated,
      steps: this.steps,
      tokensPerSecond: this.busyMs > 0 ? this.tokensGenerated / (this.busyMs / 1e3) : 0,
      decodeTokens: this.decodeTokens,
      decodeSeconds: this.decodeMs / 1e3,
      decodeTokensPerSecond: this.decodeMs > 0 ? this.decodeTokens / (this.decodeMs / 1e3) : 0,
    };
  }

  // -- one step -------------------------------------------------------------------------

  /**
   * Move queued requests to the live set while their pages are free: in arrival order (`admission`
   * "arrival"), or the shortest prompt first ("shortest").
   */
  admit() {
    while (this.queue.length > 0) {
      const request = this.admission === "arrival" ? this.queue[0]
        : this.queue.reduce((shortest, queued) => (queued.prompt.length < shortest.prompt.length ? queued : shortest));
      if (this.reserved + request.reserved > this.layout.pages) return;
      this.queue.splice(this.queue.indexOf(request), 1);
      this.reserved += request.reserved;
      this.live.push(request);
    }
  }

  /**
   * The tokens of the next run, per sequence: one for each decoding sequence, then chunks of the
   * prompts still being read, within the token budget (the greedy policy).
   * @returns {PlannedFeed[]}
   */
  planStep() {
    /** @type {PlannedFeed[]} */
    const plan = [];
    let budget = this.budget;
    for (const request of this.live) {
      if (request.prefilled && budget > 0) {
        plan.push([request, request.nextFeed()]);
        budget -= 1;
      }
    }
    budget = Math.min(budget, this.prefillChunk ?? budget); // the prompt tokens this step reads at most
    for (const request of this.live) {
      if (!request.prefilled && budget > 0) {
        const chunk = request.nextFeed().slice(0, budget);
        plan.push([request, chunk]);
        budget -= chunk.length;
      }
    }
    return plan;
  }

  /**
   * Admit, run the model once over every live sequence's next tokens, pick and deliver. Any
   * error of the run or of the picks ends every live sequence with it (and rejects).
   * @returns {Promise<void>}
   */
  async step() {
    this.admit();
    if (this.live.length === 0) return;
    const started = performance.now();
    this.stepping = true;
    /** @type {any} */
    let logits = null;
    /** @type {PlannedFeed[]} */
    let plan = [];
    const made = this.tokensGenerated;
    try {
      plan = this.planStep();
      const decoding = plan.every(([request, tokens]) => tokens.length === 1 && request.prefilled);
      logits = await this.run(plan);
      this.steps += 1;
      await this.deliver(plan, logits);
      if (decoding) {
        this.decodeTokens += this.tokensGenerated - made;
        this.decodeMs += performance.now() - started;
      }
    } catch (error) {
      // a dispose() during the step fails it with whatever the device says: say what happened instead
      this.failAll(this.model.disposed ? new Error(DISPOSED_DURING_GENERATE) : error);
      throw error;
    } finally {
      logits?.dispose();
      this.stepping = false;
      this.busyMs += performance.now() - started;
    }
  }

  /**
   * One run of the model over the plan's tokens, the pools kept for the next step.
   * @param {PlannedFeed[]} plan @returns {Promise<any>} the logits, kept
   */
  async run(plan) {
    const { layout, inputs } = this;
    /** @type {number[]} */
    const ids = [];
    /** @type {number[]} */
    const positions = [];
    /** @type {number[][]} */
    const tables = [];
    for (const [request, tokens] of plan) {
      tokens.forEach((token, offset) => {
        const position = request.cached + offset;
        while (request.pages.length <= Math.floor(position / layout.pageSize)) {
          request.pages.push(/** @type {number} */ (this.freePages.pop()));
        }
        ids.push(token);
        positions.push(position);
        tables.push(request.pages.slice());
      });
    }
    const width = layout.pagesPerSequence;
    const table = new Int32Array(ids.length * width); // a sequence's pages, then 0s
    tables.forEach((pages, row) => table.set(pages, row * width));
    /** @type {Record<string, any>} */
    const feeds = {
      input_ids: integerTensor(inputs.input_ids.dtype, ids, [1, ids.length]),
      position_ids: integerTensor(inputs.position_ids.dtype, positions, [1, ids.length]),
      [PAGE_TABLE]: { data: table, shape: [1, ids.length, width] },
    };
    for (const [past, present] of this.signature.cache) feeds[past] = this.pools?.[present] ?? this.emptyPool(past);
    const keepOnGpu = ["logits", ...this.signature.cache.map(([, present]) => present)];
    const previous = this.pools;
    /** @type {Record<string, any>} */
    let outputs;
    try {
      outputs = await this.model.run(feeds, { keepOnGpu });
    } catch (error) {
      this.pools = null; // the pools' contents are lost with the views: the live sequences fail
      for (const tensor of Object.values(previous ?? {})) tensor.dispose();
      throw error;
    }
    this.pools = Object.fromEntries(this.signature.cache.map(([, present]) => [present, outputs[present]]));
    for (const tensor of Object.values(previous ?? {})) tensor.dispose();
    for (const [request, tokens] of plan) request.cached += tokens.length;
    return outputs.logits;
  }

  /**
   * A pool of zeros, the past of the first step (its shape is constant: [pages, heads, pageSize, head]).
   * @param {string} past @returns {{data: any, shape: number[]}}
   */
  emptyPool(past) {
    const { dtype, shape } = this.inputs[past];
    const size = shape.reduce((/** @type {number} */ a, /** @type {number} */ b) => a * b, 1);
    return { data: new (/** @type {any} */ (TYPED_ARRAY_OF_DTYPE)[dtype])(size), shape: [...shape] };
  }

  /**
   * Pick the next token of each sequence whose prompt is read, and retire those that stop (those
   * whose signal aborted during the step too).
   * @param {PlannedFeed[]} plan @param {any} logits
   */
  async deliver(plan, logits) {
    /** @type {[Request, number][]} */
    const picks = [];
    let row = 0;
    for (const [request, tokens] of plan) {
      row += tokens.length;
      if (request.prefilled) picks.push([request, row - 1]);
    }
    await Promise.all(picks.map(async ([request]) => { request.sampler ??= await this.makeSampler(request); }));
    const tokens = await this.sampleBatch(logits, picks.map(([request, pickRow]) =>
      [/** @type {Sampler} */ (request.sampler), pickRow, request.uniform()]));
    const now = performance.now();
    picks.forEach(([request], index) => {
      if (request.tokens.length === 0 && !request.firstTokenAt) request.firstTokenAt = now;
      this.accept(request, tokens[index]);
    });
    for (const request of this.live) if (!request.done && request.signal?.aborted) request.stopped = "aborted";
    for (const request of this.live.filter((r) => r.done)) this.retire(request);
  }

  /**
   * The sequence's next token: kept, streamed, or the reason it stops.
   * @param {Request} request @param {number} token
   */
  accept(request, token) {
    if (request.stops.has(token)) {
      request.stopped = "eos";
      return;
    }
    request.tokens.push(token);
    this.tokensGenerated += 1;
    request.text += request.stream.push(token);
    if (request.onToken) {
      try {
        if (request.onToken(token, request.text) === false) {
          request.stopped = "aborted";
          return;
        }
      } catch (error) { // the callback's error ends its own sequence only
        request.error = error;
        request.failed = true;
        return;
      }
    }
    if (request.tokens.length === request.maxNewTokens || request.prompt.length + request.tokens.length > this.layout.capacity) {
      request.stopped = "length";
    }
  }

  /**
   * A finished sequence leaves: its pages go back to the pool.
   * @param {Request} request
   */
  retire(request) {
    this.live.splice(this.live.indexOf(request), 1);
    this.freePages.push(...request.pages.reverse());
    this.reserved -= request.reserved;
    request.pages = [];
    request.sampler?.close();
    request.sampler = null;
    this.finish(request);
  }

  /**
   * A request has ended (retired, cancelled or aborted before admission): its caller resumes.
   * @param {Request} request
   */
  finish(request) {
    request.finishedAt = performance.now();
    if (request.abortListener) request.signal?.removeEventListener("abort", request.abortListener);
    request.abortListener = null;
    request.settle();
  }

  /** @param {unknown} error */
  failAll(error) {
    for (const request of [...this.live]) {
      if (!request.done) {
        request.error = error;
        request.failed = true;
      }
      this.retire(request);
    }
  }

  /** Dispose of the pools' views. */
  close() {
    for (const tensor of Object.values(this.pools ?? {})) tensor.dispose();
    this.pools = null;
  }
}
