// The in-page half of bench/run.py: loads one system (relaxweb, or onnxruntime-web with one
// execution provider), then runs it shape by shape. run.py drives it through window.bench.
// Counters come from bench/instrument.js (window.__bench), installed before this page loads.

// What the counters grew by between two snapshots (live/peak bytes are not counters).
const delta = (after, before) => Object.fromEntries(Object.entries(after)
  .filter(([key]) => key !== "liveBytes" && key !== "peakLiveBytes")
  .map(([key, value]) => [key, value - before[key]]));

// Every Worker the page creates (relaxweb's wasm thread pool, onnxruntime-web's pthreads), so
// the report can say how many threads a system really started: wrapped before any system loads.
const workersCreated = [];
const PageWorker = globalThis.Worker;
globalThis.Worker = class extends PageWorker {
  constructor(url, options) {
    super(url, options);
    workersCreated.push(String(url).split("/").pop().split("?")[0]);
  }
};

const infoOf = (info) => info && {
  vendor: info.vendor, architecture: info.architecture, device: info.device,
  description: info.description,
};

// One system: { name, async load(model), async run(inputs) -> TypedArray, adapterInfo() }.
// `inputs` is { name: { data: TypedArray, shape } }; run returns the first output's data.
// relaxweb on WebGPU (options {}) or on its kernels.wasm ({backend: "wasm", threads: N}).
const SYSTEMS = {
  relaxweb: (backendOptions) => () => {
    let model;
    let pipelinesReadyMs = null; // from the start of load until model.ready settled
    return {
      // relaxwebOptions: bench/run.py --relaxweb-options, passed to load() as they are (the
      // hook for runtime options such as a per-kernel profile; extra() is where its report goes).
      async load({ bundleUrl, relaxwebOptions }) {
        const start = performance.now();
        const runtime = await import(`${bundleUrl}runtime/relaxweb.js`);
        model = await runtime.load(bundleUrl, { ...relaxwebOptions, ...backendOptions });
        // load() returns before every pipeline is compiled; model.ready settles when all are
        model.ready?.then(() => { pipelinesReadyMs = performance.now() - start; }, () => {});
      },
      async run(inputs) {
        const outputs = await model.run(inputs);
        return outputs[model.outputs[0].name].data;
      },
      adapterInfo: () => infoOf(model.device?.adapterInfo),
      extra: () => (model.backend === "wasm"
        ? { backend: model.backend, threads: model.threads, unitsRunByWorkers: model.unitsRunByWorkers,
            lastDispatchCount: model.lastDispatchCount, warmUp: model.runBackend?.warmUp, ...threadEvidence() }
        : { lastDispatchCount: model.lastDispatchCount, pipelinesReadyMs, kernels: model.kernels }),
      // one warm-up run, then one with every dispatch timed (model.profile): the top kernels.
      // On wasm no warm-up: nothing is compiled at run time, and the case's runs just ran at this
      // shape (a real model's run there takes seconds to minutes).
      async profile(inputs) {
        const { profile } = await model.profile(inputs, { warmup: model.backend === "wasm" ? 0 : 1 });
        return { method: profile.method, dispatches: profile.dispatches, totalMs: profile.totalMs,
                 rows: profile.rows.slice(0, 10) };
      },
    };
  },
  // onnxruntime-web, served from node_modules/onnxruntime-web/dist at /ort/. The non-bundled
  // builds are used so its .mjs/.wasm files are fetched (and measured) separately. Its wasm
  // threads (numThreads > 1) need a cross-origin isolated page; elsewhere it falls back to 1.
  ort: (executionProvider, numThreads = 1) => () => {
    let ort;
    let session;
    return {
      async load({ onnxUrl, externalData }) {
        const file = executionProvider === "webgpu" ? "ort.webgpu.min.mjs" : "ort.wasm.min.mjs";
        ort = await import(`/ort/${file}`);
        ort.env.wasm.wasmPaths = "/ort/";
        ort.env.wasm.numThreads = numThreads;
        const options = { executionProviders: [executionProvider] };
        if (externalData.length > 0) options.externalData = externalData; // the weights beside the .onnx
        session = await ort.InferenceSession.create(onnxUrl, options);
      },
      async run(inputs) {
        const feeds = {};
        for (const [name, { data, shape }] of Object.entries(inputs)) {
          feeds[name] = new ort.Tensor(data instanceof BigInt64Array ? "int64" : "float32", data, shape);
        }
        const outputs = await session.run(feeds);
        return outputs[session.outputNames[0]].data;
      },
      adapterInfo: () => infoOf(ort.env.webgpu?.device?.adapterInfo ?? ort.env.webgpu?.adapter?.info),
      extra: () => ({ executionProvider, numThreads: ort.env.wasm.numThreads, ...threadEvidence() }),
    };
  },
};
// The wasm systems at 2 threads ("-2t") and at 1 in the same page kind ("-1t-iso") are loaded
// in a cross-origin isolated page (run.py).
SYSTEMS["relaxweb-wasm"] = SYSTEMS.relaxweb({ backend: "wasm", threads: 1 });
SYSTEMS["relaxweb-wasm-1t-iso"] = SYSTEMS.relaxweb({ backend: "wasm", threads: 1 });
SYSTEMS["relaxweb-wasm-2t"] = SYSTEMS.relaxweb({ backend: "wasm", threads: 2 });
SYSTEMS.relaxweb = SYSTEMS.relaxweb({});
SYSTEMS["ort-webgpu"] = SYSTEMS.ort("webgpu");
SYSTEMS["ort-wasm"] = SYSTEMS.ort("wasm");
SYSTEMS["ort-wasm-1t-iso"] = SYSTEMS.ort("wasm", 1);
SYSTEMS["ort-wasm-2t"] = SYSTEMS.ort("wasm", 2);
delete SYSTEMS.ort;

// What says whether a wasm system could run threads and started them: the page's isolation
// and the workers created since the page opened (their script names).
function threadEvidence() {
  return { crossOriginIsolated: globalThis.crossOriginIsolated === true, workersCreated: [...workersCreated] };
}

let system = null;
let lastInputs = null; // the inputs runShape last ran (a function that copies them)

window.bench = {
  // The adapter a plain requestAdapter() gives this page (what both systems also request).
  async pageAdapter() {
    if (!navigator.gpu) return { error: "navigator.gpu is missing: no WebGPU in this page" };
    const adapter = await navigator.gpu.requestAdapter();
    return adapter ? infoOf(adapter.info) : { error: "requestAdapter() returned null" };
  },

  // Import the runtime and load the model; the time covers the runtime's download too.
  async load(name, urls) {
    const before = window.__bench.snapshot();
    const start = performance.now();
    system = SYSTEMS[name]();
    await system.load(urls);
    const loadMs = performance.now() - start;
    return { loadMs, counts: delta(window.__bench.snapshot(), before), adapterInfo: system.adapterInfo() };
  },

  // At one shape: one first run (timed and counted alone), `warmup` runs, then `runs` timed
  // runs. Inputs come as { name: { dtype, shape, base64 } }. Returns the times, the counters'
  // differences, and the first run's first output (float32 bytes in base64).
  // With `budgetMs` (run.py --budget-s) the warm-up and timed runs stop once the case has
  // taken that long, the first run included: a system that needs minutes per run runs once.
  async runShape({ inputs, warmup, runs, budgetMs = Infinity }) {
    const tensors = decodeInputs(inputs);
    lastInputs = tensors;
    let before = window.__bench.snapshot();
    const caseStart = performance.now();
    let start = caseStart;
    const output = await system.run(tensors());
    const firstRunMs = performance.now() - start;
    const firstRun = delta(window.__bench.snapshot(), before);
    const withinBudget = () => performance.now() - caseStart < budgetMs;
    for (let i = 0; i < warmup && withinBudget(); i += 1) await system.run(tensors());
    before = window.__bench.snapshot();
    const timesMs = [];
    for (let i = 0; i < runs && withinBudget(); i += 1) {
      start = performance.now();
      await system.run(tensors());
      timesMs.push(performance.now() - start);
    }
    const steady = delta(window.__bench.snapshot(), before);
    const floats = Float32Array.from(output, Number);
    let binary = "";
    const bytes = new Uint8Array(floats.buffer);
    for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
    return { firstRunMs, firstRun, steady, timesMs, extra: system.extra(), output: btoa(binary), totals: window.__bench.snapshot() };
  },

  // run.py --interleave: `count` more timed runs of the inputs runShape last ran, with what
  // the counters grew by over them.
  async timeRuns({ count }) {
    const before = window.__bench.snapshot();
    const timesMs = [];
    for (let i = 0; i < count; i += 1) {
      const start = performance.now();
      await system.run(lastInputs());
      timesMs.push(performance.now() - start);
    }
    return { timesMs, steady: delta(window.__bench.snapshot(), before), extra: system.extra(), totals: window.__bench.snapshot() };
  },

  // relaxweb only (run.py --profile), after runShape at the same shape: where a run's time goes.
  async profileShape({ inputs }) {
    if (!system.profile) throw new Error("this system has no per-kernel profile");
    return system.profile(decodeInputs(inputs)());
  },
};

// Inputs as run.py sends them ({ name: { dtype, shape, base64 } }) -> a function that returns
// a fresh copy of them per run, as an application makes new tensors.
function decodeInputs(inputs) {
  const arrays = Object.fromEntries(Object.entries(inputs).map(([name, { dtype, shape, base64 }]) => {
    const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
    const Type = { float32: Float32Array, int64: BigInt64Array }[dtype];
    if (!Type) throw new Error(`input ${name}: dtype ${dtype} is not handled by the benchmark page`);
    return [name, { data: new Type(bytes.buffer), shape }];
  }));
  return () => Object.fromEntries(Object.entries(arrays).map(([name, { data, shape }]) => [name, { data: data.slice(), shape }]));
}
window.benchReady = true;
