// The browser runtime of relaxweb: loads a bundle (docs/bundle-format.md) and runs it on
// WebGPU, or on its kernels.wasm (wasm_model.js). No build step; types are in JSDoc and in
// relaxweb.d.ts. A model's runs go through the host-program driver (driver.js) over its
// backend: webgpu_backend.js (and webgpu_batch.js for batches), over the device
// (webgpu_device.js), its kernels (webgpu_kernels.js) and its buffers (webgpu_buffers.js).
//
//   import { load } from "./runtime/relaxweb.js";
//   const model = await load("./");
//   const { y } = await model.run({ x: { data: new Float32Array(64), shape: [1, 64] } });

import { FORMAT_VERSION, InputShapeError, TYPED_ARRAY_OF_DTYPE, dtypeInfo } from "./host.js";
import { RunCheckError } from "./run_status.js";
import { GpuTensor, TransferStats } from "./gpu_tensor.js";
import { installGenerationMethods } from "./generate.js";
import { fetchedText, loadTokenizer } from "./tokenizer.js";
import { validateManifest } from "./manifest.js";
import { PageHost } from "./page_host.js";
import { checkInstances } from "./batch.js";
import { DEFAULT_CACHE_NAME, fetchBytes, fetchManifest, fetchShards, openShardCache, resolveManifestUrl } from "./bundle_files.js";
import { HostProgramDriver } from "./driver.js";
import { WebGpuBackend } from "./webgpu_backend.js";
import { ModelBuffers } from "./webgpu_buffers.js";
import {
  NO_ADAPTER, WebGpuDevice, checkDevice, checkLimitCaps, deviceShortfalls, loadTimeLimits, requestAdapter, requestDevice,
} from "./webgpu_device.js";
import { KernelPipelines, SHADER_F16, chosenKernels, compileKernels, fetchKernelSources } from "./webgpu_kernels.js";
import { checkRelaxedSimd, useRelaxedSimd } from "./relaxed_simd.js";
import { KERNEL_TIMEOUT_MS, kernelTimeout, prepareKernels, sharedMemoryVariant, singleThreadReason, threadCount } from "./wasm_backend.js";
import { splitUnits } from "./wasm_pool.js";
import { checkWarmUp } from "./warm_up.js";
import { WasmModel } from "./wasm_model.js";

export { DEFAULT_CACHE_NAME, GpuTensor, InputShapeError, KERNEL_TIMEOUT_MS, RunCheckError, WasmModel, sharedMemoryVariant, splitUnits };

/**
 * @typedef {import("./host.js").InputTensor} Tensor
 * @typedef {import("./bundle_files.js").Progress} Progress
 * @typedef {Object} LoadOptions
 * @property {"auto"|"webgpu"|"wasm"} [backend]  what runs the kernels: "webgpu", "wasm" (the
 *   bundle's kernels.wasm on the CPU, wasm_backend.js), or "auto" (the default): WebGPU where
 *   the page's adapter (or `device`) meets the bundle's required limits and features and the
 *   manifest has no `webgpu.unavailable` (an int64 weight outside int32), else wasm when the
 *   bundle has kernels.wasm; `model.backend` says which, and `model.backendReason`
 *   why "auto" did not take WebGPU (null when it did, or when a backend was asked for)
 * @property {number} [threads]  the wasm backend's threads, where the page is cross-origin
 *   isolated (default: min(navigator.hardwareConcurrency, 4)); elsewhere always 1; `model.threads`
 * @property {boolean} [warmUp]  the wasm backend calls every kernel with no units at load, so that
 *   the engine compiles it for speed before the first run (warm_up.js): by default for models of
 *   4 MiB of weights and more
 * @property {boolean} [relaxedSimd]  the wasm backend's multiply-adds with relaxed SIMD (fused):
 *   by default where the engine compiles it; false lowers them to plain SIMD128 at load
 *   (results the same on every machine), true insists; `model.relaxedSimd` says which runs
 * @property {number} [kernelTimeoutMs]  the wasm backend's deadline for one kernel call, on its
 *   worker threads or on the page's (default KERNEL_TIMEOUT_MS, 10 s): past it the call is
 *   stopped, the run rejects and the model must be loaded again
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
 * Load a bundle and prepare it to run.
 * @param {string|URL} url the bundle folder (or its manifest.json)
 * @param {LoadOptions} [options]
 * @returns {Promise<Model|WasmModel>} a Model on WebGPU, a WasmModel on the wasm backend
 */
export async function load(url, {
  backend = "auto", threads, bounds, onProgress, device, cache, profile = false, kernels = "auto", limits = {},
  kernelTimeoutMs, relaxedSimd, warmUp,
} = {}) {
  if (!["auto", "webgpu", "wasm"].includes(backend)) throw new Error(`backend must be "auto", "webgpu" or "wasm", got ${String(backend).slice(0, 40)}`);
  if (!["auto", "gpu", "cpu", "f16"].includes(kernels)) throw new Error(`kernels must be "auto", "gpu", "cpu" or "f16", got ${String(kernels).slice(0, 40)}`);
  if (threads !== undefined) threadCount(threads); // checks the option even where there are no threads
  kernelTimeout(kernelTimeoutMs);
  checkRelaxedSimd(relaxedSimd);
  checkWarmUp(warmUp);
  checkLimitCaps(limits);
  const manifestUrl = resolveManifestUrl(url);
  const manifest = await fetchManifest(manifestUrl);
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
  // an int64 weight outside int32 (the manifest's webgpu.unavailable): WebGPU on no device, so no adapter is asked
  const webgpuProblem = manifest.webgpu ? `WebGPU cannot run this bundle: ${manifest.webgpu.unavailable}` : null;
  if (webgpuProblem && (backend === "webgpu" || wasmProblem)) {
    throw new Error(backend === "webgpu" ? `${webgpuProblem}; load it with backend "wasm"` : `${webgpuProblem}, and ${wasmProblem}`);
  }
  const fileUrl = (/** @type {string} */ file) => new URL(file, manifestUrl);
  // a Hugging Face tokenizer's libraries and files, while the rest loads (nothing without one)
  const tokenizerPromise = loadTokenizer(manifest.tokenizer, fetchedText(fileUrl));
  tokenizerPromise.catch(() => {}); // awaited below

  // The adapter comes first (a given device knows its own): which backend runs, and which
  // kernel shaders to fetch, depend on it. "auto" takes a missing adapter for the wasm backend.
  /** @type {Error|null} why there is no adapter ("auto" only: the wasm backend may run instead) */
  let adapterError = null;
  const adapterPromise = device || backend === "wasm" || webgpuProblem ? Promise.resolve(null)
    : backend === "auto" ? requestAdapter().then((a) => a ?? Promise.reject(new Error(NO_ADAPTER)))
      .catch((/** @type {Error} */ error) => { adapterError = error; return null; })
    : requestAdapter();
  // The kernels of the backend the adapter makes likely are fetched with the shards (the
  // choice itself waits for the host module's sizes at the bounds; the other backend's kernels
  // are fetched then, when it is the other one).
  const wasmLikely = adapterPromise.then((a) => backend === "wasm" || webgpuProblem !== null || (backend === "auto" && !device && a === null));
  const wasmBytesPromise = wasmLikely.then((likely) => (likely && !wasmProblem ? fetchBytes(fileUrl(manifest.wasm.file)) : null));
  const shadersPromise = Promise.all([wasmLikely, adapterPromise]).then(([likely, a]) =>
    (likely ? null : fetchKernelSources(manifest, fileUrl, chosenKernels(kernels, device ?? a, manifest))));
  // kernels.wasm compiled and warmed up while the shards are fetched (wasm_backend.js prepareKernels), where a
  // relaxed SIMD choice can be made now; create() compiles again where this gives nothing
  const preparedPromise = wasmBytesPromise.then((bytes) => {
    if (!bytes) return null;
    let relaxed;
    try { relaxed = useRelaxedSimd(manifest.wasm, relaxedSimd); } catch { return null; }
    return prepareKernels(manifest, bytes, { relaxedSimd: relaxed, warmUp });
  }).catch(() => null);
  for (const promise of [wasmBytesPromise, shadersPromise]) promise.catch(() => {}); // awaited below, where used
  const [host, shards, adapter] = await Promise.all([
    fetchBytes(fileUrl("host.wasm")).then((b) => PageHost.instantiate(b, manifest)),
    openShardCache(cache).then((shardCache) => fetchShards(manifest, fileUrl, onProgress, shardCache)),
    adapterPromise,
  ]);
  try {
    const tokenizer = await tokenizerPromise;
    const configured = await host.configure(bounds);
    const { sizesAtBounds } = configured;
    const requiredLimits = loadTimeLimits(manifest, sizesAtBounds);
    const requiredFeatures = [...(manifest.required_features ?? [])];
    const gpu = device ?? adapter;
    const chosen = chosenBackend(backend, manifest, gpu, requiredLimits, requiredFeatures, sizesAtBounds);
    if (chosen === "wasm") {
      const relaxed = useRelaxedSimd(manifest.wasm, relaxedSimd); // throws where relaxedSimd: true cannot be met
      const wasmBytes = (await wasmBytesPromise) ?? (await fetchBytes(fileUrl(manifest.wasm.file)));
      const model = await WasmModel.create(manifest, host, wasmBytes, shards,
        { threads, ...configured, tokenizer, kernelTimeoutMs, relaxedSimd: relaxed, warmUp, prepared: await preparedPromise });
      if (backend === "auto") {
        model.backendReason = webgpuProblem ?? (gpu === null ? (adapterError?.message ?? NO_ADAPTER)
          : deviceShortfalls(gpu, requiredLimits, requiredFeatures, "GPU adapter", manifest, sizesAtBounds).join("; "));
        console.info(`relaxweb: WebGPU cannot run this model: ${model.backendReason}`);
      }
      const why = model.threads === 1 ? singleThreadReason(threads) : "";
      console.info(`relaxweb: the wasm backend runs this model (${model.threads} thread${model.threads === 1 ? "" : "s"}${why && `: ${why}`})`);
      return model;
    }
    if (adapterError) throw new Error(`${adapterError.message}, and ${wasmProblem}`);
    const kernelShaders = (await shadersPromise) ?? (await fetchKernelSources(manifest, fileUrl, chosenKernels(kernels, device ?? adapter, manifest)));
    if (kernelShaders.kernels === "f16" && !requiredFeatures.includes(SHADER_F16)) requiredFeatures.push(SHADER_F16);
    const gpuDevice = device ?? (await requestDevice(adapter, requiredLimits, requiredFeatures, sizesAtBounds === null, profile,
      manifest, sizesAtBounds));
    checkDevice(gpuDevice, requiredLimits, requiredFeatures, "device", manifest, sizesAtBounds);
    const model = await Model.create(manifest, host, gpuDevice, {
      ...kernelShaders, shards, ownsDevice: !device, limitCaps: limits, fileUrl, ...configured, tokenizer,
    });
    console.info("relaxweb: the webgpu backend runs this model");
    return model;
  } catch (error) {
    host.dispose(); // stops its worker (Model.create's failure disposed the rest)
    throw error;
  }
}

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
 * (or the given device) meets the bundle's required limits and features and the manifest does
 * not say that WebGPU cannot run it (`webgpu.unavailable`), else wasm (when the bundle has
 * kernels.wasm; without it, WebGPU, whose errors say what is missing).
 * @param {"auto"|"webgpu"|"wasm"} backend @param {any} manifest @param {GPUAdapter|GPUDevice|null} gpu
 * @param {Record<string, number>} requiredLimits @param {string[]} requiredFeatures
 * @param {number[]|null} sizesAtBounds each storage's size at the bounds in effect
 * @returns {"webgpu"|"wasm"}
 */
function chosenBackend(backend, manifest, gpu, requiredLimits, requiredFeatures, sizesAtBounds) {
  if (backend !== "auto") return backend;
  if (manifest.webgpu) return "wasm"; // its webgpu.unavailable (load() refused the bundle when it has no kernels.wasm either)
  const gpuFits = gpu !== null && deviceShortfalls(gpu, requiredLimits, requiredFeatures, "GPU adapter", manifest, sizesAtBounds).length === 0;
  return gpuFits || kernelsWasmProblem(manifest) ? "webgpu" : "wasm";
}

/** A loaded bundle on WebGPU: its GPU resources, its host module, and the driver of its runs. */
export class Model {
  /**
   * @param {any} manifest
   * @param {PageHost} host
   * @param {GPUDevice} device
   * @param {{kernelSources: string[], kernelFiles: string[], kernels: "gpu"|"cpu"|"f16", shards: Uint8Array[], ownsDevice: boolean,
   *   bounds: (number|null)[], sizesAtBounds: number[]|null, limitCaps?: Record<string, number>, fileUrl?: (file: string) => URL,
   *   tokenizer?: any}} parts
   * @returns {Promise<Model>}
   */
  static async create(manifest, host, device, parts) {
    const model = new Model(manifest, host, device, parts);
    try {
      const modules = await model.gpu.orDeviceLoss(compileKernels(device, manifest, parts.kernelSources, parts.kernelFiles));
      await model.gpu.captureGpuErrors("load", () => {
        model.buffers.loadWeights(parts.shards, parts.limitCaps ?? {});
        model.buffers.allocateStoragesAtBounds(parts.sizesAtBounds);
        model.pipelines.start(modules);
      });
      return model;
    } catch (error) {
      model.dispose();
      throw error;
    }
  }

  /**
   * @param {any} manifest
   * @param {PageHost} host
   * @param {GPUDevice} device
   * @param {{kernels: "gpu"|"cpu"|"f16", ownsDevice: boolean, bounds: (number|null)[], sizesAtBounds: number[]|null,
   *   fileUrl?: (file: string) => URL, tokenizer?: any}} parts which shaders were compiled, whether load() requested the
   *   device, the bound of each symbolic var in effect, each storage's size at the bounds, the URL of a bundle file, the
   *   bundle's tokenizer (tokenizer.js loadTokenizer)
   */
  constructor(manifest, host, device, { kernels, ownsDevice, bounds, sizesAtBounds, fileUrl, tokenizer = null }) {
    this.manifest = manifest;
    this.host = host;
    this.device = device;
    this.ownsDevice = ownsDevice;
    /** Which backend runs the kernels. @type {"webgpu"} */
    this.backend = "webgpu";
    /** Why `backend: "auto"` did not take WebGPU: null, since it did. @type {null} */
    this.backendReason = null;
    /** Which shaders the kernels with a variant were compiled from: "gpu", "cpu" or "f16". @type {"gpu"|"cpu"|"f16"} */
    this.kernels = kernels;
    /** @type {{name: string, dtype: string, shape: (number|string)[]}[]} */
    this.inputs = manifest.inputs;
    /** @type {{name: string, dtype: string, shape: (number|string)[]}[]} */
    this.outputs = manifest.outputs;
    /** The symbolic vars, with the bounds in effect (after the `bounds` option). */
    this.symbolicVars = manifest.symbolic_vars.map((/** @type {any} */ v, /** @type {number} */ i) => ({
      ...v,
      bound: bounds[i],
    }));
    /** Counts of its GPU calls: `total` since load began, `lastRun` since the last run started;
     * `liveGpuBytes`: the bytes of its buffers not destroyed. */
    this.stats = new TransferStats();
    /** The bundle's tokenizer (tokenizer.js), or null when it has none. */
    this.tokenizer = tokenizer;
    /** Whether dispose() was called (a generate running then rejects saying so). */
    this.disposed = false;
    /** The device, its loss and its errors as this model sees them. */
    this.gpu = new WebGpuDevice(device);
    this.buffers = new ModelBuffers(device, manifest, this.stats);
    this.pipelines = new KernelPipelines(this.gpu, manifest, kernels, fileUrl ?? null);
    /** Each state of a run on the device: the driver's RunBackend. */
    this.runBackend = new WebGpuBackend(this, this.gpu, this.buffers, this.pipelines, sizesAtBounds);
    this.driver = new HostProgramDriver(this.runBackend, host);
  }

  /**
   * Resolves when every pipeline is ready; rejects if one cannot be created. A run does not
   * wait for it: each dispatch waits for its own kernel's pipeline only.
   * @returns {Promise<void>}
   */
  get ready() {
    return this.pipelines.ready;
  }

  /** Dispatches of the last run, over all its steps. */
  get lastDispatchCount() {
    return this.driver.lastDispatchCount;
  }

  /** Values the last run read back from the GPU (0 for bundles without reads). */
  get lastReadCount() {
    return this.driver.lastReadCount;
  }

  /** How the last runBatch ran (batch.js). @returns {import("./batch.js").BatchReport|null} */
  get lastBatch() {
    return this.driver.lastBatch;
  }

  /**
   * For each weight the bundle binds in parts, by name, the byte sizes of the buffers it was
   * loaded into (one: the device binds it whole; docs/bundle-format.md, "Weights in parts").
   * @returns {Record<string, number[]>}
   */
  get weightPartSizes() {
    return this.buffers.weightPartSizes;
  }

  /**
   * Run the model. `keepOnGpu` (output names, or true for every output but sequences) gives
   * those outputs as GpuTensors, nothing read back; a GpuTensor input is copied on the GPU.
   * @param {Record<string, Tensor|GpuTensor>} inputs name -> {data, shape} or GpuTensor
   * @param {{keepOnGpu?: boolean|string[]}} [options]
   * @returns {Promise<Record<string, Tensor|GpuTensor>>} name -> {data, shape} or GpuTensor
   */
  async run(inputs, { keepOnGpu = false } = {}) {
    return this.driver.run(inputs, { keepOnGpu });
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
    this.gpu.checkUsable();
    checkInstances(instances);
    if (keepOnGpu && !(Array.isArray(keepOnGpu) && keepOnGpu.length === 0)) {
      throw new Error("runBatch reads every output back: keepOnGpu is an option of run()");
    }
    return this.driver.runBatch(instances);
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
    return this.driver.profile(inputs, warmup);
  }

  /** Free the GPU resources (and the device, when load() requested it). */
  dispose() {
    this.disposed = true;
    this.gpu.unusableReason ??= "the model was disposed";
    this.buffers.dispose(); // and the buffers of GpuTensors disposed later
    this.runBackend.dispose();
    if (this.ownsDevice) this.device.destroy();
    this.host.dispose();
  }

  // What GpuTensors and generate use ----------------------------------------------------

  /** Buffers of disposed GpuTensors, for the next kept outputs. */
  get gpuTensorPool() {
    return this.buffers.gpuTensorPool;
  }

  /**
   * A GpuTensor's values, read back as `{data, shape}` (what `tensor.read()` calls).
   * @param {GpuTensor} tensor @returns {Promise<Tensor>}
   */
  readGpuTensor(tensor) {
    return this.runBackend.readGpuTensor(tensor);
  }

  /**
   * Encode the copy of the run status a run that read nothing back left unread to `offset` of
   * `readback`, a buffer the caller maps and checks there (checkRunStatus) before using what it
   * read; whether there was one (generate's token read).
   * @param {GPUCommandEncoder} encoder @param {GPUBuffer} readback @param {number} offset @returns {boolean}
   */
  copyUnreadStatus(encoder, readback, offset) {
    return this.buffers.copyUnreadStatus(encoder, readback, offset);
  }

  /** `device.createBuffer`, counted in `stats`. @param {GPUBufferDescriptor} descriptor @returns {GPUBuffer} */
  createBuffer(descriptor) {
    return this.buffers.createBuffer(descriptor);
  }

  /**
   * `queue.writeBuffer`, its bytes counted in `stats` under `counter`.
   * @param {GPUBuffer} buffer @param {ArrayBufferView} data
   * @param {"inputBytesWritten"|"paramsBytesWritten"} counter @param {number} [offset]
   */
  writeBuffer(buffer, data, counter, offset = 0) {
    this.buffers.writeBuffer(buffer, data, counter, offset);
  }

  /**
   * `work` inside error scopes: its first GPU error rejects (WebGpuDevice.captureGpuErrors).
   * @template T @param {string} what @param {() => T | Promise<T>} work @returns {Promise<T>}
   */
  captureGpuErrors(what, work) {
    return this.gpu.captureGpuErrors(what, work);
  }

  /** `promise`, rejected as soon as the device is lost. @template T @param {Promise<T>} promise @returns {Promise<T>} */
  orDeviceLoss(promise) {
    return this.gpu.orDeviceLoss(promise);
  }
}

// generate, generateMany, generationStats, applyChatTemplate and chat: generate.js's, as on the other model
installGenerationMethods(Model.prototype);
