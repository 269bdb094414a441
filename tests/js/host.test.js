// Node tests of relaxweb/runtime_js/host.js on the hand-made bundle
// (tests/fixtures/handmade_bundle.py): no GPU needed.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import { Host, InputShapeError, checkInputs } from "../../relaxweb/runtime_js/host.js";

const REPO_ROOT = fileURLToPath(new URL("../../", import.meta.url));
const BOUND = 16; // DEFAULT_BOUND of the hand-made bundle
const WEIGHT_BYTES = 16; // four float32 values

/**
 * Write a hand-made bundle into a fresh temporary folder with the Python fixture.
 * @param {string} boundExpression a Python expression for the bound of n ("16", "None")
 * @returns {string} the folder
 */
function writeHandmadeBundle(boundExpression) {
  const folder = mkdtempSync(join(tmpdir(), "relaxweb-host-test-"));
  const script =
    "from tests.fixtures.handmade_bundle import write_handmade_bundle; " +
    `write_handmade_bundle(${JSON.stringify(folder)}, bound=${boundExpression})`;
  execFileSync("python3", ["-c", script], { cwd: REPO_ROOT, stdio: ["ignore", "inherit", "inherit"] });
  return folder;
}

/**
 * Instantiate the host module of a bundle folder.
 * @param {string} folder
 * @returns {Promise<Host>}
 */
async function loadHost(folder) {
  const manifest = JSON.parse(readFileSync(join(folder, "manifest.json"), "utf8"));
  return Host.instantiate(readFileSync(join(folder, "host.wasm")), manifest);
}

const folders = [];
let boundedFolder;
let unboundedFolder;

before(() => {
  boundedFolder = writeHandmadeBundle(String(BOUND));
  unboundedFolder = writeHandmadeBundle("None");
  folders.push(boundedFolder, unboundedFolder);
});

after(() => {
  for (const folder of folders) rmSync(folder, { recursive: true, force: true });
});

test("run binds n and computes output shapes, storage sizes and var values", async () => {
  const host = await loadHost(boundedFolder);
  for (const n of [0, 1, 5, BOUND]) {
    host.writeInputShapes([[n, 4]]);
    assert.equal(host.run(), 0);
    assert.deepEqual(host.varValues(), [n]);
    assert.deepEqual(host.outputShapes(), [[n, 4]]);
    assert.deepEqual(host.storageSizes(), [n * 16, n * 16, n * 16]);
  }
});

test("the command list dispatches both call sites in order", async () => {
  const host = await loadHost(boundedFolder);
  host.runOrThrow([[5, 4]]);
  assert.deepEqual(host.commands(), [
    { opcode: 1, callSite: 0, workgroups: [1, 1, 1] },
    { opcode: 1, callSite: 1, workgroups: [1, 1, 1] },
  ]);
  host.runOrThrow([[BOUND, 4]]);
  assert.deepEqual(host.commands().map((c) => c.workgroups), [[1, 1, 1], [1, 1, 1]]);
});

test("the params block holds each call site's element count", async () => {
  const host = await loadHost(boundedFolder);
  host.runOrThrow([[5, 4]]);
  const params = host.params();
  assert.equal(params.byteLength, host.manifest.params_bytes);
  const words = new DataView(params.buffer);
  for (const site of host.manifest.call_sites) {
    assert.equal(words.getUint32(site.params_offset, true), 20);
    assert.equal(words.getUint32(site.params_offset + 4, true), 0);
  }
});

test("sizes at bounds use the build bound, or tighter bounds written later", async () => {
  const host = await loadHost(boundedFolder);
  assert.deepEqual(host.varBounds(), [BOUND]);
  assert.deepEqual(host.sizesAtBounds(), [BOUND * 16, BOUND * 16, BOUND * 16]);
  host.setBounds({ n: 3 });
  assert.deepEqual(host.varBounds(), [3]);
  assert.deepEqual(host.sizesAtBounds(), [48, 48, 48]);
});

test("a bound above the build bound, or for an unknown var, is refused", async () => {
  const host = await loadHost(boundedFolder);
  assert.throws(() => host.setBounds({ n: BOUND + 1 }), /'n' is 17, above the bound 16/);
  assert.throws(() => host.setBounds({ m: 2 }), /unknown symbolic var 'm'/);
  assert.throws(() => host.setBounds({ n: 2.5 }), /non-negative integer/);
  assert.deepEqual(host.varBounds(), [BOUND]);
});

test("an unbounded var has no sizes at bounds until a bound is given", async () => {
  const host = await loadHost(unboundedFolder);
  assert.deepEqual(host.varBounds(), [null]);
  assert.equal(host.sizesAtBounds(), null);
  host.runOrThrow([[1000, 4]]);
  assert.deepEqual(host.storageSizes(), [16000, 16000, 16000]);
  host.setBounds({ n: 1000000 });
  assert.deepEqual(host.sizesAtBounds(), [16000000, 16000000, 16000000]);
});

test("a dimension above its bound is an InputShapeError naming input, dimension, value and bound", async () => {
  const host = await loadHost(boundedFolder);
  host.writeInputShapes([[17, 4]]);
  const code = host.run();
  assert.equal(code, 3);
  assert.deepEqual(host.errorInfo(), { code: 3, value: 17, expected: BOUND });
  const error = host.errorFor(code);
  assert.ok(error instanceof InputShapeError);
  assert.equal(error.message, "input 'x': dimension 0 (n) is 17, above its bound 16");
  assert.throws(() => host.runOrThrow([[17, 4]]), (thrown) => {
    assert.ok(thrown instanceof InputShapeError);
    for (const part of ["'x'", "dimension 0", "17", "16"]) assert.ok(thrown.message.includes(part), part);
    return true;
  });
});

test("a wrong fixed dimension is an InputShapeError naming the input and both sizes", async () => {
  const host = await loadHost(boundedFolder);
  assert.throws(() => host.runOrThrow([[2, 5]]), {
    name: "InputShapeError",
    message: "input 'x': dimension 1 is 5, expected 4",
  });
  assert.throws(() => host.runOrThrow([[2, 4, 1]]), {
    name: "InputShapeError",
    message: "input 'x' has 3 dimensions, expected 2",
  });
});

test("an unknown error code still gives a readable error", async () => {
  const host = await loadHost(boundedFolder);
  const error = host.errorFor(99);
  assert.match(error.message, /unknown error code 99/);
});

test("checkInputs names the input for a missing input, a wrong dtype, rank or length", async () => {
  const { manifest } = await loadHost(boundedFolder);
  const good = { x: { data: new Float32Array(8), shape: [2, 4] } };
  assert.deepEqual(checkInputs(manifest, good), [[2, 4]]);
  assert.throws(() => checkInputs(manifest, {}), { name: "InputShapeError", message: "input 'x' is missing" });
  assert.throws(() => checkInputs(manifest, { x: { data: new Int32Array(8), shape: [2, 4] } }),
    /input 'x': expected float32 data \(Float32Array\), got Int32Array/);
  assert.throws(() => checkInputs(manifest, { x: { data: new Float32Array(8), shape: [8] } }),
    /input 'x': expected 2 dimensions \[n, 4\], got 1 \[8\]/);
  assert.throws(() => checkInputs(manifest, { x: { data: new Float32Array(7), shape: [2, 4] } }),
    /input 'x': shape \[2, 4\] has 8 elements, but the data has 7/);
  assert.throws(() => checkInputs(manifest, { ...good, y: good.x }), /unknown input 'y'/);
});

test("the shard of the hand-made bundle holds its one weight", async () => {
  const { manifest } = await loadHost(boundedFolder);
  assert.equal(manifest.shards[0].nbytes, WEIGHT_BYTES);
  assert.equal(readFileSync(join(boundedFolder, manifest.shards[0].file)).byteLength, WEIGHT_BYTES);
});
