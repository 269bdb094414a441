"""The dtype table (relaxweb/ir/dtype.py) and what reads it: storages, casts, WGSL, the manifest."""

from __future__ import annotations

import numpy as np
import pytest

from relaxweb.errors import UnsupportedModelError
from relaxweb.ir.dtype import DTYPES, GPU_DTYPES, DtypeKind, dtype_info
from relaxweb.ir.symbolic import SizeVar
from relaxweb.ir.tir import Buffer, Cast, Load, ReduceCombiner
from relaxweb.wgsl.emit import literal, reduce_identity, storage_type

NUMPY_KINDS = {"f": DtypeKind.FLOAT, "i": DtypeKind.INT, "u": DtypeKind.UINT, "b": DtypeKind.BOOL}


@pytest.mark.parametrize("name", DTYPES)
def test_each_entry_agrees_with_numpy(name: str) -> None:
    info = dtype_info(name)
    assert info.name == name
    assert info.bytes == np.dtype(name).itemsize
    assert info.kind is NUMPY_KINDS[np.dtype(name).kind]


@pytest.mark.parametrize("name", GPU_DTYPES)
def test_device_dtypes_are_32_bit_of_the_same_kind(name: str) -> None:
    info = dtype_info(name)
    device = info.device
    assert device.bytes == info.device_bytes == 4
    assert device.device is device  # a device dtype is its own
    assert device.kind is (DtypeKind.UINT if info.kind is DtypeKind.BOOL else info.kind)
    assert info.storage_bytes == max(info.bytes, 4)  # room for the device form and the interpreter's
    assert info.narrowed_on_device == (info.bytes > 4)
    assert info.compute_dtype == ("bool" if name == "bool" else device.name)  # kernels compute in 32 bits


def test_the_device_dtypes_of_the_bundle_format() -> None:
    """The table of docs/bundle-format.md."""
    devices = {name: dtype_info(name).device.name for name in GPU_DTYPES}
    assert devices == {
        "float32": "float32", "float16": "float32", "float64": "float32",
        "int32": "int32", "int16": "int32", "int8": "int32", "int64": "int32",
        "uint32": "uint32", "uint16": "uint32", "uint8": "uint32", "bool": "uint32",
    }
    assert dtype_info("int64").manifest_entry() == {"bytes": 8, "kind": "int", "device_dtype": "int32", "device_bytes": 4,
                                                         "wasm_dtype": "int64", "wasm_bytes": 8}
    assert dtype_info("bool").manifest_entry() == {"bytes": 1, "kind": "bool", "device_dtype": "uint32", "device_bytes": 4,
                                                        "wasm_dtype": "uint32", "wasm_bytes": 4}


def test_an_unknown_dtype_is_one_clear_error() -> None:
    with pytest.raises(UnsupportedModelError, match=r"unsupported dtype bfloat16 \(relaxweb knows float32, .*bool\)"):
        dtype_info("bfloat16")


def test_uint64_is_known_but_has_no_gpu_form() -> None:
    info = dtype_info("uint64")
    assert not info.on_gpu and "uint64" not in GPU_DTYPES
    assert info.storage_bytes == 8
    with pytest.raises(UnsupportedModelError, match="uint64 has no GPU representation"):
        info.device
    with pytest.raises(ValueError, match="cannot cast to uint64"):
        Cast("uint64", Load(Buffer("x", (4,), "int32"), (SizeVar("i"),)))
    with pytest.raises(NotImplementedError, match="uint64 has no GPU representation"):
        literal(1, "uint64")


def test_every_gpu_dtype_is_a_cast_target_with_a_wgsl_type() -> None:
    x = Load(Buffer("x", (4,), "float32"), (SizeVar("i"),))
    for name in GPU_DTYPES:
        assert Cast(name, x).dtype == name
        assert storage_type(name) in ("f32", "i32", "u32")


def test_literals_follow_the_kind_and_the_device_range() -> None:
    assert literal(2, "float16") == "2.0"
    assert literal(-3, "int8") == "(-3)"
    assert literal(-2**40, "int64") == "i32(-2147483648)"  # int64 saturates to its int32 device form
    assert literal(2**40, "int64") == "2147483647"
    assert literal(7, "uint16") == "7u"
    assert literal(1, "bool") == "true"


def test_max_and_min_start_from_the_extremes_of_the_dtype() -> None:
    """Narrow integers start from their own range (an int8 max from -128, not from 0); the
    32-bit dtypes and int64 (int32 on the device) from the device's."""
    assert reduce_identity(ReduceCombiner.MAX, "int8") == "(-128)"
    assert reduce_identity(ReduceCombiner.MIN, "int8") == "127"
    assert reduce_identity(ReduceCombiner.MIN, "uint8") == "255u"
    assert reduce_identity(ReduceCombiner.MAX, "uint16") == "0u"
    assert reduce_identity(ReduceCombiner.MAX, "int64") == "i32(-2147483648)"
    assert reduce_identity(ReduceCombiner.MIN, "uint32") == "4294967295u"
    assert reduce_identity(ReduceCombiner.MAX, "float16").startswith("bitcast<f32>(0xff800000u")
    assert reduce_identity(ReduceCombiner.SUM, "float32") == "0.0"
    assert reduce_identity(ReduceCombiner.PROD, "int32") == "1"
