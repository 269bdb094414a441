"""A Hugging Face tokenizer as its publisher ships it -> the bundle's ``tokenizer/`` folder and
the manifest's ``tokenizer`` entry (kind ``huggingface``), checked at build.

``relaxweb build --tokenizer PATH`` takes a ``tokenizer.json`` or a folder as transformers'
``save_pretrained`` (or onnxruntime-genai's model builder) writes it.  From a folder it reads
the files of :data:`FILES` that are there, nothing else: ``tokenizer.json`` (required), and
when present ``tokenizer_config.json`` (the special tokens, the chat template),
``chat_template.jinja`` (the template, taking priority over the config's, as in
transformers), ``generation_config.json`` (EOS ids, sampling defaults) or, without it,
onnxruntime-genai's ``genai_config.json`` (the same, under ``model`` and ``search``).

These files come from strangers: each is read only if it is a regular file, not a symbolic
link (a link could copy a private file into a bundle that is then published), of at most its
size in :data:`FILES`; ``tokenizer.json`` must load in the ``tokenizers`` library with a model
the browser's ``@huggingface/tokenizers`` has (BPE, WordPiece, Unigram without byte fallback)
and the template must compile.  The bundle carries the files as the publisher wrote them (a template found only in
``tokenizer_config.json`` is also written out as ``chat_template.jinja``); what the runtimes
need from the configs goes into the manifest entry, so that neither runtime parses them:

``{"kind": "huggingface", "vocab_size": N, "files": [...], "eos_token_ids": [...],
"special_tokens": {"bos_token": "<s>", ...}, "generation": {"temperature": 0.7, ...}}``
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tokenizers

from relaxweb.errors import RelaxwebError
from relaxweb.tokenizer.byte import MAX_VOCAB_SIZE, is_int
from relaxweb.tokenizer.chat_template import ChatTemplate

KIND = "huggingface"
TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE = "chat_template.jinja"
GENERATION_CONFIG = "generation_config.json"
GENAI_CONFIG = "genai_config.json"
#: The files relaxweb reads from a publisher's folder (and a bundle's ``tokenizer/`` holds),
#: each with the most bytes it may have (Gemma's tokenizer.json has 33 MB).
FILES = {TOKENIZER_JSON: 64 << 20, TOKENIZER_CONFIG: 8 << 20, CHAT_TEMPLATE: 1 << 20, GENERATION_CONFIG: 1 << 20,
         GENAI_CONFIG: 1 << 20}
#: The tokenizer models ``@huggingface/tokenizers`` (the browser's) implements.
BROWSER_MODELS = ("BPE", "WordPiece", "Unigram")
#: The named special tokens a chat template sees (transformers' ``special_tokens_map``); keys
#: ending in ``_token`` with a token as value are named special tokens too.
NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
#: transformers' sampling defaults where a config turns sampling on without saying more.
SAMPLING_DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 1.0}
MAX_TOP_K = 256  # runtime_js/sampler.wgsl's MAX_TOP_K
MAX_EOS_IDS = 64
#: A special token's name, as the manifest schema allows it (``tokenizer.special_tokens``).
SPECIAL_TOKEN_NAME = r"[A-Za-z_][A-Za-z0-9_]{0,63}"


@dataclass
class TokenizerSource:
    """A checked tokenizer for a bundle: its manifest entry, the files of its ``tokenizer/``
    folder (name -> bytes; none for a ``byte`` tokenizer) and notes for the build's output."""

    entry: dict
    files: dict[str, bytes] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def read_publisher_file(path: Path, limit: int) -> bytes | None:
    """The bytes of a publisher's file, None when it is absent; a RelaxwebError for a symbolic
    link, anything but a regular file, or more than ``limit`` bytes."""
    if path.is_symlink():
        raise RelaxwebError(f"{path} is a symbolic link; relaxweb copies tokenizer files into the bundle and reads "
                            "only regular files (copy the file itself there)")
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError as error:
        raise RelaxwebError(f"{path}: cannot be read ({error.strerror})") from None
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise RelaxwebError(f"{path} is not a regular file")
        data = file.read(limit + 1)
    if len(data) > limit:
        raise RelaxwebError(f"{path} is larger than {limit >> 20} MB, the most relaxweb reads for {path.name}")
    return data


def parse_json(text: str | bytes, where: str) -> Any:
    """JSON from a model or a publisher's file, which may be hostile: text that is not UTF-8 or
    JSON, nesting deeper than Python's stack (200,000 brackets), a number of thousands of digits
    are one RelaxwebError naming ``where``."""
    try:
        return json.loads(text.decode("utf-8") if isinstance(text, bytes) else text)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RelaxwebError(f"{where}: not readable JSON ({error})") from None
    except RecursionError:
        raise RelaxwebError(f"{where}: JSON nested too deeply to read") from None
    except ValueError as error:  # an integer of more digits than Python converts
        raise RelaxwebError(f"{where}: not readable JSON ({error})") from None


def _json_object(data: bytes, path: Path) -> dict:
    value = parse_json(data, str(path))
    if not isinstance(value, dict):
        raise RelaxwebError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def huggingface_tokenizer(path: Path, tokenizer_json: bytes) -> TokenizerSource:
    """The tokenizer of ``path``: a folder as ``save_pretrained`` writes it, or the bytes of a
    lone ``tokenizer.json`` (``path`` is then that file)."""
    folder = path if path.is_dir() else None
    files = {TOKENIZER_JSON: tokenizer_json}
    if folder is not None:
        files.update({name: data for name in FILES if name != TOKENIZER_JSON
                      and (data := read_publisher_file(folder / name, FILES[name])) is not None})
    where = (lambda name: folder / name) if folder is not None else (lambda name: path)
    tokenizer = _loaded_tokenizer(files[TOKENIZER_JSON], where(TOKENIZER_JSON))
    config = _json_object(files[TOKENIZER_CONFIG], where(TOKENIZER_CONFIG)) if TOKENIZER_CONFIG in files else {}
    special_tokens = _special_tokens(config, where(TOKENIZER_CONFIG))
    source = TokenizerSource({"kind": KIND, "vocab_size": tokenizer.get_vocab_size(with_added_tokens=True)})
    template = _chat_template(files, config, where)
    if template is not None:
        ChatTemplate(template, special_tokens, str(where(CHAT_TEMPLATE if CHAT_TEMPLATE in files else TOKENIZER_CONFIG)))
        files.setdefault(CHAT_TEMPLATE, template.encode("utf-8"))
    generation_file = next((name for name in (GENERATION_CONFIG, GENAI_CONFIG) if name in files), None)
    generation = _json_object(files[generation_file], where(generation_file)) if generation_file else {}
    if generation_file == GENAI_CONFIG:
        generation = _genai_as_generation_config(generation, where(GENAI_CONFIG))
    eos_ids = _eos_token_ids(generation, where(generation_file or GENERATION_CONFIG))
    eos_token = special_tokens.get("eos_token")
    if eos_token is not None:
        eos_id = tokenizer.token_to_id(eos_token)
        if eos_id is None:
            raise RelaxwebError(f"{where(TOKENIZER_CONFIG)}: its eos_token {json.dumps(eos_token)[:80]} is not a token of "
                                f"{where(TOKENIZER_JSON)}")
        eos_ids += [] if eos_id in eos_ids else [eos_id]
    source.entry.update(files=[name for name in FILES if name in files], eos_token_ids=eos_ids,
                        special_tokens=special_tokens)
    defaults = _generation_defaults(generation, where(generation_file or GENERATION_CONFIG), source.notes)
    if defaults:
        source.entry["generation"] = defaults
    source.files = files
    return source


def _loaded_tokenizer(data: bytes, path: Path) -> tokenizers.Tokenizer:
    """``tokenizer.json`` loaded by the ``tokenizers`` library, with a model the browser has."""
    spec = _json_object(data, path)
    try:
        tokenizer = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
    except Exception as error:  # the library raises plain Exceptions for every kind of bad file
        raise RelaxwebError(f"{path}: the tokenizers library cannot load it ({str(error)[:300]})") from None
    model_type = spec.get("model", {}).get("type") if isinstance(spec.get("model"), dict) else None
    if model_type not in BROWSER_MODELS:
        raise RelaxwebError(f"{path}: a {json.dumps(model_type)[:40]} tokenizer model; relaxweb's runtimes (the "
                            f"browser's @huggingface/tokenizers) have {', '.join(BROWSER_MODELS)}")
    if model_type == "Unigram" and spec["model"].get("byte_fallback"):
        raise RelaxwebError(f"{path}: a Unigram model with byte fallback, which the browser's @huggingface/tokenizers "
                            "does not have (it would give <unk> where the tokenizers library gives bytes)")
    if not 1 <= tokenizer.get_vocab_size(with_added_tokens=True) <= MAX_VOCAB_SIZE:
        raise RelaxwebError(f"{path}: a vocabulary of {tokenizer.get_vocab_size(with_added_tokens=True)} tokens; "
                            f"relaxweb takes 1 to {MAX_VOCAB_SIZE}")
    return tokenizer


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken object."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _special_tokens(config: Mapping[str, Any], path: Path) -> dict[str, str]:
    """The named special tokens a chat template sees (transformers' ``special_tokens_map``):
    the :data:`NAMED_SPECIAL_TOKENS`, every other ``*_token`` key with a token, and the named
    ``extra_special_tokens``."""
    named = {key: value for key, value in config.items() if key in NAMED_SPECIAL_TOKENS or key.endswith("_token")}
    extra = config.get("extra_special_tokens")
    if isinstance(extra, dict):
        named.update(extra)
    tokens = {key: text for key, value in named.items() if (text := _token_text(value)) is not None}
    for key, text in tokens.items():
        if not re.fullmatch(SPECIAL_TOKEN_NAME, key) or len(text) > 4096:
            raise RelaxwebError(f"{path}: the special token {key[:64]!r} ({text[:40]!r}...) is not one relaxweb takes "
                                "(a name of at most 64 letters, digits and _, a token of at most 4096 characters)")
    if len(tokens) > 64:
        raise RelaxwebError(f"{path}: {len(tokens)} named special tokens; relaxweb takes at most 64")
    return tokens


def _chat_template(files: Mapping[str, bytes], config: Mapping[str, Any], where: Callable[[str], Path]) -> str | None:
    """The chat template: ``chat_template.jinja``, else the config's ``chat_template`` (a
    string, or named templates of which "default" is the one used), else None."""
    if CHAT_TEMPLATE in files:
        try:
            return files[CHAT_TEMPLATE].decode("utf-8")
        except UnicodeDecodeError:
            raise RelaxwebError(f"{where(CHAT_TEMPLATE)}: not UTF-8 text") from None
    template = config.get("chat_template")
    if template is None or isinstance(template, str):
        return template
    if isinstance(template, list) and all(isinstance(t, dict) and isinstance(t.get("template"), str) for t in template):
        named = {t.get("name"): t["template"] for t in template}
        if "default" in named:
            return named["default"]
        raise RelaxwebError(f"{where(TOKENIZER_CONFIG)}: chat templates named {', '.join(map(str, named))} and none "
                            "named \"default\", the one relaxweb uses")
    raise RelaxwebError(f"{where(TOKENIZER_CONFIG)}: chat_template must be a string or a list of "
                        "{\"name\": ..., \"template\": ...}")


def _genai_as_generation_config(genai: Mapping[str, Any], path: Path) -> dict:
    """onnxruntime-genai's ``genai_config.json`` read as a ``generation_config.json``: the EOS
    ids of ``model``, the sampling options of ``search``."""
    model, search = genai.get("model", {}), genai.get("search", {})
    if not isinstance(model, dict) or not isinstance(search, dict):
        raise RelaxwebError(f"{path}: its \"model\" and \"search\" must be JSON objects")
    return {**{key: search[key] for key in ("do_sample", "repetition_penalty", *SAMPLING_DEFAULTS) if key in search},
            **({"eos_token_id": model["eos_token_id"]} if "eos_token_id" in model else {})}


def _eos_token_ids(generation: Mapping[str, Any], path: Path) -> list[int]:
    value = generation.get("eos_token_id")
    ids = [] if value is None else value if isinstance(value, list) else [value]
    if len(ids) > MAX_EOS_IDS or not all(is_int(i) and 0 <= i < MAX_VOCAB_SIZE for i in ids):
        raise RelaxwebError(f"{path}: eos_token_id must be a token id or a list of at most {MAX_EOS_IDS}, got "
                            f"{json.dumps(value)[:80]}")
    return list(dict.fromkeys(ids))


#: Each sampling option a generation config may give: whether a value is allowed, and what it is.
_OPTION_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "temperature": (lambda v: _is_number(v) and 0 <= v <= 100, "a number from 0 to 100"),
    "top_k": (lambda v: is_int(v) and v >= 0, "an integer >= 0"),
    "top_p": (lambda v: _is_number(v) and 0 < v <= 1, "a number above 0, at most 1"),
    "repetition_penalty": (lambda v: _is_number(v) and 0 < v <= 100, "a number above 0, at most 100"),
}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _generation_defaults(generation: Mapping[str, Any], path: Path, notes: list[str]) -> dict:
    """The sampling options ``generate`` takes by default, as transformers' ``generate`` reads
    the config: with ``do_sample`` its temperature, top_k and top_p (transformers' defaults for
    those it lacks); the repetition penalty either way; greedy without ``do_sample``."""
    do_sample = generation.get("do_sample", False)
    if not isinstance(do_sample, bool):
        raise RelaxwebError(f"{path}: do_sample must be true or false, got {json.dumps(do_sample)[:40]}")
    wanted = {**SAMPLING_DEFAULTS, **{k: generation[k] for k in SAMPLING_DEFAULTS if k in generation}} if do_sample else {}
    if "repetition_penalty" in generation:
        wanted["repetition_penalty"] = generation["repetition_penalty"]
    for name, value in wanted.items():
        allowed, expected = _OPTION_RULES[name]
        if not allowed(value):
            raise RelaxwebError(f"{path}: {name} must be {expected}, got {json.dumps(value)[:40]}")
    if wanted.get("top_k", 0) > MAX_TOP_K:
        notes.append(f"{path.name}'s top_k {wanted['top_k']} is above the sampler's {MAX_TOP_K}: sampling considers "
                     "the whole vocabulary (with its top_p)")
        wanted["top_k"] = 0
    if wanted.get("temperature") == 0:  # transformers refuses to sample at temperature 0: greedy it is
        wanted = {k: v for k, v in wanted.items() if k not in SAMPLING_DEFAULTS}
    return {name: float(value) if name != "top_k" else value for name, value in wanted.items()
            if not (name == "repetition_penalty" and value == 1)}
