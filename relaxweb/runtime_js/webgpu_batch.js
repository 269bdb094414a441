// The ragged batch backend of WebGPU (driver.js's RaggedBatchBackend): each state of a batch's
// rounds on the device. The twin of relaxweb/runtime/webgpu_batch.py; batch.js holds the
// arithmetic (layouts, merges, tables, grids) both runtimes share.
//
// Every storage holds each instance's slice one after another (SliceLayout), in packed buffers
// kept between batches. A round is one command encoder in one error scope, submitted by
// readValues: on the first round the packed storages and each instance's inputs, on later ones
// the copies of the slices the last growth moved; then the round's ragged dispatches in one
// compute pass (one batch table per dispatch, all in one uniform buffer), the output copies of
// the instances that finish (each into a readback buffer of its own) and the copies of the
// values the others read (into one staging buffer, mapped once). So beginRound, encodeRound
// and finishInstance only note what the round does, and readValues does it.

import { SliceLayout, batchTable, checkTotals } from "./batch.js";
import { dtypeInfo } from "./host.js";
import { STATUS_BYTES, checkRunStatus } from "./run_status.js";
import { prepareInputs } from "./tensors.js";
import { READBACK_USAGE, STORAGE_USAGE, USAGE, gpuBufferSize } from "./webgpu_buffers.js";
import { storageSizeLimit } from "./webgpu_device.js";

/**
 * @typedef {import("./host_session.js").HostStep} HostStep
 * @typedef {import("./webgpu_backend.js").Readback} Readback
 * @typedef {{shapes: number[][], sequences: Record<number, number[][]|null>, inputs: Record<string, import("./tensors.js").DeviceInput>}} BatchRun
 */

export class WebGpuRaggedBatch {
  /** @param {import("./webgpu_backend.js").WebGpuBackend} backend the single runs' backend, whose buffers and pipelines it shares */
  constructor(backend) {
    this.backend = backend;
    this.manifest = backend.manifest;
    this.gpu = backend.gpu;
    this.device = backend.device;
    this.buffers = backend.buffers;
    /** @type {GPUBuffer[]} one per storage: every instance's slice, packed (kept between batches) */
    this.storageBuffers = [];
    /** @type {GPUComputePipeline[]} the kernels' ragged forms (writeInputs) */
    this.pipelines = [];
    // The batch in progress.
    this.layout = SliceLayout.of([]);
    /** @type {SliceLayout|null} the layout before the last growth */
    this.previousLayout = null;
    /** @type {number[]} storages whose layout changed since the last round */
    this.changed = [];
    /** @type {[number, string]} the device's largest storage buffer and the limit that says so */
    this.limit = [0, ""];
    /** @type {BatchRun[]|null} the instances whose inputs the first round writes */
    this.pendingInputs = null;
    /**
     * What the round in progress submits: its ragged dispatches and the instances that finish.
     * @type {{planned: {callSite: number, table: Uint8Array, offset: number, grid: [number, number, number]}[], tableBytes: number,
     *   finishing: [number, Readback][]}}
     */
    this.round = { planned: [], tableBytes: 0, finishing: [] };
    /** @type {Readback[]} the readbacks made by this batch (destroyed on an error) */
    this.readbacks = [];
    /** @type {GPUBuffer[]} buffers the last submit used, destroyed once it has run */
    this.retired = [];
  }

  /** @param {Record<string, any>} inputs @returns {BatchRun} */
  prepareInstance(inputs) {
    const { shapes, sequences, deviceInputs } = prepareInputs(this.manifest, inputs);
    return { shapes, sequences, inputs: deviceInputs };
  }

  /**
   * The packed layout of every instance's first step, its totals within the device's limit.
   * @param {number[][]} sizes @param {Record<string, number>[]} varValues
   */
  layOut(sizes, varValues) {
    this.layout = SliceLayout.of(sizes);
    this.previousLayout = null;
    this.changed = [];
    this.readbacks = [];
    this.retired = [];
    this.limit = storageSizeLimit(this.device.limits);
    checkTotals(this.manifest, this.layout, sizes, varValues, ...this.limit);
  }

  /**
   * The ragged pipelines (compiled on the first batch); each instance's inputs are written
   * into its slices by the first round's submit.
   * @param {BatchRun[]} runs
   */
  async writeInputs(runs) {
    this.pipelines = await this.backend.pipelines.ragged();
    this.pendingInputs = runs;
  }

  beginRound() {
    this.round = { planned: [], tableBytes: 0, finishing: [] };
  }

  /**
   * The round's ragged dispatches, each with its batch table (every instance's params slot,
   * the bases of its slices, its first workgroup); a chunk whose instances all have empty
   * grids is skipped.
   * @param {import("./batch.js").RaggedDispatch[]} plan @param {Map<number, HostStep>} live
   * @returns {number} the dispatches encoded
   */
  encodeRound(plan, live) {
    const sites = this.manifest.call_sites;
    const { planned } = this.round;
    let offset = this.round.tableBytes;
    for (const { callSite, members, workgroups, grid } of plan) {
      if (workgroups === 0) continue; // every instance's grid is empty
      const site = sites[callSite];
      let first = 0;
      /** @type {[Uint8Array, number[], number][]} */
      const entries = members.map(([k, dispatch]) => {
        const bases = site.buffers.map((/** @type {any} */ b) => ("storage" in b ? this.layout.offsets[b.storage][k] : 0));
        const entry = /** @type {[Uint8Array, number[], number]} */ ([/** @type {HostStep} */ (live.get(k)).params, bases, first]);
        first += dispatch.workgroups[0] * dispatch.workgroups[1] * dispatch.workgroups[2];
        return entry;
      });
      const table = batchTable(site, entries);
      planned.push({ callSite, table, offset, grid });
      offset += Math.ceil(table.byteLength / 256) * 256;
    }
    this.round.tableBytes = offset;
    return planned.length;
  }

  /**
   * An instance whose list ends with its outputs: a readback of its own, filled by the
   * round's submit (the copies of its outputs out of its slices).
   * @param {number} k @param {HostStep} step @returns {Readback}
   */
  finishInstance(k, step) {
    const { manifest } = this;
    let offset = 0;
    const outputs = manifest.outputs.map((/** @type {any} */ spec, /** @type {number} */ o) => {
      const shape = step.outputShapes[o];
      const info = dtypeInfo(manifest, spec);
      const bytes = shape.reduce((a, b) => a * b, 1) * info.device_bytes;
      const output = { name: spec.name, dtype: spec.dtype, info, shape, offset, bytes, storage: spec.storage, kept: null };
      offset += Math.ceil(bytes / 4) * 4;
      return output;
    });
    const statusOffset = this.buffers.statusBuffer ? offset : -1; // the run status (shared by the batch) after them
    if (statusOffset >= 0) offset += STATUS_BYTES;
    /** @type {Readback} */
    const readback = { buffer: null, size: Math.max(offset, 4), outputs, statusOffset };
    this.round.finishing.push([k, readback]);
    this.readbacks.push(readback);
    return readback;
  }

  /**
   * The round's submit: its copies, dispatches, output copies and the reads' copies into one
   * staging buffer, mapped once.
   * @param {Map<number, import("./host.js").ReadCommand>} reads
   * @returns {Promise<Map<number, number>>} each reading instance's value
   */
  async readValues(reads) {
    const readList = [...reads];
    const layout = this.layout;
    const staging = await this.gpu.captureGpuErrors("run", () => {
      const encoder = this.device.createCommandEncoder();
      if (this.pendingInputs) {
        this.ensureStorages(layout.totals);
        this.buffers.clearStatus(); // one run status for the batch: its first error fails the batch
        this.uploadInputs(this.pendingInputs, layout);
        this.pendingInputs = null;
      } else if (this.changed.length > 0) {
        this.growStorages(encoder, /** @type {SliceLayout} */ (this.previousLayout), layout, this.changed);
      }
      this.changed = [];
      this.encodePlanned(encoder);
      for (const [k, readback] of this.round.finishing) this.encodeOutputCopies(encoder, k, readback, layout);
      const buffer = readList.length > 0 ? this.encodeReads(encoder, readList, layout) : null;
      this.device.queue.submit([encoder.finish()]);
      return buffer;
    });
    /** @type {Map<number, number>} */
    const values = new Map();
    if (staging) {
      try {
        await this.gpu.orDeviceLoss(staging.mapAsync(/* GPUMapMode.READ */ 1));
        const mapped = staging.getMappedRange().slice(0);
        // an error before the reads may have made their values meaningless
        if (this.buffers.statusBuffer) checkRunStatus(this.manifest, mapped.slice(4 * readList.length));
        const read = new Int32Array(mapped, 0, readList.length);
        readList.forEach(([k], i) => values.set(k, read[i]));
        this.buffers.stats.add("bytesRead", 4 * readList.length);
      } finally {
        staging.destroy();
      }
    }
    for (const buffer of this.retired.splice(0)) buffer.destroy();
    return values;
  }

  /**
   * The layout after instances' storages grew to `sizes` (each slice keeps at least its
   * capacity), its totals checked; the storages that changed are copied by the next round.
   * @param {number[][]} sizes @param {Record<string, number>[]} varValues
   */
  growSlices(sizes, varValues) {
    this.previousLayout = this.layout;
    [this.layout, this.changed] = this.layout.grown(sizes);
    if (this.changed.length > 0) checkTotals(this.manifest, this.layout, sizes, varValues, ...this.limit);
  }

  /**
   * Every instance's outputs: each readback mapped in turn (those not read yet destroyed on an error).
   * @param {Readback[]} readbacks @returns {Promise<Record<string, any>[]>}
   */
  async readBatchOutputs(readbacks) {
    const outputs = [];
    try {
      for (const readback of readbacks) outputs.push(await this.backend.readOutputs(readback));
    } finally {
      for (const readback of readbacks.slice(outputs.length + 1)) readback.buffer?.destroy();
    }
    return outputs;
  }

  /** After an error: destroy what the rounds left (buffers of the last submit, readbacks). */
  releaseBatch() {
    for (const buffer of this.retired.splice(0)) buffer.destroy();
    for (const readback of this.readbacks.splice(0)) readback.buffer?.destroy();
    this.pendingInputs = null;
  }

  /** Destroy the packed storages. */
  dispose() {
    for (const buffer of this.storageBuffers) buffer?.destroy();
  }

  // The round's GPU work ------------------------------------------------------------------------

  /**
   * The packed storage buffers of batches: kept between batches, replaced (contents dropped:
   * a batch starts with nothing on the GPU) where one is smaller than `totals`.
   * @param {number[]} totals
   */
  ensureStorages(totals) {
    totals.forEach((total, s) => {
      const needed = gpuBufferSize(total);
      const buffer = this.storageBuffers[s];
      if (buffer && buffer.size >= needed) return;
      buffer?.destroy();
      this.storageBuffers[s] = this.createStorage(s, needed);
    });
  }

  /** @param {number} s @param {number} size @returns {GPUBuffer} */
  createStorage(s, size) {
    return this.buffers.createBuffer({ label: `batch storage ${s} (${this.manifest.storages[s].role})`, size, usage: STORAGE_USAGE });
  }

  /**
   * Storages whose layout changed between two rounds: a new buffer each, every instance's
   * slice copied from where it was (its old capacity) to where it is now.
   * @param {GPUCommandEncoder} encoder @param {SliceLayout} before @param {SliceLayout} after @param {number[]} changed
   */
  growStorages(encoder, before, after, changed) {
    const totals = after.totals;
    for (const s of changed) {
      const old = this.storageBuffers[s];
      const grown = this.createStorage(s, gpuBufferSize(totals[s]));
      before.capacities[s].forEach((capacity, i) => {
        const size = Math.min(capacity, old.size - before.offsets[s][i]);
        if (size > 0) encoder.copyBufferToBuffer(old, before.offsets[s][i], grown, after.offsets[s][i], size);
      });
      this.retired.push(old);
      this.storageBuffers[s] = grown;
    }
  }

  /**
   * Upload each instance's inputs into its slices.
   * @param {BatchRun[]} runs @param {SliceLayout} layout
   */
  uploadInputs(runs, layout) {
    runs.forEach(({ inputs }, k) => {
      for (const spec of this.manifest.inputs) {
        const { data } = inputs[spec.name];
        if (!data || data.byteLength === 0) continue;
        if (data.byteLength > layout.capacities[spec.storage][k]) {
          throw new Error(
            `instance ${k} of the batch: the bundle's host module gave input '${spec.name}' a storage of ${layout.capacities[spec.storage][k]} bytes for ${data.byteLength} bytes of data: the bundle is damaged`,
          );
        }
        this.buffers.writeBuffer(this.storageBuffers[spec.storage], data, "inputBytesWritten", layout.offsets[spec.storage][k]);
      }
    });
  }

  /**
   * Encode the round's ragged dispatches in one compute pass, their batch tables in one uniform
   * buffer for the round.
   * @param {GPUCommandEncoder} encoder
   */
  encodePlanned(encoder) {
    const { planned, tableBytes } = this.round;
    if (planned.length === 0) return;
    const sites = this.manifest.call_sites;
    const tables = this.buffers.createBuffer({ label: "batch tables", size: tableBytes, usage: USAGE.UNIFORM | USAGE.COPY_DST });
    this.retired.push(tables);
    const all = new Uint8Array(tableBytes);
    for (const { table, offset } of planned) all.set(table, offset);
    this.buffers.writeBuffer(tables, all, "paramsBytesWritten");
    const pass = encoder.beginComputePass();
    for (const { callSite, table, offset, grid } of planned) {
      const site = sites[callSite];
      const pipeline = this.pipelines[site.kernel];
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, this.device.createBindGroup({
        layout: pipeline.getBindGroupLayout(0),
        entries: [
          { binding: 0, resource: { buffer: tables, offset, size: table.byteLength } },
          ...this.buffers.boundBuffers(site, this.storageBuffers).map((buffer, b) => ({ binding: b + 1, resource: { buffer } })),
        ],
      }));
      pass.dispatchWorkgroups(...grid);
    }
    pass.end();
  }

  /**
   * Encode the copy of each reading instance's i32 (at its read's offset in its own slice) into
   * one staging buffer, 4 bytes per instance in `reads` order.
   * @param {GPUCommandEncoder} encoder @param {[number, import("./host.js").ReadCommand][]} reads
   * @param {SliceLayout} layout @returns {GPUBuffer}
   */
  encodeReads(encoder, reads, layout) {
    const status = this.buffers.statusBuffer ? STATUS_BYTES : 0; // the run status after the values
    const staging = this.buffers.createBuffer({ label: "batch read values", size: 4 * reads.length + status, usage: READBACK_USAGE });
    this.buffers.copyStatus(encoder, staging, status ? 4 * reads.length : -1);
    reads.forEach(([k, { storage, byteOffset }], i) => {
      if (byteOffset + 4 > layout.capacities[storage][k]) {
        throw new Error(`instance ${k} of the batch: host.wasm asks to read bytes ${byteOffset}..${byteOffset + 4} of storage ${storage}, whose slice has ${layout.capacities[storage][k]} bytes`);
      }
      encoder.copyBufferToBuffer(this.storageBuffers[storage], layout.offsets[storage][k] + byteOffset, staging, 4 * i, 4);
    });
    return staging;
  }

  /**
   * Encode the copy of instance `k`'s outputs (from its slices) into its readback buffer
   * (an idle one, or new).
   * @param {GPUCommandEncoder} encoder @param {number} k @param {Readback} readback @param {SliceLayout} layout
   */
  encodeOutputCopies(encoder, k, readback, layout) {
    const buffer = this.buffers.readback(readback.size);
    readback.buffer = buffer;
    this.buffers.copyStatus(encoder, buffer, readback.statusOffset ?? -1);
    for (const output of readback.outputs) {
      const padded = Math.ceil(output.bytes / 4) * 4;
      if (padded === 0) continue;
      if (padded > layout.capacities[output.storage][k]) {
        throw new Error(`instance ${k} of the batch: output '${output.name}' has ${output.bytes} bytes, above its slice of ${layout.capacities[output.storage][k]}: the bundle is damaged`);
      }
      encoder.copyBufferToBuffer(this.storageBuffers[output.storage], layout.offsets[output.storage][k], buffer, output.offset, padded);
    }
  }
}
