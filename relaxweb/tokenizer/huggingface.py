"""A bundle's Hugging Face tokenizer (manifest ``tokenizer`` of kind ``huggingface``) at run
time: the ``tokenizers`` library encodes and decodes ``tokenizer/tokenizer.json``, jinja2
renders ``tokenizer/chat_template.jinja`` (``chat_template.py``).  The browser runtime does
the same with ``@huggingface/tokenizers`` and ``@huggingface/jinja``
(``runtime_js/tokenizer.js``): the same ids, text and prompts.

Text is what ``tokenizers`` gives: ``encode`` adds the special tokens of the tokenizer's
post-processor (a BOS, BERT's [CLS] ... [SEP]) unless told not to (a chat prompt's template
writes them itself, as transformers encodes it); ``decode`` leaves out special tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import tokenizers

from relaxweb.errors import RelaxwebError
from relaxweb.tokenizer.chat_template import ChatTemplate
from relaxweb.tokenizer.publisher import CHAT_TEMPLATE, FILES, TOKENIZER_JSON

#: The folder of a bundle that holds the tokenizer's files.
FOLDER = "tokenizer"


class HuggingFaceTokenizer:
    """Text <-> ids with ``tokenizers``, chat prompts with the publisher's template."""

    kind = "huggingface"

    def __init__(self, entry: Mapping[str, Any], tokenizer_json: str, chat_template: str | None) -> None:
        self.vocab_size: int = entry["vocab_size"]
        self.eos_token_ids: list[int] = list(entry.get("eos_token_ids", []))
        self.special_tokens: dict[str, str] = dict(entry.get("special_tokens", {}))
        self._defaults: dict[str, float] = dict(entry.get("generation", {}))
        try:
            self._tokenizer = tokenizers.Tokenizer.from_str(tokenizer_json)
        except Exception as error:  # the library raises plain Exceptions
            raise RelaxwebError(f"the bundle's {FOLDER}/{TOKENIZER_JSON} cannot be loaded ({str(error)[:300]})") from None
        where = f"the bundle's {FOLDER}/{CHAT_TEMPLATE}"
        self.chat_template = None if chat_template is None else ChatTemplate(chat_template, self.special_tokens, where)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """The ids of ``text`` (with the post-processor's special tokens when
        ``add_special_tokens``)."""
        if not isinstance(text, str):
            raise RelaxwebError(f"the text to encode must be a string, got {type(text).__name__}")
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``, special tokens left out."""
        return self._tokenizer.decode(list(ids), skip_special_tokens=True)

    def stream(self) -> "DecodeStream":
        return DecodeStream(self.decode)

    @property
    def stop_tokens(self) -> list[int]:
        """The ids that end generation by default: every EOS id of the model's configs."""
        return list(self.eos_token_ids)

    @property
    def generation_defaults(self) -> dict[str, float]:
        """The publisher's sampling options (from generation_config.json), for generate's defaults."""
        return dict(self._defaults)


class DecodeStream:
    """Generated ids -> text as it becomes final: :meth:`push` returns the text a new id adds,
    :meth:`finish` what is held back at the end.

    Text is decoded from a window of recent ids twice, with and without the ids not shown yet,
    and the difference is the new text (so a decoder that drops a leading space, as
    SentencePiece's does, drops it from both); it is held back while it ends in U+FFFD, the
    start of a character whose other bytes are still to come.  ``runtime_js/tokenizer.js``
    streams the same way."""

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._prefix = 0  # where the window starts
        self._read = 0  # the ids before this are shown

    def _text(self, start: int, end: int) -> str:
        return self._decode(self._ids[start:end]) if end > start else ""

    def push(self, token: int) -> str:
        self._ids.append(token)
        shown = self._text(self._prefix, self._read)
        text = self._text(self._prefix, len(self._ids))
        if len(text) <= len(shown) or text.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(shown):]

    def finish(self) -> str:
        shown = self._text(self._prefix, self._read)
        text = self._text(self._prefix, len(self._ids))
        self._prefix = self._read = len(self._ids)
        return text[len(shown):] if len(text) > len(shown) else ""


def load_huggingface_tokenizer(entry: Mapping[str, Any], read_file: Callable[[str, int], bytes]) -> HuggingFaceTokenizer:
    """The tokenizer of a validated manifest entry, its files read by ``read_file(relative
    path, most bytes)`` (the runtime's reader, which keeps reads inside the bundle)."""
    def text(name: str) -> str:
        try:
            return read_file(f"{FOLDER}/{name}", FILES[name]).decode("utf-8")
        except UnicodeDecodeError:
            raise RelaxwebError(f"the bundle's {FOLDER}/{name} is not UTF-8 text") from None

    files = entry["files"]
    return HuggingFaceTokenizer(entry, text(TOKENIZER_JSON), text(CHAT_TEMPLATE) if CHAT_TEMPLATE in files else None)
