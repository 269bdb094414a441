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
    const tensor = ({ data, shape }) => new ort.Tensor(data instanceof BigInt64Array ? "int64" : "float32", data, shape);
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
        const inputs = Object.fromEntries(Object.entries(feeds).map(([name, value]) => [name, tensor(value)]));
        for (const [name, value] of Object.entries(past)) inputs[name] = value instanceof ort.Tensor ? value : tensor(value);
        const outputs = await session.run(inputs);
        const present = Object.fromEntries(names.pasts.map((name, k) => [name, outputs[names.presents[k]]]));
        return { logits: outputs[names.logits].data, present };
      },
      dispose(past) {
        for (const value of Object.values(past)) if (value instanceof ort.Tensor) value.dispose();
      },
      adapterInfo: () => infoOf(ort.env.webgpu?.device?.adapterInfo ?? ort.env.webgpu?.adapter?.info),
      stats: () => null,
    };
  },
};

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
