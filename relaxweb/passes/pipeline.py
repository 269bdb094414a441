"""The order of passes from an imported module to one ready for code generation.

Each pass is a plain ``IRModule -> IRModule`` function in its own file; the user's settings
(bounds, opt level, storage reuse, verification) come from the current
:class:`~relaxweb.passes.context.PassContext`.  ``relaxweb build`` runs :func:`pipeline` for
its ``--opt-level`` (and ``--dump-ir`` writes the module after each step).  Level 0 skips the
optimizing passes: every op is its own kernel, one WebGPU invocation per output element (the
WebAssembly kernels keep their schedules: ``schedule_programs.py``); it exists to compare
against (``scripts/measure_pipeline.py``).

With verification on, :func:`run_pipeline` checks the module before the first pass and after
each one (``relaxweb/ir/well_formed.py``), so a broken module is reported with the name of the
pass that produced it.
"""

from __future__ import annotations

from typing import Callable

from ..ir.module import IRModule
from ..ir.well_formed import WellFormedError, well_formed_problems
from .canonicalize_bindings import canonicalize_bindings
from .compress_weights import compress_weights
from .context import DEFAULT_OPT_LEVEL, OPT_LEVELS, PassContext
from .fold_scalar_constants import fold_scalar_constants
from .fuse_attention import fuse_attention
from .fuse_ops import fuse_ops
from .gather_before_transpose import gather_before_transpose
from .legalize_ops import legalize_ops
from .place_kv_caches import place_kv_caches
from .lower_shapes_to_host import lower_shapes_to_host
from .page_kv_caches import page_kv_caches
from .plan_memory import plan_memory
from .prove_integer_checks import prove_integer_checks
from .schedule_programs import schedule_programs
from .share_programs import share_programs
from .split_wide_concats import split_wide_concats
from .split_wide_einsums import split_wide_einsums

Pass = Callable[[IRModule], IRModule]

# Rewrites that make less work before anything is packed or lowered (a tied embedding read
# through a transpose of the LM head: only the rows gathered are transposed).
SIMPLIFY: list[Pass] = [gather_before_transpose]

# Weights stored packed (--weights float16|int8|int4), decoded by the kernels that read them.
COMPRESS: list[Pass] = [compress_weights]

# Op-level rewrites into ops with kernels of their own (attention: one kernel, no scores).
FUSE_OPS: list[Pass] = [fuse_attention]

# A decoder's present = concat(past, new) outputs -> one cache buffer each, read in place;
# with --kv-pages, pools of pages that the sequences of one run share.
PLACE_CACHES: list[Pass] = [place_kv_caches, page_kv_caches]

# Graph-level ops -> tensor programs, each kernel within WebGPU's storage bindings (a concat of
# more tensors than one kernel binds becomes a tree of concats, an einsum of more operands a
# chain of einsums).
LOWER_OPS: list[Pass] = [split_wide_concats, split_wide_einsums, legalize_ops]

# Read values where they are computed, write scalar constants into the kernels, merge
# producer/consumer kernels.
OPTIMIZE: list[Pass] = [canonicalize_bindings, fold_scalar_constants, fuse_ops]

# Drop the run-time integer checks value ranges prove never fail (at every opt level: fused
# bodies show index arithmetic as such; the sites are still literals).
PROVE_CHECKS: list[Pass] = [prove_integer_checks]

# Let kernels that differ only in integer constants share one program (one shader to
# compile at load).
SHARE: list[Pass] = [share_programs]

# Tensors -> storages (a loop's carried values get copy kernels), each kernel's schedule on
# every target once all kernels exist (at every opt level: at 0, WebGPU's element layout),
# then the shape computation -> the host function (the dispatch sizes the schedules imply).
LOWER_TO_HOST: list[Pass] = [plan_memory, schedule_programs, lower_shapes_to_host]


def pipeline(opt_level: int | None = None) -> list[Pass]:
    """The passes ``relaxweb build --opt-level N`` runs (by default, the current context's level)."""
    if opt_level is None:
        opt_level = PassContext.current().opt_level
    if opt_level not in OPT_LEVELS:
        raise ValueError(f"opt level {opt_level} does not exist; expected one of {', '.join(map(str, OPT_LEVELS))}")
    optimizing = opt_level >= 1
    return [*(SIMPLIFY if optimizing else []), *COMPRESS, *(FUSE_OPS + PLACE_CACHES if optimizing else []), *LOWER_OPS,
            *(OPTIMIZE if optimizing else []), *PROVE_CHECKS, *(SHARE if optimizing else []), *LOWER_TO_HOST]


PIPELINE: list[Pass] = pipeline(DEFAULT_OPT_LEVEL)


def run_pipeline(module: IRModule, passes: list[Pass] | None = None,
                 on_step: Callable[[str, IRModule], None] | None = None) -> IRModule:
    """Run ``passes`` (by default the pipeline of the current context's opt level) in order,
    under the current :class:`PassContext`; ``on_step(name, module)`` sees each result."""
    verify = PassContext.current().verify
    if verify:
        _verify(module, "the module given to the pipeline is ill-formed")
    for step in pipeline() if passes is None else passes:
        module = step(module)
        if verify:
            _verify(module, f"pass {step.__name__} produced an ill-formed module")
        if on_step is not None:
            on_step(step.__name__, module)
    return module


def _verify(module: IRModule, what: str) -> None:
    problems = well_formed_problems(module)
    if problems:
        raise WellFormedError(f"{what}:\n  " + "\n  ".join(problems))
