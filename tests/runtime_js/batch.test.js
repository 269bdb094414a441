// Node tests of relaxweb/runtime_js/batch.js, the twin of relaxweb/runtime/batch.py: its pure
// functions on small cases, and the same cases through the Python functions (the merge of
// dispatches, batch tables, layouts and messages must be the same in both runtimes).

import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";

import {
  MAX_BATCH_INSTANCES, MAX_INSTANCES, SliceLayout, checkInstances, aligned, batchTable, checkTotals, chunks, gridOf, instanceError, mergeDispatches,
  oneByOneReason, storageName, tableBytes,
} from "../../relaxweb/runtime_js/batch.js";
import { InputShapeError } from "../../relaxweb/runtime_js/host.js";

const REPO_ROOT = fileURLToPath(new URL("../../", import.meta.url));

/** The JSON `expression` evaluates to in Python, with runtime/batch.py imported as `b`. */
function python(setup, expression) {
  const script = [
    "import json, struct",
    "from relaxweb.runtime import batch as b",
    "from relaxweb.runtime.host import Dispatch",
    setup,
    `print(json.dumps(${expression}))`,
  ].join("\n");
  return JSON.parse(execFileSync("python3", ["-c", script], { cwd: REPO_ROOT, encoding: "utf8" }));
}

const MANIFEST = {
  kernels: [{ name: "k0", batch_file: "kernels/k0.batch.wgsl" }, { name: "k1", batch_file: "kernels/k1.batch.wgsl" }],
  inputs: [{ name: "x", storage: 0 }],
  outputs: [{ name: "y", storage: 2 }],
  storages: [{ role: "input" }, { role: "intermediate" }, { role: "output" }],
};

/** Dispatch lists as {callSite} records, and the same as Python's source text. */
const d = (/** @type {number} */ callSite) => ({ callSite, workgroups: [1, 1, 1] });
const LISTS = {
  // instances 0 and 2 take the then branch (sites 2, 3), 1 and 3 the else branch (site 4); all share 0, 1 and 5
  0: [0, 1, 2, 3, 5],
  1: [0, 1, 4, 5],
  2: [0, 1, 2, 3, 5],
  3: [0, 1, 4, 4, 5],
  // a shorter instance (its grid ended after the first two)
  4: [0, 1],
};

test("aligned: slices of 256 bytes, at least one", () => {
  assert.deepEqual([0, 1, 255, 256, 257, 1000].map(aligned), [256, 256, 256, 256, 512, 1024]);
});

test("SliceLayout packs each storage's slices and grows keeping each at least its capacity", () => {
  const layout = SliceLayout.of([[100, 0], [600, 300]]);
  assert.deepEqual(layout.capacities, [[256, 768], [256, 512]]);
  assert.deepEqual(layout.offsets, [[0, 256], [0, 256]]);
  assert.deepEqual(layout.totals, [1024, 768]);
  const [grown, changed] = layout.grown([[100, 700], [10, 300]]);
  assert.deepEqual(grown.capacities, [[256, 768], [768, 512]]);
  assert.deepEqual(grown.offsets, [[0, 256], [0, 768]]);
  assert.deepEqual(changed, [1]);
  const expected = python(
    "l = b.SliceLayout.of([[100, 0], [600, 300]]); g, c = l.grown([[100, 700], [10, 300]])",
    "[l.offsets, l.capacities, l.totals, g.offsets, g.capacities, c]",
  );
  assert.deepEqual([layout.offsets, layout.capacities, layout.totals, grown.offsets, grown.capacities, changed], expected);
});

test("mergeDispatches runs shared call sites once for all, each branch per group, as Python does", () => {
  const lists = new Map(Object.entries(LISTS).map(([k, sites]) => [Number(k), sites.map(d)]));
  const merged = mergeDispatches(lists).map(([site, members]) => [site, members.map(([k]) => k)]);
  assert.deepEqual(merged[0], [0, [0, 1, 2, 3, 4]]);
  assert.deepEqual(merged[1], [1, [0, 1, 2, 3, 4]]);
  assert.deepEqual(merged.at(-1), [5, [0, 1, 2, 3]]); // the join, once, after both branches
  // each instance's own order is kept
  for (const [k, sites] of Object.entries(LISTS)) {
    assert.deepEqual(merged.filter(([, members]) => members.includes(Number(k))).map(([site]) => site), sites);
  }
  const expected = python(
    `lists = {int(k): [Dispatch(s, (1, 1, 1)) for s in v] for k, v in json.loads('${JSON.stringify(LISTS)}').items()}`,
    "[[site, [k for k, _ in members]] for site, members in b.merge_dispatches(lists)]",
  );
  assert.deepEqual(merged, expected);
});

test("batchTable: count, then per instance its params slot, its bases in vec4 rows and its first workgroup", () => {
  const site = { params_offset: 256, params_size: 32, buffers: [{ storage: 0 }, { weight: 0 }, { storage: 1 }, { storage: 2 }, { storage: 3 }] };
  const params = (/** @type {number} */ seed) => Uint8Array.from({ length: 512 }, (_, i) => (i * 7 + seed) % 251);
  const entries = /** @type {[Uint8Array, number[], number][]} */ ([[params(1), [0, 0, 256, 512, 768], 0], [params(2), [256, 0, 512, 1024, 1280], 12]]);
  const table = batchTable(site, entries);
  assert.equal(table.byteLength, tableBytes(32, 5));
  assert.equal(table.byteLength, 16 + MAX_INSTANCES * (32 + 32 + 16));
  const view = new DataView(table.buffer);
  assert.equal(view.getInt32(0, true), 2);
  assert.deepEqual([...table.subarray(16, 48)], [...params(1).subarray(256, 288)]);
  assert.equal(view.getInt32(16 + 80 + 32 + 8, true), 512); // instance 1, base of buffer 2
  assert.equal(view.getInt32(16 + 80 + 64, true), 12); // instance 1's first workgroup
  const hex = Buffer.from(table).toString("hex");
  const expected = python(
    [
      "site = {'params_offset': 256, 'params_size': 32, 'buffers': [{}] * 5}",
      "params = lambda seed: bytes((i * 7 + seed) % 251 for i in range(512))",
      "t = b.batch_table(site, [(params(1), [0, 0, 256, 512, 768], 0), (params(2), [256, 0, 512, 1024, 1280], 12)])",
    ].join("\n"),
    "t.hex()",
  );
  assert.equal(hex, expected);
});

test("gridOf lays workgroups out in two dimensions within the limit", () => {
  assert.deepEqual(gridOf(0, "s"), [1, 1, 1]);
  assert.deepEqual(gridOf(65535, "s"), [65535, 1, 1]);
  assert.deepEqual(gridOf(65536, "s"), [32768, 2, 1]);
  assert.deepEqual(gridOf(200000, "s"), python("", "b.grid_of(200000, 's')"));
  assert.throws(() => gridOf(65535 * 65535 + 1, "call site 3"), /^Error: the batch is too large for this device: call site 3 needs/);
});

test("checkTotals names the storage, the instance and the limit, as Python's check_totals", () => {
  const sizes = [[100, 1000, 50], [100, 3000, 50], [100, 200, 50]];
  const layout = SliceLayout.of(sizes);
  const vars = [{ seq: 4 }, { seq: 12 }, { seq: 1 }];
  let message = "";
  try {
    checkTotals(MANIFEST, layout, sizes, vars, 4000, "maxStorageBufferBindingSize");
  } catch (error) {
    message = /** @type {Error} */ (error).message;
  }
  assert.match(message, /storage 1 \(intermediate\) needs 4352 bytes for its 3 instances; instance 1 \(seq = 12; 3000 bytes\) takes it to 4096/);
  const expected = python(
    [
      `manifest = json.loads('${JSON.stringify(MANIFEST)}')`,
      `sizes = ${JSON.stringify(sizes)}`,
      "try:\n    b.check_totals(manifest, b.SliceLayout.of(sizes), sizes, [{'seq': 4}, {'seq': 12}, {'seq': 1}], 4000, 'maxStorageBufferBindingSize')\n    m = ''\nexcept Exception as e:\n    m = str(e)",
    ].join("\n"),
    "m",
  );
  assert.equal(message, expected);
  checkTotals(MANIFEST, layout, sizes, vars, 1 << 20, "maxBufferSize"); // fits: no error
  assert.equal(storageName(MANIFEST, 0), "input 'x' (storage 0)");
  assert.equal(storageName(MANIFEST, 2), "output 'y' (storage 2)");
});

test("oneByOneReason: kernels without a ragged form, caches, sequences, inputs that are not arrays", () => {
  const x = { x: { data: new Float32Array(4), shape: [1, 4] } };
  assert.equal(oneByOneReason(MANIFEST, [x, x]), "");
  assert.equal(oneByOneReason({ ...MANIFEST, kernels: [...MANIFEST.kernels, { name: "k2" }] }, [x]), "kernel(s) k2 have no ragged form");
  assert.equal(oneByOneReason({ ...MANIFEST, caches: [{}] }, [x]), "the model keeps KV caches between runs");
  assert.equal(oneByOneReason({ ...MANIFEST, outputs: [{ name: "s", kind: "sequence" }] }, [x]), "the model has sequence inputs or outputs");
  assert.match(oneByOneReason(MANIFEST, [x, { x: [] }]), /not an array/);
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

test("a batch of more instances than a runtime keeps host modules for is refused, with Python's limit", () => {
  assert.equal(MAX_BATCH_INSTANCES, python("", "b.MAX_BATCH_INSTANCES"));
  const many = Array.from({ length: MAX_BATCH_INSTANCES + 1 }, () => ({}));
  assert.throws(() => checkInstances(many), new RegExp(`at most ${MAX_BATCH_INSTANCES} instances.*got ${MAX_BATCH_INSTANCES + 1}`));
  checkInstances(many.slice(1));
});
