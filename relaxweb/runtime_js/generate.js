// Text generation with a decoder bundle: `model.generate(prompt, options)`,
// `model.generateMany(prompts, options)`, `model.chat(messages, options)` and
// `model.applyChatTemplate(messages)` (the Python runtime's relaxweb/runtime/generate.py in
// JavaScript; the same checks, messages and random numbers).
//
// A bundle can generate when it has the decoder signature optimum and transformers.js use: an
// `input_ids` input and a `logits` output, and a `present.X` output for each
// `past_key_values.X` input (`attention_mask` and `position_ids` optional). Generation is a
// prefill of the prompt with an empty past, then one run per token with the new token, each
// run's `present` (and `logits`) kept (`run(inputs, {keepOnGpu})`) and the presents fed back as
// the next run's past. The loop is the same on both backends; what differs is behind `run`
// (WebGPU: GpuTensors, the caches' views on the GPU; wasm: WasmTensors, the caches' views in the
// wasm memory) and the sampler (SAMPLERS): on WebGPU sampler.wgsl (the Python runtime runs the
// same file) picks the token from the last position's logits and only that one integer is read
// back; on wasm cpu_sampler.js does the same on the CPU. Every kept tensor made is disposed
// before `generate` settles, however it ends (a stop token, the length, an AbortSignal, an error). The sampler applies the repetition
// penalty, the temperature, top-k and top-p in transformers' order; an option not given takes
// the bundle's default (its tokenizer's generation_config.json, GREEDY without one).
// Generation stops at any of the stop tokens (by default every EOS id of the tokenizer).
//
// On a bundle with a paged KV cache (`--kv-pages`, the manifest's `kv_pool`) generations do
// not take turns: every `generate`, `generateMany` and `chat` call on the model joins the steps
// of its one scheduler (paged_generate.js), which advances all live sequences in each run and
// picks all their tokens at once (on WebGPU one submit and one map per step).

import { TYPED_ARRAY_OF_DTYPE } from "./host.js";
import { CpuSampler, seenBits } from "./cpu_sampler.js";
import { TextStream } from "./tokenizer.js";
import { STATUS_BYTES, checkRunStatus } from "./run_status.js";
import { DISPOSED_DURING_GENERATE, PAGE_TABLE, PagedScheduler, Request, poolLayout } from "./paged_generate.js";

export { DISPOSED_DURING_GENERATE };

/** The largest topK the sampler keeps in workgroup memory (sampler.wgsl's MAX_TOP_K). */
export const MAX_TOP_K = 256;
const PAST_PREFIX = "past_key_values.";
const PRESENT_PREFIX = "present.";
const PARAMS_BYTES = 32; // sampler.wgsl's Params
/** The sampling options without a default from the bundle: greedy, nothing cut, no penalty. */
export const GREEDY = Object.freeze({ temperature: 0, topK: 0, topP: 1, repetitionPenalty: 1 });
const USAGE = { MAP_READ: 0x1, COPY_SRC: 0x4, COPY_DST: 0x8, UNIFORM: 0x40, STORAGE: 0x80 };

/**
 * @typedef {{attentionMask: boolean, positionIds: boolean, cache: [string, string][]}} DecoderSignature
 *   which inputs and outputs generate feeds and reads; cache: (past input, present output) pairs
 * @typedef {Object} GenerateOptions
 * @property {number} [maxNewTokens]  new tokens at most (default 64)
 * @property {number} [temperature]  0 (default): greedy; above 0: sample from softmax(logits / temperature)
 * @property {number} [topK]  with a temperature, sample among the topK largest logits (0, the default: all)
 * @property {number} [topP]  with a temperature, sample among the most likely tokens that make up topP of the
 *   probability (1, the default: no cut)
 * @property {number} [repetitionPenalty]  logits of tokens already in the sequence are divided by it (multiplied
 *   where negative; 1, the default: none)
 * @property {number} [seed]  seed of the random numbers (default 0)
 * @property {number[]} [stopTokens]  ids that end generation (default: the tokenizer's EOS ids); not included
 * @property {(token: number, textSoFar: string) => unknown} [onToken]  called once per new token; returning
 *   false stops generation ("aborted")
 * @property {AbortSignal} [signal]  stops generation before its next step
 * @property {boolean} [waitForPages]  on a paged KV cache, whether a request whose pages are taken waits
 *   for them (true, the default) or is refused at once
 * @typedef {Omit<GenerateOptions, "seed"|"onToken"> & {seeds?: (number|null|undefined)[],
 *   onTokens?: (((token: number, textSoFar: string) => unknown)|null|undefined)[]}} GenerateManyOptions
 *   generateMany's: prompt i draws from seed `seeds[i] ?? i` and streams to `onTokens[i]`
 * @typedef {{tokens: number[], text: string, stopped: "eos"|"length"|"aborted", tokensPerSecond: number, prefillMs: number}} Generation
 * @typedef {{signature: DecoderSignature, sampling: {temperature: number, topK: number, topP: number, repetitionPenalty: number},
 *   vocab: number, limit: number|null, stops: Set<number>, maxNewTokens: number}} Setup
 *   what every generation of one call shares
 */

/**
 * The bundle's decoder signature, or an Error saying everything it lacks.
 * @param {any} manifest
 * @returns {DecoderSignature}
 */
export function decoderSignature(manifest) {
  const inputs = manifest.inputs.map((/** @type {any} */ entry) => entry.name);
  const outputs = manifest.outputs.map((/** @type {any} */ entry) => entry.name);
  const problems = [];
  if (!inputs.includes("input_ids")) problems.push("no input 'input_ids'");
  if (!outputs.includes("logits")) problems.push("no output 'logits'");
  const pasts = inputs.filter((/** @type {string} */ name) => name.startsWith(PAST_PREFIX));
  if (pasts.length === 0) problems.push(`no cache inputs '${PAST_PREFIX}*'`);
  /** @type {[string, string][]} */
  const cache = pasts.map((/** @type {string} */ past) => [past, PRESENT_PREFIX + past.slice(PAST_PREFIX.length)]);
  for (const [past, present] of cache) if (!outputs.includes(present)) problems.push(`no output '${present}' for input '${past}'`);
  const paged = manifest.kv_pool ? [PAGE_TABLE] : []; // a paged KV cache's page table (paged_generate.js)
  const others = inputs.filter((/** @type {string} */ name) => !["input_ids", "attention_mask", "position_ids", ...pasts, ...paged].includes(name));
  if (others.length > 0) problems.push(`inputs generate cannot feed: ${others.map((/** @type {string} */ n) => `'${n}'`).join(", ")}`);
  if (problems.length > 0) {
    throw new Error(`this bundle cannot generate: it has ${problems.join("; ")} (a decoder has input_ids -> logits and a ` +
      `${PRESENT_PREFIX}X output for each ${PAST_PREFIX}X input, optionally attention_mask and position_ids)`);
  }
  return { attentionMask: inputs.includes("attention_mask"), positionIds: inputs.includes("position_ids"), cache };
}

/**
 * The longest sequence (prompt and new tokens) one run can take: the bound of each cache's
 * length (past + 1; its axis as cacheAxis finds it) or of the attention mask's, whichever is
 * smallest; null when unbounded.
 * @param {any} manifest @param {DecoderSignature} signature @returns {number|null}
 */
export function sequenceLimit(manifest, signature) {
  /** @type {Record<string, number>} */
  const bounds = Object.fromEntries(manifest.symbolic_vars.filter((/** @type {any} */ v) => v.bound !== null)
    .map((/** @type {any} */ v) => [v.name, v.bound]));
  const input = (/** @type {string} */ name) => manifest.inputs.find((/** @type {any} */ entry) => entry.name === name);
  const limits = [];
  for (const [past, present] of signature.cache) {
    const length = input(past).shape[cacheAxis(manifest, past, present)];
    if (length in bounds) limits.push(bounds[length] + 1);
  }
  const mask = signature.attentionMask ? input("attention_mask").shape : [];
  if (mask.length > 0 && mask[mask.length - 1] in bounds) limits.push(bounds[mask[mask.length - 1]]);
  return limits.length > 0 ? Math.min(...limits) : null;
}

/**
 * The axis of input `past` that is the past length: the cache's axis where the bundle has one,
 * else the one symbolic dimension (not the batch) the output `present` names otherwise, else the
 * past's one symbolic dimension; an Error when there is none.
 * @param {any} manifest @param {string} past @param {string} present @returns {number}
 */
export function cacheAxis(manifest, past, present) {
  const index = manifest.inputs.findIndex((/** @type {any} */ entry) => entry.name === past);
  const { shape } = manifest.inputs[index];
  const batch = manifest.inputs.find((/** @type {any} */ entry) => entry.name === "input_ids").shape[0];
  const presentShape = manifest.outputs.find((/** @type {any} */ entry) => entry.name === present).shape;
  const grows = presentShape ?? shape.map(() => null);
  let axes = (manifest.caches ?? []).filter((/** @type {any} */ c) => c.input === index).map((/** @type {any} */ c) => c.axis);
  const symbolic = [...shape.keys()].filter((axis) => typeof shape[axis] === "string" && shape[axis] !== batch);
  if (axes.length === 0) {
    axes = symbolic.filter((axis) => typeof grows[axis] === "string" && grows[axis] !== shape[axis]);
    if (axes.length === 0 && symbolic.length === 1) axes = symbolic;
  }
  if (axes.length !== 1) {
    throw new Error(`this bundle cannot generate: no dimension of input '${past}' ${JSON.stringify(shape)} is the past ` +
      `length alone (the one output '${present}' ${JSON.stringify(presentShape)} grows along)`);
  }
  return axes[0];
}

/**
 * A seeded generator of uniforms in [0, 1) with 24 bits (exact in float32; generate.py has the same).
 * @param {number} seed @returns {() => number}
 */
export function mulberry32(seed) {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = Math.imul(state ^ (state >>> 15), state | 1) >>> 0;
    t = (t ^ (t + Math.imul(t ^ (t >>> 7), t | 61))) >>> 0;
    return ((t ^ (t >>> 14)) >>> 8) / (1 << 24);
  };
}

/**
 * An Error for the first option out of range (the Python runtime checks the same).
 * @param {{maxNewTokens: number, temperature: number, topK: number, seed: number, topP?: number, repetitionPenalty?: number}} options
 */
export function checkOptions({ maxNewTokens, temperature, topK, seed, topP = 1, repetitionPenalty = 1 }) {
  if (!Number.isInteger(maxNewTokens) || maxNewTokens < 1) throw new Error(`maxNewTokens must be an integer >= 1, got ${String(maxNewTokens).slice(0, 40)}`);
  if (typeof temperature !== "number" || !(temperature >= 0) || temperature === Infinity || !inFloat32(temperature)) {
    throw new Error(`temperature must be a number >= 0 (0: greedy), got ${String(temperature).slice(0, 40)}${float32Note(temperature)}`);
  }
  if (!Number.isInteger(topK) || topK < 0 || topK > MAX_TOP_K) {
    throw new Error(`topK must be an integer from 0 (the whole vocabulary) to ${MAX_TOP_K}, got ${String(topK).slice(0, 40)}`);
  }
  if (typeof topP !== "number" || !(topP > 0 && topP <= 1) || !inFloat32(topP)) {
    throw new Error(`topP must be a number above 0 and at most 1 (1: no cut), got ${String(topP).slice(0, 40)}${float32Note(topP)}`);
  }
  if (typeof repetitionPenalty !== "number" || !(repetitionPenalty > 0) || repetitionPenalty === Infinity || !inFloat32(repetitionPenalty)) {
    throw new Error(`repetitionPenalty must be a number above 0 (1: none), got ${String(repetitionPenalty).slice(0, 40)}` +
      float32Note(repetitionPenalty));
  }
  if (!Number.isInteger(seed)) throw new Error(`seed must be an integer, got ${String(seed).slice(0, 40)}`);
}

/** The samplers compute in float32: its smallest normal and largest finite numbers (generate.py's FLOAT32_RANGE). */
const FLOAT32_RANGE = [1.1754943508222875e-38, 3.4028234663852886e38];

/** Whether `value` is 0 or a normal float32 (else the samplers would see 0 or infinity). @param {number} value */
function inFloat32(value) {
  return value === 0 || (Math.abs(value) >= FLOAT32_RANGE[0] && Math.abs(value) <= FLOAT32_RANGE[1]);
}

/** Why a number otherwise in range is refused (generate.py's _float32_note). @param {any} value @returns {string} */
function float32Note(value) {
  return typeof value === "number" && value !== 0 && Number.isFinite(value) && !inFloat32(value)
    ? " (outside float32's range, 1.2e-38 to 3.4e38, which the samplers compute in)" : "";
}

/**
 * The sampling options of a generate call: each one given (not undefined or null), else the
 * bundle's default (`defaults`: its tokenizer's), else GREEDY's.
 * @param {Record<string, number>} defaults @param {Record<string, number|undefined|null>} given
 * @returns {{temperature: number, topK: number, topP: number, repetitionPenalty: number}}
 */
export function samplingOptions(defaults, given) {
  return /** @type {any} */ (Object.fromEntries(Object.entries(GREEDY)
    .map(([name, greedy]) => [name, given[name] ?? defaults[name] ?? greedy])));
}

/** @type {WeakMap<GPUDevice, Promise<GPUComputePipeline>>} sampler.wgsl's pipeline, one per device */
const samplerPipelines = new WeakMap();

/** @param {GPUDevice} device @returns {Promise<GPUComputePipeline>} */
function samplerPipeline(device) {
  let pipeline = samplerPipelines.get(device);
  if (!pipeline) {
    pipeline = (async () => {
      const response = await fetch(new URL("./sampler.wgsl", import.meta.url));
      if (!response.ok) throw new Error(`cannot fetch the runtime's sampler.wgsl (HTTP ${response.status})`);
      const module = device.createShaderModule({ label: "sampler", code: await response.text() });
      return device.createComputePipelineAsync({ label: "sampler", layout: "auto", compute: { module, entryPoint: "main" } });
    })();
    pipeline.catch(() => samplerPipelines.delete(device));
    samplerPipelines.set(device, pipeline);
  }
  return pipeline;
}

/**
 * sampler.wgsl for one generate: its pipeline and four small buffers (destroyed by close): the
 * params, the token, its staging copy and the ids seen (one bit each: the prompt's, then each
 * token picked).
 */
class GpuSampler {
  /**
   * @param {any} model the Model @param {GPUComputePipeline} pipeline @param {number} vocab
   * @param {{temperature: number, topK: number, topP: number, repetitionPenalty: number}} sampling
   * @param {number[]} prompt
   */
  constructor(model, pipeline, vocab, sampling, prompt) {
    this.model = model;
    this.pipeline = pipeline;
    this.sampling = sampling;
    this.params = model.createBuffer({ label: "sampler params", size: PARAMS_BYTES, usage: USAGE.UNIFORM | USAGE.COPY_DST });
    this.result = model.createBuffer({ label: "sampled token", size: 16, usage: USAGE.STORAGE | USAGE.COPY_SRC });
    // the token, then (at 4) the run status a kept run left unread: its error comes first
    this.staging = model.createBuffer({ label: "sampled token read", size: 4 + STATUS_BYTES, usage: USAGE.MAP_READ | USAGE.COPY_DST });
    const seen = seenBits(vocab, sampling, prompt);
    this.seen = model.createBuffer({ label: "seen tokens", size: Math.max(16, Math.ceil(seen.byteLength / 16) * 16), usage: USAGE.STORAGE | USAGE.COPY_DST });
    if (sampling.repetitionPenalty !== 1) model.writeBuffer(this.seen, seen, "paramsBytesWritten"); // the prompt's ids count as seen, as in transformers
  }

  /**
   * Record the pick of the next token from row `row` of `logits` ([1, T, vocab] float32, kept on
   * the GPU) into `encoder`: the token lands in `this.result`.
   * @param {GPUCommandEncoder} encoder @param {import("./gpu_tensor.js").GpuTensor} logits
   * @param {number} row @param {number} uniform
   */
  encode(encoder, logits, row, uniform) {
    const { temperature, topK, topP, repetitionPenalty } = this.sampling;
    const vocab = logits.shape[logits.shape.length - 1];
    const params = new DataView(new ArrayBuffer(PARAMS_BYTES));
    params.setUint32(0, row * vocab, true);
    params.setUint32(4, vocab, true);
    params.setUint32(8, topK, true);
    params.setFloat32(12, temperature, true);
    params.setFloat32(16, uniform, true);
    params.setFloat32(20, topP, true);
    params.setFloat32(24, repetitionPenalty, true);
    params.setUint32(28, repetitionPenalty !== 1 ? 1 : 0, true);
    this.model.writeBuffer(this.params, new Uint8Array(params.buffer), "paramsBytesWritten");
    const bindGroup = this.model.device.createBindGroup({
      layout: this.pipeline.getBindGroupLayout(0),
      entries: [
        { binding: 0, resource: { buffer: this.params } },
        { binding: 1, resource: { buffer: logits.buffer() } },
        { binding: 2, resource: { buffer: this.result } },
        { binding: 3, resource: { buffer: this.seen } },
      ],
    });
    const pass = encoder.beginComputePass();
    pass.setPipeline(this.pipeline);
    pass.setBindGroup(0, bindGroup);
    pass.dispatchWorkgroups(1);
    pass.end();
  }

  /**
   * The next token from the last row of `logits` ([1, seq, vocab] float32, kept on the GPU).
   * @param {import("./gpu_tensor.js").GpuTensor} logits @param {number} uniform
   * @returns {Promise<number>}
   */
  async sample(logits, uniform) {
    const rows = logits.shape.slice(0, -1).reduce((a, b) => a * b, 1);
    return (await GpuSampler.sampleRows(this.model, logits, [[this, rows - 1, uniform]], this.staging))[0];
  }

  /**
   * Each sampler's next token from its row of `logits` (`picks`: sampler, row, uniform), all in
   * one submit with one map of the tokens (and of the run status the run that made the logits
   * left unread: its error comes first). `staging`: a MAP_READ buffer of at least 4 bytes per
   * pick and STATUS_BYTES, else one is made for the call.
   * @param {any} model @param {import("./gpu_tensor.js").GpuTensor} logits
   * @param {[GpuSampler, number, number][]} picks @param {GPUBuffer|null} [staging]
   * @returns {Promise<number[]>}
   */
  static async sampleRows(model, logits, picks, staging = null) {
    const tokensBytes = 4 * picks.length;
    const own = staging === null;
    const readback = staging ?? model.createBuffer({
      label: "sampled tokens read", size: Math.ceil((tokensBytes + STATUS_BYTES) / 16) * 16, usage: USAGE.MAP_READ | USAGE.COPY_DST,
    });
    try {
      const { device } = model;
      let carriesStatus = false;
      await model.captureGpuErrors("generate", () => {
        const encoder = device.createCommandEncoder();
        for (const [sampler, row, uniform] of picks) sampler.encode(encoder, logits, row, uniform);
        picks.forEach(([sampler], index) => encoder.copyBufferToBuffer(sampler.result, 0, readback, 4 * index, 4));
        carriesStatus = model.copyUnreadStatus(encoder, readback, tokensBytes);
        device.queue.submit([encoder.finish()]);
      });
      const size = carriesStatus ? tokensBytes + STATUS_BYTES : tokensBytes;
      if (size === 0) return [];
      await model.orDeviceLoss(readback.mapAsync(/* GPUMapMode.READ */ 1, 0, size));
      const mapped = readback.getMappedRange(0, size).slice(0);
      readback.unmap();
      // the run that made the logits (and any before it) kept everything: its error comes first
      if (carriesStatus) checkRunStatus(model.manifest, mapped.slice(tokensBytes, tokensBytes + STATUS_BYTES));
      model.stats.add("bytesRead", tokensBytes);
      return Array.from(new Uint32Array(mapped, 0, picks.length));
    } finally {
      if (own) readback.destroy();
    }
  }

  close() {
    for (const buffer of [this.params, this.result, this.staging, this.seen]) buffer.destroy();
  }
}

/**
 * The token sampler of each backend (`model.backend`): `create(model, vocab, sampling, prompt)`
 * per generation (a promise of it), then its `sample(logits, uniform)` per token (a promise of
 * the token) and `close()`; `sampleRows(model, logits, picks)`: the tokens of several samplers,
 * each from its row of the logits (`picks`: sampler, row, uniform), at once.
 * @type {Record<string, {create: (model: any, vocab: number, sampling: any, prompt: number[]) => Promise<any>,
 *   sampleRows: (model: any, logits: any, picks: [any, number, number][]) => Promise<number[]>}>}
 */
const SAMPLERS = {
  webgpu: {
    create: async (model, vocab, sampling, prompt) =>
      new GpuSampler(model, await model.orDeviceLoss(samplerPipeline(model.device)), vocab, sampling, prompt),
    sampleRows: (model, logits, picks) => GpuSampler.sampleRows(model, logits, picks),
  },
  wasm: {
    create: async (_model, vocab, sampling, prompt) => new CpuSampler(vocab, sampling, prompt),
    sampleRows: async (_model, logits, picks) => CpuSampler.sampleRows(logits, picks),
  },
};

/**
 * An integer tensor of `dtype` holding `values`.
 * @param {string} dtype @param {number[]} values @param {number[]} shape
 */
function integers(dtype, values, shape) {
  const data = dtype === "int64" ? BigInt64Array.from(values, BigInt)
    : /** @type {any} */ (TYPED_ARRAY_OF_DTYPE)[dtype].from(values);
  return { data, shape };
}

/**
 * The inputs of each run: the new tokens, their mask and positions, and the past.
 * @param {any} manifest @param {DecoderSignature} signature
 * @returns {(tokens: number[], start: number, past: Record<string, any>|null) => Record<string, any>}
 */
function feedsMaker(manifest, signature) {
  const spec = (/** @type {string} */ name) => manifest.inputs.find((/** @type {any} */ entry) => entry.name === name);
  const batch = spec("input_ids").shape[0];
  /**
   * The prompt's empty past: 1 for the batch, 0 for the past length (the dimension the present
   * grows along: the cache's axis, else the one symbolic dimension the present names otherwise),
   * and each other dimension as the model has it: the past's when a number, else the present's (a
   * head size the exporter left symbolic, `kv_cache_dim`, that the model's graph fixes).
   * @param {string} past @param {string} present @returns {number[]}
   */
  const emptyPastShape = (past, present) => {
    const { shape } = spec(past);
    const grows = manifest.outputs.find((/** @type {any} */ entry) => entry.name === present).shape ?? shape.map(() => null);
    const length = cacheAxis(manifest, past, present);
    return shape.map((/** @type {number|string} */ dim, /** @type {number} */ axis) => {
      const extent = dim === batch ? 1 : axis === length ? 0 : typeof dim === "number" ? dim : grows[axis];
      if (typeof extent !== "number") {
        throw new Error(`this bundle cannot generate: dimension ${axis} of input '${past}' (${dim}) has no extent in the ` +
          `model (output '${present}' has ${grows[axis]} there), so its empty past cannot be made`);
      }
      return extent;
    });
  };
  /** @type {Record<string, any>} */
  const emptyPast = Object.fromEntries(signature.cache.map(([past, present]) => {
    const data = new (/** @type {any} */ (TYPED_ARRAY_OF_DTYPE)[spec(past).dtype])(0);
    return [past, { data, shape: emptyPastShape(past, present) }];
  }));
  return (tokens, start, past) => {
    /** @type {Record<string, any>} */
    const feeds = { input_ids: integers(spec("input_ids").dtype, tokens, [1, tokens.length]) };
    const total = start + tokens.length;
    if (signature.attentionMask) feeds.attention_mask = integers(spec("attention_mask").dtype, new Array(total).fill(1), [1, total]);
    if (signature.positionIds) {
      feeds.position_ids = integers(spec("position_ids").dtype, tokens.map((_, k) => start + k), [1, tokens.length]);
    }
    for (const [pastName, presentName] of signature.cache) feeds[pastName] = past ? past[presentName] : emptyPast[pastName];
    return feeds;
  };
}

/**
 * A prompt's ids: text encoded by the tokenizer (with its special tokens), or ids checked.
 * @param {any} tokenizer @param {string|number[]} prompt @param {number} vocab @returns {number[]}
 */
function promptIds(tokenizer, prompt, vocab) {
  /** @type {number[]} */
  let ids;
  if (typeof prompt === "string") {
    if (!tokenizer) throw new Error("this bundle has no tokenizer (build it with --tokenizer PATH): give the prompt as token ids");
    ids = tokenizer.encode(prompt);
    const tooLarge = ids.find((id) => id >= vocab);
    if (tooLarge !== undefined) {
      throw new Error(`the tokenizer gave the id ${tooLarge}, but the model's logits have ${vocab} entries: this tokenizer is not the model's`);
    }
  } else {
    ids = [...prompt];
    if (!ids.every((id) => Number.isInteger(id) && id >= 0 && id < vocab)) {
      throw new Error(`a prompt of token ids must hold integers from 0 to ${vocab - 1}`);
    }
  }
  if (ids.length === 0) throw new Error("the prompt is empty: generate needs at least one token to start from");
  return ids;
}

/**
 * `model.applyChatTemplate`: the prompt text of a conversation (see relaxweb.d.ts).
 * @param {any} model @param {any} messages @param {{addGenerationPrompt?: boolean}} [options] @returns {string}
 */
export function applyChatTemplate(model, messages, options = {}) {
  const template = model.tokenizer?.chatTemplate ?? null;
  if (template === null) {
    const which = model.tokenizer ? `a ${model.tokenizer.kind} tokenizer without one` : "no tokenizer";
    throw new Error(`this bundle has no chat template (${which}): build it with --tokenizer FOLDER, a tokenizer folder ` +
      "with chat_template.jinja or a chat_template in tokenizer_config.json");
  }
  return template.render(messages, options);
}

/**
 * `model.chat`: the reply to `messages`, generated (by the model's generate) after their prompt,
 * the chat template's text encoded without adding special tokens (the template writes them).
 * @param {any} model @param {any} messages @param {GenerateOptions} [options] @returns {Promise<Generation>}
 */
export async function chat(model, messages, options = {}) {
  const prompt = applyChatTemplate(model, messages);
  return model.generate(model.tokenizer.encode(prompt, { addSpecialTokens: false }), options);
}

/** Each model's last generation, which the next one waits for (non-paged bundles). @type {WeakMap<any, Promise<void>>} */
const GENERATIONS = new WeakMap();
/** Each model's paged KV cache scheduler, made on first use (`pagedScheduler`). @type {WeakMap<any, PagedScheduler>} */
const SCHEDULERS = new WeakMap();

/**
 * `model.generate`: see relaxweb.d.ts. On a bundle whose caches are not paged, generations on
 * one model take turns, as the Python runtime's do (its session lock): each carries its past as
 * views of the model's KV caches, which the next run of any other generation would overwrite
 * (two at once failed the first with a stale-view error). On a paged KV cache they join the
 * steps of the model's scheduler (paged_generate.js).
 * @param {any} model the Model
 * @param {string|number[]} prompt
 * @param {GenerateOptions} [options]
 * @returns {Promise<Generation>}
 */
export async function generate(model, prompt, options = {}) {
  const { seed = 0, onToken, ...shared } = options;
  return (await generateMany(model, [prompt], { ...shared, seeds: [seed], onTokens: [onToken] }))[0];
}

/**
 * `model.generateMany`: one Generation per prompt, with `generate`'s options but `seeds` and
 * `onTokens` per prompt (prompt i: `seeds[i] ?? i`, `onTokens[i]`). On a bundle with a paged KV
 * cache the prompts advance together (paged_generate.js); otherwise one after another, each as
 * `generate` alone. Every prompt and option is checked before anything runs.
 * @param {any} model @param {(string|number[])[]} prompts @param {GenerateManyOptions} [options]
 * @returns {Promise<Generation[]>}
 */
export async function generateMany(model, prompts, options = {}) {
  if (!Array.isArray(prompts) || prompts.length === 0) {
    throw new Error("prompts must be a non-empty list of prompts (texts or lists of token ids)");
  }
  const { seeds: givenSeeds, onTokens: givenOnTokens, signal, waitForPages = true } = options;
  if ((givenSeeds !== undefined && givenSeeds?.length !== prompts.length) ||
      (givenOnTokens !== undefined && givenOnTokens?.length !== prompts.length)) {
    throw new Error(`${prompts.length} prompts need as many seeds and onTokens callbacks, got ` +
      `${givenSeeds?.length ?? prompts.length} and ${givenOnTokens?.length ?? prompts.length}`);
  }
  const seeds = prompts.map((_, index) => givenSeeds?.[index] ?? index);
  const onTokens = prompts.map((_, index) => givenOnTokens?.[index] ?? null);
  const setup = generationSetup(model, options, seeds);
  const promptIdsList = prompts.map((prompt) => promptIds(model.tokenizer, prompt, setup.vocab));
  for (const ids of promptIdsList) {
    if (setup.limit !== null && ids.length > setup.limit) {
      throw new Error(`the prompt has ${ids.length} tokens; this bundle's bounds allow sequences of at most ${setup.limit}`);
    }
  }
  if (poolLayout(model.manifest) === null) {
    return takingTurns(model, async () => {
      const generations = [];
      for (const [index, ids] of promptIdsList.entries()) {
        generations.push(await generateAlone(model, setup, ids, { seed: seeds[index], onToken: onTokens[index], signal }));
      }
      return generations;
    });
  }
  const scheduler = pagedScheduler(model, setup);
  const { tokenizer } = model;
  const requests = promptIdsList.map((ids, index) => new Request({
    prompt: ids, maxNewTokens: setup.maxNewTokens, sampling: setup.sampling, uniform: mulberry32(seeds[index]),
    stops: setup.stops, onToken: onTokens[index], stream: tokenizer ? tokenizer.stream() : new TextStream(), signal,
  }));
  /** @type {Request[]} */
  const submitted = [];
  try {
    for (const request of requests) submitted.push(scheduler.submit(request, waitForPages));
  } catch (error) {
    scheduler.cancel(submitted); // all of the call's prompts or none
    throw error;
  }
  await scheduler.wait(requests);
  return requests.map((request) => generationOf(model, request));
}

/**
 * `work` when the model's earlier generations have settled; the next ones wait for it.
 * @template T @param {any} model @param {() => Promise<T>} work @returns {Promise<T>}
 */
async function takingTurns(model, work) {
  const previous = GENERATIONS.get(model) ?? Promise.resolve();
  /** @type {() => void} */
  let done = () => {};
  GENERATIONS.set(model, new Promise((resolve) => { done = resolve; }));
  try {
    await previous;
    return await work();
  } finally {
    done();
  }
}

/**
 * What every generation of one call shares, its options checked (`seeds`: each prompt's).
 * @param {any} model @param {GenerateOptions|GenerateManyOptions} options @param {number[]} seeds @returns {Setup}
 */
function generationSetup(model, options, seeds) {
  const { maxNewTokens = 64, stopTokens } = options;
  const { manifest, tokenizer } = model;
  const signature = decoderSignature(manifest);
  const sampling = samplingOptions(tokenizer?.generationDefaults ?? {}, /** @type {any} */ (options));
  for (const seed of seeds) checkOptions({ maxNewTokens, seed, ...sampling });
  const logitsSpec = manifest.outputs.find((/** @type {any} */ entry) => entry.name === "logits");
  const vocab = logitsSpec.shape?.[logitsSpec.shape.length - 1];
  if (!Number.isInteger(vocab) || !["float32", "float16"].includes(logitsSpec.dtype)) { // (float16: float32 on the GPU)
    throw new Error("this bundle cannot generate: its logits must be float32 or float16 with a fixed vocabulary size as " +
      `their last dimension, got ${logitsSpec.dtype} [${(logitsSpec.shape ?? []).join(", ")}]`);
  }
  const layout = poolLayout(manifest);
  const limit = layout !== null ? layout.capacity : sequenceLimit(manifest, signature);
  const stops = new Set(stopTokens ?? tokenizer?.stopTokens ?? []);
  return { signature, sampling, vocab, limit, stops, maxNewTokens };
}

/**
 * The model's scheduler (made on first use).
 * @param {any} model @param {Setup} setup @returns {PagedScheduler}
 */
function pagedScheduler(model, setup) {
  let scheduler = SCHEDULERS.get(model);
  if (!scheduler) {
    const sampler = SAMPLERS[model.backend];
    scheduler = new PagedScheduler(model, /** @type {any} */ (poolLayout(model.manifest)), setup.signature,
      (request) => sampler.create(model, setup.vocab, request.sampling, request.prompt),
      (logits, picks) => sampler.sampleRows(model, logits, picks));
    SCHEDULERS.set(model, scheduler);
  }
  return scheduler;
}

/**
 * `model.generationStats`: the scheduler's, null before its first use or without a paged KV cache.
 * @param {any} model @returns {import("./paged_generate.js").SchedulerStats|null}
 */
export function generationStats(model) {
  return SCHEDULERS.get(model)?.stats() ?? null;
}

/**
 * The model's scheduler (paged_generate.js's PagedScheduler, made by its first generation on a
 * paged bundle), null before: where the policy's knobs are (`prefillChunk`, `admission`).
 * @param {any} model @returns {PagedScheduler | null}
 */
export function schedulerOf(model) {
  return SCHEDULERS.get(model) ?? null;
}

/**
 * A finished request as the Generation its caller gets (its error thrown).
 * @param {any} model @param {Request} request @returns {Generation}
 */
function generationOf(model, request) {
  if (request.failed) throw request.error;
  const { tokenizer } = model;
  const text = tokenizer ? tokenizer.decode(request.tokens) : request.text + request.stream.finish();
  const decoded = request.tokens.length - 1;
  const seconds = (request.finishedAt - request.firstTokenAt) / 1e3;
  return {
    tokens: request.tokens,
    text,
    stopped: request.stopped ?? "length",
    tokensPerSecond: decoded > 0 && seconds > 0 ? decoded / seconds : 0,
    prefillMs: request.firstTokenAt ? request.firstTokenAt - request.submittedAt : 0,
  };
}

/**
 * One generation on a bundle whose caches are not paged, the model's alone: the loop of the module doc.
 * @param {any} model @param {Setup} setup @param {number[]} ids
 * @param {{seed: number, onToken: ((token: number, textSoFar: string) => unknown)|null, signal?: AbortSignal}} options
 * @returns {Promise<Generation>}
 */
async function generateAlone(model, setup, ids, { seed, onToken, signal }) {
  const { signature, sampling, vocab, limit, stops, maxNewTokens } = setup;
  const { manifest, tokenizer } = model;
  const stream = tokenizer ? tokenizer.stream() : new TextStream();
  const feeds = feedsMaker(manifest, signature);
  const uniform = mulberry32(seed);
  const keepOnGpu = ["logits", ...signature.cache.map(([, present]) => present)];

  /** @type {number[]} */
  const tokens = [];
  let text = "";
  /** @type {"eos"|"length"|"aborted"} */
  let stopped = "length";
  /** @type {any[]} every kept tensor alive: disposed whatever happens */
  let held = [];
  const sampler = await SAMPLERS[model.backend].create(model, vocab, sampling, ids);
  const started = performance.now();
  let decodeStarted = 0;
  let prefillMs = 0;
  try {
    if (signal?.aborted) return { tokens, text, stopped: "aborted", tokensPerSecond: 0, prefillMs };
    let outputs = await model.run(feeds(ids, 0, null), { keepOnGpu });
    held = Object.values(outputs);
    for (;;) {
      const token = await sampler.sample(outputs.logits, uniform());
      outputs.logits.dispose();
      if (tokens.length === 0) {
        decodeStarted = performance.now();
        prefillMs = decodeStarted - started;
      }
      if (stops.has(token)) {
        stopped = "eos";
        break;
      }
      tokens.push(token);
      text += stream.push(token);
      if (onToken?.(token, text) === false || signal?.aborted) {
        stopped = "aborted";
        break;
      }
      if (tokens.length === maxNewTokens || (limit !== null && ids.length + tokens.length > limit)) break;
      const previous = held;
      outputs = await model.run(feeds([token], ids.length + tokens.length - 1, outputs), { keepOnGpu });
      held = Object.values(outputs);
      for (const tensor of previous) tensor.dispose();
    }
  } catch (error) {
    // a dispose() between or during the awaits above fails them with whatever the device says
    // (a mapAsync aborted, a destroyed buffer): say what happened instead
    if (model.disposed) throw new Error(DISPOSED_DURING_GENERATE);
    throw error;
  } finally {
    for (const tensor of held) tensor.dispose();
    sampler.close();
  }
  text = tokenizer ? tokenizer.decode(tokens) : text + stream.finish();
  const decoded = tokens.length - 1;
  const seconds = (performance.now() - decodeStarted) / 1e3;
  return { tokens, text, stopped, tokensPerSecond: decoded > 0 && seconds > 0 ? decoded / seconds : 0, prefillMs };
}

/**
 * The text-generation methods of both models (`Model` on WebGPU and `WasmModel`): each is this
 * module's function of the model (types: relaxweb.d.ts). Installed on their prototypes by
 * `installGenerationMethods` (`generationStats` is a getter).
 */
const GENERATION_METHODS = {
  /** @this {any} @param {string|number[]} prompt @param {GenerateOptions} [options] */
  generate(prompt, options) { return generate(this, prompt, options); },
  /** @this {any} @param {(string|number[])[]} prompts @param {GenerateManyOptions} [options] */
  generateMany(prompts, options) { return generateMany(this, prompts, options); },
  get generationStats() { return generationStats(this); },
  /** @this {any} @param {any[]} messages @param {{addGenerationPrompt?: boolean}} [options] */
  applyChatTemplate(messages, options) { return applyChatTemplate(this, messages, options); },
  /** @this {any} @param {any[]} messages @param {GenerateOptions} [options] */
  chat(messages, options) { return chat(this, messages, options); },
};

/**
 * Give a model class generate, generateMany, generationStats, applyChatTemplate and chat.
 * @param {object} prototype the class's prototype
 */
export function installGenerationMethods(prototype) {
  Object.defineProperties(prototype, Object.getOwnPropertyDescriptors(GENERATION_METHODS));
}
