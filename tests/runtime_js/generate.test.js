// Node tests of relaxweb/runtime_js/generate.js and tokenizer.js that need no GPU: the byte
// tokenizer's streaming of characters that span tokens, the decoder detection and the options'
// checks (the random numbers, the same as the Python runtime's, are the conformance corpus's
// sampler_draws cases).
// generate itself runs in Chromium (tests/runtime/test_generate.py).

import { test } from "node:test";
import assert from "node:assert/strict";

import { checkOptions, decoderSignature, sequenceLimit } from "../../relaxweb/runtime_js/generate.js";
import { ByteTokenizer } from "../../relaxweb/runtime_js/tokenizer.js";

test("a byte tokenizer encodes UTF-8 after BOS and streams only complete characters", () => {
  const tokenizer = new ByteTokenizer({ vocab_size: 258, bos_token_id: 256, eos_token_id: 257 });
  const ids = tokenizer.encode("aé€");
  assert.deepEqual(ids, [256, 97, 0xc3, 0xa9, 0xe2, 0x82, 0xac]);
  const stream = tokenizer.stream();
  assert.deepEqual(ids.map((id) => stream.push(id)), ["", "a", "", "é", "", "", "€"]);
  assert.equal(stream.push(0xe2) + stream.finish(), "\ufffd");
  assert.equal(tokenizer.decode([...ids, 257]), "aé€");
  assert.deepEqual(tokenizer.stopTokens, [257]);
});

const decoder = () => ({
  inputs: [
    { name: "input_ids", dtype: "int64", shape: ["batch", "seq"] },
    { name: "attention_mask", dtype: "int64", shape: ["batch", "total"] },
    { name: "past_key_values.0.key", dtype: "float32", shape: ["batch", 2, "past", 8] },
  ],
  outputs: [{ name: "logits" }, { name: "present.0.key" }],
  symbolic_vars: [{ name: "batch", bound: 1 }, { name: "past", bound: 99 }, { name: "total", bound: 64 }, { name: "seq", bound: null }],
});

test("a decoder is detected, and what a bundle lacks is listed", () => {
  const manifest = decoder();
  const signature = decoderSignature(manifest);
  assert.deepEqual(signature, { attentionMask: true, positionIds: false, cache: [["past_key_values.0.key", "present.0.key"]] });
  assert.equal(sequenceLimit(manifest, signature), 64);
  manifest.outputs = [{ name: "y" }];
  manifest.inputs.push({ name: "pixels", dtype: "float32", shape: [] });
  assert.throws(() => decoderSignature(manifest), {
    message: "this bundle cannot generate: it has no output 'logits'; no output 'present.0.key' for input " +
      "'past_key_values.0.key'; inputs generate cannot feed: 'pixels' (a decoder has input_ids -> logits and a present.X " +
      "output for each past_key_values.X input, optionally attention_mask and position_ids)",
  });
});

test("the sequence limit is the bound of the cache's length axis, whatever the cache's rank", () => {
  const manifest = {
    inputs: [
      { name: "input_ids", dtype: "int64", shape: ["batch", "seq"] },
      { name: "past_key_values.0.key", dtype: "float32", shape: ["batch", "past", 8] },
    ],
    outputs: [{ name: "logits" }, { name: "present.0.key", shape: ["batch", "past + seq", 8] }],
    symbolic_vars: [{ name: "batch", bound: 1 }, { name: "past", bound: 16 }, { name: "seq", bound: 32 }],
  };
  assert.equal(sequenceLimit(manifest, decoderSignature(manifest)), 17); // past <= 16, then one more token
});

test("options out of range are refused", () => {
  const good = { maxNewTokens: 4, temperature: 0, topK: 0, seed: 0 };
  checkOptions(good);
  assert.throws(() => checkOptions({ ...good, topK: 257 }), /topK must be an integer from 0/);
  assert.throws(() => checkOptions({ ...good, temperature: -1 }), /temperature must be a number >= 0/);
  assert.throws(() => checkOptions({ ...good, maxNewTokens: 0 }), /maxNewTokens must be an integer >= 1/);
  // the samplers compute in float32: what it would round to 0 or infinity is refused
  for (const [name, value] of [["temperature", 1e-320], ["repetitionPenalty", 1e308], ["topP", 1e-40]]) {
    assert.throws(() => checkOptions({ ...good, [name]: value }), new RegExp(`${name} must be .*outside float32's range`));
  }
});
