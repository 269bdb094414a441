// Per-kernel profiles of a run (model.profile, driver.js's profile): time, FLOPs and bytes per
// kernel. The twin of relaxweb/runtime/profile.py: the same rows from the same manifest.
//
// Each dispatch is timed by the backend's timer: on WebGPU timestamp queries or one submit per
// dispatch (webgpu_timers.js), on the wasm backend the wall clock around each kernel call
// (WallClockTimer). The FLOPs and bytes of a call come from its kernel's `cost` trees in the
// manifest (relaxweb/ir/cost.py wrote them), evaluated with the fields the host module wrote
// into that call site's params block.

export const TIMESTAMPS = "timestamp queries";
export const SUBMITS = "per-dispatch submits";
/** The wasm backend's method: each dispatch timed by the calling thread's clock (performance.now()). */
export const WALL_CLOCK = "wall clock per kernel call"; // relaxweb/runtime/profile.py WASM_CALLS

/**
 * @typedef {{callSite: number, ms: number, params: Int32Array}} DispatchTime
 * @typedef {{kernel: string, calls: number, totalMs: number, percent: number, flops: number|null,
 *   bytes: number|null, gflopsPerSecond: number|null, gbytesPerSecond: number|null}} ProfileRow
 * @typedef {{method: string, dispatches: number, totalMs: number, rows: ProfileRow[]}} Profile
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

/**
 * The i32 fields of a call site's params block, from the whole params block.
 * @param {Uint8Array} params @param {any} site
 */
export const paramsFields = (params, site) =>
  new Int32Array(params.slice(site.params_offset, site.params_offset + site.params_size).buffer);

/**
 * The wasm backend's timer: the wall-clock time of each kernel call, which the backend
 * measures around the call and records here.
 */
export class WallClockTimer {
  constructor() {
    this.method = WALL_CLOCK;
    /** @type {DispatchTime[]} */
    this.measured = [];
  }

  /**
   * One dispatch's time.
   * @param {number} callSite @param {number} ms @param {Uint8Array} params the whole params block @param {any} site the call site
   */
  record(callSite, ms, params, site) {
    this.measured.push({ callSite, ms, params: paramsFields(params, site) });
  }

  /** @returns {Promise<DispatchTime[]>} */
  async times() {
    return this.measured;
  }
}
