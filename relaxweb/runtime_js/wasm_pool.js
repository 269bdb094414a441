// The wasm backend's thread pool (wasm_backend.js starts it where the page is cross-origin
// isolated): the control block its workers share (CONTROL, one slot of i32 fields a worker),
// how a dispatch's units are split between them (splitUnits), and WorkerPool, the page's side:
// it starts the workers (wasm_worker.js, their side), posts each stage's dispatches to worker 0,
// the leader, and awaits the stage under the kernel calls' deadline.

import { WARM_UP_BUDGET_MS, WARM_UP_GRACE_MS } from "./warm_up.js";

/**
 * The fewest units a thread gets: a dispatch with fewer than twice this runs on the calling
 * thread alone. At 4, a convolution of 7 units (ResNet-50's, MobileNetV3's: a unit is
 * a group of panels that packs the weight once) ran on one thread of two; at 2, GPT-2's
 * decode step ran its 768-column matrix-vector products (2 units of 384 columns, 2.4 MB of
 * weight each) on one.
 */
export const MIN_UNITS_PER_THREAD = 1;

// The control block of the pool: one slot of i32 fields per worker. Worker 0 is the leader:
// the page posts it a stage (RUN_STAGE: a chunk of the stage's dispatches, in the dispatch
// table) and awaits it once; the leader runs each dispatch, posting RUN_UNITS jobs to the
// other workers and waiting for them itself (workers may Atomics.wait; the page may not).
const GO = 0; // the poster adds 1 here (the new job's number), then notifies
const DONE = 1; // the worker stores the job number here when it has run it, then notifies
const STATUS = 2; // 0: the job ran; 1: a kernel trapped (RUN_STAGE: its worker in FAILED_WORKER)
const KERNEL = 3;
const PARAMS = 4;
const FIRST = 5;
const END = 6;
const SCRATCH = 7; // this worker's scratch block (set once, at start)
const BUFFER_COUNT = 8;
const UNITS_RUN = 9; // units this worker has run since the pool started (for tests)
const OP = 10; // RUN_UNITS (kernel KERNEL over [FIRST, END)) or RUN_STAGE (the leader only)
const QUITTING = 11; // set by the page before a last job: the worker ends (WorkerPool.quit)
const DISPATCHES = 12; // RUN_STAGE: how many dispatches the table holds
const CURRENT = 13; // RUN_STAGE: the dispatch being run (or that failed), from 0
const FAILED_WORKER = 14; // RUN_STAGE: the worker whose message says why the dispatch failed
const STARTED = 15; // RUN_STAGE: when the current kernel call started (Date.now() - the pool's epoch)
const RUN_STATUS = 16; // this worker's run status (run_status.js; set once, at start): a call site's status binding is it
const ADDRESSES = 17; // then one address per binding
const MAX_BUFFERS = 63; // a call site binds at most 63 buffers (the manifest schema); the slot holds one more: a prepacked region
export const CONTROL_SLOT = ADDRESSES + MAX_BUFFERS + 1;
export const MESSAGE_BYTES = 256;
/** OP of a job that runs kernel KERNEL over units [FIRST, END). */
export const RUN_UNITS = 0;
/** OP of the leader's job: the dispatches of the dispatch table, in order. */
export const RUN_STAGE = 1;
/** The dispatch table's i32 words: per dispatch [kernel (-1 - K: kK_pack), params address, buffer count, status position (-1: none), addresses...]. */
export const TABLE_WORDS = 1 << 16;
/** The most dispatches one RUN_STAGE job runs (a longer stage is posted in chunks). */
export const MAX_CHUNK_DISPATCHES = 4096;

export const CONTROL = {
  GO, DONE, STATUS, KERNEL, PARAMS, FIRST, END, SCRATCH, BUFFER_COUNT, UNITS_RUN, OP, QUITTING, DISPATCHES, CURRENT,
  FAILED_WORKER, STARTED, RUN_STATUS, ADDRESSES,
};

/**
 * Units [0, units) split into contiguous ranges, one per thread used: as many threads as
 * give each at least `minUnits` units (at most `threads`, at least one), sizes differing by
 * at most one. The first range is the calling thread's.
 * @param {number} units @param {number} threads @param {number} [minUnits]
 * @returns {[number, number][]}
 */
export function splitUnits(units, threads, minUnits = MIN_UNITS_PER_THREAD) {
  const used = Math.max(1, Math.min(threads, Math.floor(units / minUnits)));
  return Array.from({ length: used }, (_, i) => [Math.floor((units * i) / used), Math.floor((units * (i + 1)) / used)]);
}

/** A dispatch of a stage that failed on the pool: its index in the stage and why. */
export class DispatchFailure extends Error {
  /** @param {number} index @param {string} message */
  constructor(index, message) {
    super(message);
    this.index = index;
  }
}

/**
 * One kernel call of a stage, as the leader worker runs it.
 * @typedef {{kernel: number, params: number, addresses: number[], statusAt: number}} KernelCall
 */

/**
 * The workers that run every kernel call of a model, each with its own instance of the
 * shared-memory module over the one shared memory, and a slot of a shared control block
 * (CONTROL). The page posts a stage's dispatches to worker 0, the leader, through a shared
 * dispatch table, and awaits the stage once (Atomics.waitAsync); the leader runs each
 * dispatch, splitting its units with the other workers (RUN_UNITS jobs it posts and waits for),
 * stamps each kernel call's start, and writes each call's time. The page's deadline is the
 * current call's start plus the timeout: past it every worker is terminated and the pool is
 * broken.
 */
export class WorkerPool {
  /**
   * @param {WebAssembly.Module} module the shared-memory variant
   * @param {WebAssembly.Memory} memory shared
   * @param {number} count
   * @param {number[]} scratch one scratch block per worker
   * @param {number[]} statuses one run status per worker (each writes its own: no atomics)
   * @param {{kernel: number, first: number, end: number}[]|null} [warmUp] the kernels the leader calls with no units
   *   before it reports ready (warm_up.js); a leader that has not reported within the budget and its grace is
   *   terminated and the pool started again without them
   * @returns {Promise<WorkerPool>}
   */
  static async start(module, memory, count, scratch, statuses, warmUp = null) {
    const control = new Int32Array(new SharedArrayBuffer(count * CONTROL_SLOT * 4));
    scratch.forEach((address, w) => { control[w * CONTROL_SLOT + SCRATCH] = address; });
    statuses.forEach((address, w) => { control[w * CONTROL_SLOT + RUN_STATUS] = address; });
    const messages = new Uint8Array(new SharedArrayBuffer(count * MESSAGE_BYTES));
    const table = new Int32Array(new SharedArrayBuffer(TABLE_WORDS * 4));
    const times = new Float64Array(new SharedArrayBuffer(MAX_CHUNK_DISPATCHES * 8));
    const epoch = Date.now();
    const workers = Array.from({ length: count }, () => new Worker(new URL("./wasm_worker.js", import.meta.url), { type: "module" }));
    const pool = new WorkerPool(workers, control, messages, table, times, epoch);
    /** @type {ReturnType<typeof setTimeout>|undefined} */
    let timer;
    try {
      const started = Promise.all(workers.map((worker, index) => new Promise((resolve, reject) => {
        worker.onmessage = ({ data }) => {
          if (!data?.ready) return reject(new Error(`a wasm worker failed to start: ${data?.error}`));
          if (data.warmUp) pool.warmUp = data.warmUp;
          return resolve(null);
        };
        worker.onerror = (event) => reject(new Error(`a wasm worker failed to start: ${event.message}`));
        const leaderWarmUp = index === 0 && warmUp?.length ? warmUp : null;
        worker.postMessage({ module, memory, control, messages, table, times, epoch, index, count, warmUp: leaderWarmUp });
      })));
      const late = warmUp?.length ? new Promise((resolve) => { timer = setTimeout(() => resolve("late"), WARM_UP_BUDGET_MS + WARM_UP_GRACE_MS); }) : null;
      if ((await (late ? Promise.race([started, late]) : started)) === "late") { // a kernel loops at load: start again without
        pool.stop();
        return WorkerPool.start(module, memory, count, scratch, statuses, null);
      }
    } catch (error) {
      pool.stop();
      throw error;
    } finally {
      clearTimeout(timer);
    }
    return pool;
  }

  /**
   * @param {Worker[]} workers @param {Int32Array} control @param {Uint8Array} messages
   * @param {Int32Array} table the dispatch table @param {Float64Array} times each dispatch's ms
   * @param {number} epoch Date.now() when the pool started: STARTED counts from it
   */
  constructor(workers, control, messages, table, times, epoch) {
    this.workers = workers;
    this.control = control;
    this.messages = messages;
    this.table = table;
    this.times = times;
    this.epoch = epoch;
    /** @type {string|null} why the pool cannot run any more (a kernel call past its deadline) */
    this.broken = null;
    /** The most dispatches posted at once (at most MAX_CHUNK_DISPATCHES; tests lower it). */
    this.chunkDispatches = MAX_CHUNK_DISPATCHES;
    /** The leader's calls of every kernel with no units before it reported ready (warm_up.js). */
    this.warmUp = { kernels: 0, ms: 0 };
  }

  /**
   * Run `calls` in order on the pool, in chunks that fit the dispatch table, each kernel call
   * under a deadline of `timeoutMs`. Resolves to each call's ms; rejects with a DispatchFailure
   * (the call that trapped or passed its deadline) or when the pool is broken.
   * @param {KernelCall[]} calls @param {number} timeoutMs @returns {Promise<number[]>}
   */
  async runDispatches(calls, timeoutMs) {
    /** @type {number[]} */
    const times = [];
    while (times.length < calls.length) {
      if (this.broken) throw new Error(this.broken);
      const first = times.length;
      const count = this.writeTable(calls, first);
      const job = this.postStage(count);
      await this.awaitStage(job, first, timeoutMs);
      times.push(...this.times.subarray(0, count));
    }
    return times;
  }

  /**
   * As many of `calls` from `first` on as the table holds, written into it. @param {KernelCall[]} calls
   * @param {number} first @returns {number} how many
   */
  writeTable(calls, first) {
    let at = 0;
    let count = 0;
    for (const { kernel, params, addresses, statusAt } of calls.slice(first, first + this.chunkDispatches)) {
      if (at + 4 + addresses.length > TABLE_WORDS) break;
      this.table[at] = kernel;
      this.table[at + 1] = params;
      this.table[at + 2] = addresses.length;
      this.table[at + 3] = statusAt;
      this.table.set(addresses, at + 4);
      at += 4 + addresses.length;
      count += 1;
    }
    return count;
  }

  /** Post the table's `count` dispatches to the leader. @param {number} count @returns {number} the job's number */
  postStage(count) {
    const { control } = this;
    control[OP] = RUN_STAGE;
    control[DISPATCHES] = count;
    control[CURRENT] = 0;
    Atomics.store(control, STARTED, Date.now() - this.epoch); // the deadline runs until the leader stamps its first call
    const job = Atomics.add(control, GO, 1) + 1; // publishes the fields stored before it
    Atomics.notify(control, GO, 1);
    return job;
  }

  /**
   * Await the leader's job `job` (Atomics.waitAsync: the page's thread never blocks) while its
   * current kernel call is within `timeoutMs` of its start. Past it, every worker is terminated,
   * the pool is broken, and this throws. A trap throws its message. Both name the call
   * (`first` + the leader's CURRENT).
   * @param {number} job @param {number} first @param {number} timeoutMs
   */
  async awaitStage(job, first, timeoutMs) {
    const { control } = this;
    for (let done = Atomics.load(control, DONE); done !== job; done = Atomics.load(control, DONE)) {
      const left = this.epoch + Atomics.load(control, STARTED) + timeoutMs - Date.now();
      if (left <= 0 || this.broken) {
        this.broken ??= `a kernel call ran for more than ${timeoutMs / 1000} s and its worker threads were stopped ` +
          "(the bundle's kernels.wasm loops, or is damaged; a model this slow on purpose: raise the kernelTimeoutMs load " +
          "option); load the model again";
        const current = Atomics.load(control, CURRENT);
        this.stop();
        throw new DispatchFailure(first + current, this.broken);
      }
      await waitForChange(control, DONE, done, left);
    }
    if (control[STATUS] !== 0) throw new DispatchFailure(first + control[CURRENT], this.message(control[FAILED_WORKER]));
  }

  /** The message a worker wrote when its kernel trapped. @param {number} w @returns {string} */
  message(w) {
    const bytes = this.messages.slice(w * MESSAGE_BYTES, (w + 1) * MESSAGE_BYTES);
    const end = bytes.indexOf(0);
    return new TextDecoder().decode(bytes.subarray(0, end < 0 ? bytes.length : end));
  }

  /** Units the workers have run since the pool started. @returns {number} */
  unitsRun() {
    return this.workers.reduce((sum, _, w) => sum + Atomics.load(this.control, w * CONTROL_SLOT + UNITS_RUN), 0);
  }

  /**
   * Stop worker `w`: QUITTING and a new job end its loop (terminate() alone does not stop a
   * worker blocked in Atomics.wait in Chromium; it would keep its thread).
   * @param {number} w
   */
  quit(w) {
    const slot = w * CONTROL_SLOT;
    Atomics.store(this.control, slot + QUITTING, 1);
    Atomics.add(this.control, slot + GO, 1);
    Atomics.notify(this.control, slot + GO);
    this.workers[w].terminate();
  }

  /**
   * Stop every worker, the pool broken for `reason`; a notify of each DONE wakes the leader where
   * it waits for another worker, and the page where it awaits a stage (which then rejects).
   * @param {string} [reason]
   */
  stop(reason = "its worker threads were stopped") {
    this.broken ??= reason;
    this.workers.forEach((_, w) => this.quit(w));
    this.workers.forEach((_, w) => Atomics.notify(this.control, w * CONTROL_SLOT + DONE));
  }
}

/**
 * Resolves once `array[index]` is no longer `value`, or after `ms` (Atomics.waitAsync; where
 * a browser lacks it, after a macrotask turn).
 * @param {Int32Array} array @param {number} index @param {number} value @param {number} ms
 * @returns {Promise<unknown>}
 */
function waitForChange(array, index, value, ms) {
  const waitAsync = /** @type {any} */ (Atomics).waitAsync;
  if (typeof waitAsync !== "function") return new Promise((resolve) => setTimeout(resolve, 0));
  const waited = waitAsync(array, index, value, ms);
  return waited.async ? waited.value : Promise.resolve(waited.value);
}
