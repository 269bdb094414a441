"""The tiny Llama-like decoder of ``scripts/tiny_llama.py`` (RMSNorm, rotary embedding,
grouped-query attention, SwiGLU, a KV cache in the optimum / transformers.js signature),
trained on the Python documentation's text: its export against torch, then relaxweb's bundle
on WebGPU (the Python runtime) against onnxruntime at prefill, at a decode step, and over a
greedy generation that feeds each step's present back as the next step's past.

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
from relaxweb.compiler import import_model
from relaxweb.ir.expr import Call, MatchCast
from relaxweb.ir.functor import iter_bindings
from relaxweb.passes import fuse_attention
from tests.helpers import MODEL, assert_close

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
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
def session(paths, tmp_path_factory, device):
    bundle = relaxweb.build(paths["model"], tmp_path_factory.mktemp("tiny-llama") / "bundle", bounds=BOUNDS)
    return bundle.load(device=device)


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
    checks = [b for b in iter_bindings(module.main) if isinstance(b, MatchCast)]
    assert len(checks) == 1 and "total_sequence_length" in checks[0].reason


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
