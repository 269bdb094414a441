// The GPU buffers of a model on WebGPU: weights (whole, or in parts where the device binds less
// than the weight), the params block, the storages, the buffer a value read back mid-run lands
// in, idle readback buffers and those of disposed GpuTensors, and the bind group of each call
// site; every creation and upload counted in the model's `stats`. The twin of
// relaxweb/runtime/webgpu_buffers.py (its SessionBuffers: the JS session is the Model).
//
// Sizes follow docs/bundle-format.md ("One run"): a buffer holds at least 16 bytes (a kernel
// may bind it as array<vec4<f32>>, even when it is empty), a multiple of 4.

import { BufferPool } from "./gpu_tensor.js";
import { STATUS_BYTES } from "./run_status.js";
import { storageSizeLimit, storageSizeProblem, weightPartSizes } from "./webgpu_device.js";
import { webgpuWeightBytes } from "./tensors.js";

/** GPU buffer usages (the GPUBufferUsage flags, spelled out so that Node can import this file). */
export const USAGE = { MAP_READ: 0x1, COPY_SRC: 0x4, COPY_DST: 0x8, UNIFORM: 0x40, STORAGE: 0x80, QUERY_RESOLVE: 0x200 };
/** A storage: bound by kernels, written by uploads, copied when it grows and to read outputs. */
export const STORAGE_USAGE = USAGE.STORAGE | USAGE.COPY_DST | USAGE.COPY_SRC;
/** A buffer mapped to read what the GPU copied into it. */
export const READBACK_USAGE = USAGE.MAP_READ | USAGE.COPY_DST;

/** The GPU buffer size for `bytes` bytes: at least 16, a multiple of 4. @param {number} bytes */
export const gpuBufferSize = (bytes) => Math.ceil(Math.max(bytes, 16) / 4) * 4;

/**
 * A weight bound in parts: the buffer bound for each part (a placeholder for the parts a
 * device binding it whole does not use) and the byte sizes of the real ones.
 * @typedef {{buffers: GPUBuffer[], sizes: number[]}} WeightParts
 */

/** The buffers of one model on its device. */
export class ModelBuffers {
  /**
   * @param {GPUDevice} device @param {any} manifest
   * @param {import("./gpu_tensor.js").TransferStats} stats where its GPU calls are counted
   */
  constructor(device, manifest, stats) {
    this.device = device;
    this.manifest = manifest;
    this.stats = stats;
    /** @type {(GPUBuffer|null)[]} one per weight bound whole (null for a weight in parts) */
    this.weightBuffers = [];
    /** @type {Map<number, WeightParts>} the buffers bound for each part of a weight in parts, by weight */
    this.weightParts = new Map();
    /** @type {GPUBuffer[]} one per storage, allocated at load, grown when a run needs more */
    this.storageBuffers = [];
    /** @type {(GPUBindGroup|null)[]} one per call site, rebuilt when a storage it uses is replaced */
    this.bindGroups = manifest.call_sites.map(() => null);
    /** Buffers of disposed GpuTensors, for the next kept outputs; idle readback buffers. */
    this.gpuTensorPool = new BufferPool();
    this.readbackPool = new BufferPool();
    this.paramsBuffer = this.createBuffer({
      label: "params",
      size: Math.max(manifest.params_bytes, 256),
      usage: USAGE.UNIFORM | USAGE.COPY_DST,
    });
    /** @type {GPUBuffer|null} where a value read back mid-run lands (4 bytes, and the run status after them; made on the first read) */
    this.readValueBuffer = null;
    /** @type {GPUBuffer|null} the run status (run_status.js), where the manifest has run_errors */
    this.statusBuffer = manifest.run_errors?.length
      ? this.createBuffer({ label: "run status", size: STATUS_BYTES, usage: STORAGE_USAGE }) : null;
    /** A run that read nothing back (every output kept) left the run status uncopied: the next read carries it. */
    this.statusUnread = false;
  }

  /**
   * Zero the run status before a run's first submit (a writeBuffer, ordered before it; not
   * counted), unless an earlier run left it unread: its error, if any, stays for the next read.
   */
  clearStatus() {
    if (this.statusBuffer && !this.statusUnread) this.device.queue.writeBuffer(this.statusBuffer, 0, new Uint8Array(STATUS_BYTES));
  }

  /**
   * Encode the copy of the run status to `offset` of a readback buffer (nothing without one);
   * from this copy on the status is read (the reader checks those bytes before its values).
   * @param {GPUCommandEncoder} encoder @param {GPUBuffer} readback @param {number} offset
   */
  copyStatus(encoder, readback, offset) {
    if (!this.statusBuffer) return;
    encoder.copyBufferToBuffer(this.statusBuffer, 0, readback, offset, STATUS_BYTES);
    this.statusUnread = false;
  }

  /**
   * Encode the copy of the run status to `offset` of `readback` when a run left it unread (a
   * GpuTensor's read, the sampled token's); whether it did.
   * @param {GPUCommandEncoder} encoder @param {GPUBuffer} readback @param {number} offset @returns {boolean}
   */
  copyUnreadStatus(encoder, readback, offset) {
    if (!this.statusUnread) return false;
    this.copyStatus(encoder, readback, offset);
    return true;
  }

  /** A run that reads nothing back copies no run status: the next read carries it. */
  leaveStatusUnread() {
    if (this.statusBuffer) this.statusUnread = true;
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

  // Weights ---------------------------------------------------------------------------------

  /**
   * One read-only GPU buffer per weight bound whole, filled from its shard, and the buffers of
   * each part of each weight in parts (docs/bundle-format.md, "Weights in parts"): the whole
   * weight in one when the device binds it (the other parts a 16-byte placeholder), else parts
   * as large as the device binds, within `caps` (the `limits` option).
   * @param {Uint8Array[]} shards @param {Record<string, number>} caps
   */
  loadWeights(shards, caps) {
    // the shards hold the wasm form: an int64 weight is narrowed to int32 here
    const gpuBytes = (/** @type {any} */ weight) => webgpuWeightBytes(weight,
      shards[weight.shard].subarray(weight.offset, weight.offset + weight.nbytes), this.manifest.dtypes[weight.dtype]);
    this.weightBuffers = this.manifest.weights.map((/** @type {any} */ weight) => {
      if ((weight.parts ?? 1) > 1) return null;
      return this.filledWeightBuffer(weight.name, gpuBytes(weight));
    });
    const [largest, limitName] = storageSizeLimit(this.device.limits, caps);
    this.manifest.weights.forEach((/** @type {any} */ weight, /** @type {number} */ index) => {
      if ((weight.parts ?? 1) === 1) return;
      const data = gpuBytes(weight);
      const sizes = weightPartSizes(data.byteLength, weight.parts, largest);
      if (sizes === null) {
        throw new Error(`weight '${weight.name}' has ${data.byteLength} bytes, above the device's WebGPU limit ` +
          `${limitName} = ${largest}, and the bundle binds it in at most ${weight.parts} parts`);
      }
      const buffers = [];
      let start = 0;
      for (const [part, size] of sizes.entries()) {
        buffers.push(this.filledWeightBuffer(`${weight.name} part ${part}`, data.subarray(start, start + size)));
        start += size;
      }
      // the unused parts: one placeholder of its own per weight, so that destroying the parts frees each once
      const placeholder = buffers.length < weight.parts ? this.filledWeightBuffer(`${weight.name} unused part`, new Uint8Array(16)) : null;
      while (buffers.length < weight.parts) buffers.push(/** @type {GPUBuffer} */ (placeholder));
      this.weightParts.set(index, { buffers, sizes });
    });
  }

  /**
   * A read-only GPU buffer holding `bytes`, counted in `stats`.
   * @param {string} label @param {Uint8Array} bytes @returns {GPUBuffer}
   */
  filledWeightBuffer(label, bytes) {
    const buffer = this.createBuffer({ label, size: gpuBufferSize(bytes.byteLength), usage: USAGE.STORAGE, mappedAtCreation: true });
    new Uint8Array(buffer.getMappedRange()).set(bytes);
    this.stats.add("weightBytesWritten", bytes.byteLength);
    buffer.unmap();
    return buffer;
  }

  /**
   * For each weight the bundle binds in parts, by name, the byte sizes of the buffers it was
   * loaded into (one: the device binds it whole).
   * @returns {Record<string, number[]>}
   */
  get weightPartSizes() {
    return Object.fromEntries([...this.weightParts].map(([index, parts]) => [this.manifest.weights[index].name, parts.sizes]));
  }

  // Storages ------------------------------------------------------------------------------

  /**
   * Allocate every storage whose size at the bounds is known (all of them when every var has a bound).
   * @param {number[]|null} sizesAtBounds the host module's sizes at the bounds, null when some var has none
   */
  allocateStoragesAtBounds(sizesAtBounds) {
    this.growStorages(sizesAtBounds ?? this.manifest.storages.map((/** @type {any} */ s) => s.size_at_bounds ?? 0));
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
      const needed = gpuBufferSize(size);
      const buffer = this.storageBuffers[index];
      if (buffer !== undefined && buffer.size >= needed) return;
      const grown = this.createBuffer({ label: `storage ${index} (${this.manifest.storages[index].role})`, size: needed, usage: STORAGE_USAGE });
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

  // Bindings ------------------------------------------------------------------------------

  /**
   * The buffers a call site binds after its params, in binding order: its storages (from
   * `storages`: the model's, or a batch's packed ones), its weights, a weight part's buffer.
   * @param {any} site a manifest call site @param {GPUBuffer[]} storages @returns {GPUBuffer[]}
   */
  boundBuffers(site, storages) {
    return site.buffers.map((/** @type {any} */ b) =>
      "storage" in b ? storages[b.storage]
        : "status" in b ? this.boundStatus()
        : "weight_part" in b ? /** @type {WeightParts} */ (this.weightParts.get(b.weight_part[0])).buffers[b.weight_part[1]]
        : /** @type {GPUBuffer} */ (this.weightBuffers[b.weight]));
  }

  /**
   * The bind group of a call site, created on first use.
   * @param {number} callSite @param {GPUComputePipeline} pipeline its kernel's
   * @returns {GPUBindGroup}
   */
  bindGroup(callSite, pipeline) {
    const existing = this.bindGroups[callSite];
    if (existing) return existing;
    const site = this.manifest.call_sites[callSite];
    const group = this.device.createBindGroup({
      layout: pipeline.getBindGroupLayout(0),
      entries: [
        { binding: 0, resource: { buffer: this.paramsBuffer, offset: site.params_offset, size: site.params_size } },
        ...this.boundBuffers(site, this.storageBuffers).map((buffer, b) => ({ binding: b + 1, resource: { buffer } })),
      ],
    });
    this.bindGroups[callSite] = group;
    return group;
  }

  /** The run status a call site binds ({"status": 0}). @returns {GPUBuffer} */
  boundStatus() {
    if (!this.statusBuffer) throw new Error("a call site binds the run status, but the manifest has no run_errors: the bundle is damaged");
    return this.statusBuffer;
  }

  /** The buffer a value read back mid-run lands in, the run status after it (made on the first read). @returns {GPUBuffer} */
  readValueStaging() {
    this.readValueBuffer ??= this.createBuffer({ label: "read value", size: 4 + (this.statusBuffer ? STATUS_BYTES : 0), usage: READBACK_USAGE });
    return this.readValueBuffer;
  }

  /** A readback buffer of at least `size` bytes: an idle one, or new. @param {number} size @returns {GPUBuffer} */
  readback(size) {
    return this.readbackPool.take(size) ?? this.createBuffer({ size, usage: READBACK_USAGE });
  }

  /** Destroy every buffer (and those of GpuTensors disposed later). */
  dispose() {
    const parts = [...this.weightParts.values()].flatMap((p) => p.buffers);
    for (const buffer of [...this.weightBuffers, ...parts, ...this.storageBuffers, this.paramsBuffer, this.readValueBuffer, this.statusBuffer]) buffer?.destroy();
    this.gpuTensorPool.close();
    this.readbackPool.close();
  }
}
