// The host module's side of a run, step by step: what the driver (driver.js) asks of it.
//
// A run starts the host on the input shapes and gets a HostStep: the command list to carry
// out, the storage sizes and the params block it needs, and (once the list ends with the
// outputs) the output shapes. After a list that ends with a read, the value read back is
// handed over and the host resumed for the next step; after one that ends with a resume
// record, the host is resumed at once. HostSessions holds the session runs use and one per
// instance of a batch, each with its own host state across the rounds. The twin of
// relaxweb/runtime/host_session.py (docs/runtime-core.md, "Host steps"). No GPU here: a
// PageHost (page_host.js) runs these on the page's thread, each call under a time limit.

import { Host, OPCODE_DISPATCH, OPCODE_READ, OPCODE_RESUME, isSequence } from "./host.js";

/**
 * One command list of a run and what the host wrote with it. `outputShapes` and
 * `elementShapes` are only set on the last step (a list that ends neither with a read nor with
 * a resume; else empty): each output's shape (a sequence output's as the 1-D shape of its flat
 * values) and, per output, null or its elements' shapes (`{shapes: null}`: an optional
 * sequence that is none). `varValues`: the symbolic sizes by name, on a batch instance's steps
 * from startInstance (its messages name them).
 * @typedef {{commands: import("./host.js").Command[], sizes: number[], params: Uint8Array, outputShapes: number[][],
 *   elementShapes: ({shapes: number[][]|null}|null)[], varValues?: Record<string, number>}} HostStep
 */

/** The dispatch records of a step, in order. @param {HostStep} step @returns {import("./host.js").DispatchCommand[]} */
export function dispatchesOf(step) {
  return /** @type {import("./host.js").DispatchCommand[]} */ (step.commands.filter((command) => command.opcode === OPCODE_DISPATCH));
}

/** The read record that ends a step's list, or null. @param {HostStep} step @returns {import("./host.js").ReadCommand|null} */
export function readOf(step) {
  const last = step.commands[step.commands.length - 1];
  return last?.opcode === OPCODE_READ ? /** @type {import("./host.js").ReadCommand} */ (last) : null;
}

/** Whether a step's list ends with a resume record (a loop's iteration). @param {HostStep} step @returns {boolean} */
export function resumes(step) {
  return step.commands[step.commands.length - 1]?.opcode === OPCODE_RESUME;
}

/** Whether this is the run's last step (its list ends with the outputs). @param {HostStep} step @returns {boolean} */
export function finished(step) {
  return readOf(step) === null && !resumes(step);
}

/**
 * The host module's side of a run, in the few calls the browser runtime makes: one per load
 * setting and one per step. A Model talks to it through a PageHost (page_host.js), so that a
 * module that never returns is stopped.
 */
export class HostSession {
  /** @param {Host} host */
  constructor(host) {
    this.host = host;
  }

  /** @param {Record<string, number|null>} bounds @returns {{bounds: (number|null)[], sizesAtBounds: number[]|null}} */
  configure(bounds) {
    if (bounds) this.host.setBounds(bounds);
    return { bounds: this.host.varBounds(), sizesAtBounds: this.host.sizesAtBounds() };
  }

  /**
   * Run with these input shapes (and the element shapes of sequence inputs, by input index);
   * throws an InputShapeError when the host rejects them.
   * @param {number[][]} shapes @param {Record<number, number[][]|null>} [sequences]
   * @returns {HostStep}
   */
  start(shapes, sequences = {}) {
    for (const [k, elementShapes] of Object.entries(sequences)) {
      const spec = this.host.manifest.inputs[Number(k)];
      this.host.writeSequence(spec.name, spec.sequence, elementShapes);
    }
    this.host.runOrThrow(shapes);
    return this.step();
  }

  /**
   * Go on after a step: write the value read back (if the step read one) and resume.
   * @param {number|null} slot @param {number} value @returns {HostStep}
   */
  resume(slot, value) {
    if (slot !== null) this.host.writeReadValue(slot, value);
    this.host.resumeOrThrow();
    return this.step();
  }

  /** The host's current step. @returns {HostStep} */
  step() {
    const commands = this.host.commands();
    const step = { commands, sizes: this.host.storageSizes(), params: this.host.params(), outputShapes: [], elementShapes: [] };
    if (!finished(step)) return step;
    const outputShapes = this.host.outputShapes();
    // a sequence output is copied as one flat array of its elements' values, then split
    /** @type {({shapes: number[][]|null}|null)[]} */
    const elementShapes = this.host.manifest.outputs.map((/** @type {any} */ spec) =>
      isSequence(spec) ? { shapes: this.host.readSequence(spec.sequence, spec.kind === "optional_sequence") } : null);
    elementShapes.forEach((sequence, k) => {
      if (sequence) outputShapes[k] = [(sequence.shapes ?? []).reduce((total, shape) => total + shape.reduce((a, b) => a * b, 1), 0)];
    });
    return { ...step, outputShapes, elementShapes };
  }
}

/**
 * The host module's sessions of one model: the one its runs use, and one per instance of a
 * batch (model.runBatch), each created on first use from the same module with the model's
 * bounds, so that every instance has its own host state (its sizes, params, read values)
 * across the rounds of a batch. PageHost (page_host.js) holds them.
 */
export class HostSessions {
  /**
   * @param {BufferSource} wasmBytes @param {any} manifest
   * @param {WebAssembly.Imports} [imports] what every instance imports (an interruptible module's deadline)
   * @returns {Promise<HostSessions>}
   */
  static async instantiate(wasmBytes, manifest, imports = {}) {
    const module = await WebAssembly.compile(wasmBytes);
    const instance = await WebAssembly.instantiate(module, imports);
    return new HostSessions(module, manifest, new HostSession(new Host(instance, manifest)), imports);
  }

  /**
   * @param {WebAssembly.Module} module @param {any} manifest @param {HostSession} main
   * @param {WebAssembly.Imports} [imports]
   */
  constructor(module, manifest, main, imports = {}) {
    this.module = module;
    this.manifest = manifest;
    this.main = main;
    this.imports = imports;
    /** @type {Record<string, number|null>|null} the bounds option, given to every instance's session too */
    this.bounds = null;
    /** @type {HostSession[]} one per batch instance, by index */
    this.instances = [];
  }

  /** @param {Record<string, number|null>|null} bounds */
  configure(bounds) {
    const result = this.main.configure(/** @type {any} */ (bounds));
    this.bounds = bounds;
    return result;
  }

  /** @param {number[][]} shapes @param {Record<number, number[][]|null>} [sequences] */
  start(shapes, sequences) { return this.main.start(shapes, sequences); }

  /** @param {number|null} slot @param {number} value */
  resume(slot, value) { return this.main.resume(slot, value); }

  /**
   * Start batch instance `k` on its own session (created on first use): its first step, with
   * its symbolic sizes by name (`varValues`) for messages.
   * @param {number} k @param {number[][]} shapes @param {Record<number, number[][]|null>} [sequences]
   * @returns {Promise<HostStep & {varValues: Record<string, number>}>}
   */
  async startInstance(k, shapes, sequences) {
    if (!Number.isInteger(k) || k < 0) throw new Error(`no batch instance ${k}`);
    while (this.instances.length <= k) {
      const instance = await WebAssembly.instantiate(this.module, this.imports);
      const session = new HostSession(new Host(instance, this.manifest));
      if (this.bounds) session.configure(/** @type {any} */ (this.bounds));
      this.instances.push(session);
    }
    const step = this.instances[k].start(shapes, sequences);
    const names = this.manifest.symbolic_vars.map((/** @type {any} */ v) => v.name);
    const values = this.instances[k].host.varValues();
    return { ...step, varValues: Object.fromEntries(names.map((name, i) => [name, values[i]])) };
  }

  /** Go on with batch instance `k` (see HostSession.resume). @param {number} k @param {number|null} slot @param {number} value */
  resumeInstance(k, slot, value) {
    const session = this.instances[k];
    if (!session) throw new Error(`batch instance ${k} was not started`);
    return session.resume(slot, value);
  }
}
