"""The params block: the uniform buffer every kernel reads at binding 0 (the bundle's contract).

The host module writes one block per call site, each in its own :data:`PARAMS_SLOT`-byte
slot of the params buffer; the kernel declares the same fields as a WGSL struct.  A block
is i32 fields: ``element_count`` (the dispatch's invocation count) first, then the kernel's
size variables in order, then padding up to a multiple of 16 bytes (the size rule of a
uniform buffer binding).  :class:`ParamsLayout` is that layout; the WGSL backend
(``wgsl/shader.py``), the library kernels (``library/params.py``), the bundle writer and the
host module (``wasm/``) all take it from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UnsupportedModelError

PARAMS_SLOT = 256  # bytes per call site: minUniformBufferOffsetAlignment's WebGPU default
FIELD_BYTES = 4  # every field is an i32
ELEMENT_COUNT = "element_count"  # the first field
_ALIGNMENT = 16  # a uniform binding's size is a multiple of 16 bytes


@dataclass(frozen=True)
class ParamsLayout:
    """The params block of a kernel whose size variables are ``size_vars`` (names, in order)."""

    size_vars: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "size_vars", tuple(self.size_vars))
        if self.size > PARAMS_SLOT:
            raise UnsupportedModelError(
                f"a kernel with {len(self.size_vars)} size variables needs a {self.size}-byte params block; "
                f"each call site has {PARAMS_SLOT} bytes"
            )

    @property
    def fields(self) -> tuple[str, ...]:
        """The fields the host writes, in order: ``element_count``, then the size variables."""
        return (ELEMENT_COUNT, *self.size_vars)

    @property
    def padding(self) -> tuple[str, ...]:
        """Names of the unused fields after them (``_pad0`` ...) that round the block up."""
        per_row = _ALIGNMENT // FIELD_BYTES
        return tuple(f"_pad{i}" for i in range((-len(self.fields)) % per_row))

    @property
    def size(self) -> int:
        """Bytes of the block (a multiple of 16)."""
        return FIELD_BYTES * (len(self.fields) + len(self.padding))
