// The browser runtime of relaxweb: loads a bundle (docs/bundle-format.md) and runs it on
// WebGPU. No build step; types are in JSDoc and in relaxweb.d.ts.
//
//   import { load } from "./runtime/relaxweb.js";
//   const model = await load("./");
//   const { y } = await model.run({ x: { data: new Float32Array(64), shape: [1, 64] } });

import {
  FORMAT_VERSION, InputShapeError, TYPED_ARRAY_OF_DTYPE, OPCODE_DISPATCH, OPCODE_READ, OPCODE_RESUME,
  isSequence, deviceShortfalls, dtypeInfo, fromDeviceData, loadTimeLimits, storageSizeProblem,
  weightPartSizes,
  SHADER_F16, chooseKernels,
} from "./host.js";
import { BufferPool, GpuTensor, TransferStats, cacheBlockCopies } from "./gpu_tensor.js";
import { generate } from "./generate.js";
import { prepareInputs, splitElements } from "./tensors.js";
import { makeTokenizer } from "./tokenizer.js";
import { validateManifest } from "./manifest.js";
import { RemoteHost } from "./remote_host.js";
import { SubmitTimer, TimestampTimer, summarize } from "./profile.js";
import { WasmModel, sharedMemoryVariant, splitUnits, threadCount } from "./wasm_backend.js";
import {
  RAGGED, SliceLayout, batchTable, callElements, checkInstances, checkTotals, chunks, gridOf, instanceError, mergeDispatches, oneByOneReason,
  runOneByOne,
} from "./batch.js";

export { GpuTensor, InputShapeError, WasmModel, sharedMemoryVariant, splitUnits };

/**
 * @typedef {import("./host.js").InputTensor} Tensor
 * @typedef {{loaded: number, total: number}} Progress  bytes of weights fetched so far / in all
 * @typedef {Object} LoadOptions
 * @property {"auto"|"webgpu"|"wasm"} [backend]  what runs the kernels: "webgpu", "wasm" (the
 *   bundle's kernels.wasm on the CPU, wasm_backend.js), or "auto" (the default): WebGPU where
 *   the page's adapter (or `device`) meets the bundle's required limits and features, else
 *   wasm when the bundle has kernels.wasm; `model.backend` says which
 * @property {number} [threads]  the wasm backend's threads, where the page is cross-origin
 *   isolated (default: min(navigator.hardwareConcurrency, 4)); elsewhere always 1; `model.threads`
 * @property {Record<string, number>} [bounds]  tighter bounds for symbolic vars (at most the build's)
 * @property {(progress: Progress) => void} [onProgress]  called as weight bytes arrive
 * @property {GPUDevice} [device]  a device to use instead of requesting one
 * @property {boolean|string} [cache]  keep the weight shards in the Cache API (`true`: the
 *   cache "relaxweb", a string: that cache's name); they are still verified on every load
 * @property {boolean} [profile]  request the adapter's "timestamp-query" feature when it has
 *   one, so that `model.profile()` times kernels on the GPU (never requested otherwise)
 * @property {"auto"|"gpu"|"cpu"|"f16"} [kernels]  for kernels with a second shader (the
 *   manifest's `cpu_file` for CPU adapters, `f16_file` for adapters with "shader-f16"), which
 *   to compile: "auto" (the default) takes the CPU one on a CPU adapter such as SwiftShader,
 *   else the f16 one where the adapter has "shader-f16"; "f16" falls back to "gpu" (with a
 *   console warning) where it lacks it; `model.kernels` says which were compiled
 * @property {{maxStorageBufferBindingSize?: number, maxBufferSize?: number}} [limits]  lower
 *   buffer size limits to split the weights the bundle binds in parts at, as a device that
 *   offers only these would (storages keep the device's own limits); see docs/bundle-format.md
 */

/**
 * A weight bound in parts: the buffer bound for each part (a placeholder for the parts a
 * device binding it whole does not use) and the byte sizes of the real ones.
 * @typedef {{buffers: GPUBuffer[], sizes: number[]}} WeightParts
 */

/** The Cache API cache that `cache: true` uses. */
export const DEFAULT_CACHE_NAME = "relaxweb";

/**
 * A run's outputs, copied into one mappable buffer (`size` bytes of it; null when every
 * output is kept on the GPU) by its last submit; kept outputs are their GpuTensors.
 * @typedef {{buffer: GPUBuffer|null, size: number, outputs: {name: string, dtype: string, info: import("./host.js").DtypeInfo, shape: number[], offset: number, bytes: number, storage: number, kept: GpuTensor|null}[], elementShapes?: ({shapes: number[][]|null}|null)[]}} Readback
 */

/** GPU buffer usages (the GPUBufferUsage flags, spelled out so that Node can import this file). */
const USAGE = { MAP_READ: 0x1, COPY_SRC: 0x4, COPY_DST: 0x8, UNIFORM: 0x40, STORAGE: 0x80 };
const COMPUTE_STAGE = 0x4;

/**
 * Load a bundle and prepare it to run.
 * @param {string|URL} url the bundle folder (or its manifest.json)
 * @param {LoadOptions} [options]
 * @returns {Promise<Model|WasmModel>} a Model on WebGPU, a WasmModel on the wasm backend
 */
export async function load(url, {
  backend = "auto", threads, bounds, onProgress, device, cache, profile = false, kernels = "auto", limits = {},
} = {}) {
  if (!["auto", "webgpu", "wasm"].includes(backend)) throw new Error(`backend must be "auto", "webgpu" or "wasm", got ${String(backend).slice(0, 40)}`);
  if (!["auto", "gpu", "cpu", "f16"].includes(kernels)) throw new Error(`kernels must be "auto", "gpu", "cpu" or "f16", got ${String(kernels).slice(0, 40)}`);
  if (threads !== undefined) threadCount(threads); // checks the option even where there are no threads
  checkLimitCaps(limits);
  const manifestUrl = resolveManifestUrl(url);
  let manifest;
  try {
    manifest = await (await fetchOk(manifestUrl)).json();
  } catch (error) {
    if (!(error instanceof SyntaxError)) throw error;
    throw new Error(`${manifestUrl} is not valid JSON: ${error.message}`);
  }
  if (manifest === null || typeof manifest !== "object" || manifest.format !== "relaxweb-bundle") {
    throw new Error(`${manifestUrl} is not a relaxweb bundle manifest`);
  }
  if (manifest.version !== FORMAT_VERSION) {
    throw new Error(
      `${manifestUrl} has bundle format version ${String(JSON.stringify(manifest.version)).slice(0, 40)}; this runtime reads version ${FORMAT_VERSION} (rebuild the bundle with this relaxweb)`,
    );
  }
  validateManifest(manifest);
  for (const tensor of [...manifest.inputs, ...manifest.outputs]) {
    if (!Object.hasOwn(TYPED_ARRAY_OF_DTYPE, tensor.dtype)) {
      throw new Error(`'${tensor.name}' has dtype ${tensor.dtype}, which this runtime does not support`);
    }
    dtypeInfo(manifest, tensor); // the manifest says how the GPU holds it
  }
  const wasmProblem = kernelsWasmProblem(manifest);
  if (backend === "wasm" && wasmProblem) throw new Error(`${wasmProblem}; load it with backend "webgpu"`);
  const fileUrl = (/** @type {string} */ file) => new URL(file, manifestUrl);

  // The adapter comes first (a given device knows its own): which backend runs, and which
  // kernel shaders to fetch, depend on it. "auto" takes a missing adapter for the wasm backend.
  /** @type {Error|null} why there is no adapter ("auto" only: the wasm backend may run instead) */
  let adapterError = null;
  const adapterPromise = device || backend === "wasm" ? Promise.resolve(null)
    : backend === "auto" ? requestAdapter().then((a) => a ?? Promise.reject(new Error(NO_ADAPTER)))
      .catch((/** @type {Error} */ error) => { adapterError = error; return null; })
    : requestAdapter();
  // The kernels of the backend the adapter makes likely are fetched with the shards (the
  // choice itself waits for the host module's sizes at the bounds; the other backend's kernels
  // are fetched then, when it is the other one).
  const wasmLikely = adapterPromise.then((a) => backend === "wasm" || (backend === "auto" && !device && a === null));
  const wasmBytesPromise = wasmLikely.then((likely) => (likely && !wasmProblem ? fetchBytes(fileUrl(manifest.wasm.file)) : null));
  const shadersPromise = Promise.all([wasmLikely, adapterPromise]).then(([likely, a]) =>
    (likely ? null : fetchKernelSources(manifest, fileUrl, chosenKernels(kernels, device ?? a, manifest))));
  for (const promise of [wasmBytesPromise, shadersPromise]) promise.catch(() => {}); // awaited below, where used
  const [host, shards, adapter] = await Promise.all([
    fetchBytes(fileUrl("host.wasm")).then((b) => RemoteHost.instantiate(b, manifest)),
    openShardCache(cache).then((shardCache) => fetchShards(manifest, fileUrl, onProgress, shardCache)),
    adapterPromise,
  ]);
  try {
    const configured = await host.configure(bounds);
    const { sizesAtBounds } = configured;
    const requiredLimits = loadTimeLimits(manifest, sizesAtBounds);
    const requiredFeatures = [...(manifest.required_features ?? [])];
    if (chosenBackend(backend, manifest, device ?? adapter, requiredLimits, requiredFeatures) === "wasm") {
      const wasmBytes = (await wasmBytesPromise) ?? (await fetchBytes(fileUrl(manifest.wasm.file)));
      const model = await WasmModel.create(manifest, host, wasmBytes, shards, { threads, ...configured });
      console.info(`relaxweb: the wasm backend runs this model (${model.threads} thread${model.threads === 1 ? "" : "s"})`);
      return model;
    }
    if (adapterError) throw new Error(`${adapterError.message}, and ${wasmProblem}`);
    const kernelShaders = (await shadersPromise) ?? (await fetchKernelSources(manifest, fileUrl, chosenKernels(kernels, device ?? adapter, manifest)));
    if (kernelShaders.kernels === "f16" && !requiredFeatures.includes(SHADER_F16)) requiredFeatures.push(SHADER_F16);
    const gpuDevice = device ?? (await requestDevice(adapter, requiredLimits, requiredFeatures, sizesAtBounds === null, profile));
    checkDevice(gpuDevice, requiredLimits, requiredFeatures, "device");
    const model = await Model.create(manifest, host, gpuDevice, { ...kernelShaders, shards, ownsDevice: !device, limitCaps: limits, fileUrl, ...configured });
    console.info("relaxweb: the webgpu backend runs this model");
    return model;
  } catch (error) {
    host.dispose(); // stops its worker (Model.create's failure disposed the rest)
    throw error;
  }
}

const NO_ADAPTER = "WebGPU is available but no GPU adapter was found";

/**
 * Why the wasm backend cannot run a bundle (its manifest's `wasm` entry is missing, or says
 * why the build wrote no kernels.wasm), or null.
 * @param {any} manifest @returns {string|null}
 */
function kernelsWasmProblem(manifest) {
  if (manifest.wasm?.file) return null;
  if (manifest.wasm?.unavailable !== undefined) return `this bundle has no kernels.wasm: ${manifest.wasm.unavailable}`;
  return "this bundle has no kernels.wasm (its manifest has no \"wasm\" entry: rebuild it with a relaxweb that writes one)";
}

/**
 * Which backend runs the bundle: the one asked for, or for "auto" WebGPU where the adapter
 * (or the given device) meets the bundle's required limits and features, else wasm (when
 * the bundle has kernels.wasm; without it, WebGPU, whose errors say what is missing).
 * @param {"auto"|"webgpu"|"wasm"} backend @param {any} manifest @param {GPUAdapter|GPUDevice|null} gpu
 * @param {Record<string, number>} requiredLimits @param {string[]} requiredFeatures
 * @returns {"webgpu"|"wasm"}
 */
function chosenBackend(backend, manifest, gpu, requiredLimits, requiredFeatures) {
  if (backend !== "auto") return backend;
  const gpuFits = gpu !== null && deviceShortfalls(gpu, requiredLimits, requiredFeatures, "GPU adapter").length === 0;
  return gpuFits || kernelsWasmProblem(manifest) ? "webgpu" : "wasm";
}

/** A loaded bundle: its GPU resources and its host module. */
export class Model {
  /**
   * @param {any} manifest
   * @param {RemoteHost} host
   * @param {GPUDevice} device
   * @param {{kernelSources: string[], kernelFiles: string[], kernels: "gpu"|"cpu"|"f16", shards: Uint8Array[], ownsDevice: boolean,
   *   bounds: (number|null)[], sizesAtBounds: number[]|null, limitCaps?: Record<string, number>, fileUrl?: (file: string) => URL}} parts
   * @returns {Promise<Model>}
   */
  static async create(manifest, host, device, parts) {
    const model = new Model(manifest, host, device, parts.ownsDevice, parts.bounds);
    model.kernels = parts.kernels;
    model.fileUrl = parts.fileUrl ?? null;
    model.storageSizesAtBounds = parts.sizesAtBounds;
    try {
      const modules = await model.orDeviceLoss(compileKernels(device, manifest, parts.kernelSources, parts.kernelFiles));
      await model.captureGpuErrors("load", () => {
        model.weightBuffers = createWeightBuffers(model, manifest, parts.shards);
        model.weightParts = createWeightParts(model, manifest, parts.shards, parts.limitCaps ?? {});
        model.allocateStoragesAtBounds(parts.sizesAtBounds);
        model.startPipelines(modules);
      });
      return model;
    } catch (error) {
      model.dispose();
      throw error;
    }
  }

  /**
   * @param {any} manifest
   * @param {RemoteHost} host
   * @param {GPUDevice} device
   * @param {boolean} ownsDevice
   * @param {(number|null)[]} bounds the bound of each symbolic var in effect
   */
  constructor(manifest, host, device, ownsDevice, bounds) {
    this.manifest = manifest;
    this.host = host;
    this.device = device;
    this.ownsDevice = ownsDevice;
    /** Which backend runs the kernels. @type {"webgpu"} */
    this.backend = "webgpu";
    /** Which shaders the kernels with a variant were compiled from: "gpu", "cpu" or "f16". @type {"gpu"|"cpu"|"f16"} */
    this.kernels = "gpu";
    /** @type {{name: string, dtype: string, shape: (number|string)[]}[]} */
    this.inputs = manifest.inputs;
    /** @type {{name: string, dtype: string, shape: (number|string)[]}[]} */
    this.outputs = manifest.outputs;
    /** The symbolic vars, with the bounds in effect (after the `bounds` option). */
    this.symbolicVars = manifest.symbolic_vars.map((/** @type {any} */ v, /** @type {number} */ i) => ({
      ...v,
      bound: bounds[i],
    }));
    /** @type {GPUComputePipeline[]} one per kernel, each set when it is ready (startPipelines) */
    this.pipelines = [];
    /** @type {Promise<GPUComputePipeline>[]} one per kernel: settles when its pipeline is ready */
    this.pipelinePromises = [];
    /**
     * Resolves when every pipeline is ready; rejects if one cannot be created. A run does
     * not wait for it: each dispatch waits for its own kernel's pipeline only.
     * @type {Promise<void>}
     */
    this.ready = Promise.resolve();
    this.allPipelinesReady = false;
    /** @type {(GPUBuffer|null)[]} one per weight bound whole (null for a weight in parts) */
    this.weightBuffers = [];
    /** @type {Map<number, WeightParts>} the buffers bound for each part of a weight in parts, by weight */
    this.weightParts = new Map();
    /** @type {GPUBuffer[]} one per storage, allocated at load, grown when a run needs more */
    this.storageBuffers = [];
    /** KV caches (manifest "caches") by input index and by output index. @type {Map<number, any>} */
    this.cacheOfInput = new Map((manifest.caches ?? []).map((/** @type {any} */ c) => [c.input, c]));
    /** @type {Map<number, any>} */
    this.cacheOfOutput = new Map((manifest.caches ?? []).map((/** @type {any} */ c) => [c.output, c]));
    /** Runs that started writing the GPU: a view of a cache is current while it is this run's. */
    this.runNumber = 0;
    /** @type {(GPUBindGroup|null)[]} one per call site, rebuilt when a storage it uses is replaced */
    this.bindGroups = manifest.call_sites.map(() => null);
    /** Counts of its GPU calls: `total` since load began, `lastRun` since the last run started;
     * `liveGpuBytes`: the bytes of its buffers not destroyed. */
    this.stats = new TransferStats();
    /** The bundle's tokenizer (tokenizer.js), or null when it has none. */
    this.tokenizer = manifest.tokenizer ? makeTokenizer(manifest.tokenizer) : null;
    /** Buffers of disposed GpuTensors, for the next kept outputs; idle readback buffers. */
    this.gpuTensorPool = new BufferPool();
    this.readbackPool = new BufferPool();
    /** @type {number[]|null} each storage's size at the bounds: a kept output's buffer size (null: unbounded) */
    this.storageSizesAtBounds = null;
    this.paramsBuffer = this.createBuffer({
      label: "params",
      size: Math.max(manifest.params_bytes, 256),
      usage: USAGE.UNIFORM | USAGE.COPY_DST,
    });
    /** @type {GPUBuffer|null} where a value read back mid-run lands (4 bytes, made on the first read) */
    this.readValueBuffer = null;
    /** Dispatches of the last run, over all its steps. */
    this.lastDispatchCount = 0;
    /** Values the last run read back from the GPU (0 for bundles without reads). */
    this.lastReadCount = 0;
    /** How the last runBatch ran (batch.js). @type {import("./batch.js").BatchReport|null} */
    this.lastBatch = null;
    /** @type {GPUBuffer[]} one per storage for batches: every instance's slice, packed (allocated by runBatch) */
    this.batchStorageBuffers = [];
    /** @type {Promise<GPUComputePipeline[]>|null} the kernels' ragged forms, compiled on the first runBatch */
    this.batchPipelinesPromise = null;
    /** @type {((file: string) => URL)|null} the URL of a bundle file (load() sets it: runBatch fetches the ragged kernels) */
    this.fileUrl = null;
    /**
     * Resolves when the run in progress no longer needs the host module: runs take turns,
     * since a run that reads values back keeps its state in the host across awaits.
     * @type {Promise<void>}
     */
    this.turn = Promise.resolve();
    /** @type {string|null} why the model cannot run any more (disposed, device lost) */
    this.unusableReason = null;
    /** Resolves with an Error when the device is lost. */
    this.lost = device.lost.then((info) => {
      this.unusableReason ??= `the WebGPU device was lost (${info.reason}): ${info.message}`;
      return new Error(this.unusableReason);
    });
  }

  /**
   * Run the model. `keepOnGpu` (output names, or true for every output but sequences) gives
   * those outputs as GpuTensors, nothing read back; a GpuTensor input is copied on the GPU.
   * @param {Record<string, Tensor|GpuTensor>} inputs name -> {data, shape} or GpuTensor
   * @param {{keepOnGpu?: boolean|string[]}} [options]
   * @returns {Promise<Record<string, Tensor|GpuTensor>>} name -> {data, shape} or GpuTensor
   */
  async run(inputs, { keepOnGpu = false } = {}) {
    return this.runTimed(inputs, null, keepOnGpu);
  }

  /**
   * Run a batch of instances, each its own inputs with its own values of the model's symbolic
   * sizes, and return each instance's outputs (as run() gives them), in order. On WebGPU one
   * dispatch of each kernel's ragged form serves every instance that runs a call site
   * (runtime_js/batch.js; docs/bundle-format.md "Batches"), each instance in its own slice of
   * every storage; a bundle that cannot batch (batch.js oneByOneReason) runs the instances one
   * after another. Every instance's inputs are checked and its host module run before any GPU
   * work: an error names the instance. `lastBatch` says how it ran.
   * @param {Record<string, Tensor>[]} instances
   * @param {{keepOnGpu?: boolean|string[]}} [options]
   * @returns {Promise<Record<string, Tensor>[]>}
   */
  async runBatch(instances, { keepOnGpu = false } = {}) {
    if (this.unusableReason) throw new Error(`cannot run: ${this.unusableReason}`);
    checkInstances(instances);
    if (keepOnGpu && !(Array.isArray(keepOnGpu) && keepOnGpu.length === 0)) {
      throw new Error("runBatch reads every output back: keepOnGpu is an option of run()");
    }
    const reason = oneByOneReason(this.manifest, instances);
    if (reason) {
      const { outputs, report } = await runOneByOne((inputs) => this.run(inputs), instances, reason, this);
      this.lastBatch = report;
      return outputs;
    }
    // Checked and copied now (as run() does), each error naming its instance.
    const prepared = instances.map((inputs, k) => {
      try {
        return prepareInputs(this.manifest, inputs);
      } catch (error) {
        throw instanceError(k, error);
      }
    });
    const previous = this.turn;
    /** @type {() => void} */
    let endTurn = () => {};
    this.turn = new Promise((resolve) => { endTurn = resolve; });
    let readbacks;
    try {
      await previous;
      if (this.unusableReason) throw new Error(`cannot run: ${this.unusableReason}`);
      this.stats.startRun();
      readbacks = await this.runBatchRounds(prepared);
    } finally {
      endTurn();
    }
    const outputs = [];
    try {
      for (const readback of readbacks) outputs.push(await this.readOutputs(readback));
    } finally {
      for (const readback of readbacks.slice(outputs.length + 1)) readback.buffer?.destroy();
    }
    return outputs;
  }

  /**
   * The ragged batch up to its last submit (runtime/batch.py's algorithm): every instance's
   * host run on its own session; the packed layout checked against the device's limits; then
   * rounds: each live instance's command list (up to its next read or resume), the lists'
   * dispatches merged into ragged dispatches, one compute pass and one submit; reads copied
   * from each instance's slice into one staging buffer mapped once, instances resumed, storages
   * grown (each slice's contents kept) for the next round; an instance whose list ends with its
   * outputs has them copied out of its slices by that round's submit.
   * @param {{shapes: number[][], sequences: Record<number, number[][]|null>, deviceInputs: Record<string, any>}[]} prepared
   * @returns {Promise<Readback[]>} each instance's outputs to map
   */
  async runBatchRounds(prepared) {
    const { manifest, host, device } = this;
    const count = prepared.length;
    /** @type {(import("./host.js").HostStep & {varValues?: Record<string, number>})[]} */
    const steps = [];
    for (const [k, { shapes, sequences }] of prepared.entries()) {
      try {
        steps.push(await host.startInstance(k, shapes, sequences));
      } catch (error) {
        throw instanceError(k, error);
      }
    }
    const varValues = steps.map((step) => step.varValues ?? {});
    const sizes = steps.map((step) => [...step.sizes]);
    let layout = SliceLayout.of(sizes);
    const limits = device.limits;
    const [largest, limitName] = limits.maxBufferSize < limits.maxStorageBufferBindingSize
      ? [limits.maxBufferSize, "maxBufferSize"] : [limits.maxStorageBufferBindingSize, "maxStorageBufferBindingSize"];
    checkTotals(manifest, layout, sizes, varValues, largest, limitName);
    /** @type {Readback[]} */
    const readbacks = new Array(count);
    if (count === 0) {
      this.lastBatch = { mode: RAGGED, reason: "", instances: 0, dispatches: 0, rounds: 0, varValues };
      return readbacks;
    }
    const pipelines = await this.batchPipelines();
    /** @type {GPUBuffer[]} */
    const retired = [];
    /** @type {number[]} storages whose layout changed since the last round */
    let changed = [];
    /** @type {SliceLayout|null} */
    let previousLayout = null;
    /** @type {Map<number, import("./host.js").HostStep>} */
    let live = new Map(steps.map((step, k) => [k, step]));
    let dispatches = 0;
    let rounds = 0;
    /** @type {number|null} output elements computed (runtime/batch.py's BatchReport.elements) */
    let elements = 0;
    try {
      while (live.size > 0) {
        rounds += 1;
        const first = rounds === 1;
        /** @type {[number, import("./host.js").ReadCommand][]} */
        const reads = [];
        const readValues = await this.captureGpuErrors("run", () => {
          const encoder = device.createCommandEncoder();
          if (first) {
            this.ensureBatchStorages(layout.totals);
            this.uploadBatchInputs(prepared, layout);
          } else if (changed.length > 0) {
            this.growBatchStorages(encoder, /** @type {SliceLayout} */ (previousLayout), layout, changed, retired);
          }
          const lists = new Map([...live].map(([k, step]) => [k, /** @type {import("./host.js").DispatchCommand[]} */ (
            step.commands.filter((c) => c.opcode === OPCODE_DISPATCH))]));
          const merged = mergeDispatches(lists);
          for (const [callSite, members] of merged) {
            for (const [k] of members) {
              const count = elements === null ? null : callElements(manifest, callSite, /** @type {any} */ (live.get(k)).params);
              elements = count === null || elements === null ? null : elements + count;
            }
          }
          dispatches += this.encodeRaggedDispatches(encoder, pipelines, merged, live, layout, retired);
          for (const [k, step] of live) {
            const last = step.commands[step.commands.length - 1];
            if (last?.opcode === OPCODE_READ) reads.push([k, /** @type {import("./host.js").ReadCommand} */ (last)]);
            else if (last?.opcode !== OPCODE_RESUME) readbacks[k] = this.encodeBatchOutputCopies(encoder, k, step.outputShapes, layout);
          }
          const staging = reads.length > 0 ? this.encodeBatchReads(encoder, reads, layout) : null;
          device.queue.submit([encoder.finish()]);
          return staging;
        });
        /** @type {number[]} */
        let values = [];
        if (readValues) {
          try {
            await this.orDeviceLoss(readValues.mapAsync(/* GPUMapMode.READ */ 1));
            values = Array.from(new Int32Array(readValues.getMappedRange().slice(0)));
            this.stats.add("bytesRead", 4 * reads.length);
          } finally {
            readValues.destroy();
          }
        }
        for (const buffer of retired.splice(0)) buffer.destroy();
        /** @type {Map<number, import("./host.js").HostStep>} */
        const next = new Map();
        const readOf = new Map(reads.map(([k, read], i) => [k, { slot: read.slot, value: values[i] }]));
        for (const [k, step] of live) {
          const last = step.commands[step.commands.length - 1]?.opcode;
          if (last !== OPCODE_READ && last !== OPCODE_RESUME) continue; // finished: its outputs are copied
          const read = readOf.get(k);
          try {
            next.set(k, await host.resumeInstance(k, read ? read.slot : null, read ? read.value : 0));
          } catch (error) {
            throw instanceError(k, error);
          }
        }
        for (const [k, step] of next) sizes[k] = [...step.sizes];
        previousLayout = layout;
        [layout, changed] = layout.grown(sizes);
        if (changed.length > 0) checkTotals(manifest, layout, sizes, varValues, largest, limitName);
        live = next;
      }
    } catch (error) {
      for (const buffer of retired) buffer.destroy();
      for (const readback of readbacks) readback?.buffer?.destroy();
      throw error;
    }
    this.lastBatch = { mode: RAGGED, reason: "", instances: count, dispatches, rounds, elements, varValues };
    return readbacks;
  }

  /**
   * The ragged pipelines (each kernel's `batch_file`, or `batch_cpu_file` where this model
   * compiled the CPU variants), compiled on the first runBatch.
   * @returns {Promise<GPUComputePipeline[]>}
   */
  batchPipelines() {
    if (!this.batchPipelinesPromise) {
      const fileUrl = this.fileUrl;
      if (!fileUrl) throw new Error("runBatch needs the bundle's URL: load the model with load()");
      const kernels = this.manifest.kernels.map((/** @type {any} */ k) => ({ ...k, name: `${k.name} (ragged form)` }));
      const files = this.manifest.kernels.map((/** @type {any} */ k) => (this.kernels === "cpu" && k.batch_cpu_file) || k.batch_file);
      this.batchPipelinesPromise = (async () => {
        const sources = await Promise.all(files.map((/** @type {string} */ file) => fetchOk(fileUrl(file)).then((r) => r.text())));
        const modules = await compileKernels(this.device, { kernels }, sources, files);
        return Promise.all(createPipelines(this.device, { kernels }, modules));
      })();
      this.batchPipelinesPromise.catch(() => { this.batchPipelinesPromise = null; }); // the next runBatch tries again
    }
    return this.orDeviceLoss(/** @type {Promise<GPUComputePipeline[]>} */ (this.batchPipelinesPromise));
  }

  /**
   * The packed storage buffers of batches: kept between batches, replaced (contents dropped:
   * a batch starts with nothing on the GPU) where one is smaller than `totals`.
   * @param {number[]} totals
   */
  ensureBatchStorages(totals) {
    totals.forEach((total, s) => {
      const needed = Math.ceil(Math.max(total, 16) / 4) * 4;
      const buffer = this.batchStorageBuffers[s];
      if (buffer && buffer.size >= needed) return;
      buffer?.destroy();
      this.batchStorageBuffers[s] = this.createBuffer({
        label: `batch storage ${s} (${this.manifest.storages[s].role})`,
        size: needed,
        usage: USAGE.STORAGE | USAGE.COPY_DST | USAGE.COPY_SRC,
      });
    });
  }

  /**
   * Storages whose layout changed between two rounds: a new buffer each, every instance's
   * slice copied from where it was (its old capacity) to where it is now.
   * @param {GPUCommandEncoder} encoder @param {SliceLayout} before @param {SliceLayout} after
   * @param {number[]} changed @param {GPUBuffer[]} retired old buffers, destroyed after the submit
   */
  growBatchStorages(encoder, before, after, changed, retired) {
    const totals = after.totals;
    for (const s of changed) {
      const old = this.batchStorageBuffers[s];
      const grown = this.createBuffer({
        label: `batch storage ${s} (${this.manifest.storages[s].role})`,
        size: Math.ceil(Math.max(totals[s], 16) / 4) * 4,
        usage: USAGE.STORAGE | USAGE.COPY_DST | USAGE.COPY_SRC,
      });
      before.capacities[s].forEach((capacity, i) => {
        const size = Math.min(capacity, old.size - before.offsets[s][i]);
        if (size > 0) encoder.copyBufferToBuffer(old, before.offsets[s][i], grown, after.offsets[s][i], size);
      });
      retired.push(old);
      this.batchStorageBuffers[s] = grown;
    }
  }

  /**
   * Upload each instance's inputs into its slices.
   * @param {{deviceInputs: Record<string, any>}[]} prepared @param {SliceLayout} layout
   */
  uploadBatchInputs(prepared, layout) {
    prepared.forEach(({ deviceInputs }, k) => {
      for (const spec of this.manifest.inputs) {
        const { data } = deviceInputs[spec.name];
        if (!data || data.byteLength === 0) continue;
        if (data.byteLength > layout.capacities[spec.storage][k]) {
          throw new Error(
            `instance ${k} of the batch: the bundle's host module gave input '${spec.name}' a storage of ${layout.capacities[spec.storage][k]} bytes for ${data.byteLength} bytes of data: the bundle is damaged`,
          );
        }
        this.writeBuffer(this.batchStorageBuffers[spec.storage], data, "inputBytesWritten", layout.offsets[spec.storage][k]);
      }
    });
  }

  /**
   * Encode one round's merged dispatches in one compute pass: per call site and run of at
   * most MAX_INSTANCES instances one ragged dispatch, its batch table (every instance's params
   * slot, the bases of its slices, its first workgroup) in one uniform buffer for the round.
   * @param {GPUCommandEncoder} encoder @param {GPUComputePipeline[]} pipelines
   * @param {[number, [number, import("./host.js").DispatchCommand][]][]} merged
   * @param {Map<number, import("./host.js").HostStep>} live each instance's step (its params)
   * @param {SliceLayout} layout @param {GPUBuffer[]} retired where the table buffer goes after the submit
   * @returns {number} the dispatches encoded
   */
  encodeRaggedDispatches(encoder, pipelines, merged, live, layout, retired) {
    const sites = this.manifest.call_sites;
    /** @type {{callSite: number, table: Uint8Array, offset: number, grid: [number, number, number]}[]} */
    const planned = [];
    let offset = 0;
    for (const [callSite, members] of merged) {
      const site = sites[callSite];
      for (const part of chunks(members)) {
        let workgroups = 0;
        /** @type {[Uint8Array, number[], number][]} */
        const entries = part.map(([k, dispatch]) => {
          const bases = site.buffers.map((/** @type {any} */ b) => ("storage" in b ? layout.offsets[b.storage][k] : 0));
          const entry = /** @type {[Uint8Array, number[], number]} */ ([/** @type {import("./host.js").HostStep} */ (live.get(k)).params, bases, workgroups]);
          workgroups += dispatch.workgroups[0] * dispatch.workgroups[1] * dispatch.workgroups[2];
          return entry;
        });
        if (workgroups === 0) continue; // every instance's grid is empty
        const table = batchTable(site, entries);
        planned.push({ callSite, table, offset, grid: gridOf(workgroups, String(site.binding ?? `call site ${callSite}`).slice(0, 80)) });
        offset += Math.ceil(table.byteLength / 256) * 256;
      }
    }
    if (planned.length === 0) return 0;
    const tables = this.createBuffer({ label: "batch tables", size: offset, usage: USAGE.UNIFORM | USAGE.COPY_DST });
    retired.push(tables);
    const all = new Uint8Array(offset);
    for (const { table, offset: at } of planned) all.set(table, at);
    this.writeBuffer(tables, all, "paramsBytesWritten");
    const pass = encoder.beginComputePass();
    for (const { callSite, table, offset: at, grid } of planned) {
      const site = sites[callSite];
      const pipeline = pipelines[site.kernel];
      const buffers = site.buffers.map((/** @type {any} */ b) =>
        "storage" in b ? this.batchStorageBuffers[b.storage]
          : "weight_part" in b ? /** @type {WeightParts} */ (this.weightParts.get(b.weight_part[0])).buffers[b.weight_part[1]]
          : /** @type {GPUBuffer} */ (this.weightBuffers[b.weight]));
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, this.device.createBindGroup({
        layout: pipeline.getBindGroupLayout(0),
        entries: [
          { binding: 0, resource: { buffer: tables, offset: at, size: table.byteLength } },
          ...buffers.map((/** @type {GPUBuffer} */ buffer, /** @type {number} */ b) => ({ binding: b + 1, resource: { buffer } })),
        ],
      }));
      pass.dispatchWorkgroups(...grid);
    }
    pass.end();
    return planned.length;
  }

  /**
   * Encode the copy of each reading instance's i32 (at its read's offset in its own slice) into
   * one staging buffer, 4 bytes per instance in `reads` order.
   * @param {GPUCommandEncoder} encoder @param {[number, import("./host.js").ReadCommand][]} reads
   * @param {SliceLayout} layout @returns {GPUBuffer}
   */
  encodeBatchReads(encoder, reads, layout) {
    const staging = this.createBuffer({ label: "batch read values", size: 4 * reads.length, usage: USAGE.MAP_READ | USAGE.COPY_DST });
    reads.forEach(([k, { storage, byteOffset }], i) => {
      if (byteOffset + 4 > layout.capacities[storage][k]) {
        throw new Error(`instance ${k} of the batch: host.wasm asks to read bytes ${byteOffset}..${byteOffset + 4} of storage ${storage}, whose slice has ${layout.capacities[storage][k]} bytes`);
      }
      encoder.copyBufferToBuffer(this.batchStorageBuffers[storage], layout.offsets[storage][k] + byteOffset, staging, 4 * i, 4);
    });
    return staging;
  }

  /**
   * Encode the copy of instance `k`'s outputs (from its slices) into a readback buffer of its own.
   * @param {GPUCommandEncoder} encoder @param {number} k @param {number[][]} outputShapes
   * @param {SliceLayout} layout @returns {Readback}
   */
  encodeBatchOutputCopies(encoder, k, outputShapes, layout) {
    const { manifest } = this;
    let offset = 0;
    const outputs = manifest.outputs.map((/** @type {any} */ spec, /** @type {number} */ o) => {
      const shape = outputShapes[o];
      const info = dtypeInfo(manifest, spec);
      const bytes = shape.reduce((a, b) => a * b, 1) * info.device_bytes;
      const output = { name: spec.name, dtype: spec.dtype, info, shape, offset, bytes, storage: spec.storage, kept: null };
      offset += Math.ceil(bytes / 4) * 4;
      return output;
    });
    const size = Math.max(offset, 4);
    const buffer = this.readbackPool.take(size) ?? this.createBuffer({ size, usage: USAGE.MAP_READ | USAGE.COPY_DST });
    for (const output of outputs) {
      const padded = Math.ceil(output.bytes / 4) * 4;
      if (padded === 0) continue;
      if (padded > layout.capacities[output.storage][k]) {
        throw new Error(`instance ${k} of the batch: output '${output.name}' has ${output.bytes} bytes, above its slice of ${layout.capacities[output.storage][k]}: the bundle is damaged`);
      }
      encoder.copyBufferToBuffer(this.batchStorageBuffers[output.storage], layout.offsets[output.storage][k], buffer, output.offset, padded);
    }
    return { buffer, size, outputs };
  }

  /**
   * Generate text with a decoder bundle (generate.js: which bundles can, and how): see relaxweb.d.ts.
   * @param {string|number[]} prompt text (encoded by the bundle's tokenizer) or token ids
   * @param {import("./generate.js").GenerateOptions} [options]
   * @returns {Promise<import("./generate.js").Generation>}
   */
  async generate(prompt, options) {
    return generate(this, prompt, options);
  }

  /**
   * Run the model `warmup` times (drivers compile a pipeline on its first use), then once
   * more timing every dispatch, and return that run's outputs and its profile: one row per
   * kernel (calls, time, FLOPs, bytes), slowest first. Dispatches are timed by timestamp
   * queries where the device has "timestamp-query" (load with `profile: true`), otherwise by
   * one submit per dispatch and the wall time until the queue has done it.
   * @param {Record<string, Tensor>} inputs
   * @param {{warmup?: number}} [options]
   * @returns {Promise<{outputs: Record<string, Tensor>, profile: import("./profile.js").Profile}>}
   */
  async profile(inputs, { warmup = 1 } = {}) {
    await this.orDeviceLoss(this.ready); // every pipeline ready: the timed run waits for none
    for (let i = 0; i < warmup; i++) await this.run(inputs);
    const timer = this.device.features.has("timestamp-query") ? new TimestampTimer(this) : new SubmitTimer(this);
    const outputs = await this.runTimed(inputs, timer);
    return { outputs, profile: summarize(this.manifest, await timer.times(), timer.method) };
  }

  /**
   * `run`, with each dispatch timed by `timer` when one is given.
   * @param {Record<string, Tensor>} inputs
   * @param {TimestampTimer|SubmitTimer|null} timer
   * @param {boolean|string[]} [keepOnGpu]
   * @returns {Promise<Record<string, any>>}
   */
  async runTimed(inputs, timer, keepOnGpu = false) {
    if (this.unusableReason) throw new Error(`cannot run: ${this.unusableReason}`);
    const kept = this.keptOutputIndices(keepOnGpu);
    this.checkGpuTensorInputs(inputs);
    // Checked and copied now: a run may wait for earlier ones, and what it uses then must be
    // what was checked, whatever the caller does to its arrays meanwhile.
    const { shapes, sequences, deviceInputs } = prepareInputs(this.manifest, inputs);
    const previous = this.turn;
    /** @type {() => void} */
    let endTurn = () => {};
    this.turn = new Promise((resolve) => { endTurn = resolve; });
    const { readback, retired } = await (async () => {
      try {
        await previous;
        if (this.unusableReason) throw new Error(`cannot run: ${this.unusableReason}`);
        this.stats.startRun();
        return await this.runSteps(deviceInputs, shapes, sequences, timer, kept);
      } finally {
        endTurn(); // the last submit is done: the next run may start while this one maps its outputs
      }
    })();
    try {
      return await this.readOutputs(readback);
    } finally {
      for (const buffer of retired) buffer.destroy();
    }
  }

  /**
   * Follow "One run" of docs/bundle-format.md up to the last submit: run() in the host, then
   * one step per command list. A list that ends with a read is submitted, the value read,
   * written to its read slot and resume() called for the next list; one that ends with a
   * resume record (a loop's iteration) is submitted and resume() called at once; storages
   * grown between two steps keep their contents (copied at the start of the next step).
   * The last list ends with the output copies.
   * @param {Record<string, Tensor>} inputs
   * @param {number[][]} shapes
   * @param {Record<number, number[][]|null>} sequences the element shapes of sequence inputs
   * @param {TimestampTimer|SubmitTimer|null} [timer] encodes (and times) the dispatches when given
   * @param {Set<number>} [kept] the outputs to keep on the GPU
   * @returns {Promise<{readback: Readback, retired: GPUBuffer[]}>} the outputs to map, and old
   *   storage buffers to destroy once the last submit has run
   */
  async runSteps(inputs, shapes, sequences, timer = null, kept = new Set()) {
    const { host } = this;
    let hostStep = await host.start(shapes, sequences);
    this.checkCacheViews(inputs); // the current views of caches are their pasts; older ones are refused
    this.runNumber += 1; // every cache is written from here on
    /** @type {GPUBuffer[]} */
    const retired = [];
    let dispatches = 0;
    let reads = 0;
    try {
      for (let step = 0; ; step++) {
        const { commands, sizes, params, outputShapes } = hostStep;
        const last = commands[commands.length - 1];
        const read = last?.opcode === OPCODE_READ ? /** @type {import("./host.js").ReadCommand} */ (last) : null;
        const resume = last?.opcode === OPCODE_RESUME;
        /**
         * Submit commands[from, to): the step's storage growth, input upload and params
         * come with its first part, the read or the output copies with its last.
         * @param {number} from
         * @param {number} to
         */
        const submit = (from, to) => this.captureGpuErrors("run", () => {
          const encoder = this.device.createCommandEncoder();
          if (from === 0) {
            // Before the first step nothing of this run is on the GPU: no contents to keep.
            this.growStorages(sizes, step === 0 ? undefined : { encoder, retired });
            if (step === 0) this.uploadInputs(inputs);
            if (step === 0) this.encodeGpuTensorCopies(encoder, inputs);
            if (params.byteLength > 0) this.writeBuffer(this.paramsBuffer, params, "paramsBytesWritten");
          }
          const part = commands.slice(from, to);
          // A timer encodes the dispatches its own way: it may hand on a fresh encoder for the
          // rest of the step, and work (timed submits) to wait for before submitting it.
          if (!timer) this.encodeDispatches(encoder, part);
          const timed = timer ? timer.encode(encoder, part, params) : { encoder, wait: null };
          const rest = timed.encoder;
          let readback = null;
          if (to === commands.length) {
            readback = read ? this.encodeRead(rest, read) : resume ? null : this.encodeOutputCopies(rest, outputShapes, kept);
          }
          const finished = rest.finish();
          if (!timed.wait) {
            this.device.queue.submit([finished]);
            return readback;
          }
          return timed.wait().then(() => {
            this.device.queue.submit([finished]);
            return readback;
          });
        });
        // Right after load, pipelines may still be compiling: the dispatches whose pipelines
        // are ready go to the GPU while the next one's pipeline is awaited.
        let from = 0;
        for (let waiting = this.firstWithoutPipeline(commands, 0); waiting < commands.length;
          waiting = this.firstWithoutPipeline(commands, waiting)) {
          if (waiting > from) await submit(from, waiting);
          from = waiting;
          await this.orDeviceLoss(this.pipelinePromises[this.manifest.call_sites[commands[waiting].callSite].kernel]);
        }
        const submitted = await submit(from, commands.length);
        dispatches += commands.filter((command) => command.opcode === OPCODE_DISPATCH).length;
        if (!read && !resume) {
          this.lastDispatchCount = dispatches;
          this.lastReadCount = reads;
          const readback = /** @type {Readback} */ (submitted);
          return { readback: { ...readback, elementShapes: hostStep.elementShapes }, retired };
        }
        let value = 0;
        if (read) {
          value = await this.readValue();
          for (const buffer of retired.splice(0)) buffer.destroy();
          reads += 1;
        }
        hostStep = await host.resume(read ? read.slot : null, value);
      }
    } catch (error) {
      for (const buffer of retired) buffer.destroy();
      throw error;
    }
  }

  /**
   * For each weight the bundle binds in parts, by name, the byte sizes of the buffers it was
   * loaded into (one: the device binds it whole; docs/bundle-format.md, "Weights in parts").
   * @returns {Record<string, number[]>}
   */
  get weightPartSizes() {
    return Object.fromEntries([...this.weightParts].map(([index, parts]) => [this.manifest.weights[index].name, parts.sizes]));
  }

  /** Free the GPU resources (and the device, when load() requested it). */
  dispose() {
    this.unusableReason ??= "the model was disposed";
    const parts = [...this.weightParts.values()].flatMap((p) => p.buffers);
    for (const buffer of [...this.weightBuffers, ...parts, ...this.storageBuffers, ...this.batchStorageBuffers, this.paramsBuffer, this.readValueBuffer]) buffer?.destroy();
    this.gpuTensorPool.close(); // and the buffers of GpuTensors disposed later
    this.readbackPool.close();
    if (this.ownsDevice) this.device.destroy();
    this.host.dispose();
  }

  /**
   * Allocate every storage whose size at the bounds is known (all of them when every var has a bound).
   * @param {number[]|null} sizesAtBounds the host module's sizes at the bounds, null when some var has none
   */
  allocateStoragesAtBounds(sizesAtBounds) {
    const sizes = sizesAtBounds
      ?? this.manifest.storages.map((/** @type {any} */ s) => s.size_at_bounds ?? 0);
    this.growStorages(sizes);
  }

  /**
   * Reallocate every storage buffer smaller than needed; forget the bind groups that used it.
   * With `keep` (growth between two steps of one run), each old buffer is first copied into
   * its new one by `keep.encoder`, and added to `keep.retired` to be destroyed once that
   * copy has run; without it, old buffers are destroyed now.
   * @param {number[]} sizes bytes needed per storage
   * @param {{encoder: GPUCommandEncoder, retired: GPUBuffer[]}} [keep]
   */
  growStorages(sizes, keep) {
    // Before any GPU call: a clear message, not a validation error from createBuffer.
    const problem = storageSizeProblem(this.manifest, sizes, this.device.limits);
    if (problem) throw new Error(problem);
    sizes.forEach((size, index) => {
      // at least 16 bytes: a kernel may bind it as array<vec4<f32>>, even when it is empty
      const needed = Math.ceil(Math.max(size, 16) / 4) * 4;
      const buffer = this.storageBuffers[index];
      if (buffer !== undefined && buffer.size >= needed) return;
      const grown = this.createBuffer({
        label: `storage ${index} (${this.manifest.storages[index].role})`,
        size: needed,
        usage: USAGE.STORAGE | USAGE.COPY_DST | USAGE.COPY_SRC,
      });
      if (buffer !== undefined && keep) {
        keep.encoder.copyBufferToBuffer(buffer, 0, grown, 0, buffer.size);
        keep.retired.push(buffer);
      } else {
        buffer?.destroy();
      }
      this.storageBuffers[index] = grown;
      this.manifest.call_sites.forEach((/** @type {any} */ site, /** @type {number} */ c) => {
        if (site.buffers.some((/** @type {any} */ b) => b.storage === index)) this.bindGroups[c] = null;
      });
    });
  }

  /**
   * The bind group of a call site, created on first use.
   * @param {number} callSite
   * @returns {GPUBindGroup}
   */
  bindGroup(callSite) {
    const existing = this.bindGroups[callSite];
    if (existing) return existing;
    const site = this.manifest.call_sites[callSite];
    const buffers = site.buffers.map((/** @type {any} */ b) =>
      "storage" in b ? this.storageBuffers[b.storage]
        : "weight_part" in b ? /** @type {WeightParts} */ (this.weightParts.get(b.weight_part[0])).buffers[b.weight_part[1]]
        : /** @type {GPUBuffer} */ (this.weightBuffers[b.weight]));
    const group = this.device.createBindGroup({
      layout: this.pipelines[site.kernel].getBindGroupLayout(0),
      entries: [
        { binding: 0, resource: { buffer: this.paramsBuffer, offset: site.params_offset, size: site.params_size } },
        ...buffers.map((/** @type {GPUBuffer} */ buffer, /** @type {number} */ b) => ({ binding: b + 1, resource: { buffer } })),
      ],
    });
    this.bindGroups[callSite] = group;
    return group;
  }

  /**
   * Upload each input to its storage (offset 0).
   * @param {Record<string, Tensor>} inputs
   */
  uploadInputs(inputs) {
    this.manifest.inputs.forEach((/** @type {any} */ spec, /** @type {number} */ k) => {
      const { data, shape } = inputs[spec.name];
      const cache = this.cacheOfInput.get(k);
      if (data && data.byteLength > 0 && cache) { // a cache's past: each block at the start of its capacity rows
        const itemSize = data.byteLength / shape.reduce((a, b) => a * b, 1);
        for (const [from, at, size] of cacheBlockCopies(cache, shape, itemSize, null)) {
          this.writeBuffer(this.storageBuffers[cache.storage], new Uint8Array(data.buffer, data.byteOffset + from, size),
            "inputBytesWritten", at);
        }
      } else if (data && data.byteLength > 0) { // a GpuTensor has none: encodeGpuTensorCopies
        const buffer = this.storageBuffers[spec.storage];
        if (!buffer || buffer.size < data.byteLength) {
          throw new Error(
            `the bundle's host module gave input '${spec.name}' a storage of ${buffer?.size ?? 0} bytes for ${data.byteLength} bytes of data: the bundle is damaged`,
          );
        }
        this.writeBuffer(buffer, data, "inputBytesWritten");
      }
    });
  }

  /**
   * The index of the first dispatch at or after `start` whose kernel's pipeline is not
   * ready yet (commands.length when there is none).
   * @param {import("./host.js").Command[]} commands
   * @param {number} start
   * @returns {number}
   */
  firstWithoutPipeline(commands, start) {
    if (this.allPipelinesReady) return commands.length;
    for (let i = start; i < commands.length; i++) {
      const command = commands[i];
      if (command.opcode === OPCODE_DISPATCH && !this.pipelines[this.manifest.call_sites[command.callSite].kernel]) return i;
    }
    return commands.length;
  }

  /**
   * Start creating one compute pipeline per kernel, in the order of their first call sites
   * (the order of the manifest's kernels), without waiting for them: `load()` returns once
   * the kernels compile and the weights are on the GPU, and the first run starts as soon as
   * the pipelines it needs first are ready while the others keep compiling.
   * @param {GPUShaderModule[]} modules
   */
  startPipelines(modules) {
    this.pipelinePromises = createPipelines(this.device, this.manifest, modules).map((promise, k) =>
      promise.then((pipeline) => {
        this.pipelines[k] = pipeline;
        return pipeline;
      }));
    for (const promise of this.pipelinePromises) promise.catch(() => {}); // reported by the run that needs it, and by `ready`
    this.ready = Promise.all(this.pipelinePromises).then(() => {
      this.allPipelinesReady = true;
    });
    this.ready.catch(() => {});
  }

  /**
   * Encode a command list's dispatches in one compute pass.
   * @param {GPUCommandEncoder} encoder
   * @param {import("./host.js").Command[]} commands
   */
  encodeDispatches(encoder, commands) {
    const pass = encoder.beginComputePass();
    for (const command of commands) {
      if (command.opcode === OPCODE_DISPATCH) this.encodeDispatch(pass, /** @type {import("./host.js").DispatchCommand} */ (command));
    }
    pass.end();
  }

  /**
   * Encode one dispatch into a compute pass.
   * @param {GPUComputePassEncoder} pass
   * @param {import("./host.js").DispatchCommand} command
   */
  encodeDispatch(pass, command) {
    pass.setPipeline(this.pipelines[this.manifest.call_sites[command.callSite].kernel]);
    pass.setBindGroup(0, this.bindGroup(command.callSite));
    pass.dispatchWorkgroups(...command.workgroups);
  }

  /**
   * Encode the copy of the i32 a read record names into the read-value buffer.
   * @param {GPUCommandEncoder} encoder
   * @param {import("./host.js").ReadCommand} read
   * @returns {null}
   */
  encodeRead(encoder, { storage, byteOffset }) {
    const source = this.storageBuffers[storage];
    if (byteOffset + 4 > source.size) {
      throw new Error(`host.wasm asks to read bytes ${byteOffset}..${byteOffset + 4} of storage ${storage}, which has ${source.size} bytes`);
    }
    this.readValueBuffer ??= this.createBuffer({ label: "read value", size: 4, usage: USAGE.MAP_READ | USAGE.COPY_DST });
    encoder.copyBufferToBuffer(source, byteOffset, this.readValueBuffer, 0, 4);
    return null;
  }

  /**
   * Map the read-value buffer (after the step that fills it was submitted) and return its i32.
   * @returns {Promise<number>}
   */
  async readValue() {
    const buffer = /** @type {GPUBuffer} */ (this.readValueBuffer);
    await this.orDeviceLoss(buffer.mapAsync(/* GPUMapMode.READ */ 1));
    try {
      const value = new DataView(buffer.getMappedRange()).getInt32(0, true);
      this.stats.add("bytesRead", 4);
      return value;
    } finally {
      buffer.unmap();
    }
  }

  /**
   * Encode the copy of each output (as many bytes as its shape says) into a readback buffer
   * (from the pool of idle ones, or new), and of each kept output into its GpuTensor's buffer.
   * @param {GPUCommandEncoder} encoder
   * @param {number[][]} outputShapes
   * @param {Set<number>} [kept] the outputs to keep on the GPU
   * @returns {Readback}
   */
  encodeOutputCopies(encoder, outputShapes, kept = new Set()) {
    const { manifest } = this;
    let offset = 0;
    const outputs = manifest.outputs.map((/** @type {any} */ spec, /** @type {number} */ k) => {
      const shape = outputShapes[k];
      const info = dtypeInfo(manifest, spec);
      const bytes = shape.reduce((a, b) => a * b, 1) * info.device_bytes;
      const keptTensor = kept.has(k) ? this.keepOutput(encoder, spec, shape, bytes) : null;
      const output = { name: spec.name, dtype: spec.dtype, info, shape, offset, bytes, storage: spec.storage, kept: keptTensor };
      if (!keptTensor) offset += Math.ceil(bytes / 4) * 4;
      return output;
    });
    if (outputs.every((output) => output.kept)) return { buffer: null, size: 0, outputs };
    const size = Math.max(offset, 4);
    const buffer = this.readbackPool.take(size) ?? this.createBuffer({ size, usage: USAGE.MAP_READ | USAGE.COPY_DST });
    for (const [k, output] of outputs.entries()) {
      const cache = this.cacheOfOutput.get(k);
      if (output.bytes > 0 && !output.kept && cache) { // its rows of each block
        for (const [dense, at, size] of cacheBlockCopies(cache, output.shape, output.info.device_bytes, null)) {
          encoder.copyBufferToBuffer(this.storageBuffers[output.storage], at, buffer, output.offset + dense, size);
        }
      } else if (output.bytes > 0 && !output.kept) {
        encoder.copyBufferToBuffer(this.storageBuffers[output.storage], 0, buffer, output.offset, Math.ceil(output.bytes / 4) * 4);
      }
    }
    return { buffer, size, outputs };
  }

  /**
   * Map the readback buffer and copy each output out of it (kept outputs are their GpuTensors).
   * The buffer goes back to the pool of idle readback buffers once read.
   * @param {Readback} readback
   * @returns {Promise<Record<string, Tensor|GpuTensor>>}
   */
  async readOutputs({ buffer, size, outputs, elementShapes }) {
    if (!buffer) return Object.fromEntries(outputs.map((output) => [output.name, output.kept]));
    let reusable = false;
    try {
      await this.orDeviceLoss(buffer.mapAsync(/* GPUMapMode.READ */ 1, 0, size));
      const mapped = buffer.getMappedRange(0, size);
      this.stats.add("bytesRead", size);
      /** @type {Record<string, any>} */
      const result = {};
      for (const [k, output] of outputs.entries()) {
        const { name, info, shape, offset, bytes } = output;
        if (output.kept) {
          result[name] = output.kept;
          continue;
        }
        const data = fromDeviceData(output, info, mapped.slice(offset, offset + bytes));
        const sequence = elementShapes?.[k];
        result[name] = !sequence ? { data, shape } : sequence.shapes ? splitElements(data, sequence.shapes) : null;
      }
      buffer.unmap();
      reusable = true;
      return result;
    } finally {
      if (reusable) this.readbackPool.give(buffer);
      else buffer.destroy();
    }
  }

  // GPU tensors (run(inputs, {keepOnGpu})) ----------------------------------------------

  /**
   * The indices of the outputs `keepOnGpu` names (true: every output but sequences).
   * @param {boolean|string[]|undefined} keepOnGpu
   * @returns {Set<number>}
   */
  keptOutputIndices(keepOnGpu) {
    const outputs = this.manifest.outputs;
    if (keepOnGpu === true) return new Set(outputs.flatMap((/** @type {any} */ o, /** @type {number} */ k) => (isSequence(o) ? [] : [k])));
    if (!keepOnGpu) return new Set();
    if (!Array.isArray(keepOnGpu)) throw new Error(`keepOnGpu must be true or an array of output names, got ${String(keepOnGpu).slice(0, 40)}`);
    const names = outputs.map((/** @type {any} */ o) => o.name);
    const unknown = keepOnGpu.filter((name) => !names.includes(name));
    if (unknown.length > 0) {
      throw new Error(`keepOnGpu names unknown output ${unknown.map((n) => `'${n}'`).join(", ")}; the model's outputs are ${names.map((n) => `'${n}'`).join(", ")}`);
    }
    const sequences = keepOnGpu.filter((name) => isSequence(outputs[names.indexOf(name)]));
    if (sequences.length > 0) throw new Error(`output ${sequences.map((n) => `'${n}'`).join(", ")} is a sequence: only tensors can be kept on the GPU`);
    return new Set(keepOnGpu.map((name) => names.indexOf(name)));
  }

  /**
   * Refuse GpuTensor inputs that are disposed or live on another device, naming the input.
   * @param {Record<string, any>} inputs
   */
  checkGpuTensorInputs(inputs) {
    for (const [name, tensor] of Object.entries(inputs ?? {})) {
      if (!(tensor instanceof GpuTensor)) continue;
      if (tensor.disposed) throw new Error(`input '${name}': GPU tensor '${tensor.name}' was disposed and cannot be used any more`);
      if (tensor.model.device !== this.device) {
        throw new Error(`input '${name}': GPU tensor '${tensor.name}' lives on another WebGPU device than this model's; read it with read() and pass its data`);
      }
    }
  }

  /**
   * Encode the copy of each GpuTensor input into its storage (the first step, before its dispatches).
   * @param {GPUCommandEncoder} encoder
   * @param {Record<string, {gpuTensor?: GpuTensor}>} inputs
   */
  encodeGpuTensorCopies(encoder, inputs) {
    this.manifest.inputs.forEach((/** @type {any} */ spec, /** @type {number} */ k) => {
      const tensor = inputs[spec.name].gpuTensor;
      if (!tensor || tensor.byteLength === 0) return;
      const cache = this.cacheOfInput.get(k);
      if (cache) { // nothing for the current view of this cache (it is there); else a copy per block
        if (tensor.cacheView?.cache === cache) return;
        const itemSize = tensor.byteLength / tensor.shape.reduce((a, b) => a * b, 1);
        for (const [from, at, size] of cacheBlockCopies(cache, tensor.shape, itemSize, tensor.cacheView?.cache ?? null)) {
          encoder.copyBufferToBuffer(tensor.buffer(), from, this.storageBuffers[cache.storage], at, size);
        }
        return;
      }
      const bytes = Math.ceil(tensor.byteLength / 4) * 4;
      const storage = this.storageBuffers[spec.storage];
      if (!storage || storage.size < bytes) {
        throw new Error(
          `the bundle's host module gave input '${spec.name}' a storage of ${storage?.size ?? 0} bytes for ${tensor.byteLength} bytes of data: the bundle is damaged`,
        );
      }
      encoder.copyBufferToBuffer(tensor.buffer(), 0, storage, 0, bytes);
    });
  }

  /**
   * Refuse views of KV caches that a later run has written (a view is valid until the next
   * run), views of another model's caches, and views given as anything but a cache's past.
   * @param {Record<string, {gpuTensor?: GpuTensor}>} inputs
   */
  checkCacheViews(inputs) {
    this.manifest.inputs.forEach((/** @type {any} */ spec, /** @type {number} */ k) => {
      const tensor = inputs[spec.name]?.gpuTensor;
      const view = tensor?.cacheView;
      if (!tensor || !view) return;
      if (tensor.model !== this) {
        throw new Error(`input '${spec.name}': GPU tensor '${tensor.name}' is a view of another model's KV cache; read it with read() and pass its data`);
      }
      if (view.run !== this.runNumber) {
        throw new Error(`input '${spec.name}': GPU tensor '${tensor.name}' is a view of a KV cache that a later run has written: a view is valid until the next run (read it with read() first to keep its values)`);
      }
      if (!this.cacheOfInput.has(k)) {
        throw new Error(`input '${spec.name}': GPU tensor '${tensor.name}' is a view of a KV cache; it can be given back only as a cache's past (or read with read())`);
      }
      const ownPast = inputs[this.manifest.inputs[view.cache.input].name]?.gpuTensor;
      if (this.cacheOfInput.get(k) !== view.cache && ownPast?.cacheView?.cache !== view.cache) {
        throw new Error(`input '${spec.name}': GPU tensor '${tensor.name}' is a view of another KV cache whose own past in this run is not that view (this run overwrites it first); read it with read() and pass its data`);
      }
    });
  }

  /**
   * A GpuTensor for a kept output: a buffer from the pool, or a new one sized at its storage's
   * size at the bounds (so that later runs find it fits), and the copy of the output into it.
   * @param {GPUCommandEncoder} encoder @param {any} spec @param {number[]} shape @param {number} bytes
   * @returns {GpuTensor}
   */
  keepOutput(encoder, spec, shape, bytes) {
    const cache = this.cacheOfOutput.get(this.manifest.outputs.indexOf(spec));
    if (cache) { // a view of the cache's storage: no buffer, no copy
      return new GpuTensor(this, spec.name, spec.dtype, [...shape], this.storageBuffers[cache.storage], bytes,
        { cache, run: this.runNumber });
    }
    const atBounds = this.storageSizesAtBounds?.[spec.storage] ?? 0;
    const size = Math.ceil(Math.max(bytes, atBounds, 16) / 4) * 4;
    const buffer = this.gpuTensorPool.take(size)
      ?? this.createBuffer({ label: `kept output ${spec.name}`, size, usage: USAGE.STORAGE | USAGE.COPY_DST | USAGE.COPY_SRC });
    if (bytes > 0) encoder.copyBufferToBuffer(this.storageBuffers[spec.storage], 0, buffer, 0, Math.ceil(bytes / 4) * 4);
    return new GpuTensor(this, spec.name, spec.dtype, [...shape], buffer, bytes);
  }

  /**
   * A GpuTensor's values, read back as `{data, shape}` (what `tensor.read()` calls).
   * @param {GpuTensor} tensor
   * @returns {Promise<Tensor>}
   */
  async readGpuTensor(tensor) {
    const source = tensor.buffer();
    const view = tensor.cacheView;
    if (view && view.run !== this.runNumber) {
      throw new Error(`GPU tensor '${tensor.name}' is a view of a KV cache that a later run has written: a view is valid until the next run`);
    }
    const info = dtypeInfo(this.manifest, tensor);
    if (tensor.byteLength === 0) return { data: fromDeviceData(tensor, info, new ArrayBuffer(0)), shape: [...tensor.shape] };
    const size = Math.ceil(tensor.byteLength / 4) * 4;
    const staging = this.createBuffer({ label: `read ${tensor.name}`, size, usage: USAGE.MAP_READ | USAGE.COPY_DST });
    try {
      await this.captureGpuErrors("read", () => {
        const encoder = this.device.createCommandEncoder();
        if (!view) encoder.copyBufferToBuffer(source, 0, staging, 0, size);
        const itemSize = tensor.byteLength / tensor.shape.reduce((a, b) => a * b, 1);
        for (const [dense, at, bytes] of view ? cacheBlockCopies(view.cache, tensor.shape, itemSize, null) : []) {
          encoder.copyBufferToBuffer(source, at, staging, dense, bytes);
        }
        this.device.queue.submit([encoder.finish()]);
      });
      await this.orDeviceLoss(staging.mapAsync(/* GPUMapMode.READ */ 1));
      const bytes = staging.getMappedRange().slice(0, tensor.byteLength);
      this.stats.add("bytesRead", size);
      staging.unmap();
      return { data: fromDeviceData(tensor, info, bytes), shape: [...tensor.shape] };
    } finally {
      staging.destroy();
    }
  }

  // Counted GPU calls (stats) -----------------------------------------------------------

  /** `device.createBuffer`, counted in `stats`. @param {GPUBufferDescriptor} descriptor @returns {GPUBuffer} */
  createBuffer(descriptor) {
    const buffer = this.device.createBuffer(descriptor);
    this.stats.add("buffersCreated");
    this.stats.trackBuffer(buffer);
    return buffer;
  }

  /**
   * `queue.writeBuffer` of `data` at `offset`, its bytes counted in `stats` under `counter`.
   * @param {GPUBuffer} buffer @param {ArrayBufferView} data
   * @param {"inputBytesWritten"|"paramsBytesWritten"} counter @param {number} [offset]
   */
  writeBuffer(buffer, data, counter, offset = 0) {
    this.device.queue.writeBuffer(buffer, offset, data.buffer, data.byteOffset, data.byteLength);
    this.stats.add(counter, data.byteLength);
  }

  /**
   * Call `work` inside validation and out-of-memory error scopes; reject with the first GPU
   * error its calls caused, or when the device is lost. The scopes are pushed and popped
   * around the synchronous part of `work` only, so concurrent calls cannot mix them up;
   * a promise it returns is awaited afterwards.
   * @template T
   * @param {string} what "load" or "run", for the message
   * @param {() => T | Promise<T>} work
   * @returns {Promise<T>}
   */
  async captureGpuErrors(what, work) {
    this.device.pushErrorScope("out-of-memory");
    this.device.pushErrorScope("validation");
    /** @type {T | Promise<T> | undefined} */
    let result;
    /** @type {unknown} */
    let failure = null;
    try {
      result = work();
    } catch (error) {
      failure = error;
    }
    const validationError = this.device.popErrorScope();
    const outOfMemoryError = this.device.popErrorScope();
    const [validation, outOfMemory] = await this.orDeviceLoss(Promise.all([validationError, outOfMemoryError]));
    if (outOfMemory) failure = new Error(`WebGPU ran out of memory during ${what}: ${outOfMemory.message}`);
    else if (validation) failure = new Error(`WebGPU validation error during ${what}: ${validation.message}`);
    const settled = Promise.resolve(/** @type {T | Promise<T>} */ (result));
    if (failure) {
      settled.catch(() => {}); // its own failure, if any, is superseded by this one
      throw failure;
    }
    return this.orDeviceLoss(settled);
  }

  /**
   * Wait for `promise`, but reject as soon as the device is lost.
   * @template T
   * @param {Promise<T>} promise
   * @returns {Promise<T>}
   */
  orDeviceLoss(promise) {
    /** @type {Promise<never>} */
    const lost = this.lost.then((error) => Promise.reject(error));
    return Promise.race([promise, lost]);
  }
}

/**
 * @param {string|URL} url a bundle folder or its manifest.json
 * @returns {URL}
 */
function resolveManifestUrl(url) {
  const base = globalThis.location?.href;
  const text = String(url);
  if (text.endsWith(".json")) return new URL(text, base);
  return new URL("manifest.json", new URL(text.endsWith("/") ? text : `${text}/`, base));
}

/**
 * fetch() that rejects on an HTTP error status.
 * @param {URL} url
 * @returns {Promise<Response>}
 */
async function fetchOk(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`could not fetch ${url}: HTTP ${response.status} ${response.statusText}`);
  return response;
}

/**
 * A file's bytes (fetchOk: an HTTP error rejects).
 * @param {URL} url
 * @returns {Promise<ArrayBuffer>}
 */
async function fetchBytes(url) {
  return (await fetchOk(url)).arrayBuffer();
}

/**
 * The Cache API cache that the `cache` option names, or null (no option, or no Cache API
 * here: not a secure context, or Node).
 * @param {boolean|string|undefined} cache
 * @returns {Promise<Cache|null>}
 */
async function openShardCache(cache) {
  if (!cache) return null;
  if (!globalThis.caches) return null; // nothing to cache in: fetch as if the option were off
  return caches.open(cache === true ? DEFAULT_CACHE_NAME : String(cache));
}

/**
 * Fetch every weight shard (from `shardCache` when it holds it), report progress, and verify
 * its size and sha256. A cached shard that fails the check is fetched again from the network
 * (once); a fetched shard that fails it is an error naming the shard. Good fetched shards are
 * put in the cache.
 * @param {any} manifest
 * @param {(file: string) => URL} fileUrl
 * @param {((progress: Progress) => void)|undefined} onProgress
 * @param {Cache|null} [shardCache]
 * @returns {Promise<Uint8Array[]>}
 */
async function fetchShards(manifest, fileUrl, onProgress, shardCache = null) {
  const total = manifest.shards.reduce((/** @type {number} */ sum, /** @type {any} */ s) => sum + s.nbytes, 0);
  let loaded = 0;
  const report = (/** @type {number} */ bytes) => {
    loaded += bytes;
    onProgress?.({ loaded, total });
  };
  report(0);
  return Promise.all(manifest.shards.map(async (/** @type {any} */ shard) => {
    const url = fileUrl(shard.file);
    const cached = shardCache ? await shardCache.match(url) : undefined;
    if (cached) {
      const bytes = new Uint8Array(await cached.arrayBuffer());
      if ((await shardProblem(shard, bytes)) === null) {
        report(bytes.byteLength);
        return bytes;
      }
      // A stale or damaged copy: drop it, and fetch the shard from the network.
      await shardCache?.delete(url);
    }
    // Progress counts only the bytes of this fetch, even if a cached copy was read before.
    const bytes = await readWithProgress(await fetchOk(url), shard.nbytes, report);
    const problem = await shardProblem(shard, bytes);
    if (problem !== null) throw new Error(problem);
    if (shardCache) {
      // A failure to store (quota) only costs the next load a download.
      await shardCache.put(url, new Response(bytes, { headers: { "Content-Type": "application/octet-stream" } }))
        .catch(() => {});
    }
    return bytes;
  }));
}

/**
 * Why the bytes of a shard are not the manifest's (wrong size, wrong sha256), or null.
 * @param {{file: string, nbytes: number, sha256: string}} shard
 * @param {Uint8Array} bytes
 * @returns {Promise<string|null>}
 */
async function shardProblem(shard, bytes) {
  if (bytes.byteLength !== shard.nbytes) {
    return `weight shard ${shard.file} has ${bytes.byteLength} bytes, expected ${shard.nbytes}`;
  }
  const digest = await sha256Hex(bytes);
  if (digest !== shard.sha256) {
    return `weight shard ${shard.file} is corrupt: sha256 ${digest}, expected ${shard.sha256}`;
  }
  return null;
}

/**
 * Read a response body, calling `report(bytes)` for each chunk.
 * @param {Response} response
 * @param {number} expectedBytes
 * @param {(bytes: number) => void} report
 * @returns {Promise<Uint8Array>}
 */
async function readWithProgress(response, expectedBytes, report) {
  if (!response.body) {
    const bytes = new Uint8Array(await response.arrayBuffer());
    report(bytes.byteLength);
    return bytes;
  }
  const chunks = [];
  let length = 0;
  const reader = response.body.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    chunks.push(value);
    length += value.byteLength;
    report(value.byteLength);
  }
  const bytes = new Uint8Array(length);
  let offset = 0;
  for (const chunk of chunks) {
    bytes.set(chunk, offset);
    offset += chunk.byteLength;
  }
  return bytes;
}

/**
 * @param {Uint8Array} bytes
 * @returns {Promise<string>}
 */
async function sha256Hex(bytes) {
  if (!globalThis.crypto?.subtle) throw new Error("crypto.subtle is unavailable: serve the bundle over https or from localhost");
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * The page's WebGPU adapter (null when there is none: requestDevice says so).
 * @returns {Promise<GPUAdapter|null>}
 */
async function requestAdapter() {
  if (!globalThis.navigator?.gpu) throw new Error("WebGPU is not available here (navigator.gpu is missing)");
  return navigator.gpu.requestAdapter();
}

/**
 * chooseKernels (host.js), its warning on the console.
 * @param {"auto"|"gpu"|"cpu"|"f16"} kernels the load option
 * @param {GPUAdapter|GPUDevice|null} gpu the adapter, or the device given to load()
 * @param {any} manifest
 * @returns {"gpu"|"cpu"|"f16"}
 */
function chosenKernels(kernels, gpu, manifest) {
  const choice = chooseKernels(kernels, gpu, manifest);
  if (choice.warning) console.warn(`relaxweb: ${choice.warning}`);
  return choice.kernels;
}

/**
 * Every kernel's WGSL, the CPU (f16) variant where `variant` is "cpu" ("f16") and the kernel
 * has one, with the file each came from and the variant.
 * @param {any} manifest
 * @param {(file: string) => URL} fileUrl
 * @param {"gpu"|"cpu"|"f16"} variant
 * @returns {Promise<{kernelSources: string[], kernelFiles: string[], kernels: "gpu"|"cpu"|"f16"}>}
 */
async function fetchKernelSources(manifest, fileUrl, variant) {
  const kernelFiles = manifest.kernels.map((/** @type {any} */ k) =>
    (variant === "cpu" && k.cpu_file) || (variant === "f16" && k.f16_file) || k.file);
  const kernelSources = await Promise.all(kernelFiles.map((/** @type {string} */ file) => fetchOk(fileUrl(file)).then((r) => r.text())));
  return { kernelSources, kernelFiles, kernels: variant };
}

/**
 * Request a device from `adapter` with the limits and features the bundle needs. When some
 * storage has no bound, also ask for the adapter's largest buffers, since storages may grow.
 * @param {GPUAdapter|null} adapter
 * @param {Record<string, number>} requiredLimits
 * @param {string[]} requiredFeatures
 * @param {boolean} unbounded
 * @param {boolean} profile also request "timestamp-query" when the adapter offers it
 * @returns {Promise<GPUDevice>}
 */
async function requestDevice(adapter, requiredLimits, requiredFeatures, unbounded, profile) {
  if (!adapter) throw new Error(NO_ADAPTER);
  checkDevice(adapter, requiredLimits, requiredFeatures, "GPU adapter");
  const limits = { ...requiredLimits };
  if (unbounded) {
    limits.maxStorageBufferBindingSize = adapter.limits.maxStorageBufferBindingSize;
    limits.maxBufferSize = adapter.limits.maxBufferSize;
  }
  const features = profile && adapter.features.has("timestamp-query") ? [...requiredFeatures, "timestamp-query"] : requiredFeatures;
  return adapter.requestDevice({ requiredLimits: limits, requiredFeatures: /** @type {GPUFeatureName[]} */ (features) });
}

/**
 * Throw one Error listing every required feature `gpu` lacks and every required limit it
 * does not meet (see deviceShortfalls in host.js).
 * @param {GPUAdapter|GPUDevice} gpu
 * @param {Record<string, number>} requiredLimits
 * @param {string[]} requiredFeatures
 * @param {string} owner "GPU adapter" or "device", for the message
 */
function checkDevice(gpu, requiredLimits, requiredFeatures, owner) {
  const problems = deviceShortfalls(gpu, requiredLimits, requiredFeatures, owner);
  if (problems.length > 0) throw new Error(problems.join("; "));
}

/**
 * Compile every kernel's WGSL; reject with the compiler's messages (file:line:column) when
 * one does not compile.
 * @param {GPUDevice} device
 * @param {any} manifest
 * @param {string[]} sources WGSL code per kernel
 * @param {string[]} files the file each came from, for messages
 * @returns {Promise<GPUShaderModule[]>}
 */
async function compileKernels(device, manifest, sources, files) {
  device.pushErrorScope("validation");
  const modules = manifest.kernels.map((/** @type {any} */ kernel, /** @type {number} */ k) =>
    device.createShaderModule({ label: kernel.name, code: sources[k] }));
  const scopeError = device.popErrorScope();
  await Promise.all(modules.map(async (/** @type {GPUShaderModule} */ module, /** @type {number} */ k) => {
    const kernel = manifest.kernels[k];
    const errors = (await module.getCompilationInfo()).messages.filter((m) => m.type === "error");
    if (errors.length > 0) {
      const lines = errors.map((m) => `  ${files[k]}:${m.lineNum}:${m.linePos}: ${m.message}`).join("\n");
      throw new Error(`kernel ${kernel.name} does not compile:\n${lines}`);
    }
  })).catch((error) => {
    scopeError.catch(() => {}); // the compiler's messages say more
    throw error;
  });
  const error = await scopeError;
  if (error) throw new Error(`WebGPU validation error while compiling the kernels: ${error.message}`);
  return modules;
}

/**
 * Create one compute pipeline per kernel, with explicit bind group layouts. The GPU calls
 * are made now, in kernel order; each returned promise settles when its pipeline is ready.
 * @param {GPUDevice} device
 * @param {any} manifest
 * @param {GPUShaderModule[]} modules compiled WGSL per kernel
 * @returns {Promise<GPUComputePipeline>[]}
 */
function createPipelines(device, manifest, modules) {
  return manifest.kernels.map((/** @type {any} */ kernel, /** @type {number} */ k) => {
    const bindGroupLayout = device.createBindGroupLayout({
      label: kernel.name,
      entries: kernel.bindings.map((/** @type {GPUBufferBindingType} */ type, /** @type {number} */ binding) => ({
        binding, visibility: COMPUTE_STAGE, buffer: { type },
      })),
    });
    return device.createComputePipelineAsync({
      label: kernel.name,
      layout: device.createPipelineLayout({ bindGroupLayouts: [bindGroupLayout] }),
      compute: { module: modules[k], entryPoint: kernel.entry_point },
    }).catch((error) => {
      throw new Error(`kernel ${kernel.name}: cannot create its pipeline: ${error.message}`);
    });
  });
}

/**
 * Create one read-only GPU buffer per weight bound whole, filled from its shard (a weight in
 * parts gets none here: see createWeightParts); counted in `model.stats`.
 * @param {Model} model
 * @param {any} manifest
 * @param {Uint8Array[]} shards
 * @returns {(GPUBuffer|null)[]}
 */
function createWeightBuffers(model, manifest, shards) {
  return manifest.weights.map((/** @type {any} */ weight) => {
    if ((weight.parts ?? 1) > 1) return null;
    return filledWeightBuffer(model, weight.name, shards[weight.shard].subarray(weight.offset, weight.offset + weight.nbytes));
  });
}

/**
 * A read-only GPU buffer holding `bytes` (at least 16 bytes, a multiple of 4), counted in `model.stats`.
 * @param {Model} model @param {string} label @param {Uint8Array} bytes
 * @returns {GPUBuffer}
 */
function filledWeightBuffer(model, label, bytes) {
  const buffer = model.createBuffer({
    label,
    size: Math.ceil(Math.max(bytes.byteLength, 16) / 4) * 4,
    usage: USAGE.STORAGE,
    mappedAtCreation: true,
  });
  new Uint8Array(buffer.getMappedRange()).set(bytes);
  model.stats.add("weightBytesWritten", bytes.byteLength);
  buffer.unmap();
  return buffer;
}

/**
 * The buffers bound for each part of each weight in parts (docs/bundle-format.md, "Weights
 * in parts"): the whole weight in one when the device binds it (the other parts a 16-byte
 * placeholder), else parts as large as the device binds, within `caps` (the `limits` option).
 * @param {Model} model
 * @param {any} manifest
 * @param {Uint8Array[]} shards
 * @param {Record<string, number>} caps
 * @returns {Map<number, WeightParts>}
 */
function createWeightParts(model, manifest, shards, caps) {
  const device = model.device;
  const binding = Math.min(device.limits.maxStorageBufferBindingSize, caps.maxStorageBufferBindingSize ?? Infinity);
  const buffer = Math.min(device.limits.maxBufferSize, caps.maxBufferSize ?? Infinity);
  const [largest, limitName] = buffer < binding ? [buffer, "maxBufferSize"] : [binding, "maxStorageBufferBindingSize"];
  /** @type {Map<number, WeightParts>} */
  const parts = new Map();
  manifest.weights.forEach((/** @type {any} */ weight, /** @type {number} */ index) => {
    if ((weight.parts ?? 1) === 1) return;
    const sizes = weightPartSizes(weight.nbytes, weight.parts, largest);
    if (sizes === null) {
      throw new Error(`weight '${weight.name}' has ${weight.nbytes} bytes, above the device's WebGPU limit ` +
        `${limitName} = ${largest}, and the bundle binds it in at most ${weight.parts} parts`);
    }
    const buffers = [];
    let start = weight.offset;
    for (const [part, size] of sizes.entries()) {
      buffers.push(filledWeightBuffer(model, `${weight.name} part ${part}`, shards[weight.shard].subarray(start, start + size)));
      start += size;
    }
    // the unused parts: one placeholder of its own per weight, so that destroying the parts frees each once
    const placeholder = buffers.length < weight.parts ? filledWeightBuffer(model, `${weight.name} unused part`, new Uint8Array(16)) : null;
    while (buffers.length < weight.parts) buffers.push(/** @type {GPUBuffer} */ (placeholder));
    parts.set(index, { buffers, sizes });
  });
  return parts;
}

/**
 * Check the `limits` option of load(): lower values of maxStorageBufferBindingSize and maxBufferSize.
 * @param {any} limits
 */
function checkLimitCaps(limits) {
  if (limits === null || typeof limits !== "object") throw new Error("limits must be an object");
  for (const [name, value] of Object.entries(limits)) {
    if (!["maxStorageBufferBindingSize", "maxBufferSize"].includes(name)) {
      throw new Error(`limits may lower maxStorageBufferBindingSize and maxBufferSize, not ${String(name).slice(0, 60)}`);
    }
    if (!Number.isInteger(value) || value < 256) throw new Error(`limits: ${name} must be an integer of at least 256`);
  }
}
