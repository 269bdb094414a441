// The WebGPU backend of the host-program driver (driver.js): each state of a run on a device.
// The twin of relaxweb/runtime/webgpu_backend.py.
//
// A stage is submitted in one or more parts, each one command encoder in one error scope (a
// GPU error names the run): the stage's first part grows the storages (copying the contents
// of those grown between two stages), writes the inputs (on the run's first stage: uploads,
// and the GPU-to-GPU copies of GpuTensor inputs) and the params block, then the dispatches in
// one compute pass; a read ends the stage's last part with the copy of its value, a resume
// with nothing, the run's last stage with the output copies (and the kept outputs). So the
// states before a stage's submit only note what it must do (prepareStorages, writeInputs,
// beginStep), and the submit does it. Right after load, pipelines may still be compiling: the
// dispatches whose pipelines are ready are submitted while the next one's pipeline is awaited.
// GPU tensors (keepOnGpu, KV cache views: gpu_tensor.js) are this backend's too.

import { GpuTensor, cacheBlockCopies } from "./gpu_tensor.js";
import { dtypeInfo, fromDeviceData } from "./host.js";
import { STATUS_BYTES, checkRunStatus } from "./run_status.js";
import { oneByOneReason } from "./batch.js";
import { keptOutputIndices, prepareInputs, splitElements } from "./tensors.js";
import { READBACK_USAGE, STORAGE_USAGE, gpuBufferSize } from "./webgpu_buffers.js";
import { WebGpuRaggedBatch } from "./webgpu_batch.js";
import { SubmitTimer, TimestampTimer } from "./webgpu_timers.js";

/**
 * @typedef {import("./host.js").InputTensor} Tensor
 * @typedef {import("./host.js").DispatchCommand} DispatchCommand
 * @typedef {import("./tensors.js").DeviceInput} DeviceInput
 * @typedef {TimestampTimer|SubmitTimer} WebGpuTimer
 */

/**
 * A run's inputs on this backend: PreparedRun (driver.js) with the device inputs by name and
 * the indices of the outputs to keep on the GPU.
 * @typedef {{shapes: number[][], sequences: Record<number, number[][]|null>, inputs: Record<string, DeviceInput>,
 *   kept: Set<number>}} WebGpuRun
 */

/**
 * A run's outputs, copied into one mappable buffer (`size` bytes of it; null when every
 * output is kept on the GPU) by its last submit; kept outputs are their GpuTensors; `retired`:
 * old storage buffers the last submit still copied from, destroyed once the outputs are read.
 * @typedef {{buffer: GPUBuffer|null, size: number, outputs: {name: string, dtype: string, info: import("./host.js").DtypeInfo,
 *   shape: number[], offset: number, bytes: number, storage: number, kept: GpuTensor|null}[],
 *   elementShapes?: ({shapes: number[][]|null}|null)[], retired?: GPUBuffer[], statusOffset?: number}} Readback
 */

/** The run state of one Model on WebGPU: its buffers, pipelines, and the stage in progress. */
export class WebGpuBackend {
  /**
   * @param {any} model the Model its GpuTensors belong to
   * @param {import("./webgpu_device.js").WebGpuDevice} gpu
   * @param {import("./webgpu_buffers.js").ModelBuffers} buffers
   * @param {import("./webgpu_kernels.js").KernelPipelines} pipelines
   * @param {number[]|null} sizesAtBounds each storage's size at the bounds: a kept output's buffer size (null: unbounded)
   */
  constructor(model, gpu, buffers, pipelines, sizesAtBounds) {
    this.model = model;
    this.gpu = gpu;
    this.device = gpu.device;
    this.manifest = buffers.manifest;
    this.buffers = buffers;
    this.stats = buffers.stats;
    this.pipelines = pipelines;
    this.storageSizesAtBounds = sizesAtBounds;
    /** KV caches (manifest "caches") by input index and by output index. @type {Map<number, any>} */
    this.cacheOfInput = new Map((this.manifest.caches ?? []).map((/** @type {any} */ c) => [c.input, c]));
    /** @type {Map<number, any>} */
    this.cacheOfOutput = new Map((this.manifest.caches ?? []).map((/** @type {any} */ c) => [c.output, c]));
    /** Runs that started writing the GPU: a view of a cache is current while it is this run's. */
    this.runNumber = 0;
    /** @type {WebGpuRaggedBatch|null} made on the first ragged batch */
    this.batch = null;
    // The run in progress (in its turn).
    /**
     * What the stage's first submitted part does before its dispatches, besides writing the
     * params block: the storages grown, and on the run's first stage its inputs written (null
     * once done).
     * @type {{sizes: number[], keepContents: boolean, inputs: Record<string, DeviceInput>|null}|null}
     */
    this.pending = null;
    /** @type {Uint8Array} the stage's params block */
    this.params = new Uint8Array(0);
    /** @type {DispatchCommand[]} the stage's dispatches not submitted yet */
    this.rest = [];
    /** @type {WebGpuTimer|null} */
    this.timer = null;
    /** @type {GPUBuffer[]} old buffers of storages grown during the run, destroyed once their copies have run */
    this.retired = [];
  }

  // Before the run --------------------------------------------------------------------------

  /**
   * @param {Record<string, Tensor|GpuTensor>} inputs @param {boolean|string[]} keepOnGpu
   * @returns {WebGpuRun}
   */
  prepareRun(inputs, keepOnGpu) {
    this.gpu.checkUsable();
    const kept = this.keptOutputIndices(keepOnGpu);
    this.checkGpuTensorInputs(inputs);
    const { shapes, sequences, deviceInputs } = prepareInputs(this.manifest, inputs);
    return { shapes, sequences, inputs: deviceInputs, kept };
  }

  beginRun() {
    this.gpu.checkUsable();
    this.stats.startRun();
  }

  /** @param {Record<string, any>[]} instances @returns {string} */
  oneByOneReason(instances) {
    return oneByOneReason(this.manifest, instances);
  }

  /** @returns {WebGpuRaggedBatch} */
  raggedBatch() {
    this.batch ??= new WebGpuRaggedBatch(this);
    return this.batch;
  }

  /** Nothing to refuse before the work: a grid the device cannot dispatch is its validation error. */
  checkCommands() {}

  /** @param {number[]} sizes @param {boolean} keepContents */
  prepareStorages(sizes, keepContents) {
    this.pending = { sizes, keepContents, inputs: null };
  }

  /** @param {WebGpuRun} run */
  writeInputs(run) {
    this.checkCacheViews(run.inputs); // the current views of caches are their pasts; older ones are refused
    this.runNumber += 1; // every cache is written from here on
    /** @type {NonNullable<WebGpuBackend["pending"]>} */ (this.pending).inputs = run.inputs;
  }

  // Stages ----------------------------------------------------------------------------------

  /** @param {Uint8Array} params */
  beginStep(params) {
    this.params = params;
  }

  /**
   * Encode the stage's dispatches: the part whose pipelines are ready is submitted now when a
   * later dispatch's pipeline must be awaited; the rest goes with the stage's end.
   * @param {DispatchCommand[]} dispatches @param {Uint8Array} _params @param {WebGpuTimer|null} timer
   * @returns {Promise<void>|undefined}
   */
  encodeDispatches(dispatches, _params, timer) {
    this.timer = timer;
    this.rest = dispatches;
    if (this.pipelines.firstWithoutPipeline(dispatches, 0) === dispatches.length) return undefined;
    return (async () => {
      let from = 0;
      for (let waiting = this.pipelines.firstWithoutPipeline(dispatches, 0); waiting < dispatches.length;
        waiting = this.pipelines.firstWithoutPipeline(dispatches, waiting)) {
        if (waiting > from) await this.submitPart(dispatches.slice(from, waiting), null);
        from = waiting;
        await this.pipelines.waitFor(dispatches[waiting]);
      }
      this.rest = dispatches.slice(from);
    })();
  }

  /** @param {import("./host.js").ReadCommand} read @returns {Promise<number>} */
  async readValue(read) {
    await this.submitPart(this.rest, (encoder) => this.encodeRead(encoder, read));
    const buffer = /** @type {GPUBuffer} */ (this.buffers.readValueBuffer);
    let value = 0;
    await this.gpu.orDeviceLoss(buffer.mapAsync(/* GPUMapMode.READ */ 1));
    try {
      const mapped = buffer.getMappedRange();
      // an error before the read may have made its value meaningless
      if (this.buffers.statusBuffer) checkRunStatus(this.manifest, mapped.slice(4, 4 + STATUS_BYTES));
      value = new DataView(mapped).getInt32(0, true);
      this.stats.add("bytesRead", 4);
    } finally {
      buffer.unmap();
    }
    for (const old of this.retired.splice(0)) old.destroy();
    return value;
  }

  /** End a stage that resumes (a loop's iteration); its old buffers go when the run's outputs are read. */
  async submit() {
    await this.submitPart(this.rest, null);
  }

  /**
   * Submit `dispatches` (the stage's first part also does what `pending` says and writes the
   * params block), ended by `ending` (the read's copy, the output copies) when given.
   * @template T
   * @param {DispatchCommand[]} dispatches @param {((encoder: GPUCommandEncoder) => T)|null} ending
   * @returns {Promise<T|null>}
   */
  submitPart(dispatches, ending) {
    return this.gpu.captureGpuErrors("run", () => {
      const encoder = this.device.createCommandEncoder();
      const pending = this.pending;
      if (pending) {
        this.pending = null;
        // Before the first step nothing of this run is on the GPU: no contents to keep.
        this.buffers.growStorages(pending.sizes, pending.keepContents ? { encoder, retired: this.retired } : undefined);
        if (pending.inputs) {
          this.buffers.clearStatus();
          this.uploadInputs(pending.inputs);
          this.encodeGpuTensorCopies(encoder, pending.inputs);
        }
        if (this.params.byteLength > 0) this.buffers.writeBuffer(this.buffers.paramsBuffer, this.params, "paramsBytesWritten");
      }
      // A timer encodes the dispatches its own way: it may hand on a fresh encoder for the
      // rest of the stage, and work (timed submits) to wait for before submitting it.
      const timer = this.timer;
      if (!timer) this.encodeDispatchPass(encoder, dispatches);
      const timed = timer ? timer.encode(encoder, dispatches, this.params) : { encoder, wait: null };
      const readback = ending ? ending(timed.encoder) : null;
      const commandBuffer = timed.encoder.finish();
      if (!timed.wait) {
        this.device.queue.submit([commandBuffer]);
        return readback;
      }
      return timed.wait().then(() => {
        this.device.queue.submit([commandBuffer]);
        return readback;
      });
    });
  }

  /**
   * Encode dispatches in one compute pass.
   * @param {GPUCommandEncoder} encoder @param {DispatchCommand[]} dispatches
   */
  encodeDispatchPass(encoder, dispatches) {
    const pass = encoder.beginComputePass();
    for (const dispatch of dispatches) this.encodeDispatch(pass, dispatch);
    pass.end();
  }

  /**
   * Encode one dispatch into a compute pass.
   * @param {GPUComputePassEncoder} pass @param {DispatchCommand} command
   */
  encodeDispatch(pass, command) {
    const pipeline = this.pipelines.ofCallSite(command.callSite);
    pass.setPipeline(pipeline);
    pass.setBindGroup(0, this.buffers.bindGroup(command.callSite, pipeline));
    pass.dispatchWorkgroups(...command.workgroups);
  }

  /**
   * Encode the copy of the i32 a read record names into the read-value buffer.
   * @param {GPUCommandEncoder} encoder @param {import("./host.js").ReadCommand} read
   * @returns {null}
   */
  encodeRead(encoder, { storage, byteOffset }) {
    const source = this.buffers.storageBuffers[storage];
    if (byteOffset + 4 > source.size) {
      throw new Error(`host.wasm asks to read bytes ${byteOffset}..${byteOffset + 4} of storage ${storage}, which has ${source.size} bytes`);
    }
    encoder.copyBufferToBuffer(source, byteOffset, this.buffers.readValueStaging(), 0, 4);
    this.buffers.copyStatus(encoder, this.buffers.readValueStaging(), 4);
    return null;
  }

  // The outputs -------------------------------------------------------------------------------

  /**
   * The last stage's end: the output copies (and kept outputs) and the run's last submit.
   * @param {WebGpuRun} run @param {import("./host_session.js").HostStep} step
   * @returns {Promise<Readback>}
   */
  async submitOutputs(run, step) {
    const readback = /** @type {Readback} */ (await this.submitPart(this.rest, (encoder) => this.encodeOutputCopies(encoder, step.outputShapes, run.kept)));
    return { ...readback, elementShapes: step.elementShapes, retired: this.retired.splice(0) };
  }

  /** Destroy what the run kept past its submits (on an error: its old storage buffers). */
  releaseRun() {
    for (const old of this.retired.splice(0)) old.destroy();
    this.pending = null;
    this.rest = [];
    this.timer = null;
  }

  /** A timer for a profiled run, once every pipeline is ready (the timed run waits for none). @returns {Promise<WebGpuTimer>} */
  async createTimer() {
    await this.gpu.orDeviceLoss(this.pipelines.ready);
    return this.device.features.has("timestamp-query") ? new TimestampTimer(this) : new SubmitTimer(this);
  }

  /**
   * Encode the copy of each output (as many bytes as its shape says) into a readback buffer
   * (from the pool of idle ones, or new), and of each kept output into its GpuTensor's buffer.
   * @param {GPUCommandEncoder} encoder @param {number[][]} outputShapes @param {Set<number>} kept the outputs to keep on the GPU
   * @returns {Readback}
   */
  encodeOutputCopies(encoder, outputShapes, kept) {
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
    if (outputs.every((output) => output.kept)) { // nothing read back: no wait for the run status either
      this.buffers.leaveStatusUnread();
      return { buffer: null, size: 0, outputs };
    }
    const statusOffset = this.buffers.statusBuffer ? offset : -1; // the run status after the outputs
    if (statusOffset >= 0) offset += STATUS_BYTES;
    const size = Math.max(offset, 4);
    const buffer = this.buffers.readback(size);
    this.buffers.copyStatus(encoder, buffer, statusOffset);
    const storages = this.buffers.storageBuffers;
    for (const [k, output] of outputs.entries()) {
      const cache = this.cacheOfOutput.get(k);
      if (output.bytes > 0 && !output.kept && cache) { // its rows of each block
        for (const [dense, at, bytes] of cacheBlockCopies(cache, output.shape, output.info.device_bytes, null)) {
          encoder.copyBufferToBuffer(storages[output.storage], at, buffer, output.offset + dense, bytes);
        }
      } else if (output.bytes > 0 && !output.kept) {
        encoder.copyBufferToBuffer(storages[output.storage], 0, buffer, output.offset, Math.ceil(output.bytes / 4) * 4);
      }
    }
    return { buffer, size, outputs, statusOffset };
  }

  /**
   * Map the readback buffer and copy each output out of it (kept outputs are their GpuTensors);
   * the buffer goes back to the pool of idle readback buffers once read, the run's old storage
   * buffers are destroyed.
   * @param {Readback} readback
   * @returns {Promise<Record<string, Tensor|GpuTensor|null|Tensor[]>>}
   */
  async readOutputs({ buffer, size, outputs, elementShapes, retired = [], statusOffset = -1 }) {
    try {
      if (!buffer) return Object.fromEntries(outputs.map((output) => [output.name, output.kept]));
      let reusable = false;
      try {
        await this.gpu.orDeviceLoss(buffer.mapAsync(/* GPUMapMode.READ */ 1, 0, size));
        const mapped = buffer.getMappedRange(0, size);
        if (statusOffset >= 0) { // the run's error, when a kernel reported one
          try {
            checkRunStatus(this.manifest, mapped.slice(statusOffset, statusOffset + STATUS_BYTES));
          } catch (error) {
            buffer.unmap();
            reusable = true;
            throw error;
          }
        }
        this.stats.add("bytesRead", statusOffset >= 0 ? statusOffset : size);
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
        if (reusable) this.buffers.readbackPool.give(buffer);
        else buffer.destroy();
      }
    } finally {
      for (const old of retired) old.destroy();
    }
  }

  // Inputs ----------------------------------------------------------------------------------

  /**
   * Upload each input to its storage (offset 0; a KV cache's past: each block at the start of
   * its capacity rows).
   * @param {Record<string, DeviceInput>} inputs
   */
  uploadInputs(inputs) {
    this.manifest.inputs.forEach((/** @type {any} */ spec, /** @type {number} */ k) => {
      const { data, shape } = inputs[spec.name];
      const cache = this.cacheOfInput.get(k);
      if (data && data.byteLength > 0 && cache) {
        const itemSize = data.byteLength / shape.reduce((a, b) => a * b, 1);
        for (const [from, at, size] of cacheBlockCopies(cache, shape, itemSize, null)) {
          this.buffers.writeBuffer(this.buffers.storageBuffers[cache.storage], new Uint8Array(data.buffer, data.byteOffset + from, size),
            "inputBytesWritten", at);
        }
      } else if (data && data.byteLength > 0) { // a GpuTensor has none: encodeGpuTensorCopies
        const buffer = this.buffers.storageBuffers[spec.storage];
        if (!buffer || buffer.size < data.byteLength) {
          throw new Error(
            `the bundle's host module gave input '${spec.name}' a storage of ${buffer?.size ?? 0} bytes for ${data.byteLength} bytes of data: the bundle is damaged`,
          );
        }
        this.buffers.writeBuffer(buffer, data, "inputBytesWritten");
      }
    });
  }

  // GPU tensors (run(inputs, {keepOnGpu})) ----------------------------------------------

  /**
   * The indices of the outputs `keepOnGpu` names (true: every output but sequences).
   * @param {boolean|string[]|undefined} keepOnGpu
   * @returns {Set<number>}
   */
  keptOutputIndices(keepOnGpu) {
    return keptOutputIndices(this.manifest, keepOnGpu);
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
    const storages = this.buffers.storageBuffers;
    this.manifest.inputs.forEach((/** @type {any} */ spec, /** @type {number} */ k) => {
      const tensor = inputs[spec.name].gpuTensor;
      if (!tensor || tensor.byteLength === 0) return;
      const cache = this.cacheOfInput.get(k);
      if (cache) { // nothing for the current view of this cache (it is there); else a copy per block
        if (tensor.cacheView?.cache === cache) return;
        const itemSize = tensor.byteLength / tensor.shape.reduce((a, b) => a * b, 1);
        for (const [from, at, size] of cacheBlockCopies(cache, tensor.shape, itemSize, tensor.cacheView?.cache ?? null)) {
          encoder.copyBufferToBuffer(tensor.buffer(), from, storages[cache.storage], at, size);
        }
        return;
      }
      const bytes = Math.ceil(tensor.byteLength / 4) * 4;
      const storage = storages[spec.storage];
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
      if (tensor.model !== this.model) {
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
    const storages = this.buffers.storageBuffers;
    const cache = this.cacheOfOutput.get(this.manifest.outputs.indexOf(spec));
    if (cache) { // a view of the cache's storage: no buffer, no copy
      return new GpuTensor(this.model, spec.name, spec.dtype, [...shape], storages[cache.storage], bytes, { cache, run: this.runNumber });
    }
    const atBounds = this.storageSizesAtBounds?.[spec.storage] ?? 0;
    const size = gpuBufferSize(Math.max(bytes, atBounds));
    const buffer = this.buffers.gpuTensorPool.take(size)
      ?? this.buffers.createBuffer({ label: `kept output ${spec.name}`, size, usage: STORAGE_USAGE });
    if (bytes > 0) encoder.copyBufferToBuffer(storages[spec.storage], 0, buffer, 0, Math.ceil(bytes / 4) * 4);
    return new GpuTensor(this.model, spec.name, spec.dtype, [...shape], buffer, bytes);
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
    const status = this.buffers.statusUnread ? STATUS_BYTES : 0; // the run status a kept run left unread, after the values
    const staging = this.buffers.createBuffer({ label: `read ${tensor.name}`, size: size + status, usage: READBACK_USAGE });
    let carriesStatus = false;
    try {
      await this.gpu.captureGpuErrors("read", () => {
        const encoder = this.device.createCommandEncoder();
        if (!view) encoder.copyBufferToBuffer(source, 0, staging, 0, size);
        const itemSize = tensor.byteLength / tensor.shape.reduce((a, b) => a * b, 1);
        for (const [dense, at, bytes] of view ? cacheBlockCopies(view.cache, tensor.shape, itemSize, null) : []) {
          encoder.copyBufferToBuffer(source, at, staging, dense, bytes);
        }
        carriesStatus = status > 0 && this.buffers.copyUnreadStatus(encoder, staging, size);
        this.device.queue.submit([encoder.finish()]);
      });
      await this.gpu.orDeviceLoss(staging.mapAsync(/* GPUMapMode.READ */ 1));
      const mapped = staging.getMappedRange();
      // a kept run's error surfaces here, before its values are used
      if (carriesStatus) checkRunStatus(this.manifest, mapped.slice(size, size + STATUS_BYTES));
      const bytes = mapped.slice(0, tensor.byteLength);
      this.stats.add("bytesRead", size);
      staging.unmap();
      return { data: fromDeviceData(tensor, info, bytes), shape: [...tensor.shape] };
    } finally {
      staging.destroy();
    }
  }

  /** Destroy the batch's packed storages (the model's buffers are ModelBuffers'). */
  dispose() {
    this.batch?.dispose();
  }
}
