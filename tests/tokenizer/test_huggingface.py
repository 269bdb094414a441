"""Hugging Face tokenizers in bundles, in the Python runtime (``relaxweb/tokenizer/``): token ids
and text equal to the ``tokenizers`` library's on the corpus (``corpus.json``) for a byte-level
BPE, two SentencePiece-style tokenizers and a WordPiece one; chat prompts equal to
transformers' ``apply_chat_template(messages, tokenize=False, add_generation_prompt=True)`` for
a ChatML-, a Llama-3- and a Gemma-style template; the publisher's files in the bundle and what
the manifest says of them.  The browser runtime's side: ``tests/runtime_js/test_tokenizer_browser.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

import relaxweb
from relaxweb.errors import RelaxwebError
from relaxweb.tokenizer import DecodeStream
from tests.tokenizer.conversations import HELLO, REFUSED, RENDERED
from tests.tokenizer.folders import corpus_texts, identity_model, tokenizer_bundles, tokenizer_folders  # noqa: F401

#: the folders with a tokenizer.json of their own (bytelevel_llama3 shares bytelevel_chatml's)
TOKENIZERS = ["bytelevel_chatml", "sentencepiece_bpe", "sentencepiece_unigram", "wordpiece"]


@pytest.fixture(scope="module")
def sessions(tokenizer_bundles):  # noqa: F811
    """Each bundle on the wasm backend: tokenizers need no GPU."""
    return {name: relaxweb.load(path, backend="wasm") for name, path in tokenizer_bundles.items()}


def streamed(decode, ids: list[int]) -> str:
    stream = DecodeStream(decode)
    return "".join(stream.push(token) for token in ids) + stream.finish()


@pytest.mark.parametrize("name", TOKENIZERS)
def test_token_ids_and_text_are_the_tokenizers_librarys(name, tokenizer_folders, sessions) -> None:  # noqa: F811
    reference = Tokenizer.from_file(str(tokenizer_folders[name] / "tokenizer.json"))
    ours = sessions[name].tokenizer
    texts = corpus_texts()
    assert len(texts) >= 50
    for text in texts:
        expected = reference.encode(text)
        assert ours.encode(text) == expected.ids, text
        plain = reference.encode(text, add_special_tokens=False).ids
        assert ours.encode(text, add_special_tokens=False) == plain, text
        assert ours.decode(expected.ids) == reference.decode(expected.ids), text
        # streamed a token at a time, the text adds up to the decoding of all of it
        assert streamed(ours.decode, plain) == reference.decode(plain), text


def test_a_stream_holds_back_a_character_cut_between_tokens(sessions) -> None:
    tokenizer = sessions["sentencepiece_bpe"].tokenizer
    ids = tokenizer.encode("a😀b", add_special_tokens=False)
    assert len(ids) >= 5  # the emoji's 4 bytes fall back to <0xNN> tokens
    stream = tokenizer.stream()
    pieces = [stream.push(token) for token in ids]
    assert "".join(pieces) == "a😀b" and "😀" in pieces and "\ufffd" not in "".join(pieces)
    # cut inside the emoji (its last byte and the b dropped): one U+FFFD per byte, as the
    # tokenizers library decodes it
    assert tokenizer.decode(ids[:-2]) == "a" + "\ufffd" * 3


def test_the_bundle_carries_the_publishers_files(tokenizer_folders, tokenizer_bundles, sessions) -> None:  # noqa: F811
    for name, bundle in tokenizer_bundles.items():
        entry = json.loads((bundle / "manifest.json").read_text())["tokenizer"]
        assert entry["kind"] == "huggingface"
        for file in entry["files"]:
            carried = (bundle / "tokenizer" / file).read_bytes()
            if (tokenizer_folders[name] / file).exists():
                assert carried == (tokenizer_folders[name] / file).read_bytes(), (name, file)
        assert sorted(entry["files"]) == sorted(path.name for path in (bundle / "tokenizer").iterdir())
        # the browser libraries beside the runtime, for a page that serves the bundle as files
        assert (bundle / "runtime" / "vendor" / "tokenizers.mjs").is_file()
        assert (bundle / "runtime" / "vendor" / "jinja.mjs").is_file()

    chatml = json.loads((tokenizer_bundles["bytelevel_chatml"] / "manifest.json").read_text())["tokenizer"]
    vocabulary = Tokenizer.from_file(str(tokenizer_folders["bytelevel_chatml"] / "tokenizer.json"))
    assert chatml["files"] == ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"]
    assert chatml["vocab_size"] == vocabulary.get_vocab_size()
    assert chatml["eos_token_ids"] == [vocabulary.token_to_id("<|im_end|>"), vocabulary.token_to_id("<|endoftext|>")]
    assert chatml["special_tokens"] == {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    assert chatml["generation"] == {"temperature": 0.7, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.05}
    config = json.loads((tokenizer_folders["bytelevel_chatml"] / "tokenizer_config.json").read_text())
    assert (tokenizer_bundles["bytelevel_chatml"] / "tokenizer" / "chat_template.jinja").read_text() == config["chat_template"]
    assert sessions["bytelevel_chatml"].tokenizer.stop_tokens == chatml["eos_token_ids"]

    gemma = json.loads((tokenizer_bundles["sentencepiece_bpe"] / "manifest.json").read_text())["tokenizer"]
    assert gemma["special_tokens"] == {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
                                       "unk_token": "<unk>", "boi_token": "<start_of_image>"}
    assert "generation" not in gemma
    wordpiece = json.loads((tokenizer_bundles["wordpiece"] / "manifest.json").read_text())["tokenizer"]
    assert (wordpiece["files"], wordpiece["eos_token_ids"]) == (["tokenizer.json", "tokenizer_config.json"], [])


def test_a_bundle_without_a_hugging_face_tokenizer_carries_no_library(tmp_path: Path) -> None:
    bundle = relaxweb.build(identity_model(), tmp_path / "bundle").path
    assert not (bundle / "tokenizer").exists() and not (bundle / "runtime" / "vendor").exists()


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_chat_prompts_are_transformers(name, tokenizer_folders, sessions) -> None:  # noqa: F811
    reference = AutoTokenizer.from_pretrained(str(tokenizer_folders[name]))
    session = sessions[name]
    for messages in RENDERED[name]:
        expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert session.apply_chat_template(messages) == expected, messages
        assert session.apply_chat_template(messages, add_generation_prompt=False) == reference.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=False)
    for folder, messages, message in REFUSED:
        if folder == name:
            with pytest.raises(Exception, match="^" + message.replace(".", r"\.")):
                reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            with pytest.raises(RelaxwebError) as refused:
                session.apply_chat_template(messages)
            assert str(refused.value) == f"the chat template refused these messages: {message}"


def test_chat_needs_a_template_and_messages(tokenizer_bundles, sessions, tmp_path: Path) -> None:  # noqa: F811
    with pytest.raises(RelaxwebError, match=r"^this bundle has no chat template \(a huggingface tokenizer without one\): "
                                            "build it with --tokenizer FOLDER"):
        sessions["wordpiece"].apply_chat_template(HELLO)
    bare = relaxweb.load(relaxweb.build(identity_model(), tmp_path / "bare").path, backend="wasm")
    with pytest.raises(RelaxwebError, match=r"no chat template \(no tokenizer\)"):
        bare.apply_chat_template(HELLO)
    session = sessions["bytelevel_chatml"]
    for messages, message in (("Hello", "messages must be a non-empty list of messages"),
                              ([], "messages must be a non-empty list"),
                              (["Hello"], r"messages\[0\] must be an object"),
                              ([{"role": "user", "content": object()}], r"messages\[0\]\.content: a chat message holds JSON "
                                                                        "values")):
        with pytest.raises(RelaxwebError, match=message):
            session.apply_chat_template(messages)
    with pytest.raises(RelaxwebError, match="add_generation_prompt must be True or False"):
        session.apply_chat_template(HELLO, add_generation_prompt="yes")
    # a prompt renders for any bundle with a template; chatting needs a decoder (this one is y = x)
    with pytest.raises(RelaxwebError, match="this bundle cannot generate: it has no input 'input_ids'"):
        session.chat(HELLO)
