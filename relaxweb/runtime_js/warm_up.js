// Kernels compiled for speed before the first run: the wasm backend calls every kernel of
// kernels.wasm at load, with no units, until the engine has compiled it with its optimizing
// compiler. By default only for models of WARM_UP_MIN_WEIGHT_BYTES of weights and more (the
// `warmUp` load option decides otherwise): a small model's first run is short anyway, and
// compiling all its kernels for speed costs more CPU than it saves.
//
// Why: V8 (Chromium, Node) compiles a module's functions first with its baseline compiler
// (Liftoff) and recompiles a function with its optimizing one (TurboFan) once the function
// has run enough, counted as code executed ("dynamic tiering"); the new code is used from
// the function's next call on. A kernel call runs all of its units in one call, so each
// kernel's first call ran entirely in baseline code, 2-4x slower than later calls: the first
// run of a model took 1.3-3.6x its later runs (docs/benchmarks.md, "First runs"). A call with
// no units (first = end = 0) runs only the kernel's prologue; a few thousand of them spend the
// budget, and the optimized code is compiled in the background while the load goes on (on the
// page's thread the load then waits for the next task, afterTierUp, before it resolves).
//
// The calls read the params block of the kernel's first call site, filled with ones for the
// call (size variables of 1: no division by zero) and zeroed again after; every buffer
// address is 0, in the reserved bytes [0, 65536) that are never a buffer, and no unit runs,
// so nothing outside those bytes is written (tests/runtime_js/wasm_backend.test.js checks the
// memory). A kernel that traps on these sizes is left to its first run. The calls stop after
// WARM_UP_BUDGET_MS in all. On the page's thread the interruptible module enforces that as a
// deadline; on a cross-origin isolated page the pool's leader worker makes the calls before it
// reports ready, and a leader that has not reported within WARM_UP_GRACE_MS more is
// terminated and the pool started again without them (a module that loops then fails its
// first run at its deadline, as before). The workers share the module, and with it the
// optimized code. Other engines (Firefox's baseline and Ion tiers, Safari's) also compile hot
// functions again, which these calls make hot; wasmtime (Python) compiles ahead of time and
// needs none of this.

/** Calls with no units per kernel: enough for Chromium 156's V8 to tier every kernel of the benchmark models up. */
export const WARM_UP_CALLS = 3000;
/** The most the warm-up may take at load, in all (ms): the kernels after it are left to their first run. */
export const WARM_UP_BUDGET_MS = 300;
/** How long past the budget the page waits for the pool's leader to finish its warm-up (ms). */
export const WARM_UP_GRACE_MS = 2000;
/**
 * The weight bytes from which a model is warmed up by default (the `warmUp` load option): the
 * warm-up has every kernel compiled with the optimizing compiler, which a small model's short
 * first run would mostly not have needed (not measured: a CI run with the warm-up on every
 * model and one with this default took the same CPU time, 25 minutes, on a busy machine).
 */
export const WARM_UP_MIN_WEIGHT_BYTES = 4 << 20;

/**
 * Resolves on the next task of the event loop: the load awaits it after the warm-up calls.
 * The calls start the engine's optimizing compiles, which finish in the background; without
 * this, the first run started at once and its first kernel ran in baseline code (ResNet-50
 * in Node: its 7x7 convolution took 48-56 ms in the first run against 7.5 after; with this,
 * 9.2-13.4 ms in three loads).
 * @returns {Promise<void>}
 */
export function afterTierUp() {
  return new Promise((resolve) => { setTimeout(resolve, 0); });
}

/**
 * The `warmUp` load option checked: true, false or left out.
 * @param {unknown} option
 */
export function checkWarmUp(option) {
  if (option !== undefined && typeof option !== "boolean") {
    throw new Error(`warmUp must be true or false (or left out: models of ${WARM_UP_MIN_WEIGHT_BYTES >> 20} MiB of weights and more), ` +
      `got ${String(option).slice(0, 40)}`);
  }
}

/**
 * Whether a model is warmed up at load: the `warmUp` load option, by default (undefined) when
 * its weights hold at least WARM_UP_MIN_WEIGHT_BYTES.
 * @param {any} manifest @param {boolean|undefined} option
 * @returns {boolean}
 */
export function warmsUp(manifest, option) {
  checkWarmUp(option);
  if (option !== undefined) return option;
  return manifest.weights.reduce((/** @type {number} */ sum, /** @type {any} */ w) => sum + w.nbytes, 0) >= WARM_UP_MIN_WEIGHT_BYTES;
}

/**
 * Where each kernel's warm-up calls read their params: the block of its first call site, as
 * i32 word indices [first, end) of the memory, by kernel (kernels without a call site have none).
 * @param {any} manifest the bundle's manifest (its call_sites) @param {number} paramsBase the params region's address
 * @returns {{kernel: number, first: number, end: number}[]}
 */
export function warmUpBlocks(manifest, paramsBase) {
  /** @type {Map<number, {kernel: number, first: number, end: number}>} */
  const blocks = new Map();
  for (const site of manifest.call_sites) {
    if (blocks.has(site.kernel)) continue;
    const first = (paramsBase + site.params_offset) >> 2;
    blocks.set(site.kernel, { kernel: site.kernel, first, end: first + (site.params_size >> 2) });
  }
  return [...blocks.values()].sort((a, b) => a.kernel - b.kernel);
}

/**
 * Call each kernel of `blocks` WARM_UP_CALLS times with no units (see the file's comment);
 * `startClock(ms)`, where the calls can be stopped (the page's thread's interruptible module),
 * gives them the rest of the budget as their deadline.
 * @param {(k: number) => Function} kernel kernel k's function (kK)
 * @param {{kernel: number, first: number, end: number}[]} blocks warmUpBlocks
 * @param {Int32Array} words the memory as i32 (the params region is zero at load)
 * @param {(ms: number) => void} [startClock]
 * @returns {{kernels: number, ms: number}} the kernels warmed and the time taken
 */
export function warmUpKernels(kernel, blocks, words, startClock = () => {}) {
  const started = performance.now();
  const left = () => WARM_UP_BUDGET_MS - (performance.now() - started);
  let warmed = 0;
  for (const { kernel: k, first, end } of blocks) {
    if (left() <= 0) break;
    const main = kernel(k);
    const addresses = new Array(Math.max(0, main.length - 3)).fill(0); // scratch, buffers, status: all 0
    words.fill(1, first, end);
    startClock(left());
    try {
      for (let call = 0; call < WARM_UP_CALLS; call++) main(first << 2, 0, 0, ...addresses);
      warmed += 1;
    } catch {
      // sizes of 1 made it trap, or the budget's deadline passed (the loop ends): its first run compiles it as before
    } finally {
      words.fill(0, first, end);
    }
  }
  return { kernels: warmed, ms: performance.now() - started };
}
