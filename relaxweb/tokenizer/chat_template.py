"""Chat templates: a conversation -> the prompt text, as transformers' ``apply_chat_template(
messages, tokenize=False, add_generation_prompt=True)`` renders it.

A chat template is Jinja code from the model's publisher (``chat_template.jinja``, or
``tokenizer_config.json``'s ``chat_template``).  It is rendered with jinja2 in a sandbox that
refuses attribute access to Python internals and any change to the objects it is given
(``ImmutableSandboxedEnvironment``), with Hugging Face's dialect on top: blocks trimmed
(``trim_blocks``, ``lstrip_blocks``), ``break``/``continue``, ``raise_exception(message)``,
``strftime_now(format)``, a ``tojson`` that keeps non-ASCII characters and does not escape
HTML, namespaces that refuse underscore names, and the ``{% generation %}`` block (rendered
as its body).  The template sees the messages, ``add_generation_prompt``, ``tools`` and
``documents`` (None) and the tokenizer's named special tokens (``bos_token``, ...).

The browser runtime renders the same templates with ``@huggingface/jinja``
(``runtime_js/chat_template.js``); both prepare the messages alike (:func:`template_messages`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from relaxweb.errors import RelaxwebError

#: Where a message's reasoning may be, the first the one templates read (transformers copies
#: the first given into ``reasoning_content`` and, unless set, ``thinking``).
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: marks the assistant's text for training
    masks in transformers; rendering it gives its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


class _Namespace(jinja2.utils.Namespace):
    """``namespace(...)`` that refuses names starting with ``_`` (a way to Python internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - jinja2's own signature trick
        self, values = args[0], dict(*args[1:], **kwargs)
        for name in values:
            _check_name(name)
        jinja2.utils.Namespace.__init__(self, values)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


def _check_name(name: Any) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"a chat template may not set the name {name!r} on a namespace")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _environment() -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    environment.filters["tojson"] = _tojson
    environment.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, namespace=_Namespace)
    return environment


class ChatTemplate:
    """A publisher's chat template, compiled once (a syntax error is a RelaxwebError naming
    ``source``)."""

    def __init__(self, source_text: str, special_tokens: Mapping[str, str], source: str) -> None:
        self.text = source_text
        self.special_tokens = dict(special_tokens)
        try:
            self._template = _environment().from_string(source_text)
        except jinja2.exceptions.TemplateSyntaxError as error:
            raise RelaxwebError(f"the chat template in {source} is not valid Jinja: {error.message} "
                                f"(line {error.lineno})") from None

    def render(self, messages: Any, *, add_generation_prompt: bool = True) -> str:
        """The prompt text of ``messages`` (a list of ``{"role": ..., "content": ...}``)."""
        if not isinstance(add_generation_prompt, bool):
            raise RelaxwebError(f"add_generation_prompt must be True or False, got {add_generation_prompt!r}")
        try:
            return self._template.render(messages=template_messages(messages), tools=None, documents=None,
                                         add_generation_prompt=add_generation_prompt, **self.special_tokens)
        except Exception as error:  # raise_exception's TemplateError, or the Python error of an operation it did
            raise RelaxwebError(f"the chat template refused these messages: {error}") from None


def template_messages(messages: Any) -> list[dict]:
    """The messages as the template sees them: plain JSON values, keys whose value is None
    dropped (templates test for a missing key), a message's reasoning under the names
    templates read (:data:`REASONING_FIELDS`); a RelaxwebError for anything but a non-empty
    list of objects."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise RelaxwebError("messages must be a non-empty list of messages ({\"role\": ..., \"content\": ...}), got "
                            f"{_shown(messages)}")
    prepared = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise RelaxwebError(f"messages[{index}] must be an object ({{\"role\": ..., \"content\": ...}}), got "
                                f"{_shown(message)}")
        plain = {str(key): _plain(value, f"messages[{index}].{key}") for key, value in message.items()
                 if value is not None}
        reasoning = next((plain[name] for name in REASONING_FIELDS if name in plain), None)
        if reasoning is not None:
            plain = {"thinking": reasoning, **plain, "reasoning_content": reasoning}
        prepared.append(plain)
    return prepared


def _plain(value: Any, where: str) -> Any:
    """``value`` as JSON gives values (str, int, float, bool, None, lists, objects): nothing
    else reaches a template."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, Mapping):
        return {str(key): _plain(item, f"{where}.{key}") for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item, f"{where}[{index}]") for index, item in enumerate(value)]
    raise RelaxwebError(f"{where}: a chat message holds JSON values (text, numbers, lists, objects), got "
                        f"{type(value).__name__}")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "..."
