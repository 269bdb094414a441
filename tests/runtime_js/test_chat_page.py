"""The chat page (web_demo/chat.html, the page ``relaxweb serve DIR`` prints for a bundle that
generates text) in headless Chromium, driven as a person uses it.

The model is the hand-made tiny decoder of ``tests/fixtures/tiny_decoder.py`` (random weights,
258 logits) with the byte-level tokenizer folder of ``tests/runtime/test_chat.py`` (a byte is its
own id, ``<s>`` 256, ``</s>`` 257; a chat template; EOS 257): replies are byte noise, but exact.
Each reply the page streams must be onnxruntime's greedy tokens after transformers' chat prompt
of the conversation so far, decoded by ``tokenizers``. Beside it, in sub-folders of the served
bundle: the same decoder with only its byte tokenizer (no chat template: plain completion) and
the example MLP (not a decoder: the page says so). The page runs on WebGPU (SwiftShader) and,
in a Chromium without WebGPU, on the wasm backend ("auto").
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

import relaxweb
from examples.make_mlp import make_mlp
from relaxweb import browser
from tests.fixtures.tiny_decoder import tiny_decoder
from tests.runtime.test_chat import TEMPLATE, byte_tokenizer
from tests.runtime_js.test_browser import pytestmark as browser_marks

pytestmark = browser_marks

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS_DIR = ROOT / "test-artifacts"
TIMEOUT_MS = 120_000
#: Long enough for a chat prompt and a 400-token reply.
BOUNDS = {"batch_size": 1, "sequence_length": 256, "past_sequence_length": 512}
EOS = 257
STEPS = 24
LONG = 400


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory) -> Path:
    """A publisher's folder for the tiny decoder's ids: tokenizer.json, a chat template, EOS 257."""
    folder = tmp_path_factory.mktemp("chat-page-tokenizer")
    byte_tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "chat_template": TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast"}))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 256, "eos_token_id": EOS}))
    return folder


@pytest.fixture(scope="module")
def bundle(tokenizer_folder, tmp_path_factory) -> Path:
    """The chat bundle at the root; ``completion/`` (the decoder with its byte tokenizer alone)
    and ``mlp/`` (no decoder) inside it, so that one server serves all three."""
    root = tmp_path_factory.mktemp("chat-page") / "bundle"
    relaxweb.build(tiny_decoder(), root, bounds=BOUNDS, tokenizer=tokenizer_folder)
    relaxweb.build(tiny_decoder(), root / "completion", bounds=BOUNDS)
    relaxweb.build(make_mlp(), root / "mlp", bounds={"batch": 4})
    return root


@pytest.fixture(scope="module")
def reference(tokenizer_folder):
    """The replies the page must give: onnxruntime's greedy tokens after a prompt, as text."""
    session = onnxruntime.InferenceSession(tiny_decoder().SerializeToString(), providers=["CPUExecutionProvider"])
    transformers_tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_folder))
    decoder = Tokenizer.from_file(str(tokenizer_folder / "tokenizer.json"))

    def greedy(prompt: list[int], steps: int) -> tuple[list[int], str]:
        tokens: list[int] = []
        while len(tokens) < steps:
            feeds = {"input_ids": np.array([prompt + tokens], np.int64),
                     "past_key_values.0.key": np.zeros((1, 1, 0, 8), np.float32)}
            token = int(session.run(["logits"], feeds)[0][0, -1].argmax())
            if token == EOS:
                return tokens, "eos"
            tokens.append(token)
        return tokens, "length"

    def chat(messages: list[dict], steps: int) -> tuple[list[int], str, str]:
        encoded = transformers_tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        tokens, stopped = greedy(list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded), steps)
        return tokens, decoder.decode(tokens), stopped

    def completion(text: str, steps: int) -> tuple[list[int], str, str]:
        tokens, stopped = greedy([256, *text.encode()], steps)  # the byte tokenizer: <s>, then the bytes
        return tokens, bytes(t for t in tokens if t < 256).decode(errors="replace"), stopped

    return chat, completion


@contextlib.contextmanager
def chat_page(bundle_dir: Path, query: dict[str, str] | None = None, *, webgpu: bool = True) -> Iterator:
    """A headless Chromium page (without WebGPU unless ``webgpu``) on the chat page, served as
    ``relaxweb serve`` serves it; an uncaught error on the page fails the test."""
    server = browser.start_server(bundle_dir)
    try:
        with browser.sync_playwright() as playwright:
            chromium = browser.launch_chromium(playwright, webgpu=webgpu)
            try:
                page = chromium.new_page()
                uncaught: list[str] = []
                page.on("pageerror", lambda error: uncaught.append(str(error)))
                page.goto(f"{server.url}chat.html?{urllib.parse.urlencode(query or {})}")  # type: ignore[attr-defined]
                yield page
                assert uncaught == []
            finally:
                chromium.close()
    finally:
        browser.stop_server(server)


#: Records every text the newest reply shows while it streams (window.streamed).
RECORD_STREAM = """() => {
  window.streamed = [];
  new MutationObserver(() => {
    const replies = document.querySelectorAll("#conversation .message .content");
    const text = replies.length ? replies[replies.length - 1].textContent : "";
    if (text && text !== window.streamed[window.streamed.length - 1]) window.streamed.push(text);
  }).observe(document.getElementById("conversation"), { childList: true, subtree: true, characterData: true });
}"""


#: Makes the page click Stop as soon as the status shows 5 tokens or more (installed before the
#: message is sent: the click lands at the fifth token however fast the tokens come).
STOP_AFTER_FIVE_TOKENS = """() => {
  const status = document.getElementById("status");
  const observer = new MutationObserver(() => {
    if (/^([5-9]|\\d\\d+) tokens/.test(status.textContent)) {
      observer.disconnect();
      document.getElementById("stop").click();
    }
  });
  observer.observe(status, { childList: true, characterData: true, subtree: true });
}"""


def send(page, text: str, max_new_tokens: int) -> None:
    page.fill("#max-new-tokens", str(max_new_tokens))
    page.fill("#message", text)
    page.press("#message", "Enter")


def last_reply(page) -> dict:
    """The newest reply once it has finished (or the page's error): its text and figures."""
    page.wait_for_function("""() => document.getElementById("error").textContent !== "" ||
      [...document.querySelectorAll("#conversation .message")].slice(-1)[0]?.dataset.stopped !== undefined""",
                           timeout=TIMEOUT_MS)
    return page.evaluate("""() => {
      const box = [...document.querySelectorAll("#conversation .message")].slice(-1)[0];
      return { error: document.getElementById("error").textContent, role: box?.dataset.role ?? null,
               text: box?.querySelector(".content").textContent ?? null, stats: box?.querySelector(".stats").textContent ?? null,
               figures: box ? { ...box.dataset } : null };
    }""")


def check_reply(page, expected: tuple[list[int], str, str], role: str = "assistant") -> dict:
    """The page's newest reply is ``expected`` (tokens, text, why it stopped), with its figures."""
    tokens, text, stopped = expected
    reply = last_reply(page)
    assert reply["error"] == "", reply["error"]
    assert (reply["role"], reply["text"]) == (role, text)
    assert (reply["figures"]["tokens"], reply["figures"]["stopped"]) == (str(len(tokens)), stopped)
    assert float(reply["figures"]["tokensPerSecond"]) > 0 and float(reply["figures"]["prefillMs"]) > 0
    assert "tokens/s" in reply["stats"] and "prefill" in reply["stats"]
    return reply


def chat_and_stop(page, reference, backend_line: str) -> None:
    """The conversation every backend must hold: two greedy turns streamed, a long reply stopped,
    the page usable after, a new chat, a bad option refused with the turn given back."""
    chat, _ = reference
    page.wait_for_selector("#send:not([disabled])", timeout=TIMEOUT_MS)
    assert page.inner_text("#device").startswith(backend_line)
    assert page.is_hidden("#notice")
    assert page.input_value("#temperature") == "0" and page.input_value("#top-p") == "1"  # no sampling defaults: greedy
    assert page.input_value("#max-new-tokens") == "256"
    page.evaluate(RECORD_STREAM)

    first = [{"role": "user", "content": "Hello there"}]
    expected = chat(first, STEPS)
    send(page, "Hello there", STEPS)
    reply = check_reply(page, expected)
    streamed = page.evaluate("window.streamed")
    assert len(streamed) >= min(len(expected[0]), 3) and streamed[-1] == reply["text"]  # token by token

    second = [*first, {"role": "assistant", "content": expected[1]}, {"role": "user", "content": "And then?"}]
    send(page, "And then?", STEPS)
    check_reply(page, chat(second, STEPS))
    assert page.eval_on_selector_all("#conversation .message", "(nodes) => nodes.map((n) => n.dataset.role)") == [
        "user", "assistant", "user", "assistant"]

    page.click("#new-chat")
    assert page.eval_on_selector_all("#conversation .message", "(nodes) => nodes.length") == 0
    _, _, long_stopped = chat([{"role": "user", "content": "Go on"}], LONG)
    assert long_stopped == "length"  # a reply that would run LONG tokens
    page.evaluate(STOP_AFTER_FIVE_TOKENS)
    send(page, "Go on", LONG)
    stopped = last_reply(page)
    assert stopped["error"] == "" and stopped["figures"]["stopped"] == "aborted"
    assert 5 <= int(stopped["figures"]["tokens"]) <= 8  # stopped within a token or two of the click
    assert page.is_disabled("#stop") and page.is_enabled("#send")
    kept = stopped["text"]  # the stopped reply stays in the conversation
    send(page, "Thanks", STEPS)
    check_reply(page, chat([{"role": "user", "content": "Go on"}, {"role": "assistant", "content": kept},
                            {"role": "user", "content": "Thanks"}], STEPS))

    page.fill("#temperature", "-1")
    send(page, "Hot?", STEPS)
    page.wait_for_function("document.getElementById('error').textContent !== ''", timeout=TIMEOUT_MS)
    assert "temperature must be a number >= 0" in page.inner_text("#error")
    assert page.input_value("#message") == "Hot?"  # the turn is given back
    assert page.eval_on_selector_all("#conversation .message", "(nodes) => nodes.length") == 4


def test_the_chat_page_streams_stops_and_shows_its_figures_on_webgpu(bundle, reference) -> None:
    with chat_page(bundle) as page:
        chat_and_stop(page, reference, "Backend: webgpu")
        ARTIFACTS_DIR.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS_DIR / "chat-page.png"), full_page=True)


def test_the_chat_page_without_webgpu_runs_on_the_wasm_backend(bundle, reference) -> None:
    with chat_page(bundle, webgpu=False) as page:  # backend "auto", no adapter: wasm
        chat_and_stop(page, reference, "Backend: wasm (CPU, ")


def test_the_chat_page_says_what_a_bundle_lacks_and_offers_completion(bundle, reference) -> None:
    _, completion = reference
    with chat_page(bundle, {"bundle": "bundle/mlp/"}) as page:
        page.wait_for_selector("#notice:not([hidden])", timeout=TIMEOUT_MS)
        assert page.inner_text("#notice").startswith("This bundle cannot generate: it has no input 'input_ids'")
        assert page.is_disabled("#send") and page.is_disabled("#message")
        assert page.inner_text("#error") == ""

        page.fill("#bundle-url", "bundle/completion/")
        page.select_option("#backend", "webgpu")
        page.click("#load")
        page.wait_for_selector("#send:not([disabled])", timeout=TIMEOUT_MS)
        notice = page.inner_text("#notice")
        assert "byte tokenizer has no chat template" in notice and "plain completion" in notice
        assert page.is_hidden("#system-line")
        send(page, "The if", STEPS)
        check_reply(page, completion("The if", STEPS), role="completion")


def test_relaxweb_serve_prints_the_chat_page_for_a_bundle_that_generates(bundle) -> None:
    """``relaxweb serve`` says where the chat is for a decoder with a tokenizer (with a template
    or without: plain completion), and only the demo for other bundles."""
    for folder, chat in ((bundle, True), (bundle / "completion", True), (bundle / "mlp", False)):
        server = subprocess.Popen([sys.executable, "-m", "relaxweb", "serve", str(folder), "--port", "0"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            first = server.stdout.readline()  # type: ignore[union-attr]
            assert first.startswith(f"Serving {folder} at http://127.0.0.1:") and first.endswith("(Ctrl-C to stop)\n")
            url = first.split(" at ")[1].split(" ")[0]
            if chat:
                assert server.stdout.readline() == f"Chat with it at {url}chat.html\n"  # type: ignore[union-attr]
        finally:
            server.terminate()
            output, _ = server.communicate(timeout=30)
        assert "Chat with it" not in output
