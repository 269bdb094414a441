"""The order of passes from an imported module to one ready for code generation.

Each pass is a plain ``IRModule -> IRModule`` function in its own file.  ``relaxweb build``
runs :func:`pipeline` for its ``--opt-level`` (and ``--dump-ir`` writes the module after each
step).  Level 0 skips the optimizing passes: every op is its own kernel, one invocation per
output element; it exists to compare against (``scripts/measure_pipeline.py``).
"""

from __future__ import annotations

from typing import Callable

from ..ir.module import IRModule
from .canonicalize_bindings import canonicalize_bindings
from .fold_scalar_constants import fold_scalar_constants
from .fuse_ops import fuse_ops
from .legalize_ops import legalize_ops
from .lower_shapes_to_host import lower_shapes_to_host
from .plan_memory import plan_memory
from .schedule_programs import schedule_programs

Pass = Callable[[IRModule], IRModule]

# Graph-level ops -> tensor programs.
LOWER_OPS: list[Pass] = [legalize_ops]

# Read values where they are computed, write scalar constants into the kernels, merge
# producer/consumer kernels, then pick each kernel's schedule from its pattern.
OPTIMIZE: list[Pass] = [canonicalize_bindings, fold_scalar_constants, fuse_ops, schedule_programs]

# Tensors -> storages, then the shape computation -> the host function.
LOWER_TO_HOST: list[Pass] = [plan_memory, lower_shapes_to_host]

OPT_LEVELS = (0, 1)
DEFAULT_OPT_LEVEL = 1


def pipeline(opt_level: int = DEFAULT_OPT_LEVEL) -> list[Pass]:
    """The passes ``relaxweb build --opt-level N`` runs."""
    if opt_level not in OPT_LEVELS:
        raise ValueError(f"opt level {opt_level} does not exist; expected one of {', '.join(map(str, OPT_LEVELS))}")
    return [*LOWER_OPS, *(OPTIMIZE if opt_level >= 1 else []), *LOWER_TO_HOST]


PIPELINE: list[Pass] = pipeline()


def run_pipeline(module: IRModule, passes: list[Pass] = PIPELINE, on_step: Callable[[str, IRModule], None] | None = None) -> IRModule:
    for step in passes:
        module = step(module)
        if on_step is not None:
            on_step(step.__name__, module)
    return module
