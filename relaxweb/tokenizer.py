"""The tokenizer a bundle carries (``manifest.json``'s ``tokenizer``), for ``generate``.

A model names its tokenizer in its ONNX ``metadata_props["relaxweb.tokenizer"]`` (a JSON
object), or ``relaxweb build --tokenizer FILE`` gives one; the build checks it here
(:func:`checked_tokenizer`) and copies it into the manifest.  The entry is a JSON object whose
``kind`` says how to read the rest, so that other kinds can be added without changing the ones
there are.  Kinds:

``byte``  ``{"kind": "byte", "vocab_size": 258, "bos_token_id": 256, "eos_token_id": 257}``:
          ids 0-255 are the bytes of the UTF-8 text, ids from 256 to ``vocab_size - 1`` are
          special tokens (``bos_token_id`` starts every prompt, ``eos_token_id`` ends the text;
          both optional) and decode to nothing.

:class:`ByteTokenizer` encodes and decodes; :class:`TextStream` turns generated ids into text
a character at a time, holding back the bytes of a character that spans tokens.  The browser
runtime's ``runtime_js/tokenizer.js`` is the same code in JavaScript.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from relaxweb.errors import RelaxwebError

#: The key of the ONNX model's ``metadata_props`` entry that holds its tokenizer.
METADATA_KEY = "relaxweb.tokenizer"
#: The tokenizer kinds relaxweb knows (the manifest schema's ``tokenizer.kind`` lists the same).
KINDS = ("byte",)
#: The largest vocabulary a tokenizer entry may declare (the schema's bound).
MAX_VOCAB_SIZE = 1 << 24
_BYTES = 256
_SPECIAL_IDS = ("bos_token_id", "eos_token_id")


def checked_tokenizer(spec: Any, source: str) -> dict:
    """``spec`` (a tokenizer entry read from ``source``: a file, or the model's metadata) as the
    manifest will hold it, or a RelaxwebError saying what is wrong with it."""
    if not isinstance(spec, Mapping):
        raise RelaxwebError(f"the tokenizer in {source} must be a JSON object with a \"kind\", got {type(spec).__name__}")
    kind = spec.get("kind")
    if kind not in KINDS:
        raise RelaxwebError(f"the tokenizer in {source} has kind {json.dumps(kind)[:80]}; relaxweb knows the kinds "
                            f"{', '.join(KINDS)}")
    vocab_size = spec.get("vocab_size")
    if not _is_int(vocab_size) or not _BYTES <= vocab_size <= MAX_VOCAB_SIZE:
        raise RelaxwebError(f"the tokenizer in {source}: a byte tokenizer's vocab_size must be an integer from "
                            f"{_BYTES} to {MAX_VOCAB_SIZE}, got {json.dumps(vocab_size)[:80]}")
    entry: dict = {"kind": kind, "vocab_size": vocab_size}
    for name in _SPECIAL_IDS:
        if spec.get(name) is None:
            continue
        value = spec[name]
        if not _is_int(value) or not _BYTES <= value < vocab_size:
            raise RelaxwebError(f"the tokenizer in {source}: {name} must be a special id from {_BYTES} to "
                                f"{vocab_size - 1} (ids below {_BYTES} are bytes), got {json.dumps(value)[:80]}")
        entry[name] = value
    return entry


def tokenizer_from_file(path: str | Path) -> dict:
    """The checked tokenizer entry of a JSON file (``relaxweb build --tokenizer FILE``)."""
    try:
        spec = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RelaxwebError(f"{path}: no such tokenizer file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RelaxwebError(f"{path}: not a readable JSON tokenizer ({error})") from None
    return checked_tokenizer(spec, str(path))


def tokenizer_from_metadata(metadata: Mapping[str, str], source: str) -> dict | None:
    """The checked tokenizer entry of a model's ``metadata_props`` (key -> value), or None
    when the model names none."""
    if METADATA_KEY not in metadata:
        return None
    where = f"{source}'s metadata_props[{METADATA_KEY!r}]"
    try:
        spec = json.loads(metadata[METADATA_KEY])
    except json.JSONDecodeError as error:
        raise RelaxwebError(f"the tokenizer in {where} is not JSON ({error})") from None
    return checked_tokenizer(spec, where)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class ByteTokenizer:
    """A ``byte`` tokenizer entry (from a validated manifest): text <-> token ids."""

    def __init__(self, entry: Mapping[str, Any]) -> None:
        self.vocab_size: int = entry["vocab_size"]
        self.bos_token_id: int | None = entry.get("bos_token_id")
        self.eos_token_id: int | None = entry.get("eos_token_id")

    def encode(self, text: str) -> list[int]:
        """The ids of a prompt: BOS (when the tokenizer has one), then the UTF-8 bytes."""
        return ([] if self.bos_token_id is None else [self.bos_token_id]) + list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``: special ids dropped, bytes decoded as UTF-8 (invalid ones
        replaced by U+FFFD)."""
        return bytes(i for i in ids if 0 <= i < _BYTES).decode("utf-8", errors="replace")

    def stream(self) -> "TextStream":
        return TextStream()

    @property
    def stop_tokens(self) -> list[int]:
        """The ids that end generation by default: the EOS, when there is one."""
        return [] if self.eos_token_id is None else [self.eos_token_id]


class TextStream:
    """Generated ids -> text, complete characters only: :meth:`push` returns the text a new id
    completes ("" while a multi-byte character is unfinished), :meth:`finish` what is left."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        return self._decoder.decode(bytes([token])) if 0 <= token < _BYTES else ""

    def finish(self) -> str:
        return self._decoder.decode(b"", final=True)


def make_tokenizer(entry: Mapping[str, Any]) -> ByteTokenizer:
    """The tokenizer of a validated manifest's ``tokenizer`` entry (its kind is one of KINDS)."""
    return ByteTokenizer(entry)
