// The in-page half of bench/batch.py: one system (relaxweb, or onnxruntime-web on WebGPU) and
// one batch of instances of different lengths, run in each of the system's modes:
//   batch       relaxweb's model.runBatch([...instances]) (the ragged batch, issue 16)
//   one-by-one  model.run / session.run per instance, in a loop
//   padded      one run at batch N x maxSeq, the inputs zero-padded on the right (a mask's
//               zeros mark the padding), made in the timed region
// A run is timed from making the input tensors to every output read back to JavaScript.
// Counters come from bench/instrument.js (window.__bench), installed before this page loads.

const delta = (after, before) => Object.fromEntries(Object.entries(after)
  .filter(([key]) => key !== "liveBytes" && key !== "peakLiveBytes")
  .map(([key, value]) => [key, value - before[key]]));
const add = (total, more) => Object.fromEntries(Object.entries(more).map(([key, value]) => [key, (total?.[key] ?? 0) + value]));

const infoOf = (info) => info && {
  vendor: info.vendor, architecture: info.architecture, device: info.device, description: info.description,
};

// A system: { load(urls), modes: { mode: async (batch) -> raw result }, outputs(mode, raw, batch)
// -> one Float32Array per instance (its first output; for padded, its rows [i, :length]) }.
const SYSTEMS = {
  relaxweb() {
    let model;
    const first = (outputs) => outputs[model.outputs[0].name].data;
    return {
      async load({ bundleUrl }) {
        const runtime = await import(`${bundleUrl}runtime/relaxweb.js`);
        model = await runtime.load(bundleUrl);
      },
      modes: {
        async batch(batch) {
          if (typeof model.runBatch !== "function") throw new Error("runBatch missing");
          return (await model.runBatch(batch.fresh())).map(first);
        },
        async "one-by-one"(batch) {
          const outputs = [];
          for (const instance of batch.fresh()) outputs.push(first(await model.run(instance)));
          return outputs;
        },
        async padded(batch) {
          return first(await model.run(batch.padded()));
        },
      },
      adapterInfo: () => infoOf(model.device?.adapterInfo),
      extra: () => ({ lastBatch: model.lastBatch ?? null }),
    };
  },
  "ort-webgpu"() {
    let ort;
    let session;
    const feeds = (inputs) => Object.fromEntries(Object.entries(inputs).map(([name, { data, shape }]) => [
      name, new ort.Tensor(data instanceof BigInt64Array ? "int64" : "float32", data, shape)]));
    const first = (outputs) => outputs[session.outputNames[0]].data;
    return {
      async load({ onnxUrl, externalData }) {
        ort = await import("/ort/ort.webgpu.min.mjs");
        ort.env.wasm.wasmPaths = "/ort/";
        ort.env.wasm.numThreads = 1;
        const options = { executionProviders: ["webgpu"] };
        if (externalData.length > 0) options.externalData = externalData;
        session = await ort.InferenceSession.create(onnxUrl, options);
      },
      modes: {
        async "one-by-one"(batch) {
          const outputs = [];
          for (const instance of batch.fresh()) outputs.push(first(await session.run(feeds(instance))));
          return outputs;
        },
        async padded(batch) {
          return first(await session.run(feeds(batch.padded())));
        },
      },
      adapterInfo: () => infoOf(ort.env.webgpu?.device?.adapterInfo ?? ort.env.webgpu?.adapter?.info),
      extra: () => ({}),
    };
  },
};

let system = null;
let batch = null;

// The instances as batch.py sends them ([{ name: { dtype, shape, base64 } }]) -> the batch:
// fresh() gives new copies of every instance's arrays (as an application makes its tensors),
// padded() one zero-padded batch N x maxSeq of each input, lengths each instance's length.
function makeBatch(encoded, maxSeq) {
  const instances = encoded.map((inputs) => Object.fromEntries(Object.entries(inputs).map(
    ([name, { dtype, shape, base64 }]) => {
      const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
      const Type = { float32: Float32Array, int64: BigInt64Array }[dtype];
      if (!Type) throw new Error(`input ${name}: dtype ${dtype} is not handled by the batch page`);
      return [name, { data: new Type(bytes.buffer), shape }];
    })));
  const names = Object.keys(instances[0]);
  const lengths = instances.map((instance) => instance[names[0]].shape[1]);
  return {
    lengths,
    maxSeq,
    fresh: () => instances.map((instance) => Object.fromEntries(Object.entries(instance).map(
      ([name, { data, shape }]) => [name, { data: data.slice(), shape }]))),
    padded() {
      return Object.fromEntries(names.map((name) => {
        const Type = instances[0][name].data.constructor;
        const data = new Type(instances.length * maxSeq); // zeros: the padding
        instances.forEach((instance, row) => data.set(instance[name].data, row * maxSeq));
        return [name, { data, shape: [instances.length, maxSeq] }];
      }));
    },
  };
}

// One Float32Array per instance from a mode's raw result.
function perInstance(mode, raw) {
  if (mode !== "padded") return raw.map((data) => Float32Array.from(data, Number));
  const inner = raw.length / (batch.lengths.length * batch.maxSeq);
  return batch.lengths.map((length, row) => Float32Array.from(
    raw.subarray(row * batch.maxSeq * inner, (row * batch.maxSeq + length) * inner), Number));
}

function base64Of(floats) {
  const bytes = new Uint8Array(floats.buffer, floats.byteOffset, floats.byteLength);
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(binary);
}

window.batchBench = {
  async pageAdapter() {
    if (!navigator.gpu) return { error: "navigator.gpu is missing: no WebGPU in this page" };
    const adapter = await navigator.gpu.requestAdapter();
    return adapter ? infoOf(adapter.info) : { error: "requestAdapter() returned null" };
  },

  async load(name, urls) {
    const start = performance.now();
    system = SYSTEMS[name]();
    await system.load(urls);
    return { loadMs: performance.now() - start, adapterInfo: system.adapterInfo() };
  },

  setInstances({ instances, maxSeq }) {
    batch = makeBatch(instances, maxSeq);
    return batch.lengths;
  },

  // Each mode once, untimed for the median (its time and counters reported as the first run;
  // its outputs returned for the check), `warmup` more passes, then `runs` timed passes over
  // the modes in turn (interleaved). A mode that fails is reported by its error and skipped.
  async measure({ modes, warmup, runs }) {
    const results = {};
    const timed = async (mode) => {
      const before = window.__bench.snapshot();
      const start = performance.now();
      const raw = await system.modes[mode](batch);
      return { ms: performance.now() - start, counts: delta(window.__bench.snapshot(), before), raw };
    };
    for (const mode of modes) {
      try {
        const { ms, counts, raw } = await timed(mode);
        results[mode] = { firstMs: ms, first: counts, outputs: perInstance(mode, raw).map(base64Of),
                          timesMs: [], steady: null };
      } catch (error) {
        results[mode] = { error: String(error?.message ?? error) };
      }
    }
    const live = () => modes.filter((mode) => !results[mode].error);
    for (let i = 0; i < warmup; i += 1) for (const mode of live()) await system.modes[mode](batch);
    for (let i = 0; i < runs; i += 1) {
      for (const mode of live()) {
        try {
          const { ms, counts } = await timed(mode);
          results[mode].timesMs.push(ms);
          results[mode].steady = add(results[mode].steady, counts);
        } catch (error) {
          results[mode] = { error: String(error?.message ?? error) };
        }
      }
    }
    for (const mode of live()) results[mode].steady ??= {};
    if (results.batch && !results.batch.error) results.batch.extra = system.extra(); // relaxweb's lastBatch
    return results;
  },
};
window.batchBenchReady = true;
