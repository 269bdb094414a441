// Node tests of the browser runtime's Hugging Face tokenizer (tokenizer.js, chat_template.js,
// libraries.js) and of generate.js's sampling options, on small tokenizers written here as
// tokenizer.json data. The corpus comparisons with the Python tokenizers library and with
// transformers' chat templates run in Chromium (tests/runtime_js/test_tokenizer_browser.py).

import { test } from "node:test";
import assert from "node:assert/strict";

import { GREEDY, checkOptions, samplingOptions } from "../../relaxweb/runtime_js/generate.js";
import { importLibrary } from "../../relaxweb/runtime_js/libraries.js";
import { templateMessages } from "../../relaxweb/runtime_js/chat_template.js";
import { ByteTokenizer, DecodeStream, HuggingFaceTokenizer, loadTokenizer } from "../../relaxweb/runtime_js/tokenizer.js";

const BYTES = Array.from({ length: 256 }, (_, byte) => `<0x${byte.toString(16).toUpperCase().padStart(2, "0")}>`);

/** A Llama-2-style tokenizer.json: "▁" for spaces, a few pieces, every byte as <0xNN>. */
function sentencePieceJson() {
  const pieces = ["<unk>", "<s>", "</s>", "▁", "a", "b", "▁a", "ab", ...BYTES];
  return {
    version: "1.0",
    added_tokens: ["<unk>", "<s>", "</s>"].map((content, id) => ({
      id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
    })),
    normalizer: { type: "Sequence", normalizers: [{ type: "Prepend", prepend: "▁" }, { type: "Replace", pattern: { String: " " }, content: "▁" }] },
    pre_tokenizer: null,
    post_processor: {
      type: "TemplateProcessing", single: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
      pair: [{ Sequence: { id: "A", type_id: 0 } }, { Sequence: { id: "B", type_id: 1 } }],
      special_tokens: { "<s>": { id: "<s>", ids: [1], tokens: ["<s>"] } },
    },
    decoder: { type: "Sequence", decoders: [
      { type: "Replace", pattern: { String: "▁" }, content: " " }, { type: "ByteFallback" }, { type: "Fuse" },
      { type: "Strip", content: " ", start: 1, stop: 0 },
    ] },
    model: {
      type: "BPE", dropout: null, unk_token: "<unk>", continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: true, byte_fallback: true, ignore_merges: false,
      vocab: Object.fromEntries(pieces.map((piece, id) => [piece, id])), merges: [["▁", "a"], ["a", "b"]],
    },
  };
}

const ENTRY = { kind: "huggingface", vocab_size: 264, files: ["tokenizer.json", "chat_template.jinja"], eos_token_ids: [2],
  special_tokens: { bos_token: "<s>", eos_token: "</s>" }, generation: { temperature: 0.6, top_p: 0.9 } };
const TEMPLATE = "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content | trim }}{% if m.role == 'system' %}{{ raise_exception('no system here') }}{% endif %}\n{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}";

/** @returns {Promise<any>} */
function loaded(entry = ENTRY, files = { "tokenizer/tokenizer.json": JSON.stringify(sentencePieceJson()), "tokenizer/chat_template.jinja": TEMPLATE }) {
  return loadTokenizer(entry, async (file) => {
    if (!(file in files)) throw new Error(`no file ${file}`);
    return /** @type {Record<string, string>} */ (files)[file];
  });
}

test("the libraries are imported by their bare names where they resolve, once", async () => {
  const tokenizers = await importLibrary("tokenizers");
  assert.equal(typeof tokenizers.Tokenizer, "function");
  assert.equal(await importLibrary("tokenizers"), tokenizers);
  assert.equal(typeof (await importLibrary("jinja")).Template, "function");
});

test("a Hugging Face tokenizer encodes with its post-processor and decodes without special tokens", async () => {
  const tokenizer = await loaded();
  assert.ok(tokenizer instanceof HuggingFaceTokenizer);
  assert.deepEqual(tokenizer.encode("ab a"), [1, 6, 5, 6]); // <s> ▁a b ▁a: the merge "▁ a" ranks first
  assert.deepEqual(tokenizer.encode("ab a", { addSpecialTokens: false }), [6, 5, 6]);
  assert.equal(tokenizer.decode([1, 6, 5, 6, 2]), "ab a");
  assert.equal(tokenizer.decode([]), "");
  assert.deepEqual(tokenizer.stopTokens, [2]);
  assert.deepEqual(tokenizer.generationDefaults, { temperature: 0.6, topP: 0.9 });
});

test("byte runs decode as the tokenizers library decodes them: a BOM kept, one U+FFFD per invalid byte", async () => {
  const tokenizer = await loaded();
  const byte = (/** @type {number} */ value) => 8 + value;
  assert.equal(tokenizer.decode([byte(0x61), byte(0xef), byte(0xbb), byte(0xbf), byte(0x62)]), "a\ufeffb");
  assert.equal(tokenizer.decode([byte(0xef), byte(0xbb), byte(0xbf), 4]), "\ufeffa");
  assert.equal(tokenizer.decode([4, byte(0xf0), byte(0x9f), byte(0x98)]), "a\ufffd\ufffd\ufffd"); // a cut emoji
  assert.equal(tokenizer.decode([4, byte(0xf0), byte(0x9f), byte(0x98), byte(0x80)]), "a😀");
  // streamed: the emoji is held back until its last byte
  const ids = tokenizer.encode("a😀b", { addSpecialTokens: false });
  const stream = tokenizer.stream();
  assert.deepEqual(ids.map((/** @type {number} */ id) => stream.push(id)).filter((text) => text !== ""), ["a", "😀", "b"]);
  assert.equal(stream.finish(), "");
});

test("a decode stream gives the new text of each id and what is held at the end", () => {
  // a decoder that drops the first space, as SentencePiece's does, and keeps a cut character as U+FFFD
  const decode = (/** @type {number[]} */ ids) => ids.map((id) => ["\u2581x", "\u2581y", "\ufffd", "z"][id]).join("")
    .replaceAll("\u2581", " ").replace(/^ /, "");
  const stream = new DecodeStream(decode);
  assert.deepEqual([0, 1, 2].map((id) => stream.push(id)), ["x", " y", ""]);
  assert.equal(stream.finish(), "\ufffd");
});

test("chat templates render with the special tokens, and their refusals are errors", async () => {
  const tokenizer = await loaded();
  // trim_blocks: the newline after a block tag goes
  assert.equal(tokenizer.chatTemplate.render([{ role: "user", content: "  hi  " }]), "<s>[user] hi[assistant]");
  assert.equal(tokenizer.chatTemplate.render([{ role: "user", content: "hi" }], { addGenerationPrompt: false }), "<s>[user] hi");
  assert.throws(() => tokenizer.chatTemplate.render([{ role: "system", content: "x" }]),
    { message: "the chat template refused these messages: no system here" });
  assert.throws(() => tokenizer.chatTemplate.render([]), /^Error: messages must be a non-empty list of messages/);
  assert.throws(() => tokenizer.chatTemplate.render(["hi"]), /messages\[0\] must be an object/);
  assert.throws(() => tokenizer.chatTemplate.render([{ role: "user", content: () => 1 }]),
    /messages\[0\]\.content: a chat message holds JSON values/);
  assert.throws(() => tokenizer.chatTemplate.render([{ role: "user", content: "hi" }], { addGenerationPrompt: "yes" }),
    /addGenerationPrompt must be true or false/);
});

test("messages reach a template as transformers passes them", () => {
  assert.deepEqual(templateMessages([{ role: "user", content: "x", name: null, extra: undefined }]), [{ role: "user", content: "x" }]);
  assert.deepEqual(templateMessages([{ role: "assistant", content: "y", reasoning: "r" }]),
    [{ thinking: "r", role: "assistant", content: "y", reasoning: "r", reasoning_content: "r" }]);
});

test("a template that does not parse, a tokenizer.json that is not JSON, a missing library file: errors", async () => {
  await assert.rejects(loaded(ENTRY, { "tokenizer/tokenizer.json": JSON.stringify(sentencePieceJson()), "tokenizer/chat_template.jinja": "{% for %}" }),
    /the chat template in the bundle's tokenizer\/chat_template\.jinja is not valid Jinja/);
  await assert.rejects(loaded(ENTRY, { "tokenizer/tokenizer.json": "{", "tokenizer/chat_template.jinja": TEMPLATE }),
    /the bundle's tokenizer\/tokenizer\.json is not valid JSON/);
  await assert.rejects(loaded(ENTRY, { "tokenizer/tokenizer.json": JSON.stringify(sentencePieceJson()) }), /no file tokenizer\/chat_template\.jinja/);
  // without a template in its files, no template is read
  const plain = await loaded({ ...ENTRY, files: ["tokenizer.json"] }, { "tokenizer/tokenizer.json": JSON.stringify(sentencePieceJson()) });
  assert.equal(plain.chatTemplate, null);
  assert.equal(await loadTokenizer(undefined, async () => ""), null);
  assert.ok((await loadTokenizer({ kind: "byte", vocab_size: 258 }, async () => "")) instanceof ByteTokenizer);
});

test("sampling options: given, else the bundle's, else greedy; checked", () => {
  assert.deepEqual(samplingOptions({}, {}), GREEDY);
  assert.deepEqual(samplingOptions({ temperature: 0.6, topP: 0.9 }, { topP: 0.5, repetitionPenalty: null }),
    { temperature: 0.6, topK: 0, topP: 0.5, repetitionPenalty: 1 });
  const good = { maxNewTokens: 4, temperature: 0, topK: 0, seed: 0, topP: 1, repetitionPenalty: 1 };
  checkOptions(good);
  assert.throws(() => checkOptions({ ...good, topP: 0 }), /topP must be a number above 0 and at most 1 \(1: no cut\), got 0/);
  assert.throws(() => checkOptions({ ...good, topP: 1.5 }), /topP must be a number above 0/);
  assert.throws(() => checkOptions({ ...good, repetitionPenalty: 0 }), /repetitionPenalty must be a number above 0 \(1: none\)/);
  assert.throws(() => checkOptions({ ...good, repetitionPenalty: NaN }), /repetitionPenalty must be a number above 0/);
});
