"""The tokenizer a bundle carries (``manifest.json``'s ``tokenizer``), for ``generate`` and
``chat``.

The build finds it (:func:`tokenizer_from_path` for ``relaxweb build --tokenizer PATH``, else
:func:`tokenizer_from_metadata` for the model's ``metadata_props["relaxweb.tokenizer"]``),
checks it and writes its entry into the manifest (and its files into the bundle's
``tokenizer/`` folder); the runtimes make it with :func:`make_tokenizer`.  The entry's ``kind``
says how to read the rest:

``byte``         ids 0-255 are UTF-8 bytes (``byte.py``), for models trained on bytes
``huggingface``  a Hugging Face ``tokenizer.json`` with its configs and chat template, as
                 publishers ship them (``publisher.py`` at build, ``huggingface.py`` at run
                 time, ``chat_template.py``)

The browser runtime's ``runtime_js/tokenizer.js`` and ``chat_template.js`` are the twins.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from relaxweb.errors import RelaxwebError, path_kind
from relaxweb.tokenizer.byte import ByteTokenizer, TextStream, checked_byte_entry
from relaxweb.tokenizer.chat_template import ChatTemplate
from relaxweb.tokenizer.huggingface import DecodeStream, HuggingFaceTokenizer, load_huggingface_tokenizer
from relaxweb.tokenizer.publisher import (
    FILES, TOKENIZER_JSON, TokenizerSource, huggingface_tokenizer, parse_json, read_publisher_file,
)

__all__ = [
    "ByteTokenizer", "ChatTemplate", "DecodeStream", "HuggingFaceTokenizer", "KINDS", "METADATA_KEY", "TextStream",
    "Tokenizer", "TokenizerSource", "checked_tokenizer", "make_tokenizer", "tokenizer_from_metadata", "tokenizer_from_path",
]

#: The key of the ONNX model's ``metadata_props`` entry that holds its tokenizer.
METADATA_KEY = "relaxweb.tokenizer"
#: The tokenizer kinds relaxweb knows (the manifest schema's ``tokenizer.kind`` lists the same).
KINDS = ("byte", "huggingface")
Tokenizer = ByteTokenizer | HuggingFaceTokenizer


def checked_tokenizer(spec: Any, source: str) -> dict:
    """``spec`` (a relaxweb tokenizer entry read from ``source``: a JSON file, or the model's
    metadata) as the manifest will hold it, or a RelaxwebError saying what is wrong with it.
    Only ``byte`` entries are written by hand; a ``huggingface`` one comes from the publisher's
    files (:func:`tokenizer_from_path`)."""
    if not isinstance(spec, Mapping):
        raise RelaxwebError(f"the tokenizer in {source} must be a JSON object with a \"kind\", got {type(spec).__name__}")
    kind = spec.get("kind")
    if kind != "byte":
        raise RelaxwebError(f"the tokenizer in {source} has kind {json.dumps(kind)[:80]}; a tokenizer entry written by "
                            "hand has the kind byte (give a Hugging Face tokenizer as its tokenizer.json or its folder: "
                            "relaxweb build --tokenizer PATH)")
    return checked_byte_entry(spec, source)


def tokenizer_from_path(path: str | Path) -> TokenizerSource:
    """The checked tokenizer of ``relaxweb build --tokenizer PATH``: a folder as
    ``save_pretrained`` writes it, a Hugging Face ``tokenizer.json``, or a JSON file holding a
    relaxweb entry (``{"kind": "byte", ...}``)."""
    path = Path(path)
    if path_kind(path) == "folder":  # (a name the file system cannot look up: one error)
        data = read_publisher_file(path / TOKENIZER_JSON, FILES[TOKENIZER_JSON])
        if data is None:
            raise RelaxwebError(f"{path}: no {TOKENIZER_JSON} in this folder (relaxweb reads a tokenizer folder as "
                                "save_pretrained writes it: tokenizer.json, and tokenizer_config.json, "
                                "chat_template.jinja, generation_config.json when there)")
        return huggingface_tokenizer(path, data)
    data = read_publisher_file(path, FILES[TOKENIZER_JSON])
    if data is None:
        raise RelaxwebError(f"{path}: no such tokenizer file or folder")
    spec = parse_json(data, f"{path} (a JSON tokenizer)")
    if isinstance(spec, dict) and "model" in spec and "kind" not in spec:
        return huggingface_tokenizer(path, data)
    if isinstance(spec, dict) and "kind" not in spec and ("chat_template" in spec or "tokenizer_class" in spec):
        raise RelaxwebError(f"{path}: a tokenizer_config.json, not a tokenizer; give the folder that holds it and "
                            "its tokenizer.json")
    return TokenizerSource(checked_tokenizer(spec, str(path)))


def tokenizer_from_metadata(metadata: Mapping[str, str], source: str) -> TokenizerSource | None:
    """The checked tokenizer of a model's ``metadata_props`` (key -> value), or None when the
    model names none."""
    if METADATA_KEY not in metadata:
        return None
    where = f"{source}'s metadata_props[{METADATA_KEY!r}]"
    spec = parse_json(metadata[METADATA_KEY], f"the tokenizer in {where}")
    return TokenizerSource(checked_tokenizer(spec, where))


def make_tokenizer(entry: Mapping[str, Any], read_file: Callable[[str, int], bytes]) -> Tokenizer:
    """The tokenizer of a validated manifest's ``tokenizer`` entry; ``read_file(relative path,
    most bytes)`` reads the bundle's files (a ``huggingface`` tokenizer's)."""
    if entry["kind"] == "huggingface":
        return load_huggingface_tokenizer(entry, read_file)
    return ByteTokenizer(entry)
