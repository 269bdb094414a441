// Batches: many inputs of different sizes in one run (`model.runBatch`), the part that does
// not depend on the backend. The twin of relaxweb/runtime/batch.py (same names, camelCase;
// same messages): read that file's doc for the design.
//
// A batch runs every instance's host module on its own shapes, then proceeds in rounds: in
// each round every instance still running has a command list (the whole run, or the part
// before its next read), and the dispatches of all of them are merged (mergeDispatches) so
// that one dispatch of a kernel's ragged form (relaxweb/wgsl/ragged.py) serves every instance
// that runs that call site (planRound). Every storage holds each instance's slice one after
// another (SliceLayout), so the memory is the packed total, not the longest instance times the
// count. The rounds themselves are the driver's (driver.js, runBatchRounds).

import { InputShapeError } from "./host.js";
import { RunCheckError } from "./run_status.js";
import { evaluateTree } from "./profile.js";

/** Instances one ragged dispatch serves (wgsl/ragged.MAX_INSTANCES, the batch table's length). */
export const MAX_INSTANCES = 64;
/** Instances of one batch at most (each keeps a host module instance of its own). */
export const MAX_BATCH_INSTANCES = 1024;
/** Alignment of each instance's slice of a storage (minStorageBufferOffsetAlignment's default). */
export const SLICE_ALIGNMENT = 256;
/** Bytes of the batch table's header (the instance count, padded to 16). */
export const TABLE_HEADER_BYTES = 16;
/** Workgroups along one dimension of a grid (WebGPU's default limit). */
export const MAX_GRID_DIMENSION = 65535;

export const ONE_BY_ONE = "one by one";
export const RAGGED = "ragged";

/**
 * How the last batch ran (`model.lastBatch`).
 * `elements`: the output elements the ragged dispatches computed, summed over instances (each at
 * its own sizes); null where a kernel's count is not in the manifest or the instances ran one by one.
 * @typedef {{mode: "ragged"|"one by one", reason: string, instances: number, dispatches: number, rounds: number,
 *   elements?: number|null, varValues?: Record<string, number>[]}} BatchReport
 */

/**
 * Output elements of one call of a call site with an instance's params block (the kernel's
 * `elements` tree over its params fields), null where the manifest does not say.
 * @param {any} manifest @param {number} callSite @param {Uint8Array} params the instance's whole params block
 * @returns {number|null}
 */
export function callElements(manifest, callSite, params) {
  const site = manifest.call_sites[callSite];
  const kernel = manifest.kernels[site.kernel];
  if (kernel.elements === undefined) return null;
  const fields = new Int32Array(params.buffer.slice(params.byteOffset + site.params_offset,
    params.byteOffset + site.params_offset + site.params_size));
  const values = new Map((kernel.params ?? []).map((/** @type {string} */ name, /** @type {number} */ i) => [name, fields[i]]));
  return evaluateTree(kernel.elements, values);
}

/**
 * Why this bundle (and these inputs) cannot run as one ragged batch, or "".
 * @param {any} manifest
 * @param {Record<string, any>[]} instances
 * @returns {string}
 */
export function oneByOneReason(manifest, instances) {
  const missing = manifest.kernels.filter((/** @type {any} */ k) => !("batch_file" in k)).map((/** @type {any} */ k) => k.name);
  if (missing.length > 0) {
    return `kernel(s) ${missing.slice(0, 5).join(", ")}${missing.length > 5 ? " ..." : ""} have no ragged form`;
  }
  if ((manifest.caches ?? []).length > 0) return "the model keeps KV caches between runs";
  if ([...manifest.inputs, ...manifest.outputs].some((/** @type {any} */ e) => e.kind === "sequence" || e.kind === "optional_sequence")) {
    return "the model has sequence inputs or outputs";
  }
  for (const instance of instances) {
    if (instance === null || typeof instance !== "object") continue; // refused by the input checks
    if (Object.values(instance).some((value) => !isArray(value))) {
      return "an instance has an input that is not an array (a GpuTensor or a sequence)";
    }
  }
  return "";
}

/** @param {any} value @returns {boolean} an array `{data, shape}` (not a GpuTensor, a sequence or null) */
function isArray(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value)
    && value.constructor?.name !== "GpuTensor" && "data" in value && "shape" in value;
}

/**
 * `error` (an input check, the host module's refusal or a kernel's check) for instance `index`
 * of a batch: the same class (InputShapeError, RunCheckError, else Error), the message
 * prefixed with the instance.
 * @param {number} index @param {any} error @returns {Error}
 */
export function instanceError(index, error) {
  const message = `instance ${index} of the batch: ${error?.message ?? String(error)}`;
  if (error instanceof InputShapeError || error?.name === "InputShapeError") {
    return new InputShapeError(message, { code: error.code, value: error.value, expected: error.expected });
  }
  if (error instanceof RunCheckError) return new RunCheckError(message);
  return new Error(message);
}

/**
 * `byteSize` rounded up to a slice boundary (at least one slice: every instance's slice
 * starts on its own boundary, even an empty one).
 * @param {number} byteSize @returns {number}
 */
export function aligned(byteSize) {
  return Math.max(SLICE_ALIGNMENT, Math.ceil(byteSize / SLICE_ALIGNMENT) * SLICE_ALIGNMENT);
}

/** @param {number[][]} capacities @returns {number[][]} */
function prefixSums(capacities) {
  return capacities.map((row) => {
    let total = 0;
    return row.map((capacity) => {
      const start = total;
      total += capacity;
      return start;
    });
  });
}

/**
 * Where each instance's slice of each storage lies: `offsets[s][i]` and `capacities[s][i]`
 * bytes; `totals[s]` is the storage's packed size.
 */
export class SliceLayout {
  /** @param {number[][]} offsets @param {number[][]} capacities */
  constructor(offsets, capacities) {
    this.offsets = offsets;
    this.capacities = capacities;
  }

  /**
   * The packed layout of per-instance storage sizes (`sizes[i][s]`).
   * @param {number[][]} sizes @returns {SliceLayout}
   */
  static of(sizes) {
    const storages = sizes.length > 0 ? sizes[0].length : 0;
    const capacities = Array.from({ length: storages }, (_, s) => sizes.map((row) => aligned(row[s])));
    return new SliceLayout(prefixSums(capacities), capacities);
  }

  /** @returns {number[]} */
  get totals() {
    return this.capacities.map((row) => row.reduce((a, b) => a + b, 0));
  }

  /**
   * The layout after instances' storages grew to `sizes` (each slice keeps at least its
   * capacity) and the storages whose layout changed.
   * @param {number[][]} sizes @returns {[SliceLayout, number[]]}
   */
  grown(sizes) {
    const capacities = this.capacities.map((row, s) => sizes.map((instance, i) => Math.max(row[i], aligned(instance[s]))));
    const changed = capacities.flatMap((row, s) => (row.some((c, i) => c !== this.capacities[s][i]) ? [s] : []));
    return [new SliceLayout(prefixSums(capacities), capacities), changed];
  }
}

/**
 * How a message names storage `index`: the input or output it holds, else its role.
 * @param {any} manifest @param {number} index @returns {string}
 */
export function storageName(manifest, index) {
  for (const kind of ["input", "output"]) {
    for (const entry of manifest[`${kind}s`]) {
      if (entry.storage === index) return `${kind} '${entry.name}' (storage ${index})`;
    }
  }
  return `storage ${index} (${manifest.storages[index].role})`;
}

/**
 * Refuse a batch whose packed storage exceeds the device's buffer limit, naming the storage
 * and the instance that takes it past the limit, before any GPU work.
 * @param {any} manifest @param {SliceLayout} layout @param {number[][]} sizes
 * @param {Record<string, number>[]} varValues each instance's symbolic sizes, by name
 * @param {number} largest @param {string} limitName
 */
export function checkTotals(manifest, layout, sizes, varValues, largest, limitName) {
  layout.capacities.forEach((capacities, storage) => {
    let total = 0;
    capacities.forEach((capacity, instance) => {
      total += capacity;
      if (total > largest) {
        // the model's sizes (the host's own, for values read back, start with "_")
        const sizesText = Object.entries(varValues[instance]).filter(([name]) => !name.startsWith("_"))
          .map(([name, value]) => `${name} = ${value}`).join(", ");
        const all = capacities.reduce((a, b) => a + b, 0);
        throw new Error(
          `the batch is too large for this device: ${storageName(manifest, storage)} needs ${all} bytes for its ` +
          `${capacities.length} instances; instance ${instance} (${sizesText}; ${sizes[instance][storage]} bytes) takes it ` +
          `to ${total}, above the device's WebGPU limit ${limitName} = ${largest}. Split the batch.`,
        );
      }
    });
  });
}

/**
 * One round's dispatches of every instance (`lists`: instance -> its dispatches, in order) as
 * batched dispatches `[callSite, [[instance, dispatch], ...]]`.
 *
 * Each instance's own order is kept; instances do not depend on each other. Greedily, the
 * next batched dispatch is the call site that most instances run next, preferring one that no
 * other instance is still waiting to run later: where instances took different branches,
 * each branch's own dispatches run (per group) before the dispatches after the join, which
 * then run for all of them at once.
 * @template {{callSite: number}} D
 * @param {Map<number, D[]>} lists
 * @returns {[number, [number, D][]][]}
 */
export function mergeDispatches(lists) {
  /** @type {Map<number, number>} */
  const position = new Map([...lists.keys()].map((instance) => [instance, 0]));
  /** @type {[number, [number, D][]][]} */
  const merged = [];
  const at = (/** @type {number} */ instance) => /** @type {number} */ (position.get(instance));
  for (;;) {
    const live = [...lists.keys()].filter((instance) => at(instance) < /** @type {D[]} */ (lists.get(instance)).length);
    if (live.length === 0) return merged;
    /** @type {Map<number, number>} */
    const nextOf = new Map(live.map((instance) => [instance, /** @type {D[]} */ (lists.get(instance))[at(instance)].callSite]));
    const candidates = [...new Set(nextOf.values())].sort((a, b) => a - b);
    const waiting = (/** @type {number} */ callSite) => live.filter((instance) => nextOf.get(instance) !== callSite
      && /** @type {D[]} */ (lists.get(instance)).slice(at(instance) + 1).some((d) => d.callSite === callSite)).length;
    const score = (/** @type {number} */ callSite) =>
      [waiting(callSite) === 0 ? 1 : 0, [...nextOf.values()].filter((c) => c === callSite).length, -callSite];
    let chosen = candidates[0];
    let best = score(chosen);
    for (const candidate of candidates.slice(1)) {
      const s = score(candidate);
      if (s[0] > best[0] || (s[0] === best[0] && (s[1] > best[1] || (s[1] === best[1] && s[2] > best[2])))) {
        chosen = candidate;
        best = s;
      }
    }
    /** @type {[number, D][]} */
    const members = live.filter((instance) => nextOf.get(instance) === chosen)
      .map((instance) => [instance, /** @type {D[]} */ (lists.get(instance))[at(instance)]]);
    for (const [instance] of members) position.set(instance, at(instance) + 1);
    merged.push([chosen, members]);
  }
}

/**
 * `members` in runs of at most `size` (one ragged dispatch each).
 * @template T @param {T[]} members @param {number} [size] @returns {T[][]}
 */
export function chunks(members, size = MAX_INSTANCES) {
  const out = [];
  for (let start = 0; start < members.length; start += size) out.push(members.slice(start, start + size));
  return out;
}

/** vec4 rows of bases in a batch-table entry (wgsl/ragged.py). @param {number} bufferCount */
export function baseRows(bufferCount) {
  return Math.max(1, Math.ceil(bufferCount / 4));
}

/** Bytes of one instance's entry in a batch table: params, bases, first workgroup. @param {number} paramsSize @param {number} bufferCount */
export function instanceEntryBytes(paramsSize, bufferCount) {
  return paramsSize + 16 * baseRows(bufferCount) + 16;
}

/** Bytes of a whole batch table (the uniform binding is always this size). @param {number} paramsSize @param {number} bufferCount */
export function tableBytes(paramsSize, bufferCount) {
  return TABLE_HEADER_BYTES + MAX_INSTANCES * instanceEntryBytes(paramsSize, bufferCount);
}

/**
 * The batch table of one ragged dispatch: `entries` are, per instance, its params block (the
 * whole params of that instance; the call site's slot is taken from it), the byte offset of
 * its slice in each bound buffer, and its first workgroup.
 * @param {{params_offset: number, params_size: number, buffers: any[]}} callSite
 * @param {[Uint8Array, number[], number][]} entries
 * @returns {Uint8Array}
 */
export function batchTable(callSite, entries) {
  const paramsSize = callSite.params_size;
  const bufferCount = callSite.buffers.length;
  const rows = baseRows(bufferCount);
  const out = new Uint8Array(tableBytes(paramsSize, bufferCount));
  const view = new DataView(out.buffer);
  view.setInt32(0, entries.length, true);
  const step = instanceEntryBytes(paramsSize, bufferCount);
  entries.forEach(([params, bases, firstGroup], index) => {
    const at = TABLE_HEADER_BYTES + index * step;
    out.set(params.subarray(callSite.params_offset, callSite.params_offset + paramsSize), at);
    bases.forEach((base, b) => view.setInt32(at + paramsSize + 4 * b, base, true));
    view.setInt32(at + paramsSize + 16 * rows, firstGroup, true);
  });
  return out;
}

/**
 * The 2-D grid of `workgroups` workgroups (the kernels number them `y * xCount + x`).
 * @param {number} workgroups @param {string} callSiteText @returns {[number, number, number]}
 */
export function gridOf(workgroups, callSiteText) {
  if (workgroups > MAX_GRID_DIMENSION * MAX_GRID_DIMENSION) {
    throw new Error(
      `the batch is too large for this device: ${callSiteText} needs ${workgroups} workgroups, ` +
      `above ${MAX_GRID_DIMENSION} x ${MAX_GRID_DIMENSION}. Split the batch.`,
    );
  }
  if (workgroups <= MAX_GRID_DIMENSION) return [Math.max(workgroups, 1), 1, 1];
  const rows = Math.ceil(workgroups / MAX_GRID_DIMENSION);
  return [Math.ceil(workgroups / rows), rows, 1];
}

/**
 * One dispatch of a kernel's ragged form in a round: the call site, the instances it serves
 * with each one's own dispatch record, their workgroups in all and the 2-D grid.
 * @typedef {{callSite: number, members: [number, import("./host.js").DispatchCommand][], workgroups: number,
 *   grid: [number, number, number]}} RaggedDispatch
 */

/**
 * A round's ragged dispatches: the instances' dispatch lists merged (mergeDispatches), each
 * merged call site cut in chunks of MAX_INSTANCES, each chunk's grid checked (gridOf) before
 * any GPU work.
 * @param {any} manifest @param {Map<number, import("./host.js").DispatchCommand[]>} lists instance -> its dispatches
 * @returns {RaggedDispatch[]}
 */
export function planRound(manifest, lists) {
  /** @type {RaggedDispatch[]} */
  const planned = [];
  for (const [callSite, members] of mergeDispatches(lists)) {
    const text = `call site ${callSite} (${String(manifest.call_sites[callSite].binding).slice(0, 80)})`;
    for (const chunk of chunks(members)) {
      const workgroups = chunk.reduce((total, [, { workgroups: [x, y, z] }]) => total + x * y * z, 0);
      planned.push({ callSite, members: chunk, workgroups, grid: gridOf(workgroups, text) });
    }
  }
  return planned;
}

/**
 * callElements, remembered by call site and params slot: a batch evaluates it for every
 * instance of every ragged dispatch, and the same sizes come back batch after batch.
 */
export class ElementCounts {
  /** @param {any} manifest */
  constructor(manifest) {
    this.manifest = manifest;
    /** @type {Map<string, number|null>} */
    this.counts = new Map();
  }

  /**
   * Output elements of one call of a call site with this (whole) params block.
   * @param {number} callSite @param {Uint8Array} params @returns {number|null}
   */
  of(callSite, params) {
    const site = this.manifest.call_sites[callSite];
    const key = `${callSite}:${params.subarray(site.params_offset, site.params_offset + site.params_size).join(",")}`;
    let count = this.counts.get(key);
    if (count === undefined) {
      count = callElements(this.manifest, callSite, params);
      this.counts.set(key, count);
    }
    return count;
  }
}

/**
 * Add one dispatch's output elements to a batch's count: null once any is unknown.
 * @param {BatchReport} report @param {number|null} count
 */
export function addElements(report, count) {
  report.elements = count === null || report.elements === null || report.elements === undefined ? null : report.elements + count;
}

/**
 * Refuse a `runBatch` argument that is not an array of input objects.
 * @param {any} instances
 */
export function checkInstances(instances) {
  if (!Array.isArray(instances)) throw new Error(`runBatch takes an array of inputs (one object per instance), got ${typeof instances}`);
  if (instances.length > MAX_BATCH_INSTANCES) {
    throw new Error(`a batch has at most ${MAX_BATCH_INSTANCES} instances (each keeps a host module instance), ` +
      `got ${instances.length}: split the batch`);
  }
  instances.forEach((inputs, k) => {
    if (inputs === null || typeof inputs !== "object" || Array.isArray(inputs)) {
      throw new InputShapeError(`instance ${k} of the batch: its inputs must be an object of name -> {data, shape}`);
    }
  });
}
