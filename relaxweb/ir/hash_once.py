"""Expression nodes that compute their hash once.

The scalar and index expressions (``tir.py``, ``prim_expr.py``) are frozen dataclasses used
as dict keys everywhere (memo tables, common subexpressions, renderers' caches). The hash a
dataclass generates hashes the tuple of its fields, so hashing a node hashes its whole tree
again, every time: building a small bundle spent a third of its time in ``hash``. A node
never changes, so its hash is computed on first use and kept in the instance.

The kept hash is left out of a pickled or copied node's state: string hashes differ between
processes, so a hash must be computed where it is used.
"""

from __future__ import annotations

from typing import TypeVar

NodeClass = TypeVar("NodeClass", bound=type)

_KEPT = "_hash"


def hash_once(cls: NodeClass) -> NodeClass:
    """Make the frozen dataclass ``cls`` (apply it above ``@dataclass``) keep its hash after
    the first call; equality is the dataclass's own."""
    computed = cls.__hash__
    if computed is None:
        raise TypeError(f"{cls.__name__} has no hash to keep: it is not a frozen dataclass")

    def __hash__(self) -> int:
        state = self.__dict__
        value = state.get(_KEPT)
        if value is None:
            value = computed(self)
            state[_KEPT] = value  # the instance's dict, past the frozen __setattr__
        return value

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop(_KEPT, None)
        return state

    __hash__.__qualname__ = f"{cls.__qualname__}.__hash__"
    cls.__hash__ = __hash__  # type: ignore[method-assign]
    cls.__getstate__ = __getstate__  # type: ignore[attr-defined]
    return cls
