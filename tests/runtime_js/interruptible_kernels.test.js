// interruptible_kernels.js: a kernels.wasm rewritten so that a kernel call on the page's thread
// can be stopped at its deadline (the page is not cross-origin isolated: no workers to
// terminate). What a rewritten module computes is unchanged (every wasm backend test in Node
// runs rewritten modules: Node is not isolated); these tests are the stopping itself, on
// modules that run long in each way a module can: a loop, a tree of calls with no loop, bulk
// memory instructions in a loop; and what the rewrite refuses.

import { test, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import { FUEL_REFILL, countedLoopsPerFunction, interruptibleKernels, readLeb } from "../../relaxweb/runtime_js/interruptible_kernels.js";
import { KernelClock, KernelDeadlineError } from "../../relaxweb/runtime_js/wasm_backend.js";
import { PageHost } from "../../relaxweb/runtime_js/page_host.js";
import { WasmModel } from "../../relaxweb/runtime_js/wasm_model.js";

const REPO_ROOT = fileURLToPath(new URL("../../", import.meta.url));
/** @param {string} script @returns {string} */
const python = (script) => execFileSync("python3", ["-c", script], { cwd: REPO_ROOT, encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] });

/** The binary of a WAT module (wasmtime's wat2wasm, as the compiler uses). @param {string} wat @returns {Uint8Array} */
function assemble(wat) {
  const hex = python(`import sys, wasmtime; print(wasmtime.wat2wasm(sys.argv[1]).hex())`.replace("sys.argv[1]", JSON.stringify(wat)));
  return Uint8Array.from(Buffer.from(hex.trim(), "hex"));
}

/**
 * The module rewritten and instantiated with a clock; its exports and how to start a call of at most `timeoutMs`.
 * @param {string} wat @param {number} timeoutMs
 */
async function interruptible(wat, timeoutMs) {
  const memory = new WebAssembly.Memory({ initial: 1, maximum: 65536 });
  const clock = new KernelClock();
  const { instance } = await WebAssembly.instantiate(interruptibleKernels(assemble(wat)), { env: { memory }, relaxweb: { deadline: clock.deadline } });
  return { exports: /** @type {any} */ (instance.exports), start: () => clock.start(timeoutMs) };
}

/** Call `f` with the clock started (`start`): [what it threw, ms it took]. @param {() => void} start @param {() => unknown} f */
function timed(start, f) {
  const started = performance.now();
  start();
  try {
    f();
    return [null, performance.now() - started];
  } catch (error) {
    return [error, performance.now() - started];
  }
}

/** Loops that never end, in each shape the rewrite treats its own way. */
const FOREVER = {
  "repeats by a br at its end": "(loop $forever (br $forever))",
  "repeats by a br_if at its end": "(loop $forever (br_if $forever (i32.const 2)))",
  "repeats from two places": "(loop $forever (br_if $forever (local.get 0)) (br $forever))",
  "has a result": "(drop (loop $forever (result i32) (br $forever)))",
  "inside a loop that ends": "(loop $outer (loop $inner (br_if $inner (i32.const 1))) (br_if $outer (i32.const 0)))",
  // a counted loop (charged its trip count on entry) from 0: 2^32 iterations, more than the fuel: its checked copy runs
  "counts down from 0": "(local.set 0 (i32.const 0)) (loop $count (local.set 0 (i32.sub (local.get 0) (i32.const 1))) (br_if $count (local.get 0)))",
};

for (const [shape, loop] of Object.entries(FOREVER)) {
  test(`a loop that never ends is stopped at its deadline: one that ${shape}`, async () => {
    const { exports, start } = await interruptible(`(module (import "env" "memory" (memory 1 65536))
      (func (export "k0") (param i32) ${loop}))`, 200);
    const [error, ms] = timed(start, () => exports.k0(1));
    assert.ok(error instanceof KernelDeadlineError, String(error));
    assert.match(error.message, /^a kernel call ran for more than 0.2 s and was stopped \(the bundle's kernels.wasm loops/);
    assert.ok(ms >= 200 && ms < 3000, String(ms));
  });
}

test("a tree of calls with no loop (2^40 calls) is stopped: a function that calls spends fuel on entry", async () => {
  const levels = Array.from({ length: 40 }, (_, i) => `(func $f${i} (call $f${i + 1}) (call $f${i + 1}))`).join("\n");
  const { exports, start } = await interruptible(`(module (import "env" "memory" (memory 1 65536))
    ${levels} (func $f40) (export "k0" (func $f0)))`, 200);
  const [error, ms] = timed(start, () => exports.k0());
  assert.ok(error instanceof KernelDeadlineError, String(error));
  assert.ok(ms < 3000, String(ms));
});

test("bulk memory in a loop is charged by the bytes it moves", async () => {
  // 16 pages filled and copied per iteration: about 2 MiB of fuel an iteration, so the clock is asked every iteration
  const { exports, start } = await interruptible(`(module (import "env" "memory" (memory 1 65536))
    (func (export "k0") (drop (memory.grow (i32.const 16)))
      (loop $forever (memory.fill (i32.const 0) (i32.const 7) (i32.const 1048576))
                     (memory.copy (i32.const 0) (i32.const 65536) (i32.const 1048576)) (br $forever))))`, 200);
  const [error, ms] = timed(start, () => exports.k0());
  assert.ok(error instanceof KernelDeadlineError, String(error));
  assert.ok(ms < 3000, String(ms));
});

test("what a rewritten module computes is unchanged: loops, calls (renumbered), locals and a bulk copy", async () => {
  const { exports, start } = await interruptible(`(module (import "env" "memory" (memory 1 65536))
    (func $square (param f32) (result f32) (f32.mul (local.get 0) (local.get 0)))
    (func (export "sum_of_squares") (param $n i32) (result f32) (local $i i32) (local $total f32)
      (i32.store (i32.const 0) (i32.const 3))
      (memory.copy (i32.const 8) (i32.const 0) (i32.const 4))
      (block $done (loop $next (local.set $total (f32.add (local.get $total) (call $square (f32.convert_i32_s (local.get $i)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $done (i32.eq (local.get $i) (i32.const 1000000000)))
        (br_if $next (i32.lt_s (local.get $i) (local.get $n)))))
      (f32.add (local.get $total) (f32.convert_i32_s (i32.load (i32.const 8)))))
    (func (export "count_to") (param $n i32) (result i32) (local $i i32) (local $j i32)
      (block $done (loop $rows
        (br_if $done (i32.ge_s (local.get $i) (local.get $n)))
        (local.set $j (i32.const 0))
        (loop $columns (local.set $j (i32.add (local.get $j) (i32.const 1))) (br_if $columns (i32.lt_s (local.get $j) (i32.const 1000))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $rows)))
      (i32.add (i32.mul (local.get $i) (i32.const 1000)) (local.get $j))))`, 1000);
  start();
  assert.equal(exports.sum_of_squares(4), 0 + 1 + 4 + 9 + 3);
  assert.equal(exports.sum_of_squares(3_000_000) > 0, true); // past several refills of fuel, within the deadline
  assert.equal(exports.count_to(5000), 5_001_000); // 5 million iterations of an inner loop: refills on the way
});

/** The module rewritten, with a deadline import that counts its calls. @param {string} wat */
async function counting(wat) {
  const calls = { deadline: 0 };
  const deadline = () => { calls.deadline += 1; return FUEL_REFILL; };
  const memory = new WebAssembly.Memory({ initial: 1, maximum: 65536 });
  const { instance } = await WebAssembly.instantiate(interruptibleKernels(assemble(wat)), { env: { memory }, relaxweb: { deadline } });
  return { exports: /** @type {any} */ (instance.exports), calls };
}

const WAT_COUNTED = `(module (import "env" "memory" (memory 1 65536))
    (func (export "sum") (param $k i32) (param $mode i32) (result i32) (local $total i32)
      (block $out
        (block $skip
          (loop $sum
            (local.set $total (i32.add (local.get $total) (local.get $k)))
            (br_if $skip (i32.and (i32.eq (local.get $mode) (i32.const 1)) (i32.eq (local.get $k) (i32.const 40))))
            (if (i32.and (i32.eq (local.get $mode) (i32.const 2)) (i32.eq (local.get $k) (i32.const 7)))
              (then (br_table $out $skip (i32.const 0))))
            (if (i32.and (i32.eq (local.get $mode) (i32.const 3)) (i32.eq (local.get $k) (i32.const 3)))
              (then (return (i32.const -3))))
            (local.set $k (i32.sub (local.get $k) (i32.const 1)))
            (br_if $sum (local.get $k))))
        (local.set $total (i32.add (local.get $total) (i32.const 1000000))))
      (local.get $total))
    (func (export "tee") (param $k i32) (result i32) (local $steps i32)
      (loop $tee (local.set $steps (i32.add (local.get $steps) (i32.const 1)))
        (br_if $tee (local.tee $k (i32.sub (local.get $k) (i32.const 1)))))
      (local.get $steps))
    (func (export "by_two") (param $k i32) (result i32) (local $steps i32)
      (loop $by_two (local.set $steps (i32.add (local.get $steps) (i32.const 1)))
        (local.set $k (i32.sub (local.get $k) (i32.const 2))) (br_if $by_two (local.get $k)))
      (local.get $steps))
    (func (export "again") (param $k i32) (result i32)
      (loop $again (br_if $again (i32.eq (local.get $k) (i32.const 5)))
        (local.set $k (i32.sub (local.get $k) (i32.const 1))) (br_if $again (local.get $k)))
      (local.get $k))
    (func (export "reset") (param $k i32) (result i32)
      (loop $reset (if (i32.eq (local.get $k) (i32.const 5)) (then (local.set $k (i32.const 9))))
        (local.set $k (i32.sub (local.get $k) (i32.const 1))) (br_if $reset (local.get $k)))
      (local.get $k)))`;

test("a counted loop is charged its trip count on entry and runs without a check; what it computes is unchanged", async () => {
  // $sum counts $k down: a counted loop (local.set form) inside blocks, leaving by a branch
  // to either (from inside an if: labels past the loop move by the if the rewrite wraps it in)
  // or by a return, as `mode` says. $tee counts with local.tee. Not counted, checked at every
  // iteration: $by_two counts down by 2, $again also repeats from its middle, $reset writes its
  // counter inside.
  const { exports, calls } = await counting(WAT_COUNTED);
  assert.deepEqual(countedLoopsPerFunction(assemble(WAT_COUNTED)), [1, 1, 0, 0, 0]);
  const sum = (/** @type {number} */ from, /** @type {number} */ to) => ((from + to) * (from - to + 1)) / 2;
  assert.equal(exports.sum(100, 0), sum(100, 1) + 1000000); // within the fuel: charged on entry, the unchecked copy
  assert.equal(exports.sum(100, 1), sum(100, 40) + 1000000); // out through $skip
  assert.equal(exports.sum(100, 2), sum(100, 7)); // out through $out, from a br_table
  assert.equal(exports.sum(100, 3), -3);
  assert.equal(calls.deadline, 0);
  const many = 3 * FUEL_REFILL; // more than the fuel: the copy that checks, asking for fuel as it goes
  assert.equal(exports.sum(many, 0), (sum(many, 1) + 1000000) | 0);
  assert.ok(calls.deadline >= 2 && calls.deadline <= 4, String(calls.deadline));
  calls.deadline = 0;
  for (let call = 0; call < 8; call++) assert.equal(exports.tee(FUEL_REFILL / 2), FUEL_REFILL / 2);
  assert.ok(calls.deadline >= 3 && calls.deadline <= 5, `8 entries of half the fuel each: ${calls.deadline} refills`);
  calls.deadline = 0;
  assert.equal(exports.by_two(2 * FUEL_REFILL), FUEL_REFILL);
  assert.equal(calls.deadline, 1);
});

test("the micro-kernels of relaxweb's packed matmuls are counted loops: they run without a check in them", () => {
  const folder = mkdtempSync(join(tmpdir(), "relaxweb-counted-loops-test-"));
  folders.push(folder);
  python(`import numpy as np, onnx, relaxweb; from onnx import helper, TensorProto; from tests.helpers import make_model; ` +
    `m = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", TensorProto.FLOAT, ["n", 96])], ["y"], ` +
    `{"w": np.ones((96, 64), np.float32)}); onnx.save(m, ${JSON.stringify(join(folder, "m.onnx"))}); ` +
    `relaxweb.build(${JSON.stringify(join(folder, "m.onnx"))}, ${JSON.stringify(join(folder, "dist"))})`);
  const counts = countedLoopsPerFunction(readFileSync(join(folder, "dist", "kernels.wasm")));
  assert.ok(counts.some((count) => count >= 1), JSON.stringify(counts));
});

/** A module's sections in order: [id, body, custom section's name]. @param {Uint8Array} bytes */
function sectionsOf(bytes) {
  const sections = [];
  for (let position = 8; position < bytes.length;) {
    const [size, start] = readLeb(bytes, position + 1);
    const body = bytes.subarray(start, start + size);
    let title = null;
    if (bytes[position] === 0) {
      const [length, at] = readLeb(body, 0);
      title = new TextDecoder().decode(body.subarray(at, at + length));
    }
    sections.push({ id: bytes[position], body, title });
    position = start + size;
  }
  return sections;
}

test("every fuel check's if is hinted unlikely, in a branch hint section before the code section", () => {
  const rewritten = interruptibleKernels(assemble(`(module (import "env" "memory" (memory 1 65536))
    (func $leaf (param i32) (result i32) (i32.add (local.get 0) (i32.const 1)))
    (func (export "loop_and_call") (param $n i32) (result i32) (local $i i32)
      (loop $next (local.set $i (call $leaf (local.get $i))) (br_if $next (i32.lt_s (local.get $i) (local.get $n))))
      (local.get $i))
    (func (export "two_loops") (param $n i32) (local $i i32) (local $j i32) (local $k f64)
      (loop $rows (local.set $j (i32.const 0))
        (loop $columns (local.set $j (i32.add (local.get $j) (i32.const 1))) (br_if $columns (i32.lt_s (local.get $j) (i32.const 9))))
        (local.set $i (i32.add (local.get $i) (i32.const 1))) (br_if $rows (i32.lt_s (local.get $i) (local.get $n))))))`));
  const sections = sectionsOf(rewritten);
  const at = sections.findIndex((s) => s.title === "metadata.code.branch_hint");
  assert.ok(at >= 0 && at < sections.findIndex((s) => s.id === 10), "the hints come before the code section");
  const hints = sections[at].body;
  let [, position] = readLeb(hints, 0);
  position += "metadata.code.branch_hint".length;
  const read = () => { const [value, after] = readLeb(hints, position); position = after; return value; };
  const functions = new Map();
  for (let count = read(); count > 0; count--) {
    const index = read();
    const offsets = [];
    for (let n = read(); n > 0; n--) {
      offsets.push(read());
      assert.deepEqual([read(), read()], [1, 0]); // one byte: "likely false"
    }
    functions.set(index, offsets);
  }
  // function 0 is the deadline import: the leaf (1) has no loop and calls nothing
  assert.deepEqual([...functions.keys()], [2, 3]);
  const code = sections.find((s) => s.id === 10).body;
  let [bodies, cursor] = readLeb(code, 0);
  for (let f = 1; bodies > 0; f++, bodies--) {
    const [size, start] = readLeb(code, cursor);
    const body = code.subarray(start, start + size);
    for (const offset of functions.get(f) ?? []) assert.deepEqual([body[offset], body[offset + 1]], [0x04, 0x40], `function ${f}`);
    cursor = start + size;
  }
  assert.equal(functions.get(2).length, 2); // its entry (it calls) and its loop
  assert.equal(functions.get(3).length, 2); // its two loops
  assert.ok(new WebAssembly.Module(rewritten));
});

test("the rewrite refuses what it does not know, naming it", () => {
  assert.throws(() => interruptibleKernels(new Uint8Array([1, 2, 3])), /not a WebAssembly module/);
  const table = assemble(`(module (table 1 funcref) (func $f) (elem (i32.const 0) $f))`);
  assert.throws(() => interruptibleKernels(table), /element section/);
  const truncated = assemble(`(module (func (export "f") (loop (br 0))))`).slice(0, -3);
  assert.throws(() => interruptibleKernels(truncated), /truncated/);
});

const folders = /** @type {string[]} */ ([]);
after(() => {
  for (const folder of folders) rmSync(folder, { recursive: true, force: true });
});

test("a bundle whose kernels loop: the run rejects at the deadline naming the kernel, the model cannot run again, a new load of good kernels runs", async () => {
  const folder = mkdtempSync(join(tmpdir(), "relaxweb-deadline-test-"));
  folders.push(folder);
  const original = python(`from tests.fixtures.handmade_bundle import write_handmade_bundle; from tests.fixtures.handmade_wasm import add_kernels_wasm, HANDMADE_KERNELS; ` +
    `from tests.fixtures.looping_kernels import write_looping_kernels; write_handmade_bundle(${JSON.stringify(folder)}, bound=16); ` +
    `add_kernels_wasm(${JSON.stringify(folder)}, HANDMADE_KERNELS); print(write_looping_kernels(${JSON.stringify(folder)})["kernels.wasm"].hex())`);
  const manifest = JSON.parse(readFileSync(join(folder, "manifest.json"), "utf8"));
  const shards = manifest.shards.map((/** @type {any} */ s) => new Uint8Array(readFileSync(join(folder, s.file))));
  const load = async (/** @type {Uint8Array} */ kernels) => {
    const host = await PageHost.instantiate(readFileSync(join(folder, "host.wasm")), manifest);
    return WasmModel.create(manifest, host, kernels, shards, { ...(await host.configure(undefined)), kernelTimeoutMs: 300 });
  };
  const x = { x: { data: new Float32Array(8), shape: [2, 4] } };
  const looping = await load(readFileSync(join(folder, "kernels.wasm")));
  assert.equal(looping.kernelTimeoutMs, 300);
  const started = performance.now();
  await assert.rejects(looping.run(x), /^Error: kernel add_broadcast failed at call site 0 \(.*\): a kernel call ran for more than 0.3 s and was stopped/);
  assert.ok(performance.now() - started < 3000);
  await assert.rejects(looping.run(x), /cannot run: a kernel call ran for more than 0.3 s and was stopped/);
  looping.dispose();
  const good = await load(Uint8Array.from(Buffer.from(original.trim(), "hex")));
  const { z } = await good.run(x);
  assert.deepEqual(Array.from(z.data), [1, -2.5, 4, 7.5, 1, -2.5, 4, 7.5]);
  good.dispose();
});

test("a looping host module runs on the page's thread: the call rejects at the limit, and so does every later one; a good one answers at once", async () => {
  const folder = mkdtempSync(join(tmpdir(), "relaxweb-host-deadline-test-"));
  folders.push(folder);
  python(`from tests.fixtures.handmade_bundle import write_handmade_bundle; write_handmade_bundle(${JSON.stringify(folder)}, bound=16)`);
  const manifest = JSON.parse(readFileSync(join(folder, "manifest.json"), "utf8"));
  const exports = ["input_shapes", "var_bounds", "var_values", "storage_sizes", "output_shapes", "error_info", "commands",
    "params", "sizes_at_bounds"];
  const looping = await PageHost.instantiate(assemble(`(module (memory (export "memory") 1)
    ${exports.map((name) => `(func (export "${name}") (result i32) (i32.const 64))`).join("\n    ")}
    (func (export "run") (result i32) (loop $forever (br $forever)) (i32.const 0)))`), manifest, 300);
  const started = performance.now();
  await assert.rejects(looping.start([[2, 4]], {}), /^Error: the bundle's host module did not finish start within 0.3 s/);
  assert.ok(performance.now() - started < 3000);
  await assert.rejects(looping.configure(undefined), /did not finish start within 0.3 s/);
  const good = await PageHost.instantiate(readFileSync(join(folder, "host.wasm")), manifest, 300);
  await good.configure(undefined);
  const step = await good.start([[2, 4]], {});
  assert.deepEqual(step.outputShapes, [[2, 4]]);
});

test("damaged modules: the rewrite throws an Error or gives a module that validates wherever the input did", () => {
  const base = assemble(`(module (import "env" "memory" (memory 1 65536))
    (func $twice (param f32) (result f32) (f32.add (local.get 0) (local.get 0)))
    (func (export "k0") (param $n i32) (local $i i32) (local $v v128)
      (block $done (loop $next
        (br_if $done (i32.ge_s (local.get $i) (local.get $n)))
        (local.set $v (f32x4.splat (call $twice (f32.convert_i32_s (local.get $i)))))
        (v128.store (i32.shl (local.get $i) (i32.const 4)) (local.get $v))
        (memory.copy (i32.const 1024) (i32.const 0) (i32.const 64))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next))))
    (func (export "k1") (param $k i32) (local $total f32)
      (block $out (loop $count (local.set $total (f32.add (local.get $total) (f32.const 1)))
        (br_if $out (f32.gt (local.get $total) (f32.const 100)))
        (local.set $k (i32.sub (local.get $k) (i32.const 1))) (br_if $count (local.get $k))))))`);
  assert.deepEqual(countedLoopsPerFunction(base), [0, 0, 1]);
  let seed = 7;
  const random = () => (seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32;
  const outcomes = { rewritten: 0, refused: 0 };
  for (let n = 0; n < 500; n++) {
    const bytes = Uint8Array.from(base);
    for (let edit = 0; edit < 1 + Math.floor(random() * 3); edit++) bytes[Math.floor(random() * bytes.length)] = Math.floor(random() * 256);
    let rewritten;
    try {
      rewritten = interruptibleKernels(bytes);
    } catch (error) {
      assert.ok(error instanceof Error, String(error));
      outcomes.refused += 1;
      continue;
    }
    outcomes.rewritten += 1;
    if (WebAssembly.validate(bytes)) assert.ok(WebAssembly.validate(rewritten), `mutant ${n} validates, its rewrite does not`);
  }
  assert.ok(outcomes.rewritten > 50 && outcomes.refused > 50, JSON.stringify(outcomes));
});
