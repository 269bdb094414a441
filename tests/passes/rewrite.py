"""The before/expected IR-text check every pass test uses (tests/passes/test_<pass>.py).

``check_rewrite(pass, before, expected, inputs)`` parses ``before``, runs the pass, asserts
the result is structurally equal to the parsed ``expected`` (variable and size-variable
names may differ), checks it is well formed, and runs ``before``, the result and
``expected`` through the reference interpreter on the same inputs (``run_host_function``
once the module has a host function); the result must also print as IR text that parses
back to it (what a pass produces, the text can say).  A pass that must leave a module
alone is checked the same way, with ``expected`` the ``before`` text (:func:`check_unchanged`).

The expected text is written by hand from what the pass's docstring promises, not printed
from the pass's output.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from relaxweb.ir.host import HostFunction
from relaxweb.ir.interpreter import run_host_function, run_module
from relaxweb.ir.module import IRModule
from relaxweb.ir.parser import parse_module
from relaxweb.ir.printer import format_module, module_constants
from relaxweb.ir.structural import assert_structural_equal
from relaxweb.ir.well_formed import check_well_formed

RTOL, ATOL = 1e-5, 1e-6

Inputs = Mapping[str, np.ndarray]
Rewrite = Callable[[IRModule], IRModule]


def run(module: IRModule, inputs: Inputs) -> list[np.ndarray]:
    """The module's outputs in the reference interpreter (its graph or its host function)."""
    main = module.main
    if isinstance(main, HostFunction):
        return run_host_function(main, module.programs, dict(inputs))
    return run_module(module, dict(inputs))


def check_rewrite(rewrite: Rewrite, before_text: str, expected_text: str, inputs: Inputs | Sequence[Inputs],
                  constants: Mapping[str, np.ndarray] | None = None) -> IRModule:
    """``rewrite(parse(before))`` is ``parse(expected)``, well formed, prints as text that
    parses back to it, and computes what ``before`` computes on each of ``inputs`` (one dict
    of inputs, or several)."""
    before = parse_module(before_text, constants)
    after = rewrite(before)
    expected = parse_module(expected_text, constants)
    assert_structural_equal(after, expected)
    check_well_formed(after)
    assert_structural_equal(parse_module(format_module(after), module_constants(after)), after)
    for feeds in [inputs] if isinstance(inputs, Mapping) else inputs:
        reference = run(before, feeds)
        for module in (after, expected):
            results = run(module, feeds)
            assert len(results) == len(reference)
            for result, wanted in zip(results, reference):
                assert result.shape == wanted.shape
                np.testing.assert_allclose(result, wanted, rtol=RTOL, atol=ATOL)
    return after


def check_unchanged(rewrite: Rewrite, text: str, inputs: Inputs | Sequence[Inputs],
                    constants: Mapping[str, np.ndarray] | None = None) -> IRModule:
    """The pass leaves the module ``text`` describes as it is (and it still computes the same)."""
    return check_rewrite(rewrite, text, text, inputs, constants)


# Tensor programs that many tests call, as legalize_ops writes them for x[n, 4].
RELU = '''
@tensor_program
def relu(A: Buffer((n, 4), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = maximum(A[i0_, i1_], float32(0.0))
'''
TANH = '''
@tensor_program
def tanh(A: Buffer((n, 4), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = tanh(A[i0_, i1_])
'''
EXP = '''
@tensor_program
def exp(A: Buffer((n, 4), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = exp(A[i0_, i1_])
'''
NEGATIVE = '''
@tensor_program
def negative(A: Buffer((n, 4), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = negative(A[i0_, i1_])
'''
ADD = '''
@tensor_program
def add(A: Buffer((n, 4), "float32"), B: Buffer((n, 4), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = (A[i0_, i1_] + B[i0_, i1_])
'''
MATMUL = '''
@tensor_program
def matmul(A: Buffer((n, 4), "float32"), B: Buffer((4, 8), "float32"), out: Buffer((n, 8), "float32")):
    out[i0_, i1_] = sum((A[i0_, k_] * B[k_, i1_]) for k_ in range(4))
'''
