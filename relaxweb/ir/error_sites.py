"""Errors a kernel finds in a run's data, and the run status it reports them in.

Some facts hold only for some data: an index read from a tensor must lie within the axis it
indexes (ONNX Gather, the scatters), an integer result must fit its dtype.  A kernel that
checks one reports a failure into the run's **status**, a small buffer of
:data:`STATUS_WORDS` u32 words that the runtime clears before a run and reads back with the
outputs (docs/design.md, "Errors found by kernels"):

- word 0: the **site** of the first error (0: none), first writer wins;
- words 1 ..: the values the site's message shows (signed 32-bit), at most :data:`MAX_VALUES`.

A site is one check of one node of the model: the module's attrs hold the table
(:data:`ERROR_SITES`: site ``k`` is entry ``k - 1``), the bundle writes it into the manifest
(``run_errors``) and the runtimes format the message from it (``errors.run_error_message``).
A legalization adds a site with its context's ``error_site`` and writes the site number into
the program as an integer literal (:class:`~relaxweb.ir.tir.CheckedIndex`'s ``site``), so a
fused program keeps each node's own site, and ``share_programs`` turns sites that differ
between shared programs into a params field like any other literal.

A kernel whose program holds a reporting node binds the status as its last storage binding
(after its output; ``{"status": true}`` in its call sites' buffers), so it costs a binding
only where there is a check (:func:`reports_errors`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import STATUS_WORDS
from .tir import TensorProgram, scalar_nodes

#: The module attribute holding the table of error sites (a tuple of ``(node, op, message)``).
ERROR_SITES = "relaxweb.error_sites"

#: The run status: :data:`STATUS_WORDS` u32 words (``relaxweb/errors.py``, which the runtimes
#: read too), the site, then the values of its message.
STATUS_BYTES = 4 * STATUS_WORDS
MAX_VALUES = STATUS_WORDS - 1

#: The scalar kinds that report into the status (``relaxweb/ir/tir.py``): a program holding one
#: binds the status.
REPORTING_KINDS = frozenset({"checked_index", "checked_integer", "checked_divisor"})


@dataclass(frozen=True)
class ErrorSite:
    """One check of one node: ``node`` and ``op`` are the model's node name and op type (the
    IR op when the call came from no node), ``message`` the rest of the message, ``{0}``,
    ``{1}`` ... standing for the values the kernel reports (``index {0} is out of range for
    axis 0 of extent {1}``)."""

    node: str
    op: str
    message: str

    def entry(self) -> dict[str, str]:
        """The manifest's ``run_errors`` entry."""
        return {"node": self.node, "op": self.op, "message": self.message}


def error_sites(attrs: Mapping[str, Any]) -> tuple[ErrorSite, ...]:
    """The module's error sites, in site order (site ``k`` is the ``k - 1``-th)."""
    return tuple(ErrorSite(*entry) for entry in attrs.get(ERROR_SITES, ()))


def with_error_site(attrs: Mapping[str, Any], site: ErrorSite) -> tuple[dict[str, Any], int]:
    """``attrs`` with ``site`` added to the table, and the site's number (1 or more)."""
    table = tuple(attrs.get(ERROR_SITES, ()))
    entry = (site.node, site.op, site.message)
    return {**attrs, ERROR_SITES: (*table, entry)}, len(table) + 1


def reports_errors(program: object) -> bool:
    """Whether a kernel's program holds a node that reports into the run status (it then
    binds the status buffer); a library kernel never does."""
    return isinstance(program, TensorProgram) and any(
        node.scalar_kind in REPORTING_KINDS for node in scalar_nodes(program.body))
