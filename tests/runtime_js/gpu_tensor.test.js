// Node tests of relaxweb/runtime_js/gpu_tensor.js (GpuTensor, BufferPool, TransferStats) and of
// host.js's checks of GpuTensor inputs: no GPU needed (buffers are stand-ins with a size).
// The runs themselves are tested in Chromium (tests/runtime/test_gpu_tensors.py).

import { test } from "node:test";
import assert from "node:assert/strict";

import { BufferPool, GpuTensor, TransferStats } from "../../relaxweb/runtime_js/gpu_tensor.js";
import { InputShapeError, checkInputs } from "../../relaxweb/runtime_js/host.js";

/** A stand-in GPUBuffer: its size, and whether it was destroyed. */
const fakeBuffer = (size) => ({ size, destroyed: false, destroy() { this.destroyed = true; } });
const fakeModel = () => ({ device: {}, gpuTensorPool: new BufferPool(), readGpuTensor: async () => null });

test("a pool gives the smallest buffer that fits, once", () => {
  const pool = new BufferPool();
  const [small, large, medium] = [fakeBuffer(16), fakeBuffer(1024), fakeBuffer(256)];
  for (const buffer of [small, large, medium]) pool.give(buffer);
  assert.equal(pool.take(100), medium);
  assert.equal(pool.take(100), large);
  assert.equal(pool.take(100), null);
  assert.equal(pool.take(16), small);
});

test("a closed pool destroys what it holds and what it is given later", () => {
  const pool = new BufferPool();
  const [held, later] = [fakeBuffer(16), fakeBuffer(16)];
  pool.give(held);
  pool.close();
  pool.give(later);
  assert.ok(held.destroyed && later.destroyed);
  assert.equal(pool.take(16), null);
});

test("stats count into the total and into the last run, which each run resets", () => {
  const stats = new TransferStats();
  stats.add("buffersCreated");
  stats.add("weightBytesWritten", 64);
  stats.startRun();
  stats.add("inputBytesWritten", 12);
  stats.add("bytesRead", 4);
  assert.deepEqual(stats.lastRun, { buffersCreated: 0, inputBytesWritten: 12, paramsBytesWritten: 0, weightBytesWritten: 0, bytesRead: 4 });
  assert.deepEqual(stats.total, { buffersCreated: 1, inputBytesWritten: 12, paramsBytesWritten: 0, weightBytesWritten: 64, bytesRead: 4 });
});

test("a disposed GpuTensor gives its buffer back once and refuses to be used", () => {
  const model = fakeModel();
  const buffer = fakeBuffer(64);
  const tensor = new GpuTensor(model, "present", "float32", [2, 8], buffer, 64);
  assert.equal(tensor.buffer(), buffer);
  tensor.dispose();
  tensor.dispose();
  assert.ok(tensor.disposed);
  assert.equal(model.gpuTensorPool.free.length, 1);
  assert.throws(() => tensor.buffer(), { message: "GPU tensor 'present' was disposed and cannot be used any more" });
});

test("a GpuTensor input is checked like an array: dtype and rank; its shape goes on", () => {
  const manifest = { inputs: [{ name: "past", dtype: "float32", shape: ["n", 8], storage: 0 }] };
  const model = fakeModel();
  const tensor = (dtype, shape) => new GpuTensor(model, "present", dtype, shape, fakeBuffer(256), 4 * shape.reduce((a, b) => a * b, 1));
  assert.deepEqual(checkInputs(manifest, { past: tensor("float32", [3, 8]) }), [[3, 8]]);
  assert.throws(() => checkInputs(manifest, { past: tensor("int32", [3, 8]) }),
    (error) => error instanceof InputShapeError && error.message === "input 'past': expected float32 data, got GPU tensor 'present' of dtype int32");
  assert.throws(() => checkInputs(manifest, { past: tensor("float32", [24]) }),
    (error) => error instanceof InputShapeError && error.message === "input 'past': expected 2 dimensions [n, 8], got 1 [24]");
});

test("live GPU bytes count tracked buffers until they are destroyed, once", () => {
  const stats = new TransferStats();
  const [a, b] = [fakeBuffer(64), fakeBuffer(256)];
  stats.trackBuffer(a);
  stats.trackBuffer(b);
  assert.equal(stats.liveGpuBytes, 320);
  a.destroy();
  a.destroy();
  assert.ok(a.destroyed);
  assert.equal(stats.liveGpuBytes, 256);
});
