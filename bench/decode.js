// The in-page half of bench/decode.py: token-by-token decoding with a KV cache, relaxweb and
// onnxruntime-web (WebGPU) driven the same way, the way web libraries drive a decoder
// (transformers.js): each step's present outputs stay on the GPU and go back as the next
// step's past, the previous past is disposed, and the logits are read back to choose the next
// token on the host (greedy argmax, the same code for both systems). decode.py drives it
// through window.decodeBench; the counters come from bench/instrument.js (window.__bench).

const delta = (after, before) => Object.fromEntries(Object.entries(after)
  .filter(([key]) => key !== "liveBytes" && key !== "peakLiveBytes")
  .map(([key, value]) => [key, value - before[key]]));

const infoOf = (info) => info && { vendor: info.vendor, architecture: info.architecture, description: info.description };

// One system: { async load(urls, names), async step(feeds, past) -> {logits, present}, dispose(past) }.
// `feeds` are { name: {data, shape} } (input_ids, attention_mask, position_ids); `past` maps
// each past input's name to what the system takes as that input: at the first step arrays
// ({data, shape}), later the `present` of the step before. `present` maps the past names to
// the new presents (GPU tensors; arrays for the cache-on-host reference); `logits` are the
// last position's (a Float32Array).
const SYSTEMS = {
  relaxweb: () => relaxwebSystem(true),
  // For reference (bench/decode.py --systems): the presents read back to JavaScript as arrays
  // and uploaded again as the next past, the traffic keepOnGpu avoids.
  "relaxweb-cache-on-host": () => relaxwebSystem(false),
  // onnxruntime-web 1.2x, WebGPU: present.* are 'gpu-buffer' outputs (preferredOutputLocation),
  // fed back as inputs as they are, and disposed when the next step has used them.
  "ort-webgpu": () => {
    let ort;
    let session;
    let names;
    return {
      async load({ onnxUrl }, decoderNames) {
        names = decoderNames;
        ort = await import("/ort/ort.webgpu.min.mjs");
        ort.env.wasm.wasmPaths = "/ort/";
        ort.env.wasm.numThreads = 1; // the page is not cross-origin isolated: no wasm threads
        session = await ort.InferenceSession.create(onnxUrl, {
          executionProviders: ["webgpu"],
          preferredOutputLocation: Object.fromEntries(names.presents.map((name) => [name, "gpu-buffer"])),
        });
      },
      async step(feeds, past) {
        const outputs = await session.run(ortInputs(ort, feeds, past));
        const present = Object.fromEntries(names.pasts.map((name, k) => [name, outputs[names.presents[k]]]));
        return { logits: outputs[names.logits].data, present };
      },
      dispose(past) {
        disposeOrtPast(ort, past);
      },
      adapterInfo: () => infoOf(ort.env.webgpu?.device?.adapterInfo ?? ort.env.webgpu?.adapter?.info),
      stats: () => null,
    };
  },
};

/**
 * onnxruntime-web's inputs of one step: the feeds ({data, shape}) as tensors, and the past as
 * it is where it is a tensor already (a GPU one: the previous step's present), else a tensor.
 */
function ortInputs(ort, feeds, past) {
  const tensor = ({ data, shape }) => new ort.Tensor(data instanceof BigInt64Array ? "int64" : "float32", data, shape);
  const inputs = Object.fromEntries(Object.entries(feeds).map(([name, value]) => [name, tensor(value)]));
  for (const [name, value] of Object.entries(past)) inputs[name] = value instanceof ort.Tensor ? value : tensor(value);
  return inputs;
}

/** Dispose of a past's onnxruntime-web tensors (its GPU buffers) once the next step used them. */
function disposeOrtPast(ort, past) {
  for (const value of Object.values(past)) if (value instanceof ort.Tensor) value.dispose();
}

function relaxwebSystem(keepOnGpu) {
  let model;
  let names;
  return {
    async load({ bundleUrl }, decoderNames) {
      names = decoderNames;
      const runtime = await import(`${bundleUrl}runtime/relaxweb.js`);
      model = await runtime.load(bundleUrl);
      await model.ready; // every pipeline compiled before the first step
    },
    async step(feeds, past) {
      const outputs = await model.run({ ...feeds, ...past }, { keepOnGpu: keepOnGpu ? names.presents : false });
      const present = Object.fromEntries(names.pasts.map((name, k) => [name, outputs[names.presents[k]]]));
      return { logits: outputs[names.logits].data, present };
    },
    dispose(past) {
      for (const tensor of Object.values(past)) tensor.dispose?.(); // arrays have none
    },
    adapterInfo: () => infoOf(model.device.adapterInfo),
    stats: () => ({ ...model.stats.lastRun }),
  };
}

const loaded = {};

// Greedy choice on the host: the index of the largest logit (the first of equal ones).
const argmax = (values) => {
  let best = 0;
  for (let i = 1; i < values.length; i += 1) if (values[i] > values[best]) best = i;
  return best;
};

const fromBase64 = ({ dtype, shape, base64 }) => {
  const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
  return { data: dtype === "int64" ? new BigInt64Array(bytes.buffer) : new Float32Array(bytes.buffer), shape };
};

// The host-side inputs of one step: one token at `position`, after a past of `position` tokens.
const stepFeeds = (token, position) => ({
  input_ids: { data: BigInt64Array.of(BigInt(token)), shape: [1, 1] },
  attention_mask: { data: new BigInt64Array(position + 1).fill(1n), shape: [1, position + 1] },
  position_ids: { data: BigInt64Array.of(BigInt(position)), shape: [1, 1] },
});

window.decodeBench = {
  async pageAdapter() {
    if (!navigator.gpu) return { error: "navigator.gpu is missing: no WebGPU in this page" };
    const adapter = await navigator.gpu.requestAdapter();
    return adapter ? infoOf(adapter.info) : { error: "requestAdapter() returned null" };
  },

  // names: {pasts: [...], presents: [...] (in the same order), logits}
  async load(system, urls, names) {
    const before = window.__bench.snapshot();
    const start = performance.now();
    loaded[system] = SYSTEMS[system]();
    await loaded[system].load(urls, names);
    return { loadMs: performance.now() - start, counts: delta(window.__bench.snapshot(), before),
             adapterInfo: loaded[system].adapterInfo() };
  },

  // A prefill from `past` (arrays of length position - 1, uploaded untimed) with `token`, then
  // `warmup` + `steps` decode steps, each: make the inputs, run, dispose the previous past,
  // read the logits, choose the next token (argmax). Returns per step the time, the counters'
  // differences and the token; the prefill's logits; one step's list of transfers.
  async decode(system, { token, position, past, warmup, steps }) {
    const runner = loaded[system];
    let current = Object.fromEntries(Object.entries(past).map(([name, value]) => [name, fromBase64(value)]));
    const { logits: prefillLogits, present } = await runner.step(stepFeeds(token, position), current);
    current = present;
    let next = argmax(prefillLogits); // batch 1, one position: the logits are one row
    const tokens = [next];
    const timed = [];
    let transfers = null;
    for (let i = 0; i < warmup + steps; i += 1) {
      position += 1;
      const record = i === warmup; // the first timed step's transfers, listed
      if (record) window.__bench.record(true);
      const before = window.__bench.snapshot();
      const start = performance.now();
      const outputs = await runner.step(stepFeeds(next, position), current);
      runner.dispose(current);
      current = outputs.present;
      next = argmax(outputs.logits);
      const ms = performance.now() - start;
      const counts = delta(window.__bench.snapshot(), before);
      if (record) transfers = window.__bench.record(false);
      tokens.push(next);
      if (i >= warmup) timed.push({ ms, counts, past: position, runtimeStats: runner.stats() });
    }
    runner.dispose(current);
    return { tokens, timed, transfers, prefillLogits: Array.from(prefillLogits), totals: window.__bench.snapshot() };
  },
};
window.decodeBenchReady = true;

// ---------------------------------------------------------------------------------------------
// Language-model generation (decode.py --lm): a prompt's prefill with an empty past, then
// greedy new tokens, on relaxweb (WebGPU and wasm) and onnxruntime-web (WebGPU and wasm), all
// loaded in the page, generating in turn (decode.py alternates their order), released at the
// end. What each system is measured by:
//   load: the time from nothing to a model ready to run (relaxweb: load() and model.ready, so
//     every pipeline is compiled; onnxruntime-web: InferenceSession.create), the bytes fetched
//     meanwhile (Resource Timing's decoded body sizes: the runtime's files and the model's), the
//     GPU buffers created and not destroyed during it (instrument.js) and the WebAssembly
//     memories made during it; the GPU peak adds the most live bytes a generation added;
//   prefill: from the call to the first new token known on the host;
//   decode: the time between consecutive new tokens (each a run with the previous presents as
//     the past, its logits reduced to a token), and what instrument.js counted between them.
// relaxweb on WebGPU runs model.generate (greedy on the GPU's sampler, one integer read per
// token); relaxweb on wasm runs model.generate where the build has it, else per-step model.run
// with the presents read back as arrays and given back as the next past (the mode is reported).
// onnxruntime-web is driven as transformers.js drives it: WebGPU keeps present.* on the GPU
// ('gpu-buffer' outputs fed back as the next past, disposed after use) and reads the logits;
// greedy argmax on the host.

performance.setResourceTimingBufferSize(1_000_000); // relaxweb fetches a shader per kernel

// Every WebAssembly.Memory made in the page (relaxweb's, onnxruntime-web's threaded build's
// imported memory) and every memory an instance exports: the systems' wasm memory.
const wasmMemories = [];
{
  const NativeMemory = WebAssembly.Memory;
  const tracked = new WeakSet();
  const track = (memory) => {
    if (memory instanceof NativeMemory && !tracked.has(memory)) { tracked.add(memory); wasmMemories.push(memory); }
  };
  WebAssembly.Memory = new Proxy(NativeMemory, { construct(target, args) { const m = new target(...args); track(m); return m; } });
  const exported = (result) => {
    const instance = result?.instance ?? result;
    for (const value of Object.values(instance?.exports ?? {})) track(value);
    return result;
  };
  for (const name of ["instantiate", "instantiateStreaming"]) {
    const original = WebAssembly[name];
    WebAssembly[name] = (...args) => original.apply(WebAssembly, args).then(exported);
  }
}
const memoryBytes = (memories) => memories.reduce((sum, m) => sum + m.buffer.byteLength, 0);
const fetchedSince = (start) => performance.getEntriesByType("resource")
  .filter((entry) => entry.startTime >= start)
  .reduce((sum, entry) => sum + (entry.decodedBodySize || entry.encodedBodySize || 0), 0);

// One system for generation: { load(urls, names), generate(prompt, newTokens, onToken) -> {tokens, mode}, release() }.
// names: {pasts, presents, logits, inputs, pastShapes (each [kv heads, 0, head size])}.
const LM_SYSTEMS = {
  relaxweb: () => relaxwebLm("webgpu"),
  "relaxweb-wasm": () => relaxwebLm("wasm"),
  "relaxweb-paged": () => relaxwebLm("webgpu"), // a bundle built with --kv-pages (bench/many_generations.py)
  "relaxweb-wasm-paged": () => relaxwebLm("wasm"),
  "ort-webgpu": () => ortLm("webgpu"),
  "ort-wasm": () => ortLm("wasm"),
};

const GREEDY = { temperature: 0, topK: 0, topP: 1, repetitionPenalty: 1, stopTokens: [] };
const GENERATE_MISSING = /generate\(\) needs the webgpu backend/;

function relaxwebLm(backend) {
  let model;
  let names;
  let useGenerate = true;
  return {
    async load({ bundleUrl }, decoderNames) {
      names = decoderNames;
      const runtime = await import(`${bundleUrl}runtime/relaxweb.js`);
      model = await runtime.load(bundleUrl, backend === "wasm" ? { backend, threads: 1 } : { backend });
      await model.ready;
    },
    async generate(prompt, newTokens, onToken) {
      if (useGenerate) {
        try {
          const generation = await model.generate(prompt, { maxNewTokens: newTokens, ...GREEDY, onToken });
          return { tokens: generation.tokens, mode: "model.generate", runtime: { tokensPerSecond: generation.tokensPerSecond,
                   prefillMs: generation.prefillMs } };
        } catch (error) {
          if (!GENERATE_MISSING.test(String(error?.message))) throw error;
          useGenerate = false; // this build's wasm model cannot generate: per-step runs below
        }
      }
      const step = async (feeds, past) => {
        const outputs = await model.run({ ...feeds, ...past });
        return { logits: outputs[names.logits].data,
                 present: Object.fromEntries(names.pasts.map((n, k) => [n, outputs[names.presents[k]]])) };
      };
      const tokens = await greedyLoop(step, () => {}, prompt, newTokens, names, onToken);
      return { tokens, mode: "model.run per step, the presents read back and given back as the next past (generate() on wasm is not in this build)" };
    },
    // Every prompt at once: concurrent model.generate calls, which a bundle built with --kv-pages
    // advances together (bench/many_generations.py); onToken(index) after each new token.
    async generateTogether(prompts, newTokens, onToken) {
      const before = model.generationStats;
      const generations = await Promise.all(prompts.map((prompt, index) => model.generate(prompt, {
        maxNewTokens: newTokens, ...GREEDY, onToken: () => onToken(index) })));
      const after = model.generationStats;
      const decodeTokens = after.decodeTokens - (before?.decodeTokens ?? 0);
      const decodeSeconds = after.decodeSeconds - (before?.decodeSeconds ?? 0);
      return { generations: generations.map((g) => ({ tokens: g.tokens, prefillMs: g.prefillMs })),
               stats: { ...after, decodeTokensPerSecond: decodeSeconds > 0 ? decodeTokens / decodeSeconds : 0 } };
    },
    release() { model.dispose(); },
    adapterInfo: () => (backend === "webgpu" ? infoOf(model.device.adapterInfo) : null),
    stats: () => (model.stats ? { ...model.stats.lastRun } : null),
    backend: () => model.backend,
  };
}

function ortLm(executionProvider) {
  let ort;
  let session;
  let names;
  return {
    async load({ onnxUrl }, decoderNames) {
      names = decoderNames;
      ort = await import(`/ort/${executionProvider === "webgpu" ? "ort.webgpu.min.mjs" : "ort.wasm.min.mjs"}`);
      ort.env.wasm.wasmPaths = "/ort/";
      ort.env.wasm.numThreads = 1; // the page is not cross-origin isolated: no wasm threads (relaxweb's wasm: 1 too)
      const options = { executionProviders: [executionProvider], graphOptimizationLevel: "all" };
      if (executionProvider === "webgpu") { // the cache stays on the GPU; logits come to the CPU
        options.preferredOutputLocation = Object.fromEntries(names.presents.map((name) => [name, "gpu-buffer"]));
      }
      session = await ort.InferenceSession.create(onnxUrl, options);
    },
    async generate(prompt, newTokens, onToken) {
      const step = async (feeds, past) => {
        const outputs = await session.run(ortInputs(ort, feeds, past));
        const logits = outputs[names.logits];
        const result = { logits: logits.data, present: Object.fromEntries(names.pasts.map((n, k) => [n, outputs[names.presents[k]]])) };
        logits.dispose();
        return result;
      };
      const dispose = (past) => disposeOrtPast(ort, past);
      const tokens = await greedyLoop(step, dispose, prompt, newTokens, names, onToken);
      return { tokens, mode: executionProvider === "webgpu" ? "session.run per step, present.* as 'gpu-buffer' outputs fed back"
        : "session.run per step, present.* fed back as CPU tensors" };
    },
    release() { session.release(); },
    adapterInfo: () => infoOf(ort.env.webgpu?.device?.adapterInfo ?? ort.env.webgpu?.adapter?.info),
    stats: () => null,
    backend: () => executionProvider,
  };
}

// The prompt's prefill (an empty past) and newTokens - 1 decode steps; greedy argmax of the
// last position's logits on the host; onToken(token) after each new token is known.
async function greedyLoop(step, dispose, prompt, newTokens, names, onToken) {
  const ids = (tokens) => ({ data: BigInt64Array.from(tokens, BigInt), shape: [1, tokens.length] });
  const feeds = (tokens, total) => {
    const inputs = { input_ids: ids(tokens) };
    if (names.inputs.includes("attention_mask")) inputs.attention_mask = { data: new BigInt64Array(total).fill(1n), shape: [1, total] };
    if (names.inputs.includes("position_ids")) {
      inputs.position_ids = { data: BigInt64Array.from(tokens, (_, k) => BigInt(total - tokens.length + k)), shape: [1, tokens.length] };
    }
    return inputs;
  };
  let past = Object.fromEntries(names.pasts.map((name, k) => [name, { data: new Float32Array(0), shape: [1, ...names.pastShapes[k]] }]));
  let outputs = await step(feeds(prompt, prompt.length), past);
  const tokens = [];
  for (;;) {
    const vocab = outputs.logits.length / (tokens.length === 0 ? prompt.length : 1);
    const next = argmax(outputs.logits.subarray(outputs.logits.length - vocab));
    tokens.push(next);
    onToken(next);
    if (tokens.length === newTokens) break;
    const previous = outputs.present;
    outputs = await step(feeds([next], prompt.length + tokens.length), previous);
    dispose(previous);
  }
  dispose(outputs.present);
  return tokens;
}

const lmLoaded = {};

window.decodeBench.loadLm = async (system, urls, names) => {
  const before = window.__bench.snapshot();
  const memoriesBefore = wasmMemories.length;
  const start = performance.now();
  lmLoaded[system] = { runner: LM_SYSTEMS[system]() };
  await lmLoaded[system].runner.load(urls, names);
  const loadMs = performance.now() - start;
  const counts = delta(window.__bench.snapshot(), before);
  lmLoaded[system].memories = wasmMemories.slice(memoriesBefore);
  lmLoaded[system].gpuLoadBytes = window.__bench.snapshot().liveBytes - before.liveBytes;
  return { loadMs, counts, fetchedBytes: fetchedSince(start), gpuLiveBytes: lmLoaded[system].gpuLoadBytes,
           wasmMemoryBytes: memoryBytes(lmLoaded[system].memories), adapterInfo: lmLoaded[system].runner.adapterInfo(),
           backend: lmLoaded[system].runner.backend() };
};

// One generation: the prefill's time, each decode step's time and counters, the tokens.
window.decodeBench.generateLm = async (system, prompt, newTokens) => {
  const { runner, memories, gpuLoadBytes } = lmLoaded[system];
  const marks = [];
  const liveAtStart = window.__bench.snapshot().liveBytes; // the other systems' buffers, this one's since its load
  let peakLive = 0;
  const onToken = () => {
    const snapshot = window.__bench.snapshot();
    peakLive = Math.max(peakLive, snapshot.liveBytes - liveAtStart);
    marks.push({ at: performance.now(), snapshot, stats: runner.stats() });
  };
  const start = performance.now();
  const { tokens, mode, runtime } = await runner.generate(prompt, newTokens, onToken);
  const steps = marks.slice(1).map((mark, k) => ({ ms: mark.at - marks[k].at, counts: delta(mark.snapshot, marks[k].snapshot),
                                                   runtimeStats: mark.stats }));
  return { tokens, mode, runtime: runtime ?? null, prefillMs: marks[0].at - start, steps, gpuPeakLiveBytes: gpuLoadBytes + peakLive,
           wasmMemoryBytes: memoryBytes(memories) };
};

window.decodeBench.releaseLm = async (system) => {
  lmLoaded[system].runner.release();
  delete lmLoaded[system];
};

// Several generations (bench/many_generations.py): one after another (any system: each prompt's
// generation, then the next) or together (relaxweb on a paged bundle). The wall time of all,
// each generation's tokens and time to its first token (from the start of all when together,
// from its call when one after another), its decode time (first token to last).
window.decodeBench.generateManyLm = async (system, prompts, newTokens, together) => {
  const { runner } = lmLoaded[system];
  const firsts = prompts.map(() => 0);
  const lasts = prompts.map(() => 0);
  const calls = prompts.map(() => 0);
  const counts = prompts.map(() => 0);
  const onToken = (index) => {
    const now = performance.now();
    if (!firsts[index]) firsts[index] = now;
    lasts[index] = now;
    counts[index] += 1;
  };
  const start = performance.now();
  let tokens;
  let stats = null;
  if (together) {
    calls.fill(start);
    const result = await runner.generateTogether(prompts, newTokens, onToken);
    tokens = result.generations.map((g) => g.tokens);
    stats = result.stats;
  } else {
    tokens = [];
    for (const [index, prompt] of prompts.entries()) {
      calls[index] = performance.now();
      tokens.push((await runner.generate(prompt, newTokens, () => onToken(index))).tokens);
    }
  }
  const wallMs = performance.now() - start;
  return { tokens, wallMs, stats, ttftMs: firsts.map((first, k) => first - calls[k]),
           decodeMs: lasts.map((last, k) => last - firsts[k]), counts };
};
