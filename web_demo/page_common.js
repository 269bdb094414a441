// What the demo page (demo.js) and the chat page (chat.js) share: typed element lookups, the
// line that says which backend runs the model, and whether a bundle can generate text.

import { decoderSignature } from "./runtime/generate.js";

/** @param {string} id */
export const element = (id) => /** @type {HTMLElement} */ (document.getElementById(id));
/** @param {string} id */
export const field = (id) => /** @type {HTMLInputElement} */ (document.getElementById(id));
/** @param {string} id */
export const button = (id) => /** @type {HTMLButtonElement} */ (document.getElementById(id));

/**
 * What runs the model: WebGPU and its adapter, or the wasm backend and its threads (with the
 * reason for one thread where the page is not cross-origin isolated).
 * @param {any} model
 * @returns {string}
 */
export function backendText(model) {
  if (model.backend === "wasm") {
    const isolation = model.threads === 1 && !crossOriginIsolated ? " (the page is not cross-origin isolated: one thread)" : "";
    return `Backend: wasm (CPU, ${model.threads} thread${model.threads === 1 ? "" : "s"})${isolation}`;
  }
  const adapterInfo = model.device?.adapterInfo;
  const gpu = adapterInfo ? `${adapterInfo.vendor} ${adapterInfo.architecture}`.trim() : "";
  return `Backend: webgpu${gpu ? ` (GPU: ${gpu})` : ""}`;
}

/**
 * Why a bundle cannot generate text from a typed prompt ("" when it can): it is not a decoder
 * with a KV cache in the signature generate takes (the runtime's message), or it has no
 * tokenizer to turn text into tokens.
 * @param {any} model
 * @returns {string}
 */
export function whyNoGeneration(model) {
  try {
    decoderSignature(model.manifest);
  } catch (error) {
    return /** @type {Error} */ (error).message;
  }
  return model.tokenizer ? "" : "this bundle has no tokenizer, so typed text cannot become tokens (build it with --tokenizer PATH)";
}
