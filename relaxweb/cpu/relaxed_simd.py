"""Relaxed SIMD in kernels.wasm: the kernels' multiply-adds as ``f32x4.relaxed_madd``, written so
that a runtime whose engine lacks relaxed SIMD lowers them to plain SIMD128 in place.

The kernels are rendered once, with :func:`multiply_add` at every ``sum + a * b`` of f32x4
that sits on a hot loop (the matmul tiers' micro-kernels and rows, the attention kernels'
dot products).  Where the CPU has fused multiply-add (x86 with FMA3, every ARM64) an engine
with relaxed SIMD (Chromium from 114, Firefox from 120, wasmtime) turns it into one
instruction instead of a multiply and an add, which halves the arithmetic of a micro-kernel:
bench/wasm_peak.py measures the f32x4 peak both ways.

The bundle ships that one module.  Each multiply-add is a *site* of one fixed binary form::

    a  b  local.get $sum  f32x4.relaxed_madd  nop nop nop

and its plain form has the same length::

    a  b  f32x4.mul  local.get $sum  f32x4.add

(the three nops, one byte each, pay for the second opcode; engines drop nops when they
compile).  So a runtime without relaxed SIMD rewrites each site's bytes where they stand, with
no function, section or index of the module moving (``runtime/relaxed_simd.py``,
``runtime_js/relaxed_simd.js``; docs/bundle-format.md, "Relaxed SIMD").  The manifest counts
the sites (``wasm.relaxed_madd_sites``), and the runtimes check that they rewrote as many.

:func:`plain_simd` is the same lowering on the text, for the tests that hold the runtimes'
byte rewrite to the assembler's plain module.  The relaxed instruction may round once (fused)
or twice (as the plain form); the specification lets the engine pick, so results may differ
in the last bit between machines, never between two runs on one.
"""

from __future__ import annotations

import re

RELAXED_MADD = "f32x4.relaxed_madd"
"""The relaxed SIMD instruction the kernels use: ``a * b + c``, fused or not."""

SITE_PADDING = "(nop) (nop) (nop)"
"""What follows each relaxed multiply-add: the bytes its plain form takes beyond it."""

_ACCUMULATOR = re.compile(r"\(local\.get \$[\w.]+\)")


def multiply_add(a: str, b: str, accumulator: str) -> str:
    """``a * b + accumulator`` on f32x4 values (WAT folded instructions) as one relaxed
    instruction and its padding: a site the runtimes can lower in place.  ``accumulator`` is
    a ``(local.get $name)``, ``a`` and ``b`` any f32x4 expressions without a site inside."""
    if not _ACCUMULATOR.fullmatch(accumulator):
        raise ValueError(f"a relaxed multiply-add adds to a local (local.get $name), not {accumulator!r}")
    if RELAXED_MADD in a or RELAXED_MADD in b:
        raise ValueError("a relaxed multiply-add's factors hold no multiply-add of their own")
    return f"({RELAXED_MADD} {a} {b} {accumulator}) {SITE_PADDING}"


def relaxed_madd_sites(wat: str) -> int:
    """How many multiply-add sites ``wat`` has (the manifest's ``wasm.relaxed_madd_sites``)."""
    return wat.count(f"({RELAXED_MADD} ")


_SITE = re.compile(rf"\({re.escape(RELAXED_MADD)} (.*?) (\(local\.get \$[\w.]+\))\) {re.escape(SITE_PADDING)}")


def plain_simd(wat: str) -> str:
    """``wat`` with every site written ``(f32x4.add (f32x4.mul a b) (local.get $sum))``: the
    text of what the runtimes' lowering makes of the module."""
    plain = _SITE.sub(lambda site: f"(f32x4.add (f32x4.mul {site[1]}) {site[2]})", wat)
    if RELAXED_MADD in plain:
        raise ValueError(f"a {RELAXED_MADD} not written by multiply_add in the kernels' text (a relaxweb bug)")
    return plain
