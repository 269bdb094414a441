// The host-program driver: "One run" of docs/bundle-format.md, written once for every backend.
//
// A run starts the host module on the input shapes and carries out its command lists one stage
// at a time: the stage's params, its dispatches, then a read back (its value handed to the host,
// which resumes), a resume, or the end; storages grow between two stages keeping their
// contents; the last stage ends with the outputs. A batch does the same in rounds, for every
// instance at once (batch.js). How each state is done on a device is the backend's: WebGPU
// (webgpu_backend.js, webgpu_batch.js) or kernels.wasm (wasm_backend.js), each behind a
// RunBackend (and a RaggedBatchBackend for ragged batches). The twin of
// relaxweb/runtime/driver.py, with the same states and names (docs/runtime-core.md).
//
// Runs take turns (`turn`): a run that reads values back keeps its state in the host module
// (and in the backend) across awaits, so the next run starts once this one's last submit is
// done; it may then start while this one maps its outputs.

import { ONE_BY_ONE, RAGGED, ElementCounts, addElements, instanceError, planRound } from "./batch.js";
import { dispatchesOf, finished, readOf, resumes } from "./host_session.js";
import { summarize } from "./profile.js";
import { RunCheckError } from "./run_status.js";

/**
 * @typedef {import("./host_session.js").HostStep} HostStep
 * @typedef {import("./host.js").DispatchCommand} DispatchCommand
 * @typedef {import("./host.js").ReadCommand} ReadCommand
 * @typedef {import("./batch.js").BatchReport} BatchReport
 * @typedef {import("./batch.js").RaggedDispatch} RaggedDispatch
 */

/**
 * A run's inputs after the checks, before any device work: what the host takes (the input
 * shapes, `[]` for a sequence input; the element shapes of sequence inputs by input index,
 * null for none); the rest is the backend's own.
 * @typedef {{shapes: number[][], sequences: Record<number, number[][]|null>}} PreparedRun
 */

/**
 * A run up to its last submit: what readOutputs needs, and its counts.
 * @typedef {{readback: any, dispatches: number, reads: number}} FinishedRun
 */

/**
 * Times each dispatch of a profiled run (webgpu_timers.js, profile.js's WallClockTimer); the
 * backend's encodeDispatches calls its own hook.
 * @typedef {{method: string, times(): Promise<import("./profile.js").DispatchTime[]>}} DispatchTimer
 */

/**
 * What a device does in each state of a run (docs/runtime-core.md, "The backend interface").
 * Every method is called by the driver only; one that returns a promise is awaited.
 * @typedef {Object} RunBackend
 * @property {any} manifest the bundle's manifest
 * @property {(inputs: Record<string, any>, keepOnGpu: boolean|string[]) => PreparedRun} prepareRun
 *   check the inputs against the manifest (and GpuTensors, kept outputs), convert them to device dtypes; no device work
 * @property {() => void} beginRun the run's turn has come: refuse when the model cannot run any more, start the run's counts
 * @property {(instances: Record<string, any>[]) => string} oneByOneReason why a batch runs instance by instance ("" = ragged)
 * @property {() => RaggedBatchBackend} raggedBatch the batch backend (only asked for when the reason is "")
 * @property {(commands: import("./host.js").Command[]) => void} checkCommands refuse what this device cannot run before any work
 * @property {(sizes: number[], keepContents: boolean) => void} prepareStorages every storage at least `sizes` bytes;
 *   between two steps (`keepContents`) the contents carry over
 * @property {(run: PreparedRun) => void} writeInputs the run's inputs into their storages
 * @property {(params: Uint8Array) => void} beginStep start a stage: its params block in place
 * @property {(dispatches: DispatchCommand[], params: Uint8Array, timer: DispatchTimer|null) => void|Promise<void>} encodeDispatches
 *   run or encode the stage's dispatches in order, each timed by `timer` when one is given
 * @property {(read: ReadCommand) => number|Promise<number>} readValue end the stage reading the i32 a read record names
 * @property {() => void|Promise<void>} submit end a stage that resumes without a read
 * @property {(run: PreparedRun, step: HostStep) => any} submitOutputs end the last stage (the run's last submit);
 *   returns what readOutputs needs
 * @property {(readback: any) => Record<string, any>|Promise<Record<string, any>>} readOutputs the outputs by name
 * @property {() => void} releaseRun destroy what the run kept past its submits (in its turn: after its last submit, or on an error)
 * @property {() => DispatchTimer|Promise<DispatchTimer>} createTimer a timer for profile
 */

/**
 * What a device does in each state of a ragged batch (WebGPU only: webgpu_batch.js).
 * @typedef {Object} RaggedBatchBackend
 * @property {(inputs: Record<string, any>) => PreparedRun} prepareInstance an instance's inputs checked and converted
 * @property {(sizes: number[][], varValues: Record<string, number>[]) => void} layOut the packed slice layout of every
 *   instance's first step, totals checked against the device's buffer limit; no device work (the batch's state starts here)
 * @property {(runs: PreparedRun[]) => Promise<void>} writeInputs packed storages and each instance's inputs in its slices
 * @property {() => void} beginRound a new round (first copying each slice of the storages growSlices moved)
 * @property {(plan: RaggedDispatch[], live: Map<number, HostStep>) => number} encodeRound the plan's ragged dispatches;
 *   returns how many it encoded
 * @property {(k: number, step: HostStep) => any} finishInstance an instance whose list ends with its outputs:
 *   what readBatchOutputs needs of it
 * @property {(reads: Map<number, ReadCommand>) => Promise<Map<number, number>>} readValues end the round: its submit,
 *   and the values the reading instances read
 * @property {(sizes: number[][], varValues: Record<string, number>[]) => void} growSlices the layout grown to `sizes`,
 *   totals checked, storages that changed reallocated
 * @property {(readbacks: any[]) => Promise<Record<string, any>[]>} readBatchOutputs every instance's outputs, in order
 * @property {() => void} releaseBatch after an error from layOut on (in the batch's turn): destroy what the rounds left
 */

/** Runs a bundle's host program on one backend: single runs, profiled runs and batches. */
export class HostProgramDriver {
  /**
   * @param {RunBackend} backend
   * @param {import("./page_host.js").PageHost} host the host module's sessions (on the page's thread, page_host.js)
   */
  constructor(backend, host) {
    this.backend = backend;
    this.host = host;
    this.manifest = backend.manifest;
    /** Dispatches of the last run, over all its steps. */
    this.lastDispatchCount = 0;
    /** Values the last run read back (0 for bundles without reads). */
    this.lastReadCount = 0;
    /** How the last runBatch ran. @type {BatchReport|null} */
    this.lastBatch = null;
    /**
     * Resolves when the run in progress no longer needs the host module (its last submit is
     * done): runs take turns.
     * @type {Promise<void>}
     */
    this.turn = Promise.resolve();
    this.elementCounts = new ElementCounts(this.manifest);
  }

  /**
   * `work` once the previous run's turn is over, as this run's turn.
   * @template T @param {() => Promise<T>} work @returns {Promise<T>}
   */
  async inTurn(work) {
    const previous = this.turn;
    /** @type {() => void} */
    let endTurn = () => {};
    this.turn = new Promise((resolve) => { endTurn = resolve; });
    try {
      await previous;
      this.backend.beginRun();
      return await work();
    } finally {
      endTurn();
    }
  }

  // Single runs -------------------------------------------------------------------------------

  /**
   * One run of `inputs`: its outputs by name.
   * @param {Record<string, any>} inputs
   * @param {{keepOnGpu?: boolean|string[], timer?: DispatchTimer|null}} [options]
   * @returns {Promise<Record<string, any>>}
   */
  async run(inputs, { keepOnGpu = false, timer = null } = {}) {
    // Checked and copied now: a run may wait for earlier ones, and what it uses then must be
    // what was checked, whatever the caller does to its arrays meanwhile.
    const run = this.backend.prepareRun(inputs, keepOnGpu);
    const { readback } = await this.inTurn(() => this.runSteps(run, timer));
    return this.backend.readOutputs(readback);
  }

  /**
   * A prepared run from the host's start to its last submit (in its turn).
   * @param {PreparedRun} run @param {DispatchTimer|null} [timer]
   * @returns {Promise<FinishedRun>}
   */
  async runSteps(run, timer = null) {
    const { backend, host } = this;
    try {
      let step = await host.start(run.shapes, run.sequences);
      backend.checkCommands(step.commands);
      backend.prepareStorages(step.sizes, false); // nothing of this run is on the device yet
      backend.writeInputs(run);
      let dispatches = 0;
      let reads = 0;
      for (;;) {
        const stage = dispatchesOf(step);
        backend.beginStep(step.params);
        const encoding = backend.encodeDispatches(stage, step.params, timer);
        if (encoding) await encoding; // WebGPU, while pipelines compile (an await of nothing costs every stage a tick)
        dispatches += stage.length;
        const read = readOf(step);
        if (read) {
          const value = await backend.readValue(read);
          reads += 1;
          step = await host.resume(read.slot, value);
        } else if (resumes(step)) {
          await backend.submit();
          step = await host.resume(null, 0);
        } else {
          break;
        }
        backend.checkCommands(step.commands);
        backend.prepareStorages(step.sizes, true);
      }
      const submitted = backend.submitOutputs(run, step);
      const readback = submitted instanceof Promise ? await submitted : submitted;
      this.lastDispatchCount = dispatches;
      this.lastReadCount = reads;
      return { readback, dispatches, reads };
    } finally {
      backend.releaseRun();
    }
  }

  /**
   * `warmup` runs, then one with every dispatch timed: its outputs and its profile.
   * @param {Record<string, any>} inputs @param {number} warmup
   * @returns {Promise<{outputs: Record<string, any>, profile: import("./profile.js").Profile}>}
   */
  async profile(inputs, warmup) {
    for (let i = 0; i < warmup; i++) await this.run(inputs);
    const timer = await this.backend.createTimer();
    const outputs = await this.run(inputs, { timer });
    return { outputs, profile: summarize(this.manifest, await timer.times(), timer.method) };
  }

  // Batches -----------------------------------------------------------------------------------

  /**
   * Each instance's outputs, in order, and how the batch ran (`lastBatch`): as one ragged
   * batch, or one instance after another where the backend says why. Every instance's inputs
   * are checked and its host module run before any device work: an error names the instance.
   * @param {Record<string, any>[]} instances
   * @returns {Promise<Record<string, any>[]>}
   */
  async runBatch(instances) {
    const reason = this.backend.oneByOneReason(instances);
    if (reason) return this.runOneByOne(instances, reason);
    if (instances.length === 0) {
      await this.inTurn(async () => {});
      this.lastBatch = { mode: RAGGED, reason: "", instances: 0, dispatches: 0, rounds: 0, varValues: [] };
      return [];
    }
    const batch = this.backend.raggedBatch();
    const runs = instances.map((inputs, k) => {
      try {
        return batch.prepareInstance(inputs);
      } catch (error) {
        throw instanceError(k, error);
      }
    });
    /** @type {BatchReport} */
    const report = { mode: RAGGED, reason: "", instances: instances.length, dispatches: 0, rounds: 0, elements: 0, varValues: [] };
    try {
      const readbacks = await this.inTurn(() => this.runBatchRounds(batch, runs, report));
      this.lastBatch = report;
      return await batch.readBatchOutputs(readbacks);
    } catch (error) {
      if (error instanceof RunCheckError) throw await this.instanceOfCheck(instances, error);
      throw error;
    }
  }

  /**
   * The error of a kernel's check in a ragged batch, naming the instance: the run status holds
   * the node and the values but not which instance's rows failed, so the instances run again
   * one at a time (runOneByOne, whose errors name the instance) until one fails (an error path
   * only); `error` itself if none does alone.
   * @param {Record<string, any>[]} instances @param {RunCheckError} error @returns {Promise<Error>}
   */
  async instanceOfCheck(instances, error) {
    try {
      await this.runOneByOne(instances, "a kernel's check failed in the merged batch: the instances ran again one by one");
    } catch (named) {
      if (named instanceof RunCheckError) return named;
      throw named;
    }
    return error;
  }

  /**
   * Each instance in a run of its own (its errors name it), its dispatches and rounds counted.
   * @param {Record<string, any>[]} instances @param {string} reason
   * @returns {Promise<Record<string, any>[]>}
   */
  async runOneByOne(instances, reason) {
    const outputs = [];
    let dispatches = 0;
    let rounds = 0;
    for (const [k, inputs] of instances.entries()) {
      try {
        outputs.push(await this.run(inputs));
      } catch (error) {
        throw instanceError(k, error);
      }
      dispatches += this.lastDispatchCount;
      rounds += 1 + this.lastReadCount;
    }
    this.lastBatch = { mode: ONE_BY_ONE, reason, instances: instances.length, dispatches, rounds, elements: null };
    return outputs;
  }

  /**
   * A ragged batch up to its last round (in its turn): every instance started (nothing on the
   * device yet), the packed layout checked, then rounds of the live instances' merged
   * dispatches; returns what readBatchOutputs needs of each instance.
   * @param {RaggedBatchBackend} batch @param {PreparedRun[]} runs @param {BatchReport} report
   * @returns {Promise<any[]>}
   */
  async runBatchRounds(batch, runs, report) {
    /** @type {HostStep[]} every instance's latest step */
    const steps = [];
    for (const [k, { shapes, sequences }] of runs.entries()) {
      try {
        steps.push(await this.host.startInstance(k, shapes, sequences));
      } catch (error) {
        throw instanceError(k, error);
      }
    }
    const varValues = steps.map((step) => step.varValues ?? {});
    report.varValues = varValues;
    batch.layOut(steps.map((step) => [...step.sizes]), varValues); // the batch's device state starts here
    try {
      return await this.rounds(batch, runs, steps, varValues, report);
    } catch (error) {
      batch.releaseBatch();
      throw error;
    }
  }

  /**
   * The rounds of a batch laid out: the live instances' merged dispatches, their reads, their
   * resumes, the slices grown, until every instance has its outputs.
   * @param {RaggedBatchBackend} batch @param {PreparedRun[]} runs @param {HostStep[]} steps every instance's first step
   * @param {Record<string, number>[]} varValues @param {BatchReport} report
   * @returns {Promise<any[]>} what readBatchOutputs needs of each instance
   */
  async rounds(batch, runs, steps, varValues, report) {
    let live = new Map(steps.map((step, k) => [k, step]));
    let plan = this.plan(live);
    await batch.writeInputs(runs);
    /** @type {any[]} */
    const readbacks = new Array(steps.length);
    while (live.size > 0) {
      report.rounds += 1;
      batch.beginRound();
      for (const { callSite, members } of plan) {
        for (const [k] of members) addElements(report, this.elementCounts.of(callSite, /** @type {HostStep} */ (live.get(k)).params));
      }
      report.dispatches += batch.encodeRound(plan, live);
      /** @type {Map<number, ReadCommand>} */
      const reads = new Map();
      for (const [k, step] of live) {
        const read = readOf(step);
        if (read) reads.set(k, read);
        else if (finished(step)) readbacks[k] = batch.finishInstance(k, step);
      }
      const values = await batch.readValues(reads);
      live = await this.resumed(live, values);
      for (const [k, step] of live) steps[k] = step;
      if (live.size > 0) {
        plan = this.plan(live);
        batch.growSlices(steps.map((step) => [...step.sizes]), varValues);
      }
    }
    return readbacks;
  }

  /** A round's plan: the live instances' dispatches. @param {Map<number, HostStep>} live @returns {RaggedDispatch[]} */
  plan(live) {
    return planRound(this.manifest, new Map([...live].map(([k, step]) => [k, dispatchesOf(step)])));
  }

  /**
   * The next step of each live instance that read a value or resumes (its errors name it).
   * @param {Map<number, HostStep>} live @param {Map<number, number>} values
   * @returns {Promise<Map<number, HostStep>>}
   */
  async resumed(live, values) {
    /** @type {Map<number, HostStep>} */
    const next = new Map();
    for (const [k, step] of live) {
      if (finished(step)) continue; // its outputs are copied
      const read = readOf(step);
      try {
        next.set(k, await this.host.resumeInstance(k, read ? read.slot : null, values.get(k) ?? 0));
      } catch (error) {
        throw instanceError(k, error);
      }
    }
    return next;
  }
}
