"""PassContext: the settings a pass pipeline runs under.

Passes stay plain ``IRModule -> IRModule`` functions; the few that depend on the user's
settings read them from the current context (TVM style)::

    with PassContext(bounds={"batch": 64}, opt_level=1):
        module = run_pipeline(module)

- ``bounds``: upper bounds of symbolic variables (``--bound batch=64``); ``fuse_ops`` and
  ``plan_memory`` compare sizes with them, ``lower_shapes_to_host`` checks inputs against
  them and sizes storages at them.
- ``opt_level``: which pipeline :func:`~relaxweb.passes.pipeline.pipeline` gives (0: no
  fusion or scheduling).
- ``storage_reuse``: ``plan_memory`` reuses storages of dead tensors (off: every tensor its
  own storage, the baseline ``scripts/measure_pipeline.py`` compares with).
- ``weights``, ``weight_group_size``, ``weight_scale_dtype``: how ``compress_weights`` stores
  the weights of matmuls, gathers and convolutions (``--weights float32|float16|int8|int4``,
  ``--group-size``, ``--scale-dtype``; float32 keeps them as the model stores them).
- ``binding_split_bytes``: a weight of more device bytes is bound to its kernels as several
  parts of at most this size (``fuse_ops`` counts each part as a storage binding, the bundle
  writer emits kernels that read the parts); by default WebGPU's guaranteed
  ``maxStorageBufferBindingSize``, 128 MiB.  Tests set it lower (a multiple of 256) to split
  small weights; the runtimes decide at load how many parts a device needs.
- ``kv_pages``, ``kv_page_size``: a decoder's KV caches become pools of this many pages of
  this many positions per layer, shared by the sequences a run advances together
  (``page_kv_caches``, ``--kv-pages`` / ``--kv-page-size``); None: one cache per run's batch.
- ``verify``: ``run_pipeline`` checks the module's well-formedness before the first pass and
  after every pass, and names the pass that broke it.  Off by default; on when the
  environment variable ``RELAXWEB_VERIFY_IR`` is ``1`` (the test suite sets it).

Outside any ``with`` block, :meth:`PassContext.current` is ``PassContext()``.
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Mapping

from ..ir.launch import BINDING_PART_BYTES, PART_ALIGNMENT

OPT_LEVELS = (0, 1)
WEIGHT_FORMATS = ("float32", "float16", "int8", "int4")
SCALE_DTYPES = ("float16", "float32")
DEFAULT_OPT_LEVEL = 1
#: Positions per page of a paged KV cache (``--kv-page-size``).
DEFAULT_KV_PAGE_SIZE = 16
VERIFY_ENVIRONMENT_VARIABLE = "RELAXWEB_VERIFY_IR"


def _verify_by_default() -> bool:
    return os.environ.get(VERIFY_ENVIRONMENT_VARIABLE) == "1"


@dataclass(frozen=True)
class PassContext:
    bounds: Mapping[str, int] = field(default_factory=dict)
    opt_level: int = DEFAULT_OPT_LEVEL
    storage_reuse: bool = True
    weights: str = "float32"
    weight_group_size: int = 32
    weight_scale_dtype: str = "float16"
    binding_split_bytes: int = BINDING_PART_BYTES
    kv_pages: int | None = None
    kv_page_size: int = DEFAULT_KV_PAGE_SIZE
    verify: bool = field(default_factory=_verify_by_default)

    def __post_init__(self) -> None:
        if self.opt_level not in OPT_LEVELS:
            raise ValueError(f"opt level {self.opt_level} does not exist; expected one of {', '.join(map(str, OPT_LEVELS))}")
        if self.weights not in WEIGHT_FORMATS:
            raise ValueError(f"weights {self.weights!r} is not a weight format; expected one of {', '.join(WEIGHT_FORMATS)}")
        if self.weight_scale_dtype not in SCALE_DTYPES:
            raise ValueError(f"scale dtype {self.weight_scale_dtype!r} is not one of {', '.join(SCALE_DTYPES)}")
        if int(self.weight_group_size) < 1:
            raise ValueError(f"the group size must be >= 1, got {self.weight_group_size}")
        if self.binding_split_bytes <= 0 or self.binding_split_bytes % PART_ALIGNMENT:
            raise ValueError(f"binding_split_bytes must be a positive multiple of {PART_ALIGNMENT}, "
                             f"got {self.binding_split_bytes}")
        if self.kv_pages is not None and (self.kv_pages < 1 or self.kv_page_size < 1):
            raise ValueError(f"kv_pages and kv_page_size must be >= 1, got {self.kv_pages} and {self.kv_page_size}")
        object.__setattr__(self, "bounds", MappingProxyType(dict(self.bounds)))

    @staticmethod
    def current() -> PassContext:
        """The innermost context entered with ``with``, or the default one."""
        active = _ACTIVE.get()
        return active[-1] if active else PassContext()

    def replace(self, **changes: Any) -> PassContext:
        return replace(self, **changes)

    def __enter__(self) -> PassContext:
        _ACTIVE.set((*_ACTIVE.get(), self))
        return self

    def __exit__(self, *exception: object) -> None:
        active = _ACTIVE.get()
        assert active and active[-1] is self, "PassContext blocks must be exited in the order they were entered"
        _ACTIVE.set(active[:-1])


# The contexts entered and not yet exited, innermost last (per thread and per async task).
_ACTIVE: ContextVar[tuple[PassContext, ...]] = ContextVar("relaxweb_pass_contexts", default=())
