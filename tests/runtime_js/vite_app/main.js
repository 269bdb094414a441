// A web app as a developer writes one: the runtime imported from the npm package ("relaxweb"),
// bundled by Vite (its workers and sampler.wgsl become assets of the build), the model's
// bundle fetched from /bundle/ (built with --runtime none: no runtime copy of its own).
// tests/runtime_js/test_npm_package.py builds this app and calls these two functions.
import { load } from "relaxweb";

/** Load the bundle on `backend` and run it once; the outputs as plain arrays. */
window.runModel = async (backend, inputs) => {
  const model = await load("/bundle/", { backend, threads: 2 });
  try {
    const outputs = await model.run(inputs);
    const plain = Object.fromEntries(Object.entries(outputs).map(([name, { data, shape }]) => [name, { data: Array.from(data), shape }]));
    return { backend: model.backend, threads: model.backend === "wasm" ? model.threads : 1, outputs: plain };
  } finally {
    model.dispose();
  }
};

/** Greedy tokens of the bundle's decoder after `prompt` (the sampler: runtime/sampler.wgsl). */
window.generateTokens = async (prompt, maxNewTokens) => {
  const model = await load("/bundle/", { backend: "webgpu" });
  try {
    const { tokens, stopped } = await model.generate(prompt, { maxNewTokens });
    return { tokens, stopped };
  } finally {
    model.dispose();
  }
};

/** The reply to `messages` (the bundle's Hugging Face tokenizer and chat template: the package's dependencies). */
window.chatReply = async (messages, maxNewTokens) => {
  const model = await load("/bundle/", { backend: "webgpu" });
  try {
    const prompt = model.applyChatTemplate(messages);
    const { tokens, text } = await model.chat(messages, { maxNewTokens });
    return { prompt, tokens, text };
  } finally {
    model.dispose();
  }
};

document.getElementById("status").textContent = "ready";
