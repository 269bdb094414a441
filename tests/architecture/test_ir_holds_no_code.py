"""The IR holds what a kernel computes, never a backend's code: no dataclass of
``relaxweb/ir`` has a field for shader or WebAssembly text, and the library kernels the
builders make hold none in any field (the backends render it: ``relaxweb/wgsl/library``,
``relaxweb/cpu/library``)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil

import pytest

import relaxweb.ir
from relaxweb.ir.symbolic import SizeVar
from relaxweb.library import (
    attention_kernel, kv_cache_write_kernel, recurrence_kernel, sequence_write_kernel, unique_count_kernel,
    unique_values_kernel, write_row_kernel,
)

#: Words in a field name that would say it holds a backend's code.
CODE_WORDS = ("source", "wgsl", "wat", "wasm", "shader")
#: What starts WGSL or WebAssembly text (a WGSL binding or entry point, a WAT function).
CODE_MARKS = ("@group(", "@compute", "fn main(", "(func $")


def ir_dataclasses() -> list[type]:
    found = []
    for info in pkgutil.iter_modules(relaxweb.ir.__path__):
        module = importlib.import_module(f"relaxweb.ir.{info.name}")
        found += [value for value in vars(module).values() if inspect.isclass(value)
                  and dataclasses.is_dataclass(value) and value.__module__ == module.__name__]
    return found


def test_no_ir_dataclass_has_a_field_for_code() -> None:
    """No text field named for code (a target's typed schedule, ``TargetSchedules.wasm``, is
    not text)."""
    classes = ir_dataclasses()
    assert any(cls.__name__ == "LibraryKernel" for cls in classes)
    named = [f"{cls.__module__}.{cls.__name__}.{field.name}" for cls in classes for field in dataclasses.fields(cls)
             if any(word in field.name.split("_") for word in CODE_WORDS) and "str" in str(field.type)]
    assert not named, f"IR fields of text named for a backend's code: {named}"


def texts(value: object) -> list[str]:
    """Every string in ``value``, through tuples, lists and dicts."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, (tuple, list)):
        return [text for item in value for text in texts(item)]
    if isinstance(value, dict):
        return [text for pair in value.items() for text in texts(pair)]
    return []


n = SizeVar("n")


@pytest.mark.parametrize("kernel", [
    attention_kernel("attention", (2, 3), n, n, 8, 8, (2, 1, n, n), 0.5, True),
    recurrence_kernel("lstm", "lstm", n, 2, 8, "bidirectional", (("sigmoid", 0, 0), ("tanh", 0, 0), ("tanh", 0, 0)) * 2),
    write_row_kernel("write_row", n, (4,), "float32", "row"),
    sequence_write_kernel("int32"),
    kv_cache_write_kernel("kv", (1, 2), n, (8,), 64, "float32", "past"),
    unique_count_kernel("count", n, "float32"),
    unique_values_kernel("values", n, "int32"),
], ids=lambda kernel: kernel.builder)
def test_library_kernels_hold_no_code(kernel) -> None:
    fields = {field.name: getattr(kernel, field.name) for field in dataclasses.fields(kernel)}
    coded = [name for name, value in fields.items() for text in texts(value) if any(mark in text for mark in CODE_MARKS)]
    assert not coded, f"{kernel.name}: fields holding code: {coded}"
