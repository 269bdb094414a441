"""The lexical conventions of the IR text, shared by the printers and the parser.

The printed IR is valid Python syntax, parsed back with Python's ``ast`` module
(``relaxweb/ir/parser.py``).  Names that come from a model (ONNX names may hold any
character) are data: they appear either as plain identifiers, when they are one, or as
quoted string literals, so no name can break the text or change its meaning.
"""

from __future__ import annotations

import json
import keyword
import math
import re


def is_plain_name(name: str) -> bool:
    """True when ``name`` can be printed as it is: a Python identifier that is not a keyword."""
    return name.isidentifier() and not keyword.iskeyword(name)


def sanitized_name(name: str) -> str:
    """A plain name derived from ``name`` (for names the text may change, e.g. variables)."""
    base = re.sub(r"\W", "_", name, flags=re.ASCII) or "v"
    if base[0].isdigit():
        base = "v" + base
    return base + "_" if keyword.iskeyword(base) else base


def format_string(text: str) -> str:
    """A double-quoted string literal of ``text``, in ASCII (every other character escaped)."""
    return json.dumps(text)


def comment_text(text: str) -> str:
    """``text`` made safe for a line comment of generated code (WAT ``;;``, WGSL and JS ``//``).

    Model names may hold any character; a line break would end the comment and make the rest
    of the name code.  Every character outside printable ASCII is escaped (``\\n``, ``\\u2028``),
    and so is the backslash, so the comment stays one line and still shows what the model wrote.
    """
    return json.dumps(str(text), ensure_ascii=True)[1:-1].replace('\\"', '"')


def format_float(value: float) -> str:
    """A float literal that reads back to the same float (infinities and NaN included)."""
    value = float(value)
    if math.isnan(value):
        return 'float("nan")'
    if math.isinf(value):
        return 'float("inf")' if value > 0 else 'float("-inf")'
    return repr(value)


def format_number(value: bool | int | float) -> str:
    """An int, bool or float literal keeping its Python type (``1``, ``True``, ``1.0``)."""
    return format_float(value) if isinstance(value, float) else repr(value)


def unique_identifier(name: str, taken: set[str]) -> str:
    """``name`` when it is a plain name not in ``taken``, else a sanitized one that is not."""
    base = name if is_plain_name(name) else sanitized_name(name)
    candidate, counter = base, 1
    while candidate in taken:
        candidate = f"{base}_{counter}"
        counter += 1
    return candidate


def format_keywords(*items: tuple[str, str] | None) -> str:
    """``(a=1, b=2)`` from the (keyword, text) pairs that are not None; empty when none are."""
    present = [f"{key}={value}" for key, value in (i for i in items if i is not None)]
    return f"({', '.join(present)})" if present else ""
