"""The dtype table: every fact relaxweb keeps about an element type, in one place.

A dtype is named as numpy names it (``float32``, ``int64``, ``bool``).  Each entry says how
many bytes an element takes in the model, what kind of number it is, and which dtype it has
on the GPU.  WGSL buffers hold only 32-bit ``f32``/``i32``/``u32`` here (no 64-bit types, no
bool buffers, no 8/16-bit types, and ``f16`` needs the ``shader-f16`` feature), so:

    float32, int32, uint32          the same
    float16, float64                float32
    int64, int16, int8              int32  (int64 values must fit: inputs checked at the boundary,
                                            results in the kernels: ir/integer_checks.py)
    uint16, uint8, bool             uint32 (a bool as 0/1)
    uint64                          none: no GPU lowering

WebAssembly has 64-bit integers, so ``kernels.wasm`` holds an int64 tensor as int64 and
computes it exactly (:attr:`DtypeInfo.wasm_dtype`); every other dtype is held there as on the
GPU.  Memory plans reserve the larger of the two (:attr:`DtypeInfo.storage_bytes`).

Annotations, tensor programs, memory planning, the WGSL backend and the bundle writer read
these facts from here; the bundle writes the entries its tensors use into its manifest
(:meth:`DtypeInfo.manifest_entry`), and both runtimes convert inputs and outputs by them.
What a backend calls a device dtype (WGSL's ``f32``) stays in that backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ..errors import UnsupportedModelError


class DtypeKind(str, Enum):
    """What kind of number an element is (the manifest writes the value)."""

    FLOAT = "float"
    INT = "int"  # signed
    UINT = "uint"
    BOOL = "bool"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class DtypeInfo:
    """The facts of one dtype.

    ``bytes`` is the size of an element in the model (numpy's itemsize); ``device_dtype`` is
    the dtype a tensor of this dtype has in GPU memory, None where the GPU has none;
    ``memory_dtype`` the one it has in ``kernels.wasm``'s linear memory where that differs
    (:attr:`wasm_dtype`).
    """

    name: str
    bytes: int
    kind: DtypeKind
    device_dtype: str | None
    memory_dtype: str | None = None

    @property
    def on_gpu(self) -> bool:
        """True when tensors of this dtype can live on the GPU (and be a Cast target)."""
        return self.device_dtype is not None

    @property
    def device(self) -> "DtypeInfo":
        """The entry of the device dtype (itself for float32, int32, uint32)."""
        if self.device_dtype is None:
            raise UnsupportedModelError(
                f"dtype {self.name} has no GPU representation (GPU dtypes: {', '.join(GPU_DTYPES)})"
            )
        return DTYPES[self.device_dtype]

    @property
    def device_bytes(self) -> int:
        """Bytes per element in GPU memory."""
        return self.device.bytes

    @property
    def wasm_dtype(self) -> str | None:
        """The dtype a tensor of this dtype has in ``kernels.wasm``'s memory (and computes in
        there): int64 for int64, the device dtype for every other."""
        return self.memory_dtype or self.device_dtype

    @property
    def wasm_bytes(self) -> int:
        """Bytes per element in ``kernels.wasm``'s memory."""
        return DTYPES[self.wasm_dtype].bytes if self.wasm_dtype is not None else self.bytes

    @property
    def compute_dtype(self) -> str:
        """The dtype kernels compute values of this dtype in: its device dtype (kernels compute
        in 32 bits), except that a bool stays a bool.  Operands of one compute dtype may be
        combined (a float16 value times a float32 one is float32 arithmetic)."""
        return self.name if self.kind is DtypeKind.BOOL else self.device.name

    @property
    def storage_bytes(self) -> int:
        """Bytes per element a planned storage reserves: enough for the device form (a bool
        is 4 bytes on the GPU) and for the model form (the interpreter keeps an int64 as 8
        bytes; on the GPU those storages are over-allocated)."""
        return max(self.bytes, self.device_bytes, self.wasm_bytes) if self.on_gpu else self.bytes

    @property
    def is_float(self) -> bool:
        return self.kind is DtypeKind.FLOAT

    @property
    def is_integer(self) -> bool:
        """Signed or unsigned integer (not bool)."""
        return self.kind in (DtypeKind.INT, DtypeKind.UINT)

    @property
    def narrowed_on_device(self) -> bool:
        """True when the device dtype holds fewer bytes than the model's (int64 -> int32,
        float64 -> float32): values may not fit and are range-checked or saturated."""
        return self.on_gpu and self.device_bytes < self.bytes

    def manifest_entry(self) -> dict:
        """The entry of this dtype in a bundle's ``manifest.json`` ``dtypes`` table."""
        return {"bytes": self.bytes, "kind": self.kind.value, "device_dtype": self.device_dtype,
                "device_bytes": self.device_bytes, "wasm_dtype": self.wasm_dtype, "wasm_bytes": self.wasm_bytes}


_TABLE = (
    DtypeInfo("float32", 4, DtypeKind.FLOAT, "float32"),
    DtypeInfo("float16", 2, DtypeKind.FLOAT, "float32"),
    DtypeInfo("float64", 8, DtypeKind.FLOAT, "float32"),
    DtypeInfo("int32", 4, DtypeKind.INT, "int32"),
    DtypeInfo("int16", 2, DtypeKind.INT, "int32"),
    DtypeInfo("int8", 1, DtypeKind.INT, "int32"),
    DtypeInfo("int64", 8, DtypeKind.INT, "int32", "int64"),
    DtypeInfo("uint32", 4, DtypeKind.UINT, "uint32"),
    DtypeInfo("uint16", 2, DtypeKind.UINT, "uint32"),
    DtypeInfo("uint8", 1, DtypeKind.UINT, "uint32"),
    DtypeInfo("uint64", 8, DtypeKind.UINT, None),
    DtypeInfo("bool", 1, DtypeKind.BOOL, "uint32"),
)

#: Every dtype relaxweb knows, by name.
DTYPES: dict[str, DtypeInfo] = {info.name: info for info in _TABLE}
#: The dtypes tensors may have on the GPU (and the targets a tensor program may Cast to).
GPU_DTYPES: tuple[str, ...] = tuple(info.name for info in _TABLE if info.on_gpu)


def dtype_info(dtype: str) -> DtypeInfo:
    """The entry of ``dtype``; an unknown dtype is an :class:`UnsupportedModelError`."""
    try:
        return DTYPES[dtype]
    except KeyError:
        raise UnsupportedModelError(
            f"unsupported dtype {dtype} (relaxweb knows {', '.join(DTYPES)})"
        ) from None
