// A worker of the wasm backend's thread pool (wasm_backend.js, WorkerPool): it instantiates
// the shared-memory kernels.wasm over the model's shared memory, then runs the jobs the
// page posts in its slot of the control block (CONTROL in wasm_backend.js): it waits on GO,
// runs kernel KERNEL over units [FIRST, END) and counts them (OP RUN_UNITS), or stores
// kK_units(PARAMS) in RESULT (OP COUNT_UNITS), and stores the job number in DONE; a job
// whose kernel is QUIT ends it. A trap is reported in STATUS and its message bytes, never
// thrown away. A kernel that never returns is stopped by the page terminating this worker.

import { CONTROL, CONTROL_SLOT, COUNT_UNITS, MESSAGE_BYTES, QUIT } from "./wasm_backend.js";

self.onmessage = ({ data: { module, memory, control, messages, index } }) => {
  let exports;
  try {
    exports = new WebAssembly.Instance(module, { env: { memory } }).exports;
  } catch (error) {
    self.postMessage({ error: String(error?.message ?? error) });
    return;
  }
  self.postMessage({ ready: true });
  serve(exports, control, messages, index);
};

/**
 * Run jobs until one says QUIT.
 * @param {Record<string, any>} exports @param {Int32Array} control @param {Uint8Array} messages @param {number} index
 */
function serve(exports, control, messages, index) {
  const slot = index * CONTROL_SLOT;
  const { GO, DONE, STATUS, KERNEL, PARAMS, FIRST, END, SCRATCH, BUFFER_COUNT, UNITS_RUN, OP, RESULT, ADDRESSES } = CONTROL;
  // Jobs are numbered from 1 and GO starts at 0: a job posted before this loop began (a QUIT
  // sent while the worker was still starting) is seen at once, never taken for an old one.
  let seen = 0;
  for (;;) {
    Atomics.wait(control, slot + GO, seen);
    const job = Atomics.load(control, slot + GO);
    if (job === seen) continue;
    seen = job;
    if (control[slot + KERNEL] === QUIT) {
      self.close();
      return;
    }
    const first = control[slot + FIRST];
    const end = control[slot + END];
    const addresses = Array.from(control.subarray(slot + ADDRESSES, slot + ADDRESSES + control[slot + BUFFER_COUNT]));
    let status = 0;
    try {
      if (control[slot + OP] === COUNT_UNITS) {
        control[slot + RESULT] = exports[`k${control[slot + KERNEL]}_units`](control[slot + PARAMS]);
      } else {
        exports[`k${control[slot + KERNEL]}`](control[slot + PARAMS], first, end, control[slot + SCRATCH], ...addresses);
        Atomics.add(control, slot + UNITS_RUN, end - first);
      }
    } catch (error) {
      status = 1;
      const text = new TextEncoder().encode(String(error?.message ?? error)).subarray(0, MESSAGE_BYTES - 1);
      messages.fill(0, index * MESSAGE_BYTES, (index + 1) * MESSAGE_BYTES);
      messages.set(text, index * MESSAGE_BYTES);
    }
    control[slot + STATUS] = status;
    Atomics.store(control, slot + DONE, job); // publishes STATUS and the memory the kernel wrote
    Atomics.notify(control, slot + DONE); // wakes the page's Atomics.waitAsync (else it waits out its deadline)
  }
}
