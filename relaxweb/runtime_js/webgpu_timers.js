// Dispatch timers of a profiled run on WebGPU (Model.profile; the timer is the backend's
// createTimer): timestamp queries (one compute pass per dispatch, a timestamp at its start and
// end) where the device has "timestamp-query", otherwise one submit per dispatch and the wall
// time until onSubmittedWorkDone. The twin of relaxweb/runtime/webgpu_timers.py.

import { SUBMITS, TIMESTAMPS, paramsFields } from "./profile.js";
import { USAGE } from "./webgpu_buffers.js";

const MAX_QUERIES = 4096; // WebGPU's largest query set

/**
 * What a timer's encoding hands back: the encoder the stage goes on with, and work (timed
 * submits) to wait for before submitting it.
 * @typedef {{encoder: GPUCommandEncoder, wait: (() => Promise<void>)|null}} TimedStep
 * @typedef {import("./profile.js").DispatchTime} DispatchTime
 */

/** One compute pass per dispatch with timestamps at its start and end, resolved in the same encoder. */
export class TimestampTimer {
  /** @param {import("./webgpu_backend.js").WebGpuBackend} backend */
  constructor(backend) {
    this.backend = backend;
    this.method = TIMESTAMPS;
    /** @type {{readable: GPUBuffer, spent: (GPUBuffer|GPUQuerySet)[], calls: {callSite: number, params: Int32Array}[]}[]} */
    this.pending = [];
  }

  /**
   * Encode a step's dispatches; the step goes on in the same encoder.
   * @param {GPUCommandEncoder} encoder @param {import("./host.js").DispatchCommand[]} dispatches @param {Uint8Array} params
   * @returns {TimedStep}
   */
  encode(encoder, dispatches, params) {
    const { device, manifest } = this.backend;
    for (let first = 0; first < dispatches.length; first += MAX_QUERIES / 2) {
      const chunk = dispatches.slice(first, first + MAX_QUERIES / 2);
      const count = 2 * chunk.length;
      const querySet = device.createQuerySet({ type: "timestamp", count });
      chunk.forEach((command, index) => {
        const pass = encoder.beginComputePass({
          timestampWrites: { querySet, beginningOfPassWriteIndex: 2 * index, endOfPassWriteIndex: 2 * index + 1 },
        });
        this.backend.encodeDispatch(pass, command);
        pass.end();
      });
      const resolved = this.backend.buffers.createBuffer({ size: 8 * count, usage: USAGE.QUERY_RESOLVE | USAGE.COPY_SRC });
      const readable = this.backend.buffers.createBuffer({ size: 8 * count, usage: USAGE.MAP_READ | USAGE.COPY_DST });
      encoder.resolveQuerySet(querySet, 0, count, resolved, 0);
      encoder.copyBufferToBuffer(resolved, 0, readable, 0, 8 * count);
      const calls = chunk.map((command) => ({
        callSite: command.callSite, params: paramsFields(params, manifest.call_sites[command.callSite]) }));
      this.pending.push({ readable, spent: [querySet, resolved], calls });
    }
    return { encoder, wait: null };
  }

  /** Each dispatch's time, once the run's last submit is done. @returns {Promise<DispatchTime[]>} */
  async times() {
    /** @type {DispatchTime[]} */
    const times = [];
    for (const { readable, spent, calls } of this.pending) {
      await this.backend.gpu.orDeviceLoss(readable.mapAsync(/* GPUMapMode.READ */ 1));
      const stamps = new BigUint64Array(readable.getMappedRange().slice(0));
      this.backend.stats.add("bytesRead", stamps.byteLength);
      for (const object of [readable, ...spent]) object.destroy();
      calls.forEach(({ callSite, params }, index) => {
        // nanoseconds; a pair out of order (a clock reset) counts as 0
        const elapsed = stamps[2 * index + 1] > stamps[2 * index] ? stamps[2 * index + 1] - stamps[2 * index] : 0n;
        times.push({ callSite, ms: Number(elapsed) / 1e6, params });
      });
    }
    return times;
  }
}

/** One submit per dispatch, timed by the wall clock until the queue has done it. */
export class SubmitTimer {
  /** @param {import("./webgpu_backend.js").WebGpuBackend} backend */
  constructor(backend) {
    this.backend = backend;
    this.method = SUBMITS;
    /** @type {DispatchTime[]} */
    this.measured = [];
  }

  /**
   * Submit what the step encoded so far, encode each dispatch in a command buffer of its
   * own, and return a fresh encoder for the rest of the step and `wait`, which submits the
   * dispatches one by one, timing each (run it before submitting the rest).
   * @param {GPUCommandEncoder} encoder @param {import("./host.js").DispatchCommand[]} dispatches @param {Uint8Array} params
   * @returns {TimedStep}
   */
  encode(encoder, dispatches, params) {
    const { device, manifest } = this.backend;
    device.queue.submit([encoder.finish()]); // uploads and copies of grown storages: not timed
    const single = dispatches.map((command) => {
      const own = device.createCommandEncoder();
      const pass = own.beginComputePass();
      this.backend.encodeDispatch(pass, command);
      pass.end();
      return { command, buffer: own.finish() };
    });
    const wait = async () => {
      await this.backend.gpu.orDeviceLoss(device.queue.onSubmittedWorkDone());
      for (const { command, buffer } of single) {
        // in an error scope as every other submit of a run (WebGpuDevice.captureGpuErrors), popped
        // after the time is taken
        device.pushErrorScope("validation");
        const start = performance.now();
        device.queue.submit([buffer]);
        const scope = device.popErrorScope();
        await this.backend.gpu.orDeviceLoss(device.queue.onSubmittedWorkDone());
        const ms = performance.now() - start;
        const error = await this.backend.gpu.orDeviceLoss(scope);
        if (error) throw new Error(`WebGPU validation error during the profiled run: ${error.message}`);
        this.measured.push({
          callSite: command.callSite, ms,
          params: paramsFields(params, manifest.call_sites[command.callSite]),
        });
      }
    };
    return { encoder: device.createCommandEncoder(), wait };
  }

  /** @returns {Promise<DispatchTime[]>} */
  async times() {
    return this.measured;
  }
}
