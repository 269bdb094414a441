// The WebGPU device of a model: the limits and features a bundle needs of it, the adapter and
// device requests of load(), the sizes of weights the bundle binds in parts, and the device's
// errors and loss as a model sees them (WebGpuDevice). The twin of relaxweb/runtime/webgpu_device.py.
// Pure functions but the requests: Node imports this file (through host.js's re-exports).

export const NO_ADAPTER = "WebGPU is available but no GPU adapter was found";

/**
 * What keeps a device (or adapter) from loading a bundle: one line per required feature it
 * lacks and per required limit it does not meet ("max..." limits at least, "min..." at
 * most). Each line names the feature or the limit, the value needed and the one offered.
 * @param {{limits: any, features?: {has(name: string): boolean}}} gpu a GPUAdapter or GPUDevice
 * @param {Record<string, number>} requiredLimits
 * @param {string[]} requiredFeatures
 * @param {string} owner "GPU adapter" or "device", for the message
 * @param {any} [manifest] the bundle's manifest: a buffer size limit set by a storage names it (storageNote)
 * @param {number[]|null} [sizesAtBounds] each storage's size at the bounds in effect (null: the manifest's)
 * @returns {string[]} empty when it can load the bundle
 */
export function deviceShortfalls(gpu, requiredLimits, requiredFeatures, owner, manifest = null, sizesAtBounds = null) {
  const problems = [];
  for (const feature of requiredFeatures) {
    if (!gpu.features?.has(feature)) {
      problems.push(`this model needs the WebGPU feature ${feature}, which the ${owner} does not offer`);
    }
  }
  for (const [name, needed] of Object.entries(requiredLimits)) {
    const available = gpu.limits[name];
    if (typeof available !== "number") {
      problems.push(`this model needs the WebGPU limit ${name} = ${needed}, but the ${owner} does not report that limit`);
      continue;
    }
    const enough = name.startsWith("min") ? available <= needed : available >= needed;
    if (!enough) {
      problems.push(`this model needs the WebGPU limit ${name} = ${needed}, but the ${owner} supports ${available}${storageNote(manifest, sizesAtBounds, name, needed)}`);
    }
  }
  return problems;
}

/**
 * Which storage makes the bundle need `limit` = `needed`, for a message (": storage 3 (output
 * 'logits') needs ... bytes at the bounds ..."), or "" when no storage at the bounds sets it (another
 * limit, a weight, no manifest). The twin of relaxweb/runtime/webgpu_device.py's storage_note.
 * @param {any} manifest @param {number[]|null} sizesAtBounds @param {string} limit @param {number} needed
 * @returns {string}
 */
export function storageNote(manifest, sizesAtBounds, limit, needed) {
  if (!manifest || !["maxStorageBufferBindingSize", "maxBufferSize"].includes(limit)) return "";
  const sizes = sizesAtBounds ?? manifest.storages.map((/** @type {any} */ s) => s.size_at_bounds);
  const index = sizes.findIndex((size) => size === needed);
  if (index < 0) return "";
  const storage = manifest.storages[index];
  return `: storage ${index} (${storage.holds ?? storage.role}) needs ${needed} bytes at the bounds (its size: ${storage.size} bytes; build with lower --bound values, or run on wasm)`;
}

/**
 * The bytes a weight takes on the GPU (elements x `device_bytes`): its shard holds the wasm form
 * (`nbytes`, elements x `wasm_bytes`; 8 bytes an int64 element, 4 on the GPU). The GPU's buffer
 * sizes, parts and limit checks count these. The twin of runtime/tensors.py's webgpu_weight_nbytes.
 * @param {any} manifest @param {any} weight @returns {number}
 */
export function webgpuWeightNbytes(manifest, weight) {
  const info = manifest.dtypes[weight.dtype];
  return weight.nbytes / info.wasm_bytes * info.device_bytes;
}

/**
 * The limits a device must meet to load a bundle: the manifest's `required_limits`, with the
 * buffer size limits raised to the largest weight and to the largest storage at the bounds
 * in effect (`sizesAtBounds`, null when some var has no bound) when those are larger, and
 * maxBufferSize at least maxStorageBufferBindingSize.
 * @param {any} manifest
 * @param {number[]|null} sizesAtBounds
 * @returns {Record<string, number>}
 */
export function loadTimeLimits(manifest, sizesAtBounds) {
  /** @type {Record<string, number>} */
  const limits = { ...(manifest.required_limits ?? {}) };
  // A buffer bound whole is at least as large as its binding; a weight in parts needs its smallest part only.
  const largest = [...manifest.weights.map((/** @type {any} */ w) => smallestPartBytes(webgpuWeightNbytes(manifest, w), w.parts ?? 1)),
    ...(sizesAtBounds ?? []),
    limits.maxStorageBufferBindingSize ?? 0].reduce((a, b) => Math.max(a, b), 0);
  if (largest > 0) {
    for (const name of ["maxStorageBufferBindingSize", "maxBufferSize"]) limits[name] = Math.max(limits[name] ?? 0, largest);
  }
  return limits;
}

/** Every part of a weight in parts but the last holds a multiple of this many bytes (docs/bundle-format.md, "Weights in parts"). */
export const PART_ALIGNMENT = 256;

/**
 * The smallest binding size (a multiple of 256) at which `parts` parts hold `nbytes` bytes.
 * @param {number} nbytes @param {number} parts
 * @returns {number}
 */
export function smallestPartBytes(nbytes, parts) {
  if (parts === 1) return nbytes;
  return Math.ceil(Math.ceil(nbytes / parts) / PART_ALIGNMENT) * PART_ALIGNMENT;
}

/**
 * The byte sizes of the buffers holding a weight of `nbytes` bound in up to `parts` parts on
 * a device binding at most `largest` bytes: the whole weight when it fits, else parts of
 * `largest` rounded down to 256 bytes and the rest; null when `parts` are too few.
 * @param {number} nbytes @param {number} parts @param {number} largest
 * @returns {number[]|null}
 */
export function weightPartSizes(nbytes, parts, largest) {
  if (nbytes <= largest) return [nbytes];
  const part = Math.floor(largest / PART_ALIGNMENT) * PART_ALIGNMENT;
  if (part === 0 || Math.ceil(nbytes / part) > parts) return null;
  const sizes = [];
  for (let start = 0; start < nbytes; start += part) sizes.push(Math.min(part, nbytes - start));
  return sizes;
}

/**
 * Why a run cannot go on because a storage needs more bytes than the device can bind (a
 * message naming the input or output it holds and the limit), or null when every size fits.
 * @param {any} manifest
 * @param {number[]} sizes bytes needed per storage
 * @param {any} limits the device's GPUSupportedLimits
 * @returns {string|null}
 */
export function storageSizeProblem(manifest, sizes, limits) {
  const [largest, limitName] = storageSizeLimit(limits);
  const index = sizes.findIndex((size) => size > largest);
  if (index < 0) return null;
  const input = manifest.inputs.find((/** @type {any} */ i) => i.storage === index);
  const output = manifest.outputs.find((/** @type {any} */ o) => o.storage === index);
  const holds = input ? `input '${input.name}' (storage ${index})`
    : output ? `output '${output.name}' (storage ${index})`
    : `storage ${index} (${manifest.storages[index].role})`;
  return `these inputs are too large for this device: ${holds} needs ${sizes[index]} bytes, above the device's WebGPU limit ${limitName} = ${largest}`;
}

/**
 * The largest buffer the device binds as a storage, and the WebGPU limit that says so: the
 * smaller of maxBufferSize and maxStorageBufferBindingSize, each within `caps` (the `limits`
 * option of load(), for weights in parts) when given.
 * @param {any} limits the device's GPUSupportedLimits
 * @param {{maxStorageBufferBindingSize?: number, maxBufferSize?: number}} [caps]
 * @returns {[number, string]}
 */
export function storageSizeLimit(limits, caps = {}) {
  const binding = Math.min(limits.maxStorageBufferBindingSize, caps.maxStorageBufferBindingSize ?? Infinity);
  const buffer = Math.min(limits.maxBufferSize, caps.maxBufferSize ?? Infinity);
  return buffer < binding ? [buffer, "maxBufferSize"] : [binding, "maxStorageBufferBindingSize"];
}

/**
 * Check the `limits` option of load(): lower values of maxStorageBufferBindingSize and maxBufferSize.
 * @param {any} limits
 */
export function checkLimitCaps(limits) {
  if (limits === null || typeof limits !== "object") throw new Error("limits must be an object");
  for (const [name, value] of Object.entries(limits)) {
    if (!["maxStorageBufferBindingSize", "maxBufferSize"].includes(name)) {
      throw new Error(`limits may lower maxStorageBufferBindingSize and maxBufferSize, not ${String(name).slice(0, 60)}`);
    }
    if (!Number.isInteger(value) || value < 256) throw new Error(`limits: ${name} must be an integer of at least 256`);
  }
}

/**
 * The page's WebGPU adapter (null when there is none: requestDevice says so).
 * @returns {Promise<GPUAdapter|null>}
 */
export async function requestAdapter() {
  if (!globalThis.navigator?.gpu) throw new Error("WebGPU is not available here (navigator.gpu is missing)");
  return navigator.gpu.requestAdapter();
}

/**
 * Request a device from `adapter` with the limits and features the bundle needs. When some
 * storage has no bound, also ask for the adapter's largest buffers, since storages may grow.
 * @param {GPUAdapter|null} adapter
 * @param {Record<string, number>} requiredLimits
 * @param {string[]} requiredFeatures
 * @param {boolean} unbounded
 * @param {boolean} profile also request "timestamp-query" when the adapter offers it
 * @param {any} [manifest] @param {number[]|null} [sizesAtBounds] see deviceShortfalls
 * @returns {Promise<GPUDevice>}
 */
export async function requestDevice(adapter, requiredLimits, requiredFeatures, unbounded, profile, manifest = null, sizesAtBounds = null) {
  if (!adapter) throw new Error(NO_ADAPTER);
  checkDevice(adapter, requiredLimits, requiredFeatures, "GPU adapter", manifest, sizesAtBounds);
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
 * does not meet (see deviceShortfalls).
 * @param {GPUAdapter|GPUDevice} gpu
 * @param {Record<string, number>} requiredLimits
 * @param {string[]} requiredFeatures
 * @param {string} owner "GPU adapter" or "device", for the message
 * @param {any} [manifest] @param {number[]|null} [sizesAtBounds] see deviceShortfalls
 */
export function checkDevice(gpu, requiredLimits, requiredFeatures, owner, manifest = null, sizesAtBounds = null) {
  const problems = deviceShortfalls(gpu, requiredLimits, requiredFeatures, owner, manifest, sizesAtBounds);
  if (problems.length > 0) throw new Error(problems.join("; "));
}

/**
 * A model's device, with what every part of the model needs around it: why the model cannot
 * run any more (`unusableReason`: disposed, device lost), GPU errors caught per call
 * (captureGpuErrors) and promises that reject when the device is lost (orDeviceLoss).
 */
export class WebGpuDevice {
  /** @param {GPUDevice} device */
  constructor(device) {
    this.device = device;
    /** @type {string|null} why the model cannot run any more (disposed, device lost) */
    this.unusableReason = null;
    /** Resolves with an Error when the device is lost. */
    this.lost = device.lost.then((info) => {
      // Chromium loses every device (reason "unknown") when its GPU process goes away: a
      // crash, or its watchdog stopping a call that ran too long (a shader compiling for minutes)
      const gone = info.reason === "unknown" ? " (the browser's GPU process was lost; reload the page to try again)" : "";
      this.unusableReason ??= `the WebGPU device was lost (${info.reason}): ${info.message}${gone}`;
      return new Error(this.unusableReason);
    });
  }

  /**
   * `promise` (the creation of kernel `kernelName`'s pipeline), rejecting as soon as the
   * device is lost, and its own failure once the device is lost (Chromium rejects the
   * pipelines still compiling with "A valid external Instance reference no longer exists"),
   * with an error that names the kernel and says the device was lost.
   * @template T
   * @param {string} kernelName
   * @param {Promise<T>} promise
   * @returns {Promise<T>}
   */
  compiling(kernelName, promise) {
    const lostWhileCompiling = (/** @type {Error} */ error) =>
      new Error(`kernel ${kernelName}: cannot create its pipeline: ${error.message}`);
    const lost = this.lost.then((error) => Promise.reject(lostWhileCompiling(error)));
    const failed = promise.catch(async (/** @type {any} */ error) => {
      await Promise.race([this.lost, new Promise((resolve) => setTimeout(resolve, 0))]); // a loss the same moment
      if (this.unusableReason) throw lostWhileCompiling(new Error(this.unusableReason));
      throw new Error(`kernel ${kernelName}: cannot create its pipeline: ${error?.message ?? error}`);
    });
    return Promise.race([failed, lost]);
  }

  /** Refuse to start a run when the model cannot run any more. */
  checkUsable() {
    if (this.unusableReason) throw new Error(`cannot run: ${this.unusableReason}`);
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
