// Node tests of relaxweb/runtime_js/host.js on the hand-made bundles
// (tests/fixtures/handmade_bundle.py): no GPU needed. The second bundle, y = x[x > 0],
// stops its command list with a read of k (the number of positive elements) and resumes.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import {
  Host, InputShapeError, OPCODE_DISPATCH, OPCODE_READ, OPCODE_RESUME, checkInputs, deviceShortfalls, dtypeInfo, storageNote, fromDeviceData,
  floatToHalfBits, halfBitsToFloat, loadTimeLimits, storageSizeProblem, toDeviceData,
} from "../../relaxweb/runtime_js/host.js";

const REPO_ROOT = fileURLToPath(new URL("../../", import.meta.url));
const BOUND = 16; // DEFAULT_BOUND of the hand-made bundle
const WEIGHT_BYTES = 16; // four float32 values
/** The entries of a manifest's dtypes table (relaxweb/ir/dtype.py) that these tests use. */
const DTYPES = {
  float32: { bytes: 4, kind: "float", device_dtype: "float32", device_bytes: 4 },
  float16: { bytes: 2, kind: "float", device_dtype: "float32", device_bytes: 4 },
  float64: { bytes: 8, kind: "float", device_dtype: "float32", device_bytes: 4 },
  int64: { bytes: 8, kind: "int", device_dtype: "int32", device_bytes: 4 },
  int16: { bytes: 2, kind: "int", device_dtype: "int32", device_bytes: 4 },
  int8: { bytes: 1, kind: "int", device_dtype: "int32", device_bytes: 4 },
  uint16: { bytes: 2, kind: "uint", device_dtype: "uint32", device_bytes: 4 },
  uint8: { bytes: 1, kind: "uint", device_dtype: "uint32", device_bytes: 4 },
  bool: { bytes: 1, kind: "bool", device_dtype: "uint32", device_bytes: 4 },
};

/**
 * Write a hand-made bundle into a fresh temporary folder with the Python fixture.
 * @param {string} boundExpression a Python expression for the bound of n ("16", "None")
 * @param {string} [writer] the fixture function: write_handmade_bundle or write_positives_bundle
 * @param {string} [extraArguments] more keyword arguments, in Python (", positive_limit=3")
 * @returns {string} the folder
 */
function writeHandmadeBundle(boundExpression, writer = "write_handmade_bundle", extraArguments = "") {
  const folder = mkdtempSync(join(tmpdir(), "relaxweb-host-test-"));
  const script =
    `from tests.fixtures.handmade_bundle import ${writer}; ` +
    `${writer}(${JSON.stringify(folder)}, bound=${boundExpression}${extraArguments})`;
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
let positivesFolder;
let limitedPositivesFolder;

before(() => {
  boundedFolder = writeHandmadeBundle(String(BOUND));
  unboundedFolder = writeHandmadeBundle("None");
  positivesFolder = writeHandmadeBundle("None", "write_positives_bundle");
  limitedPositivesFolder = writeHandmadeBundle(String(BOUND), "write_positives_bundle", ", positive_limit=3");
  folders.push(boundedFolder, unboundedFolder, positivesFolder, limitedPositivesFolder);
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
  assert.throws(() => checkInputs(manifest, { x: { data: new Float32Array(8), shape: [2n, 4n] } }), {
    name: "InputShapeError",
    message: "input 'x': shape must be an array of non-negative integers (numbers, not BigInts), got [2n,4n]",
  });
  const cyclic = [2]; cyclic.push(cyclic);
  assert.throws(() => checkInputs(manifest, { x: { data: new Float32Array(8), shape: cyclic } }),
    /input 'x': shape must be an array of non-negative integers, got 2,/);
});

test("int64 and bool tensors are int32 and uint32 on the GPU, converted at the boundary", () => {
  const ids = { name: "ids", dtype: "int64", shape: ["n"] };
  const mask = { name: "mask", dtype: "bool", shape: ["n"] };
  const manifest = { dtypes: DTYPES, inputs: [ids, mask] };
  assert.deepEqual(checkInputs(manifest, {
    ids: { data: new BigInt64Array([1n, -2n]), shape: [2] }, mask: { data: new Uint8Array([0, 5]), shape: [2] },
  }), [[2], [2]]);
  assert.deepEqual(checkInputs(manifest, {
    ids: { data: new Int32Array([1, 2]), shape: [2] }, mask: { data: new Uint8Array(2), shape: [2] },
  }), [[2], [2]]);
  assert.throws(() => checkInputs(manifest, { ids: { data: new Float32Array(2), shape: [2] }, mask: { data: new Uint8Array(2), shape: [2] } }),
    /input 'ids': expected int64 data \(BigInt64Array or Int32Array\), got Float32Array/);
  const idsInfo = dtypeInfo(manifest, ids);
  const maskInfo = dtypeInfo(manifest, mask);
  assert.deepEqual(toDeviceData(ids, idsInfo, new BigInt64Array([1n, -2n, 2147483647n])), new Int32Array([1, -2, 2147483647]));
  assert.throws(() => toDeviceData(ids, idsInfo, new BigInt64Array([0n, 2147483648n])),
    { name: "InputShapeError", message: /input 'ids': value 2147483648 at flat index 1 does not fit in int32/ });
  assert.throws(() => toDeviceData(ids, idsInfo, new BigInt64Array([-2147483649n])), /input 'ids'/);
  assert.deepEqual(toDeviceData(mask, maskInfo, new Uint8Array([0, 5, 1])), new Uint32Array([0, 1, 1]));
  assert.deepEqual(fromDeviceData(ids, idsInfo, new Int32Array([7, -8]).buffer), new BigInt64Array([7n, -8n]));
  assert.deepEqual(fromDeviceData(mask, maskInfo, new Uint32Array([0, 1]).buffer), new Uint8Array([0, 1]));
});

test("dtypeInfo gives a tensor's entry of the manifest's dtypes table, and names a missing one", () => {
  const manifest = { dtypes: { int64: DTYPES.int64 } };
  assert.equal(dtypeInfo(manifest, { name: "ids", dtype: "int64" }).device_bytes, 4);
  assert.throws(() => dtypeInfo(manifest, { name: "x", dtype: "float32" }),
    /the manifest's dtypes table has no entry for float32 \(the dtype of 'x'\)/);
});

test("the shard of the hand-made bundle holds its one weight", async () => {
  const { manifest } = await loadHost(boundedFolder);
  assert.equal(manifest.shards[0].nbytes, WEIGHT_BYTES);
  assert.equal(readFileSync(join(boundedFolder, manifest.shards[0].file)).byteLength, WEIGHT_BYTES);
});

// Values read back: the positives bundle -------------------------------------------------

test("a bundle without reads has no read slots and cannot resume", async () => {
  const host = await loadHost(boundedFolder);
  assert.equal(host.manifest.read_slots, undefined);
  assert.equal(host.readSlots, 0);
  assert.deepEqual(host.readValues(), []);
  assert.throws(() => host.writeReadValue(0, 1), /read slot 0 does not exist: the bundle has 0/);
  assert.throws(() => host.resume(), /no resume export/);
});

test("run stops with a read record and sizes everything as if the value were 0", async () => {
  const host = await loadHost(positivesFolder);
  assert.equal(host.readSlots, 1);
  host.runOrThrow([[70]]);
  assert.deepEqual(host.commands(), [
    { opcode: OPCODE_DISPATCH, callSite: 0, workgroups: [2, 1, 1] },
    { opcode: OPCODE_DISPATCH, callSite: 1, workgroups: [1, 1, 1] },
    { opcode: OPCODE_READ, storage: 2, byteOffset: 4, slot: 0 },
  ]);
  assert.deepEqual(host.storageSizes(), [280, 280, 8, 0]);
  assert.deepEqual(host.outputShapes(), [[0]]);
});

test("resume uses the value read back: new commands, sizes, output shape and params", async () => {
  const host = await loadHost(positivesFolder);
  for (const [n, k] of [[10, 6], [10, 0], [10, 10], [0, 0], [1000, 100]]) {
    host.runOrThrow([[n]]);
    host.writeReadValue(0, k);
    assert.deepEqual(host.readValues(), [k]);
    assert.equal(host.resume(), 0);
    assert.deepEqual(host.commands(), [{ opcode: OPCODE_DISPATCH, callSite: 2, workgroups: [1, 1, 1] }]);
    assert.deepEqual(host.storageSizes(), [4 * n, 4 * (n + k), 8, 4 * k]);
    assert.deepEqual(host.outputShapes(), [[k]]);
    const params = new DataView(host.params().buffer);
    const site = host.manifest.call_sites[2].params_offset;
    assert.deepEqual([0, 4, 8, 12].map((b) => params.getUint32(site + b, true)), [n, k, 0, 0]);
  }
});

test("a failing resume is an InputShapeError with the manifest's message", async () => {
  const host = await loadHost(positivesFolder);
  host.runOrThrow([[10]]);
  host.writeReadValue(0, -7); // sign-extended to i64
  assert.equal(host.resume(), 4);
  assert.deepEqual(host.errorInfo(), { code: 4, value: -7, expected: 10 });
  assert.throws(() => host.resumeOrThrow(), {
    name: "InputShapeError",
    message: "the number of positive elements read back is -7, outside 0..10",
  });

  const limited = await loadHost(limitedPositivesFolder);
  limited.runOrThrow([[10]]);
  limited.writeReadValue(0, 4);
  assert.throws(() => limited.resumeOrThrow(), (thrown) => {
    assert.ok(thrown instanceof InputShapeError);
    assert.equal(thrown.message, "output 'y': x has 4 positive elements, more than the 3 this bundle allows");
    assert.equal(thrown.code, 5);
    return true;
  });
  limited.writeReadValue(0, 3);
  limited.resumeOrThrow();
  assert.deepEqual(limited.outputShapes(), [[3]]);
});

test("read slots are checked, and a read beyond the manifest's slots is malformed", async () => {
  const host = await loadHost(positivesFolder);
  assert.throws(() => host.writeReadValue(1, 0), /read slot 1 does not exist: the bundle has 1/);
  assert.throws(() => host.writeReadValue(-1, 0), /read slot -1 does not exist/);

  const manifest = JSON.parse(readFileSync(join(positivesFolder, "manifest.json"), "utf8"));
  const noSlots = await Host.instantiate(readFileSync(join(positivesFolder, "host.wasm")), { ...manifest, read_slots: 0 });
  noSlots.runOrThrow([[4]]);
  assert.throws(() => noSlots.commands(), /read record uses slot 0; the manifest has 0 read slot\(s\)/);
});

test("read slots in a manifest whose host.wasm cannot resume are refused", async () => {
  const manifest = JSON.parse(readFileSync(join(boundedFolder, "manifest.json"), "utf8"));
  await assert.rejects(
    Host.instantiate(readFileSync(join(boundedFolder, "host.wasm")), { ...manifest, read_slots: 1 }),
    /does not export read_values or resume/,
  );
});

// Loops: a compiled Scan (tests/ops/test_loop.py), one command list per iteration -----------------

test("a loop's iterations each end their command list with a resume record", async () => {
  const folder = mkdtempSync(join(tmpdir(), "relaxweb-host-test-"));
  folders.push(folder);
  const script = `import relaxweb; from tests.ops.test_loop import scan_model; relaxweb.build(scan_model(), ${JSON.stringify(folder)})`;
  execFileSync("python3", ["-c", script], { cwd: REPO_ROOT, stdio: ["ignore", "inherit", "inherit"] });
  const host = await loadHost(folder);
  const iteration = host.manifest.symbolic_vars.findIndex((v) => v.name === "rnn_scan_iteration");
  for (const steps of [3, 1]) {
    host.runOrThrow([[3], [steps, 2]]);
    const iterations = [];
    for (;;) {
      const commands = host.commands();
      const last = commands[commands.length - 1];
      if (last?.opcode !== OPCODE_RESUME) break;
      assert.ok(commands.slice(0, -1).every((command) => command.opcode === OPCODE_DISPATCH));
      iterations.push(host.varValues()[iteration]);
      host.resumeOrThrow();
    }
    // (the host counts an iteration before it stops: its dispatches' params hold the one before)
    assert.deepEqual(iterations, [...Array(steps).keys()].map((i) => i + 1));
    assert.deepEqual(host.outputShapes(), [[3], [steps, 3], [steps, 2]]);
  }
});

// Load-time limits and features (fake adapter limits: plain objects, as GPUSupportedLimits reads)

test("deviceShortfalls names the storage that sets a buffer size limit, at the bounds in effect", () => {
  const gpu = { limits: { maxStorageBufferBindingSize: 1024, maxComputeWorkgroupStorageSize: 16 }, features: new Set() };
  const manifest = { storages: [{ role: "input", size: "n * 4", size_at_bounds: 400, holds: "input 'x'" },
    { role: "output", size: "n * 16", size_at_bounds: 1600, holds: "output 'y'" }] };
  const limits = { maxStorageBufferBindingSize: 1600, maxComputeWorkgroupStorageSize: 32 };
  assert.deepEqual(deviceShortfalls(gpu, limits, [], "GPU adapter", manifest), [
    "this model needs the WebGPU limit maxStorageBufferBindingSize = 1600, but the GPU adapter supports 1024: storage 1 "
      + "(output 'y') needs 1600 bytes at the bounds (its size: n * 16 bytes; build with lower --bound values, or run on wasm)",
    "this model needs the WebGPU limit maxComputeWorkgroupStorageSize = 32, but the GPU adapter supports 16",
  ]);
  // load-time bounds: the sizes the host module computed, not the manifest's
  assert.match(deviceShortfalls(gpu, { maxStorageBufferBindingSize: 1200 }, [], "GPU adapter", manifest, [300, 1200])[0],
    /supports 1024: storage 1 \(output 'y'\) needs 1200 bytes at the bounds/);
  assert.equal(storageNote(manifest, null, "maxStorageBufferBindingSize", 999), ""); // a weight sets it
});

test("deviceShortfalls names each missing feature and unmet limit with both values", () => {
  const gpu = { limits: { maxStorageBufferBindingSize: 1024, minStorageBufferOffsetAlignment: 256 }, features: new Set(["timestamp-query"]) };
  assert.deepEqual(deviceShortfalls(gpu, { maxStorageBufferBindingSize: 1024 }, ["timestamp-query"], "device"), []);
  assert.deepEqual(
    deviceShortfalls(gpu, { maxStorageBufferBindingSize: 2048, minStorageBufferOffsetAlignment: 32, maxImaginaryThings: 1 }, ["shader-f16"], "GPU adapter"),
    [
      "this model needs the WebGPU feature shader-f16, which the GPU adapter does not offer",
      "this model needs the WebGPU limit maxStorageBufferBindingSize = 2048, but the GPU adapter supports 1024",
      "this model needs the WebGPU limit minStorageBufferOffsetAlignment = 32, but the GPU adapter supports 256",
      "this model needs the WebGPU limit maxImaginaryThings = 1, but the GPU adapter does not report that limit",
    ],
  );
});

test("loadTimeLimits raises the buffer limits to the weights and the sizes at the bounds", () => {
  // the int64 weight: 1400 bytes in its shard (8 an element), 700 on the GPU (4 an element)
  const dtypes = { float32: { device_bytes: 4, wasm_bytes: 4 }, int64: { device_bytes: 4, wasm_bytes: 8 } };
  const manifest = { required_limits: { maxStorageBuffersPerShaderStage: 3 }, dtypes,
    weights: [{ dtype: "float32", nbytes: 100 }, { dtype: "int64", nbytes: 1400 }] };
  assert.deepEqual(loadTimeLimits(manifest, null),
    { maxStorageBuffersPerShaderStage: 3, maxStorageBufferBindingSize: 700, maxBufferSize: 700 });
  assert.deepEqual(loadTimeLimits(manifest, [5000, 64]),
    { maxStorageBuffersPerShaderStage: 3, maxStorageBufferBindingSize: 5000, maxBufferSize: 5000 });
  const declared = { required_limits: { maxStorageBufferBindingSize: 9000 }, dtypes, weights: [] };
  assert.deepEqual(loadTimeLimits(declared, [16]), { maxStorageBufferBindingSize: 9000, maxBufferSize: 9000 });
});

test("storageSizeProblem names the input and the smaller buffer limit", () => {
  const manifest = JSON.parse(readFileSync(join(unboundedFolder, "manifest.json"), "utf8"));
  const limits = { maxStorageBufferBindingSize: 4096, maxBufferSize: 8192 };
  assert.equal(storageSizeProblem(manifest, [4096, 4096, 4096], limits), null);
  assert.equal(storageSizeProblem(manifest, [4800, 4800, 4800], limits),
    "these inputs are too large for this device: input 'x' (storage 0) needs 4800 bytes, above the device's WebGPU limit maxStorageBufferBindingSize = 4096");
  assert.equal(storageSizeProblem(manifest, [16, 16, 3000], { maxStorageBufferBindingSize: 4096, maxBufferSize: 2048 }),
    "these inputs are too large for this device: output 'z' (storage 2) needs 3000 bytes, above the device's WebGPU limit maxBufferSize = 2048");
});

// float16, float64 and narrow ints at the boundary

test("half bits convert both ways, rounding to nearest even", () => {
  const cases = [[0, 0], [1, 0x3c00], [-2, 0xc000], [65504, 0x7bff], [2 ** -24, 0x0001], [Infinity, 0x7c00], [-Infinity, 0xfc00]];
  for (const [value, bits] of cases) {
    assert.equal(floatToHalfBits(value), bits, `bits of ${value}`);
    assert.equal(halfBitsToFloat(bits), value, `value of ${bits}`);
  }
  assert.equal(floatToHalfBits(1 + 2 ** -11), 0x3c00); // halfway: to even
  assert.equal(floatToHalfBits(1 + 3 * 2 ** -11), 0x3c02); // halfway: to even (up)
  assert.equal(floatToHalfBits(65520), 0x7c00); // rounds beyond the largest half: infinity
  assert.equal(floatToHalfBits(2 ** -25), 0); // halfway to the smallest subnormal: to even (0)
  assert.equal(floatToHalfBits(3 * 2 ** -26), 1);
  assert.ok(Number.isNaN(halfBitsToFloat(floatToHalfBits(NaN))));
  assert.ok(Object.is(halfBitsToFloat(floatToHalfBits(-0)), -0));
});

test("float16, float64 and narrow int data is converted on upload and back on readback", () => {
  const f16 = { name: "h", dtype: "float16" };
  const up = toDeviceData(f16, DTYPES.float16, Uint16Array.from([0x3c00, 0xc000, 0x3555]));
  assert.ok(up instanceof Float32Array);
  assert.deepEqual(Array.from(up), [1, -2, halfBitsToFloat(0x3555)]);
  const down = fromDeviceData(f16, DTYPES.float16, Float32Array.from([1, -2, 1 / 3]).buffer);
  assert.ok(down instanceof Uint16Array);
  assert.deepEqual(Array.from(down), [0x3c00, 0xc000, 0x3555]);

  const f64 = { name: "d", dtype: "float64" };
  assert.deepEqual(Array.from(toDeviceData(f64, DTYPES.float64, Float64Array.from([0.1, -3]))), [Math.fround(0.1), -3]);
  const back = fromDeviceData(f64, DTYPES.float64, Float32Array.from([0.5, 2]).buffer);
  assert.ok(back instanceof Float64Array);
  assert.deepEqual(Array.from(back), [0.5, 2]);

  const u8 = { name: "b", dtype: "uint8" };
  assert.deepEqual(toDeviceData(u8, DTYPES.uint8, Uint8Array.from([0, 255])), Uint32Array.from([0, 255]));
  assert.deepEqual(fromDeviceData(u8, DTYPES.uint8, Uint32Array.from([4, 260]).buffer), Uint8Array.from([4, 4]));
  const i8 = { name: "c", dtype: "int8" };
  assert.deepEqual(toDeviceData(i8, DTYPES.int8, Int8Array.from([-128, 127])), Int32Array.from([-128, 127]));
  assert.deepEqual(fromDeviceData(i8, DTYPES.int8, Int32Array.from([-129, 128, 5]).buffer), Int8Array.from([127, -128, 5]));
  const i16 = { name: "s", dtype: "int16" };
  assert.deepEqual(fromDeviceData(i16, DTYPES.int16, Int32Array.from([40000]).buffer), Int16Array.from([40000 - 65536]));
});

test("checkInputs takes the typed array of each new dtype", () => {
  const manifest = {
    inputs: [
      { name: "a", dtype: "float64", shape: [2] }, { name: "b", dtype: "float16", shape: [2] },
      { name: "c", dtype: "int8", shape: [2] }, { name: "d", dtype: "uint16", shape: [2] },
    ],
  };
  const inputs = {
    a: { data: new Float64Array(2), shape: [2] }, b: { data: new Uint16Array(2), shape: [2] },
    c: { data: new Int8Array(2), shape: [2] }, d: { data: new Uint16Array(2), shape: [2] },
  };
  assert.deepEqual(checkInputs(manifest, inputs), [[2], [2], [2], [2]]);
  assert.throws(() => checkInputs(manifest, { ...inputs, a: { data: new Float32Array(2), shape: [2] } }),
    /input 'a': expected float64 data \(Float64Array\), got Float32Array/);
});
