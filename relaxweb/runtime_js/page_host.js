// The browser runtime's handle on a bundle's host module: its sessions on the page's thread,
// every call under a time limit. The module is rewritten as a plain page's kernels.wasm is
// (interruptible_kernels.js: fuel spent in every loop, a look at the clock when it runs out),
// so a module that has not returned by then (a tampered host.wasm that loops) throws there;
// the call rejects with a clear error and every later call with the same. The host module
// once ran in a worker, terminated at the limit: on this machine a run then waited 2.2 ms for
// the worker to wake and answer, where the call itself takes 0.3 ms (GPT-2's decode step);
// each token generated paid that again.

import { DeadlineClock, interruptibleKernels, DEADLINE_IMPORT } from "./interruptible_kernels.js";
import { HostSessions } from "./host_session.js";

/** How long one call into the host module may take (modules relaxweb writes need milliseconds). */
export const HOST_CALL_TIMEOUT_MS = 10_000;

/** A call into the host module that ran past its time limit. */
class HostDeadlineError extends Error {}

/** @typedef {import("./host_session.js").HostStep} HostStep */

export class PageHost {
  /**
   * The module's sessions on this thread, its bytes rewritten to be interruptible.
   * @param {ArrayBuffer|Uint8Array} wasmBytes
   * @param {any} manifest
   * @param {number} [timeoutMs]
   * @returns {Promise<PageHost>}
   */
  static async instantiate(wasmBytes, manifest, timeoutMs = HOST_CALL_TIMEOUT_MS) {
    const clock = new DeadlineClock(() => new HostDeadlineError("past the host call's time limit"));
    const imports = { [DEADLINE_IMPORT[0]]: { [DEADLINE_IMPORT[1]]: clock.deadline } };
    return new PageHost(await HostSessions.instantiate(interruptibleKernels(wasmBytes), manifest, imports), timeoutMs, clock);
  }

  /**
   * @param {any} sessions the module's sessions (HostSessions; a test's HostSession)
   * @param {number} [timeoutMs]
   * @param {DeadlineClock|null} [clock] the clock its rewritten module asks (none: a module as written, never stopped)
   */
  constructor(sessions, timeoutMs = HOST_CALL_TIMEOUT_MS, clock = null) {
    this.sessions = sessions;
    this.timeoutMs = timeoutMs;
    this.clock = clock;
    /** @type {Error|null} why the host module cannot be called any more */
    this.broken = null;
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

  /** No more calls (the model is disposed). */
  dispose() { this.broken ??= new Error("the model was disposed"); }

  /**
   * @param {string} method
   * @param {any[]} args
   * @returns {Promise<any>}
   */
  async call(method, args) {
    if (this.broken) throw this.broken;
    this.clock?.start(this.timeoutMs);
    try {
      return await this.sessions[method](...args);
    } catch (error) {
      if (!(error instanceof HostDeadlineError)) throw error;
      this.broken = new Error(`the bundle's host module did not finish ${method} within ${this.timeoutMs / 1000} s ` +
        "(a module relaxweb writes needs milliseconds): it loops, the bundle is damaged");
      throw this.broken;
    }
  }
}
