"""The ``byte`` tokenizer kind, for models trained on bytes.

``{"kind": "byte", "vocab_size": 258, "bos_token_id": 256, "eos_token_id": 257}``: ids 0-255 are
the bytes of the UTF-8 text, ids from 256 to ``vocab_size - 1`` are special tokens
(``bos_token_id`` starts every prompt, ``eos_token_id`` ends the text; both optional) and
decode to nothing.  A model names it in its ONNX ``metadata_props["relaxweb.tokenizer"]``, or
``relaxweb build --tokenizer FILE`` gives it as a JSON file.

:class:`ByteTokenizer` encodes and decodes; :class:`TextStream` turns generated ids into text a
character at a time, holding back the bytes of a character that spans tokens.  The browser
runtime's ``runtime_js/tokenizer.js`` is the same code in JavaScript.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Mapping
from typing import Any

from relaxweb.errors import RelaxwebError

#: The largest vocabulary a tokenizer entry may declare (the schema's bound).
MAX_VOCAB_SIZE = 1 << 24
BYTES = 256
_SPECIAL_IDS = ("bos_token_id", "eos_token_id")


def checked_byte_entry(spec: Mapping[str, Any], source: str) -> dict:
    """A ``byte`` entry (``spec["kind"] == "byte"``) as the manifest will hold it, or a
    RelaxwebError saying what is wrong with it."""
    vocab_size = spec.get("vocab_size")
    if not is_int(vocab_size) or not BYTES <= vocab_size <= MAX_VOCAB_SIZE:
        raise RelaxwebError(f"the tokenizer in {source}: a byte tokenizer's vocab_size must be an integer from "
                            f"{BYTES} to {MAX_VOCAB_SIZE}, got {json.dumps(vocab_size)[:80]}")
    entry: dict = {"kind": "byte", "vocab_size": vocab_size}
    for name in _SPECIAL_IDS:
        if spec.get(name) is None:
            continue
        value = spec[name]
        if not is_int(value) or not BYTES <= value < vocab_size:
            raise RelaxwebError(f"the tokenizer in {source}: {name} must be a special id from {BYTES} to "
                                f"{vocab_size - 1} (ids below {BYTES} are bytes), got {json.dumps(value)[:80]}")
        entry[name] = value
    return entry


def is_int(value: Any) -> bool:
    """A Python int that is not a bool (JSON's ``true`` is never a count or an id)."""
    return isinstance(value, int) and not isinstance(value, bool)


class ByteTokenizer:
    """A ``byte`` tokenizer entry (from a validated manifest): text <-> token ids."""

    kind = "byte"
    #: a byte tokenizer has no chat template (``apply_chat_template`` says so)
    chat_template = None

    def __init__(self, entry: Mapping[str, Any]) -> None:
        self.vocab_size: int = entry["vocab_size"]
        self.bos_token_id: int | None = entry.get("bos_token_id")
        self.eos_token_id: int | None = entry.get("eos_token_id")

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """The ids of a prompt: BOS (when the tokenizer has one and ``add_special_tokens``),
        then the UTF-8 bytes."""
        bos = [] if self.bos_token_id is None or not add_special_tokens else [self.bos_token_id]
        return bos + list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``: special ids dropped, bytes decoded as UTF-8 (invalid ones
        replaced by U+FFFD)."""
        return bytes(i for i in ids if 0 <= i < BYTES).decode("utf-8", errors="replace")

    def stream(self) -> "TextStream":
        return TextStream()

    @property
    def stop_tokens(self) -> list[int]:
        """The ids that end generation by default: the EOS, when there is one."""
        return [] if self.eos_token_id is None else [self.eos_token_id]

    @property
    def generation_defaults(self) -> dict[str, float]:
        """A byte tokenizer brings no sampling defaults (``generate``'s own apply)."""
        return {}


class TextStream:
    """Generated ids -> text, complete characters only: :meth:`push` returns the text a new id
    completes ("" while a multi-byte character is unfinished), :meth:`finish` what is left."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        return self._decoder.decode(bytes([token])) if 0 <= token < BYTES else ""

    def finish(self) -> str:
        return self._decoder.decode(b"", final=True)
