// The wasm backend of the browser runtime: a bundle's kernels run from its kernels.wasm
// (WebAssembly SIMD) on the CPU, driven by the same host module, command records, params
// blocks and call sites as on WebGPU (docs/bundle-format.md, "kernels.wasm"), through the
// same host-program driver (driver.js; WasmBackend is its RunBackend). load() in relaxweb.js
// picks it when WebGPU is missing (backend "auto") or when asked (backend "wasm"); the public
// model is wasm_model.js's WasmModel.
//
// Memory: one WebAssembly.Memory laid out as the contract says: bytes [0, 64 KiB) never a
// buffer, then the params region, the weights (copied once from the verified shards), the
// prepacked regions (`wasm.prepacked`: a weight's panels as its kernel's packed tier reads them,
// written by kK_pack at load), one scratch block per thread, the storages (16-byte aligned), and at least 64 KiB of slack.
// KV caches (the manifest's `caches`) get their regions at load, at their size at the bounds,
// and never move. A storage that must grow mid-run moves to a new region at the top, its
// contents copied; before a run's first step the other storages are laid out again (a bundle
// with bounds allocates every storage once, at load).
//
// Kept outputs (`run(inputs, {keepOnGpu})`, what generate runs with) are WasmTensors: a KV
// cache's present is a view of the cache's region, taken back as the next run's past without a
// byte moved; any other kept output holds a copy of its device bytes, made at its run's end.
//
// Tensors are held in the memory as the manifest's `dtypes` table says of kernels.wasm
// (`wasm_dtype`, `wasm_bytes`: an int64 as an 8-byte little-endian int64, exactly; every other
// dtype as on the GPU): the backend converts by wasmManifest's view of the manifest (tensors.js),
// so inputs, outputs, kept tensors, cache views and byte counts all follow it; the shards
// hold each weight in this form too (an int64 weight as int64), copied in as they are.
//
// Threads: where the page is cross-origin isolated (SharedArrayBuffer) the memory is shared
// and a pool of workers (wasm_pool.js, wasm_worker.js) instantiates the shared-memory variant of the
// module; every kernel call runs on the workers, never on the page's thread. The page posts a
// stage's dispatches to worker 0, the leader, and awaits the stage once (Atomics.waitAsync);
// the leader counts each dispatch's units (kK_units), splits them into contiguous ranges, one
// per worker, runs the first and waits for the others (Atomics, among workers). Each kernel
// call has a deadline (`kernelTimeoutMs`, KERNEL_TIMEOUT_MS by default) from the start the
// leader stamps: a call that passes it has its workers terminated, the run rejects and the
// model cannot run any more (load it again). Where the page is not isolated there is no memory
// to share with a worker: kernels run on the page's thread, one call at a time, from the
// kernels.wasm rewritten to look at the clock as it loops (interruptible_kernels.js): a call
// past the same deadline throws, and the model cannot run any more either (docs/design.md,
// "Deadlines").

import { TYPED_ARRAY_OF_DTYPE, dtypeInfo, fromDeviceData } from "./host.js";
import { GpuTensor, TransferStats, cacheBlockCopies } from "./gpu_tensor.js";
import { InputCopies, keptOutputIndices, prepareInputs, splitElements, wasmManifest } from "./tensors.js";
import { WALL_CLOCK, WallClockTimer } from "./profile.js";
import { STATUS_BYTES, checkRunStatus } from "./run_status.js";
import { DEADLINE_IMPORT, DeadlineClock, interruptibleKernels, readLeb } from "./interruptible_kernels.js";
import { lowerRelaxedSimd } from "./relaxed_simd.js";
import { afterTierUp, warmUpBlocks, warmUpKernels, warmsUp } from "./warm_up.js";
import { DispatchFailure, WorkerPool } from "./wasm_pool.js";

export { WALL_CLOCK };

export const PAGE_BYTES = 65536;
/** Bytes [0, RESERVED_BYTES) are never a buffer: a stray small address reads zeros or traps. */
export const RESERVED_BYTES = 65536;
/** Bytes kept free after the last buffer: a vector load of its last elements may read past it. */
export const SLACK_BYTES = 65536;
/**
 * Prepacked regions (`wasm.prepacked`) are laid out while they end below this address: a model
 * whose weights are near the 4 GiB of a wasm32 memory keeps that room for its storages (its call
 * sites past it get no region, and their kernels pack per call as without one).
 */
export const PREPACKED_LIMIT_BYTES = 2 ** 31;
/** The most pages a wasm32 memory holds (4 GiB); kernels.wasm declares it as its memory's maximum. */
export const MAX_PAGES = 65536;
/** The default thread count is min(navigator.hardwareConcurrency, DEFAULT_MAX_THREADS). */
export const DEFAULT_MAX_THREADS = 4;

/**
 * How long one kernel call (its kK_units, then its units on all the workers) may run before its
 * workers are stopped and the run fails: the host module's limit (HOST_CALL_TIMEOUT_MS). A kernel
 * call of the models relaxweb runs on the CPU takes milliseconds to a second; a kernels.wasm
 * that loops fails within it. The load option `kernelTimeoutMs` overrides it.
 */
export const KERNEL_TIMEOUT_MS = 10_000;

/**
 * `bytes` (a kernels.wasm) with its memory import made shared (limits flag 0x01 -> 0x03),
 * for threads: the twin of relaxweb/cpu/module.py's shared_memory_variant. The module imports
 * exactly one memory with a maximum; anything else is refused (the bytes are not a
 * kernels.wasm relaxweb wrote).
 * @param {ArrayBuffer|Uint8Array} bytes
 * @returns {Uint8Array} a copy, edited
 */
export function sharedMemoryVariant(bytes) {
  const data = new Uint8Array(bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes)).slice();
  const header = [0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00];
  if (data.length < 8 || header.some((byte, i) => data[i] !== byte)) throw new Error("not a WebAssembly module (version 1)");
  let position = 8;
  while (position < data.length) {
    const sectionId = data[position];
    const [size, start] = readLeb(data, position + 1);
    if (sectionId === 2) {
      let [count, cursor] = readLeb(data, start);
      for (; count > 0; count--) {
        for (let field = 0; field < 2; field++) { // module name, field name
          const [length, after] = readLeb(data, cursor);
          cursor = after + length;
        }
        if (data[cursor] !== 0x02) throw new Error("kernels.wasm imports something other than its memory");
        if (data[cursor + 1] !== 0x01) throw new Error("the memory import is not a non-shared memory with a maximum");
        data[cursor + 1] = 0x03;
        return data;
      }
    }
    position = start + size;
  }
  throw new Error("kernels.wasm has no memory import");
}

/**
 * How many threads the wasm backend uses: 1 where the page is not cross-origin isolated (no
 * SharedArrayBuffer) or has no workers, else the `threads` option, by default
 * min(navigator.hardwareConcurrency, DEFAULT_MAX_THREADS).
 * @param {number|undefined} threads the load option
 * @returns {number}
 */
export function threadCount(threads) {
  if (threads !== undefined && (!Number.isInteger(threads) || threads < 1 || threads > 256)) {
    throw new Error(`threads must be an integer from 1 to 256, got ${String(threads).slice(0, 40)}`);
  }
  if (!workersShareMemory()) return 1;
  return threads ?? Math.max(1, Math.min(globalThis.navigator?.hardwareConcurrency ?? 1, DEFAULT_MAX_THREADS));
}

/** Whether this page can share a memory with workers (cross-origin isolated, with Worker): kernels then run on a pool. */
export function workersShareMemory() {
  return globalThis.crossOriginIsolated === true && typeof SharedArrayBuffer !== "undefined" && typeof Worker !== "undefined";
}

/**
 * The `kernelTimeoutMs` load option checked: milliseconds above 0, at most a day.
 * @param {number|undefined} ms @returns {number}
 */
export function kernelTimeout(ms) {
  if (ms === undefined) return KERNEL_TIMEOUT_MS;
  if (typeof ms !== "number" || !(ms > 0 && ms <= 86_400_000)) {
    throw new Error(`kernelTimeoutMs must be a number of milliseconds above 0 and at most 86400000, got ${String(ms).slice(0, 40)}`);
  }
  return ms;
}

/**
 * Why the wasm backend runs on one thread although more were not refused by the `threads`
 * option, for load's console line; "" where nothing stopped it (threads: 1 asked for, or one core).
 * @param {number|undefined} threads the load option
 * @returns {string}
 */
export function singleThreadReason(threads) {
  if (threads === 1) return "";
  if (globalThis.crossOriginIsolated !== true) {
    return "this page is not cross-origin isolated, so it has no SharedArrayBuffer to share with worker threads " +
      "(serve it with the headers Cross-Origin-Opener-Policy: same-origin and Cross-Origin-Embedder-Policy: " +
      "require-corp, as relaxweb serve does)";
  }
  if (typeof SharedArrayBuffer === "undefined") return "this browser has no SharedArrayBuffer";
  if (typeof Worker === "undefined") return "this context has no Worker";
  return "";
}

/** @param {number} value @returns {number} */
const aligned16 = (value) => Math.ceil(value / 16) * 16;

/**
 * A run's inputs on this backend: PreparedRun (driver.js) with the device inputs by name and
 * the indices of the outputs to keep.
 * @typedef {{shapes: number[][], sequences: Record<number, number[][]|null>, inputs: Record<string, import("./tensors.js").DeviceInput>,
 *   kept: Set<number>}} WasmRun
 */

/**
 * An output a wasm model's `run(inputs, {keepOnGpu})` kept: a GpuTensor's interface (`name`,
 * `dtype`, `shape`, `read()`, `dispose()`, given back to `run` as an input) over the model's
 * memory instead of a GPU. A KV cache's present is a view of the cache's region (`cacheView`
 * set: valid until the next run ends, as on WebGPU); any other kept output holds a copy of its
 * device bytes, made at the end of its run.
 */
export class WasmTensor extends GpuTensor {
  /**
   * @param {WasmBackend} backend @param {any} spec the output's manifest entry @param {number[]} shape
   * @param {number} byteLength @param {Int32Array|Uint32Array|Float32Array|BigInt64Array|null} data its values as the memory holds
   *   them (a copy), or null for a view
   * @param {{cache: any, run: number}|null} cacheView
   */
  constructor(backend, spec, shape, byteLength, data, cacheView) {
    super(/** @type {any} */ (backend), spec.name, spec.dtype, shape, /** @type {any} */ (data ?? cacheView?.cache.storage), byteLength, cacheView);
    this.backend = backend;
    this.spec = spec;
  }

  /** Its values as the memory holds them (the dtype's `wasm_dtype`), flat; a view's read from the cache now. */
  deviceData() {
    this.buffer(); // throws once disposed
    return this.cacheView ? this.backend.readView(this) : /** @type {any} */ (this.gpuBuffer);
  }

  /** Its values: `{data, shape}` as `run` gives an output. */
  async read() {
    const data = this.deviceData();
    const info = dtypeInfo(this.backend.manifest, this.spec);
    return { data: fromDeviceData(this.spec, info, data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength)), shape: this.shape };
  }

  /** Drop it (its copy, or its claim on the cache's rows); using it afterwards is an error. */
  dispose() {
    this.gpuBuffer = null;
  }
}

/**
 * The bundle's kernels.wasm as this engine runs it: lowered to plain SIMD128 unless `relaxedSimd`.
 * @param {any} manifest @param {ArrayBuffer|Uint8Array} wasmBytes @param {boolean} relaxedSimd
 */
function kernelBytes(manifest, wasmBytes, relaxedSimd) {
  return manifest.wasm.relaxed_madd_sites && !relaxedSimd ? lowerRelaxedSimd(wasmBytes, manifest.wasm.relaxed_madd_sites) : wasmBytes;
}

/**
 * kernels.wasm compiled for the page's thread and, for a model that is warmed up (warm_up.js),
 * its kernels warmed up on an instance and memory of their own, while the load still fetches the
 * weights: V8 compiles the kernels with its optimizing compiler in the background, and for a
 * large module that took longer than the one task the load waited after the warm-up, so the first
 * run's first kernels still ran in baseline code (ResNet-50 in Node: the first run 1.2-1.3x the
 * next ones). WasmBackend.create then instantiates this module (`prepared`): its instances share
 * the compiled code. Null where workers share memory (there the pool's leader warms up) and where
 * preparing fails (create compiles as before and reports what is wrong).
 * @param {any} manifest @param {ArrayBuffer|Uint8Array} wasmBytes
 * @param {{relaxedSimd: boolean, warmUp?: boolean}} options as create's
 * @returns {Promise<{module: WebAssembly.Module, relaxedSimd: boolean, warmUp: {kernels: number, ms: number}|null}|null>}
 */
export async function prepareKernels(manifest, wasmBytes, { relaxedSimd, warmUp }) {
  if (workersShareMemory()) return null;
  try {
    const module = await WebAssembly.compile(interruptibleKernels(kernelBytes(manifest, wasmBytes, relaxedSimd)));
    if (!warmsUp(manifest, warmUp)) return { module, relaxedSimd, warmUp: null };
    const paramsBase = RESERVED_BYTES;
    const memory = new WebAssembly.Memory({ initial: Math.ceil((paramsBase + manifest.params_bytes + 16) / PAGE_BYTES), maximum: MAX_PAGES });
    const clock = new KernelClock();
    const instance = await WebAssembly.instantiate(module, { env: { memory }, [DEADLINE_IMPORT[0]]: { [DEADLINE_IMPORT[1]]: clock.deadline } });
    const exports = /** @type {Record<string, Function>} */ (instance.exports);
    const blocks = warmUpBlocks(manifest, paramsBase).filter(({ kernel }) => typeof exports[`k${kernel}`] === "function");
    const result = warmUpKernels((k) => exports[`k${k}`], blocks, new Int32Array(memory.buffer), (ms) => clock.start(ms));
    return { module, relaxedSimd, warmUp: result };
  } catch {
    return null;
  }
}

/**
 * The wasm backend of the host-program driver (driver.js): the memory of one model's
 * kernels.wasm and each state of a run in it. The twin of relaxweb/runtime/wasm_backend.py.
 * A stage is its params block written, then each dispatch run at once; a read reads the i32
 * from the storage's region; the outputs are copied out of their storages by the run's end.
 */
export class WasmBackend {
  /**
   * Compile and instantiate a bundle's kernels.wasm (its shared-memory variant, with a pool of
   * workers, where the page gives threads), and lay its memory out.
   * @param {any} manifest
   * @param {ArrayBuffer} wasmBytes the bundle's kernels.wasm
   * @param {Uint8Array[]} shards the verified weight shards
   * @param {{threads?: number, sizesAtBounds: number[]|null, kernelTimeoutMs?: number, relaxedSimd?: boolean,
   *   warmUp?: boolean, prepared?: Awaited<ReturnType<typeof prepareKernels>>}} options relaxedSimd: whether the
   *   kernels run with relaxed SIMD (relaxed_simd.js useRelaxedSimd: else they are lowered to plain SIMD128 here);
   *   warmUp: the load option (warm_up.js warmsUp); prepared: prepareKernels' module, used on the page's thread
   * @returns {Promise<WasmBackend>}
   */
  static async create(manifest, wasmBytes, shards, { threads, sizesAtBounds, kernelTimeoutMs, relaxedSimd = false, warmUp,
    prepared = null }) {
    const timeoutMs = kernelTimeout(kernelTimeoutMs);
    const count = threadCount(threads);
    const shared = workersShareMemory(); // then every kernel call runs on the pool, even with one thread
    const memory = new WebAssembly.Memory({ initial: 1, maximum: MAX_PAGES, shared });
    const early = !shared && prepared?.relaxedSimd === relaxedSimd ? prepared : null;
    let module;
    try {
      const kernels = early ? null : kernelBytes(manifest, wasmBytes, relaxedSimd);
      module = early?.module ?? await WebAssembly.compile(shared ? sharedMemoryVariant(kernels) : interruptibleKernels(kernels));
    } catch (error) {
      throw new Error(`the bundle's ${manifest.wasm.file} does not compile here: ${/** @type {Error} */ (error).message}`);
    }
    const clock = new KernelClock();
    const imports = shared ? { env: { memory } } : { env: { memory }, [DEADLINE_IMPORT[0]]: { [DEADLINE_IMPORT[1]]: clock.deadline } };
    const instance = await WebAssembly.instantiate(module, imports);
    const backend = new WasmBackend(manifest, memory, instance, count);
    backend.kernelTimeoutMs = timeoutMs;
    backend.clock = clock;
    backend.relaxedSimd = relaxedSimd;
    try {
      backend.layOut(shards, sizesAtBounds);
      // the kernels compiled for speed before the first run (warm_up.js): on the page's thread, or by the pool's leader
      const blocks = warmsUp(manifest, warmUp) ? warmUpBlocks(manifest, backend.paramsBase) : [];
      if (shared) {
        backend.pool = await WorkerPool.start(module, memory, count, backend.scratchAddresses, backend.statusAddresses, blocks);
        backend.warmUp = backend.pool.warmUp;
        await backend.prepack();
      } else if (early?.warmUp && blocks.length) {
        backend.warmUp = early.warmUp; // while the weights were fetched (prepareKernels): the compiles are done or under way
      } else {
        backend.warmUp = warmUpKernels((k) => backend.kernelFunctions[k].main, blocks, new Int32Array(memory.buffer),
          (ms) => clock.start(ms));
        if (blocks.length) await afterTierUp();
      }
      if (!shared) await backend.prepack();
      return backend;
    } catch (error) {
      backend.dispose();
      throw error;
    }
  }

  /**
   * @param {any} manifest @param {WebAssembly.Memory} memory @param {WebAssembly.Instance} instance
   * @param {number} threads
   */
  constructor(manifest, memory, instance, threads) {
    /** The manifest with its dtypes as kernels.wasm holds them (wasmManifest): what the driver and every conversion here read. */
    this.manifest = wasmManifest(manifest);
    this.memory = memory;
    /** Threads that run a dispatch's units: the pool's workers, or 1 (the page's thread, where there is no pool). */
    this.threads = threads;
    /** How long one kernel call on the pool may run (KERNEL_TIMEOUT_MS unless the load option says). */
    this.kernelTimeoutMs = KERNEL_TIMEOUT_MS;
    /** Whether the kernels run with relaxed SIMD (else lowered to plain SIMD128 at load: relaxed_simd.js). */
    this.relaxedSimd = false;
    /** The load's calls of every kernel with no units (warm_up.js): kernels warmed and ms taken. */
    this.warmUp = { kernels: 0, ms: 0 };
    /** The arrays a run copies its inputs into, reused by the next run once they are in the memory. */
    this.inputCopies = new InputCopies();
    const exports = /** @type {Record<string, Function>} */ (/** @type {unknown} */ (instance.exports));
    /** Per kernel: its function and its units function. */
    this.kernelFunctions = manifest.kernels.map((/** @type {any} */ _, /** @type {number} */ k) => {
      const main = exports[`k${k}`];
      const units = exports[`k${k}_units`];
      if (typeof main !== "function" || typeof units !== "function") {
        throw new Error(`the bundle's kernels.wasm lacks kernel ${k} (exports k${k}, k${k}_units): the bundle is damaged`);
      }
      // a kernel that can read its second factor prepacked: it takes its call site's region last (0: none)
      const pack = typeof exports[`k${k}_pack`] === "function" ? exports[`k${k}_pack`] : null;
      return { main, units, pack };
    });
    /** @type {Map<number, number>} per call site of `wasm.prepacked`: its region's address (layOut) */
    this.prepackedRegions = new Map();
    /** @type {WorkerPool|null} */
    this.pool = null;
    /** The deadline of the kernel call running on the page's thread (no pool). */
    this.clock = new KernelClock();
    this.top = RESERVED_BYTES; // the end of the last region allocated
    this.paramsBase = 0;
    /** @type {number[]} */
    this.weightAddresses = [];
    /** @type {number[]} one scratch block per thread */
    this.scratchAddresses = [];
    /** @type {number[]} one run status per thread (run_status.js): threads never share one, so no atomics */
    this.statusAddresses = [];
    /** The address the storages are laid out from (after the scratch blocks). */
    this.storagesBase = 0;
    /** @type {number[]} */
    this.storageAddresses = [];
    /** @type {number[]} */
    this.storageSizes = [];
    /** @type {(number[]|null)[]} per call site: its buffers' addresses, forgotten when a storage moves */
    this.siteAddresses = manifest.call_sites.map(() => null);
    /** @type {number[]} per call site: the position of the run status among its buffers (-1: none) */
    this.statusAt = manifest.call_sites.map(() => -1);
    this.cacheOfInput = new Map((manifest.caches ?? []).map((/** @type {any} */ c) => [c.input, c]));
    this.cacheOfOutput = new Map((manifest.caches ?? []).map((/** @type {any} */ c) => [c.output, c]));
    /** @type {Set<number>} the storages of KV caches: placed at load, never moved */
    this.fixed = new Set((manifest.caches ?? []).map((/** @type {any} */ c) => c.storage));
    /** What moved in and out of the memory (`buffersCreated`: regions laid out for storages). */
    this.stats = new TransferStats();
    /** Runs that started writing the memory: a view of a cache is current while it is this run's. */
    this.runNumber = 0;
    /** @type {string|null} why the model cannot run any more (disposed, a worker that never finished) */
    this.unusableReason = null;
  }

  /** The deadline of one kernel call in ms, on the pool and on the page's thread alike. */
  get kernelDeadlineMs() {
    return this.kernelTimeoutMs;
  }

  /** Units that the pool's workers have run since load (0 with one thread). */
  get unitsRunByWorkers() {
    return this.pool ? this.pool.unitsRun() : 0;
  }

  // The memory ------------------------------------------------------------------------------

  /**
   * The regions of the memory: params, weights (copied from the shards), scratch blocks, storages.
   * @param {Uint8Array[]} shards @param {number[]|null} sizesAtBounds
   */
  layOut(shards, sizesAtBounds) {
    this.paramsBase = this.allocate(this.manifest.params_bytes);
    this.weightAddresses = this.manifest.weights.map((/** @type {any} */ weight) => {
      // as the shard holds it (an int64 weight as int64); whole, even a weight WebGPU binds in parts
      const data = shards[weight.shard].subarray(weight.offset, weight.offset + weight.nbytes);
      const address = this.allocate(data.byteLength);
      this.bytes().set(data, address);
      this.stats.add("weightBytesWritten", data.byteLength);
      return address;
    });
    // per call site that reads its weight prepacked: its region, written by kK_pack at load (prepack); the
    // header's second i32 says the region's bytes
    for (const { call_site: callSite, bytes } of this.manifest.wasm?.prepacked ?? []) {
      if (aligned16(this.top) + aligned16(bytes) > PREPACKED_LIMIT_BYTES) continue; // none: its kernel packs per call
      const address = this.allocate(bytes);
      new DataView(this.memory.buffer).setUint32(address + 4, bytes, true);
      this.prepackedRegions.set(callSite, address);
    }
    const scratchBytes = this.manifest.wasm?.scratch_bytes ?? 0;
    this.scratchAddresses = Array.from({ length: this.threads }, () => this.allocate(scratchBytes));
    this.statusAddresses = Array.from({ length: this.threads }, () => this.allocate(STATUS_BYTES));
    for (const index of [...this.fixed].sort((a, b) => a - b)) {
      const size = this.manifest.storages[index].size_at_bounds;
      if (typeof size !== "number") throw new Error(`the bundle's KV cache storage ${index} has no size at the bounds: the bundle is damaged`);
      this.storageSizes[index] = Math.max(aligned16(size), 16);
      this.storageAddresses[index] = this.allocate(this.storageSizes[index]);
      this.stats.add("buffersCreated");
    }
    this.storagesBase = aligned16(this.top);
    this.prepareStorages(sizesAtBounds ?? this.manifest.storages.map((/** @type {any} */ s) => s.size_at_bounds ?? 0), false);
  }

  /**
   * A 16-byte aligned region of `bytes` bytes (at least 16) at the top, the memory grown to
   * keep SLACK_BYTES after it.
   * @param {number} bytes @returns {number} its address
   */
  allocate(bytes) {
    const address = aligned16(this.top);
    const end = address + Math.max(aligned16(bytes), 16);
    const needed = Math.ceil((end + SLACK_BYTES) / PAGE_BYTES);
    if (needed > MAX_PAGES) {
      throw new Error(`the model needs ${end + SLACK_BYTES} bytes of WebAssembly memory, above its 4 GiB (65536 pages)`);
    }
    const pages = this.memory.buffer.byteLength / PAGE_BYTES;
    if (needed > pages) {
      try {
        this.memory.grow(needed - pages);
      } catch (error) {
        throw new Error(`cannot grow the WebAssembly memory to ${needed * PAGE_BYTES} bytes: ${/** @type {Error} */ (error).message}`);
      }
    }
    this.top = end;
    return address;
  }

  /** The memory's bytes (a new view: growing the memory replaces its buffer). @returns {Uint8Array} */
  bytes() {
    return new Uint8Array(this.memory.buffer);
  }

  // The states of a run ---------------------------------------------------------------------

  /**
   * The inputs checked and converted: arrays, and this model's own kept tensors (WasmTensors).
   * @param {Record<string, any>} inputs @param {boolean|string[]} keepOnGpu @returns {WasmRun}
   */
  prepareRun(inputs, keepOnGpu) {
    const kept = keptOutputIndices(this.manifest, keepOnGpu);
    this.checkUsable();
    for (const [name, tensor] of Object.entries(inputs ?? {})) {
      if (!(tensor instanceof GpuTensor)) continue;
      if (!(tensor instanceof WasmTensor)) {
        throw new Error(`input '${name}': GPU tensor '${tensor.name}' lives on a WebGPU device; this model runs on the wasm backend and takes {data, shape} and its own kept tensors (read() gives the data)`);
      }
      if (tensor.disposed) throw new Error(`input '${name}': tensor '${tensor.name}' was disposed and cannot be used any more`);
      if (tensor.backend !== this) throw new Error(`input '${name}': tensor '${tensor.name}' was kept by another wasm model; read() it and pass its data`);
    }
    const { shapes, sequences, deviceInputs } = prepareInputs(this.manifest, inputs, this.inputCopies);
    return { shapes, sequences, inputs: deviceInputs, kept };
  }

  beginRun() {
    this.checkUsable();
    this.stats.startRun();
  }

  checkUsable() {
    if (this.unusableReason) throw new Error(`cannot run: ${this.unusableReason}`);
  }

  /** kernels.wasm has no ragged form. @returns {string} */
  oneByOneReason() {
    return "the wasm backend runs instances one by one";
  }

  /** @returns {never} */
  raggedBatch() {
    throw new Error("the wasm backend runs instances one by one");
  }

  /** Nothing to refuse before the work. */
  checkCommands() {}

  /**
   * Give every storage smaller than `sizes` says a region that fits (at least twice its old
   * one). Between two steps of a run (`keepContents`) each such storage moves to the top with
   * its contents; before a run's first step nothing is kept, so every storage is placed again
   * from the first storage's address (the memory grows to the largest run's layout, and
   * regions are reused).
   * @param {number[]} sizes @param {boolean} keepContents
   */
  prepareStorages(sizes, keepContents) {
    const fits = (/** @type {number} */ size, /** @type {number} */ index) =>
      this.storageAddresses[index] !== undefined && this.storageSizes[index] >= size;
    if (sizes.every(fits)) return;
    const cache = sizes.findIndex((size, index) => this.fixed.has(index) && !fits(size, index));
    if (cache >= 0) throw new Error(`the bundle's host module sized KV cache storage ${cache} above its size at the bounds: the bundle is damaged`);
    const capacity = (/** @type {number} */ size, /** @type {number} */ index) =>
      fits(size, index) ? this.storageSizes[index] : Math.max(aligned16(size), 16, 2 * (this.storageSizes[index] ?? 0));
    if (!keepContents) this.top = this.storagesBase;
    sizes.forEach((size, index) => {
      if ((keepContents && fits(size, index)) || this.fixed.has(index)) return;
      const bytes = capacity(size, index);
      const address = this.allocate(bytes);
      if (address !== this.storageAddresses[index] || bytes !== this.storageSizes[index]) this.stats.add("buffersCreated");
      if (keepContents) {
        const old = this.storageAddresses[index];
        this.bytes().copyWithin(address, old, old + this.storageSizes[index]);
      }
      this.storageAddresses[index] = address;
      this.storageSizes[index] = bytes;
    });
    this.siteAddresses.fill(null);
  }

  /**
   * Copy each input into its storage; a KV cache's past goes to the start of each block's
   * capacity rows, unless it is the current view of that cache (already in place: nothing moves).
   * Kept tensors are resolved first, before anything is written (a view read while its cache holds it).
   * @param {WasmRun} run
   */
  writeInputs({ inputs }) {
    const resolved = this.manifest.inputs.map((/** @type {any} */ spec, /** @type {number} */ k) => {
      const { gpuTensor, shape } = inputs[spec.name];
      if (!gpuTensor) return inputs[spec.name];
      const tensor = /** @type {WasmTensor} */ (gpuTensor);
      this.checkCurrent(tensor, `input '${spec.name}': tensor '${tensor.name}'`);
      if (tensor.cacheView && tensor.cacheView.cache === this.cacheOfInput.get(k)) return { data: null, shape };
      return { data: tensor.deviceData(), shape };
    });
    this.runNumber += 1; // every cache is written from here on: older views are stale
    const memory = this.bytes();
    for (const address of this.statusAddresses) memory.fill(0, address, address + STATUS_BYTES);
    this.manifest.inputs.forEach((/** @type {any} */ spec, /** @type {number} */ k) => {
      const { data, shape } = resolved[k];
      if (!data || data.byteLength === 0) return;
      this.stats.add("inputBytesWritten", data.byteLength);
      const source = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
      const cache = this.cacheOfInput.get(k);
      if (cache) {
        const base = this.storageAddresses[cache.storage];
        const itemSize = data.byteLength / shape.reduce((a, b) => a * b, 1);
        for (const [from, at, size] of cacheBlockCopies(cache, shape, itemSize, null)) memory.set(source.subarray(from, from + size), base + at);
        return;
      }
      if (this.storageSizes[spec.storage] < data.byteLength) {
        throw new Error(
          `the bundle's host module gave input '${spec.name}' a storage of ${this.storageSizes[spec.storage]} bytes for ${data.byteLength} bytes of data: the bundle is damaged`,
        );
      }
      memory.set(source, this.storageAddresses[spec.storage]);
    });
    this.inputCopies.release(inputs); // in the memory now: the next run copies its inputs into these arrays
  }

  /** The stage's params block into the params region. @param {Uint8Array} params */
  beginStep(params) {
    this.bytes().set(params, this.paramsBase);
    this.stats.add("paramsBytesWritten", params.byteLength);
  }

  /**
   * Run the stage's dispatches in order, each timed by `timer` when one is given.
   * @param {import("./host.js").DispatchCommand[]} dispatches @param {Uint8Array} params
   * @param {WallClockTimer|null} timer
   */
  encodeDispatches(dispatches, params, timer) {
    if (this.pool) return this.dispatchOnWorkers(dispatches, params, timer);
    for (const { callSite } of dispatches) {
      const started = timer ? performance.now() : 0;
      this.dispatch(callSite);
      if (timer) timer.record(callSite, performance.now() - started, params, this.manifest.call_sites[callSite]);
    }
  }

  /** The i32 a read record names, from its storage's region. @param {import("./host.js").ReadCommand} read @returns {number} */
  readValue(read) {
    this.checkStatus(); // an error before the read may have made its value meaningless
    this.stats.add("bytesRead", 4);
    return new DataView(this.memory.buffer).getInt32(this.storageAddresses[read.storage] + read.byteOffset, true);
  }

  /** A stage that resumes without a read: nothing to submit. */
  submit() {}

  /**
   * The run's end: each output copied out of its storage now (the next run reuses the memory),
   * or kept (a view of a cache, else a copy of its device bytes).
   * @param {WasmRun} run @param {import("./host_session.js").HostStep} step
   * @returns {Record<string, any>}
   */
  submitOutputs(run, step) {
    this.checkStatus();
    return this.copyOutputs(step.outputShapes, step.elementShapes, run.kept);
  }

  /** The run's error, when a kernel reported one into a thread's status (the first thread's first). */
  checkStatus() {
    for (const address of this.statusAddresses) checkRunStatus(this.manifest, this.memory.buffer.slice(address, address + STATUS_BYTES));
  }

  /** The outputs submitOutputs copied. @param {Record<string, any>} outputs */
  readOutputs(outputs) {
    return outputs;
  }

  /** Nothing outlives a run's stages here. */
  releaseRun() {}

  /** @returns {WallClockTimer} */
  createTimer() {
    return new WallClockTimer();
  }

  /**
   * Run one dispatch record of call site `callSite` on the page's thread (no pool): its kernel
   * over all its units, under the deadline. A trap throws naming the call site; so does a call
   * past the deadline, after which the model cannot run any more.
   * @param {number} callSite
   */
  dispatch(callSite) {
    const site = this.manifest.call_sites[callSite];
    const { main, units: unitsOf } = this.kernelFunctions[site.kernel];
    const params = this.paramsBase + site.params_offset;
    const addresses = this.siteAddresses[callSite] ?? this.addressesOf(callSite);
    this.clock.start(this.kernelTimeoutMs);
    try {
      const units = unitsOf(params);
      if (units > 0) main(params, 0, units, this.scratchAddresses[0], ...addresses);
    } catch (error) {
      if (error instanceof KernelDeadlineError) this.unusableReason ??= error.message;
      throw this.kernelError(callSite, /** @type {Error} */ (error));
    }
  }

  /**
   * Each prepacked region's panels written at load (docs/bundle-format.md, "Prepacked weights"):
   * its kernel's kK_pack on the region's params block, put in the call site's own params slot
   * (zeroed again after), with the weights' addresses and 0 for every other buffer; on
   * the pool's leader where there is a pool, else on the page's thread, each call under the
   * kernel deadline. A pack that declines (0) leaves its kernel packing per call.
   */
  async prepack() {
    /** @type {{kernel: number, params: number, addresses: number[], statusAt: number, callSite: number, paramsBytes: number}[]} */
    const calls = [];
    for (const region of this.manifest.wasm?.prepacked ?? []) {
      const address = this.prepackedRegions.get(region.call_site);
      if (address === undefined) continue; // past PREPACKED_LIMIT_BYTES: none
      const site = this.manifest.call_sites[region.call_site];
      if (!this.kernelFunctions[site.kernel].pack) {
        throw new Error(`the bundle's wasm.prepacked names call site ${region.call_site}, whose kernel has no kK_pack: the bundle is damaged`);
      }
      const params = this.paramsBase + site.params_offset;
      new Int32Array(this.memory.buffer, params, region.params.length).set(region.params);
      const addresses = site.buffers.map((/** @type {any} */ b) => ("weight" in b || "weight_part" in b ? this.weightAddress(b) : 0));
      // a negative kernel: the pool's leader calls its kK_pack instead of its units (wasm_worker.js)
      calls.push({ kernel: -1 - site.kernel, params, addresses: [...addresses, address], statusAt: -1, callSite: region.call_site,
        paramsBytes: 4 * region.params.length });
    }
    if (!calls.length) return;
    if (this.pool) {
      try {
        await this.pool.runDispatches(calls, this.kernelTimeoutMs);
      } catch (error) {
        if (this.pool.broken) this.unusableReason ??= this.pool.broken;
        if (!(error instanceof DispatchFailure)) throw error;
        throw this.kernelError(calls[error.index].callSite, error);
      }
    } else {
      for (const { kernel, params, addresses, callSite } of calls) {
        this.clock.start(this.kernelTimeoutMs);
        try {
          /** @type {Function} */ (this.kernelFunctions[-1 - kernel].pack)(params, 0, 0, this.scratchAddresses[0], ...addresses);
        } catch (error) {
          throw this.kernelError(callSite, /** @type {Error} */ (error));
        }
      }
    }
    for (const { params, paramsBytes } of calls) new Uint8Array(this.memory.buffer, params, paramsBytes).fill(0);
  }

  /**
   * Run a stage's dispatches on the pool, in order, each timed by `timer` when one is given:
   * the leader worker runs them (WorkerPool.runDispatches) while the page's thread awaits the
   * stage, every kernel call under the deadline.
   * @param {import("./host.js").DispatchCommand[]} dispatches @param {Uint8Array} params
   * @param {WallClockTimer|null} timer
   */
  async dispatchOnWorkers(dispatches, params, timer) {
    const pool = /** @type {WorkerPool} */ (this.pool);
    const sites = dispatches.map(({ callSite }) => this.manifest.call_sites[callSite]);
    const calls = dispatches.map(({ callSite }, i) => ({
      kernel: sites[i].kernel,
      params: this.paramsBase + sites[i].params_offset,
      addresses: this.siteAddresses[callSite] ?? this.addressesOf(callSite),
      statusAt: this.statusAt[callSite],
    }));
    let times;
    try {
      times = await pool.runDispatches(calls, this.kernelTimeoutMs);
    } catch (error) {
      if (pool.broken) this.unusableReason ??= pool.broken;
      if (!(error instanceof DispatchFailure)) throw error;
      throw this.kernelError(dispatches[error.index].callSite, error);
    }
    if (timer) dispatches.forEach(({ callSite }, i) => timer.record(callSite, times[i], params, sites[i]));
  }

  /** A kernel's error, naming it and its call site. @param {number} callSite @param {Error} error @returns {Error} */
  kernelError(callSite, error) {
    const site = this.manifest.call_sites[callSite];
    const kernel = this.manifest.kernels[site.kernel].name;
    return new Error(`kernel ${kernel} failed at call site ${callSite} (${String(site.binding).slice(0, 300)}): ${error.message}`);
  }

  /**
   * The address a call site passes for a `{"weight": j}` or `{"weight_part": [j, part]}` binding:
   * the whole weight's as part 0, 0 for its other parts.
   * @param {any} binding @returns {number}
   */
  weightAddress(binding) {
    if ("weight" in binding) return this.weightAddresses[binding.weight];
    return binding.weight_part[1] === 0 ? this.weightAddresses[binding.weight_part[0]] : 0;
  }

  /**
   * The byte address of each buffer of a call site, in binding order: a weight in parts is
   * passed whole as part 0, and 0 for its other parts (the contract); then, for a kernel that
   * exports kK_pack, the call site's prepacked region (0: none).
   * @param {number} callSite @returns {number[]}
   */
  addressesOf(callSite) {
    const buffers = this.manifest.call_sites[callSite].buffers;
    const addresses = buffers.map((/** @type {any} */ b) =>
      "storage" in b ? this.storageAddresses[b.storage]
        : "status" in b ? this.statusAddresses[0] // the page's thread's; each worker gets its own (WorkerPool.run)
        : this.weightAddress(b));
    if (this.kernelFunctions[this.manifest.call_sites[callSite].kernel].pack) addresses.push(this.prepackedRegions.get(callSite) ?? 0);
    this.siteAddresses[callSite] = addresses;
    this.statusAt[callSite] = buffers.findIndex((/** @type {any} */ b) => "status" in b);
    return addresses;
  }

  /**
   * Each output copied out of its storage (a KV cache's output: its rows of each block); the
   * `kept` ones as WasmTensors (a cache's: a view, nothing copied).
   * @param {number[][]} outputShapes @param {({shapes: number[][]|null}|null)[]} elementShapes
   * @param {Set<number>} [kept]
   * @returns {Record<string, any>}
   */
  copyOutputs(outputShapes, elementShapes, kept = new Set()) {
    const memory = this.bytes();
    /** @type {Record<string, any>} */
    const result = {};
    this.manifest.outputs.forEach((/** @type {any} */ spec, /** @type {number} */ k) => {
      const shape = outputShapes[k];
      const info = dtypeInfo(this.manifest, spec);
      const bytes = shape.reduce((a, b) => a * b, 1) * info.device_bytes;
      const base = this.storageAddresses[spec.storage];
      const cache = this.cacheOfOutput.get(k);
      if (kept.has(k) && cache) {
        result[spec.name] = new WasmTensor(this, spec, [...shape], bytes, null, { cache, run: this.runNumber });
        return;
      }
      let copy = memory.slice(base, base + bytes);
      if (cache) {
        copy = new Uint8Array(bytes);
        for (const [dense, at, size] of cacheBlockCopies(cache, shape, info.device_bytes, null)) copy.set(memory.subarray(base + at, base + at + size), dense);
      }
      this.stats.add("bytesRead", bytes);
      if (kept.has(k)) {
        const stored = new (/** @type {any} */ (TYPED_ARRAY_OF_DTYPE)[info.device_dtype])(copy.buffer);
        result[spec.name] = new WasmTensor(this, spec, [...shape], bytes, stored, null);
        return;
      }
      const data = fromDeviceData(spec, info, copy.buffer);
      const sequence = elementShapes?.[k];
      result[spec.name] = !sequence ? { data, shape } : sequence.shapes ? splitElements(data, sequence.shapes) : null;
    });
    return result;
  }

  /**
   * Refuse a view of a KV cache that a later run has written.
   * @param {WasmTensor} tensor @param {string} what
   */
  checkCurrent(tensor, what) {
    if (tensor.cacheView && tensor.cacheView.run !== this.runNumber) {
      throw new Error(`${what} is a view of a KV cache that a later run has written: a view is valid until the next run (read it first to keep its values)`);
    }
  }

  /**
   * A cache view's values (its rows of each block), flat in the dtype the memory holds (`wasm_dtype`).
   * @param {WasmTensor} tensor @returns {Int32Array|Uint32Array|Float32Array|BigInt64Array}
   */
  readView(tensor) {
    this.checkCurrent(tensor, `tensor '${tensor.name}'`);
    const cache = /** @type {{cache: any}} */ (tensor.cacheView).cache;
    const info = dtypeInfo(this.manifest, tensor.spec);
    const memory = this.bytes();
    const base = this.storageAddresses[cache.storage];
    const dense = new Uint8Array(tensor.byteLength);
    for (const [at, from, size] of cacheBlockCopies(cache, tensor.shape, info.device_bytes, null)) dense.set(memory.subarray(base + from, base + from + size), at);
    this.stats.add("bytesRead", tensor.byteLength);
    return new (/** @type {any} */ (TYPED_ARRAY_OF_DTYPE)[info.device_dtype])(dense.buffer);
  }

  /** Stop the workers; the memory goes with the last reference. */
  dispose() {
    this.unusableReason ??= "the model was disposed";
    this.pool?.stop(this.unusableReason);
  }
}

/** A kernel call on the page's thread that ran past its deadline. */
export class KernelDeadlineError extends Error {}

/** The deadline of the kernel call running on the page's thread (interruptible_kernels.js DeadlineClock). */
export class KernelClock extends DeadlineClock {
  constructor() {
    super((timeoutMs) => new KernelDeadlineError(`a kernel call ran for more than ${timeoutMs / 1000} s and was stopped ` +
      "(the bundle's kernels.wasm loops, or is damaged; a model this slow on purpose: raise the kernelTimeoutMs load " +
      "option); load the model again"));
  }
}
