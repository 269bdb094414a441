"""generate and chat with a Hugging Face tokenizer, on the tiny Llama of ``scripts/tiny_llama.py``
(trained on bytes): its tokenizer here is a byte-level BPE without merges whose ids are the
model's (a byte is its own id, ``<s>`` 256, ``</s>`` 257), with a chat template and a
generation_config.json, as a publisher's folder holds them.  Against onnxruntime on the same
ONNX: greedy tokens of a chat prompt (encoded as transformers encodes it), greedy tokens under
the repetition penalty, top-p draws inside the top-p set; ``.text`` the ``tokenizers``
decoding of ``.tokens``; ``relaxweb chat``; the same in Chromium.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoTokenizer

import relaxweb
from relaxweb import browser
from tests.e2e.test_tiny_llama import onnxruntime_run, paths, reference, tiny_llama  # noqa: F401  (fixtures)
from tests.runtime_js.test_browser import pytestmark as browser_marks

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BOUNDS = {"batch_size": 1, "sequence_length": 256, "past_sequence_length": 256, "total_sequence_length": 256}
TEMPLATE = ("{{ bos_token }}{% for message in messages %}### {{ message['role'] | capitalize }}:\n"
            "{{ message['content'] | trim }}\n\n{% endfor %}{% if add_generation_prompt %}### Assistant:\n{% endif %}")
MESSAGES = [{"role": "system", "content": "Answer from the Python documentation."},
            {"role": "user", "content": "What does the if statement do?"}]
STEPS = 24
PENALTY = 2.0
TOP_P = 0.9


def byte_tokenizer() -> Tokenizer:
    """A byte-level BPE with no merges: each byte its own id, as the tiny Llama was trained."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tokenizer = Tokenizer(models.BPE(vocab={char: _byte_of(char) for char in alphabet}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(["<s>", "</s>"])
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 256)])
    return tokenizer


def _byte_of(char: str) -> int:
    """The byte ByteLevel's alphabet writes as ``char`` (GPT-2's map: printable Latin-1 bytes as
    themselves, the others from U+0100 on, in byte order)."""
    shown = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    hidden = [byte for byte in range(256) if byte not in shown]
    return ord(char) if ord(char) in shown else hidden[ord(char) - 256]


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tiny_llama) -> Path:  # noqa: F811
    folder = tmp_path_factory.mktemp("tiny-llama-tokenizer")
    tokenizer = byte_tokenizer()
    tokenizer.save(str(folder / "tokenizer.json"))
    assert tokenizer.encode("aé€ xyz").ids == tiny_llama.encode("aé€ xyz")
    assert (tokenizer.token_to_id("<s>"), tokenizer.token_to_id("</s>")) == (tiny_llama.BOS, tiny_llama.EOS)
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "chat_template": TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast"}))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 256, "eos_token_id": 257}))
    return folder


@pytest.fixture(scope="module")
def bundle(paths, folder, tmp_path_factory) -> Path:  # noqa: F811
    return relaxweb.build(paths["model"], tmp_path_factory.mktemp("chat") / "bundle", bounds=BOUNDS, tokenizer=folder).path


@pytest.fixture(scope="module")
def session(bundle, device):
    return relaxweb.load(bundle, device=device)


@pytest.fixture(scope="module")
def chat_prompt_ids(folder) -> list[int]:
    """The chat prompt's ids as transformers gives them."""
    encoded = AutoTokenizer.from_pretrained(str(folder)).apply_chat_template(MESSAGES, tokenize=True,
                                                                              add_generation_prompt=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def onnxruntime_logits(tiny_llama, onnxruntime_run, ids: list[int]) -> np.ndarray:  # noqa: F811
    """onnxruntime's logits of every position of ``ids`` (one run, an empty past)."""
    return onnxruntime_run(tiny_llama.decoder_feeds(tiny_llama.Config(), ids, 0, None))["logits"][0]


def greedy_with_penalty(tiny_llama, onnxruntime_run, prompt: list[int], steps: int, penalty: float) -> list[int]:  # noqa: F811
    """transformers' greedy search with a repetition penalty, on onnxruntime's logits."""
    tokens: list[int] = []
    for _ in range(steps):
        row = onnxruntime_logits(tiny_llama, onnxruntime_run, prompt + tokens)[-1].copy()
        seen = sorted(set(prompt + tokens))
        row[seen] = np.where(row[seen] < 0, row[seen] * penalty, row[seen] / penalty)
        tokens.append(int(row.argmax()))
    return tokens


def assert_within_top_p(tiny_llama, onnxruntime_run, prompt: list[int], tokens: list[int], temperature: float,  # noqa: F811
                        top_p: float) -> None:
    """Each token is one of the most likely whose probabilities before it sum to less than top_p
    (with room for float32 noise)."""
    rows = onnxruntime_logits(tiny_llama, onnxruntime_run, prompt + tokens)[len(prompt) - 1:-1]
    for step, (row, token) in enumerate(zip(rows, tokens)):
        weights = np.exp((row.astype(np.float64) - row.max()) / temperature)
        before = weights[row > row[token]].sum() / weights.sum()
        assert before < top_p + 1e-4, (step, token, before)


def test_chat_gives_onnxruntimes_greedy_tokens_and_the_tokenizers_text(session, folder, chat_prompt_ids, tiny_llama,  # noqa: F811
                                                                       onnxruntime_run) -> None:  # noqa: F811
    prompt = session.apply_chat_template(MESSAGES)
    assert prompt == AutoTokenizer.from_pretrained(str(folder)).apply_chat_template(MESSAGES, tokenize=False,
                                                                                     add_generation_prompt=True)
    assert session.tokenizer.encode(prompt, add_special_tokens=False) == chat_prompt_ids
    expected = tiny_llama.greedy_with_cache(onnxruntime_run, tiny_llama.Config(), chat_prompt_ids, STEPS)
    streamed = []
    result = session.chat(MESSAGES, max_new_tokens=STEPS, on_token=lambda token, text: streamed.append(text))
    stop = expected.index(tiny_llama.EOS) if tiny_llama.EOS in expected else STEPS
    assert result.tokens == expected[:stop]
    assert result.stopped == ("eos" if stop < STEPS else "length")
    reference_tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert result.text == reference_tokenizer.decode(result.tokens)
    assert streamed[-1] == result.text or not streamed
    # a text prompt: encoded with its <s>, the greedy tokens after it
    text_result = session.generate("The if statement", max_new_tokens=8, stop_tokens=[])
    assert text_result.tokens == tiny_llama.greedy_with_cache(onnxruntime_run, tiny_llama.Config(),
                                                              tiny_llama.encode("The if statement"), 8)


def test_the_repetition_penalty_and_top_p_as_transformers_apply_them(session, chat_prompt_ids, tiny_llama,  # noqa: F811
                                                                     onnxruntime_run) -> None:  # noqa: F811
    penalized = session.chat(MESSAGES, max_new_tokens=STEPS, repetition_penalty=PENALTY, stop_tokens=[])
    assert penalized.tokens == greedy_with_penalty(tiny_llama, onnxruntime_run, chat_prompt_ids, STEPS, PENALTY)
    plain = session.chat(MESSAGES, max_new_tokens=STEPS, stop_tokens=[])
    assert penalized.tokens != plain.tokens  # the penalty changed something

    def sample(seed: int) -> list[int]:
        return session.chat(MESSAGES, max_new_tokens=STEPS, temperature=1.0, top_p=TOP_P, seed=seed, stop_tokens=[]).tokens

    first = sample(4)
    assert sample(4) == first and sample(5) != first
    assert_within_top_p(tiny_llama, onnxruntime_run, chat_prompt_ids, first, 1.0, TOP_P)


def test_relaxweb_chat_answers_messages_and_lines_of_input(bundle, session) -> None:
    expected = session.chat(MESSAGES, max_new_tokens=12)
    command = [sys.executable, "-m", "relaxweb", "chat", str(bundle), "--max-tokens", "12"]
    result = subprocess.run([*command, "--message", f"system:{MESSAGES[0]['content']}", "--message",
                             f"user:{MESSAGES[1]['content']}"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected.text + "\n"
    assert f"{len(expected.tokens)} tokens, stopped by {expected.stopped}" in result.stderr
    # without --message: a user message a line, each reply after it
    first = session.chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "if"}], max_new_tokens=12)
    second = session.chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "if"},
                           {"role": "assistant", "content": first.text}, {"role": "user", "content": "for"}],
                          max_new_tokens=12)
    result = subprocess.run([*command, "--system", "Be brief."], input="if\n\nfor\n", capture_output=True, text=True,
                            cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout == first.text + "\n" + second.text + "\n"
    result = subprocess.run([*command, "--message", "user"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 2
    assert "error: argument --message: --message expects ROLE:TEXT (e.g. user:Hello), got 'user'" in result.stderr


def in_chromium(test):
    for mark in browser_marks:
        test = mark(test)
    return test


#: Runs in the runner page: the chat prompt, greedy chat, greedy chat under a repetition
#: penalty, and a seeded top-p chat twice.
CHAT_IN_PAGE = """
async ({ messages, steps, penalty, topP }) => {
  const model = await window.relaxweb.load("/bundle/");
  const prompt = model.applyChatTemplate(messages);
  const greedy = await model.chat(messages, { maxNewTokens: steps });
  const penalized = await model.chat(messages, { maxNewTokens: steps, repetitionPenalty: penalty, stopTokens: [] });
  const sampled = [];
  for (const seed of [4, 4]) {
    sampled.push((await model.chat(messages, { maxNewTokens: steps, temperature: 1, topP, seed, stopTokens: [] })).tokens);
  }
  model.dispose();
  return { prompt, greedy, penalized: penalized.tokens, sampled };
}
"""


@in_chromium
def test_chat_in_chromium(bundle, session, chat_prompt_ids, tiny_llama, onnxruntime_run) -> None:  # noqa: F811
    with browser.open_runner_page(bundle, timeout_s=120) as page:
        result = page.evaluate(CHAT_IN_PAGE, {"messages": MESSAGES, "steps": STEPS, "penalty": PENALTY, "topP": TOP_P})
    assert result["prompt"] == session.apply_chat_template(MESSAGES)
    python = session.chat(MESSAGES, max_new_tokens=STEPS)
    assert (result["greedy"]["tokens"], result["greedy"]["text"], result["greedy"]["stopped"]) == (
        python.tokens, python.text, python.stopped)
    assert result["penalized"] == greedy_with_penalty(tiny_llama, onnxruntime_run, chat_prompt_ids, STEPS, PENALTY)
    first, again = result["sampled"]
    assert first == again
    assert_within_top_p(tiny_llama, onnxruntime_run, chat_prompt_ids, first, 1.0, TOP_P)
