// The browser runtime's handle on a bundle's host module. The module runs in a worker
// (host_worker.js): every call has a time limit, and a module that has not answered by then
// (a tampered host.wasm that loops) is stopped by terminating the worker, and the call
// rejects with a clear error instead of freezing the page. Where workers are not available
// the module runs in the page, without that limit.

import { InputShapeError } from "./host.js";
import { HostSessions } from "./host_session.js";

/** How long one call into the host module may take (modules relaxweb writes need milliseconds). */
export const HOST_CALL_TIMEOUT_MS = 10_000;

/** @typedef {import("./host_session.js").HostStep} HostStep */

export class RemoteHost {
  /**
   * @param {ArrayBuffer} wasmBytes
   * @param {any} manifest
   * @param {number} [timeoutMs]
   * @returns {Promise<RemoteHost>}
   */
  static async instantiate(wasmBytes, manifest, timeoutMs = HOST_CALL_TIMEOUT_MS) {
    if (typeof Worker === "undefined") {
      return new RemoteHost(null, timeoutMs, await HostSessions.instantiate(wasmBytes, manifest));
    }
    const worker = new Worker(new URL("./host_worker.js", import.meta.url), { type: "module" });
    const remote = new RemoteHost(worker, timeoutMs, null);
    await remote.call("instantiate", [wasmBytes, manifest]);
    return remote;
  }

  /**
   * @param {Worker|null} worker
   * @param {number} timeoutMs
   * @param {HostSessions|null} local the sessions in the page, when there is no worker
   */
  constructor(worker, timeoutMs, local) {
    this.worker = worker;
    this.timeoutMs = timeoutMs;
    this.local = local;
    /** @type {Map<number, {resolve: (value: any) => void, reject: (error: Error) => void, timer: any}>} */
    this.pending = new Map();
    this.nextId = 0;
    /** @type {Error|null} why the host module cannot be called any more */
    this.broken = null;
    if (worker) {
      worker.onmessage = ({ data }) => this.answer(data);
      worker.onerror = (event) => this.stop(new Error(`the bundle's host module failed in its worker: ${event.message}`));
    }
  }

  /** @param {Record<string, number|null>|undefined} bounds @returns {Promise<{bounds: (number|null)[], sizesAtBounds: number[]|null}>} */
  configure(bounds) { return this.call("configure", [bounds ?? null]); }

  /** @param {number[][]} shapes @param {Record<number, number[][]|null>} sequences @returns {Promise<HostStep>} */
  start(shapes, sequences) { return this.call("start", [shapes, sequences]); }

  /** @param {number|null} slot @param {number} value @returns {Promise<HostStep>} */
  resume(slot, value) { return this.call("resume", [slot, value]); }

  /**
   * Start instance `k` of a batch on its own host session (HostSessions.startInstance).
   * @param {number} k @param {number[][]} shapes @param {Record<number, number[][]|null>} sequences
   * @returns {Promise<HostStep & {varValues: Record<string, number>}>}
   */
  startInstance(k, shapes, sequences) { return this.call("startInstance", [k, shapes, sequences]); }

  /** @param {number} k @param {number|null} slot @param {number} value @returns {Promise<HostStep>} */
  resumeInstance(k, slot, value) { return this.call("resumeInstance", [k, slot, value]); }

  /** Stop the worker (the model is disposed). */
  dispose() { this.stop(new Error("the model was disposed")); }

  /**
   * @param {string} method
   * @param {any[]} args
   * @returns {Promise<any>}
   */
  call(method, args) {
    if (this.local) {
      return new Promise((resolve) => resolve(/** @type {any} */ (this.local)[method](...args)));
    }
    if (this.broken) return Promise.reject(this.broken);
    return new Promise((resolve, reject) => {
      const id = this.nextId++;
      const timer = setTimeout(() => this.stop(new Error(
        `the bundle's host module did not finish ${method} within ${this.timeoutMs / 1000} s ` +
        "(a module relaxweb writes needs milliseconds): it loops, the bundle is damaged",
      )), this.timeoutMs);
      this.pending.set(id, { resolve, reject, timer });
      /** @type {Worker} */ (this.worker).postMessage({ id, method, args });
    });
  }

  /** @param {{id: number, result?: any, error?: {name: string, message: string, details?: any}}} data */
  answer({ id, result, error }) {
    const call = this.pending.get(id);
    if (!call) return;
    this.pending.delete(id);
    clearTimeout(call.timer);
    if (!error) return call.resolve(result);
    call.reject(error.name === "InputShapeError" ? new InputShapeError(error.message, error.details) : new Error(error.message));
  }

  /** @param {Error} reason */
  stop(reason) {
    this.broken ??= reason;
    this.worker?.terminate();
    for (const call of this.pending.values()) {
      clearTimeout(call.timer);
      call.reject(reason);
    }
    this.pending.clear();
  }
}
