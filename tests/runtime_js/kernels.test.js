// Node tests of chooseKernels (relaxweb/runtime_js/webgpu_kernels.js, re-exported by host.js): which shaders load() compiles for
// the `kernels` option, with fake adapters and devices (no GPU needed).

import { test } from "node:test";
import assert from "node:assert/strict";

import { SHADER_F16, chooseKernels } from "../../relaxweb/runtime_js/host.js";

const WITH_F16 = { kernels: [{ file: "kernels/a.wgsl", f16_file: "kernels/a.f16.wgsl" }, { file: "kernels/b.wgsl" }] };
const WITHOUT_F16 = { kernels: [{ file: "kernels/a.wgsl", cpu_file: "kernels/a.cpu.wgsl" }] };

/** A fake GPUAdapter: `info` and `features`. */
function adapter({ f16 = false, swiftshader = false, fallback = false } = {}) {
  return { info: { architecture: swiftshader ? "swiftshader" : "ampere", isFallbackAdapter: fallback },
           features: new Set(f16 ? [SHADER_F16] : []) };
}

/** A fake GPUDevice: `adapterInfo` and `features`. */
function device({ f16 = false } = {}) {
  return { adapterInfo: { architecture: "ampere", isFallbackAdapter: false }, features: new Set(f16 ? [SHADER_F16] : []) };
}

test("auto: the CPU shaders on a CPU adapter, else f16 where the adapter offers it, else the f32 ones", () => {
  assert.deepEqual(chooseKernels("auto", adapter({ f16: true }), WITH_F16), { kernels: "f16", warning: null });
  assert.deepEqual(chooseKernels("auto", adapter(), WITH_F16), { kernels: "gpu", warning: null });
  assert.deepEqual(chooseKernels("auto", adapter({ f16: true, swiftshader: true }), WITH_F16), { kernels: "cpu", warning: null });
  assert.deepEqual(chooseKernels("auto", adapter({ f16: true, fallback: true }), WITH_F16), { kernels: "cpu", warning: null });
  assert.deepEqual(chooseKernels("auto", adapter({ f16: true }), WITHOUT_F16), { kernels: "gpu", warning: null });
  assert.deepEqual(chooseKernels("auto", device({ f16: true }), WITH_F16), { kernels: "f16", warning: null });
  assert.deepEqual(chooseKernels("auto", null, WITH_F16), { kernels: "gpu", warning: null });
});

test("f16 falls back to the f32 shaders with a warning where it cannot be had", () => {
  assert.deepEqual(chooseKernels("f16", adapter({ f16: true, swiftshader: true }), WITH_F16), { kernels: "f16", warning: null });
  assert.deepEqual(chooseKernels("f16", adapter({ swiftshader: true }), WITH_F16),
                   { kernels: "gpu", warning: 'kernels "f16": the adapter does not offer shader-f16; compiling the f32 shaders' });
  assert.deepEqual(chooseKernels("f16", device(), WITH_F16),
                   { kernels: "gpu", warning: 'kernels "f16": the given device does not offer shader-f16; compiling the f32 shaders' });
  assert.deepEqual(chooseKernels("f16", adapter({ f16: true }), WITHOUT_F16),
                   { kernels: "gpu", warning: 'kernels "f16": the bundle has no f16 shaders; compiling the f32 shaders' });
});

test("gpu and cpu are taken as given", () => {
  assert.deepEqual(chooseKernels("gpu", adapter({ f16: true }), WITH_F16), { kernels: "gpu", warning: null });
  assert.deepEqual(chooseKernels("cpu", adapter({ f16: true }), WITH_F16), { kernels: "cpu", warning: null });
});
