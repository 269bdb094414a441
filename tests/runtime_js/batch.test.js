// Node tests of relaxweb/runtime_js/batch.js beyond the conformance corpus (the layouts, merges,
// tables, grids, totals and batch modes both runtimes share are its cases: conformance.test.js):
// the plan of a round, the element counts, the names in messages and the refusals of runBatch.

import { test } from "node:test";
import assert from "node:assert/strict";

import {
  MAX_BATCH_INSTANCES, MAX_INSTANCES, ElementCounts, addElements, aligned, checkInstances, chunks, instanceError, planRound, storageName,
} from "../../relaxweb/runtime_js/batch.js";
import { InputShapeError } from "../../relaxweb/runtime_js/host.js";

const MANIFEST = {
  kernels: [
    { name: "k0", batch_file: "kernels/k0.batch.wgsl", params: ["n"], elements: ["mul", "n", 2] },
    { name: "k1", batch_file: "kernels/k1.batch.wgsl" },
  ],
  call_sites: [
    { kernel: 0, binding: "y = k0(x)", params_offset: 0, params_size: 16, buffers: [] },
    { kernel: 1, binding: `z = k1(${"y, ".repeat(40)}y)`, params_offset: 256, params_size: 16, buffers: [] },
  ],
  inputs: [{ name: "x", storage: 0 }],
  outputs: [{ name: "y", storage: 2 }],
  storages: [{ role: "input" }, { role: "intermediate" }, { role: "output" }],
};

/** A dispatch record of call site `callSite` over `groups` workgroups. @param {number} callSite @param {number} groups */
const dispatch = (callSite, groups) => ({ opcode: /** @type {1} */ (1), callSite, workgroups: /** @type {[number, number, number]} */ ([groups, 1, 1]) });

test("aligned: slices of 256 bytes, at least one", () => {
  assert.deepEqual([0, 1, 255, 256, 257, 1000].map(aligned), [256, 256, 256, 256, 512, 1024]);
});

test("planRound: each merged call site in chunks of MAX_INSTANCES, their workgroups summed into one grid", () => {
  const lists = new Map(Array.from({ length: MAX_INSTANCES + 2 }, (_, k) => [k, [dispatch(0, k), dispatch(1, 70000)]]));
  const plan = planRound(MANIFEST, lists);
  assert.deepEqual(plan.map(({ callSite, members }) => [callSite, members.length]), [[0, MAX_INSTANCES], [0, 2], [1, MAX_INSTANCES], [1, 2]]);
  assert.equal(plan[0].workgroups, (MAX_INSTANCES * (MAX_INSTANCES - 1)) / 2);
  assert.deepEqual(plan[1].members.map(([k]) => k), [MAX_INSTANCES, MAX_INSTANCES + 1]);
  assert.deepEqual(plan[3].grid, [46667, 3, 1]); // 140000 workgroups in 3 rows of at most 65535
  assert.deepEqual(planRound(MANIFEST, new Map([[0, [dispatch(0, 0)]]])).map(({ workgroups, grid }) => [workgroups, grid]), [[0, [1, 1, 1]]]);
});

test("planRound refuses a ragged dispatch past 65535 x 65535 workgroups, naming the call site and its binding", () => {
  const lists = new Map([[0, [dispatch(1, 65535 * 65535)]], [1, [dispatch(1, 1)]]]);
  assert.throws(() => planRound(MANIFEST, lists), {
    message: `the batch is too large for this device: call site 1 (${MANIFEST.call_sites[1].binding.slice(0, 80)}) needs ` +
      `${65535 * 65535 + 1} workgroups, above 65535 x 65535. Split the batch.`,
  });
});

test("ElementCounts evaluates a kernel's elements tree over the call site's params slot, once per slot; addElements sums them", () => {
  const counts = new ElementCounts(MANIFEST);
  const params = new Uint8Array(512);
  new DataView(params.buffer).setInt32(0, 21, true);
  assert.equal(counts.of(0, params), 42);
  assert.equal(counts.counts.size, 1);
  params[300] = 7; // another call site's slot: the same count
  assert.equal(counts.of(0, params), 42);
  assert.equal(counts.counts.size, 1);
  assert.equal(counts.of(1, params), null); // k1 has no elements tree
  const report = { mode: /** @type {"ragged"} */ ("ragged"), reason: "", instances: 2, dispatches: 0, rounds: 0, elements: /** @type {number|null} */ (0) };
  addElements(report, 42);
  addElements(report, 8);
  assert.equal(report.elements, 50);
  addElements(report, null);
  addElements(report, 8);
  assert.equal(report.elements, null);
});

test("storageName names the input or output a storage holds, else its role", () => {
  assert.equal(storageName(MANIFEST, 0), "input 'x' (storage 0)");
  assert.equal(storageName(MANIFEST, 1), "storage 1 (intermediate)");
  assert.equal(storageName(MANIFEST, 2), "output 'y' (storage 2)");
});

test("instanceError keeps InputShapeError and prefixes the instance", () => {
  const error = instanceError(3, new InputShapeError("input 'x': dimension 0 (n) is 20, above its bound n <= 16", { code: 2, value: 20, expected: 16 }));
  assert.ok(error instanceof InputShapeError);
  assert.equal(error.message, "instance 3 of the batch: input 'x': dimension 0 (n) is 20, above its bound n <= 16");
  assert.equal(error.value, 20);
  const other = instanceError(0, new Error("boom"));
  assert.ok(!(other instanceof InputShapeError));
  assert.equal(other.message, "instance 0 of the batch: boom");
  assert.deepEqual(chunks([1, 2, 3, 4, 5], 2), [[1, 2], [3, 4], [5]]);
});

test("a batch of more instances than a runtime keeps host modules for is refused, and inputs that are not objects", () => {
  const many = Array.from({ length: MAX_BATCH_INSTANCES + 1 }, () => ({}));
  assert.throws(() => checkInstances(many), new RegExp(`at most ${MAX_BATCH_INSTANCES} instances.*got ${MAX_BATCH_INSTANCES + 1}`));
  checkInstances(many.slice(1));
  assert.throws(() => checkInstances({}), /runBatch takes an array of inputs/);
  assert.throws(() => checkInstances([{}, null]),
    (error) => error instanceof InputShapeError && error.message === "instance 1 of the batch: its inputs must be an object of name -> {data, shape}");
});
