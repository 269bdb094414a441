"""The params block every library kernel declares (the bundle's binding contract)."""

from __future__ import annotations


def params_struct(size_vars: list[str]) -> str:
    """The WGSL params block of the binding contract: element_count, size vars, padding."""
    fields = ["element_count", *size_vars]
    fields += [f"_pad{i}" for i in range((-len(fields)) % 4)]
    return "struct Params {\n" + "".join(f"  {name}: i32,\n" for name in fields) + "}\n"
