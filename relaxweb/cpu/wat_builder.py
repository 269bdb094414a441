"""A small structured writer of WAT function bodies: blocks, loops, ifs, locals and folded
instructions, nested by Python's ``with`` instead of by hand-counted parentheses.

A :class:`Body` writes the statements of one :class:`~relaxweb.cpu.emit.Function` (its
locals and lines) at the depth of the constructs it has open; the expression emitter
(``emit.Emitter``) writes into the same function at the indent the body gives it
(:attr:`Body.indent`).  Each construct opens a line (``(block $done``) and, when its ``with``
ends, closes it on the last line written inside it, so the text reads as hand-written WAT::

    with body.block("$done"):
        body.br_if("$done", ge_u(get("$i"), get("$stop")))
        with body.loop("$element"):
            ...

Values are WAT folded instructions, built as text by :func:`op` and the helpers below
(``get("$i")`` is ``(local.get $i)``); labels and locals keep the names the caller gives
(``kernels.wat`` is for reading; the binary's name section keeps them too).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from .emit import Function

STEP = "  "  # the indent of one level of nesting


def op(instruction: str, *operands: str) -> str:
    """A folded instruction: ``(i32.add a b)``."""
    return f"({' '.join((instruction, *operands))})"


def get(local: str) -> str:
    return f"(local.get {local})"


def const(value: int) -> str:
    """An i32 constant."""
    return f"(i32.const {value})"


def add(a: str, b: str) -> str:
    return op("i32.add", a, b)


def sub(a: str, b: str) -> str:
    return op("i32.sub", a, b)


def mul(a: str, b: str) -> str:
    return op("i32.mul", a, b)


def div_u(a: str, b: str) -> str:
    return op("i32.div_u", a, b)


def ceil_div_u(a: str, b: int) -> str:
    """``a / b`` rounded up (unsigned, ``b`` a positive constant): ``(a + b - 1) / b``."""
    return div_u(add(a, const(b - 1)), const(b))


def call(function: str, *operands: str) -> str:
    return op(f"call {function}", *operands)


class Body:
    """The statements of a function body, written at the depth of the open constructs."""

    def __init__(self, function: Function, indent: str = STEP) -> None:
        self.function = function
        self.indent = indent

    # -- statements

    def line(self, text: str) -> None:
        """One statement (or comment) at the current depth."""
        self.function.emit(self.indent, text)

    def comment(self, text: str) -> None:
        self.line(f";; {text}")

    def set(self, local: str, value: str) -> None:
        self.line(op("local.set", local, value))

    def increment(self, local: str, step: int | str = 1) -> None:
        """``local += step`` (a constant or an i32 value)."""
        self.set(local, add(get(local), const(step) if isinstance(step, int) else step))

    def count_down(self, counter: str, label: str) -> None:
        """The end of a counted loop: ``counter -= 1`` and, while it is not zero, again from
        ``label``.  A loop that ends so, with nothing else writing the counter or branching
        to its top and no loop or call inside, runs at most the counter's value of
        iterations from its entry: a page that is not isolated charges that on entry and
        runs it without a fuel check (``runtime_js/interruptible_kernels.js``, countedLoops),
        where a loop that ends with a comparison spends fuel at every iteration."""
        self.set(counter, sub(get(counter), const(1)))
        self.br_if(label, get(counter))

    def br(self, label: str) -> None:
        self.line(f"(br {label})")

    def br_if(self, label: str, condition: str) -> None:
        self.line(f"(br_if {label} {condition})")

    def store(self, instruction: str, address: str, value: str, offset: int = 0) -> None:
        """``(instruction offset=N address value)`` (no ``offset=`` at 0)."""
        at = f"offset={offset} " if offset else ""
        self.line(f"({instruction} {at}{address} {value})")

    # -- locals

    def local(self, prefix: str, kind: str) -> str:
        """A new local ``$prefixN`` of wasm type ``kind``."""
        return self.function.local(prefix, kind)

    def named(self, name: str, kind: str = "i32") -> str:
        """The local ``$name`` (declared once)."""
        return self.function.named_local(name, kind)

    # -- constructs

    @contextmanager
    def block(self, label: str) -> Iterator[None]:
        """``(block $label ...)``: ``br $label`` leaves it."""
        with self._construct(f"(block {label}"):
            yield

    @contextmanager
    def loop(self, label: str) -> Iterator[None]:
        """``(loop $label ...)``: ``br $label`` runs it again."""
        with self._construct(f"(loop {label}"):
            yield

    @contextmanager
    def if_(self, condition: str) -> Iterator[None]:
        """``(if condition ...)``, holding :meth:`then` and :meth:`else_`."""
        with self._construct(f"(if {condition}"):
            yield

    @contextmanager
    def then(self) -> Iterator[None]:
        with self._construct("(then"):
            yield

    @contextmanager
    def else_(self) -> Iterator[None]:
        with self._construct("(else"):
            yield

    @contextmanager
    def nested(self) -> Iterator[None]:
        """One level deeper, without a construct (statements inside a construct the caller
        opened and closes itself)."""
        outer = self.indent
        self.indent += STEP
        try:
            yield
        finally:
            self.indent = outer

    @contextmanager
    def _construct(self, opening: str) -> Iterator[None]:
        self.line(opening)
        with self.nested():
            yield
        self.close()

    def close(self) -> None:
        """Closes the construct opened last: a ``)`` after the last statement written (on a
        line of its own after a comment, which would swallow it)."""
        lines = self.function.lines
        if ";;" in lines[-1]:
            lines.append(self.indent + ")")
        else:
            lines[-1] += ")"
