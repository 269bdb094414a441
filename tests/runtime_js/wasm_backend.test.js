// Node tests of the wasm backend (relaxweb/runtime_js/wasm_backend.js, wasm_model.js): sharedMemoryVariant
// against its Python twin, the split of a dispatch's units, and WasmModel running the
// hand-made bundles (tests/fixtures/handmade_bundle.py) on hand-written kernels.wasm
// (tests/fixtures/handmade_wasm.py) on one thread (Node has no Web Workers nor
// cross-origin isolation: the pool is tested in Chromium, tests/runtime_js/test_wasm_browser.py).

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { createServer } from "node:http";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import { Host, InputShapeError } from "../../relaxweb/runtime_js/host.js";
import { HostSession } from "../../relaxweb/runtime_js/host_session.js";
import { PageHost } from "../../relaxweb/runtime_js/page_host.js";
import { WALL_CLOCK } from "../../relaxweb/runtime_js/profile.js";
import { engineHasRelaxedSimd, lowerRelaxedSimd, useRelaxedSimd } from "../../relaxweb/runtime_js/relaxed_simd.js";
import { RESERVED_BYTES, WasmTensor, prepareKernels, sharedMemoryVariant, threadCount } from "../../relaxweb/runtime_js/wasm_backend.js";
import { splitUnits } from "../../relaxweb/runtime_js/wasm_pool.js";
import { warmUpBlocks, warmUpKernels, warmsUp } from "../../relaxweb/runtime_js/warm_up.js";
import { WasmModel } from "../../relaxweb/runtime_js/wasm_model.js";
import { load } from "../../relaxweb/runtime_js/relaxweb.js";
import { webgpuWeightBytes } from "../../relaxweb/runtime_js/tensors.js";

const REPO_ROOT = fileURLToPath(new URL("../../", import.meta.url));
const WEIGHT = [0.5, -1.25, 2.0, 3.75]; // HANDMADE_WEIGHT
const COUNT_DECOY = -7;

/** Run Python in the repository root; its stdout. @param {string} script @returns {string} */
const python = (script) => execFileSync("python3", ["-c", script], { cwd: REPO_ROOT, encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] });

/** The kernels.wasm of each hand-made bundle (tests/fixtures/handmade_wasm.py). */
const KERNELS_OF = { write_handmade_bundle: "HANDMADE_KERNELS", write_positives_bundle: "POSITIVES_KERNELS", write_int64_bundle: "INT64_KERNELS" };

/**
 * A hand-made bundle with its kernels.wasm, in a fresh temporary folder.
 * @param {"write_handmade_bundle"|"write_positives_bundle"|"write_int64_bundle"} writer @param {string} bound a Python expression
 * @param {string} [trapKernel] a Python expression: the kernel to make trap ("None")
 * @returns {string}
 */
function writeBundle(writer, bound, trapKernel = "None") {
  const folder = mkdtempSync(join(tmpdir(), "relaxweb-wasm-test-"));
  const kernels = KERNELS_OF[writer];
  python(`from tests.fixtures.handmade_bundle import ${writer}; from tests.fixtures.handmade_wasm import add_kernels_wasm, ${kernels}; ` +
    `${writer}(${JSON.stringify(folder)}, bound=${bound}); add_kernels_wasm(${JSON.stringify(folder)}, ${kernels}, trap_kernel=${trapKernel})`);
  folders.push(folder);
  return folder;
}

/**
 * A WasmModel of a bundle folder, as load() makes it (the host module in the page: Node has no Worker).
 * @param {string} folder @param {{warmUp?: boolean}} [options] WasmModel.create's @returns {Promise<WasmModel>}
 */
async function loadWasmModel(folder, options = {}) {
  const manifest = JSON.parse(readFileSync(join(folder, "manifest.json"), "utf8"));
  const host = new PageHost(new HostSession(await Host.instantiate(readFileSync(join(folder, "host.wasm")), manifest)), 10_000);
  const configured = await host.configure(undefined);
  const shards = manifest.shards.map((/** @type {any} */ s) => new Uint8Array(readFileSync(join(folder, s.file))));
  return WasmModel.create(manifest, host, readFileSync(join(folder, "kernels.wasm")), shards, { ...configured, ...options });
}

/** @param {number} rows @returns {Float32Array} */
const input = (rows) => Float32Array.from({ length: rows * 4 }, (_, i) => ((i * 7) % 13) - 6.5);
/** @param {Float32Array} x @returns {number[]} (x + w) * 2 in float32 */
const expected = (x) => Array.from(x, (v, i) => Math.fround(Math.fround(v + WEIGHT[i % 4]) * 2));

/** @type {string[]} */
const folders = [];
let bounded = "";
let unbounded = "";
let positives = "";
let trapping = "";
let int64 = "";

before(() => {
  bounded = writeBundle("write_handmade_bundle", "16");
  unbounded = writeBundle("write_handmade_bundle", "None");
  positives = writeBundle("write_positives_bundle", "None");
  trapping = writeBundle("write_handmade_bundle", "16", "1");
  int64 = writeBundle("write_int64_bundle", "16");
});

after(() => {
  for (const folder of folders) rmSync(folder, { recursive: true, force: true });
});

test("sharedMemoryVariant edits the same byte as Python's shared_memory_variant, and the variant takes a shared memory", async () => {
  const bytes = readFileSync(join(bounded, "kernels.wasm"));
  const variant = sharedMemoryVariant(bytes);
  const pythonVariant = python(
    `from relaxweb.cpu.module import shared_memory_variant; import sys; ` +
    `sys.stdout.write(shared_memory_variant(open(${JSON.stringify(join(bounded, "kernels.wasm"))}, "rb").read()).hex())`);
  assert.equal(Buffer.from(variant).toString("hex"), pythonVariant);
  assert.equal(variant.filter((byte, i) => byte !== bytes[i]).length, 1);
  assert.deepEqual(new Uint8Array(bytes), new Uint8Array(readFileSync(join(bounded, "kernels.wasm"))), "the input is not edited");

  const shared = new WebAssembly.Memory({ initial: 1, maximum: 65536, shared: true });
  const plain = new WebAssembly.Memory({ initial: 1, maximum: 65536 });
  await WebAssembly.instantiate(variant, { env: { memory: shared } });
  await WebAssembly.instantiate(bytes, { env: { memory: plain } });
  await assert.rejects(WebAssembly.instantiate(bytes, { env: { memory: shared } }), WebAssembly.LinkError);
  await assert.rejects(WebAssembly.instantiate(variant, { env: { memory: plain } }), WebAssembly.LinkError);
});

test("sharedMemoryVariant refuses what is not a kernels.wasm", () => {
  assert.throws(() => sharedMemoryVariant(new Uint8Array([1, 2, 3])), /not a WebAssembly module/);
  const header = [0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00];
  assert.throws(() => sharedMemoryVariant(new Uint8Array(header)), /has no memory import/);
  // an import section with one function import: "env" "f" (func type 0)
  const functionImport = [0x02, 0x09, 0x01, 0x03, 0x65, 0x6e, 0x76, 0x01, 0x66, 0x00, 0x00];
  assert.throws(() => sharedMemoryVariant(new Uint8Array([...header, ...functionImport])), /imports something other than its memory/);
  // a memory import already shared: limits flag 0x03
  const sharedImport = [0x02, 0x0f, 0x01, 0x03, 0x65, 0x6e, 0x76, 0x06, 0x6d, 0x65, 0x6d, 0x6f, 0x72, 0x79, 0x02, 0x03, 0x01, 0x01];
  assert.throws(() => sharedMemoryVariant(new Uint8Array([...header, ...sharedImport])), /not a non-shared memory with a maximum/);
});

test("splitUnits: contiguous ranges covering [0, units), a unit a thread at least, the calling thread's first", () => {
  assert.deepEqual(splitUnits(0, 4), [[0, 0]]);
  assert.deepEqual(splitUnits(1, 4), [[0, 1]]); // one unit: nothing to share
  assert.deepEqual(splitUnits(2, 2), [[0, 1], [1, 2]]); // a matrix-vector product of two column blocks
  assert.deepEqual(splitUnits(3, 4), [[0, 1], [1, 2], [2, 3]]);
  assert.deepEqual(splitUnits(7, 2), [[0, 3], [3, 7]]); // a 7-unit convolution on two threads
  assert.deepEqual(splitUnits(14, 3), [[0, 4], [4, 9], [9, 14]]);
  assert.deepEqual(splitUnits(8, 4, 2), [[0, 2], [2, 4], [4, 6], [6, 8]]);
  assert.deepEqual(splitUnits(5, 4, 2), [[0, 2], [2, 5]]); // at least 2 a thread: two threads
  assert.deepEqual(splitUnits(1000, 1), [[0, 1000]]);
  for (const [units, threads] of [[1, 2], [17, 4], [100, 3], [4097, 4], [65, 16]]) {
    const ranges = splitUnits(units, threads);
    assert.ok(ranges.length <= threads && ranges.length >= 1);
    assert.equal(ranges[0][0], 0);
    assert.equal(ranges[ranges.length - 1][1], units);
    for (let i = 1; i < ranges.length; i++) assert.equal(ranges[i][0], ranges[i - 1][1]);
    const sizes = ranges.map(([a, b]) => b - a);
    assert.ok(Math.max(...sizes) - Math.min(...sizes) <= 1, `${units} units on ${threads}: ${sizes}`);
    if (ranges.length > 1) assert.ok(Math.min(...sizes) >= 1);
  }
});

test("threadCount: one thread where the page is not cross-origin isolated; the option is checked", () => {
  assert.equal(globalThis.crossOriginIsolated, undefined);
  assert.equal(threadCount(undefined), 1);
  assert.equal(threadCount(8), 1);
  assert.throws(() => threadCount(0), /threads must be an integer from 1 to 256, got 0/);
  assert.throws(() => threadCount(2.5), /threads must be an integer/);
});

test("a bounded bundle runs on kernels.wasm: the outputs of (x + w) * 2, at every batch size", async () => {
  const model = await loadWasmModel(bounded);
  assert.equal(model.backend, "wasm");
  assert.equal(model.threads, 1);
  assert.equal(model.unitsRunByWorkers, 0);
  for (const rows of [5, 16, 1, 0]) {
    const x = input(rows);
    const { z } = await model.run({ x: { data: x, shape: [rows, 4] } });
    assert.deepEqual(z.shape, [rows, 4]);
    assert.ok(z.data instanceof Float32Array);
    assert.deepEqual(Array.from(z.data), expected(x));
  }
  assert.equal(model.lastDispatchCount, 2);
  // every buffer lies above the reserved first 64 KiB, 16-byte aligned
  const memory = model.runBackend;
  for (const address of [memory.paramsBase, ...memory.weightAddresses, ...memory.storageAddresses]) {
    assert.ok(address >= RESERVED_BYTES && address % 16 === 0, String(address));
  }
  model.dispose();
  await assert.rejects(model.run({ x: { data: input(1), shape: [1, 4] } }), /cannot run: the model was disposed/);
});

test("a run copies its inputs when it is called: arrays changed before it runs, or runs queued behind it, change nothing", async () => {
  const model = await loadWasmModel(bounded);
  const x = input(5);
  const want = expected(x);
  const spares = model.runBackend.inputCopies.spare;
  await model.run({ x: { data: x, shape: [5, 4] } });
  const spare = spares.get("x"); // the first run's copy, free once its input was in the memory
  assert.ok(spare instanceof Float32Array && spare !== x);
  // three runs called at once: the first copies into the spare array, the others into new ones
  const changed = x.slice();
  const runs = [model.run({ x: { data: changed, shape: [5, 4] } })];
  assert.equal(spares.has("x"), false); // taken by the first run until its input is in the memory
  changed.fill(100); // after run() returned its promise: the run uses what it was called with
  runs.push(model.run({ x: { data: changed, shape: [5, 4] } }), model.run({ x: { data: x, shape: [5, 4] } }));
  changed.fill(-1);
  const [first, second, third] = await Promise.all(runs);
  assert.deepEqual(Array.from(first.z.data), want);
  assert.deepEqual(Array.from(second.z.data), expected(new Float32Array(20).fill(100)));
  assert.deepEqual(Array.from(third.z.data), want);
  assert.ok(spares.get("x") instanceof Float32Array); // given back
  model.dispose();
});

test("an unbounded bundle's storages grow at run time, laid out again before a run: the memory stops growing", async () => {
  const model = await loadWasmModel(unbounded);
  const grown = [];
  for (const rows of [3, 200, 40, 5000, 200, 5000, 4999]) {
    const x = input(rows);
    const { z } = await model.run({ x: { data: x, shape: [rows, 4] } });
    assert.deepEqual(Array.from(z.data), expected(x));
    grown.push(model.runBackend.memory.buffer.byteLength);
  }
  assert.ok(grown[3] > grown[0], "5000 rows need more memory");
  assert.deepEqual(grown.slice(3), [grown[3], grown[3], grown[3], grown[3]], "regions are reused");
  assert.ok(model.runBackend.memory.buffer.byteLength >= model.runBackend.top + 65536, "64 KiB of slack after the last buffer");
  model.dispose();
});

test("reads, resumes and growth between steps: y = x[x > 0] with its length read back", async () => {
  const model = await loadWasmModel(positives);
  for (const x of [[1, -2, 3, 0, 5], [-1, -2], Array.from({ length: 300 }, (_, i) => (i % 3) - 1)]) {
    const { y } = await model.run({ x: { data: Float32Array.from(x), shape: [x.length] } });
    const positive = x.filter((v) => v > 0);
    assert.deepEqual(y.shape, [positive.length]);
    assert.deepEqual(Array.from(y.data), positive);
    assert.equal(model.lastReadCount, 1);
    assert.equal(model.lastDispatchCount, 3);
  }
  assert.notEqual(COUNT_DECOY, 0); // the kernel writes the decoy at byte 0 and k at byte 4: the read takes byte 4
  model.dispose();
});

test("input errors are the host module's and the shared checks' InputShapeErrors, as on WebGPU", async () => {
  const model = await loadWasmModel(bounded);
  await assert.rejects(model.run({ x: { data: input(17), shape: [17, 4] } }),
    (error) => error instanceof InputShapeError && error.message === "input 'x': dimension 0 (n) is 17, above its bound 16");
  await assert.rejects(model.run({ x: { data: input(2), shape: [2, 3] } }),
    (error) => error instanceof InputShapeError && /input 'x'/.test(error.message));
  await assert.rejects(model.run({ y: { data: input(1), shape: [1, 4] } }),
    (error) => error instanceof InputShapeError && error.message.startsWith("unknown input 'y'"));
  const { z } = await model.run({ x: { data: input(2), shape: [2, 4] } }); // still usable
  assert.deepEqual(Array.from(z.data), expected(input(2)));
  model.dispose();
});

test("keepOnGpu keeps outputs in the model's memory as WasmTensors, which run takes back", async () => {
  const model = await loadWasmModel(bounded);
  const { z } = await model.run({ x: { data: input(2), shape: [2, 4] } }, { keepOnGpu: ["z"] });
  assert.ok(z instanceof WasmTensor && z.cacheView === null);
  assert.deepEqual([z.name, z.dtype, z.shape, z.byteLength], ["z", "float32", [2, 4], 32]);
  assert.equal(model.stats.lastRun.bytesRead, 32); // its copy, made at the run's end
  assert.deepEqual(Array.from((await z.read()).data), expected(input(2)));
  const again = await model.run({ x: z }); // given back: its bytes written as the input
  assert.deepEqual(Array.from(again.z.data), expected(Float32Array.from(expected(input(2)))));
  assert.equal(model.stats.lastRun.inputBytesWritten, 32);
  z.dispose();
  await assert.rejects(model.run({ x: z }), /input 'x': tensor 'z' was disposed/);
  await assert.rejects(model.run({ x: { data: input(1), shape: [1, 4] } }, { keepOnGpu: ["w"] }), /keepOnGpu names unknown output 'w'/);
  await assert.rejects(model.runBatch([{ x: { data: input(1), shape: [1, 4] } }], { keepOnGpu: true }), /keepOnGpu is an option of run/);
  await assert.rejects(model.generate([1, 2]), /this bundle cannot generate: it has no input 'input_ids'/);
  model.dispose();
});

test("a kernel trap rejects the run naming the kernel and its call site", async () => {
  const model = await loadWasmModel(trapping);
  await assert.rejects(model.run({ x: { data: input(2), shape: [2, 4] } }),
    /kernel multiply_by_two failed at call site 1 \(z = multiply_by_two\(y\)\): unreachable/);
  model.dispose();
});

test("profile: one row per kernel from the dispatches' wall-clock times", async () => {
  const model = await loadWasmModel(bounded);
  const x = input(16);
  const { outputs, profile } = await model.profile({ x: { data: x, shape: [16, 4] } });
  assert.deepEqual(Array.from(outputs.z.data), expected(x));
  assert.equal(profile.method, WALL_CLOCK);
  assert.equal(profile.dispatches, 2);
  assert.deepEqual(profile.rows.map((row) => row.kernel).sort(), ["add_broadcast", "multiply_by_two"]);
  for (const row of profile.rows) assert.ok(row.calls === 1 && row.totalMs >= 0);
  model.dispose();
});

// int64: kernels.wasm holds an int64 tensor as an 8-byte int64 (the manifest's wasm_dtype, bundle
// format 3), so values beyond int32 go in and come back exactly (the int64 bundle: z = (x + w) * 2
// on i64, its weight int64 in the shard, as kernels.wasm holds it: the GPU narrows it).

const INT64_WEIGHT = [5n, -7n, 2n ** 31n - 1n, -(2n ** 31n)];
/** Values beyond int32 and within it, 3 rows of 4. */
const BEYOND_INT32 = BigInt64Array.from([2n ** 31n, -(2n ** 31n) - 1n, 2n ** 40n, -(2n ** 40n) + 3n,
  2n ** 62n + 1n, -(2n ** 62n), 2n ** 63n - 1n, -(2n ** 63n), 0n, -1n, 2n ** 31n - 1n, 7n]);
/** (x + w) * 2 in int64, wrapping. @param {ArrayLike<bigint|number>} x @returns {bigint[]} */
const expectedInt64 = (x) => Array.from(x, (v, i) => BigInt.asIntN(64, (BigInt(v) + INT64_WEIGHT[i % 4]) * 2n));

test("int64 inputs and outputs are 8-byte int64 in kernels.wasm's memory: values beyond int32 exactly", async () => {
  const model = await loadWasmModel(int64);
  const { z } = await model.run({ x: { data: BEYOND_INT32, shape: [3, 4] } });
  assert.ok(z.data instanceof BigInt64Array);
  assert.deepEqual(Array.from(z.data), expectedInt64(BEYOND_INT32));
  assert.equal(z.data[2], (2n ** 40n + 2n ** 31n - 1n) * 2n);
  assert.deepEqual([model.stats.lastRun.inputBytesWritten, model.stats.lastRun.bytesRead], [96, 96]);
  // an Int32Array for the int64 input: sign-extended
  const x32 = Int32Array.from([-1, -(2 ** 31), 2 ** 31 - 1, 3]);
  const widened = await model.run({ x: { data: x32, shape: [1, 4] } });
  assert.deepEqual(Array.from(widened.z.data), expectedInt64(x32));
  assert.equal(model.stats.lastRun.inputBytesWritten, 32);
  // the shard's int64 weight copied as it is (32 bytes): -2^31 * 2 needs the high word's sign
  assert.equal(model.stats.total.weightBytesWritten, 32);
  const zeros = await model.run({ x: { data: new BigInt64Array(4), shape: [1, 4] } });
  assert.deepEqual(Array.from(zeros.z.data), INT64_WEIGHT.map((w) => 2n * w));
  // runBatch runs one by one, each instance held the same way
  const [one, three] = await model.runBatch([{ x: { data: BEYOND_INT32.slice(0, 4), shape: [1, 4] } }, { x: { data: BEYOND_INT32, shape: [3, 4] } }]);
  assert.deepEqual(Array.from(one.z.data), expectedInt64(BEYOND_INT32.slice(0, 4)));
  assert.deepEqual(Array.from(three.z.data), expectedInt64(BEYOND_INT32));
  await assert.rejects(model.run({ x: { data: new Float32Array(4), shape: [1, 4] } }),
    (error) => error instanceof InputShapeError && error.message.startsWith("input 'x': expected int64 data (BigInt64Array or Int32Array)"));
  model.dispose();
});

test("a kept int64 tensor holds int64 and goes back as an input", async () => {
  const model = await loadWasmModel(int64);
  const { z } = await model.run({ x: { data: BEYOND_INT32, shape: [3, 4] } }, { keepOnGpu: ["z"] });
  assert.ok(z instanceof WasmTensor);
  assert.deepEqual([z.dtype, z.byteLength], ["int64", 96]);
  assert.ok(z.deviceData() instanceof BigInt64Array); // as the memory holds it
  assert.deepEqual(Array.from((await z.read()).data), expectedInt64(BEYOND_INT32));
  const again = await model.run({ x: z });
  assert.deepEqual(Array.from(again.z.data), expectedInt64(expectedInt64(BEYOND_INT32)));
  assert.equal(model.stats.lastRun.inputBytesWritten, 96);
  model.dispose();
});

/**
 * A model built into a new folder, and onnxruntime's int64 outputs for `values` (as strings).
 * @param {string} imports Python importing what `model` needs @param {string} model a Python
 * expression of the ONNX model @param {string[]} values its int64 input `x`
 * @returns {{folder: string, expectedValues: string[]}}
 */
function buildInt64Model(imports, model, values) {
  const folder = mkdtempSync(join(tmpdir(), "relaxweb-wasm-test-"));
  folders.push(folder);
  const expectedValues = JSON.parse(python(
    `import json, numpy as np, relaxweb; from tests.helpers import onnxruntime_outputs; ${imports}; m = ${model}; ` +
    `relaxweb.build(m, ${JSON.stringify(folder)}); x = np.array([${values.join(", ")}], np.int64); ` +
    "print(json.dumps([str(v) for v in onnxruntime_outputs(m, {'x': x})[0].tolist()]))"));
  return { folder, expectedValues };
}

test("a compiled int64 Add and Mul by 5 matches onnxruntime around 2^31 and 2^40 on kernels.wasm", async () => {
  const values = ["2147483647", "2147483648", "-2147483653", "1099511627776", "-1099511627775", "3"];
  const { folder, expectedValues } = buildInt64Model("from tests.runtime.test_wasm_int64 import int64_add_mul_model",
    "int64_add_mul_model()", values);
  const model = await loadWasmModel(folder);
  const x = BigInt64Array.from(values, BigInt);
  const { y } = await model.run({ x: { data: x, shape: [x.length] } });
  assert.deepEqual(Array.from(y.data, String), expectedValues);
  model.dispose();
});

// An int64 weight outside int32 (2^53 + 1): the shards hold it as int64, the manifest says
// WebGPU cannot run the bundle (webgpu.unavailable); kernels.wasm answers onnxruntime's values
// exactly; load() refuses backend "webgpu" naming the weight, and "auto" takes wasm saying why
// (served over HTTP: load() fetches the bundle; Node has no Worker, so the host module runs in
// the page, and no navigator.gpu: "auto" asks for no adapter here anyway).

/** Serve `folder` on localhost; its URL and a function that stops the server. @param {string} folder */
async function serveFolder(folder) {
  const server = createServer((request, response) => {
    try {
      const body = readFileSync(join(folder, decodeURIComponent(new URL(request.url ?? "/", "http://x").pathname)));
      response.writeHead(200).end(body);
    } catch {
      response.writeHead(404).end();
    }
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(null)));
  const { port } = /** @type {import("node:net").AddressInfo} */ (server.address());
  return { url: `http://127.0.0.1:${port}/`, close: () => new Promise((resolve) => server.close(() => resolve(null))) };
}

test("a compiled int64 constant outside int32 runs exactly on kernels.wasm; load() refuses webgpu and auto says why", async () => {
  const values = ["0", "-3", "2147483648", "1099511627776", "-1099511627769", "-9007199254740993"];
  const { folder, expectedValues } = buildInt64Model("from tests.e2e.test_integer_arithmetic import BIG, _constant_model",
    "_constant_model('Add', np.array(BIG, np.int64))", values);
  const reason = "weight 'c' (int64) holds 9007199254740993, outside the int32 range the GPU holds int64 tensors in";
  const manifest = JSON.parse(readFileSync(join(folder, "manifest.json"), "utf8"));
  assert.deepEqual(manifest.webgpu, { unavailable: reason });
  assert.equal(manifest.weights[0].nbytes, 8);
  const x = BigInt64Array.from(values, BigInt);
  const direct = await loadWasmModel(folder);
  assert.deepEqual(Array.from((await direct.run({ x: { data: x, shape: [x.length] } })).y.data, String), expectedValues);
  direct.dispose();

  const served = await serveFolder(folder);
  const info = console.info;
  console.info = () => {};
  try {
    await assert.rejects(load(served.url, { backend: "webgpu" }),
      { message: `WebGPU cannot run this bundle: ${reason}; load it with backend "wasm"` });
    const model = await load(served.url);
    assert.deepEqual([model.backend, model.backendReason], ["wasm", `WebGPU cannot run this bundle: ${reason}`]);
    assert.deepEqual(Array.from((await model.run({ x: { data: x, shape: [x.length] } })).y.data, String), expectedValues);
    model.dispose();
  } finally {
    console.info = info;
    await served.close();
  }
});

test("useRelaxedSimd: where the kernels multiply and add and the engine compiles it; false never", () => {
  const relaxed = { file: "kernels.wasm", relaxed_madd_sites: 12, scratch_bytes: 0 };
  const plain = { file: "kernels.wasm", scratch_bytes: 0 };
  const here = engineHasRelaxedSimd();
  assert.equal(useRelaxedSimd(relaxed, undefined), here);
  assert.equal(useRelaxedSimd(relaxed, false), false);
  assert.equal(useRelaxedSimd(plain, undefined), false);
  assert.throws(() => useRelaxedSimd(plain, true), /relaxedSimd: true, but the bundle's kernels use no relaxed SIMD/);
  assert.throws(() => useRelaxedSimd(relaxed, /** @type {any} */ ("yes")), /relaxedSimd must be true or false/);
  if (here) assert.equal(useRelaxedSimd(relaxed, true), true);
  else assert.throws(() => useRelaxedSimd(relaxed, true), /relaxedSimd: true, but this engine does not compile relaxed SIMD/);
});

// A compiled MatMul's kernels.wasm has relaxed multiply-add sites (relaxweb/cpu/relaxed_simd.py);
// load() runs them relaxed where the engine takes it (Node 20 does not, relaxed SIMD being
// behind a flag; Chromium's is tested in test_wasm_browser.py), else lowered to plain SIMD128,
// and lowered when asked. The lowering is byte for byte runtime/relaxed_simd.py's.
test("load() runs a compiled MatMul with relaxed SIMD where the engine takes it, lowered with relaxedSimd: false", async () => {
  const folder = mkdtempSync(join(tmpdir(), "relaxweb-wasm-test-"));
  folders.push(folder);
  const [expectedY, lowered] = JSON.parse(python(
    "import hashlib, json, numpy as np, relaxweb; from onnx import TensorProto, helper; from tests.helpers import make_model, rand; " +
    "from relaxweb.runtime.relaxed_simd import lower_relaxed_simd; " +
    "w = rand(24, 40, seed=1); m = make_model([helper.make_node('MatMul', ['x', 'w'], ['y'])], " +
    "[('x', TensorProto.FLOAT, ['n', 24])], ['y'], {'w': w}); " +
    `relaxweb.build(m, ${JSON.stringify(folder)}); x = np.arange(9 * 24, dtype=np.float32).reshape(9, 24) % 7 - 3; ` +
    `manifest = json.load(open(${JSON.stringify(join(folder, "manifest.json"))})); ` +
    `wasm = open(${JSON.stringify(join(folder, "kernels.wasm"))}, 'rb').read(); ` +
    "print(json.dumps([(x.astype(np.float64) @ w.astype(np.float64)).ravel().tolist(), " +
    "hashlib.sha256(lower_relaxed_simd(wasm, manifest['wasm']['relaxed_madd_sites'])).hexdigest()]))"));
  const manifest = JSON.parse(readFileSync(join(folder, "manifest.json"), "utf8"));
  assert.ok(manifest.wasm.relaxed_madd_sites > 0);
  const kernels = readFileSync(join(folder, "kernels.wasm"));
  assert.equal(createHash("sha256").update(lowerRelaxedSimd(kernels, manifest.wasm.relaxed_madd_sites)).digest("hex"), lowered);
  assert.throws(() => lowerRelaxedSimd(kernels, manifest.wasm.relaxed_madd_sites + 1),
    { message: `the bundle's kernels.wasm cannot be lowered to plain SIMD128 (${manifest.wasm.relaxed_madd_sites} relaxed ` +
      `multiply-adds where the manifest counts ${manifest.wasm.relaxed_madd_sites + 1}): the bundle is damaged` });
  const x = Float32Array.from({ length: 9 * 24 }, (_, i) => (i % 7) - 3);
  const served = await serveFolder(folder);
  const info = console.info;
  console.info = () => {};
  try {
    for (const relaxedSimd of [undefined, false]) {
      const model = /** @type {WasmModel} */ (await load(served.url, { backend: "wasm", relaxedSimd }));
      assert.equal(model.relaxedSimd, relaxedSimd === undefined && engineHasRelaxedSimd());
      const { y } = await model.run({ x: { data: x, shape: [9, 24] } });
      y.data.forEach((/** @type {number} */ value, /** @type {number} */ i) => assert.ok(Math.abs(value - expectedY[i]) <= 1e-4 + 1e-5 * Math.abs(expectedY[i]), `y[${i}]`));
      model.dispose();
    }
    if (!engineHasRelaxedSimd()) {
      await assert.rejects(load(served.url, { backend: "wasm", relaxedSimd: true }),
        { message: "relaxedSimd: true, but this engine does not compile relaxed SIMD" });
    }
  } finally {
    console.info = info;
    await served.close();
  }
});

test("a compiled MatMul's weight is packed at load into its prepacked region and read there", async () => {
  const folder = mkdtempSync(join(tmpdir(), "relaxweb-wasm-test-"));
  folders.push(folder);
  const w = JSON.parse(python(
    "import json, relaxweb; from onnx import TensorProto, helper; from tests.helpers import make_model, rand; " +
    "w = rand(24, 40, seed=1); m = make_model([helper.make_node('MatMul', ['x', 'w'], ['y'])], " +
    `[('x', TensorProto.FLOAT, ['n', 24])], ['y'], {'w': w}); relaxweb.build(m, ${JSON.stringify(folder)}); ` +
    "print(json.dumps(w.astype(float).ravel().tolist()))"));
  const manifest = JSON.parse(readFileSync(join(folder, "manifest.json"), "utf8"));
  const [region] = manifest.wasm.prepacked;
  assert.deepEqual([region.call_site, region.bytes], [0, 16 + 5 * 8 * 24 * 4]); // 40 columns: 5 blocks of 8
  const model = await loadWasmModel(folder);
  const backend = /** @type {any} */ (model.runBackend);
  const address = backend.prepackedRegions.get(0);
  assert.deepEqual(Array.from(new Uint32Array(backend.memory.buffer, address, 2)), [1, region.bytes]); // packed at load
  const check = async (/** @type {number} */ rows) => {
    const x = Float32Array.from({ length: rows * 24 }, (_, i) => ((i * 7) % 11) - 5);
    const out = await model.run({ x: { data: x, shape: [rows, 24] } });
    out.y.data.forEach((/** @type {number} */ v, /** @type {number} */ i) => {
      let sum = 0;
      for (let k = 0; k < 24; k++) sum += x[Math.floor(i / 40) * 24 + k] * w[k * 40 + (i % 40)];
      assert.ok(Math.abs(v - sum) <= 1e-4, `y[${i}] at ${rows} rows`);
    });
  };
  await check(2); // the matrix-vector tier, which reads the weight as it is
  await check(9);
  new Float32Array(backend.memory.buffer, backend.weightAddresses[0], 24 * 40).fill(0);
  await check(33); // the panels, not the zeroed weight
  model.dispose();
});

// The load's warm-up (warm_up.js) calls every kernel with no units: on a compiled model of
// many kernel kinds (convolutions, matmuls, pooling, softmax) it warms them all, and calling
// it again writes nothing outside the reserved bytes [0, 65536).
test("warmsUp: the load option, else models of 4 MiB of weights and more", () => {
  const weights = (/** @type {number[]} */ ...sizes) => ({ weights: sizes.map((nbytes) => ({ nbytes })) });
  assert.equal(warmsUp(weights(1 << 20, 2 << 20), undefined), false);
  assert.equal(warmsUp(weights(1 << 20, 3 << 20), undefined), true);
  assert.equal(warmsUp(weights(), true), true);
  assert.equal(warmsUp(weights(64 << 20), false), false);
  assert.throws(() => warmsUp(weights(), /** @type {any} */ ("yes")), /warmUp must be true or false/);
});

/** @type {string|null} */
let convModelFolder = null;

/**
 * A compiled model of many kernel kinds (convolutions, matmuls, pooling, softmax), built once.
 * @returns {string} its bundle folder
 */
function convModel() {
  if (convModelFolder) return convModelFolder;
  const folder = mkdtempSync(join(tmpdir(), "relaxweb-wasm-test-"));
  folders.push(folder);
  python("import relaxweb; from onnx import TensorProto, helper; from tests.helpers import make_model, rand; " +
    "m = make_model([helper.make_node('Conv', ['x', 'k'], ['c'], pads=[1, 1, 1, 1]), helper.make_node('Relu', ['c'], ['r']), " +
    "helper.make_node('MaxPool', ['r'], ['p'], kernel_shape=[2, 2], strides=[2, 2]), " +
    "helper.make_node('Conv', ['p', 'd'], ['q'], group=8, pads=[1, 1, 1, 1]), helper.make_node('GlobalAveragePool', ['q'], ['g']), " +
    "helper.make_node('Flatten', ['g'], ['f']), helper.make_node('Gemm', ['f', 'w', 'b'], ['l']), " +
    "helper.make_node('Softmax', ['l'], ['y'])], [('x', TensorProto.FLOAT, ['batch', 3, 'height', 'width'])], ['y'], " +
    "{'k': rand(8, 3, 3, 3), 'd': rand(8, 1, 3, 3, seed=1), 'w': rand(8, 5, seed=2), 'b': rand(5, seed=3)}); " +
    `relaxweb.build(m, ${JSON.stringify(folder)})`);
  convModelFolder = folder;
  return folder;
}

test("the warm-up calls every kernel of a compiled model and writes nothing outside the reserved bytes", async () => {
  const folder = convModel();
  assert.equal((await loadWasmModel(folder)).runBackend.warmUp.kernels, 0); // a model this small is not warmed by default
  const model = await loadWasmModel(folder, { warmUp: true });
  const backend = model.runBackend;
  const kernels = model.manifest.kernels.length;
  assert.ok(kernels >= 3);
  assert.equal(backend.warmUp.kernels, kernels);
  const before = new Uint8Array(backend.memory.buffer).slice(RESERVED_BYTES);
  const again = warmUpKernels((/** @type {number} */ k) => backend.kernelFunctions[k].main,
    warmUpBlocks(model.manifest, backend.paramsBase), new Int32Array(backend.memory.buffer),
    (/** @type {number} */ ms) => backend.clock.start(ms));
  assert.equal(again.kernels, kernels);
  const after = new Uint8Array(backend.memory.buffer).slice(RESERVED_BYTES);
  assert.equal(after.length, before.length);
  assert.ok(after.every((byte, i) => byte === before[i]), "the warm-up wrote outside the reserved bytes");
  model.dispose();
});

test("prepareKernels compiles and warms up the kernels on a memory of their own; create() runs that module", async () => {
  const folder = convModel();
  const manifest = JSON.parse(readFileSync(join(folder, "manifest.json"), "utf8"));
  const bytes = readFileSync(join(folder, "kernels.wasm"));
  const prepared = await prepareKernels(manifest, bytes, { relaxedSimd: false, warmUp: true });
  assert.ok(prepared && prepared.module instanceof WebAssembly.Module);
  assert.equal(prepared.warmUp?.kernels, manifest.kernels.length);
  assert.equal((await prepareKernels(manifest, bytes, { relaxedSimd: false, warmUp: false }))?.warmUp, null);
  assert.equal(await prepareKernels(manifest, new Uint8Array([0, 1, 2]), { relaxedSimd: false }), null); // create reports it
  const compile = WebAssembly.compile;
  let compiles = 0;
  WebAssembly.compile = (/** @type {any} */ b) => { compiles += 1; return compile(b); };
  try {
    const model = await loadWasmModel(folder, { warmUp: true, prepared });
    assert.equal(compiles, 0);
    assert.equal(model.runBackend.warmUp, prepared.warmUp);
    const other = await loadWasmModel(folder, { warmUp: true, prepared: { ...prepared, relaxedSimd: true } }); // made for the other choice
    assert.equal(compiles, 1);
    const plain = await loadWasmModel(folder, { warmUp: true });
    const x = { data: Float32Array.from({ length: 2 * 3 * 6 * 6 }, (_, i) => Math.sin(i)), shape: [2, 3, 6, 6] };
    const [a, b] = [await model.run({ x }), await plain.run({ x })];
    assert.deepEqual(Array.from(a.y.data), Array.from(b.y.data));
    for (const m of [model, other, plain]) m.dispose();
  } finally {
    WebAssembly.compile = compile;
  }
});

test("webgpuWeightBytes narrows an int64 weight to int32 and names one outside int32", () => {
  const int64 = { bytes: 8, kind: "int", device_dtype: "int32", device_bytes: 4, wasm_dtype: "int64", wasm_bytes: 8 };
  const wide = new Uint8Array(BigInt64Array.from([3n, -7n, 2n ** 31n - 1n, -(2n ** 31n)]).buffer);
  const narrow = webgpuWeightBytes({ name: "c", dtype: "int64" }, wide, int64);
  assert.deepEqual(Array.from(new Int32Array(narrow.buffer, narrow.byteOffset, 4)), [3, -7, 2 ** 31 - 1, -(2 ** 31)]);
  const float32 = { bytes: 4, kind: "float", device_dtype: "float32", device_bytes: 4, wasm_dtype: "float32", wasm_bytes: 4 };
  assert.equal(webgpuWeightBytes({ name: "w", dtype: "float32" }, wide, float32), wide); // the same bytes
  const beyond = new Uint8Array(BigInt64Array.from([1n, 2n ** 40n]).buffer);
  assert.throws(() => webgpuWeightBytes({ name: "big\nname", dtype: "int64" }, beyond, int64),
    { message: "weight 'big\\nname' (int64) holds 1099511627776, outside the int32 range the GPU holds int64 tensors in, " +
      "and the manifest does not say that WebGPU cannot run it (webgpu.unavailable): the bundle is damaged" });
});
