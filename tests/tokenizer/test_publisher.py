"""The publisher's tokenizer files at build (``relaxweb/tokenizer/publisher.py``): what a folder
gives (a lone tokenizer.json, onnxruntime-genai's genai_config.json, generation defaults as
transformers reads them), and each file relaxweb refuses, with a message that says why and no
bundle written.  These files come from strangers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import relaxweb
from relaxweb.errors import RelaxwebError
from relaxweb.tokenizer import publisher, tokenizer_from_path
from tests.tokenizer.folders import identity_model, sentencepiece_unigram, tokenizer_folders  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def folder(tokenizer_folders, tmp_path: Path) -> Path:  # noqa: F811
    """A copy of the ChatML folder to spoil."""
    return Path(shutil.copytree(tokenizer_folders["bytelevel_chatml"], tmp_path / "tokenizer"))


def write_json(path: Path, value) -> None:
    path.write_text(json.dumps(value))


def edit_json(path: Path, edit: Callable[[dict], None]) -> None:
    value = json.loads(path.read_text())
    edit(value)
    write_json(path, value)


def symlink_tokenizer(folder: Path) -> None:
    (folder / "real.json").write_bytes((folder / "tokenizer.json").read_bytes())
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").symlink_to(folder / "real.json")


def word_level(folder: Path) -> None:
    write_json(folder / "tokenizer.json", {"version": "1.0", "model": {"type": "WordLevel", "vocab": {"a": 0, "[UNK]": 1},
                                                                       "unk_token": "[UNK]"}})


def unigram_with_byte_fallback(folder: Path) -> None:
    spec = json.loads(sentencepiece_unigram().to_str())
    spec["model"]["byte_fallback"] = True
    write_json(folder / "tokenizer.json", spec)


SPOILED = [
    ("a symbolic link", symlink_tokenizer, "tokenizer.json is a symbolic link; relaxweb copies tokenizer files into the "
                                           "bundle and reads only regular files"),
    ("a FIFO", lambda f: (f / "generation_config.json").unlink() or os.mkfifo(f / "generation_config.json"),
     "generation_config.json is not a regular file"),
    ("no tokenizer.json", lambda f: (f / "tokenizer.json").unlink(), "no tokenizer.json in this folder"),
    ("not JSON", lambda f: (f / "tokenizer.json").write_text("{oops"), "tokenizer.json: not readable JSON"),
    ("not a tokenizer", lambda f: write_json(f / "tokenizer.json", {"model": {"type": "BPE"}}),
     "tokenizer.json: the tokenizers library cannot load it"),
    ("a WordLevel model", word_level, "tokenizer.json: a \"WordLevel\" tokenizer model; relaxweb's runtimes (the browser's "
                                      "@huggingface/tokenizers) have BPE, WordPiece, Unigram"),
    ("Unigram with byte fallback", unigram_with_byte_fallback, "a Unigram model with byte fallback, which the browser's "
                                                               "@huggingface/tokenizers does not have"),
    ("a template that does not compile", lambda f: (f / "chat_template.jinja").write_text("{% for m in messages %}"),
     "chat_template.jinja is not valid Jinja: Unexpected end of template"),
    ("an EOS token not in the vocabulary", lambda f: edit_json(f / "tokenizer_config.json",
                                                               lambda c: c.update(eos_token="<|no such token|>")),
     "its eos_token \"<|no such token|>\" is not a token of"),
    ("named templates without a default", lambda f: edit_json(
        f / "tokenizer_config.json", lambda c: c.update(chat_template=[{"name": "tool_use", "template": "x"}])),
     "chat templates named tool_use and none named \"default\""),
    ("top_p above 1", lambda f: edit_json(f / "generation_config.json", lambda c: c.update(top_p=1.5)),
     "generation_config.json: top_p must be a number above 0, at most 1, got 1.5"),
    ("do_sample a string", lambda f: edit_json(f / "generation_config.json", lambda c: c.update(do_sample="yes")),
     "generation_config.json: do_sample must be true or false, got \"yes\""),
    ("an EOS id as text", lambda f: edit_json(f / "generation_config.json", lambda c: c.update(eos_token_id="2")),
     "generation_config.json: eos_token_id must be a token id or a list of at most 64, got \"2\""),
    ("a special token's odd name", lambda f: edit_json(f / "tokenizer_config.json",
                                                       lambda c: c.update({"odd name_token": "<|im_end|>"})),
     "the special token 'odd name_token'"),
]


@pytest.mark.parametrize("spoil, message", [case[1:] for case in SPOILED], ids=[case[0] for case in SPOILED])
def test_a_spoiled_folder_is_refused_and_nothing_is_written(folder: Path, tmp_path: Path, spoil, message) -> None:
    spoil(folder)
    with pytest.raises(RelaxwebError) as refused:
        relaxweb.build(identity_model(), tmp_path / "bundle", tokenizer=folder)
    assert message in str(refused.value)
    assert not (tmp_path / "bundle" / "manifest.json").exists()


def test_a_file_larger_than_its_bound_is_refused(folder: Path, monkeypatch) -> None:
    monkeypatch.setitem(publisher.FILES, "generation_config.json", 64)
    with pytest.raises(RelaxwebError, match="generation_config.json is larger than 0 MB, the most relaxweb reads"):
        tokenizer_from_path(folder)


def test_what_a_path_may_be(folder: Path, tmp_path: Path) -> None:
    lone = tokenizer_from_path(folder / "tokenizer.json")  # a lone tokenizer.json: no configs, no template
    assert (lone.entry["files"], lone.entry["eos_token_ids"], lone.entry["special_tokens"]) == (["tokenizer.json"], [], {})
    assert list(lone.files) == ["tokenizer.json"]
    with pytest.raises(RelaxwebError, match="a tokenizer_config.json, not a tokenizer; give the folder"):
        tokenizer_from_path(folder / "tokenizer_config.json")
    with pytest.raises(RelaxwebError, match="no such tokenizer file or folder"):
        tokenizer_from_path(tmp_path / "nowhere")
    byte = tmp_path / "byte.json"
    write_json(byte, {"kind": "byte", "vocab_size": 258, "eos_token_id": 257})
    assert tokenizer_from_path(byte).entry == {"kind": "byte", "vocab_size": 258, "eos_token_id": 257}


def test_generation_defaults_are_read_as_transformers_reads_them(folder: Path) -> None:
    config = folder / "generation_config.json"
    write_json(config, {"do_sample": True, "eos_token_id": 3})  # sampling on: transformers' defaults for the rest
    entry = tokenizer_from_path(folder).entry
    assert entry["generation"] == {"temperature": 1.0, "top_k": 50, "top_p": 1.0}
    assert entry["eos_token_ids"][0] == 3  # then the tokenizer's own eos_token, <|im_end|>
    write_json(config, {"temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.2})  # no do_sample: greedy
    assert tokenizer_from_path(folder).entry["generation"] == {"repetition_penalty": 1.2}
    write_json(config, {"do_sample": True, "top_k": 1000, "top_p": 0.9})
    source = tokenizer_from_path(folder)
    assert source.entry["generation"] == {"temperature": 1.0, "top_k": 0, "top_p": 0.9}
    assert source.notes == ["generation_config.json's top_k 1000 is above the sampler's 256: sampling considers the whole "
                            "vocabulary (with its top_p)"]


def test_onnxruntime_genais_config_gives_the_eos_ids_and_sampling_options(folder: Path) -> None:
    """The model builder writes genai_config.json beside the tokenizer, no generation_config.json."""
    (folder / "generation_config.json").unlink()
    write_json(folder / "genai_config.json", {
        "model": {"bos_token_id": 1, "eos_token_id": [7, 5], "type": "qwen2"},
        "search": {"do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.05,
                   "max_length": 4096, "num_beams": 1}})
    source = tokenizer_from_path(folder)
    assert source.entry["eos_token_ids"][:2] == [7, 5]
    assert source.entry["generation"] == {"temperature": 0.7, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.05}
    assert "genai_config.json" in source.entry["files"]


@pytest.mark.slow
def test_the_command_line_says_what_is_wrong_in_one_line(folder: Path, tmp_path: Path) -> None:
    import onnx  # noqa: PLC0415 - only this test writes a model file

    onnx.save(identity_model(), str(tmp_path / "m.onnx"))
    symlink_tokenizer(folder)
    result = subprocess.run([sys.executable, "-m", "relaxweb", "build", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "out"),
                             "--tokenizer", str(folder)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == (f"error: {folder / 'tokenizer.json'} is a symbolic link; relaxweb copies tokenizer "
                                     "files into the bundle and reads only regular files (copy the file itself there)")
