// Per-kernel profiles of a run (Model.profile in relaxweb.js): time, FLOPs and bytes per
// kernel. The twin of relaxweb/runtime/profile.py: the same rows from the same manifest.
//
// Each dispatch is timed by a timer: timestamp queries (one compute pass per dispatch, a
// timestamp at its start and end) where the device has "timestamp-query", otherwise one
// submit per dispatch and the wall time until onSubmittedWorkDone. The FLOPs and bytes of a
// call come from its kernel's `cost` trees in the manifest (relaxweb/ir/cost.py wrote them),
// evaluated with the fields the host module wrote into that call site's params block.

import { OPCODE_DISPATCH } from "./host.js";

export const TIMESTAMPS = "timestamp queries";
export const SUBMITS = "per-dispatch submits";
const MAX_QUERIES = 4096; // WebGPU's largest query set
const USAGE = { MAP_READ: 0x1, COPY_SRC: 0x4, COPY_DST: 0x8, QUERY_RESOLVE: 0x200 };

/**
 * @typedef {{callSite: number, ms: number, params: Int32Array}} DispatchTime
 * @typedef {{kernel: string, calls: number, totalMs: number, percent: number, flops: number|null,
 *   bytes: number|null, gflopsPerSecond: number|null, gbytesPerSecond: number|null}} ProfileRow
 * @typedef {{method: string, dispatches: number, totalMs: number, rows: ProfileRow[]}} Profile
 * @typedef {{encoder: GPUCommandEncoder, wait: (() => Promise<void>)|null}} TimedStep
 */

/**
 * The value of a manifest cost tree (validated by the schema) with its names bound by
 * `values`; null where it divides by zero or names an unknown value. Integers stay exact up
 * to 2^53 (floor division and modulo as Python's).
 * @param {any} tree @param {Map<string, number>} values
 * @returns {number|null}
 */
export function evaluateTree(tree, values) {
  if (typeof tree === "string") return values.get(tree) ?? null;
  if (!Array.isArray(tree)) return tree;
  const a = evaluateTree(tree[1], values);
  const b = evaluateTree(tree[2], values);
  if (a === null || b === null) return null;
  if ((tree[0] === "floordiv" || tree[0] === "mod") && b === 0) return null;
  const mod = ((a % b) + b) % b;
  switch (tree[0]) {
    case "add": return a + b;
    case "sub": return a - b;
    case "mul": return a * b;
    case "floordiv": return (a - mod) / b;
    case "mod": return mod;
    case "min": return Math.min(a, b);
    case "max": return Math.max(a, b);
    default: return null;
  }
}

/**
 * FLOPs and bytes of one dispatch, from its kernel's cost trees and its params.
 * @param {any} manifest @param {DispatchTime} dispatch
 * @returns {[number|null, number|null]}
 */
export function callCost(manifest, dispatch) {
  const kernel = manifest.kernels[manifest.call_sites[dispatch.callSite].kernel];
  if (!kernel.cost) return [null, null];
  const values = new Map((kernel.params ?? []).map((/** @type {string} */ name, /** @type {number} */ i) => [name, dispatch.params[i]]));
  return [evaluateTree(kernel.cost.flops, values), evaluateTree(kernel.cost.bytes, values)];
}

/**
 * One row per kernel dispatched, slowest first.
 * @param {any} manifest @param {DispatchTime[]} dispatches @param {string} method
 * @returns {Profile}
 */
export function summarize(manifest, dispatches, method) {
  /** @type {Map<number, DispatchTime[]>} */
  const byKernel = new Map();
  for (const dispatch of dispatches) {
    const kernel = manifest.call_sites[dispatch.callSite].kernel;
    byKernel.set(kernel, [...(byKernel.get(kernel) ?? []), dispatch]);
  }
  const totalMs = dispatches.reduce((sum, d) => sum + d.ms, 0);
  const known = (/** @type {(number|null)[]} */ values) =>
    values.includes(null) ? null : values.reduce((/** @type {number} */ sum, v) => sum + /** @type {number} */ (v), 0);
  const rows = [...byKernel].map(([kernel, calls]) => {
    const costs = calls.map((call) => callCost(manifest, call));
    const ms = calls.reduce((sum, call) => sum + call.ms, 0);
    const flops = known(costs.map(([f]) => f));
    const bytes = known(costs.map(([, b]) => b));
    return {
      kernel: manifest.kernels[kernel].name, calls: calls.length, totalMs: ms, percent: totalMs > 0 ? (100 * ms) / totalMs : 0,
      flops, bytes,
      gflopsPerSecond: flops === null || ms <= 0 ? null : flops / (ms * 1e6),
      gbytesPerSecond: bytes === null || ms <= 0 ? null : bytes / (ms * 1e6),
    };
  });
  rows.sort((a, b) => b.totalMs - a.totalMs || (a.kernel < b.kernel ? -1 : a.kernel > b.kernel ? 1 : 0));
  return { method, dispatches: dispatches.length, totalMs, rows };
}

/** The dispatches of a command list. @param {import("./host.js").Command[]} commands */
const dispatchesOf = (commands) => /** @type {import("./host.js").DispatchCommand[]} */ (
  commands.filter((command) => command.opcode === OPCODE_DISPATCH));

/**
 * The i32 fields of a call site's params block, from the whole params block.
 * @param {Uint8Array} params @param {any} site
 */
export const paramsFields = (params, site) =>
  new Int32Array(params.slice(site.params_offset, site.params_offset + site.params_size).buffer);

/** One compute pass per dispatch with timestamps at its start and end, resolved in the same encoder. */
export class TimestampTimer {
  /** @param {import("./relaxweb.js").Model} model */
  constructor(model) {
    this.model = model;
    this.method = TIMESTAMPS;
    /** @type {{readable: GPUBuffer, spent: (GPUBuffer|GPUQuerySet)[], calls: {callSite: number, params: Int32Array}[]}[]} */
    this.pending = [];
  }

  /**
   * Encode a step's dispatches; the step goes on in the same encoder.
   * @param {GPUCommandEncoder} encoder @param {import("./host.js").Command[]} commands @param {Uint8Array} params
   * @returns {TimedStep}
   */
  encode(encoder, commands, params) {
    const { device, manifest } = this.model;
    const dispatches = dispatchesOf(commands);
    for (let first = 0; first < dispatches.length; first += MAX_QUERIES / 2) {
      const chunk = dispatches.slice(first, first + MAX_QUERIES / 2);
      const count = 2 * chunk.length;
      const querySet = device.createQuerySet({ type: "timestamp", count });
      chunk.forEach((command, index) => {
        const pass = encoder.beginComputePass({
          timestampWrites: { querySet, beginningOfPassWriteIndex: 2 * index, endOfPassWriteIndex: 2 * index + 1 },
        });
        this.model.encodeDispatch(pass, command);
        pass.end();
      });
      const resolved = this.model.createBuffer({ size: 8 * count, usage: USAGE.QUERY_RESOLVE | USAGE.COPY_SRC });
      const readable = this.model.createBuffer({ size: 8 * count, usage: USAGE.MAP_READ | USAGE.COPY_DST });
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
      await this.model.orDeviceLoss(readable.mapAsync(/* GPUMapMode.READ */ 1));
      const stamps = new BigUint64Array(readable.getMappedRange().slice(0));
      this.model.stats.add("bytesRead", stamps.byteLength);
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
  /** @param {import("./relaxweb.js").Model} model */
  constructor(model) {
    this.model = model;
    this.method = SUBMITS;
    /** @type {DispatchTime[]} */
    this.measured = [];
  }

  /**
   * Submit what the step encoded so far, encode each dispatch in a command buffer of its
   * own, and return a fresh encoder for the rest of the step and `wait`, which submits the
   * dispatches one by one, timing each (run it before submitting the rest).
   * @param {GPUCommandEncoder} encoder @param {import("./host.js").Command[]} commands @param {Uint8Array} params
   * @returns {TimedStep}
   */
  encode(encoder, commands, params) {
    const { device, manifest } = this.model;
    device.queue.submit([encoder.finish()]); // uploads and copies of grown storages: not timed
    const single = dispatchesOf(commands).map((command) => {
      const own = device.createCommandEncoder();
      const pass = own.beginComputePass();
      this.model.encodeDispatch(pass, command);
      pass.end();
      return { command, buffer: own.finish() };
    });
    const wait = async () => {
      await this.model.orDeviceLoss(device.queue.onSubmittedWorkDone());
      for (const { command, buffer } of single) {
        // in an error scope as every other submit of a run (Model.captureGpuErrors), popped
        // after the time is taken
        device.pushErrorScope("validation");
        const start = performance.now();
        device.queue.submit([buffer]);
        const scope = device.popErrorScope();
        await this.model.orDeviceLoss(device.queue.onSubmittedWorkDone());
        const ms = performance.now() - start;
        const error = await this.model.orDeviceLoss(scope);
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
