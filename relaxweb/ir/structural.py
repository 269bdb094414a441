"""Structural equality: same structure, with bound variables equal up to renaming.

Graph variables (``Var``) and symbolic variables (``SizeVar``) are matched by their first
occurrence — which is their definition in a well-formed program (parameters, bindings,
``match_cast``, tensor-program axes) — and must correspond one to one afterwards.  So
``def f(x: (n, 4)) ...`` equals ``def f(y: (m, 4)) ...`` when the bodies correspond.
Symbolic dims compare as trees after :func:`~relaxweb.ir.symbolic.simplify`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from .expr import Var
from .symbolic import PrimExpr, SizeVar, simplify


class _Matcher:
    def __init__(self) -> None:
        self.vars: dict[int, Var] = {}
        self.vars_reverse: dict[int, Var] = {}
        self.size_vars: dict[str, str] = {}
        self.size_vars_reverse: dict[str, str] = {}

    def equal(self, a: Any, b: Any) -> bool:
        if isinstance(a, Var) or isinstance(b, Var):
            return type(a) is type(b) and self.match_var(a, b)
        if isinstance(a, PrimExpr) and isinstance(b, PrimExpr):
            return self.equal_prim(simplify(a), simplify(b))
        if type(a) is not type(b):
            return False
        if dataclasses.is_dataclass(a):
            return all(
                self.equal_field(f.name, getattr(a, f.name), getattr(b, f.name))
                for f in dataclasses.fields(a) if f.compare or f.name == "struct_info"
            )
        for kinds, equal in self.CONTAINERS:
            if isinstance(a, kinds):
                return equal(self, a, b)
        return a == b

    def equal_sequence(self, a: tuple | list, b: tuple | list) -> bool:
        return len(a) == len(b) and all(self.equal(x, y) for x, y in zip(a, b))

    def equal_dict(self, a: dict, b: dict) -> bool:
        return a.keys() == b.keys() and all(self.equal(a[k], b[k]) for k in a)

    def equal_array(self, a: np.ndarray, b: np.ndarray) -> bool:
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")

    def equal_float(self, a: float, b: float) -> bool:
        return math.isnan(b) if math.isnan(a) else a == b  # a NaN constant equals itself

    # The values other than nodes and variables that hold nodes or need their own equality,
    # by kind (``a`` and ``b`` have the same type).
    CONTAINERS = (((tuple, list), equal_sequence), (dict, equal_dict), (np.ndarray, equal_array), (float, equal_float))

    def equal_field(self, name: str, a: Any, b: Any) -> bool:
        if name == "size_var_values":
            # (program size variable name, caller value) pairs: the names are variables too
            return len(a) == len(b) and all(
                self.equal_prim(SizeVar(name_a), SizeVar(name_b)) and self.equal(value_a, value_b)
                for (name_a, value_a), (name_b, value_b) in zip(a, b)
            )
        return self.equal(a, b)

    def match_var(self, a: Var, b: Var) -> bool:
        if id(a) in self.vars:
            return self.vars[id(a)] is b
        if id(b) in self.vars_reverse:
            return False
        self.vars[id(a)] = b
        self.vars_reverse[id(b)] = a
        return self.equal(a.struct_info, b.struct_info)

    def equal_prim(self, a: PrimExpr, b: PrimExpr) -> bool:
        if isinstance(a, SizeVar) and isinstance(b, SizeVar):
            if a.name in self.size_vars:
                return self.size_vars[a.name] == b.name
            if b.name in self.size_vars_reverse:
                return False
            self.size_vars[a.name] = b.name
            self.size_vars_reverse[b.name] = a.name
            return True
        if type(a) is not type(b):
            return False
        if isinstance(a, SizeVar):
            return False
        if dataclasses.is_dataclass(a) and not isinstance(a, SizeVar):
            return all(self.equal_prim(getattr(a, f.name), getattr(b, f.name)) if isinstance(getattr(a, f.name), PrimExpr)
                       else getattr(a, f.name) == getattr(b, f.name) for f in dataclasses.fields(a))
        return a == b


def structural_equal(a: Any, b: Any) -> bool:
    """True when ``a`` and ``b`` (modules, functions, expressions, annotations) are the same
    up to the names of the variables they define."""
    return _Matcher().equal(a, b)


def assert_structural_equal(a: Any, b: Any) -> None:
    """Like structural_equal, with both texts in the message when they differ."""
    if not structural_equal(a, b):
        raise AssertionError(f"not structurally equal:\n--- first\n{a}\n--- second\n{b}")
