// The conformance corpus (tests/conformance/*.json) through the JS runtime: the same cases
// tests/runtime/test_conformance.py runs through the Python runtime, so a difference between
// the two runtimes is a failing case in one of them (docs/runtime-core.md, "The conformance
// corpus"). A case marked `pending_in: ["js"]` is skipped here with its `pending_why`.

import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";

import { SliceLayout, batchTable, checkTotals, gridOf, mergeDispatches, oneByOneReason } from "../../relaxweb/runtime_js/batch.js";
import { mulberry32 } from "../../relaxweb/runtime_js/generate.js";
import { Host, OPCODE_DISPATCH, OPCODE_READ, OPCODE_RESUME } from "../../relaxweb/runtime_js/host.js";
import { manifestProblem } from "../../relaxweb/runtime_js/manifest.js";
import { evaluateTree } from "../../relaxweb/runtime_js/profile.js";

const CORPUS = new URL("../conformance/", import.meta.url);
const COMMON_FIELDS = ["name", "pending_in", "pending_why"];

/** @param {any} manifest @param {(string|number)[]} path @returns {[any, string|number]} */
function at(manifest, path) {
  let target = manifest;
  for (const step of path.slice(0, -1)) target = target[step];
  return [target, path[path.length - 1]];
}

/** @param {string} hex @returns {Uint8Array} */
const fromHex = (hex) => Uint8Array.from(hex.match(/../g) ?? [], (byte) => parseInt(byte, 16));

/**
 * `compute()` gives `value`, or throws an Error saying exactly `error`.
 * @param {() => any} compute @param {any} value @param {string|null|undefined} error
 */
function expect(compute, value, error) {
  if (error === null || error === undefined) {
    assert.deepEqual(compute(), value);
    return;
  }
  assert.throws(compute, (thrown) => {
    assert.equal(/** @type {Error} */ (thrown).message, error);
    return true;
  });
}

/**
 * The commands the JS host decodes from `words`: a Host over a memory holding them, whose
 * `commands` export points at them (the decoding of runtime_js/host.js, without a host.wasm).
 * @param {any} c the case
 */
function decodedCommands(c) {
  const memory = { buffer: new ArrayBuffer(Math.max(4 * c.words.length, 4)) };
  new Int32Array(memory.buffer).set(c.words);
  const exports = { memory, commands: () => 0, read_values: () => 0, resume: () => 0 };
  const manifest = {
    call_sites: Array.from({ length: c.call_sites }, () => ({})),
    storages: Array.from({ length: c.storages }, () => ({})),
    read_slots: c.read_slots,
    max_rank: 0,
  };
  return new Host(/** @type {any} */ ({ exports }), manifest).commands();
}

/** kind -> [its runner, the fields its cases may have besides the common ones] */
const RUNNERS = {
  manifest_problems: [(/** @type {any} */ c, /** @type {any} */ corpus) => {
    const manifest = structuredClone(corpus.bases[c.base]);
    for (const [path, value] of c.set ?? []) {
      const [target, key] = at(manifest, path);
      target[key] = value;
    }
    for (const path of c.delete ?? []) {
      const [target, key] = at(manifest, path);
      delete target[key];
    }
    if (c.nest) {
      const [target, key] = at(manifest, c.nest.path);
      for (let i = 0; i < c.nest.depth; i++) target[key] = ["add", target[key], 1];
    }
    if (c.double) {
      const [target, key] = at(manifest, c.double.path);
      for (let i = 0; i < c.double.times; i++) target[key] = ["add", target[key], target[key]];
    }
    assert.equal(manifestProblem(manifest), c.problem);
  }, ["base", "set", "delete", "nest", "double", "problem"]],

  cost_trees: [(/** @type {any} */ c) => {
    assert.equal(evaluateTree(c.tree, new Map(Object.entries(c.values))), c.value);
  }, ["tree", "values", "value"]],

  sampler_draws: [(/** @type {any} */ c) => {
    const draw = mulberry32(c.seed);
    assert.deepEqual(c.uniforms.map(() => draw()), c.uniforms);
  }, ["seed", "uniforms"]],

  slice_layouts: [(/** @type {any} */ c) => {
    const layout = SliceLayout.of(c.sizes);
    assert.deepEqual([layout.offsets, layout.capacities, layout.totals], [c.offsets, c.capacities, c.totals]);
    if (c.grown_sizes) {
      const [grown, changed] = layout.grown(c.grown_sizes);
      assert.deepEqual({ offsets: grown.offsets, capacities: grown.capacities, totals: grown.totals, changed }, c.grown);
    }
  }, ["sizes", "offsets", "capacities", "totals", "grown_sizes", "grown"]],

  merged_dispatches: [(/** @type {any} */ c) => {
    const lists = new Map(c.lists.map((/** @type {[number, [number, number[]][]]} */ [instance, dispatches]) =>
      [instance, dispatches.map(([callSite, workgroups]) => ({ callSite, workgroups }))]));
    const merged = mergeDispatches(lists).map(([site, members]) => [site, members.map(([instance]) => instance)]);
    assert.deepEqual(merged, c.merged);
  }, ["lists", "merged"]],

  batch_tables: [(/** @type {any} */ c) => {
    const entries = c.entries.map((/** @type {any} */ e) => [fromHex(e.params), e.bases, e.first_workgroup]);
    const table = batchTable(c.call_site, entries);
    const expected = new Uint8Array(c.table.bytes);
    expected.set(fromHex(c.table.hex));
    assert.equal(table.byteLength, c.table.bytes);
    assert.deepEqual(table, expected);
  }, ["call_site", "entries", "table"]],

  grids: [(/** @type {any} */ c) => {
    expect(() => gridOf(c.workgroups, c.text), c.grid, c.error);
  }, ["workgroups", "text", "grid", "error"]],

  batch_totals: [(/** @type {any} */ c) => {
    expect(() => checkTotals(c.manifest, SliceLayout.of(c.sizes), c.sizes, c.var_values, c.largest, c.limit_name), undefined, c.error);
  }, ["manifest", "sizes", "var_values", "largest", "limit_name", "error"]],

  batch_modes: [(/** @type {any} */ c) => {
    /** @type {Record<string, () => any>} */
    const values = { array: () => ({ data: new Float32Array(1), shape: [1] }), list: () => [] };
    const instances = c.instances.map((/** @type {Record<string, string>} */ instance) =>
      Object.fromEntries(Object.entries(instance).map(([name, kind]) => [name, values[kind]()])));
    assert.equal(oneByOneReason(c.manifest, instances), c.reason);
  }, ["manifest", "instances", "reason"]],

  command_lists: [(/** @type {any} */ c) => {
    expect(() => {
      const commands = decodedCommands(c);
      const last = commands[commands.length - 1];
      /** @type {any} */
      const step = {
        dispatches: commands.filter((command) => command.opcode === OPCODE_DISPATCH)
          .map((/** @type {any} */ command) => [command.callSite, [...command.workgroups]]),
        end: last?.opcode === OPCODE_READ ? "read" : last?.opcode === OPCODE_RESUME ? "resume" : "outputs",
      };
      if (last?.opcode === OPCODE_READ) {
        const read = /** @type {any} */ (last);
        step.read = { storage: read.storage, byte_offset: read.byteOffset, slot: read.slot };
      }
      return step;
    }, c.step, c.error);
  }, ["call_sites", "storages", "read_slots", "words", "step", "error"]],
};

const corpora = readdirSync(CORPUS).filter((file) => file.endsWith(".json")).sort()
  .map((file) => JSON.parse(readFileSync(new URL(file, CORPUS), "utf8")));

test("every corpus file is a known kind with named cases", () => {
  assert.deepEqual(corpora.map((corpus) => corpus.kind).sort(), Object.keys(RUNNERS).sort());
  for (const corpus of corpora) {
    const names = corpus.cases.map((/** @type {any} */ c) => c.name);
    assert.ok(names.length > 0 && new Set(names).size === names.length, corpus.kind);
  }
});

for (const corpus of corpora) {
  const [run, fields] = /** @type {any} */ (RUNNERS)[corpus.kind] ?? [null, []];
  for (const c of corpus.cases) {
    const pending = (c.pending_in ?? []).includes("js");
    test(`${corpus.kind}/${c.name}`, { skip: pending ? c.pending_why : false }, () => {
      const unknown = Object.keys(c).filter((field) => !fields.includes(field) && !COMMON_FIELDS.includes(field));
      assert.deepEqual(unknown, [], "fields no runner reads");
      assert.ok(run, `no runner for ${corpus.kind}`);
      run(c, corpus);
    });
  }
}
