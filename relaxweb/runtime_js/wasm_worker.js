// A worker of the wasm backend's thread pool (wasm_backend.js, WorkerPool): it instantiates
// the shared-memory kernels.wasm over the model's shared memory (the leader then calls every
// kernel with no units, warm_up.js, before it reports ready), then runs the jobs posted in
// its slot of the control block (CONTROL in wasm_backend.js): it waits on GO, runs the job,
// stores the job number in DONE and notifies; QUITTING ends it. A RUN_UNITS job runs kernel
// KERNEL over units [FIRST, END) and counts them. Worker 0, the leader, also takes RUN_STAGE
// jobs from the page: the dispatch table's kernel calls in order, each one's units counted
// (kK_units), split (splitUnits) and run with the other workers (RUN_UNITS jobs it posts and
// waits for); it stamps each call's start in STARTED and the dispatch in CURRENT (the page's
// deadline), and writes each call's ms into `times`. A trap is reported in STATUS and its
// message bytes, never thrown away. A kernel that never returns is stopped by the page
// terminating the workers.

import { CONTROL, CONTROL_SLOT, MESSAGE_BYTES, RUN_STAGE, RUN_UNITS, splitUnits } from "./wasm_pool.js";
import { warmUpKernels } from "./warm_up.js";

const {
  GO, DONE, STATUS, KERNEL, PARAMS, FIRST, END, SCRATCH, BUFFER_COUNT, UNITS_RUN, OP, QUITTING, DISPATCHES, CURRENT,
  FAILED_WORKER, STARTED, RUN_STATUS, ADDRESSES,
} = CONTROL;

/** Loads of another worker's DONE between two looks at QUITTING while the leader waits for it
 * (and of GO between two looks at the clock while a worker spins for its next job). */
const LOADS_PER_LOOK = 1024;
/** How long a worker that has done a job looks for the next one before it sleeps (Atomics.wait). */
const SPIN_MS = 2;

/**
 * What a worker works with.
 * @typedef {{exports: Record<string, any>, control: Int32Array, messages: Uint8Array, table: Int32Array,
 *   times: Float64Array, epoch: number, index: number, count: number}} PoolWorker
 */

self.onmessage = ({ data }) => {
  let exports;
  try {
    exports = new WebAssembly.Instance(data.module, { env: { memory: data.memory } }).exports;
  } catch (error) {
    self.postMessage({ error: String(error?.message ?? error) });
    return;
  }
  // the leader calls every kernel with no units first, so that they are compiled for speed (warm_up.js)
  const warmUp = data.warmUp ? warmUpKernels((k) => exports[`k${k}`], data.warmUp, new Int32Array(data.memory.buffer)) : null;
  self.postMessage({ ready: true, warmUp });
  serve({ ...data, exports });
};

/**
 * Run jobs until QUITTING.
 * @param {PoolWorker} worker
 */
function serve(worker) {
  const { control, index } = worker;
  const slot = index * CONTROL_SLOT;
  // Jobs are numbered from 1 and GO starts at 0: a job posted before this loop began (a quit
  // sent while the worker was still starting) is seen at once, never taken for an old one.
  let seen = 0;
  for (;;) {
    seen = nextJob(control, slot + GO, seen);
    if (Atomics.load(control, slot + QUITTING)) break;
    const failed = control[slot + OP] === RUN_STAGE ? runStage(worker) : runUnits(worker, slot) ? -1 : index;
    if (Atomics.load(control, slot + QUITTING)) break;
    control[slot + STATUS] = failed < 0 ? 0 : 1;
    Atomics.store(control, slot + DONE, seen); // publishes STATUS and the memory the kernels wrote
    Atomics.notify(control, slot + DONE);
  }
  self.close();
}

/**
 * The next job's number once control[at] is no longer `seen`: looked at in a loop for
 * SPIN_MS first, then Atomics.wait. The next dispatch of a stage comes within about a kernel
 * call's time, and waking from Atomics.wait costs tens of microseconds of each dispatch:
 * with this and 2 units a thread (MIN_UNITS_PER_THREAD), MobileNetV3's 73 dispatches took
 * 0.89x their time on 2 threads in Chromium (the medians of 4 alternating invocations each).
 * @param {Int32Array} control @param {number} at @param {number} seen @returns {number}
 */
function nextJob(control, at, seen) {
  let job = Atomics.load(control, at);
  for (const until = performance.now() + SPIN_MS; job === seen && performance.now() < until;) {
    for (let i = 0; i < LOADS_PER_LOOK && job === seen; i++) job = Atomics.load(control, at);
  }
  while (job === seen) {
    Atomics.wait(control, at, seen);
    job = Atomics.load(control, at);
  }
  return job;
}

/**
 * A RUN_UNITS job of slot `slot`; false when the kernel trapped (its message written).
 * @param {PoolWorker} worker @param {number} slot @returns {boolean}
 */
function runUnits(worker, slot) {
  const { control, exports } = worker;
  const first = control[slot + FIRST];
  const end = control[slot + END];
  const addresses = control.subarray(slot + ADDRESSES, slot + ADDRESSES + control[slot + BUFFER_COUNT]);
  try {
    exports[`k${control[slot + KERNEL]}`](control[slot + PARAMS], first, end, control[slot + SCRATCH], ...addresses);
  } catch (error) {
    writeMessage(worker, error);
    return false;
  }
  Atomics.add(control, slot + UNITS_RUN, end - first);
  return true;
}

/**
 * The leader's RUN_STAGE job: the table's dispatches in order, stopping at the first that fails.
 * @param {PoolWorker} worker @returns {number} the worker whose kernel trapped (its message written), or -1
 */
function runStage(worker) {
  const { control, table, times, epoch } = worker;
  const count = control[DISPATCHES];
  for (let i = 0, at = 0; i < count; i++) {
    const addresses = table.subarray(at + 4, at + 4 + table[at + 2]);
    control[CURRENT] = i;
    Atomics.store(control, STARTED, Date.now() - epoch);
    const started = performance.now();
    const failed = runDispatch(worker, table[at], table[at + 1], addresses, table[at + 3]);
    times[i] = performance.now() - started;
    if (Atomics.load(control, QUITTING)) return -1; // the pool is stopping: serve ends
    if (failed >= 0) {
      control[FAILED_WORKER] = failed;
      return failed;
    }
    at += 4 + addresses.length;
  }
  return -1;
}

/**
 * One dispatch, led by worker 0: its units counted, split, range 0 run here and the others
 * posted to workers 1.., then waited for (every one, even after a trap: none may still write
 * the memory when the stage ends); a negative kernel -1 - K: kK_pack, here alone (load's prepack).
 * @param {PoolWorker} worker @param {number} kernel @param {number} params @param {Int32Array} addresses
 * @param {number} statusAt the position of the run status among `addresses` (-1: none): each worker binds its own
 * @returns {number} the first worker whose kernel trapped, or -1
 */
function runDispatch(worker, kernel, params, addresses, statusAt) {
  const { control, exports, count } = worker;
  if (kernel < 0) { // a weight packed into its prepacked region (the last address) at load: kK_pack, here alone
    try {
      exports[`k${-1 - kernel}_pack`](params, 0, 0, control[SCRATCH], ...addresses);
    } catch (error) {
      writeMessage(worker, error);
      return 0;
    }
    return -1;
  }
  let units;
  try {
    units = exports[`k${kernel}_units`](params);
  } catch (error) {
    writeMessage(worker, error);
    return 0;
  }
  if (units <= 0) return -1;
  const ranges = splitUnits(units, count);
  const jobs = ranges.map((range, w) => (w === 0 ? 0 : postUnits(control, w, kernel, params, range, addresses, statusAt)));
  let failed = -1;
  try {
    exports[`k${kernel}`](params, ranges[0][0], ranges[0][1], control[SCRATCH], ...addresses);
    Atomics.add(control, UNITS_RUN, ranges[0][1] - ranges[0][0]);
  } catch (error) {
    writeMessage(worker, error);
    failed = 0;
  }
  for (let w = 1; w < ranges.length; w++) {
    if (!waitDone(control, w, jobs[w])) return failed; // the pool is stopping
    if (failed < 0 && control[w * CONTROL_SLOT + STATUS] !== 0) failed = w;
  }
  return failed;
}

/**
 * Post worker `w` the RUN_UNITS job of `range`. @param {Int32Array} control @param {number} w
 * @param {number} kernel @param {number} params @param {[number, number]} range @param {Int32Array} addresses
 * @param {number} statusAt the position of the run status among `addresses` (-1: none)
 * @returns {number} the job's number
 */
function postUnits(control, w, kernel, params, [first, end], addresses, statusAt) {
  const slot = w * CONTROL_SLOT;
  control[slot + OP] = RUN_UNITS;
  control[slot + KERNEL] = kernel;
  control[slot + PARAMS] = params;
  control[slot + FIRST] = first;
  control[slot + END] = end;
  control[slot + BUFFER_COUNT] = addresses.length;
  control.set(addresses, slot + ADDRESSES);
  if (statusAt >= 0) control[slot + ADDRESSES + statusAt] = control[slot + RUN_STATUS]; // its own run status
  const job = Atomics.add(control, slot + GO, 1) + 1; // publishes the fields stored before it
  Atomics.notify(control, slot + GO, 1);
  return job;
}

/**
 * Wait until worker `w` has done job `job`, spinning (its range is as large as the leader's,
 * so it is done about as soon; waking from Atomics.wait would cost tens of microseconds a
 * dispatch); false when the leader is told to quit meanwhile (the page stops a pool whose
 * worker passed the deadline).
 * @param {Int32Array} control @param {number} w @param {number} job @returns {boolean}
 */
function waitDone(control, w, job) {
  const at = w * CONTROL_SLOT + DONE;
  for (;;) {
    for (let i = 0; i < LOADS_PER_LOOK; i++) if (Atomics.load(control, at) === job) return true;
    if (Atomics.load(control, QUITTING)) return false;
  }
}

/** A trap's message into this worker's message bytes. @param {PoolWorker} worker @param {unknown} error */
function writeMessage({ messages, index }, error) {
  const text = new TextEncoder().encode(String(/** @type {any} */ (error)?.message ?? error)).subarray(0, MESSAGE_BYTES - 1);
  messages.fill(0, index * MESSAGE_BYTES, (index + 1) * MESSAGE_BYTES);
  messages.set(text, index * MESSAGE_BYTES);
}
