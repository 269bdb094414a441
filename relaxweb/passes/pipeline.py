"""The order of passes from an imported module to one ready for code generation.

Each pass is a plain ``IRModule -> IRModule`` function in its own file.  ``relaxweb build``
runs :data:`PIPELINE` (and ``--dump-ir`` writes the module after each step).
"""

from __future__ import annotations

from typing import Callable

from ..ir.module import IRModule
from .legalize_ops import legalize_ops
from .lower_shapes_to_host import lower_shapes_to_host
from .plan_memory import plan_memory

Pass = Callable[[IRModule], IRModule]

# Graph-level ops -> tensor programs.
LOWER_OPS: list[Pass] = [legalize_ops]

# Tensors -> storages, then the shape computation -> the host function.
LOWER_TO_HOST: list[Pass] = [plan_memory, lower_shapes_to_host]

PIPELINE: list[Pass] = [*LOWER_OPS, *LOWER_TO_HOST]


def run_pipeline(module: IRModule, passes: list[Pass] = PIPELINE, on_step: Callable[[str, IRModule], None] | None = None) -> IRModule:
    for step in passes:
        module = step(module)
        if on_step is not None:
            on_step(step.__name__, module)
    return module
