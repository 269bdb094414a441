"""Hugging Face tokenizer folders as publishers ship them, made here with the ``tokenizers``
library (no hub access): each a ``tokenizer.json`` trained on a few paragraphs, with a
``tokenizer_config.json`` (``configs/``: special tokens, chat templates written as real models'
are) and where a model has one a ``generation_config.json`` or ``chat_template.jinja``.

=====================  ==========================================================================
folder                 tokenizer
=====================  ==========================================================================
``bytelevel_chatml``   byte-level BPE (GPT-2 / Llama 3 / Qwen: a split regex, ByteLevel), a
                       ChatML template (Qwen style), generation_config.json with two EOS ids
``bytelevel_llama3``   the same tokenizer.json, a Llama-3-style template and special tokens
``sentencepiece_bpe``  SentencePiece-style BPE with byte fallback (Llama 2 / Gemma: ``▁`` for
                       spaces, ``<0xNN>`` bytes), a Gemma-style chat_template.jinja
``sentencepiece_unigram``  SentencePiece-style Unigram (T5: NFKC, Metaspace, <unk> for unknown characters)
``wordpiece``          WordPiece (BERT: lowercased, accents stripped, [CLS] ... [SEP])
=====================  ==========================================================================

Small vocabularies, so that the corpus's texts split into many pieces and unseen characters
fall back to bytes (or [UNK]).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

import relaxweb
from tests.helpers import make_model

HERE = Path(__file__).resolve().parent
CONFIGS = HERE / "configs"
CORPUS = HERE / "corpus.json"
#: Llama 3's pre-tokenizer split, as its tokenizer.json has it.
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
                r"\s+(?!\S)|\s+")
TRAINING_TEXT = [
    "The browser runtime loads a bundle, compiles its kernels and runs the model on the GPU.",
    "A tokenizer turns text into ids; the model turns ids into logits; the sampler picks the next id.",
    "Chat templates render a conversation as the prompt text the model was trained on.",
    "def greet(name):\n    return f'Hello, {name}!'\n\nprint(greet('world'))\n",
    "for (const item of items) {\n  total += item.price * item.count;\n}\n",
    "Weights are stored in shards; each shard is checked by its size and its SHA-256 digest.",
    "Les modèles de langue génèrent du texte, un jeton après l'autre.",
    "Die Gewichte werden in Teilen gespeichert und beim Laden geprüft.",
    "The quick brown fox jumps over the lazy dog, again and again, 1234567890 times.",
] * 4
BYTE_TOKENS = [f"<0x{byte:02X}>" for byte in range(256)]


def _train(tokenizer: Tokenizer, trainer) -> Tokenizer:
    tokenizer.train_from_iterator(TRAINING_TEXT, trainer)
    return tokenizer


def bytelevel_bpe() -> Tokenizer:
    """Byte-level BPE in Llama 3's layout: a split regex, then ByteLevel; a BOS post-processor."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>",
                "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    _train(tokenizer, trainers.BpeTrainer(vocab_size=600, special_tokens=specials,
                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B:1",
                                      special_tokens=[("<|begin_of_text|>", tokenizer.token_to_id("<|begin_of_text|>"))]),
    ])
    return tokenizer


def sentencepiece_bpe() -> Tokenizer:
    """Llama 2 / Gemma's layout: spaces as ``▁`` by the normalizer, BPE with byte fallback, a
    decoder that turns ``<0xNN>`` back into bytes and drops the first space; BOS added."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>"]
    _train(tokenizer, trainers.BpeTrainer(vocab_size=500, special_tokens=specials, limit_alphabet=80))
    spec = json.loads(tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    for token in BYTE_TOKENS:
        vocab.setdefault(token, len(vocab))
    spec["model"]["byte_fallback"] = True
    tokenizer = Tokenizer.from_str(json.dumps(spec))
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                           decoders.Strip(" ", 1, 0)])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", tokenizer.token_to_id("<bos>"))])
    return tokenizer


def sentencepiece_unigram() -> Tokenizer:
    """T5's layout: NFKC, Metaspace, a Unigram model (unknown characters: one <unk> a run); EOS
    appended."""
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    _train(tokenizer, trainers.UnigramTrainer(vocab_size=300, special_tokens=["<pad>", "</s>", "<unk>"],
                                              unk_token="<unk>", max_piece_length=8))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", tokenizer.token_to_id("</s>"))])
    return tokenizer


def wordpiece() -> Tokenizer:
    """BERT: lowercased, accents stripped, Chinese characters apart; [CLS] text [SEP]."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True, clean_text=True,
                                                      handle_chinese_chars=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    _train(tokenizer, trainers.WordPieceTrainer(vocab_size=400, special_tokens=specials, limit_alphabet=60))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[(token, tokenizer.token_to_id(token)) for token in ("[CLS]", "[SEP]")])
    return tokenizer


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


def make_tokenizer_folders(root: Path) -> dict[str, Path]:
    """The folders of the module's table under ``root`` (made once per call)."""
    root.mkdir(parents=True, exist_ok=True)
    bytelevel = bytelevel_bpe()
    made = {
        "bytelevel_chatml": bytelevel, "bytelevel_llama3": bytelevel, "sentencepiece_bpe": sentencepiece_bpe(),
        "sentencepiece_unigram": sentencepiece_unigram(), "wordpiece": wordpiece(),
    }
    folders = {}
    for name, tokenizer in made.items():
        folder = root / name
        folder.mkdir(exist_ok=True)
        tokenizer.save(str(folder / "tokenizer.json"))
        folders[name] = folder
    for name, config in (("bytelevel_chatml", "chatml"), ("bytelevel_llama3", "llama3"), ("sentencepiece_bpe", "gemma")):
        shutil.copyfile(CONFIGS / f"{config}_tokenizer_config.json", folders[name] / "tokenizer_config.json")
    shutil.copyfile(CONFIGS / "gemma_chat_template.jinja", folders["sentencepiece_bpe"] / "chat_template.jinja")
    _write_json(folders["sentencepiece_unigram"] / "tokenizer_config.json",
                {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>", "tokenizer_class": "T5Tokenizer"})
    _write_json(folders["wordpiece"] / "tokenizer_config.json",
                {"cls_token": "[CLS]", "sep_token": "[SEP]", "mask_token": "[MASK]", "pad_token": "[PAD]",
                 "unk_token": "[UNK]", "do_lower_case": True, "tokenizer_class": "BertTokenizer"})
    # Qwen 2.5's way: sampling on, two EOS ids (the end of a turn and of a text)
    _write_json(folders["bytelevel_chatml"] / "generation_config.json", {
        "bos_token_id": bytelevel.token_to_id("<|endoftext|>"), "do_sample": True,
        "eos_token_id": [bytelevel.token_to_id("<|im_end|>"), bytelevel.token_to_id("<|endoftext|>")],
        "pad_token_id": bytelevel.token_to_id("<|endoftext|>"), "repetition_penalty": 1.05, "temperature": 0.7,
        "top_k": 20, "top_p": 0.8, "transformers_version": "4.37.0"})
    return folders


def corpus_texts() -> list[str]:
    return json.loads(CORPUS.read_text(encoding="utf-8"))["texts"]


def identity_model() -> onnx.ModelProto:
    """y = x: a model to carry a tokenizer (tokenizers need no decoder)."""
    return make_model([helper.make_node("Identity", ["x"], ["y"])], [("x", TensorProto.FLOAT, ["n"])], ["y"])


@pytest.fixture(scope="module")
def tokenizer_folders(tmp_path_factory) -> dict[str, Path]:
    return make_tokenizer_folders(tmp_path_factory.mktemp("tokenizer-folders"))


@pytest.fixture(scope="module")
def tokenizer_bundles(tokenizer_folders, tmp_path_factory) -> dict[str, Path]:
    """An identity bundle with each folder's tokenizer, built as ``relaxweb build --tokenizer
    FOLDER`` builds it: the first at the root, the others in sub-folders of it (so that one
    page, served the root, loads them all)."""
    root = tmp_path_factory.mktemp("tokenizer-bundles") / "bundles"
    bundles = {}
    for index, (name, folder) in enumerate(tokenizer_folders.items()):
        bundles[name] = root if index == 0 else root / name
        relaxweb.build(identity_model(), bundles[name], tokenizer=folder)
    return bundles
