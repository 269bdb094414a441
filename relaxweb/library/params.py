"""The params block every library kernel declares (the bundle's binding contract, laid out
by ``relaxweb/ir/params_block.py``)."""

from __future__ import annotations

from ..ir.params_block import ParamsLayout


def params_struct(size_vars: list[str]) -> str:
    """The WGSL struct of the params block: element_count, the size variables, padding."""
    layout = ParamsLayout(tuple(size_vars))
    return "struct Params {\n" + "".join(f"  {name}: i32,\n" for name in (*layout.fields, *layout.padding)) + "}\n"
