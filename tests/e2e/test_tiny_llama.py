"""The tiny Llama-like decoder of ``scripts/tiny_llama.py`` (RMSNorm, rotary embedding,
grouped-query attention, SwiGLU, a KV cache in the optimum / transformers.js signature),
trained on the Python documentation's text: its export against torch, then relaxweb's bundle
on WebGPU and on kernels.wasm (the Python runtime's two backends) against onnxruntime at
prefill, at a decode step, and over a greedy generation that feeds each step's present back as
the next step's past; the bundle whose presents are KV caches too, on both.

The model is trained once (~3 min on one core) into ``.cache/tiny-llama/``; later runs reuse it.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import relaxweb
from relaxweb import browser
from relaxweb.compiler import import_model
from relaxweb.ir.expr import Call, MatchCast
from relaxweb.ir.functor import iter_bindings
from relaxweb.passes import fuse_attention
from tests.helpers import MODEL, assert_close, load_bundle

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "tiny_llama.py"
BOUNDS = {"batch_size": 2, "sequence_length": 64, "past_sequence_length": 128, "total_sequence_length": 192}
PREFILL = 16
GREEDY_STEPS = 20


@pytest.fixture(scope="module")
def tiny_llama():
    """scripts/tiny_llama.py as a module (it imports torch: loaded only when these tests run)."""
    spec = importlib.util.spec_from_file_location("tiny_llama", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("tiny_llama", module)  # its dataclasses look themselves up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.fixture(scope="module")
def paths(tiny_llama) -> dict[str, Path]:
    return tiny_llama.tiny_llama_paths()


@pytest.fixture(scope="module")
def reference(paths) -> dict:
    return json.loads(paths["reference"].read_text())


@pytest.fixture(scope="module")
def bundle(paths, tmp_path_factory):
    return relaxweb.build(paths["model"], tmp_path_factory.mktemp("tiny-llama") / "bundle", bounds=BOUNDS)


@pytest.fixture(scope="module")
def session(bundle, backend):
    """The bundle on each backend: every test taking it runs on WebGPU and on kernels.wasm."""
    return load_bundle(bundle.path, backend)


@pytest.fixture(scope="module")
def onnxruntime_run(tiny_llama, paths):
    return tiny_llama.onnxruntime_runner(paths["model"])


def prompt_ids(tiny_llama, reference) -> list[int]:
    """PREFILL tokens: the reference prompt and the start of its greedy continuation."""
    ids = tiny_llama.encode(reference["prompt"]) + reference["continuation_ids"]
    return ids[:PREFILL]


def assert_outputs_close(actual: dict, expected: dict) -> None:
    assert set(actual) == set(expected)
    for name, want in expected.items():
        assert actual[name].dtype == want.dtype and actual[name].shape == want.shape, name
        assert_close(actual[name], want, MODEL, err_msg=name)


def test_the_export_matches_torch_and_carries_the_tokenizer(tiny_llama, paths, reference) -> None:
    """onnxruntime's logits at prefill (empty past) and decode steps are torch's, and greedy
    tokens with the cache are torch's without one (the script's --check)."""
    result = tiny_llama.check(tiny_llama.load_trained(), paths["model"], reference)
    assert result["greedy_tokens_checked"] == len(reference["continuation_ids"]) == 64
    tokenizer = json.loads(paths["tokenizer"].read_text())
    assert tokenizer == {"kind": "byte", "vocab_size": 258, "bos_token_id": 256, "eos_token_id": 257}
    metadata = {prop.key: prop.value for prop in onnx.load(str(paths["model"])).metadata_props}
    assert json.loads(metadata["relaxweb.tokenizer"]) == tokenizer


def test_the_model_learned_the_text(tiny_llama, reference) -> None:
    """Trained, not random: the loss is far below a uniform byte's log(258) = 5.55 nats, and the
    greedy continuation is mostly letters and spaces (a random model's is not)."""
    assert reference["training"]["final_loss"] < 2.0
    continuation = reference["continuation"]
    assert sum(c.isalpha() or c == " " for c in continuation) >= 0.8 * len(continuation), continuation
    assert tiny_llama.decode(reference["continuation_ids"]) == continuation


def test_each_layer_attention_is_one_kernel_reading_the_cache_in_place(paths) -> None:
    """fuse_attention sees through the checks of past + sequence == total (one check of the
    mask instead) and through repeat_kv: each layer's attention reads its present key and value
    ([batch, 2, total, 32]) for its 4 query heads; no softmax, no repeated-head copy remains."""
    module = fuse_attention(import_model(onnx.load(str(paths["model"]))))
    calls = [b.value for b in iter_bindings(module.main) if isinstance(b.value, Call)]
    attention = [call for call in calls if call.op == "attention"]
    assert [(call.args[1].name, call.args[2].name) for call in attention] == [
        (f"present_{layer}_key", f"present_{layer}_value") for layer in range(4)]
    assert not {"softmax", "broadcast_to"} & {call.op for call in calls}
    checks = [b.reason for b in iter_bindings(module.main) if isinstance(b, MatchCast)]
    # one check of the mask; the others are Reshape's -1 beside dims that may be 0 (as onnxruntime refuses)
    assert sum("total_sequence_length" in reason for reason in checks) == 1
    assert all("total_sequence_length" in reason or "the -1 of the target" in reason for reason in checks)


def test_prefill_matches_onnxruntime(tiny_llama, reference, session, onnxruntime_run) -> None:
    config = tiny_llama.Config()
    feeds = tiny_llama.decoder_feeds(config, prompt_ids(tiny_llama, reference), 0, None)
    assert feeds["past_key_values.0.key"].shape == (1, config.kv_heads, 0, config.head_dim)
    assert_outputs_close(session.run(feeds), onnxruntime_run(feeds))


def test_a_decode_step_after_a_past_of_16_matches_onnxruntime(tiny_llama, reference, session, onnxruntime_run) -> None:
    config = tiny_llama.Config()
    ids = tiny_llama.encode(reference["prompt"]) + reference["continuation_ids"]
    prefill = onnxruntime_run(tiny_llama.decoder_feeds(config, ids[:PREFILL], 0, None))
    past = [prefill[name] for name in tiny_llama.past_names(config, "present")]
    feeds = tiny_llama.decoder_feeds(config, ids[PREFILL:PREFILL + 1], PREFILL, past)
    actual, expected = session.run(feeds), onnxruntime_run(feeds)
    assert actual["present.3.value"].shape == (1, config.kv_heads, PREFILL + 1, config.head_dim)
    assert_outputs_close(actual, expected)


def test_greedy_generation_with_the_cache_matches_onnxruntime(tiny_llama, reference, session, onnxruntime_run) -> None:
    """Each step's present outputs (arrays read back) are the next step's past, in relaxweb and in
    onnxruntime alike; both give the tokens torch gave without a cache."""
    config = tiny_llama.Config()
    prompt = tiny_llama.encode(reference["prompt"])
    actual = tiny_llama.greedy_with_cache(session.run, config, prompt, GREEDY_STEPS)
    expected = tiny_llama.greedy_with_cache(onnxruntime_run, config, prompt, GREEDY_STEPS)
    assert actual == expected == reference["continuation_ids"][:GREEDY_STEPS], tiny_llama.decode(actual)


def left_padded_feeds(tiny_llama, prompts: list[str]) -> dict:
    """A batch of prompts padded on the left as transformers.js pads them: attention_mask 0 at
    the pads, position ids counting only real tokens, an empty past."""
    config = tiny_llama.Config()
    ids = [tiny_llama.encode(prompt) for prompt in prompts]
    width = max(map(len, ids))
    mask = np.array([[0] * (width - len(row)) + [1] * len(row) for row in ids], np.int64)
    feeds = {"input_ids": np.array([[0] * (width - len(row)) + row for row in ids], np.int64),
             "attention_mask": mask, "position_ids": np.maximum(np.cumsum(mask, axis=1) - 1, 0)}
    empty = np.zeros((len(prompts), config.kv_heads, 0, config.head_dim), np.float32)
    return feeds | {name: empty for name in tiny_llama.past_names(config, "past_key_values")}


def test_a_left_padded_batch_matches_onnxruntime(tiny_llama, session, onnxruntime_run) -> None:
    """Two prompts of different lengths in one batch (masked pads, shifted positions), then one
    decode step with their cache: every row of every output, the pads' rows included (their
    mask row is all float32's minimum, a uniform softmax in both)."""
    config = tiny_llama.Config()
    feeds = left_padded_feeds(tiny_llama, ["The if statement", "A class"])
    expected = onnxruntime_run(feeds)
    assert_outputs_close(session.run(feeds), expected)
    step = {"input_ids": expected["logits"][:, -1].argmax(axis=-1)[:, None].astype(np.int64),
            "attention_mask": np.concatenate([feeds["attention_mask"], np.ones((2, 1), np.int64)], axis=1),
            "position_ids": feeds["position_ids"][:, -1:] + 1}
    step |= {past: expected[present] for past, present in zip(tiny_llama.past_names(config, "past_key_values"),
                                                              tiny_llama.past_names(config, "present"))}
    assert_outputs_close(session.run(step), onnxruntime_run(step))


def test_an_attention_mask_that_does_not_cover_past_and_new_tokens_is_refused(tiny_llama, session) -> None:
    config = tiny_llama.Config()
    feeds = tiny_llama.decoder_feeds(config, tiny_llama.encode("abc"), 0, None)
    feeds["attention_mask"] = np.ones((1, 5), np.int64)
    with pytest.raises(relaxweb.InputShapeError, match="total_sequence_length"):
        session.run(feeds)


# The KV cache that never moves (passes/place_kv_caches.py) -------------------------------------

CACHE_BOUNDS = {"batch_size": 1, "sequence_length": 64, "past_sequence_length": 192, "total_sequence_length": 256}
DECODE_STEPS = 40


@pytest.fixture(scope="module")
def cached_bundle(paths, tmp_path_factory):
    return relaxweb.build(paths["model"], tmp_path_factory.mktemp("tiny-llama-cache") / "bundle", bounds=CACHE_BOUNDS)


def decode_step_bytes(start: int) -> int:
    """The bytes a decode step at past ``start`` writes from the host: input_ids, attention_mask
    and position_ids, int64 as the GPU's int32."""
    return 4 * (1 + (start + 1) + 1)


def test_each_present_output_is_a_cache_of_the_bound_of_past_plus_sequence(tiny_llama, cached_bundle) -> None:
    config = tiny_llama.Config()
    manifest = cached_bundle.manifest
    inputs, outputs = [i["name"] for i in manifest["inputs"]], [o["name"] for o in manifest["outputs"]]
    pairs = [(inputs[c["input"]], outputs[c["output"]], c["axis"], c["capacity"]) for c in manifest["caches"]]
    assert pairs == [(past, present, 2, 256) for past, present in zip(tiny_llama.past_names(config, "past_key_values"),
                                                                      tiny_llama.past_names(config, "present"))]
    for cache in manifest["caches"]:  # [1, 2, 256, 32] float32, allocated at load
        assert manifest["storages"][cache["storage"]]["size_at_bounds"] == 256 * 2 * 32 * 4


def test_greedy_decode_feeding_present_views_back_moves_no_cache_bytes(tiny_llama, reference, cached_bundle,
                                                                       onnxruntime_run, device) -> None:
    """40 greedy steps, each step's present outputs kept on the GPU (views of the caches) and
    given back as the next step's past: onnxruntime's tokens and logits, and from the third
    step on no buffer created, only input_ids / attention_mask / position_ids written and only
    the logits read."""
    config = tiny_llama.Config()
    present, past = tiny_llama.past_names(config, "present"), tiny_llama.past_names(config, "past_key_values")
    session = cached_bundle.load(device=device)
    prompt = tiny_llama.encode(reference["prompt"])
    feeds = tiny_llama.decoder_feeds(config, prompt, 0, None)
    outputs, expected = session.run(feeds, keep_on_gpu=present), onnxruntime_run(feeds)
    tokens, start, older = [], len(prompt), None
    for step in range(DECODE_STEPS):
        assert_close(outputs["logits"], expected["logits"], MODEL, err_msg=f"step {step}")
        tokens.append(int(outputs["logits"][0, -1].argmax()))
        assert tokens[-1] == int(expected["logits"][0, -1].argmax())
        views = [outputs[name] for name in present]
        assert views[0].shape == (1, config.kv_heads, start, config.head_dim) and views[0].cache_view is not None
        feeds = tiny_llama.decoder_feeds(config, tokens[-1:], start, views)
        older, outputs = views, session.run(feeds, keep_on_gpu=present)
        counts = session.stats.last_run
        if step >= 2:
            assert counts.buffers_created == 0, (step, counts)
        assert counts.input_bytes_written == decode_step_bytes(start), (step, counts)
        assert counts.bytes_read == outputs["logits"].nbytes, (step, counts)
        expected = onnxruntime_run(tiny_llama.decoder_feeds(config, tokens[-1:], start,
                                                            [expected[name] for name in present]))
        start += 1
    assert tokens == reference["continuation_ids"][:DECODE_STEPS], tiny_llama.decode(tokens)
    for name in present:  # a current view reads back its rows of each block
        assert_close(outputs[name].numpy(), expected[name], MODEL, err_msg=name)
    with pytest.raises(relaxweb.RelaxwebError, match="a view of a KV cache that a later run has written"):
        older[0].numpy()
    stale = tiny_llama.decoder_feeds(config, tokens[-1:], start - 1, older)
    with pytest.raises(relaxweb.RelaxwebError, match="input 'past_key_values.0.key': .* a later run has written"):
        session.run(stale, keep_on_gpu=present)


def test_a_decoder_with_kv_caches_matches_onnxruntime(tiny_llama, reference, cached_bundle, onnxruntime_run,
                                                      backend) -> None:
    """The caches bundle with plain arrays (no views kept on a GPU): each past written into its
    cache block by block, each present read out of it, fed back as the next step's past."""
    assert cached_bundle.manifest["caches"]
    config = tiny_llama.Config()
    present = tiny_llama.past_names(config, "present")
    session = load_bundle(cached_bundle.path, backend)
    ids = tiny_llama.encode(reference["prompt"]) + reference["continuation_ids"]
    pasts, start = None, 0
    for tokens in (ids[:PREFILL], ids[PREFILL:PREFILL + 1], ids[PREFILL + 1:PREFILL + 3]):
        feeds = tiny_llama.decoder_feeds(config, tokens, start, pasts)
        actual = session.run(feeds)
        assert_outputs_close(actual, onnxruntime_run(feeds))
        pasts, start = [actual[name] for name in present], start + len(tokens)


def test_a_past_given_as_arrays_or_copies_still_matches(tiny_llama, reference, cached_bundle, onnxruntime_run,
                                                        device) -> None:
    """The cache written from arrays (one write per head), and from a view of another cache (one
    copy per head), then read back as arrays: onnxruntime's outputs.  A view of a cache that the
    same run overwrites first is refused."""
    config = tiny_llama.Config()
    present = tiny_llama.past_names(config, "present")
    session = cached_bundle.load(device=device)
    ids = tiny_llama.encode(reference["prompt"]) + reference["continuation_ids"]
    prefill = onnxruntime_run(tiny_llama.decoder_feeds(config, ids[:PREFILL], 0, None))
    feeds = tiny_llama.decoder_feeds(config, ids[PREFILL:PREFILL + 2], PREFILL, [prefill[name] for name in present])
    assert_outputs_close(session.run(feeds), onnxruntime_run(feeds))
    kept = session.run(tiny_llama.decoder_feeds(config, ids[:PREFILL], 0, None), keep_on_gpu=present)
    swapped = [kept[name] for name in present[::-1]]  # layer 3's value cache as layer 0's key past, ...
    with pytest.raises(relaxweb.RelaxwebError, match="a view of another KV cache whose own past in this run is not"):
        session.run(tiny_llama.decoder_feeds(config, ids[PREFILL:PREFILL + 1], PREFILL, swapped))
    pasts = [kept[name] for name in present]
    pasts[1] = pasts[0]  # layer 0's key cache also as its value past: copied, its own cache left as it is
    feeds = tiny_llama.decoder_feeds(config, ids[PREFILL:PREFILL + 1], PREFILL, pasts)
    arrays = [prefill[name] for name in present]
    expected = onnxruntime_run(tiny_llama.decoder_feeds(config, ids[PREFILL:PREFILL + 1], PREFILL,
                                                        [arrays[0], arrays[0], *arrays[2:]]))
    assert_outputs_close(session.run(feeds), expected)


#: Runs in the runner page: prefill, then greedy steps feeding the present views back; returns
#: the tokens, the logits' last rows and each step's counts, and the stale view's refusal.
DECODE_IN_PAGE = """
async ({ prompt, steps, layers }) => {
  const model = await window.relaxweb.load("/bundle/");
  const present = [...Array(layers).keys()].flatMap((i) => [`present.${i}.key`, `present.${i}.value`]);
  const past = present.map((name) => name.replace("present", "past_key_values"));
  const ids = (values) => ({ data: BigInt64Array.from(values, (v) => BigInt(v)), shape: [1, values.length] });
  const feeds = (tokens, start, pasts) => ({
    input_ids: ids(tokens), attention_mask: ids(Array(start + tokens.length).fill(1)),
    position_ids: ids(tokens.map((_, k) => start + k)),
    ...Object.fromEntries(past.map((name, k) => [name, pasts?.[k] ?? { data: new Float32Array(0), shape: [1, 2, 0, 32] }])),
  });
  const last = (logits) => Array.from(logits.data.slice(logits.data.length - logits.shape[2]));
  const argmax = (row) => row.reduce((best, v, k) => (v > row[best] ? k : best), 0);
  let outputs = await model.run(feeds(prompt, 0, null), { keepOnGpu: present });
  const result = { tokens: [], logits: [last(outputs.logits)], counts: [] };
  let start = prompt.length;
  let older = null;
  for (let step = 0; step < steps; step++) {
    const token = argmax(last(outputs.logits));
    result.tokens.push(token);
    older = present.map((name) => outputs[name]);
    outputs = await model.run(feeds([token], start, older), { keepOnGpu: present });
    result.counts.push({ ...model.stats.lastRun });
    result.logits.push(last(outputs.logits));
    start += 1;
  }
  result.view = (await outputs["present.0.key"].read()).shape;
  result.stale = await model.run(feeds([0], start - 1, older), { keepOnGpu: present }).then(() => "no error", (e) => e.message);
  model.dispose();
  return result;
}
"""


@pytest.mark.browser
def test_greedy_decode_in_chromium_moves_no_cache_bytes(tiny_llama, reference, cached_bundle, onnxruntime_run) -> None:
    pytest.importorskip("playwright")
    try:
        browser.find_chromium()
    except relaxweb.RelaxwebError as error:
        pytest.skip(str(error))
    config, steps = tiny_llama.Config(), 12
    prompt = tiny_llama.encode(reference["prompt"])
    with browser.open_runner_page(cached_bundle.path) as page:
        result = page.evaluate(DECODE_IN_PAGE, {"prompt": prompt, "steps": steps, "layers": config.layers})
    assert result["tokens"] == reference["continuation_ids"][:steps]
    expected = tiny_llama.greedy_with_cache(onnxruntime_run, config, prompt, steps)
    assert result["tokens"] == expected
    start = len(prompt)
    for step, counts in enumerate(result["counts"]):
        if step >= 2:
            assert counts["buffersCreated"] == 0, (step, counts)
        assert counts["inputBytesWritten"] == decode_step_bytes(start + step), (step, counts)
        assert counts["bytesRead"] == 4 * 258, (step, counts)
    assert result["view"] == [1, config.kv_heads, start + steps, config.head_dim]
    assert "a view of a KV cache that a later run has written" in result["stale"], result["stale"]


#: Runs in the runner page: two prompts generated one after the other, then both at once, on each backend.
CONCURRENT_IN_PAGE = """
async ({ prompts, steps }) => {
  const results = {};
  for (const backend of ["webgpu", "wasm"]) {
    const model = await window.relaxweb.load("/bundle/", { backend });
    const options = { maxNewTokens: steps, temperature: 0, stopTokens: [] };
    const alone = [];
    for (const prompt of prompts) alone.push((await model.generate(prompt, options)).tokens);
    const together = await Promise.allSettled(prompts.map((prompt) => model.generate(prompt, options)));
    results[backend] = { backend: model.backend, alone,
                         together: together.map((r) => (r.status === "fulfilled" ? r.value.tokens : r.reason.message)) };
    model.dispose();
  }
  return results;
}
"""


@pytest.mark.browser
def test_concurrent_generations_on_one_model_take_turns_in_chromium(tiny_llama, reference, cached_bundle) -> None:
    """Two ``generate`` calls at once on a model with KV caches each give the tokens of their
    prompt alone, on both backends (the first failed: the second's runs overwrote its cache views)."""
    pytest.importorskip("playwright")
    try:
        browser.find_chromium()
    except relaxweb.RelaxwebError as error:
        pytest.skip(str(error))
    prompts = [tiny_llama.encode(reference["prompt"]), tiny_llama.encode(reference["prompt"])[:5]]
    with browser.open_runner_page(cached_bundle.path, webgpu=True) as page:
        results = page.evaluate(CONCURRENT_IN_PAGE, {"prompts": prompts, "steps": 6})
    for backend, result in results.items():
        assert result["backend"] == backend and result["together"] == result["alone"], results
    assert results["webgpu"]["alone"][0] == reference["continuation_ids"][:6]
