"""Library kernel builders by name, so a kernel can be printed, parsed back and rendered.

A library kernel (``relaxweb/library``) holds what it computes (buffers, dispatch, a numpy
reference), which the IR text does not repeat: the text names the builder that made the
kernel and the arguments it was given, and the parser calls the builder again.  The backends
render the kernel's code from the same two (``relaxweb/wgsl/library``, ``relaxweb/cpu/library``:
a table of renderers by builder name).  ``relaxweb/library`` fills this registry when it is
imported (the IR layer does not import it)::

    @library_kernel_builder("unique_count")
    def unique_count_kernel(name: str, length: PrimExpr, dtype: str) -> LibraryKernel: ...

Each kernel a registered builder returns records ``builder`` (the registered name) and
``builder_args`` (its arguments by parameter name), which the printer writes out.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable

_BUILDERS: dict[str, Callable[..., Any]] = {}


def library_kernel_builder(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a function that returns a library kernel under ``name``; the kernels it
    returns record the builder and their arguments."""
    def register(build: Callable[..., Any]) -> Callable[..., Any]:
        if name in _BUILDERS:
            raise ValueError(f"library kernel builder {name!r} registered twice")
        signature = inspect.signature(build)

        @functools.wraps(build)
        def build_and_record(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            kernel = build(*bound.args, **bound.kwargs)
            return dataclasses.replace(kernel, builder=name, builder_args=tuple(bound.arguments.items()))

        _BUILDERS[name] = build_and_record
        return build_and_record

    return register


def build_library_kernel(builder: str, arguments: dict[str, Any]) -> Any:
    """The kernel that the builder registered as ``builder`` makes from ``arguments``."""
    if builder not in _BUILDERS:
        known = ", ".join(sorted(_BUILDERS)) or "none; import relaxweb.library first"
        raise KeyError(f"no library kernel builder named {builder!r} is registered (registered: {known})")
    return _BUILDERS[builder](**arguments)
