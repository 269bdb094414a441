"""Text generation: the tokenizer in the bundle (``relaxweb/tokenizer/``, the manifest's
``tokenizer``), decoder detection, and ``generate`` in both runtimes (``runtime/generate.py``,
``runtime_js/generate.js``, the shared ``runtime_js/sampler.wgsl``) on the tiny Llama of
``scripts/tiny_llama.py``, against onnxruntime's greedy tokens and logits; and the CLI.  On the
wasm backend (``sampler.py`` / ``cpu_sampler.js`` picking each token), chat and generate give
the WebGPU chat's tokens, in Python, on the command line and in Chromium.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import relaxweb
from relaxweb import browser
from relaxweb.errors import RelaxwebError
from relaxweb.runtime.generate import decoder_signature
from relaxweb.tokenizer import ByteTokenizer, checked_tokenizer
from tests.fixtures.tiny_decoder import BOUNDS as TINY_DECODER_BOUNDS, tiny_decoder
from tests.helpers import demo_page, load_bundle, make_model
from tests.runtime_js.test_browser import pytestmark as browser_marks
from tests.e2e.test_tiny_llama import onnxruntime_run, paths, reference, tiny_llama  # noqa: F401  (fixtures)
from tests.runtime.test_chat import MESSAGES as CHAT_MESSAGES, STEPS as CHAT_STEPS, folder  # noqa: F401  (a fixture)

ROOT = Path(__file__).resolve().parents[2]
BYTE_TOKENIZER = {"kind": "byte", "vocab_size": 258, "bos_token_id": 256, "eos_token_id": 257}
BOUNDS = {"batch_size": 1, "sequence_length": 256, "past_sequence_length": 256, "total_sequence_length": 256}
GREEDY_STEPS = 48
TOP_K = 5


def identity_model(tokenizer: str | None = None) -> onnx.ModelProto:
    """y = x: not a decoder; with ``tokenizer`` in its metadata_props when given."""
    model = make_model([helper.make_node("Identity", ["x"], ["y"])], [("x", TensorProto.FLOAT, ["n"])], ["y"])
    if tokenizer is not None:
        helper.set_model_props(model, {"relaxweb.tokenizer": tokenizer})
    return model


# The tokenizer ------------------------------------------------------------------------------


def test_a_byte_tokenizer_encodes_after_bos_and_streams_complete_characters() -> None:
    tokenizer = ByteTokenizer(BYTE_TOKENIZER)
    ids = tokenizer.encode("aé€")
    assert ids == [256, 97, 0xC3, 0xA9, 0xE2, 0x82, 0xAC]
    stream = tokenizer.stream()
    assert [stream.push(i) for i in ids] == ["", "a", "", "é", "", "", "€"]
    assert stream.push(0xE2) + stream.finish() == "\ufffd"  # a character cut off at the end
    assert tokenizer.decode([*ids, 257]) == "aé€"
    assert tokenizer.stop_tokens == [257]


@pytest.mark.parametrize("spec, message", [
    ({"kind": "sentencepiece", "vocab_size": 300}, 'kind "sentencepiece"; a tokenizer entry written by hand has the kind '
                                                   'byte (give a Hugging Face tokenizer as its tokenizer.json or its folder'),
    ({"kind": "huggingface", "vocab_size": 300}, 'kind "huggingface"; a tokenizer entry written by hand has the kind byte'),
    ({"vocab_size": 258}, "kind null"),
    ([1, 2], "must be a JSON object"),
    ({"kind": "byte", "vocab_size": 100}, "vocab_size must be an integer from 256"),
    ({"kind": "byte", "vocab_size": 258, "eos_token_id": 65}, "eos_token_id must be a special id from 256 to 257"),
    ({"kind": "byte", "vocab_size": 258, "bos_token_id": 258}, "bos_token_id must be a special id"),
])
def test_a_tokenizer_relaxweb_cannot_use_is_refused(spec, message) -> None:
    with pytest.raises(RelaxwebError, match="the tokenizer in here") as error:
        checked_tokenizer(spec, "here")
    assert message in str(error.value)


def test_the_build_copies_the_models_tokenizer_or_the_given_file(tmp_path: Path) -> None:
    with_metadata = relaxweb.build(identity_model(json.dumps(BYTE_TOKENIZER)), tmp_path / "a")
    assert with_metadata.manifest["tokenizer"] == BYTE_TOKENIZER
    assert "tokenizer" not in relaxweb.build(identity_model(), tmp_path / "b").manifest
    (tmp_path / "tokenizer.json").write_text(json.dumps({"kind": "byte", "vocab_size": 256, "comment": "dropped"}))
    given = relaxweb.build(identity_model(json.dumps(BYTE_TOKENIZER)), tmp_path / "c", tokenizer=tmp_path / "tokenizer.json")
    assert given.manifest["tokenizer"] == {"kind": "byte", "vocab_size": 256}
    with pytest.raises(RelaxwebError, match=r"metadata_props\['relaxweb.tokenizer'\] has kind \"wordpiece\""):
        relaxweb.build(identity_model(json.dumps({"kind": "wordpiece"})), tmp_path / "d")
    assert not (tmp_path / "d" / "manifest.json").exists()


def test_the_command_line_builds_with_a_tokenizer_file(tmp_path: Path) -> None:
    onnx.save(identity_model(), str(tmp_path / "m.onnx"))
    (tmp_path / "bad.json").write_text('{"kind": "byte", "vocab_size": 258, "eos_token_id": 7}')
    result = subprocess.run([sys.executable, "-m", "relaxweb", "build", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "out"),
                             "--tokenizer", str(tmp_path / "bad.json")], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 2
    assert result.stderr.strip() == (f"error: the tokenizer in {tmp_path / 'bad.json'}: eos_token_id must be a special id "
                                     "from 256 to 257 (ids below 256 are bytes), got 7")


# Decoder detection and options -----------------------------------------------------------------


def test_a_bundle_that_is_not_a_decoder_is_told_what_it_lacks(tmp_path: Path) -> None:
    manifest = relaxweb.build(identity_model(), tmp_path / "bundle").manifest
    with pytest.raises(RelaxwebError) as error:
        decoder_signature(manifest)
    assert str(error.value) == (
        "this bundle cannot generate: it has no input 'input_ids'; no output 'logits'; no cache inputs "
        "'past_key_values.*'; inputs generate cannot feed: 'x' (a decoder has input_ids -> logits and a present.X output "
        "for each past_key_values.X input, optionally attention_mask and position_ids)")


def test_generation_stops_at_the_bound_of_a_cache_of_any_rank(backend, tmp_path: Path) -> None:
    """A cache [batch, past, 8] bounded at 16: a prompt of 10 tokens gets 8 new ones (the last
    run has a past of 16) and stops with "length", rather than failing at a past of 17."""
    bundle = relaxweb.build(tiny_decoder(cache_rank=3), tmp_path / "dist", bounds={**TINY_DECODER_BOUNDS, "past_sequence_length": 16})
    result = load_bundle(bundle.path, backend).generate([65] * 10, max_new_tokens=30, stop_tokens=[])
    assert (len(result.tokens), result.stopped) == (8, "length")


# The tiny Llama on the Python runtime -------------------------------------------------------


@pytest.fixture(scope="module")
def llama_bundle(paths, tmp_path_factory) -> Path:  # noqa: F811
    out = tmp_path_factory.mktemp("generate") / "bundle"
    relaxweb.build(paths["model"], out, bounds=BOUNDS)
    return out


@pytest.fixture(scope="module")
def session(llama_bundle, device):
    return relaxweb.load(llama_bundle, device=device)


@pytest.fixture(scope="module")
def greedy_tokens(tiny_llama, reference, onnxruntime_run) -> list[int]:  # noqa: F811
    """onnxruntime's greedy tokens after the reference prompt, with its cache fed back."""
    config = tiny_llama.Config()
    return tiny_llama.greedy_with_cache(onnxruntime_run, config, tiny_llama.encode(reference["prompt"]), GREEDY_STEPS)


def top_k_of_onnxruntime(tiny_llama, onnxruntime_run, prompt: list[int], tokens: list[int]) -> list[np.ndarray]:  # noqa: F811
    """For each generated token, onnxruntime's logits at the position that produced it (the
    whole sequence in one run with an empty past)."""
    feeds = tiny_llama.decoder_feeds(tiny_llama.Config(), prompt + tokens, 0, None)
    logits = onnxruntime_run(feeds)["logits"][0]
    return [logits[len(prompt) - 1 + step] for step in range(len(tokens))]


def assert_among_top_k(token_logits: list[np.ndarray], tokens: list[int], k: int) -> None:
    """Each token is one of the k largest logits of its row (within float32 noise of the k-th:
    relaxweb's logits are not onnxruntime's to the last bit)."""
    for step, (row, token) in enumerate(zip(token_logits, tokens)):
        kth = np.sort(row)[-k]
        assert row[token] >= kth - 1e-4 * max(1.0, abs(kth)), (step, token, row[token], kth)


@pytest.mark.slow
def test_greedy_generate_gives_onnxruntimes_tokens(session, greedy_tokens, tiny_llama, reference) -> None:  # noqa: F811
    streamed = []
    result = session.generate(reference["prompt"], max_new_tokens=GREEDY_STEPS, stop_tokens=[],
                              on_token=lambda token, text: streamed.append((token, text)))
    assert result.tokens == greedy_tokens, tiny_llama.decode(result.tokens)
    assert result.stopped == "length" and result.text == tiny_llama.decode(greedy_tokens)
    assert [token for token, _ in streamed] == greedy_tokens
    assert [text for _, text in streamed] == [tiny_llama.decode(greedy_tokens[:n + 1]) for n in range(GREEDY_STEPS)]
    assert result.tokens_per_second > 0 and result.prefill_ms > 0
    # token ids work as a prompt too, and only one 4-byte value is read back per token
    again = session.generate(tiny_llama.encode(reference["prompt"]), max_new_tokens=3)
    assert again.tokens == greedy_tokens[:3]
    assert session.stats.last_run.bytes_read == 4


@pytest.mark.slow
def test_top_k_sampling_is_reproducible_and_picks_among_the_k_largest(session, greedy_tokens, tiny_llama, reference,  # noqa: F811
                                                                      onnxruntime_run) -> None:  # noqa: F811
    def sample(seed: int, **options) -> list[int]:
        return session.generate(reference["prompt"], max_new_tokens=40, temperature=1.0, seed=seed, stop_tokens=[],
                                **options).tokens

    first = sample(7, top_k=TOP_K)
    assert sample(7, top_k=TOP_K) == first
    assert sample(8, top_k=TOP_K) != first
    assert first != greedy_tokens[:40]  # it samples: not the greedy tokens
    prompt = tiny_llama.encode(reference["prompt"])
    assert_among_top_k(top_k_of_onnxruntime(tiny_llama, onnxruntime_run, prompt, first), first, TOP_K)
    # over the whole vocabulary some token is outside the top 5 somewhere (the sampler's
    # other path), yet every one is a token the model gives some probability
    whole = sample(3, top_k=0)
    rows = top_k_of_onnxruntime(tiny_llama, onnxruntime_run, prompt, whole)
    assert any(row[token] < np.sort(row)[-TOP_K] for row, token in zip(rows, whole))
    # top_k=1 is greedy whatever the temperature
    assert sample(5, top_k=1) == greedy_tokens[:40]


@pytest.mark.slow
def test_generation_stops_at_stop_tokens_the_callback_and_the_bound(session, greedy_tokens, reference) -> None:
    assert greedy_tokens[:4] == [32, 116, 104, 101]  # " the": the stop token 32 comes first
    result = session.generate(reference["prompt"], max_new_tokens=GREEDY_STEPS, stop_tokens=[32])
    assert (result.tokens, result.stopped) == ([], "eos")
    result = session.generate(reference["prompt"], max_new_tokens=GREEDY_STEPS, stop_tokens=[101])
    assert (result.tokens, result.stopped, result.text) == ([32, 116, 104], "eos", " th")

    aborted = session.generate(reference["prompt"], max_new_tokens=GREEDY_STEPS, on_token=lambda token, text: len(text) < 5)
    assert (aborted.tokens, aborted.stopped) == (greedy_tokens[:5], "aborted")

    # a prompt of 250 tokens with sequences bounded at 256: 7 new tokens (the last one needs no run)
    long_prompt = [256] + [97] * 249
    bounded = session.generate(long_prompt, max_new_tokens=20)
    assert (len(bounded.tokens), bounded.stopped) == (7, "length")
    with pytest.raises(RelaxwebError, match="the prompt has 257 tokens; this bundle's bounds allow sequences of at most 256"):
        session.generate([97] * 257)
    with pytest.raises(RelaxwebError, match="top_k must be an integer from 0"):
        session.generate("x", top_k=300)


@pytest.mark.slow
def test_live_gpu_bytes_stay_flat_over_100_tokens(session, reference) -> None:
    session.generate(reference["prompt"], max_new_tokens=3)  # warm: the pool holds the kept outputs' buffers
    before = session.stats.live_gpu_bytes
    created = session.stats.total.buffers_created
    live = []
    result = session.generate(reference["prompt"], max_new_tokens=100, temperature=0.8, top_k=20, seed=1, stop_tokens=[],
                              on_token=lambda token, text: live.append(session.stats.live_gpu_bytes))
    assert len(result.tokens) == 100
    assert session.stats.live_gpu_bytes == before
    assert len(set(live)) == 1, sorted(set(live))
    # the sampler's four small buffers are all a warm generate creates
    assert session.stats.total.buffers_created - created == 4


@pytest.mark.slow
def test_the_command_line_streams_text(llama_bundle, greedy_tokens, tiny_llama, reference) -> None:  # noqa: F811
    result = subprocess.run([sys.executable, "-m", "relaxweb", "generate", str(llama_bundle), "--prompt", reference["prompt"],
                             "--max-tokens", "16"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout == tiny_llama.decode(greedy_tokens[:16]) + "\n"
    assert "16 tokens, stopped by length" in result.stderr and "tokens/s" in result.stderr
    help_text = subprocess.run([sys.executable, "-m", "relaxweb", "generate", "--help"], capture_output=True, text=True,
                               cwd=ROOT).stdout
    assert all(option in help_text for option in ("--temperature", "--top-k", "--top-p", "--repetition-penalty", "--seed"))


# The tiny Llama in Chromium -----------------------------------------------------------------


def in_chromium(test):
    """tests/runtime_js/test_browser.py's marks (browser; skipped without Playwright or Chromium), and slow."""
    for mark in (*browser_marks, pytest.mark.slow):
        test = mark(test)
    return test

#: Runs in the runner page: greedy with tokens streamed, seeded top-k twice, an abort after 5
#: tokens, and 100 tokens with the live GPU bytes before, at each token, and after.
GENERATE_IN_PAGE = """
async ({ prompt, steps, topK }) => {
  const model = await window.relaxweb.load("/bundle/");
  const streamed = [];
  const greedy = await model.generate(prompt, { maxNewTokens: steps, stopTokens: [],
                                                onToken: (token, text) => streamed.push([token, text]) });
  const sampled = [];
  for (const seed of [7, 7]) {
    sampled.push((await model.generate(prompt, { maxNewTokens: 40, temperature: 1, topK, seed, stopTokens: [] })).tokens);
  }
  const controller = new AbortController();
  let calls = 0;
  const aborted = await model.generate(prompt, { maxNewTokens: steps, signal: controller.signal,
                                                 onToken: () => { if (++calls === 5) controller.abort(); } });
  const before = model.stats.liveGpuBytes;
  const live = [];
  const long = await model.generate(prompt, { maxNewTokens: 100, temperature: 0.8, topK: 20, seed: 1, stopTokens: [],
                                              onToken: () => live.push(model.stats.liveGpuBytes) });
  const result = { greedy, streamed, sampled, aborted, calls, before, live, after: model.stats.liveGpuBytes,
                   longTokens: long.tokens.length, disposedDuring: {} };
  model.dispose();
  // disposed while generating: on WebGPU just as the sampler starts reading a token back (the
  // device's own words were "Buffer was unmapped before mapping was resolved"), on wasm between tokens
  const mapAsync = GPUBuffer.prototype.mapAsync;
  for (const backend of ["webgpu", "wasm"]) {
    const doomed = await window.relaxweb.load("/bundle/", { backend });
    let armed = false;
    GPUBuffer.prototype.mapAsync = function (...args) {
      const mapping = mapAsync.apply(this, args);
      if (armed) doomed.dispose();
      return mapping;
    };
    const onToken = () => { if (backend === "webgpu") armed = true; else doomed.dispose(); };
    result.disposedDuring[backend] = await doomed.generate(prompt, { maxNewTokens: steps, stopTokens: [], onToken })
      .then(() => "resolved", (error) => error.message);
    GPUBuffer.prototype.mapAsync = mapAsync;
  }
  return result;
}
"""


@in_chromium
def test_generate_in_chromium(llama_bundle, greedy_tokens, tiny_llama, reference, onnxruntime_run) -> None:  # noqa: F811
    with browser.open_runner_page(llama_bundle, timeout_s=120) as page:
        result = page.evaluate(GENERATE_IN_PAGE, {"prompt": reference["prompt"], "steps": GREEDY_STEPS, "topK": TOP_K})
    greedy = result["greedy"]
    assert greedy["tokens"] == greedy_tokens, tiny_llama.decode(greedy["tokens"])
    assert (greedy["text"], greedy["stopped"]) == (tiny_llama.decode(greedy_tokens), "length")
    assert greedy["tokensPerSecond"] > 0 and greedy["prefillMs"] > 0
    # onToken: one call per token, in order, the text so far each time
    assert [token for token, _ in result["streamed"]] == greedy_tokens
    assert [text for _, text in result["streamed"]] == [tiny_llama.decode(greedy_tokens[:n + 1]) for n in range(GREEDY_STEPS)]

    first, again = result["sampled"]
    assert first == again and first != greedy_tokens[:40]
    prompt = tiny_llama.encode(reference["prompt"])
    assert_among_top_k(top_k_of_onnxruntime(tiny_llama, onnxruntime_run, prompt, first), first, TOP_K)

    aborted = result["aborted"]
    assert (aborted["tokens"], aborted["stopped"], result["calls"]) == (greedy_tokens[:5], "aborted", 5)

    # memory: after the warm-up above, equal before and after 100 tokens, and flat in between
    assert result["longTokens"] == 100
    assert result["after"] == result["before"]
    assert len(set(result["live"])) == 1, sorted(set(result["live"]))
    assert result["disposedDuring"] == {"webgpu": "the model was disposed during generate",
                                        "wasm": "the model was disposed during generate"}


@in_chromium
def test_the_demo_page_streams_generated_text(llama_bundle, greedy_tokens, tiny_llama) -> None:  # noqa: F811
    """``relaxweb serve DIR`` of a decoder with a tokenizer: the demo shows a prompt box, streams
    the tokens into the page with tokens/s, and Stop ends a generation."""
    with demo_page(llama_bundle) as page:
        page.wait_for_selector("#generate-section:not([hidden]) #generate:not([disabled])", timeout=120_000)
        assert page.input_value("#prompt") == "The if statement"
        page.fill("#max-tokens", "24")
        # the text grows token by token: record each change of the output
        page.evaluate("""() => { window.seen = []; new MutationObserver(() => window.seen.push(
            document.getElementById('generated').textContent)).observe(document.getElementById('generated'),
            { childList: true, characterData: true, subtree: true }); }""")
        page.click("#generate")
        page.wait_for_function("document.getElementById('generate-status').textContent.includes('stopped by')",
                               timeout=120_000)
        assert page.inner_text("#error") == ""
        assert page.text_content("#generated") == tiny_llama.decode(greedy_tokens[:24])
        status = page.inner_text("#generate-status")
        assert status.startswith("24 tokens, stopped by length") and "tokens/s" in status, status
        assert len(set(page.evaluate("window.seen"))) >= 20  # streamed, not written once at the end

        page.fill("#max-tokens", "1000")
        page.click("#generate")
        page.wait_for_function("document.getElementById('generated').textContent.length >= 3", timeout=120_000)
        page.click("#stop")
        page.wait_for_function("document.getElementById('generate-status').textContent.includes('stopped by')",
                               timeout=120_000)
        assert "stopped by aborted" in page.inner_text("#generate-status")
        assert len(page.text_content("#generated")) < 100
        assert page.is_enabled("#generate") and page.is_disabled("#stop")


# The wasm backend: the same loop, each token picked on the CPU ------------------------------


@pytest.fixture(scope="module")
def chat_bundle(paths, folder, tmp_path_factory) -> Path:  # noqa: F811
    """The tiny Llama with test_chat.py's tokenizer folder (a chat template)."""
    return relaxweb.build(paths["model"], tmp_path_factory.mktemp("chat") / "bundle", bounds=BOUNDS, tokenizer=folder).path


#: greedy, the repetition penalty, seeded top-p and top-k draws
CHAT_OPTIONS = [{}, {"repetition_penalty": 2.0}, {"temperature": 1.0, "top_p": 0.9, "seed": 5},
                {"temperature": 0.8, "top_k": TOP_K, "seed": 1}]


@pytest.mark.slow
def test_chat_on_wasm_gives_the_webgpu_chats_tokens(chat_bundle, device) -> None:
    """Greedy, penalized and seeded chats on the wasm backend: WebGPU's tokens, text and stop
    (the CPU sampler is sampler.wgsl's algorithm, and the logits agree)."""
    on_gpu, on_wasm = relaxweb.load(chat_bundle, device=device), relaxweb.load(chat_bundle, backend="wasm")
    assert on_wasm.backend == "wasm"
    for options in CHAT_OPTIONS:
        expected = on_gpu.chat(CHAT_MESSAGES, max_new_tokens=CHAT_STEPS, **options)
        result = on_wasm.chat(CHAT_MESSAGES, max_new_tokens=CHAT_STEPS, **options)
        assert (result.tokens, result.text, result.stopped) == (expected.tokens, expected.text, expected.stopped), options
    assert len({tuple(on_gpu.chat(CHAT_MESSAGES, max_new_tokens=CHAT_STEPS, **options).tokens)
                for options in CHAT_OPTIONS}) > 2  # the options pick differently


@pytest.mark.slow
def test_the_command_line_generates_and_chats_on_wasm(chat_bundle, llama_bundle, greedy_tokens, tiny_llama,  # noqa: F811
                                                      reference) -> None:
    result = subprocess.run([sys.executable, "-m", "relaxweb", "generate", str(llama_bundle), "--prompt", reference["prompt"],
                             "--max-tokens", "16", "--backend", "wasm"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout == tiny_llama.decode(greedy_tokens[:16]) + "\n"
    expected = relaxweb.load(chat_bundle, backend="wasm").chat(CHAT_MESSAGES, max_new_tokens=CHAT_STEPS)
    messages = [f"{message['role']}:{message['content']}" for message in CHAT_MESSAGES]
    result = subprocess.run([sys.executable, "-m", "relaxweb", "chat", str(chat_bundle), "--backend", "wasm",
                             "--max-tokens", str(CHAT_STEPS), *(f"--message={m}" for m in messages)],
                            capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected.text + "\n"
    refused = subprocess.run([sys.executable, "-m", "relaxweb", "chat", str(chat_bundle), "--backend", "wasm", "--kernels",
                              "cpu"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert (refused.returncode, refused.stderr) == (
        2, "error: --kernels picks WebGPU shaders; --backend wasm runs the bundle's kernels.wasm\n")


#: Runs in the runner page (cross-origin isolated: the wasm backend on worker threads): the same
#: chats on each backend, and the kept tensors a wasm run gives back.
CHAT_ON_BOTH_IN_PAGE = """
async ({ messages, steps, options }) => {
  const results = {};
  for (const backend of ["webgpu", "wasm"]) {
    const model = await window.relaxweb.load("/bundle/", { backend });
    results[backend] = [];
    for (const extra of options) {
      const { tokens, text, stopped } = await model.chat(messages, { maxNewTokens: steps, ...extra });
      results[backend].push({ tokens, text, stopped });
    }
    results[backend + "Threads"] = model.threads ?? 0;
    model.dispose();
  }
  return results;
}
"""


@in_chromium
def test_chat_on_wasm_in_chromium_gives_the_webgpu_chats_tokens(chat_bundle, device) -> None:
    options = [{"repetitionPenalty" if key == "repetition_penalty" else "topP" if key == "top_p" else
                "topK" if key == "top_k" else key: value for key, value in extra.items()} for extra in CHAT_OPTIONS]
    with browser.open_runner_page(chat_bundle, timeout_s=180) as page:
        result = page.evaluate(CHAT_ON_BOTH_IN_PAGE, {"messages": CHAT_MESSAGES, "steps": CHAT_STEPS, "options": options})
    assert result["wasm"] == result["webgpu"]
    assert result["wasmThreads"] > 1
    python = relaxweb.load(chat_bundle, backend="wasm")
    for extra, in_page in zip(CHAT_OPTIONS, result["wasm"]):
        expected = python.chat(CHAT_MESSAGES, max_new_tokens=CHAT_STEPS, **extra)
        assert (in_page["tokens"], in_page["text"], in_page["stopped"]) == (expected.tokens, expected.text, expected.stopped)
