"""The attention sites of a model, as ``fuse_attention`` records them in the module's attrs.

An attention site is a ``softmax`` whose weights (or ``where(isnan(weights), 0, weights)`` of
them) a ``matmul`` multiplies by values.  ``passes/fuse_attention.py`` records each site it
saw, fused into the ``attention`` op or not and why not; the bundle writer lists them in the
manifest (``attention``, docs/bundle-format.md) and ``relaxweb inspect`` prints them.  The
record lives here because those layers all read it.

In ``module.attrs[ATTENTION_SITES]`` each site is a dict (the attrs are IR text): ``softmax``,
``scores`` and ``output``, the names of the module's variables of the site's ``softmax``, its
scores' ``matmul(q, k_t)`` (None when the softmax reads no matmul) and its value product
``matmul(weights, v)``; ``fused``; ``reason``, why it is not fused ("" when it is).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: The module attrs key of the attention sites.
ATTENTION_SITES = "attention_sites"


@dataclass(frozen=True)
class AttentionSite:
    """One attention site: its variables' names and, when it is not fused, why."""

    softmax: str
    scores: str | None
    output: str
    reason: str = ""

    @property
    def fused(self) -> bool:
        return not self.reason

    def record(self) -> dict[str, Any]:
        """The site as the module's attrs hold it."""
        return {"softmax": self.softmax, "scores": self.scores, "output": self.output, "fused": self.fused,
                "reason": self.reason}


def attention_sites(attrs: Mapping[str, Any]) -> list[AttentionSite]:
    """The attention sites recorded in a module's ``attrs``, in the order the pass saw them."""
    return [AttentionSite(site["softmax"], site["scores"], site["output"], site["reason"])
            for site in attrs.get(ATTENTION_SITES, [])]
