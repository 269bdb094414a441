// A bundle loaded on the wasm backend (load(url, {backend: "wasm"}), or "auto" without WebGPU):
// the same run(), reads, loops, sequences and KV caches as on WebGPU, through the same
// host-program driver (driver.js) over wasm_backend.js's WasmBackend; kept outputs are
// WasmTensors (a KV cache's present a view of the cache in the memory), so generate,
// generateMany and chat run generate.js's one loop (or, on a paged KV cache, the steps of
// paged_generate.js's scheduler), each token picked on the CPU by cpu_sampler.js. The twin of
// relaxweb/runtime/wasm_session.py.

import { checkInstances } from "./batch.js";
import { HostProgramDriver } from "./driver.js";
import { installGenerationMethods } from "./generate.js";
import { WasmBackend } from "./wasm_backend.js";

/** A bundle loaded on the wasm backend. */
export class WasmModel {
  /**
   * @param {any} manifest
   * @param {import("./page_host.js").PageHost} host
   * @param {ArrayBuffer} wasmBytes the bundle's kernels.wasm
   * @param {Uint8Array[]} shards the verified weight shards
   * @param {{threads?: number, bounds: (number|null)[], sizesAtBounds: number[]|null, tokenizer?: any, kernelTimeoutMs?: number,
   *   relaxedSimd?: boolean, warmUp?: boolean, prepared?: any}} options
   *   tokenizer: the bundle's (tokenizer.js loadTokenizer), or null; kernelTimeoutMs: the load option; relaxedSimd:
   *   whether the kernels run with relaxed SIMD (relaxed_simd.js useRelaxedSimd); warmUp: the load option; prepared:
   *   the kernels compiled and warmed up while the weights were fetched (wasm_backend.js prepareKernels), or null
   * @returns {Promise<WasmModel>}
   */
  static async create(manifest, host, wasmBytes, shards, { threads, bounds, sizesAtBounds, tokenizer = null, kernelTimeoutMs,
    relaxedSimd = false, warmUp, prepared = null }) {
    try {
      const backend = await WasmBackend.create(manifest, wasmBytes, shards,
        { threads, sizesAtBounds, kernelTimeoutMs, relaxedSimd, warmUp, prepared });
      return new WasmModel(manifest, host, backend, bounds, tokenizer);
    } catch (error) {
      host.dispose();
      throw error;
    }
  }

  /**
   * @param {any} manifest @param {import("./page_host.js").PageHost} host
   * @param {WasmBackend} backend @param {(number|null)[]} bounds the bound of each symbolic var in effect
   * @param {any} [tokenizer] the bundle's tokenizer (tokenizer.js), or null
   */
  constructor(manifest, host, backend, bounds, tokenizer = null) {
    this.manifest = manifest;
    this.host = host;
    /** Which backend runs the kernels. @type {"wasm"} */
    this.backend = "wasm";
    /** Why `backend: "auto"` did not take WebGPU (no adapter, or the limits and features it lacks,
     * naming the storage that needs a larger binding, or the manifest's webgpu.unavailable); null
     * when "wasm" was asked for. @type {string|null} */
    this.backendReason = null;
    /** The memory, kernels and state of runs: the driver's RunBackend. */
    this.runBackend = backend;
    this.driver = new HostProgramDriver(backend, host);
    /** @type {{name: string, dtype: string, shape: (number|string)[]}[]} */
    this.inputs = manifest.inputs;
    /** @type {{name: string, dtype: string, shape: (number|string)[]}[]} */
    this.outputs = manifest.outputs;
    this.symbolicVars = manifest.symbolic_vars.map((/** @type {any} */ v, /** @type {number} */ i) => ({ ...v, bound: bounds[i] }));
    /** The bundle's tokenizer (tokenizer.js), or null when it has none. */
    this.tokenizer = tokenizer;
    /** Whether dispose() was called (a generate running then rejects saying so). */
    this.disposed = false;
  }

  /** Threads that run a dispatch's units: the pool's workers, or 1 (the page's thread, where the page is not isolated). */
  get threads() {
    return this.runBackend.threads;
  }

  /** Whether the kernels run with relaxed SIMD (else lowered to plain SIMD128 at load; the `relaxedSimd` load option). */
  get relaxedSimd() {
    return this.runBackend.relaxedSimd;
  }

  /** The deadline of one kernel call in ms (the `kernelTimeoutMs` load option), on every page. */
  get kernelTimeoutMs() {
    return this.runBackend.kernelDeadlineMs;
  }

  /**
   * Counts of what moved in and out of the memory: `total` since load, `lastRun` since the last
   * run started (`buffersCreated`: regions laid out for storages; `bytesRead`: bytes copied out:
   * outputs, kept copies, values read mid-run; `liveGpuBytes` stays 0).
   */
  get stats() {
    return this.runBackend.stats;
  }

  /** Units that the pool's workers have run since load (0 with one thread): they really ran. */
  get unitsRunByWorkers() {
    return this.runBackend.unitsRunByWorkers;
  }

  /** Dispatches of the last run, over all its steps (those with no units included). */
  get lastDispatchCount() {
    return this.driver.lastDispatchCount;
  }

  /** Values the last run read back (0 for bundles without reads). */
  get lastReadCount() {
    return this.driver.lastReadCount;
  }

  /** How the last runBatch ran. @returns {import("./batch.js").BatchReport|null} */
  get lastBatch() {
    return this.driver.lastBatch;
  }

  /**
   * Run the model: the same results and errors as the WebGPU model's run(). `keepOnGpu`
   * (output names, or true) keeps those outputs in this model's memory as WasmTensors, which
   * run() takes back as inputs: a KV cache's present is a view of the cache (no copy; valid until
   * the next run ends), given back as its past without a byte written; any other kept output
   * is a copy of its bytes.
   * @param {Record<string, any>} inputs name -> {data, shape}, a kept tensor (or a sequence's elements)
   * @param {{keepOnGpu?: boolean|string[]}} [options]
   * @returns {Promise<Record<string, any>>}
   */
  async run(inputs, { keepOnGpu = false } = {}) {
    return this.driver.run(inputs, { keepOnGpu });
  }

  /**
   * Run a batch of instances (each its own inputs, of its own sizes): on the wasm backend one
   * after another (`lastBatch.mode` "one by one"), with the errors the WebGPU model's
   * runBatch() gives (the instance named).
   * @param {Record<string, any>[]} instances
   * @param {{keepOnGpu?: boolean|string[]}} [options]
   * @returns {Promise<Record<string, any>[]>}
   */
  async runBatch(instances, { keepOnGpu = false } = {}) {
    checkInstances(instances);
    if (keepOnGpu && !(Array.isArray(keepOnGpu) && keepOnGpu.length === 0)) {
      throw new Error("runBatch reads every output back: keepOnGpu is an option of run()");
    }
    return this.driver.runBatch(instances);
  }

  /**
   * Run `warmup` times, then once more timing every dispatch by the clock, and return that
   * run's outputs and its profile (profile.js's rows: one per kernel, slowest first).
   * @param {Record<string, any>} inputs @param {{warmup?: number}} [options]
   * @returns {Promise<{outputs: Record<string, any>, profile: import("./profile.js").Profile}>}
   */
  async profile(inputs, { warmup = 1 } = {}) {
    return this.driver.profile(inputs, warmup);
  }

  /** Stop the workers and the host module; the memory goes with the last reference. */
  dispose() {
    this.disposed = true;
    this.runBackend.dispose();
    this.host.dispose();
  }
}

// generate, generateMany, generationStats, applyChatTemplate and chat: generate.js's, as on the other model
installGenerationMethods(WasmModel.prototype);
