// The chat page: a conversation with a bundle that generates text. Each reply is
// `model.chat(messages, options)` streamed into the page through `onToken`, stopped by an
// AbortController's signal, and followed by its Generation's figures (tokens, why it stopped,
// prefill time, tokens/s). The same calls run on both backends (`load`'s `backend` option:
// auto, webgpu or wasm). A bundle with a tokenizer but no chat template gets plain completion
// (`model.generate(text)`, each prompt on its own); a bundle that cannot generate says why.
// The bundle comes from `bundle/` next to this page (where `relaxweb serve DIR` puts it);
// `?bundle=URL&backend=wasm` or the fields pick others.

import { load } from "./runtime/relaxweb.js";
import { GREEDY, decoderSignature, sequenceLimit } from "./runtime/generate.js";
import { backendText, button, element, field, whyNoGeneration } from "./page_common.js";

/** A reply's default length: generate's 64 is short for a chat; the bundle's bound may be shorter. */
const DEFAULT_MAX_NEW_TOKENS = 256;

/**
 * What the page does with a bundle: "chat" (a chat template), "completion" (a tokenizer without
 * one: the prompt's continuation), or nothing (`why` says what is missing).
 * @typedef {{kind: "chat"|"completion"|null, why: string}} Mode
 * @typedef {{role: string, content: string}} Message
 */

/** @param {any} model @returns {Mode} */
function modeOf(model) {
  const why = whyNoGeneration(model);
  if (why) return { kind: null, why: `${why[0].toUpperCase()}${why.slice(1)}.` };
  if (!model.tokenizer.chatTemplate) {
    return { kind: "completion", why: `This bundle's ${model.tokenizer.kind} tokenizer has no chat template (build it with ` +
      "--tokenizer FOLDER, a folder with chat_template.jinja or a chat_template in tokenizer_config.json): the page " +
      "continues each prompt instead (plain completion, no conversation)." };
  }
  return { kind: "chat", why: "" };
}

/** The page's state: the model, what it does, the conversation so far, the reply being generated. */
const state = {
  /** @type {any} */ model: null,
  /** @type {Mode} */ mode: { kind: null, why: "" },
  /** @type {Message[]} the messages sent and replied to (chat mode) */ history: [],
  /** @type {AbortController|null} the reply in progress, stopped by the Stop button */ reply: null,
  /** counts the conversations (New chat, a load): a reply that ends in a later one is not kept */ conversation: 0,
};

/** @param {unknown} error */
function showError(error) {
  element("error").textContent = error instanceof Error ? error.message : String(error ?? "");
}

/** Enable the controls that fit: sending when the model generates and no reply is in progress. */
function updateControls() {
  const ready = state.model !== null && state.mode.kind !== null;
  const busy = state.reply !== null;
  /** @type {HTMLTextAreaElement} */ (element("message")).disabled = !ready;
  button("send").disabled = !ready || busy;
  button("stop").disabled = !busy;
  button("new-chat").disabled = !ready;
}

// Sampling options ---------------------------------------------------------------------------

/** The number fields of generate's options: option name -> field id. */
const OPTION_FIELDS = {
  maxNewTokens: "max-new-tokens", temperature: "temperature", topK: "top-k", topP: "top-p",
  repetitionPenalty: "repetition-penalty", seed: "seed",
};

/**
 * Fill the sampling fields with the bundle's defaults (its generation_config.json's, else greedy)
 * and a reply length within its bounds.
 * @param {any} model
 */
function showDefaults(model) {
  const fromBundle = model.tokenizer?.generationDefaults ?? {};
  const defaults = { ...GREEDY, ...fromBundle };
  let limit = null;
  try {
    limit = sequenceLimit(model.manifest, decoderSignature(model.manifest));
  } catch { /* not a decoder: the notice says so */ }
  const values = { ...defaults, maxNewTokens: Math.min(DEFAULT_MAX_NEW_TOKENS, limit ?? Infinity) };
  for (const [name, id] of Object.entries(OPTION_FIELDS)) {
    if (name in values) field(id).value = String(/** @type {any} */ (values)[name]);
  }
  element("defaults-source").textContent = Object.keys(fromBundle).length > 0
    ? "(defaults: the bundle's generation_config.json)" : "(defaults: greedy; the bundle has no sampling defaults)";
}

/**
 * generate's options from the fields (an empty field: the bundle's default); the runtime checks
 * their ranges and its message is shown.
 * @returns {Record<string, number>}
 */
function readOptions() {
  /** @type {Record<string, number>} */
  const options = {};
  for (const [name, id] of Object.entries(OPTION_FIELDS)) {
    const text = field(id).value.trim();
    if (text === "") continue;
    const value = Number(text);
    if (Number.isNaN(value)) throw new Error(`the ${id.replaceAll("-", " ")} must be a number, not '${text}'`);
    options[name] = value;
  }
  return options;
}

// The conversation ---------------------------------------------------------------------------

/**
 * Add a message to the page: its role and its content (filled as tokens arrive).
 * @param {string} role @param {string} text
 * @returns {{box: HTMLElement, content: HTMLElement, stats: HTMLElement}}
 */
function addMessage(role, text) {
  const box = document.createElement("div");
  box.className = "message";
  box.dataset.role = role;
  const label = document.createElement("div");
  label.className = "role";
  label.textContent = role;
  const content = document.createElement("div");
  content.className = "content";
  content.textContent = text;
  const stats = document.createElement("div");
  stats.className = "stats";
  box.append(label, content, stats);
  element("conversation").append(box);
  return { box, content, stats };
}

/**
 * The messages of the next reply: the system message (when given), the conversation, the new one.
 * @param {string} text @returns {Message[]}
 */
function messagesWith(text) {
  const system = field("system").value.trim();
  return [...(system ? [{ role: "system", content: system }] : []), ...state.history, { role: "user", content: text }];
}

/** Send the message box's text and stream the reply; on an error the turn is taken back. */
async function send() {
  const { model, mode } = state;
  const text = field("message").value;
  if (!model || mode.kind === null || state.reply || text.trim() === "") return;
  showError("");
  const chat = mode.kind === "chat";
  const conversation = state.conversation;
  const asked = addMessage(chat ? "user" : "prompt", text);
  const answer = addMessage(chat ? "assistant" : "completion", "");
  field("message").value = "";
  const controller = new AbortController();
  state.reply = controller;
  updateControls();
  const status = element("status");
  status.textContent = "prefill…";
  /** @type {number[]} when each token arrived */
  const arrivals = [];
  try {
    const options = {
      ...readOptions(), signal: controller.signal,
      onToken: (/** @type {number} */ _token, /** @type {string} */ textSoFar) => {
        arrivals.push(performance.now());
        answer.content.textContent = textSoFar;
        const seconds = (arrivals[arrivals.length - 1] - arrivals[0]) / 1e3;
        status.textContent = `${arrivals.length} tokens${seconds > 0 ? `, ${((arrivals.length - 1) / seconds).toFixed(1)} tokens/s` : ""}`;
      },
    };
    const messages = chat ? messagesWith(text) : [];
    const result = chat ? await model.chat(messages, options) : await model.generate(text, options);
    answer.content.textContent = result.text;
    showFigures(answer.box, answer.stats, result);
    status.textContent = "";
    if (chat && conversation === state.conversation) state.history = [...messages.filter((m) => m.role !== "system"), { role: "assistant", content: result.text }];
  } catch (error) {
    asked.box.remove();
    answer.box.remove();
    if (field("message").value === "") field("message").value = text;
    status.textContent = "";
    showError(error);
  } finally {
    state.reply = null;
    updateControls();
  }
}

/**
 * A reply's Generation figures under it (also as data- attributes, for scripts and tests).
 * @param {HTMLElement} box @param {HTMLElement} stats
 * @param {{tokens: number[], stopped: string, prefillMs: number, tokensPerSecond: number}} result
 */
function showFigures(box, stats, result) {
  const { tokens, stopped, prefillMs, tokensPerSecond } = result;
  Object.assign(box.dataset, { tokens: String(tokens.length), stopped, prefillMs: prefillMs.toFixed(1),
    tokensPerSecond: tokensPerSecond.toFixed(2) });
  const why = { eos: "the model ended it", length: "max new tokens reached", aborted: "stopped" }[stopped] ?? stopped;
  stats.textContent = `${tokens.length} tokens (${why}) · prefill ${prefillMs.toFixed(0)} ms · ` +
    `${tokensPerSecond.toFixed(1)} tokens/s · ${state.model.backend}`;
}

/** Stop the reply in progress and forget the conversation. */
function newChat() {
  state.reply?.abort();
  state.conversation += 1;
  state.history = [];
  element("conversation").replaceChildren();
  showError("");
}

// Loading ------------------------------------------------------------------------------------

/**
 * Load a bundle on a backend (replacing the current one) and say what the page can do with it.
 * @param {string} bundleUrl @param {"auto"|"webgpu"|"wasm"} backend @param {string} threads
 */
async function loadBundle(bundleUrl, backend, threads) {
  newChat();
  state.model?.dispose();
  state.model = null;
  state.mode = { kind: null, why: "" };
  updateControls();
  button("load").disabled = true;
  element("notice").hidden = true;
  element("device").textContent = "";
  const progress = /** @type {HTMLProgressElement} */ (element("progress"));
  progress.value = 0;
  element("progress-text").textContent = "Loading…";
  try {
    const model = await load(new URL(bundleUrl, location.href), {
      backend, ...(threads.trim() ? { threads: Number(threads) } : {}),
      onProgress: ({ loaded, total }) => {
        progress.max = Math.max(total, 1);
        progress.value = loaded;
        element("progress-text").textContent = `Loading weights: ${loaded} / ${total} bytes`;
      },
    });
    progress.value = progress.max;
    element("progress-text").textContent = "Loaded.";
    element("device").textContent = backendText(model);
    state.model = model;
    state.mode = modeOf(model);
    element("notice").textContent = state.mode.why;
    element("notice").hidden = state.mode.why === "";
    element("system-line").hidden = state.mode.kind !== "chat";
    showDefaults(model);
  } catch (error) {
    element("progress-text").textContent = "Loading failed.";
    throw error;
  } finally {
    button("load").disabled = false;
    updateControls();
  }
}

function main() {
  const parameters = new URLSearchParams(location.search);
  const urlField = field("bundle-url");
  const backendField = /** @type {HTMLSelectElement} */ (element("backend"));
  urlField.value = parameters.get("bundle") ?? "bundle/";
  backendField.value = parameters.get("backend") ?? "auto";
  if (backendField.value === "") backendField.value = "auto"; // an unknown ?backend=
  field("threads").value = parameters.get("threads") ?? "";
  const reload = () => {
    /** @type {HTMLAnchorElement} */ (element("demo-link")).href = `./?${new URLSearchParams({ bundle: urlField.value.trim() })}`;
    return loadBundle(urlField.value.trim(), /** @type {any} */ (backendField.value), field("threads").value).catch(showError);
  };
  element("bundle-form").addEventListener("submit", (event) => {
    event.preventDefault();
    reload();
  });
  element("message-form").addEventListener("submit", (event) => {
    event.preventDefault();
    send();
  });
  element("message").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send();
    }
  });
  button("stop").addEventListener("click", () => state.reply?.abort());
  button("new-chat").addEventListener("click", newChat);
  reload();
}

main();
