// A strict TypeScript consumer of the npm package: tests/runtime_js/test_npm_package.py installs
// the packed tarball alone into a fresh folder and compiles this file with `tsc --strict`.
// Every use of the README compiles without a cast; each `@ts-expect-error` line is a use the
// types must refuse (tsc fails if it compiles), so the types cannot silently become `any`.

import { GpuTensor, InputShapeError, load, type KeptOutputs, type Model, type Tensor, type WasmModel } from "relaxweb";

const x: Tensor = { data: new Float32Array(5 * 64), shape: [5, 64] };

// A plain run: every output is a Tensor, no cast.
const model = await load("./dist/", { onProgress: ({ loaded, total }) => console.log(loaded, total) });
const outputs = await model.run({ x });
const probabilities: Tensor["data"] = outputs.probabilities.data;
const shape: number[] = outputs.probabilities.shape;
console.log(model.backend, probabilities, shape);
// @ts-expect-error a plain run's outputs are read back: not GpuTensors
const notKept: GpuTensor = outputs.probabilities;

// keepOnGpu by name: those outputs are GpuTensors, the others Tensors.
const gpu: Model = await load("./dist/", { backend: "webgpu" });
let state: Tensor | GpuTensor = { data: new Float32Array(4 * 8), shape: [4, 8] };
for (const step of [x]) {
  const kept: KeptOutputs<"state_out"> = await gpu.run({ state_in: state, x: step }, { keepOnGpu: ["state_out"] });
  if (state instanceof GpuTensor) state.dispose();
  state = kept.state_out;
}
if (state instanceof GpuTensor) console.log((await state.read()).data, gpu.stats.lastRun.buffersCreated);
const everything = await gpu.run({ x }, { keepOnGpu: true });
const firstKept: GpuTensor = everything.probabilities;
console.log(firstKept.byteLength, gpu.device);

// The wasm backend: threads, and outputs kept in its memory.
const wasm: WasmModel = await load("./dist/", { backend: "wasm", threads: 4 });
console.log(wasm.threads, (await wasm.run({ x })).probabilities.shape);
const keptOnWasm: GpuTensor = (await wasm.run({ x }, { keepOnGpu: ["probabilities"] })).probabilities;
console.log((await keptOnWasm.read()).shape, wasm.stats.lastRun.bytesRead);

// Errors and profiles.
try {
  await model.run({ x: { data: new Float32Array(65 * 64), shape: [65, 64] } });
} catch (error) {
  if (error instanceof InputShapeError) console.log(error.code, error.message);
}
const { profile } = await gpu.profile({ x });
console.log(profile.method, profile.rows.map((row) => row.kernel));
// @ts-expect-error load takes a URL, not a number
await load(42);
console.log(notKept);

// Generation: one prompt, several at once (a paged KV cache advances them together), the scheduler's stats.
const generation = await model.generate("The if statement", { maxNewTokens: 8, onToken: (token, text) => text.length < 40 });
const many = await model.generateMany(["a", [256, 97]], { seeds: [1, null], onTokens: [null, (token) => console.log(token)], waitForPages: false });
const stats = wasm.generationStats;
console.log(generation.stopped, many.map((g) => g.tokens.length), stats === null ? 0 : stats.pagesInUse - stats.pages);
// @ts-expect-error generateMany takes a list of prompts
await model.generateMany("one prompt");
