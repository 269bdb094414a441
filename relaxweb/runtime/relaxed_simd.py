"""Relaxed SIMD on the wasm backend: whether the kernels run with it, and their lowering to
plain SIMD128 where they do not (the twin of runtime_js/relaxed_simd.js).

A bundle's kernels.wasm writes each f32x4 multiply-add as a *site* of one fixed form (the
compiler's ``cpu/relaxed_simd.py``; docs/bundle-format.md, "Relaxed SIMD")::

    local.get $sum  f32x4.relaxed_madd  nop nop nop       20 <index> fd 85 02 01 01 01

(its two factors already on the stack).  Without relaxed SIMD the same bytes become::

    f32x4.mul  local.get $sum  f32x4.add                  fd e6 01 20 <index> fd e4 01

which is as long, so the rewrite moves nothing else in the module.  The manifest's
``wasm.relaxed_madd_sites`` says how many sites there are; a module where the lowering finds
another count is damaged, and refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import wasmtime

from relaxweb.errors import RelaxwebError

#: A module that validates exactly where the engine has relaxed SIMD: one function returning
#: ``f32x4.relaxed_madd`` of its three v128 parameters (runtime_js/relaxed_simd.js has the same bytes).
RELAXED_SIMD_PROBE = bytes([0, 97, 115, 109, 1, 0, 0, 0, 1, 8, 1, 96, 3, 123, 123, 123, 1, 123, 3, 2, 1, 0, 10, 13, 1,
                            11, 0, 32, 0, 32, 1, 32, 2, 253, 133, 2, 11])

#: A site's bytes after its local.get: f32x4.relaxed_madd (0xfd 261) and three nops.
SITE_TAIL = bytes([0xFD, 0x85, 0x02, 0x01, 0x01, 0x01])
_LOCAL_GET, _F32X4_MUL, _F32X4_ADD = 0x20, bytes([0xFD, 0xE6, 0x01]), bytes([0xFD, 0xE4, 0x01])
_CODE_SECTION = 10


def engine_has_relaxed_simd(engine: wasmtime.Engine) -> bool:
    """Whether ``engine`` compiles relaxed SIMD (wasmtime's default; ``Config.wasm_relaxed_simd``)."""
    try:
        wasmtime.Module.validate(engine, RELAXED_SIMD_PROBE)
    except wasmtime.WasmtimeError:
        return False
    return True


def use_relaxed_simd(entry: Mapping[str, Any], wanted: bool | None, engine: wasmtime.Engine) -> bool:
    """Whether a session runs the bundle's kernels with relaxed SIMD: ``wanted`` None where the
    kernels multiply and add and the engine compiles it; True insists (an error where it
    cannot); False runs them lowered to plain SIMD128 (results the same on every machine)."""
    if wanted is False:
        return False
    if wanted not in (None, True):
        raise ValueError(f"relaxed_simd must be None (where the engine has it), True or False, got {wanted!r}")
    if "relaxed_madd_sites" not in entry:
        if wanted:
            raise RelaxwebError("relaxed_simd=True, but the bundle's kernels use no relaxed SIMD (its manifest's "
                                "wasm entry has no relaxed_madd_sites: no kernel multiplies and adds)")
        return False
    if not engine_has_relaxed_simd(engine):
        if wanted:
            raise RelaxwebError("relaxed_simd=True, but this wasmtime does not compile relaxed SIMD")
        return False
    return True


def lower_relaxed_simd(wasm: bytes, sites: int) -> bytes:
    """``wasm`` (a kernels.wasm) with each of its ``sites`` relaxed multiply-adds rewritten as a
    plain multiply then add, in place.  A RelaxwebError where the module is not so shaped."""
    data = bytearray(wasm)
    start, end = _code_section(data)
    found = 0
    position = data.find(SITE_TAIL, start, end)
    while position >= 0:
        # the local.get before it: 0x20, then the local's index (LEB128: its last byte below 0x80)
        get = position - 1
        if data[get] & 0x80:
            raise _damaged("a relaxed multiply-add does not follow a local.get")
        get -= 1
        while get >= start and data[get] & 0x80 and position - get <= 5:
            get -= 1
        if data[get] != _LOCAL_GET:
            raise _damaged("a relaxed multiply-add does not follow a local.get")
        index = bytes(data[get + 1:position])
        data[get:position + len(SITE_TAIL)] = _F32X4_MUL + bytes([_LOCAL_GET]) + index + _F32X4_ADD
        found += 1
        position = data.find(SITE_TAIL, position + len(SITE_TAIL), end)
    if found != sites:
        raise _damaged(f"{found} relaxed multiply-adds where the manifest counts {sites}")
    return bytes(data)


def _code_section(data: bytearray) -> tuple[int, int]:
    """Where the code section's bytes start and end."""
    if data[:8] != b"\0asm\x01\0\0\0":
        raise _damaged("not a WebAssembly module (version 1)")
    position = 8
    while position < len(data):
        section_id = data[position]
        size, position = _read_leb(data, position + 1)
        if section_id == _CODE_SECTION:
            return position, position + size
        position += size
    raise _damaged("no code section")


def _read_leb(data: bytearray, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if position >= len(data) or shift > 28:
            raise _damaged("truncated")
        byte = data[position]
        value |= (byte & 0x7F) << shift
        position += 1
        if byte < 0x80:
            return value, position
        shift += 7


def _damaged(why: str) -> RelaxwebError:
    return RelaxwebError(f"the bundle's kernels.wasm cannot be lowered to plain SIMD128 ({why}): the bundle is damaged")
