// The conformance corpus (tests/conformance/*.json) through the JS runtime: the same cases
// tests/runtime/test_conformance.py runs through the Python runtime, so a difference between
// the two runtimes is a failing case in one of them (docs/runtime-core.md, "The conformance
// corpus"). One test per case, named kind/name; a case marked `pending_in: ["js"]` is skipped
// with its `pending_why`. A file of an unknown kind, a kind without a file, or a case field no
// runner reads fails.

import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";

import { SliceLayout, batchTable, checkTotals, gridOf, mergeDispatches, oneByOneReason } from "../../relaxweb/runtime_js/batch.js";
import { mulberry32 } from "../../relaxweb/runtime_js/generate.js";
import { TYPED_ARRAY_OF_DTYPE, decodeCommands, floatToHalfBits } from "../../relaxweb/runtime_js/host.js";
import { dispatchesOf, readOf, resumes } from "../../relaxweb/runtime_js/host_session.js";
import { manifestProblem } from "../../relaxweb/runtime_js/manifest.js";
import { evaluateTree } from "../../relaxweb/runtime_js/profile.js";
import { prepareInputs, wasmManifest } from "../../relaxweb/runtime_js/tensors.js";

const CORPUS = new URL("../conformance/", import.meta.url);
const COMMON_FIELDS = ["name", "pending_in", "pending_why"];

/** The object holding the value at `path` (keys and indices), and its key. @param {any} root @param {(string|number)[]} path */
function at(root, path) {
  let target = root;
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
  assert.throws(compute, (/** @type {any} */ thrown) => {
    assert.equal(thrown.message, error);
    return true;
  });
}

/** A manifest_problems case's manifest: its base, edited in the order the fields are listed. @param {any} c @param {any} corpus */
function editedManifest(c, corpus) {
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
  return manifest;
}

/** A command_lists case's words decoded, as the corpus writes a step. @param {any} c */
function decodedStep(c) {
  const step = { commands: decodeCommands(c.words, c.call_sites, c.storages, c.read_slots) };
  const read = readOf(/** @type {any} */ (step));
  /** @type {any} */
  const decoded = {
    dispatches: dispatchesOf(/** @type {any} */ (step)).map(({ callSite, workgroups }) => [callSite, [...workgroups]]),
    end: read ? "read" : resumes(/** @type {any} */ (step)) ? "resume" : "outputs",
  };
  if (read) decoded.read = { storage: read.storage, byte_offset: read.byteOffset, slot: read.slot };
  return decoded;
}

/**
 * An input_arrays case's given data as a page would pass it: a list as a plain Array, an
 * array as its dtype's typed array (int64 BigInt64Array, float16 half bits, bool 0/1 bytes).
 * @param {{list?: any[], dtype?: string, values?: any[]}} given
 */
function givenData(given) {
  if (given.list) return given.list;
  const values = /** @type {any[]} */ (given.values);
  /** @type {Record<string, (v: any) => any>} */
  const asElement = { int64: BigInt, float16: floatToHalfBits, bool: Number };
  const typed = /** @type {any} */ (TYPED_ARRAY_OF_DTYPE)[/** @type {string} */ (given.dtype)];
  return typed.from(values.map(asElement[/** @type {string} */ (given.dtype)] ?? ((v) => v)));
}

/** How the batch_modes cases write an instance's inputs. @type {Record<string, () => any>} */
const INPUT_OF_KIND = { array: () => ({ data: new Float32Array(1), shape: [1] }), list: () => [] };

/** kind -> [its runner, the fields its cases may have besides the common ones] @type {Record<string, [(c: any, corpus: any) => void, string[]]>} */
const RUNNERS = {
  manifest_problems: [(c, corpus) => assert.equal(manifestProblem(editedManifest(c, corpus)), c.problem),
    ["base", "set", "delete", "nest", "double", "problem"]],

  cost_trees: [(c) => assert.equal(evaluateTree(c.tree, new Map(Object.entries(c.values))), c.value),
    ["tree", "values", "value"]],

  sampler_draws: [(c) => {
    const draw = mulberry32(c.seed);
    assert.deepEqual(c.uniforms.map(() => draw()), c.uniforms);
  }, ["seed", "uniforms"]],

  slice_layouts: [(c) => {
    const layout = SliceLayout.of(c.sizes);
    assert.deepEqual([layout.offsets, layout.capacities, layout.totals], [c.offsets, c.capacities, c.totals]);
    if (c.grown_sizes) {
      const [grown, changed] = layout.grown(c.grown_sizes);
      assert.deepEqual({ offsets: grown.offsets, capacities: grown.capacities, totals: grown.totals, changed }, c.grown);
    }
  }, ["sizes", "offsets", "capacities", "totals", "grown_sizes", "grown"]],

  merged_dispatches: [(c) => {
    const lists = new Map(c.lists.map((/** @type {[number, [number, number[]][]]} */ [instance, dispatches]) =>
      [instance, dispatches.map(([callSite, workgroups]) => ({ callSite, workgroups }))]));
    assert.deepEqual(mergeDispatches(lists).map(([site, members]) => [site, members.map(([instance]) => instance)]), c.merged);
  }, ["lists", "merged"]],

  batch_tables: [(c) => {
    const table = batchTable(c.call_site, c.entries.map((/** @type {any} */ e) => [fromHex(e.params), e.bases, e.first_workgroup]));
    const expected = new Uint8Array(c.table.bytes); // the bytes after the last entry are zeros
    expected.set(fromHex(c.table.hex));
    assert.deepEqual(table, expected);
  }, ["call_site", "entries", "table"]],

  grids: [(c) => expect(() => gridOf(c.workgroups, c.text), c.grid, c.error), ["workgroups", "text", "grid", "error"]],

  batch_totals: [(c) => expect(() => checkTotals(c.manifest, SliceLayout.of(c.sizes), c.sizes, c.var_values, c.largest, c.limit_name),
    undefined, c.error), ["manifest", "sizes", "var_values", "largest", "limit_name", "error"]],

  batch_modes: [(c) => {
    const instances = c.instances.map((/** @type {Record<string, string>} */ instance) =>
      Object.fromEntries(Object.entries(instance).map(([name, kind]) => [name, INPUT_OF_KIND[kind]()])));
    assert.equal(oneByOneReason(c.manifest, instances), c.reason);
  }, ["manifest", "instances", "reason"]],

  command_lists: [(c) => expect(() => decodedStep(c), c.step, c.error), ["call_sites", "storages", "read_slots", "words", "step", "error"]],

  input_arrays: [(c, corpus) => {
    const manifest = { inputs: [{ name: "x", dtype: c.input, shape: ["n"], storage: 0 }], dtypes: corpus.dtypes };
    const data = givenData(c.given);
    const inputs = { x: { data, shape: [data.length] } };
    // on WebGPU (the manifest's dtypes), then on kernels.wasm (wasmManifest's): `wasm` where it differs
    for (const [view, device] of [[manifest, c.device], [wasmManifest(manifest), c.wasm ?? c.device]]) {
      if (!device) {
        assert.throws(() => prepareInputs(view, inputs), (/** @type {any} */ thrown) => {
          assert.equal(thrown.name, "InputShapeError");
          for (const part of c.refused) assert.ok(thrown.message.includes(part), thrown.message);
          return true;
        });
        continue;
      }
      const held = /** @type {any} */ (prepareInputs(view, inputs).deviceInputs.x.data);
      const dtype = held instanceof BigInt64Array ? "int64" : held.constructor.name.replace("Array", "").toLowerCase();
      assert.deepEqual([dtype, Array.from(held, Number)], [device.dtype, device.values]);
    }
  }, ["input", "given", "device", "refused", "wasm"]],
};

const corpora = readdirSync(CORPUS).filter((file) => file.endsWith(".json")).sort()
  .map((file) => ({ file, corpus: JSON.parse(readFileSync(new URL(file, CORPUS), "utf8")) }));

test("every corpus file is a known kind, named after it, with named cases", () => {
  assert.deepEqual(corpora.map(({ corpus }) => corpus.kind).sort(), Object.keys(RUNNERS).sort());
  for (const { file, corpus } of corpora) {
    assert.equal(file, `${corpus.kind}.json`);
    const names = corpus.cases.map((/** @type {any} */ c) => c.name);
    assert.ok(names.length > 0 && new Set(names).size === names.length, corpus.kind);
  }
});

for (const { corpus } of corpora) {
  const [run, fields] = RUNNERS[corpus.kind] ?? [null, []];
  for (const c of corpus.cases) {
    const pending = (c.pending_in ?? []).includes("js");
    test(`${corpus.kind}/${c.name}`, { skip: pending ? c.pending_why : false }, () => {
      assert.deepEqual(Object.keys(c).filter((field) => !fields.includes(field) && !COMMON_FIELDS.includes(field)), [],
        "fields no runner reads");
      assert.ok(run, `no runner for ${corpus.kind}`);
      run(c, corpus);
    });
  }
}
